/* kernels/cuda/rope_cuda.cu — rotary position embedding, rotate-half convention (DESIGN 2).
 *
 * x, out, dx, dout [B, T, n_heads, head_dim] bf16; cos, sin [T, head_dim / 2] fp32. Channel i
 * of the first half and channel i + head_dim/2 form one pair rotated by the angle of
 * (t, i), the formulas of kernels/cpu/rope_cpu.c:
 *   forward:  (a, b) -> (a cos - b sin, b cos + a sin)
 *   backward: dx += the inverse rotation of dout: (da cos + db sin, db cos - da sin), or
 *             dx = it, added to +0.0 without reading dx (GRAD_WRITE: the bits of an add into
 *             zeros, runtime/backend.h)
 * One thread takes 8 consecutive pairs of one head (16 bytes of each half, 32 of cos and of
 * sin), reads all of them before it writes, so out may alias x. Math in fp32, one rounding.
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

enum { ROPE_THREADS = 256 };

/* head_rows = B * T * n_heads rows of head_dim = 2 * half values; `accumulate` is read by
 * the backward only */
template <bool VECTOR, bool BACKWARD>
__global__ void __launch_bounds__(ROPE_THREADS)
    rope_kernel(bfloat *out, const bfloat *x, const float *cos, const float *sin, int T,
                int n_heads, int half, size_t head_rows, bool accumulate)
{
    int groups = (half + 7) / 8; /* groups of 8 pairs in a head */
    size_t items = head_rows * groups;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t item = (size_t)blockIdx.x * blockDim.x + threadIdx.x; item < items;
         item += stride) {
        size_t head_row = item / groups;
        int i = (int)(item % groups) * 8;
        int t = (int)((head_row / n_heads) % T);
        const bfloat *x_row = x + head_row * 2 * half;
        bfloat *out_row = out + head_row * 2 * half;
        const float *cos_row = cos + (size_t)t * half, *sin_row = sin + (size_t)t * half;

        float a[8], b[8], c[8], s[8], first[8], second[8];
        load8<VECTOR>(a, x_row, i, half);
        load8<VECTOR>(b, x_row + half, i, half);
        load8_float<VECTOR>(c, cos_row, i, half);
        load8_float<VECTOR>(s, sin_row, i, half);
        if (BACKWARD) {
            if (accumulate) {
                load8<VECTOR>(first, out_row, i, half);
                load8<VECTOR>(second, out_row + half, i, half);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++)
                    first[k] = second[k] = 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) {
                first[k] += a[k] * c[k] + b[k] * s[k];
                second[k] += b[k] * c[k] - a[k] * s[k];
            }
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                first[k] = a[k] * c[k] - b[k] * s[k];
                second[k] = b[k] * c[k] + a[k] * s[k];
            }
        }
        store8<VECTOR>(out_row, i, half, first);
        store8<VECTOR>(out_row + half, i, half, second);
    }
}

template <bool BACKWARD>
static void rope_launch(bf16 *out, const bf16 *x, const float *cos, const float *sin, int B,
                        int T, int n_heads, int head_dim, bool accumulate, cudaStream_t stream)
{
    if (B <= 0 || T <= 0 || n_heads <= 0 || head_dim < 2)
        return;
    int half = head_dim / 2;
    size_t head_rows = (size_t)B * T * n_heads;
    unsigned blocks = grid_stride_blocks(head_rows * ((half + 7) / 8), ROPE_THREADS);
    bool vector = half % 8 == 0 && is_aligned_16(out) && is_aligned_16(x) &&
                  is_aligned_16(cos) && is_aligned_16(sin);
    if (vector)
        rope_kernel<true, BACKWARD><<<blocks, ROPE_THREADS, 0, stream>>>(
            (bfloat *)out, (const bfloat *)x, cos, sin, T, n_heads, half, head_rows,
            accumulate);
    else
        rope_kernel<false, BACKWARD><<<blocks, ROPE_THREADS, 0, stream>>>(
            (bfloat *)out, (const bfloat *)x, cos, sin, T, n_heads, half, head_rows,
            accumulate);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rope_forward(bf16 *out, const bf16 *x, const float *cos, const float *sin,
                                  int B, int T, int n_heads, int head_dim, cudaStream_t stream)
{
    rope_launch<false>(out, x, cos, sin, B, T, n_heads, head_dim, false, stream);
}

extern "C" void cuda_rope_backward(bf16 *dx, GradMode dx_mode, const bf16 *dout,
                                   const float *cos, const float *sin, int B, int T,
                                   int n_heads, int head_dim, cudaStream_t stream)
{
    rope_launch<true>(dx, dout, cos, sin, B, T, n_heads, head_dim, dx_mode == GRAD_ADD, stream);
}
