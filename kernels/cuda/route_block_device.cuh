/* kernels/cuda/route_block_device.cuh — what the two-phase Route's files share
 * (route_block_cuda.cu: the entries and the merges; route_block_forward_cuda.cu,
 * route_block_dots_cuda.cu and route_block_backward_cuda.cu: the block kernels). CUDA C++
 * only; the contract is route_block_cuda.h's.
 *
 * The block kernels' row layout: a block a token (persistent grid), thread t owning vector t
 * (8 channels, 16 bytes) of the row, threads = d / 8 rounded up to a warp, at most 512. A
 * per-head sum over the block is made as route_cuda.cu makes it: where a warp lies in one
 * head (head_vectors % 32 == 0) warp_transpose_sum gives each warp's share of many sums at
 * once and the parts of head h are its warps; otherwise each sum goes through
 * warp_segment_sum and the parts are the segments of route_device.cuh. The parts of a sum
 * are added in their order: every thread that reads a sum gets the same bits.
 *
 * The split layout (tensor cores only, FATHOM_ROUTE_BLOCK=mma_all): where a head is not whole
 * warps but splits evenly into warps of 16, 20 or 24 vectors (head_dim 128, 160 or 192, or
 * twice that), warp w owns the warp_vectors vectors from w * warp_vectors on, its lanes past
 * them idle in the loads, so that every warp again lies in one head and its products run
 * over whole k-steps of 16 channels: at d 1280 with H 8, eight warps of 20 vectors, where the
 * row layout puts heads inside warps and only the per-thread kernels take it. A call takes
 * its layout from block_heads (its N and G: where the split's shared memory does not fit,
 * the row layout).
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_BLOCK_DEVICE_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_BLOCK_DEVICE_CUH

#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"

enum {
    BLOCK_MAX_THREADS = 512,      /* d <= 4096 */
    BLOCK_SHARED_LIMIT = 227 * 1024,
    /* the backward walker's grid is a function of the shapes only (the token ranges fix the
     * order of the sums over tokens): one wave of the blocks an H100's or H200's 132
     * multiprocessors hold, each 228 KB of shared memory less 1 KB a block, at most
     * BLOCK_WALK_MAX_RESIDENT a multiprocessor (its launch bounds) */
    BLOCK_WALK_MULTIPROCESSORS = 132,
    BLOCK_MULTIPROCESSOR_SHARED = 228 * 1024,
    BLOCK_RESERVED_SHARED = 1024,
    BLOCK_WALK_VEC = 4,            /* channels a walker thread owns (8-byte loads) */
    /* a walker block's threads: a slice of 512 channels, or of 640 where that leaves fewer
     * idle (block_walk_threads); held to 128 registers, so 4 and 3 blocks a multiprocessor */
    BLOCK_WALK_THREADS = 128,
    BLOCK_WALK_THREADS_WIDE = 160,
    BLOCK_WALK_REGISTERS = 128,
    BLOCK_WALK_MAX_RESIDENT = 4,
};

/* The walker's threads a block at width d: slices of 128 x 4 channels, or 160 x 4 where
 * those leave fewer channels idle. At d 1280 slices of 512 are 512, 512 and 256: the last
 * block's threads are half idle, and at N 9 to 12, where three blocks fit a multiprocessor,
 * a sixth of the resident threads did nothing (the walker at 2.0 and 1.6 TB/s there,
 * 2.4-2.5 at N <= 6; docs/performance.md, 2026-12-06, late). Two slices of 640 have none. */
__host__ __device__ constexpr int block_walk_threads(int d)
{
    return (d + BLOCK_WALK_THREADS_WIDE * BLOCK_WALK_VEC - 1) /
                       (BLOCK_WALK_THREADS_WIDE * BLOCK_WALK_VEC) * BLOCK_WALK_THREADS_WIDE <
                   (d + BLOCK_WALK_THREADS * BLOCK_WALK_VEC - 1) /
                       (BLOCK_WALK_THREADS * BLOCK_WALK_VEC) * BLOCK_WALK_THREADS
               ? BLOCK_WALK_THREADS_WIDE
               : BLOCK_WALK_THREADS;
}

/* The most walker blocks of `threads` a multiprocessor holds at BLOCK_WALK_REGISTERS: its
 * launch bounds. */
