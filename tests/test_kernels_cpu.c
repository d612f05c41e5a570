/* tests/test_kernels_cpu.c — the cpu backend's forward ops against naive double-precision
 * loops written here (DESIGN 7, "Unit"); the optimizer ops are test_kernels_cpu_optimizer.c's.
 *
 * Shapes are small and deliberately odd (1, 3, 7 rows; widths 5, 33; 3 query heads over 1 kv
 * head; head_dim 2, 6, 10; T 1, 5, 17; V 7, 37) plus a few larger than the kernels' tiles.
 * Outputs are poisoned with NaN first, so an element the kernel never writes fails the
 * comparison. Tolerance: relative error (whole tensor, 2-norm) <= 1e-5.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define FORWARD_TOLERANCE 1e-5

/* ---- the table and memory ---- */

Test(kernels_cpu, backend_table_fills_every_op)
{
    const Backend *backend = backend_cpu();
    cr_assert_str_eq(backend->name, "cpu");
#define EXPECT_OP(op) cr_assert_not_null((void *)(uintptr_t)backend->op, #op " is NULL")
    EXPECT_OP(alloc); EXPECT_OP(release); EXPECT_OP(zero); EXPECT_OP(copy); EXPECT_OP(upload);
    EXPECT_OP(download); EXPECT_OP(synchronize); EXPECT_OP(add_inplace); EXPECT_OP(add);
    EXPECT_OP(add_both); EXPECT_OP(add_difference);
    EXPECT_OP(embedding_forward); EXPECT_OP(embedding_backward); EXPECT_OP(sum_rows);
    EXPECT_OP(rmsnorm_forward);
    EXPECT_OP(rmsnorm_backward); EXPECT_OP(rmsnorm_backward_branch);
    EXPECT_OP(matmul_forward); EXPECT_OP(matmul_backward);
    EXPECT_OP(rope_forward); EXPECT_OP(rope_backward); EXPECT_OP(attention_forward);
    EXPECT_OP(attention_backward); EXPECT_OP(swiglu_forward); EXPECT_OP(swiglu_backward);
    EXPECT_OP(cross_entropy_forward); EXPECT_OP(cross_entropy_backward); EXPECT_OP(sum_squares);
    EXPECT_OP(adamw_update); EXPECT_OP(adamw_update_ranges); EXPECT_OP(route_forward);
    EXPECT_OP(route_backward); EXPECT_OP(stream_conv_forward); EXPECT_OP(stream_conv_backward);
    EXPECT_OP(route_block_forward); EXPECT_OP(route_block_backward); EXPECT_OP(add_scaled);
    EXPECT_OP(add_scaled_rmsnorm_forward); EXPECT_OP(stream_mix_rmsnorm_forward);
    EXPECT_OP(route_merge_forward); EXPECT_OP(route_merge_backward);
    EXPECT_OP(route_merge_conv_forward); EXPECT_OP(route_merge_conv_mix_forward);
    EXPECT_OP(route_merge_conv_backward);
    EXPECT_OP(stream_mix_forward); EXPECT_OP(stream_mix_backward); EXPECT_OP(memory_usage);
    EXPECT_OP(memory_peak_reset); EXPECT_OP(event_create); EXPECT_OP(event_destroy);
    EXPECT_OP(event_record); EXPECT_OP(event_elapsed_ms); EXPECT_OP(event_wait);
    EXPECT_OP(activations_from_floats);
    EXPECT_OP(activations_upload); EXPECT_OP(activations_download);
    cr_assert_eq(backend->activation_bytes, sizeof(float), "cpu activations are fp32");
#undef EXPECT_OP
}

Test(kernels_cpu, alloc_returns_zero_filled_memory)
{
    const Backend *backend = backend_cpu();
    size_t n = 1000;
    float *x = backend->alloc(n * sizeof(float));
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(x[i], 0.0f);
    backend->release(x);
}

