/* tests/test_cuda_kernels.c — the cuda backend's elementwise, embedding, RMSNorm, RoPE
 * and SwiGLU kernels (kernels/cuda/kernels_cuda.h) against the cpu reference
 * (kernels/cpu) on the same random inputs, rounded to bf16 first (DESIGN 7, "GPU").
 *
 * Tolerances: ||gpu - cpu|| / ||cpu|| <= 1e-2 for bf16 outputs, <= 1e-5 for fp32 outputs
 * (statistics, fp32 gradients). Written outputs are poisoned with NaN first; "+=" outputs
 * start from random values, rounded like the GPU's. Shapes are odd on purpose (rows 1, 7,
 * 333; widths that are and are not multiples of 8, which take the 16-byte and the
 * element-wise paths). Every backward is also run twice to check it gives the same bits.
 * Each test SKIPs where no GPU answers.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/kernels_cuda.h"
#include "runtime/error.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define FP32_TOLERANCE 1e-5




static void expect_same_bits(const float *a, const float *b, size_t n, const char *what)
{
    cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0, "%s: two runs differ", what);
}

/* ---- elementwise ---- */

static const size_t flat_lengths[] = {1, 7, 333 * 96 + 5, (1 << 20) + 3};

Test(cuda_kernels, add_matches_cpu)
{
    gpu_require();
    for (size_t c = 0; c < sizeof flat_lengths / sizeof flat_lengths[0]; c++) {
        size_t n = flat_lengths[c];
        float *a = gpu_test_bf16_values(n, 1, 10 + c), *b = gpu_test_bf16_values(n, 1, 20 + c);
        float *expected = malloc(n * sizeof(float));
        cpu_add(expected, a, b, n);
        bf16 *out = gpu_poisoned_bf16(n);
        cuda_add(out, gpu_upload_bf16(a, n), gpu_upload_bf16(b, n), n, 0);
        float *got = gpu_download_bf16(out, n);
        gpu_expect_close(got, expected, n, BF16_TOLERANCE, "add");
        free(a), free(b), free(expected), free(got);
        gpu_free_all();
    }
}

Test(cuda_kernels, add_inplace_adds_x_into_y)
{
    gpu_require();
    for (size_t c = 0; c < sizeof flat_lengths / sizeof flat_lengths[0]; c++) {
        size_t n = flat_lengths[c];
        float *y = gpu_test_bf16_values(n, 1, 30 + c), *x = gpu_test_bf16_values(n, 1, 40 + c);
        bf16 *device_y = gpu_upload_bf16(y, n);
        cuda_add_inplace(device_y, gpu_upload_bf16(x, n), n, 0);
        cpu_add_inplace(y, x, n);
        float *got = gpu_download_bf16(device_y, n);
        gpu_expect_close(got, y, n, BF16_TOLERANCE, "add_inplace");
        free(y), free(x), free(got);
        gpu_free_all();
    }
}

Test(cuda_kernels, add_matches_cpu_on_unaligned_arrays)
{
    gpu_require();
    size_t n = 1001; /* pointers one element in: the element-wise path */
    float *a = gpu_test_bf16_values(n + 1, 1, 50), *b = gpu_test_bf16_values(n + 1, 1, 51);
    float *expected = malloc(n * sizeof(float));
    cpu_add(expected, a + 1, b + 1, n);
    bf16 *out = gpu_poisoned_bf16(n + 1);
    cuda_add(out + 1, gpu_upload_bf16(a, n + 1) + 1, gpu_upload_bf16(b, n + 1) + 1, n, 0);
    float *got = gpu_download_bf16(out, n + 1);
    gpu_expect_close(got + 1, expected, n, BF16_TOLERANCE, "add, unaligned");
    cr_assert(isnan(got[0]), "add wrote before its output");
    free(a), free(b), free(expected), free(got);
    gpu_free_all();
}

/* ---- embedding ---- */

static const int embedding_shapes[][3] = {/* n, V, d */
                                          {1, 7, 64}, {7, 3, 96}, {333, 5, 96},
                                          {33, 11, 100}, {300, 37, 4096}};

