/* tests/test_cuda_grad_mode.c — the cuda backward ops' GradMode (runtime/backend.h), through
 * the cuda op table:
 * - GRAD_WRITE into NaN gives the bits GRAD_ADD gives into zeros on the GPU, and GRAD_ADD
 *   onto a start still adds (grad_mode_support.h);
 * - the written gradients match the cpu's, into outputs poisoned on both sides
 *   (cuda_backend_support.h); GRAD_ADD against the cpu is test_cuda_backend_ops.c's.
 * The attention checks run each backward kernel (fused, fused_tma, two_pass): each has its
 * own stores of dq, dk, dv. Each test SKIPs where no GPU answers.
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/backend_cuda.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/grad_mode_support.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE
#define FP32_OUT BACKEND_FP32_TOLERANCE
#define EPS 1e-5f

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
    /* rows of a warp (d <= 1024) and of a whole block, vector and not */
    const int shapes[][2] = {{7, 40}, {33, 100}, {5, 2056}, {3, 4100}};
    for (int i = 0; i < 4; i++) {
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

/* ---- GRAD_WRITE against the cpu, into poisoned outputs ---- */

static float *scratch_floats(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(x);
    return x;
}

static void run_matmul_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->matmul_backward(p[0], GRAD_WRITE, p[1], p[2], p[3], p[4], c->shape[0], c->shape[1],
                       c->shape[2]);
}

Test(cuda_grad_mode, matmul_backward_writes_the_cpu_input_gradient)
{
    gpu_require();
    const int shapes[][3] = {{33, 40, 24}, {5, 24, 56}};
    for (int i = 0; i < 2; i++) {
        const int rows = shapes[i][0], in = shapes[i][1], out = shapes[i][2];
        OpCase c = op_case("matmul_backward (GRAD_WRITE)", run_matmul_backward);
        c.shape[0] = rows, c.shape[1] = in, c.shape[2] = out;
        op_output(&c, "din", ARRAY_ACTIVATION, (size_t)rows * in, BF16_OUT);
        op_accumulated(&c, "dweight", ARRAY_FLOAT, (size_t)out * in, FP32_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)rows * out, 1, 0);
        op_input(&c, "in", ARRAY_ACTIVATION, (size_t)rows * in, 1, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)out * in, 0.5f, 0);
        op_check(&c, 210 + (uint64_t)i);
    }
}

enum { RMSNORM_X = 3, RMSNORM_WEIGHT = 4, RMSNORM_RSTD = 5 };

static void run_rmsnorm_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->rmsnorm_backward(p[0], GRAD_WRITE, p[1], p[2], p[3], p[4], p[5], c->shape[0],
                        c->shape[1]);
}

static void prepare_rmsnorm_backward(OpCase *c)
{
    float *out = scratch_floats((size_t)c->shape[0] * c->shape[1]);
    backend_cpu()->rmsnorm_forward((Activation *)out, op_host(c, RMSNORM_RSTD),
                                   (Activation *)op_host(c, RMSNORM_X),
                                   (Activation *)op_host(c, RMSNORM_WEIGHT), c->shape[0],
                                   c->shape[1], EPS);
    free(out);
}

Test(cuda_grad_mode, rmsnorm_backward_writes_the_cpu_input_gradient)
{
    gpu_require();
    const int shapes[][2] = {{7, 40}, {33, 100}, {3, 4100}};
    for (int i = 0; i < 3; i++) {
        const int rows = shapes[i][0], d = shapes[i][1];
        OpCase c = op_case("rmsnorm_backward (GRAD_WRITE)", run_rmsnorm_backward);
        c.shape[0] = rows, c.shape[1] = d;
        c.prepare = prepare_rmsnorm_backward;
        op_output(&c, "dx", ARRAY_ACTIVATION, (size_t)rows * d, BF16_OUT);
        op_accumulated(&c, "dweight", ARRAY_FLOAT, (size_t)d, FP32_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0);
        op_input(&c, "x", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
        op_input(&c, "rstd", ARRAY_FLOAT, (size_t)rows, 0, 0);
        op_check(&c, 220 + (uint64_t)i);
    }
}

static void run_rope_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->rope_backward(p[0], GRAD_WRITE, p[1], p[2], p[3], c->shape[0], c->shape[1], c->shape[2],
                     c->shape[3]);
}

