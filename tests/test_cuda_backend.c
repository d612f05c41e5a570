/* tests/test_cuda_backend.c — the services of the cuda op table (kernels/cuda/
 * backend_cuda.cu): memory and its accounting, events, the conversions between fp32 and
 * bf16 activations, and the optimizer entries against the cpu table (relative 1e-5; the sum
 * of squares 1e-12; conversions and the compute copy bit for bit). The compute ops are in
 * test_cuda_backend_ops.c and test_cuda_backend_route.c. Device memory is reached through
 * the table only, so its one stream orders every access. Each test SKIPs where no GPU
 * answers.
 */
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/kernels_cuda.h"
#include "runtime/cuda_module.h"
#include "runtime/error.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <libgen.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *host_values(size_t n, float scale, uint64_t seed)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(x);
    test_fill_uniform(x, n, scale, seed);
    return x;
}

/* what the GPU holds of a value: its bf16 rounding (nearest even), as fp32 */
static float *rounded_copy(const float *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(y);
    for (size_t i = 0; i < n; i++)
        y[i] = bf16_to_float(bf16_from_float(x[i]));
    return y;
}

static void *device_poisoned(size_t bytes)
{
    const Backend *cuda = backend_cuda();
    void *device = cuda->alloc(bytes);
    unsigned char *ones = malloc(bytes);
    cr_assert_not_null(ones);
    memset(ones, 0xFF, bytes);
    cuda->upload(device, ones, bytes);
    free(ones);
    return device;
}

static float *device_floats(const float *host, size_t n)
{
    float *device = backend_cuda()->alloc(n * sizeof(float));
    backend_cuda()->upload(device, host, n * sizeof(float));
    return device;
}

/* ---- the table ---- */

