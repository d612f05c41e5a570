/* kernels/cuda/route_gate_cuda.cu — the delta form's gate, x = p + alpha * y, and its
 * backward (runtime/backend.h add_scaled, add_scaled_backward; route_block_cuda.h).
 *
 * Both stream their rows once: the forward reads p and y and writes x (3 rows), the backward
 * reads dout and y and writes dy (3 rows); at d 1280 and 8192 tokens a row is 21 MB, so
 * about 15 us each at 4.3 TB/s. They replace, for MSAR's gate, a Route over the one source
 * y, whose per-site kernels read and wrote the same rows but spent most of their time on a
 * softmax over one source (docs/performance.md, 2026-12-02, eighth run).
 *
 * d alpha = sum dout y: each block of a fixed grid (GATE_PARTIALS blocks at most, the same
 * for a given n on a given GPU) sums its grid-stride share in fp32, warps then the block's
 * warps in order; a second kernel, one block, adds the blocks' sums in index order in double
 * and adds the total to *dalpha. No atomics: the same bits every run.
 */
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_device.cuh"

#include "kernels/cuda/bf16_vector.cuh"

enum {
    GATE_THREADS = 256,
    GATE_WARPS = GATE_THREADS / 32,
    GATE_PARTIALS = 1024, /* the most blocks of the backward's first kernel */
};

/* ---- forward ---- */

template <bool VECTOR>
__global__ void __launch_bounds__(GATE_THREADS)
    add_scaled_kernel(bfloat *out, const bfloat *base, const bfloat *x, const float *alpha,
                      size_t n)
{
    const float scale = *alpha;
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float sum[8], other[8];
        load8<VECTOR>(sum, base, i, n);
        load8<VECTOR>(other, x, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++)
            sum[k] = scaled_add(sum[k], scale, other[k]);
        store8<VECTOR>(out, i, n, sum);
    }
}

extern "C" void cuda_add_scaled(bf16 *out, const bf16 *base, const bf16 *x, const float *alpha,
                                size_t n, cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, GATE_THREADS);
    bfloat *out_ = (bfloat *)out;
    const bfloat *base_ = (const bfloat *)base, *x_ = (const bfloat *)x;
    if (is_aligned_16(out) && is_aligned_16(base) && is_aligned_16(x))
        add_scaled_kernel<true><<<blocks, GATE_THREADS, 0, stream>>>(out_, base_, x_, alpha, n);
    else
        add_scaled_kernel<false><<<blocks, GATE_THREADS, 0, stream>>>(out_, base_, x_, alpha, n);
    CUDA_CHECK_LAUNCH();
}

/* ---- backward ---- */

/* dx = alpha dout; partials[blockIdx.x] = this block's sum of dout x. */
template <bool VECTOR>
__global__ void __launch_bounds__(GATE_THREADS)
    add_scaled_backward_kernel(bfloat *dx, float *partials, const bfloat *dout, const bfloat *x,
                               const float *alpha, size_t n)
{
    __shared__ float warp_sums[GATE_WARPS];
    const float scale = *alpha;
    float dot = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float grad[8], value[8], out[8];
        load8<VECTOR>(grad, dout, i, n);
        load8<VECTOR>(value, x, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            dot += grad[k] * value[k]; /* zero past n: load8 pads with zeros */
            out[k] = scale * grad[k];
        }
        store8<VECTOR>(dx, i, n, out);
    }
    dot = warp_sum(dot);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0)
        warp_sums[warp] = dot;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < GATE_WARPS; w++)
            total += warp_sums[w];
        partials[blockIdx.x] = total;
    }
}

/* One block: *dalpha += the partials in index order (double). */
__global__ void add_scaled_backward_total_kernel(float *dalpha, const float *partials,
                                                 unsigned count)
{
    double total = 0.0;
    for (unsigned b = 0; b < count; b++)
        total += partials[b];
    *dalpha += (float)total;
}

static unsigned backward_blocks(size_t n)
{
    unsigned blocks = grid_stride_blocks((n + 7) / 8, GATE_THREADS);
    return blocks < (unsigned)GATE_PARTIALS ? blocks : (unsigned)GATE_PARTIALS;
}

extern "C" size_t cuda_add_scaled_backward_workspace_floats(size_t n)
{
    (void)n;
    return GATE_PARTIALS;
}

extern "C" void cuda_add_scaled_backward(bf16 *dx, float *dalpha, const bf16 *dout,
                                         const bf16 *x, const float *alpha, size_t n,
                                         float *workspace, cudaStream_t stream)
{
    if (n == 0)
        return;
    const unsigned blocks = backward_blocks(n);
    bfloat *dx_ = (bfloat *)dx;
    const bfloat *dout_ = (const bfloat *)dout, *x_ = (const bfloat *)x;
    if (is_aligned_16(dx) && is_aligned_16(dout) && is_aligned_16(x))
        add_scaled_backward_kernel<true>
            <<<blocks, GATE_THREADS, 0, stream>>>(dx_, workspace, dout_, x_, alpha, n);
    else
        add_scaled_backward_kernel<false>
            <<<blocks, GATE_THREADS, 0, stream>>>(dx_, workspace, dout_, x_, alpha, n);
    CUDA_CHECK_LAUNCH();
    add_scaled_backward_total_kernel<<<1, 1, 0, stream>>>(dalpha, workspace, blocks);
    CUDA_CHECK_LAUNCH();
}
