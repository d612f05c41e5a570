/* tests/test_grad_mode.c — the cpu backward ops' GradMode (runtime/backend.h): GRAD_WRITE
 * into NaN gives the bits GRAD_ADD gives into zeros, and GRAD_ADD onto a start still adds
 * (grad_mode_support.h). Through the op table, as the model calls them; shapes large enough
 * to run on several threads and blocks (and the cuda shapes of test_cuda_grad_mode.c).
 */
#include "tests/grad_mode_support.h"

#include <criterion/criterion.h>

/* fp32: a start + gradient summed in another order is off by a few roundings */
#define ADD_TOLERANCE 1e-5

Test(grad_mode, matmul_backward_writes_what_it_adds_into_zeros)
{
    /* rows, in_dim, out_dim: one block; in_dim over two column blocks and several threads;
     * no outputs, where din is an empty sum (zeros) */
    const int shapes[][3] = {{33, 40, 24}, {70, 300, 37}, {5, 24, 0}};
    for (int i = 0; i < 3; i++) {
        GradModeCase c = grad_mode_case_matmul(shapes[i][0], shapes[i][1], shapes[i][2]);
        grad_mode_check(backend_cpu(), &c, 10 + (uint64_t)i, ADD_TOLERANCE);
    }
}

Test(grad_mode, rmsnorm_backward_writes_what_it_adds_into_zeros)
{
    const int shapes[][2] = {{7, 40}, {256, 200}}; /* rows, d */
    for (int i = 0; i < 2; i++) {
        GradModeCase c = grad_mode_case_rmsnorm(shapes[i][0], shapes[i][1]);
        grad_mode_check(backend_cpu(), &c, 20 + (uint64_t)i, ADD_TOLERANCE);
    }
}

Test(grad_mode, rope_backward_writes_what_it_adds_into_zeros)
{
    const int shapes[][4] = {{2, 9, 3, 10}, {2, 65, 4, 64}}; /* B, T, n_heads, head_dim */
    for (int i = 0; i < 2; i++) {
        const int *s = shapes[i];
        GradModeCase c = grad_mode_case_rope(s[0], s[1], s[2], s[3]);
        grad_mode_check(backend_cpu(), &c, 30 + (uint64_t)i, ADD_TOLERANCE);
    }
}

/* dq at t = 0 is the one product 0 * k (p = 1, dp = delta): -0.0 wherever k < 0, +0.0 after
 * an add into zeros; the write must give +0.0 too */
Test(grad_mode, attention_backward_writes_what_it_adds_into_zeros)
{
    /* B, T, n_heads, n_kv_heads, head_dim: grouped and ungrouped heads */
    const int shapes[][5] = {{2, 37, 4, 2, 64}, {1, 19, 3, 1, 80}, {1, 20, 2, 2, 16}};
    for (int i = 0; i < 3; i++) {
        const int *s = shapes[i];
        GradModeCase c = grad_mode_case_attention(s[0], s[1], s[2], s[3], s[4]);
        grad_mode_check(backend_cpu(), &c, 40 + (uint64_t)i, ADD_TOLERANCE);
    }
}

Test(grad_mode, swiglu_backward_writes_what_it_adds_into_zeros)
{
    const size_t lengths[] = {1003, (1 << 15) + 3};
    for (int i = 0; i < 2; i++) {
        GradModeCase c = grad_mode_case_swiglu(lengths[i]);
        grad_mode_check(backend_cpu(), &c, 50 + (uint64_t)i, ADD_TOLERANCE);
    }
}

/* MSAR's walk writes the convolved partial's gradient row, AttnRes's adds into the block's */
Test(grad_mode, route_merge_backward_writes_what_it_adds_into_zeros)
{
    const int shapes[][4] = {{7, 24, 3, 2}, {300, 64, 4, 5}}; /* tokens, d, heads, sources */
    for (int i = 0; i < 2; i++) {
        const int *s = shapes[i];
        GradModeCase c = grad_mode_case_route_merge(s[0], s[1], s[2], s[3]);
        grad_mode_check(backend_cpu(), &c, 70 + (uint64_t)i, ADD_TOLERANCE);
    }
}

Test(grad_mode, cross_entropy_backward_writes_what_it_adds_into_zeros)
{
    const int shapes[][2] = {{3, 37}, {40, 1000}}; /* rows, V */
    for (int i = 0; i < 2; i++) {
        GradModeCase c = grad_mode_case_cross_entropy(shapes[i][0], shapes[i][1]);
        grad_mode_check(backend_cpu(), &c, 60 + (uint64_t)i, ADD_TOLERANCE);
    }
}