Test(cuda_kernels, embedding_forward_copies_the_rows_the_tokens_name)
{
    gpu_require();
    for (size_t c = 0; c < sizeof embedding_shapes / sizeof embedding_shapes[0]; c++) {
        int n = embedding_shapes[c][0], V = embedding_shapes[c][1], d = embedding_shapes[c][2];
        float *table = gpu_test_bf16_values((size_t)V * d, 1, 60 + c);
        uint32_t *tokens = gpu_test_random_tokens(n, V, 70 + c);
        float *expected = malloc((size_t)n * d * sizeof(float));
        cpu_embedding_forward(expected, tokens, table, n, d);
        bf16 *out = gpu_poisoned_bf16((size_t)n * d);
        cuda_embedding_forward(out, gpu_upload_tokens(tokens, n),
                               gpu_upload_bf16(table, (size_t)V * d), n, d, 0);
        float *got = gpu_download_bf16(out, (size_t)n * d);
        cr_assert_eq(memcmp(got, expected, (size_t)n * d * sizeof(float)), 0,
                     "embedding forward n %d d %d", n, d);
        free(table), free(tokens), free(expected), free(got);
        gpu_free_all();
    }
}

/* dtable after one backward from `initial`, on the GPU */
static float *gpu_embedding_backward(const float *initial, const float *dout,
                                     const uint32_t *tokens, int n, int V, int d)
{
    float *dtable = gpu_upload_floats(initial, (size_t)V * d);
    cuda_embedding_backward(dtable, gpu_upload_bf16(dout, (size_t)n * d),
                            gpu_upload_tokens(tokens, n), n, d, 0);
    return gpu_download_floats(dtable, (size_t)V * d);
}

Test(cuda_kernels, embedding_backward_equals_cpu_bit_for_bit_with_repeated_tokens)
{
    gpu_require();
    for (size_t c = 0; c < sizeof embedding_shapes / sizeof embedding_shapes[0]; c++) {
        int n = embedding_shapes[c][0], V = embedding_shapes[c][1], d = embedding_shapes[c][2];
        float *dtable = gpu_test_fp32_values((size_t)V * d, 1, 80 + c);
        float *dout = gpu_test_bf16_values((size_t)n * d, 1, 90 + c);
        uint32_t *tokens = gpu_test_random_tokens(n, V, 100 + c);
        float *got = gpu_embedding_backward(dtable, dout, tokens, n, V, d);
        cpu_embedding_backward(dtable, dout, tokens, n, d);
        cr_assert_eq(memcmp(got, dtable, (size_t)V * d * sizeof(float)), 0,
                     "embedding backward n %d V %d d %d", n, V, d);
        free(dtable), free(dout), free(tokens), free(got);
        gpu_free_all();
    }
}

Test(cuda_kernels, embedding_backward_is_deterministic)
{
    gpu_require();
    int n = 2000, V = 3, d = 4096;
    float *dtable = gpu_test_fp32_values((size_t)V * d, 1, 110),
        *dout = gpu_test_bf16_values((size_t)n * d, 1, 111);
    uint32_t *tokens = gpu_test_random_tokens(n, V, 112);
    float *first = gpu_embedding_backward(dtable, dout, tokens, n, V, d);
    float *second = gpu_embedding_backward(dtable, dout, tokens, n, V, d);
    expect_same_bits(first, second, (size_t)V * d, "embedding backward");
    free(dtable), free(dout), free(tokens), free(first), free(second);
    gpu_free_all();
}

/* ---- RMSNorm ---- */

/* rows, d: one warp a row up to d = 1024, a block beyond; several rows per group (1500,
 * 5000); d not a multiple of 8 (100, 1000) */
static const int rmsnorm_shapes[][2] = {{1, 64},   {7, 96},     {333, 4096}, {33, 100},
                                        {5, 1000}, {3, 5000},   {2, 8192},   {1500, 2048},
                                        {5000, 64}};
static const float rmsnorm_eps = 1e-5f;

