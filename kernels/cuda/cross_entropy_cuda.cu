/* kernels/cuda/cross_entropy_cuda.cu — fused cross-entropy and z-loss over bf16 logits rows
 * (DESIGN 2, "Loss"; formulas of runtime/backend.h and kernels/cpu/cross_entropy_cpu.c).
 *
 * logits [rows, V] bf16, targets [rows], losses / lse / dloss [rows] fp32:
 *   lse_r    = logsumexp(logits[r, :])
 *   loss_r   = lse_r - logits[r, target_r] + z_loss * lse_r^2
 *   dlogits += or = (GradMode) dloss_r * (softmax(logits[r]) * (1 + 2 z_loss lse_r)
 *                                         - onehot(target_r))
 *
 * Forward: a row is read once, by a cluster of C blocks (C = 1, 2, 4 or 8) whose threads keep
 * their 8-column vectors of the row in registers: the fewest blocks whose part of the row is
 * at most ROW_BLOCK_COLUMNS = 16384 columns (8 vectors a thread; C is 8 at V 128256), or,
 * for a row longer than 8 such parts, 8 blocks of up to 32768 (ROW_MAX_VECTORS = 16 a
 * thread). Smaller blocks pay: at V 128256, 8 blocks of 8 vectors (64 registers, four
 * blocks a multiprocessor) wrote the gradient 11% sooner than 4 of 16 (two a
 * multiprocessor), whose blocks all waited on their barriers at once (docs/performance.md,
 * 2026-12-06, 18 h). Each thread keeps a running max m and a sum s of exp(x - m) over its
 * vectors in order, rescaling s when m grows (the "online softmax");
 * the (m, s) pairs are combined across the warp by a fixed butterfly, across warps in warp
 * order and across the cluster's blocks in rank order (distributed shared memory), so lse
 * has the same bits run to run. Everything is fp32.
 * The forward for a backward (cross_entropy_forward_backward) is the same kernel, which then
 * writes the gradient over the logits from the registers: one read and one write of the
 * logits, where the two launches took two reads and a write, and the same bits as the
 * forward followed by the backward (whose per-element terms it shares, gradient8).
 * Backward: elementwise given lse; a grid of (row, chunk of 8 * threads columns). A write
 * (GRAD_WRITE, or dlogits == logits: kernels_cuda.h, in place) adds each term to +0.0
 * instead of the old gradient: the bits of an add into zeros, nothing read.
 * A target >= V gives a NaN loss and no one-hot term (the device cannot call fatal).
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

#include "runtime/error.h"

#include <cooperative_groups.h>
#include <math.h>

namespace cg = cooperative_groups;

enum {
    CROSS_ENTROPY_THREADS = 512, /* the backward's blocks */
    ROW_THREADS = 256,           /* a cluster block's threads in the forward */
    ROW_VECTORS = 8,             /* 8-column vectors a thread holds: 32 registers */
    ROW_MAX_VECTORS = 16,        /* ... at most, for the longest rows: 64 registers */
    ROW_MAX_CLUSTER = 8,
    ROW_BLOCK_COLUMNS = ROW_THREADS * ROW_VECTORS * 8,
    ROW_MAX_BLOCK_COLUMNS = ROW_THREADS * ROW_MAX_VECTORS * 8,
};

/* The (max, sum of exp(x - max)) pair of the union of two sets of values; an empty set is
 * (-inf, 0) and contributes nothing (its exp(-inf - max) is never formed). */
__device__ __forceinline__ void combine_max_sum(float *max, float *sum, float other_max,
                                                float other_sum)
{
    float new_max = fmaxf(*max, other_max);
    if (new_max == -INFINITY)
        return;
    float mine = *max == -INFINITY ? 0.0f : *sum * __expf(*max - new_max);
    float theirs = other_max == -INFINITY ? 0.0f : other_sum * __expf(other_max - new_max);
    *max = new_max;
    *sum = mine + theirs;
}

/* The gradient of 8 columns from i, in the backward's order: each term added to the old
 * gradient, or to +0.0 (WRITE). */
template <bool WRITE>
__device__ __forceinline__ void gradient8(float grads[8], const float values[8], int i,
                                          float softmax_factor, float row_lse, float row_dloss,
                                          uint32_t target)
{
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float term = softmax_factor * __expf(values[k] - row_lse);
        if ((uint32_t)(i + k) == target)
            term -= row_dloss;
        grads[k] = (WRITE ? 0.0f : grads[k]) + term;
    }
}

/* The (max, sum) of the 8 columns from i that lie before `end`, into the running pair. */
__device__ __forceinline__ void combine_vector(float *running_max, float *running_sum,
                                               const float values[8], int i, int end)
{
    float chunk_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (i + k < end)
            chunk_max = fmaxf(chunk_max, values[k]);
    float chunk_sum = 0.0f;
    if (chunk_max != -INFINITY) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i + k < end)
                chunk_sum += __expf(values[k] - chunk_max);
    }
    combine_max_sum(running_max, running_sum, chunk_max, chunk_sum);
}

