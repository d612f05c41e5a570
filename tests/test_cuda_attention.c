/* tests/test_cuda_attention.c — the cuda attention kernels against the cpu reference
 * (DESIGN 7 "GPU"; kernels/cuda/attention_cuda.h).
 *
 * Every case draws fresh random q, k, v, dout, rounds them to bf16 (what the GPU reads) and
 * runs kernels/cpu on the rounded values; the backward reference gets the forward's out
 * rounded to bf16, as the GPU backward does. Outputs are poisoned (NaN) before each call, so
 * an element the kernels never write fails. Tolerances (relative, whole tensor): 1e-2 for
 * the bf16 tensors out, dq, dk, dv; 1e-3 for the fp32 lse. Gradients are compared with an
 * RMS floor of 1e-3 under the reference norm: at T = 1 the exact dq and dk are zero and the
 * GPU's (dout . v - dout . out) is a rounding residue, not an error.
 * Shapes (B, T, n_heads, n_kv_heads, head_dim) cover one token, ragged tails (T not a
 * multiple of the 64 / 128 tiles, including blocks where a whole warpgroup's rows lie past T),
 * grouped and ungrouped heads, head_dim 64, 80 (no power of two) and 128, and a sequence long
 * enough that every shared-memory ring of the kernels wraps several times.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/attention_cuda.h"
#include "runtime/error.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define LSE_TOLERANCE 1e-3
#define GRADIENT_RMS_FLOOR 1e-3

typedef struct Shape {
    int B, T, n_heads, n_kv_heads, head_dim;
} Shape;

/* Host inputs (already rounded to bf16) and the cpu results on them. */
typedef struct Case {
    Shape shape;
    size_t q_count, kv_count, lse_count;
    float *q, *k, *v, *dout;
    float *out, *lse;    /* cpu forward */
    float *out_rounded;  /* out as the GPU forward would store it */
    float *dq, *dk, *dv; /* cpu backward from zero, given out_rounded (with_backward only) */
} Case;

static float *random_bf16_floats(size_t n, uint64_t seed)
{
    float *x = gpu_test_host_floats(n);
    test_fill_normal(x, n, 1.0f, seed);
    gpu_round_to_bf16(x, n);
    return x;
}

static Case case_make(Shape shape, uint64_t seed, int with_backward)
{
    Case c = {.shape = shape};
    c.q_count = (size_t)shape.B * shape.T * shape.n_heads * shape.head_dim;
    c.kv_count = (size_t)shape.B * shape.T * shape.n_kv_heads * shape.head_dim;
    c.lse_count = (size_t)shape.B * shape.n_heads * shape.T;
    c.q = random_bf16_floats(c.q_count, seed);
    c.k = random_bf16_floats(c.kv_count, seed + 1);
    c.v = random_bf16_floats(c.kv_count, seed + 2);
    c.dout = random_bf16_floats(c.q_count, seed + 3);
    c.out = gpu_test_host_floats(c.q_count);
    c.lse = gpu_test_host_floats(c.lse_count);
    cpu_attention_forward(c.out, c.lse, c.q, c.k, c.v, shape.B, shape.T, shape.n_heads,
                          shape.n_kv_heads, shape.head_dim);
    c.out_rounded = gpu_test_host_floats(c.q_count);
    memcpy(c.out_rounded, c.out, c.q_count * sizeof(float));
    gpu_round_to_bf16(c.out_rounded, c.q_count);
    if (with_backward) {
        c.dq = gpu_test_host_floats(c.q_count);
        c.dk = gpu_test_host_floats(c.kv_count);
        c.dv = gpu_test_host_floats(c.kv_count);
        cpu_attention_backward(c.dq, c.dk, c.dv, c.dout, c.q, c.k, c.v, c.out_rounded, c.lse,
                               shape.B, shape.T, shape.n_heads, shape.n_kv_heads,
                               shape.head_dim);
    }
    return c;
}

