/* tests/test_cuda_merge_conv.c — MSAR's replace-form merge of a site's partial in every
 * stream, the convolution inside the read (cuda_route_merge_conv_forward and its backward,
 * kernels/cuda/route_merge_conv_cuda.cu; docs/design-notes.md, "The replace form's merge
 * convolves its partial inside the read"):
 * - on the GPU, the bits of cuda_stream_conv_forward into rows and cuda_route_merge_forward
 *   a stream at a time, as the op promises: the merged streams, the weights (phase one's rows
 *   rescaled, the partial's row written) and the partial's rstd;
 * - against the cpu's convolution (E rounded to bf16, as the op's contract rounds it) and
 *   merge on the same values, within bf16 tolerance (E in fp32 moved the weights 1.7e-3 on
 *   an H100, past the statistics' 1e-3);
 * - its backward (cuda_route_merge_conv_backward) the bits of the convolution then
 *   cuda_route_merge_backward with GRAD_WRITE a stream at a time, twice the same, and the
 *   cpu's within bf16 tolerance (the second test);
 * - cuda_route_merge_conv_mix_forward (the merges mixed as they are made, o_r stored only
 *   where kept) the bits of the merges then cuda_stream_mix_forward (the third test).
 * Fresh random inputs rounded to bf16; the partial's weight and rstd rows and a separate out
 * poisoned with NaN; the warp-a-token kernel (d % 256 == 0) with streams of every kernel
 * size, sequences shorter than the widest kernel, more than a launch's 8 streams, more phase
 * one weights than a lane holds; and rows the kernel does not take (d 96), where the op
 * convolves into the caller's rows. Each test SKIPs where no GPU answers.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_cuda.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define STATISTIC_TOLERANCE 1e-3
#define EPS 1e-5f

enum { MAX_STREAMS = 10 };

typedef struct {
    int B, T, d, heads, n_sources, streams;
    int kernel_sizes[MAX_STREAMS];
    bool in_place; /* out is result, as the walk calls it */
} MergeConvShape;

static const MergeConvShape shapes[] = {
    {2, 300, 1280, 8, 5, 4, {1, 2, 4, 8}, true},              /* the 1B step's */
    {3, 17, 256, 2, 2, 3, {3, 5, 7}, false},                   /* one lane a head's half */
    {1, 5, 2048, 16, 3, 1, {8}, true},                         /* T below k; 8 vectors a lane */
    {1, 40, 512, 4, 9, 10, {1, 2, 3, 4, 5, 6, 7, 8, 2, 1}, true}, /* two launches */
    {1, 20, 256, 32, 6, 2, {4, 1}, false},                     /* N H = 160: past the held */
    {2, 33, 96, 4, 3, 2, {2, 8}, true},                        /* the composition */
};

/* One stream's arrays: host fp32 (bf16 values where the GPU reads bf16) and two device
 * copies, one for the composition and one for the op */
typedef struct {
    float *taps, *query, *key_norm, *result, *lse, *weights, *rstd;
    bf16 *device_taps, *device_query, *device_key_norm;
    float *device_lse;
    bf16 *result_of[2], *out_of[2];
    float *weights_of[2], *rstd_of[2];
} StreamArrays;

static size_t rows_of(const MergeConvShape *s)
{
    return (size_t)s->B * s->T * s->d;
}