Test(cuda_kernels, rmsnorm_forward_matches_cpu)
{
    gpu_require();
    for (size_t c = 0; c < sizeof rmsnorm_shapes / sizeof rmsnorm_shapes[0]; c++) {
        int rows = rmsnorm_shapes[c][0], d = rmsnorm_shapes[c][1];
        size_t count = (size_t)rows * d;
        float *x = gpu_test_bf16_values(count, 2, 120 + c),
            *weight = gpu_test_bf16_values(d, 1, 130 + c);
        float *expected = malloc(count * sizeof(float));
        float *expected_rstd = malloc(rows * sizeof(float));
        cpu_rmsnorm_forward(expected, expected_rstd, x, weight, rows, d, rmsnorm_eps);
        bf16 *out = gpu_poisoned_bf16(count);
        float *rstd = gpu_poisoned_floats(rows);
        cuda_rmsnorm_forward(out, rstd, gpu_upload_bf16(x, count), gpu_upload_bf16(weight, d),
                             rows, d, rmsnorm_eps, 0);
        float *got = gpu_download_bf16(out, count), *got_rstd = gpu_download_floats(rstd, rows);
        gpu_expect_close(got, expected, count, BF16_TOLERANCE, "rmsnorm out");
        gpu_expect_close(got_rstd, expected_rstd, rows, FP32_TOLERANCE, "rmsnorm rstd");
        free(x), free(weight), free(expected), free(expected_rstd), free(got), free(got_rstd);
        gpu_free_all();
    }
}

/* dx (bf16) and dweight (fp32) after one GPU backward from the given starting values */
static void gpu_rmsnorm_backward(float **dx_out, float **dweight_out, const float *dx,
                                 const float *dweight, const float *dout, const float *x,
                                 const float *weight, const float *rstd, int rows, int d)
{
    size_t count = (size_t)rows * d;
    bf16 *device_dx = gpu_upload_bf16(dx, count);
    float *device_dweight = gpu_upload_floats(dweight, d);
    float *workspace = gpu_poisoned_floats(cuda_rmsnorm_backward_workspace_floats(rows, d));
    cuda_rmsnorm_backward(device_dx, GRAD_ADD, device_dweight, gpu_upload_bf16(dout, count),
                          gpu_upload_bf16(x, count), gpu_upload_bf16(weight, d),
                          gpu_upload_floats(rstd, rows), rows, d, workspace, 0);
    *dx_out = gpu_download_bf16(device_dx, count);
    *dweight_out = gpu_download_floats(device_dweight, d);
}

Test(cuda_kernels, rmsnorm_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (size_t c = 0; c < sizeof rmsnorm_shapes / sizeof rmsnorm_shapes[0]; c++) {
        int rows = rmsnorm_shapes[c][0], d = rmsnorm_shapes[c][1];
        size_t count = (size_t)rows * d;
        float *x = gpu_test_bf16_values(count, 2, 140 + c),
            *weight = gpu_test_bf16_values(d, 1, 150 + c);
        float *dout = gpu_test_bf16_values(count, 1, 160 + c),
            *dx = gpu_test_bf16_values(count, 0.5f, 170 + c);
        float *dweight = gpu_test_fp32_values(d, 1, 180 + c), *rstd = malloc(rows * sizeof(float));
        float *scratch = malloc(count * sizeof(float));
        cpu_rmsnorm_forward(scratch, rstd, x, weight, rows, d, rmsnorm_eps);
        float *got_dx, *got_dweight;
        gpu_rmsnorm_backward(&got_dx, &got_dweight, dx, dweight, dout, x, weight, rstd, rows, d);
        cpu_rmsnorm_backward(dx, GRAD_ADD, dweight, dout, x, weight, rstd, rows, d);
        gpu_expect_close(got_dx, dx, count, BF16_TOLERANCE, "rmsnorm dx");
        gpu_expect_close(got_dweight, dweight, d, FP32_TOLERANCE, "rmsnorm dweight");
        free(x), free(weight), free(dout), free(dx), free(dweight), free(rstd), free(scratch);
        free(got_dx), free(got_dweight);
        gpu_free_all();
    }
}