/* A cluster of C blocks a row (grid rows x C); block `rank` holds columns [rank * part,
 * (rank + 1) * part) of it, thread j the vectors j, j + ROW_THREADS, .. of those (VECTORS
 * of them at most). GRADIENT: the gradient then replaces the logits (dloss read). Two
 * cluster barriers: the blocks' pairs are written, then read by every block (none may exit
 * while another reads its pair). */
template <bool VECTOR, int VECTORS, bool GRADIENT>
__global__ void __launch_bounds__(ROW_THREADS)
    cross_entropy_rows_kernel(float *losses, float *lse, bfloat *logits, const float *dloss,
                              const uint32_t *targets, int V, int part, float z_loss)
{
    __shared__ float warp_max[ROW_THREADS / 32], warp_sum[ROW_THREADS / 32];
    __shared__ float block_pair[2];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank(), blocks = (int)cluster.num_blocks();
    const int row = blockIdx.x / blocks;
    bfloat *row_logits = logits + (size_t)row * V;
    const int begin = rank * part, end = begin + part < V ? begin + part : V;
    const uint32_t target = targets[row];
    /* read before any block of the cluster writes its gradient (after the second barrier) */
    float target_logit = NAN;
    if (rank == 0 && threadIdx.x == 0 && target < (uint32_t)V)
        target_logit = __bfloat162float(row_logits[target]);

    uint4 raw[VECTORS];
#pragma unroll
    for (int k = 0; k < VECTORS; k++) {
        const int i = begin + (threadIdx.x + k * ROW_THREADS) * 8;
        if (i < end)
            raw[k] = load8_raw<VECTOR>(row_logits, i, end);
    }
    float running_max = -INFINITY, running_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < VECTORS; k++) {
        const int i = begin + (threadIdx.x + k * ROW_THREADS) * 8;
        if (i < end) {
            float values[8];
            unpack8(values, raw[k]);
            combine_vector(&running_max, &running_sum, values, i, end);
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        float other_max = __shfl_xor_sync(0xffffffffu, running_max, offset);
        float other_sum = __shfl_xor_sync(0xffffffffu, running_sum, offset);
        combine_max_sum(&running_max, &running_sum, other_max, other_sum);
    }
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        warp_max[warp] = running_max;
        warp_sum[warp] = running_sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float block_max = warp_max[0], block_sum = warp_sum[0];
        for (int w = 1; w < ROW_THREADS / 32; w++)
            combine_max_sum(&block_max, &block_sum, warp_max[w], warp_sum[w]);
        block_pair[0] = block_max;
        block_pair[1] = block_sum;
    }
    cluster.sync();
    float row_max = -INFINITY, row_sum = 0.0f;
    for (int r = 0; r < blocks; r++) {
        const float *pair = cluster.map_shared_rank(block_pair, r);
        combine_max_sum(&row_max, &row_sum, pair[0], pair[1]);
    }
    cluster.sync();
    const float row_lse = row_max + logf(row_sum);
    if (rank == 0 && threadIdx.x == 0) {
        losses[row] = row_lse - target_logit + z_loss * row_lse * row_lse;
        lse[row] = row_lse;
    }
    if (!GRADIENT)
        return;
    const float row_dloss = dloss[row];
    const float softmax_factor = row_dloss * (1.0f + 2.0f * z_loss * row_lse);
#pragma unroll
    for (int k = 0; k < VECTORS; k++) {
        const int i = begin + (threadIdx.x + k * ROW_THREADS) * 8;
        if (i < end) {
            float values[8], grads[8];
            unpack8(values, raw[k]);
            gradient8<true>(grads, values, i, softmax_factor, row_lse, row_dloss, target);
            store8<VECTOR>(row_logits, i, end, grads);
        }
    }
}

/* grid (rows, chunks of CROSS_ENTROPY_THREADS * 8 columns) */
template <bool VECTOR, bool WRITE>
__global__ void __launch_bounds__(CROSS_ENTROPY_THREADS)
    cross_entropy_backward_kernel(bfloat *dlogits, const float *dloss, const bfloat *logits,
                                  const float *lse, const uint32_t *targets, int V,
                                  float z_loss)
{
    int row = blockIdx.x;
    int column = (blockIdx.y * CROSS_ENTROPY_THREADS + threadIdx.x) * 8;
    if (column >= V)
        return;
    float row_dloss = dloss[row], row_lse = lse[row];
    float softmax_factor = row_dloss * (1.0f + 2.0f * z_loss * row_lse);
    uint32_t target = targets[row];
    size_t offset = (size_t)row * V;

    float values[8], grads[8];
    load8<VECTOR>(values, logits + offset, column, V);
    if (!WRITE)
        load8<VECTOR>(grads, dlogits + offset, column, V);
    gradient8<WRITE>(grads, values, column, softmax_factor, row_lse, row_dloss, target);
    store8<VECTOR>(dlogits + offset, column, V, grads);
}

/* The cluster's blocks for a row of V: the fewest (a power of two, up to ROW_MAX_CLUSTER)
 * whose part holds at most ROW_BLOCK_COLUMNS columns, else ROW_MAX_CLUSTER of up to
 * ROW_MAX_BLOCK_COLUMNS. */
