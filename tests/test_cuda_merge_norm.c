/* tests/test_cuda_merge_norm.c — a replace-form site's merge inside its sublayer's norm, and
 * the merge's backward inside the norm's backward (runtime/backend.h
 * route_merge_rmsnorm_forward and route_merge_rmsnorm_backward;
 * kernels/cuda/route_merge_norm_cuda.cu, route_merge_norm_backward_cuda.cu;
 * docs/design-notes.md, "The replace form's merge inside its sublayer's norm" and "The
 * replace form's merge backward inside its sublayer's norm backward"). The forward:
 * - the cuda op table against the cpu's (the add, the merge and the norm in turn), with and
 *   without the add of the sublayer before's output into the partial first: rules of
 *   tests/cuda_backend_support.h (fresh random inputs rounded to bf16, outputs poisoned,
 *   bf16 tolerance for rows and 1e-3 for statistics, the cuda call twice the same bits);
 *   phase one's result, lse and weight rows come from the cpu's route_block_forward over the
 *   completed sources;
 * - the promise of one pass: the bits of cuda_add, cuda_route_merge_forward and
 *   cuda_rmsnorm_forward in turn, for x, the normed row, both rstd, the weights and the
 *   partial.
 * The backward:
 * - the cuda op table against the cpu's (the norm's backward, then the merge's from the dx it
 *   wrote), with the partial's share (a block's later site) and without (its first); x, the
 *   depth weights and rstd come from the cpu's Route over the site's sources, the norm's
 *   rstd from the cpu's norm of x;
 * - the promise of one pass: dx, mean, d partial, dquery and dkey_norm with the bits of
 *   cuda_rmsnorm_backward (GRAD_WRITE) and cuda_route_merge_backward in turn, d partial
 *   added into and written; dweight the same sum within fp32's rounding.
 * Shapes (completed sources N, tokens, d, heads): the one-pass kernels' (d % 256 == 0,
 * d <= 1280: the 1B step's d 1280 H 8, a lane a head at H 32, d 768 where the norm's warp
 * takes a fourth empty chunk; 2000 and 2500 tokens, more warps than the multiprocessors hold
 * at once and more tokens than the backward's 1056 warps, so a warp walks a second token)
 * and the others' (d 2048, past the norm's warp rows; d 96, past the warp-a-token merges).
 * Each test SKIPs where no GPU answers.
 */
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/route_block_cuda.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE
#define FP32_OUT BACKEND_FP32_TOLERANCE
#define STATISTIC BACKEND_STATISTIC_TOLERANCE
#define ROUTE_EPS 1e-5f
#define NORM_EPS 1e-6f
#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

typedef struct {
    int completed, tokens, d, heads;
} MergeNormShape;

static const MergeNormShape shapes[] = {
    {5, 300, 1280, 8}, {3, 33, 512, 4}, {2, 17, 256, 32}, {4, 20, 768, 8},
    {3, 9, 2048, 16},  {2, 7, 96, 4},   {3, 2000, 1280, 8}, {2, 2500, 512, 4},
};

/* ---- the op table: arrays in this order ---- */

enum { X, OUT, NORM_RSTD, WEIGHTS, RSTD, RESULT, LSE, COMPLETED, PARTIAL, QUERY, KEY_NORM,
       NORM_WEIGHT, PARTIAL_BEFORE, ADDED };

static MergeNormShape shape_of(const OpCase *c)
{
    return (MergeNormShape){c->shape[0], c->shape[1], c->shape[2], c->shape[3]};
}

static void run_merge_norm(const Backend *b, void *const *p, const OpCase *c)
{
    const MergeNormShape s = shape_of(c);
    const RouteMerge merge = {p[WEIGHTS], p[RSTD], p[RESULT], p[LSE], p[PARTIAL], p[QUERY],
                              p[KEY_NORM], s.completed + 1, s.heads, ROUTE_EPS};
    const GateAdd add = {p[ADDED], NULL, p[PARTIAL_BEFORE], p[PARTIAL]};
    b->route_merge_rmsnorm_forward(p[X], p[OUT], p[NORM_RSTD], &merge, p[NORM_WEIGHT],
                                   s.tokens, s.d, NORM_EPS, c->shape[4] ? &add : NULL);
}

