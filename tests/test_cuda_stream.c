/* tests/test_cuda_stream.c — the CUDA MSAR stream kernels (convolution and mix) against the
 * cpu reference (DESIGN 2.2; DESIGN 7, "GPU"). Same rules as test_cuda_route.c: fresh
 * inputs rounded to bf16, the cpu reference (kernels/cpu/stream_cpu.c) on the same values,
 * 1e-2 for bf16 outputs, 1e-3 for fp32 ones, outputs poisoned (gradients start at zero),
 * shapes that are not multiples of anything, bitwise determinism of every backward.
 * Identities checked bit for bit: identity taps return x; the mix at init (theta 0,
 * beta = -ln(m-1)) of m equal streams gives gates 1/m and the stream itself.
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
#define MIX_EPS 1e-5f

static void expect_close(const float *got, const float *expected, size_t n, double tolerance,
                         const char *what, const int *shape)
{
    double error = test_relative_error(got, expected, n);
    cr_assert_leq(error, tolerance, "%s (shape %d, %d, %d, %d): relative error %.3g", what,
                  shape[0], shape[1], shape[2], shape[3], error);
}

/* ---- convolution: shapes {B, T, d, kernel_size} ---- */

/* runs of 16 rows cut short by T; T below k; d 6 and 5 (vectors of 2 and 1 channels); the
 * 1B width with a kernel of 3 (the 4-tap kernels); ranges of the dtaps sums across sequences */
static const int conv_shapes[][4] = {
    {2, 33, 24, 1}, {1, 1000, 256, 4}, {3, 17, 4096, 8}, {1, 5, 24, 8}, {2, 33, 4096, 2},
    {1, 1, 256, 4}, {2, 100, 24, 7}, {1, 300, 1280, 3}, {3, 7, 6, 8}, {2, 9, 5, 2},
};
#define CONV_SHAPE_COUNT ((int)(sizeof conv_shapes / sizeof conv_shapes[0]))

Test(cuda_stream, conv_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < CONV_SHAPE_COUNT; i++) {
        const int *shape = conv_shapes[i];
        const int B = shape[0], T = shape[1], d = shape[2], k = shape[3];
        const size_t size = (size_t)B * T * d;
        float *x = gpu_test_rounded_uniform(size, 1.0f, 0.0f, 100 + (uint64_t)i);
        float *taps = gpu_test_rounded_uniform((size_t)k * d, 0.8f, 0.0f, 200 + (uint64_t)i);
        float *ref = gpu_test_host_floats(size);
        cpu_stream_conv_forward(ref, x, taps, k, B, T, d);
        bf16 *out = gpu_poisoned_bf16(size);
        cuda_stream_conv_forward(out, gpu_upload_bf16(x, size), gpu_upload_bf16(taps, (size_t)k * d),
                                 k, B, T, d, 0);
        float *got = gpu_download_bf16(out, size);
        expect_close(got, ref, size, BF16_TOLERANCE, "conv out", shape);
        free(x);
        free(taps);
        free(ref);
        free(got);
        gpu_free_all();
    }
}

Test(cuda_stream, conv_with_identity_taps_returns_the_input_bit_for_bit)
{
    gpu_require();
    enum { B = 2, T = 33, D = 256, K = 8 };
    const size_t size = (size_t)B * T * D;
    float *x = gpu_test_rounded_uniform(size, 3.0f, 0.0f, 42);
    float *taps = gpu_test_host_floats((size_t)K * D);
    for (int c = 0; c < D; c++)
        taps[c] = 1.0f;
    bf16 *out = gpu_poisoned_bf16(size);
    cuda_stream_conv_forward(out, gpu_upload_bf16(x, size), gpu_upload_bf16(taps, (size_t)K * D), K,
                             B, T, D, 0);
    float *got = gpu_download_bf16(out, size);
    cr_assert_eq(memcmp(got, x, size * sizeof(float)), 0, "identity taps changed the input");
    free(x);
    free(taps);
    free(got);
    gpu_free_all();
}

