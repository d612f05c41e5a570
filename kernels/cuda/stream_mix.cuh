/* kernels/cuda/stream_mix.cuh — what MSAR's mix kernels share (CUDA C++ only; the contract is
 * cuda_stream_mix_forward / cuda_stream_mix_backward's in route_cuda.h, the math
 * kernels/cpu/stream_cpu.c's): the launch arguments, and the warp-a-token kernels of
 * stream_mix_narrow_cuda.cu that stream_cuda.cu calls when a shape fits them.
 *
 * Two layouts of the same math:
 * - a block a token (stream_cuda.cu), for any width up to CUDA_ROUTE_MAX_WIDTH: its row sums
 *   cross warps, so every stream of every token waits at a block barrier;
 * - a warp a token (stream_mix_narrow_cuda.cu), for narrow rows: d % 256 == 0, d <= 1536,
 *   every pointer 16-byte aligned. Lane l owns vectors l, l + 32, .. of 8 channels (LV =
 *   d / 256 of them), so each load of the warp is one coalesced 512-byte piece of the row
 *   and each row sum is a warp_sum: no barrier. At the 1B width (d 1280, LV 5) the block
 *   a token ran the forward at 1.8 TB/s and the backward at 1.7 TB/s on an H100, where a
 *   copy runs near 3 TB/s (docs/performance.md, 2026-12-05 (afternoon)).
 *
 * The backward's parameter gradients go through the same per-range partials either way,
 * [ranges, m, d] dtheta, [ranges, m] dbeta, [ranges, m] the shares of d alpha, which
 * stream_mix_reduce_kernel adds in range order; the ranges are fixed by the shapes and the
 * number of streams given, so each layout gives the same bits run after run.
 */
#ifndef FATHOM_KERNELS_CUDA_STREAM_MIX_CUH
#define FATHOM_KERNELS_CUDA_STREAM_MIX_CUH

#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"

struct MixForwardArgs {
    bf16 *out;
    float *gates, *rstd; /* [tokens, m] */
    const bf16 *streams[CUDA_STREAM_MAX_STREAMS];
    const float *mix_bias;
    const bf16 *mix_proj;
    float eps, inverse_width;
    int m, tokens, vectors, slots;
};

/* The forward's arguments (streams NULL: a kernel that makes o_r itself; the block layout's
 * vectors and slots left 0 for its launch to set) */
static inline MixForwardArgs mix_forward_args(bf16 *out, float *gates, float *rstd,
                                              const bf16 *const *streams, int m,
                                              const float *mix_bias, const bf16 *mix_proj,
                                              float eps, int tokens, int d)
{
    MixForwardArgs args = {};
    for (int r = 0; r < m && streams && r < CUDA_STREAM_MAX_STREAMS; r++)
        args.streams[r] = streams[r];
    args.out = out;
    args.gates = gates;
    args.rstd = rstd;
    args.mix_bias = mix_bias;
    args.mix_proj = mix_proj;
    args.eps = eps;
    args.inverse_width = 1.0f / (float)d;
    args.m = m;
    args.tokens = tokens;
    return args;
}

struct MixBackwardArgs {
    bf16 *dstreams[CUDA_STREAM_MAX_STREAMS];
    const bf16 *streams[CUDA_STREAM_MAX_STREAMS]; /* NULL: a stream not given (skipped) */
    int given_streams[CUDA_STREAM_MAX_STREAMS];   /* the given ones in order, `given` of them */
    float *partials; /* workspace: [ranges, m, d] dtheta, [ranges, m] dbeta, [ranges, m] the
                        shares of d alpha */
    float *dmix_bias, *dmix_proj, *dalpha;
    const bf16 *dout, *mix_proj;
    const float *gates, *rstd;
    const float *alpha; /* NULL: no gate */
    float inverse_width;
    int m, tokens, d, vectors, slots, ranges, given;
    int token_ranges;   /* the narrow backward: a warp's token ranges (four to a partial) */
    int add;            /* dstreams: GRAD_ADD (1) or GRAD_WRITE (0) */
};

/* One stream of a token in the warp-a-token layout, o = this lane's vectors lane, lane + 32,
 * .. of o_r: its gate w = sigmoid(beta + rho <theta, o>), rho = rsqrt(mean(o^2) + eps) into
 * *rho (the same in every lane). The mix kernel (stream_mix_narrow_cuda.cu) and the merges
 * that mix as they merge (route_merge_conv_cuda.cu) both take their gates from here, so
 * that they give the same bits. */
