/* tests/test_stream_cpu.c — the cpu kernels of the MSAR streams: the causal depthwise
 * convolution and the gated mix (DESIGN 2.2; DESIGN 7, "Unit"). Suite route_cpu, with Route.
 *
 * Forwards are compared with naive loops in double written here (outputs poisoned with NaN
 * first; relative error <= 1e-5). Every backward is compared with central finite differences
 * of L = sum(out * R), R random, taken on the double reference (step 1e-4), for every input:
 * conv x and taps, mix streams, mix_bias and mix_proj (relative error <= 1e-4). Kernel sizes
 * 1, 2, 3, 8, with T shorter than the kernel in some cases; m = 2, 3, 4 streams.
 * Identity taps and the init gates are checked bit for bit; each backward adds into its
 * gradients and gives the same bits on 1 and 2 threads.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#define FORWARD_TOLERANCE 1e-5
#define GRADIENT_TOLERANCE 1e-4
#define DIFFERENCE_STEP 1e-4
#define MAX_STREAMS 8

static const float mix_eps = 1e-5f;

/* The suite's finite-difference rule: step DIFFERENCE_STEP, GRADIENT_TOLERANCE. */
static void expect_gradient(ReferenceObjective objective, const void *problem, double *input,
                            const float *gradient, size_t n, const char *what)
{
    expect_gradient_of_reference(objective, problem, input, gradient, n, DIFFERENCE_STEP,
                                 GRADIENT_TOLERANCE, what);
}

/* ---- convolution ---- */

static void reference_conv(double *out, const double *x, const double *taps, int kernel_size,
                           int B, int T, int d)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < d; c++) {
                double sum = 0;
                for (int tau = 0; tau < kernel_size && tau <= t; tau++)
                    sum += taps[(size_t)tau * d + c] * x[((size_t)b * T + t - tau) * d + c];
                out[((size_t)b * T + t) * d + c] = sum;
            }
}

typedef struct {
    int kernel_size, B, T, d;
    float *x, *taps, *probe;
    double *x64, *taps64, *probe64;
} ConvProblem;

static ConvProblem conv_problem(int kernel_size, int B, int T, int d, uint64_t seed)
{
    size_t size = (size_t)B * T * d, n_taps = (size_t)kernel_size * d;
    ConvProblem p = {.kernel_size = kernel_size, .B = B, .T = T, .d = d};
    p.x = random_floats(size, 1.0f, seed);
    p.taps = random_floats(n_taps, 1.0f, seed + 1);
    p.probe = random_floats(size, 1.0f, seed + 2);
    p.x64 = to_doubles(p.x, size);
    p.taps64 = to_doubles(p.taps, n_taps);
    p.probe64 = to_doubles(p.probe, size);
    return p;
}

static void conv_problem_free(ConvProblem *p)
{
    free(p->x), free(p->taps), free(p->probe), free(p->x64), free(p->taps64), free(p->probe64);
}

static double conv_objective(const void *pointer)
{
    const ConvProblem *p = pointer;
    size_t size = (size_t)p->B * p->T * p->d;
    double *out = malloc(size * sizeof(double)), sum = 0;
    cr_assert_not_null(out);
    reference_conv(out, p->x64, p->taps64, p->kernel_size, p->B, p->T, p->d);
    for (size_t i = 0; i < size; i++)
        sum += out[i] * p->probe64[i];
    free(out);
    return sum;
}

/* (kernel_size, B, T, d); T < kernel_size in the 3rd and 4th */
static const int conv_cases[][4] = {{1, 2, 5, 3}, {2, 1, 7, 5}, {3, 2, 2, 4}, {8, 2, 5, 3},
                                    {8, 1, 11, 2}};

Test(route_cpu, stream_conv_forward_matches_double_reference)
{
    for (size_t k = 0; k < sizeof conv_cases / sizeof conv_cases[0]; k++) {
        const int *c = conv_cases[k];
        size_t size = (size_t)c[1] * c[2] * c[3];
        ConvProblem p = conv_problem(c[0], c[1], c[2], c[3], 10 * k);
        float *out = poisoned_floats(size);
        double *expected = malloc(size * sizeof(double));
        cpu_stream_conv_forward(out, p.x, p.taps, c[0], c[1], c[2], c[3]);
        reference_conv(expected, p.x64, p.taps64, c[0], c[1], c[2], c[3]);
        expect_close(out, expected, size, FORWARD_TOLERANCE, "conv out");
        free(out), free(expected);
        conv_problem_free(&p);
    }
}

