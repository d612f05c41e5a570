/* tests/test_cuda_add_norm.c — the standard stream's residual add inside the next sublayer's
 * norm on the cuda op table (runtime/backend.h add_rmsnorm_forward): sum = a + b, then its
 * RMSNorm, against the cpu, and with the bits of add then rmsnorm_forward, the two ops it
 * replaces (model/chunk.c layer_forward).
 *
 * Rules of tests/cuda_backend_support.h: fresh random inputs rounded to bf16, outputs
 * poisoned with NaN on both backends, relative errors within bf16 tolerance (1e-2) for
 * activations and 1e-3 for rstd, and the cuda call run twice from the same start must give
 * the same bits. Each test SKIPs where no GPU answers.
 */
#include "kernels/cuda/kernels_cuda.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#define EPS 1e-5f
#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

/* rows of a block of 256 threads (d 4096, two chunks), of a warp over five chunks (d 1280,
 * the 1B width), of a warp (d 24), and a width that is no multiple of 8 (the scalar path) */
static const int add_norm_shapes[][2] = {{33, 4096}, {17, 1280}, {5, 24}, {9, 100}};

/* shape rows, d; sum, out, rstd, a, b, weight */
static void run_add_rmsnorm(const Backend *b, void *const *p, const OpCase *c)
{
    b->add_rmsnorm_forward(p[0], p[1], p[2], p[3], p[4], p[5], c->shape[0], c->shape[1], EPS);
}

Test(cuda_add_norm, add_rmsnorm_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < COUNT(add_norm_shapes); i++) {
        const int rows = add_norm_shapes[i][0], d = add_norm_shapes[i][1];
        const size_t n = (size_t)rows * d;
        OpCase c = op_case("add_rmsnorm_forward", run_add_rmsnorm);
        c.shape[0] = rows, c.shape[1] = d;
        op_output(&c, "sum", ARRAY_ACTIVATION, n, BACKEND_BF16_TOLERANCE);
        op_output(&c, "out", ARRAY_ACTIVATION, n, BACKEND_BF16_TOLERANCE);
        /* the sum is rounded to bf16 before its row sum here, not on the cpu */
        op_output(&c, "rstd", ARRAY_FLOAT, (size_t)rows, BACKEND_STATISTIC_TOLERANCE);
        op_input(&c, "a", ARRAY_ACTIVATION, n, 1, 0);
        op_input(&c, "b", ARRAY_ACTIVATION, n, 2, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
        op_check(&c, 1400 + (uint64_t)i);
    }
}

/* The promise of runtime/backend.h: the bits of add then rmsnorm_forward on the same backend
 * (its kernels, on the default stream) for the sum, the normed row and rstd. */
Test(cuda_add_norm, add_rmsnorm_forward_gives_the_bits_of_add_then_the_norm)
{
    gpu_require();
    for (int i = 0; i < COUNT(add_norm_shapes); i++) {
        const int rows = add_norm_shapes[i][0], d = add_norm_shapes[i][1];
        const size_t n = (size_t)rows * d;
        float *a = gpu_test_rounded_uniform(n, 1.0f, 0.0f, 1410 + (uint64_t)i);
        float *b = gpu_test_rounded_uniform(n, 2.0f, 0.0f, 1420 + (uint64_t)i);
        float *weight = gpu_test_rounded_uniform((size_t)d, 0.5f, 1.0f, 1430 + (uint64_t)i);
        const bf16 *a_device = gpu_upload_bf16(a, n), *b_device = gpu_upload_bf16(b, n);
        const bf16 *weight_device = gpu_upload_bf16(weight, (size_t)d);
        bf16 *sum[2], *out[2];
        float *rstd[2];
        for (int k = 0; k < 2; k++) { /* 0: the two ops, 1: one pass */
            sum[k] = gpu_poisoned_bf16(n), out[k] = gpu_poisoned_bf16(n);
            rstd[k] = gpu_poisoned_floats((size_t)rows);
        }
        cuda_add(sum[0], a_device, b_device, n, 0);
        cuda_rmsnorm_forward(out[0], rstd[0], sum[0], weight_device, rows, d, EPS, 0);
        cuda_add_rmsnorm_forward(sum[1], out[1], rstd[1], a_device, b_device, weight_device,
                                 rows, d, EPS, 0);
        float *want[3] = {gpu_download_bf16(sum[0], n), gpu_download_bf16(out[0], n),
                          gpu_download_floats(rstd[0], (size_t)rows)};
        float *got[3] = {gpu_download_bf16(sum[1], n), gpu_download_bf16(out[1], n),
                         gpu_download_floats(rstd[1], (size_t)rows)};
        const size_t counts[3] = {n, n, (size_t)rows};
        const char *names[3] = {"the sum against add's", "the normed row against the norm's",
                                "rstd against the norm's"};
        for (int k = 0; k < 3; k++) {
            expect_bitwise_equal(got[k], want[k], counts[k], names[k]);
            free(got[k]);
            free(want[k]);
        }
        free(a), free(b), free(weight);
        gpu_free_all();
    }
}
