/* tests/attention_support.c — see attention_support.h. */
#include "tests/attention_support.h"

#include "kernels/cpu/kernels_cpu.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

float *attention_random_bf16(size_t n, uint64_t seed)
{
    float *x = gpu_test_host_floats(n);
    test_fill_normal(x, n, 1.0f, seed);
    gpu_round_to_bf16(x, n);
    return x;
}

Case attention_case_make(Shape shape, uint64_t seed, int with_backward)
{
    Case c = {.shape = shape};
    c.q_count = (size_t)shape.B * shape.T * shape.n_heads * shape.head_dim;
    c.kv_count = (size_t)shape.B * shape.T * shape.n_kv_heads * shape.head_dim;
    c.lse_count = (size_t)shape.B * shape.n_heads * shape.T;
    c.q = attention_random_bf16(c.q_count, seed);
    c.k = attention_random_bf16(c.kv_count, seed + 1);
    c.v = attention_random_bf16(c.kv_count, seed + 2);
    c.dout = attention_random_bf16(c.q_count, seed + 3);
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
        cpu_attention_backward(c.dq, c.dk, c.dv, GRAD_ADD, c.dout, c.q, c.k, c.v,
                               c.out_rounded, c.lse, shape.B, shape.T, shape.n_heads,
                               shape.n_kv_heads, shape.head_dim);
    }
    return c;
}

void attention_case_free(Case *c)
{
    float *arrays[] = {c->q, c->k, c->v, c->dout, c->out, c->lse, c->out_rounded,
                       c->dq, c->dk, c->dv};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        free(arrays[i]);
    gpu_free_all();
}

/* ||a - ref|| / max(||ref||, floor * sqrt(n)); NaN anywhere gives +inf. */
double attention_gradient_error(const float *a, const float *ref, size_t n)
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

double attention_root_mean_square(const float *x, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    return n ? sqrt(sum / (double)n) : 0;
}

DeviceInputs attention_device_inputs(const Case *c)
{
    DeviceInputs d;
    d.q = gpu_upload_bf16(c->q, c->q_count);
    d.k = gpu_upload_bf16(c->k, c->kv_count);
    d.v = gpu_upload_bf16(c->v, c->kv_count);
    d.dout = gpu_upload_bf16(c->dout, c->q_count);
    d.out = gpu_upload_bf16(c->out_rounded, c->q_count);
    d.lse = gpu_upload_floats(c->lse, c->lse_count);
    d.workspace = gpu_poisoned_floats(
        attention_backward_cuda_workspace_bytes(c->shape.B, c->shape.T, c->shape.n_heads,
                                                c->shape.head_dim) /
        sizeof(float));
    return d;
}

