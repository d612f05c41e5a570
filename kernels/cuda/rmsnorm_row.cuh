/* kernels/cuda/rmsnorm_row.cuh — RMSNorm's forward of one row that a team of ROW_THREADS
 * threads holds in registers, CHUNKS chunks of 8 values a thread (rmsnorm_cuda.cu's layout:
 * chunk k of thread l holds columns (k ROW_THREADS + l) 8 ..): the one copy of its
 * arithmetic, for the norm's kernel and for the kernels that norm a row they have just made
 * (route_merge_norm_cuda.cu), so that they give the same bits. CUDA C++ only.
 *   rstd = rsqrt(mean(x^2) + eps), the squares summed chunk by chunk, then row_sum's
 *   fixed tree; out = bf16(weight * bf16(x * rstd)), Hugging Face's LlamaRMSNorm order.
 */
#ifndef FATHOM_KERNELS_CUDA_RMSNORM_ROW_CUH
#define FATHOM_KERNELS_CUDA_RMSNORM_ROW_CUH

#include "kernels/cuda/bf16_vector.cuh"

/* The row `raw` (this thread's chunks) normed into out_row [d], its rstd into *rstd by the
 * team's first thread; scratch as row_sum takes it. Every thread of the team calls it. */
template <int ROW_THREADS, int CHUNKS, bool VECTOR>
__device__ __forceinline__ void rmsnorm_row_forward(bfloat *out_row, float *rstd,
                                                    const uint4 (&raw)[CHUNKS],
                                                    const bfloat *weight, int d, float eps,
                                                    float *scratch)
{
    const int lane = threadIdx.x % ROW_THREADS;
    float sum_squares = 0.0f;
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++) {
        float values[8];
        unpack8(values, raw[chunk]);
#pragma unroll
        for (int k = 0; k < 8; k++)
            sum_squares += values[k] * values[k];
    }
    sum_squares = row_sum<ROW_THREADS>(sum_squares, scratch);
    const float row_rstd = rsqrtf(sum_squares / d + eps);
    if (lane == 0)
        *rstd = row_rstd;
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++) {
        const int column = (chunk * ROW_THREADS + lane) * 8;
        float values[8], scales[8];
        unpack8(values, raw[chunk]);
        load8<VECTOR>(scales, weight, column, d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            values[k] = scales[k] * __bfloat162float(__float2bfloat16_rn(values[k] * row_rstd));
        store8<VECTOR>(out_row, column, d, values);
    }
}

#endif