static void stream_make(StreamArrays *a, const MergeConvShape *s, int r, uint64_t seed)
{
    const int tokens = s->B * s->T, N = s->n_sources - 1, H = s->heads;
    const size_t weights = (size_t)(N + 1) * tokens * H, rstd = (size_t)(N + 1) * tokens;
    memset(a, 0, sizeof *a);
    a->taps = gpu_test_bf16_values((size_t)s->kernel_sizes[r] * s->d, 0.6f, seed + 1);
    a->query = gpu_test_bf16_values((size_t)s->d, 1.0f, seed + 2);
    a->key_norm = gpu_test_rounded_uniform((size_t)s->d, 0.5f, 1.0f, seed + 3);
    a->result = gpu_test_bf16_values(rows_of(s), 1.0f, seed + 4);
    a->lse = gpu_test_fp32_values((size_t)tokens * H, 1.0f, seed + 5);
    /* phase one's: weights in (0, 1) and rstd in (0.5, 1.5) for rows 0..N-1, the partial's
     * row N poisoned */
    a->weights = gpu_test_host_floats(weights);
    a->rstd = gpu_test_host_floats(rstd);
    float *uniform = gpu_test_fp32_values(weights, 0.5f, seed + 6);
    for (size_t i = 0; i < weights; i++)
        a->weights[i] = i < (size_t)N * tokens * H ? uniform[i] + 0.5f : NAN;
    free(uniform);
    uniform = gpu_test_fp32_values(rstd, 0.5f, seed + 7);
    for (size_t i = 0; i < rstd; i++)
        a->rstd[i] = i < (size_t)N * tokens ? uniform[i] + 1.0f : NAN;
    free(uniform);
    a->device_taps = gpu_upload_bf16(a->taps, (size_t)s->kernel_sizes[r] * s->d);
    a->device_query = gpu_upload_bf16(a->query, (size_t)s->d);
    a->device_key_norm = gpu_upload_bf16(a->key_norm, (size_t)s->d);
    a->device_lse = gpu_upload_floats(a->lse, (size_t)tokens * H);
    for (int k = 0; k < 2; k++) {
        a->result_of[k] = gpu_upload_bf16(a->result, rows_of(s));
        a->out_of[k] = s->in_place ? a->result_of[k] : gpu_poisoned_bf16(rows_of(s));
        a->weights_of[k] = gpu_upload_floats(a->weights, weights);
        a->rstd_of[k] = gpu_upload_floats(a->rstd, rstd);
    }
}

static void stream_free(StreamArrays *a)
{
    free(a->taps), free(a->query), free(a->key_norm), free(a->result), free(a->lse);
    free(a->weights), free(a->rstd);
}

/* Every stream's arrays of a shape (stream_make) and the op's pointer arrays over them:
 * copy k of out, result, weights and rstd, the shared inputs, and poisoned rows */
typedef struct {
    bf16 *out[2][MAX_STREAMS], *result[2][MAX_STREAMS], *rows[MAX_STREAMS];
    const bf16 *taps[MAX_STREAMS], *query[MAX_STREAMS], *key_norm[MAX_STREAMS];
    float *weights_of[2][MAX_STREAMS], *rstd_of[2][MAX_STREAMS];
    const float *lse[MAX_STREAMS];
} MergeOperands;

static void merge_operands_make(MergeOperands *o, StreamArrays *a, const MergeConvShape *s,
                                uint64_t seed)
{
    for (int r = 0; r < s->streams; r++) {
        stream_make(&a[r], s, r, seed * 100 + 10 * (uint64_t)r);
        o->taps[r] = a[r].device_taps, o->query[r] = a[r].device_query;
        o->key_norm[r] = a[r].device_key_norm, o->lse[r] = a[r].device_lse;
        o->rows[r] = gpu_poisoned_bf16(rows_of(s));
        for (int k = 0; k < 2; k++) {
            o->out[k][r] = a[r].out_of[k], o->result[k][r] = a[r].result_of[k];
            o->weights_of[k][r] = a[r].weights_of[k], o->rstd_of[k][r] = a[r].rstd_of[k];
        }
    }
}

static void expect_close(const float *got, const float *want, size_t n, double tolerance,
                         const char *what, int shape, int r)
{
    const double error = test_relative_error(got, want, n);
    cr_assert_leq(error, tolerance, "shape %d stream %d: %s against the cpu: relative error %.3g",
                  shape, r, what, error);
}

