/* tests/test_route_conv_cpu.c — the cpu stream route with the convolution inside the read
 * (kernels/cpu/route_conv_cpu.c; DESIGN 2.2; DESIGN 7, "Unit").
 *
 * The reference is the composition the op replaces, on the same inputs: stream_conv_forward
 * of every convolved source into a buffer, route_forward over the buffers; backward
 * route_backward into dE, then stream_conv_backward (each tested against finite differences
 * in test_route_cpu.c and test_stream_cpu.c). The fused op must give the same out, weights,
 * rstd and the same gradients of every input (sources, taps, query, key_norm) within 1e-6
 * relative. B = 2 everywhere, so a convolution that crossed the sequence boundary would
 * differ; kernel sizes 1, 2, 3, 8 (T shorter than the kernel in one case); the first source
 * has NULL taps (the null source) in most cases. Outputs are poisoned with NaN first.
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

#define COMPOSITION_TOLERANCE 1e-6
#define MAX_SOURCES 9

static const float conv_eps = 1e-5f;

/* One problem: N sources [B, T, d] of different scales, taps [k, d] per source (NULL for
 * source 0 when null_first), query, key_norm, and dout for the backward. */
typedef struct {
    int B, T, d, heads, n_sources, kernel_size;
    size_t size; /* B * T * d */
    float *sources, *taps, *query, *key_norm, *dout;
    const float *source_rows[MAX_SOURCES], *tap_rows[MAX_SOURCES];
} ConvRouteProblem;

static ConvRouteProblem conv_route_problem(int B, int T, int d, int heads, int n_sources,
                                           int kernel_size, bool null_first, uint64_t seed)
{
    ConvRouteProblem p = {.B = B, .T = T, .d = d, .heads = heads, .n_sources = n_sources,
                          .kernel_size = kernel_size};
    cr_assert_leq(n_sources, MAX_SOURCES);
    p.size = (size_t)B * T * d;
    p.sources = zero_floats((size_t)n_sources * p.size);
    p.taps = random_floats((size_t)n_sources * kernel_size * d, 0.6f, seed + 50);
    for (int n = 0; n < n_sources; n++) {
        float *rows = p.sources + (size_t)n * p.size;
        test_fill_uniform(rows, p.size, 0.5f + 0.4f * n, seed + (uint64_t)n);
        p.source_rows[n] = rows;
        p.tap_rows[n] = null_first && n == 0 ? NULL : p.taps + (size_t)n * kernel_size * d;
    }
    p.query = random_floats(d, 2.0f / sqrtf((float)(d / heads)), seed + 100);
    p.key_norm = random_floats(d, 0.5f, seed + 101);
    for (int c = 0; c < d; c++)
        p.key_norm[c] += 1.0f;
    p.dout = random_floats(p.size, 1.0f, seed + 102);
    return p;
}

static void conv_route_problem_free(ConvRouteProblem *p)
{
    free_all(p->sources, p->taps, p->query, p->key_norm, p->dout, NULL);
}

/* The outputs of one forward, and the gradients of one backward. */
typedef struct {
    float *out, *weights, *rstd;
} RouteOutputs;

typedef struct {
    float *dsources, *dtaps, *dquery, *dkey_norm;
} RouteGrads;

static RouteOutputs outputs_poisoned(const ConvRouteProblem *p)
{
    size_t rows = (size_t)p->n_sources * p->B * p->T;
    RouteOutputs o = {poisoned_floats(p->size), poisoned_floats(rows * p->heads),
                      poisoned_floats(rows)};
    return o;
}

static void outputs_free(RouteOutputs *o)
{
    free_all(o->out, o->weights, o->rstd, NULL);
}

static RouteGrads grads_zero(const ConvRouteProblem *p)
{
    RouteGrads g = {zero_floats((size_t)p->n_sources * p->size),
                    zero_floats((size_t)p->n_sources * p->kernel_size * p->d),
                    zero_floats(p->d), zero_floats(p->d)};
    return g;
}