/* runs cuda_stream_conv_backward once into zeroed dx (unless without_dx) and dtaps */
static void gpu_conv_backward(float **dx_got, float **dtaps_got, const float *dout,
                              const float *x, const float *taps, const int *shape,
                              bool without_dx)
{
    const int B = shape[0], T = shape[1], d = shape[2], k = shape[3];
    const size_t size = (size_t)B * T * d;
    float *zeros = gpu_test_host_floats(size > (size_t)k * d ? size : (size_t)k * d);
    bf16 *dx = without_dx ? NULL : gpu_upload_bf16(zeros, size);
    float *dtaps = gpu_upload_floats(zeros, (size_t)k * d);
    float *workspace = gpu_poisoned_floats(cuda_stream_conv_backward_workspace_floats(k, B, T, d));
    cuda_stream_conv_backward(dx, dtaps, gpu_upload_bf16(dout, size), gpu_upload_bf16(x, size),
                              gpu_upload_bf16(taps, (size_t)k * d), k, B, T, d, workspace, 0);
    *dx_got = dx ? gpu_download_bf16(dx, size) : NULL;
    *dtaps_got = gpu_download_floats(dtaps, (size_t)k * d);
    free(zeros);
}

Test(cuda_stream, conv_backward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < CONV_SHAPE_COUNT; i++) {
        const int *shape = conv_shapes[i];
        const int B = shape[0], T = shape[1], d = shape[2], k = shape[3];
        const size_t size = (size_t)B * T * d;
        float *x = gpu_test_rounded_uniform(size, 1.0f, 0.0f, 300 + (uint64_t)i);
        float *taps = gpu_test_rounded_uniform((size_t)k * d, 0.8f, 0.0f, 400 + (uint64_t)i);
        float *dout = gpu_test_rounded_uniform(size, 1.0f, 0.0f, 500 + (uint64_t)i);
        float *dx_ref = gpu_test_host_floats(size), *dtaps_ref = gpu_test_host_floats((size_t)k * d);
        cpu_stream_conv_backward(dx_ref, dtaps_ref, dout, x, taps, k, B, T, d);
        float *dx_got, *dtaps_got;
        gpu_conv_backward(&dx_got, &dtaps_got, dout, x, taps, shape, i % 2 == 1);
        if (dx_got)
            expect_close(dx_got, dx_ref, size, BF16_TOLERANCE, "conv dx", shape);
        expect_close(dtaps_got, dtaps_ref, (size_t)k * d, FP32_TOLERANCE, "conv dtaps", shape);
        free(x);
        free(taps);
        free(dout);
        free(dx_ref);
        free(dtaps_ref);
        free(dx_got);
        free(dtaps_got);
        gpu_free_all();
    }
}

Test(cuda_stream, conv_backward_is_bitwise_deterministic)
{
    gpu_require();
    const int shape[4] = {2, 1000, 4096, 8};
    const size_t size = (size_t)2 * 1000 * 4096;
    float *x = gpu_test_rounded_uniform(size, 1.0f, 0.0f, 61), *dout = gpu_test_rounded_uniform(size, 1.0f, 0.0f, 62);
    float *taps = gpu_test_rounded_uniform((size_t)8 * 4096, 0.8f, 0.0f, 63);
    float *dx_first, *dtaps_first, *dx_second, *dtaps_second;
    gpu_conv_backward(&dx_first, &dtaps_first, dout, x, taps, shape, false);
    gpu_conv_backward(&dx_second, &dtaps_second, dout, x, taps, shape, false);
    cr_assert_eq(memcmp(dx_first, dx_second, size * sizeof(float)), 0, "dx differs");
    cr_assert_eq(memcmp(dtaps_first, dtaps_second, (size_t)8 * 4096 * sizeof(float)), 0,
                 "dtaps differs");
    free(x);
    free(dout);
    free(taps);
    free(dx_first);
    free(dtaps_first);
    free(dx_second);
    free(dtaps_second);
    gpu_free_all();
}

