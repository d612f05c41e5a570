/* kernels/cuda/attention_backward_delta_cuda.cu — the attention backward's first pass
 * (attention_backward_cuda.cu runs it before the fused or the two-pass kernels):
 *   delta[b, h, t] = sum_i dout[b, t, h, i] * out[b, t, h, i]   in fp32,
 * dout and out [B, T, n_heads, head_dim] bf16, delta [B, n_heads, T] fp32 in the backward's
 * workspace (attention_backward_internal.h), whose semaphores and tile counter it also
 * zeroes for the fused kernel. Deterministic: every sum is taken in a fixed order.
 */
#include "kernels/cuda/attention_backward_internal.h"
#include "kernels/cuda/attention_tiles.cuh"

#include <cuda_runtime.h>

#define PREPROCESS_THREADS 256

/* delta[b, h, t] = sum_i dout[b,t,h,i] * out[b,t,h,i] in fp32; rows = B * T * n_heads, a
 * row head_dim / 8 pieces of 16 bytes. Both delta kernels also zero zeroed[0 ..
 * zeroed_words) (the fused kernel's semaphores and tile counter). */
enum { DELTA_STEPS = 4 };

__device__ __forceinline__ void delta_zero_words(uint32_t *zeroed, size_t zeroed_words)
{
    for (size_t word = (size_t)blockIdx.x * PREPROCESS_THREADS + threadIdx.x;
         word < zeroed_words; word += (size_t)gridDim.x * PREPROCESS_THREADS)
        zeroed[word] = 0u;
}

__device__ __forceinline__ void delta_store(float *delta, long long row, float sum, int T,
                                            int n_heads)
{
    const int head = (int)(row % n_heads), t = (int)((row / n_heads) % T);
    const long long batch = row / ((long long)n_heads * T);
    delta[((size_t)batch * n_heads + head) * T + t] = sum;
}

/* The dot of one 16-byte piece of dout and out: 8 products added in order, in fp32. */
__device__ __forceinline__ float delta_piece_dot(uint4 dout_piece, uint4 out_piece)
{
    float dout_values[8], out_values[8], sum = 0.0f;
    unpack_bf16x8(dout_values, dout_piece);
    unpack_bf16x8(out_values, out_piece);
#pragma unroll
    for (int i = 0; i < 8; i++)
        sum += dout_values[i] * out_values[i];
    return sum;
}

/* head_dim 64 and 128 (8 and 16 pieces): a row's pieces go to a segment of SEGMENT lanes,
 * 32 / SEGMENT rows a warp at once, and a warp takes DELTA_STEPS such groups with all their
 * loads issued first. (A warp a row, one piece a lane, left half the lanes idle at head_dim
 * 128 and 32 bytes a thread in flight: 72 us for the 134 MB of B2 T4096 32 heads, twice the
 * copy rate.) The sum is the same xor tree over a segment's lanes as a warp a row gave. */
