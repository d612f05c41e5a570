/* kernels/cuda/elementwise_cuda.cu — bf16 sums of whole tensors (runtime/backend.h,
 * "elementwise"): y += x, out = a + b, both at once (add_both: out = a + x, y += x) and
 * y = (y - minus) + plus (add_difference), each element summed in fp32 and rounded once; and
 * the fp32 -> bf16 conversion of runtime/backend.h activations_from_floats.
 *
 * One grid-stride loop, 8 elements (16 bytes of bf16) per thread per step. Every thread
 * reads both operands of its 8 elements before writing them, so out may alias a or b.
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

enum { ELEMENTWISE_THREADS = 256 };

/* out[i] = a[i] + b[i], i < n */
template <bool VECTOR>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    add_kernel(bfloat *out, const bfloat *a, const bfloat *b, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float sum[8], other[8];
        load8<VECTOR>(sum, a, i, n);
        load8<VECTOR>(other, b, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++)
            sum[k] += other[k];
        store8<VECTOR>(out, i, n, sum);
    }
}

extern "C" void cuda_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n,
                         cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, ELEMENTWISE_THREADS);
    bfloat *out_ = (bfloat *)out;
    const bfloat *a_ = (const bfloat *)a, *b_ = (const bfloat *)b;
    if (is_aligned_16(out) && is_aligned_16(a) && is_aligned_16(b))
        add_kernel<true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(out_, a_, b_, n);
    else
        add_kernel<false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(out_, a_, b_, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_add_inplace(bf16 *y, const bf16 *x, size_t n, cudaStream_t stream)
{
    cuda_add(y, y, x, n, stream);
}

/* out[i] = a[i] + x[i], y[i] += x[i], i < n: x read once for both */
template <bool VECTOR>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    add_both_kernel(bfloat *out, const bfloat *a, bfloat *y, const bfloat *x, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float sum[8], total[8], added[8];
        load8<VECTOR>(sum, a, i, n);
        load8<VECTOR>(total, y, i, n);
        load8<VECTOR>(added, x, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            sum[k] += added[k];
            total[k] += added[k];
        }
        store8<VECTOR>(out, i, n, sum);
        store8<VECTOR>(y, i, n, total);
    }
}

extern "C" void cuda_add_both(bf16 *out, const bf16 *a, bf16 *y, const bf16 *x, size_t n,
                              cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, ELEMENTWISE_THREADS);
    bfloat *out_ = (bfloat *)out, *y_ = (bfloat *)y;
    const bfloat *a_ = (const bfloat *)a, *x_ = (const bfloat *)x;
    if (is_aligned_16(out) && is_aligned_16(a) && is_aligned_16(y) && is_aligned_16(x))
        add_both_kernel<true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(out_, a_, y_, x_, n);
    else
        add_both_kernel<false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(out_, a_, y_, x_, n);
    CUDA_CHECK_LAUNCH();
}

/* y[i] = bf16((y[i] - minus[i]) + plus[i]), i < n; PLUS false: bf16(y[i] - minus[i]) */
template <bool VECTOR, bool PLUS>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    add_difference_kernel(bfloat *y, const bfloat *plus, const bfloat *minus, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float sum[8], taken[8], added[8];
        load8<VECTOR>(sum, y, i, n);
        load8<VECTOR>(taken, minus, i, n);
        if (PLUS)
            load8<VECTOR>(added, plus, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++)
            sum[k] = PLUS ? (sum[k] - taken[k]) + added[k] : sum[k] - taken[k];
        store8<VECTOR>(y, i, n, sum);
    }
}

extern "C" void cuda_add_difference(bf16 *y, const bf16 *plus, const bf16 *minus, size_t n,
                                    cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, ELEMENTWISE_THREADS);
    bfloat *y_ = (bfloat *)y;
    const bfloat *plus_ = (const bfloat *)plus, *minus_ = (const bfloat *)minus;
    const bool vector = is_aligned_16(y) && is_aligned_16(minus) && is_aligned_16(plus);
#define DIFFERENCE(VECTOR_, PLUS_)                                                             \
    add_difference_kernel<VECTOR_, PLUS_><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(y_, plus_, \
                                                                                    minus_, n)
    if (plus)
        vector ? DIFFERENCE(true, true) : DIFFERENCE(false, true);
    else
        vector ? DIFFERENCE(true, false) : DIFFERENCE(false, false);
#undef DIFFERENCE
    CUDA_CHECK_LAUNCH();
}

/* dst[i] = bf16(src[i]), i < n (round to nearest even) */
template <bool VECTOR>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    bf16_from_floats_kernel(bfloat *dst, const float *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float values[8];
        load8_float<VECTOR>(values, src, i, n);
        store8<VECTOR>(dst, i, n, values);
    }
}

extern "C" void cuda_bf16_from_floats(bf16 *dst, const float *src, size_t n,
                                      cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, ELEMENTWISE_THREADS);
    bfloat *dst_ = (bfloat *)dst;
    if (is_aligned_16(dst) && is_aligned_16(src))
        bf16_from_floats_kernel<true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(dst_, src, n);
    else
        bf16_from_floats_kernel<false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(dst_, src, n);
    CUDA_CHECK_LAUNCH();
}