static void grads_free(RouteGrads *g)
{
    free_all(g->dsources, g->dtaps, g->dquery, g->dkey_norm, NULL);
}

/* the gradient pointer arrays into g (dtaps NULL where the taps are) */
static void grad_pointers(const ConvRouteProblem *p, RouteGrads *g, float **dsources,
                          float **dtaps)
{
    for (int n = 0; n < p->n_sources; n++) {
        dsources[n] = g->dsources + (size_t)n * p->size;
        dtaps[n] = p->tap_rows[n] ? g->dtaps + (size_t)n * p->kernel_size * p->d : NULL;
    }
}

/* ---- the composition ---- */

/* E_k into `expanded` (the source itself for a null source) */
static void composition_expand(const ConvRouteProblem *p, float *buffers,
                               const float **expanded)
{
    for (int n = 0; n < p->n_sources; n++) {
        if (!p->tap_rows[n]) {
            expanded[n] = p->source_rows[n];
            continue;
        }
        float *E = buffers + (size_t)n * p->size;
        cpu_stream_conv_forward(E, p->source_rows[n], p->tap_rows[n], p->kernel_size, p->B,
                                p->T, p->d);
        expanded[n] = E;
    }
}

static void composition_forward(const ConvRouteProblem *p, RouteOutputs *o)
{
    float *buffers = zero_floats((size_t)p->n_sources * p->size);
    const float *expanded[MAX_SOURCES];
    composition_expand(p, buffers, expanded);
    cpu_route_forward(o->out, o->weights, o->rstd, expanded, p->n_sources, p->query,
                      p->key_norm, NULL, 0.0f, p->B * p->T, p->d, p->heads, conv_eps);
    free(buffers);
}

static void composition_backward(const ConvRouteProblem *p, const RouteOutputs *o,
                                 RouteGrads *g)
{
    const int N = p->n_sources, tokens = p->B * p->T;
    float *buffers = zero_floats((size_t)N * p->size), *dE = zero_floats((size_t)N * p->size);
    float *scratch = zero_floats((size_t)N * tokens * p->heads);
    const float *expanded[MAX_SOURCES];
    float *dexpanded[MAX_SOURCES], *dsources[MAX_SOURCES], *dtaps[MAX_SOURCES];
    composition_expand(p, buffers, expanded);
    grad_pointers(p, g, dsources, dtaps);
    for (int n = 0; n < N; n++)
        dexpanded[n] = p->tap_rows[n] ? dE + (size_t)n * p->size : dsources[n];
    cpu_route_backward(dexpanded, g->dquery, g->dkey_norm, NULL, p->dout, expanded, N,
                       o->weights, o->rstd, p->query, p->key_norm, false, 0.0f, scratch, tokens,
                       p->d, p->heads);
    for (int n = 0; n < N; n++)
        if (p->tap_rows[n])
            cpu_stream_conv_backward(dsources[n], dtaps[n], dexpanded[n], p->source_rows[n],
                                     p->tap_rows[n], p->kernel_size, p->B, p->T, p->d);
    free_all(buffers, dE, scratch, NULL);
}

/* ---- the fused op ---- */

static void fused_forward(const ConvRouteProblem *p, RouteOutputs *o)
{
    cpu_route_conv_forward(o->out, o->weights, o->rstd, p->source_rows, p->tap_rows,
                           p->n_sources, p->kernel_size, p->query, p->key_norm, p->B, p->T,
                           p->d, p->heads, conv_eps);
}

