/* kernels/cuda/route_block_cuda.cu — the two-phase Route's entries (route_block_cuda.h):
 * the dispatch of phase one to the block kernels (route_block_device.cuh) or, for shapes they
 * do not take, to the per-site kernels of route_cuda.h once a site; and the fixed-order
 * reduction of per-block channel sums into dquery, dkey_norm (and dalpha, and a plain row
 * such as a norm's dweight) that the backward kernels and the merges (route_merge_cuda.cu)
 * share.
 */
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_block_device.cuh"
#include "kernels/cuda/route_device.cuh"

#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/ordered_sum.cuh"

#include <limits.h>
#include <math.h>

enum { REDUCE_SLICES = 8, REDUCE_BATCH = 16 };

/* ---- the reduction of per-block channel sums ---- */

/* For site i = blockIdx.y: S_c = the blocks' sums in block order (REDUCE_SLICES strided sums,
 * then those in order), dq_c += g_c S_c, dg_c += q_c S_c; *dalpha += its terms (a strided
 * sum a thread, then the threads' sums in a fixed order). The last y, where there is a plain
 * row: plain_sum_c += the same sum of plain_partials. Block: REDUCE_SLICES warps x 32
 * channels. */
__global__ void route_block_reduce_kernel(const __grid_constant__ BlockReduceArgs args)
{
    __shared__ float slices[REDUCE_SLICES][32];
    const int site = blockIdx.y, d = args.d;
    const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    const bool plain = args.plain_sum && blockIdx.y == gridDim.y - 1;
    const float *partials =
        plain ? args.plain_partials : args.partials + (long long)site * args.blocks * d;
    /* a slice's rows 16 at a time: the merges' 264 blocks give a slice 33, two batches and
     * a term where batches of 8 took four and a term (the rows were just written and sit in
     * L2: the launch waits on a round trip to it a batch) */
    float sum = 0.0f;
    if (c < d)
        sum = ordered_strided_sum<REDUCE_BATCH>(partials + (long long)slice * d + c,
                                                strided_count(slice, args.blocks, REDUCE_SLICES),
                                                (long long)REDUCE_SLICES * d);
    slices[slice][lane] = sum;
    __syncthreads();
    if (slice == 0 && c < d) {
        float total = 0.0f;
        for (int k = 0; k < REDUCE_SLICES; k++)
            total += slices[k][lane];
        if (plain) {
            args.plain_sum[c] += total;
        } else {
            args.dquery[site][c] += bf16_bits_to_float(args.key_norm[site][c]) * total;
            args.dkey_norm[site][c] += bf16_bits_to_float(args.query[site][c]) * total;
        }
    }
    if (plain) /* uniform over the block: no dalpha past the sites */
        return;
    /* dalpha: every thread of the site's first block sums a stride of the token terms
     * (ordered_strided_sum), then each lane of warp 0 its eight slices in order, then
     * warp_sum's fixed tree over the lanes. One warp's 256 terms a lane at 8192 tokens
     * kept the launch waiting on 32 round trips to memory after the channel sums were done
     * (19 us a launch in the 1B MHAR delta step, H100, 2026-12-06); the loads go
     * REDUCE_BATCH at a time (at 32, one short batch of 32 terms, the compiler issued each
     * load behind the add before it: 8 us a launch then, "2026-12-06 (late night)"). */
    if (args.dalpha[site] && blockIdx.x == 0) { /* uniform over the block */
        const float *alpha_partials = args.alpha_partials + (long long)site * args.alpha_blocks;
        const int thread = threadIdx.x, threads = blockDim.x;
        __syncthreads(); /* the channel sums' slices are read */
        slices[slice][lane] = ordered_strided_sum<REDUCE_BATCH>(
            alpha_partials + thread, strided_count(thread, args.alpha_blocks, threads), threads);
        __syncthreads();
        if (slice == 0) {
            float alpha = 0.0f;
            for (int k = 0; k < REDUCE_SLICES; k++)
                alpha += slices[k][lane];
            alpha = warp_sum(alpha);
            if (lane == 0)
                *args.dalpha[site] += alpha;
        }
    }
}

