/* kernels/cuda/route_block_forward.cuh — what the block route forward's kernels share
 * (route_block_forward_cuda.cu: a token a block; route_block_forward_pair_cuda.cu: two
 * tokens a block on tensor cores). CUDA C++ only; the contract is route_block_cuda.h's.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_BLOCK_FORWARD_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_BLOCK_FORWARD_CUH

#include "kernels/cuda/route_block_device.cuh"
#include "kernels/cuda/route_block_mma.cuh"

#include <math.h>

struct BlockForwardArgs {
    bf16 *results[CUDA_BLOCK_MAX_SITES];
    float *weights[CUDA_BLOCK_MAX_SITES]; /* [N, tokens, H] */
    float *rstd[CUDA_BLOCK_MAX_SITES];    /* [N, tokens] */
    float *lse[CUDA_BLOCK_MAX_SITES];     /* [tokens, H] or NULL */
    const bf16 *sources[CUDA_BLOCK_MAX_SOURCES];
    const bf16 *query[CUDA_BLOCK_MAX_SITES], *key_norm[CUDA_BLOCK_MAX_SITES];
    BlockHeads layout;
    float eps, inverse_width;
    int n_sources, n_sites, tokens, heads;
    int warp_heads_max; /* the most heads one warp's vectors touch */
};

/* Where site i's outputs go: its result rows and softmax records, for the lane's own i, so
 * that a kernel can fetch them once (the pair kernel: from a table in shared memory) where
 * selecting them from the parameter arrays took some 30 instructions a call. */
struct BlockSitePointers {
    bf16 *result;
    float *weights, *rstd, *lse;
};

__device__ __forceinline__ BlockSitePointers block_site_pointers(const BlockForwardArgs &args,
                                                                 int i)
{
    BlockSitePointers site;
    site.result = block_site_pointer(args.results, i);
    site.weights = block_site_pointer(args.weights, i);
    site.rstd = block_site_pointer(args.rstd, i);
    site.lse = block_site_pointer(args.lse, i);
    return site;
}

/* Where part p of site i's dot against source n lies in a token's dot parts, [parts][G][N]
 * (block_forward_mma_softmax). */
__device__ __forceinline__ size_t block_mma_dot_at(int p, int i, int n, int G, int N)
{
    return ((size_t)p * G + i) * N + n;
}

/* The heads that warp w's vectors touch: first .. last. */
__host__ __device__ __forceinline__ void block_warp_heads(const BlockHeads &layout, int warp,
                                                          int *first, int *last)
{
    const int from = warp * layout.warp_vectors, end = from + layout.warp_vectors - 1;
    const int to = end < layout.vectors ? end : layout.vectors - 1;
    *first = from / layout.head_vectors;
    *last = to / layout.head_vectors;
}

/* Step 2 on tensor cores, where every warp lies in one head: the softmax of the warp's head
 * for every site, with all 32 lanes at work. Lane (i, q) = (lane / 4, lane % 4) takes site i
 * and the sources q, q + 4, q + 8, ..; the site's max and sum over its four lanes go through
 * two xor shuffles, whose additions are commutative, so the four lanes, and every warp of the
 * head, hold the same bits. r of source n is summed by lanes 2n and 2n + 1 (the even and the
 * odd warps' squares). `site_out` holds site i's pointers (block_site_pointers). (The
 * per-thread kernel's loop, a lane a (site, head), kept 8 of 32 lanes busy at H 8 and walked
 * the N sources, the warps' squares and the parts one after another: a quarter of the
 * kernel's stalls, 2026-12-02.) The parts of the dots lie [parts][G][N] (block_mma_dot_at),
 * so that the lanes of a warp read consecutive words: laid [G][N][parts], a head of 16
 * parts (H 1 at d 4096) put the lanes' reads 16 words apart, 8 to a bank. */
template <int MAXN>
__device__ __forceinline__ void block_forward_mma_softmax(const BlockForwardArgs &args,
                                                          const BlockSitePointers &site_out,
                                                          const float *square_parts,
                                                          const float *dot_parts,
                                                          float *warp_coefficients, long long t)
{
    constexpr int PER_LANE = (MAXN + 3) / 4;
    const BlockHeads &layout = args.layout;
    const int N = args.n_sources, G = args.n_sites, H = args.heads, tokens = args.tokens;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int stride = args.warp_heads_max;
    const int h = warp / layout.warps_per_head, i = lane >> 2, q = lane & 3;
    const bool writer = warp == h * layout.warps_per_head, site = i < G;
    float *const rstd = site_out.rstd, *const weights = site_out.weights;
    float *const lse = site_out.lse;

    float square = 0.0f; /* lanes 2n, 2n + 1: source n; unrolled to the most warps a block
                          * has, predicated (a loop to `warps` took some 70 instructions) */
    if (lane >> 1 < N) {
        const float *parts_of_source = square_parts + (lane >> 1) * warps;
#pragma unroll
        for (int k = 0; k < BLOCK_MAX_THREADS / 64; k++) {
            const int w = 2 * k + (lane & 1);
            if (w < warps)
                square += parts_of_source[w];
        }
    }
    square += __shfl_xor_sync(0xffffffffu, square, 1);
    const float r_of_lane = rsqrtf(square * args.inverse_width + args.eps);

    int from, to;
    block_head_parts(layout, h, &from, &to);
    float z[PER_LANE], r[PER_LANE], top = -INFINITY;
#pragma unroll
    for (int k = 0; k < PER_LANE; k++) {
        const int n = q + 4 * k;
        r[k] = __shfl_sync(0xffffffffu, r_of_lane, (2 * n) & 31);
        z[k] = -INFINITY;
        if (site && n < N) {
            float dot = 0.0f;
            for (int p = from; p <= to; p++)
                dot += dot_parts[block_mma_dot_at(p, i, n, G, N)];
            z[k] = r[k] * dot;
            top = fmaxf(top, z[k]);
            if (warp == 0)
                rstd[(long long)n * tokens + t] = r[k];
        }
    }
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_LANE; k++) {
        z[k] = site && q + 4 * k < N ? __expf(z[k] - top) : 0.0f;
        total += z[k];
    }
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const float inverse = __frcp_rn(total); /* exact for N a power of two at equal scores */
#pragma unroll
    for (int k = 0; k < PER_LANE; k++) {
        const int n = q + 4 * k;
        if (!site || n >= N)
            continue;
        const float a = z[k] * inverse;
        warp_coefficients[((size_t)i * N + n) * stride] = a;
        if (writer)
            weights[((long long)n * tokens + t) * H + h] = a;
    }
    if (writer && site && q == 0 && lse)
        lse[t * H + h] = top + __logf(total);
    __syncwarp();
}

/* Two tokens a block on tensor cores (route_block_forward_pair_cuda.cu), where it applies:
 * a tensor-core layout (heads of whole warps, or the split layout), N <=
 * ROUTE_BLOCK_PAIR_MAX_SOURCES, and the four token buffers within shared memory. Returns
 * false, launching nothing, where it does not. */
enum { ROUTE_BLOCK_PAIR_MAX_SOURCES = 6 };
bool route_block_forward_pairs(const BlockForwardArgs &args, int threads, cudaStream_t stream);

#endif