static void case_free(Case *c)
{
    float *arrays[] = {c->q, c->k, c->v, c->dout, c->out, c->lse, c->out_rounded,
                       c->dq, c->dk, c->dv};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        free(arrays[i]);
    gpu_free_all();
}

/* ||a - ref|| / max(||ref||, floor * sqrt(n)); NaN anywhere gives +inf. */
static double gradient_error(const float *a, const float *ref, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        double d = (double)a[i] - (double)ref[i];
        diff += d * d;
        norm += (double)ref[i] * ref[i];
    }
    double floor = GRADIENT_RMS_FLOOR * sqrt((double)n);
    return sqrt(diff) / fmax(sqrt(norm), floor);
}

static double root_mean_square(const float *x, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    return n ? sqrt(sum / (double)n) : 0;
}

/* Device copies of a case's inputs. */
typedef struct DeviceInputs {
    bf16 *q, *k, *v, *dout, *out;
    float *lse, *workspace;
} DeviceInputs;

static DeviceInputs device_inputs(const Case *c)
{
    DeviceInputs d;
    d.q = gpu_upload_bf16(c->q, c->q_count);
    d.k = gpu_upload_bf16(c->k, c->kv_count);
    d.v = gpu_upload_bf16(c->v, c->kv_count);
    d.dout = gpu_upload_bf16(c->dout, c->q_count);
    d.out = gpu_upload_bf16(c->out_rounded, c->q_count);
    d.lse = gpu_upload_floats(c->lse, c->lse_count);
    d.workspace = gpu_poisoned_floats(
        attention_backward_cuda_workspace_bytes(c->shape.B, c->shape.T, c->shape.n_heads) /
        sizeof(float));
    return d;
}

