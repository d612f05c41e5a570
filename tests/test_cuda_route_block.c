/* tests/test_cuda_route_block.c — the two-phase Route of the cuda op table
 * (route_block_forward / backward, route_merge_forward / backward; DESIGN 2.1;
 * docs/design-notes.md, "Two-phase routing"; the delta gate's ops are
 * tests/test_cuda_route_gate.c's) against the cpu table's, which loops the per-site Route
 * (kernels/cpu/route_block_cpu.c): so each case holds the cuda two-phase ops to the per-site
 * reference.
 *
 * Rules of tests/cuda_backend_support.h: fresh random inputs rounded to bf16, outputs
 * poisoned with NaN on both backends, "+=" outputs from random starts, relative errors within
 * bf16 tolerance (1e-2) for activations and 1e-3 for fp32 statistics and weight gradients, and
 * the cuda call run twice from the same start must give the same bits. The statistics a
 * backward reads (weights, rstd, a merge's phase-one result and lse, a merged output) come
 * from the cpu forward of the same inputs.
 * Shapes (N sources, G sites, tokens, d, H): the block kernels (N <= 12, G <= 8, d <= 4096,
 * head_dim % 8 == 0) with heads that are whole warps (d 4096, H 8 and H 1), heads inside a
 * warp (d 1280, H 8: 20 lanes; d 256, H 32: one lane), a row shorter than a warp (d 24),
 * one token, tokens that are multiples of nothing, and more tokens than multiprocessors (the
 * persistent kernels' double buffers in use), N 10 (the 1B model's last block in the delta
 * form) and 12 (the widest source bucket); and the per-site kernels past the limits (N 13,
 * G 9, head_dim 4, d 8192). Each test SKIPs where no GPU answers.
 */
#include "kernels/cuda/route_block_cuda.h"
#include "runtime/error.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE
#define STATISTIC BACKEND_STATISTIC_TOLERANCE
#define EPS 1e-5f

enum { MAX_SOURCES = 16, MAX_SITES = 12 };

typedef struct {
    int n_sources, n_sites, tokens, d, heads;
} BlockShape;

/* {5, 8, 300, 4096, 8}: more tokens than an H200 has multiprocessors, so that the persistent
 * kernels take several tokens a block and run through their double buffers, and the forward
 * on tensor cores, two tokens a block at N <= 6, meets pairs without a second token;
 * {4, 4, 7, 4096, 8}: such a pair first, its second buffer never written; {2, 8, 20, 4096, 8}
 * and {6, 4, 41, 4096, 1}: the pairs' other source counts; {6, 7, 150, 2048, 8}: heads of
 * one whole warp in the row layout, whose dots make the coefficients themselves (as the split
 * layout's d 1280, 512 and 2048 H 16 do); {4, 8, 200, 1280, 8}: a walker grid of three
 * rounds of the multiprocessors at d 1280 (two slices of 640 channels), some ranges two
 * tokens long; {12, 8, 700, 1280, 8}: the walker at two blocks a multiprocessor, ranges of
 * five tokens; {3, 8, 90, 640, 4}: one slice of 640 channels */
static const BlockShape block_kernel_shapes[] = {
    {9, 8, 33, 4096, 8}, {3, 4, 100, 4096, 1}, {5, 8, 33, 1280, 8},  {2, 3, 17, 256, 32},
    {4, 2, 33, 24, 3},   {7, 5, 1, 512, 4},    {9, 1, 50, 2048, 16}, {5, 8, 300, 4096, 8},
    {4, 4, 7, 4096, 8},  {2, 8, 20, 4096, 8},  {6, 4, 41, 4096, 1},  {10, 8, 33, 1280, 8},
    {12, 3, 17, 256, 8}, {6, 7, 150, 2048, 8}, {4, 8, 200, 1280, 8}, {12, 8, 700, 1280, 8},
    {3, 8, 90, 640, 4},
};
static const BlockShape per_site_shapes[] = {
    {13, 2, 33, 256, 8}, {3, 9, 20, 256, 2}, {2, 3, 33, 20, 5}, {2, 2, 5, 8192, 8},
};
#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

