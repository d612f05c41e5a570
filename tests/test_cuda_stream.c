/* tests/test_cuda_stream.c — the CUDA MSAR stream convolution against the cpu reference
 * (DESIGN 2.2; DESIGN 7, "GPU"; the mix is test_cuda_stream_mix.c's). Same rules as
 * test_cuda_route.c: fresh
 * inputs rounded to bf16, the cpu reference (kernels/cpu/stream_cpu.c) on the same values,
 * 1e-2 for bf16 outputs, 1e-3 for fp32 ones, outputs poisoned (the convolution's gradients,
 * which its backward adds into, start from other values),
 * shapes that are not multiples of anything, bitwise determinism of every backward. The
 * convolution takes several rows a call (a block's sources), and its backward every stream
 * of them at once: every row and stream is checked. Identity taps return x, bit for bit.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/route_cuda.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define FP32_TOLERANCE 1e-3

/* ---- convolution: shapes {B, T, d, kernel_size} ---- */

/* runs of 16 rows cut short by T; T below k; d 6 and 5 (vectors of 2 and 1 channels); the
 * 1B width with a kernel of 3 (the 4-tap kernels); partials of the dtaps across sequences */
static const int conv_shapes[][4] = {
    {2, 33, 24, 1}, {1, 1000, 256, 4}, {3, 17, 4096, 8}, {1, 5, 24, 8}, {2, 33, 4096, 2},
    {1, 1, 256, 4}, {2, 100, 24, 7}, {1, 300, 1280, 3}, {3, 7, 6, 8}, {2, 9, 5, 2},
};
#define CONV_SHAPE_COUNT ((int)(sizeof conv_shapes / sizeof conv_shapes[0]))
#define CONV_ROWS_MAX 14
#define CONV_STREAMS_MAX 10

/* `count` rows of one shape, each with its own input, and for each of `streams` streams
 * (kernel size kernel_sizes[r]) its own taps and dout, as one call sees them ([r * count +
 * n]): host values rounded to bf16 and their device copies; and the gradients the backward
 * adds into, as they were before it (dx rounded to bf16, dtaps in fp32), nonzero so that a
 * backward writing where it should add fails. With `misaligned`, row 1's input
 * starts one element past a 16-byte boundary, which narrows the vectors of its whole launch. */
typedef struct {
    int count, streams, kernel_sizes[CONV_STREAMS_MAX];
    size_t size;
    float *x[CONV_ROWS_MAX];
    float *taps[CONV_STREAMS_MAX * CONV_ROWS_MAX], *dout[CONV_STREAMS_MAX * CONV_ROWS_MAX];
    float *dx_before[CONV_ROWS_MAX], *dtaps_before[CONV_STREAMS_MAX * CONV_ROWS_MAX];
    const bf16 *device_x[CONV_ROWS_MAX];
    const bf16 *device_taps[CONV_STREAMS_MAX * CONV_ROWS_MAX];
    const bf16 *device_dout[CONV_STREAMS_MAX * CONV_ROWS_MAX];
} ConvRows;

static const bf16 *upload_misaligned(const float *values, size_t n)
{
    float *padded = gpu_test_host_floats(n + 1);
    memcpy(padded + 1, values, n * sizeof(float));
    const bf16 *device = gpu_upload_bf16(padded, n + 1) + 1;
    free(padded);
    return device;
}

static size_t conv_taps_size(const ConvRows *rows, const int *shape, int r)
{
    return (size_t)rows->kernel_sizes[r] * (size_t)shape[2];
}