/* the downloads of copy k equal copy 0's bit for bit */
static void expect_same_bits(const float *got, const float *want, size_t n, const char *what,
                             int shape, int r)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            cr_assert_fail("shape %d stream %d: %s[%zu] is %a, the ops in turn give %a", shape,
                           r, what, i, got[i], want[i]);
}

static void check_shape(int index, uint64_t seed)
{
    const MergeConvShape *s = &shapes[index];
    const int tokens = s->B * s->T, N = s->n_sources - 1, H = s->heads, m = s->streams;
    const size_t row = rows_of(s), weights = (size_t)(N + 1) * tokens * H;
    const size_t rstd = (size_t)(N + 1) * tokens;
    float *partial = gpu_test_bf16_values(row, 1.0f, seed);
    bf16 *device_partial = gpu_upload_bf16(partial, row);
    StreamArrays a[MAX_STREAMS];
    MergeOperands o;
    merge_operands_make(&o, a, s, seed);
    bf16 *(*out)[MAX_STREAMS] = o.out, *(*result)[MAX_STREAMS] = o.result, **rows = o.rows;
    const bf16 **taps = o.taps, **query = o.query, **key_norm = o.key_norm;
    float *(*weights_of)[MAX_STREAMS] = o.weights_of, *(*rstd_of)[MAX_STREAMS] = o.rstd_of;
    const float **lse = o.lse;
    /* copy 0: the two ops in turn; copy 1: the op */
    const bf16 *x[1] = {device_partial};
    cuda_stream_conv_forward(rows, x, taps, 1, m, s->kernel_sizes, s->B, s->T, s->d, 0);
    for (int r = 0; r < m; r++)
        cuda_route_merge_forward(out[0][r], weights_of[0][r], rstd_of[0][r], result[0][r], lse[r],
                                 rows[r], s->n_sources, query[r], key_norm[r], tokens, s->d, H,
                                 EPS, 0);
    for (int r = 0; r < m; r++) /* the op's rows are scratch: poisoned again */
        rows[r] = gpu_poisoned_bf16(row);
    cuda_route_merge_conv_forward(out[1], weights_of[1], rstd_of[1],
                                  (const bf16 *const *)result[1], lse, device_partial, taps,
                                  s->kernel_sizes, m, s->n_sources, query, key_norm, rows, s->B,
                                  s->T, s->d, H, EPS, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    float *convolved = gpu_test_host_floats(row), *want = gpu_test_host_floats(row);
    for (int r = 0; r < m; r++) {
        float *got[2][3];
        for (int k = 0; k < 2; k++) {
            got[k][0] = gpu_download_bf16(out[k][r], row);
            got[k][1] = gpu_download_floats(weights_of[k][r], weights);
            got[k][2] = gpu_download_floats(rstd_of[k][r], rstd);
        }
        expect_same_bits(got[1][0], got[0][0], row, "out", index, r);
        expect_same_bits(got[1][1], got[0][1], weights, "weights", index, r);
        expect_same_bits(got[1][2], got[0][2], rstd, "rstd", index, r);
        /* the cpu's convolution and merge of the same values */
        cpu_stream_conv_forward(convolved, partial, a[r].taps, s->kernel_sizes[r], s->B, s->T,
                                s->d);
        gpu_round_to_bf16(convolved, row);
        cpu_route_merge_forward(want, a[r].weights, a[r].rstd, a[r].result, a[r].lse, convolved,
                                s->n_sources, a[r].query, a[r].key_norm, tokens, s->d, H, EPS);
        cr_assert(test_all_finite(got[1][0], row) && test_all_finite(got[1][1], weights) &&
                      test_all_finite(got[1][2], rstd),
                  "shape %d stream %d: an output left unwritten (NaN)", index, r);
        expect_close(got[1][0], want, row, BF16_TOLERANCE, "out", index, r);
        expect_close(got[1][1], a[r].weights, weights, STATISTIC_TOLERANCE, "weights", index, r);
        expect_close(got[1][2], a[r].rstd, rstd, STATISTIC_TOLERANCE, "rstd", index, r);
        for (int k = 0; k < 2; k++)
            for (int q = 0; q < 3; q++)
                free(got[k][q]);
        stream_free(&a[r]);
    }
    free(convolved), free(want), free(partial);
    gpu_free_all();
}

/* check(i, seed) at every shape, a seed of its own each */
static void check_every_shape(void (*check)(int, uint64_t), uint64_t seed, uint64_t stride,
                              const char *what)
{
    gpu_require();
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        cr_log_info("%s shape %d", what, i);
        check(i, seed + stride * (uint64_t)i);
    }
}