static BlockShape shape_of(const OpCase *c)
{
    return (BlockShape){c->shape[0], c->shape[1], c->shape[2], c->shape[3], c->shape[4]};
}

static void set_shape(OpCase *c, BlockShape s, int flag)
{
    c->shape[0] = s.n_sources, c->shape[1] = s.n_sites, c->shape[2] = s.tokens;
    c->shape[3] = s.d, c->shape[4] = s.heads, c->shape[5] = flag;
}

static void split_floats(float *base, int count, size_t size, float **out)
{
    for (int n = 0; n < count; n++)
        out[n] = base + (size_t)n * size;
}

/* a query of scale 2/sqrt(head_dim): scores O(1), a softmax neither flat nor one-hot */
static float query_scale(BlockShape s)
{
    return 2.0f / sqrtf((float)(s.d / s.heads));
}

static size_t rows_of(BlockShape s)
{
    return (size_t)s.tokens * s.d;
}

/* The cpu phase one of `s` into host arrays (weights [G][N][tokens][H], one rstd, lse). */
static void cpu_phase_one(BlockShape s, const float *sources, const float *queries,
                          const float *key_norms, float *weights, float *rstd, float *lse,
                          float *results)
{
    const Backend *cpu = backend_cpu();
    const Activation *source_rows[MAX_SOURCES], *query[MAX_SITES], *key_norm[MAX_SITES];
    Activation *result[MAX_SITES];
    float *weight[MAX_SITES], *rstd_of[MAX_SITES], *lse_of[MAX_SITES];
    float *own_results = results ? NULL : calloc((size_t)s.n_sites * rows_of(s), sizeof(float));
    split_rows_const(cpu, sources, s.n_sources, rows_of(s), source_rows);
    split_rows_const(cpu, queries, s.n_sites, (size_t)s.d, query);
    split_rows_const(cpu, key_norms, s.n_sites, (size_t)s.d, key_norm);
    split_rows(cpu, results ? results : own_results, s.n_sites, rows_of(s), result);
    split_floats(weights, s.n_sites, (size_t)s.n_sources * s.tokens * s.heads, weight);
    for (int i = 0; i < s.n_sites; i++)
        rstd_of[i] = rstd; /* the same values for every site */
    if (lse)
        split_floats(lse, s.n_sites, (size_t)s.tokens * s.heads, lse_of);
    cpu->route_block_forward(result, weight, rstd_of, lse ? lse_of : NULL, source_rows,
                             s.n_sources, query, key_norm, s.n_sites, s.tokens, s.d, s.heads,
                             EPS);
    free(own_results);
}

/* ---- route_block_forward: shape N, G, tokens, d, H, lse wanted ---- */

enum { FORWARD_RESULTS, FORWARD_WEIGHTS, FORWARD_RSTD, FORWARD_LSE, FORWARD_SOURCES,
       FORWARD_QUERIES, FORWARD_KEY_NORMS };

static void run_block_forward(const Backend *b, void *const *p, const OpCase *c)
{
    const BlockShape s = shape_of(c);
    Activation *results[MAX_SITES];
    const Activation *sources[MAX_SOURCES], *queries[MAX_SITES], *key_norms[MAX_SITES];
    float *weights[MAX_SITES], *rstd[MAX_SITES], *lse[MAX_SITES];
    split_rows(b, p[FORWARD_RESULTS], s.n_sites, rows_of(s), results);
    split_floats(p[FORWARD_WEIGHTS], s.n_sites, (size_t)s.n_sources * s.tokens * s.heads,
                 weights);
    split_floats(p[FORWARD_RSTD], s.n_sites, (size_t)s.n_sources * s.tokens, rstd);
    split_floats(p[FORWARD_LSE], s.n_sites, (size_t)s.tokens * s.heads, lse);
    split_rows_const(b, p[FORWARD_SOURCES], s.n_sources, rows_of(s), sources);
    split_rows_const(b, p[FORWARD_QUERIES], s.n_sites, (size_t)s.d, queries);
    split_rows_const(b, p[FORWARD_KEY_NORMS], s.n_sites, (size_t)s.d, key_norms);
    b->route_block_forward(results, weights, rstd, c->shape[5] ? lse : NULL, sources,
                           s.n_sources, queries, key_norms, s.n_sites, s.tokens, s.d, s.heads,
                           EPS);
}

