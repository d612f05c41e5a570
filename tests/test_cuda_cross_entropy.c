/* tests/test_cuda_cross_entropy.c — the cuda backend's fused cross-entropy + z-loss
 * (kernels/cuda/cross_entropy_cuda.cu) against the cpu reference on the same random logits,
 * rounded to bf16 first (DESIGN 7, "GPU").
 *
 * Tolerances: relative 1e-5 for the fp32 losses and lse, 1e-2 for the bf16 gradient, which
 * is also compared without its target columns (the one-hot term dominates a row's norm and
 * would hide an error in the softmax part). Vocabularies: 37, 1000, Llama-3's 128256, and
 * 50257, not a multiple of 8 (the element-wise path). The forward for a backward (the two in
 * one launch) is held to the two launches bit for bit. Each test SKIPs without a GPU.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/kernels_cuda.h"
#include "tests/gpu_support.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define FP32_TOLERANCE 1e-5

/* rows, V: V 50257 is not a multiple of 8 (the element-wise path); 128256 is Llama-3's */
static const int cross_entropy_shapes[][2] = {{1, 37}, {7, 1000}, {333, 1000}, {3, 128256},
                                              {5, 50257}};
static const float z_loss = 1e-2f;

Test(cuda_cross_entropy, forward_matches_cpu)
{
    gpu_require();
    for (size_t c = 0; c < sizeof cross_entropy_shapes / sizeof cross_entropy_shapes[0]; c++) {
        int rows = cross_entropy_shapes[c][0], V = cross_entropy_shapes[c][1];
        size_t count = (size_t)rows * V;
        float *logits = gpu_test_bf16_values(count, 6, 340 + c);
        uint32_t *targets = gpu_test_random_tokens(rows, V, 350 + c);
        float *expected = malloc(rows * sizeof(float));
        float *expected_lse = malloc(rows * sizeof(float));
        cpu_cross_entropy_forward(expected, expected_lse, logits, targets, rows, V, z_loss);
        float *losses = gpu_poisoned_floats(rows), *lse = gpu_poisoned_floats(rows);
        cuda_cross_entropy_forward(losses, lse, gpu_upload_bf16(logits, count),
                                   gpu_upload_tokens(targets, rows), rows, V, z_loss, 0);
        float *got = gpu_download_floats(losses, rows), *got_lse = gpu_download_floats(lse, rows);
        gpu_expect_close(got, expected, rows, FP32_TOLERANCE, "cross-entropy losses");
        gpu_expect_close(got_lse, expected_lse, rows, FP32_TOLERANCE, "cross-entropy lse");
        free(logits), free(targets), free(expected), free(expected_lse), free(got), free(got_lse);
        gpu_free_all();
    }
}

Test(cuda_cross_entropy, target_outside_the_vocabulary_gives_a_nan_loss)
{
    gpu_require();
    int rows = 3, V = 1000;
    float *logits = gpu_test_bf16_values((size_t)rows * V, 6, 360);
    uint32_t targets[3] = {5, (uint32_t)V, 7};
    float *losses = gpu_poisoned_floats(rows), *lse = gpu_poisoned_floats(rows);
    cuda_cross_entropy_forward(losses, lse, gpu_upload_bf16(logits, (size_t)rows * V),
                               gpu_upload_tokens(targets, rows), rows, V, z_loss, 0);
    float *got = gpu_download_floats(losses, rows);
    cr_assert(isfinite(got[0]) && isnan(got[1]) && isfinite(got[2]),
              "losses %g %g %g", got[0], got[1], got[2]);
    free(logits), free(got);
    gpu_free_all();
}

/* dlogits after one GPU backward: added to `dlogits`, or in place over the logits when
 * dlogits is NULL */
static float *gpu_cross_entropy_backward(const float *dlogits, const float *dloss,
                                         const float *logits, const float *lse,
                                         const uint32_t *targets, int rows, int V)
{
    size_t count = (size_t)rows * V;
    bf16 *device_logits = gpu_upload_bf16(logits, count);
    bf16 *device_dlogits = dlogits ? gpu_upload_bf16(dlogits, count) : device_logits;
    cuda_cross_entropy_backward(device_dlogits, GRAD_ADD, gpu_upload_floats(dloss, rows),
                                device_logits, gpu_upload_floats(lse, rows),
                                gpu_upload_tokens(targets, rows), rows, V, z_loss, 0);
    return gpu_download_bf16(device_dlogits, count);
}

