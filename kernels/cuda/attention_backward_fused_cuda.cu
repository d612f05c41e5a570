/* kernels/cuda/attention_backward_fused_cuda.cu — causal grouped-KV flash attention, backward in
 * one pass over the scores: five products a tile, dq deterministic without atomics (see
 * attention_cuda.h; tiles in attention_tiles.cuh, products in warpgroup_mma.cuh; the CTA's
 * shared layout and the device functions of its roles in attention_backward_fused_roles.cuh).
 *
 * A CTA owns 128 keys of one kv head (as the two-pass dk/dv kernel does) and walks every query
 * head of the group and every 64-query block at or after its keys. Per step, each of its two
 * consumer warpgroups (64 keys each) computes
 *   p^T = exp(k q^T * scale - lse),  dp^T = v dout^T,  ds^T = p^T (dp^T - delta)
 *   dv += p^T dout,  dk += ds^T q                      (p^T, ds^T straight from registers)
 * writes ds^T (bf16) into a shared tile, and after both halves are there computes half of
 *   dq_part [64 queries, head_dim] = ds [64, 128 keys] k [128 keys, head_dim]
 * (warpgroup w: columns w head_dim / 2 ..), which it leaves in a shared staging tile.
 *
 * dq in a fixed order. A third warpgroup gives its registers to the other two (setmaxnreg);
 * one of its warps, the writer, adds each staged dq_part into the fp32 dq_accum tile of its
 * (batch, head, query block) in the workspace with one bulk reduction in L2
 * (cp.reduce.async.bulk .add.f32), but only when that tile's semaphore says that exactly the
 * key blocks before its own have added theirs: key block 0 stores (no zeroing needed), key
 * block 1 adds, and so on. Every dq element is therefore the same sum in the same order on
 * every run, and a last kernel scales dq_accum into dq (bf16, + dq when accumulating).
 *
 * Why it cannot deadlock: a CTA takes its tile from an atomic counter, not from blockIdx, and
 * tiles are numbered by bands of pairs (batch, kv head), key block major inside a band, so every
 * key block a CTA waits for (the same pair's, lower) was taken by a CTA that had already started:
 * it is resident or finished, and by induction on the tile number the lowest unfinished tile never
 * waits. Why bands: a band's tiles read the same q and dout and add into the same dq tiles while
 * those are in L2. With every pair in one band, at the 1B shape (B32 T1024 16/8 hd80) L2 hit 55%
 * of the reads and DRAM was 56% busy; in bands of about two rounds of CTAs, DRAM 19% and 1.034 ->
 * 0.928 ms (docs/performance.md). Why it rarely waits: each CTA walks its query blocks from the
 * last down, heads inside, so key blocks j - 1 and j reach a (head, query block) at the same step
 * of their walks; j trails j - 1 by one bulk addition, and the CTAs of later key blocks have fewer
 * steps.
 *
 * Ordering. Consumers write the staging tile with ordinary stores, fence the async proxy and
 * arrive on DQ_FULL; the writer syncs on it, acquires the semaphore (ld.acquire.gpu), fences
 * the proxies, issues the bulk operation, waits until its shared source is read (then arrives
 * on DQ_EMPTY, so the consumers may refill the tile); once the next tile's operation is issued
 * it waits until this one's writes are performed, fences the proxies again and releases this
 * tile's semaphore (red.release.gpu). A chain of releases therefore waits on later issues,
 * but every issue of key block j waits only on key block j - 1, down to key block 0, which
 * never waits. Consumers load q, dout, lse,
 * delta with cp.async into a ring of two stages and meet at a 256-thread barrier per step (a
 * stage is refilled only after both warpgroups retired the products that read it); the ds tile
 * is published by a second barrier in the step.
 *
 * Shared memory (bf16 tiles packed, attention_tiles.cuh): k, v [128, hd]; q, dout rings
 * [2][64, hd]; ds^T [128 keys, 64 queries]; the dq staging tile [64 hd] fp32; lse, delta rings.
 * head_dim 128: 177 KiB. The dk, dv results leave through fp32 staging over the tiles in front
 * of the dq staging tile, which the writer may still be reading.
 */
