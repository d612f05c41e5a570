/* kernels/cuda/attention_backward_cuda.cu — causal grouped-KV flash attention, backward
 * (see attention_cuda.h; fragment and tile layouts in attention_tiles.cuh).
 *
 * With p = exp(score - lse) recomputed from the saved lse, dp = dout . v, delta = dout . out
 * and ds = p (dp - delta) (the softmax backward), per (query t, key s):
 *   dv_s += p dout_t,   dk_s += ds q_t / sqrt(hd),   dq_t += ds k_s / sqrt(hd).
 * This file holds the entry point (which picks the fused one-pass kernel of
 * attention_backward_fused_cuda.cu or the two-pass kernels below) and the two-pass kernels;
 * after the delta pass both use, three kernels in all on the caller's stream:
 * 1. delta [B, n_heads, T] (workspace) = rowsum(dout * out), a pass over dout and out
 *    (attention_backward_delta_cuda.cu).
 * 2. dk, dv: a CTA of two warpgroups owns 128 keys of one kv head; warpgroup w owns keys
 *    64w .. 64w+63 and works on the transposed products (scores^T = k q^T, dp^T = v dout^T)
 *    so that its rows are its keys: p^T and ds^T stay in its registers and feed
 *    dv += p^T dout and dk += ds^T q directly. The CTA walks every query head of the group and
 *    every query block of 64 at or after its keys through a ring of three shared-memory
 *    stages (q, dout, lse, delta), loaded one block ahead: the whole sum for a key is made by
 *    one thread in a fixed order, so no atomics are needed.
 * 3. dq: a CTA of two warpgroups owns 128 queries of one head (64 a warpgroup) and walks its
 *    key blocks of 64 (as the forward does, through a ring of three k, v stages) recomputing
 *    p and dp: dq += ds k. Again one thread, one fixed order.
 * Kernel 3 repeats two of kernel 2's products; that is what a deterministic dq costs without
 * atomics or a T/64-fold partial buffer (DESIGN 3 "Determinism").
 * Kernel 3 issues the next tile's score products before it waits for the previous tile's
 * dq product; kernel 2 retires each tile's products before the next (its dk, dv accumulators,
 * the next scores and this tile's operands would not fit in the registers together). In both,
 * a warpgroup whose rows the causal mask hides wholly from a tile skips that tile's products,
 * and the next tile's loads are issued behind the products, in their shadow.
 */
#include "kernels/cuda/attention_backward_internal.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "runtime/error.h"

#include <cuda_runtime.h>
#include <math.h>

#define BACKWARD_BLOCK_ROWS 128 /* keys of a dk/dv CTA, queries of a dq CTA: two warpgroups */
#define BACKWARD_BLOCK_WALK 64  /* queries (dk/dv) or keys (dq) of one step of the walk */
#define BACKWARD_STAGES 3       /* ring of the walked tiles: step i + 1 loads while step i is
                                 * computed and step i - 1 finishes its last product */
#define BACKWARD_THREADS (2 * WARPGROUP_THREADS)
static_assert(BACKWARD_BLOCK_WALK == 64 && BACKWARD_BLOCK_ROWS == 2 * WARPGROUP_ROWS,
              "the fragment arrays below hold 64 x 64 tiles, one per warpgroup");

/* Two tiles of BACKWARD_BLOCK_ROWS rows (dk/dv: k, v; dq: q, dout), two rings of
 * BACKWARD_STAGES tiles of BACKWARD_BLOCK_WALK rows (dk/dv: q, dout; dq: k, v), all packed,
 * and for dk/dv the lse and delta rings; the fp32 staging of the results at the end reuses
 * the same memory. */
template <int HEAD_DIM>
__host__ __device__ static constexpr size_t backward_shared_bytes(void)
{
    return (size_t)(2 * BACKWARD_BLOCK_ROWS + 2 * BACKWARD_STAGES * BACKWARD_BLOCK_WALK) *
               HEAD_DIM * sizeof(__nv_bfloat16) +
           (size_t)2 * BACKWARD_STAGES * BACKWARD_BLOCK_WALK * sizeof(float);
}