template <int SEGMENT>
__global__ void __launch_bounds__(PREPROCESS_THREADS)
attention_backward_delta_kernel(float *delta, uint32_t *zeroed, size_t zeroed_words,
                                const __nv_bfloat16 *dout, const __nv_bfloat16 *out, int rows,
                                int T, int n_heads, int head_dim)
{
    constexpr int ROWS_AT_ONCE = 32 / SEGMENT;
    delta_zero_words(zeroed, zeroed_words);
    const size_t global_thread = (size_t)blockIdx.x * PREPROCESS_THREADS + threadIdx.x;
    const int lane = threadIdx.x % 32, piece = lane % SEGMENT;
    const long long first = (long long)(global_thread / 32) * ROWS_AT_ONCE * DELTA_STEPS +
                            lane / SEGMENT;
    uint4 dout_pieces[DELTA_STEPS], out_pieces[DELTA_STEPS];
#pragma unroll
    for (int step = 0; step < DELTA_STEPS; step++) {
        const long long row = first + step * ROWS_AT_ONCE;
        dout_pieces[step] = out_pieces[step] = make_uint4(0u, 0u, 0u, 0u);
        if (row < rows && piece < head_dim / 8) {
            const size_t offset = (size_t)row * head_dim + piece * 8;
            dout_pieces[step] = *reinterpret_cast<const uint4 *>(dout + offset);
            out_pieces[step] = *reinterpret_cast<const uint4 *>(out + offset);
        }
    }
#pragma unroll
    for (int step = 0; step < DELTA_STEPS; step++) {
        const long long row = first + step * ROWS_AT_ONCE;
        float sum = delta_piece_dot(dout_pieces[step], out_pieces[step]);
#pragma unroll
        for (int offset = SEGMENT / 2; offset > 0; offset /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (piece == 0 && row < rows)
            delta_store(delta, row, sum, T, n_heads);
    }
}

/* head_dim 80: a row's 10 pieces fit no segment of lanes that divides 32, and in one of 16
 * lanes 6 lanes were idle (3.7 ms a 1B step, 1.6 TB/s: docs/performance.md, 2026-12-05).
 * Here a warp takes 32 consecutive rows as one run of 32 * PIECES pieces (rows lie one after
 * another in memory), PIECES a lane at a stride of 32, every lane busy and all loads issued
 * first; each piece's 8-term dot goes to the warp's row of shared memory, and lane r then
 * adds row r's piece dots in piece order (fixed: the same bits every run). */
template <int PIECES>
__global__ void __launch_bounds__(PREPROCESS_THREADS)
attention_backward_delta_rows_kernel(float *delta, uint32_t *zeroed, size_t zeroed_words,
                                     const __nv_bfloat16 *dout, const __nv_bfloat16 *out,
                                     int rows, int T, int n_heads)
{
    __shared__ float piece_dots[PREPROCESS_THREADS / 32][32 * PIECES];
    delta_zero_words(zeroed, zeroed_words);
    const int lane = threadIdx.x % 32;
    float *dots = piece_dots[threadIdx.x / 32];
    const long long first_row =
        (long long)(((size_t)blockIdx.x * PREPROCESS_THREADS + threadIdx.x) / 32) * 32;
    const long long first_piece = first_row * PIECES, pieces = (long long)rows * PIECES;
    uint4 dout_pieces[PIECES], out_pieces[PIECES];
#pragma unroll
    for (int i = 0; i < PIECES; i++) {
        const long long piece = first_piece + lane + 32 * i;
        dout_pieces[i] = out_pieces[i] = make_uint4(0u, 0u, 0u, 0u);
        if (piece < pieces) {
            dout_pieces[i] = reinterpret_cast<const uint4 *>(dout)[piece];
            out_pieces[i] = reinterpret_cast<const uint4 *>(out)[piece];
        }
    }
#pragma unroll
    for (int i = 0; i < PIECES; i++) {
        dots[lane + 32 * i] = delta_piece_dot(dout_pieces[i], out_pieces[i]);
    }
    __syncwarp();
    const long long row = first_row + lane;
    if (row < rows) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < PIECES; i++)
            sum += dots[lane * PIECES + i];
        delta_store(delta, row, sum, T, n_heads);
    }
}

void attention_backward_delta_launch(const AttentionBackwardWorkspace *w, const bf16 *dout,
                                     const bf16 *out, int B, int T, int n_heads, int head_dim,
                                     cudaStream_t stream)
{
    int rows = B * T * n_heads;
    if (head_dim == 80) {
        const int rows_a_block = PREPROCESS_THREADS; /* 32 a warp */
        attention_backward_delta_rows_kernel<10>
            <<<(rows + rows_a_block - 1) / rows_a_block, PREPROCESS_THREADS, 0, stream>>>(
                w->delta, w->semaphores, w->zeroed_words,
                reinterpret_cast<const __nv_bfloat16 *>(dout),
                reinterpret_cast<const __nv_bfloat16 *>(out), rows, T, n_heads);
    } else { /* segments of 16 lanes (head_dim 128) or 8 (64) */
        const int segment = head_dim == 64 ? 8 : 16;
        const int rows_a_block = PREPROCESS_THREADS / 32 * (32 / segment) * DELTA_STEPS;
        const int preprocess_blocks = (rows + rows_a_block - 1) / rows_a_block;
        (segment == 8 ? attention_backward_delta_kernel<8> : attention_backward_delta_kernel<16>)
            <<<preprocess_blocks, PREPROCESS_THREADS, 0, stream>>>(
                w->delta, w->semaphores, w->zeroed_words,
                reinterpret_cast<const __nv_bfloat16 *>(dout),
                reinterpret_cast<const __nv_bfloat16 *>(out), rows, T, n_heads, head_dim);
    }
    CUDA_CHECK_LAUNCH();
}
