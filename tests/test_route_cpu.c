/* tests/test_route_cpu.c — the cpu kernels of attention over depth: Route forward and
 * backward (DESIGN 2.1; DESIGN 7, "Unit"). The MSAR stream kernels share the suite
 * (tests/test_stream_cpu.c).
 *
 * The forward is compared with a naive loop in double written here (outputs poisoned with NaN
 * first; relative error <= 1e-5). The backward is compared with central finite differences
 * of L = sum(out * R), R random, taken on the double reference (step 1e-4), for every input:
 * sources, query, key_norm and, in the delta form, alpha (relative error <= 1e-4). Sizes are
 * odd: N = 1, 2, 5, 9 (= 2L + 1 for L = 4) sources, H = 1, 2, 3, 8 heads of 1, 3 or 5
 * channels, replace and delta forms.
 * Identities the math guarantees are checked bit for bit; the backward adds into its
 * gradients and gives the same bits on 1 and 2 threads.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FORWARD_TOLERANCE 1e-5
#define GRADIENT_TOLERANCE 1e-4
#define DIFFERENCE_STEP 1e-4
#define MAX_SOURCES 16

static const float route_eps = 1e-5f;

/* Sources n = 0..N-1 of [tokens, d] in one buffer, source n uniform in +-(0.5 + 0.4 n):
 * different scales give different rms statistics. */
static float *random_sources(int n_sources, size_t size, uint64_t seed)
{
    float *all = malloc((size_t)n_sources * size * sizeof(float));
    cr_assert_not_null(all);
    for (int n = 0; n < n_sources; n++)
        test_fill_uniform(all + n * size, size, 0.5f + 0.4f * n, seed + (uint64_t)n);
    return all;
}

/* The suite's finite-difference rule: step DIFFERENCE_STEP, GRADIENT_TOLERANCE. */
static void expect_gradient(ReferenceObjective objective, const void *problem, double *input,
                            const float *gradient, size_t n, const char *what)
{
    expect_gradient_of_reference(objective, problem, input, gradient, n, DIFFERENCE_STEP,
                                 GRADIENT_TOLERANCE, what);
}

/* ---- Route ---- */

/* DESIGN 2.1 in double; weights [N, tokens, H] may be NULL, base NULL for the replace form */
static void reference_route(double *out, double *weights, const double *sources, int n_sources,
                            const double *query, const double *key_norm, const double *base,
                            double alpha, int tokens, int d, int heads)
{
    int head_dim = d / heads;
    double z[MAX_SOURCES], r[MAX_SOURCES];
    for (int t = 0; t < tokens; t++) {
        for (int n = 0; n < n_sources; n++) {
            const double *s = sources + ((size_t)n * tokens + t) * d;
            double sum_squares = 0;
            for (int c = 0; c < d; c++)
                sum_squares += s[c] * s[c];
            r[n] = 1 / sqrt(sum_squares / d + route_eps);
        }
        for (int h = 0; h < heads; h++) {
            double max_z = -INFINITY, sum = 0;
            for (int n = 0; n < n_sources; n++) {
                const double *s = sources + ((size_t)n * tokens + t) * d;
                z[n] = 0;
                for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                    z[n] += query[c] * key_norm[c] * s[c] * r[n];
                max_z = fmax(max_z, z[n]);
            }
            for (int n = 0; n < n_sources; n++)
                sum += exp(z[n] - max_z);
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++) {
                double mix = 0;
                for (int n = 0; n < n_sources; n++)
                    mix += exp(z[n] - max_z) / sum * sources[((size_t)n * tokens + t) * d + c];
                size_t i = (size_t)t * d + c;
                out[i] = base ? base[i] + alpha * mix : mix;
            }
            if (weights)
                for (int n = 0; n < n_sources; n++)
                    weights[((size_t)n * tokens + t) * heads + h] = exp(z[n] - max_z) / sum;
        }
    }
}

