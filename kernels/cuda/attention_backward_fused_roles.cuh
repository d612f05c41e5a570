/* kernels/cuda/attention_backward_fused_roles.cuh — the roles of one CTA of the fused attention
 * backward (attention_backward_fused_cuda.cu, whose header comment gives the algorithm, the
 * ordering and why it cannot deadlock); CUDA C++ only, included by that file alone.
 *
 * Here: the CTA's shape (FUSED_*), its named barriers, the byte layout of its shared memory
 * (FusedLayout), the walk of a key block over (query block, head) steps (FusedWalk), and the
 * device functions each warpgroup runs: fused_dq_writer (warp 0 of warpgroup 0: dq_part into
 * dq_accum in key block order), fused_producer (warp 1 of warpgroup 0, TMA only: q, dout, lse,
 * delta into the ring) and fused_consumer (warpgroups 1 and 2: the five products a step, then
 * dk, dv out). The kernel that assigns the roles, the dq conversion and the launch stay in the
 * .cu. Every function is static __device__ __forceinline__, so each instance of the kernel is
 * still one inlined body (no calls, registers allotted across the roles by setmaxnreg).
 */
#ifndef FATHOM_KERNELS_CUDA_ATTENTION_BACKWARD_FUSED_ROLES_CUH
#define FATHOM_KERNELS_CUDA_ATTENTION_BACKWARD_FUSED_ROLES_CUH

#include "kernels/cuda/attention_backward_internal.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/attention_tma.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

#define FUSED_KEYS 128
#define FUSED_QUERIES ATTENTION_FUSED_QUERIES
#define FUSED_STAGES 2
#define FUSED_CONSUMER_THREADS (2 * WARPGROUP_THREADS)
#define FUSED_THREADS (3 * WARPGROUP_THREADS) /* warpgroup 0: the writer; 1, 2: consumers */
#define FUSED_HANDOFF_THREADS (FUSED_CONSUMER_THREADS + 32)
static_assert(FUSED_KEYS == 2 * WARPGROUP_ROWS && FUSED_QUERIES == 64,
              "a consumer warpgroup owns 64 keys; the score fragments hold 64 x 64 tiles");

enum FusedBarrier {
    BARRIER_RING = 1,     /* consumers: a ring stage landed, the older one is free */
    BARRIER_SCORES = 2,   /* consumers: both halves of ds^T are in shared memory */
    BARRIER_DQ_FULL = 3,  /* consumers arrive, writer syncs: the staging tile holds dq_part */
    BARRIER_DQ_EMPTY = 4, /* writer arrives, consumers sync: the staging tile may be refilled */
};

/* Byte offsets of the shared-memory parts (each a multiple of 128; with TMA the q, dout
 * stages start on 1024-byte boundaries of a 1024-aligned base, ds has two buffers, and the
 * ring's mbarriers follow the delta ring). */
template <int HEAD_DIM, bool TMA>
struct FusedLayout {
    static constexpr size_t tile_bytes = (size_t)FUSED_KEYS * HEAD_DIM * 2;
    static constexpr size_t stage_bytes = (size_t)FUSED_QUERIES * HEAD_DIM * 2;
    static constexpr size_t k = 0;
    static constexpr size_t v = k + tile_bytes;
    static constexpr size_t q_ring = v + tile_bytes;
    static constexpr size_t dout_ring = q_ring + FUSED_STAGES * stage_bytes;
    static constexpr size_t ds = dout_ring + FUSED_STAGES * stage_bytes;
    static constexpr size_t ds_bytes = (size_t)FUSED_KEYS * FUSED_QUERIES * 2;
    static constexpr size_t dq_stage = ds + (TMA ? 2 : 1) * ds_bytes;
    static constexpr size_t lse_ring = dq_stage + (size_t)FUSED_QUERIES * HEAD_DIM * 4;
    static constexpr size_t delta_ring = lse_ring + FUSED_STAGES * FUSED_QUERIES * 4;
    static constexpr size_t barriers = delta_ring + FUSED_STAGES * FUSED_QUERIES * 4;
    static constexpr size_t claimed = barriers + (TMA ? 2 * FUSED_STAGES * 8 : 0);
    static constexpr size_t bytes = claimed + 16 + (TMA ? 1024 : 0); /* + base alignment */
    static_assert(!TMA || (q_ring % 1024 == 0 && stage_bytes % 1024 == 0),
                  "TMA stages start on 1024-byte boundaries");
    /* dk and dv leave through fp32 staging rows of HEAD_DIM + STAGE_PAD in front of dq_stage */
    static_assert((size_t)2 * FUSED_KEYS * (HEAD_DIM + STAGE_PAD) * 4 <= dq_stage,
                  "the dk, dv staging must not reach the dq staging tile");
    static_assert(bytes <= 227 * 1024, "shared memory of one CTA");
};

