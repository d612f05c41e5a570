/* tests/test_cuda_optimizer.c — the cuda backend's optimizer ops (kernels/cuda/
 * kernels_cuda.h: AdamW with its bf16 compute copy, EMA, scale, sum of squares) against the
 * cpu reference (kernels/cpu/optimizer_cpu.c) on the same random fp32 ranges.
 *
 * Tolerances: relative 1e-5 for the fp32 ranges, 1e-12 for the double sum of squares.
 * Lengths: 1, 7, 333 and about a million plus an odd tail, and a range that starts one
 * element into its allocation (the element-wise path). The batched AdamW of many ranges is
 * held bit for bit to a launch a range. Each test SKIPs where no GPU answers.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/kernels_cuda.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FP32_TOLERANCE 1e-5
#define DOUBLE_TOLERANCE 1e-12

static const size_t lengths[] = {1, 7, 333, (1 << 20) + 3};
enum { LENGTH_COUNT = sizeof lengths / sizeof lengths[0] };

/* AdamW hyperparameters; lr is large so that the update, not the old value, dominates the
 * parameters the test compares */
static const float lr = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
static const int step = 3;

static AdamwScalars scalars(float grad_scale)
{
    return (AdamwScalars){.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                          .weight_decay = weight_decay, .grad_scale = grad_scale,
                          .ema_decay = 0.9f, .step = step};
}

static float *values(size_t n, float scale, uint64_t seed)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(x);
    test_fill_uniform(x, n, scale, seed);
    return x;
}

static void expect_close(const float *got, const float *want, size_t n, const char *what)
{
    double error = test_relative_error(got, want, n);
    cr_assert_leq(error, FP32_TOLERANCE, "%s (n %zu): relative error %g", what, n, error);
}

/* The AdamW state of one test case, on the host. */
typedef struct AdamState {
    float *params, *grads, *exp_avg, *exp_avg_sq;
} AdamState;

static AdamState adam_state(size_t n, uint64_t seed)
{
    AdamState state = {values(n, 1, seed), values(n, 1, seed + 1), values(n, 0.1f, seed + 2),
                       values(n, 0.01f, seed + 3)};
    for (size_t i = 0; i < n; i++)
        state.exp_avg_sq[i] = fabsf(state.exp_avg_sq[i]);
    return state;
}

static void adam_state_free(AdamState *state)
{
    free(state->params), free(state->grads), free(state->exp_avg), free(state->exp_avg_sq);
}

Test(cuda_optimizer, adamw_update_matches_cpu)
{
    gpu_require();
    for (size_t c = 0; c < LENGTH_COUNT; c++) {
        size_t n = lengths[c];
        AdamState state = adam_state(n, 10 + 10 * c);
        float *params = gpu_upload_floats(state.params, n);
        float *exp_avg = gpu_upload_floats(state.exp_avg, n);
        float *exp_avg_sq = gpu_upload_floats(state.exp_avg_sq, n);
        const AdamwScalars s = scalars(c % 2 ? 0.37f : 1.0f); /* clipped and not */
        /* the weight EMA in the same pass at every other length */
        float *ema = c % 2 ? NULL : values(n, 1, 20 + 10 * c);
        float *device_ema = ema ? gpu_upload_floats(ema, n) : NULL;
        cuda_adamw_update(params, gpu_upload_floats(state.grads, n), exp_avg, exp_avg_sq,
                          device_ema, n, &s, NULL, 0);
        cpu_adamw_update(state.params, state.grads, state.exp_avg, state.exp_avg_sq, ema, n, &s);
        float *got_params = gpu_download_floats(params, n);
        float *got_exp_avg = gpu_download_floats(exp_avg, n);
        float *got_exp_avg_sq = gpu_download_floats(exp_avg_sq, n);
        expect_close(got_params, state.params, n, "adamw params");
        expect_close(got_exp_avg, state.exp_avg, n, "adamw exp_avg");
        expect_close(got_exp_avg_sq, state.exp_avg_sq, n, "adamw exp_avg_sq");
        if (ema) {
            float *got_ema = gpu_download_floats(device_ema, n);
            expect_close(got_ema, ema, n, "adamw ema");
            free(got_ema), free(ema);
        }
        adam_state_free(&state);
        free(got_params), free(got_exp_avg), free(got_exp_avg_sq);
        gpu_free_all();
    }
}

