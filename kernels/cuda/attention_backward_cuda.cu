/* kernels/cuda/attention_backward_cuda.cu — causal grouped-KV flash attention, backward
 * (see attention_cuda.h; fragment layouts in attention_tiles.cuh).
 *
 * With p = exp(score - lse) recomputed from the saved lse, dp = dout . v, delta = dout . out
 * and ds = p (dp - delta) (the softmax backward), per (query t, key s):
 *   dv_s += p dout_t,   dk_s += ds q_t / sqrt(hd),   dq_t += ds k_s / sqrt(hd).
 * Three kernels, all on the caller's stream:
 * 1. delta [B, n_heads, T] (workspace) = rowsum(dout * out), one warp a row.
 * 2. dk, dv: a CTA of 4 warps owns 64 keys of one kv head; warp w owns keys 16w .. 16w+15
 *    and works on the transposed products (scores^T = k q^T, dp^T = v dout^T) so that its
 *    rows are its keys: p^T and ds^T stay in its registers and feed dv += p^T dout and
 *    dk += ds^T q directly. The CTA walks every query head of the group and every query
 *    block at or after its keys (double-buffered q, dout, lse, delta tiles): the whole sum
 *    for a key is made by one thread in a fixed order, so no atomics are needed.
 * 3. dq: a CTA of 4 warps owns 64 queries of one head and walks its key blocks (as the
 *    forward does) recomputing p and dp: dq += ds k. Again one thread, one fixed order.
 * Kernel 3 repeats two of kernel 2's products; that is what a deterministic dq costs without
 * atomics or a T/64-fold partial buffer (DESIGN 3 "Determinism").
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_tiles.cuh"

#include <cuda_runtime.h>
#include <math.h>

#define BACKWARD_BLOCK 64 /* queries and keys a tile: equal, so only tile pairs on the
                           * diagonal need the causal mask */
#define BACKWARD_WARPS (BACKWARD_BLOCK / 16)
#define BACKWARD_THREADS (BACKWARD_WARPS * 32)
#define PREPROCESS_THREADS 256

/* Six bf16 tiles [64, HEAD_DIM + pad] (kernel 2: k, v, q x2, dout x2; kernel 3: q, dout,
 * k x2, v x2) and, for kernel 2, lse and delta x2; the fp32 staging of the results at the
 * end reuses the same memory. */
template <int HEAD_DIM>
__host__ __device__ static constexpr size_t backward_shared_bytes(void)
{
    return (size_t)6 * BACKWARD_BLOCK * (HEAD_DIM + TILE_PAD) * sizeof(__nv_bfloat16) +
           (size_t)4 * BACKWARD_BLOCK * sizeof(float);
}

/* delta[b, h, t] = sum_i dout[b,t,h,i] * out[b,t,h,i] in fp32; rows = B * T * n_heads, one
 * warp a row of head_dim (<= 128: one 16-byte piece per lane). */
__global__ void __launch_bounds__(PREPROCESS_THREADS)
attention_backward_delta_kernel(float *delta, const __nv_bfloat16 *dout,
                                const __nv_bfloat16 *out, int rows, int T, int n_heads,
                                int head_dim)
{
    int row = blockIdx.x * (PREPROCESS_THREADS / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows)
        return; /* the whole warp leaves together */
    float sum = 0.0f;
    if (lane < head_dim / 8) {
        size_t offset = (size_t)row * head_dim + lane * 8;
        float dout_values[8], out_values[8];
        unpack_bf16x8(dout_values, *reinterpret_cast<const uint4 *>(dout + offset));
        unpack_bf16x8(out_values, *reinterpret_cast<const uint4 *>(out + offset));
#pragma unroll
        for (int i = 0; i < 8; i++)
            sum += dout_values[i] * out_values[i];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
        int head = row % n_heads, t = (row / n_heads) % T, batch = row / (n_heads * T);
        delta[((size_t)batch * n_heads + head) * T + t] = sum;
    }
}

