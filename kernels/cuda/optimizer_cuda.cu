/* kernels/cuda/optimizer_cuda.cu — the optimizer's flat-range ops (DESIGN 3) on fp32 device
 * ranges: AdamW (writing the weight EMA and the bf16 compute copy in the same pass), the adds
 * of FSDP's accumulators, and the squared norm for gradient clipping.
 *
 * The elementwise ops are grid-stride loops, AdamW over 4 fp32 values a thread and step, the
 * others over 8 (two 16-byte accesses), with the formulas of kernels/cpu/optimizer_cpu.c term
 * by term.
 *
 * sum_squares must give the same double on every run, because the clip factor and so every
 * later step depends on it. The first pass always runs CUDA_SUM_SQUARES_PARTIALS blocks of
 * SUM_SQUARES_THREADS threads, whatever the device: thread j of block b squares and adds, in
 * double, the groups of 8 elements (b * THREADS + j) + k * (PARTIALS * THREADS), k = 0, 1, ..;
 * each block adds its threads in a fixed tree into one double of the workspace. The second
 * pass, one block, adds the partials in a fixed tree and adds the total to *result. The order
 * of every addition depends only on n.
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

#include <math.h>

enum {
    OPTIMIZER_THREADS = 256,
    SUM_SQUARES_THREADS = 256,
};

/* The scalars of one launch: AdamwScalars with the bias corrections made once. */
struct AdamwKernelScalars {
    float beta1, beta2, eps, decay, step_size, bias_correction2_sqrt, grad_scale, ema_decay;
};

/* One parameter's update, the formulas of kernels/cpu/optimizer_cpu.c term by term. */
__device__ __forceinline__ void adamw_one(float &p, float g, float &m, float &v,
                                          const AdamwKernelScalars &s)
{
    g *= s.grad_scale; /* the clipping coefficient, 1 when nothing is clipped */
    p -= s.decay * p;
    m = s.beta1 * m + (1.0f - s.beta1) * g;
    v = s.beta2 * v + (1.0f - s.beta2) * g * g;
    p -= s.step_size * m / (sqrtf(v) / s.bias_correction2_sqrt + s.eps);
}

/* The EMA reads and writes 8 bytes a parameter where a pass of its own over the new weights
 * read 12 (the weights, then the EMA read and written): 11 GB fewer a step at 8 layers of
 * the 8B width.
 * Four parameters a thread and step: all five loads (one 16-byte access each) issued before
 * the first store, at 40 registers. Eight a thread (two accesses an array) took 64 registers
 * and moved 3.47 TB/s against 3.9 for four (H200, 218 M parameters: the copy rate is 4.2). */
template <bool VECTOR>
__global__ void __launch_bounds__(OPTIMIZER_THREADS)
    adamw_kernel(float *__restrict__ params, const float *__restrict__ grads,
                 float *__restrict__ exp_avg, float *__restrict__ exp_avg_sq,
                 float *__restrict__ ema, bfloat *__restrict__ compute_copy, size_t n,
                 const AdamwKernelScalars s)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        float p[4], g[4], m[4], v[4], e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        load_floats<4, VECTOR>(p, params, i, n);
        load_floats<4, VECTOR>(g, grads, i, n);
        load_floats<4, VECTOR>(m, exp_avg, i, n);
        load_floats<4, VECTOR>(v, exp_avg_sq, i, n);
        if (ema)
            load_floats<4, VECTOR>(e, ema, i, n);
#pragma unroll
        for (int k = 0; k < 4; k++)
            adamw_one(p[k], g[k], m[k], v[k], s);
        store_floats<4, VECTOR>(params, i, n, p);
        store_floats<4, VECTOR>(exp_avg, i, n, m);
        store_floats<4, VECTOR>(exp_avg_sq, i, n, v);
        if (ema) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                e[k] = s.ema_decay * e[k] + (1.0f - s.ema_decay) * p[k];
            store_floats<4, VECTOR>(ema, i, n, e);
        }
        if (compute_copy)
            store4<VECTOR>(compute_copy, i, n, p);
    }
}

template <bool VECTOR>
__global__ void __launch_bounds__(OPTIMIZER_THREADS)
    add_floats_kernel(float *y, const float *x, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float a[8], b[8];
        load8_float<VECTOR>(a, y, i, n);
        load8_float<VECTOR>(b, x, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++)
            a[k] += b[k];
        store8_float<VECTOR>(y, i, n, a);
    }
}

/* Adds the THREADS doubles of `values` (shared memory) in a fixed tree; thread 0 gets the
 * total. Every thread of the block calls it. */