void route_block_reduce(const BlockReduceArgs &args, int n_sites, cudaStream_t stream)
{
    const int rows = n_sites + (args.plain_sum ? 1 : 0);
    if (rows == 0 || args.d <= 0)
        return;
    dim3 grid((unsigned)((args.d + 31) / 32), (unsigned)rows);
    route_block_reduce_kernel<<<grid, 32 * REDUCE_SLICES, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

/* ---- phase one: the block kernels, or the per-site kernels once a site ---- */

BlockHeads block_heads(int n_sources, int n_sites, int d, int heads)
{
    BlockHeads split;
    if (!cuda_route_block_split_heads() || !block_heads_split(d, heads, &split) ||
        route_block_forward_shared_bytes(split, n_sources, n_sites) > BLOCK_SHARED_LIMIT ||
        route_block_dots_shared_bytes(split, n_sources, n_sites) > BLOCK_SHARED_LIMIT)
        return block_heads_rows(d, heads);
    return split;
}

extern "C" CudaRouteBlockLayout cuda_route_block_layout(int n_sources, int n_sites, int d,
                                                        int heads)
{
    CudaRouteBlockLayout out = {"per_site", "per_site", 0, 0, 0, 0, 0, 0};
    if (!route_block_fits(n_sources, n_sites, d, heads))
        return out;
    const BlockHeads layout = block_heads(n_sources, n_sites, d, heads);
    out.kernels = !layout.tensor_cores ? "simt" : layout.warp_vectors < 32 ? "mma_split" : "mma";
    out.threads = layout.threads;
    out.warp_vectors = layout.warp_vectors;
    out.k_steps = layout.tensor_cores ? layout.k_steps : 0;
    out.backward = route_block_one_pass_takes(layout, n_sources, n_sites, d, heads)
                       ? "one_pass"
                       : "two_pass";
    out.walk_threads = block_walk_threads(d);
    out.walk_resident = route_block_walk_resident(n_sources, n_sites, d, heads);
    out.walk_blocks = route_block_walk_blocks(INT_MAX, n_sources, n_sites, d, heads);
    return out;
}

extern "C" size_t cuda_route_block_forward_workspace_floats(int n_sources, int n_sites,
                                                            int tokens, int d, int heads)
{
    (void)n_sources, (void)n_sites, (void)tokens, (void)d, (void)heads;
    return 1; /* neither path needs one */
}

extern "C" void cuda_route_block_forward(bf16 *const *results, float *const *weights,
                                         float *const *rstd, float *const *lse,
                                         const bf16 *const *sources, int n_sources,
                                         const bf16 *const *queries,
                                         const bf16 *const *key_norms, int n_sites,
                                         int tokens, int d, int heads, float eps,
                                         float *workspace, cudaStream_t stream)
{
    (void)workspace;
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0 || n_sites <= 0)
        return;
    const void *pointers[CUDA_ROUTE_MAX_SOURCES + 3 * CUDA_BLOCK_MAX_SITES];
    int count = 0;
    for (int n = 0; n < n_sources && count < CUDA_ROUTE_MAX_SOURCES; n++)
        pointers[count++] = sources[n];
    for (int i = 0; i < n_sites && i < CUDA_BLOCK_MAX_SITES; i++) {
        pointers[count++] = results[i];
        pointers[count++] = queries[i];
        pointers[count++] = key_norms[i];
    }
    if (route_block_fits(n_sources, n_sites, d, heads) && pointers_aligned(pointers, count, 16)) {
        route_block_forward_fast(results, weights, rstd, lse, sources, n_sources, queries,
                                 key_norms, n_sites, tokens, d, heads, eps, stream);
        return;
    }
    for (int i = 0; i < n_sites; i++)
        route_forward_lse(results[i], weights[i], rstd[i], lse ? lse[i] : NULL, sources,
                          n_sources, queries[i], key_norms[i], NULL, NULL, tokens, d, heads,
                          eps, stream);
}

extern "C" size_t cuda_route_block_backward_workspace_floats(int n_sources, int n_sites,
                                                             int tokens, int d, int heads)
{
    const size_t per_site = cuda_route_backward_workspace_floats(tokens, d);
    const size_t fast = route_block_backward_fast_workspace_floats(n_sources, n_sites, tokens,
                                                                    d, heads);
    return per_site > fast ? per_site : fast;
}

extern "C" void cuda_route_block_backward(bf16 *const *dsources, unsigned dsources_written,
                                          float *const *dqueries,
                                          float *const *dkey_norms, float *const *dalphas,
                                          const bf16 *const *douts, const bf16 *const *sources,
                                          int n_sources, const float *const *weights,
                                          const float *rstd, const bf16 *const *queries,
                                          const bf16 *const *key_norms,
                                          const float *const *alphas, const float *const *means,
                                          int n_sites, float *workspace, int tokens, int d,
                                          int heads, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0 || n_sites <= 0)
        return;
    const void *pointers[2 * CUDA_ROUTE_MAX_SOURCES + 3 * CUDA_BLOCK_MAX_SITES];
    int count = 0;
    for (int n = 0; n < n_sources && n < CUDA_ROUTE_MAX_SOURCES; n++) {
        pointers[count++] = sources[n];
        pointers[count++] = dsources[n];
    }
    for (int i = 0; i < n_sites && i < CUDA_BLOCK_MAX_SITES; i++) {
        pointers[count++] = douts[i];
        pointers[count++] = queries[i];
        pointers[count++] = key_norms[i];
    }
    if (route_block_fits(n_sources, n_sites, d, heads) && pointers_aligned(pointers, count, 16)) {
        route_block_backward_fast(dsources, dsources_written, dqueries, dkey_norms, dalphas,
                                  douts, sources,
                                  n_sources, weights, rstd, queries, key_norms, alphas, means,
                                  n_sites, workspace, tokens, d, heads, stream);
        return;
    }
    for (int n = 0; n < n_sources; n++) /* the per-site kernels add: into zeros */
        if (dsources[n] && (dsources_written >> n & 1u))
            CUDA_CHECK(cudaMemsetAsync(dsources[n], 0, (size_t)tokens * d * sizeof(bf16), stream));
    for (int i = 0; i < n_sites; i++)
        route_backward_centred(dsources, dqueries[i], dkey_norms[i], alphas ? dalphas[i] : NULL,
                               douts[i], sources, n_sources, weights[i], rstd, queries[i],
                               key_norms[i], alphas ? alphas[i] : NULL, means ? means[i] : NULL,
                               workspace, tokens, d, heads, stream);
}