#include "kernels/cuda/attention_backward_fused_roles.cuh"
#include "kernels/cuda/attention_backward_internal.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/attention_tma.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#define FUSED_BAND_ROUNDS 2 /* a band: pairs of about two launches' worth of CTAs */
#define FUSED_WRITER_REGISTERS 24
#define FUSED_CONSUMER_REGISTERS 240 /* 128 x 24 + 256 x 240 <= 65536 */
#define FUSED_TMA_WRITER_REGISTERS 24 /* the writer and the producer warp */
#define FUSED_TMA_CONSUMER_REGISTERS 240
#define CONVERT_THREADS 256

/* grid: one CTA per (key block, batch, kv head) tile, FUSED_THREADS threads; the tile comes
 * from *counter (zeroed by the delta pass), key block major. TMA: q, dout, lse, delta come
 * from a producer warp (the maps describe q and dout, boxes of 64 rows); otherwise the maps
 * are not read. */
template <int HEAD_DIM, bool TMA>
__global__ void __launch_bounds__(FUSED_THREADS, 1)
attention_backward_fused_kernel(const __grid_constant__ CUtensorMap q_map,
                                const __grid_constant__ CUtensorMap dout_map,
                                __nv_bfloat16 *dk, __nv_bfloat16 *dv, float *dq_accum,
                                uint32_t *semaphores, uint32_t *counter,
                                const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                                const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse,
                                const float *delta, int B, int T, int n_heads, int n_kv_heads,
                                int pairs_per_band, float scale, float scale_log2,
                                bool accumulate)
{
    using Layout = FusedLayout<HEAD_DIM, TMA>;
    extern __shared__ __align__(128) unsigned char shared_window[];
    unsigned char *shared = shared_window;
    if constexpr (TMA) /* the swizzled stages start on 1024-byte boundaries */
        shared += (1024 - shared_address(shared_window) % 1024) % 1024;
    int *claimed = reinterpret_cast<int *>(shared + Layout::claimed);
    if (threadIdx.x == 0) {
        *claimed = (int)atomicAdd(counter, 1u);
        if constexpr (TMA) {
            uint64_t *full = reinterpret_cast<uint64_t *>(shared + Layout::barriers);
            for (int stage = 0; stage < FUSED_STAGES; stage++) {
                mbarrier_init(full + stage, 1 + 32); /* the TMA bytes, then every lane's copies */
                mbarrier_init(full + FUSED_STAGES + stage, 2); /* empty: both consumers */
            }
            mbarrier_init_fence();
        }
    }
    __syncthreads();
    /* tile -> (pair (batch, kv head), key block): key block major inside bands of pairs */
    int pair, key_block;
    band_tile(*claimed, n_kv_heads * B, pairs_per_band, (T + FUSED_KEYS - 1) / FUSED_KEYS, &pair,
              &key_block);
    const int batch = pair / n_kv_heads;
    FusedWalk walk;
    walk.query_blocks = (T + FUSED_QUERIES - 1) / FUSED_QUERIES;
    walk.heads_per_kv = n_heads / n_kv_heads;
    walk.kv_head = pair % n_kv_heads;
    /* query blocks before the key block's first key see none of its keys */
    int items = walk.heads_per_kv * (walk.query_blocks - key_block * (FUSED_KEYS / FUSED_QUERIES));

    int role = __shfl_sync(0xffffffffu, (int)threadIdx.x / WARPGROUP_THREADS, 0);
    if (role == 0) {
        warpgroup_registers_release<TMA ? FUSED_TMA_WRITER_REGISTERS : FUSED_WRITER_REGISTERS>();
        int warp = __shfl_sync(0xffffffffu, (int)threadIdx.x / 32, 0);
        if (warp == 0)
            fused_dq_writer<HEAD_DIM>(dq_accum, semaphores,
                                      reinterpret_cast<const float *>(shared + Layout::dq_stage),
                                      walk, items, key_block, batch, n_heads);
        else if (TMA && warp == 1)
            fused_producer<HEAD_DIM>(shared, &q_map, &dout_map, lse, delta, walk, items, batch,
                                     T, n_heads);
    } else {
        warpgroup_registers_claim<TMA ? FUSED_TMA_CONSUMER_REGISTERS
                                      : FUSED_CONSUMER_REGISTERS>();
        fused_consumer<HEAD_DIM, TMA>(shared, dk, dv, dout, q, k, v, lse, delta, walk, items,
                                      key_block, batch, T, n_heads, n_kv_heads, scale,
                                      scale_log2, accumulate, (int)threadIdx.x - WARPGROUP_THREADS);
    }
}