static int row_cluster_blocks(int V)
{
    int blocks = 1;
    while (blocks < ROW_MAX_CLUSTER && (V + blocks - 1) / blocks > ROW_BLOCK_COLUMNS)
        blocks *= 2;
    if ((V + blocks - 1) / blocks > ROW_MAX_BLOCK_COLUMNS)
        fatal(EXIT_CONFIG, "the cuda loss takes vocabularies of up to %d tokens, not %d",
              ROW_MAX_CLUSTER * ROW_MAX_BLOCK_COLUMNS, V);
    return blocks;
}

template <bool VECTOR, int VECTORS, bool GRADIENT>
static void rows_launch(float *losses, float *lse, bfloat *logits, const float *dloss,
                        const uint32_t *targets, int rows, int V, int blocks, int part,
                        float z_loss, cudaStream_t stream)
{
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)rows * (unsigned)blocks);
    config.blockDim = dim3(ROW_THREADS);
    config.stream = stream;
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = (unsigned)blocks;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&config, cross_entropy_rows_kernel<VECTOR, VECTORS, GRADIENT>,
                                  losses, lse, logits, dloss, targets, V, part, z_loss));
}

template <bool GRADIENT>
static void cross_entropy_rows(float *losses, float *lse, bfloat *logits, const float *dloss,
                               const uint32_t *targets, int rows, int V, float z_loss,
                               cudaStream_t stream)
{
    if (rows <= 0 || V <= 0)
        return;
    const int blocks = row_cluster_blocks(V);
    const int part = ((V + blocks - 1) / blocks + 7) / 8 * 8; /* whole vectors a block */
    const int vectors = (part / 8 + ROW_THREADS - 1) / ROW_THREADS;
    const bool vector = V % 8 == 0 && is_aligned_16(logits);
#define ROWS_LAUNCH(V_, N_)                                                                    \
    rows_launch<V_, N_, GRADIENT>(losses, lse, logits, dloss, targets, rows, V, blocks, part, \
                                  z_loss, stream)
    if (vectors <= 1)
        vector ? ROWS_LAUNCH(true, 1) : ROWS_LAUNCH(false, 1);
    else if (vectors <= 4)
        vector ? ROWS_LAUNCH(true, 4) : ROWS_LAUNCH(false, 4);
    else if (vectors <= 8)
        vector ? ROWS_LAUNCH(true, 8) : ROWS_LAUNCH(false, 8);
    else
        vector ? ROWS_LAUNCH(true, ROW_MAX_VECTORS) : ROWS_LAUNCH(false, ROW_MAX_VECTORS);
#undef ROWS_LAUNCH
}

extern "C" void cuda_cross_entropy_forward(float *losses, float *lse, const bf16 *logits,
                                           const uint32_t *targets, int rows, int V,
                                           float z_loss, cudaStream_t stream)
{
    /* GRADIENT false: the logits are only read */
    cross_entropy_rows<false>(losses, lse, (bfloat *)logits, NULL, targets, rows, V, z_loss,
                              stream);
}

extern "C" void cuda_cross_entropy_forward_backward(float *losses, float *lse, bf16 *logits,
                                                    const float *dloss, const uint32_t *targets,
                                                    int rows, int V, float z_loss,
                                                    cudaStream_t stream)
{
    cross_entropy_rows<true>(losses, lse, (bfloat *)logits, dloss, targets, rows, V, z_loss,
                             stream);
}

extern "C" void cuda_cross_entropy_backward(bf16 *dlogits, GradMode mode, const float *dloss,
                                            const bf16 *logits, const float *lse,
                                            const uint32_t *targets, int rows, int V,
                                            float z_loss, cudaStream_t stream)
{
    if (rows <= 0 || V <= 0)
        return;
    int columns_per_block = CROSS_ENTROPY_THREADS * 8;
    dim3 grid(rows, (V + columns_per_block - 1) / columns_per_block);
    bool vector = V % 8 == 0 && is_aligned_16(logits) && is_aligned_16(dlogits);
    bool write = mode == GRAD_WRITE || (const void *)dlogits == (const void *)logits;
    bfloat *out = (bfloat *)dlogits;
    const bfloat *in = (const bfloat *)logits;
    if (write && vector)
        cross_entropy_backward_kernel<true, true><<<grid, CROSS_ENTROPY_THREADS, 0, stream>>>(
            out, dloss, in, lse, targets, V, z_loss);
    else if (write)
        cross_entropy_backward_kernel<false, true><<<grid, CROSS_ENTROPY_THREADS, 0, stream>>>(
            out, dloss, in, lse, targets, V, z_loss);
    else if (vector)
        cross_entropy_backward_kernel<true, false><<<grid, CROSS_ENTROPY_THREADS, 0, stream>>>(
            out, dloss, in, lse, targets, V, z_loss);
    else
        cross_entropy_backward_kernel<false, false><<<grid, CROSS_ENTROPY_THREADS, 0, stream>>>(
            out, dloss, in, lse, targets, V, z_loss);
    CUDA_CHECK_LAUNCH();
}
