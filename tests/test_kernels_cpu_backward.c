/* tests/test_kernels_cpu_backward.c — the cpu backend's backward ops (DESIGN 7, "Unit").
 *
 * Gradients are checked against central finite differences of the scalar objective
 *   L = sum(out * R),  R random,
 * evaluated in double from the fp32 forward, perturbing every element of every input and
 * weight (shapes are small enough), so the backward is called with dout = R. Each
 * perturbation uses the step the fp32 input actually took, (float)(x + eps) - (float)(x - eps),
 * not the nominal 2 eps. Tolerance: relative error (whole tensor) <= 1e-3.
 *
 * Also: every backward adds into its gradients (two calls give twice one call; the ops with a
 * GradMode are called with GRAD_ADD here, GRAD_WRITE is test_grad_mode.c's), and the ops
 * whose gradients sum over tokens give bitwise-identical results on 1 and 2 threads.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#define GRADIENT_TOLERANCE 1e-3

/* ---- the finite-difference harness ---- */

/* An op under test as a closure: forward(op) recomputes `out` [out_count] from the op's
 * current inputs; probe is R. */
typedef struct {
    void (*forward)(void *op);
    void *op;
    const float *out;
    const float *probe;
    size_t out_count;
} Objective;

static double objective_value(const Objective *objective)
{
    objective->forward(objective->op);
    double sum = 0;
    for (size_t i = 0; i < objective->out_count; i++)
        sum += (double)objective->out[i] * objective->probe[i];
    return sum;
}

/* Asserts that `gradient` [n] is dL/d input within GRADIENT_TOLERANCE, by central
 * differences over every element of `input` (restored afterwards). */
static void expect_gradient(const Objective *objective, float *input, const float *gradient,
                            size_t n, double eps, const char *what)
{
    double *numeric = calloc(n ? n : 1, sizeof(double));
    cr_assert_not_null(numeric);
    for (size_t i = 0; i < n; i++) {
        float saved = input[i];
        float plus = (float)(saved + eps), minus = (float)(saved - eps);
        input[i] = plus;
        double value_plus = objective_value(objective);
        input[i] = minus;
        double value_minus = objective_value(objective);
        input[i] = saved;
        numeric[i] = (value_plus - value_minus) / ((double)plus - (double)minus);
    }
    objective_value(objective); /* leave `out` as the unperturbed inputs give it */
    double error = test_relative_error_double(gradient, numeric, n);
    cr_assert_leq(error, GRADIENT_TOLERANCE, "%s: relative error %.3g against finite differences",
                  what, error);
    free(numeric);
}

/* ---- embedding ---- */

typedef struct {
    float *out, *table;
    const uint32_t *tokens;
    int n, d;
} EmbeddingOp;

static void embedding_op_forward(void *pointer)
{
    EmbeddingOp *op = pointer;
    cpu_embedding_forward(op->out, op->tokens, op->table, op->n, op->d);
}

Test(kernels_cpu_backward, embedding_backward_matches_finite_differences_with_repeated_tokens)
{
    int n = 17, V = 7, d = 5; /* 17 tokens over 7 ids: repeats are certain */
    EmbeddingOp op = {zero_floats((size_t)n * d), random_floats((size_t)V * d, 1, 1),
                      random_tokens(n, V, 2), n, d};
    float *probe = random_floats((size_t)n * d, 1, 3), *dtable = zero_floats((size_t)V * d);
    Objective objective = {embedding_op_forward, &op, op.out, probe, (size_t)n * d};
    cpu_embedding_backward(dtable, probe, op.tokens, n, d);
    expect_gradient(&objective, op.table, dtable, (size_t)V * d, 1e-2, "dtable");
    free_all(op.out, op.table, (void *)op.tokens, probe, dtable, NULL);
}

Test(kernels_cpu_backward, embedding_backward_accumulates)
{
    int n = 33, V = 7, d = 70;
    uint32_t *tokens = random_tokens(n, V, 4);
    float *dout = random_floats((size_t)n * d, 1, 5);
    float *once = zero_floats((size_t)V * d), *twice = zero_floats((size_t)V * d);
    cpu_embedding_backward(once, dout, tokens, n, d);
    cpu_embedding_backward(twice, dout, tokens, n, d);
    cpu_embedding_backward(twice, dout, tokens, n, d);
    expect_doubled(twice, once, (size_t)V * d, "dtable");
    free_all(tokens, dout, once, twice, NULL);
}