Test(kernels_cpu, upload_copy_download_round_trip_preserves_every_byte)
{
    const Backend *backend = backend_cpu();
    size_t n = 777;
    float *host = random_floats(n, 1, 1), *back = poisoned_floats(n);
    float *a = backend->alloc(n * sizeof(float)), *b = backend->alloc(n * sizeof(float));
    backend->upload(a, host, n * sizeof(float));
    backend->copy(b, a, n * sizeof(float));
    backend->synchronize();
    backend->download(back, b, n * sizeof(float));
    cr_assert_eq(memcmp(host, back, n * sizeof(float)), 0);
    backend->release(a);
    backend->release(b);
    free_all(host, back, NULL);
}

Test(kernels_cpu, zero_clears_every_byte)
{
    const Backend *backend = backend_cpu();
    size_t n = 300;
    float *x = random_floats(n, 1, 2);
    backend->zero(x, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(x[i], 0.0f);
    free(x);
}

/* ---- elementwise ---- */

Test(kernels_cpu, add_inplace_adds_x_into_y)
{
    size_t n = 40000; /* above the parallel threshold */
    float *y = random_floats(n, 1, 3), *x = random_floats(n, 1, 4);
    double *expected = zero_doubles(n);
    for (size_t i = 0; i < n; i++)
        expected[i] = (double)y[i] + x[i];
    cpu_add_inplace(y, x, n);
    cr_assert_leq(test_relative_error_double(y, expected, n), FORWARD_TOLERANCE);
    free_all(y, x, expected, NULL);
}

Test(kernels_cpu, add_both_writes_a_plus_x_and_adds_x_into_y)
{
    size_t n = 40000; /* above the parallel threshold */
    float *a = random_floats(n, 1, 7), *y = random_floats(n, 1, 8), *x = random_floats(n, 1, 9);
    float *out = poisoned_floats(n);
    double *expected_out = zero_doubles(n), *expected_y = zero_doubles(n);
    for (size_t i = 0; i < n; i++) {
        expected_out[i] = (double)a[i] + x[i];
        expected_y[i] = (double)y[i] + x[i];
    }
    cpu_add_both(out, a, y, x, n);
    cr_assert_leq(test_relative_error_double(out, expected_out, n), FORWARD_TOLERANCE);
    cr_assert_leq(test_relative_error_double(y, expected_y, n), FORWARD_TOLERANCE);
    cpu_add_both(a, a, y, x, n); /* out aliasing a */
    cr_assert_leq(test_relative_error_double(a, expected_out, n), FORWARD_TOLERANCE);
    free_all(a, y, x, out, expected_out, expected_y, NULL);
}

Test(kernels_cpu, add_difference_trades_minus_for_plus)
{
    size_t n = 40000; /* above the parallel threshold */
    float *y = random_floats(n, 1, 10), *plus = random_floats(n, 1, 11);
    float *minus = random_floats(n, 1, 12), *alone = poisoned_floats(n);
    double *expected = zero_doubles(n), *expected_alone = zero_doubles(n);
    for (size_t i = 0; i < n; i++) {
        expected[i] = ((double)y[i] - minus[i]) + plus[i];
        expected_alone[i] = (double)y[i] - minus[i];
        alone[i] = y[i];
    }
    cpu_add_difference(y, plus, minus, n);
    cr_assert_leq(test_relative_error_double(y, expected, n), FORWARD_TOLERANCE);
    cpu_add_difference(alone, NULL, minus, n); /* nothing added */
    cr_assert_leq(test_relative_error_double(alone, expected_alone, n), FORWARD_TOLERANCE);
    /* a zero block gradient traded leaves the stream's gradient as it was, to the bit */
    float *zeros = calloc(n, sizeof *zeros), *kept = poisoned_floats(n);
    memcpy(kept, plus, n * sizeof *kept);
    cpu_add_difference(plus, zeros, zeros, n);
    cr_assert_eq(memcmp(plus, kept, n * sizeof *kept), 0);
    free_all(y, plus, minus, alone, expected, expected_alone, zeros, kept, NULL);
}

Test(kernels_cpu, add_writes_the_sum_even_when_out_aliases_an_input)
{
    size_t n = 33;
    float *a = random_floats(n, 1, 5), *b = random_floats(n, 1, 6), *out = poisoned_floats(n);
    double *expected = zero_doubles(n);
    for (size_t i = 0; i < n; i++)
        expected[i] = (double)a[i] + b[i];
    cpu_add(out, a, b, n);
    cr_assert_leq(test_relative_error_double(out, expected, n), FORWARD_TOLERANCE);
    cpu_add(a, a, b, n);
    cr_assert_eq(memcmp(a, out, n * sizeof(float)), 0);
    free_all(a, b, out, expected, NULL);
}

/* ---- embedding ---- */

Test(kernels_cpu, embedding_forward_copies_the_rows_the_tokens_name)
{
    const int shapes[][3] = {{1, 7, 5}, {3, 7, 33}, {17, 37, 5}, {300, 37, 64}}; /* n, V, d */
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int n = shapes[c][0], V = shapes[c][1], d = shapes[c][2];
        float *table = random_floats((size_t)V * d, 1, 10 + c);
        float *out = poisoned_floats((size_t)n * d);
        uint32_t *tokens = random_tokens(n, V, 20 + c);
        cpu_embedding_forward(out, tokens, table, n, d);
        for (int t = 0; t < n; t++)
            cr_assert_eq(memcmp(out + (size_t)t * d, table + (size_t)tokens[t] * d,
                                (size_t)d * sizeof(float)), 0, "n %d d %d row %d", n, d, t);
        free_all(table, out, tokens, NULL);
    }
}