/* Random logits, targets and dloss for a shape, and the cpu lse. */
typedef struct CrossEntropyCase {
    float *logits, *dloss, *lse, *losses;
    uint32_t *targets;
} CrossEntropyCase;

static CrossEntropyCase cross_entropy_case(int rows, int V, uint64_t seed)
{
    CrossEntropyCase case_;
    case_.logits = gpu_test_bf16_values((size_t)rows * V, 6, seed);
    case_.targets = gpu_test_random_tokens(rows, V, seed + 1);
    case_.dloss = gpu_test_fp32_values(rows, 1, seed + 2);
    case_.lse = malloc(rows * sizeof(float));
    case_.losses = malloc(rows * sizeof(float));
    cpu_cross_entropy_forward(case_.losses, case_.lse, case_.logits, case_.targets, rows, V,
                              z_loss);
    return case_;
}

/* The one-hot term dominates the norm of a gradient row; the softmax part is compared on its
 * own as well, with the target columns left out of both arrays. */
static void expect_close_gradient(const float *got, const float *expected,
                                  const uint32_t *targets, int rows, int V, const char *what)
{
    size_t count = (size_t)rows * V;
    gpu_expect_close(got, expected, count, BF16_TOLERANCE, what);
    float *got_softmax = malloc(count * sizeof(float));
    float *expected_softmax = malloc(count * sizeof(float));
    memcpy(got_softmax, got, count * sizeof(float));
    memcpy(expected_softmax, expected, count * sizeof(float));
    for (int r = 0; r < rows; r++)
        got_softmax[(size_t)r * V + targets[r]] = expected_softmax[(size_t)r * V + targets[r]] = 0;
    gpu_expect_close(got_softmax, expected_softmax, count, BF16_TOLERANCE, what);
    free(got_softmax), free(expected_softmax);
}

static void cross_entropy_case_free(CrossEntropyCase *case_)
{
    free(case_->logits), free(case_->dloss), free(case_->lse), free(case_->losses);
    free(case_->targets);
}

Test(cuda_cross_entropy, backward_adds_the_cpu_gradient)
{
    gpu_require();
    for (size_t c = 0; c < sizeof cross_entropy_shapes / sizeof cross_entropy_shapes[0]; c++) {
        int rows = cross_entropy_shapes[c][0], V = cross_entropy_shapes[c][1];
        size_t count = (size_t)rows * V;
        CrossEntropyCase case_ = cross_entropy_case(rows, V, 370 + 10 * c);
        float *dlogits = gpu_test_bf16_values(count, 0.5f / V, 375 + 10 * c);
        float *got = gpu_cross_entropy_backward(dlogits, case_.dloss, case_.logits, case_.lse,
                                                case_.targets, rows, V);
        cpu_cross_entropy_backward(dlogits, GRAD_ADD, case_.dloss, case_.logits, case_.lse,
                                   case_.targets, rows, V, z_loss);
        expect_close_gradient(got, dlogits, case_.targets, rows, V, "cross-entropy dlogits");
        cross_entropy_case_free(&case_);
        free(dlogits), free(got);
        gpu_free_all();
    }
}

Test(cuda_cross_entropy, backward_in_place_replaces_the_logits_by_their_gradient)
{
    gpu_require();
    for (size_t c = 0; c < sizeof cross_entropy_shapes / sizeof cross_entropy_shapes[0]; c++) {
        int rows = cross_entropy_shapes[c][0], V = cross_entropy_shapes[c][1];
        size_t count = (size_t)rows * V;
        CrossEntropyCase case_ = cross_entropy_case(rows, V, 430 + 10 * c);
        float *got = gpu_cross_entropy_backward(NULL, case_.dloss, case_.logits, case_.lse,
                                                case_.targets, rows, V);
        float *expected = calloc(count, sizeof(float));
        cpu_cross_entropy_backward(expected, GRAD_ADD, case_.dloss, case_.logits, case_.lse,
                                   case_.targets, rows, V, z_loss);
        expect_close_gradient(got, expected, case_.targets, rows, V, "cross-entropy in place");
        cross_entropy_case_free(&case_);
        free(expected), free(got);
        gpu_free_all();
    }
}