static void run_backward(const Case *c, const DeviceInputs *d, bf16 *dq, bf16 *dk, bf16 *dv,
                         bool accumulate)
{
    Shape s = c->shape;
    attention_backward_cuda(dq, dk, dv, d->dout, d->q, d->k, d->v, d->out, d->lse, s.B, s.T,
                            s.n_heads, s.n_kv_heads, s.head_dim, d->workspace, accumulate, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
}

static void check_forward(Shape shape, uint64_t seed)
{
    gpu_require();
    Case c = case_make(shape, seed, 0);
    DeviceInputs d = device_inputs(&c);
    bf16 *out = gpu_poisoned_bf16(c.q_count);
    float *lse = gpu_poisoned_floats(c.lse_count);
    attention_forward_cuda(out, lse, d.q, d.k, d.v, shape.B, shape.T, shape.n_heads,
                           shape.n_kv_heads, shape.head_dim, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *out_gpu = gpu_download_bf16(out, c.q_count);
    float *lse_gpu = gpu_download_floats(lse, c.lse_count);
    double out_error = test_relative_error(out_gpu, c.out, c.q_count);
    double lse_error = test_relative_error(lse_gpu, c.lse, c.lse_count);
    free(out_gpu);
    free(lse_gpu);
    case_free(&c);
    cr_log_info("out %.3g, lse %.3g", out_error, lse_error);
    cr_expect_leq(out_error, BF16_TOLERANCE, "out: relative error %.3g", out_error);
    cr_expect_leq(lse_error, LSE_TOLERANCE, "lse: relative error %.3g", lse_error);
}

/* Overwrite mode into poisoned gradients. */
static void check_backward(Shape shape, uint64_t seed)
{
    gpu_require();
    Case c = case_make(shape, seed, 1);
    DeviceInputs d = device_inputs(&c);
    bf16 *dq = gpu_poisoned_bf16(c.q_count);
    bf16 *dk = gpu_poisoned_bf16(c.kv_count);
    bf16 *dv = gpu_poisoned_bf16(c.kv_count);
    run_backward(&c, &d, dq, dk, dv, false);
    float *dq_gpu = gpu_download_bf16(dq, c.q_count);
    float *dk_gpu = gpu_download_bf16(dk, c.kv_count);
    float *dv_gpu = gpu_download_bf16(dv, c.kv_count);
    double dq_error = gradient_error(dq_gpu, c.dq, c.q_count);
    double dk_error = gradient_error(dk_gpu, c.dk, c.kv_count);
    double dv_error = gradient_error(dv_gpu, c.dv, c.kv_count);
    free(dq_gpu);
    free(dk_gpu);
    free(dv_gpu);
    case_free(&c);
    cr_log_info("dq %.3g, dk %.3g, dv %.3g", dq_error, dk_error, dv_error);
    cr_expect_leq(dq_error, BF16_TOLERANCE, "dq: relative error %.3g", dq_error);
    cr_expect_leq(dk_error, BF16_TOLERANCE, "dk: relative error %.3g", dk_error);
    cr_expect_leq(dv_error, BF16_TOLERANCE, "dv: relative error %.3g", dv_error);
}

static const Shape single_token = {1, 1, 1, 1, 64};
static const Shape grouped_ragged_64 = {2, 77, 4, 2, 64};
static const Shape grouped_ragged_128 = {1, 300, 8, 2, 128};
static const Shape grouped_ragged_80 = {1, 129, 6, 3, 80};
static const Shape wide_128 = {2, 256, 32, 8, 128};
static const Shape ungrouped_64 = {2, 200, 3, 3, 64};
static const Shape long_64 = {1, 1000, 2, 1, 64};
static const Shape groups_of_8_128 = {1, 333, 16, 2, 128}; /* a group spans two blocks */
static const Shape groups_of_3_80 = {1, 190, 6, 2, 80};    /* odd group: one head a block */

Test(cuda_attention, forward_matches_cpu_for_a_single_token)
{
    check_forward(single_token, 101);
}

Test(cuda_attention, forward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    check_forward(grouped_ragged_64, 102);
}

Test(cuda_attention, forward_matches_cpu_for_head_dim_128_past_two_query_tiles)
{
    check_forward(grouped_ragged_128, 103);
}

Test(cuda_attention, forward_matches_cpu_for_head_dim_80)
{
    check_forward(grouped_ragged_80, 104);
}

Test(cuda_attention, forward_matches_cpu_with_32_heads_over_8_kv_heads)
{
    check_forward(wide_128, 105);
}

Test(cuda_attention, forward_matches_cpu_without_grouped_heads)
{
    check_forward(ungrouped_64, 106);
}

Test(cuda_attention, forward_matches_cpu_over_many_key_blocks)
{
    check_forward(long_64, 107);
}

Test(cuda_attention, forward_matches_cpu_with_groups_of_eight_heads)
{
    check_forward(groups_of_8_128, 108);
}

Test(cuda_attention, forward_matches_cpu_with_groups_of_three_heads)
{
    check_forward(groups_of_3_80, 109);
}

Test(cuda_attention, backward_matches_cpu_for_a_single_token)
{
    check_backward(single_token, 201);
}

Test(cuda_attention, backward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    check_backward(grouped_ragged_64, 202);
}

Test(cuda_attention, backward_matches_cpu_for_head_dim_128_past_two_query_tiles)
{
    check_backward(grouped_ragged_128, 203);
}

Test(cuda_attention, backward_matches_cpu_for_head_dim_80)
{
    check_backward(grouped_ragged_80, 204);
}

Test(cuda_attention, backward_matches_cpu_with_32_heads_over_8_kv_heads)
{
    check_backward(wide_128, 205);
}

Test(cuda_attention, backward_matches_cpu_without_grouped_heads)
{
    check_backward(ungrouped_64, 206);
}

Test(cuda_attention, backward_matches_cpu_over_many_key_blocks)
{
    check_backward(long_64, 207);
}

/* dq, dk, dv start at random values of the gradients' own size: the result must be
 * start + gradient, not the gradient alone nor twice it. */
Test(cuda_attention, backward_with_accumulate_adds_to_the_gradients)
{
    gpu_require();
    Shape shape = grouped_ragged_80;
    Case c = case_make(shape, 301, 1);
    DeviceInputs d = device_inputs(&c);
    float *reference[3] = {c.dq, c.dk, c.dv};
    size_t count[3] = {c.q_count, c.kv_count, c.kv_count};
    float *start[3], *expected[3];
    bf16 *gradient[3];
    for (int i = 0; i < 3; i++) {
        start[i] = gpu_test_host_floats(count[i]);
        test_fill_normal(start[i], count[i], (float)root_mean_square(reference[i], count[i]),
                         302 + (uint64_t)i);
        gpu_round_to_bf16(start[i], count[i]);
        gradient[i] = gpu_upload_bf16(start[i], count[i]);
        expected[i] = gpu_test_host_floats(count[i]);
        for (size_t j = 0; j < count[i]; j++)
            expected[i][j] = start[i][j] + reference[i][j];
    }
    run_backward(&c, &d, gradient[0], gradient[1], gradient[2], true);
    const char *names[3] = {"dq", "dk", "dv"};
    double error[3];
    for (int i = 0; i < 3; i++) {
        float *result = gpu_download_bf16(gradient[i], count[i]);
        error[i] = gradient_error(result, expected[i], count[i]);
        free(result);
        free(start[i]);
        free(expected[i]);
    }
    case_free(&c);
    for (int i = 0; i < 3; i++)
        cr_expect_leq(error[i], BF16_TOLERANCE, "%s: relative error %.3g", names[i], error[i]);
}

/* Two runs on the same inputs into freshly poisoned buffers give the same bits. */
Test(cuda_attention, backward_is_bitwise_deterministic)
{
    gpu_require();
    Shape shape = {2, 300, 8, 2, 128};
    Case c = case_make(shape, 401, 0);
    DeviceInputs d = device_inputs(&c);
    size_t count[3] = {c.q_count, c.kv_count, c.kv_count};
    float *first[3], *second[3];
    for (int run = 0; run < 2; run++) {
        bf16 *gradient[3];
        for (int i = 0; i < 3; i++)
            gradient[i] = gpu_poisoned_bf16(count[i]);
        run_backward(&c, &d, gradient[0], gradient[1], gradient[2], false);
        for (int i = 0; i < 3; i++)
            (run == 0 ? first : second)[i] = gpu_download_bf16(gradient[i], count[i]);
    }
    const char *names[3] = {"dq", "dk", "dv"};
    int same[3];
    for (int i = 0; i < 3; i++) {
        same[i] = test_all_finite(first[i], count[i]) &&
                  memcmp(first[i], second[i], count[i] * sizeof(float)) == 0;
        free(first[i]);
        free(second[i]);
    }
    case_free(&c);
    for (int i = 0; i < 3; i++)
        cr_expect(same[i], "%s differs between two runs (or is not finite)", names[i]);
}

/* Shapes the kernels cannot run are refused before any launch (no GPU needed). */
static void attention_with_head_dim_96(void *unused)
{
    (void)unused;
    attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, 1, 16, 4, 2, 96, 0);
}

Test(cuda_attention, unsupported_head_dim_exits_with_the_config_code)
{
    test_expect_fatal(attention_with_head_dim_96, NULL, EXIT_CONFIG,
                      "model.head_dim = 96 is not supported on cuda");
}

static void attention_backward_with_4_kv_heads_for_6(void *unused)
{
    (void)unused;
    attention_backward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 16, 6, 4,
                            64, NULL, true, 0);
}

Test(cuda_attention, kv_heads_not_dividing_heads_exits_with_the_config_code)
{
    test_expect_fatal(attention_backward_with_4_kv_heads_for_6, NULL, EXIT_CONFIG,
                      "model.n_kv_heads = 4 must divide model.n_heads = 6");
}