/* ---- RMSNorm ---- */

Test(kernels_cpu, rmsnorm_forward_matches_double_reference)
{
    const int shapes[][2] = {{1, 5}, {3, 33}, {7, 5}, {64, 300}}; /* rows, d */
    const float eps = 1e-5f;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int rows = shapes[c][0], d = shapes[c][1];
        size_t count = (size_t)rows * d;
        float *x = random_floats(count, 2, 30 + c), *weight = random_floats(d, 1, 40 + c);
        float *out = poisoned_floats(count), *rstd = poisoned_floats(rows);
        double *expected = zero_doubles(count), *expected_rstd = zero_doubles(rows);
        for (int r = 0; r < rows; r++) {
            double sum = 0;
            for (int i = 0; i < d; i++)
                sum += (double)x[r * d + i] * x[r * d + i];
            expected_rstd[r] = 1.0 / sqrt(sum / d + eps);
            for (int i = 0; i < d; i++)
                expected[r * d + i] = weight[i] * x[r * d + i] * expected_rstd[r];
        }
        cpu_rmsnorm_forward(out, rstd, x, weight, rows, d, eps);
        cr_assert_leq(test_relative_error_double(out, expected, count), FORWARD_TOLERANCE,
                      "rows %d d %d", rows, d);
        cr_assert_leq(test_relative_error_double(rstd, expected_rstd, rows), FORWARD_TOLERANCE,
                      "rows %d d %d", rows, d);
        free_all(x, weight, out, rstd, expected, expected_rstd, NULL);
    }
}

/* ---- matmul ---- */

static void matmul_reference(double *out, const float *in, const float *weight, int rows,
                             int in_dim, int out_dim)
{
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out_dim; o++) {
            double sum = 0;
            for (int i = 0; i < in_dim; i++)
                sum += (double)in[(size_t)r * in_dim + i] * weight[(size_t)o * in_dim + i];
            out[(size_t)r * out_dim + o] = sum;
        }
}