/* kernel_sizes NULL: one stream of shape[3] */
static ConvRows conv_rows(const int *shape, int count, int streams, const int *kernel_sizes,
                          uint64_t seed, bool misaligned)
{
    const int B = shape[0], T = shape[1], d = shape[2];
    ConvRows rows = {.count = count, .streams = streams, .size = (size_t)B * T * d};
    for (int r = 0; r < streams; r++)
        rows.kernel_sizes[r] = kernel_sizes ? kernel_sizes[r] : shape[3];
    for (int n = 0; n < count; n++) {
        const uint64_t row_seed = seed + 100 * (uint64_t)n;
        rows.x[n] = gpu_test_rounded_uniform(rows.size, 1.0f, 0.0f, row_seed);
        rows.dx_before[n] = gpu_test_rounded_uniform(rows.size, 1.0f, 0.0f, row_seed + 77);
        rows.device_x[n] = misaligned && n == 1 ? upload_misaligned(rows.x[n], rows.size)
                                                : gpu_upload_bf16(rows.x[n], rows.size);
        for (int r = 0; r < streams; r++) {
            const int at = r * count + n;
            const size_t taps_size = conv_taps_size(&rows, shape, r);
            rows.taps[at] = gpu_test_rounded_uniform(taps_size, 0.8f, 0.0f, row_seed + 2 * r + 1);
            rows.dout[at] = gpu_test_rounded_uniform(rows.size, 1.0f, 0.0f, row_seed + 2 * r + 2);
            rows.dtaps_before[at] =
                gpu_test_rounded_uniform(taps_size, 1.0f, 0.0f, row_seed + 2 * r + 78);
            rows.device_taps[at] = gpu_upload_bf16(rows.taps[at], taps_size);
            rows.device_dout[at] = gpu_upload_bf16(rows.dout[at], rows.size);
        }
    }
    return rows;
}

static void conv_rows_free(ConvRows *rows)
{
    for (int n = 0; n < rows->count; n++) {
        free(rows->x[n]);
        free(rows->dx_before[n]);
        for (int r = 0; r < rows->streams; r++) {
            free(rows->taps[r * rows->count + n]);
            free(rows->dout[r * rows->count + n]);
            free(rows->dtaps_before[r * rows->count + n]);
        }
    }
    gpu_free_all();
}

/* the forward of every row and stream in one call, each against the cpu (kernel_sizes
 * NULL: one stream of shape[3]) */
static void expect_conv_forward(const int *shape, int count, int streams,
                                const int *kernel_sizes, uint64_t seed, bool misaligned)
{
    const int B = shape[0], T = shape[1], d = shape[2];
    ConvRows rows = conv_rows(shape, count, streams, kernel_sizes, seed, misaligned);
    bf16 *out[CONV_STREAMS_MAX * CONV_ROWS_MAX];
    for (int at = 0; at < streams * count; at++)
        out[at] = gpu_poisoned_bf16(rows.size);
    cuda_stream_conv_forward(out, rows.device_x, rows.device_taps, count, streams,
                             rows.kernel_sizes, B, T, d, 0);
    float *ref = gpu_test_host_floats(rows.size);
    for (int r = 0; r < streams; r++)
        for (int n = 0; n < count; n++) {
            const int at = r * count + n;
            cpu_stream_conv_forward(ref, rows.x[n], rows.taps[at], rows.kernel_sizes[r], B, T, d);
            float *got = gpu_download_bf16(out[at], rows.size);
            gpu_expect_close_at(got, ref, rows.size, BF16_TOLERANCE, "conv out", shape);
            free(got);
        }
    free(ref);
    conv_rows_free(&rows);
}

Test(cuda_stream, conv_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < CONV_SHAPE_COUNT; i++)
        expect_conv_forward(conv_shapes[i], 1 + i % 3, 1, NULL, 100 + 37 * (uint64_t)i, false);
}

/* more rows than a launch takes (12), and a misaligned row narrowing its launch's vectors */
Test(cuda_stream, conv_forward_of_many_rows_matches_cpu)
{
    gpu_require();
    const int shape[4] = {2, 21, 24, 4}, wide[4] = {1, 40, 256, 8};
    expect_conv_forward(shape, 14, 1, NULL, 150, false);
    expect_conv_forward(wide, 3, 1, NULL, 160, true);
}

/* The every-stream cases of the forward and the backward: MSAR's kernel sizes, sizes that
 * are not powers of two, more streams than a launch takes (8); T no multiple of a run (16)
 * or of a block's runs (128 tokens), d 6 and 5 (vectors of 2 and 1 channels) */
static const int streams_msar[] = {1, 2, 4, 8}, streams_odd[] = {3, 5, 7};
static const int streams_many[] = {8, 1, 2, 3, 4, 5, 6, 7, 8, 2};
static const int streams_shapes[][4] = {{2, 33, 24, 0}, {1, 300, 1280, 0}, {3, 17, 4096, 0},
                                        {2, 130, 6, 0}, {2, 9, 5, 0}};

