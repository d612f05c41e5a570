/* kernels/cuda/optimizer_cuda.cu — the optimizer's flat-range ops (DESIGN 3) on fp32 device
 * ranges: AdamW (writing the weight EMA and the bf16 compute copy in the same pass), the adds
 * of FSDP's accumulators, and the squared norm for gradient clipping.
 *
 * The elementwise ops are grid-stride loops, AdamW over 4 fp32 values a thread and step, the
 * others over 8 (two 16-byte accesses), with the formulas of kernels/cpu/optimizer_cpu.c term
 * by term. AdamW over many ranges (cuda_adamw_update_ranges) gives each large range a launch
 * of its own and batches the small ones, up to 64 to a launch, a block per 1024 elements.
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
#include <string.h>

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
/* Elements i .. i + 3 of one range (n its length): all five loads issued before the first
 * store. */
template <bool VECTOR>
__device__ __forceinline__ void adamw_four(float *__restrict__ params,
                                           const float *__restrict__ grads,
                                           float *__restrict__ exp_avg,
                                           float *__restrict__ exp_avg_sq,
                                           float *__restrict__ ema,
                                           bfloat *__restrict__ compute_copy, size_t i, size_t n,
                                           const AdamwKernelScalars &s)
{
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
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride)
        adamw_four<VECTOR>(params, grads, exp_avg, exp_avg_sq, ema, compute_copy, i, n, s);
}

/* Up to ADAMW_BATCH_RANGES small ranges in one launch: range r takes blocks first_block[r]
 * .. first_block[r + 1] - 1, each block OPTIMIZER_THREADS x 4 consecutive elements of it.
 * A model has one range a tensor, and most are small (norms, routing weights: d or fewer
 * elements): at the 8-layer MHAR delta graft of the 8B width 127 launches a step became 58
 * and a batch (docs/performance.md, 2026-12-06 evening). */
enum {
    ADAMW_BATCH_RANGES = 64,
    ADAMW_BLOCK_ELEMENTS = OPTIMIZER_THREADS * 4,
    ADAMW_SMALL_RANGE = 256 * ADAMW_BLOCK_ELEMENTS, /* larger ones: a launch of their own */
};

struct AdamwBatch {
    AdamwKernelScalars scalars; /* decay and step_size: each range's own, below */
    int n_ranges;
    unsigned first_block[ADAMW_BATCH_RANGES + 1];
    unsigned long long offset[ADAMW_BATCH_RANGES];
    unsigned count[ADAMW_BATCH_RANGES];
    float decay[ADAMW_BATCH_RANGES], step_size[ADAMW_BATCH_RANGES];
};