Test(kernels_cpu_backward, embedding_backward_is_bitwise_identical_for_1_and_2_threads)
{
    int n = 512, V = 7, d = 300; /* every id repeats ~70 times; 5 column blocks */
    uint32_t *tokens = random_tokens(n, V, 6);
    float *dout = random_floats((size_t)n * d, 1, 7);
    float *one = zero_floats((size_t)V * d), *two = zero_floats((size_t)V * d);
    omp_set_num_threads(1);
    cpu_embedding_backward(one, dout, tokens, n, d);
    omp_set_num_threads(2);
    cpu_embedding_backward(two, dout, tokens, n, d);
    expect_bitwise_equal(one, two, (size_t)V * d, "dtable");
    free_all(tokens, dout, one, two, NULL);
}

/* The delta form's null source is one row read by every token: its gradient, the sum of
 * rows, is the embedding backward with every token 0, bit for bit, and adds into out. */
Test(kernels_cpu_backward, sum_rows_is_the_embedding_backward_onto_one_row)
{
    int n = 131, d = 150; /* 3 column blocks, the last one partial */
    uint32_t *zeros = calloc((size_t)n, sizeof *zeros);
    cr_assert_not_null(zeros);
    float *x = random_floats((size_t)n * d, 1, 8);
    float *start = random_floats((size_t)d, 1, 9);
    float *summed = random_floats((size_t)d, 1, 9), *scattered = random_floats((size_t)d, 1, 9);
    cpu_sum_rows(summed, x, n, d);
    cpu_embedding_backward(scattered, x, zeros, n, d);
    expect_bitwise_equal(summed, scattered, (size_t)d, "out");
    for (int c = 0; c < d; c++) {
        double column = start[c];
        for (int t = 0; t < n; t++)
            column += x[(size_t)t * d + c];
        cr_assert_float_eq(summed[c], column, 1e-4 * (1 + fabs(column)), "column %d", c);
    }
    free_all(zeros, x, start, summed, scattered, NULL);
}

/* ---- RMSNorm ---- */

typedef struct {
    float *out, *rstd, *x, *weight;
    int rows, d;
} RmsnormOp;

static const float rmsnorm_eps = 1e-5f;

static void rmsnorm_op_forward(void *pointer)
{
    RmsnormOp *op = pointer;
    cpu_rmsnorm_forward(op->out, op->rstd, op->x, op->weight, op->rows, op->d, rmsnorm_eps);
}

Test(kernels_cpu_backward, rmsnorm_backward_matches_finite_differences)
{
    const int shapes[][2] = {{1, 5}, {3, 33}, {7, 5}}; /* rows, d */
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int rows = shapes[c][0], d = shapes[c][1];
        size_t count = (size_t)rows * d;
        RmsnormOp op = {zero_floats(count), zero_floats(rows), random_floats(count, 1, 10 + c),
                        random_floats(d, 1, 20 + c), rows, d};
        float *probe = random_floats(count, 1, 30 + c);
        float *dx = zero_floats(count), *dweight = zero_floats(d);
        Objective objective = {rmsnorm_op_forward, &op, op.out, probe, count};
        objective_value(&objective);
        cpu_rmsnorm_backward(dx, GRAD_ADD, dweight, probe, op.x, op.weight, op.rstd, rows, d);
        expect_gradient(&objective, op.x, dx, count, 1e-3, "dx");
        expect_gradient(&objective, op.weight, dweight, d, 1e-2, "dweight");
        free_all(op.out, op.rstd, op.x, op.weight, probe, dx, dweight, NULL);
    }
}

Test(kernels_cpu_backward, rmsnorm_backward_accumulates)
{
    int rows = 7, d = 33;
    size_t count = (size_t)rows * d;
    RmsnormOp op = {zero_floats(count), zero_floats(rows), random_floats(count, 1, 40),
                    random_floats(d, 1, 41), rows, d};
    float *dout = random_floats(count, 1, 42);
    float *dx_once = zero_floats(count), *dweight_once = zero_floats(d);
    float *dx_twice = zero_floats(count), *dweight_twice = zero_floats(d);
    rmsnorm_op_forward(&op);
    cpu_rmsnorm_backward(dx_once, GRAD_ADD, dweight_once, dout, op.x, op.weight, op.rstd, rows, d);
    for (int call = 0; call < 2; call++)
        cpu_rmsnorm_backward(dx_twice, GRAD_ADD, dweight_twice, dout, op.x, op.weight, op.rstd,
                             rows, d);
    expect_doubled(dx_twice, dx_once, count, "dx");
    expect_doubled(dweight_twice, dweight_once, d, "dweight");
    free_all(op.out, op.rstd, op.x, op.weight, dout, dx_once, dweight_once, dx_twice, dweight_twice,
             NULL);
}

