/* tests/test_cuda_grad_mode.c — the cuda backward ops' GradMode (runtime/backend.h), through
 * the cuda op table:
 * GRAD_WRITE into NaN gives the bits GRAD_ADD gives into zeros on the GPU, and GRAD_ADD onto
 * a start still adds (grad_mode_support.h). With GRAD_ADD held to the cpu from random starts
 * (test_cuda_backend_ops.c, test_cuda_cross_entropy.c), that holds the written gradients to
 * the cpu's as well.
 * The attention checks run each backward kernel (fused, fused_tma, two_pass): each has its
 * own stores of dq, dk, dv. Each test SKIPs where no GPU answers.
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/backend_cuda.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/grad_mode_support.h"

#include <criterion/criterion.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE /* cuda_backend_support.h */

static const AttentionBackwardKernel attention_kernels[] = {
    ATTENTION_BACKWARD_FUSED, ATTENTION_BACKWARD_FUSED_TMA, ATTENTION_BACKWARD_TWO_PASS};

/* ---- GRAD_WRITE is GRAD_ADD into zeros, on the GPU ---- */

Test(cuda_grad_mode, matmul_backward_writes_what_it_adds_into_zeros)
{
    gpu_require();
    /* rows, in_dim, out_dim; the last has no outputs: din is an empty sum, zeros */
    const int shapes[][3] = {{33, 40, 24}, {5, 24, 56}, {512, 1024, 384}, {5, 24, 0}};
    for (int i = 0; i < 4; i++) {
        GradModeCase c = grad_mode_case_matmul(shapes[i][0], shapes[i][1], shapes[i][2]);
        grad_mode_check(backend_cuda(), &c, 110 + (uint64_t)i, BF16_OUT);
    }
}

Test(cuda_grad_mode, rmsnorm_backward_writes_what_it_adds_into_zeros)
{
    gpu_require();
    /* rows of a warp (d <= 1024), of a warp over five chunks (d <= 1280) and of a whole
     * block, vector and not */
    const int shapes[][2] = {{7, 40}, {33, 100}, {5, 2056}, {3, 4100}, {9, 1280}, {4, 1100}};
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        GradModeCase c = grad_mode_case_rmsnorm(shapes[i][0], shapes[i][1]);
        grad_mode_check(backend_cuda(), &c, 120 + (uint64_t)i, BF16_OUT);
    }
}

Test(cuda_grad_mode, rope_backward_writes_what_it_adds_into_zeros)
{
    gpu_require();
    const int shapes[][4] = {{2, 9, 3, 10}, {1, 17, 2, 64}}; /* scalar and vector paths */
    for (int i = 0; i < 2; i++) {
        const int *s = shapes[i];
        GradModeCase c = grad_mode_case_rope(s[0], s[1], s[2], s[3]);
        grad_mode_check(backend_cuda(), &c, 130 + (uint64_t)i, BF16_OUT);
    }
}

static const int attention_shapes[][5] = {{2, 37, 4, 2, 64}, {1, 19, 3, 1, 80},
                                          {1, 130, 2, 2, 128}};

Test(cuda_grad_mode, attention_backward_writes_what_it_adds_into_zeros)
{
    gpu_require();
    for (int k = 0; k < 3; k++) {
        attention_cuda_select_backward(attention_kernels[k]);
        for (int i = 0; i < 3; i++) {
            const int *s = attention_shapes[i];
            GradModeCase c = grad_mode_case_attention(s[0], s[1], s[2], s[3], s[4]);
            cr_log_info("attention backward kernel %d, shape %d", k, i);
            grad_mode_check(backend_cuda(), &c, 140 + (uint64_t)(3 * k + i), BF16_OUT);
        }
    }
}

Test(cuda_grad_mode, swiglu_backward_writes_what_it_adds_into_zeros)
{
    gpu_require();
    const size_t lengths[] = {1, 1003, (1 << 20) + 3}; /* the last: several grid strides */
    for (int i = 0; i < 3; i++) {
        GradModeCase c = grad_mode_case_swiglu(lengths[i]);
        grad_mode_check(backend_cuda(), &c, 150 + (uint64_t)i, BF16_OUT);
    }
}

Test(cuda_grad_mode, cross_entropy_backward_writes_what_it_adds_into_zeros)
{
    gpu_require();
    /* rows, V: V not a multiple of 8 (the scalar path), and the 8B vocabulary */
    const int shapes[][2] = {{3, 37}, {5, 128256}};
    for (int i = 0; i < 2; i++) {
        GradModeCase c = grad_mode_case_cross_entropy(shapes[i][0], shapes[i][1]);
        grad_mode_check(backend_cuda(), &c, 160 + (uint64_t)i, BF16_OUT);
    }
}

/* the warp-a-token kernel (d % 256 == 0, heads dividing 32, route_merge_narrow_cuda.cu) and
 * the block-a-token one, each with several tokens a warp or block */
Test(cuda_grad_mode, route_merge_backward_writes_what_it_adds_into_zeros)
{
    gpu_require();
    /* tokens, d, heads, sources: the 1B width; narrow at 8 vectors a lane; block a token, vector
     * and not; more tokens than the narrow backward's warps */
    const int shapes[][4] = {{300, 1280, 8, 4}, {33, 2048, 16, 2}, {37, 96, 4, 3},
                             {9, 20, 5, 6}, {1100, 256, 2, 3}};
    for (int i = 0; i < 5; i++) {
        const int *s = shapes[i];
        GradModeCase c = grad_mode_case_route_merge(s[0], s[1], s[2], s[3]);
        grad_mode_check(backend_cuda(), &c, 170 + (uint64_t)i, BF16_OUT);
    }
}