static void check_block_forward(BlockShape s, bool lse, uint64_t seed)
{
    OpCase c = op_case("route_block_forward", run_block_forward);
    set_shape(&c, s, lse);
    op_output(&c, "results", ARRAY_ACTIVATION, (size_t)s.n_sites * rows_of(s), BF16_OUT);
    op_output(&c, "weights", ARRAY_FLOAT, (size_t)s.n_sites * s.n_sources * s.tokens * s.heads,
              STATISTIC);
    op_output(&c, "rstd", ARRAY_FLOAT, (size_t)s.n_sites * s.n_sources * s.tokens, STATISTIC);
    if (lse) /* written only when asked for: otherwise an input the op must not touch */
        op_output(&c, "lse", ARRAY_FLOAT, (size_t)s.n_sites * s.tokens * s.heads, STATISTIC);
    else
        op_input(&c, "lse", ARRAY_FLOAT, (size_t)s.n_sites * s.tokens * s.heads, 0, 0);
    op_input(&c, "sources", ARRAY_ACTIVATION, (size_t)s.n_sources * rows_of(s), 1, 0);
    op_input(&c, "queries", ARRAY_ACTIVATION, (size_t)s.n_sites * s.d, query_scale(s), 0);
    op_input(&c, "key_norms", ARRAY_ACTIVATION, (size_t)s.n_sites * s.d, 0.5f, 1);
    op_check(&c, seed);
}

Test(cuda_route_block, block_forward_is_each_sites_route_on_the_block_kernels)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "simt", 1); /* the tensor-core set has tests below */
    for (int i = 0; i < COUNT(block_kernel_shapes); i++)
        check_block_forward(block_kernel_shapes[i], i % 2 == 0, 600 + (uint64_t)i);
}

Test(cuda_route_block, block_forward_is_each_sites_route_past_the_block_kernels_limits)
{
    gpu_require();
    for (int i = 0; i < COUNT(per_site_shapes); i++)
        check_block_forward(per_site_shapes[i], true, 650 + (uint64_t)i);
}

/* ---- route_block_backward: shape N, G, tokens, d, H, form (0 delta, 1 replace with the
 * merges' centres, 2 replace without), the sources written rather than added into (a mask)
 * ---- */

enum { BACKWARD_DSOURCES, BACKWARD_DQUERIES, BACKWARD_DKEY_NORMS, BACKWARD_DALPHAS,
       BACKWARD_DOUTS, BACKWARD_SOURCES, BACKWARD_WEIGHTS, BACKWARD_RSTD, BACKWARD_QUERIES,
       BACKWARD_KEY_NORMS, BACKWARD_ALPHAS, BACKWARD_MEANS, BACKWARD_SCRATCH };

