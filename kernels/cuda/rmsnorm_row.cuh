/* kernels/cuda/rmsnorm_row.cuh — RMSNorm's forward and backward of one row that a team of
 * ROW_THREADS threads holds in registers, CHUNKS chunks of 8 values a thread (rmsnorm_cuda.cu's
 * layout: chunk k of thread l holds columns (k ROW_THREADS + l) 8 ..): the one copy of their
 * arithmetic, for the norm's kernels and for the kernels that norm a row they have just made
 * or take a norm's gradient further (route_merge_norm_cuda.cu,
 * route_merge_norm_backward_cuda.cu), so that they give the same bits. CUDA C++ only.
 *   forward   rstd = rsqrt(mean(x^2) + eps), the squares summed chunk by chunk, then
 *             row_sum's fixed tree; out = bf16(weight * bf16(x * rstd)), Hugging Face's
 *             LlamaRMSNorm order.
 *   backward  xhat = x rstd, dxhat = dout weight; centre = mean(dxhat xhat), summed chunk by
 *             chunk, then row_sum's tree; g = rstd (dxhat - xhat centre); dweight += dout xhat
 *             (a kernel adding g into dx does so with __fadd_rn).
 */
#ifndef FATHOM_KERNELS_CUDA_RMSNORM_ROW_CUH
#define FATHOM_KERNELS_CUDA_RMSNORM_ROW_CUH

#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/kernels_cuda.h" /* CudaGateAdd */

/* The norm's input row, with a gate (add_scaled_rmsnorm_forward, stream_mix_rmsnorm_forward)
 * formed first: x = bf16(base + *alpha * route), scaled_add's rounding, stored to gated;
 * before it, where added is not NULL, base += added (stored to stream, base's buffer) and
 * partial = partial_before + added where partial is not NULL (CudaGateAdd). route: where
 * the norm kernel reads the route; a kernel that makes the route itself leaves it NULL. */
struct NormInput {
    const bfloat *x; /* or the gate's base */
    const bfloat *route;
    const float *alpha;
    bfloat *gated;
    const bfloat *added, *partial_before;
    bfloat *stream, *partial;
};

/* A gate's input: x = bf16(base + *alpha * route) into x, after add's rows where it is not
 * NULL (CudaGateAdd); route NULL where the kernel makes the route itself. */
static inline NormInput norm_input_of_gate(const bf16 *base, const bf16 *route,
                                           const float *alpha, bf16 *x, const CudaGateAdd *add)
{
    return NormInput{(const bfloat *)base,
                     (const bfloat *)route,
                     alpha,
                     (bfloat *)x,
                     add ? (const bfloat *)add->added : NULL,
                     add ? (const bfloat *)add->partial_before : NULL,
                     add ? (bfloat *)add->stream : NULL,
                     add ? (bfloat *)add->partial : NULL};
}

/* chunk `column` of the row at `at`: a + b, rounded once and stored to `to`; the sum returned
 * as stored (add_both's and add_inplace's bits). */
template <bool VECTOR>
__device__ __forceinline__ uint4 norm_add_store(uint4 a, const bfloat *b, bfloat *to, size_t at,
                                                int column, int d)
{
    float sums[8], others[8];
    unpack8(sums, a);
    unpack8(others, load8_raw<VECTOR>(b + at, column, d));
#pragma unroll
    for (int k = 0; k < 8; k++)
        sums[k] += others[k];
    const uint4 rounded = pack8(sums);
    store8_raw<VECTOR>(to + at, column, d, rounded);
    return rounded;
}

/* The row `raw` (this thread's chunks of x, or of the gate's base) made into the norm's
 * input as NormInput says: the adds, stored, then where `gate` the gate with this thread's
 * chunks of the route (route_raw), stored to gated. GATED: the instance that may add into
 * a partial or form a gate (the others keep no registers for them). */
template <int ROW_THREADS, int CHUNKS, bool VECTOR, bool GATED>
__device__ __forceinline__ void rmsnorm_input_form(uint4 (&raw)[CHUNKS],
                                                   const uint4 (&route_raw)[CHUNKS], bool gate,
                                                   const NormInput &input, int row, int d)
{
    const int lane = threadIdx.x % ROW_THREADS;
    if (input.added) { /* the sublayer before's output, into the partial and the stream */
        const size_t at = (size_t)row * d;
#pragma unroll
        for (int chunk = 0; chunk < CHUNKS; chunk++) {
            const int column = (chunk * ROW_THREADS + lane) * 8;
            if (GATED && input.partial)
                norm_add_store<VECTOR>(load8_raw<VECTOR>(input.partial_before + at, column, d),
                                       input.added, input.partial, at, column, d);
            raw[chunk] = norm_add_store<VECTOR>(raw[chunk], input.added, input.stream, at,
                                                column, d);
        }
    }
    if (GATED && gate) { /* the gate, rounded once: the norm reads the rounded x */
        const float scale = *input.alpha;
#pragma unroll
        for (int chunk = 0; chunk < CHUNKS; chunk++) {
            float sums[8], others[8];
            unpack8(sums, raw[chunk]);
            unpack8(others, route_raw[chunk]);
#pragma unroll
            for (int k = 0; k < 8; k++)
                sums[k] = scaled_add(sums[k], scale, others[k]);
            raw[chunk] = pack8(sums);
            store8_raw<VECTOR>(input.gated + (size_t)row * d, (chunk * ROW_THREADS + lane) * 8,
                               d, raw[chunk]);
        }
    }
}

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

/* The backward's arithmetic is written with explicit roundings (__fmul_rn, __fmaf_rn, ..),
 * which the compiler neither contracts nor reorders: the product xhat and dxhat are used
 * twice, and whether it fused them into the sums depended on the kernel around them, where
 * the kernels that share this code must give the same bits. */

/* The backward's centre of the row: mean over it of dxhat * xhat (this thread's chunks of x,
 * dout and weight given raw). Every thread of the team calls it and gets the same value. */
template <int ROW_THREADS, int CHUNKS>
__device__ __forceinline__ float rmsnorm_row_backward_centre(const uint4 (&x)[CHUNKS],
                                                             const uint4 (&dout)[CHUNKS],
                                                             const uint4 (&weight)[CHUNKS],
                                                             float rstd, int d, float *scratch)
{
    float dot = 0.0f;
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++) {
        float xs[8], grads[8], scales[8];
        unpack8(xs, x[chunk]);
        unpack8(grads, dout[chunk]);
        unpack8(scales, weight[chunk]);
#pragma unroll
        for (int k = 0; k < 8; k++)
            dot = __fmaf_rn(__fmul_rn(grads[k], scales[k]), __fmul_rn(xs[k], rstd), dot);
    }
    return __fdiv_rn(row_sum<ROW_THREADS>(dot, scratch), (float)d);
}

/* One chunk's gradient: g = rstd (dxhat - xhat centre) into g, and dout * xhat added into
 * dweight_sum (this thread's running sums of the chunk's 8 columns). */
__device__ __forceinline__ void rmsnorm_chunk_backward(float (&g)[8], float (&dweight_sum)[8],
                                                       uint4 x, uint4 dout, uint4 weight,
                                                       float rstd, float centre)
{
    float xs[8], grads[8], scales[8];
    unpack8(xs, x);
    unpack8(grads, dout);
    unpack8(scales, weight);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float xhat = __fmul_rn(xs[k], rstd);
        g[k] = __fmul_rn(rstd, __fmaf_rn(-xhat, centre, __fmul_rn(grads[k], scales[k])));
        dweight_sum[k] = __fmaf_rn(grads[k], xhat, dweight_sum[k]);
    }
}

#endif