Test(cuda_kernels, rmsnorm_backward_is_deterministic)
{
    gpu_require();
    const int shapes[][2] = {{1500, 2048}, {5000, 64}};
    for (size_t c = 0; c < 2; c++) {
        int rows = shapes[c][0], d = shapes[c][1];
        size_t count = (size_t)rows * d;
        float *x = gpu_test_bf16_values(count, 2, 190), *weight = gpu_test_bf16_values(d, 1, 191);
        float *dout = gpu_test_bf16_values(count, 1, 192),
            *dx = gpu_test_bf16_values(count, 0.5f, 193);
        float *dweight = gpu_test_fp32_values(d, 1, 194),
            *rstd = gpu_test_fp32_values(rows, 1, 195);
        float *dx_1, *dweight_1, *dx_2, *dweight_2;
        gpu_rmsnorm_backward(&dx_1, &dweight_1, dx, dweight, dout, x, weight, rstd, rows, d);
        gpu_rmsnorm_backward(&dx_2, &dweight_2, dx, dweight, dout, x, weight, rstd, rows, d);
        expect_same_bits(dx_1, dx_2, count, "rmsnorm dx");
        expect_same_bits(dweight_1, dweight_2, d, "rmsnorm dweight");
        free(x), free(weight), free(dout), free(dx), free(dweight), free(rstd);
        free(dx_1), free(dweight_1), free(dx_2), free(dweight_2);
        gpu_free_all();
    }
}

/* The backward's second pass adds each column's group rows in a fixed order: 32 interleaved
 * slices, each summed in group order from 0, then the slices in order from 0, then that into
 * dweight. Its loads go 16 at a time with a short last batch (kernels/cuda/ordered_sum.cuh),
 * so the counts of groups are chosen around those batches: a slice of 1, 15, 16, 17 and 33
 * terms, and 0 for some slices. The host adds in the same order: the same bits. */
Test(cuda_kernels, rmsnorm_dweight_reduce_adds_the_groups_in_their_order)
{
    gpu_require();
    const int groups_list[] = {1, 20, 32, 480, 512, 544, 1041}, widths[] = {1, 100, 1280};
    for (size_t gi = 0; gi < sizeof groups_list / sizeof groups_list[0]; gi++)
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            const int groups = groups_list[gi], d = widths[wi];
            float *partials = gpu_test_fp32_values((size_t)groups * d, 1, 410 + gi);
            float *dweight = gpu_test_fp32_values(d, 1, 420 + wi);
            float *device_dweight = gpu_upload_floats(dweight, d);
            cuda_rmsnorm_dweight_reduce(device_dweight,
                                        gpu_upload_floats(partials, (size_t)groups * d),
                                        groups, d, 0);
            float *got = gpu_download_floats(device_dweight, d);
            for (int c = 0; c < d; c++) {
                float total = 0.0f;
                for (int slice = 0; slice < 32; slice++) {
                    float sum = 0.0f;
                    for (int g = slice; g < groups; g += 32)
                        sum += partials[(size_t)g * d + c];
                    total += sum;
                }
                dweight[c] += total;
            }
            cr_assert_eq(memcmp(got, dweight, (size_t)d * sizeof(float)), 0,
                         "dweight of %d groups, d %d: not the sum in group order", groups, d);
            free(partials), free(dweight), free(got);
            gpu_free_all();
        }
}

static void rmsnorm_rows_of_8200(void *unused)
{
    (void)unused;
    cuda_rmsnorm_forward(NULL, NULL, NULL, NULL, 1, 8200, rmsnorm_eps, 0);
}

/* The width check runs before any device work, so this needs no GPU. */
Test(cuda_kernels, rmsnorm_refuses_rows_wider_than_8192)
{
    test_expect_fatal(rmsnorm_rows_of_8200, NULL, EXIT_CONFIG,
                      "rmsnorm on the cuda backend takes rows of at most 8192 values, got "
                      "d = 8200");
}

/* ---- RoPE ---- */

/* B, T, n_heads, head_dim; head_dim 20 (half 10) takes the element-wise path */
static const int rope_shapes[][4] = {{1, 1, 1, 64}, {2, 7, 3, 96}, {1, 33, 4, 128},
                                     {2, 5, 3, 20}, {1, 333, 2, 64}};