Test(cuda_merge_conv, merges_every_stream_with_the_bits_of_the_convolution_then_the_merge)
{
    check_every_shape(check_shape, 4000, 17, "merge conv");
}

/* ---- the backward: cuda_route_merge_conv_backward ----
 * Against cuda_stream_conv_forward into rows, then cuda_route_merge_backward with GRAD_WRITE
 * a stream at a time, bit for bit (d E_r, the softmax centres, d q and d g added into the
 * same starting values); against the cpu's convolution (rounded to bf16) and merge backward
 * within bf16 tolerance; and a second call of the op the same bits as the first. d E_r and
 * the centres poisoned first. */

/* One stream's backward arrays: host fp32, and for each of the three calls (composition,
 * op, op again) the device outputs */
typedef struct {
    float *taps, *query, *key_norm, *dout, *out, *weights, *rstd, *dquery, *dkey_norm;
    bf16 *device_taps, *device_query, *device_key_norm, *device_dout, *device_out;
    float *device_weights, *device_rstd;
    bf16 *dpartial_of[3];
    float *mean_of[3], *dquery_of[3], *dkey_norm_of[3];
} BackwardStream;

static void backward_stream_make(BackwardStream *a, const MergeConvShape *s, int r,
                                 uint64_t seed)
{
    const int tokens = s->B * s->T, N = s->n_sources - 1, H = s->heads;
    const size_t weights = (size_t)(N + 1) * tokens * H, rstd = (size_t)(N + 1) * tokens;
    memset(a, 0, sizeof *a);
    a->taps = gpu_test_bf16_values((size_t)s->kernel_sizes[r] * s->d, 0.6f, seed + 1);
    a->query = gpu_test_bf16_values((size_t)s->d, 1.0f, seed + 2);
    a->key_norm = gpu_test_rounded_uniform((size_t)s->d, 0.5f, 1.0f, seed + 3);
    a->dout = gpu_test_bf16_values(rows_of(s), 1.0f, seed + 4);
    a->out = gpu_test_bf16_values(rows_of(s), 1.0f, seed + 5);
    a->weights = gpu_test_rounded_uniform(weights, 0.5f, 0.5f, seed + 6);
    a->rstd = gpu_test_rounded_uniform(rstd, 0.5f, 1.0f, seed + 7);
    a->dquery = gpu_test_fp32_values((size_t)s->d, 0.1f, seed + 8);
    a->dkey_norm = gpu_test_fp32_values((size_t)s->d, 0.1f, seed + 9);
    a->device_taps = gpu_upload_bf16(a->taps, (size_t)s->kernel_sizes[r] * s->d);
    a->device_query = gpu_upload_bf16(a->query, (size_t)s->d);
    a->device_key_norm = gpu_upload_bf16(a->key_norm, (size_t)s->d);
    a->device_dout = gpu_upload_bf16(a->dout, rows_of(s));
    a->device_out = gpu_upload_bf16(a->out, rows_of(s));
    a->device_weights = gpu_upload_floats(a->weights, weights);
    a->device_rstd = gpu_upload_floats(a->rstd, rstd);
    for (int k = 0; k < 3; k++) {
        a->dpartial_of[k] = gpu_poisoned_bf16(rows_of(s));
        a->mean_of[k] = gpu_poisoned_floats((size_t)tokens * H);
        a->dquery_of[k] = gpu_upload_floats(a->dquery, (size_t)s->d);
        a->dkey_norm_of[k] = gpu_upload_floats(a->dkey_norm, (size_t)s->d);
    }
}