static void run_block_backward(const Backend *b, void *const *p, const OpCase *c)
{
    const BlockShape s = shape_of(c);
    const int form = c->shape[5];
    Activation *dsources[MAX_SOURCES];
    const Activation *douts[MAX_SITES], *sources[MAX_SOURCES], *queries[MAX_SITES];
    const Activation *key_norms[MAX_SITES];
    float *dqueries[MAX_SITES], *dkey_norms[MAX_SITES], *dalphas[MAX_SITES];
    float *weights[MAX_SITES], *alphas[MAX_SITES], *means[MAX_SITES];
    split_rows(b, p[BACKWARD_DSOURCES], s.n_sources, rows_of(s), dsources);
    split_floats(p[BACKWARD_DQUERIES], s.n_sites, (size_t)s.d, dqueries);
    split_floats(p[BACKWARD_DKEY_NORMS], s.n_sites, (size_t)s.d, dkey_norms);
    split_floats(p[BACKWARD_DALPHAS], s.n_sites, 1, dalphas);
    split_rows_const(b, p[BACKWARD_DOUTS], s.n_sites, rows_of(s), douts);
    split_rows_const(b, p[BACKWARD_SOURCES], s.n_sources, rows_of(s), sources);
    split_floats(p[BACKWARD_WEIGHTS], s.n_sites, (size_t)s.n_sources * s.tokens * s.heads,
                 weights);
    split_rows_const(b, p[BACKWARD_QUERIES], s.n_sites, (size_t)s.d, queries);
    split_rows_const(b, p[BACKWARD_KEY_NORMS], s.n_sites, (size_t)s.d, key_norms);
    split_floats(p[BACKWARD_ALPHAS], s.n_sites, 1, alphas);
    split_floats(p[BACKWARD_MEANS], s.n_sites, (size_t)s.tokens * s.heads, means);
    b->route_block_backward(dsources, (unsigned)c->shape[6], dqueries, dkey_norms, dalphas,
                            douts, sources,
                            s.n_sources, (const float *const *)weights, p[BACKWARD_RSTD],
                            queries, key_norms, form == 0 ? (const float *const *)alphas : NULL,
                            form == 1 ? (const float *const *)means : NULL, s.n_sites,
                            p[BACKWARD_SCRATCH], s.tokens, s.d, s.heads);
}

/* weights and rstd of the cpu phase one (they do not depend on the form) */
static void prepare_block_backward(OpCase *c)
{
    const BlockShape s = shape_of(c);
    cpu_phase_one(s, op_host(c, BACKWARD_SOURCES), op_host(c, BACKWARD_QUERIES),
                  op_host(c, BACKWARD_KEY_NORMS), op_host(c, BACKWARD_WEIGHTS),
                  op_host(c, BACKWARD_RSTD), NULL, NULL);
}

static void check_block_backward_writing(BlockShape s, int form, unsigned written,
                                        uint64_t seed)
{
    OpCase c = op_case("route_block_backward", run_block_backward);
    set_shape(&c, s, form);
    c.shape[6] = (int)written;
    c.prepare = prepare_block_backward;
    op_accumulated(&c, "dsources", ARRAY_ACTIVATION, (size_t)s.n_sources * rows_of(s), BF16_OUT);
    op_accumulated(&c, "dqueries", ARRAY_FLOAT, (size_t)s.n_sites * s.d, STATISTIC);
    op_accumulated(&c, "dkey_norms", ARRAY_FLOAT, (size_t)s.n_sites * s.d, STATISTIC);
    op_accumulated(&c, "dalphas", ARRAY_FLOAT, (size_t)s.n_sites, STATISTIC);
    op_input(&c, "douts", ARRAY_ACTIVATION, (size_t)s.n_sites * rows_of(s), 1, 0);
    op_input(&c, "sources", ARRAY_ACTIVATION, (size_t)s.n_sources * rows_of(s), 1, 0);
    op_input(&c, "weights", ARRAY_FLOAT, (size_t)s.n_sites * s.n_sources * s.tokens * s.heads,
             0, 0);
    op_input(&c, "rstd", ARRAY_FLOAT, (size_t)s.n_sources * s.tokens, 0, 0);
    op_input(&c, "queries", ARRAY_ACTIVATION, (size_t)s.n_sites * s.d, query_scale(s), 0);
    op_input(&c, "key_norms", ARRAY_ACTIVATION, (size_t)s.n_sites * s.d, 0.5f, 1);
    op_input(&c, "alphas", ARRAY_FLOAT, (size_t)s.n_sites, 0.5f, 0.8f);
    op_input(&c, "means", ARRAY_FLOAT, (size_t)s.n_sites * s.tokens * s.heads, 1, 0);
    op_cpu_scratch(&c, "scratch", (size_t)s.n_sources * s.tokens * s.heads);
    op_check(&c, seed);
}

static void check_block_backward(BlockShape s, int form, uint64_t seed)
{
    check_block_backward_writing(s, form, 0, seed);
}

Test(cuda_route_block, block_backward_is_each_sites_route_backward_in_the_delta_form)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "simt", 1); /* the tensor-core set has tests below */
    for (int i = 0; i < COUNT(block_kernel_shapes); i++)
        check_block_backward(block_kernel_shapes[i], 0, 700 + (uint64_t)i);
    for (int i = 0; i < COUNT(per_site_shapes); i++)
        check_block_backward(per_site_shapes[i], 0, 750 + (uint64_t)i);
}