/* ---- mix: shapes {m, tokens, d, unused} ---- */

static const int mix_shapes[][4] = {
    {2, 33, 24, 0}, {4, 1000, 256, 0}, {3, 1, 4096, 0}, {4, 33, 4096, 0}, {3, 1000, 24, 0},
    {2, 33, 8192, 0},
};
#define MIX_SHAPE_COUNT ((int)(sizeof mix_shapes / sizeof mix_shapes[0]))

/* m streams of different scales, theta small enough for gates away from 0 and 1 */
typedef struct {
    int m, tokens, d;
    size_t size;
    float *streams, *mix_bias, *mix_proj;
    const float *stream_rows[CUDA_STREAM_MAX_STREAMS];
    const bf16 *device_streams[CUDA_STREAM_MAX_STREAMS];
} MixInputs;

static MixInputs mix_inputs(const int *shape, uint64_t seed)
{
    MixInputs in;
    in.m = shape[0];
    in.tokens = shape[1];
    in.d = shape[2];
    in.size = (size_t)in.tokens * in.d;
    in.streams = gpu_test_host_floats((size_t)in.m * in.size);
    for (int r = 0; r < in.m; r++) {
        float *rows = in.streams + (size_t)r * in.size;
        test_fill_uniform(rows, in.size, 0.5f + 0.5f * r, seed + (uint64_t)r);
        gpu_round_to_bf16(rows, in.size);
        in.stream_rows[r] = rows;
        in.device_streams[r] = gpu_upload_bf16(rows, in.size);
    }
    in.mix_bias = gpu_test_host_floats(in.m);
    test_fill_uniform(in.mix_bias, in.m, 1.0f, seed + 20);
    in.mix_proj = gpu_test_rounded_uniform((size_t)in.m * in.d, 2.0f / sqrtf((float)in.d), 0.0f, seed + 21);
    return in;
}

static void mix_inputs_free(MixInputs *in)
{
    free(in->streams);
    free(in->mix_bias);
    free(in->mix_proj);
    gpu_free_all();
}

Test(cuda_stream, mix_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < MIX_SHAPE_COUNT; i++) {
        MixInputs in = mix_inputs(mix_shapes[i], 700 + 10 * (uint64_t)i);
        const size_t n_gates = (size_t)in.tokens * in.m;
        float *out_ref = gpu_test_host_floats(in.size), *gates_ref = gpu_test_host_floats(n_gates);
        float *rstd_ref = gpu_test_host_floats(n_gates);
        cpu_stream_mix_forward(out_ref, gates_ref, rstd_ref, in.stream_rows, in.m, in.mix_bias,
                               in.mix_proj, in.tokens, in.d, MIX_EPS);
        bf16 *out = gpu_poisoned_bf16(in.size);
        float *gates = gpu_poisoned_floats(n_gates), *rstd = gpu_poisoned_floats(n_gates);
        cuda_stream_mix_forward(out, gates, rstd, in.device_streams, in.m,
                                gpu_upload_floats(in.mix_bias, in.m),
                                gpu_upload_bf16(in.mix_proj, (size_t)in.m * in.d), in.tokens,
                                in.d, MIX_EPS, 0);
        float *out_got = gpu_download_bf16(out, in.size);
        float *gates_got = gpu_download_floats(gates, n_gates);
        float *rstd_got = gpu_download_floats(rstd, n_gates);
        expect_close(out_got, out_ref, in.size, BF16_TOLERANCE, "mix out", mix_shapes[i]);
        expect_close(gates_got, gates_ref, n_gates, FP32_TOLERANCE, "mix gates", mix_shapes[i]);
        expect_close(rstd_got, rstd_ref, n_gates, FP32_TOLERANCE, "mix rstd", mix_shapes[i]);
        free(out_ref);
        free(gates_ref);
        free(rstd_ref);
        free(out_got);
        free(gates_got);
        free(rstd_got);
        mix_inputs_free(&in);
    }
}