#define EXPECT_ENTRY(table, entry) \
    cr_expect((table)->entry != NULL, "the cuda table has no " #entry)

/* A partial rebuild (meson 1.0 tracks no headers for nvcc) or a module of another build
 * fills entries at other offsets: both are refused by the op table's size (no GPU needed). */
Test(cuda_backend, the_module_reports_the_op_table_this_binary_was_built_with)
{
    cr_expect_eq(backend_cuda_table_bytes(), sizeof(Backend));
}

static void fill_routing_of_a_smaller_table(void *unused)
{
    (void)unused;
    Backend table = {0};
    backend_cuda_fill_routing(&table, sizeof table - sizeof(void *));
}

Test(cuda_backend, routing_entries_compiled_against_another_op_table_exit_with_the_config_code)
{
    test_expect_fatal(fill_routing_of_a_smaller_table, NULL, EXIT_CONFIG,
                      "compiled against another runtime/backend.h");
}

Test(cuda_backend, fills_every_entry_with_two_byte_activations)
{
    gpu_require();
    const Backend *b = backend_cuda();
    cr_assert_str_eq(b->name, "cuda");
    cr_expect_eq(b->activation_bytes, 2);
    EXPECT_ENTRY(b, alloc); EXPECT_ENTRY(b, release); EXPECT_ENTRY(b, zero);
    EXPECT_ENTRY(b, copy); EXPECT_ENTRY(b, upload); EXPECT_ENTRY(b, download);
    EXPECT_ENTRY(b, synchronize); EXPECT_ENTRY(b, memory_usage);
    EXPECT_ENTRY(b, memory_peak_reset);
    EXPECT_ENTRY(b, event_create); EXPECT_ENTRY(b, event_destroy);
    EXPECT_ENTRY(b, event_record); EXPECT_ENTRY(b, event_elapsed_ms);
    EXPECT_ENTRY(b, event_wait);
    EXPECT_ENTRY(b, activations_from_floats); EXPECT_ENTRY(b, activations_upload);
    EXPECT_ENTRY(b, activations_download); EXPECT_ENTRY(b, add_inplace); EXPECT_ENTRY(b, add);
    EXPECT_ENTRY(b, add_both);
    EXPECT_ENTRY(b, add_difference);
    EXPECT_ENTRY(b, embedding_forward); EXPECT_ENTRY(b, embedding_backward);
    EXPECT_ENTRY(b, sum_rows);
    EXPECT_ENTRY(b, rmsnorm_forward); EXPECT_ENTRY(b, rmsnorm_backward);
    EXPECT_ENTRY(b, rmsnorm_backward_branch);
    EXPECT_ENTRY(b, matmul_forward); EXPECT_ENTRY(b, matmul_backward);
    EXPECT_ENTRY(b, rope_forward); EXPECT_ENTRY(b, rope_backward);
    EXPECT_ENTRY(b, attention_forward); EXPECT_ENTRY(b, attention_backward);
    EXPECT_ENTRY(b, swiglu_forward); EXPECT_ENTRY(b, swiglu_backward);
    EXPECT_ENTRY(b, cross_entropy_forward); EXPECT_ENTRY(b, cross_entropy_backward);
    EXPECT_ENTRY(b, route_forward); EXPECT_ENTRY(b, route_backward);
    EXPECT_ENTRY(b, route_block_forward); EXPECT_ENTRY(b, route_block_backward);
    EXPECT_ENTRY(b, route_merge_forward); EXPECT_ENTRY(b, route_merge_backward);
    EXPECT_ENTRY(b, route_merge_rmsnorm_forward); EXPECT_ENTRY(b, route_merge_rmsnorm_backward);
    EXPECT_ENTRY(b, route_merge_conv_forward); EXPECT_ENTRY(b, route_merge_conv_mix_forward);
    EXPECT_ENTRY(b, route_merge_conv_backward);
    EXPECT_ENTRY(b, add_scaled); EXPECT_ENTRY(b, add_scaled_rmsnorm_forward);
    EXPECT_ENTRY(b, stream_mix_rmsnorm_forward);
    EXPECT_ENTRY(b, stream_conv_forward); EXPECT_ENTRY(b, stream_conv_backward);
    EXPECT_ENTRY(b, stream_mix_forward); EXPECT_ENTRY(b, stream_mix_backward);
    EXPECT_ENTRY(b, sum_squares); EXPECT_ENTRY(b, adamw_update);
    EXPECT_ENTRY(b, adamw_update_ranges);
}

/* The module found through runtime/cuda_module (as `fathom` finds it, here by its path)
 * hands out the same table. */
Test(cuda_backend, is_what_the_cuda_module_hands_out)
{
    gpu_require();
    char binary[1024], module[1100];
    snprintf(binary, sizeof binary, "%s", test_fathom_binary());
    snprintf(module, sizeof module, "%s/kernels/libfathom_cuda.so", dirname(binary));
    setenv("FATHOM_CUDA_MODULE", module, 1);
    const Backend *b = cuda_module_backend();
    cr_assert_not_null(b, "no cuda backend from %s: %s", module,
                       cuda_module_probe()->description);
    cr_expect_str_eq(b->name, "cuda");
    cr_expect_eq(b->activation_bytes, 2);
}

/* ---- memory ---- */

Test(cuda_backend, alloc_returns_zeroed_memory_even_where_data_was_released)
{
    gpu_require();
    const Backend *b = backend_cuda();
    const size_t bytes = (1 << 20) + 6;
    b->release(device_poisoned(bytes));
    unsigned char *got = malloc(bytes);
    cr_assert_not_null(got);
    void *device = b->alloc(bytes); /* likely the memory just released */
    b->download(got, device, bytes);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i++)
        nonzero += got[i] != 0;
    cr_expect_eq(nonzero, 0, "%zu of %zu bytes are not zero", nonzero, bytes);
    b->release(device);
    free(got);
}

Test(cuda_backend, alloc_of_zero_bytes_returns_null_and_release_of_null_does_nothing)
{
    gpu_require();
    const Backend *b = backend_cuda();
    cr_expect_null(b->alloc(0));
    b->release(NULL);
}