/* cos and sin of random angles, [T, half] each */
static void rope_tables(float **cos_out, float **sin_out, int T, int half, uint64_t seed)
{
    float *angles = gpu_test_fp32_values((size_t)T * half, 3.2f, seed);
    *cos_out = malloc((size_t)T * half * sizeof(float));
    *sin_out = malloc((size_t)T * half * sizeof(float));
    for (size_t i = 0; i < (size_t)T * half; i++) {
        (*cos_out)[i] = cosf(angles[i]);
        (*sin_out)[i] = sinf(angles[i]);
    }
    free(angles);
}

static void rope_check_forward(int in_place)
{
    for (size_t c = 0; c < sizeof rope_shapes / sizeof rope_shapes[0]; c++) {
        int B = rope_shapes[c][0], T = rope_shapes[c][1], H = rope_shapes[c][2],
            hd = rope_shapes[c][3];
        size_t count = (size_t)B * T * H * hd;
        float *x = gpu_test_bf16_values(count, 1, 200 + c), *cos, *sin;
        rope_tables(&cos, &sin, T, hd / 2, 210 + c);
        float *expected = malloc(count * sizeof(float));
        cpu_rope_forward(expected, x, cos, sin, B, T, H, hd);
        bf16 *device_x = gpu_upload_bf16(x, count);
        bf16 *out = in_place ? device_x : gpu_poisoned_bf16(count);
        cuda_rope_forward(out, device_x, gpu_upload_floats(cos, (size_t)T * hd / 2),
                          gpu_upload_floats(sin, (size_t)T * hd / 2), B, T, H, hd, 0);
        float *got = gpu_download_bf16(out, count);
        gpu_expect_close(got, expected, count, BF16_TOLERANCE, "rope forward");
        free(x), free(cos), free(sin), free(expected), free(got);
        gpu_free_all();
    }
}

Test(cuda_kernels, rope_forward_matches_cpu)
{
    gpu_require();
    rope_check_forward(0);
}

Test(cuda_kernels, rope_forward_in_place_matches_cpu)
{
    gpu_require();
    rope_check_forward(1);
}

static float *gpu_rope_backward(const float *dx, const float *dout, const float *cos,
                                const float *sin, int B, int T, int H, int hd)
{
    size_t count = (size_t)B * T * H * hd;
    bf16 *device_dx = gpu_upload_bf16(dx, count);
    cuda_rope_backward(device_dx, GRAD_ADD, gpu_upload_bf16(dout, count),
                       gpu_upload_floats(cos, (size_t)T * hd / 2),
                       gpu_upload_floats(sin, (size_t)T * hd / 2), B, T, H, hd, 0);
    return gpu_download_bf16(device_dx, count);
}

Test(cuda_kernels, rope_backward_adds_the_inverse_rotation)
{
    gpu_require();
    for (size_t c = 0; c < sizeof rope_shapes / sizeof rope_shapes[0]; c++) {
        int B = rope_shapes[c][0], T = rope_shapes[c][1], H = rope_shapes[c][2],
            hd = rope_shapes[c][3];
        size_t count = (size_t)B * T * H * hd;
        float *dout = gpu_test_bf16_values(count, 1, 220 + c),
            *dx = gpu_test_bf16_values(count, 0.5f, 230 + c);
        float *cos, *sin;
        rope_tables(&cos, &sin, T, hd / 2, 240 + c);
        float *got = gpu_rope_backward(dx, dout, cos, sin, B, T, H, hd);
        cpu_rope_backward(dx, GRAD_ADD, dout, cos, sin, B, T, H, hd);
        gpu_expect_close(got, dx, count, BF16_TOLERANCE, "rope backward");
        free(dout), free(dx), free(cos), free(sin), free(got);
        gpu_free_all();
    }
}

Test(cuda_kernels, rope_backward_is_deterministic)
{
    gpu_require();
    int B = 2, T = 333, H = 3, hd = 128;
    size_t count = (size_t)B * T * H * hd;
    float *dout = gpu_test_bf16_values(count, 1, 250),
        *dx = gpu_test_bf16_values(count, 0.5f, 251), *cos, *sin;
    rope_tables(&cos, &sin, T, hd / 2, 252);
    float *first = gpu_rope_backward(dx, dout, cos, sin, B, T, H, hd);
    float *second = gpu_rope_backward(dx, dout, cos, sin, B, T, H, hd);
    expect_same_bits(first, second, count, "rope backward");
    free(dout), free(dx), free(cos), free(sin), free(first), free(second);
    gpu_free_all();
}