Test(cuda_stream, mix_at_init_of_equal_streams_gives_one_over_m_and_the_stream)
{
    gpu_require();
    enum { M = 4, TOKENS = 33, D = 256 };
    float *stream_rows = gpu_test_rounded_uniform((size_t)TOKENS * D, 2.0f, 0.0f, 99);
    float bias[M], *theta = gpu_test_host_floats((size_t)M * D);
    for (int r = 0; r < M; r++)
        bias[r] = (float)-log(M - 1.0);
    const bf16 *streams[M];
    bf16 *device_stream = gpu_upload_bf16(stream_rows, (size_t)TOKENS * D);
    for (int r = 0; r < M; r++)
        streams[r] = device_stream;
    bf16 *out = gpu_poisoned_bf16((size_t)TOKENS * D);
    float *gates = gpu_poisoned_floats(TOKENS * M), *rstd = gpu_poisoned_floats(TOKENS * M);
    cuda_stream_mix_forward(out, gates, rstd, streams, M, gpu_upload_floats(bias, M),
                            gpu_upload_bf16(theta, (size_t)M * D), TOKENS, D, MIX_EPS, 0);
    float *out_got = gpu_download_bf16(out, (size_t)TOKENS * D);
    float *gates_got = gpu_download_floats(gates, TOKENS * M);
    for (int i = 0; i < TOKENS * M; i++)
        cr_assert_eq(gates_got[i], 1.0f / M, "gate %d is %.9g", i, gates_got[i]);
    cr_assert_eq(memcmp(out_got, stream_rows, (size_t)TOKENS * D * sizeof(float)), 0,
                 "the mix of equal streams at init is not the stream");
    free(stream_rows);
    free(theta);
    free(out_got);
    free(gates_got);
    gpu_free_all();
}

/* Host copies of one cuda_stream_mix_backward into zeroed gradients (dalpha from 0). */
typedef struct {
    float *dstreams, *dmix_bias, *dmix_proj, dalpha;
} MixGrads;

/* How the backward is called: `alpha` the gate (NULL: none), the streams one at a time,
 * dstreams written over poison (GRAD_WRITE) or added into zeros (GRAD_ADD). */
typedef struct {
    const float *alpha;
    bool one_at_a_time;
    GradMode mode;
} MixCall;

static const MixCall plain_call = {NULL, false, GRAD_ADD};

static MixGrads gpu_mix_backward_as(const MixInputs *in, const float *dout, const float *gates,
                                    const float *rstd, MixCall call)
{
    const size_t n_gates = (size_t)in->tokens * in->m, n_proj = (size_t)in->m * in->d;
    float *zeros = gpu_test_host_floats(in->size > n_proj ? in->size : n_proj);
    bf16 *dstreams[CUDA_STREAM_MAX_STREAMS];
    for (int r = 0; r < in->m; r++)
        dstreams[r] = call.mode == GRAD_WRITE ? gpu_poisoned_bf16(in->size)
                                              : gpu_upload_bf16(zeros, in->size);
    float *dmix_bias = gpu_upload_floats(zeros, in->m);
    float *dmix_proj = gpu_upload_floats(zeros, n_proj), *dalpha = gpu_upload_floats(zeros, 1);
    const float *alpha = call.alpha ? gpu_upload_floats(call.alpha, 1) : NULL;
    float *workspace =
        gpu_poisoned_floats(cuda_stream_mix_backward_workspace_floats(in->m, in->tokens, in->d));
    const bf16 *device_dout = gpu_upload_bf16(dout, in->size);
    const float *device_gates = gpu_upload_floats(gates, n_gates);
    const float *device_rstd = gpu_upload_floats(rstd, n_gates);
    const float *device_bias = gpu_upload_floats(in->mix_bias, in->m);
    const bf16 *device_proj = gpu_upload_bf16(in->mix_proj, n_proj);
    const bf16 *given[CUDA_STREAM_MAX_STREAMS];
    for (int pass = 0; pass < (call.one_at_a_time ? in->m : 1); pass++) {
        for (int r = 0; r < in->m; r++)
            given[r] = !call.one_at_a_time || r == pass ? in->device_streams[r] : NULL;
        cuda_stream_mix_backward(dstreams, call.mode, dmix_bias, dmix_proj, dalpha, device_dout,
                                 given, in->m, device_gates, device_rstd, device_bias,
                                 device_proj, alpha, in->tokens, in->d, workspace, 0);
    }
    MixGrads grads;
    grads.dstreams = gpu_test_host_floats((size_t)in->m * in->size);
    for (int r = 0; r < in->m; r++) {
        float *got = gpu_download_bf16(dstreams[r], in->size);
        memcpy(grads.dstreams + (size_t)r * in->size, got, in->size * sizeof(float));
        free(got);
    }
    grads.dmix_bias = gpu_download_floats(dmix_bias, in->m);
    grads.dmix_proj = gpu_download_floats(dmix_proj, n_proj);
    float *dalpha_got = gpu_download_floats(dalpha, 1);
    grads.dalpha = dalpha_got[0];
    free(dalpha_got);
    free(zeros);
    return grads;
}