/* phase one over the completed sources, on the cpu: the result, its lse and rows 0..N-1 of
 * the weights and rstd */
static void prepare_phase_one(OpCase *c)
{
    const MergeNormShape s = shape_of(c);
    const Backend *cpu = backend_cpu();
    const size_t rows = (size_t)s.tokens * s.d;
    const Activation *sources[16];
    for (int n = 0; n < s.completed; n++)
        sources[n] = activation_at_const(cpu, (const Activation *)op_host(c, COMPLETED),
                                         (size_t)n * rows);
    Activation *results[1] = {(Activation *)op_host(c, RESULT)};
    float *weights[1] = {op_host(c, WEIGHTS)}, *rstd[1] = {op_host(c, RSTD)};
    float *lse[1] = {op_host(c, LSE)};
    const Activation *queries[1] = {(const Activation *)op_host(c, QUERY)};
    const Activation *key_norms[1] = {(const Activation *)op_host(c, KEY_NORM)};
    cpu->route_block_forward(results, weights, rstd, lse, sources, s.completed, queries,
                             key_norms, 1, s.tokens, s.d, s.heads, ROUTE_EPS);
}

static void check_merge_norm(MergeNormShape s, bool adds, uint64_t seed)
{
    OpCase c = op_case("route_merge_rmsnorm_forward", run_merge_norm);
    c.shape[0] = s.completed, c.shape[1] = s.tokens, c.shape[2] = s.d, c.shape[3] = s.heads;
    c.shape[4] = adds;
    c.prepare = prepare_phase_one;
    const size_t rows = (size_t)s.tokens * s.d, all = (size_t)s.completed + 1;
    op_output(&c, "x", ARRAY_ACTIVATION, rows, BF16_OUT);
    op_output(&c, "out", ARRAY_ACTIVATION, rows, BF16_OUT);
    /* x rounded before its row sum here, not on the cpu: twice the statistics' bound, as
     * the gated norm's test allows */
    op_output(&c, "norm rstd", ARRAY_FLOAT, (size_t)s.tokens, 2 * STATISTIC);
    op_updated(&c, "weights", all * s.tokens * s.heads, 0, 0, STATISTIC);
    op_updated(&c, "rstd", all * s.tokens, 0, 0, STATISTIC);
    op_input(&c, "result", ARRAY_ACTIVATION, rows, 0, 0);
    op_input(&c, "lse", ARRAY_FLOAT, (size_t)s.tokens * s.heads, 0, 0);
    op_input(&c, "completed sources", ARRAY_ACTIVATION, (size_t)s.completed * rows, 1, 0);
    if (adds)
        op_output(&c, "partial", ARRAY_ACTIVATION, rows, BF16_OUT);
    else
        op_input(&c, "partial", ARRAY_ACTIVATION, rows, 1, 0);
    /* a query of scale 2/sqrt(head_dim): scores O(1), a softmax neither flat nor one-hot */
    op_input(&c, "query", ARRAY_ACTIVATION, (size_t)s.d, 2.0f / sqrtf((float)(s.d / s.heads)),
             0);
    op_input(&c, "key_norm", ARRAY_ACTIVATION, (size_t)s.d, 0.5f, 1);
    op_input(&c, "norm weight", ARRAY_ACTIVATION, (size_t)s.d, 0.5f, 1);
    op_input(&c, "partial before", ARRAY_ACTIVATION, rows, 1, 0);
    op_input(&c, "added", ARRAY_ACTIVATION, rows, 0.5f, 0);
    op_check(&c, seed);
}

Test(cuda_merge_norm, route_merge_rmsnorm_forward_is_the_add_the_merge_and_the_norm)
{
    gpu_require();
    for (int i = 0; i < COUNT(shapes); i++) {
        check_merge_norm(shapes[i], false, 2000 + 2 * (uint64_t)i);
        check_merge_norm(shapes[i], true, 2001 + 2 * (uint64_t)i);
    }
}