/* one Route problem: float inputs for the kernel, their double copies for the reference */
typedef struct {
    int n_sources, tokens, d, heads;
    bool delta;
    float *sources, *query, *key_norm, *base, *probe, alpha;
    double *sources64, *query64, *key_norm64, *base64, *probe64, alpha64;
} RouteProblem;

static RouteProblem route_problem(int n_sources, int tokens, int d, int heads, bool delta,
                                  uint64_t seed)
{
    size_t size = (size_t)tokens * d;
    RouteProblem p = {.n_sources = n_sources, .tokens = tokens, .d = d, .heads = heads,
                      .delta = delta};
    p.sources = random_sources(n_sources, size, seed);
    p.query = random_floats(d, 1.0f, seed + 100);
    p.key_norm = random_floats(d, 0.5f, seed + 101);
    for (int c = 0; c < d; c++)
        p.key_norm[c] += 1.0f;
    p.base = delta ? random_floats(size, 1.0f, seed + 102) : NULL;
    p.probe = random_floats(size, 1.0f, seed + 103);
    p.alpha = delta ? 0.7f : 0.0f;
    p.sources64 = to_doubles(p.sources, n_sources * size);
    p.query64 = to_doubles(p.query, d);
    p.key_norm64 = to_doubles(p.key_norm, d);
    p.base64 = delta ? to_doubles(p.base, size) : NULL;
    p.probe64 = to_doubles(p.probe, size);
    p.alpha64 = p.alpha;
    return p;
}

