/* tests/test_cuda_backend_ops.c — every compute entry of the cuda op table
 * (kernels/cuda/backend_cuda.cu) against the same entry of the cpu table, on small random
 * shapes that are not multiples of 8 or 16 where the op allows (DESIGN 7, "GPU").
 *
 * The point is the wiring: argument order, dtypes, and the "+=" of every backward (whose
 * gradients start from non-zero values; the ops with a GradMode in GRAD_ADD, GRAD_WRITE is
 * test_cuda_grad_mode.c's). The kernels' own accuracy over many shapes is the
 * business of test_cuda_kernels.c and its siblings. Rules and tolerances:
 * cuda_backend_support.h. A backward reads the statistics of the cpu forward on the same
 * inputs, on both backends. Attention over depth and MSAR: test_cuda_backend_route.c.
 * Each test SKIPs where no GPU answers.
 */
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdlib.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE
#define FP32_OUT BACKEND_FP32_TOLERANCE
#define STATISTIC BACKEND_STATISTIC_TOLERANCE
#define EPS 1e-5f

static float *scratch_floats(size_t n)
{
    float *x = calloc(n, sizeof(float));
    cr_assert_not_null(x);
    return x;
}

/* ---- elementwise ---- */

static const int lengths[] = {1, 1003};

static void run_add(const Backend *b, void *const *p, const OpCase *c)
{
    b->add(p[0], p[1], p[2], (size_t)c->shape[0]);
}

static void run_add_inplace(const Backend *b, void *const *p, const OpCase *c)
{
    b->add_inplace(p[0], p[1], (size_t)c->shape[0]);
}

Test(cuda_backend_ops, add_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        OpCase c = op_case("add", run_add);
        c.shape[0] = lengths[i];
        op_output(&c, "out", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_input(&c, "a", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_input(&c, "b", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_check(&c, 10 + (uint64_t)i);
    }
}

static void run_add_both(const Backend *b, void *const *p, const OpCase *c)
{
    b->add_both(p[0], p[2], p[1], p[3], (size_t)c->shape[0]);
}

Test(cuda_backend_ops, add_both_writes_a_plus_x_and_adds_x_into_y)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        OpCase c = op_case("add_both", run_add_both);
        c.shape[0] = lengths[i];
        op_output(&c, "out", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_accumulated(&c, "y", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_input(&c, "a", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_input(&c, "x", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_check(&c, 30 + (uint64_t)i);
    }
}

static void run_add_difference(const Backend *b, void *const *p, const OpCase *c)
{
    b->add_difference(p[0], c->shape[1] ? p[2] : NULL, p[1], (size_t)c->shape[0]);
}

/* y = (y - minus) + plus, one rounding, and y - minus without plus */
Test(cuda_backend_ops, add_difference_trades_minus_for_plus_in_y)
{
    gpu_require();
    for (int i = 0; i < 4; i++) {
        OpCase c = op_case("add_difference", run_add_difference);
        c.shape[0] = lengths[i % 2], c.shape[1] = i < 2;
        op_accumulated(&c, "y", ARRAY_ACTIVATION, (size_t)c.shape[0], BF16_OUT);
        op_input(&c, "minus", ARRAY_ACTIVATION, (size_t)c.shape[0], 1, 0);
        if (c.shape[1])
            op_input(&c, "plus", ARRAY_ACTIVATION, (size_t)c.shape[0], 1, 0);
        op_check(&c, 40 + (uint64_t)i);
    }
}

Test(cuda_backend_ops, add_inplace_adds_into_y)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        OpCase c = op_case("add_inplace", run_add_inplace);
        c.shape[0] = lengths[i];
        op_accumulated(&c, "y", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_input(&c, "x", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_check(&c, 20 + (uint64_t)i);
    }
}

/* ---- embedding: shape n, d, V ---- */

static const int embedding_shapes[][3] = {{37, 20, 11}, {5, 64, 300}};

static void run_embedding_forward(const Backend *b, void *const *p, const OpCase *c)
{
    b->embedding_forward(p[0], p[1], p[2], c->shape[0], c->shape[1]);
}

static void run_embedding_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->embedding_backward(p[0], p[1], p[2], c->shape[0], c->shape[1]);
}

Test(cuda_backend_ops, embedding_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        const int n = embedding_shapes[i][0], d = embedding_shapes[i][1];
        const int V = embedding_shapes[i][2];
        OpCase c = op_case("embedding_forward", run_embedding_forward);
        c.shape[0] = n, c.shape[1] = d, c.shape[2] = V;
        op_output(&c, "out", ARRAY_ACTIVATION, (size_t)n * d, BF16_OUT);
        op_tokens(&c, "tokens", (size_t)n, V);
        op_input(&c, "table", ARRAY_ACTIVATION, (size_t)V * d, 1, 0);
        op_check(&c, 30 + (uint64_t)i);
    }
}

Test(cuda_backend_ops, embedding_backward_adds_the_cpu_gradient)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        const int n = embedding_shapes[i][0], d = embedding_shapes[i][1];
        const int V = embedding_shapes[i][2];
        OpCase c = op_case("embedding_backward", run_embedding_backward);
        c.shape[0] = n, c.shape[1] = d, c.shape[2] = V;
        op_accumulated(&c, "dtable", ARRAY_FLOAT, (size_t)V * d, FP32_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)n * d, 1, 0);
        op_tokens(&c, "tokens", (size_t)n, V);
        op_check(&c, 40 + (uint64_t)i);
    }
}