/* ---- one pass against the ops in turn, bit for bit ---- */

/* The outputs of one way of making the site, on the device. */
typedef struct {
    bf16 *x, *out, *partial;
    float *norm_rstd, *weights, *rstd;
} MergeNormOutputs;

static void outputs_make(MergeNormOutputs *o, MergeNormShape s, const float *weights,
                         const float *rstd)
{
    const size_t rows = (size_t)s.tokens * s.d, all = (size_t)s.completed + 1;
    o->x = gpu_poisoned_bf16(rows), o->out = gpu_poisoned_bf16(rows);
    o->partial = gpu_poisoned_bf16(rows);
    o->norm_rstd = gpu_poisoned_floats((size_t)s.tokens);
    o->weights = gpu_upload_floats(weights, all * s.tokens * s.heads);
    o->rstd = gpu_upload_floats(rstd, all * s.tokens);
}

static void expect_same_bits(const float *want, const float *got, size_t n, const char *name,
                             MergeNormShape s, bool adds)
{
    cr_expect_eq(memcmp(got, want, n * sizeof(float)), 0,
                 "%s differs from the ops in turn at N %d, tokens %d, d %d, H %d, %s", name,
                 s.completed, s.tokens, s.d, s.heads, adds ? "with the add" : "no add");
}

static void check_bits(MergeNormShape s, bool adds, uint64_t seed)
{
    const size_t rows = (size_t)s.tokens * s.d, all = (size_t)s.completed + 1;
    const size_t weight_count = all * s.tokens * s.heads, rstd_count = all * s.tokens;
    float *result = gpu_test_bf16_values(rows, 1.0f, seed);
    float *lse = gpu_test_fp32_values((size_t)s.tokens * s.heads, 1.0f, seed + 1);
    float *before = gpu_test_bf16_values(rows, 1.0f, seed + 2);
    float *added = gpu_test_bf16_values(rows, 0.5f, seed + 3);
    float *query = gpu_test_bf16_values((size_t)s.d, 2.0f / sqrtf((float)(s.d / s.heads)),
                                        seed + 4);
    float *key_norm = gpu_test_rounded_uniform((size_t)s.d, 0.5f, 1.0f, seed + 5);
    float *norm_weight = gpu_test_rounded_uniform((size_t)s.d, 0.5f, 1.0f, seed + 6);
    /* phase one's rows: weights in (0.5, 1.5), rstd in (0.5, 1.5); the partial's poisoned */
    float *weights = gpu_test_rounded_uniform(weight_count, 0.5f, 1.0f, seed + 7);
    float *rstd = gpu_test_rounded_uniform(rstd_count, 0.5f, 1.0f, seed + 8);
    for (size_t k = (size_t)s.completed * s.tokens * s.heads; k < weight_count; k++)
        weights[k] = NAN;
    for (size_t k = (size_t)s.completed * s.tokens; k < rstd_count; k++)
        rstd[k] = NAN;
    const bf16 *result_device = gpu_upload_bf16(result, rows);
    const float *lse_device = gpu_upload_floats(lse, (size_t)s.tokens * s.heads);
    const bf16 *before_device = gpu_upload_bf16(before, rows);
    const bf16 *added_device = gpu_upload_bf16(added, rows);
    const bf16 *query_device = gpu_upload_bf16(query, (size_t)s.d);
    const bf16 *key_norm_device = gpu_upload_bf16(key_norm, (size_t)s.d);
    const bf16 *norm_weight_device = gpu_upload_bf16(norm_weight, (size_t)s.d);
    MergeNormOutputs o[2]; /* 0: the ops in turn, 1: one pass */
    for (int k = 0; k < 2; k++) {
        outputs_make(&o[k], s, weights, rstd);
        if (!adds) /* the partial is the merge's input */
            o[k].partial = (bf16 *)before_device;
    }
    if (adds)
        cuda_add(o[0].partial, before_device, added_device, rows, 0);
    cuda_route_merge_forward(o[0].x, o[0].weights, o[0].rstd, result_device, lse_device,
                             o[0].partial, s.completed + 1, query_device, key_norm_device,
                             s.tokens, s.d, s.heads, ROUTE_EPS, 0);
    cuda_rmsnorm_forward(o[0].out, o[0].norm_rstd, o[0].x, norm_weight_device, s.tokens, s.d,
                         NORM_EPS, 0);
    const CudaGateAdd add = {added_device, NULL, before_device, o[1].partial};
    cuda_route_merge_rmsnorm_forward(o[1].x, o[1].out, o[1].norm_rstd, o[1].weights, o[1].rstd,
                                     result_device, lse_device, o[1].partial, s.completed + 1,
                                     query_device, key_norm_device, norm_weight_device,
                                     s.tokens, s.d, s.heads, ROUTE_EPS, NORM_EPS,
                                     adds ? &add : NULL, 0);
    float *got[6], *want[6];
    const char *names[6] = {"x", "out", "partial", "norm rstd", "weights", "rstd"};
    const size_t counts[6] = {rows, rows, rows, (size_t)s.tokens, weight_count, rstd_count};
    for (int k = 0; k < 2; k++) {
        float **to = k ? got : want;
        to[0] = gpu_download_bf16(o[k].x, rows), to[1] = gpu_download_bf16(o[k].out, rows);
        to[2] = gpu_download_bf16(o[k].partial, rows);
        to[3] = gpu_download_floats(o[k].norm_rstd, (size_t)s.tokens);
        to[4] = gpu_download_floats(o[k].weights, weight_count);
        to[5] = gpu_download_floats(o[k].rstd, rstd_count);
    }
    for (int k = 0; k < 6; k++) {
        if (k != 2 || adds)
            expect_same_bits(want[k], got[k], counts[k], names[k], s, adds);
        free(got[k]), free(want[k]);
    }
    free(result), free(lse), free(before), free(added), free(query), free(key_norm);
    free(norm_weight), free(weights), free(rstd);
    gpu_free_all();
}

