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
 *
 * Sum of rows (out[c] += sum_t x[t, c], the gradient of a row every token reads): the
 * embedding backward with all n tokens on one row has one owner block a column chunk that
 * walks n rows serially, two blocks on the whole GPU at d 4096. Here the rows are cut into
 * SUM_ROWS_SLICES fixed slices: block (chunk, slice) sums its slice in row order into a
 * partial row of the workspace, then one thread a column adds the slices' partials in slice
 * order and adds that to out. Both orders depend on (rows, d) and the vector path only.
 * Bytes: x read once and [slices, d] fp32 written and read: 4096 x 4096 bf16 is 33.6 MB,
 * ~8 us at 4.3 TB/s, with 256 blocks of 128 threads, four rows in flight each.
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"

enum { EMBEDDING_MAX_THREADS = 256, SUM_ROWS_THREADS = 128, SUM_ROWS_SLICES = 64 };

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

/* Slices of the sum of rows: a function of the row count only (the order of the sum). */
static int sum_rows_slices(int rows)
{
    return rows < SUM_ROWS_SLICES ? rows : SUM_ROWS_SLICES;
}

/* grid (column chunks of blockDim * 8, slices): partials[slice, c] = sum of x[t, c] over
 * the slice's rows, in row order, fp32 */
template <bool VECTOR>
__global__ void __launch_bounds__(SUM_ROWS_THREADS)
    sum_rows_partial_kernel(float *partials, const bfloat *x, int rows, int d, int slices)
{
    size_t column = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (column >= (size_t)d)
        return;
    int slice = blockIdx.y;
    int first = (int)((long long)rows * slice / slices);
    int last = (int)((long long)rows * (slice + 1) / slices);
    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int t = first;
    for (; t + 4 <= last; t += 4) { /* four independent loads in flight, added in row order */
        float row[4][8];
#pragma unroll
        for (int r = 0; r < 4; r++)
            load8<VECTOR>(row[r], x + (size_t)(t + r) * d, column, d);
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int k = 0; k < 8; k++)
                sum[k] += row[r][k];
    }
    for (; t < last; t++) {
        float row[8];
        load8<VECTOR>(row, x + (size_t)t * d, column, d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            sum[k] += row[k];
    }
    store8_float<VECTOR>(partials + (size_t)slice * d, column, d, sum);
}

/* one thread a column: out[c] += the slices' partials added in slice order */
__global__ void sum_rows_reduce_kernel(float *out, const float *partials, int slices, int d)
{
    int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= d)
        return;
    float sum = 0.0f;
    for (int slice = 0; slice < slices; slice++)
        sum += partials[(size_t)slice * d + column];
    out[column] += sum;
}

extern "C" size_t cuda_sum_rows_workspace_floats(int rows, int d)
{
    if (rows <= 0 || d <= 0)
        return 1;
    return (size_t)sum_rows_slices(rows) * (size_t)d;
}

extern "C" void cuda_sum_rows(float *out, const bf16 *x, int rows, int d, float *workspace,
                              cudaStream_t stream)
{
    if (rows <= 0 || d <= 0)
        return;
    int slices = sum_rows_slices(rows);
    int chunk = SUM_ROWS_THREADS * 8;
    dim3 grid((d + chunk - 1) / chunk, slices);
    bool vector = d % 8 == 0 && is_aligned_16(x) && is_aligned_16(workspace);
    if (vector)
        sum_rows_partial_kernel<true>
            <<<grid, SUM_ROWS_THREADS, 0, stream>>>(workspace, (const bfloat *)x, rows, d, slices);
    else
        sum_rows_partial_kernel<false>
            <<<grid, SUM_ROWS_THREADS, 0, stream>>>(workspace, (const bfloat *)x, rows, d, slices);
    CUDA_CHECK_LAUNCH();
    sum_rows_reduce_kernel<<<(d + 255) / 256, 256, 0, stream>>>(out, workspace, slices, d);
    CUDA_CHECK_LAUNCH();
}