/* ---- sum of rows: shape rows, d (d 20: the scalar path; 72 and 4096: 16-byte vectors;
 * rows past SUM_ROWS_SLICES = 64 cut into slices) ---- */

static const int sum_rows_shapes[][2] = {{37, 20}, {1001, 72}, {300, 4096}};

static void run_sum_rows(const Backend *b, void *const *p, const OpCase *c)
{
    b->sum_rows(p[0], p[1], c->shape[0], c->shape[1]);
}

Test(cuda_backend_ops, sum_rows_adds_the_cpu_column_sums)
{
    gpu_require();
    for (int i = 0; i < 3; i++) {
        const int rows = sum_rows_shapes[i][0], d = sum_rows_shapes[i][1];
        OpCase c = op_case("sum_rows", run_sum_rows);
        c.shape[0] = rows, c.shape[1] = d;
        op_accumulated(&c, "out", ARRAY_FLOAT, (size_t)d, FP32_OUT);
        op_input(&c, "x", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0.25f);
        op_check(&c, 45 + (uint64_t)i);
    }
}

/* ---- RMSNorm: shape rows, d ---- */

/* rows of a warp (d <= 1024), of a warp over five chunks (d <= 1280: the 1B width, and a
 * width that is not a multiple of 8), of a block */
static const int rmsnorm_shapes[][2] = {{7, 40}, {33, 100}, {9, 1280}, {6, 1100}, {3, 2056}};

static void run_rmsnorm_forward(const Backend *b, void *const *p, const OpCase *c)
{
    b->rmsnorm_forward(p[0], p[1], p[2], p[3], c->shape[0], c->shape[1], EPS);
}

enum { RMSNORM_DX, RMSNORM_DWEIGHT, RMSNORM_DOUT, RMSNORM_X, RMSNORM_WEIGHT, RMSNORM_RSTD };

