/* tests/test_cuda_matmul.c — the cuBLASLt matmul (kernels/cuda/matmul_cuda.cu) against the
 * cpu reference (kernels/cpu/matmul_cpu.c) on the same bf16-rounded random operands.
 *
 * Shapes are rows x in_dim x out_dim: 1x64x64, 333x96x200, 333x200x96, and 4096x4096x1024,
 * where the cpu reference is computed only for sampled rows of out and din and sampled rows
 * of dweight (a full fp32 reference would take the cpu seconds). Tolerances: relative 1e-2
 * for bf16 outputs (out, din), 1e-5 for the fp32 dweight. Outputs that are written are
 * poisoned first; "+=" outputs start from random values. Each test SKIPs without a GPU.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/kernels_cuda.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define FP32_TOLERANCE 1e-5

static const int small_shapes[][3] = {{1, 64, 64}, {333, 96, 200}, {333, 200, 96}};
enum { SMALL_SHAPE_COUNT = sizeof small_shapes / sizeof small_shapes[0] };
enum { LARGE_ROWS = 4096, LARGE_IN = 4096, LARGE_OUT = 1024, SAMPLES = 24 };



static void expect_close(const float *got, const float *want, size_t n, double tolerance,
                         const char *what, int rows, int in_dim, int out_dim)
{
    double error = test_relative_error(got, want, n);
    cr_assert_leq(error, tolerance, "%s %dx%dx%d: relative error %g", what, rows, in_dim,
                  out_dim, error);
}

/* The operands of one case, on the host (bf16-valued) and the device. */
typedef struct MatmulCase {
    int rows, in_dim, out_dim;
    float *in, *weight, *dout, *din, *dweight;  /* host; din and dweight: starting values */
    bf16 *device_in, *device_weight, *device_dout;
} MatmulCase;