Test(cuda_optimizer, adamw_update_writes_the_rounded_new_params_as_the_compute_copy)
{
    gpu_require();
    for (size_t c = 0; c < LENGTH_COUNT; c++) {
        size_t n = lengths[c];
        AdamState state = adam_state(n, 100 + 10 * c);
        float *params = gpu_upload_floats(state.params, n);
        bf16 *compute_copy = gpu_poisoned_bf16(n);
        const AdamwScalars s = scalars(1.0f);
        cuda_adamw_update(params, gpu_upload_floats(state.grads, n),
                          gpu_upload_floats(state.exp_avg, n),
                          gpu_upload_floats(state.exp_avg_sq, n), NULL, n, &s, compute_copy, 0);
        float *expected = gpu_download_floats(params, n);
        gpu_round_to_bf16(expected, n);
        float *got = gpu_download_bf16(compute_copy, n);
        cr_assert_eq(memcmp(got, expected, n * sizeof(float)), 0, "compute copy, n %zu", n);
        adam_state_free(&state);
        free(expected), free(got);
        gpu_free_all();
    }
}

/* The ranges of one adamw_update_ranges case: 70 small ones (two batches) with gaps between
 * them, every start on 4 floats except range 7's (its batch takes the element-wise path),
 * and range 35 over the batching bound (a launch of its own); each its own lr and decay. */
enum { RANGES_SMALL = 70 };

static size_t ranges_case(AdamwRange *ranges)
{
    size_t at = 0;
    for (int r = 0; r <= RANGES_SMALL; r++) {
        at = (at + (size_t)(r * 13) % 64 + 3) / 4 * 4 + (r == 7 ? 1 : 0);
        const size_t count = r == RANGES_SMALL / 2 ? 300001 : 1 + (size_t)(r * 397) % 3001;
        ranges[r] = (AdamwRange){at, count, lr * (float)(1 + r % 3), r % 2 ? weight_decay : 0};
        at += count;
    }
    return at + 5; /* a gap after the last range too */
}

/* Six device buffers of one case: the state uploaded, the compute copy poisoned. */
typedef struct RangesDevice {
    float *params, *grads, *exp_avg, *exp_avg_sq, *ema;
    bf16 *compute;
} RangesDevice;

static RangesDevice ranges_device(const AdamState *state, const float *ema, size_t n)
{
    return (RangesDevice){gpu_upload_floats(state->params, n),
                          gpu_upload_floats(state->grads, n),
                          gpu_upload_floats(state->exp_avg, n),
                          gpu_upload_floats(state->exp_avg_sq, n), gpu_upload_floats(ema, n),
                          gpu_poisoned_bf16(n)};
}

static void expect_same_floats(const float *one, const float *two, size_t n, const char *what)
{
    float *a = gpu_download_floats(one, n), *b = gpu_download_floats(two, n);
    cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0, "%s differ", what);
    free(a), free(b);
}

/* The batched launches give every range the bits of a launch of its own, and leave every
 * element outside the ranges as it was (the gaps hold random values, which would change). */