/* `calls` backward calls into g, with the saved statistics of the forward o */
static void fused_backward(const ConvRouteProblem *p, const RouteOutputs *o, RouteGrads *g,
                           int calls)
{
    float *dsources[MAX_SOURCES], *dtaps[MAX_SOURCES];
    float *scratch = zero_floats((size_t)p->n_sources * p->B * p->T * p->heads);
    grad_pointers(p, g, dsources, dtaps);
    for (int call = 0; call < calls; call++)
        cpu_route_conv_backward(dsources, dtaps, g->dquery, g->dkey_norm, p->dout,
                                p->source_rows, p->tap_rows, p->n_sources, p->kernel_size,
                                o->weights, o->rstd, p->query, p->key_norm, scratch, p->B,
                                p->T, p->d, p->heads);
    free(scratch);
}

static bool all_zero(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f)
            return false;
    return true;
}

static void expect_near(const float *got, const float *expected, size_t n, const char *what)
{
    double *reference = to_doubles(expected, n);
    expect_close(got, reference, n, COMPOSITION_TOLERANCE, what);
    free(reference);
}

/* (B, T, d, heads, N, kernel_size, null first): kernel sizes 1, 2, 3, 8; T = 3 < 8 once;
 * d = 130 spans three channel blocks of the backward's second pass */
static const int conv_route_cases[][7] = {
    {2, 5, 12, 3, 3, 1, 1}, {2, 6, 16, 2, 4, 2, 0}, {2, 7, 15, 3, 5, 3, 1},
    {2, 11, 24, 8, 9, 8, 1}, {2, 3, 8, 2, 2, 8, 0}, {2, 40, 130, 2, 3, 3, 1},
};
#define CASE_COUNT (sizeof conv_route_cases / sizeof conv_route_cases[0])

static ConvRouteProblem case_problem(size_t k, uint64_t seed)
{
    const int *c = conv_route_cases[k];
    cr_log_info("case B %d T %d d %d H %d N %d kernel %d null %d", c[0], c[1], c[2], c[3], c[4],
                c[5], c[6]);
    return conv_route_problem(c[0], c[1], c[2], c[3], c[4], c[5], c[6] != 0, seed);
}

Test(route_conv_cpu, forward_equals_stream_conv_then_route)
{
    for (size_t k = 0; k < CASE_COUNT; k++) {
        ConvRouteProblem p = case_problem(k, 10 + 100 * k);
        RouteOutputs fused = outputs_poisoned(&p), composed = outputs_poisoned(&p);
        const size_t rows = (size_t)p.n_sources * p.B * p.T;
        fused_forward(&p, &fused);
        composition_forward(&p, &composed);
        expect_near(fused.out, composed.out, p.size, "out");
        expect_near(fused.weights, composed.weights, rows * p.heads, "weights");
        expect_near(fused.rstd, composed.rstd, rows, "rstd");
        outputs_free(&fused);
        outputs_free(&composed);
        conv_route_problem_free(&p);
    }
}

/* The backward's recompute of a stream: the mix by the saved weights is the forward's out bit
 * for bit, through the kernel and through the op table, into a poisoned output. */
Test(route_conv_cpu, mix_by_the_saved_weights_is_the_forwards_out_bit_for_bit)
{
    for (size_t k = 0; k < CASE_COUNT; k++) {
        ConvRouteProblem p = case_problem(k, 20 + 100 * k);
        RouteOutputs forward = outputs_poisoned(&p), mixed = outputs_poisoned(&p),
                     table = outputs_poisoned(&p);
        fused_forward(&p, &forward);
        cpu_route_conv_mix(mixed.out, forward.weights, (const float *const *)p.source_rows,
                           (const float *const *)p.tap_rows, p.n_sources, p.kernel_size, p.B,
                           p.T, p.d, p.heads);
        backend_cpu()->route_conv_mix(AS_ACTIVATIONS(table.out), forward.weights,
                                      (const Activation *const *)p.source_rows,
                                      (const Activation *const *)p.tap_rows, p.n_sources,
                                      p.kernel_size, p.B, p.T, p.d, p.heads);
        expect_bitwise_equal(mixed.out, forward.out, p.size, "mix");
        expect_bitwise_equal(table.out, forward.out, p.size, "table mix");
        outputs_free(&forward);
        outputs_free(&mixed);
        outputs_free(&table);
        conv_route_problem_free(&p);
    }
}