__host__ __device__ constexpr int block_walk_max_resident(int threads)
{
    return 65536 / (threads * BLOCK_WALK_REGISTERS) < BLOCK_WALK_MAX_RESIDENT
               ? 65536 / (threads * BLOCK_WALK_REGISTERS)
               : BLOCK_WALK_MAX_RESIDENT;
}

/* The fixed-order reduction of per-block channel sums S into dq += g S, dg += q S, and of
 * per-block dalpha sums (route_block_cuda.cu). partials [sites][blocks][d]; alpha_partials
 * [sites][alpha_blocks]; a NULL dalpha[i] skips it. plain_sum (NULL: none) is one more row
 * reduced in the same launch and the same order: plain_sum[c] += the sum over the blocks of
 * plain_partials [blocks][d] (a norm's dweight beside the merge's sums, one launch where
 * two were). */
struct BlockReduceArgs {
    float *dquery[CUDA_BLOCK_MAX_SITES], *dkey_norm[CUDA_BLOCK_MAX_SITES];
    float *dalpha[CUDA_BLOCK_MAX_SITES];
    const bf16 *query[CUDA_BLOCK_MAX_SITES], *key_norm[CUDA_BLOCK_MAX_SITES];
    const float *partials, *alpha_partials;
    float *plain_sum;
    const float *plain_partials;
    int blocks, alpha_blocks, d;
};

void route_block_reduce(const BlockReduceArgs &args, int n_sites, cudaStream_t stream);

/* Where a token's per-head sums over the block's threads go, and which kernels run (see the
 * top of this file). warp_vectors: the vectors a warp owns (32, or the split layout's);
 * tensor_cores: the kernels of route_block_mma.cuh, k_steps a warp (warp_vectors / 2). */
struct BlockHeads {
    int vectors, head_vectors, segment_period, parts, warp_heads, warps_per_head;
    int warp_vectors, threads, tensor_cores, k_steps;
};

/* The split layout's warp widths, in k-steps of 16 channels: head_dim 128, 160 (the 1B
 * graft, d 1280 with H 8) and 192. Even, so that the pair forward's mix takes two k-steps an
 * iteration. The launches of route_block_forward_cuda.cu, route_block_forward_pair_cuda.cu
 * and route_block_dots_cuda.cu name each (8, 10, 12) and the whole warp's 16. */
enum { BLOCK_SPLIT_STEPS_MIN = 8, BLOCK_SPLIT_STEPS_MAX = 12 };
static_assert(BLOCK_SPLIT_STEPS_MIN == 8 && BLOCK_SPLIT_STEPS_MAX == 12,
              "the block kernels' launches switch over k-steps 8, 10, 12 and 16");

/* The row layout (thread t owns vector t; see the top of this file), on tensor cores where
 * a head is whole warps and the choice allows it. */
static inline BlockHeads block_heads_rows(int d, int heads)
{
    BlockHeads layout;
    layout.vectors = d / 8;
    layout.head_vectors = d / heads / 8;
    layout.segment_period =
        32 / greatest_common_divisor(32, layout.head_vectors) * layout.head_vectors;
    const int threads = (layout.vectors + 31) / 32 * 32, last = layout.vectors - 1;
    layout.warp_heads = layout.head_vectors % 32 == 0;
    layout.warps_per_head = layout.warp_heads ? layout.head_vectors / 32 : 0;
    layout.parts = layout.warp_heads
                       ? threads / 32
                       : last / 32 + last / layout.head_vectors - last / layout.segment_period + 1;
    layout.warp_vectors = 32;
    layout.threads = threads;
    layout.tensor_cores = cuda_route_block_tensor_cores() && layout.warp_heads &&
                          layout.vectors % 32 == 0;
    layout.k_steps = 16;
    return layout;
}

/* The split layout of (d, heads) into *layout: the head over the fewest warps of at most 32
 * vectors each; false where those warps would not hold a multiple of 4 vectors from 16 to
 * 24, or would take more than BLOCK_MAX_THREADS threads. */
static inline bool block_heads_split(int d, int heads, BlockHeads *layout)
{
    *layout = block_heads_rows(d, heads);
    if (layout->warp_heads || layout->head_vectors < 1)
        return false;
    const int warps_per_head = (layout->head_vectors + 31) / 32;
    const int warp_vectors = layout->head_vectors / warps_per_head;
    const int warps = heads * warps_per_head;
    if (layout->head_vectors % warps_per_head != 0 || warp_vectors % 4 != 0 ||
        warp_vectors / 2 < BLOCK_SPLIT_STEPS_MIN || warp_vectors / 2 > BLOCK_SPLIT_STEPS_MAX ||
        warps * 32 > BLOCK_MAX_THREADS)
        return false;
    layout->warp_heads = 1;
    layout->warps_per_head = warps_per_head;
    layout->parts = warps;
    layout->warp_vectors = warp_vectors;
    layout->threads = warps * 32;
    layout->tensor_cores = 1;
    layout->k_steps = warp_vectors / 2;
    return true;
}

