/* kernels/cuda/route_merge_norm_cuda.cu — a replace-form site's merge and its sublayer's
 * input norm in one pass (cuda_route_merge_rmsnorm_forward, route_block_cuda.h; the op's
 * contract is runtime/backend.h route_merge_rmsnorm_forward).
 *
 * Three ops run one after the other at each site i > 0 of an open block in the replace form:
 *   add    b = bf16(b_before + f)          the output of the sublayer before into the
 *                                           block's partial (model/chunk.c)
 *   merge  x = route_merge_forward(b)       route_merge_cuda.cu's math
 *   norm   out = rmsnorm_forward(x)         rmsnorm_cuda.cu's math
 * Apart, they move 3 + 3 + 2 rows of [tokens, d] (the add reads two and writes one, the merge
 * reads b and the phase-one result and writes x, the norm reads x and writes out); here a warp
 * takes a token and keeps its rows on chip between the three: b_before, f and the result in,
 * b, x and out out, 6 rows. At the 1B step (d 1280, 8192 tokens a microbatch, 7 merges a
 * block of 8 sites, 6 of them after an add) that is 2 rows of 21 MB fewer a merge and two
 * launches fewer: about 10.6 GB and 500 launches a step (docs/performance.md).
 *
 * The same bits as the three ops: the add rounds once, as cuda_add does; the merge is
 * merge_narrow_token, the narrow merge kernel's own code; the norm reads x back from the
 * warp's shared row in the norm kernel's layout for a row of a warp (lane l takes the
 * vectors l, l + 32, ..., route_narrow's contiguous layout gives it l LV .. l LV + LV - 1)
 * and sums the squares in that kernel's order. So the rows taken are the narrow merge's
 * (d % 256 == 0, heads dividing 32, 16-byte aligned) with the norm's warp rows (d <= 1280);
 * the others run the three ops.
 */
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/rmsnorm_row.cuh"
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_merge.cuh"
#include "kernels/cuda/route_merge_narrow.cuh"

enum {
    MERGE_NORM_THREADS = 128,  /* four warps a block, a token a warp */
    MERGE_NORM_MAX_LANE_VECTORS = 5, /* d <= 1280: the norm's rows of a warp */
};

/* What the pass adds to the merge's arguments: the add before it, the norm after it. */
struct MergeNormArgs {
    const bf16 *partial_before, *added; /* NULL: no add; args.partial is read as it is */
    bf16 *partial;                      /* the add's sum, args.partial's buffer */
    bf16 *normed;
    float *rstd;
    const bf16 *weight;
    float eps;
};

