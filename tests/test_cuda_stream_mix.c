/* tests/test_cuda_stream_mix.c — the CUDA MSAR stream mix against the cpu reference
 * (DESIGN 2.2; DESIGN 7, "GPU"), the rules of test_cuda_stream.c: fresh inputs rounded to
 * bf16, the cpu reference (kernels/cpu/stream_cpu.c) on the same values, 1e-2 for bf16
 * outputs, 1e-3 for fp32 ones, outputs poisoned, shapes that are not multiples of anything,
 * bitwise determinism of every backward. The mix runs in both of its layouts (a warp a
 * token, a block a token; mix_shapes says which). At init (theta 0, beta = -ln(m-1)) the
 * mix of m equal streams gives gates 1/m and the stream itself, bit for bit.
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

/* ---- mix: shapes {m, tokens, d, misaligned} ---- */

/* Both layouts (stream_mix.cuh): a warp a token where d % 256 == 0 up to 1536 and every row
 * is 16-byte aligned (d 256, 512, the 1B width 1280, 1536; the forward also at 2048, 3072 and
 * the 8B width 4096), a block a token otherwise (d 24, 1792, 8192, the backward past 1536,
 * and the 1B width with its streams starting one element past an aligned address:
 * misaligned 1). */
static const int mix_shapes[][4] = {
    {2, 33, 24, 0},    {4, 1000, 256, 0}, {3, 1, 4096, 0},    {4, 33, 4096, 0},
    {3, 1000, 24, 0},  {2, 33, 8192, 0},  {4, 1000, 1280, 0}, {3, 77, 1536, 0},
    {2, 33, 512, 0},   {4, 100, 1280, 1}, {4, 50, 1792, 0},   {2, 65, 2048, 0},
    {3, 40, 3072, 0},
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
    in.streams = gpu_test_host_floats((size_t)in.m * in.size + 1);
    const size_t shift = shape[3] ? 1 : 0; /* one element before the rows on the device */
    for (int r = 0; r < in.m; r++) {
        float *rows = in.streams + (size_t)r * in.size + shift;
        test_fill_uniform(rows, in.size, 0.5f + 0.5f * r, seed + (uint64_t)r);
        gpu_round_to_bf16(rows, in.size);
        in.stream_rows[r] = rows;
        in.device_streams[r] = gpu_upload_bf16(rows - shift, in.size + shift) + shift;
    }
    in.mix_bias = gpu_test_host_floats(in.m);
    test_fill_uniform(in.mix_bias, in.m, 1.0f, seed + 20);
    in.mix_proj = gpu_test_rounded_uniform((size_t)in.m * in.d, 2.0f / sqrtf((float)in.d), 0.0f,
                                           seed + 21);
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
        gpu_expect_close_at(out_got, out_ref, in.size, BF16_TOLERANCE, "mix out", mix_shapes[i]);
        gpu_expect_close_at(gates_got, gates_ref, n_gates, FP32_TOLERANCE, "mix gates",
                            mix_shapes[i]);
        gpu_expect_close_at(rstd_got, rstd_ref, n_gates, FP32_TOLERANCE, "mix rstd", mix_shapes[i]);
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
        gpu_expect_close_at(got.dstreams, ref.dstreams, (size_t)in.m * in.size, BF16_TOLERANCE,
                     "gated dstreams", shape);
        gpu_expect_close_at(got.dmix_bias, ref.dmix_bias, in.m, FP32_TOLERANCE, "gated dbias",
                            shape);
        gpu_expect_close_at(got.dmix_proj, ref.dmix_proj, (size_t)in.m * in.d, FP32_TOLERANCE,
                     "gated dproj", shape);
        gpu_expect_close_at(&got.dalpha, &ref.dalpha, 1, FP32_TOLERANCE, "d alpha", shape);
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
        gpu_expect_close_at(got.dstreams, ref.dstreams, (size_t)in.m * in.size, BF16_TOLERANCE,
                     "mix dstreams", shape);
        gpu_expect_close_at(got.dmix_bias, ref.dmix_bias, in.m, FP32_TOLERANCE, "mix dbias", shape);
        gpu_expect_close_at(got.dmix_proj, ref.dmix_proj, (size_t)in.m * in.d, FP32_TOLERANCE,
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
    static const int shapes[][4] = {{4, 1000, 4096, 0}, {4, 1000, 1280, 0}}; /* both layouts */
    for (int i = 0; i < 2; i++) {
        const int *shape = shapes[i];
        MixInputs in = mix_inputs(shape, 1234 + (uint64_t)i);
        float *dout, *gates, *rstd;
        MixGrads ref = mix_reference(&in, &dout, &gates, &rstd, 1235);
        MixGrads first = gpu_mix_backward(&in, dout, gates, rstd);
        MixGrads second = gpu_mix_backward(&in, dout, gates, rstd);
        cr_assert_eq(memcmp(first.dstreams, second.dstreams,
                            (size_t)in.m * in.size * sizeof(float)),
                     0, "dstreams differ (d %d)", shape[2]);
        cr_assert_eq(memcmp(first.dmix_bias, second.dmix_bias, in.m * sizeof(float)), 0,
                     "dmix_bias differs (d %d)", shape[2]);
        cr_assert_eq(memcmp(first.dmix_proj, second.dmix_proj,
                            (size_t)in.m * in.d * sizeof(float)),
                     0, "dmix_proj differs (d %d)", shape[2]);
        mix_grads_free(&ref);
        mix_grads_free(&first);
        mix_grads_free(&second);
        free(dout);
        free(gates);
        free(rstd);
        mix_inputs_free(&in);
    }
}