/* dq [B, T, n_heads, HEAD_DIM] (+)= scale * dq_accum (accumulate: +=; otherwise = 0.0 +, dq
 * not read); grid (query blocks, n_heads, B),
 * CONVERT_THREADS threads: a tile is read in its register order into a row-major shared tile,
 * then written out in 16-byte pieces. */
template <int HEAD_DIM>
__global__ void __launch_bounds__(CONVERT_THREADS)
attention_backward_dq_convert_kernel(__nv_bfloat16 *dq, const float *dq_accum, int T,
                                     int n_heads, float scale, bool accumulate)
{
    constexpr int tiles = HEAD_DIM / 16, stride = HEAD_DIM + 4; /* dq_columns / 8 */
    __shared__ __align__(16) float rows[FUSED_QUERIES * stride];
    int query_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    size_t tile = ((size_t)batch * n_heads + head) * gridDim.x + query_block;
    const float4 *source = reinterpret_cast<const float4 *>(dq_accum) +
                           tile * (FUSED_QUERIES * HEAD_DIM / 4);
    for (int i = threadIdx.x; i < FUSED_QUERIES * HEAD_DIM / 4; i += CONVERT_THREADS) {
        /* i = ((group * 4 + warp) * tiles + t) * 32 + lane (the fused kernel's staging) */
        int lane = i % 32, t = i / 32 % tiles, warp = i / (32 * tiles) % 4;
        int group = i / (128 * tiles);
        int row = warp * 16 + lane / 4, column = group * (HEAD_DIM / 2) + t * 8 + 2 * (lane % 4);
        float4 value = source[i];
        rows[row * stride + column] = value.x;
        rows[row * stride + column + 1] = value.y;
        rows[(row + 8) * stride + column] = value.z;
        rows[(row + 8) * stride + column + 1] = value.w;
    }
    __syncthreads();
    size_t row_stride = (size_t)n_heads * HEAD_DIM;
    __nv_bfloat16 *out = dq + (size_t)batch * T * row_stride + (size_t)head * HEAD_DIM;
    for (int piece = threadIdx.x; piece < FUSED_QUERIES * HEAD_DIM / 8; piece += CONVERT_THREADS) {
        int row = piece / (HEAD_DIM / 8), column = piece % (HEAD_DIM / 8) * 8;
        int query = query_block * FUSED_QUERIES + row;
        if (query >= T)
            continue;
        float value[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            value[e] = rows[row * stride + column + e] * scale;
        uint4 *destination = reinterpret_cast<uint4 *>(out + (size_t)query * row_stride + column);
        /* not accumulating: +0.0 in place of dq, which is not read (warp_store_staged) */
        float old[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (accumulate)
            unpack_bf16x8(old, *destination);
#pragma unroll
        for (int e = 0; e < 8; e++)
            value[e] += old[e];
        *destination =
            make_uint4(pack_bf16x2(value[0], value[1]), pack_bf16x2(value[2], value[3]),
                       pack_bf16x2(value[4], value[5]), pack_bf16x2(value[6], value[7]));
    }
}

template <int HEAD_DIM, bool TMA>
static void fused_launch(__nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv,
                         const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                         const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse,
                         const AttentionBackwardWorkspace *w, int B, int T, int n_heads,
                         int n_kv_heads, bool accumulate, cudaStream_t stream)
{
    constexpr size_t shared_bytes = FusedLayout<HEAD_DIM, TMA>::bytes;
    static bool configured; /* over 48 KiB of shared memory must be asked for, once */
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attention_backward_fused_kernel<HEAD_DIM, TMA>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
        configured = true;
    }
    CUtensorMap q_map, dout_map;
    memset(&q_map, 0, sizeof q_map);
    memset(&dout_map, 0, sizeof dout_map);
    if (TMA) {
        const char *op = "attention_backward_cuda";
        q_map = tensor_map_rows<HEAD_DIM>(op, q, B, T, n_heads, FUSED_QUERIES);
        dout_map = tensor_map_rows<HEAD_DIM>(op, dout, B, T, n_heads, FUSED_QUERIES);
    }
    int key_blocks = (T + FUSED_KEYS - 1) / FUSED_KEYS;
    int query_blocks = (T + FUSED_QUERIES - 1) / FUSED_QUERIES;
    float scale = 1.0f / sqrtf((float)HEAD_DIM), scale_log2 = scale * LOG2_E;
    unsigned tiles = (unsigned)key_blocks * (unsigned)(n_kv_heads * B);
    /* bands of pairs of about FUSED_BAND_ROUNDS rounds of CTAs (one a multiprocessor): at
     * the 8B shape (32 key blocks a pair, 8 pairs) that is one band. Measured at the 1B
     * shape: bands of one round (17 pairs) 0.976 ms, of two 0.928; at the 8B shape, where
     * one round makes two bands of its 8 pairs, 0.83 -> 1.10 ms. Bands change which CTA
     * takes a tile, not a sum's order: the bits stay. */
    const int pairs_per_band = band_pairs_for(n_kv_heads * B, key_blocks,
                                              cuda_multiprocessor_count(), FUSED_BAND_ROUNDS);
    attention_backward_fused_kernel<HEAD_DIM, TMA>
        <<<tiles, FUSED_THREADS, shared_bytes, stream>>>(
            q_map, dout_map, dk, dv, w->dq_accum, w->semaphores, w->counter, dout, q, k, v, lse,
            w->delta, B, T, n_heads, n_kv_heads, pairs_per_band, scale, scale_log2, accumulate);
    CUDA_CHECK_LAUNCH();
    attention_backward_dq_convert_kernel<HEAD_DIM>
        <<<dim3(query_blocks, n_heads, B), CONVERT_THREADS, 0, stream>>>(
            dq, w->dq_accum, T, n_heads, scale, accumulate);
    CUDA_CHECK_LAUNCH();
}

template <int HEAD_DIM>
static void fused_launch_either(bool tma, __nv_bfloat16 *dq, __nv_bfloat16 *dk,
                                __nv_bfloat16 *dv, const __nv_bfloat16 *dout,
                                const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                const __nv_bfloat16 *v, const float *lse,
                                const AttentionBackwardWorkspace *w, int B, int T, int n_heads,
                                int n_kv_heads, bool accumulate, cudaStream_t stream)
{
    if (tma)
        fused_launch<HEAD_DIM, true>(dq, dk, dv, dout, q, k, v, lse, w, B, T, n_heads,
                                     n_kv_heads, accumulate, stream);
    else
        fused_launch<HEAD_DIM, false>(dq, dk, dv, dout, q, k, v, lse, w, B, T, n_heads,
                                      n_kv_heads, accumulate, stream);
}

extern "C" void attention_backward_fused_launch(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                                const bf16 *q, const bf16 *k, const bf16 *v,
                                                const float *lse,
                                                const AttentionBackwardWorkspace *w, int B,
                                                int T, int n_heads, int n_kv_heads, int head_dim,
                                                bool tma, bool accumulate, cudaStream_t stream)
{
    __nv_bfloat16 *dq_bf16 = reinterpret_cast<__nv_bfloat16 *>(dq);
    __nv_bfloat16 *dk_bf16 = reinterpret_cast<__nv_bfloat16 *>(dk);
    __nv_bfloat16 *dv_bf16 = reinterpret_cast<__nv_bfloat16 *>(dv);
    const __nv_bfloat16 *dout_bf16 = reinterpret_cast<const __nv_bfloat16 *>(dout);
    const __nv_bfloat16 *q_bf16 = reinterpret_cast<const __nv_bfloat16 *>(q);
    const __nv_bfloat16 *k_bf16 = reinterpret_cast<const __nv_bfloat16 *>(k);
    const __nv_bfloat16 *v_bf16 = reinterpret_cast<const __nv_bfloat16 *>(v);
    switch (head_dim) {
    case 64:
        fused_launch_either<64>(tma, dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16,
                                v_bf16, lse, w, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    case 80:
        fused_launch_either<80>(tma, dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16,
                                v_bf16, lse, w, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    default:
        fused_launch_either<128>(tma, dq_bf16, dk_bf16, dv_bf16, dout_bf16, q_bf16, k_bf16,
                                 v_bf16, lse, w, B, T, n_heads, n_kv_heads, accumulate, stream);
        break;
    }
}