Test(route_cpu, stream_conv_backward_matches_finite_differences)
{
    for (size_t k = 0; k < sizeof conv_cases / sizeof conv_cases[0]; k++) {
        const int *c = conv_cases[k];
        size_t size = (size_t)c[1] * c[2] * c[3], n_taps = (size_t)c[0] * c[3];
        ConvProblem p = conv_problem(c[0], c[1], c[2], c[3], 20 * k);
        float *dx = zero_floats(size), *dtaps = zero_floats(n_taps);
        cpu_stream_conv_backward(dx, dtaps, p.probe, p.x, p.taps, c[0], c[1], c[2], c[3]);
        cr_log_info("conv kernel %d B %d T %d d %d", c[0], c[1], c[2], c[3]);
        expect_gradient(conv_objective, &p, p.x64, dx, size, "dx");
        /* taps at tau >= T never meet an input: their gradient is exactly 0 */
        expect_gradient(conv_objective, &p, p.taps64, dtaps, n_taps, "dtaps");
        free(dx), free(dtaps);
        conv_problem_free(&p);
    }
}

Test(route_cpu, stream_conv_with_identity_taps_returns_the_input)
{
    static const int kernel_sizes[] = {1, 2, 3, 8};
    int B = 2, T = 5, d = 7;
    size_t size = (size_t)B * T * d;
    float *x = random_floats(size, 1.0f, 30), *out = poisoned_floats(size);
    for (int k = 0; k < 4; k++) {
        float *taps = zero_floats((size_t)kernel_sizes[k] * d);
        for (int c = 0; c < d; c++)
            taps[c] = 1.0f;
        cpu_stream_conv_forward(out, x, taps, kernel_sizes[k], B, T, d);
        expect_bitwise_equal(out, x, size, "identity conv against its input");
        free(taps);
    }
    free(x), free(out);
}

Test(route_cpu, stream_conv_backward_accumulates)
{
    ConvProblem p = conv_problem(3, 2, 7, 5, 40);
    size_t size = 2 * 7 * 5, n_taps = 3 * 5;
    float *dx_once = zero_floats(size), *dtaps_once = zero_floats(n_taps);
    float *dx_twice = zero_floats(size), *dtaps_twice = zero_floats(n_taps);
    cpu_stream_conv_backward(dx_once, dtaps_once, p.probe, p.x, p.taps, 3, 2, 7, 5);
    for (int call = 0; call < 2; call++)
        cpu_stream_conv_backward(dx_twice, dtaps_twice, p.probe, p.x, p.taps, 3, 2, 7, 5);
    expect_doubled(dx_twice, dx_once, size, "dx");
    expect_doubled(dtaps_twice, dtaps_once, n_taps, "dtaps");
    free(dx_once), free(dtaps_once), free(dx_twice), free(dtaps_twice);
    conv_problem_free(&p);
}

Test(route_cpu, stream_conv_backward_without_dx_gives_the_same_dtaps)
{
    ConvProblem p = conv_problem(3, 2, 7, 5, 45);
    float *dx = zero_floats(2 * 7 * 5), *dtaps = zero_floats(3 * 5);
    float *dtaps_alone = zero_floats(3 * 5);
    cpu_stream_conv_backward(dx, dtaps, p.probe, p.x, p.taps, 3, 2, 7, 5);
    cpu_stream_conv_backward(NULL, dtaps_alone, p.probe, p.x, p.taps, 3, 2, 7, 5);
    expect_bitwise_equal(dtaps_alone, dtaps, 3 * 5, "dtaps without dx");
    free(dx), free(dtaps), free(dtaps_alone);
    conv_problem_free(&p);
}

