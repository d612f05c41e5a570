/* tests/test_kernels_cpu_optimizer.c — the cpu backend's optimizer ops (sum of squares,
 * AdamW with its EMA, AdamW over ranges) against naive double-precision loops written here
 * (DESIGN 7, "Unit"). Tolerance: relative error (whole tensor, 2-norm) <= 1e-5.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define FORWARD_TOLERANCE 1e-5

/* ||a - b|| / ||b|| for two double arrays */
static double relative_error_doubles(const double *a, const double *b, size_t n)
{
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        diff += (a[i] - b[i]) * (a[i] - b[i]);
        ref += b[i] * b[i];
    }
    return isfinite(diff) && ref > 0 ? sqrt(diff / ref) : INFINITY;
}

/* ---- optimizer ops ---- */

Test(kernels_cpu, sum_squares_matches_naive_loop)
{
    /* from empty to several parallel groups of blocks, ending mid-block */
    const size_t sizes[] = {0, 1, 4097, 2 * 64 * 4096 + 123};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        size_t n = sizes[c];
        float *x = random_floats(n, 3, 180 + c);
        double expected = 0;
        for (size_t i = 0; i < n; i++)
            expected += (double)x[i] * x[i];
        double got = cpu_sum_squares(x, n);
        cr_assert_leq(fabs(got - expected), 1e-12 * expected, "n %zu: %.17g vs %.17g", n, got,
                      expected);
        free(x);
    }
}

Test(kernels_cpu, sum_squares_is_bitwise_identical_for_1_and_2_threads)
{
    size_t n = 3 * 64 * 4096 + 5;
    float *x = random_floats(n, 3, 190);
    omp_set_num_threads(1);
    double one = cpu_sum_squares(x, n);
    omp_set_num_threads(2);
    double two = cpu_sum_squares(x, n);
    cr_assert_eq(memcmp(&one, &two, sizeof one), 0, "%.17g vs %.17g", one, two);
    free(x);
}

/* The EMA in AdamW's pass follows the NEW weights; without an EMA buffer the update is the
 * same, bit for bit. */
Test(kernels_cpu, adamw_update_takes_the_ema_of_the_updated_weights)
{
    size_t n = 1001;
    const double decay = 0.6; /* the new weights weigh in: an EMA of the old ones would fail */
    float *params = random_floats(n, 1, 210), *grads = random_floats(n, 1, 211);
    float *ema = random_floats(n, 1, 212), *alone = random_floats(n, 1, 210);
    float *exp_avg = calloc(n, sizeof(float)), *exp_avg_sq = calloc(n, sizeof(float));
    float *exp_avg_alone = calloc(n, sizeof(float)), *exp_avg_sq_alone = calloc(n, sizeof(float));
    double *expected = zero_doubles(n);
    const AdamwScalars s = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                            .weight_decay = 0.1f, .grad_scale = 0.5f,
                            .ema_decay = (float)decay, .step = 1};
    cpu_adamw_update(alone, grads, exp_avg_alone, exp_avg_sq_alone, NULL, n, &s);
    for (size_t i = 0; i < n; i++)
        expected[i] = decay * ema[i] + (1 - decay) * alone[i];
    cpu_adamw_update(params, grads, exp_avg, exp_avg_sq, ema, n, &s);
    cr_assert_eq(memcmp(params, alone, n * sizeof(float)), 0, "the EMA changed the update");
    cr_assert_leq(test_relative_error_double(ema, expected, n), FORWARD_TOLERANCE);
    free_all(params, grads, ema, alone, exp_avg, exp_avg_sq, exp_avg_alone, exp_avg_sq_alone,
             expected, NULL);
}

/* The ranges op is adamw_update a range, each with its own lr and decay, and leaves what
 * lies between the ranges alone. */