static MixGrads gpu_mix_backward(const MixInputs *in, const float *dout, const float *gates,
                                 const float *rstd)
{
    return gpu_mix_backward_as(in, dout, gates, rstd, plain_call);
}

static void mix_grads_free(MixGrads *grads)
{
    free(grads->dstreams);
    free(grads->dmix_bias);
    free(grads->dmix_proj);
}

/* the cpu forward (for gates and rstd) and backward from zero, with a random dout, the gate
 * `alpha` (NULL: none), all streams at once */
static MixGrads mix_reference_gated(const MixInputs *in, float **dout, float **gates,
                                    float **rstd, const float *alpha, uint64_t seed)
{
    const size_t n_gates = (size_t)in->tokens * in->m, n_proj = (size_t)in->m * in->d;
    float *out = gpu_test_host_floats(in->size);
    *gates = gpu_test_host_floats(n_gates);
    *rstd = gpu_test_host_floats(n_gates);
    cpu_stream_mix_forward(out, *gates, *rstd, in->stream_rows, in->m, in->mix_bias,
                           in->mix_proj, in->tokens, in->d, MIX_EPS);
    free(out);
    *dout = gpu_test_rounded_uniform(in->size, 1.0f, 0.0f, seed);
    MixGrads ref;
    ref.dstreams = gpu_test_host_floats((size_t)in->m * in->size);
    ref.dmix_bias = gpu_test_host_floats(in->m);
    ref.dmix_proj = gpu_test_host_floats(n_proj);
    ref.dalpha = 0.0f;
    float *dstreams[CUDA_STREAM_MAX_STREAMS];
    for (int r = 0; r < in->m; r++)
        dstreams[r] = ref.dstreams + (size_t)r * in->size;
    cpu_stream_mix_backward(dstreams, GRAD_ADD, ref.dmix_bias, ref.dmix_proj, &ref.dalpha, *dout,
                            in->stream_rows, in->m, *gates, *rstd, in->mix_bias, in->mix_proj,
                            alpha, in->tokens, in->d);
    return ref;
}

static MixGrads mix_reference(const MixInputs *in, float **dout, float **gates, float **rstd,
                              uint64_t seed)
{
    return mix_reference_gated(in, dout, gates, rstd, NULL, seed);
}

/* The delta gate folded in (alpha, d alpha), the streams given one at a time, d o_r written
 * over poison: the cpu's all-streams backward with the same gate. */