static MatmulCase matmul_case(int rows, int in_dim, int out_dim, uint64_t seed)
{
    MatmulCase c = {rows, in_dim, out_dim, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t in_count = (size_t)rows * in_dim, out_count = (size_t)rows * out_dim;
    size_t weight_count = (size_t)out_dim * in_dim;
    c.in = gpu_test_bf16_values(in_count, 1, seed);
    c.weight = gpu_test_bf16_values(weight_count, 1, seed + 1);
    c.dout = gpu_test_bf16_values(out_count, 1, seed + 2);
    c.din = gpu_test_bf16_values(in_count, 4, seed + 3);
    c.dweight = gpu_test_fp32_values(weight_count, 4, seed + 4);
    c.device_in = gpu_upload_bf16(c.in, in_count);
    c.device_weight = gpu_upload_bf16(c.weight, weight_count);
    c.device_dout = gpu_upload_bf16(c.dout, out_count);
    return c;
}

static void matmul_case_free(MatmulCase *c)
{
    free(c->in), free(c->weight), free(c->dout), free(c->din), free(c->dweight);
    gpu_free_all();
}

/* One GPU backward from the case's starting din / dweight; returns them on the host.
 * with_din = 0 passes din = NULL. */
static void gpu_backward(const MatmulCase *c, int with_din, float **din_out, float **dweight_out)
{
    size_t in_count = (size_t)c->rows * c->in_dim, weight_count = (size_t)c->out_dim * c->in_dim;
    bf16 *din = with_din ? gpu_upload_bf16(c->din, in_count) : NULL;
    float *dweight = gpu_upload_floats(c->dweight, weight_count);
    cuda_matmul_backward(din, GRAD_ADD, dweight, GRAD_ADD, c->device_dout, c->device_in,
                         c->device_weight, c->rows, c->in_dim, c->out_dim, 0);
    *din_out = with_din ? gpu_download_bf16(din, in_count) : NULL;
    *dweight_out = gpu_download_floats(dweight, weight_count);
}

Test(cuda_matmul, forward_matches_cpu)
{
    gpu_require();
    for (int s = 0; s < SMALL_SHAPE_COUNT; s++) {
        MatmulCase c = matmul_case(small_shapes[s][0], small_shapes[s][1], small_shapes[s][2],
                                   10 + 10 * s);
        size_t out_count = (size_t)c.rows * c.out_dim;
        float *expected = malloc(out_count * sizeof(float));
        cpu_matmul_forward(expected, c.in, c.weight, c.rows, c.in_dim, c.out_dim);
        bf16 *out = gpu_poisoned_bf16(out_count);
        cuda_matmul_forward(out, c.device_in, c.device_weight, c.rows, c.in_dim, c.out_dim, 0);
        float *got = gpu_download_bf16(out, out_count);
        expect_close(got, expected, out_count, BF16_TOLERANCE, "forward", c.rows, c.in_dim,
                     c.out_dim);
        free(expected), free(got);
        matmul_case_free(&c);
    }
}

Test(cuda_matmul, backward_adds_both_cpu_gradients)
{
    gpu_require();
    for (int s = 0; s < SMALL_SHAPE_COUNT; s++) {
        MatmulCase c = matmul_case(small_shapes[s][0], small_shapes[s][1], small_shapes[s][2],
                                   100 + 10 * s);
        float *got_din, *got_dweight;
        gpu_backward(&c, 1, &got_din, &got_dweight);
        cpu_matmul_backward(c.din, GRAD_ADD, c.dweight, GRAD_ADD, c.dout, c.in, c.weight, c.rows,
                            c.in_dim, c.out_dim);
        expect_close(got_din, c.din, (size_t)c.rows * c.in_dim, BF16_TOLERANCE, "din", c.rows,
                     c.in_dim, c.out_dim);
        expect_close(got_dweight, c.dweight, (size_t)c.out_dim * c.in_dim, FP32_TOLERANCE,
                     "dweight", c.rows, c.in_dim, c.out_dim);
        free(got_din), free(got_dweight);
        matmul_case_free(&c);
    }
}

Test(cuda_matmul, backward_without_din_adds_only_dweight)
{
    gpu_require();
    MatmulCase c = matmul_case(333, 96, 200, 200);
    float *got_din, *got_dweight;
    gpu_backward(&c, 0, &got_din, &got_dweight);
    cpu_matmul_backward(NULL, GRAD_ADD, c.dweight, GRAD_ADD, c.dout, c.in, c.weight, c.rows,
                        c.in_dim, c.out_dim);
    expect_close(got_dweight, c.dweight, (size_t)c.out_dim * c.in_dim, FP32_TOLERANCE,
                 "dweight", c.rows, c.in_dim, c.out_dim);
    free(got_dweight);
    matmul_case_free(&c);
}

Test(cuda_matmul, two_backward_calls_double_dweight)
{
    gpu_require();
    MatmulCase c = matmul_case(333, 96, 200, 300);
    size_t weight_count = (size_t)c.out_dim * c.in_dim;
    float *once = gpu_poisoned_floats(weight_count), *twice = gpu_poisoned_floats(weight_count);
    CUDA_CHECK(cudaMemset(once, 0, weight_count * sizeof(float)));
    CUDA_CHECK(cudaMemset(twice, 0, weight_count * sizeof(float)));
    cuda_matmul_backward(NULL, GRAD_ADD, once, GRAD_ADD, c.device_dout, c.device_in,
                         c.device_weight, c.rows, c.in_dim, c.out_dim, 0);
    for (int call = 0; call < 2; call++)
        cuda_matmul_backward(NULL, GRAD_ADD, twice, GRAD_ADD, c.device_dout, c.device_in,
                             c.device_weight, c.rows, c.in_dim, c.out_dim, 0);
    float *got_once = gpu_download_floats(once, weight_count);
    float *got_twice = gpu_download_floats(twice, weight_count);
    for (size_t i = 0; i < weight_count; i++)
        got_once[i] *= 2.0f;
    /* (0 + X) + X is exactly 2X when C is added after the k-loop; allow for an epilogue that
     * folds C in earlier: still one fp32 sum, so far below any real accumulation error */
    double error = test_relative_error(got_twice, got_once, weight_count);
    cr_assert_leq(error, 1e-6, "two calls vs twice one call: relative error %g", error);
    free(got_once), free(got_twice);
    matmul_case_free(&c);
}

Test(cuda_matmul, backward_is_deterministic)
{
    gpu_require();
    MatmulCase c = matmul_case(LARGE_ROWS, LARGE_IN, LARGE_OUT, 400);
    float *din_1, *dweight_1, *din_2, *dweight_2;
    gpu_backward(&c, 1, &din_1, &dweight_1);
    gpu_backward(&c, 1, &din_2, &dweight_2);
    cr_assert_eq(memcmp(din_1, din_2, (size_t)c.rows * c.in_dim * sizeof(float)), 0,
                 "din differs between runs");
    cr_assert_eq(memcmp(dweight_1, dweight_2, (size_t)c.out_dim * c.in_dim * sizeof(float)), 0,
                 "dweight differs between runs");
    free(din_1), free(dweight_1), free(din_2), free(dweight_2);
    matmul_case_free(&c);
}

Test(cuda_matmul, matmul_runs_again_after_destroy)
{
    gpu_require();
    MatmulCase c = matmul_case(1, 64, 64, 500);
    float expected[64];
    cpu_matmul_forward(expected, c.in, c.weight, 1, 64, 64);
    bf16 *out = gpu_poisoned_bf16(64);
    cuda_matmul_forward(out, c.device_in, c.device_weight, 1, 64, 64, 0);
    cuda_matmul_destroy();
    CUDA_CHECK(cudaMemset(out, 0xFF, 64 * sizeof(bf16)));
    cuda_matmul_forward(out, c.device_in, c.device_weight, 1, 64, 64, 0);
    float *got = gpu_download_bf16(out, 64);
    expect_close(got, expected, 64, BF16_TOLERANCE, "forward after destroy", 1, 64, 64);
    free(got);
    matmul_case_free(&c);
}

/* ---- 4096 x 4096 x 1024, checked on samples ---- */

/* SAMPLES distinct-enough random indices below `limit` */
static void sample_indices(int *indices, int limit, uint64_t seed)
{
    for (int s = 0; s < SAMPLES; s++)
        indices[s] = test_random_int(0, limit - 1, seed + (uint64_t)s);
}

/* rows[s] of a [*, width] matrix, gathered into [SAMPLES, width] */
static float *gather_rows(const float *matrix, const int *rows, int width)
{
    float *out = malloc((size_t)SAMPLES * width * sizeof(float));
    for (int s = 0; s < SAMPLES; s++)
        memcpy(out + (size_t)s * width, matrix + (size_t)rows[s] * width, width * sizeof(float));
    return out;
}

Test(cuda_matmul, large_forward_matches_cpu_on_sampled_rows)
{
    gpu_require();
    MatmulCase c = matmul_case(LARGE_ROWS, LARGE_IN, LARGE_OUT, 600);
    size_t out_count = (size_t)c.rows * c.out_dim;
    bf16 *out = gpu_poisoned_bf16(out_count);
    cuda_matmul_forward(out, c.device_in, c.device_weight, c.rows, c.in_dim, c.out_dim, 0);
    float *got = gpu_download_bf16(out, out_count);
    cr_assert(test_all_finite(got, out_count), "forward left elements unwritten");

    int rows[SAMPLES];
    sample_indices(rows, c.rows, 610);
    float *in_rows = gather_rows(c.in, rows, c.in_dim);
    float *got_rows = gather_rows(got, rows, c.out_dim);
    float *expected = malloc((size_t)SAMPLES * c.out_dim * sizeof(float));
    cpu_matmul_forward(expected, in_rows, c.weight, SAMPLES, c.in_dim, c.out_dim);
    expect_close(got_rows, expected, (size_t)SAMPLES * c.out_dim, BF16_TOLERANCE, "forward",
                 c.rows, c.in_dim, c.out_dim);
    free(got), free(in_rows), free(got_rows), free(expected);
    matmul_case_free(&c);
}

Test(cuda_matmul, large_backward_matches_cpu_on_sampled_rows)
{
    gpu_require();
    MatmulCase c = matmul_case(LARGE_ROWS, LARGE_IN, LARGE_OUT, 700);
    float *got_din, *got_dweight;
    gpu_backward(&c, 1, &got_din, &got_dweight);

    /* din rows: the cpu backward over the sampled rows only (its dweight is discarded) */
    int rows[SAMPLES];
    sample_indices(rows, c.rows, 710);
    float *dout_rows = gather_rows(c.dout, rows, c.out_dim);
    float *in_rows = gather_rows(c.in, rows, c.in_dim);
    float *expected_din = gather_rows(c.din, rows, c.in_dim);
    float *discarded = calloc((size_t)c.out_dim * c.in_dim, sizeof(float));
    cpu_matmul_backward(expected_din, GRAD_ADD, discarded, GRAD_ADD, dout_rows, in_rows, c.weight,
                        SAMPLES, c.in_dim, c.out_dim);
    float *got_din_rows = gather_rows(got_din, rows, c.in_dim);
    expect_close(got_din_rows, expected_din, (size_t)SAMPLES * c.in_dim, BF16_TOLERANCE, "din",
                 c.rows, c.in_dim, c.out_dim);

    /* dweight rows o: dweight[o, :] + sum over all rows r of dout[r, o] * in[r, :], in double */
    int outs[SAMPLES];
    sample_indices(outs, c.out_dim, 720);
    double *sum = malloc((size_t)c.in_dim * sizeof(double));
    double *expected_dweight = malloc((size_t)SAMPLES * c.in_dim * sizeof(double));
    for (int s = 0; s < SAMPLES; s++) {
        int o = outs[s];
        for (int i = 0; i < c.in_dim; i++)
            sum[i] = c.dweight[(size_t)o * c.in_dim + i];
        for (int r = 0; r < c.rows; r++) {
            double g = c.dout[(size_t)r * c.out_dim + o];
            const float *in_row = c.in + (size_t)r * c.in_dim;
            for (int i = 0; i < c.in_dim; i++)
                sum[i] += g * in_row[i];
        }
        memcpy(expected_dweight + (size_t)s * c.in_dim, sum, c.in_dim * sizeof(double));
    }
    float *got_dweight_rows = gather_rows(got_dweight, outs, c.in_dim);
    double error = test_relative_error_double(got_dweight_rows, expected_dweight,
                                              (size_t)SAMPLES * c.in_dim);
    cr_assert_leq(error, FP32_TOLERANCE, "dweight 4096x4096x1024: relative error %g", error);

    free(got_din), free(got_dweight), free(dout_rows), free(in_rows), free(expected_din);
    free(discarded), free(got_din_rows), free(sum), free(expected_dweight), free(got_dweight_rows);
    matmul_case_free(&c);
}