/* The branch form writes dx (whatever it held) and adds the same values into branch. */
Test(kernels_cpu_backward, rmsnorm_backward_branch_writes_dx_and_adds_it_into_the_branch)
{
    int rows = 7, d = 33;
    size_t count = (size_t)rows * d;
    RmsnormOp op = {zero_floats(count), zero_floats(rows), random_floats(count, 1, 43),
                    random_floats(d, 1, 44), rows, d};
    float *dout = random_floats(count, 1, 45);
    float *dx = zero_floats(count), *dweight = random_floats(d, 1, 46);
    float *branch_dx = random_floats(count, 1, 47); /* stale values: must be overwritten */
    float *branch = random_floats(count, 1, 48), *branch_before = zero_floats(count);
    float *branch_dweight = zero_floats(d);
    memcpy(branch_before, branch, count * sizeof(float));
    memcpy(branch_dweight, dweight, d * sizeof(float));
    rmsnorm_op_forward(&op);
    cpu_rmsnorm_backward(dx, GRAD_ADD, dweight, dout, op.x, op.weight, op.rstd, rows, d);
    cpu_rmsnorm_backward_branch(branch_dx, branch, branch_dweight, dout, op.x, op.weight,
                                op.rstd, rows, d);
    for (size_t i = 0; i < count; i++) {
        cr_assert_eq(branch_dx[i], dx[i], "dx[%zu]", i);
        cr_assert_eq(branch[i], branch_before[i] + dx[i], "branch[%zu]", i);
    }
    for (int i = 0; i < d; i++)
        cr_assert_eq(branch_dweight[i], dweight[i], "dweight[%d]", i);
    free_all(op.out, op.rstd, op.x, op.weight, dout, dx, dweight, branch_dx, branch,
             branch_before, branch_dweight, NULL);
}

Test(kernels_cpu_backward, rmsnorm_backward_is_bitwise_identical_for_1_and_2_threads)
{
    int rows = 256, d = 200;
    size_t count = (size_t)rows * d;
    RmsnormOp op = {zero_floats(count), zero_floats(rows), random_floats(count, 1, 43),
                    random_floats(d, 1, 44), rows, d};
    float *dout = random_floats(count, 1, 45);
    float *dx_one = zero_floats(count), *dweight_one = zero_floats(d);
    float *dx_two = zero_floats(count), *dweight_two = zero_floats(d);
    rmsnorm_op_forward(&op);
    omp_set_num_threads(1);
    cpu_rmsnorm_backward(dx_one, GRAD_ADD, dweight_one, dout, op.x, op.weight, op.rstd, rows, d);
    omp_set_num_threads(2);
    cpu_rmsnorm_backward(dx_two, GRAD_ADD, dweight_two, dout, op.x, op.weight, op.rstd, rows, d);
    expect_bitwise_equal(dx_one, dx_two, count, "dx");
    expect_bitwise_equal(dweight_one, dweight_two, d, "dweight");
    free_all(op.out, op.rstd, op.x, op.weight, dout, dx_one, dweight_one, dx_two, dweight_two,
             NULL);
}

/* ---- matmul ---- */

typedef struct {
    float *out, *in, *weight;
    int rows, in_dim, out_dim;
    size_t in_count, weight_count, out_count;
} MatmulOp;

static void matmul_op_forward(void *pointer)
{
    MatmulOp *op = pointer;
    cpu_matmul_forward(op->out, op->in, op->weight, op->rows, op->in_dim, op->out_dim);
}

static MatmulOp matmul_op_random(int rows, int in_dim, int out_dim, uint64_t seed)
{
    MatmulOp op = {NULL, NULL, NULL, rows, in_dim, out_dim, (size_t)rows * in_dim,
                   (size_t)out_dim * in_dim, (size_t)rows * out_dim};
    op.out = zero_floats(op.out_count);
    op.in = random_floats(op.in_count, 1, seed);
    op.weight = random_floats(op.weight_count, 1, seed + 1);
    return op;
}