Test(cuda_merge_norm, route_merge_rmsnorm_forward_gives_the_bits_of_the_ops_in_turn)
{
    gpu_require();
    for (int i = 0; i < COUNT(shapes); i++) {
        check_bits(shapes[i], false, 2100 + 20 * (uint64_t)i);
        check_bits(shapes[i], true, 2110 + 20 * (uint64_t)i);
    }
}

/* ---- the backward's op table: arrays in this order; shape[4]: the site reads the partial */

enum { BACK_DX, BACK_DWEIGHT, BACK_DNORMED, BACK_X, BACK_NORM_WEIGHT, BACK_NORM_RSTD,
       BACK_DPARTIAL, BACK_DQUERY, BACK_DKEY_NORM, BACK_MEAN, BACK_SOURCES, BACK_WEIGHTS,
       BACK_RSTD, BACK_QUERY, BACK_KEY_NORM, BACK_SCRATCH };

static int sources_of(const OpCase *c)
{
    return c->shape[0] + (c->shape[4] ? 1 : 0);
}

static void run_merge_norm_backward(const Backend *b, void *const *p, const OpCase *c)
{
    const MergeNormShape s = shape_of(c);
    const int all = sources_of(c);
    const size_t last = (size_t)(all - 1) * s.tokens * s.d;
    const Activation *partial =
        c->shape[4] ? activation_at_const(b, p[BACK_SOURCES], last) : NULL;
    const RouteMergeGrad merge = {
        .dpartial = partial ? p[BACK_DPARTIAL] : NULL,
        .dpartial_mode = GRAD_ADD,
        .dquery = p[BACK_DQUERY],
        .dkey_norm = p[BACK_DKEY_NORM],
        .mean = p[BACK_MEAN],
        .partial = partial,
        .weights = p[BACK_WEIGHTS],
        .rstd = p[BACK_RSTD],
        .query = p[BACK_QUERY],
        .key_norm = p[BACK_KEY_NORM],
        .scratch = p[BACK_SCRATCH],
        .n_sources = all,
        .heads = s.heads,
    };
    b->route_merge_rmsnorm_backward(p[BACK_DX], p[BACK_DWEIGHT], p[BACK_DNORMED], p[BACK_X],
                                    p[BACK_NORM_WEIGHT], p[BACK_NORM_RSTD], s.tokens, s.d,
                                    &merge);
}