/* The shared memory a launch of the forward (the one-token kernel) and of the backward's
 * dots kernel needs at the least in `layout` for N sources and G sites
 * (route_block_forward_cuda.cu, route_block_dots_cuda.cu). */
size_t route_block_forward_shared_bytes(const BlockHeads &layout, int n_sources, int n_sites);
size_t route_block_dots_shared_bytes(const BlockHeads &layout, int n_sources, int n_sites);

/* The layout of a call with N sources and G sites (route_block_cuda.cu): the split layout
 * where FATHOM_ROUTE_BLOCK=mma_all, the head splits and both kernels' shared memory fits (the
 * split layout's 32 slots a warp take more of it than the rows do); else the row layout. */
BlockHeads block_heads(int n_sources, int n_sites, int d, int heads);

/* The parts of head h: warps h * warps_per_head .. , or its segments. */
__device__ __forceinline__ void block_head_parts(const BlockHeads &layout, int h, int *from,
                                                 int *to)
{
    if (layout.warp_heads) {
        *from = h * layout.warps_per_head;
        *to = *from + layout.warps_per_head - 1;
    } else {
        *from = segment_index(h * layout.head_vectors, layout.head_vectors,
                              layout.segment_period);
        *to = segment_index((h + 1) * layout.head_vectors - 1, layout.head_vectors,
                            layout.segment_period);
    }
}

/* Sums the K values of every thread over each thread's head (part per warp or segment) into
 * parts[k * stride + part * part_stride], k < count (count uniform over the block). All
 * threads call it. */
template <int K>
__device__ __forceinline__ void block_head_reduce(float (&values)[K], float *parts, int stride,
                                                  int part_stride, int count,
                                                  const BlockHeads &layout,
                                                  const SlotPlace &place)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (layout.warp_heads) {
        int index;
        const float sum = warp_transpose_sum<K>(values, lane, &index);
        if (index >= 0 && index < count)
            parts[index * stride + warp * part_stride] = sum;
        return;
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (k >= count)
            continue; /* uniform */
        const float sum = warp_segment_sum(values[k], lane, place.reach);
        if (place.starts_segment)
            parts[k * stride + place.segment * part_stride] = sum;
    }
}

/* Sums K values of every thread over the whole block into parts[k * warps + warp] (the
 * warps' shares; the reader adds them in warp order). */
template <int K>
__device__ __forceinline__ void block_row_reduce(float (&values)[K], float *parts, int count)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int index;
    const float sum = warp_transpose_sum<K>(values, lane, &index);
    if (index >= 0 && index < count)
        parts[index * warps + warp] = sum;
}

/* The backward's first two launches (route_block_dots_cuda.cu): the dots of every site
 * against every source, then each token's coefficients for the walker. */
struct BlockDotsArgs {
    const bf16 *sources[CUDA_BLOCK_MAX_SOURCES];
    const bf16 *douts[CUDA_BLOCK_MAX_SITES];
    const float *weights[CUDA_BLOCK_MAX_SITES]; /* site i's [N_i, tokens, H] */
    const float *rstd;                          /* [N, tokens] */
    const bf16 *query[CUDA_BLOCK_MAX_SITES], *key_norm[CUDA_BLOCK_MAX_SITES];
    const float *alpha[CUDA_BLOCK_MAX_SITES];   /* device [1] each, or all NULL */
    const float *means[CUDA_BLOCK_MAX_SITES];   /* [tokens, H] each, or all NULL */
    float *parts;        /* [tokens][parts][G][2][N]: the warps' or segments' shares of D, P */
    float *coefficients; /* [tokens][N][H][2G]: a scale_i at i, r dz at G + i */
    float *self_terms;   /* [tokens][N] e_n */
    float *alpha_terms;  /* [G][tokens] sum_{n,h} a D; fused: [G][blocks][H] (<= tokens) */
    BlockHeads layout;
    float inverse_width;
    int n_sources, n_sites, tokens, heads;
};