Test(kernels_cpu_backward, matmul_backward_matches_finite_differences)
{
    /* rows, in_dim, out_dim; the last one spans several backward blocks */
    const int shapes[][3] = {{1, 5, 7}, {3, 33, 1}, {7, 5, 37}, {9, 260, 11}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        MatmulOp op = matmul_op_random(shapes[c][0], shapes[c][1], shapes[c][2], 50 + 2 * c);
        size_t in_count = op.in_count, weight_count = op.weight_count, out_count = op.out_count;
        float *probe = random_floats(out_count, 1, 60 + c);
        float *din = zero_floats(in_count), *dweight = zero_floats(weight_count);
        Objective objective = {matmul_op_forward, &op, op.out, probe, out_count};
        cpu_matmul_backward(din, GRAD_ADD, dweight, GRAD_ADD, probe, op.in, op.weight, op.rows,
                            op.in_dim, op.out_dim);
        expect_gradient(&objective, op.in, din, in_count, 1e-2, "din");
        expect_gradient(&objective, op.weight, dweight, weight_count, 1e-2, "dweight");
        free_all(op.out, op.in, op.weight, probe, din, dweight, NULL);
    }
}

Test(kernels_cpu_backward, matmul_backward_without_din_matches_finite_differences_for_dweight)
{
    MatmulOp op = matmul_op_random(7, 33, 6, 70);
    size_t weight_count = op.weight_count, out_count = op.out_count;
    float *probe = random_floats(out_count, 1, 72), *dweight = zero_floats(weight_count);
    Objective objective = {matmul_op_forward, &op, op.out, probe, out_count};
    cpu_matmul_backward(NULL, GRAD_ADD, dweight, GRAD_ADD, probe, op.in, op.weight, op.rows,
                        op.in_dim, op.out_dim);
    expect_gradient(&objective, op.weight, dweight, weight_count, 1e-2, "dweight");
    free_all(op.out, op.in, op.weight, probe, dweight, NULL);
}

Test(kernels_cpu_backward, matmul_backward_accumulates)
{
    MatmulOp op = matmul_op_random(9, 260, 11, 80);
    size_t in_count = op.in_count, weight_count = op.weight_count;
    float *dout = random_floats((size_t)op.rows * op.out_dim, 1, 82);
    float *din_once = zero_floats(in_count), *dweight_once = zero_floats(weight_count);
    float *din_twice = zero_floats(in_count), *dweight_twice = zero_floats(weight_count);
    cpu_matmul_backward(din_once, GRAD_ADD, dweight_once, GRAD_ADD, dout, op.in, op.weight, op.rows,
                        op.in_dim, op.out_dim);
    for (int call = 0; call < 2; call++)
        cpu_matmul_backward(din_twice, GRAD_ADD, dweight_twice, GRAD_ADD, dout, op.in, op.weight,
                            op.rows, op.in_dim, op.out_dim);
    expect_doubled(din_twice, din_once, in_count, "din");
    expect_doubled(dweight_twice, dweight_once, weight_count, "dweight");
    free_all(op.out, op.in, op.weight, dout, din_once, dweight_once, din_twice, dweight_twice,
             NULL);
}

Test(kernels_cpu_backward, matmul_backward_is_bitwise_identical_for_1_and_2_threads)
{
    MatmulOp op = matmul_op_random(200, 300, 100, 90);
    size_t in_count = op.in_count, weight_count = op.weight_count;
    float *dout = random_floats((size_t)op.rows * op.out_dim, 1, 92);
    float *din_one = zero_floats(in_count), *dweight_one = zero_floats(weight_count);
    float *din_two = zero_floats(in_count), *dweight_two = zero_floats(weight_count);
    omp_set_num_threads(1);
    cpu_matmul_backward(din_one, GRAD_ADD, dweight_one, GRAD_ADD, dout, op.in, op.weight, op.rows,
                        op.in_dim, op.out_dim);
    omp_set_num_threads(2);
    cpu_matmul_backward(din_two, GRAD_ADD, dweight_two, GRAD_ADD, dout, op.in, op.weight, op.rows,
                        op.in_dim, op.out_dim);
    expect_bitwise_equal(din_one, din_two, in_count, "din");
    expect_bitwise_equal(dweight_one, dweight_two, weight_count, "dweight");
    free_all(op.out, op.in, op.weight, dout, din_one, dweight_one, din_two, dweight_two, NULL);
}