static void run_rmsnorm_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->rmsnorm_backward(p[0], GRAD_ADD, p[1], p[2], p[3], p[4], p[5], c->shape[0],
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

Test(cuda_backend_ops, rmsnorm_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < (int)(sizeof rmsnorm_shapes / sizeof rmsnorm_shapes[0]); i++) {
        const int rows = rmsnorm_shapes[i][0], d = rmsnorm_shapes[i][1];
        OpCase c = op_case("rmsnorm_forward", run_rmsnorm_forward);
        c.shape[0] = rows, c.shape[1] = d;
        op_output(&c, "out", ARRAY_ACTIVATION, (size_t)rows * d, BF16_OUT);
        op_output(&c, "rstd", ARRAY_FLOAT, (size_t)rows, FP32_OUT);
        op_input(&c, "x", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
        op_check(&c, 50 + (uint64_t)i);
    }
}

Test(cuda_backend_ops, rmsnorm_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (int i = 0; i < (int)(sizeof rmsnorm_shapes / sizeof rmsnorm_shapes[0]); i++) {
        const int rows = rmsnorm_shapes[i][0], d = rmsnorm_shapes[i][1];
        OpCase c = op_case("rmsnorm_backward", run_rmsnorm_backward);
        c.shape[0] = rows, c.shape[1] = d;
        c.prepare = prepare_rmsnorm_backward;
        op_accumulated(&c, "dx", ARRAY_ACTIVATION, (size_t)rows * d, BF16_OUT);
        op_accumulated(&c, "dweight", ARRAY_FLOAT, (size_t)d, FP32_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0);
        op_input(&c, "x", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
        op_input(&c, "rstd", ARRAY_FLOAT, (size_t)rows, 0, 0);
        op_check(&c, 60 + (uint64_t)i);
    }
}

static void run_rmsnorm_backward_branch(const Backend *b, void *const *p, const OpCase *c)
{
    b->rmsnorm_backward_branch(p[0], p[1], p[2], p[3], p[4], p[5], p[6], c->shape[0],
                               c->shape[1]);
}

static void prepare_rmsnorm_backward_branch(OpCase *c)
{
    float *out = scratch_floats((size_t)c->shape[0] * c->shape[1]);
    backend_cpu()->rmsnorm_forward((Activation *)out, op_host(c, 6), (Activation *)op_host(c, 4),
                                   (Activation *)op_host(c, 5), c->shape[0], c->shape[1], EPS);
    free(out);
}

/* dx is an output (poisoned first: the op must write it), the branch accumulates; rows of a
 * warp (d <= 1280) and of a whole block (2 and 4 chunks), vector and not */
static const int rmsnorm_branch_shapes[][2] = {{7, 40}, {33, 100}, {5, 2056}, {3, 4100},
                                               {9, 1280}, {6, 1100}, {5, 4096}};

Test(cuda_backend_ops, rmsnorm_backward_branch_writes_the_cpu_gradient_and_adds_it_to_the_branch)
{
    gpu_require();
    const int count = (int)(sizeof rmsnorm_branch_shapes / sizeof rmsnorm_branch_shapes[0]);
    for (int i = 0; i < count; i++) {
        const int rows = rmsnorm_branch_shapes[i][0], d = rmsnorm_branch_shapes[i][1];
        OpCase c = op_case("rmsnorm_backward_branch", run_rmsnorm_backward_branch);
        c.shape[0] = rows, c.shape[1] = d;
        c.prepare = prepare_rmsnorm_backward_branch;
        op_output(&c, "dx", ARRAY_ACTIVATION, (size_t)rows * d, BF16_OUT);
        op_accumulated(&c, "branch", ARRAY_ACTIVATION, (size_t)rows * d, BF16_OUT);
        op_accumulated(&c, "dweight", ARRAY_FLOAT, (size_t)d, FP32_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0);
        op_input(&c, "x", ARRAY_ACTIVATION, (size_t)rows * d, 1, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
        op_input(&c, "rstd", ARRAY_FLOAT, (size_t)rows, 0, 0);
        op_check(&c, 70 + (uint64_t)i);
    }
}

/* ---- matmul: shape rows, in_dim, out_dim ---- */

/* row lengths multiples of 8 (the model's widths are), not of 16; odd row counts */
static const int matmul_shapes[][3] = {{33, 40, 24}, {5, 24, 56}};

static void run_matmul_forward(const Backend *b, void *const *p, const OpCase *c)
{
    b->matmul_forward(p[0], p[1], p[2], c->shape[0], c->shape[1], c->shape[2]);
}

static void run_matmul_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->matmul_backward(p[0], GRAD_ADD, p[1], GRAD_ADD, p[2], p[3], p[4], c->shape[0], c->shape[1],
                       c->shape[2]);
}

static void run_matmul_backward_without_din(const Backend *b, void *const *p, const OpCase *c)
{
    b->matmul_backward(NULL, GRAD_ADD, p[0], GRAD_ADD, p[1], p[2], p[3], c->shape[0], c->shape[1],
                       c->shape[2]);
}

Test(cuda_backend_ops, matmul_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        const int rows = matmul_shapes[i][0], in = matmul_shapes[i][1];
        const int out = matmul_shapes[i][2];
        OpCase c = op_case("matmul_forward", run_matmul_forward);
        c.shape[0] = rows, c.shape[1] = in, c.shape[2] = out;
        op_output(&c, "out", ARRAY_ACTIVATION, (size_t)rows * out, BF16_OUT);
        op_input(&c, "in", ARRAY_ACTIVATION, (size_t)rows * in, 1, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)out * in, 0.5f, 0);
        op_check(&c, 70 + (uint64_t)i);
    }
}