Test(route_cpu, stream_conv_backward_is_bitwise_identical_for_1_and_2_threads)
{
    int kernel_size = 4, B = 2, T = 300, d = 150; /* 3 channel blocks, 4 taps */
    ConvProblem p = conv_problem(kernel_size, B, T, d, 50);
    size_t size = (size_t)B * T * d, n_taps = (size_t)kernel_size * d;
    float *dx_one = zero_floats(size), *dtaps_one = zero_floats(n_taps);
    float *dx_two = zero_floats(size), *dtaps_two = zero_floats(n_taps);
    omp_set_num_threads(1);
    cpu_stream_conv_backward(dx_one, dtaps_one, p.probe, p.x, p.taps, kernel_size, B, T, d);
    omp_set_num_threads(2);
    cpu_stream_conv_backward(dx_two, dtaps_two, p.probe, p.x, p.taps, kernel_size, B, T, d);
    expect_bitwise_equal(dx_one, dx_two, size, "dx on 1 and 2 threads");
    expect_bitwise_equal(dtaps_one, dtaps_two, n_taps, "dtaps on 1 and 2 threads");
    free(dx_one), free(dtaps_one), free(dx_two), free(dtaps_two);
    conv_problem_free(&p);
}

/* ---- mix ---- */

/* DESIGN 2.2 in double; gates [tokens, m] may be NULL */
static void reference_mix(double *out, double *gates, const double *streams, int m,
                          const double *mix_bias, const double *mix_proj, int tokens, int d)
{
    for (int t = 0; t < tokens; t++) {
        double w[MAX_STREAMS];
        for (int r = 0; r < m; r++) {
            const double *o = streams + ((size_t)r * tokens + t) * d;
            double sum_squares = 0, g = mix_bias[r];
            for (int c = 0; c < d; c++)
                sum_squares += o[c] * o[c];
            double rho = 1 / sqrt(sum_squares / d + mix_eps);
            for (int c = 0; c < d; c++)
                g += mix_proj[(size_t)r * d + c] * o[c] * rho;
            w[r] = 1 / (1 + exp(-g));
            if (gates)
                gates[(size_t)t * m + r] = w[r];
        }
        for (int c = 0; c < d; c++) {
            double sum = 0;
            for (int r = 0; r < m; r++)
                sum += w[r] * streams[((size_t)r * tokens + t) * d + c];
            out[(size_t)t * d + c] = sum;
        }
    }
}

typedef struct {
    int m, tokens, d;
    float *streams, *mix_bias, *mix_proj, *probe;
    double *streams64, *mix_bias64, *mix_proj64, *probe64;
} MixProblem;

static MixProblem mix_problem(int m, int tokens, int d, uint64_t seed)
{
    size_t size = (size_t)tokens * d;
    MixProblem p = {.m = m, .tokens = tokens, .d = d};
    p.streams = malloc((size_t)m * size * sizeof(float));
    cr_assert_not_null(p.streams);
    for (int r = 0; r < m; r++) /* streams of different scales */
        test_fill_uniform(p.streams + r * size, size, 0.5f + 0.5f * r, seed + (uint64_t)r);
    p.mix_bias = random_floats(m, 1.0f, seed + 100);
    p.mix_proj = random_floats((size_t)m * d, 0.5f, seed + 101);
    p.probe = random_floats(size, 1.0f, seed + 102);
    p.streams64 = to_doubles(p.streams, (size_t)m * size);
    p.mix_bias64 = to_doubles(p.mix_bias, m);
    p.mix_proj64 = to_doubles(p.mix_proj, (size_t)m * d);
    p.probe64 = to_doubles(p.probe, size);
    return p;
}

static void mix_problem_free(MixProblem *p)
{
    free(p->streams), free(p->mix_bias), free(p->mix_proj), free(p->probe);
    free(p->streams64), free(p->mix_bias64), free(p->mix_proj64), free(p->probe64);
}

static double mix_objective(const void *pointer)
{
    const MixProblem *p = pointer;
    size_t size = (size_t)p->tokens * p->d;
    double *out = malloc(size * sizeof(double)), sum = 0;
    cr_assert_not_null(out);
    reference_mix(out, NULL, p->streams64, p->m, p->mix_bias64, p->mix_proj64, p->tokens, p->d);
    for (size_t i = 0; i < size; i++)
        sum += out[i] * p->probe64[i];
    free(out);
    return sum;
}

