/* tests/test_cuda_route.c — the CUDA Route kernels against the cpu reference (DESIGN 2.1;
 * DESIGN 7, "GPU"). The MSAR stream kernels have their own file (test_cuda_stream.c).
 *
 * Every input is drawn fresh and rounded to bf16 first (what the GPU reads); the cpu
 * reference (kernels/cpu/route_cpu.c) runs on the same rounded values in fp32/double.
 * Tolerances, ||gpu - cpu|| / ||cpu||: 1e-2 for bf16 outputs (out, dsources), 1e-3 for
 * fp32 ones (weights, rstd, dquery, dkey_norm, dalpha). Outputs are poisoned with NaN first
 * (gradients, which are added into, start from zero: an unwritten element stays 0 and
 * misses the reference). The backward is fed the cpu forward's weights and rstd, so both
 * backwards see the same inputs. Shapes: N 1, 2, 5, 9, 17, 65; H 1, 2, 4, 8, 16;
 * d 24 (H 8: head_dim 3, element loads; H 4: pairs; H 2: quads), 256 .. 2048 (the
 * warp-a-token kernels), 4096, 8192, and a source 2 bytes off its alignment;
 * tokens 1, 33, 1000 (not multiples of anything); replace and delta forms.
 * Identities checked bit for bit: alpha = 0 returns base; a zero query gives weights
 * 1/N and, over equal sources with N a power of two, the source itself. The backward is
 * bitwise deterministic and adds into its gradients.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/route_cuda.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define FP32_TOLERANCE 1e-3
#define ROUTE_EPS 1e-5f

typedef struct {
    int n_sources, tokens, d, heads;
} RouteShape;

/* Each listed value of N, tokens, d and H appears with several of the others. Rows of
 * d % 256 == 0 up to 2048, with H dividing 32, take the warp-a-token kernels
 * (route_narrow.cuh): d 256 .. 2048, lanes of 1 to 8 vectors, heads of 1 to 32 lanes; the
 * rest take the block-a-token ones, as does a misaligned source (its own test). */
static const RouteShape route_shapes[] = {
    {1, 33, 24, 1},    {2, 1000, 24, 2},  {5, 1, 24, 8},     {9, 33, 24, 8},
    {17, 1000, 24, 2}, {5, 33, 24, 4},    {2, 33, 256, 1},   {5, 1000, 256, 2},
    {9, 1, 256, 8},    {17, 33, 256, 8},  {1, 1000, 256, 8}, {65, 17, 256, 8},
    {9, 1000, 4096, 8}, {17, 33, 4096, 1}, {5, 33, 4096, 2}, {2, 1, 4096, 8},
    {1, 33, 4096, 8},  {9, 33, 4096, 16}, {3, 33, 8192, 8},
    {10, 1000, 1280, 8}, {16, 33, 1280, 8}, {3, 1000, 768, 4}, {4, 33, 512, 32},
    {2, 1000, 2048, 16}, {7, 33, 1536, 1},  {6, 1, 1792, 2},
};
#define ROUTE_SHAPE_COUNT ((int)(sizeof route_shapes / sizeof route_shapes[0]))

/* ---- inputs ---- */

/* One Route problem, on the host (rounded to bf16) and on the device. */
typedef struct {
    RouteShape shape;
    size_t size; /* tokens * d */
    float *sources; /* [N][size] */
    const float *source_rows[CUDA_ROUTE_MAX_SOURCES];
    float *query, *key_norm, *base; /* base: delta form only */
    const bf16 *device_sources[CUDA_ROUTE_MAX_SOURCES];
    bf16 *device_query, *device_key_norm, *device_base;
} RouteInputs;

/* Sources of different scales (different rms statistics); a query of scale 2/sqrt(head_dim)
 * so that scores are O(1) and the softmax is neither flat nor one-hot; key_norm near 1.
 * `misaligned`: source 1 starts 2 bytes into its allocation. */
