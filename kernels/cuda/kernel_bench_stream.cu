/* kernels/cuda/kernel_bench_stream.cu — `fathom-kernel-bench mix`: MSAR's stream mix, its
 * convolution and the replace form's merges as the walks call them (kernel_bench.h). */
#include "kernels/cuda/kernel_bench.h"
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* MSAR's stream mix (m 4) as the walks call it: the forward over every stream; the
 * backward a stream at a time with the delta gate (the delta form's block backward) and over
 * every stream at once (the replace form's), d o_r written. */
typedef struct {
    int m, rows, d, only; /* only: the one stream given, or -1 for all */
    const bf16 *streams[4];
    bf16 *dstreams[4], *out, *dout, *mix_proj;
    float *gates, *rstd, *mix_bias, *dmix_bias, *dmix_proj, *dalpha, *alpha, *workspace;
} MixCase;

static void mix_forward_case(void *p)
{
    MixCase *c = (MixCase *)p;
    cuda_stream_mix_forward(c->out, c->gates, c->rstd, c->streams, c->m, c->mix_bias,
                            c->mix_proj, c->rows, c->d, 1e-5f, 0);
}

static void mix_backward_case(void *p)
{
    MixCase *c = (MixCase *)p;
    const bf16 *given[4];
    for (int r = 0; r < c->m; r++)
        given[r] = c->only < 0 || c->only == r ? c->streams[r] : NULL;
    cuda_stream_mix_backward(c->dstreams, GRAD_WRITE, c->dmix_bias, c->dmix_proj, c->dalpha,
                             c->dout, given, c->m, c->gates, c->rstd, c->mix_bias, c->mix_proj,
                             c->only < 0 ? NULL : c->alpha, c->rows, c->d, c->workspace, 0);
}

void bench_mix(int rows, int d)
{
    MixCase c = {};
    c.m = 4, c.rows = rows, c.d = d;
    const size_t n = (size_t)rows * d;
    for (int r = 0; r < c.m; r++) {
        c.streams[r] = (const bf16 *)device_random_bf16(n, 41 + r);
        c.dstreams[r] = (bf16 *)device_random_bf16(n, 45 + r);
    }
    c.out = (bf16 *)device_random_bf16(n, 49);
    c.dout = (bf16 *)device_random_bf16(n, 50);
    c.mix_proj = (bf16 *)device_random_bf16((size_t)c.m * d, 51);
    c.gates = device_floats((size_t)rows * c.m, 0.25f);
    c.rstd = device_floats((size_t)rows * c.m, 1.0f);
    c.mix_bias = device_floats(c.m, -1.0986f);
    c.dmix_bias = device_floats(c.m, 0.0f);
    c.dmix_proj = device_floats((size_t)c.m * d, 0.0f);
    c.dalpha = device_floats(1, 0.0f);
    c.alpha = device_floats(1, 0.5f);
    c.workspace = device_floats(cuda_stream_mix_backward_workspace_floats(c.m, rows, d), 0.0f);
    const double row_bytes = 2.0 * n;
    char name[64];
    snprintf(name, sizeof name, "stream mix fwd m4 %dx%d", rows, d);
    report(name, median_ms(mix_forward_case, &c), 0, (c.m + 1) * row_bytes);
    c.only = 1;
    snprintf(name, sizeof name, "stream mix bwd, a stream, gated %dx%d", rows, d);
    report(name, median_ms(mix_backward_case, &c), 0, 3 * row_bytes);
    c.only = -1;
    snprintf(name, sizeof name, "stream mix bwd m4 %dx%d", rows, d);
    report(name, median_ms(mix_backward_case, &c), 0, (2 * c.m + 1) * row_bytes);
    for (int r = 0; r < c.m; r++)
        cudaFree((void *)c.streams[r]), cudaFree(c.dstreams[r]);
    cudaFree(c.out), cudaFree(c.dout), cudaFree(c.mix_proj), cudaFree(c.gates), cudaFree(c.rstd);
    cudaFree(c.mix_bias), cudaFree(c.dmix_bias), cudaFree(c.dmix_proj), cudaFree(c.dalpha);
    cudaFree(c.alpha), cudaFree(c.workspace);
}

/* MSAR's stream convolution as the walk calls it: a block's five sources at once, each
 * with its taps, forward and backward (dx added into, dtaps through the partials): one
 * stream of each kernel size, then the four streams of kernel sizes 1, 2, 4, 8 at once (the
 * walk's backward: each source read once for all of them). And the replace form's partial,
 * one row: a stream of each kernel size, then the four streams' forward at once. */
enum { CONV_CASE_ROWS = 5, CONV_CASE_STREAMS = 4 };

typedef struct {
    int count, streams, kernel_sizes[CONV_CASE_STREAMS], B, T, d;
    bf16 *out[CONV_CASE_STREAMS * CONV_CASE_ROWS], *x[CONV_CASE_ROWS], *dx[CONV_CASE_ROWS];
    bf16 *dout[CONV_CASE_STREAMS * CONV_CASE_ROWS], *taps[CONV_CASE_STREAMS * CONV_CASE_ROWS];
    float *dtaps[CONV_CASE_STREAMS * CONV_CASE_ROWS], *workspace;
} ConvCase;

static void conv_forward_case(void *p)
{
    ConvCase *c = (ConvCase *)p;
    cuda_stream_conv_forward(c->out, (const bf16 *const *)c->x, (const bf16 *const *)c->taps,
                             c->count, c->streams, c->kernel_sizes, c->B, c->T, c->d, 0);
}

static void conv_backward_case(void *p)
{
    ConvCase *c = (ConvCase *)p;
    cuda_stream_conv_backward(c->dx, c->dtaps, (const bf16 *const *)c->dout,
                              (const bf16 *const *)c->x, (const bf16 *const *)c->taps, c->count,
                              c->streams, c->kernel_sizes, c->B, c->T, c->d, c->workspace, 0);
}

/* the case of `count` rows and `streams` streams of the given kernel sizes, its rows random */
static ConvCase conv_case_create(int count, int streams, const int *kernel_sizes, int B, int T,
                                 int d)
{
    const size_t n = (size_t)B * T * d;
    ConvCase c = {};
    c.count = count, c.streams = streams, c.B = B, c.T = T, c.d = d;
    for (int r = 0; r < streams; r++)
        c.kernel_sizes[r] = kernel_sizes[r];
    for (int row = 0; row < c.count; row++) {
        c.x[row] = (bf16 *)device_random_bf16(n, 66 + row);
        c.dx[row] = (bf16 *)device_random_bf16(n, 76 + row);
        for (int r = 0; r < streams; r++) {
            const int at = r * c.count + row, k = kernel_sizes[r];
            c.out[at] = (bf16 *)device_random_bf16(n, 61 + 10 * r + row);
            c.dout[at] = (bf16 *)device_random_bf16(n, 71 + 10 * r + row);
            c.taps[at] = (bf16 *)device_random_bf16((size_t)k * d, 81 + 10 * r + row);
            c.dtaps[at] = device_floats((size_t)k * d, 0.0f);
        }
    }
    c.workspace = device_floats(
        cuda_stream_conv_backward_workspace_floats(c.count, streams, kernel_sizes, B, T, d), 0.0f);
    return c;
}

static void conv_case_free(ConvCase *c)
{
    for (int row = 0; row < c->count; row++) {
        cudaFree(c->x[row]), cudaFree(c->dx[row]);
        for (int r = 0; r < c->streams; r++) {
            const int at = r * c->count + row;
            cudaFree(c->out[at]), cudaFree(c->dout[at]), cudaFree(c->taps[at]);
            cudaFree(c->dtaps[at]);
        }
    }
    cudaFree(c->workspace);
}

void bench_conv(int B, int T, int d)
{
    const double row_bytes = 2.0 * B * T * d * CONV_CASE_ROWS;
    char name[80];
    for (int kernel_size = 1; kernel_size <= 8; kernel_size *= 2) {
        ConvCase c = conv_case_create(CONV_CASE_ROWS, 1, &kernel_size, B, T, d);
        snprintf(name, sizeof name, "stream conv fwd, 5 rows, k %d, %dx%d", kernel_size, B * T, d);
        report(name, median_ms(conv_forward_case, &c), 0, 2 * row_bytes);
        snprintf(name, sizeof name, "stream conv bwd, 5 rows, k %d, %dx%d", kernel_size, B * T, d);
        report(name, median_ms(conv_backward_case, &c), 0, 4 * row_bytes);
        conv_case_free(&c);
    }
    const int kernel_sizes[CONV_CASE_STREAMS] = {1, 2, 4, 8};
    ConvCase c = conv_case_create(CONV_CASE_ROWS, CONV_CASE_STREAMS, kernel_sizes, B, T, d);
    snprintf(name, sizeof name, "stream conv bwd, 5 rows, 4 streams k 1 2 4 8, %dx%d", B * T, d);
    report(name, median_ms(conv_backward_case, &c), 0, (CONV_CASE_STREAMS + 3) * row_bytes);
    conv_case_free(&c);
    const double partial_bytes = row_bytes / CONV_CASE_ROWS;
    for (int kernel_size = 1; kernel_size <= 8; kernel_size *= 2) {
        c = conv_case_create(1, 1, &kernel_size, B, T, d);
        snprintf(name, sizeof name, "stream conv fwd, a partial, k %d, %dx%d", kernel_size, B * T,
                 d);
        report(name, median_ms(conv_forward_case, &c), 0, 2 * partial_bytes);
        conv_case_free(&c);
    }
    c = conv_case_create(1, CONV_CASE_STREAMS, kernel_sizes, B, T, d);
    snprintf(name, sizeof name, "stream conv fwd, a partial, 4 streams k 1 2 4 8, %dx%d", B * T, d);
    report(name, median_ms(conv_forward_case, &c), 0, (1 + CONV_CASE_STREAMS) * partial_bytes);
    conv_case_free(&c);
}

/* The replace form's merges of a site's partial b in MSAR's four streams (k 1 2 4 8) over
 * N = 5 completed sources, in place in the streams, as the walk calls them: the
 * convolution into four rows then a merge a stream (1 + m rows, then 3 a stream: 17), or the
 * convolution inside the merge's read (b, then each stream read and written: 9); one
 * stream's merge backward with the partial, d partial added into (5 rows) or written (4);
 * and every stream's merge backward as the walk calls it: the convolution into four rows then
 * a backward a stream (1 + m rows, then 4 a stream: 21), or the convolution inside the
 * backward's read (b, then d out and out read and d E written a stream: 13). The forward's
 * site also mixes its streams: the merges then the mix (9 + 4 read + 1 written: 14 rows), or
 * the streams mixed as they are merged (b and the four phase-one rows read, x written: 6;
 * with o_r kept, as the backward's turn keeps them, 10). */
enum { MERGE_CASE_STREAMS = 4, MERGE_CASE_SOURCES = 6 };

typedef struct {
    int B, T, d, kernel_sizes[MERGE_CASE_STREAMS];
    bf16 *partial, *streams[MERGE_CASE_STREAMS], *rows[MERGE_CASE_STREAMS], *dpartial, *dout;
    bf16 *grad_rows[MERGE_CASE_STREAMS];
    const bf16 *taps[MERGE_CASE_STREAMS], *query[MERGE_CASE_STREAMS];
    const bf16 *key_norm[MERGE_CASE_STREAMS];
    float *weights[MERGE_CASE_STREAMS], *rstd[MERGE_CASE_STREAMS], *workspace, *dquery;
    float *dkey_norm, *mean;
    const float *lse[MERGE_CASE_STREAMS];
    GradMode mode;
    bf16 *mixed, *mix_proj; /* the site's mix: x, theta [m, d], beta [m], gates, rstd */
    float *mix_bias, *mix_gates, *mix_rstd;
    bool keep_streams; /* the backward's turn: o_r stored too */
} MergeCase;

static void merge_composed_case(void *p)
{
    MergeCase *c = (MergeCase *)p;
    const bf16 *x[1] = {c->partial};
    cuda_stream_conv_forward(c->rows, x, c->taps, 1, MERGE_CASE_STREAMS, c->kernel_sizes, c->B,
                             c->T, c->d, 0);
    for (int r = 0; r < MERGE_CASE_STREAMS; r++)
        cuda_route_merge_forward(c->streams[r], c->weights[r], c->rstd[r], c->streams[r],
                                 c->lse[r], c->rows[r], MERGE_CASE_SOURCES, c->query[r],
                                 c->key_norm[r], c->B * c->T, c->d, 8, 1e-5f, 0);
}

static void merge_conv_case(void *p)
{
    MergeCase *c = (MergeCase *)p;
    cuda_route_merge_conv_forward(c->streams, c->weights, c->rstd, (const bf16 *const *)c->streams,
                                  c->lse, c->partial, c->taps, c->kernel_sizes, MERGE_CASE_STREAMS,
                                  MERGE_CASE_SOURCES, c->query, c->key_norm, c->rows, c->B, c->T,
                                  c->d, 8, 1e-5f, 0);
}

static void merge_then_mix_case(void *p)
{
    MergeCase *c = (MergeCase *)p;
    merge_conv_case(p);
    cuda_stream_mix_forward(c->mixed, c->mix_gates, c->mix_rstd, (const bf16 *const *)c->streams,
                            MERGE_CASE_STREAMS, c->mix_bias, c->mix_proj, c->B * c->T, c->d,
                            1e-5f, 0);
}

static void merge_mix_case(void *p)
{
    MergeCase *c = (MergeCase *)p;
    cuda_route_merge_conv_mix_forward(
        c->mixed, c->mix_gates, c->mix_rstd, c->mix_bias, c->mix_proj, c->streams,
        c->keep_streams, c->weights, c->rstd, (const bf16 *const *)c->streams, c->lse,
        c->partial, c->taps, c->kernel_sizes, MERGE_CASE_STREAMS, MERGE_CASE_SOURCES, c->query,
        c->key_norm, c->rows, c->B, c->T, c->d, 8, 1e-5f, 0);
}

static void merge_backward_case(void *p)
{
    MergeCase *c = (MergeCase *)p;
    cuda_route_merge_backward(c->dpartial, c->mode, c->dquery, c->dkey_norm, c->mean, c->dout,
                              c->streams[0], c->rows[0], MERGE_CASE_SOURCES, c->weights[0],
                              c->rstd[0], c->query[0], c->key_norm[0], c->workspace,
                              c->B * c->T, c->d, 8, 0);
}

/* every stream's d E written, its centres and d q, d g: the pointers of stream r */
static float *merge_case_stream_floats(float *array, int r, size_t per_stream)
{
    return array + (size_t)r * per_stream;
}

static void merge_backward_streams_case(void *p)
{
    MergeCase *c = (MergeCase *)p;
    const int tokens = c->B * c->T;
    const bf16 *x[1] = {c->partial};
    cuda_stream_conv_forward(c->rows, x, c->taps, 1, MERGE_CASE_STREAMS, c->kernel_sizes, c->B,
                             c->T, c->d, 0);
    for (int r = 0; r < MERGE_CASE_STREAMS; r++)
        cuda_route_merge_backward(
            c->grad_rows[r], GRAD_WRITE, merge_case_stream_floats(c->dquery, r, c->d),
            merge_case_stream_floats(c->dkey_norm, r, c->d),
            merge_case_stream_floats(c->mean, r, (size_t)tokens * 8), c->dout, c->streams[r],
            c->rows[r], MERGE_CASE_SOURCES, c->weights[r], c->rstd[r], c->query[r],
            c->key_norm[r], c->workspace, tokens, c->d, 8, 0);
}

static void merge_conv_backward_case(void *p)
{
    MergeCase *c = (MergeCase *)p;
    const int tokens = c->B * c->T;
    float *dquery[MERGE_CASE_STREAMS], *dkey_norm[MERGE_CASE_STREAMS], *mean[MERGE_CASE_STREAMS];
    const bf16 *dout[MERGE_CASE_STREAMS];
    const float *weights[MERGE_CASE_STREAMS], *rstd[MERGE_CASE_STREAMS];
    for (int r = 0; r < MERGE_CASE_STREAMS; r++) {
        dquery[r] = merge_case_stream_floats(c->dquery, r, c->d);
        dkey_norm[r] = merge_case_stream_floats(c->dkey_norm, r, c->d);
        mean[r] = merge_case_stream_floats(c->mean, r, (size_t)tokens * 8);
        dout[r] = c->dout, weights[r] = c->weights[r], rstd[r] = c->rstd[r];
    }
    cuda_route_merge_conv_backward(c->grad_rows, dquery, dkey_norm, mean, dout,
                                   (const bf16 *const *)c->streams, c->partial, c->taps,
                                   c->kernel_sizes, MERGE_CASE_STREAMS, MERGE_CASE_SOURCES,
                                   weights, rstd, c->query, c->key_norm, c->rows, c->workspace,
                                   c->B, c->T, c->d, 8, 0);
}

void bench_merge(int B, int T, int d)
{
    const int tokens = B * T, heads = 8;
    const size_t n = (size_t)tokens * d;
    MergeCase c = {};
    c.B = B, c.T = T, c.d = d;
    c.partial = (bf16 *)device_random_bf16(n, 91);
    c.dpartial = (bf16 *)device_random_bf16(n, 92);
    c.dout = (bf16 *)device_random_bf16(n, 93);
    for (int r = 0; r < MERGE_CASE_STREAMS; r++) {
        c.kernel_sizes[r] = 1 << r;
        c.streams[r] = (bf16 *)device_random_bf16(n, 94 + r);
        c.rows[r] = (bf16 *)device_random_bf16(n, 98 + r);
        c.taps[r] = (const bf16 *)device_random_bf16((size_t)c.kernel_sizes[r] * d, 102 + r);
        c.query[r] = (const bf16 *)device_random_bf16((size_t)d, 106 + r);
        c.key_norm[r] = (const bf16 *)device_random_bf16((size_t)d, 110 + r);
        c.weights[r] = device_floats((size_t)MERGE_CASE_SOURCES * tokens * heads, 0.2f);
        c.rstd[r] = device_floats((size_t)MERGE_CASE_SOURCES * tokens, 1.0f);
        c.lse[r] = device_floats((size_t)tokens * heads, 0.5f);
    }
    for (int r = 0; r < MERGE_CASE_STREAMS; r++)
        c.grad_rows[r] = (bf16 *)device_random_bf16(n, 114 + r);
    c.dquery = device_floats((size_t)MERGE_CASE_STREAMS * d, 0.0f);
    c.dkey_norm = device_floats((size_t)MERGE_CASE_STREAMS * d, 0.0f);
    c.mean = device_floats((size_t)MERGE_CASE_STREAMS * tokens * heads, 0.0f);
    c.workspace = device_floats(
        cuda_route_merge_conv_backward_workspace_floats(MERGE_CASE_STREAMS, tokens, d, heads), 0);
    c.mixed = (bf16 *)device_random_bf16(n, 118);
    c.mix_proj = (bf16 *)device_random_bf16((size_t)MERGE_CASE_STREAMS * d, 119);
    c.mix_bias = device_floats(MERGE_CASE_STREAMS, -1.1f);
    c.mix_gates = device_floats((size_t)tokens * MERGE_CASE_STREAMS, 0.0f);
    c.mix_rstd = device_floats((size_t)tokens * MERGE_CASE_STREAMS, 0.0f);
    const double row_bytes = 2.0 * n;
    char name[80];
    snprintf(name, sizeof name, "merge, 4 streams: conv then merges, %dx%d", tokens, d);
    report(name, median_ms(merge_composed_case, &c), 0, 17 * row_bytes);
    snprintf(name, sizeof name, "merge, 4 streams: conv in the read, %dx%d", tokens, d);
    report(name, median_ms(merge_conv_case, &c), 0, 9 * row_bytes);
    snprintf(name, sizeof name, "merge, 4 streams: conv in the read, then mix, %dx%d", tokens, d);
    report(name, median_ms(merge_then_mix_case, &c), 0, 14 * row_bytes);
    snprintf(name, sizeof name, "merge, 4 streams: mixed as merged, %dx%d", tokens, d);
    report(name, median_ms(merge_mix_case, &c), 0, 6 * row_bytes);
    c.keep_streams = true;
    snprintf(name, sizeof name, "merge, 4 streams: mixed as merged, kept, %dx%d", tokens, d);
    report(name, median_ms(merge_mix_case, &c), 0, 10 * row_bytes);
    c.mode = GRAD_ADD;
    snprintf(name, sizeof name, "merge bwd, a stream, d partial added, %dx%d", tokens, d);
    report(name, median_ms(merge_backward_case, &c), 0, 5 * row_bytes);
    c.mode = GRAD_WRITE;
    snprintf(name, sizeof name, "merge bwd, a stream, d partial written, %dx%d", tokens, d);
    report(name, median_ms(merge_backward_case, &c), 0, 4 * row_bytes);
    snprintf(name, sizeof name, "merge bwd, 4 streams: conv then merges, %dx%d", tokens, d);
    report(name, median_ms(merge_backward_streams_case, &c), 0, 21 * row_bytes);
    snprintf(name, sizeof name, "merge bwd, 4 streams: conv in the read, %dx%d", tokens, d);
    report(name, median_ms(merge_conv_backward_case, &c), 0, 13 * row_bytes);
    for (int r = 0; r < MERGE_CASE_STREAMS; r++) {
        cudaFree(c.streams[r]), cudaFree(c.rows[r]), cudaFree((void *)c.taps[r]);
        cudaFree((void *)c.query[r]), cudaFree((void *)c.key_norm[r]), cudaFree(c.weights[r]);
        cudaFree(c.rstd[r]), cudaFree((void *)c.lse[r]), cudaFree(c.grad_rows[r]);
    }
    cudaFree(c.partial), cudaFree(c.dpartial), cudaFree(c.dout), cudaFree(c.dquery);
    cudaFree(c.dkey_norm), cudaFree(c.mean), cudaFree(c.workspace);
    cudaFree(c.mixed), cudaFree(c.mix_proj), cudaFree(c.mix_bias), cudaFree(c.mix_gates);
    cudaFree(c.mix_rstd);
}