Test(kernels_cpu, matmul_forward_matches_double_reference)
{
    /* rows, in_dim, out_dim: odd sizes, sizes that end mid-tile, sizes over a block */
    const int shapes[][3] = {{1, 5, 7},   {3, 33, 1},  {7, 5, 37},  {2, 4, 4},
                             {7, 3, 9},   {65, 33, 70}, {130, 131, 67}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int rows = shapes[c][0], in_dim = shapes[c][1], out_dim = shapes[c][2];
        size_t count = (size_t)rows * out_dim;
        float *in = random_floats((size_t)rows * in_dim, 1, 50 + c);
        float *weight = random_floats((size_t)out_dim * in_dim, 1, 60 + c);
        float *out = poisoned_floats(count);
        double *expected = zero_doubles(count);
        matmul_reference(expected, in, weight, rows, in_dim, out_dim);
        cpu_matmul_forward(out, in, weight, rows, in_dim, out_dim);
        cr_assert_leq(test_relative_error_double(out, expected, count), FORWARD_TOLERANCE,
                      "rows %d in %d out %d", rows, in_dim, out_dim);
        free_all(in, weight, out, expected, NULL);
    }
}

Test(kernels_cpu, matmul_forward_of_a_row_does_not_depend_on_the_other_rows)
{
    int rows = 67, in_dim = 45, out_dim = 71;
    float *in = random_floats((size_t)rows * in_dim, 1, 70);
    float *weight = random_floats((size_t)out_dim * in_dim, 1, 71);
    float *batch = poisoned_floats((size_t)rows * out_dim), *single = poisoned_floats(out_dim);
    cpu_matmul_forward(batch, in, weight, rows, in_dim, out_dim);
    for (int r = 0; r < rows; r++) {
        cpu_matmul_forward(single, in + (size_t)r * in_dim, weight, 1, in_dim, out_dim);
        cr_assert_eq(memcmp(single, batch + (size_t)r * out_dim, out_dim * sizeof(float)), 0,
                     "row %d", r);
    }
    free_all(in, weight, batch, single, NULL);
}

Test(kernels_cpu, matmul_forward_256x512x512_takes_under_100_ms)
{
    int rows = 256, in_dim = 512, out_dim = 512;
    float *in = random_floats((size_t)rows * in_dim, 1, 72);
    float *weight = random_floats((size_t)out_dim * in_dim, 1, 73);
    float *out = poisoned_floats((size_t)rows * out_dim);
    double best = INFINITY;
    for (int repeat = 0; repeat < 3; repeat++) {
        double start = omp_get_wtime();
        cpu_matmul_forward(out, in, weight, rows, in_dim, out_dim);
        double elapsed = omp_get_wtime() - start;
        best = elapsed < best ? elapsed : best;
    }
    cr_assert_lt(best, 0.1, "best of 3: %.1f ms", best * 1e3);
    free_all(in, weight, out, NULL);
}

/* ---- RoPE ---- */

/* cos, sin [T, half] of real angles t * theta^(-2i/hd) */
static void rope_tables(float *cos_table, float *sin_table, int T, int head_dim)
{
    int half = head_dim / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double angle = t * pow(10000.0, -2.0 * i / head_dim);
            cos_table[t * half + i] = (float)cos(angle);
            sin_table[t * half + i] = (float)sin(angle);
        }
}

Test(kernels_cpu, rope_forward_matches_double_reference)
{
    const int shapes[][4] = {{1, 1, 1, 2}, {2, 5, 3, 6}, {1, 17, 2, 10}}; /* B T heads hd */
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int B = shapes[c][0], T = shapes[c][1], H = shapes[c][2], hd = shapes[c][3];
        int half = hd / 2;
        size_t count = (size_t)B * T * H * hd;
        float *x = random_floats(count, 1, 80 + c), *out = poisoned_floats(count);
        float *cos_table = poisoned_floats((size_t)T * half);
        float *sin_table = poisoned_floats((size_t)T * half);
        double *expected = zero_doubles(count);
        rope_tables(cos_table, sin_table, T, hd);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    size_t o = (((size_t)b * T + t) * H + h) * hd;
                    for (int i = 0; i < half; i++) {
                        double c_ = cos_table[t * half + i], s_ = sin_table[t * half + i];
                        expected[o + i] = x[o + i] * c_ - x[o + i + half] * s_;
                        expected[o + i + half] = x[o + i + half] * c_ + x[o + i] * s_;
                    }
                }
        cpu_rope_forward(out, x, cos_table, sin_table, B, T, H, hd);
        cr_assert_leq(test_relative_error_double(out, expected, count), FORWARD_TOLERANCE,
                      "B %d T %d heads %d hd %d", B, T, H, hd);
        free_all(x, out, cos_table, sin_table, expected, NULL);
    }
}