Test(cuda_cross_entropy, backward_is_deterministic)
{
    gpu_require();
    int rows = 7, V = 128256;
    CrossEntropyCase case_ = cross_entropy_case(rows, V, 490);
    float *dlogits = gpu_test_bf16_values((size_t)rows * V, 0.5f / V, 495);
    float *first = gpu_cross_entropy_backward(dlogits, case_.dloss, case_.logits, case_.lse,
                                              case_.targets, rows, V);
    float *second = gpu_cross_entropy_backward(dlogits, case_.dloss, case_.logits, case_.lse,
                                               case_.targets, rows, V);
    cr_assert_eq(memcmp(first, second, (size_t)rows * V * sizeof(float)), 0,
                 "cross-entropy backward: two runs differ");
    cross_entropy_case_free(&case_);
    free(dlogits), free(first), free(second);
    gpu_free_all();
}

/* The forward for a backward (cuda_cross_entropy_forward_backward): its losses, lse and the
 * gradient it writes over the logits have the bits of the forward, then the backward in
 * place, and the cpu's values within the bounds above. A row goes to a cluster of 1 (37,
 * 1000), 2 (20000), 4 (50257) and 8 (128256; Qwen3's 151936 with 16 vectors a thread)
 * blocks. */
Test(cuda_cross_entropy, forward_backward_is_the_forward_then_the_backward_in_place)
{
    gpu_require();
    static const int shapes[][2] = {{1, 37}, {333, 1000}, {9, 20000}, {300, 128256},
                                    {5, 50257}, {2, 151936}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int rows = shapes[c][0], V = shapes[c][1];
        const size_t count = (size_t)rows * V;
        CrossEntropyCase case_ = cross_entropy_case(rows, V, 510 + 10 * c);
        const uint32_t *targets = gpu_upload_tokens(case_.targets, rows);
        const float *dloss = gpu_upload_floats(case_.dloss, rows);
        bf16 *apart = gpu_upload_bf16(case_.logits, count);
        float *losses = gpu_poisoned_floats(rows), *lse = gpu_poisoned_floats(rows);
        cuda_cross_entropy_forward(losses, lse, apart, targets, rows, V, z_loss, 0);
        cuda_cross_entropy_backward(apart, GRAD_WRITE, dloss, apart, lse, targets, rows, V,
                                    z_loss, 0);
        bf16 *together = gpu_upload_bf16(case_.logits, count);
        float *together_losses = gpu_poisoned_floats(rows);
        float *together_lse = gpu_poisoned_floats(rows);
        cuda_cross_entropy_forward_backward(together_losses, together_lse, together, dloss,
                                            targets, rows, V, z_loss, 0);
        float *want[3] = {gpu_download_floats(losses, rows), gpu_download_floats(lse, rows),
                          gpu_download_bf16(apart, count)};
        float *got[3] = {gpu_download_floats(together_losses, rows),
                         gpu_download_floats(together_lse, rows),
                         gpu_download_bf16(together, count)};
        const size_t sizes[3] = {(size_t)rows, (size_t)rows, count};
        const char *names[3] = {"the losses against the two launches'",
                                "lse against the two launches'",
                                "the gradient against the two launches'"};
        for (int k = 0; k < 3; k++)
            expect_bitwise_equal(got[k], want[k], sizes[k], names[k]);
        float *expected = calloc(count, sizeof(float));
        cpu_cross_entropy_backward(expected, GRAD_WRITE, case_.dloss, case_.logits, case_.lse,
                                   case_.targets, rows, V, z_loss);
        gpu_expect_close(got[0], case_.losses, rows, FP32_TOLERANCE, "the losses, together");
        expect_close_gradient(got[2], expected, case_.targets, rows, V, "the gradient, together");
        for (int k = 0; k < 3; k++)
            free(want[k]), free(got[k]);
        free(expected);
        cross_entropy_case_free(&case_);
        gpu_free_all();
    }
}