static RouteInputs route_inputs(RouteShape shape, bool delta, bool misaligned, uint64_t seed)
{
    RouteInputs in;
    memset(&in, 0, sizeof in);
    in.shape = shape;
    in.size = (size_t)shape.tokens * shape.d;
    in.sources = gpu_test_host_floats((size_t)shape.n_sources * in.size);
    for (int n = 0; n < shape.n_sources; n++) {
        float *rows = in.sources + (size_t)n * in.size;
        test_fill_uniform(rows, in.size, 0.5f + 0.4f * (n % 7), seed + 10 + (uint64_t)n);
        gpu_round_to_bf16(rows, in.size);
        in.source_rows[n] = rows;
        in.device_sources[n] = gpu_upload_bf16(rows, in.size);
        if (misaligned && n == 1) {
            float *shifted = gpu_test_host_floats(in.size + 1);
            memcpy(shifted + 1, rows, in.size * sizeof(float));
            in.device_sources[n] = gpu_upload_bf16(shifted, in.size + 1) + 1;
            free(shifted);
        }
    }
    float query_scale = 2.0f / sqrtf((float)(shape.d / shape.heads));
    in.query = gpu_test_rounded_uniform(shape.d, query_scale, 0.0f, seed + 1);
    in.key_norm = gpu_test_rounded_uniform(shape.d, 0.5f, 1.0f, seed + 2);
    in.device_query = gpu_upload_bf16(in.query, shape.d);
    in.device_key_norm = gpu_upload_bf16(in.key_norm, shape.d);
    if (delta) {
        in.base = gpu_test_rounded_uniform(in.size, 0.3f, 0.0f, seed + 3);
        in.device_base = gpu_upload_bf16(in.base, in.size);
    }
    return in;
}

static void route_inputs_free(RouteInputs *in)
{
    free(in->sources);
    free(in->query);
    free(in->key_norm);
    free(in->base);
    gpu_free_all();
}

static void expect_close(const float *got, const float *expected, size_t n, double tolerance,
                         const char *what, RouteShape shape)
{
    /* Where the exact gradient is zero (one source: the softmax has nothing to trade), the
     * GPU's answer is rounding noise: hold it to an RMS of 1e-4 instead of a ratio to 0. */
    double reference_squares = 0, got_squares = 0;
    for (size_t i = 0; i < n; i++) {
        reference_squares += (double)expected[i] * expected[i];
        got_squares += (double)got[i] * got[i];
    }
    if (reference_squares == 0) {
        double rms = sqrt(got_squares / (double)n);
        cr_assert(rms <= 1e-4, "%s (N %d, tokens %d, d %d, H %d): exact value 0, got RMS %.3g",
                  what, shape.n_sources, shape.tokens, shape.d, shape.heads, rms);
        return;
    }
    double error = test_relative_error(got, expected, n);
    cr_assert_leq(error, tolerance, "%s (N %d, tokens %d, d %d, H %d): relative error %.3g",
                  what, shape.n_sources, shape.tokens, shape.d, shape.heads, error);
}

/* ---- forward ---- */

static void check_forward(RouteShape shape, bool delta, bool misaligned, uint64_t seed)
{
    RouteInputs in = route_inputs(shape, delta, misaligned, seed);
    const int N = shape.n_sources;
    const size_t n_weights = (size_t)N * shape.tokens * shape.heads;
    const size_t n_rstd = (size_t)N * shape.tokens;
    const float alpha = delta ? 1.5f : 0.0f;

    float *out_ref = gpu_test_host_floats(in.size), *weights_ref = gpu_test_host_floats(n_weights);
    float *rstd_ref = gpu_test_host_floats(n_rstd);
    cpu_route_forward(out_ref, weights_ref, rstd_ref, in.source_rows, N, in.query, in.key_norm,
                      in.base, alpha, shape.tokens, shape.d, shape.heads, ROUTE_EPS);

    bf16 *out = gpu_poisoned_bf16(in.size);
    float *weights = gpu_poisoned_floats(n_weights), *rstd = gpu_poisoned_floats(n_rstd);
    cuda_route_forward(out, weights, rstd, in.device_sources, N, in.device_query,
                       in.device_key_norm, in.device_base,
                       delta ? gpu_upload_floats(&alpha, 1) : NULL, shape.tokens, shape.d,
                       shape.heads, ROUTE_EPS, 0);
    float *out_got = gpu_download_bf16(out, in.size);
    float *weights_got = gpu_download_floats(weights, n_weights);
    float *rstd_got = gpu_download_floats(rstd, n_rstd);

    expect_close(out_got, out_ref, in.size, BF16_TOLERANCE, "out", shape);
    expect_close(weights_got, weights_ref, n_weights, FP32_TOLERANCE, "weights", shape);
    expect_close(rstd_got, rstd_ref, n_rstd, FP32_TOLERANCE, "rstd", shape);

    free(out_ref);
    free(weights_ref);
    free(rstd_ref);
    free(out_got);
    free(weights_got);
    free(rstd_got);
    route_inputs_free(&in);
}

