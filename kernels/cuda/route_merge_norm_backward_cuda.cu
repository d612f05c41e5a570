/* kernels/cuda/route_merge_norm_backward_cuda.cu — a replace-form site's norm backward and
 * merge backward in one pass (cuda_route_merge_rmsnorm_backward, route_block_cuda.h; the
 * op's contract is runtime/backend.h route_merge_rmsnorm_backward).
 *
 * A site's x_j is both the merge's output and its sublayer's norm input, so its backward ran
 * two ops one after the other:
 *   norm   dx = rmsnorm_backward(dnormed)      reads dnormed and x, writes dx     3 rows
 *   merge  route_merge_backward(dout = dx)     reads dx, x, the partial and d partial,
 *                                              writes d partial                   5 rows
 * (a block's first site reads no partial: 3 and 2 rows). Here a warp takes a token and keeps
 * its rows in shared memory between the two: dnormed, x, the partial and d partial in, dx and
 * d partial out, 6 rows (3 at a first site). At the 1B MHAR step (d 1280, 8192 tokens a
 * microbatch, 288 merges a step) that is 2 rows of 21 MB fewer a merge, about 12 GB a step,
 * and a launch fewer (docs/performance.md, 2026-12-07 (night)).
 *
 * The same bits as the two ops for dx, mean and d partial: the norm's arithmetic is
 * rmsnorm_row.cuh's, on x and dnormed read from the warp's shared rows in the norm kernel's
 * layout for a row of a warp (chunk k of lane l is vector 32 k + l), so its centre is summed
 * in that kernel's order; dx = +0.0 + g (GRAD_WRITE) is rounded, stored, and read back in the
 * merge's layout by merge_narrow_backward_token, the narrow merge backward's own code. The
 * sums over the tokens follow the narrow merge backward's partition: warp w of W =
 * merge_narrow_backward_warps(tokens) takes tokens w, w + W, ..; a block adds its four warps'
 * sums in warp order into a row (narrow_store_block_floats); the rows are added in block
 * order. So the channel sums (dquery, dkey_norm) are the merge's bits as well, and dweight is
 * the norm's sum in another fixed order (the norm kernel's groups are runs of consecutive
 * rows): deterministic, not the same bits. Both rows of block sums are added in one launch
 * (route_block_reduce's plain row beside the site's), the merge's in its own order. Rows
 * outside the narrow merge's (d % 256 == 0, heads dividing 32, 16-byte pointers) or a warp's
 * norm (d <= 1280) run the two ops.
 */
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/rmsnorm_row.cuh"
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_merge.cuh"
#include "kernels/cuda/route_merge_narrow.cuh"

enum {
    MERGE_NORM_BACKWARD_ROWS = 4,      /* a warp's rows of shared memory */
    MERGE_NORM_BACKWARD_MAX_LANE_VECTORS = 5, /* d <= 1280: the norm's rows of a warp */
};

/* What the pass adds to the merge backward's arguments: the norm's. */
struct MergeNormGradArgs {
    const bf16 *dnormed;  /* the norm's output gradient [tokens, d] */
    bf16 *dx;             /* [tokens, d], written: the merge's dout */
    const bf16 *weight;   /* the norm's [d] */
    const float *rstd;    /* the norm's [tokens], saved by its forward */
    float *partials;      /* [blocks, d]: each block's dweight sums */
};