Test(cuda_grad_mode, rope_backward_writes_the_cpu_input_gradient)
{
    gpu_require();
    const int shapes[][4] = {{2, 9, 3, 10}, {1, 17, 2, 64}};
    for (int i = 0; i < 2; i++) {
        const int *s = shapes[i];
        const size_t count = (size_t)s[0] * s[1] * s[2] * s[3], angles = (size_t)s[1] * s[3] / 2;
        OpCase c = op_case("rope_backward (GRAD_WRITE)", run_rope_backward);
        for (int k = 0; k < 4; k++)
            c.shape[k] = s[k];
        op_output(&c, "dx", ARRAY_ACTIVATION, count, BF16_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, count, 1, 0);
        op_input(&c, "cos", ARRAY_FLOAT, angles, 1, 0);
        op_input(&c, "sin", ARRAY_FLOAT, angles, 1, 0);
        op_check(&c, 230 + (uint64_t)i);
    }
}

enum { ATTENTION_Q = 4, ATTENTION_K, ATTENTION_V, ATTENTION_OUT, ATTENTION_LSE };

static void run_attention_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->attention_backward(p[0], p[1], p[2], GRAD_WRITE, p[3], p[4], p[5], p[6], p[7], p[8],
                          c->shape[0], c->shape[1], c->shape[2], c->shape[3], c->shape[4]);
}

static void prepare_attention_backward(OpCase *c)
{
    backend_cpu()->attention_forward(
        (Activation *)op_host(c, ATTENTION_OUT), op_host(c, ATTENTION_LSE),
        (Activation *)op_host(c, ATTENTION_Q), (Activation *)op_host(c, ATTENTION_K),
        (Activation *)op_host(c, ATTENTION_V), c->shape[0], c->shape[1], c->shape[2],
        c->shape[3], c->shape[4]);
}

Test(cuda_grad_mode, attention_backward_writes_the_cpu_input_gradients)
{
    gpu_require();
    for (int k = 0; k < 3; k++) {
        attention_cuda_select_backward(attention_kernels[k]);
        for (int i = 0; i < 3; i++) {
            const int *s = attention_shapes[i];
            const size_t q_count = (size_t)s[0] * s[1] * s[2] * s[4];
            const size_t kv_count = (size_t)s[0] * s[1] * s[3] * s[4];
            OpCase c = op_case("attention_backward (GRAD_WRITE)", run_attention_backward);
            for (int j = 0; j < 5; j++)
                c.shape[j] = s[j];
            c.prepare = prepare_attention_backward;
            op_output(&c, "dq", ARRAY_ACTIVATION, q_count, BF16_OUT);
            op_output(&c, "dk", ARRAY_ACTIVATION, kv_count, BF16_OUT);
            op_output(&c, "dv", ARRAY_ACTIVATION, kv_count, BF16_OUT);
            op_input(&c, "dout", ARRAY_ACTIVATION, q_count, 1, 0);
            op_input(&c, "q", ARRAY_ACTIVATION, q_count, 1.7f, 0);
            op_input(&c, "k", ARRAY_ACTIVATION, kv_count, 1.7f, 0);
            op_input(&c, "v", ARRAY_ACTIVATION, kv_count, 1.7f, 0);
            op_input(&c, "out", ARRAY_ACTIVATION, q_count, 0, 0);
            op_input(&c, "lse", ARRAY_FLOAT, (size_t)s[0] * s[2] * s[1], 0, 0);
            cr_log_info("attention backward kernel %d, shape %d", k, i);
            op_check(&c, 240 + (uint64_t)(3 * k + i));
        }
    }
}

static void run_swiglu_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->swiglu_backward(p[0], p[1], GRAD_WRITE, p[2], p[3], p[4], (size_t)c->shape[0]);
}

Test(cuda_grad_mode, swiglu_backward_writes_the_cpu_input_gradients)
{
    gpu_require();
    const int lengths[] = {1, 1003};
    for (int i = 0; i < 2; i++) {
        OpCase c = op_case("swiglu_backward (GRAD_WRITE)", run_swiglu_backward);
        c.shape[0] = lengths[i];
        op_output(&c, "dgate", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_output(&c, "dup", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_input(&c, "gate", ARRAY_ACTIVATION, (size_t)lengths[i], 3, 0);
        op_input(&c, "up", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_check(&c, 250 + (uint64_t)i);
    }
}