/* ---- RoPE ---- */

typedef struct {
    float *out, *x, *cos, *sin;
    int B, T, n_heads, head_dim;
} RopeOp;

static void rope_op_forward(void *pointer)
{
    RopeOp *op = pointer;
    cpu_rope_forward(op->out, op->x, op->cos, op->sin, op->B, op->T, op->n_heads, op->head_dim);
}

Test(kernels_cpu_backward, rope_backward_matches_finite_differences)
{
    const int shapes[][4] = {{1, 1, 1, 2}, {2, 5, 3, 6}, {1, 17, 2, 10}}; /* B T heads hd */
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int B = shapes[c][0], T = shapes[c][1], H = shapes[c][2], hd = shapes[c][3];
        size_t count = (size_t)B * T * H * hd, table_count = (size_t)T * hd / 2;
        RopeOp op = {zero_floats(count), random_floats(count, 1, 100 + c),
                     zero_floats(table_count), zero_floats(table_count), B, T, H, hd};
        float *angles = random_floats(table_count, 3, 110 + c);
        for (size_t i = 0; i < table_count; i++) {
            op.cos[i] = cosf(angles[i]);
            op.sin[i] = sinf(angles[i]);
        }
        float *probe = random_floats(count, 1, 120 + c), *dx = zero_floats(count);
        Objective objective = {rope_op_forward, &op, op.out, probe, count};
        cpu_rope_backward(dx, GRAD_ADD, probe, op.cos, op.sin, B, T, H, hd);
        expect_gradient(&objective, op.x, dx, count, 1e-2, "dx");
        free_all(op.out, op.x, op.cos, op.sin, angles, probe, dx, NULL);
    }
}

Test(kernels_cpu_backward, rope_backward_accumulates)
{
    int B = 2, T = 5, H = 3, hd = 6;
    size_t count = (size_t)B * T * H * hd, table_count = (size_t)T * hd / 2;
    float *cos_table = random_floats(table_count, 1, 130);
    float *sin_table = random_floats(table_count, 1, 131);
    float *dout = random_floats(count, 1, 132);
    float *once = zero_floats(count), *twice = zero_floats(count);
    cpu_rope_backward(once, GRAD_ADD, dout, cos_table, sin_table, B, T, H, hd);
    for (int call = 0; call < 2; call++)
        cpu_rope_backward(twice, GRAD_ADD, dout, cos_table, sin_table, B, T, H, hd);
    expect_doubled(twice, once, count, "dx");
    free_all(cos_table, sin_table, dout, once, twice, NULL);
}

/* ---- attention ---- */

typedef struct {
    float *out, *lse, *q, *k, *v;
    int B, T, n_heads, n_kv_heads, head_dim;
    size_t q_count, kv_count;
} AttentionOp;

static void attention_op_forward(void *pointer)
{
    AttentionOp *op = pointer;
    cpu_attention_forward(op->out, op->lse, op->q, op->k, op->v, op->B, op->T, op->n_heads,
                          op->n_kv_heads, op->head_dim);
}

static AttentionOp attention_op_random(int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                       uint64_t seed)
{
    AttentionOp op = {NULL, NULL, NULL, NULL, NULL, B, T, n_heads, n_kv_heads, head_dim,
                      (size_t)B * T * n_heads * head_dim, (size_t)B * T * n_kv_heads * head_dim};
    op.out = zero_floats(op.q_count);
    op.lse = zero_floats((size_t)B * n_heads * T);
    op.q = random_floats(op.q_count, 1, seed);
    op.k = random_floats(op.kv_count, 1, seed + 1);
    op.v = random_floats(op.kv_count, 1, seed + 2);
    return op;
}

/* the backward of op at dout, into dq, dk, dv (forward first: it needs out and lse) */
static void attention_op_backward(AttentionOp *op, const float *dout, float *dq, float *dk,
                                  float *dv)
{
    cpu_attention_backward(dq, dk, dv, GRAD_ADD, dout, op->q, op->k, op->v, op->out, op->lse, op->B,
                           op->T, op->n_heads, op->n_kv_heads, op->head_dim);
}