template <int LV>
__global__ void __launch_bounds__(MERGE_NARROW_THREADS)
    merge_norm_backward_kernel(const __grid_constant__ MergeArgs args,
                               const __grid_constant__ MergeNormGradArgs norm)
{
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    /* the partition, fixed by the shapes; the warps past it (only where warps = tokens) meet
     * the block's barriers with zeros */
    const int warps = args.warps;
    const int H = args.heads, tokens = args.tokens, d = args.d;
    const bool has_partial = args.partial != NULL, adds = args.dpartial_add;
    /* a warp's rows: dnormed comes in through the first, dx leaves through it and the merge
     * reads it back from there, then d partial leaves through it; x, the partial and d
     * partial's old value come in through the others */
    extern __shared__ __align__(16) unsigned char merge_shared[];
    constexpr int VECTORS = NarrowRow<LV>::VECTORS;
    BfVector<8> *grad_stage = reinterpret_cast<BfVector<8> *>(merge_shared) +
                              (threadIdx.x >> 5) * MERGE_NORM_BACKWARD_ROWS * VECTORS;
    BfVector<8> *x_stage = grad_stage + VECTORS;
    BfVector<8> *partial_stage = x_stage + VECTORS;
    BfVector<8> *old_stage = partial_stage + VECTORS;
    float key_weight[8 * LV], channel_sums[8 * LV] = {}, dweight_sums[8 * LV] = {};
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
    for (int t = warp; warp < warps && t < tokens; t += warps) {
        float a, r;
        merge_narrow_backward_fetch<LV>(args, t, lane, norm.dnormed, grad_stage, &a, &r);
        const float norm_rstd = norm.rstd[t];
        uint4 weight_raw[LV]; /* the norm's weight in its layout, again a token (L1): held
                               * over the walk, it left the pass short of registers */
#pragma unroll
        for (int k = 0; k < LV; k++)
            weight_raw[k] = reinterpret_cast<const uint4 *>(norm.weight)[32 * k + lane];
        copy_async_wait<0>();
        __syncwarp();

        /* the norm, in its kernel's layout: dx = +0.0 + g, stored rounded */
        uint4 x_chunks[LV], dout_chunks[LV];
#pragma unroll
        for (int k = 0; k < LV; k++) {
            x_chunks[k] = x_stage[narrow_slot<LV>(32 * k + lane)].raw;
            dout_chunks[k] = grad_stage[narrow_slot<LV>(32 * k + lane)].raw;
        }
        const float centre = rmsnorm_row_backward_centre<32, LV>(x_chunks, dout_chunks,
                                                                 weight_raw, norm_rstd, d,
                                                                 nullptr);
#pragma unroll
        for (int k = 0; k < LV; k++) {
            float g[8];
            rmsnorm_chunk_backward(g, reinterpret_cast<float(&)[8]>(dweight_sums[8 * k]),
                                   x_chunks[k], dout_chunks[k], weight_raw[k], norm_rstd,
                                   centre);
#pragma unroll
            for (int i = 0; i < 8; i++)
                g[i] = __fadd_rn(0.0f, g[i]); /* GRAD_WRITE: rmsnorm_cuda.cu's +0.0 + g */
            /* the slot this lane read dnormed from: no other lane reads it */
            grad_stage[narrow_slot<LV>(32 * k + lane)] = vector_from_floats<8>(g);
        }
        __syncwarp();
        narrow_store_staged<LV>(norm.dx, t, grad_stage, lane);
        __syncwarp(); /* every lane's dx vectors read before d partial's replace them */

        /* the merge, from dx as stored, its rows read from the stages where it needs them;
         * d partial replaces dx in its stage, a vector once the lane has read it */
        const int first = lane * NarrowRow<LV>::STRIDE;
        const MergeTokenRows rows = {grad_stage + first, x_stage + first, partial_stage + first,
                                     old_stage + first, grad_stage + first};
        merge_narrow_backward_token<LV>(rows, args.mean, has_partial, adds, a, r, key_weight,
                                        channel_sums, H, t, args.inverse_width, lane);
        if (has_partial) {
            __syncwarp();
            narrow_store_staged<LV>(args.dpartial, t, grad_stage, lane);
        }
        __syncwarp(); /* every stage read before the next token's copies */
    }
    float4 *sums_stage = reinterpret_cast<float4 *>(merge_shared);
    const int stride = MERGE_NORM_BACKWARD_ROWS * VECTORS; /* float4s, as BfVector<8>s */
    if (has_partial) { /* uniform over the launch */
        narrow_store_block_floats<LV, MERGE_NARROW_THREADS / 32>(
            args.partials + (long long)blockIdx.x * d, channel_sums, warp < warps, sums_stage,
            stride);
        __syncthreads(); /* every warp's row read before the next are staged */
    }
    narrow_store_block_floats<LV, MERGE_NARROW_THREADS / 32, true>(
        norm.partials + (long long)blockIdx.x * d, dweight_sums, warp < warps, sums_stage,
        stride);
}