typedef struct {
    float *dstreams, *dmix_bias, *dmix_proj;
} MixGradients;

/* forward, then `calls` backward calls with dout = probe into zeroed gradients */
static MixGradients mix_gradients(const MixProblem *p, int calls)
{
    size_t size = (size_t)p->tokens * p->d;
    MixGradients g = {zero_floats((size_t)p->m * size), zero_floats(p->m),
                      zero_floats((size_t)p->m * p->d)};
    const float *streams[MAX_STREAMS];
    float *dstreams[MAX_STREAMS];
    point_into(streams, p->streams, p->m, size);
    point_into((const float **)dstreams, g.dstreams, p->m, size);
    float *out = zero_floats(size), *gates = zero_floats((size_t)p->tokens * p->m);
    float *rstd = zero_floats((size_t)p->tokens * p->m);
    cpu_stream_mix_forward(out, gates, rstd, streams, p->m, p->mix_bias, p->mix_proj, p->tokens,
                           p->d, mix_eps);
    for (int call = 0; call < calls; call++)
        cpu_stream_mix_backward(dstreams, GRAD_ADD, g.dmix_bias, g.dmix_proj, NULL, p->probe,
                                streams, p->m, gates, rstd, p->mix_bias, p->mix_proj, NULL,
                                p->tokens, p->d);
    free(out), free(gates), free(rstd);
    return g;
}

/* One backward with the gate (alpha) into gradients written (dstreams) or zeroed, the
 * streams given one at a time when `one_at_a_time`; *dalpha from 0. The forward's out is
 * kept in `mix` (size floats) when not NULL. */
static MixGradients mix_gradients_gated(const MixProblem *p, float alpha, bool one_at_a_time,
                                        float *dalpha, float *mix)
{
    size_t size = (size_t)p->tokens * p->d;
    MixGradients g = {poisoned_floats((size_t)p->m * size), zero_floats(p->m),
                      zero_floats((size_t)p->m * p->d)};
    const float *streams[MAX_STREAMS], *given[MAX_STREAMS] = {0};
    float *dstreams[MAX_STREAMS];
    point_into(streams, p->streams, p->m, size);
    point_into((const float **)dstreams, g.dstreams, p->m, size);
    float *out = zero_floats(size), *gates = zero_floats((size_t)p->tokens * p->m);
    float *rstd = zero_floats((size_t)p->tokens * p->m);
    cpu_stream_mix_forward(out, gates, rstd, streams, p->m, p->mix_bias, p->mix_proj, p->tokens,
                           p->d, mix_eps);
    *dalpha = 0.0f;
    for (int r = 0; r < (one_at_a_time ? p->m : 1); r++) {
        for (int k = 0; k < p->m; k++)
            given[k] = !one_at_a_time || k == r ? streams[k] : NULL;
        cpu_stream_mix_backward(dstreams, GRAD_WRITE, g.dmix_bias, g.dmix_proj, dalpha, p->probe,
                                given, p->m, gates, rstd, p->mix_bias, p->mix_proj, &alpha,
                                p->tokens, p->d);
    }
    if (mix)
        memcpy(mix, out, size * sizeof *mix);
    free(out), free(gates), free(rstd);
    return g;
}

static void mix_gradients_free(MixGradients *g)
{
    free(g->dstreams), free(g->dmix_bias), free(g->dmix_proj);
}

/* got and expected hold the same bits: m streams of `size` values, over d channels */
static void expect_same_mix_gradients(const MixGradients *got, const MixGradients *expected,
                                      int m, size_t size, int d)
{
    expect_bitwise_equal(got->dstreams, expected->dstreams, (size_t)m * size, "dstreams");
    expect_bitwise_equal(got->dmix_bias, expected->dmix_bias, m, "dmix_bias");
    expect_bitwise_equal(got->dmix_proj, expected->dmix_proj, (size_t)m * d, "dmix_proj");
}

