/* kernels/cuda/route_merge_conv.cuh — what MSAR's replace-form merge kernels share
 * (route_merge_conv_cuda.cu: a site's merges in every stream with the partial's convolution
 * inside the read, and their backward; route_merge_conv_mix_cuda.cu: the same merges mixed
 * as they are made): the forward's launch arguments, a stream's merge of one token, and the
 * host helpers. CUDA C++ only; the contracts are route_block_cuda.h's, the
 * layout route_merge_narrow.cuh's (a warp a token, lane l owns channels [l d/32,
 * (l+1) d/32)).
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_MERGE_CONV_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_MERGE_CONV_CUH

#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_merge.cuh"
#include "kernels/cuda/route_merge_narrow.cuh"
#include "kernels/cuda/stream_conv.cuh"

enum {
    MERGE_CONV_THREADS = 128, /* four warps a block */
    MERGE_CONV_RUN = 4,       /* consecutive tokens a warp: 2048 warps at 8192 tokens */
    MERGE_CONV_STREAMS = 8,   /* streams a launch (more: launches in turn) */
};

/* The streams of one launch, by value in the kernel's parameters */
struct MergeConvArgs {
    bf16 *out[MERGE_CONV_STREAMS];
    float *weights[MERGE_CONV_STREAMS]; /* [N + 1, tokens, heads] */
    float *rstd[MERGE_CONV_STREAMS];    /* [N + 1, tokens] */
    const bf16 *result[MERGE_CONV_STREAMS];
    const float *lse[MERGE_CONV_STREAMS];
    const bf16 *taps[MERGE_CONV_STREAMS]; /* [kernel_size, d] */
    const bf16 *query[MERGE_CONV_STREAMS], *key_norm[MERGE_CONV_STREAMS];
    int kernel_size[MERGE_CONV_STREAMS];
    const bf16 *partial; /* b [B T, d] */
    float eps, inverse_width;
    int streams, n_completed, tokens, T, heads;
};


/* E_r of token t for this lane's channels: stream_conv's conv_sum, term by term (a product
 * alone at tau = 0, then tau = 1 .. taps_here - 1 added in order), rounded to bf16. The tau
 * loop is unrolled to the largest kernel (left at the kernel size), so that the compiler may
 * issue a step's loads ahead of the sums before it: the four streams' backward 0.27 -> 0.236
 * ms at the 1B microbatch on an H100, the forward unchanged (docs/performance.md). */
template <int LV>
__device__ __forceinline__ void merge_conv_partial(BfVector<8> (&raw)[LV], const bf16 *partial,
                                                   const bf16 *taps, int taps_here, long long t,
                                                   int lane)
{
    float sum[8 * LV];
#pragma unroll
    for (int j = 0; j < LV; j++) {
        const long long vector = lane * LV + j;
        float x[8], tap[8];
        vector_to_floats<8>(vector_load<8>(partial, t * 32 * LV + vector), x);
        vector_to_floats<8>(vector_load<8>(taps, vector), tap);
#pragma unroll
        for (int i = 0; i < 8; i++)
            sum[8 * j + i] = tap[i] * x[i];
    }
#pragma unroll
    for (int tau = 1; tau < CUDA_ROUTE_CONV_MAX_KERNEL; tau++) {
        if (tau >= taps_here)
            break;
#pragma unroll
        for (int j = 0; j < LV; j++) {
            const long long vector = lane * LV + j;
            float x[8], tap[8];
            vector_to_floats<8>(vector_load<8>(partial, (t - tau) * 32 * LV + vector), x);
            vector_to_floats<8>(vector_load<8>(taps, (long long)tau * 32 * LV + vector), tap);
#pragma unroll
            for (int i = 0; i < 8; i++)
                sum[8 * j + i] += tap[i] * x[i];
        }
    }
#pragma unroll
    for (int j = 0; j < LV; j++)
        raw[j] = vector_from_floats<8>(sum + 8 * j); /* E_r as stored */
}

/* The taps token t of a sequence of T reads with a kernel of kernel_size: none before the
 * sequence's start */
__device__ __forceinline__ int merge_conv_taps_here(long long t, int T, int kernel_size)
{
    const int position = (int)(t % T);
    return kernel_size < position + 1 ? kernel_size : position + 1;
}

/* One stream of token t: the narrow merge (route_merge_narrow.cuh) with p = E_r, into
 * out_raw (this lane's vectors). The phase-one row comes into the warp's stage (whole
 * sectors, in flight while E_r is summed); the caller stores out through the stage. */
template <int LV>
__device__ __forceinline__ void merge_conv_stream(const MergeConvArgs &args, BfVector<8> *stage,
                                                  int r, long long t, int lane,
                                                  BfVector<8> (&out_raw)[LV])
{
    const int H = args.heads, N = args.n_completed;
    narrow_copy_row<LV>(stage, args.result[r], t, lane); /* out may alias it: read first */
    copy_async_commit();
    const float completed = args.lse[r][t * H + lane / (32 / H)];
    float held[MERGE_NARROW_HELD];
    merge_narrow_held_load(held, args.weights[r], N, H, args.tokens, t, lane);
    BfVector<8> p_raw[LV];
    merge_conv_partial<LV>(p_raw, args.partial, args.taps[r],
                           merge_conv_taps_here(t, args.T, args.kernel_size[r]), t, lane);
    float p[8 * LV], key_weight[8 * LV];
#pragma unroll
    for (int j = 0; j < LV; j++)
        vector_to_floats<8>(p_raw[j], p + 8 * j);
    narrow_key_weight<LV>(args.query[r], args.key_norm[r], lane, key_weight);
    BfVector<8> result_raw[LV];
    copy_async_wait<0>();
    __syncwarp();
    narrow_lane_vectors<LV>(result_raw, stage, lane);
    merge_narrow_token<LV>(out_raw, args.weights[r], args.rstd[r], result_raw, completed, held,
                           p, key_weight, N, H, args.tokens, t, args.inverse_width, args.eps,
                           lane);
}

/* Whether every stream's rows and the partial take the warp-a-token layout */
bool merge_conv_fits(bf16 *const *out, const bf16 *const *result, const bf16 *const *taps,
                     const bf16 *const *query, const bf16 *const *key_norm,
                     const bf16 *partial, int streams, int d, int heads);

/* The forward's arguments for streams 0 .. min(streams, MERGE_CONV_STREAMS) - 1 of the
 * arrays given */
MergeConvArgs merge_conv_args(bf16 *const *out, float *const *weights, float *const *rstd,
                              const bf16 *const *result, const float *const *lse,
                              const bf16 *partial, const bf16 *const *taps,
                              const int *kernel_sizes, int streams, int n_sources,
                              const bf16 *const *query, const bf16 *const *key_norm, int tokens,
                              int T, int d, int heads, float eps);

#endif