Test(cuda_backend_ops, matmul_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        const int rows = matmul_shapes[i][0], in = matmul_shapes[i][1];
        const int out = matmul_shapes[i][2];
        OpCase c = op_case("matmul_backward", run_matmul_backward);
        c.shape[0] = rows, c.shape[1] = in, c.shape[2] = out;
        op_accumulated(&c, "din", ARRAY_ACTIVATION, (size_t)rows * in, BF16_OUT);
        op_accumulated(&c, "dweight", ARRAY_FLOAT, (size_t)out * in, FP32_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)rows * out, 1, 0);
        op_input(&c, "in", ARRAY_ACTIVATION, (size_t)rows * in, 1, 0);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)out * in, 0.5f, 0);
        op_check(&c, 80 + (uint64_t)i);
    }
}

Test(cuda_backend_ops, matmul_backward_without_din_adds_the_weight_gradient)
{
    gpu_require();
    const int rows = 33, in = 40, out = 24;
    OpCase c = op_case("matmul_backward (din NULL)", run_matmul_backward_without_din);
    c.shape[0] = rows, c.shape[1] = in, c.shape[2] = out;
    op_accumulated(&c, "dweight", ARRAY_FLOAT, (size_t)out * in, FP32_OUT);
    op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)rows * out, 1, 0);
    op_input(&c, "in", ARRAY_ACTIVATION, (size_t)rows * in, 1, 0);
    op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)out * in, 0.5f, 0);
    op_check(&c, 90);
}

/* ---- RoPE: shape B, T, n_heads, head_dim ---- */

static const int rope_shapes[][4] = {{2, 9, 3, 10}, {1, 17, 2, 64}};

static void run_rope_forward(const Backend *b, void *const *p, const OpCase *c)
{
    b->rope_forward(p[0], p[1], p[2], p[3], c->shape[0], c->shape[1], c->shape[2], c->shape[3]);
}

static void run_rope_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->rope_backward(p[0], GRAD_ADD, p[1], p[2], p[3], c->shape[0], c->shape[1], c->shape[2],
                     c->shape[3]);
}

static void check_rope(bool backward, int i)
{
    const int *s = rope_shapes[i];
    const size_t count = (size_t)s[0] * s[1] * s[2] * s[3], angles = (size_t)s[1] * s[3] / 2;
    OpCase c = op_case(backward ? "rope_backward" : "rope_forward",
                       backward ? run_rope_backward : run_rope_forward);
    for (int k = 0; k < 4; k++)
        c.shape[k] = s[k];
    if (backward)
        op_accumulated(&c, "dx", ARRAY_ACTIVATION, count, BF16_OUT);
    else
        op_output(&c, "out", ARRAY_ACTIVATION, count, BF16_OUT);
    op_input(&c, backward ? "dout" : "x", ARRAY_ACTIVATION, count, 1, 0);
    op_input(&c, "cos", ARRAY_FLOAT, angles, 1, 0);
    op_input(&c, "sin", ARRAY_FLOAT, angles, 1, 0);
    op_check(&c, (backward ? 110 : 100) + (uint64_t)i);
}

