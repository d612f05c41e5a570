/* kernels/cuda/attention_cuda.cu — causal grouped-KV flash attention, forward
 * (see attention_cuda.h; fragment layouts in attention_tiles.cuh).
 *
 * One CTA of 8 warps takes 128 queries of one head; warp w owns rows 16w .. 16w+15 and keeps
 * their output accumulators [16, head_dim] fp32 and running max / sum in registers. Key
 * blocks of 64 are walked from the diagonal down to 0, so masking happens only in the first
 * one or two blocks; the next block's K (V) is copied into the other shared buffer while
 * this block's scores (output) are computed. CTAs are launched heaviest first (the last
 * query block sees every key) so the tail of the grid is made of short CTAs.
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_tiles.cuh"

#include <cuda_runtime.h>
#include <math.h>

#define FORWARD_BLOCK_QUERIES 128
#define FORWARD_BLOCK_KEYS 64
#define FORWARD_WARPS (FORWARD_BLOCK_QUERIES / 16)
#define FORWARD_THREADS (FORWARD_WARPS * 32)

/* Q tile, then K and V tiles twice (double buffering); the fp32 output staging area of the
 * end reuses the same memory. */
template <int HEAD_DIM>
__host__ __device__ static constexpr size_t forward_shared_bytes(void)
{
    return (size_t)(FORWARD_BLOCK_QUERIES + 4 * FORWARD_BLOCK_KEYS) * (HEAD_DIM + TILE_PAD) *
           sizeof(__nv_bfloat16);
}

/* out [B, T, n_heads, HEAD_DIM], lse [B, n_heads, T] from q [B, T, n_heads, HEAD_DIM], k, v
 * [B, T, n_kv_heads, HEAD_DIM]; grid (n_heads, B, query blocks), FORWARD_THREADS threads;
 * scale_log2 = log2(e) / sqrt(HEAD_DIM) (the softmax runs in base 2). */
