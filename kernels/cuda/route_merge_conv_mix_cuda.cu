/* kernels/cuda/route_merge_conv_mix_cuda.cu — MSAR's replace-form merges of a site mixed as
 * they are made (route_block_cuda.h: cuda_route_merge_conv_mix_forward; the merges are
 * route_merge_conv_cuda.cu's, the mix stream_mix_narrow_cuda.cu's).
 *
 * A site i > 0 mixes its streams right after merging them (x = sum_r w_r o_r): in the
 * forward's turn, where nothing reads o_r again, and in the backward's, which merges the
 * site again before its sublayer's backward and keeps o_r for the site's own backward
 * (model/route_block.c). So token t's streams are merged into rows of the warp's in shared
 * memory, one a stream, stored from there (whole sectors) where they are kept, and mixed
 * from there in the mix kernel's layout (lane l: vectors l, l + 32, ..) with its gate
 * (stream_mix.cuh's mix_stream_gate): the bits of cuda_stream_mix_forward after the merges,
 * while the mix reads no o_r from memory. At the 1B microbatch (d 1280, m 4, 8192 tokens) 6
 * rows of 21 MB where 14 were (10 with o_r kept), one launch where two were. Measured on an
 * H100 (docs/performance.md, 2026-12-06 midday): 0.137 ms (0.165 with o_r kept) where the
 * two kernels took 0.179.
 */
#include "kernels/cuda/route_merge_conv.cuh"
#include "kernels/cuda/stream_mix.cuh"
#include "runtime/error.h"

/* The merge-conv forward's grid (a warp walks MERGE_CONV_RUN consecutive tokens); token t's
 * streams merged into the warp's rows, stored from them where kept, then mixed from them
 * into x and its gates and rstd */
template <int LV>
__global__ void __launch_bounds__(MERGE_CONV_THREADS)
    merge_conv_mix_forward_kernel(const __grid_constant__ MergeConvArgs args,
                                  const __grid_constant__ MixForwardArgs mix, bool keep_streams)
{
    extern __shared__ BfVector<8> merge_mix_rows[]; /* [warps][streams][NarrowRow<LV>] */
    constexpr int VECTORS = NarrowRow<LV>::VECTORS;
    const int lane = threadIdx.x & 31, m = args.streams;
    BfVector<8> *rows = merge_mix_rows + (threadIdx.x >> 5) * m * VECTORS;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long first = warp * MERGE_CONV_RUN;
    for (long long t = first; t < first + MERGE_CONV_RUN && t < args.tokens; t++) {
        for (int r = 0; r < m; r++) {
            BfVector<8> out_raw[LV];
            merge_conv_stream<LV>(args, rows + r * VECTORS, r, t, lane, out_raw);
            narrow_stage_row<LV>(rows + r * VECTORS, out_raw, lane);
            if (keep_streams)
                narrow_store_staged<LV>(args.out[r], t, rows + r * VECTORS, lane);
        }
        float sum[8 * LV] = {};
        for (int r = 0; r < m; r++) {
            BfVector<8> o[LV];
#pragma unroll
            for (int j = 0; j < LV; j++)
                o[j] = rows[r * VECTORS + narrow_slot<LV>(j * 32 + lane)];
            float rho;
            const float w =
                mix_stream_gate<LV>(o, mix.mix_proj + (long long)r * 32 * 8 * LV, mix.mix_bias[r],
                                    mix.inverse_width, mix.eps, lane, &rho);
            if (lane == 0) {
                mix.gates[t * m + r] = w;
                mix.rstd[t * m + r] = rho;
            }
            mix_stream_add<LV>(sum, o, w);
        }
#pragma unroll
        for (int j = 0; j < LV; j++) /* lane l's vectors l, l + 32, ..: 512 bytes a store */
            vector_store<8>(mix.out, t * 32 * LV + j * 32 + lane,
                            vector_from_floats<8>(sum + 8 * j));
        __syncwarp(); /* the rows' readers before the next token's copies */
    }
}

/* FATHOM_MERGE_MIX: `fused` (the default) or `composed` (the merges, then the mix kernel:
 * the same bits, for timing the two against each other) */
static bool merge_mix_fused(void)
{
    static int selected = -1; /* read once */
    if (selected < 0) {
        static const char *const names[] = {"fused", "composed"};
        selected = env_choice("FATHOM_MERGE_MIX", names, 2) == 0;
    }
    return selected == 1;
}

template <int LV>
static void merge_conv_mix_launch(const MergeConvArgs &args, const MixForwardArgs &mix,
                                  bool keep_streams, cudaStream_t stream)
{
    const long long warps = (args.tokens + MERGE_CONV_RUN - 1) / MERGE_CONV_RUN;
    const unsigned blocks = (unsigned)((warps + MERGE_CONV_THREADS / 32 - 1) /
                                       (MERGE_CONV_THREADS / 32));
    const size_t bytes = (size_t)(MERGE_CONV_THREADS / 32) * args.streams *
                         NarrowRow<LV>::VECTORS * sizeof(BfVector<8>);
    CUDA_CHECK(cudaFuncSetAttribute(merge_conv_mix_forward_kernel<LV>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    merge_conv_mix_forward_kernel<LV>
        <<<blocks, MERGE_CONV_THREADS, bytes, stream>>>(args, mix, keep_streams);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_route_merge_conv_mix_forward(
    bf16 *x, float *gates, float *mix_rstd, const float *mix_bias, const bf16 *mix_proj,
    bf16 *const *out, bool keep_streams, float *const *weights, float *const *rstd,
    const bf16 *const *result, const float *const *lse, const bf16 *partial,
    const bf16 *const *taps, const int *kernel_sizes, int streams, int n_sources,
    const bf16 *const *query, const bf16 *const *key_norm, bf16 *const *rows, int B, int T,
    int d, int heads, float eps, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (!conv_check_streams(kernel_sizes, streams, d, B, T) || streams <= 0)
        return;
    const void *mix_pointers[] = {x, mix_proj};
    if (!merge_mix_fused() || streams > MERGE_CONV_STREAMS || streams > CUDA_STREAM_MAX_STREAMS ||
        !pointers_aligned(mix_pointers, 2, 16) ||
        !merge_conv_fits(out, result, taps, query, key_norm, partial, streams, d, heads)) {
        cuda_route_merge_conv_forward(out, weights, rstd, result, lse, partial, taps,
                                      kernel_sizes, streams, n_sources, query, key_norm, rows, B,
                                      T, d, heads, eps, stream);
        cuda_stream_mix_forward(x, gates, mix_rstd, (const bf16 *const *)out, streams, mix_bias,
                                mix_proj, B * T, d, eps, stream);
        return;
    }
    const MergeConvArgs args =
        merge_conv_args(out, weights, rstd, result, lse, partial, taps, kernel_sizes, streams,
                        n_sources, query, key_norm, B * T, T, d, heads, eps);
    const MixForwardArgs mix = mix_forward_args(x, gates, mix_rstd, NULL, streams, mix_bias,
                                                mix_proj, eps, B * T, d);
    MERGE_NARROW_BY_WIDTH(d, merge_conv_mix_launch, args, mix, keep_streams, stream);
}

