/* tests/test_cuda_merge_norm.c — a replace-form site's merge inside its sublayer's norm
 * (runtime/backend.h route_merge_rmsnorm_forward; kernels/cuda/route_merge_norm_cuda.cu;
 * docs/design-notes.md, "The replace form's merge inside its sublayer's norm"):
 * - the cuda op table against the cpu's (the add, the merge and the norm in turn), with and
 *   without the add of the sublayer before's output into the partial first: rules of
 *   tests/cuda_backend_support.h (fresh random inputs rounded to bf16, outputs poisoned,
 *   bf16 tolerance for rows and 1e-3 for statistics, the cuda call twice the same bits);
 *   phase one's result, lse and weight rows come from the cpu's route_block_forward over the
 *   completed sources;
 * - the promise of one pass: the bits of cuda_add, cuda_route_merge_forward and
 *   cuda_rmsnorm_forward in turn, for x, the normed row, both rstd, the weights and the
 *   partial.
 * Shapes (completed sources N, tokens, d, heads): the one-pass kernel's (d % 256 == 0,
 * d <= 1280: the 1B step's d 1280 H 8, a lane a head at H 32, d 768 where the norm's warp
 * takes a fourth empty chunk; 2000 tokens at d 1280, more warps than the multiprocessors
 * hold at once) and the others' (d 2048, past the norm's warp rows; d 96, past the
 * warp-a-token merges). Each test SKIPs where no GPU answers.
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
#define STATISTIC BACKEND_STATISTIC_TOLERANCE
#define ROUTE_EPS 1e-5f
#define NORM_EPS 1e-6f
#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

typedef struct {
    int completed, tokens, d, heads;
} MergeNormShape;

static const MergeNormShape shapes[] = {
    {5, 300, 1280, 8}, {3, 33, 512, 4}, {2, 17, 256, 32}, {4, 20, 768, 8},
    {3, 9, 2048, 16},  {2, 7, 96, 4},   {3, 2000, 1280, 8},
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