/* dalphas are given in the replace form too: it must leave them as they were */
Test(cuda_route_block, block_backward_is_each_sites_route_backward_about_the_merges_centres)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "simt", 1); /* the tensor-core set has tests below */
    for (int i = 0; i < COUNT(block_kernel_shapes); i++)
        check_block_backward(block_kernel_shapes[i], 1, 800 + (uint64_t)i);
    for (int i = 0; i < COUNT(per_site_shapes); i++)
        check_block_backward(per_site_shapes[i], 1, 850 + (uint64_t)i);
}

Test(cuda_route_block, block_backward_is_each_sites_route_backward_in_the_replace_form)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "simt", 1); /* the tensor-core set has tests below */
    for (int i = 0; i < COUNT(block_kernel_shapes); i++)
        check_block_backward(block_kernel_shapes[i], 2, 900 + (uint64_t)i);
}

/* ---- route_merge_forward: shape N + 1 sources, -, tokens, d, H ---- */

enum { MERGE_OUT, MERGE_WEIGHTS, MERGE_RSTD, MERGE_RESULT, MERGE_LSE, MERGE_SOURCES,
       MERGE_QUERY, MERGE_KEY_NORM };

static void run_merge_forward(const Backend *b, void *const *p, const OpCase *c)
{
    const BlockShape s = shape_of(c);
    const Activation *sources[MAX_SOURCES];
    split_rows_const(b, p[MERGE_SOURCES], s.n_sources, rows_of(s), sources);
    b->route_merge_forward(p[MERGE_OUT], p[MERGE_WEIGHTS], p[MERGE_RSTD], p[MERGE_RESULT],
                           p[MERGE_LSE], sources[s.n_sources - 1], s.n_sources, p[MERGE_QUERY],
                           p[MERGE_KEY_NORM], s.tokens, s.d, s.heads, EPS);
}

/* phase one over the completed sources: result, lse, and rows 0..N-1 of weights and rstd */
static void prepare_merge_forward(OpCase *c)
{
    BlockShape s = shape_of(c);
    s.n_sources -= 1, s.n_sites = 1;
    cpu_phase_one(s, op_host(c, MERGE_SOURCES), op_host(c, MERGE_QUERY),
                  op_host(c, MERGE_KEY_NORM), op_host(c, MERGE_WEIGHTS), op_host(c, MERGE_RSTD),
                  op_host(c, MERGE_LSE), op_host(c, MERGE_RESULT));
}

static void check_merge_forward(BlockShape s, uint64_t seed)
{
    const int all = s.n_sources + 1;
    OpCase c = op_case("route_merge_forward", run_merge_forward);
    s.n_sources = all, s.n_sites = 1;
    set_shape(&c, s, 0);
    c.prepare = prepare_merge_forward;
    op_output(&c, "out", ARRAY_ACTIVATION, rows_of(s), BF16_OUT);
    op_updated(&c, "weights", (size_t)all * s.tokens * s.heads, 0, 0, STATISTIC);
    op_updated(&c, "rstd", (size_t)all * s.tokens, 0, 0, STATISTIC);
    op_input(&c, "result", ARRAY_ACTIVATION, rows_of(s), 0, 0);
    op_input(&c, "lse", ARRAY_FLOAT, (size_t)s.tokens * s.heads, 0, 0);
    op_input(&c, "sources", ARRAY_ACTIVATION, (size_t)all * rows_of(s), 1, 0);
    op_input(&c, "query", ARRAY_ACTIVATION, (size_t)s.d, query_scale(s), 0);
    op_input(&c, "key_norm", ARRAY_ACTIVATION, (size_t)s.d, 0.5f, 1);
    op_check(&c, seed);
}