Test(cuda_backend, zero_clears_exactly_its_range)
{
    gpu_require();
    const Backend *b = backend_cuda();
    const size_t n = 1003;
    float *x = host_values(n, 1, 1), *got = malloc(n * sizeof(float));
    float *device = device_floats(x, n);
    b->zero(device + 5, 990 * sizeof(float));
    b->download(got, device, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float want = i >= 5 && i < 995 ? 0.0f : x[i];
        cr_assert_eq(got[i], want, "element %zu: %g, not %g", i, got[i], want);
    }
    b->release(device);
    free(x), free(got);
}

Test(cuda_backend, copy_upload_and_download_move_the_bytes_unchanged)
{
    gpu_require();
    const Backend *b = backend_cuda();
    const size_t n = 1003;
    float *x = host_values(n, 1, 2), *got = malloc(n * sizeof(float));
    float *source = device_floats(x, n), *target = device_poisoned(n * sizeof(float));
    b->copy(target, source, n * sizeof(float));
    b->synchronize();
    b->download(got, target, n * sizeof(float));
    cr_expect_eq(memcmp(got, x, n * sizeof(float)), 0, "the round trip changed the bytes");
    b->release(source), b->release(target);
    free(x), free(got);
}

Test(cuda_backend, memory_usage_grows_by_an_alloc_and_falls_back_after_release)
{
    gpu_require();
    const Backend *b = backend_cuda();
    b->synchronize(); /* the first call makes the stream and cuBLASLt's workspace */
    size_t before, peak_before, during, peak_during, after, peak_after;
    b->memory_usage(&before, &peak_before);
    const size_t bytes = (3 << 20) + 17;
    void *device = b->alloc(bytes);
    b->memory_usage(&during, &peak_during);
    cr_expect_eq(during, before + bytes, "in use %zu after an alloc of %zu from %zu", during,
                 bytes, before);
    cr_expect_geq(peak_during, during);
    b->release(device);
    b->memory_usage(&after, &peak_after);
    cr_expect_eq(after, before, "in use %zu after release, %zu before the alloc", after, before);
    cr_expect_eq(peak_after, peak_during, "the peak is the high mark");
}

/* The rmsnorm backward needs a workspace: it is counted, and a second call of the same
 * shape allocates nothing (after the first step the workspace never grows). */
Test(cuda_backend, memory_usage_counts_the_workspace_which_does_not_grow_again)
{
    gpu_require();
    const Backend *b = backend_cuda();
    const int rows = 333, d = 100;
    const size_t count = (size_t)rows * d;
    Activation *dx = b->alloc(count * 2), *dout = b->alloc(count * 2), *x = b->alloc(count * 2);
    Activation *weight = b->alloc((size_t)d * 2);
    float *dweight = b->alloc((size_t)d * sizeof(float)), *rstd = b->alloc(rows * sizeof(float));
    size_t before, after_first, after_second;
    b->memory_usage(&before, NULL);
    b->rmsnorm_backward(dx, GRAD_ADD, dweight, dout, x, weight, rstd, rows, d);
    b->synchronize();
    b->memory_usage(&after_first, NULL);
    b->rmsnorm_backward(dx, GRAD_ADD, dweight, dout, x, weight, rstd, rows, d);
    b->synchronize();
    b->memory_usage(&after_second, NULL);
    size_t workspace = cuda_rmsnorm_backward_workspace_floats(rows, d) * sizeof(float);
    cr_expect_geq(after_first, before + workspace, "in use %zu, %zu before, workspace %zu",
                  after_first, before, workspace);
    cr_expect_eq(after_second, after_first, "the workspace grew on a repeated shape");
    void *buffers[] = {dx, dout, x, weight, dweight, rstd};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        b->release(buffers[i]);
}

/* ---- events ---- */

Test(cuda_backend, events_around_work_measure_a_non_negative_time)
{
    gpu_require();
    const Backend *b = backend_cuda();
    const size_t n = 1 << 22;
    Activation *y = b->alloc(n * 2), *x = b->alloc(n * 2);
    BackendEvent *start = b->event_create(), *end = b->event_create();
    b->event_record(start);
    b->add_inplace(y, x, n);
    b->event_record(end);
    float milliseconds = b->event_elapsed_ms(start, end);
    cr_expect(isfinite(milliseconds) && milliseconds >= 0.0f, "elapsed %g ms", milliseconds);
    b->event_destroy(start), b->event_destroy(end);
    b->release(y), b->release(x);
}