static void backward_stream_free(BackwardStream *a)
{
    free(a->taps), free(a->query), free(a->key_norm), free(a->dout), free(a->out);
    free(a->weights), free(a->rstd), free(a->dquery), free(a->dkey_norm);
}

/* call k of the op, or (k 0) the two ops in turn */
static void backward_call(const MergeConvShape *s, BackwardStream *a, const bf16 *partial, int k,
                          float *workspace)
{
    const int m = s->streams, tokens = s->B * s->T;
    bf16 *dpartial[MAX_STREAMS], *rows[MAX_STREAMS];
    float *dquery[MAX_STREAMS], *dkey_norm[MAX_STREAMS], *mean[MAX_STREAMS];
    const bf16 *dout[MAX_STREAMS], *out[MAX_STREAMS], *taps[MAX_STREAMS];
    const bf16 *query[MAX_STREAMS], *key_norm[MAX_STREAMS];
    const float *weights[MAX_STREAMS], *rstd[MAX_STREAMS];
    for (int r = 0; r < m; r++) {
        dpartial[r] = a[r].dpartial_of[k], mean[r] = a[r].mean_of[k];
        dquery[r] = a[r].dquery_of[k], dkey_norm[r] = a[r].dkey_norm_of[k];
        dout[r] = a[r].device_dout, out[r] = a[r].device_out, taps[r] = a[r].device_taps;
        query[r] = a[r].device_query, key_norm[r] = a[r].device_key_norm;
        weights[r] = a[r].device_weights, rstd[r] = a[r].device_rstd;
        rows[r] = gpu_poisoned_bf16(rows_of(s)); /* scratch: poisoned for every call */
    }
    if (k > 0) {
        cuda_route_merge_conv_backward(dpartial, dquery, dkey_norm, mean, dout, out, partial,
                                       taps, s->kernel_sizes, m, s->n_sources, weights, rstd,
                                       query, key_norm, rows, workspace, s->B, s->T, s->d,
                                       s->heads, 0);
        return;
    }
    const bf16 *x[1] = {partial};
    cuda_stream_conv_forward(rows, x, taps, 1, m, s->kernel_sizes, s->B, s->T, s->d, 0);
    for (int r = 0; r < m; r++)
        cuda_route_merge_backward(dpartial[r], GRAD_WRITE, dquery[r], dkey_norm[r], mean[r],
                                  dout[r], out[r], rows[r], s->n_sources, weights[r], rstd[r],
                                  query[r], key_norm[r], workspace, tokens, s->d, s->heads, 0);
}