/* The replace form's partial: one row in every stream at once (MSAR's kernel sizes 1 2 4 8,
 * sizes that are not powers of two, and more streams than a launch takes), a block's rows
 * in several streams, and a misaligned row, at T no multiple of a run (16). */
Test(cuda_stream, conv_forward_of_every_stream_at_once_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 5; i++) {
        expect_conv_forward(streams_shapes[i], 1, 4, streams_msar, 800 + 31 * (uint64_t)i, false);
        expect_conv_forward(streams_shapes[i], 1 + i % 3, 3, streams_odd,
                            850 + 31 * (uint64_t)i, false);
    }
    expect_conv_forward(streams_shapes[0], 1, 10, streams_many, 900, false);
    const int wide[4] = {1, 40, 256, 0};
    expect_conv_forward(wide, 3, 4, streams_msar, 910, true);
}

Test(cuda_stream, conv_with_identity_taps_returns_the_input_bit_for_bit)
{
    gpu_require();
    enum { B = 2, T = 33, D = 256, K = 8 };
    const size_t size = (size_t)B * T * D;
    float *x = gpu_test_rounded_uniform(size, 3.0f, 0.0f, 42);
    float *taps = gpu_test_host_floats((size_t)K * D);
    for (int c = 0; c < D; c++)
        taps[c] = 1.0f;
    bf16 *out = gpu_poisoned_bf16(size);
    const bf16 *device_x = gpu_upload_bf16(x, size),
        *device_taps = gpu_upload_bf16(taps, (size_t)K * D);
    const int kernel_size = K;
    cuda_stream_conv_forward(&out, &device_x, &device_taps, 1, 1, &kernel_size, B, T, D, 0);
    float *got = gpu_download_bf16(out, size);
    cr_assert_eq(memcmp(got, x, size * sizeof(float)), 0, "identity taps changed the input");
    free(x);
    free(taps);
    free(got);
    gpu_free_all();
}

/* runs cuda_stream_conv_backward once over every row and stream, adding into dx (unless
 * without_dx) and dtaps as they were before (rows->dx_before, rows->dtaps_before);
 * dx_got[n], dtaps_got[r * count + n] host copies */
static void gpu_conv_backward(float **dx_got, float **dtaps_got, const ConvRows *rows,
                              const int *shape, bool without_dx)
{
    const int B = shape[0], T = shape[1], d = shape[2], count = rows->count;
    bf16 *dx[CONV_ROWS_MAX];
    float *dtaps[CONV_STREAMS_MAX * CONV_ROWS_MAX];
    for (int n = 0; n < count; n++) {
        dx[n] = gpu_upload_bf16(rows->dx_before[n], rows->size);
        for (int r = 0; r < rows->streams; r++)
            dtaps[r * count + n] = gpu_upload_floats(rows->dtaps_before[r * count + n],
                                                     conv_taps_size(rows, shape, r));
    }
    float *workspace = gpu_poisoned_floats(cuda_stream_conv_backward_workspace_floats(
        count, rows->streams, rows->kernel_sizes, B, T, d));
    cuda_stream_conv_backward(without_dx ? NULL : dx, dtaps, rows->device_dout, rows->device_x,
                              rows->device_taps, count, rows->streams, rows->kernel_sizes, B, T,
                              d, workspace, 0);
    for (int n = 0; n < count; n++) {
        dx_got[n] = without_dx ? NULL : gpu_download_bf16(dx[n], rows->size);
        for (int r = 0; r < rows->streams; r++)
            dtaps_got[r * count + n] =
                gpu_download_floats(dtaps[r * count + n], conv_taps_size(rows, shape, r));
    }
}

/* the backward of every row and stream in one call against the cpu's, a stream at a time:
 * dx[n] the sum over the streams, dtaps each stream's */