/* ---- conversions ---- */

/* values whose bf16 rounding is a tie (half way between two bf16 values): to even */
static void put_ties(float *x, size_t n)
{
    static const uint32_t ties[] = {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x40490000u + 0x8000u,
                                    0x3F80C000u /* above half: up */};
    for (size_t i = 0; i < sizeof ties / sizeof ties[0] && i < n; i++)
        memcpy(&x[i % n], &ties[i], sizeof(float));
}

/* dst[offset..] from src[offset..]: offset 1 leaves the 16-byte paths */
static void check_from_floats(size_t n, size_t offset, uint64_t seed)
{
    const Backend *b = backend_cuda();
    float *x = host_values(n + offset, 3, seed);
    put_ties(x + offset, n);
    float *want = rounded_copy(x, n + offset), *got = malloc((n + offset) * sizeof(float));
    float *source = device_floats(x, n + offset);
    Activation *target = device_poisoned((n + offset) * 2);
    b->activations_from_floats(activation_at(b, target, offset), source + offset, n);
    b->activations_download(got, target, n + offset);
    cr_expect_eq(memcmp(got + offset, want + offset, n * sizeof(float)), 0,
                 "n %zu, offset %zu: not the nearest-even rounding", n, offset);
    b->release(source), b->release(target);
    free(x), free(want), free(got);
}

Test(cuda_backend, activations_from_floats_rounds_to_nearest_even)
{
    gpu_require();
    check_from_floats(1, 0, 10);
    check_from_floats(7, 0, 11);
    check_from_floats(1003, 0, 12);
    check_from_floats(1003, 1, 13);
}

Test(cuda_backend, activations_upload_then_download_gives_the_bf16_rounding)
{
    gpu_require();
    const Backend *b = backend_cuda();
    static const size_t lengths[] = {1, 7, 1003};
    for (size_t c = 0; c < 3; c++) {
        size_t n = lengths[c];
        float *x = host_values(n, 3, 20 + c);
        put_ties(x, n);
        float *want = rounded_copy(x, n), *got = malloc(n * sizeof(float));
        Activation *device = b->alloc(n * 2);
        b->activations_upload(device, x, n);
        b->activations_download(got, device, n);
        cr_expect_eq(memcmp(got, want, n * sizeof(float)), 0, "n %zu", n);
        b->release(device);
        free(x), free(want), free(got);
    }
}

/* ---- optimizer ---- */

static const float lr = 0.1f, beta1 = 0.9f, beta2 = 0.95f, adam_eps = 1e-8f, decay = 0.1f;
static const int adam_step = 3;
static const int optimizer_lengths[] = {1, 1003};

static const AdamwScalars adam_scalars = {.lr = lr, .beta1 = beta1, .beta2 = beta2,
                                          .eps = adam_eps, .weight_decay = decay,
                                          .grad_scale = 0.37f, .ema_decay = 0.9f,
                                          .step = adam_step};

static void run_adamw_update(const Backend *b, void *const *p, const OpCase *c)
{
    b->adamw_update(p[0], p[1], p[2], p[3], NULL, (size_t)c->shape[0], &adam_scalars, NULL);
}

static void run_adamw_update_with_ema(const Backend *b, void *const *p, const OpCase *c)
{
    b->adamw_update(p[0], p[1], p[2], p[3], p[4], (size_t)c->shape[0], &adam_scalars, NULL);
}

Test(cuda_backend, adamw_update_with_ema_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        size_t n = (size_t)optimizer_lengths[i];
        OpCase c = op_case("adamw_update with ema", run_adamw_update_with_ema);
        c.shape[0] = optimizer_lengths[i];
        op_updated(&c, "params", n, 1, 0, BACKEND_FP32_TOLERANCE);
        op_input(&c, "grads", ARRAY_FLOAT, n, 1, 0);
        op_updated(&c, "exp_avg", n, 0.1f, 0, BACKEND_FP32_TOLERANCE);
        op_updated(&c, "exp_avg_sq", n, 0.01f, 0.01f, BACKEND_FP32_TOLERANCE); /* >= 0 */
        op_updated(&c, "ema", n, 1, 0, BACKEND_FP32_TOLERANCE);
        op_check(&c, 610 + (uint64_t)i);
    }
}