/* Whether the dots' warps make the coefficients themselves (route_block_dots_cuda.cu): on
 * tensor cores where each warp's products are one whole head (a head of one warp, in the
 * row or the split layout). Then the coefficients kernel does not run: the parts hold each
 * head's share of e_n, [tokens][N][H], a small launch adds them into self_terms, and
 * alpha_terms holds each block's and head's sums, [G][blocks][H] (otherwise [G][tokens]). */
__host__ __device__ __forceinline__ bool block_dots_fused(const BlockHeads &layout)
{
    return layout.tensor_cores && layout.warps_per_head == 1;
}

/* The one-pass backward (route_block_one_pass_cuda.cu): whether it takes this call (a warp
 * a whole head, at most 8 heads, its shared memory within the device's, and
 * FATHOM_ROUTE_BLOCK_BACKWARD not two_pass); its grid (the blocks 132 multiprocessors hold,
 * at most one a token); and the launch: ds_n added into (or written where dsources_written
 * says), S [G][blocks][d] into partials and the dalpha terms [G][blocks][H] into
 * dots.alpha_terms for route_block_reduce. Returns the blocks. */
bool route_block_one_pass_takes(const BlockHeads &layout, int n_sources, int n_sites, int d,
                                int heads);
int route_block_one_pass_blocks(const BlockHeads &layout, int n_sources, int n_sites,
                                int tokens, int d, int heads);
int route_block_one_pass(const BlockDotsArgs &dots, bf16 *const *dsources,
                         unsigned dsources_written, float *partials, int d,
                         cudaStream_t stream);

/* The floats of BlockDotsArgs.parts. */
size_t route_block_parts_floats(int n_sources, int n_sites, int tokens, int d, int heads);

/* Returns the dalpha terms it wrote a site: [G][tokens], or where the dots make the
 * coefficients (block_dots_fused) each block's and head's sums over its tokens,
 * [G][blocks][H]. */
int route_block_dots(const BlockDotsArgs &args, cudaStream_t stream);

/* Starts the copies of this thread's vector of token t of each of `count` rows into `to`
 * ([count][threads] 16-byte vectors, the thread's own slots) and commits; an empty group
 * past the tokens or for a thread past the row, so that every wait counts the same groups. */
__device__ __forceinline__ void block_fetch_rows(BfVector<8> *to, const bf16 *const *rows,
                                                 int count, long long t, int tokens,
                                                 int vectors, bool valid)
{
    if (t < tokens && valid)
        for (int n = 0; n < count; n++)
            copy_vector_async<8>(to + n * blockDim.x + threadIdx.x, rows[n],
                                 t * vectors + threadIdx.x);
    copy_async_commit();
}

/* One float global -> shared through cp.async, committed and waited on as the rows are. */
__device__ __forceinline__ void copy_float_async(float *shared_destination, const float *from)
{
    const unsigned to = (unsigned)__cvta_generic_to_shared(shared_destination);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(from) : "memory");
}

/* This thread's vector of each of the token's N staged rows ([N][threads] from `rows`) as
 * floats, converted once; zeros past N and for a thread past the row. */
template <int MAXN>
__device__ __forceinline__ void block_rows_to_floats(const BfVector<8> *rows, int N, bool valid,
                                                     float (&x)[MAXN][8])
{
#pragma unroll
    for (int n = 0; n < MAXN; n++)
        vector_to_floats<8>(n < N && valid ? rows[n * blockDim.x + threadIdx.x]
                                           : vector_zero<8>(),
                            x[n]);
}

/* q_i * g_i of this thread's 8 channels (vector v): fp32 products of the bf16 weights, zeros
 * for a thread past the row. The token-layout kernels read them for every site of every
 * token; where their shared memory has room they stage them once a block in `staged`
 * ([G][threads][2] float4, a thread reading only its own), otherwise each read is two
 * 16-byte loads that miss L1 (the rows take it) and wait on L2. */