/* the completed sources' count in each shape, then the partial */
Test(cuda_route_block, merge_forward_is_the_route_over_the_completed_sources_and_the_partial)
{
    gpu_require();
    for (int i = 0; i < COUNT(block_kernel_shapes); i++)
        check_merge_forward(block_kernel_shapes[i], 1000 + (uint64_t)i);
    check_merge_forward(per_site_shapes[2], 1050); /* head_dim 4: narrower vectors */
}

/* ---- route_merge_backward: shape sources, -, tokens, d, H, has_partial ---- */

enum { MERGE_BACK_DPARTIAL, MERGE_BACK_DQUERY, MERGE_BACK_DKEY_NORM, MERGE_BACK_MEAN,
       MERGE_BACK_DOUT, MERGE_BACK_OUT, MERGE_BACK_SOURCES, MERGE_BACK_WEIGHTS,
       MERGE_BACK_RSTD, MERGE_BACK_QUERY, MERGE_BACK_KEY_NORM, MERGE_BACK_SCRATCH };

static void run_merge_backward(const Backend *b, void *const *p, const OpCase *c)
{
    const BlockShape s = shape_of(c);
    const Activation *sources[MAX_SOURCES];
    split_rows_const(b, p[MERGE_BACK_SOURCES], s.n_sources, rows_of(s), sources);
    b->route_merge_backward(p[MERGE_BACK_DPARTIAL], GRAD_ADD, p[MERGE_BACK_DQUERY],
                            p[MERGE_BACK_DKEY_NORM], p[MERGE_BACK_MEAN], p[MERGE_BACK_DOUT],
                            p[MERGE_BACK_OUT], c->shape[5] ? sources[s.n_sources - 1] : NULL,
                            s.n_sources, p[MERGE_BACK_WEIGHTS], p[MERGE_BACK_RSTD],
                            p[MERGE_BACK_QUERY], p[MERGE_BACK_KEY_NORM], p[MERGE_BACK_SCRATCH],
                            s.tokens, s.d, s.heads);
}

/* the site's forward over all its sources: out, weights, rstd */
static void prepare_merge_backward(OpCase *c)
{
    BlockShape s = shape_of(c);
    s.n_sites = 1;
    cpu_phase_one(s, op_host(c, MERGE_BACK_SOURCES), op_host(c, MERGE_BACK_QUERY),
                  op_host(c, MERGE_BACK_KEY_NORM), op_host(c, MERGE_BACK_WEIGHTS),
                  op_host(c, MERGE_BACK_RSTD), NULL, op_host(c, MERGE_BACK_OUT));
}

static void check_merge_backward(BlockShape s, bool partial, uint64_t seed)
{
    const int all = s.n_sources + (partial ? 1 : 0);
    OpCase c = op_case("route_merge_backward", run_merge_backward);
    s.n_sources = all, s.n_sites = 1;
    set_shape(&c, s, partial);
    c.prepare = prepare_merge_backward;
    op_accumulated(&c, "dpartial", ARRAY_ACTIVATION, rows_of(s), BF16_OUT);
    /* the cuda centre is < dout, out > with out in bf16: bf16's tolerance, for it and for
     * the query and key-norm gradients made from it (measured on an H200: 1.4e-3 to 2.4e-3
     * against the cpu's, whose out is fp32) */
    op_accumulated(&c, "dquery", ARRAY_FLOAT, (size_t)s.d, BF16_OUT);
    op_accumulated(&c, "dkey_norm", ARRAY_FLOAT, (size_t)s.d, BF16_OUT);
    op_output(&c, "mean", ARRAY_FLOAT, (size_t)s.tokens * s.heads, BF16_OUT);
    op_input(&c, "dout", ARRAY_ACTIVATION, rows_of(s), 1, 0);
    op_input(&c, "out", ARRAY_ACTIVATION, rows_of(s), 0, 0);
    op_input(&c, "sources", ARRAY_ACTIVATION, (size_t)all * rows_of(s), 1, 0);
    op_input(&c, "weights", ARRAY_FLOAT, (size_t)all * s.tokens * s.heads, 0, 0);
    op_input(&c, "rstd", ARRAY_FLOAT, (size_t)all * s.tokens, 0, 0);
    op_input(&c, "query", ARRAY_ACTIVATION, (size_t)s.d, query_scale(s), 0);
    op_input(&c, "key_norm", ARRAY_ACTIVATION, (size_t)s.d, 0.5f, 1);
    op_cpu_scratch(&c, "scratch", (size_t)s.tokens * s.heads);
    op_check(&c, seed);
}