Test(cuda_route, forward_matches_cpu_in_the_replace_form)
{
    gpu_require();
    for (int i = 0; i < ROUTE_SHAPE_COUNT; i++)
        check_forward(route_shapes[i], false, false, 1000 + 100 * (uint64_t)i);
}

Test(cuda_route, forward_matches_cpu_in_the_delta_form)
{
    gpu_require();
    for (int i = 0; i < ROUTE_SHAPE_COUNT; i++)
        check_forward(route_shapes[i], true, false, 5000 + 100 * (uint64_t)i);
}

Test(cuda_route, delta_form_with_zero_gate_returns_the_base_bit_for_bit)
{
    gpu_require();
    RouteShape shape = {5, 33, 256, 8};
    RouteInputs in = route_inputs(shape, true, false, 77);
    bf16 *out = gpu_poisoned_bf16(in.size);
    float *weights = gpu_poisoned_floats((size_t)5 * 33 * 8), *rstd = gpu_poisoned_floats(5 * 33);
    const float zero = 0.0f;
    cuda_route_forward(out, weights, rstd, in.device_sources, 5, in.device_query,
                       in.device_key_norm, in.device_base, gpu_upload_floats(&zero, 1),
                       shape.tokens, shape.d, shape.heads, ROUTE_EPS, 0);
    float *got = gpu_download_bf16(out, in.size);
    cr_assert_eq(memcmp(got, in.base, in.size * sizeof(float)), 0, "out differs from base");
    free(got);
    route_inputs_free(&in);
}

static void check_output_over_base(RouteShape shape, uint64_t seed)
{
    const int N = shape.n_sources;
    RouteInputs in = route_inputs(shape, true, false, seed);
    const size_t n_weights = (size_t)N * shape.tokens * shape.heads;
    const size_t n_rstd = (size_t)N * shape.tokens;
    float *out_ref = gpu_test_host_floats(in.size);
    float *weights_ref = gpu_test_host_floats(n_weights), *rstd_ref = gpu_test_host_floats(n_rstd);
    cpu_route_forward(out_ref, weights_ref, rstd_ref, in.source_rows, N, in.query, in.key_norm,
                      in.base, 0.8f, shape.tokens, shape.d, shape.heads, ROUTE_EPS);
    float *weights = gpu_poisoned_floats(n_weights), *rstd = gpu_poisoned_floats(n_rstd);
    const float alpha = 0.8f;
    cuda_route_forward(in.device_base, weights, rstd, in.device_sources, N, in.device_query,
                       in.device_key_norm, in.device_base, gpu_upload_floats(&alpha, 1),
                       shape.tokens, shape.d, shape.heads, ROUTE_EPS, 0);
    float *got = gpu_download_bf16(in.device_base, in.size);
    expect_close(got, out_ref, in.size, BF16_TOLERANCE, "out written over base", shape);
    free(got);
    free(out_ref);
    free(weights_ref);
    free(rstd_ref);
    route_inputs_free(&in);
}

Test(cuda_route, delta_form_may_write_its_output_over_the_base)
{
    gpu_require();
    check_output_over_base((RouteShape){9, 33, 4096, 8}, 91);  /* block a token */
    check_output_over_base((RouteShape){9, 33, 1280, 8}, 92);  /* warp a token */
}