/* (m, tokens, d) */
static const int mix_cases[][3] = {{2, 5, 7}, {3, 4, 9}, {4, 3, 5}};

Test(route_cpu, stream_mix_forward_matches_double_reference)
{
    for (size_t k = 0; k < sizeof mix_cases / sizeof mix_cases[0]; k++) {
        int m = mix_cases[k][0], tokens = mix_cases[k][1], d = mix_cases[k][2];
        size_t size = (size_t)tokens * d;
        MixProblem p = mix_problem(m, tokens, d, 60 + 10 * k);
        const float *streams[MAX_STREAMS];
        point_into(streams, p.streams, m, size);
        float *out = poisoned_floats(size), *gates = poisoned_floats((size_t)tokens * m);
        float *rstd = poisoned_floats((size_t)tokens * m);
        double *expected = malloc(size * sizeof(double));
        double *expected_gates = malloc((size_t)tokens * m * sizeof(double));
        cpu_stream_mix_forward(out, gates, rstd, streams, m, p.mix_bias, p.mix_proj, tokens, d,
                               mix_eps);
        reference_mix(expected, expected_gates, p.streams64, m, p.mix_bias64, p.mix_proj64,
                      tokens, d);
        expect_close(out, expected, size, FORWARD_TOLERANCE, "mix out");
        expect_close(gates, expected_gates, (size_t)tokens * m, FORWARD_TOLERANCE, "gates");
        cr_assert(test_all_finite(rstd, (size_t)tokens * m), "rstd not written");
        free(out), free(gates), free(rstd), free(expected), free(expected_gates);
        mix_problem_free(&p);
    }
}

Test(route_cpu, stream_mix_backward_matches_finite_differences)
{
    for (size_t k = 0; k < sizeof mix_cases / sizeof mix_cases[0]; k++) {
        int m = mix_cases[k][0], tokens = mix_cases[k][1], d = mix_cases[k][2];
        MixProblem p = mix_problem(m, tokens, d, 90 + 10 * k);
        MixGradients g = mix_gradients(&p, 1);
        cr_log_info("mix m %d tokens %d d %d", m, tokens, d);
        expect_gradient(mix_objective, &p, p.streams64, g.dstreams, (size_t)m * tokens * d,
                        "dstreams");
        expect_gradient(mix_objective, &p, p.mix_bias64, g.dmix_bias, m, "dmix_bias");
        expect_gradient(mix_objective, &p, p.mix_proj64, g.dmix_proj, (size_t)m * d, "dmix_proj");
        mix_gradients_free(&g);
        mix_problem_free(&p);
    }
}

Test(route_cpu, stream_mix_at_init_gives_quarter_gates_and_returns_four_equal_streams)
{
    int m = 4, tokens = 6, d = 11;
    size_t size = (size_t)tokens * d;
    float *stream = random_floats(size, 2.0f, 120), *out = poisoned_floats(size);
    float *gates = poisoned_floats((size_t)tokens * m), *rstd = poisoned_floats((size_t)tokens * m);
    float *mix_proj = zero_floats((size_t)m * d), mix_bias[4];
    const float *streams[4] = {stream, stream, stream, stream};
    for (int r = 0; r < m; r++)
        mix_bias[r] = (float)-log(m - 1.0);
    cpu_stream_mix_forward(out, gates, rstd, streams, m, mix_bias, mix_proj, tokens, d, mix_eps);
    for (int i = 0; i < tokens * m; i++)
        cr_assert_eq(gates[i], 0.25f, "gate %d is %a, not 0.25", i, gates[i]);
    expect_bitwise_equal(out, stream, size, "mix of 4 equal streams against the stream");
    free(stream), free(out), free(gates), free(rstd), free(mix_proj);
}

/* The parameter gradients are sums over tokens: 3000 tokens in one call (3 tiles of the
 * backward) must give what two calls over the halves give. */