template <int LV>
static void merge_norm_backward_launch(const MergeArgs &args, const MergeNormGradArgs &norm,
                                       int blocks, cudaStream_t stream)
{
    const size_t bytes = (size_t)(MERGE_NARROW_THREADS / 32) * MERGE_NORM_BACKWARD_ROWS *
                         NarrowRow<LV>::VECTORS * sizeof(BfVector<8>);
    CUDA_CHECK(cudaFuncSetAttribute(merge_norm_backward_kernel<LV>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    merge_norm_backward_kernel<LV><<<blocks, MERGE_NARROW_THREADS, bytes, stream>>>(args,
                                                                                          norm);
    CUDA_CHECK_LAUNCH();
}

/* the merge's channel sums first, then the norm's: either op's own, or the pass's rows */
extern "C" size_t cuda_route_merge_rmsnorm_backward_workspace_floats(int tokens, int d,
                                                                     int heads)
{
    const size_t merge = cuda_route_merge_backward_workspace_floats(tokens, d, heads);
    const size_t norm = cuda_rmsnorm_backward_workspace_floats(tokens, d);
    const size_t block_rows = (size_t)merge_narrow_backward_blocks(tokens) * (size_t)d;
    return merge + (norm > block_rows ? norm : block_rows);
}

extern "C" void cuda_route_merge_rmsnorm_backward(
    bf16 *dx, float *dweight, const bf16 *dnormed, const bf16 *x, const bf16 *norm_weight,
    const float *norm_rstd, bf16 *dpartial, GradMode dpartial_mode, float *dquery,
    float *dkey_norm, float *mean, const bf16 *partial, int n_sources, const float *weights,
    const float *rstd, const bf16 *query, const bf16 *key_norm, float *workspace, int tokens,
    int d, int heads, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0)
        return;
    float *merge_sums = workspace;
    float *norm_sums = workspace + cuda_route_merge_backward_workspace_floats(tokens, d, heads);
    const void *pointers[] = {dx, dnormed, x, norm_weight, dpartial, partial, query, key_norm};
    const bool one_pass = d / 256 <= MERGE_NORM_BACKWARD_MAX_LANE_VECTORS &&
                          merge_narrow_fits(d, heads, pointers, 8);
    if (!one_pass) {
        cuda_rmsnorm_backward(dx, GRAD_WRITE, dweight, dnormed, x, norm_weight, norm_rstd,
                              tokens, d, norm_sums, stream);
        cuda_route_merge_backward(dpartial, dpartial_mode, dquery, dkey_norm, mean, dx, x,
                                  partial, n_sources, weights, rstd, query, key_norm,
                                  merge_sums, tokens, d, heads, stream);
        return;
    }
    MergeArgs args = merge_backward_args(dpartial, dpartial_mode, mean, dx, x, partial,
                                         n_sources, weights, rstd, query, key_norm, merge_sums,
                                         tokens, d, heads, RowShape{});
    args.warps = merge_narrow_backward_warps(tokens);
    const int blocks = merge_narrow_backward_blocks(tokens);
    const MergeNormGradArgs norm = {dnormed, dx, norm_weight, norm_rstd, norm_sums};
    switch (d / 256) {
    case 1: merge_norm_backward_launch<1>(args, norm, blocks, stream); break;
    case 2: merge_norm_backward_launch<2>(args, norm, blocks, stream); break;
    case 3: merge_norm_backward_launch<3>(args, norm, blocks, stream); break;
    case 4: merge_norm_backward_launch<4>(args, norm, blocks, stream); break;
    default: merge_norm_backward_launch<5>(args, norm, blocks, stream); break;
    }
    /* dweight's rows and the merge's in one launch, one launch fewer a site */
    merge_channel_sums_reduce(dquery, dkey_norm, query, key_norm, partial ? merge_sums : NULL,
                              dweight, norm_sums, blocks, d, stream);
}