Test(cuda_backend_ops, rope_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++)
        check_rope(false, i);
}

Test(cuda_backend_ops, rope_backward_adds_the_cpu_gradient)
{
    gpu_require();
    for (int i = 0; i < 2; i++)
        check_rope(true, i);
}

/* ---- attention: shape B, T, n_heads, n_kv_heads, head_dim ---- */

static const int attention_shapes[][5] = {{2, 37, 4, 2, 64}, {1, 19, 3, 1, 80},
                                          {1, 130, 2, 2, 128}};

static void run_attention_forward(const Backend *b, void *const *p, const OpCase *c)
{
    b->attention_forward(p[0], p[1], p[2], p[3], p[4], c->shape[0], c->shape[1], c->shape[2],
                         c->shape[3], c->shape[4]);
}

enum { ATTENTION_DQ, ATTENTION_DK, ATTENTION_DV, ATTENTION_DOUT, ATTENTION_Q, ATTENTION_K,
       ATTENTION_V, ATTENTION_OUT, ATTENTION_LSE };

static void run_attention_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->attention_backward(p[0], p[1], p[2], GRAD_ADD, p[3], p[4], p[5], p[6], p[7], p[8],
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

static void check_attention(bool backward, int i)
{
    const int *s = attention_shapes[i];
    const size_t q_count = (size_t)s[0] * s[1] * s[2] * s[4];
    const size_t kv_count = (size_t)s[0] * s[1] * s[3] * s[4];
    const size_t lse_count = (size_t)s[0] * s[2] * s[1];
    OpCase c = op_case(backward ? "attention_backward" : "attention_forward",
                       backward ? run_attention_backward : run_attention_forward);
    for (int k = 0; k < 5; k++)
        c.shape[k] = s[k];
    if (backward) {
        c.prepare = prepare_attention_backward;
        op_accumulated(&c, "dq", ARRAY_ACTIVATION, q_count, BF16_OUT);
        op_accumulated(&c, "dk", ARRAY_ACTIVATION, kv_count, BF16_OUT);
        op_accumulated(&c, "dv", ARRAY_ACTIVATION, kv_count, BF16_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, q_count, 1, 0);
    } else {
        op_output(&c, "out", ARRAY_ACTIVATION, q_count, BF16_OUT);
        op_output(&c, "lse", ARRAY_FLOAT, lse_count, STATISTIC);
    }
    op_input(&c, "q", ARRAY_ACTIVATION, q_count, 1.7f, 0);
    op_input(&c, "k", ARRAY_ACTIVATION, kv_count, 1.7f, 0);
    op_input(&c, "v", ARRAY_ACTIVATION, kv_count, 1.7f, 0);
    if (backward) {
        op_input(&c, "out", ARRAY_ACTIVATION, q_count, 0, 0);
        op_input(&c, "lse", ARRAY_FLOAT, lse_count, 0, 0);
    }
    op_check(&c, (backward ? 130 : 120) + (uint64_t)i);
}

Test(cuda_backend_ops, attention_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_attention(false, i);
}

Test(cuda_backend_ops, attention_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_attention(true, i);
}

/* ---- SwiGLU ---- */

static void run_swiglu_forward(const Backend *b, void *const *p, const OpCase *c)
{
    b->swiglu_forward(p[0], p[1], p[2], (size_t)c->shape[0]);
}

static void run_swiglu_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->swiglu_backward(p[0], p[1], GRAD_ADD, p[2], p[3], p[4], (size_t)c->shape[0]);
}