Test(route_cpu, stream_mix_backward_over_several_tiles_equals_the_sum_over_two_halves)
{
    int m = 3, tokens = 3000, d = 13, half = tokens / 2;
    size_t size = (size_t)tokens * d;
    MixProblem p = mix_problem(m, tokens, d, 150);
    MixGradients whole = mix_gradients(&p, 1);
    const float *streams[MAX_STREAMS], *upper[MAX_STREAMS];
    point_into(streams, p.streams, m, size);
    float *out = zero_floats(size), *gates = zero_floats((size_t)tokens * m);
    float *rstd = zero_floats((size_t)tokens * m), *dstreams[MAX_STREAMS], *dupper[MAX_STREAMS];
    MixGradients halves = {zero_floats((size_t)m * size), zero_floats(m),
                           zero_floats((size_t)m * d)};
    point_into((const float **)dstreams, halves.dstreams, m, size);
    for (int r = 0; r < m; r++)
        upper[r] = streams[r] + (size_t)half * d, dupper[r] = dstreams[r] + (size_t)half * d;
    cpu_stream_mix_forward(out, gates, rstd, streams, m, p.mix_bias, p.mix_proj, tokens, d,
                           mix_eps);
    cpu_stream_mix_backward(dstreams, GRAD_ADD, halves.dmix_bias, halves.dmix_proj, NULL,
                            p.probe, streams, m, gates, rstd, p.mix_bias, p.mix_proj, NULL, half,
                            d);
    cpu_stream_mix_backward(dupper, GRAD_ADD, halves.dmix_bias, halves.dmix_proj, NULL,
                            p.probe + (size_t)half * d, upper, m, gates + (size_t)half * m,
                            rstd + (size_t)half * m, p.mix_bias, p.mix_proj, NULL, tokens - half,
                            d);
    double *expected_bias = to_doubles(whole.dmix_bias, m);
    double *expected_proj = to_doubles(whole.dmix_proj, (size_t)m * d);
    expect_bitwise_equal(halves.dstreams, whole.dstreams, (size_t)m * size, "dstreams");
    expect_close(halves.dmix_bias, expected_bias, m, ACCUMULATION_TOLERANCE, "dmix_bias");
    expect_close(halves.dmix_proj, expected_proj, (size_t)m * d, ACCUMULATION_TOLERANCE,
                 "dmix_proj");
    free(out), free(gates), free(rstd), free(expected_bias), free(expected_proj);
    mix_gradients_free(&whole);
    mix_gradients_free(&halves);
    mix_problem_free(&p);
}

Test(route_cpu, stream_mix_backward_accumulates)
{
    MixProblem p = mix_problem(3, 4, 9, 130);
    MixGradients once = mix_gradients(&p, 1), twice = mix_gradients(&p, 2);
    expect_doubled(twice.dstreams, once.dstreams, 3 * 4 * 9, "dstreams");
    expect_doubled(twice.dmix_bias, once.dmix_bias, 3, "dmix_bias");
    expect_doubled(twice.dmix_proj, once.dmix_proj, 3 * 9, "dmix_proj");
    mix_gradients_free(&once);
    mix_gradients_free(&twice);
    mix_problem_free(&p);
}

Test(route_cpu, stream_mix_backward_is_bitwise_identical_for_1_and_2_threads)
{
    /* 3000 tokens span 3 tiles of the backward; 130 channels span 3 blocks */
    int m = 3, tokens = 3000, d = 130;
    MixProblem p = mix_problem(m, tokens, d, 140);
    omp_set_num_threads(1);
    MixGradients one = mix_gradients(&p, 1);
    omp_set_num_threads(2);
    MixGradients two = mix_gradients(&p, 1);
    expect_same_mix_gradients(&two, &one, m, (size_t)tokens * d, d);
    mix_gradients_free(&one);
    mix_gradients_free(&two);
    mix_problem_free(&p);
}

/* With the delta gate folded in, dout is d x of x = p + alpha * out: the stream and parameter
 * gradients are alpha times the ungated ones (written, not added), and d alpha is
 * sum <dout, out> (double, against the forward's out). */