Test(route_conv_cpu, backward_equals_route_backward_then_stream_conv_backward)
{
    for (size_t k = 0; k < CASE_COUNT; k++) {
        ConvRouteProblem p = case_problem(k, 20 + 100 * k);
        RouteOutputs o = outputs_poisoned(&p);
        RouteGrads fused = grads_zero(&p), composed = grads_zero(&p);
        fused_forward(&p, &o);
        fused_backward(&p, &o, &fused, 1);
        composition_backward(&p, &o, &composed);
        expect_near(fused.dsources, composed.dsources, (size_t)p.n_sources * p.size,
                    "dsources");
        expect_near(fused.dtaps, composed.dtaps, (size_t)p.n_sources * p.kernel_size * p.d,
                    "dtaps");
        expect_near(fused.dquery, composed.dquery, p.d, "dquery");
        expect_near(fused.dkey_norm, composed.dkey_norm, p.d, "dkey_norm");
        grads_free(&fused);
        grads_free(&composed);
        outputs_free(&o);
        conv_route_problem_free(&p);
    }
}

/* MSAR at init (tap 0 = 1, the others 0) is the Route of the raw sources, bit for bit:
 * DESIGN 2.2's "at init MSAR equals Block AttnRes exactly" rests on it. */
Test(route_conv_cpu, identity_taps_give_route_forward_of_the_sources_bit_for_bit)
{
    static const int kernel_sizes[] = {1, 2, 3, 8};
    for (int i = 0; i < 4; i++) {
        ConvRouteProblem p = conv_route_problem(2, 7, 24, 4, 5, kernel_sizes[i], true, 300);
        memset(p.taps, 0, (size_t)p.n_sources * p.kernel_size * p.d * sizeof(float));
        for (int n = 0; n < p.n_sources; n++)
            for (int c = 0; c < p.d; c++)
                p.taps[(size_t)n * p.kernel_size * p.d + c] = 1.0f;
        RouteOutputs fused = outputs_poisoned(&p), plain = outputs_poisoned(&p);
        const size_t rows = (size_t)p.n_sources * p.B * p.T;
        fused_forward(&p, &fused);
        cpu_route_forward(plain.out, plain.weights, plain.rstd, p.source_rows, p.n_sources,
                          p.query, p.key_norm, NULL, 0.0f, p.B * p.T, p.d, p.heads, conv_eps);
        expect_bitwise_equal(fused.out, plain.out, p.size, "out");
        expect_bitwise_equal(fused.weights, plain.weights, rows * p.heads, "weights");
        expect_bitwise_equal(fused.rstd, plain.rstd, rows, "rstd");
        outputs_free(&fused);
        outputs_free(&plain);
        conv_route_problem_free(&p);
    }
}

/* The second sequence's results do not change when the first sequence's sources do. */
Test(route_conv_cpu, convolution_never_reads_across_the_sequence_boundary)
{
    ConvRouteProblem p = conv_route_problem(2, 6, 16, 2, 3, 8, true, 400);
    RouteOutputs before = outputs_poisoned(&p), after = outputs_poisoned(&p);
    RouteGrads grads_before = grads_zero(&p), grads_after = grads_zero(&p);
    const size_t sequence = (size_t)p.T * p.d;
    fused_forward(&p, &before);
    fused_backward(&p, &before, &grads_before, 1);
    for (int n = 0; n < p.n_sources; n++)
        test_fill_uniform(p.sources + (size_t)n * p.size, sequence, 3.0f, 410 + (uint64_t)n);
    fused_forward(&p, &after);
    fused_backward(&p, &after, &grads_after, 1);
    expect_bitwise_equal(after.out + sequence, before.out + sequence, sequence,
                         "second sequence's out");
    for (int n = 0; n < p.n_sources; n++) {
        size_t offset = (size_t)n * p.size + sequence;
        expect_bitwise_equal(grads_after.dsources + offset, grads_before.dsources + offset,
                             sequence, "second sequence's dsources");
    }
    outputs_free(&before);
    outputs_free(&after);
    grads_free(&grads_before);
    grads_free(&grads_after);
    conv_route_problem_free(&p);
}