template <int HEAD_DIM>
__global__ void __launch_bounds__(FORWARD_THREADS, 1)
attention_forward_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                         const __nv_bfloat16 *k, const __nv_bfloat16 *v, int T, int n_heads,
                         int n_kv_heads, float scale_log2)
{
    constexpr int stride = HEAD_DIM + TILE_PAD;
    constexpr int block_queries = FORWARD_BLOCK_QUERIES, block_keys = FORWARD_BLOCK_KEYS;
    static_assert(forward_shared_bytes<HEAD_DIM>() >=
                      (size_t)block_queries * (HEAD_DIM + STAGE_PAD) * sizeof(float),
                  "the output staging area must fit in the tiles' memory");
    extern __shared__ __align__(16) unsigned char shared[];
    __nv_bfloat16 *q_tile = reinterpret_cast<__nv_bfloat16 *>(shared);
    __nv_bfloat16 *k_tiles = q_tile + block_queries * stride; /* [2][block_keys][stride] */
    __nv_bfloat16 *v_tiles = k_tiles + 2 * block_keys * stride;

    int head = blockIdx.x, batch = blockIdx.y;
    int query_block = gridDim.z - 1 - blockIdx.z;
    int kv_head = head / (n_heads / n_kv_heads);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    const __nv_bfloat16 *q_base = q + (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
    const __nv_bfloat16 *k_base = k + (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    const __nv_bfloat16 *v_base = v + (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    int query0 = query_block * block_queries;
    int last_key_block = (min(T, query0 + block_queries) - 1) / block_keys;
    /* the two query rows of this thread's accumulator elements (c[0..1], c[2..3]) */
    int query_row[2] = {query0 + warp * 16 + g, query0 + warp * 16 + g + 8};

    /* groups in flight: {Q, K of the first block}, {V of the first block} */
    tile_load_async<block_queries, HEAD_DIM, FORWARD_THREADS>(q_tile, q_base, q_stride, query0, T);
    tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(k_tiles, k_base, kv_stride,
                                                           last_key_block * block_keys, T);
    copy_async_commit();
    tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(v_tiles, v_base, kv_stride,
                                                           last_key_block * block_keys, T);
    copy_async_commit();

    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
        o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    /* running max of the base-2 scores and this thread's part of the running sum, per row */
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int key_block = last_key_block, iteration = 0; key_block >= 0;
         key_block--, iteration++) {
        int buffer = iteration & 1;
        const __nv_bfloat16 *k_tile = k_tiles + buffer * block_keys * stride;
        const __nv_bfloat16 *v_tile = v_tiles + buffer * block_keys * stride;
        int key0 = key_block * block_keys;

        /* this block's K has landed (only its V may still be in flight); every warp is past
         * the previous block, so the other K buffer is free for the next block */
        copy_async_wait<1>();
        __syncthreads();
        if (key_block > 0)
            tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(
                k_tiles + (buffer ^ 1) * block_keys * stride, k_base, kv_stride,
                key0 - block_keys, T);
        copy_async_commit(); /* possibly empty: keeps the group count uniform */

        /* s = q k^T for the warp's 16 rows and the block's 64 keys */
        float s[block_keys / 8][4];
#pragma unroll
        for (int t = 0; t < block_keys / 8; t++)
            s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < HEAD_DIM; k0 += 16) {
            uint32_t a[4];
            load_matrix_x4(a, operand_a_address(q_tile, stride, warp * 16, k0, lane));
#pragma unroll
            for (int n0 = 0; n0 < block_keys; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4(b, operand_b_address(k_tile, stride, n0, k0, lane));
                mma_bf16_16x8x16(s[n0 / 8], a, b[0], b[1]);
                mma_bf16_16x8x16(s[n0 / 8 + 1], a, b[2], b[3]);
            }
        }

        /* causal mask (and keys past T, which only the diagonal blocks hold) */
        bool needs_mask = key0 + block_keys - 1 > query0;
#pragma unroll
        for (int t = 0; t < block_keys / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = key0 + t * 8 + 2 * c + (e & 1);
                s[t][e] *= scale_log2;
                if (needs_mask && (key > query_row[e >> 1] || key >= T))
                    s[t][e] = -INFINITY;
            }

        /* online softmax: rescale what was summed under the old max, then p = 2^(s - max) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float maximum = row_max[r];
#pragma unroll
            for (int t = 0; t < block_keys / 8; t++)
                maximum = fmaxf(maximum, fmaxf(s[t][2 * r], s[t][2 * r + 1]));
            maximum = fmaxf(maximum, __shfl_xor_sync(0xffffffffu, maximum, 1));
            maximum = fmaxf(maximum, __shfl_xor_sync(0xffffffffu, maximum, 2));
            /* a row with every key masked so far keeps max -inf; 0 stands in so that no
             * -inf - -inf appears (its p and correction are then exact zeros) */
            float reference = maximum == -INFINITY ? 0.0f : maximum;
            float correction = exp2f(row_max[r] - reference);
            row_max[r] = maximum;
            row_sum[r] *= correction;
#pragma unroll
            for (int t = 0; t < HEAD_DIM / 8; t++) {
                o[t][2 * r] *= correction;
                o[t][2 * r + 1] *= correction;
            }
#pragma unroll
            for (int t = 0; t < block_keys / 8; t++) {
                s[t][2 * r] = exp2f(s[t][2 * r] - reference);
                s[t][2 * r + 1] = exp2f(s[t][2 * r + 1] - reference);
                row_sum[r] += s[t][2 * r] + s[t][2 * r + 1];
            }
        }

        /* this block's V has landed; the other V buffer is free for the next block */
        copy_async_wait<1>();
        __syncthreads();
        if (key_block > 0)
            tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(
                v_tiles + (buffer ^ 1) * block_keys * stride, v_base, kv_stride,
                key0 - block_keys, T);
        copy_async_commit();

        /* o += p v, the probabilities going straight from accumulators to operands */
#pragma unroll
        for (int k0 = 0; k0 < block_keys; k0 += 16) {
            uint32_t a[4];
            accumulators_to_operand(a, s[k0 / 8], s[k0 / 8 + 1]);
#pragma unroll
            for (int n0 = 0; n0 < HEAD_DIM; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4_transposed(b, operand_b_transposed_address(v_tile, stride, n0,
                                                                          k0, lane));
                mma_bf16_16x8x16(o[n0 / 8], a, b[0], b[1]);
                mma_bf16_16x8x16(o[n0 / 8 + 1], a, b[2], b[3]);
            }
        }
    }

    /* normalise, save lse = ln(sum exp(scaled score)) = ln 2 * (max + log2(sum)) */
    float *lse_base = lse + ((size_t)batch * n_heads + head) * T;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
        for (int t = 0; t < HEAD_DIM / 8; t++) {
            o[t][2 * r] *= inverse;
            o[t][2 * r + 1] *= inverse;
        }
        if (c == 0 && query_row[r] < T)
            lse_base[query_row[r]] = (row_max[r] + log2f(sum)) * LN_2;
    }

    /* out through shared memory, in 16-byte pieces (every warp is done with the tiles) */
    __syncthreads();
    float *stage = reinterpret_cast<float *>(shared) + warp * 16 * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(stage, o, 1.0f, lane);
    __syncwarp();
    __nv_bfloat16 *out_base = out + (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
    warp_store_staged<HEAD_DIM>(out_base, q_stride, stage, query0 + warp * 16, T, false, lane);
}