Test(cuda_backend, adamw_update_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++) {
        size_t n = (size_t)optimizer_lengths[i];
        OpCase c = op_case("adamw_update", run_adamw_update);
        c.shape[0] = optimizer_lengths[i];
        op_updated(&c, "params", n, 1, 0, BACKEND_FP32_TOLERANCE);
        op_input(&c, "grads", ARRAY_FLOAT, n, 1, 0);
        op_updated(&c, "exp_avg", n, 0.1f, 0, BACKEND_FP32_TOLERANCE);
        op_updated(&c, "exp_avg_sq", n, 0.01f, 0.01f, BACKEND_FP32_TOLERANCE); /* >= 0 */
        op_check(&c, 620 + (uint64_t)i);
    }
}

/* One device AdamW step from the host state; returns the new params (and fills `copy`,
 * when not NULL, with the compute copy). */
static float *device_adamw(float *const *state, size_t n, bool with_copy, float *copy)
{
    const Backend *b = backend_cuda();
    float *params = device_floats(state[0], n), *grads = device_floats(state[1], n);
    float *exp_avg = device_floats(state[2], n), *exp_avg_sq = device_floats(state[3], n);
    Activation *compute_copy = with_copy ? device_poisoned(n * 2) : NULL;
    AdamwScalars s = adam_scalars;
    s.grad_scale = 1.0f;
    b->adamw_update(params, grads, exp_avg, exp_avg_sq, NULL, n, &s, compute_copy);
    float *result = malloc(n * sizeof(float));
    b->download(result, params, n * sizeof(float));
    if (with_copy)
        b->activations_download(copy, compute_copy, n);
    b->release(params), b->release(grads), b->release(exp_avg), b->release(exp_avg_sq);
    b->release(compute_copy);
    return result;
}

Test(cuda_backend, adamw_update_writes_the_rounded_new_params_as_the_compute_copy)
{
    gpu_require();
    const size_t n = 1003;
    float *state[4] = {host_values(n, 1, 630), host_values(n, 1, 631), host_values(n, 0.1f, 632),
                       host_values(n, 0.01f, 633)};
    for (size_t i = 0; i < n; i++)
        state[3][i] = fabsf(state[3][i]);
    float *copy = malloc(n * sizeof(float));
    float *plain = device_adamw(state, n, false, NULL);
    float *with_copy = device_adamw(state, n, true, copy);
    float *want = rounded_copy(with_copy, n);
    cr_expect_eq(memcmp(plain, with_copy, n * sizeof(float)), 0,
                 "the compute copy changed the params");
    cr_expect_eq(memcmp(copy, want, n * sizeof(float)), 0,
                 "the compute copy is not the bf16 rounding of the new params");
    for (int k = 0; k < 4; k++)
        free(state[k]);
    free(copy), free(plain), free(with_copy), free(want);
}

/* Each call starts its sum from zero: a second call gives the same, not twice as much. */
Test(cuda_backend, sum_squares_matches_cpu_on_every_call)
{
    gpu_require();
    const Backend *b = backend_cuda();
    static const size_t lengths[] = {7, 100003};
    for (size_t c = 0; c < 2; c++) {
        size_t n = lengths[c];
        float *x = host_values(n, 3, 640 + c);
        float *device = device_floats(x, n);
        double want = backend_cpu()->sum_squares(x, n);
        double first = b->sum_squares(device, n), second = b->sum_squares(device, n);
        cr_expect_leq(fabs(first - want) / want, 1e-12, "n %zu: %.17g, not %.17g", n, first,
                      want);
        cr_expect_eq(memcmp(&first, &second, sizeof first), 0, "n %zu: %.17g then %.17g", n,
                     first, second);
        b->release(device);
        free(x);
    }
}