Test(kernels_cpu_backward, attention_backward_matches_finite_differences_with_grouped_kv)
{
    /* B, T, n_heads, n_kv_heads, head_dim: 3 query heads on 1 kv head, 4 on 2, plain MHA */
    const int shapes[][5] = {{1, 1, 1, 1, 2}, {2, 5, 3, 1, 6}, {1, 17, 4, 2, 2},
                             {1, 7, 2, 2, 10}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        AttentionOp op = attention_op_random(shapes[c][0], shapes[c][1], shapes[c][2],
                                             shapes[c][3], shapes[c][4], 140 + 3 * c);
        size_t q_count = op.q_count, kv_count = op.kv_count;
        float *probe = random_floats(q_count, 1, 160 + c);
        float *dq = zero_floats(q_count), *dk = zero_floats(kv_count), *dv = zero_floats(kv_count);
        Objective objective = {attention_op_forward, &op, op.out, probe, q_count};
        objective_value(&objective);
        attention_op_backward(&op, probe, dq, dk, dv);
        cr_log_info("attention B %d T %d heads %d kv %d hd %d", op.B, op.T, op.n_heads,
                    op.n_kv_heads, op.head_dim);
        expect_gradient(&objective, op.q, dq, q_count, 1e-2, "dq");
        expect_gradient(&objective, op.k, dk, kv_count, 1e-2, "dk");
        expect_gradient(&objective, op.v, dv, kv_count, 1e-2, "dv");
        free_all(op.out, op.lse, op.q, op.k, op.v, probe, dq, dk, dv, NULL);
    }
}

Test(kernels_cpu_backward, attention_backward_accumulates)
{
    AttentionOp op = attention_op_random(2, 17, 3, 1, 6, 170);
    size_t q_count = op.q_count, kv_count = op.kv_count;
    float *dout = random_floats(q_count, 1, 175);
    float *once[3] = {zero_floats(q_count), zero_floats(kv_count), zero_floats(kv_count)};
    float *twice[3] = {zero_floats(q_count), zero_floats(kv_count), zero_floats(kv_count)};
    attention_op_forward(&op);
    attention_op_backward(&op, dout, once[0], once[1], once[2]);
    for (int call = 0; call < 2; call++)
        attention_op_backward(&op, dout, twice[0], twice[1], twice[2]);
    expect_doubled(twice[0], once[0], q_count, "dq");
    expect_doubled(twice[1], once[1], kv_count, "dk");
    expect_doubled(twice[2], once[2], kv_count, "dv");
    free_all(op.out, op.lse, op.q, op.k, op.v, dout, NULL);
    for (int i = 0; i < 3; i++)
        free_all(once[i], twice[i], NULL);
}

Test(kernels_cpu_backward, attention_backward_is_bitwise_identical_for_1_and_2_threads)
{
    AttentionOp op = attention_op_random(2, 64, 4, 2, 16, 180);
    size_t q_count = op.q_count, kv_count = op.kv_count;
    float *dout = random_floats(q_count, 1, 185);
    float *one[3] = {zero_floats(q_count), zero_floats(kv_count), zero_floats(kv_count)};
    float *two[3] = {zero_floats(q_count), zero_floats(kv_count), zero_floats(kv_count)};
    attention_op_forward(&op);
    omp_set_num_threads(1);
    attention_op_backward(&op, dout, one[0], one[1], one[2]);
    omp_set_num_threads(2);
    attention_op_backward(&op, dout, two[0], two[1], two[2]);
    expect_bitwise_equal(one[0], two[0], q_count, "dq");
    expect_bitwise_equal(one[1], two[1], kv_count, "dk");
    expect_bitwise_equal(one[2], two[2], kv_count, "dv");
    free_all(op.out, op.lse, op.q, op.k, op.v, dout, NULL);
    for (int i = 0; i < 3; i++)
        free_all(one[i], two[i], NULL);
}

/* ---- SwiGLU ---- */

typedef struct {
    float *out, *gate, *up;
    size_t n;
} SwigluOp;

static void swiglu_op_forward(void *pointer)
{
    SwigluOp *op = pointer;
    cpu_swiglu_forward(op->out, op->gate, op->up, op->n);
}