/* the site's forward on the cpu: x the Route over all its sources (what the merge makes of
 * phase one's result and the partial), its weights and rstd; the norm's rstd of x */
static void prepare_site_forward(OpCase *c)
{
    const MergeNormShape s = shape_of(c);
    const Backend *cpu = backend_cpu();
    const size_t rows = (size_t)s.tokens * s.d;
    const int all = sources_of(c);
    const Activation *sources[16];
    for (int n = 0; n < all; n++)
        sources[n] = activation_at_const(cpu, (const Activation *)op_host(c, BACK_SOURCES),
                                         (size_t)n * rows);
    Activation *results[1] = {(Activation *)op_host(c, BACK_X)};
    float *weights[1] = {op_host(c, BACK_WEIGHTS)}, *rstd[1] = {op_host(c, BACK_RSTD)};
    float *lse_row = gpu_test_host_floats((size_t)s.tokens * s.heads);
    float *lse[1] = {lse_row};
    const Activation *queries[1] = {(const Activation *)op_host(c, BACK_QUERY)};
    const Activation *key_norms[1] = {(const Activation *)op_host(c, BACK_KEY_NORM)};
    cpu->route_block_forward(results, weights, rstd, lse, sources, all, queries, key_norms, 1,
                             s.tokens, s.d, s.heads, ROUTE_EPS);
    float *normed = gpu_test_host_floats(rows);
    cpu->rmsnorm_forward((Activation *)normed, op_host(c, BACK_NORM_RSTD),
                         (const Activation *)op_host(c, BACK_X),
                         (const Activation *)op_host(c, BACK_NORM_WEIGHT), s.tokens, s.d, NORM_EPS);
    free(lse_row), free(normed);
}

static void check_backward(MergeNormShape s, bool partial, uint64_t seed)
{
    OpCase c = op_case("route_merge_rmsnorm_backward", run_merge_norm_backward);
    c.shape[0] = s.completed, c.shape[1] = s.tokens, c.shape[2] = s.d, c.shape[3] = s.heads;
    c.shape[4] = partial;
    c.prepare = prepare_site_forward;
    const size_t rows = (size_t)s.tokens * s.d, all = (size_t)sources_of(&c);
    op_output(&c, "dx", ARRAY_ACTIVATION, rows, BF16_OUT);
    op_accumulated(&c, "dweight", ARRAY_FLOAT, (size_t)s.d, FP32_OUT);
    op_input(&c, "dnormed", ARRAY_ACTIVATION, rows, 1, 0);
    op_input(&c, "x", ARRAY_ACTIVATION, rows, 0, 0);
    op_input(&c, "norm weight", ARRAY_ACTIVATION, (size_t)s.d, 0.5f, 1);
    op_input(&c, "norm rstd", ARRAY_FLOAT, (size_t)s.tokens, 0, 0);
    if (partial) { /* the merge's gradients as tests/test_cuda_route_block.c bounds them */
        op_accumulated(&c, "dpartial", ARRAY_ACTIVATION, rows, BF16_OUT);
        op_accumulated(&c, "dquery", ARRAY_FLOAT, (size_t)s.d, BF16_OUT);
        op_accumulated(&c, "dkey_norm", ARRAY_FLOAT, (size_t)s.d, BF16_OUT);
    } else { /* nothing of the partial's: not passed, or not the op's to touch */
        op_input(&c, "dpartial (not passed)", ARRAY_ACTIVATION, rows, 0, 0);
        op_input(&c, "dquery (not read)", ARRAY_FLOAT, (size_t)s.d, 0, 0);
        op_input(&c, "dkey_norm (not read)", ARRAY_FLOAT, (size_t)s.d, 0, 0);
    }
    op_output(&c, "mean", ARRAY_FLOAT, (size_t)s.tokens * s.heads, BF16_OUT);
    op_input(&c, "sources", ARRAY_ACTIVATION, all * rows, 1, 0);
    op_input(&c, "weights", ARRAY_FLOAT, all * s.tokens * s.heads, 0, 0);
    op_input(&c, "rstd", ARRAY_FLOAT, all * s.tokens, 0, 0);
    /* a query of scale 2/sqrt(head_dim): scores O(1), a softmax neither flat nor one-hot */
    op_input(&c, "query", ARRAY_ACTIVATION, (size_t)s.d, 2.0f / sqrtf((float)(s.d / s.heads)),
             0);
    op_input(&c, "key_norm", ARRAY_ACTIVATION, (size_t)s.d, 0.5f, 1);
    op_cpu_scratch(&c, "scratch", (size_t)s.tokens * s.heads);
    op_check(&c, seed);
}