Test(cuda_route, zero_query_over_equal_sources_gives_weights_one_over_n_and_the_source)
{
    gpu_require();
    enum { N = 4, TOKENS = 33, D = 256, H = 2 };
    float *source = gpu_test_rounded_uniform((size_t)TOKENS * D, 1.0f, 0.0f, 123);
    float *zeros = gpu_test_host_floats(D), *ones = gpu_test_host_floats(D);
    for (int c = 0; c < D; c++)
        ones[c] = 1.0f;
    const bf16 *sources[N];
    bf16 *device_source = gpu_upload_bf16(source, (size_t)TOKENS * D);
    for (int n = 0; n < N; n++)
        sources[n] = device_source;
    bf16 *out = gpu_poisoned_bf16((size_t)TOKENS * D);
    float *weights = gpu_poisoned_floats(N * TOKENS * H), *rstd = gpu_poisoned_floats(N * TOKENS);
    cuda_route_forward(out, weights, rstd, sources, N, gpu_upload_bf16(zeros, D),
                       gpu_upload_bf16(ones, D), NULL, NULL, TOKENS, D, H, ROUTE_EPS, 0);
    float *out_got = gpu_download_bf16(out, (size_t)TOKENS * D);
    float *weights_got = gpu_download_floats(weights, N * TOKENS * H);
    for (int i = 0; i < N * TOKENS * H; i++)
        cr_assert_eq(weights_got[i], 1.0f / N, "weight %d is %.9g", i, weights_got[i]);
    cr_assert_eq(memcmp(out_got, source, (size_t)TOKENS * D * sizeof(float)), 0,
                 "the mix of equal sources is not the source");
    free(source);
    free(zeros);
    free(ones);
    free(out_got);
    free(weights_got);
    gpu_free_all();
}

/* ---- backward ---- */

/* Host copies of the gradients of one or more cuda_route_backward calls. */
typedef struct {
    float *dsources; /* [N][size] */
    float *dquery, *dkey_norm;
    float dalpha;
} RouteGrads;

static void route_grads_free(RouteGrads *grads)
{
    free(grads->dsources);
    free(grads->dquery);
    free(grads->dkey_norm);
}

/* Calls cuda_route_backward `calls` times into fresh zeroed gradients and brings them back.
 * Sources listed in `skip` (may be NULL) get no gradient buffer (NULL) and come back zero. */
static RouteGrads gpu_route_backward(const RouteInputs *in, const float *dout,
                                     const float *weights, const float *rstd, bool delta,
                                     float alpha, const bool *skip, int calls)
{
    const RouteShape shape = in->shape;
    const int N = shape.n_sources;
    float *zeros = gpu_test_host_floats(in->size > (size_t)shape.d ? in->size : (size_t)shape.d);
    bf16 *dsources[CUDA_ROUTE_MAX_SOURCES];
    for (int n = 0; n < N; n++)
        dsources[n] = skip && skip[n] ? NULL : gpu_upload_bf16(zeros, in->size);
    float *dquery = gpu_upload_floats(zeros, shape.d);
    float *dkey_norm = gpu_upload_floats(zeros, shape.d);
    float *dalpha = gpu_upload_floats(zeros, 1);
    float *workspace =
        gpu_poisoned_floats(cuda_route_backward_workspace_floats(shape.tokens, shape.d));
    bf16 *device_dout = gpu_upload_bf16(dout, in->size);
    float *device_weights = gpu_upload_floats(weights, (size_t)N * shape.tokens * shape.heads);
    float *device_rstd = gpu_upload_floats(rstd, (size_t)N * shape.tokens);
    const float *device_alpha = delta ? gpu_upload_floats(&alpha, 1) : NULL;
    for (int call = 0; call < calls; call++)
        cuda_route_backward(dsources, dquery, dkey_norm, dalpha, device_dout,
                            in->device_sources, N, device_weights, device_rstd,
                            in->device_query, in->device_key_norm, device_alpha, workspace,
                            shape.tokens, shape.d, shape.heads, 0);

    RouteGrads grads;
    grads.dsources = gpu_test_host_floats((size_t)N * in->size);
    for (int n = 0; n < N; n++) {
        if (!dsources[n])
            continue;
        float *got = gpu_download_bf16(dsources[n], in->size);
        memcpy(grads.dsources + (size_t)n * in->size, got, in->size * sizeof(float));
        free(got);
    }
    grads.dquery = gpu_download_floats(dquery, shape.d);
    grads.dkey_norm = gpu_download_floats(dkey_norm, shape.d);
    float *got_alpha = gpu_download_floats(dalpha, 1);
    grads.dalpha = got_alpha[0];
    free(got_alpha);
    free(zeros);
    return grads;
}

/* The cpu forward's weights and rstd, a random dout, and the cpu backward from zero. */
typedef struct {
    float *weights, *rstd, *dout;
    RouteGrads grads;
} RouteReference;