static void check_backward_shape(int index, uint64_t seed)
{
    const MergeConvShape *s = &shapes[index];
    const int tokens = s->B * s->T, H = s->heads, m = s->streams;
    const size_t row = rows_of(s), heads = (size_t)tokens * H, d = (size_t)s->d;
    float *partial = gpu_test_bf16_values(row, 1.0f, seed);
    bf16 *device_partial = gpu_upload_bf16(partial, row);
    BackwardStream a[MAX_STREAMS];
    for (int r = 0; r < m; r++)
        backward_stream_make(&a[r], s, r, seed * 100 + 10 * (uint64_t)r);
    float *workspace = gpu_poisoned_floats(
        cuda_route_merge_conv_backward_workspace_floats(m, tokens, s->d, H));
    for (int k = 0; k < 3; k++)
        backward_call(s, a, device_partial, k, workspace);
    CUDA_CHECK(cudaDeviceSynchronize());

    float *convolved = gpu_test_host_floats(row), *want_dpartial = gpu_test_host_floats(row);
    float *want_mean = gpu_test_host_floats(heads), *scratch = gpu_test_host_floats(heads);
    for (int r = 0; r < m; r++) {
        float *got[3][4];
        for (int k = 0; k < 3; k++) {
            got[k][0] = gpu_download_bf16(a[r].dpartial_of[k], row);
            got[k][1] = gpu_download_floats(a[r].mean_of[k], heads);
            got[k][2] = gpu_download_floats(a[r].dquery_of[k], d);
            got[k][3] = gpu_download_floats(a[r].dkey_norm_of[k], d);
        }
        const char *names[4] = {"d partial", "mean", "d query", "d key norm"};
        const size_t sizes[4] = {row, heads, d, d};
        for (int k = 1; k < 3; k++)
            for (int q = 0; q < 4; q++)
                expect_same_bits(got[k][q], got[0][q], sizes[q], names[q], index, r);
        /* the cpu's convolution and merge backward of the same values */
        cpu_stream_conv_forward(convolved, partial, a[r].taps, s->kernel_sizes[r], s->B, s->T,
                                s->d);
        gpu_round_to_bf16(convolved, row);
        cpu_route_merge_backward(want_dpartial, GRAD_WRITE, a[r].dquery, a[r].dkey_norm,
                                 want_mean, a[r].dout, a[r].out, convolved, s->n_sources,
                                 a[r].weights, a[r].rstd, a[r].query, a[r].key_norm, scratch,
                                 tokens, s->d, H);
        cr_assert(test_all_finite(got[1][0], row) && test_all_finite(got[1][1], heads),
                  "shape %d stream %d: an output left unwritten (NaN)", index, r);
        expect_close(got[1][0], want_dpartial, row, BF16_TOLERANCE, "d partial", index, r);
        expect_close(got[1][1], want_mean, heads, BF16_TOLERANCE, "mean", index, r);
        expect_close(got[1][2], a[r].dquery, d, BF16_TOLERANCE, "d query", index, r);
        expect_close(got[1][3], a[r].dkey_norm, d, BF16_TOLERANCE, "d key norm", index, r);
        for (int k = 0; k < 3; k++)
            for (int q = 0; q < 4; q++)
                free(got[k][q]);
        backward_stream_free(&a[r]);
    }
    free(convolved), free(want_dpartial), free(want_mean), free(scratch), free(partial);
    gpu_free_all();
}

Test(cuda_merge_conv,
     merge_backward_of_every_stream_has_the_bits_of_the_convolution_then_the_merges)
{
    check_every_shape(check_backward_shape, 5000, 19, "merge conv backward");
}

/* ---- the merges mixed as they are made: cuda_route_merge_conv_mix_forward ----
 * Against cuda_route_merge_conv_forward then cuda_stream_mix_forward of the merged streams,
 * bit for bit: the mix x, its gates and rstd, and every stream's weights, rstd and (where
 * kept: every other shape) o_r. x, the gates, the mix's rstd (and out where it is not in
 * place) poisoned first. The
 * shapes above: the warp-a-token merges mix as they merge; more than 8 streams (shape 3)
 * and d 96 take the composition. */