void attention_run_backward(const Case *c, const DeviceInputs *d, bf16 *dq, bf16 *dk,
                            bf16 *dv, GradMode mode)
{
    Shape s = c->shape;
    attention_backward_cuda(dq, dk, dv, mode, d->dout, d->q, d->k, d->v, d->out, d->lse, s.B,
                            s.T, s.n_heads, s.n_kv_heads, s.head_dim, d->workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
}

void attention_check_forward(Shape shape, uint64_t seed, AttentionForwardKernel kernel)
{
    gpu_require();
    attention_cuda_select_forward(kernel);
    Case c = attention_case_make(shape, seed, 0);
    DeviceInputs d = attention_device_inputs(&c);
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
    attention_case_free(&c);
    cr_log_info("out %.3g, lse %.3g", out_error, lse_error);
    cr_expect_leq(out_error, BF16_TOLERANCE, "out: relative error %.3g", out_error);
    cr_expect_leq(lse_error, LSE_TOLERANCE, "lse: relative error %.3g", lse_error);
}

/* Overwrite mode into poisoned gradients, with the given backward kernel. */
void attention_check_backward(Shape shape, uint64_t seed, AttentionBackwardKernel kernel)
{
    gpu_require();
    attention_cuda_select_backward(kernel);
    Case c = attention_case_make(shape, seed, 1);
    DeviceInputs d = attention_device_inputs(&c);
    bf16 *dq = gpu_poisoned_bf16(c.q_count);
    bf16 *dk = gpu_poisoned_bf16(c.kv_count);
    bf16 *dv = gpu_poisoned_bf16(c.kv_count);
    attention_run_backward(&c, &d, dq, dk, dv, GRAD_WRITE);
    float *dq_gpu = gpu_download_bf16(dq, c.q_count);
    float *dk_gpu = gpu_download_bf16(dk, c.kv_count);
    float *dv_gpu = gpu_download_bf16(dv, c.kv_count);
    double dq_error = attention_gradient_error(dq_gpu, c.dq, c.q_count);
    double dk_error = attention_gradient_error(dk_gpu, c.dk, c.kv_count);
    double dv_error = attention_gradient_error(dv_gpu, c.dv, c.kv_count);
    free(dq_gpu);
    free(dk_gpu);
    free(dv_gpu);
    attention_case_free(&c);
    cr_log_info("dq %.3g, dk %.3g, dv %.3g", dq_error, dk_error, dv_error);
    cr_expect_leq(dq_error, BF16_TOLERANCE, "dq: relative error %.3g", dq_error);
    cr_expect_leq(dk_error, BF16_TOLERANCE, "dk: relative error %.3g", dk_error);
    cr_expect_leq(dv_error, BF16_TOLERANCE, "dv: relative error %.3g", dv_error);
}

/* dq, dk, dv start at random values of the gradients' own size: the result must be
 * start + gradient, not the gradient alone nor twice it. */
void attention_check_accumulate(AttentionBackwardKernel kernel)
{
    gpu_require();
    attention_cuda_select_backward(kernel);
    Shape shape = grouped_ragged_80;
    Case c = attention_case_make(shape, 301, 1);
    DeviceInputs d = attention_device_inputs(&c);
    float *reference[3] = {c.dq, c.dk, c.dv};
    size_t count[3] = {c.q_count, c.kv_count, c.kv_count};
    float *start[3], *expected[3];
    bf16 *gradient[3];
    for (int i = 0; i < 3; i++) {
        start[i] = gpu_test_host_floats(count[i]);
        test_fill_normal(start[i], count[i],
                         (float)attention_root_mean_square(reference[i], count[i]),
                         302 + (uint64_t)i);
        gpu_round_to_bf16(start[i], count[i]);
        gradient[i] = gpu_upload_bf16(start[i], count[i]);
        expected[i] = gpu_test_host_floats(count[i]);
        for (size_t j = 0; j < count[i]; j++)
            expected[i][j] = start[i][j] + reference[i][j];
    }
    attention_run_backward(&c, &d, gradient[0], gradient[1], gradient[2], GRAD_ADD);
    const char *names[3] = {"dq", "dk", "dv"};
    double error[3];
    for (int i = 0; i < 3; i++) {
        float *result = gpu_download_bf16(gradient[i], count[i]);
        error[i] = attention_gradient_error(result, expected[i], count[i]);
        free(result);
        free(start[i]);
        free(expected[i]);
    }
    attention_case_free(&c);
    for (int i = 0; i < 3; i++)
        cr_expect_leq(error[i], BF16_TOLERANCE, "%s: relative error %.3g", names[i], error[i]);
}

/* Runs the backward twice into freshly poisoned buffers; true when each gradient is finite
 * and has the same bits both times (names the first that does not). */
int attention_backward_repeats_its_bits(const Case *c, const DeviceInputs *d,
                                        const char **differs)
{
    size_t count[3] = {c->q_count, c->kv_count, c->kv_count};
    float *first[3], *second[3];
    for (int run = 0; run < 2; run++) {
        bf16 *gradient[3];
        for (int i = 0; i < 3; i++)
            gradient[i] = gpu_poisoned_bf16(count[i]);
        attention_run_backward(c, d, gradient[0], gradient[1], gradient[2], GRAD_WRITE);
        for (int i = 0; i < 3; i++)
            (run == 0 ? first : second)[i] = gpu_download_bf16(gradient[i], count[i]);
    }
    const char *names[3] = {"dq", "dk", "dv"};
    int same = 1;
    for (int i = 0; i < 3; i++) {
        int this_same = test_all_finite(first[i], count[i]) &&
                        memcmp(first[i], second[i], count[i] * sizeof(float)) == 0;
        if (!this_same && same)
            *differs = names[i];
        same = same && this_same;
        free(first[i]);
        free(second[i]);
    }
    return same;
}

void attention_check_deterministic(AttentionBackwardKernel kernel)
{
    gpu_require();
    attention_cuda_select_backward(kernel);
    Case c = attention_case_make((Shape){2, 300, 8, 2, 128}, 401, 0);
    DeviceInputs d = attention_device_inputs(&c);
    const char *differs = "";
    int same = attention_backward_repeats_its_bits(&c, &d, &differs);
    attention_case_free(&c);
    cr_expect(same, "%s differs between two runs (or is not finite)", differs);
}

/* A case whose out and lse come from the GPU forward (no cpu reference: the shapes below
 * take the cpu minutes); its host arrays q .. dout only. */
Case attention_large_case_make(Shape shape, uint64_t seed, DeviceInputs *d)
{
    Case c = {.shape = shape};
    c.q_count = (size_t)shape.B * shape.T * shape.n_heads * shape.head_dim;
    c.kv_count = (size_t)shape.B * shape.T * shape.n_kv_heads * shape.head_dim;
    c.lse_count = (size_t)shape.B * shape.n_heads * shape.T;
    c.q = attention_random_bf16(c.q_count, seed);
    c.k = attention_random_bf16(c.kv_count, seed + 1);
    c.v = attention_random_bf16(c.kv_count, seed + 2);
    c.dout = attention_random_bf16(c.q_count, seed + 3);
    d->q = gpu_upload_bf16(c.q, c.q_count);
    d->k = gpu_upload_bf16(c.k, c.kv_count);
    d->v = gpu_upload_bf16(c.v, c.kv_count);
    d->dout = gpu_upload_bf16(c.dout, c.q_count);
    d->out = gpu_poisoned_bf16(c.q_count);
    d->lse = gpu_poisoned_floats(c.lse_count);
    attention_forward_cuda(d->out, d->lse, d->q, d->k, d->v, shape.B, shape.T, shape.n_heads,
                           shape.n_kv_heads, shape.head_dim, 0);
    /* the fused kernel's workspace holds the two-pass kernels' too */
    attention_cuda_select_backward(ATTENTION_BACKWARD_FUSED);
    d->workspace = gpu_poisoned_floats(attention_backward_cuda_workspace_bytes(
                                           shape.B, shape.T, shape.n_heads, shape.head_dim) /
                                       sizeof(float));
    CUDA_CHECK(cudaDeviceSynchronize());
    return c;
}

/* `kernel` against the two-pass kernels: the same gradients in different orders, equal
 * within bf16. */
void attention_check_backward_against(Shape shape, uint64_t seed, AttentionBackwardKernel kernel)
{
    gpu_require();
    DeviceInputs d;
    Case c = attention_large_case_make(shape, seed, &d);
    size_t count[3] = {c.q_count, c.kv_count, c.kv_count};
    float *result[2][3];
    AttentionBackwardKernel kernels[2] = {kernel, ATTENTION_BACKWARD_TWO_PASS};
    for (int run = 0; run < 2; run++) {
        attention_cuda_select_backward(kernels[run]);
        bf16 *gradient[3];
        for (int i = 0; i < 3; i++)
            gradient[i] = gpu_poisoned_bf16(count[i]);
        attention_run_backward(&c, &d, gradient[0], gradient[1], gradient[2], GRAD_WRITE);
        for (int i = 0; i < 3; i++)
            result[run][i] = gpu_download_bf16(gradient[i], count[i]);
    }
    const char *names[3] = {"dq", "dk", "dv"};
    double error[3];
    for (int i = 0; i < 3; i++) {
        error[i] = attention_gradient_error(result[0][i], result[1][i], count[i]);
        free(result[0][i]);
        free(result[1][i]);
    }
    attention_case_free(&c);
    cr_log_info("dq %.3g, dk %.3g, dv %.3g", error[0], error[1], error[2]);
    for (int i = 0; i < 3; i++)
        cr_expect_leq(error[i], BF16_TOLERANCE, "%s: against two_pass %.3g", names[i],
                      error[i]);
}

/* A forward against the grouped one at the large shapes: out within bf16, lse within 1e-3
 * of each other. */
/* Two forwards of one random case on the GPU, kernels[run] into poisoned buffers each: the
 * host copies of out and lse. */
typedef struct ForwardPair {
    size_t q_count, lse_count;
    float *out[2], *lse[2];
} ForwardPair;

static ForwardPair forward_pair(Shape shape, uint64_t seed, AttentionForwardKernel first,
                                AttentionForwardKernel second)
{
    ForwardPair pair = {
        .q_count = (size_t)shape.B * shape.T * shape.n_heads * shape.head_dim,
        .lse_count = (size_t)shape.B * shape.n_heads * shape.T,
    };
    size_t kv_count = (size_t)shape.B * shape.T * shape.n_kv_heads * shape.head_dim;
    float *host[3] = {attention_random_bf16(pair.q_count, seed),
                      attention_random_bf16(kv_count, seed + 1),
                      attention_random_bf16(kv_count, seed + 2)};
    bf16 *q = gpu_upload_bf16(host[0], pair.q_count), *k = gpu_upload_bf16(host[1], kv_count);
    bf16 *v = gpu_upload_bf16(host[2], kv_count);
    const AttentionForwardKernel kernels[2] = {first, second};
    for (int run = 0; run < 2; run++) {
        attention_cuda_select_forward(kernels[run]);
        bf16 *out_device = gpu_poisoned_bf16(pair.q_count);
        float *lse_device = gpu_poisoned_floats(pair.lse_count);
        attention_forward_cuda(out_device, lse_device, q, k, v, shape.B, shape.T, shape.n_heads,
                               shape.n_kv_heads, shape.head_dim, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        pair.out[run] = gpu_download_bf16(out_device, pair.q_count);
        pair.lse[run] = gpu_download_floats(lse_device, pair.lse_count);
    }
    for (int i = 0; i < 3; i++)
        free(host[i]);
    gpu_free_all();
    return pair;
}

static void forward_pair_free(ForwardPair *pair)
{
    for (int run = 0; run < 2; run++) {
        free(pair->out[run]);
        free(pair->lse[run]);
    }
}

void attention_check_forward_against(Shape shape, uint64_t seed, AttentionForwardKernel kernel)
{
    gpu_require();
    ForwardPair pair = forward_pair(shape, seed, kernel, ATTENTION_FORWARD_GROUPED);
    double out_error = test_relative_error(pair.out[0], pair.out[1], pair.q_count);
    double lse_error = test_relative_error(pair.lse[0], pair.lse[1], pair.lse_count);
    forward_pair_free(&pair);
    cr_log_info("out %.3g, lse %.3g", out_error, lse_error);
    cr_expect_leq(out_error, BF16_TOLERANCE, "out: kernel %d against grouped %.3g", (int)kernel,
                  out_error);
    cr_expect_leq(lse_error, LSE_TOLERANCE, "lse: kernel %d against grouped %.3g", (int)kernel,
                  lse_error);
}

/* The index of the first element whose bits differ, or -1; NaN never matches. */
static long long first_difference(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0 || a[i] != a[i])
            return (long long)i;
    return -1;
}

void attention_check_forward_bits(Shape shape, uint64_t seed, AttentionForwardKernel kernel,
                                  AttentionForwardKernel reference)
{
    gpu_require();
    ForwardPair pair = forward_pair(shape, seed, kernel, reference);
    long long out_at = first_difference(pair.out[0], pair.out[1], pair.q_count);
    long long lse_at = first_difference(pair.lse[0], pair.lse[1], pair.lse_count);
    cr_expect_eq(out_at, -1, "out: kernel %d differs from kernel %d at %lld (%.9g, %.9g)",
                 (int)kernel, (int)reference, out_at, out_at < 0 ? 0.0 : pair.out[0][out_at],
                 out_at < 0 ? 0.0 : pair.out[1][out_at]);
    cr_expect_eq(lse_at, -1, "lse: kernel %d differs from kernel %d at %lld (%.9g, %.9g)",
                 (int)kernel, (int)reference, lse_at, lse_at < 0 ? 0.0 : pair.lse[0][lse_at],
                 lse_at < 0 ? 0.0 : pair.lse[1][lse_at]);
    forward_pair_free(&pair);
}
