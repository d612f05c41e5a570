/* kernels/cuda/stream_mix_norm_cuda.cu — MSAR's delta-form gate with its streams' mix made in
 * the sublayer's norm pass (cuda_stream_mix_rmsnorm_forward, route_cuda.h; the op's contract
 * is runtime/backend.h stream_mix_rmsnorm_forward).
 *
 * At each site of a block of the delta form, MSAR ran two ops one after the other:
 *   mix    mixed = sum_r w_r o_r               stream_mix_narrow_cuda.cu's math
 *   gate   x = bf16(p + alpha * mixed), normed  rmsnorm_cuda.cu's gated forward, which first
 *                                              adds the sublayer before's output f into the
 *                                              stream p and the block's partial
 * Apart, they move m + 1 rows and 8 rows of [tokens, d] (the mix reads the m streams and
 * writes the mix; the gate reads p, f, the partial before and the mix, and writes p, the
 * partial, x and the normed row). Here a warp takes a token: the mix stays in its registers
 * between the two, m + 7 rows. At the 1B MSAR delta step (d 1280, m 4, 8192 tokens a
 * microbatch, 288 sites a step) that is 2 rows of 21 MB fewer a site, 12 GB a step, and a
 * launch fewer (docs/performance.md, 2026-12-07, "(small hours)").
 *
 * The same bits as the two ops: the mix is mix_narrow_token, the narrow mix kernel's own
 * code (the gates in double, rounded once), rounded to bf16 as that kernel stores it; its lane
 * owns the vectors lane, lane + 32, .. of a row, which is the norm's layout for a row of a
 * warp (chunk k of lane l holds vector 32 k + l), so the gate and the norm run
 * rmsnorm_input_form and rmsnorm_row_forward, the norm kernel's code, on it. So the rows
 * taken are the narrow mix's (d % 256 == 0, 16-byte aligned) that a warp norms (d <= 1280);
 * the others run the two ops.
 */
#include "kernels/cuda/rmsnorm_row.cuh"
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/stream_mix.cuh"

enum {
    MIX_NORM_THREADS = 128,          /* four warps a block, a token a warp */
    MIX_NORM_MAX_LANE_VECTORS = 5,   /* d <= 1280: the norm's rows of a warp */
};

/* What the pass adds to the mix's arguments: the gate's and the norm's. */
struct MixNormArgs {
    NormInput input; /* x is the gate's base p; route NULL: the mix is made here */
    bfloat *normed;
    float *rstd;
    const bfloat *weight;
    float eps;
    int d;
};

template <int LV>
__global__ void __launch_bounds__(MIX_NORM_THREADS)
    mix_norm_forward_kernel(const __grid_constant__ MixForwardArgs mix,
                            const __grid_constant__ MixNormArgs norm)
{
    const int lane = threadIdx.x & 31;
    const int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (t >= mix.tokens)
        return; /* a whole warp leaves together */
    const int d = norm.d;
    /* the base's row first, in flight while the streams are mixed */
    uint4 raw[LV], route_raw[LV];
#pragma unroll
    for (int k = 0; k < LV; k++)
        raw[k] = load8_raw<true>(norm.input.x + (size_t)t * d, (k * 32 + lane) * 8, d);
    float mixed[8 * LV];
    mix_narrow_token<LV>(mixed, mix, t, lane);
#pragma unroll
    for (int k = 0; k < LV; k++) /* rounded as the mix kernel stores it */
        route_raw[k] = vector_from_floats<8>(mixed + 8 * k).raw;
    rmsnorm_input_form<32, LV, true, true>(raw, route_raw, true, norm.input, t, d);
    rmsnorm_row_forward<32, LV, true>(norm.normed + (size_t)t * d, norm.rstd + t, raw,
                                      norm.weight, d, norm.eps, nullptr);
}

template <int LV>
static void mix_norm_launch(const MixForwardArgs &mix, const MixNormArgs &norm,
                            cudaStream_t stream)
{
    const int warps_per_block = MIX_NORM_THREADS / 32;
    const int blocks = (mix.tokens + warps_per_block - 1) / warps_per_block;
    mix_norm_forward_kernel<LV><<<blocks, MIX_NORM_THREADS, 0, stream>>>(mix, norm);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_stream_mix_rmsnorm_forward(bf16 *x, bf16 *out, float *rstd, bf16 *mixed,
                                                float *gates, float *mix_rstd,
                                                const bf16 *const *streams, int m,
                                                const float *mix_bias, const bf16 *mix_proj,
                                                float mix_eps, const bf16 *base,
                                                const float *alpha, const bf16 *weight,
                                                int tokens, int d, float eps,
                                                const CudaGateAdd *add, cudaStream_t stream)
{
    const void *pointers[CUDA_STREAM_MAX_STREAMS + 9];
    int count = 0;
    for (int r = 0; r < m && r < CUDA_STREAM_MAX_STREAMS; r++)
        pointers[count++] = streams[r];
    const void *rows[] = {x, out, base, weight, mix_proj, add ? add->added : NULL,
                          add ? add->stream : NULL, add ? add->partial_before : NULL,
                          add ? add->partial : NULL};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        pointers[count++] = rows[k];
    const bool one_pass = m >= 1 && m <= CUDA_STREAM_MAX_STREAMS && tokens > 0 &&
                          d / 256 <= MIX_NORM_MAX_LANE_VECTORS &&
                          mix_narrow_fits(d, false, pointers, count);
    if (!one_pass) {
        cuda_stream_mix_forward(mixed, gates, mix_rstd, streams, m, mix_bias, mix_proj, tokens,
                                d, mix_eps, stream);
        cuda_add_scaled_rmsnorm_forward(x, out, rstd, base, mixed, alpha, weight, tokens, d,
                                        eps, add, stream);
        return;
    }
    const MixForwardArgs args = mix_forward_args(NULL, gates, mix_rstd, streams, m, mix_bias,
                                                 mix_proj, mix_eps, tokens, d);
    MixNormArgs norm;
    norm.input = norm_input_of_gate(base, NULL, alpha, x, add);
    norm.normed = (bfloat *)out;
    norm.rstd = rstd;
    norm.weight = (const bfloat *)weight;
    norm.eps = eps;
    norm.d = d;
    switch (d / 256) {
    case 1: mix_norm_launch<1>(args, norm, stream); break;
    case 2: mix_norm_launch<2>(args, norm, stream); break;
    case 3: mix_norm_launch<3>(args, norm, stream); break;
    case 4: mix_norm_launch<4>(args, norm, stream); break;
    default: mix_norm_launch<5>(args, norm, stream); break;
    }
}