Test(cuda_route_block, merge_backward_gives_the_centre_and_the_partials_share)
{
    gpu_require();
    for (int i = 0; i < COUNT(block_kernel_shapes); i++) {
        check_merge_backward(block_kernel_shapes[i], true, 1100 + (uint64_t)i);
        check_merge_backward(block_kernel_shapes[i], false, 1150 + (uint64_t)i);
    }
    check_merge_backward(per_site_shapes[2], true, 1190);
    /* more tokens than the warp-a-token backward's 1056 warps: a warp takes two or three
     * (at 300 tokens and fewer every warp took one, and no test walked a warp's second) */
    check_merge_backward((BlockShape){5, 1, 2500, 1280, 8}, true, 1191);
    check_merge_backward((BlockShape){3, 1, 2200, 512, 4}, false, 1192);
}

/* ---- the tensor-core kernels (FATHOM_ROUTE_BLOCK=mma, kernels/cuda/route_block_mma.cuh):
 * heads of whole warps (head_dim a multiple of 256), N up to 12 (the zero row pads the
 * sources to 16), G up to 8 (sites past G are zero columns), one token or many. Each test
 * runs in a process of its own: the variable is read anew. ---- */

static const BlockShape tensor_core_shapes[] = {
    {9, 8, 33, 4096, 8}, {3, 4, 100, 4096, 1}, {6, 7, 20, 2048, 8}, {2, 1, 1, 512, 2},
    {11, 8, 33, 4096, 8},
};

Test(cuda_route_block, block_forward_on_tensor_cores_is_each_sites_route)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "mma", 1);
    for (int i = 0; i < COUNT(tensor_core_shapes); i++)
        check_block_forward(tensor_core_shapes[i], i % 2 == 0, 1000 + (uint64_t)i);
}

Test(cuda_route_block, block_backward_on_tensor_cores_is_each_sites_route_backward)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "mma", 1);
    for (int form = 0; form < 3; form++)
        for (int i = 0; i < COUNT(tensor_core_shapes); i++)
            check_block_backward(tensor_core_shapes[i], form, 1100 + 10 * (uint64_t)form + i);
}

/* ---- the split layout (FATHOM_ROUTE_BLOCK=mma_all, kernels/cuda/route_block_device.cuh):
 * heads of 16, 20 or 24 vectors a warp (head_dim 128: d 1024 H 8; 160: the 1B graft's d 1280
 * H 8, and d 640 H 2 with two warps a head; 192: d 1536 H 8), each k-step count through the
 * pair forward (N <= 6; one token: a pair without a second) and the one-token kernel (N
 * 7-12), with more tokens than the persistent blocks take at once (pairs and single tokens);
 * and under mma_all the layouts it leaves as they were (head_dim 80: the per-thread kernels;
 * d 4096 H 8: heads of whole warps); and blocks of 4 heads (d 640 and 512 H 4), whose one
 * backward pass has four warps to a token. Each shape's kernels are asked first, so that a
 * shape the block kernels turned away cannot pass through the per-site ones unseen. ---- */

static const struct {
    BlockShape shape;
    const char *kernels, *backward; /* the backward under FATHOM_ROUTE_BLOCK_BACKWARD unset */
} split_cases[] = {
    {{5, 8, 33, 1280, 8}, "mma_split", "one_pass"},
    {{9, 8, 700, 1280, 8}, "mma_split", "one_pass"},
    {{10, 4, 33, 1280, 8}, "mma_split", "one_pass"},
    {{2, 8, 1, 1280, 8}, "mma_split", "two_pass"},
    {{4, 4, 1100, 1280, 8}, "mma_split", "two_pass"},
    {{3, 3, 17, 1024, 8}, "mma_split", "two_pass"},
    {{9, 8, 300, 1024, 8}, "mma_split", "one_pass"},
    {{7, 5, 20, 1536, 8}, "mma_split", "one_pass"},
    {{12, 8, 41, 1536, 8}, "mma_split", "one_pass"},
    {{5, 8, 1200, 1536, 8}, "mma_split", "one_pass"},
    {{4, 2, 7, 640, 2}, "mma_split", "two_pass"},
    {{9, 4, 300, 640, 2}, "mma_split", "two_pass"},
    {{5, 4, 33, 1280, 16}, "simt", "two_pass"},
    {{6, 4, 41, 4096, 8}, "mma", "two_pass"},
    {{6, 8, 90, 640, 4}, "mma_split", "one_pass"},
    {{5, 3, 40, 512, 4}, "mma_split", "one_pass"},
};