Test(route_cpu, stream_mix_backward_with_the_gate_scales_by_alpha_and_gives_d_alpha)
{
    int m = 3, tokens = 5, d = 9;
    size_t size = (size_t)tokens * d;
    MixProblem p = mix_problem(m, tokens, d, 160);
    MixGradients plain = mix_gradients(&p, 1);
    float dalpha, *mix = zero_floats(size);
    MixGradients gated = mix_gradients_gated(&p, -0.75f, false, &dalpha, mix);
    double *expected = malloc((size_t)m * size * sizeof(double)), dot = 0;
    cr_assert_not_null(expected);
    for (size_t i = 0; i < (size_t)m * size; i++)
        expected[i] = -0.75 * plain.dstreams[i];
    expect_close(gated.dstreams, expected, (size_t)m * size, FORWARD_TOLERANCE, "dstreams");
    for (int r = 0; r < m; r++)
        expected[r] = -0.75 * plain.dmix_bias[r];
    expect_close(gated.dmix_bias, expected, m, FORWARD_TOLERANCE, "dmix_bias");
    for (size_t i = 0; i < size; i++)
        dot += (double)p.probe[i] * mix[i];
    cr_expect(fabs(dalpha - dot) <= 1e-5 * (fabs(dot) + 1e-3), "d alpha %.9g, sum <dout, out> "
              "%.9g", dalpha, dot);
    free(expected), free(mix);
    mix_gradients_free(&plain);
    mix_gradients_free(&gated);
    mix_problem_free(&p);
}

/* A stream's share depends on its own o_r only: the streams given one at a time write the
 * same d o_r and add the same parameter gradients bit for bit; d alpha sums the same terms
 * in another order. */
Test(route_cpu, stream_mix_backward_a_stream_at_a_time_is_the_backward_of_all_streams)
{
    int m = 4, tokens = 1500, d = 70; /* 2 tiles, 2 channel blocks */
    size_t size = (size_t)tokens * d;
    MixProblem p = mix_problem(m, tokens, d, 170);
    float dalpha_all, dalpha_each;
    MixGradients all = mix_gradients_gated(&p, 0.5f, false, &dalpha_all, NULL);
    MixGradients each = mix_gradients_gated(&p, 0.5f, true, &dalpha_each, NULL);
    expect_same_mix_gradients(&each, &all, m, size, d);
    cr_expect(fabsf(dalpha_each - dalpha_all) <= 1e-5f * fabsf(dalpha_all), "d alpha %.9g one "
              "stream at a time, %.9g all at once", dalpha_each, dalpha_all);
    mix_gradients_free(&all);
    mix_gradients_free(&each);
    mix_problem_free(&p);
}

/* GRAD_WRITE gives what GRAD_ADD into zeros gives, bit for bit, over poisoned buffers. */
Test(route_cpu, stream_mix_backward_write_is_add_into_zeros)
{
    int m = 2, tokens = 6, d = 11;
    size_t size = (size_t)tokens * d;
    MixProblem p = mix_problem(m, tokens, d, 180);
    const float *streams[MAX_STREAMS];
    float *written[MAX_STREAMS], *added[MAX_STREAMS];
    point_into(streams, p.streams, m, size);
    float *write_rows = poisoned_floats((size_t)m * size);
    float *add_rows = zero_floats((size_t)m * size);
    point_into((const float **)written, write_rows, m, size);
    point_into((const float **)added, add_rows, m, size);
    float *out = zero_floats(size), *gates = zero_floats((size_t)tokens * m);
    float *rstd = zero_floats((size_t)tokens * m), *bias = zero_floats(m);
    float *proj = zero_floats((size_t)m * d);
    cpu_stream_mix_forward(out, gates, rstd, streams, m, p.mix_bias, p.mix_proj, tokens, d,
                           mix_eps);
    cpu_stream_mix_backward(written, GRAD_WRITE, bias, proj, NULL, p.probe, streams, m, gates,
                            rstd, p.mix_bias, p.mix_proj, NULL, tokens, d);
    cpu_stream_mix_backward(added, GRAD_ADD, bias, proj, NULL, p.probe, streams, m, gates, rstd,
                            p.mix_bias, p.mix_proj, NULL, tokens, d);
    expect_bitwise_equal(write_rows, add_rows, (size_t)m * size, "dstreams");
    free(write_rows), free(add_rows), free(out), free(gates), free(rstd), free(bias), free(proj);
    mix_problem_free(&p);
}