template <int THREADS>
__device__ double block_tree_sum(double *values)
{
#pragma unroll
    for (int width = THREADS / 2; width > 0; width /= 2) {
        __syncthreads();
        if (threadIdx.x < width)
            values[threadIdx.x] += values[threadIdx.x + width];
    }
    __syncthreads();
    return values[0];
}

/* grid: exactly CUDA_SUM_SQUARES_PARTIALS blocks of SUM_SQUARES_THREADS */
template <bool VECTOR>
__global__ void __launch_bounds__(SUM_SQUARES_THREADS)
    sum_squares_partial_kernel(double *partials, const float *x, size_t n)
{
    __shared__ double thread_sums[SUM_SQUARES_THREADS];
    size_t stride = (size_t)CUDA_SUM_SQUARES_PARTIALS * SUM_SQUARES_THREADS * 8;
    double sum = 0.0;
    for (size_t i = ((size_t)blockIdx.x * SUM_SQUARES_THREADS + threadIdx.x) * 8; i < n;
         i += stride) {
        float values[8];
        load8_float<VECTOR>(values, x, i, n);
#pragma unroll
        for (int k = 0; k < 8; k++)
            sum += (double)values[k] * (double)values[k];
    }
    thread_sums[threadIdx.x] = sum;
    double total = block_tree_sum<SUM_SQUARES_THREADS>(thread_sums);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = total;
}

/* one block of CUDA_SUM_SQUARES_PARTIALS threads */
__global__ void __launch_bounds__(CUDA_SUM_SQUARES_PARTIALS)
    sum_squares_final_kernel(double *result, const double *partials)
{
    __shared__ double values[CUDA_SUM_SQUARES_PARTIALS];
    values[threadIdx.x] = partials[threadIdx.x];
    double total = block_tree_sum<CUDA_SUM_SQUARES_PARTIALS>(values);
    if (threadIdx.x == 0)
        *result += total;
}

extern "C" void cuda_adamw_update(float *params, const float *grads, float *exp_avg,
                                  float *exp_avg_sq, float *ema, size_t n, const AdamwScalars *s,
                                  bf16 *compute_copy, cudaStream_t stream)
{
    if (n == 0)
        return;
    /* the bias corrections once, in double, as on the cpu backend */
    AdamwKernelScalars scalars;
    scalars.beta1 = s->beta1;
    scalars.beta2 = s->beta2;
    scalars.eps = s->eps;
    scalars.decay = s->lr * s->weight_decay;
    scalars.step_size = (float)(s->lr / (1.0 - pow(s->beta1, s->step)));
    scalars.bias_correction2_sqrt = (float)sqrt(1.0 - pow(s->beta2, s->step));
    scalars.grad_scale = s->grad_scale;
    scalars.ema_decay = s->ema_decay;
    unsigned blocks = grid_stride_blocks((n + 3) / 4, OPTIMIZER_THREADS);
    bool vector = is_aligned_16(params) && is_aligned_16(grads) && is_aligned_16(exp_avg) &&
                  is_aligned_16(exp_avg_sq) && is_aligned_16(ema) && is_aligned_16(compute_copy);
    if (vector)
        adamw_kernel<true><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(
            params, grads, exp_avg, exp_avg_sq, ema, (bfloat *)compute_copy, n, scalars);
    else
        adamw_kernel<false><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(
            params, grads, exp_avg, exp_avg_sq, ema, (bfloat *)compute_copy, n, scalars);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_add_floats(float *y, const float *x, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return;
    unsigned blocks = grid_stride_blocks((n + 7) / 8, OPTIMIZER_THREADS);
    if (is_aligned_16(y) && is_aligned_16(x))
        add_floats_kernel<true><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(y, x, n);
    else
        add_floats_kernel<false><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(y, x, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_sum_squares(double *result, const float *x, size_t n, double *workspace,
                                 cudaStream_t stream)
{
    if (n == 0)
        return;
    if (is_aligned_16(x))
        sum_squares_partial_kernel<true>
            <<<CUDA_SUM_SQUARES_PARTIALS, SUM_SQUARES_THREADS, 0, stream>>>(workspace, x, n);
    else
        sum_squares_partial_kernel<false>
            <<<CUDA_SUM_SQUARES_PARTIALS, SUM_SQUARES_THREADS, 0, stream>>>(workspace, x, n);
    CUDA_CHECK_LAUNCH();
    sum_squares_final_kernel<<<1, CUDA_SUM_SQUARES_PARTIALS, 0, stream>>>(result, workspace);
    CUDA_CHECK_LAUNCH();
}

extern "C" double cuda_sum_squares_read(const double *result, cudaStream_t stream)
{
    double value = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&value, result, sizeof value, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return value;
}