Test(kernels_cpu, rope_forward_in_place_equals_out_of_place)
{
    int B = 2, T = 5, H = 3, hd = 6;
    size_t count = (size_t)B * T * H * hd;
    float *x = random_floats(count, 1, 90), *out = poisoned_floats(count);
    float *cos_table = poisoned_floats((size_t)T * hd / 2);
    float *sin_table = poisoned_floats((size_t)T * hd / 2);
    rope_tables(cos_table, sin_table, T, hd);
    cpu_rope_forward(out, x, cos_table, sin_table, B, T, H, hd);
    cpu_rope_forward(x, x, cos_table, sin_table, B, T, H, hd);
    cr_assert_eq(memcmp(x, out, count * sizeof(float)), 0);
    free_all(x, out, cos_table, sin_table, NULL);
}

/* ---- attention ---- */

Test(kernels_cpu, attention_forward_matches_double_reference)
{
    /* B, T, n_heads, n_kv_heads, head_dim */
    const int shapes[][5] = {{1, 1, 1, 1, 2}, {2, 5, 3, 1, 6}, {1, 17, 4, 2, 10},
                             {2, 17, 3, 3, 6}, {1, 40, 2, 1, 8}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int B = shapes[c][0], T = shapes[c][1], H = shapes[c][2], KV = shapes[c][3];
        int hd = shapes[c][4], group = H / KV;
        size_t q_count = (size_t)B * T * H * hd, kv_count = (size_t)B * T * KV * hd;
        float *q = random_floats(q_count, 2, 100 + c), *k = random_floats(kv_count, 2, 110 + c);
        float *v = random_floats(kv_count, 1, 120 + c);
        float *out = poisoned_floats(q_count), *lse = poisoned_floats((size_t)B * H * T);
        double *expected = zero_doubles(q_count), *expected_lse = zero_doubles((size_t)B * H * T);
        double *scores = zero_doubles(T);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    const float *q_row = q + (((size_t)b * T + t) * H + h) * hd;
                    double max = -INFINITY, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        const float *k_row = k + (((size_t)b * T + s) * KV + h / group) * hd;
                        double dot = 0;
                        for (int i = 0; i < hd; i++)
                            dot += (double)q_row[i] * k_row[i];
                        scores[s] = dot / sqrt((double)hd);
                        max = scores[s] > max ? scores[s] : max;
                    }
                    for (int s = 0; s <= t; s++)
                        sum += exp(scores[s] - max);
                    double *out_row = expected + (((size_t)b * T + t) * H + h) * hd;
                    for (int s = 0; s <= t; s++) {
                        const float *v_row = v + (((size_t)b * T + s) * KV + h / group) * hd;
                        for (int i = 0; i < hd; i++)
                            out_row[i] += exp(scores[s] - max) / sum * v_row[i];
                    }
                    expected_lse[((size_t)b * H + h) * T + t] = max + log(sum);
                }
        cpu_attention_forward(out, lse, q, k, v, B, T, H, KV, hd);
        cr_assert_leq(test_relative_error_double(out, expected, q_count), FORWARD_TOLERANCE,
                      "B %d T %d heads %d kv %d hd %d", B, T, H, KV, hd);
        cr_assert_leq(test_relative_error_double(lse, expected_lse, (size_t)B * H * T),
                      FORWARD_TOLERANCE, "lse: B %d T %d heads %d kv %d hd %d", B, T, H, KV, hd);
        free_all(q, k, v, out, lse, expected, expected_lse, scores, NULL);
    }
}