Test(cuda_optimizer, adamw_update_ranges_equals_a_launch_a_range_and_leaves_the_gaps)
{
    gpu_require();
    AdamwRange ranges[RANGES_SMALL + 1];
    const size_t n = ranges_case(ranges);
    AdamState state = adam_state(n, 300);
    float *ema = values(n, 1, 305);
    RangesDevice batched = ranges_device(&state, ema, n), alone = ranges_device(&state, ema, n);
    const AdamwScalars s = scalars(0.37f);
    cuda_adamw_update_ranges(batched.params, batched.grads, batched.exp_avg, batched.exp_avg_sq,
                             batched.ema, ranges, RANGES_SMALL + 1, &s, batched.compute, 0);
    for (int r = 0; r <= RANGES_SMALL; r++) {
        AdamwScalars one = s;
        one.lr = ranges[r].lr;
        one.weight_decay = ranges[r].weight_decay;
        const size_t at = ranges[r].offset;
        cuda_adamw_update(alone.params + at, alone.grads + at, alone.exp_avg + at,
                          alone.exp_avg_sq + at, alone.ema + at, ranges[r].count, &one,
                          alone.compute + at, 0);
    }
    expect_same_floats(batched.params, alone.params, n, "params");
    expect_same_floats(batched.exp_avg, alone.exp_avg, n, "exp_avg");
    expect_same_floats(batched.exp_avg_sq, alone.exp_avg_sq, n, "exp_avg_sq");
    expect_same_floats(batched.ema, alone.ema, n, "ema");
    float *compute = gpu_download_bf16(batched.compute, n);
    float *compute_alone = gpu_download_bf16(alone.compute, n);
    cr_assert_eq(memcmp(compute, compute_alone, n * sizeof(float)), 0, "compute copies differ");
    /* and the gaps' params as they were, where every range's first one moved */
    float *params = gpu_download_floats(batched.params, n);
    size_t gap = 0;
    for (int r = 0; r <= RANGES_SMALL + 1; r++) {
        const size_t end = r <= RANGES_SMALL ? ranges[r].offset : n;
        for (; gap < end; gap++)
            cr_assert_eq(params[gap], state.params[gap], "gap element %zu was written", gap);
        if (r <= RANGES_SMALL) {
            cr_assert_neq(params[end], state.params[end], "range %d was not updated", r);
            gap = end + ranges[r].count;
        }
    }
    adam_state_free(&state);
    free(ema), free(compute), free(compute_alone), free(params);
    gpu_free_all();
}

/* A zeroed device double (two fp32 slots of gpu_support's allocator). */
static double *gpu_zero_double(void)
{
    double *result = (double *)gpu_poisoned_floats(2);
    CUDA_CHECK(cudaMemset(result, 0, sizeof(double)));
    return result;
}

/* sum of squares of a device range, through a fresh zeroed result */
static double gpu_sum_squares(const float *device_x, size_t n)
{
    double *result = gpu_zero_double();
    double *workspace = (double *)gpu_poisoned_floats(2 * CUDA_SUM_SQUARES_PARTIALS);
    cuda_sum_squares(result, device_x, n, workspace, 0);
    return cuda_sum_squares_read(result, 0);
}

static void expect_close_double(double got, double want, const char *what, size_t n)
{
    double error = fabs(got - want) / fabs(want);
    cr_assert_leq(error, DOUBLE_TOLERANCE, "%s (n %zu): %.17g vs %.17g", what, n, got, want);
}

Test(cuda_optimizer, sum_squares_matches_cpu)
{
    gpu_require();
    for (size_t c = 0; c < LENGTH_COUNT; c++) {
        size_t n = lengths[c];
        float *x = values(n + 1, 3, 400 + c);
        float *device_x = gpu_upload_floats(x, n + 1);
        expect_close_double(gpu_sum_squares(device_x, n), cpu_sum_squares(x, n),
                            "sum_squares", n);
        expect_close_double(gpu_sum_squares(device_x + 1, n), cpu_sum_squares(x + 1, n),
                            "sum_squares, unaligned", n);
        free(x);
        gpu_free_all();
    }
}

Test(cuda_optimizer, sum_squares_adds_into_its_result)
{
    gpu_require();
    size_t n = 5000, m = 333;
    float *x = values(n, 1, 500), *y = values(m, 1, 501);
    double *result = gpu_zero_double();
    double *workspace = (double *)gpu_poisoned_floats(2 * CUDA_SUM_SQUARES_PARTIALS);
    cuda_sum_squares(result, gpu_upload_floats(x, n), n, workspace, 0);
    cuda_sum_squares(result, gpu_upload_floats(y, m), m, workspace, 0);
    expect_close_double(cuda_sum_squares_read(result, 0),
                        cpu_sum_squares(x, n) + cpu_sum_squares(y, m), "two ranges", n + m);
    free(x), free(y);
    gpu_free_all();
}

Test(cuda_optimizer, sum_squares_is_deterministic)
{
    gpu_require();
    size_t n = (1 << 24) + 5;
    float *x = values(n, 1, 600);
    float *device_x = gpu_upload_floats(x, n);
    double first = gpu_sum_squares(device_x, n), second = gpu_sum_squares(device_x, n);
    cr_assert_eq(memcmp(&first, &second, sizeof first), 0, "%.17g vs %.17g", first, second);
    free(x);
    gpu_free_all();
}