template <int LV>
__device__ __forceinline__ float mix_stream_gate(const BfVector<8> (&o)[LV], const bf16 *theta_row,
                                                 float bias, float inverse_width, float eps,
                                                 int lane, float *rho)
{
    float squares = 0.0f, dot = 0.0f;
#pragma unroll
    for (int j = 0; j < LV; j++) {
        float x[8], theta[8];
        vector_to_floats<8>(o[j], x);
        vector_to_floats<8>(vector_load<8>(theta_row, j * 32 + lane), theta); /* through L1 */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            squares += x[i] * x[i];
            dot += theta[i] * x[i];
        }
    }
    squares = warp_sum(squares);
    dot = warp_sum(dot);
    *rho = rsqrtf(squares * inverse_width + eps);
    const double g = (double)(bias + *rho * dot);
    return (float)(1.0 / (1.0 + exp(-g))); /* in double, rounded once, as on the cpu */
}

/* mix += w o, this lane's 8 LV channels (the mix starts at zeros) */
template <int LV>
__device__ __forceinline__ void mix_stream_add(float (&mix)[8 * LV], const BfVector<8> (&o)[LV],
                                               float w)
{
#pragma unroll
    for (int j = 0; j < LV; j++) {
        float x[8];
        vector_to_floats<8>(o[j], x);
#pragma unroll
        for (int i = 0; i < 8; i++)
            mix[8 * j + i] += w * x[i];
    }
}

enum {
    /* the warp-a-token forward up to d 1536 with the next stream's row in flight, and at d
     * 2048, 3072 and 4096 (the 8B width) without it: a warp's row there is 4 to 8 KB, enough
     * bytes in flight by itself, and the mix's 8 LV floats a lane fill the registers */
    MIX_NARROW_FORWARD_PREFETCH_LANE_VECTORS = 6,
};

/* this lane's LV vectors of row `row` (vectors lane, lane + 32, ..) */
template <int LV>
__device__ __forceinline__ void mix_lane_load(BfVector<8> *raw, const bf16 *array, long long row,
                                              int lane)
{
#pragma unroll
    for (int j = 0; j < LV; j++)
        raw[j] = vector_load<8>(array, row * 32 * LV + j * 32 + lane);
}

/* Token t's mix in the warp-a-token layout: this lane's 8 LV channels of sum_r w_r o_r in
 * fp32 (not yet rounded), each o_r read once, the streams in order; lane 0 stores each
 * stream's gate and rstd. The mix kernel and the norm that mixes (stream_mix_norm_cuda.cu)
 * both make it here, so that they give the same bits. */
template <int LV>
__device__ __forceinline__ void mix_narrow_token(float (&mix)[8 * LV], const MixForwardArgs &args,
                                                 int t, int lane)
{
    constexpr bool PREFETCH = LV <= MIX_NARROW_FORWARD_PREFETCH_LANE_VECTORS;
    const int m = args.m;
#pragma unroll
    for (int i = 0; i < 8 * LV; i++)
        mix[i] = 0.0f;
    BfVector<8> current[LV], next[PREFETCH ? LV : 1];
    mix_lane_load<LV>(current, args.streams[0], t, lane);
    for (int r = 0; r < m; r++) {
        if (PREFETCH && r + 1 < m)
            mix_lane_load<LV>(next, args.streams[r + 1], t, lane);
        else if (!PREFETCH && r > 0)
            mix_lane_load<LV>(current, args.streams[r], t, lane);
        const bf16 *theta_row = args.mix_proj + (long long)r * 32 * 8 * LV;
        float rho;
        const float w = mix_stream_gate<LV>(current, theta_row, args.mix_bias[r],
                                            args.inverse_width, args.eps, lane, &rho);
        if (lane == 0) {
            args.gates[(long long)t * m + r] = w;
            args.rstd[(long long)t * m + r] = rho;
        }
        mix_stream_add<LV>(mix, current, w);
        if (PREFETCH)
#pragma unroll
            for (int j = 0; j < LV; j++)
                current[j] = next[j];
    }
}

/* d o of one channel in the mix's backward (stream_cuda.cu's header has the math): with
 * u = o rho, w (scale dy) + rho (dg theta - u mean). Both layouts' backward kernels call it. */
__device__ __forceinline__ float mix_grad_channel(float w, float scale, float dy, float rho,
                                                  float dg, float theta, float u, float mean)
{
    return w * (scale * dy) + rho * (dg * theta - u * mean);
}

/* Whether the warp-a-token kernels take rows of width d with these arrays (NULL entries are
 * ignored): the forward up to d 1536 and at d 2048, 3072 and 4096, the backward up to 1536. */
bool mix_narrow_fits(int d, bool backward, const void *const *pointers, int count);

/* The narrow backward's partition, a function of the shapes only: its token ranges (a warp's
 * each, for one given stream) and its partials (`ranges`: one a block of four ranges). */
int mix_narrow_token_ranges(int tokens, int given);
int mix_narrow_ranges(int tokens, int given);

/* The forward and the backward's first kernel (the per-range partials; the caller then
 * launches stream_mix_reduce_kernel) for a shape mix_narrow_fits accepts. */
void mix_narrow_forward(const MixForwardArgs &args, int d, cudaStream_t stream);
void mix_narrow_backward(const MixBackwardArgs &args, int d, cudaStream_t stream);

#endif