/* dk, dv [B, T, n_kv_heads, HEAD_DIM] (+)= their gradients; grid (n_kv_heads, B, key
 * blocks of 128), BACKWARD_THREADS threads. lse, delta [B, n_heads, T]. */
template <int HEAD_DIM>
__global__ void __launch_bounds__(BACKWARD_THREADS, 1)
attention_backward_key_kernel(__nv_bfloat16 *dk, __nv_bfloat16 *dv, const __nv_bfloat16 *dout,
                              const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                              const __nv_bfloat16 *v, const float *lse, const float *delta,
                              int T, int n_heads, int n_kv_heads, float scale, float scale_log2,
                              bool accumulate)
{
    constexpr int block_keys = BACKWARD_BLOCK_ROWS, block_queries = BACKWARD_BLOCK_WALK;
    constexpr int stage_elements = block_queries * HEAD_DIM;
    static_assert(backward_shared_bytes<HEAD_DIM>() >=
                      (size_t)2 * block_keys * (HEAD_DIM + STAGE_PAD) * sizeof(float),
                  "the dk and dv staging areas must fit in the tiles' memory");
    extern __shared__ __align__(128) unsigned char shared[];
    __nv_bfloat16 *k_tile = reinterpret_cast<__nv_bfloat16 *>(shared);
    __nv_bfloat16 *v_tile = k_tile + block_keys * HEAD_DIM;
    __nv_bfloat16 *q_ring = v_tile + block_keys * HEAD_DIM;
    __nv_bfloat16 *dout_ring = q_ring + BACKWARD_STAGES * stage_elements;
    float *lse_ring = reinterpret_cast<float *>(dout_ring + BACKWARD_STAGES * stage_elements);
    float *delta_ring = lse_ring + BACKWARD_STAGES * block_queries;

    int kv_head = blockIdx.x, batch = blockIdx.y, key_block = blockIdx.z;
    int heads_per_kv = n_heads / n_kv_heads;
    /* warp-uniform for the compiler (see attention_cuda.cu) */
    int group = __shfl_sync(0xffffffffu, (int)threadIdx.x / WARPGROUP_THREADS, 0);
    int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    size_t kv_offset = (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    int key0 = key_block * block_keys;
    int group_key0 = key0 + group * WARPGROUP_ROWS;
    bool group_active = group_key0 < T;
    /* query blocks before key0 / 64 see none of these keys */
    int first_query_block = key0 / block_queries;
    int blocks_per_head = (T + block_queries - 1) / block_queries - first_query_block;
    int items = heads_per_kv * blocks_per_head;
    /* the two key rows of this thread's accumulator elements (d[t][0..1], d[t][2..3]) */
    int key_row[2] = {group_key0 + warp * 16 + g, group_key0 + warp * 16 + g + 8};
    const __nv_bfloat16 *k_rows = k_tile + group * WARPGROUP_ROWS * HEAD_DIM;
    const __nv_bfloat16 *v_rows = v_tile + group * WARPGROUP_ROWS * HEAD_DIM;

    /* Work item i: query head kv_head * heads_per_kv + i / blocks_per_head, query block
     * first_query_block + i % blocks_per_head. Loads its q, dout, lse, delta into stage i % 3. */
    auto load_item = [&](int item) {
        int stage = item % BACKWARD_STAGES;
        int head = kv_head * heads_per_kv + item / blocks_per_head;
        int query0 = (first_query_block + item % blocks_per_head) * block_queries;
        size_t q_offset = (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
        size_t row_offset = ((size_t)batch * n_heads + head) * T;
        packed_tile_load_async<block_queries, HEAD_DIM, BACKWARD_THREADS>(
            q_ring + stage * stage_elements, q + q_offset, q_stride, query0, T);
        packed_tile_load_async<block_queries, HEAD_DIM, BACKWARD_THREADS>(
            dout_ring + stage * stage_elements, dout + q_offset, q_stride, query0, T);
        vector_load_async<block_queries>(lse_ring + stage * block_queries, lse + row_offset,
                                         query0, T);
        vector_load_async<block_queries>(delta_ring + stage * block_queries, delta + row_offset,
                                         query0, T);
    };

    packed_tile_load_async<block_keys, HEAD_DIM, BACKWARD_THREADS>(k_tile, k + kv_offset,
                                                                   kv_stride, key0, T);
    packed_tile_load_async<block_keys, HEAD_DIM, BACKWARD_THREADS>(v_tile, v + kv_offset,
                                                                   kv_stride, key0, T);
    load_item(0);
    copy_async_commit();

    float dk_sum[HEAD_DIM / 8][4], dv_sum[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk_sum[t][e] = dv_sum[t][e] = 0.0f;
    float p[8][4] = {}, ds[8][4] = {}; /* p^T, dp^T of one item as the products leave them */
    uint32_t p_operand[4][4], ds_operand[4][4];
    /* loads item + 1 into the stage of item - 2 (possibly nothing: the group count stays
     * uniform) */
    auto load_ahead = [&](int item) {
        if (item + 1 < items)
            load_item(item + 1);
        copy_async_commit();
    };

    for (int item = 0; item < items; item++) {
        int stage = item % BACKWARD_STAGES;
        int query0 = (first_query_block + item % blocks_per_head) * block_queries;
        /* this item's tiles have landed; every warpgroup has retired the products of
         * item - 1, so the stage of item - 2 takes item + 1 */
        copy_async_wait<0>();
        fence_async_proxy();
        __syncthreads();
        /* the second warpgroup's keys all follow the first query block of every head */
        if (!group_active || query0 + block_queries <= group_key0) {
            load_ahead(item);
            continue;
        }
        const __nv_bfloat16 *q_tile = q_ring + stage * stage_elements;
        const __nv_bfloat16 *dout_tile = dout_ring + stage * stage_elements;
        const float *lse_tile = lse_ring + stage * block_queries;
        const float *delta_tile = delta_ring + stage * block_queries;

        /* p^T = k q^T and dp^T = v dout^T for the warpgroup's 64 keys against 64 queries;
         * the next item's loads are issued behind them (in their shadow) */
        warpgroup_fence();
        warpgroup_rows_times_rows<HEAD_DIM>(p, k_rows, q_tile);
        warpgroup_rows_times_rows<HEAD_DIM>(ds, v_rows, dout_tile);
        warpgroup_commit();
        load_ahead(item);
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(p);
        warpgroup_fence_accumulators(ds);

        /* p^T = exp(score * scale - lse), masked where the query is before the key (the
         * diagonal tile) or past T (the last tile); ds^T = p^T (dp^T - delta), straight into
         * the bf16 operands */
        bool needs_mask = query0 == group_key0 || query0 + block_queries > T;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float p_pair[2][4], ds_pair[2][4]; /* tiles 2j, 2j+1: queries 16j .. 16j+15 */
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int t = 2 * j + h, column = t * 8 + 2 * c + (e & 1), query = query0 + column;
                    float value = exp2f(fmaf(p[t][e], scale_log2, -lse_tile[column] * LOG2_E));
                    if (needs_mask && (query < key_row[e >> 1] || query >= T))
                        value = 0.0f;
                    p_pair[h][e] = value;
                    ds_pair[h][e] = value * (ds[t][e] - delta_tile[column]);
                }
            accumulators_to_operand(p_operand[j], p_pair[0], p_pair[1]);
            accumulators_to_operand(ds_operand[j], ds_pair[0], ds_pair[1]);
        }

        /* dv += p^T dout, dk += ds^T q (the 1/sqrt(hd) of dk is applied once, at the end).
         * Retired here: a product in flight across the loop's back edge makes the compiler
         * serialise every product, and holding the next item's scores beside dk, dv and these
         * operands would not fit in the registers. */
        warpgroup_fence();
        warpgroup_fragments_times_tile<HEAD_DIM>(dv_sum, p_operand, dout_tile);
        warpgroup_fragments_times_tile<HEAD_DIM>(dk_sum, ds_operand, q_tile);
        warpgroup_commit();
        warpgroup_wait<0>();
    }
    warpgroup_fence_accumulators(dk_sum);
    warpgroup_fence_accumulators(dv_sum);
    copy_async_wait<0>(); /* only an empty group remains */

    /* results through shared memory, in 16-byte pieces (every product has completed, so the
     * tiles are free once every thread is here) */
    __syncthreads();
    int warp_row0 = group * WARPGROUP_ROWS + warp * 16;
    float *dk_stage = reinterpret_cast<float *>(shared) + warp_row0 * (HEAD_DIM + STAGE_PAD);
    float *dv_stage = dk_stage + block_keys * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(dk_stage, dk_sum, scale, lane);
    warp_stage_accumulators<HEAD_DIM>(dv_stage, dv_sum, 1.0f, lane);
    __syncwarp();
    warp_store_staged<HEAD_DIM>(dk + kv_offset, kv_stride, dk_stage, key0 + warp_row0, T,
                                accumulate, lane);
    warp_store_staged<HEAD_DIM>(dv + kv_offset, kv_stride, dv_stage, key0 + warp_row0, T,
                                accumulate, lane);
}

/* dq [B, T, n_heads, HEAD_DIM] (+)= its gradient; grid (n_heads, B, query blocks of 128),
 * BACKWARD_THREADS threads. */
template <int HEAD_DIM>
__global__ void __launch_bounds__(BACKWARD_THREADS, 1)
attention_backward_query_kernel(__nv_bfloat16 *dq, const __nv_bfloat16 *dout,
                                const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                const __nv_bfloat16 *v, const float *lse, const float *delta,
                                int T, int n_heads, int n_kv_heads, float scale,
                                float scale_log2, bool accumulate)
{
    constexpr int block_queries = BACKWARD_BLOCK_ROWS, block_keys = BACKWARD_BLOCK_WALK;
    constexpr int stage_elements = block_keys * HEAD_DIM;
    static_assert(backward_shared_bytes<HEAD_DIM>() >=
                      (size_t)block_queries * (HEAD_DIM + STAGE_PAD) * sizeof(float),
                  "the dq staging area must fit in the tiles' memory");
    extern __shared__ __align__(128) unsigned char shared[];
    __nv_bfloat16 *q_tile = reinterpret_cast<__nv_bfloat16 *>(shared);
    __nv_bfloat16 *dout_tile = q_tile + block_queries * HEAD_DIM;
    __nv_bfloat16 *k_ring = dout_tile + block_queries * HEAD_DIM;
    __nv_bfloat16 *v_ring = k_ring + BACKWARD_STAGES * stage_elements;

    int head = blockIdx.x, batch = blockIdx.y;
    int query_block = gridDim.z - 1 - blockIdx.z; /* heaviest first */
    int kv_head = head / (n_heads / n_kv_heads);
    int group = __shfl_sync(0xffffffffu, (int)threadIdx.x / WARPGROUP_THREADS, 0);
    int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    size_t q_offset = (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
    size_t kv_offset = (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    int query0 = query_block * block_queries;
    int group_row0 = query0 + group * WARPGROUP_ROWS;
    /* step i walks key block last_block - i; a warpgroup starts at its diagonal block (see
     * attention_cuda.cu) */
    int last_block = (min(T, query0 + block_queries) - 1) / block_keys;
    int blocks = last_block + 1;
    int first = group_row0 < T ? last_block - group_row0 / block_keys : blocks;
    int query_row[2] = {group_row0 + warp * 16 + g, group_row0 + warp * 16 + g + 8};
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
    const __nv_bfloat16 *q_rows = q_tile + group * WARPGROUP_ROWS * HEAD_DIM;
    const __nv_bfloat16 *dout_rows = dout_tile + group * WARPGROUP_ROWS * HEAD_DIM;

    auto load_block = [&](int step) {
        int stage = step % BACKWARD_STAGES, key0 = (last_block - step) * block_keys;
        packed_tile_load_async<block_keys, HEAD_DIM, BACKWARD_THREADS>(
            k_ring + stage * stage_elements, k + kv_offset, kv_stride, key0, T);
        packed_tile_load_async<block_keys, HEAD_DIM, BACKWARD_THREADS>(
            v_ring + stage * stage_elements, v + kv_offset, kv_stride, key0, T);
    };
    packed_tile_load_async<block_queries, HEAD_DIM, BACKWARD_THREADS>(q_tile, q + q_offset,
                                                                      q_stride, query0, T);
    packed_tile_load_async<block_queries, HEAD_DIM, BACKWARD_THREADS>(dout_tile, dout + q_offset,
                                                                      q_stride, query0, T);
    load_block(0);
    copy_async_commit();

    float dq_sum[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
        dq_sum[t][0] = dq_sum[t][1] = dq_sum[t][2] = dq_sum[t][3] = 0.0f;
    float p[8][4] = {}, ds[8][4] = {}; /* scores, dp of one step as the products leave them */
    uint32_t ds_operand[4][4];

    /* Block i lands in stage i % 3 and is published once every warpgroup has retired the
     * products of step i - 2, whose stage then takes block i + 1 (load_ahead, issued behind
     * the products of step i so that its address arithmetic runs in their shadow). */
    auto publish_block = [&](int step) {
        copy_async_wait<0>();
        fence_async_proxy();
        __syncthreads();
    };
    auto load_ahead = [&](int step) {
        if (step + 1 < blocks)
            load_block(step + 1);
        copy_async_commit(); /* possibly empty: keeps the group count uniform */
    };
    /* p = q k^T, dp = dout v^T for the warpgroup's 64 queries against the block's 64 keys */
    auto issue_scores = [&](int step) {
        int stage = step % BACKWARD_STAGES;
        warpgroup_fence();
        warpgroup_rows_times_rows<HEAD_DIM>(p, q_rows, k_ring + stage * stage_elements);
        warpgroup_rows_times_rows<HEAD_DIM>(ds, dout_rows, v_ring + stage * stage_elements);
        warpgroup_commit();
    };

    /* Step i adds block i's dq product and issues block i + 1's scores behind it; one wait
     * retires both (nothing in flight across the back edge, as in the dk/dv kernel). Steps
     * before `first` hold blocks wholly past the warpgroup's rows. */
    publish_block(0);
    if (0 >= first)
        issue_scores(0);
    load_ahead(0);
    warpgroup_wait<0>();
    warpgroup_fence_accumulators(p);
    warpgroup_fence_accumulators(ds);
    for (int i = 0; i < blocks; i++) {
        if (i >= first) {
            /* p = exp(score * scale - lse), masked after the row on the diagonal block (keys
             * past T are among them); ds = p (dp - delta), straight into bf16 operands */
            int key0 = (last_block - i) * block_keys;
            bool diagonal = i == first;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float ds_pair[2][4]; /* tiles 2j, 2j+1: keys 16j .. 16j+15 */
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int t = 2 * j + h;
                        float value = exp2f(fmaf(p[t][e], scale_log2, -row_lse[e >> 1]));
                        if (diagonal && key0 + t * 8 + 2 * c + (e & 1) > query_row[e >> 1])
                            value = 0.0f;
                        ds_pair[h][e] = value * (ds[t][e] - row_delta[e >> 1]);
                    }
                accumulators_to_operand(ds_operand[j], ds_pair[0], ds_pair[1]);
            }
            /* dq += ds k (the 1/sqrt(hd) is applied once, at the end) */
            warpgroup_fence();
            warpgroup_fragments_times_tile<HEAD_DIM>(
                dq_sum, ds_operand, k_ring + (i % BACKWARD_STAGES) * stage_elements);
            warpgroup_commit();
        }
        if (i + 1 < blocks) {
            publish_block(i + 1);
            if (i + 1 >= first)
                issue_scores(i + 1);
            load_ahead(i + 1);
        }
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(p);
        warpgroup_fence_accumulators(ds);
    }
    warpgroup_fence_accumulators(dq_sum);
    copy_async_wait<0>();

    __syncthreads();
    int warp_row0 = group * WARPGROUP_ROWS + warp * 16;
    float *stage = reinterpret_cast<float *>(shared) + warp_row0 * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(stage, dq_sum, scale, lane);
    __syncwarp();
    warp_store_staged<HEAD_DIM>(dq + q_offset, q_stride, stage, query0 + warp_row0, T, accumulate,
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
    int blocks = (T + BACKWARD_BLOCK_ROWS - 1) / BACKWARD_BLOCK_ROWS;
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

/* ---- which backward runs ---- */

static int selected_backward = -1; /* -1: not chosen yet, read FATHOM_ATTENTION_BACKWARD */

extern "C" void attention_cuda_select_backward(AttentionBackwardKernel kernel)
{
    selected_backward = (int)kernel;
}

extern "C" AttentionBackwardKernel attention_cuda_backward_kernel(void)
{
    if (selected_backward < 0) {
        /* fused_tma by default: measured fastest on an H200 (docs/performance.md) */
        static const char *const names[] = {"fused_tma", "fused", "two_pass"};
        static const int kernels[] = {ATTENTION_BACKWARD_FUSED_TMA, ATTENTION_BACKWARD_FUSED,
                                      ATTENTION_BACKWARD_TWO_PASS};
        selected_backward = kernels[env_choice("FATHOM_ATTENTION_BACKWARD", names, 3)];
    }
    return (AttentionBackwardKernel)selected_backward;
}

extern "C" size_t attention_backward_cuda_workspace_bytes(int B, int T, int n_heads,
                                                         int head_dim)
{
    bool fused = attention_cuda_backward_kernel() != ATTENTION_BACKWARD_TWO_PASS;
    return attention_backward_workspace(NULL, B, T, n_heads, head_dim, fused).bytes;
}

extern "C" void attention_backward_cuda(bf16 *dq, bf16 *dk, bf16 *dv, GradMode mode,
                                        const bf16 *dout, const bf16 *q, const bf16 *k,
                                        const bf16 *v, const bf16 *out, const float *lse, int B,
                                        int T, int n_heads, int n_kv_heads, int head_dim,
                                        float *workspace, cudaStream_t stream)
{
    const char *op = "attention_backward_cuda";
    attention_check_shape(op, B, T, n_heads, n_kv_heads, head_dim);
    const void *pointers[] = {dq, dk, dv, dout, q, k, v, out};
    const char *names[] = {"dq", "dk", "dv", "dout", "q", "k", "v", "out"};
    for (int i = 0; i < 8; i++)
        attention_check_aligned(op, names[i], pointers[i]);
    if (B == 0 || T == 0)
        return;
    int blocks = (T + BACKWARD_BLOCK_ROWS - 1) / BACKWARD_BLOCK_ROWS;
    if (blocks > 65535 || (T + ATTENTION_FUSED_QUERIES - 1) / ATTENTION_FUSED_QUERIES > 65535)
        fatal(EXIT_CONFIG, "%s: T = %d is longer than the launch grid allows", op, T);
    attention_check_device(op);
    AttentionBackwardKernel kernel = attention_cuda_backward_kernel();
    bool fused = kernel != ATTENTION_BACKWARD_TWO_PASS;
    bool accumulate = mode == GRAD_ADD; /* GRAD_WRITE: dq, dk, dv are not read */
    AttentionBackwardWorkspace parts =
        attention_backward_workspace(workspace, B, T, n_heads, head_dim, fused);

    attention_backward_delta_launch(&parts, (const bf16 *)dout, (const bf16 *)out, B, T,
                                    n_heads, head_dim, stream);
    if (fused) {
        attention_backward_fused_launch(dq, dk, dv, dout, q, k, v, lse, &parts, B, T, n_heads,
                                        n_kv_heads, head_dim,
                                        kernel == ATTENTION_BACKWARD_FUSED_TMA, accumulate,
                                        stream);
        return;
    }

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
                            parts.delta, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    case 80:
        backward_launch<80>(dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16, v_bf16, lse,
                            parts.delta, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    default:
        backward_launch<128>(dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16, v_bf16, lse,
                             parts.delta, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    }
}