/* The walk of a key block: step `item` -> (query block, head), query blocks from the last
 * down, the heads of the group inside, the same for every key block of the (batch, kv head). */
struct FusedWalk {
    int query_blocks, heads_per_kv, kv_head;
    __device__ int query_block(int item) const { return query_blocks - 1 - item / heads_per_kv; }
    __device__ int head(int item) const { return kv_head * heads_per_kv + item % heads_per_kv; }
};

/* The writer warp: hands every staged dq_part to dq_accum in key block order. Two additions
 * are in flight: tile s's semaphore is released once tile s + 1's addition is issued and
 * tile s's has completed (the two are different tiles: a walk visits each once). */
template <int HEAD_DIM>
static __device__ __forceinline__ void fused_dq_writer(float *dq_accum, uint32_t *semaphores,
                                                       const float *dq_stage, FusedWalk walk,
                                                       int items, int key_block, int batch,
                                                       int n_heads)
{
    constexpr uint32_t tile_bytes = FUSED_QUERIES * HEAD_DIM * sizeof(float);
    bool leader = threadIdx.x % 32 == 0;
    size_t previous = 0;
    named_barrier_arrive(BARRIER_DQ_EMPTY, FUSED_HANDOFF_THREADS); /* the tile starts empty */
    for (int item = 0; item < items; item++) {
        size_t tile = ((size_t)batch * n_heads + walk.head(item)) * walk.query_blocks +
                      walk.query_block(item);
        named_barrier_sync(BARRIER_DQ_FULL, FUSED_HANDOFF_THREADS);
        if (leader) {
            wait_acquire_gpu(semaphores + tile, (uint32_t)key_block);
            fence_async_proxy_global();
            float *destination = dq_accum + tile * FUSED_QUERIES * HEAD_DIM;
            if (key_block == 0)
                bulk_copy_to_global(destination, dq_stage, tile_bytes);
            else
                bulk_add_to_global(destination, dq_stage, tile_bytes);
            bulk_commit();
            bulk_wait_read<0>();
        }
        __syncwarp();
        if (item + 1 < items) /* the consumers sync on it once per step */
            named_barrier_arrive(BARRIER_DQ_EMPTY, FUSED_HANDOFF_THREADS);
        if (leader && item > 0) {
            bulk_wait<1>(); /* the previous tile's addition is performed */
            fence_async_proxy_global();
            add_release_gpu(semaphores + previous, 1u);
        }
        previous = tile;
        __syncwarp();
    }
    if (leader) {
        bulk_wait<0>();
        fence_async_proxy_global();
        add_release_gpu(semaphores + previous, 1u);
    }
    __syncwarp();
}

/* The TMA variant's producer warp: per step, q and dout through TMA and lse, delta through
 * cp.async (their rows need not be 16-byte aligned) into ring stage item % 2, all completing
 * on full[stage] (one arrival with the TMA bytes, then one per lane when its cp.async copies
 * land); a stage is refilled once both consumers released it (empty[stage]). */