static RouteReference route_reference(const RouteInputs *in, bool delta, float alpha,
                                      const bool *skip, uint64_t seed)
{
    const RouteShape shape = in->shape;
    const int N = shape.n_sources;
    RouteReference ref;
    float *out = gpu_test_host_floats(in->size);
    ref.weights = gpu_test_host_floats((size_t)N * shape.tokens * shape.heads);
    ref.rstd = gpu_test_host_floats((size_t)N * shape.tokens);
    cpu_route_forward(out, ref.weights, ref.rstd, in->source_rows, N, in->query, in->key_norm,
                      in->base, alpha, shape.tokens, shape.d, shape.heads, ROUTE_EPS);
    free(out);
    ref.dout = gpu_test_rounded_uniform(in->size, 1.0f, 0.0f, seed);

    ref.grads.dsources = gpu_test_host_floats((size_t)N * in->size);
    ref.grads.dquery = gpu_test_host_floats(shape.d);
    ref.grads.dkey_norm = gpu_test_host_floats(shape.d);
    ref.grads.dalpha = 0.0f;
    float *dsources[CUDA_ROUTE_MAX_SOURCES];
    for (int n = 0; n < N; n++)
        dsources[n] = skip && skip[n] ? NULL : ref.grads.dsources + (size_t)n * in->size;
    float *scratch = gpu_test_host_floats((size_t)N * shape.tokens * shape.heads);
    cpu_route_backward(dsources, ref.grads.dquery, ref.grads.dkey_norm, &ref.grads.dalpha,
                       ref.dout, in->source_rows, N, ref.weights, ref.rstd, in->query,
                       in->key_norm, delta, alpha, scratch, shape.tokens, shape.d, shape.heads);
    free(scratch);
    return ref;
}

static void route_reference_free(RouteReference *ref)
{
    free(ref->weights);
    free(ref->rstd);
    free(ref->dout);
    route_grads_free(&ref->grads);
}

static void expect_grads_close(const RouteGrads *got, const RouteGrads *ref, size_t size,
                               bool delta, RouteShape shape)
{
    expect_close(got->dsources, ref->dsources, (size_t)shape.n_sources * size, BF16_TOLERANCE,
                 "dsources", shape);
    expect_close(got->dquery, ref->dquery, shape.d, FP32_TOLERANCE, "dquery", shape);
    expect_close(got->dkey_norm, ref->dkey_norm, shape.d, FP32_TOLERANCE, "dkey_norm", shape);
    if (delta)
        expect_close(&got->dalpha, &ref->dalpha, 1, FP32_TOLERANCE, "dalpha", shape);
    else
        cr_assert_eq(got->dalpha, 0.0f, "the replace form wrote dalpha");
}

static void check_backward(RouteShape shape, bool delta, bool misaligned, uint64_t seed)
{
    const float alpha = delta ? 0.7f : 0.0f;
    RouteInputs in = route_inputs(shape, delta, misaligned, seed);
    RouteReference ref = route_reference(&in, delta, alpha, NULL, seed + 50);
    RouteGrads got = gpu_route_backward(&in, ref.dout, ref.weights, ref.rstd, delta, alpha,
                                        NULL, 1);
    expect_grads_close(&got, &ref.grads, in.size, delta, shape);
    route_grads_free(&got);
    route_reference_free(&ref);
    route_inputs_free(&in);
}

Test(cuda_route, backward_matches_cpu_in_the_replace_form)
{
    gpu_require();
    for (int i = 0; i < ROUTE_SHAPE_COUNT; i++)
        check_backward(route_shapes[i], false, false, 9000 + 100 * (uint64_t)i);
}

Test(cuda_route, backward_matches_cpu_in_the_delta_form)
{
    gpu_require();
    for (int i = 0; i < ROUTE_SHAPE_COUNT; i++)
        check_backward(route_shapes[i], true, false, 13000 + 100 * (uint64_t)i);
}

Test(cuda_route, a_misaligned_source_takes_the_general_kernels)
{
    gpu_require();
    /* a warp-a-token shape, but a source 2 bytes off: 2-byte loads, a block a token */
    const RouteShape shape = {5, 33, 1280, 8};
    for (int delta = 0; delta < 2; delta++) {
        check_forward(shape, delta, true, 17000 + 100 * (uint64_t)delta);
        check_backward(shape, delta, true, 17500 + 100 * (uint64_t)delta);
    }
}