__device__ __forceinline__ void block_key_weight_load(const bf16 *query, const bf16 *key_norm,
                                                      int v, bool valid, float (&out)[8])
{
    float q[8] = {0}, g[8] = {0};
    if (valid) {
        vector_to_floats<8>(vector_load<8>(query, v), q);
        vector_to_floats<8>(vector_load<8>(key_norm, v), g);
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        out[k] = q[k] * g[k];
}

__device__ __forceinline__ void block_key_weights_stage(float4 *staged,
                                                        const bf16 *const *query,
                                                        const bf16 *const *key_norm, int n_sites,
                                                        int v, bool valid)
{
    if (!staged)
        return;
    for (int i = 0; i < n_sites; i++) {
        float w[8];
        block_key_weight_load(query[i], key_norm[i], v, valid, w);
        float4 *to = staged + ((size_t)i * blockDim.x + threadIdx.x) * 2;
        to[0] = make_float4(w[0], w[1], w[2], w[3]);
        to[1] = make_float4(w[4], w[5], w[6], w[7]);
    }
}

__device__ __forceinline__ void block_key_weight(const float4 *staged, const bf16 *query,
                                                 const bf16 *key_norm, int i, int v, bool valid,
                                                 float (&out)[8])
{
    if (!staged) {
        block_key_weight_load(query, key_norm, v, valid, out);
        return;
    }
    const float4 *from = staged + ((size_t)i * blockDim.x + threadIdx.x) * 2;
    const float4 low = from[0], high = from[1];
    out[0] = low.x, out[1] = low.y, out[2] = low.z, out[3] = low.w;
    out[4] = high.x, out[5] = high.y, out[6] = high.z, out[7] = high.w;
}

/* The bytes of the staged key weights. */
static inline size_t block_key_weights_bytes(int n_sites, int threads)
{
    return (size_t)n_sites * threads * 32;
}

/* The grid of a persistent token-layout kernel: as many blocks as stay resident, at most
 * one a token; the kernel's shared-memory carveout set to its largest on its first launch
 * (the attribute persists; one flag for each KERNEL). A kernel whose sums group its tokens
 * by block asks for the count as on BLOCK_WALK_MULTIPROCESSORS multiprocessors
 * (shapes_only), whatever the device has, so that every GPU of the architecture groups them
 * alike; a device with fewer runs the rest as a second wave. */
template <auto KERNEL>
static int block_persistent_grid(int threads, size_t bytes, long long tokens, const char *what,
                                 bool shapes_only = false)
{
    static bool carveout_set;
    if (!carveout_set) {
        CUDA_CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        carveout_set = true;
    }
    int blocks = resident_blocks(KERNEL, threads, bytes, what);
    if (shapes_only)
        blocks = blocks / cuda_multiprocessor_count() * BLOCK_WALK_MULTIPROCESSORS;
    return blocks < tokens ? blocks : (int)tokens;
}

/* ---- the entries of the block kernels (route_block_forward_cuda.cu,
 * route_block_backward_cuda.cu) ---- */

/* Whether the block kernels take this shape (the pointers' alignment is the caller's test):
 * N <= CUDA_BLOCK_MAX_SOURCES, G <= CUDA_BLOCK_MAX_SITES, d % 8 == 0, d <= 4096, head_dim a
 * multiple of 8, and both kernels' shared memory within the device's. */
bool route_block_fits(int n_sources, int n_sites, int d, int heads);

void route_block_forward_fast(bf16 *const *results, float *const *weights, float *const *rstd,
                              float *const *lse, const bf16 *const *sources, int n_sources,
                              const bf16 *const *queries, const bf16 *const *key_norms,
                              int n_sites, int tokens, int d, int heads, float eps,
                              cudaStream_t stream);

/* The backward walker's grid (route_block_backward_cuda.cu), a function of the shapes alone:
 * its blocks a multiprocessor at the shape's shared memory, and its blocks in all (channel
 * slices x token ranges: at most one wave of that many on BLOCK_WALK_MULTIPROCESSORS). */
int route_block_walk_resident(int n_sources, int n_sites, int d, int heads);
int route_block_walk_blocks(int tokens, int n_sources, int n_sites, int d, int heads);

size_t route_block_backward_fast_workspace_floats(int n_sources, int n_sites, int tokens,
                                                  int d, int heads);

void route_block_backward_fast(bf16 *const *dsources, unsigned dsources_written,
                               float *const *dqueries,
                               float *const *dkey_norms, float *const *dalphas,
                               const bf16 *const *douts, const bf16 *const *sources,
                               int n_sources, const float *const *weights, const float *rstd,
                               const bf16 *const *queries, const bf16 *const *key_norms,
                               const float *const *alphas, const float *const *means,
                               int n_sites, float *workspace, int tokens, int d, int heads,
                               cudaStream_t stream);

#endif