Test(route_conv_cpu, backward_accumulates)
{
    ConvRouteProblem p = conv_route_problem(2, 7, 15, 3, 4, 3, true, 500);
    RouteOutputs o = outputs_poisoned(&p);
    RouteGrads once = grads_zero(&p), twice = grads_zero(&p);
    fused_forward(&p, &o);
    fused_backward(&p, &o, &once, 1);
    fused_backward(&p, &o, &twice, 2);
    expect_doubled(twice.dsources, once.dsources, (size_t)p.n_sources * p.size, "dsources");
    expect_doubled(twice.dtaps, once.dtaps, (size_t)p.n_sources * p.kernel_size * p.d, "dtaps");
    expect_doubled(twice.dquery, once.dquery, p.d, "dquery");
    expect_doubled(twice.dkey_norm, once.dkey_norm, p.d, "dkey_norm");
    grads_free(&once);
    grads_free(&twice);
    outputs_free(&o);
    conv_route_problem_free(&p);
}

/* NULL dsources[1] and dtaps[2]: the other gradients are the full call's, bit for bit */
Test(route_conv_cpu, backward_skips_the_gradients_given_as_null)
{
    ConvRouteProblem p = conv_route_problem(2, 7, 15, 3, 4, 3, true, 600);
    RouteOutputs o = outputs_poisoned(&p);
    RouteGrads full = grads_zero(&p), partial = grads_zero(&p);
    float *dsources[MAX_SOURCES], *dtaps[MAX_SOURCES];
    float *scratch = zero_floats((size_t)p.n_sources * p.B * p.T * p.heads);
    fused_forward(&p, &o);
    fused_backward(&p, &o, &full, 1);
    grad_pointers(&p, &partial, dsources, dtaps);
    dsources[1] = NULL;
    dtaps[2] = NULL;
    cpu_route_conv_backward(dsources, dtaps, partial.dquery, partial.dkey_norm, p.dout,
                            p.source_rows, p.tap_rows, p.n_sources, p.kernel_size, o.weights,
                            o.rstd, p.query, p.key_norm, scratch, p.B, p.T, p.d, p.heads);
    const size_t taps = (size_t)p.kernel_size * p.d;
    for (int n = 0; n < p.n_sources; n++) {
        const float *ds = partial.dsources + (size_t)n * p.size;
        if (n == 1)
            cr_expect(all_zero(ds, p.size), "dsources[1] was written");
        else
            expect_bitwise_equal(ds, full.dsources + (size_t)n * p.size, p.size, "dsources");
        if (n == 2)
            cr_expect(all_zero(partial.dtaps + (size_t)n * taps, taps), "dtaps[2] was written");
        else
            expect_bitwise_equal(partial.dtaps + (size_t)n * taps,
                                 full.dtaps + (size_t)n * taps, taps, "dtaps");
    }
    expect_bitwise_equal(partial.dquery, full.dquery, p.d, "dquery");
    expect_bitwise_equal(partial.dkey_norm, full.dkey_norm, p.d, "dkey_norm");
    free(scratch);
    grads_free(&full);
    grads_free(&partial);
    outputs_free(&o);
    conv_route_problem_free(&p);
}