static void route_problem_free(RouteProblem *p)
{
    void *all[] = {p->sources, p->query, p->key_norm, p->base, p->probe, p->sources64,
                   p->query64, p->key_norm64, p->base64, p->probe64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static double route_objective(const void *pointer)
{
    const RouteProblem *p = pointer;
    size_t size = (size_t)p->tokens * p->d;
    double *out = malloc(size * sizeof(double)), sum = 0;
    cr_assert_not_null(out);
    reference_route(out, NULL, p->sources64, p->n_sources, p->query64, p->key_norm64, p->base64,
                    p->alpha64, p->tokens, p->d, p->heads);
    for (size_t i = 0; i < size; i++)
        sum += out[i] * p->probe64[i];
    free(out);
    return sum;
}

/* The kernel's gradients of L = sum(out * probe), one backward call into zeroed buffers. */
typedef struct {
    float *dsources, *dquery, *dkey_norm, dalpha;
} RouteGradients;

static void route_run_backward(const RouteProblem *p, RouteGradients *g, int calls)
{
    size_t size = (size_t)p->tokens * p->d;
    int N = p->n_sources;
    const float *sources[MAX_SOURCES];
    float *dsources[MAX_SOURCES];
    float *out = zero_floats(size), *weights = zero_floats((size_t)N * p->tokens * p->heads);
    float *rstd = zero_floats((size_t)N * p->tokens);
    float *scratch = zero_floats((size_t)N * p->tokens * p->heads);
    point_into(sources, p->sources, N, size);
    point_into((const float **)dsources, g->dsources, N, size);
    cpu_route_forward(out, weights, rstd, sources, N, p->query, p->key_norm, p->base, p->alpha,
                      p->tokens, p->d, p->heads, route_eps);
    for (int call = 0; call < calls; call++)
        cpu_route_backward(dsources, g->dquery, g->dkey_norm, &g->dalpha, p->probe, sources, N,
                           weights, rstd, p->query, p->key_norm, p->delta, p->alpha, scratch,
                           p->tokens, p->d, p->heads);
    free(out);
    free(weights);
    free(rstd);
    free(scratch);
}

static RouteGradients route_gradients(const RouteProblem *p, int calls)
{
    RouteGradients g = {zero_floats((size_t)p->n_sources * p->tokens * p->d), zero_floats(p->d),
                        zero_floats(p->d), 0};
    route_run_backward(p, &g, calls);
    return g;
}

static void route_gradients_free(RouteGradients *g)
{
    free(g->dsources);
    free(g->dquery);
    free(g->dkey_norm);
}

/* (N, tokens, d, heads): N = 9 is 2L + 1 for L = 4; head widths 1, 3, 5 */
static const int route_cases[][4] = {
    {1, 3, 5, 1}, {2, 4, 6, 2}, {5, 7, 15, 3}, {9, 5, 24, 8}, {5, 3, 8, 8},
};

Test(route_cpu, route_forward_matches_double_reference)
{
    for (size_t k = 0; k < sizeof route_cases / sizeof route_cases[0]; k++)
        for (int delta = 0; delta <= 1; delta++) {
            int N = route_cases[k][0], tokens = route_cases[k][1], d = route_cases[k][2];
            int heads = route_cases[k][3];
            size_t size = (size_t)tokens * d, n_weights = (size_t)N * tokens * heads;
            RouteProblem p = route_problem(N, tokens, d, heads, delta, 10 * k + delta);
            const float *sources[MAX_SOURCES];
            point_into(sources, p.sources, N, size);
            float *out = poisoned_floats(size), *weights = poisoned_floats(n_weights);
            float *rstd = poisoned_floats((size_t)N * tokens);
            cpu_route_forward(out, weights, rstd, sources, N, p.query, p.key_norm, p.base, p.alpha,
                              tokens, d, heads, route_eps);
            double *expected = malloc(size * sizeof(double));
            double *expected_weights = malloc(n_weights * sizeof(double));
            double *expected_rstd = malloc((size_t)N * tokens * sizeof(double));
            reference_route(expected, expected_weights, p.sources64, N, p.query64, p.key_norm64,
                            p.base64, p.alpha64, tokens, d, heads);
            for (int n = 0; n < N; n++)
                for (int t = 0; t < tokens; t++) {
                    double sum_squares = 0;
                    for (int c = 0; c < d; c++)
                        sum_squares += p.sources64[n * size + (size_t)t * d + c] *
                                       p.sources64[n * size + (size_t)t * d + c];
                    expected_rstd[n * tokens + t] = 1 / sqrt(sum_squares / d + route_eps);
                }
            expect_close(out, expected, size, FORWARD_TOLERANCE, "out");
            expect_close(weights, expected_weights, n_weights, FORWARD_TOLERANCE, "weights");
            expect_close(rstd, expected_rstd, (size_t)N * tokens, FORWARD_TOLERANCE, "rstd");
            free(out), free(weights), free(rstd);
            free(expected), free(expected_weights), free(expected_rstd);
            route_problem_free(&p);
        }
}

Test(route_cpu, route_backward_matches_finite_differences_for_every_input)
{
    for (size_t k = 0; k < sizeof route_cases / sizeof route_cases[0]; k++)
        for (int delta = 0; delta <= 1; delta++) {
            int N = route_cases[k][0], tokens = route_cases[k][1], d = route_cases[k][2];
            RouteProblem p = route_problem(N, tokens, d, route_cases[k][3], delta, 20 * k + delta);
            RouteGradients g = route_gradients(&p, 1);
            cr_log_info("route N %d tokens %d d %d heads %d delta %d", N, tokens, d,
                        route_cases[k][3], delta);
            expect_gradient(route_objective, &p, p.sources64, g.dsources,
                            (size_t)N * tokens * d, "dsources");
            expect_gradient(route_objective, &p, p.query64, g.dquery, d, "dquery");
            expect_gradient(route_objective, &p, p.key_norm64, g.dkey_norm, d, "dkey_norm");
            if (delta)
                expect_gradient(route_objective, &p, &p.alpha64, &g.dalpha, 1, "dalpha");
            route_gradients_free(&g);
            route_problem_free(&p);
        }
}

Test(route_cpu, route_backward_skips_a_source_whose_gradient_is_null)
{
    RouteProblem p = route_problem(5, 7, 15, 3, true, 30);
    size_t size = (size_t)7 * 15;
    RouteGradients full = route_gradients(&p, 1);
    RouteGradients partial = {zero_floats(5 * size), zero_floats(15), zero_floats(15), 0};
    const float *sources[MAX_SOURCES];
    float *dsources[MAX_SOURCES], *out = zero_floats(size), *weights = zero_floats(5 * 7 * 3);
    float *rstd = zero_floats(5 * 7), *scratch = zero_floats(5 * 7 * 3);
    point_into(sources, p.sources, 5, size);
    point_into((const float **)dsources, partial.dsources, 5, size);
    dsources[2] = NULL;
    cpu_route_forward(out, weights, rstd, sources, 5, p.query, p.key_norm, p.base, p.alpha, 7,
                      15, 3, route_eps);
    cpu_route_backward(dsources, partial.dquery, partial.dkey_norm, &partial.dalpha, p.probe,
                       sources, 5, weights, rstd, p.query, p.key_norm, true, p.alpha, scratch, 7,
                       15, 3);
    for (int n = 0; n < 5; n++)
        if (n != 2)
            expect_bitwise_equal(partial.dsources + n * size, full.dsources + n * size, size,
                                 "dsources of a wanted source");
    for (size_t i = 0; i < size; i++)
        cr_assert_eq(partial.dsources[2 * size + i], 0.0f, "the skipped source was written");
    expect_bitwise_equal(partial.dquery, full.dquery, 15, "dquery");
    expect_bitwise_equal(partial.dkey_norm, full.dkey_norm, 15, "dkey_norm");
    free(out), free(weights), free(rstd), free(scratch);
    route_gradients_free(&full);
    route_gradients_free(&partial);
    route_problem_free(&p);
}

Test(route_cpu, zero_query_gives_equal_weights_and_the_mean_of_the_sources)
{
    int N = 5, tokens = 6, d = 24, heads = 8;
    size_t size = (size_t)tokens * d;
    RouteProblem p = route_problem(N, tokens, d, heads, false, 40);
    memset(p.query, 0, d * sizeof(float));
    const float *sources[MAX_SOURCES];
    point_into(sources, p.sources, N, size);
    float *out = poisoned_floats(size), *weights = poisoned_floats((size_t)N * tokens * heads);
    float *rstd = poisoned_floats((size_t)N * tokens);
    cpu_route_forward(out, weights, rstd, sources, N, p.query, p.key_norm, NULL, 0, tokens, d,
                      heads, route_eps);
    for (int i = 0; i < N * tokens * heads; i++)
        cr_assert_eq(weights[i], weights[0], "weight %d is not the others' %a", i, weights[0]);
    double *mean = calloc(size, sizeof(double));
    for (int n = 0; n < N; n++)
        for (size_t i = 0; i < size; i++)
            mean[i] += p.sources64[n * size + i] / N;
    expect_close(out, mean, size, 1e-6, "zero-query mix against the mean");
    free(out), free(weights), free(rstd), free(mean);
    route_problem_free(&p);
}

/* AttnRes written for one query over the whole width, in the arithmetic route_cpu.c states */
static void single_query_route(float *out, const float *const *sources, int N,
                               const float *query, const float *key_norm, int tokens, int d)
{
    for (int t = 0; t < tokens; t++) {
        float a[MAX_SOURCES], z[MAX_SOURCES];
        double max_z = -INFINITY, sum = 0;
        for (int n = 0; n < N; n++) {
            const float *s = sources[n] + (size_t)t * d;
            double sum_squares = 0, dot = 0;
            for (int c = 0; c < d; c++)
                sum_squares += (double)s[c] * s[c];
            float r = (float)(1.0 / sqrt(sum_squares / d + (double)route_eps));
            for (int c = 0; c < d; c++)
                dot += (double)query[c] * (key_norm[c] * (s[c] * r));
            z[n] = (float)dot;
            max_z = fmax(max_z, z[n]);
        }
        for (int n = 0; n < N; n++)
            sum += exp(z[n] - max_z);
        for (int n = 0; n < N; n++)
            a[n] = (float)(exp(z[n] - max_z) / sum);
        for (int c = 0; c < d; c++) {
            double mix = 0;
            for (int n = 0; n < N; n++)
                mix += (double)a[n] * sources[n][(size_t)t * d + c];
            out[(size_t)t * d + c] = (float)mix;
        }
    }
}

Test(route_cpu, one_head_equals_the_single_query_formula)
{
    int N = 9, tokens = 5, d = 15;
    size_t size = (size_t)tokens * d;
    RouteProblem p = route_problem(N, tokens, d, 1, false, 50);
    const float *sources[MAX_SOURCES];
    point_into(sources, p.sources, N, size);
    float *out = poisoned_floats(size), *expected = poisoned_floats(size);
    float *weights = zero_floats((size_t)N * tokens), *rstd = zero_floats((size_t)N * tokens);
    cpu_route_forward(out, weights, rstd, sources, N, p.query, p.key_norm, NULL, 0, tokens, d, 1,
                      route_eps);
    single_query_route(expected, sources, N, p.query, p.key_norm, tokens, d);
    expect_bitwise_equal(out, expected, size, "H = 1 against the single-query formula");
    free(out), free(expected), free(weights), free(rstd);
    route_problem_free(&p);
}

Test(route_cpu, delta_form_with_zero_gate_returns_the_base_even_in_place)
{
    int N = 5, tokens = 7, d = 15, heads = 3;
    size_t size = (size_t)tokens * d;
    RouteProblem p = route_problem(N, tokens, d, heads, true, 60);
    const float *sources[MAX_SOURCES];
    point_into(sources, p.sources, N, size);
    float *out = poisoned_floats(size), *in_place = malloc(size * sizeof(float));
    float *weights = zero_floats((size_t)N * tokens * heads);
    float *rstd = zero_floats((size_t)N * tokens);
    memcpy(in_place, p.base, size * sizeof(float));
    cpu_route_forward(out, weights, rstd, sources, N, p.query, p.key_norm, p.base, 0.0f, tokens,
                      d, heads, route_eps);
    expect_bitwise_equal(out, p.base, size, "delta out with alpha = 0 against base");
    cpu_route_forward(in_place, weights, rstd, sources, N, p.query, p.key_norm, in_place, 0.0f,
                      tokens, d, heads, route_eps);
    expect_bitwise_equal(in_place, p.base, size, "in-place delta out with alpha = 0");
    free(out), free(in_place), free(weights), free(rstd);
    route_problem_free(&p);
}

Test(route_cpu, route_backward_accumulates)
{
    RouteProblem p = route_problem(5, 7, 15, 3, true, 70);
    RouteGradients once = route_gradients(&p, 1), twice = route_gradients(&p, 2);
    expect_doubled(twice.dsources, once.dsources, 5 * 7 * 15, "dsources");
    expect_doubled(twice.dquery, once.dquery, 15, "dquery");
    expect_doubled(twice.dkey_norm, once.dkey_norm, 15, "dkey_norm");
    expect_doubled(&twice.dalpha, &once.dalpha, 1, "dalpha");
    route_gradients_free(&once);
    route_gradients_free(&twice);
    route_problem_free(&p);
}

Test(route_cpu, route_backward_is_bitwise_identical_for_1_and_2_threads)
{
    /* 257 tokens over 64 chunks, 200 channels over 4 blocks; well above the parallel
     * threshold */
    int N = 5, tokens = 257, d = 200, heads = 8;
    RouteProblem p = route_problem(N, tokens, d, heads, true, 80);
    omp_set_num_threads(1);
    RouteGradients one = route_gradients(&p, 1);
    omp_set_num_threads(2);
    RouteGradients two = route_gradients(&p, 1);
    expect_bitwise_equal(one.dsources, two.dsources, (size_t)N * tokens * d, "dsources");
    expect_bitwise_equal(one.dquery, two.dquery, d, "dquery");
    expect_bitwise_equal(one.dkey_norm, two.dkey_norm, d, "dkey_norm");
    expect_bitwise_equal(&one.dalpha, &two.dalpha, 1, "dalpha");
    route_gradients_free(&one);
    route_gradients_free(&two);
    route_problem_free(&p);
}