template <int HEAD_DIM>
static void forward_launch(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                           const __nv_bfloat16 *k, const __nv_bfloat16 *v, int B, int T,
                           int n_heads, int n_kv_heads, cudaStream_t stream)
{
    constexpr size_t shared_bytes = forward_shared_bytes<HEAD_DIM>();
    static bool configured; /* over 48 KiB of shared memory must be asked for, once */
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attention_forward_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
        configured = true;
    }
    int query_blocks = (T + FORWARD_BLOCK_QUERIES - 1) / FORWARD_BLOCK_QUERIES;
    dim3 grid(n_heads, B, query_blocks);
    float scale_log2 = LOG2_E / sqrtf((float)HEAD_DIM);
    attention_forward_kernel<HEAD_DIM><<<grid, FORWARD_THREADS, shared_bytes, stream>>>(
        out, lse, q, k, v, T, n_heads, n_kv_heads, scale_log2);
    CUDA_CHECK_LAUNCH();
}

extern "C" void attention_forward_cuda(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                       const bf16 *v, int B, int T, int n_heads, int n_kv_heads,
                                       int head_dim, cudaStream_t stream)
{
    const char *op = "attention_forward_cuda";
    attention_check_shape(op, B, T, n_heads, n_kv_heads, head_dim);
    attention_check_aligned(op, "out", out);
    attention_check_aligned(op, "q", q);
    attention_check_aligned(op, "k", k);
    attention_check_aligned(op, "v", v);
    if (B == 0 || T == 0)
        return;
    if ((T + FORWARD_BLOCK_QUERIES - 1) / FORWARD_BLOCK_QUERIES > 65535)
        fatal(EXIT_CONFIG, "%s: T = %d is longer than the launch grid allows", op, T);
    __nv_bfloat16 *out_bf16 = reinterpret_cast<__nv_bfloat16 *>(out);
    const __nv_bfloat16 *q_bf16 = reinterpret_cast<const __nv_bfloat16 *>(q);
    const __nv_bfloat16 *k_bf16 = reinterpret_cast<const __nv_bfloat16 *>(k);
    const __nv_bfloat16 *v_bf16 = reinterpret_cast<const __nv_bfloat16 *>(v);
    switch (head_dim) {
    case 64:
        forward_launch<64>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads, n_kv_heads,
                           stream);
        break;
    case 80:
        forward_launch<80>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads, n_kv_heads,
                           stream);
        break;
    default:
        forward_launch<128>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads, n_kv_heads,
                            stream);
        break;
    }
}
