/* kernels/cuda/embedding_cuda.cu — token embedding lookup and its gradient (DESIGN 2:
 * e = embed[x]). table [V, d] bf16, out / dout [n, d] bf16, dtable [V, d] fp32, tokens [n].
 *
 * Forward: block t copies row tokens[t] of the table to row t of out (raw bits, 16 bytes a
 * thread).
 *
 * Backward, deterministic without atomics or a sort (see kernels_cuda.h): block (t, chunk)
 * first asks whether any earlier position holds the same token; if so it exits, because
 * that earlier position's block owns the row. The owner walks the positions t..n-1 in
 * tiles of blockDim, each warp ballots which of its positions match, and the block then
 * visits the matches in increasing position order, adding their dout rows to a running
 * fp32 sum that starts from the current dtable row. Every (token, column) is summed by
 * exactly one thread in position order: the cpu backend's order, hence its bits.
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

enum { EMBEDDING_MAX_THREADS = 256 };

/* Threads for a row of d: a multiple of 32, at most EMBEDDING_MAX_THREADS, 8 columns each. */
static int embedding_threads(int d)
{
    int threads = ((d + 7) / 8 + 31) / 32 * 32;
    return threads < EMBEDDING_MAX_THREADS ? threads : EMBEDDING_MAX_THREADS;
}

/* grid (n, column chunks of blockDim * 8) */
template <bool VECTOR>
__global__ void __launch_bounds__(EMBEDDING_MAX_THREADS)
    embedding_forward_kernel(bfloat *out, const uint32_t *tokens, const bfloat *table, int d)
{
    int t = blockIdx.x;
    size_t column = ((size_t)blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (column >= (size_t)d)
        return;
    const bfloat *source = table + (size_t)tokens[t] * d;
    bfloat *target = out + (size_t)t * d;
    if (VECTOR) {
        *reinterpret_cast<uint4 *>(target + column) =
            *reinterpret_cast<const uint4 *>(source + column);
    } else {
        for (size_t c = column; c < column + 8 && c < (size_t)d; c++)
            target[c] = source[c];
    }
}

/* grid (n, column chunks of blockDim * 8); blockDim a multiple of 32 */
template <bool VECTOR>
__global__ void __launch_bounds__(EMBEDDING_MAX_THREADS)
    embedding_backward_kernel(float *dtable, const bfloat *dout, const uint32_t *tokens, int n,
                              int d)
{
    __shared__ unsigned match_masks[EMBEDDING_MAX_THREADS / 32];
    int t = blockIdx.x;
    uint32_t token = tokens[t];

    int seen_before = 0;
    for (int s = threadIdx.x; s < t; s += blockDim.x)
        seen_before |= tokens[s] == token;
    if (__syncthreads_or(seen_before))
        return; /* the whole block leaves: an earlier position owns this row */

    size_t column = ((size_t)blockIdx.y * blockDim.x + threadIdx.x) * 8;
    float *row = dtable + (size_t)token * d;
    float sum[8];
    load8_float<VECTOR>(sum, row, column, d); /* zeros past d, never stored */

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int tile = t; tile < n; tile += blockDim.x) {
        int s = tile + threadIdx.x;
        unsigned matches = __ballot_sync(0xffffffffu, s < n && tokens[s] == token);
        if (lane == 0)
            match_masks[warp] = matches;
        __syncthreads();
        for (int w = 0; w < warps; w++) {
            for (unsigned mask = match_masks[w]; mask; mask &= mask - 1) {
                int position = tile + w * 32 + __ffs(mask) - 1;
                float grad[8];
                load8<VECTOR>(grad, dout + (size_t)position * d, column, d);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    sum[k] += grad[k];
            }
        }
        __syncthreads(); /* match_masks is rewritten by the next tile */
    }
    store8_float<VECTOR>(row, column, d, sum);
}

extern "C" void cuda_embedding_forward(bf16 *out, const uint32_t *tokens, const bf16 *table,
                                       int n, int d, cudaStream_t stream)
{
    if (n <= 0 || d <= 0)
        return;
    int threads = embedding_threads(d);
    dim3 grid(n, (d + threads * 8 - 1) / (threads * 8));
    bool vector = d % 8 == 0 && is_aligned_16(out) && is_aligned_16(table);
    if (vector)
        embedding_forward_kernel<true>
            <<<grid, threads, 0, stream>>>((bfloat *)out, tokens, (const bfloat *)table, d);
    else
        embedding_forward_kernel<false>
            <<<grid, threads, 0, stream>>>((bfloat *)out, tokens, (const bfloat *)table, d);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_embedding_backward(float *dtable, const bf16 *dout, const uint32_t *tokens,
                                        int n, int d, cudaStream_t stream)
{
    if (n <= 0 || d <= 0)
        return;
    int threads = embedding_threads(d);
    dim3 grid(n, (d + threads * 8 - 1) / (threads * 8));
    bool vector = d % 8 == 0 && is_aligned_16(dtable) && is_aligned_16(dout);
    if (vector)
        embedding_backward_kernel<true>
            <<<grid, threads, 0, stream>>>(dtable, (const bfloat *)dout, tokens, n, d);
    else
        embedding_backward_kernel<false>
            <<<grid, threads, 0, stream>>>(dtable, (const bfloat *)dout, tokens, n, d);
    CUDA_CHECK_LAUNCH();
}