/* The kernels the case takes, and its backward (`two_pass`: forced to two passes) */
static void expect_split_kernels(int i, bool two_pass)
{
    const BlockShape s = split_cases[i].shape;
    const CudaRouteBlockLayout got =
        cuda_route_block_layout(s.n_sources, s.n_sites, s.d, s.heads);
    cr_expect_str_eq(got.kernels, split_cases[i].kernels, "case %d: %s", i, got.kernels);
    const char *backward = two_pass ? "two_pass" : split_cases[i].backward;
    cr_expect_str_eq(got.backward, backward, "case %d: %s", i, got.backward);
}

Test(cuda_route_block, block_forward_in_the_split_layout_is_each_sites_route)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "mma_all", 1);
    for (int i = 0; i < COUNT(split_cases); i++) {
        expect_split_kernels(i, false);
        check_block_forward(split_cases[i].shape, i % 2 == 1, 1200 + (uint64_t)i);
    }
}

/* In one pass where a warp is a head (route_block_one_pass_cuda.cu), in two elsewhere */
Test(cuda_route_block, block_backward_in_the_split_layout_is_each_sites_route_backward)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "mma_all", 1);
    for (int form = 0; form < 3; form++)
        for (int i = 0; i < COUNT(split_cases); i++) {
            expect_split_kernels(i, false);
            check_block_backward(split_cases[i].shape, form, 1300 + 20 * (uint64_t)form + i);
        }
}

/* The dots and the channel walker where the one pass would run */
Test(cuda_route_block, block_backward_in_two_passes_in_the_split_layout)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "mma_all", 1);
    setenv("FATHOM_ROUTE_BLOCK_BACKWARD", "two_pass", 1);
    for (int form = 0; form < 3; form++)
        for (int i = 0; i < 5; i++) { /* the d 1280 cases */
            expect_split_kernels(i, true);
            check_block_backward(split_cases[i].shape, form, 1600 + 20 * (uint64_t)form + i);
        }
}

/* Sources written rather than added into (MSAR's d E rows, which the walk no longer zeroes):
 * every kernel set and the per-site kernels past their limits, from the random starts the
 * "+=" outputs get, so that a kernel adding into a written source, or writing over one it
 * should add into, fails. */
Test(cuda_route_block, block_backward_writes_the_sources_it_is_told_to_and_adds_into_the_rest)
{
    gpu_require();
    static const struct {
        const char *kernels;
        BlockShape shape;
    } cases[] = {
        {"simt", {5, 8, 33, 4096, 8}}, {"simt", {4, 2, 33, 24, 3}},
        {"mma", {9, 8, 33, 4096, 8}},  {"mma_all", {5, 8, 33, 1280, 8}},
        {"mma_all", {10, 4, 300, 1280, 8}}, {"mma_all", {13, 2, 33, 256, 8}},
    };
    for (int i = 0; i < COUNT(cases); i++) {
        setenv("FATHOM_ROUTE_BLOCK", cases[i].kernels, 1);
        const int N = cases[i].shape.n_sources;
        const unsigned alternate = 0x5555u & ((1u << N) - 1), all_but_first = (1u << N) - 2;
        check_block_backward_writing(cases[i].shape, i % 3, alternate, 1500 + (uint64_t)i);
        check_block_backward_writing(cases[i].shape, 0, all_but_first, 1550 + (uint64_t)i);
    }
}