Test(cuda_merge_norm, route_merge_rmsnorm_backward_is_the_norms_backward_then_the_merges)
{
    gpu_require();
    for (int i = 0; i < COUNT(shapes); i++) {
        check_backward(shapes[i], true, 2300 + 2 * (uint64_t)i);
        check_backward(shapes[i], false, 2301 + 2 * (uint64_t)i);
    }
}

/* ---- the backward's one pass against the two ops in turn, bit for bit ---- */

/* One way's outputs on the device, from the same starts. */
typedef struct {
    bf16 *dx, *dpartial;
    float *dweight, *dquery, *dkey_norm, *mean, *workspace;
} BackwardOutputs;

static void backward_outputs_make(BackwardOutputs *o, MergeNormShape s, const float *dpartial_start,
                         const float *sums_start, size_t workspace_floats)
{
    const size_t rows = (size_t)s.tokens * s.d;
    o->dx = gpu_poisoned_bf16(rows);
    o->dpartial = dpartial_start ? gpu_upload_bf16(dpartial_start, rows)
                                 : gpu_poisoned_bf16(rows);
    o->dweight = gpu_upload_floats(sums_start, (size_t)s.d);
    o->dquery = gpu_upload_floats(sums_start + s.d, (size_t)s.d);
    o->dkey_norm = gpu_upload_floats(sums_start + 2 * s.d, (size_t)s.d);
    o->mean = gpu_poisoned_floats((size_t)s.tokens * s.heads);
    o->workspace = gpu_poisoned_floats(workspace_floats);
}