/* ---- SwiGLU ---- */

Test(cuda_kernels, swiglu_forward_matches_cpu)
{
    gpu_require();
    for (size_t c = 0; c < sizeof flat_lengths / sizeof flat_lengths[0]; c++) {
        size_t n = flat_lengths[c];
        float *gate = gpu_test_bf16_values(n, 8, 260 + c),
            *up = gpu_test_bf16_values(n, 1, 270 + c);
        float *expected = malloc(n * sizeof(float));
        cpu_swiglu_forward(expected, gate, up, n);
        bf16 *out = gpu_poisoned_bf16(n);
        cuda_swiglu_forward(out, gpu_upload_bf16(gate, n), gpu_upload_bf16(up, n), n, 0);
        float *got = gpu_download_bf16(out, n);
        gpu_expect_close(got, expected, n, BF16_TOLERANCE, "swiglu forward");
        free(gate), free(up), free(expected), free(got);
        gpu_free_all();
    }
}

static void gpu_swiglu_backward(float **dgate_out, float **dup_out, const float *dgate,
                                const float *dup, const float *dout, const float *gate,
                                const float *up, size_t n)
{
    bf16 *device_dgate = gpu_upload_bf16(dgate, n), *device_dup = gpu_upload_bf16(dup, n);
    cuda_swiglu_backward(device_dgate, device_dup, GRAD_ADD, gpu_upload_bf16(dout, n),
                         gpu_upload_bf16(gate, n), gpu_upload_bf16(up, n), n, 0);
    *dgate_out = gpu_download_bf16(device_dgate, n);
    *dup_out = gpu_download_bf16(device_dup, n);
}

Test(cuda_kernels, swiglu_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (size_t c = 0; c < sizeof flat_lengths / sizeof flat_lengths[0]; c++) {
        size_t n = flat_lengths[c];
        float *gate = gpu_test_bf16_values(n, 8, 280 + c),
            *up = gpu_test_bf16_values(n, 1, 290 + c);
        float *dout = gpu_test_bf16_values(n, 1, 300 + c);
        float *dgate = gpu_test_bf16_values(n, 0.3f, 310 + c),
            *dup = gpu_test_bf16_values(n, 0.3f, 320 + c);
        float *got_dgate, *got_dup;
        gpu_swiglu_backward(&got_dgate, &got_dup, dgate, dup, dout, gate, up, n);
        cpu_swiglu_backward(dgate, dup, GRAD_ADD, dout, gate, up, n);
        gpu_expect_close(got_dgate, dgate, n, BF16_TOLERANCE, "swiglu dgate");
        gpu_expect_close(got_dup, dup, n, BF16_TOLERANCE, "swiglu dup");
        free(gate), free(up), free(dout), free(dgate), free(dup), free(got_dgate), free(got_dup);
        gpu_free_all();
    }
}

Test(cuda_kernels, swiglu_backward_is_deterministic)
{
    gpu_require();
    size_t n = (1 << 20) + 3;
    float *gate = gpu_test_bf16_values(n, 8, 330), *up = gpu_test_bf16_values(n, 1, 331);
    float *dout = gpu_test_bf16_values(n, 1, 332), *dgate = gpu_test_bf16_values(n, 0.3f, 333);
    float *dup = gpu_test_bf16_values(n, 0.3f, 334);
    float *dgate_1, *dup_1, *dgate_2, *dup_2;
    gpu_swiglu_backward(&dgate_1, &dup_1, dgate, dup, dout, gate, up, n);
    gpu_swiglu_backward(&dgate_2, &dup_2, dgate, dup, dout, gate, up, n);
    expect_same_bits(dgate_1, dgate_2, n, "swiglu dgate");
    expect_same_bits(dup_1, dup_2, n, "swiglu dup");
    free(gate), free(up), free(dout), free(dgate), free(dup);
    free(dgate_1), free(dup_1), free(dgate_2), free(dup_2);
    gpu_free_all();
}
