/* kernels/cuda/attention_cuda.cu — causal grouped-KV flash attention, forward
 * (see attention_cuda.h; fragment and tile layouts in attention_tiles.cuh).
 *
 * One CTA of two warpgroups takes 128 queries of one head; warpgroup w owns rows
 * 64w .. 64w+63 and keeps their output accumulators [64, head_dim] fp32 and running max / sum
 * in registers. Key blocks of 64 are walked from the diagonal down to 0 (only a warpgroup's
 * first block, its diagonal one, needs the causal mask). K and V move through a ring of four
 * shared-memory stages, loaded two blocks ahead by the whole CTA.
 *
 * Each warpgroup overlaps its softmax with the tensor cores: iteration i issues the scores
 * S_i = Q K_i^T and the previous block's O += P_{i-1} V_{i-1} together, waits for S_i only,
 * computes P_i while the second product runs, then waits for it and rescales O to the new
 * running max (skipped by a warp whose rows kept their max); the next block's loads are
 * issued behind the products, in their shadow. The softmax runs in base 2 with
 * the 1/sqrt(head_dim) * log2(e) scale folded into one FMA per score. CTAs are launched
 * heaviest first (the last query block sees every key) so the tail of the grid is short CTAs.
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_tiles.cuh"

#include <cuda_runtime.h>
#include <math.h>

#define FORWARD_BLOCK_QUERIES 128 /* two warpgroups of WARPGROUP_ROWS */
#define FORWARD_BLOCK_KEYS 64
#define FORWARD_STAGES 4 /* K, V ring: block i + 2 loads while block i is computed and
                          * block i - 1 still feeds O += P V */
#define FORWARD_THREADS (2 * WARPGROUP_THREADS)
static_assert(FORWARD_BLOCK_KEYS == 64 && FORWARD_BLOCK_QUERIES == 2 * WARPGROUP_ROWS,
              "the score and probability fragments below hold 64 x 64 tiles");

/* Q tile [128, HEAD_DIM], then the K ring and the V ring [FORWARD_STAGES][64, HEAD_DIM], all
 * packed; the fp32 output staging area of the end reuses the same memory. */
template <int HEAD_DIM>
__host__ __device__ static constexpr size_t forward_shared_bytes(void)
{
    return (size_t)(FORWARD_BLOCK_QUERIES + 2 * FORWARD_STAGES * FORWARD_BLOCK_KEYS) * HEAD_DIM *
           sizeof(__nv_bfloat16);
}

/* head_dim 64 and 80 fit two CTAs in one multiprocessor's shared memory (80 and 100 KiB):
 * asking for 2 caps the registers at 128 a thread so that they also fit there. */
__host__ __device__ static constexpr int forward_blocks_per_multiprocessor(int head_dim)
{
    return head_dim < 128 ? 2 : 1;
}

/* Base-2 online softmax over one block of scores s [64 rows, 64 keys] (a thread holds two rows
 * of it, r = 0, 1): raises row_max (scaled, base 2) to cover the block, returns in correction[r]
 * the factor that brings what was summed under the old max to the new one (exactly 1 when the
 * max stayed), rescales row_sum (this thread's part of the row sum) and adds the block's
 * probabilities p = 2^(s * scale_log2 - row_max), which replace s. Masked scores are -inf and
 * give exact zeros; every row has at least one finite score in its first block. */
static __device__ __forceinline__ void softmax_block(float (&s)[FORWARD_BLOCK_KEYS / 8][4],
                                                     float (&row_max)[2], float (&row_sum)[2],
                                                     float (&correction)[2], float scale_log2)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float maximum = -INFINITY;
#pragma unroll
        for (int t = 0; t < FORWARD_BLOCK_KEYS / 8; t++)
            maximum = fmaxf(maximum, fmaxf(s[t][2 * r], s[t][2 * r + 1]));
        /* the four lanes of a quad hold the row's 64 columns */
        maximum = fmaxf(maximum, __shfl_xor_sync(0xffffffffu, maximum, 1));
        maximum = fmaxf(maximum, __shfl_xor_sync(0xffffffffu, maximum, 2));
        float new_max = fmaxf(row_max[r], maximum * scale_log2);
        correction[r] = new_max == row_max[r] ? 1.0f : exp2f(row_max[r] - new_max);
        row_max[r] = new_max;
        float sum = row_sum[r] * correction[r];