template <int HEAD_DIM>
static __device__ __forceinline__ void
fused_producer(unsigned char *shared, const CUtensorMap *q_map, const CUtensorMap *dout_map,
               const float *lse, const float *delta, FusedWalk walk, int items, int batch, int T,
               int n_heads)
{
    using Layout = FusedLayout<HEAD_DIM, true>;
    uint64_t *full = reinterpret_cast<uint64_t *>(shared + Layout::barriers);
    uint64_t *empty = full + FUSED_STAGES;
    float *lse_ring = reinterpret_cast<float *>(shared + Layout::lse_ring);
    float *delta_ring = reinterpret_cast<float *>(shared + Layout::delta_ring);
    int lane = threadIdx.x % 32;
    for (int item = 0; item < items; item++) {
        int stage = item % FUSED_STAGES, head = walk.head(item);
        int query0 = walk.query_block(item) * FUSED_QUERIES;
        if (item >= FUSED_STAGES) /* both consumers released item - 2 */
            mbarrier_wait(empty + stage, (uint32_t)((item / FUSED_STAGES - 1) & 1));
        if (lane == 0) {
            mbarrier_arrive_expect_bytes(full + stage, (uint32_t)(2 * Layout::stage_bytes));
            tma_tile_load<HEAD_DIM, FUSED_QUERIES>(shared + Layout::q_ring +
                                                       stage * Layout::stage_bytes,
                                                   q_map, head * HEAD_DIM, query0, batch,
                                                   full + stage);
            tma_tile_load<HEAD_DIM, FUSED_QUERIES>(shared + Layout::dout_ring +
                                                       stage * Layout::stage_bytes,
                                                   dout_map, head * HEAD_DIM, query0, batch,
                                                   full + stage);
        }
        size_t row_offset = ((size_t)batch * n_heads + head) * T;
        vector_load_async_by<FUSED_QUERIES>(lse_ring + stage * FUSED_QUERIES, lse + row_offset,
                                            query0, T, lane, 32);
        vector_load_async_by<FUSED_QUERIES>(delta_ring + stage * FUSED_QUERIES,
                                            delta + row_offset, query0, T, lane, 32);
        copy_async_mbarrier_arrive(full + stage);
    }
}