/* dk, dv [B, T, n_kv_heads, HEAD_DIM] (+)= their gradients; grid (n_kv_heads, B, key
 * blocks), BACKWARD_THREADS threads. lse, delta [B, n_heads, T]. */
template <int HEAD_DIM>
__global__ void __launch_bounds__(BACKWARD_THREADS, 2)
attention_backward_key_kernel(__nv_bfloat16 *dk, __nv_bfloat16 *dv, const __nv_bfloat16 *dout,
                              const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                              const __nv_bfloat16 *v, const float *lse, const float *delta,
                              int T, int n_heads, int n_kv_heads, float scale, float scale_log2,
                              bool accumulate)
{
    constexpr int stride = HEAD_DIM + TILE_PAD;
    constexpr int block = BACKWARD_BLOCK, tile = BACKWARD_BLOCK * stride;
    static_assert(backward_shared_bytes<HEAD_DIM>() >=
                      (size_t)2 * block * (HEAD_DIM + STAGE_PAD) * sizeof(float),
                  "the dk and dv staging areas must fit in the tiles' memory");
    extern __shared__ __align__(16) unsigned char shared[];
    __nv_bfloat16 *k_tile = reinterpret_cast<__nv_bfloat16 *>(shared);
    __nv_bfloat16 *v_tile = k_tile + tile;
    __nv_bfloat16 *q_tiles = v_tile + tile;        /* [2][block][stride] */
    __nv_bfloat16 *dout_tiles = q_tiles + 2 * tile; /* [2][block][stride] */
    float *lse_tiles = reinterpret_cast<float *>(dout_tiles + 2 * tile); /* [2][block] */
    float *delta_tiles = lse_tiles + 2 * block;                           /* [2][block] */

    int kv_head = blockIdx.x, batch = blockIdx.y, key_block = blockIdx.z;
    int group = n_heads / n_kv_heads;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    size_t kv_offset = (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    int key0 = key_block * block;
    int query_blocks = (T + block - 1) / block;
    /* query blocks before key_block see none of these keys */
    int blocks_per_head = query_blocks - key_block, items = group * blocks_per_head;
    /* the two key rows of this thread's accumulator elements (c[0..1], c[2..3]) */
    int key_row[2] = {key0 + warp * 16 + g, key0 + warp * 16 + g + 8};

    /* Work item i: query head kv_head * group + i / blocks_per_head, query block
     * key_block + i % blocks_per_head. Loads its q, dout, lse, delta into buffer i % 2. */
    auto load_item = [&](int item, int buffer) {
        int head = kv_head * group + item / blocks_per_head;
        int query0 = (key_block + item % blocks_per_head) * block;
        size_t q_offset = (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
        size_t row_offset = ((size_t)batch * n_heads + head) * T;
        tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(q_tiles + buffer * tile,
                                                           q + q_offset, q_stride, query0, T);
        tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(dout_tiles + buffer * tile,
                                                           dout + q_offset, q_stride, query0, T);
        vector_load_async<block>(lse_tiles + buffer * block, lse + row_offset, query0, T);
        vector_load_async<block>(delta_tiles + buffer * block, delta + row_offset, query0, T);
    };

    tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(k_tile, k + kv_offset, kv_stride, key0, T);
    tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(v_tile, v + kv_offset, kv_stride, key0, T);
    load_item(0, 0);
    copy_async_commit();

    float dk_sum[HEAD_DIM / 8][4], dv_sum[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk_sum[t][e] = dv_sum[t][e] = 0.0f;

    for (int item = 0; item < items; item++) {
        int buffer = item & 1;
        int query0 = (key_block + item % blocks_per_head) * block;
        const __nv_bfloat16 *q_tile = q_tiles + buffer * tile;
        const __nv_bfloat16 *dout_tile = dout_tiles + buffer * tile;
        const float *lse_tile = lse_tiles + buffer * block;
        const float *delta_tile = delta_tiles + buffer * block;

        /* this item's tiles have landed; every warp is done with the previous item, so its
         * buffer takes the next one while this one is computed */
        copy_async_wait<0>();
        __syncthreads();
        if (item + 1 < items)
            load_item(item + 1, buffer ^ 1);
        copy_async_commit();

        /* p^T = exp(k q^T * scale - lse), the warp's 16 keys against 64 queries */
        float p[block / 8][4];
#pragma unroll
        for (int t = 0; t < block / 8; t++)
            p[t][0] = p[t][1] = p[t][2] = p[t][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < HEAD_DIM; k0 += 16) {
            uint32_t a[4];
            load_matrix_x4(a, operand_a_address(k_tile, stride, warp * 16, k0, lane));
#pragma unroll
            for (int n0 = 0; n0 < block; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4(b, operand_b_address(q_tile, stride, n0, k0, lane));
                mma_bf16_16x8x16(p[n0 / 8], a, b[0], b[1]);
                mma_bf16_16x8x16(p[n0 / 8 + 1], a, b[2], b[3]);
            }
        }
        /* masked: queries before the key (diagonal tile) and queries past T (last tile) */
        bool needs_mask = query0 < key0 + block - 1 || query0 + block > T;
#pragma unroll
        for (int t = 0; t < block / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int column = t * 8 + 2 * c + (e & 1), query = query0 + column;
                float value = exp2f(fmaf(p[t][e], scale_log2, -lse_tile[column] * LOG2_E));
                if (needs_mask && (query < key_row[e >> 1] || query >= T))
                    value = 0.0f;
                p[t][e] = value;
            }

        /* ds^T = p^T (v dout^T - delta) */
        float ds[block / 8][4];
#pragma unroll
        for (int t = 0; t < block / 8; t++)
            ds[t][0] = ds[t][1] = ds[t][2] = ds[t][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < HEAD_DIM; k0 += 16) {
            uint32_t a[4];
            load_matrix_x4(a, operand_a_address(v_tile, stride, warp * 16, k0, lane));
#pragma unroll
            for (int n0 = 0; n0 < block; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4(b, operand_b_address(dout_tile, stride, n0, k0, lane));
                mma_bf16_16x8x16(ds[n0 / 8], a, b[0], b[1]);
                mma_bf16_16x8x16(ds[n0 / 8 + 1], a, b[2], b[3]);
            }
        }
#pragma unroll
        for (int t = 0; t < block / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                ds[t][e] = p[t][e] * (ds[t][e] - delta_tile[t * 8 + 2 * c + (e & 1)]);

        /* dv += p^T dout, dk += ds^T q (the 1/sqrt(hd) of dk is applied once, at the end) */
#pragma unroll
        for (int k0 = 0; k0 < block; k0 += 16) {
            uint32_t a_p[4], a_ds[4];
            accumulators_to_operand(a_p, p[k0 / 8], p[k0 / 8 + 1]);
            accumulators_to_operand(a_ds, ds[k0 / 8], ds[k0 / 8 + 1]);
#pragma unroll
            for (int n0 = 0; n0 < HEAD_DIM; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4_transposed(b, operand_b_transposed_address(dout_tile, stride,
                                                                          n0, k0, lane));
                mma_bf16_16x8x16(dv_sum[n0 / 8], a_p, b[0], b[1]);
                mma_bf16_16x8x16(dv_sum[n0 / 8 + 1], a_p, b[2], b[3]);
                load_matrix_x4_transposed(b, operand_b_transposed_address(q_tile, stride, n0,
                                                                          k0, lane));
                mma_bf16_16x8x16(dk_sum[n0 / 8], a_ds, b[0], b[1]);
                mma_bf16_16x8x16(dk_sum[n0 / 8 + 1], a_ds, b[2], b[3]);
            }
        }
    }

    /* results through shared memory, in 16-byte pieces (every warp is done with the tiles;
     * the last commit was empty, so no copy is in flight) */
    __syncthreads();
    float *dk_stage = reinterpret_cast<float *>(shared) + warp * 16 * (HEAD_DIM + STAGE_PAD);
    float *dv_stage = dk_stage + block * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(dk_stage, dk_sum, scale, lane);
    warp_stage_accumulators<HEAD_DIM>(dv_stage, dv_sum, 1.0f, lane);
    __syncwarp();
    warp_store_staged<HEAD_DIM>(dk + kv_offset, kv_stride, dk_stage, key0 + warp * 16, T,
                                accumulate, lane);
    warp_store_staged<HEAD_DIM>(dv + kv_offset, kv_stride, dv_stage, key0 + warp * 16, T,
                                accumulate, lane);
}

/* dq [B, T, n_heads, HEAD_DIM] (+)= its gradient; grid (n_heads, B, query blocks),
 * BACKWARD_THREADS threads. */
template <int HEAD_DIM>
__global__ void __launch_bounds__(BACKWARD_THREADS, 2)
attention_backward_query_kernel(__nv_bfloat16 *dq, const __nv_bfloat16 *dout,
                                const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                const __nv_bfloat16 *v, const float *lse, const float *delta,
                                int T, int n_heads, int n_kv_heads, float scale,
                                float scale_log2, bool accumulate)
{
    constexpr int stride = HEAD_DIM + TILE_PAD;
    constexpr int block = BACKWARD_BLOCK, tile = BACKWARD_BLOCK * stride;
    static_assert(backward_shared_bytes<HEAD_DIM>() >=
                      (size_t)block * (HEAD_DIM + STAGE_PAD) * sizeof(float),
                  "the dq staging area must fit in the tiles' memory");
    extern __shared__ __align__(16) unsigned char shared[];
    __nv_bfloat16 *q_tile = reinterpret_cast<__nv_bfloat16 *>(shared);
    __nv_bfloat16 *dout_tile = q_tile + tile;
    __nv_bfloat16 *k_tiles = dout_tile + tile; /* [2][block][stride] */
    __nv_bfloat16 *v_tiles = k_tiles + 2 * tile; /* [2][block][stride] */

    int head = blockIdx.x, batch = blockIdx.y;
    int query_block = gridDim.z - 1 - blockIdx.z; /* heaviest first */
    int kv_head = head / (n_heads / n_kv_heads);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    size_t q_offset = (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
    size_t kv_offset = (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    int query0 = query_block * block;
    int query_row[2] = {query0 + warp * 16 + g, query0 + warp * 16 + g + 8};
    /* base-2 lse and delta of this thread's two rows (zero past T: finite, never stored) */
    const float *lse_base = lse + ((size_t)batch * n_heads + head) * T;
    const float *delta_base = delta + ((size_t)batch * n_heads + head) * T;
    float row_lse[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        bool valid = query_row[r] < T;
        row_lse[r] = valid ? lse_base[query_row[r]] * LOG2_E : 0.0f;
        row_delta[r] = valid ? delta_base[query_row[r]] : 0.0f;
    }

    /* groups in flight: {q, dout, k of the diagonal block}, {v of the diagonal block} */
    tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(q_tile, q + q_offset, q_stride, query0, T);
    tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(dout_tile, dout + q_offset, q_stride,
                                                       query0, T);
    tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(k_tiles, k + kv_offset, kv_stride, query0,
                                                       T);
    copy_async_commit();
    tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(v_tiles, v + kv_offset, kv_stride, query0,
                                                       T);
    copy_async_commit();

    float dq_sum[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
        dq_sum[t][0] = dq_sum[t][1] = dq_sum[t][2] = dq_sum[t][3] = 0.0f;

    for (int key_block = query_block, iteration = 0; key_block >= 0; key_block--, iteration++) {
        int buffer = iteration & 1;
        const __nv_bfloat16 *k_tile = k_tiles + buffer * tile;
        const __nv_bfloat16 *v_tile = v_tiles + buffer * tile;
        int key0 = key_block * block;

        copy_async_wait<1>(); /* q, dout and this block's k */
        __syncthreads();
        if (key_block > 0)
            tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(
                k_tiles + (buffer ^ 1) * tile, k + kv_offset, kv_stride, key0 - block, T);
        copy_async_commit();

        /* p = exp(q k^T * scale - lse) */
        float p[block / 8][4];
#pragma unroll
        for (int t = 0; t < block / 8; t++)
            p[t][0] = p[t][1] = p[t][2] = p[t][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < HEAD_DIM; k0 += 16) {
            uint32_t a[4];
            load_matrix_x4(a, operand_a_address(q_tile, stride, warp * 16, k0, lane));
#pragma unroll
            for (int n0 = 0; n0 < block; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4(b, operand_b_address(k_tile, stride, n0, k0, lane));
                mma_bf16_16x8x16(p[n0 / 8], a, b[0], b[1]);
                mma_bf16_16x8x16(p[n0 / 8 + 1], a, b[2], b[3]);
            }
        }
        bool needs_mask = key0 == query0; /* the diagonal block (it also holds keys past T) */
#pragma unroll
        for (int t = 0; t < block / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = key0 + t * 8 + 2 * c + (e & 1);
                float value = exp2f(fmaf(p[t][e], scale_log2, -row_lse[e >> 1]));
                if (needs_mask && (key > query_row[e >> 1] || key >= T))
                    value = 0.0f;
                p[t][e] = value;
            }

        copy_async_wait<1>(); /* this block's v */
        __syncthreads();
        if (key_block > 0)
            tile_load_async<block, HEAD_DIM, BACKWARD_THREADS>(
                v_tiles + (buffer ^ 1) * tile, v + kv_offset, kv_stride, key0 - block, T);
        copy_async_commit();

        /* ds = p (dout v^T - delta) */
        float ds[block / 8][4];
#pragma unroll
        for (int t = 0; t < block / 8; t++)
            ds[t][0] = ds[t][1] = ds[t][2] = ds[t][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < HEAD_DIM; k0 += 16) {
            uint32_t a[4];
            load_matrix_x4(a, operand_a_address(dout_tile, stride, warp * 16, k0, lane));
#pragma unroll
            for (int n0 = 0; n0 < block; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4(b, operand_b_address(v_tile, stride, n0, k0, lane));
                mma_bf16_16x8x16(ds[n0 / 8], a, b[0], b[1]);
                mma_bf16_16x8x16(ds[n0 / 8 + 1], a, b[2], b[3]);
            }
        }
#pragma unroll
        for (int t = 0; t < block / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                ds[t][e] = p[t][e] * (ds[t][e] - row_delta[e >> 1]);

        /* dq += ds k (the 1/sqrt(hd) is applied once, at the end) */
#pragma unroll
        for (int k0 = 0; k0 < block; k0 += 16) {
            uint32_t a[4];
            accumulators_to_operand(a, ds[k0 / 8], ds[k0 / 8 + 1]);
#pragma unroll
            for (int n0 = 0; n0 < HEAD_DIM; n0 += 16) {
                uint32_t b[4];
                load_matrix_x4_transposed(b, operand_b_transposed_address(k_tile, stride, n0,
                                                                          k0, lane));
                mma_bf16_16x8x16(dq_sum[n0 / 8], a, b[0], b[1]);
                mma_bf16_16x8x16(dq_sum[n0 / 8 + 1], a, b[2], b[3]);
            }
        }
    }

    __syncthreads();
    float *stage = reinterpret_cast<float *>(shared) + warp * 16 * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(stage, dq_sum, scale, lane);
    __syncwarp();
    warp_store_staged<HEAD_DIM>(dq + q_offset, q_stride, stage, query0 + warp * 16, T, accumulate,
                                lane);
}

template <int HEAD_DIM>
static void backward_launch(__nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv,
                            const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                            const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse,
                            const float *delta, int B, int T, int n_heads, int n_kv_heads,
                            bool accumulate, cudaStream_t stream)
{
    constexpr size_t shared_bytes = backward_shared_bytes<HEAD_DIM>();
    static bool configured; /* over 48 KiB of shared memory must be asked for, once */
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attention_backward_key_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
        CUDA_CHECK(cudaFuncSetAttribute(attention_backward_query_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
        configured = true;
    }
    int blocks = (T + BACKWARD_BLOCK - 1) / BACKWARD_BLOCK;
    float scale = 1.0f / sqrtf((float)HEAD_DIM), scale_log2 = scale * LOG2_E;
    /* key blocks in increasing order: block 0 sees every query, so the heaviest go first */
    attention_backward_key_kernel<HEAD_DIM>
        <<<dim3(n_kv_heads, B, blocks), BACKWARD_THREADS, shared_bytes, stream>>>(
            dk, dv, dout, q, k, v, lse, delta, T, n_heads, n_kv_heads, scale, scale_log2,
            accumulate);
    CUDA_CHECK_LAUNCH();
    attention_backward_query_kernel<HEAD_DIM>
        <<<dim3(n_heads, B, blocks), BACKWARD_THREADS, shared_bytes, stream>>>(
            dq, dout, q, k, v, lse, delta, T, n_heads, n_kv_heads, scale, scale_log2,
            accumulate);
    CUDA_CHECK_LAUNCH();
}

extern "C" size_t attention_backward_cuda_workspace_bytes(int B, int T, int n_heads)
{
    return (size_t)B * T * n_heads * sizeof(float);
}

extern "C" void attention_backward_cuda(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                        const bf16 *q, const bf16 *k, const bf16 *v,
                                        const bf16 *out, const float *lse, int B, int T,
                                        int n_heads, int n_kv_heads, int head_dim,
                                        float *workspace, bool accumulate, cudaStream_t stream)
{
    const char *op = "attention_backward_cuda";
    attention_check_shape(op, B, T, n_heads, n_kv_heads, head_dim);
    const void *pointers[] = {dq, dk, dv, dout, q, k, v, out};
    const char *names[] = {"dq", "dk", "dv", "dout", "q", "k", "v", "out"};
    for (int i = 0; i < 8; i++)
        attention_check_aligned(op, names[i], pointers[i]);
    if (B == 0 || T == 0)
        return;
    int blocks = (T + BACKWARD_BLOCK - 1) / BACKWARD_BLOCK;
    if (blocks > 65535)
        fatal(EXIT_CONFIG, "%s: T = %d is longer than the launch grid allows", op, T);

    int rows = B * T * n_heads;
    int preprocess_blocks = (rows + PREPROCESS_THREADS / 32 - 1) / (PREPROCESS_THREADS / 32);
    attention_backward_delta_kernel<<<preprocess_blocks, PREPROCESS_THREADS, 0, stream>>>(
        workspace, reinterpret_cast<const __nv_bfloat16 *>(dout),
        reinterpret_cast<const __nv_bfloat16 *>(out), rows, T, n_heads, head_dim);
    CUDA_CHECK_LAUNCH();

    __nv_bfloat16 *dq_bf16 = reinterpret_cast<__nv_bfloat16 *>(dq);
    __nv_bfloat16 *dk_bf16 = reinterpret_cast<__nv_bfloat16 *>(dk);
    __nv_bfloat16 *dv_bf16 = reinterpret_cast<__nv_bfloat16 *>(dv);
    const __nv_bfloat16 *dout_bf16 = reinterpret_cast<const __nv_bfloat16 *>(dout);
    const __nv_bfloat16 *q_bf16 = reinterpret_cast<const __nv_bfloat16 *>(q);
    const __nv_bfloat16 *k_bf16 = reinterpret_cast<const __nv_bfloat16 *>(k);
    const __nv_bfloat16 *v_bf16 = reinterpret_cast<const __nv_bfloat16 *>(v);
    switch (head_dim) {
    case 64:
        backward_launch<64>(dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16, v_bf16, lse,
                            workspace, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    case 80:
        backward_launch<80>(dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16, v_bf16, lse,
                            workspace, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    default:
        backward_launch<128>(dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16, v_bf16, lse,
                             workspace, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    }
}