Test(cuda_route, backward_skips_a_source_whose_gradient_is_null)
{
    gpu_require();
    /* d 256: a warp a token; d 24: a block a token */
    const RouteShape shapes[] = {{5, 33, 256, 8}, {5, 33, 24, 8}};
    bool skip[5] = {false, true, false, false, true};
    for (int i = 0; i < 2; i++) {
        RouteInputs in = route_inputs(shapes[i], true, false, 321);
        RouteReference ref = route_reference(&in, true, 0.6f, skip, 322);
        RouteGrads got =
            gpu_route_backward(&in, ref.dout, ref.weights, ref.rstd, true, 0.6f, skip, 1);
        expect_grads_close(&got, &ref.grads, in.size, true, shapes[i]);
        route_grads_free(&got);
        route_reference_free(&ref);
        route_inputs_free(&in);
    }
}

Test(cuda_route, backward_adds_into_its_gradients)
{
    gpu_require();
    RouteShape shape = {5, 1000, 256, 2};
    RouteInputs in = route_inputs(shape, true, false, 555);
    RouteReference ref = route_reference(&in, true, 0.9f, NULL, 556);
    RouteGrads once = gpu_route_backward(&in, ref.dout, ref.weights, ref.rstd, true, 0.9f, NULL, 1);
    RouteGrads twice =
        gpu_route_backward(&in, ref.dout, ref.weights, ref.rstd, true, 0.9f, NULL, 2);
    RouteGrads doubled = once;
    size_t all = (size_t)shape.n_sources * in.size;
    doubled.dsources = gpu_test_host_floats(all);
    doubled.dquery = gpu_test_host_floats(shape.d);
    doubled.dkey_norm = gpu_test_host_floats(shape.d);
    for (size_t i = 0; i < all; i++)
        doubled.dsources[i] = 2.0f * once.dsources[i];
    for (int c = 0; c < shape.d; c++) {
        doubled.dquery[c] = 2.0f * once.dquery[c];
        doubled.dkey_norm[c] = 2.0f * once.dkey_norm[c];
    }
    doubled.dalpha = 2.0f * once.dalpha;
    expect_grads_close(&twice, &doubled, in.size, true, shape);
    route_grads_free(&once);
    route_grads_free(&twice);
    route_grads_free(&doubled);
    route_reference_free(&ref);
    route_inputs_free(&in);
}

Test(cuda_route, backward_is_bitwise_deterministic)
{
    gpu_require();
    const RouteShape shapes[] = {
        {9, 1000, 4096, 8}, {17, 1000, 24, 2}, {5, 33, 24, 8}, {10, 1000, 1280, 8}};
    for (int i = 0; i < 4; i++) {
        RouteShape shape = shapes[i];
        RouteInputs in = route_inputs(shape, true, false, 777 + (uint64_t)i);
        RouteReference ref = route_reference(&in, true, 0.5f, NULL, 778 + (uint64_t)i);
        RouteGrads first =
            gpu_route_backward(&in, ref.dout, ref.weights, ref.rstd, true, 0.5f, NULL, 1);
        RouteGrads second =
            gpu_route_backward(&in, ref.dout, ref.weights, ref.rstd, true, 0.5f, NULL, 1);
        size_t all = (size_t)shape.n_sources * in.size;
        cr_assert_eq(memcmp(first.dsources, second.dsources, all * sizeof(float)), 0,
                     "dsources differ between runs (N %d, d %d)", shape.n_sources, shape.d);
        cr_assert_eq(memcmp(first.dquery, second.dquery, shape.d * sizeof(float)), 0,
                     "dquery differs between runs (N %d, d %d)", shape.n_sources, shape.d);
        cr_assert_eq(memcmp(first.dkey_norm, second.dkey_norm, shape.d * sizeof(float)), 0,
                     "dkey_norm differs between runs (N %d, d %d)", shape.n_sources, shape.d);
        cr_assert_eq(memcmp(&first.dalpha, &second.dalpha, sizeof(float)), 0,
                     "dalpha differs between runs (N %d, d %d)", shape.n_sources, shape.d);
        route_grads_free(&first);
        route_grads_free(&second);
        route_reference_free(&ref);
        route_inputs_free(&in);
    }
}
