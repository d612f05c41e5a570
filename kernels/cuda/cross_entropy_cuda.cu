/* kernels/cuda/cross_entropy_cuda.cu — fused cross-entropy and z-loss over bf16 logits rows
 * (DESIGN 2, "Loss"; formulas of runtime/backend.h and kernels/cpu/cross_entropy_cpu.c).
 *
 * logits [rows, V] bf16, targets [rows], losses / lse / dloss [rows] fp32:
 *   lse_r    = logsumexp(logits[r, :])
 *   loss_r   = lse_r - logits[r, target_r] + z_loss * lse_r^2
 *   dlogits += or = (GradMode) dloss_r * (softmax(logits[r]) * (1 + 2 z_loss lse_r)
 *                                         - onehot(target_r))
 *
 * Forward: one block per row reads the row once. Each thread keeps a running max m and a
 * sum s of exp(x - m) over its elements, rescaling s when m grows (the "online softmax");
 * the (m, s) pairs are then combined across the warp by a fixed butterfly and across warps
 * in warp order, so lse has the same bits run to run. Everything is fp32.
 * Backward: elementwise given lse; a grid of (row, chunk of 8 * threads columns). A write
 * (GRAD_WRITE, or dlogits == logits: kernels_cuda.h, in place) adds each term to +0.0
 * instead of the old gradient: the bits of an add into zeros, nothing read.
 * A target >= V gives a NaN loss and no one-hot term (the device cannot call fatal).
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

#include <math.h>

enum { CROSS_ENTROPY_THREADS = 512 };

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

template <bool VECTOR>
__global__ void __launch_bounds__(CROSS_ENTROPY_THREADS)
    cross_entropy_forward_kernel(float *losses, float *lse, const bfloat *logits,
                                 const uint32_t *targets, int V, float z_loss)
{
    __shared__ float warp_max[CROSS_ENTROPY_THREADS / 32], warp_sum[CROSS_ENTROPY_THREADS / 32];
    int row = blockIdx.x;
    const bfloat *row_logits = logits + (size_t)row * V;

    float running_max = -INFINITY, running_sum = 0.0f;
    for (int i = threadIdx.x * 8; i < V; i += CROSS_ENTROPY_THREADS * 8) {
        float values[8];
        load8<VECTOR>(values, row_logits, i, V);
        float chunk_max = -INFINITY;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i + k < V)
                chunk_max = fmaxf(chunk_max, values[k]);
        float chunk_sum = 0.0f;
        if (chunk_max != -INFINITY) {
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (i + k < V)
                    chunk_sum += __expf(values[k] - chunk_max);
        }
        combine_max_sum(&running_max, &running_sum, chunk_max, chunk_sum);
    }

#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        float other_max = __shfl_xor_sync(0xffffffffu, running_max, offset);
        float other_sum = __shfl_xor_sync(0xffffffffu, running_sum, offset);
        combine_max_sum(&running_max, &running_sum, other_max, other_sum);
    }
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        warp_max[warp] = running_max;
        warp_sum[warp] = running_sum;
    }
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    float row_max = warp_max[0], row_sum = warp_sum[0];
    for (int w = 1; w < CROSS_ENTROPY_THREADS / 32; w++)
        combine_max_sum(&row_max, &row_sum, warp_max[w], warp_sum[w]);
    float row_lse = row_max + logf(row_sum);
    uint32_t target = targets[row];
    float target_logit = target < (uint32_t)V ? __bfloat162float(row_logits[target]) : NAN;
    losses[row] = row_lse - target_logit + z_loss * row_lse * row_lse;
    lse[row] = row_lse;
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
    if (WRITE) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            grads[k] = 0.0f;
    } else {
        load8<VECTOR>(grads, dlogits + offset, column, V);
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float term = softmax_factor * __expf(values[k] - row_lse);
        if ((uint32_t)(column + k) == target)
            term -= row_dloss;
        grads[k] += term;
    }
    store8<VECTOR>(dlogits + offset, column, V, grads);
}

extern "C" void cuda_cross_entropy_forward(float *losses, float *lse, const bf16 *logits,
                                           const uint32_t *targets, int rows, int V,
                                           float z_loss, cudaStream_t stream)
{
    if (rows <= 0 || V <= 0)
        return;
    bool vector = V % 8 == 0 && is_aligned_16(logits);
    if (vector)
        cross_entropy_forward_kernel<true><<<rows, CROSS_ENTROPY_THREADS, 0, stream>>>(
            losses, lse, (const bfloat *)logits, targets, V, z_loss);
    else
        cross_entropy_forward_kernel<false><<<rows, CROSS_ENTROPY_THREADS, 0, stream>>>(
            losses, lse, (const bfloat *)logits, targets, V, z_loss);
    CUDA_CHECK_LAUNCH();
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