static void check_mix_shape(int index, uint64_t seed)
{
    const MergeConvShape *s = &shapes[index];
    const bool keep = index % 2 == 0; /* o_r kept (the backward's turn) at every other shape */
    const int tokens = s->B * s->T, N = s->n_sources - 1, H = s->heads, m = s->streams;
    const size_t row = rows_of(s), weights = (size_t)(N + 1) * tokens * H;
    const size_t rstd = (size_t)(N + 1) * tokens, gates = (size_t)tokens * m;
    float *partial = gpu_test_bf16_values(row, 1.0f, seed);
    float *mix_proj = gpu_test_bf16_values((size_t)m * s->d, 0.5f, seed + 1);
    float *mix_bias = gpu_test_fp32_values((size_t)m, 1.0f, seed + 2);
    bf16 *device_partial = gpu_upload_bf16(partial, row);
    bf16 *device_proj = gpu_upload_bf16(mix_proj, (size_t)m * s->d);
    float *device_bias = gpu_upload_floats(mix_bias, (size_t)m);
    StreamArrays a[MAX_STREAMS];
    MergeOperands o;
    merge_operands_make(&o, a, s, seed);
    bf16 *(*out)[MAX_STREAMS] = o.out, *(*result)[MAX_STREAMS] = o.result, **rows = o.rows;
    const bf16 **taps = o.taps, **query = o.query, **key_norm = o.key_norm;
    float *(*weights_of)[MAX_STREAMS] = o.weights_of, *(*rstd_of)[MAX_STREAMS] = o.rstd_of;
    const float **lse = o.lse;
    bf16 *x[2];
    float *mix_gates[2], *mix_rstd[2];
    for (int k = 0; k < 2; k++) {
        x[k] = gpu_poisoned_bf16(row);
        mix_gates[k] = gpu_poisoned_floats(gates);
        mix_rstd[k] = gpu_poisoned_floats(gates);
    }
    /* copy 0: the two ops in turn; copy 1: the op */
    cuda_route_merge_conv_forward(out[0], weights_of[0], rstd_of[0],
                                  (const bf16 *const *)result[0], lse, device_partial, taps,
                                  s->kernel_sizes, m, s->n_sources, query, key_norm, rows, s->B,
                                  s->T, s->d, H, EPS, 0);
    cuda_stream_mix_forward(x[0], mix_gates[0], mix_rstd[0], (const bf16 *const *)out[0], m,
                            device_bias, device_proj, tokens, s->d, EPS, 0);
    cuda_route_merge_conv_mix_forward(x[1], mix_gates[1], mix_rstd[1], device_bias, device_proj,
                                      out[1], keep, weights_of[1], rstd_of[1],
                                      (const bf16 *const *)result[1], lse, device_partial, taps,
                                      s->kernel_sizes, m, s->n_sources, query, key_norm, rows,
                                      s->B, s->T, s->d, H, EPS, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    float *got[2][3];
    for (int k = 0; k < 2; k++) {
        got[k][0] = gpu_download_bf16(x[k], row);
        got[k][1] = gpu_download_floats(mix_gates[k], gates);
        got[k][2] = gpu_download_floats(mix_rstd[k], gates);
    }
    cr_assert(test_all_finite(got[1][0], row) && test_all_finite(got[1][1], gates) &&
                  test_all_finite(got[1][2], gates),
              "shape %d: the mix, its gates or rstd left unwritten (NaN)", index);
    expect_same_bits(got[1][0], got[0][0], row, "x", index, -1);
    expect_same_bits(got[1][1], got[0][1], gates, "gates", index, -1);
    expect_same_bits(got[1][2], got[0][2], gates, "mix rstd", index, -1);
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < 3; q++)
            free(got[k][q]);
    for (int r = 0; r < m; r++) {
        float *merged[2][3];
        for (int k = 0; k < 2; k++) {
            merged[k][0] = gpu_download_floats(weights_of[k][r], weights);
            merged[k][1] = gpu_download_floats(rstd_of[k][r], rstd);
            merged[k][2] = gpu_download_bf16(out[k][r], row);
        }
        expect_same_bits(merged[1][0], merged[0][0], weights, "weights", index, r);
        expect_same_bits(merged[1][1], merged[0][1], rstd, "rstd", index, r);
        if (keep)
            expect_same_bits(merged[1][2], merged[0][2], row, "out", index, r);
        for (int k = 0; k < 2; k++)
            free(merged[k][0]), free(merged[k][1]), free(merged[k][2]);
        stream_free(&a[r]);
    }
    free(partial), free(mix_proj), free(mix_bias);
    gpu_free_all();
}

Test(cuda_merge_conv, merges_mixed_as_made_have_the_bits_of_the_merges_then_the_mix)
{
    check_every_shape(check_mix_shape, 6000, 23, "merge conv mix");
}