Test(route_conv_cpu, forward_and_backward_are_bitwise_identical_for_1_and_2_threads)
{
    /* 2 x 100 tokens of 130 channels: several tokens and channel blocks per thread */
    ConvRouteProblem p = conv_route_problem(2, 100, 130, 2, 3, 4, true, 700);
    RouteOutputs one = outputs_poisoned(&p), two = outputs_poisoned(&p);
    RouteGrads grads_one = grads_zero(&p), grads_two = grads_zero(&p);
    const size_t rows = (size_t)p.n_sources * p.B * p.T;
    omp_set_num_threads(1);
    fused_forward(&p, &one);
    fused_backward(&p, &one, &grads_one, 1);
    omp_set_num_threads(2);
    fused_forward(&p, &two);
    fused_backward(&p, &two, &grads_two, 1);
    expect_bitwise_equal(one.out, two.out, p.size, "out");
    expect_bitwise_equal(one.weights, two.weights, rows * p.heads, "weights");
    expect_bitwise_equal(grads_one.dsources, grads_two.dsources, (size_t)p.n_sources * p.size,
                         "dsources");
    expect_bitwise_equal(grads_one.dtaps, grads_two.dtaps,
                         (size_t)p.n_sources * p.kernel_size * p.d, "dtaps");
    expect_bitwise_equal(grads_one.dquery, grads_two.dquery, p.d, "dquery");
    expect_bitwise_equal(grads_one.dkey_norm, grads_two.dkey_norm, p.d, "dkey_norm");
    outputs_free(&one);
    outputs_free(&two);
    grads_free(&grads_one);
    grads_free(&grads_two);
    conv_route_problem_free(&p);
}

/* the cpu op table's entries are these kernels */
Test(route_conv_cpu, cpu_table_entries_run_the_cpu_kernels)
{
    ConvRouteProblem p = conv_route_problem(2, 5, 12, 3, 3, 2, true, 800);
    RouteOutputs direct = outputs_poisoned(&p), table = outputs_poisoned(&p);
    RouteGrads grads_direct = grads_zero(&p), grads_table = grads_zero(&p);
    const Backend *cpu = backend_cpu();
    const size_t rows = (size_t)p.n_sources * p.B * p.T;
    float *dsources[MAX_SOURCES], *dtaps[MAX_SOURCES];
    float *scratch = zero_floats(rows * p.heads);
    fused_forward(&p, &direct);
    fused_backward(&p, &direct, &grads_direct, 1);
    cpu->route_conv_forward(AS_ACTIVATIONS(table.out), table.weights, table.rstd,
                            (const Activation *const *)p.source_rows,
                            (const Activation *const *)p.tap_rows, p.n_sources, p.kernel_size,
                            AS_ACTIVATIONS(p.query), AS_ACTIVATIONS(p.key_norm), p.B, p.T, p.d,
                            p.heads, conv_eps);
    grad_pointers(&p, &grads_table, dsources, dtaps);
    cpu->route_conv_backward((Activation *const *)dsources, dtaps, grads_table.dquery,
                             grads_table.dkey_norm, AS_ACTIVATIONS(p.dout),
                             (const Activation *const *)p.source_rows,
                             (const Activation *const *)p.tap_rows, p.n_sources, p.kernel_size,
                             table.weights, table.rstd, AS_ACTIVATIONS(p.query),
                             AS_ACTIVATIONS(p.key_norm), scratch, p.B, p.T, p.d, p.heads);
    expect_bitwise_equal(table.out, direct.out, p.size, "out");
    expect_bitwise_equal(table.weights, direct.weights, rows * p.heads, "weights");
    expect_bitwise_equal(grads_table.dsources, grads_direct.dsources,
                         (size_t)p.n_sources * p.size, "dsources");
    expect_bitwise_equal(grads_table.dtaps, grads_direct.dtaps,
                         (size_t)p.n_sources * p.kernel_size * p.d, "dtaps");
    free(scratch);
    outputs_free(&direct);
    outputs_free(&table);
    grads_free(&grads_direct);
    grads_free(&grads_table);
    conv_route_problem_free(&p);
}