template <bool VECTOR>
__global__ void __launch_bounds__(OPTIMIZER_THREADS)
    adamw_batch_kernel(float *__restrict__ params, const float *__restrict__ grads,
                       float *__restrict__ exp_avg, float *__restrict__ exp_avg_sq,
                       float *__restrict__ ema, bfloat *__restrict__ compute_copy,
                       const __grid_constant__ AdamwBatch batch)
{
    int r = 0; /* the range of this block: the last whose first block is at or before it */
    while (r + 1 < batch.n_ranges && batch.first_block[r + 1] <= blockIdx.x)
        r++;
    AdamwKernelScalars s = batch.scalars;
    s.decay = batch.decay[r];
    s.step_size = batch.step_size[r];
    const size_t at = batch.offset[r];
    const size_t i =
        (size_t)(blockIdx.x - batch.first_block[r]) * ADAMW_BLOCK_ELEMENTS + threadIdx.x * 4;
    adamw_four<VECTOR>(params + at, grads + at, exp_avg + at, exp_avg_sq + at,
                       ema ? ema + at : NULL, compute_copy ? compute_copy + at : NULL, i,
                       batch.count[r], s);
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

/* AdamwScalars with the bias corrections made once, in double, as on the cpu backend. */
static AdamwKernelScalars adamw_kernel_scalars(const AdamwScalars *s)
{
    AdamwKernelScalars scalars;
    scalars.beta1 = s->beta1;
    scalars.beta2 = s->beta2;
    scalars.eps = s->eps;
    scalars.decay = s->lr * s->weight_decay;
    scalars.step_size = (float)(s->lr / (1.0 - pow(s->beta1, s->step)));
    scalars.bias_correction2_sqrt = (float)sqrt(1.0 - pow(s->beta2, s->step));
    scalars.grad_scale = s->grad_scale;
    scalars.ema_decay = s->ema_decay;
    return scalars;
}

static bool adamw_buffers_aligned(const float *params, const float *grads, const float *exp_avg,
                                  const float *exp_avg_sq, const float *ema,
                                  const bf16 *compute_copy)
{
    return is_aligned_16(params) && is_aligned_16(grads) && is_aligned_16(exp_avg) &&
           is_aligned_16(exp_avg_sq) && is_aligned_16(ema) && is_aligned_16(compute_copy);
}

extern "C" void cuda_adamw_update(float *params, const float *grads, float *exp_avg,
                                  float *exp_avg_sq, float *ema, size_t n, const AdamwScalars *s,
                                  bf16 *compute_copy, cudaStream_t stream)
{
    if (n == 0)
        return;
    const AdamwKernelScalars scalars = adamw_kernel_scalars(s);
    unsigned blocks = grid_stride_blocks((n + 3) / 4, OPTIMIZER_THREADS);
    if (adamw_buffers_aligned(params, grads, exp_avg, exp_avg_sq, ema, compute_copy))
        adamw_kernel<true><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(
            params, grads, exp_avg, exp_avg_sq, ema, (bfloat *)compute_copy, n, scalars);
    else
        adamw_kernel<false><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(
            params, grads, exp_avg, exp_avg_sq, ema, (bfloat *)compute_copy, n, scalars);
    CUDA_CHECK_LAUNCH();
}

static void adamw_batch_launch(float *params, const float *grads, float *exp_avg,
                               float *exp_avg_sq, float *ema, bf16 *compute_copy,
                               AdamwBatch *batch, bool offsets_aligned, cudaStream_t stream)
{
    if (batch->n_ranges == 0)
        return;
    const unsigned blocks = batch->first_block[batch->n_ranges];
    if (offsets_aligned &&
        adamw_buffers_aligned(params, grads, exp_avg, exp_avg_sq, ema, compute_copy))
        adamw_batch_kernel<true><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(
            params, grads, exp_avg, exp_avg_sq, ema, (bfloat *)compute_copy, *batch);
    else
        adamw_batch_kernel<false><<<blocks, OPTIMIZER_THREADS, 0, stream>>>(
            params, grads, exp_avg, exp_avg_sq, ema, (bfloat *)compute_copy, *batch);
    CUDA_CHECK_LAUNCH();
    batch->n_ranges = 0;
}

extern "C" void cuda_adamw_update_ranges(float *params, const float *grads, float *exp_avg,
                                         float *exp_avg_sq, float *ema,
                                         const AdamwRange *ranges, int n_ranges,
                                         const AdamwScalars *s, bf16 *compute_copy,
                                         cudaStream_t stream)
{
    AdamwBatch batch;
    memset(&batch, 0, sizeof batch);
    batch.scalars = adamw_kernel_scalars(s);
    bool offsets_aligned = true; /* every batched range starts on 4 floats */
    for (int r = 0; r < n_ranges; r++) {
        const AdamwRange *range = &ranges[r];
        AdamwScalars one = *s;
        one.lr = range->lr;
        one.weight_decay = range->weight_decay;
        const size_t at = range->offset;
        if (range->count > ADAMW_SMALL_RANGE) {
            cuda_adamw_update(params + at, grads + at, exp_avg + at, exp_avg_sq + at,
                              ema ? ema + at : NULL, range->count, &one,
                              compute_copy ? compute_copy + at : NULL, stream);
            continue;
        }
        if (range->count == 0)
            continue;
        const AdamwKernelScalars scalars = adamw_kernel_scalars(&one);
        const int k = batch.n_ranges++;
        batch.offset[k] = at;
        batch.count[k] = (unsigned)range->count;
        batch.decay[k] = scalars.decay;
        batch.step_size[k] = scalars.step_size;
        batch.first_block[k + 1] = batch.first_block[k] +
                                   (unsigned)((range->count + ADAMW_BLOCK_ELEMENTS - 1) /
                                              ADAMW_BLOCK_ELEMENTS);
        offsets_aligned = offsets_aligned && at % 4 == 0;
        if (batch.n_ranges == ADAMW_BATCH_RANGES) {
            adamw_batch_launch(params, grads, exp_avg, exp_avg_sq, ema, compute_copy, &batch,
                               offsets_aligned, stream);
            offsets_aligned = true;
        }
    }
    adamw_batch_launch(params, grads, exp_avg, exp_avg_sq, ema, compute_copy, &batch,
                       offsets_aligned, stream);
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