static void expect_conv_backward(const int *shape, int count, int streams,
                                 const int *kernel_sizes, uint64_t seed, bool without_dx,
                                 bool misaligned)
{
    const int B = shape[0], T = shape[1], d = shape[2];
    ConvRows rows = conv_rows(shape, count, streams, kernel_sizes, seed, misaligned);
    float *dx_got[CONV_ROWS_MAX], *dtaps_got[CONV_STREAMS_MAX * CONV_ROWS_MAX];
    gpu_conv_backward(dx_got, dtaps_got, &rows, shape, without_dx);
    float *dx_ref = gpu_test_host_floats(rows.size),
        *dtaps_ref = gpu_test_host_floats((size_t)8 * d);
    for (int n = 0; n < count; n++) {
        memcpy(dx_ref, rows.dx_before[n], rows.size * sizeof(float));
        for (int r = 0; r < streams; r++) {
            const int at = r * count + n;
            const size_t taps_size = conv_taps_size(&rows, shape, r);
            memcpy(dtaps_ref, rows.dtaps_before[at], taps_size * sizeof(float));
            cpu_stream_conv_backward(dx_ref, dtaps_ref, rows.dout[at], rows.x[n], rows.taps[at],
                                     rows.kernel_sizes[r], B, T, d);
            gpu_expect_close_at(dtaps_got[at], dtaps_ref, taps_size, FP32_TOLERANCE, "conv dtaps",
                                shape);
            free(dtaps_got[at]);
        }
        if (dx_got[n])
            gpu_expect_close_at(dx_got[n], dx_ref, rows.size, BF16_TOLERANCE, "conv dx", shape);
        free(dx_got[n]);
    }
    free(dx_ref);
    free(dtaps_ref);
    conv_rows_free(&rows);
}

Test(cuda_stream, conv_backward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < CONV_SHAPE_COUNT; i++)
        expect_conv_backward(conv_shapes[i], 1 + i % 3, 1, NULL, 300 + 37 * (uint64_t)i,
                             i % 2 == 1, false);
}

/* The walk's backward: every stream of a block's sources in one call. MSAR's kernel sizes
 * 1 2 4 8, sizes that are not powers of two, one stream's, and more streams than a launch
 * takes (8: the second launch adds into the first's dx), at shapes whose T is no multiple of
 * a run (16) or of a block's runs (128 tokens), with dx and without. */
Test(cuda_stream, conv_backward_of_every_stream_at_once_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 5; i++) {
        expect_conv_backward(streams_shapes[i], 1 + i % 3, 4, streams_msar,
                             500 + 31 * (uint64_t)i, false, false);
        expect_conv_backward(streams_shapes[i], 2, 3, streams_odd, 600 + 31 * (uint64_t)i,
                             i == 3, false);
    }
    expect_conv_backward(streams_shapes[0], 2, 10, streams_many, 700, false, false);
    expect_conv_backward(streams_shapes[3], 1, 10, streams_many, 710, true, false);
}

/* more rows than a launch takes (12), and a misaligned row narrowing its launch's vectors */
Test(cuda_stream, conv_backward_of_many_rows_matches_cpu)
{
    gpu_require();
    static const int msar[] = {1, 2, 4, 8};
    const int shape[4] = {2, 21, 24, 4}, wide[4] = {1, 40, 256, 8};
    expect_conv_backward(shape, 13, 1, NULL, 350, false, false);
    expect_conv_backward(shape, 13, 4, msar, 355, false, false);
    expect_conv_backward(wide, 3, 1, NULL, 360, false, true);
    expect_conv_backward(wide, 3, 4, msar, 365, false, true);
}

Test(cuda_stream, conv_backward_is_bitwise_deterministic)
{
    gpu_require();
    static const int msar[] = {1, 2, 4, 8};
    const int shape[4] = {2, 1000, 4096, 0};
    ConvRows rows = conv_rows(shape, 2, 4, msar, 61, false);
    float *dx_first[2], *dtaps_first[8], *dx_second[2], *dtaps_second[8];
    gpu_conv_backward(dx_first, dtaps_first, &rows, shape, false);
    gpu_conv_backward(dx_second, dtaps_second, &rows, shape, false);
    for (int n = 0; n < 2; n++) {
        cr_assert_eq(memcmp(dx_first[n], dx_second[n], rows.size * sizeof(float)), 0,
                     "dx of row %d differs", n);
        free(dx_first[n]);
        free(dx_second[n]);
    }
    for (int at = 0; at < 8; at++) {
        const size_t taps_size = conv_taps_size(&rows, shape, at / 2);
        cr_assert_eq(memcmp(dtaps_first[at], dtaps_second[at], taps_size * sizeof(float)), 0,
                     "dtaps %d differs", at);
        free(dtaps_first[at]);
        free(dtaps_second[at]);
    }
    conv_rows_free(&rows);
}