Test(kernels_cpu_backward, swiglu_backward_matches_finite_differences)
{
    size_t n = 37;
    SwigluOp op = {zero_floats(n), random_floats(n, 4, 190), random_floats(n, 2, 191), n};
    float *probe = random_floats(n, 1, 192), *dgate = zero_floats(n), *dup = zero_floats(n);
    Objective objective = {swiglu_op_forward, &op, op.out, probe, n};
    cpu_swiglu_backward(dgate, dup, GRAD_ADD, probe, op.gate, op.up, n);
    expect_gradient(&objective, op.gate, dgate, n, 1e-2, "dgate");
    expect_gradient(&objective, op.up, dup, n, 1e-2, "dup");
    free_all(op.out, op.gate, op.up, probe, dgate, dup, NULL);
}

Test(kernels_cpu_backward, swiglu_backward_accumulates)
{
    size_t n = 1000;
    float *gate = random_floats(n, 4, 193), *up = random_floats(n, 2, 194);
    float *dout = random_floats(n, 1, 195);
    float *dgate_once = zero_floats(n), *dup_once = zero_floats(n);
    float *dgate_twice = zero_floats(n), *dup_twice = zero_floats(n);
    cpu_swiglu_backward(dgate_once, dup_once, GRAD_ADD, dout, gate, up, n);
    for (int call = 0; call < 2; call++)
        cpu_swiglu_backward(dgate_twice, dup_twice, GRAD_ADD, dout, gate, up, n);
    expect_doubled(dgate_twice, dgate_once, n, "dgate");
    expect_doubled(dup_twice, dup_once, n, "dup");
    free_all(gate, up, dout, dgate_once, dup_once, dgate_twice, dup_twice, NULL);
}

/* ---- cross-entropy ---- */

typedef struct {
    float *losses, *lse, *logits;
    const uint32_t *targets;
    int rows, V;
    float z_loss;
} CrossEntropyOp;

static void cross_entropy_op_forward(void *pointer)
{
    CrossEntropyOp *op = pointer;
    cpu_cross_entropy_forward(op->losses, op->lse, op->logits, op->targets, op->rows, op->V,
                              op->z_loss);
}

Test(kernels_cpu_backward, cross_entropy_backward_matches_finite_differences_with_z_loss)
{
    /* rows, V, z_loss (0.05 makes the z term a third of the gradient: a wrong one shows) */
    const struct { int rows, V; float z_loss; } cases[] = {{1, 7, 0}, {3, 37, 0.05f},
                                                           {7, 7, 0.05f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int rows = cases[c].rows, V = cases[c].V;
        size_t count = (size_t)rows * V;
        CrossEntropyOp op = {zero_floats(rows), zero_floats(rows), random_floats(count, 3, 200 + c),
                             random_tokens(rows, V, 210 + c), rows, V, cases[c].z_loss};
        float *probe = random_floats(rows, 1, 220 + c), *dlogits = zero_floats(count);
        Objective objective = {cross_entropy_op_forward, &op, op.losses, probe, (size_t)rows};
        objective_value(&objective);
        cpu_cross_entropy_backward(dlogits, GRAD_ADD, probe, op.logits, op.lse, op.targets, rows,
                                   V, op.z_loss);
        expect_gradient(&objective, op.logits, dlogits, count, 1e-2, "dlogits");
        free_all(op.losses, op.lse, op.logits, (void *)op.targets, probe, dlogits, NULL);
    }
}

Test(kernels_cpu_backward, cross_entropy_backward_accumulates)
{
    int rows = 7, V = 37;
    size_t count = (size_t)rows * V;
    CrossEntropyOp op = {zero_floats(rows), zero_floats(rows), random_floats(count, 3, 230),
                         random_tokens(rows, V, 231), rows, V, 1e-2f};
    float *dloss = random_floats(rows, 1, 232);
    float *once = zero_floats(count), *twice = zero_floats(count);
    cross_entropy_op_forward(&op);
    cpu_cross_entropy_backward(once, GRAD_ADD, dloss, op.logits, op.lse, op.targets, rows, V,
                               op.z_loss);
    for (int call = 0; call < 2; call++)
        cpu_cross_entropy_backward(twice, GRAD_ADD, dloss, op.logits, op.lse, op.targets, rows,
                                   V, op.z_loss);
    expect_doubled(twice, once, count, "dlogits");
    free_all(op.losses, op.lse, op.logits, (void *)op.targets, dloss, once, twice, NULL);
}