#pragma unroll
        for (int t = 0; t < FORWARD_BLOCK_KEYS / 8; t++) {
            s[t][2 * r] = exp2f(fmaf(s[t][2 * r], scale_log2, -new_max));
            s[t][2 * r + 1] = exp2f(fmaf(s[t][2 * r + 1], scale_log2, -new_max));
            sum += s[t][2 * r] + s[t][2 * r + 1];
        }
        row_sum[r] = sum;
    }
}

/* out [B, T, n_heads, HEAD_DIM], lse [B, n_heads, T] from q [B, T, n_heads, HEAD_DIM], k, v
 * [B, T, n_kv_heads, HEAD_DIM]; grid (n_heads, B, query blocks), FORWARD_THREADS threads;
 * scale_log2 = log2(e) / sqrt(HEAD_DIM). */
template <int HEAD_DIM>
__global__ void __launch_bounds__(FORWARD_THREADS, forward_blocks_per_multiprocessor(HEAD_DIM))
attention_forward_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                         const __nv_bfloat16 *k, const __nv_bfloat16 *v, int T, int n_heads,
                         int n_kv_heads, float scale_log2)
{
    constexpr int block_queries = FORWARD_BLOCK_QUERIES, block_keys = FORWARD_BLOCK_KEYS;
    constexpr int stage_elements = block_keys * HEAD_DIM;
    static_assert(forward_shared_bytes<HEAD_DIM>() >=
                      (size_t)block_queries * (HEAD_DIM + STAGE_PAD) * sizeof(float),
                  "the output staging area must fit in the tiles' memory");
    extern __shared__ __align__(128) unsigned char shared[];
    __nv_bfloat16 *q_tile = reinterpret_cast<__nv_bfloat16 *>(shared);
    __nv_bfloat16 *k_ring = q_tile + block_queries * HEAD_DIM;
    __nv_bfloat16 *v_ring = k_ring + FORWARD_STAGES * stage_elements;

    int head = blockIdx.x, batch = blockIdx.y;
    int query_block = gridDim.z - 1 - blockIdx.z;
    int kv_head = head / (n_heads / n_kv_heads);
    /* broadcast from lane 0, so the compiler sees it is warp-uniform: a product under a branch
     * it cannot prove uniform would be serialised */
    int group = __shfl_sync(0xffffffffu, (int)threadIdx.x / WARPGROUP_THREADS, 0);
    int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    const __nv_bfloat16 *q_base = q + (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
    const __nv_bfloat16 *k_base = k + (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    const __nv_bfloat16 *v_base = v + (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    int query0 = query_block * block_queries;
    int group_row0 = query0 + group * WARPGROUP_ROWS;
    /* CTA iteration i holds key block last_block - i */
    int last_block = (min(T, query0 + block_queries) - 1) / block_keys;
    int blocks = last_block + 1;
    /* A warpgroup starts at its diagonal block: one iteration late when the CTA's last block
     * lies wholly past its rows, never when it has no row before T. */
    int first = group_row0 < T ? last_block - group_row0 / block_keys : blocks;
    /* the two query rows of this thread's accumulator elements (d[t][0..1], d[t][2..3]) */
    int query_row[2] = {group_row0 + warp * 16 + g, group_row0 + warp * 16 + g + 8};
    const __nv_bfloat16 *q_rows = q_tile + group * WARPGROUP_ROWS * HEAD_DIM;

    auto load_block = [&](int iteration) {
        int stage = iteration % FORWARD_STAGES, key0 = (last_block - iteration) * block_keys;
        packed_tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(
            k_ring + stage * stage_elements, k_base, kv_stride, key0, T);
        packed_tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(
            v_ring + stage * stage_elements, v_base, kv_stride, key0, T);
    };
    /* groups in flight: {Q, block 0}, {block 1} (possibly empty) */
    packed_tile_load_async<block_queries, HEAD_DIM, FORWARD_THREADS>(q_tile, q_base, q_stride,
                                                                     query0, T);
    load_block(0);
    copy_async_commit();
    if (blocks > 1)
        load_block(1);
    copy_async_commit();

    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
        o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float s[block_keys / 8][4] = {}; /* defined before the first product reads it (scale-d 0) */
    uint32_t p[4][4]; /* the previous block's probabilities, as A operands (k = 16j ..) */
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    /* loads block i + 2 into the stage of block i - 2 (possibly nothing: the group count
     * stays uniform) */
    auto load_ahead = [&](int i) {
        if (i + 2 < blocks)
            load_block(i + 2);
        copy_async_commit();
    };
    /* S_i = Q K_i^T */
    auto issue_scores = [&](int i) {
        warpgroup_fence();
        warpgroup_rows_times_rows<HEAD_DIM>(s, q_rows,
                                            k_ring + (i % FORWARD_STAGES) * stage_elements);
        warpgroup_commit();
    };

    for (int i = 0; i < blocks; i++) {
        /* block i has landed (block i + 1 may be in flight); every warpgroup is past
         * iteration i - 1, so the stage of block i - 2 is free for block i + 2 */
        copy_async_wait<1>();
        fence_async_proxy();
        __syncthreads();
        if (i < first) { /* this block lies wholly past the warpgroup's rows */
            load_ahead(i);
            continue;
        }
        /* The products are issued first, the loads after them (their address arithmetic runs
         * in the products' shadow); each branch issues what it waits for, so the compiler can
         * keep the products in flight. */
        float correction[2];
        if (i == first) {
            /* the diagonal block: mask keys after the row (keys past T are among them) */
            issue_scores(i);
            load_ahead(i);
            warpgroup_wait<0>();
            warpgroup_fence_accumulators(s);
            int key0 = (last_block - i) * block_keys;
#pragma unroll
            for (int t = 0; t < block_keys / 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (key0 + t * 8 + 2 * c + (e & 1) > query_row[e >> 1])
                        s[t][e] = -INFINITY;
            softmax_block(s, row_max, row_sum, correction, scale_log2);
        } else {
            /* O += P_{i-1} V_{i-1} runs while the softmax of block i is computed */
            issue_scores(i);
            warpgroup_fence();
            warpgroup_fragments_times_tile<HEAD_DIM>(
                o, p, v_ring + ((i - 1) % FORWARD_STAGES) * stage_elements);
            warpgroup_commit();
            load_ahead(i);
            warpgroup_wait<1>(); /* the scores; P V may still run */
            warpgroup_fence_accumulators(s);
            softmax_block(s, row_max, row_sum, correction, scale_log2);
            warpgroup_wait<0>();
            warpgroup_fence_accumulators(o);
            warpgroup_fence_accumulators(s); /* p below is written only after the wait */
            if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
                for (int t = 0; t < HEAD_DIM / 8; t++) {
                    o[t][0] *= correction[0];
                    o[t][1] *= correction[0];
                    o[t][2] *= correction[1];
                    o[t][3] *= correction[1];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < block_keys / 16; j++)
            accumulators_to_operand(p[j], s[2 * j], s[2 * j + 1]);
    }

    /* the last block's O += P V */
    if (first < blocks) {
        warpgroup_fence();
        warpgroup_fragments_times_tile<HEAD_DIM>(
            o, p, v_ring + ((blocks - 1) % FORWARD_STAGES) * stage_elements);
        warpgroup_commit();
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(o);
    }
    copy_async_wait<0>(); /* only empty groups remain */

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

    /* out through shared memory, in 16-byte pieces (every product has completed, so the tiles
     * are free once every thread is here) */
    __syncthreads();
    int warp_row0 = group * WARPGROUP_ROWS + warp * 16;
    float *stage = reinterpret_cast<float *>(shared) + warp_row0 * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(stage, o, 1.0f, lane);
    __syncwarp();
    __nv_bfloat16 *out_base = out + (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
    warp_store_staged<HEAD_DIM>(out_base, q_stride, stage, query0 + warp_row0, T, false, lane);
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
    attention_check_device(op);
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
