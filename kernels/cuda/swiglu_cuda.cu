/* kernels/cuda/swiglu_cuda.cu — the MLP gate (DESIGN 2): out = silu(gate) * up, all [n] bf16.
 *
 * silu(g) = g * sigmoid(g); d silu / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))), the
 * formulas of kernels/cpu/swiglu_cpu.c, in fp32 with one rounding per output. sigmoid(g) =
 * 1 / (1 + exp(-g)) stays finite at both ends: exp(-g) = inf gives exactly 0.
 * Grid-stride loops, 8 elements (16 bytes) per operand per thread per step; the backward
 * reads dgate and dup and adds to them (GRAD_ADD), or adds to +0.0 in their place without
 * reading them (GRAD_WRITE: the bits of an add into zeros, runtime/backend.h).
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

enum { SWIGLU_THREADS = 256 };

__device__ __forceinline__ float sigmoid(float g)
{
    return 1.0f / (1.0f + __expf(-g));
}

template <bool VECTOR>
__global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_forward_kernel(bfloat *out, const bfloat *gate, const bfloat *up, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float g[8], u[8], result[8];
        load8<VECTOR>(g, gate, i, n);
        load8<VECTOR>(u, up, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++)
            result[k] = g[k] * sigmoid(g[k]) * u[k];
        store8<VECTOR>(out, i, n, result);
    }
}

template <bool VECTOR>
__global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_backward_kernel(bfloat *dgate, bfloat *dup, const bfloat *dout, const bfloat *gate,
                           const bfloat *up, size_t n, bool accumulate)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float grad[8], g[8], u[8], dg[8], du[8];
        load8<VECTOR>(grad, dout, i, n);
        load8<VECTOR>(g, gate, i, n);
        load8<VECTOR>(u, up, i, n);
        if (accumulate) {
            load8<VECTOR>(dg, dgate, i, n);
            load8<VECTOR>(du, dup, i, n);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++)
                dg[k] = du[k] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float s = sigmoid(g[k]);
            dg[k] += grad[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
            du[k] += grad[k] * g[k] * s;
        }
        store8<VECTOR>(dgate, i, n, dg);
        store8<VECTOR>(dup, i, n, du);
    }
}

extern "C" void cuda_swiglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, size_t n,
                                    cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, SWIGLU_THREADS);
    bfloat *out_ = (bfloat *)out;
    const bfloat *gate_ = (const bfloat *)gate, *up_ = (const bfloat *)up;
    if (is_aligned_16(out) && is_aligned_16(gate) && is_aligned_16(up))
        swiglu_forward_kernel<true><<<blocks, SWIGLU_THREADS, 0, stream>>>(out_, gate_, up_, n);
    else
        swiglu_forward_kernel<false><<<blocks, SWIGLU_THREADS, 0, stream>>>(out_, gate_, up_, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_swiglu_backward(bf16 *dgate, bf16 *dup, GradMode mode, const bf16 *dout,
                                     const bf16 *gate, const bf16 *up, size_t n,
                                     cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, SWIGLU_THREADS);
    bfloat *dgate_ = (bfloat *)dgate, *dup_ = (bfloat *)dup;
    const bfloat *dout_ = (const bfloat *)dout, *gate_ = (const bfloat *)gate,
                 *up_ = (const bfloat *)up;
    bool aligned = is_aligned_16(dgate) && is_aligned_16(dup) && is_aligned_16(dout) &&
                   is_aligned_16(gate) && is_aligned_16(up);
    bool accumulate = mode == GRAD_ADD;
    if (aligned)
        swiglu_backward_kernel<true><<<blocks, SWIGLU_THREADS, 0, stream>>>(
            dgate_, dup_, dout_, gate_, up_, n, accumulate);
    else
        swiglu_backward_kernel<false><<<blocks, SWIGLU_THREADS, 0, stream>>>(
            dgate_, dup_, dout_, gate_, up_, n, accumulate);
    CUDA_CHECK_LAUNCH();
}