static void check_backward_bits(MergeNormShape s, GradMode mode, uint64_t seed)
{
    const size_t rows = (size_t)s.tokens * s.d, all = (size_t)s.completed + 1;
    const size_t weight_count = all * s.tokens * s.heads, rstd_count = all * s.tokens;
    float *dnormed = gpu_test_bf16_values(rows, 1.0f, seed);
    float *x = gpu_test_bf16_values(rows, 1.0f, seed + 1);
    float *partial = gpu_test_bf16_values(rows, 1.0f, seed + 2);
    float *start = gpu_test_bf16_values(rows, 0.5f, seed + 3);
    float *query = gpu_test_bf16_values((size_t)s.d, 2.0f / sqrtf((float)(s.d / s.heads)),
                                        seed + 4);
    float *key_norm = gpu_test_rounded_uniform((size_t)s.d, 0.5f, 1.0f, seed + 5);
    float *norm_weight = gpu_test_rounded_uniform((size_t)s.d, 0.5f, 1.0f, seed + 6);
    float *norm_rstd = gpu_test_rounded_uniform((size_t)s.tokens, 0.5f, 1.0f, seed + 7);
    float *weights = gpu_test_rounded_uniform(weight_count, 0.5f, 0.5f, seed + 8);
    float *rstd = gpu_test_rounded_uniform(rstd_count, 0.5f, 1.0f, seed + 9);
    float *sums = gpu_test_fp32_values(3 * (size_t)s.d, 1.0f, seed + 10);
    const bf16 *dnormed_device = gpu_upload_bf16(dnormed, rows);
    const bf16 *x_device = gpu_upload_bf16(x, rows);
    const bf16 *partial_device = gpu_upload_bf16(partial, rows);
    const bf16 *query_device = gpu_upload_bf16(query, (size_t)s.d);
    const bf16 *key_norm_device = gpu_upload_bf16(key_norm, (size_t)s.d);
    const bf16 *norm_weight_device = gpu_upload_bf16(norm_weight, (size_t)s.d);
    const float *norm_rstd_device = gpu_upload_floats(norm_rstd, (size_t)s.tokens);
    const float *weights_device = gpu_upload_floats(weights, weight_count);
    const float *rstd_device = gpu_upload_floats(rstd, rstd_count);
    const size_t workspace = cuda_route_merge_rmsnorm_backward_workspace_floats(s.tokens, s.d,
                                                                                s.heads);
    BackwardOutputs o[2]; /* 0: the ops in turn, 1: one pass */
    for (int k = 0; k < 2; k++)
        backward_outputs_make(&o[k], s, mode == GRAD_ADD ? start : NULL, sums, workspace);
    cuda_rmsnorm_backward(o[0].dx, GRAD_WRITE, o[0].dweight, dnormed_device, x_device,
                          norm_weight_device, norm_rstd_device, s.tokens, s.d, o[0].workspace,
                          0);
    cuda_route_merge_backward(o[0].dpartial, mode, o[0].dquery, o[0].dkey_norm, o[0].mean,
                              o[0].dx, x_device, partial_device, (int)all, weights_device,
                              rstd_device, query_device, key_norm_device, o[0].workspace,
                              s.tokens, s.d, s.heads, 0);
    cuda_route_merge_rmsnorm_backward(o[1].dx, o[1].dweight, dnormed_device, x_device,
                                      norm_weight_device, norm_rstd_device, o[1].dpartial, mode,
                                      o[1].dquery, o[1].dkey_norm, o[1].mean, partial_device,
                                      (int)all, weights_device, rstd_device, query_device,
                                      key_norm_device, o[1].workspace, s.tokens, s.d, s.heads,
                                      0);
    float *got[6], *want[6];
    const char *names[6] = {"dx", "mean", "dpartial", "dquery", "dkey_norm", "dweight"};
    const size_t counts[6] = {rows, (size_t)s.tokens * s.heads, rows, (size_t)s.d,
                              (size_t)s.d, (size_t)s.d};
    for (int k = 0; k < 2; k++) {
        float **to = k ? got : want;
        to[0] = gpu_download_bf16(o[k].dx, rows);
        to[1] = gpu_download_floats(o[k].mean, counts[1]);
        to[2] = gpu_download_bf16(o[k].dpartial, rows);
        to[3] = gpu_download_floats(o[k].dquery, (size_t)s.d);
        to[4] = gpu_download_floats(o[k].dkey_norm, (size_t)s.d);
        to[5] = gpu_download_floats(o[k].dweight, (size_t)s.d);
    }
    for (int k = 0; k < 5; k++)
        cr_expect_eq(memcmp(got[k], want[k], counts[k] * sizeof(float)), 0,
                     "%s differs from the ops in turn at N %d, tokens %d, d %d, H %d, %s",
                     names[k], s.completed, s.tokens, s.d, s.heads,
                     mode == GRAD_ADD ? "added into" : "written");
    const int shape[4] = {s.completed, s.tokens, s.d, s.heads};
    gpu_expect_close_at(got[5], want[5], (size_t)s.d, FP32_OUT, "dweight", shape);
    for (int k = 0; k < 6; k++)
        free(got[k]), free(want[k]);
    free(dnormed), free(x), free(partial), free(start), free(query), free(key_norm);
    free(norm_weight), free(norm_rstd), free(weights), free(rstd), free(sums);
    gpu_free_all();
}

Test(cuda_merge_norm, route_merge_rmsnorm_backward_gives_the_bits_of_the_ops_in_turn)
{
    gpu_require();
    for (int i = 0; i < COUNT(shapes); i++) {
        check_backward_bits(shapes[i], GRAD_ADD, 2400 + 20 * (uint64_t)i);
        check_backward_bits(shapes[i], GRAD_WRITE, 2410 + 20 * (uint64_t)i);
    }
}