/* ---- SwiGLU ---- */

Test(kernels_cpu, swiglu_forward_matches_double_reference)
{
    const size_t sizes[] = {1, 7, 37, 50000};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        size_t n = sizes[c];
        float *gate = random_floats(n, 6, 130 + c), *up = random_floats(n, 2, 140 + c);
        float *out = poisoned_floats(n);
        double *expected = zero_doubles(n);
        for (size_t i = 0; i < n; i++)
            expected[i] = gate[i] / (1.0 + exp(-(double)gate[i])) * up[i];
        cpu_swiglu_forward(out, gate, up, n);
        cr_assert_leq(test_relative_error_double(out, expected, n), FORWARD_TOLERANCE, "n %zu", n);
        free_all(gate, up, out, expected, NULL);
    }
}

/* ---- cross-entropy ---- */

static void cross_entropy_reference(double *losses, double *lse, const float *logits,
                                    const uint32_t *targets, int rows, int V, double z_loss)
{
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * V;
        double max = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++)
            max = row[i] > max ? row[i] : max;
        for (int i = 0; i < V; i++)
            sum += exp(row[i] - max);
        lse[r] = max + log(sum);
        losses[r] = lse[r] - row[targets[r]] + z_loss * lse[r] * lse[r];
    }
}

Test(kernels_cpu, cross_entropy_forward_with_z_loss_matches_double_reference)
{
    const int shapes[][2] = {{1, 7}, {3, 37}, {7, 7}, {64, 1000}}; /* rows, V */
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int rows = shapes[c][0], V = shapes[c][1];
        float *logits = random_floats((size_t)rows * V, 4, 150 + c);
        uint32_t *targets = random_tokens(rows, V, 160 + c);
        float *losses = poisoned_floats(rows), *lse = poisoned_floats(rows);
        double *expected = zero_doubles(rows), *expected_lse = zero_doubles(rows);
        cross_entropy_reference(expected, expected_lse, logits, targets, rows, V, 1e-2);
        cpu_cross_entropy_forward(losses, lse, logits, targets, rows, V, 1e-2f);
        cr_assert_leq(test_relative_error_double(losses, expected, rows), FORWARD_TOLERANCE,
                      "rows %d V %d", rows, V);
        cr_assert_leq(test_relative_error_double(lse, expected_lse, rows), FORWARD_TOLERANCE,
                      "rows %d V %d", rows, V);
        free_all(logits, targets, losses, lse, expected, expected_lse, NULL);
    }
}

Test(kernels_cpu, cross_entropy_forward_is_exact_for_logits_far_beyond_exp_range)
{
    /* exp(1000) overflows fp32 and double: only a max-subtracted logsumexp survives */
    int rows = 2, V = 37;
    float *logits = random_floats((size_t)rows * V, 4, 170);
    for (int i = 0; i < rows * V; i++)
        logits[i] += 1000.0f * (i < V ? 1 : -1);
    uint32_t targets[2] = {3, 36};
    float losses[2], lse[2];
    double expected[2], expected_lse[2];
    cross_entropy_reference(expected, expected_lse, logits, targets, rows, V, 0);
    cpu_cross_entropy_forward(losses, lse, logits, targets, rows, V, 0);
    cr_assert_leq(test_relative_error_double(losses, expected, rows), FORWARD_TOLERANCE);
    cr_assert_leq(test_relative_error_double(lse, expected_lse, rows), FORWARD_TOLERANCE);
    free(logits);
}

Test(kernels_cpu, cross_entropy_forward_rejects_a_target_outside_the_vocabulary,
     .exit_code = EXIT_DATA)
{
    float logits[7] = {0};
    uint32_t target = 7;
    float loss, lse;
    cr_redirect_stderr();
    cpu_cross_entropy_forward(&loss, &lse, logits, &target, 1, 7, 0);
}