template <int LV>
__global__ void __launch_bounds__(MERGE_NORM_THREADS)
    merge_norm_forward_kernel(const __grid_constant__ MergeArgs args,
                              const __grid_constant__ MergeNormArgs norm)
{
    const int lane = threadIdx.x & 31;
    const int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (t >= args.tokens)
        return; /* a whole warp leaves together */
    const int H = args.heads, N = args.n_completed, d = args.d;
    const bool adds = norm.added != NULL;
    /* a warp's three rows: the partial (or the one before it) and f come in whole sectors,
     * and the partial leaves through the first; the phase-one result comes in through the
     * third, x leaves through it and the norm reads it back from there */
    __shared__ BfVector<8> stages[MERGE_NORM_THREADS / 32][3][NarrowRow<LV>::VECTORS];
    BfVector<8> *partial_stage = stages[threadIdx.x >> 5][0];
    BfVector<8> *added_stage = stages[threadIdx.x >> 5][1];
    BfVector<8> *result_stage = stages[threadIdx.x >> 5][2];
    float key_weight[8 * LV];
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
    float completed, held[MERGE_NARROW_HELD], p[8 * LV];
    BfVector<8> p_raw[LV], result_raw[LV], out_raw[LV];
    merge_narrow_fetch<LV>(args, t, lane, adds ? norm.partial_before : args.partial,
                           partial_stage, norm.added, added_stage, result_stage, &completed,
                           held, p_raw, result_raw, p);
    if (adds) { /* b = bf16(b_before + f), rounded once as cuda_add rounds */
        BfVector<8> f_raw[LV];
        narrow_lane_vectors<LV>(f_raw, added_stage, lane);
#pragma unroll
        for (int j = 0; j < LV; j++) {
            float f[8];
            vector_to_floats<8>(f_raw[j], f);
#pragma unroll
            for (int i = 0; i < 8; i++)
                p[8 * j + i] += f[i];
            p_raw[j] = vector_from_floats<8>(p + 8 * j);
            vector_to_floats<8>(p_raw[j], p + 8 * j); /* the merge reads the stored bits */
        }
        narrow_store_row<LV>(norm.partial, t, partial_stage, p_raw, lane);
    }
    merge_narrow_token<LV>(out_raw, args.weights, args.rstd, result_raw, completed, held, p,
                           key_weight, N, H, args.tokens, t, args.inverse_width, args.eps,
                           lane);
    narrow_store_row<LV>(args.out, t, result_stage, out_raw, lane); /* x, left in the stage */

    /* rmsnorm_forward_kernel<32, CHUNKS> of x: chunk k of lane l is vector 32 k + l */
    uint4 x_raw[LV];
#pragma unroll
    for (int k = 0; k < LV; k++)
        x_raw[k] = result_stage[narrow_slot<LV>(32 * k + lane)].raw;
    rmsnorm_row_forward<32, LV, true>(reinterpret_cast<bfloat *>(norm.normed) + (size_t)t * d,
                                      norm.rstd + t, x_raw,
                                      reinterpret_cast<const bfloat *>(norm.weight), d,
                                      norm.eps, nullptr);
}

template <int LV>
static void merge_norm_launch(const MergeArgs &args, const MergeNormArgs &norm,
                              cudaStream_t stream)
{
    const int warps_per_block = MERGE_NORM_THREADS / 32;
    const int blocks = (args.tokens + warps_per_block - 1) / warps_per_block;
    merge_norm_forward_kernel<LV><<<blocks, MERGE_NORM_THREADS, 0, stream>>>(args, norm);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_route_merge_rmsnorm_forward(bf16 *x, bf16 *out, float *norm_rstd,
                                                 float *weights, float *rstd,
                                                 const bf16 *result, const float *lse,
                                                 const bf16 *partial, int n_sources,
                                                 const bf16 *query, const bf16 *key_norm,
                                                 const bf16 *norm_weight, int tokens, int d,
                                                 int heads, float eps, float norm_eps,
                                                 const CudaGateAdd *add, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0)
        return;
    const void *pointers[] = {x, out, result, partial, add ? add->partial_before : NULL,
                              add ? add->added : NULL, query, key_norm, norm_weight};
    const bool one_pass = d / 256 <= MERGE_NORM_MAX_LANE_VECTORS &&
                          merge_narrow_fits(d, heads, pointers, 9);
    if (!one_pass) {
        if (add)
            cuda_add(add->partial, add->partial_before, add->added, (size_t)tokens * d, stream);
        cuda_route_merge_forward(x, weights, rstd, result, lse, partial, n_sources, query,
                                 key_norm, tokens, d, heads, eps, stream);
        cuda_rmsnorm_forward(out, norm_rstd, x, norm_weight, tokens, d, norm_eps, stream);
        return;
    }
    const MergeArgs args = merge_forward_args(x, weights, rstd, result, lse, partial,
                                              n_sources, query, key_norm, tokens, d, heads,
                                              eps);
    const MergeNormArgs norm = {add ? add->partial_before : NULL, add ? add->added : NULL,
                                add ? add->partial : NULL, out, norm_rstd, norm_weight,
                                norm_eps};
    switch (d / 256) {
    case 1: merge_norm_launch<1>(args, norm, stream); break;
    case 2: merge_norm_launch<2>(args, norm, stream); break;
    case 3: merge_norm_launch<3>(args, norm, stream); break;
    case 4: merge_norm_launch<4>(args, norm, stream); break;
    default: merge_norm_launch<5>(args, norm, stream); break;
    }
}