Test(kernels_cpu, adamw_update_ranges_updates_each_range_with_its_own_rates_only)
{
    const size_t n = 200;
    const AdamwRange ranges[] = {
        {3, 40, 1e-2f, 0.1f}, {50, 1, 3e-2f, 0.0f}, {64, 120, 2e-2f, 0.2f}};
    const int n_ranges = (int)(sizeof ranges / sizeof ranges[0]);
    float *params = random_floats(n, 1, 240), *grads = random_floats(n, 1, 241);
    float *ema = random_floats(n, 1, 242), *exp_avg = random_floats(n, 0.1f, 243);
    float *exp_avg_sq = random_floats(n, 0.01f, 244);
    for (size_t i = 0; i < n; i++)
        exp_avg_sq[i] = fabsf(exp_avg_sq[i]);
    float *want[] = {random_floats(n, 1, 240), random_floats(n, 1, 242),
                     random_floats(n, 0.1f, 243), random_floats(n, 0.01f, 244)};
    for (size_t i = 0; i < n; i++)
        want[3][i] = fabsf(want[3][i]);
    const AdamwScalars s = {.lr = 5.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                            .weight_decay = 5.0f, .grad_scale = 0.5f, .ema_decay = 0.7f,
                            .step = 2};
    for (int r = 0; r < n_ranges; r++) {
        AdamwScalars one = s;
        one.lr = ranges[r].lr;
        one.weight_decay = ranges[r].weight_decay;
        const size_t at = ranges[r].offset;
        cpu_adamw_update(want[0] + at, grads + at, want[2] + at, want[3] + at, want[1] + at,
                         ranges[r].count, &one);
    }
    backend_cpu()->adamw_update_ranges(params, grads, exp_avg, exp_avg_sq, ema, ranges,
                                       n_ranges, &s, NULL);
    cr_assert_eq(memcmp(params, want[0], n * sizeof(float)), 0, "params");
    cr_assert_eq(memcmp(ema, want[1], n * sizeof(float)), 0, "ema");
    cr_assert_eq(memcmp(exp_avg, want[2], n * sizeof(float)), 0, "exp_avg");
    cr_assert_eq(memcmp(exp_avg_sq, want[3], n * sizeof(float)), 0, "exp_avg_sq");
    float *untouched = random_floats(n, 1, 240);
    cr_assert_eq(memcmp(params, untouched, 3 * sizeof(float)), 0, "the first gap was written");
    cr_assert_neq(params[3], untouched[3], "the first range did not move");
    free_all(params, grads, ema, exp_avg, exp_avg_sq, want[0], want[1], want[2], want[3],
             untouched, NULL);
}

Test(kernels_cpu, adamw_update_matches_double_formula_over_3_steps)
{
    size_t n = 1001;
    const double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
    float *params = random_floats(n, 1, 220), *exp_avg = calloc(n, sizeof(float));
    float *exp_avg_sq = calloc(n, sizeof(float));
    double *p = zero_doubles(n), *m = zero_doubles(n), *v = zero_doubles(n);
    /* the displacement from the start, not the parameters themselves, is compared: an error
     * in the update must not hide under the size of the parameters */
    double *initial = zero_doubles(n), *moved = zero_doubles(n), *expected_moved = zero_doubles(n);
    for (size_t i = 0; i < n; i++)
        p[i] = initial[i] = params[i];
    for (int step = 1; step <= 3; step++) {
        float *grads = random_floats(n, 1, 230 + step);
        for (size_t i = 0; i < n; i++) {
            double g = grads[i];
            p[i] -= lr * weight_decay * p[i];
            m[i] = beta1 * m[i] + (1 - beta1) * g;
            v[i] = beta2 * v[i] + (1 - beta2) * g * g;
            p[i] -= lr / (1 - pow(beta1, step)) * m[i] /
                    (sqrt(v[i]) / sqrt(1 - pow(beta2, step)) + eps);
        }
        const AdamwScalars s = {.lr = (float)lr, .beta1 = (float)beta1, .beta2 = (float)beta2,
                                .eps = (float)eps, .weight_decay = (float)weight_decay,
                                .grad_scale = 1.0f, .step = step};
        cpu_adamw_update(params, grads, exp_avg, exp_avg_sq, NULL, n, &s);
        for (size_t i = 0; i < n; i++) {
            moved[i] = (double)params[i] - initial[i];
            expected_moved[i] = p[i] - initial[i];
        }
        cr_assert_leq(relative_error_doubles(moved, expected_moved, n), FORWARD_TOLERANCE,
                      "step %d", step);
        cr_assert_leq(test_relative_error_double(exp_avg, m, n), FORWARD_TOLERANCE, "step %d",
                      step);
        cr_assert_leq(test_relative_error_double(exp_avg_sq, v, n), FORWARD_TOLERANCE,
                      "step %d", step);
        free(grads);
    }
    free_all(params, exp_avg, exp_avg_sq, p, m, v, initial, moved, expected_moved, NULL);
}