Test(cuda_backend_ops, swiglu_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        OpCase c = op_case("swiglu_forward", run_swiglu_forward);
        c.shape[0] = lengths[i];
        op_output(&c, "out", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_input(&c, "gate", ARRAY_ACTIVATION, (size_t)lengths[i], 3, 0);
        op_input(&c, "up", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_check(&c, 140 + (uint64_t)i);
    }
}

Test(cuda_backend_ops, swiglu_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        OpCase c = op_case("swiglu_backward", run_swiglu_backward);
        c.shape[0] = lengths[i];
        op_accumulated(&c, "dgate", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_accumulated(&c, "dup", ARRAY_ACTIVATION, (size_t)lengths[i], BF16_OUT);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_input(&c, "gate", ARRAY_ACTIVATION, (size_t)lengths[i], 3, 0);
        op_input(&c, "up", ARRAY_ACTIVATION, (size_t)lengths[i], 1, 0);
        op_check(&c, 150 + (uint64_t)i);
    }
}

/* ---- cross-entropy: shape rows, V; parameter z_loss (large enough to be seen) ---- */

static const int cross_entropy_shapes[][2] = {{7, 77}, {5, 1003}};
static const float z_loss = 0.01f;

static void run_cross_entropy_forward(const Backend *b, void *const *p, const OpCase *c)
{
    b->cross_entropy_forward(p[0], p[1], p[2], p[3], c->shape[0], c->shape[1], z_loss);
}

enum { CE_DLOGITS, CE_DLOSS, CE_LOGITS, CE_LSE, CE_TARGETS };

static void run_cross_entropy_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->cross_entropy_backward(p[0], GRAD_ADD, p[1], p[2], p[3], p[4], c->shape[0], c->shape[1],
                              z_loss);
}

static void prepare_cross_entropy_backward(OpCase *c)
{
    float *losses = scratch_floats((size_t)c->shape[0]);
    backend_cpu()->cross_entropy_forward(losses, op_host(c, CE_LSE),
                                         (Activation *)op_host(c, CE_LOGITS),
                                         (const uint32_t *)op_host(c, CE_TARGETS), c->shape[0],
                                         c->shape[1], z_loss);
    free(losses);
}

Test(cuda_backend_ops, cross_entropy_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        const int rows = cross_entropy_shapes[i][0], V = cross_entropy_shapes[i][1];
        OpCase c = op_case("cross_entropy_forward", run_cross_entropy_forward);
        c.shape[0] = rows, c.shape[1] = V;
        op_output(&c, "losses", ARRAY_FLOAT, (size_t)rows, FP32_OUT);
        op_output(&c, "lse", ARRAY_FLOAT, (size_t)rows, FP32_OUT);
        op_input(&c, "logits", ARRAY_ACTIVATION, (size_t)rows * V, 4, 0);
        op_tokens(&c, "targets", (size_t)rows, V);
        op_check(&c, 160 + (uint64_t)i);
    }
}

Test(cuda_backend_ops, cross_entropy_backward_adds_the_cpu_gradient)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        const int rows = cross_entropy_shapes[i][0], V = cross_entropy_shapes[i][1];
        OpCase c = op_case("cross_entropy_backward", run_cross_entropy_backward);
        c.shape[0] = rows, c.shape[1] = V;
        c.prepare = prepare_cross_entropy_backward;
        op_accumulated(&c, "dlogits", ARRAY_ACTIVATION, (size_t)rows * V, BF16_OUT);
        op_input(&c, "dloss", ARRAY_FLOAT, (size_t)rows, 0.5f, 1);
        op_input(&c, "logits", ARRAY_ACTIVATION, (size_t)rows * V, 4, 0);
        op_input(&c, "lse", ARRAY_FLOAT, (size_t)rows, 0, 0);
        op_tokens(&c, "targets", (size_t)rows, V);
        op_check(&c, 170 + (uint64_t)i);
    }
}