Test(cuda_stream, mix_backward_with_the_gate_a_stream_at_a_time_matches_cpu)
{
    gpu_require();
    const float alpha = -0.625f;
    for (int i = 0; i < MIX_SHAPE_COUNT; i++) {
        const int *shape = mix_shapes[i];
        MixInputs in = mix_inputs(shape, 1300 + 10 * (uint64_t)i);
        float *dout, *gates, *rstd;
        MixGrads ref = mix_reference_gated(&in, &dout, &gates, &rstd, &alpha, 1350 + (uint64_t)i);
        MixGrads got = gpu_mix_backward_as(&in, dout, gates, rstd,
                                           (MixCall){&alpha, true, GRAD_WRITE});
        expect_close(got.dstreams, ref.dstreams, (size_t)in.m * in.size, BF16_TOLERANCE,
                     "gated dstreams", shape);
        expect_close(got.dmix_bias, ref.dmix_bias, in.m, FP32_TOLERANCE, "gated dbias", shape);
        expect_close(got.dmix_proj, ref.dmix_proj, (size_t)in.m * in.d, FP32_TOLERANCE,
                     "gated dproj", shape);
        expect_close(&got.dalpha, &ref.dalpha, 1, FP32_TOLERANCE, "d alpha", shape);
        MixGrads again = gpu_mix_backward_as(&in, dout, gates, rstd,
                                             (MixCall){&alpha, true, GRAD_WRITE});
        cr_expect_eq(memcmp(&again.dalpha, &got.dalpha, sizeof(float)), 0,
                     "d alpha differs between two runs");
        mix_grads_free(&ref);
        mix_grads_free(&got);
        mix_grads_free(&again);
        free(dout);
        free(gates);
        free(rstd);
        mix_inputs_free(&in);
    }
}

Test(cuda_stream, mix_backward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < MIX_SHAPE_COUNT; i++) {
        const int *shape = mix_shapes[i];
        MixInputs in = mix_inputs(shape, 900 + 10 * (uint64_t)i);
        float *dout, *gates, *rstd;
        MixGrads ref = mix_reference(&in, &dout, &gates, &rstd, 950 + (uint64_t)i);
        MixGrads got = gpu_mix_backward(&in, dout, gates, rstd);
        expect_close(got.dstreams, ref.dstreams, (size_t)in.m * in.size, BF16_TOLERANCE,
                     "mix dstreams", shape);
        expect_close(got.dmix_bias, ref.dmix_bias, in.m, FP32_TOLERANCE, "mix dbias", shape);
        expect_close(got.dmix_proj, ref.dmix_proj, (size_t)in.m * in.d, FP32_TOLERANCE,
                     "mix dproj", shape);
        mix_grads_free(&ref);
        mix_grads_free(&got);
        free(dout);
        free(gates);
        free(rstd);
        mix_inputs_free(&in);
    }
}

Test(cuda_stream, mix_backward_is_bitwise_deterministic)
{
    gpu_require();
    const int shape[4] = {4, 1000, 4096, 0};
    MixInputs in = mix_inputs(shape, 1234);
    float *dout, *gates, *rstd;
    MixGrads ref = mix_reference(&in, &dout, &gates, &rstd, 1235);
    MixGrads first = gpu_mix_backward(&in, dout, gates, rstd);
    MixGrads second = gpu_mix_backward(&in, dout, gates, rstd);
    cr_assert_eq(memcmp(first.dstreams, second.dstreams, (size_t)in.m * in.size * sizeof(float)),
                 0, "dstreams differ");
    cr_assert_eq(memcmp(first.dmix_bias, second.dmix_bias, in.m * sizeof(float)), 0,
                 "dmix_bias differs");
    cr_assert_eq(memcmp(first.dmix_proj, second.dmix_proj, (size_t)in.m * in.d * sizeof(float)),
                 0, "dmix_proj differs");
    mix_grads_free(&ref);
    mix_grads_free(&first);
    mix_grads_free(&second);
    free(dout);
    free(gates);
    free(rstd);
    mix_inputs_free(&in);
}