/* The two consumer warpgroups (thread = 0 .. 255 among them). */
template <int HEAD_DIM, bool TMA>
static __device__ __forceinline__ void
fused_consumer(unsigned char *shared, __nv_bfloat16 *dk, __nv_bfloat16 *dv,
               const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
               const __nv_bfloat16 *v, const float *lse, const float *delta, FusedWalk walk,
               int items, int key_block, int batch, int T, int n_heads, int n_kv_heads,
               float scale, float scale_log2, bool accumulate, int thread)
{
    using Layout = FusedLayout<HEAD_DIM, TMA>;
    constexpr int block_queries = FUSED_QUERIES, dq_columns = HEAD_DIM / 2;
    constexpr int stage_elements = FUSED_QUERIES * HEAD_DIM;
    __nv_bfloat16 *k_tile = reinterpret_cast<__nv_bfloat16 *>(shared + Layout::k);
    __nv_bfloat16 *v_tile = reinterpret_cast<__nv_bfloat16 *>(shared + Layout::v);
    __nv_bfloat16 *q_ring = reinterpret_cast<__nv_bfloat16 *>(shared + Layout::q_ring);
    __nv_bfloat16 *dout_ring = reinterpret_cast<__nv_bfloat16 *>(shared + Layout::dout_ring);
    __nv_bfloat16 *ds_tile = reinterpret_cast<__nv_bfloat16 *>(shared + Layout::ds);
    float *dq_stage = reinterpret_cast<float *>(shared + Layout::dq_stage);
    float *lse_ring = reinterpret_cast<float *>(shared + Layout::lse_ring);
    float *delta_ring = reinterpret_cast<float *>(shared + Layout::delta_ring);
    uint64_t *full = reinterpret_cast<uint64_t *>(shared + Layout::barriers);
    uint64_t *empty = full + FUSED_STAGES;

    /* warp-uniform for the compiler (a product under a branch it cannot prove uniform would be
     * serialised) */
    int group = __shfl_sync(0xffffffffu, thread / WARPGROUP_THREADS, 0);
    int warp = (thread / 32) % 4, lane = thread % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    size_t kv_offset = (size_t)batch * T * kv_stride + (size_t)walk.kv_head * HEAD_DIM;
    int key0 = key_block * FUSED_KEYS;
    int group_key0 = key0 + group * WARPGROUP_ROWS;
    bool group_active = group_key0 < T;
    int key_row[2] = {group_key0 + warp * 16 + g, group_key0 + warp * 16 + g + 8};
    const __nv_bfloat16 *k_rows = k_tile + group * WARPGROUP_ROWS * HEAD_DIM;
    const __nv_bfloat16 *v_rows = v_tile + group * WARPGROUP_ROWS * HEAD_DIM;
    /* this warpgroup's 64 rows of ds^T: 8 row groups of the [128 keys, 64 queries] tile (of
     * buffer item % 2 with TMA) */
    uint32_t *ds_group = reinterpret_cast<uint32_t *>(ds_tile + group * WARPGROUP_ROWS * 64);
    /* its dq columns: column pieces of the packed k tile */
    const __nv_bfloat16 *k_columns = k_tile + group * (dq_columns / 8) * 64;

    auto load_item = [&](int item) {
        int stage = item % FUSED_STAGES, head = walk.head(item);
        int query0 = walk.query_block(item) * block_queries;
        size_t q_offset = (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
        size_t row_offset = ((size_t)batch * n_heads + head) * T;
        packed_tile_load_async_by<block_queries, HEAD_DIM, FUSED_CONSUMER_THREADS>(
            q_ring + stage * stage_elements, q + q_offset, q_stride, query0, T, thread);
        packed_tile_load_async_by<block_queries, HEAD_DIM, FUSED_CONSUMER_THREADS>(
            dout_ring + stage * stage_elements, dout + q_offset, q_stride, query0, T, thread);
        vector_load_async_by<block_queries>(lse_ring + stage * block_queries, lse + row_offset,
                                            query0, T, thread, FUSED_CONSUMER_THREADS);
        vector_load_async_by<block_queries>(delta_ring + stage * block_queries,
                                            delta + row_offset, query0, T, thread,
                                            FUSED_CONSUMER_THREADS);
    };

    packed_tile_load_async_by<FUSED_KEYS, HEAD_DIM, FUSED_CONSUMER_THREADS>(
        k_tile, k + kv_offset, kv_stride, key0, T, thread);
    packed_tile_load_async_by<FUSED_KEYS, HEAD_DIM, FUSED_CONSUMER_THREADS>(
        v_tile, v + kv_offset, kv_stride, key0, T, thread);
    if constexpr (!TMA)
        load_item(0);
    copy_async_commit();
    if constexpr (TMA) { /* k, v landed before the first product reads them */
        copy_async_wait<0>();
        fence_async_proxy();
        named_barrier_sync(BARRIER_RING, FUSED_CONSUMER_THREADS);
    }

    float dk_sum[HEAD_DIM / 8][4], dv_sum[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk_sum[t][e] = dv_sum[t][e] = 0.0f;
    float p[8][4] = {}, ds[8][4] = {}; /* p^T, dp^T of one step as the products leave them */
    float dq[dq_columns / 8][4] = {};
    uint32_t p_operand[4][4], ds_operand[4][4];

    for (int item = 0; item < items; item++) {
        int stage = item % FUSED_STAGES;
        int query0 = walk.query_block(item) * block_queries;
        if constexpr (TMA) {
            mbarrier_wait(full + stage, (uint32_t)((item / FUSED_STAGES) & 1));
        } else {
            /* this item's tiles have landed; both warpgroups retired every product of
             * item - 1, so its stage takes item + 1 */
            copy_async_wait<0>();
            fence_async_proxy();
            named_barrier_sync(BARRIER_RING, FUSED_CONSUMER_THREADS);
            if (item + 1 < items)
                load_item(item + 1);
            copy_async_commit();
        }
        const __nv_bfloat16 *q_tile = q_ring + stage * stage_elements;
        const __nv_bfloat16 *dout_tile = dout_ring + stage * stage_elements;
        const unsigned char *q_bytes = reinterpret_cast<const unsigned char *>(q_tile);
        const unsigned char *dout_bytes = reinterpret_cast<const unsigned char *>(dout_tile);
        uint32_t *ds_words = ds_group + (TMA ? (item % 2) * (Layout::ds_bytes / 4) : 0);
        const __nv_bfloat16 *ds_read = ds_tile + (TMA ? (item % 2) * (Layout::ds_bytes / 2) : 0);
        const float *lse_tile = lse_ring + stage * block_queries;
        const float *delta_tile = delta_ring + stage * block_queries;
        /* the second warpgroup's keys all follow the first query block of every head */
        bool active = group_active && query0 + block_queries > group_key0;

        if (active) {
            /* p^T = k q^T and dp^T = v dout^T for the warpgroup's 64 keys, 64 queries */
            warpgroup_fence();
            if constexpr (TMA) {
#pragma unroll
                for (int k0 = 0; k0 < HEAD_DIM; k0 += 16)
                    warpgroup_mma_shared<64, 0, 0>(
                        p, packed_k_major<HEAD_DIM>(k_rows, k0),
                        swizzled_k_major<HEAD_DIM>(q_bytes, FUSED_QUERIES, 0, k0), k0 > 0);
#pragma unroll
                for (int k0 = 0; k0 < HEAD_DIM; k0 += 16)
                    warpgroup_mma_shared<64, 0, 0>(
                        ds, packed_k_major<HEAD_DIM>(v_rows, k0),
                        swizzled_k_major<HEAD_DIM>(dout_bytes, FUSED_QUERIES, 0, k0), k0 > 0);
            } else {
                warpgroup_rows_times_rows<HEAD_DIM>(p, k_rows, q_tile);
                warpgroup_rows_times_rows<HEAD_DIM>(ds, v_rows, dout_tile);
            }
            warpgroup_commit();
            warpgroup_wait<0>();
            warpgroup_fence_accumulators(p);
            warpgroup_fence_accumulators(ds);

            /* masked where the query is before the key (the diagonal tile) or past T (the last
             * tile); ds^T = p^T (dp^T - delta), straight into the bf16 operands */
            bool needs_mask = query0 == group_key0 || query0 + block_queries > T;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p_pair[2][4], ds_pair[2][4]; /* tiles 2j, 2j+1: queries 16j .. 16j+15 */
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int t = 2 * j + h, column = t * 8 + 2 * c + (e & 1);
                        int query = query0 + column;
                        float value =
                            exp2f(fmaf(p[t][e], scale_log2, -lse_tile[column] * LOG2_E));
                        if (needs_mask && (query < key_row[e >> 1] || query >= T))
                            value = 0.0f;
                        p_pair[h][e] = value;
                        ds_pair[h][e] = value * (ds[t][e] - delta_tile[column]);
                    }
                accumulators_to_operand(p_operand[j], p_pair[0], p_pair[1]);
                accumulators_to_operand(ds_operand[j], ds_pair[0], ds_pair[1]);
            }
            /* ds^T into its rows of the shared tile, packed with 64 columns: row group
             * 2 warp + r, column group 2 j + h, so a warp's 32 words are 32 banks */
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        ds_words[((2 * warp + r) * 512 + (2 * j + h) * 64 + g * 8 + 2 * c) / 2] =
                            ds_operand[j][r + 2 * h];
            /* dv += p^T dout, dk += ds^T q (the 1/sqrt(hd) of dk is applied once, at the end) */
            warpgroup_fence();
            if constexpr (TMA) {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    warpgroup_mma_registers<HEAD_DIM, 1>(
                        dv_sum, p_operand[j],
                        swizzled_mn_major<HEAD_DIM>(dout_bytes, FUSED_QUERIES, 16 * j), true);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    warpgroup_mma_registers<HEAD_DIM, 1>(
                        dk_sum, ds_operand[j],
                        swizzled_mn_major<HEAD_DIM>(q_bytes, FUSED_QUERIES, 16 * j), true);
            } else {
                warpgroup_fragments_times_tile<HEAD_DIM>(dv_sum, p_operand, dout_tile);
                warpgroup_fragments_times_tile<HEAD_DIM>(dk_sum, ds_operand, q_tile);
            }
            warpgroup_commit();
        } else {
            /* its keys see none of these queries: its rows of ds^T are zeros */
            int thread_in_group = thread % WARPGROUP_THREADS;
#pragma unroll
            for (int i = 0; i < WARPGROUP_ROWS * 64 / 2 / WARPGROUP_THREADS; i++)
                ds_words[thread_in_group + i * WARPGROUP_THREADS] = 0u;
        }
        fence_async_proxy();
        named_barrier_sync(BARRIER_SCORES, FUSED_CONSUMER_THREADS);

        /* dq_part [64 queries, this warpgroup's dq_columns] = ds k over the 128 keys: ds read
         * MN-major from the ds^T tile (rows = keys), k MN-major from the k tile */
        warpgroup_fence();
#pragma unroll
        for (int k0 = 0; k0 < FUSED_KEYS; k0 += 16)
            warpgroup_mma_shared<dq_columns, 1, 1>(dq, packed_mn_major<64>(ds_read, k0),
                                                   packed_mn_major<HEAD_DIM>(k_columns, k0),
                                                   k0 > 0);
        warpgroup_commit();
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(dq);
        warpgroup_fence_accumulators(dk_sum);
        warpgroup_fence_accumulators(dv_sum);
        if (TMA && thread % WARPGROUP_THREADS == 0) /* q, dout, lse, delta of this stage read */
            mbarrier_arrive(empty + stage);

        /* dq_part into the staging tile in register order: float4 (d[t][0..3]) number
         * ((group * 4 + warp) * dq_columns / 8 + t) * 32 + lane; dq_accum keeps this order */
        named_barrier_sync(BARRIER_DQ_EMPTY, FUSED_HANDOFF_THREADS);
        float4 *staged = reinterpret_cast<float4 *>(dq_stage) +
                         (group * 4 + warp) * (dq_columns / 8) * 32 + lane;
#pragma unroll
        for (int t = 0; t < dq_columns / 8; t++)
            staged[t * 32] = make_float4(dq[t][0], dq[t][1], dq[t][2], dq[t][3]);
        fence_async_proxy();
        named_barrier_arrive(BARRIER_DQ_FULL, FUSED_HANDOFF_THREADS);
    }
    copy_async_wait<0>(); /* only an empty group remains */

    /* dk, dv through shared memory in 16-byte pieces, once both warpgroups' last products
     * (which read k, ds) have completed; the dq staging tile behind is left alone */
    named_barrier_sync(BARRIER_RING, FUSED_CONSUMER_THREADS);
    int warp_row0 = group * WARPGROUP_ROWS + warp * 16;
    float *dk_stage = reinterpret_cast<float *>(shared) + warp_row0 * (HEAD_DIM + STAGE_PAD);
    float *dv_stage = dk_stage + FUSED_KEYS * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(dk_stage, dk_sum, scale, lane);
    warp_stage_accumulators<HEAD_DIM>(dv_stage, dv_sum, 1.0f, lane);
    __syncwarp();
    warp_store_staged<HEAD_DIM>(dk + kv_offset, kv_stride, dk_stage, key0 + warp_row0, T,
                                accumulate, lane);
    warp_store_staged<HEAD_DIM>(dv + kv_offset, kv_stride, dv_stage, key0 + warp_row0, T,
                                accumulate, lane);
}

#endif
