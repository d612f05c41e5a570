/* kernels/cuda/attention_forward_specialised_cuda.cu — causal grouped-KV flash attention,
 * forward, in the manner of FlashAttention-3: TMA loads from a producer warp, two consumer
 * warpgroups, softmax overlapped with the products (see attention_cuda.h for the contract,
 * warpgroup_mma.cuh for the products and descriptors).
 *
 * A CTA holds 128 query rows: 64 queries of two heads of one KV group (even group sizes; the
 * two consumer warpgroups share every K, V tile and the diagonal) or 128 queries of one head
 * (odd group sizes). Warpgroup 0 gives its registers away (setmaxnreg 24) and one of its
 * threads issues every TMA copy: each consumer's Q tile once, then K and V blocks of 128 keys
 * into a ring of two stages, K and V on their own mbarriers (full_k, full_v: the consumer may
 * start S = Q K^T before V has landed), each stage refilled once both consumers released it
 * (empty, one arrival per consumer warpgroup). Consumers (240 registers each) walk the key
 * blocks [128 j, 128 j + 128) from the one holding the CTA's last key (or T - 1) down to 0:
 * every row sees a key of the first block (the CTA's queries all follow its start), keys past
 * the CTA's last query are masked there, keys at or past T arrive from TMA as zeros (and are
 * masked with them), and no coordinate is ever negative. With 2 heads x 64 queries a CTA
 * whose queries start on a multiple of 128 masks half of its first block: 1.5% of the work
 * at T 4096.
 *
 * Per block i a consumer issues S_i = Q K_i^T and O += P_{i-1} V_{i-1} together, waits for S_i
 * only, runs the online softmax of S_i (base 2, as attention_cuda.cu) while the P V product
 * runs, then waits for it, releases the stage, rescales O and packs P_i: the scores of one
 * block, the probabilities of the previous one and O are live together (64 + 32 + 64 registers
 * at head_dim 128). The two consumers take turns issuing their products (named barriers 1 and
 * 2, "ping-pong"), so one's softmax runs under the other's products.
 *
 * Shared memory: Q [2][64, hd], K and V rings [2][128, hd], each tile stored as TMA writes it:
 * boxes of 64 columns (head_dim 64, 128: 128-byte rows, 128-byte swizzle) or 16 columns
 * (head_dim 80: 32-byte rows, 32-byte swizzle), box after box, every box 1024-byte aligned.
 * head_dim 128: 160 KiB. The output of a CTA's last tile leaves through fp32 staging over the
 * K, V rings once both consumers are past their last product.
 *
 * Persistent (FATHOM_ATTENTION_FORWARD=persistent, the default): as many CTAs as the
 * multiprocessors hold, each walking tiles in rounds (spec_tile_index, spec_tile). The producer
 * loads the next tile's Q once both consumers are past this tile's last score product (q_empty)
 * and its K, V blocks as the ring's stages are released, so they land while the consumers run this
 * tile's last P V, normalise and store; those stores go straight from the registers, since the
 * rings already hold the next tile's blocks. Each tile's arithmetic is the one-CTA-a-tile
 * launch's: the same bits. At T 1024 a CTA walks 4.5 key blocks a tile on average, and a tile's
 * start and end were a large part of it (docs/performance.md).
 *
 * With one consumer (FATHOM_ATTENTION_FORWARD=single_consumer) a CTA holds 64 queries of one
 * head and takes no turns; two CTAs share a multiprocessor (head_dim 64 and 80: 75 and 92
 * KiB of shared memory each), so that one's start (barriers, the Q and first K loads) and end
 * (the output's staging and stores) run under the other's products. At T 1024 a CTA of the
 * two-consumer kernel walks 4.5 key blocks on average, and those ends are a large part of it.
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/attention_tma.cuh"

#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>

#define SPEC_KEYS 128 /* keys of a block */
#define SPEC_STAGES 2
#define SPEC_PRODUCER_REGISTERS 24
#define SPEC_BAND_ROUNDS 8 /* a band: pairs of at least 8 rounds of a launch's CTAs */

/* The CTA's shape by its consumer warpgroups: two taking turns, one CTA a multiprocessor
 * (128 x 24 + 256 x 240 <= 65536 registers); or one, two CTAs a multiprocessor, each
 * launched with 128 registers a thread, of which the producer gives 104 to the consumer
 * (128 x 24 + 128 x 232 = 256 x 128). */
template <int CONSUMERS>
struct SpecShape {
    static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
    static constexpr int threads = (CONSUMERS + 1) * WARPGROUP_THREADS;
    static constexpr int rows = CONSUMERS * WARPGROUP_ROWS; /* query rows of a CTA */
    static constexpr int consumer_threads = CONSUMERS * WARPGROUP_THREADS;
    static constexpr int consumer_registers = CONSUMERS == 2 ? 240 : 232;
    static constexpr int blocks_per_multiprocessor = CONSUMERS == 2 ? 1 : 2;
};

enum SpecBarrier {
    BARRIER_TURN_FIRST = 1,  /* consumer 0 may issue its products */
    BARRIER_TURN_SECOND = 2, /* consumer 1 may issue its products */
    BARRIER_CONSUMERS = 3,   /* both consumers are past their last product */
};

/* Shared-memory layout of one head_dim (byte offsets from a 1024-aligned base). */
template <int HEAD_DIM, int CONSUMERS>
struct SpecTiles : TmaTile<HEAD_DIM> {
    static constexpr size_t q_bytes = (size_t)WARPGROUP_ROWS * HEAD_DIM * 2;
    static constexpr size_t kv_bytes = (size_t)SPEC_KEYS * HEAD_DIM * 2;
    static constexpr size_t q = 0;
    static constexpr size_t k_ring = q + CONSUMERS * q_bytes;
    static constexpr size_t v_ring = k_ring + SPEC_STAGES * kv_bytes;
    static constexpr size_t barriers = v_ring + SPEC_STAGES * kv_bytes;
    /* q_full, full_k[2], full_v[2], empty[2], q_empty */
    static constexpr size_t bytes = barriers + 8 * 8 + 1024; /* + alignment of the base */
    static_assert(q_bytes % 1024 == 0 && kv_bytes % 1024 == 0,
                  "every box starts on a 1024-byte boundary");
    static_assert((size_t)SpecShape<CONSUMERS>::rows * (HEAD_DIM + STAGE_PAD) * 4 <=
                      2 * SPEC_STAGES * kv_bytes,
                  "the output staging fits in the K, V rings");
    static_assert(bytes <= 227 * 1024, "shared memory of one CTA");
};

/* The tiles of a launch: bands of pairs (batch, group of heads), attention_tiles.cuh's
 * band_tile, the item a query block z counted from the last (the most keys), so that a
 * band goes heaviest first. A persistent CTA b of G takes tiles in rounds,
 * forwards and backwards in turn (b, then 2G - 1 - b, then 2G + b, ...): each round gives
 * the CTAs tiles of about the same length, and a CTA that had one of the round's longer
 * tiles has one of the next round's shorter ones.
 * Why bands: the tiles of a pair read the same K, V. With every pair in one band (the
 * whole launch heaviest first), a pair's tiles are spread over the launch, and at the
 * 1B shape (B32 T1024 16/8 hd80: 84 MB of K, V) L2 hit 63% of the reads, DRAM 46% busy.
 * With a pair's tiles one after another they share L2 (DRAM 16% busy, 0.346 -> 0.313 ms),
 * but the launch ends on some pair's longest tiles: at the 8B shape (64 tiles of 1 to 32
 * key blocks a pair) 0.28 -> 0.40 ms. A band of at least 8 rounds of tiles keeps both:
 * specialised_launch sizes it (docs/performance.md). */
struct SpecTile {
    int first_head, batch, query0;
};

static __device__ __forceinline__ int spec_tile_index(int round, int cta, int ctas)
{
    return round * ctas + (round % 2 ? ctas - 1 - cta : cta);
}

static __device__ __forceinline__ SpecTile spec_tile(int index, int groups, int pairs,
                                                     int pairs_per_band, int query_blocks,
                                                     int heads_per_block, int block_queries)
{
    int pair, z;
    band_tile(index, pairs, pairs_per_band, query_blocks, &pair, &z);
    return {pair % groups * heads_per_block, pair / groups,
            (query_blocks - 1 - z) * block_queries};
}

/* Out of the accumulators straight to global memory (rows at or past T skipped), as bf16
 * (0.0 + value): the bits warp_store_staged gives, without the staging. */
template <int HEAD_DIM>
static __device__ __forceinline__ void spec_store_accumulators(__nv_bfloat16 *global,
                                                               size_t row_stride,
                                                               const float (&o)[HEAD_DIM / 8][4],
                                                               const int (&query_row)[2], int T,
                                                               int lane)
{
    int c = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (query_row[r] >= T)
            continue;
        uint32_t *row = reinterpret_cast<uint32_t *>(global + (size_t)query_row[r] * row_stride);
#pragma unroll
        for (int t = 0; t < HEAD_DIM / 8; t++)
            row[(t * 8 + 2 * c) / 2] = pack_bf16x2(0.0f + o[t][2 * r], 0.0f + o[t][2 * r + 1]);
    }
}

/* grid: one CTA a tile, or fewer CTAs each walking several (persistent: the next tile's Q and
 * first K, V blocks load while this one's last products and stores run); Shape::threads
 * threads. Tensor maps: [B, T, heads * HEAD_DIM] bf16 with boxes [1, rows, box_columns]
 * (q: 64 rows, k and v: 128). */
template <int HEAD_DIM, int CONSUMERS>
__global__ void __launch_bounds__(SpecShape<CONSUMERS>::threads,
                                  SpecShape<CONSUMERS>::blocks_per_multiprocessor)
attention_forward_specialised_kernel(const __grid_constant__ CUtensorMap q_map,
                                     const __grid_constant__ CUtensorMap k_map,
                                     const __grid_constant__ CUtensorMap v_map,
                                     __nv_bfloat16 *out, float *lse, int B, int T, int n_heads,
                                     int n_kv_heads, int heads_per_block, int pairs_per_band,
                                     float scale_log2)
{
    using Tiles = SpecTiles<HEAD_DIM, CONSUMERS>;
    using Shape = SpecShape<CONSUMERS>;
    extern __shared__ __align__(128) unsigned char shared_window[];
    unsigned char *shared =
        shared_window + ((1024 - shared_address(shared_window) % 1024) % 1024);
    uint64_t *barriers = reinterpret_cast<uint64_t *>(shared + Tiles::barriers);
    uint64_t *q_full = barriers, *full_k = barriers + 1, *full_v = barriers + 3;
    uint64_t *empty = barriers + 5, *q_empty = barriers + 7;

    const int groups = n_heads / heads_per_block, block_queries = Shape::rows / heads_per_block;
    const int query_blocks = (T + block_queries - 1) / block_queries;
    const int tiles = groups * B * query_blocks, cta = blockIdx.x, ctas = gridDim.x;
    const int group_size = n_heads / n_kv_heads;
    /* the keys of a tile: [0, key_end), in blocks [128 j, 128 j + 128) walked from the top */
    auto top_block_of = [&](const SpecTile &tile) {
        return (min(T, tile.query0 + block_queries) - 1) / SPEC_KEYS;
    };

    if (threadIdx.x == 0) {
        mbarrier_init(q_full, 1);
        mbarrier_init(q_empty, CONSUMERS);
        for (int s = 0; s < SPEC_STAGES; s++) {
            mbarrier_init(full_k + s, 1);
            mbarrier_init(full_v + s, 1);
            mbarrier_init(empty + s, CONSUMERS);
        }
        mbarrier_init_fence();
    }
    __syncthreads();

    /* Tile r of this CTA fills q_full's phase r and empties q_empty's; key block n of the
     * CTA's walk (counted over its tiles) takes stage n % 2 in its use n / 2. */
    int role = __shfl_sync(0xffffffffu, (int)threadIdx.x / WARPGROUP_THREADS, 0);
    if (role == 0) {
        warpgroup_registers_release<SPEC_PRODUCER_REGISTERS>();
        if (threadIdx.x != 0)
            return;
        tensor_map_prefetch(&q_map);
        tensor_map_prefetch(&k_map);
        tensor_map_prefetch(&v_map);
        int n = 0;
        for (int round = 0, index = cta; index < tiles;
             index = spec_tile_index(++round, cta, ctas)) {
            SpecTile tile = spec_tile(index, groups, groups * B, pairs_per_band, query_blocks,
                                      heads_per_block, block_queries);
            int kv_head = tile.first_head / group_size, top_block = top_block_of(tile);
            if (round > 0) /* both consumers are past the last tile's scores */
                mbarrier_wait(q_empty, (uint32_t)((round - 1) & 1));
            mbarrier_arrive_expect_bytes(q_full, (uint32_t)(CONSUMERS * Tiles::q_bytes));
            for (int c = 0; c < CONSUMERS; c++) {
                int head = tile.first_head + c % heads_per_block;
                int row0 = tile.query0 + c / heads_per_block * WARPGROUP_ROWS;
                tma_tile_load<HEAD_DIM, WARPGROUP_ROWS>(shared + Tiles::q + c * Tiles::q_bytes,
                                                        &q_map, head * HEAD_DIM, row0,
                                                        tile.batch, q_full);
            }
            for (int i = 0; i <= top_block; i++, n++) {
                int stage = n % SPEC_STAGES, key0 = (top_block - i) * SPEC_KEYS;
                if (n >= SPEC_STAGES) /* both consumers released block n - 2 */
                    mbarrier_wait(empty + stage, (uint32_t)((n / SPEC_STAGES - 1) & 1));
                unsigned char *k_tile = shared + Tiles::k_ring + stage * Tiles::kv_bytes;
                unsigned char *v_tile = shared + Tiles::v_ring + stage * Tiles::kv_bytes;
                mbarrier_arrive_expect_bytes(full_k + stage, (uint32_t)Tiles::kv_bytes);
                tma_tile_load<HEAD_DIM, SPEC_KEYS>(k_tile, &k_map, kv_head * HEAD_DIM, key0,
                                                   tile.batch, full_k + stage);
                mbarrier_arrive_expect_bytes(full_v + stage, (uint32_t)Tiles::kv_bytes);
                tma_tile_load<HEAD_DIM, SPEC_KEYS>(v_tile, &v_map, kv_head * HEAD_DIM, key0,
                                                   tile.batch, full_v + stage);
            }
        }
        return;
    }

    warpgroup_registers_claim<Shape::consumer_registers>();
    int consumer = role - 1, thread = (int)threadIdx.x - WARPGROUP_THREADS;
    int warp = (thread / 32) % 4, lane = thread % 32, g = lane / 4, c = lane % 4;
    const unsigned char *q_tile = shared + Tiles::q + consumer * Tiles::q_bytes;
    int my_turn = consumer == 0 ? BARRIER_TURN_FIRST : BARRIER_TURN_SECOND;
    int other_turn = consumer == 0 ? BARRIER_TURN_SECOND : BARRIER_TURN_FIRST;
    /* two consumers take turns issuing their products; one alone waits for nobody (the
     * other CTA on the multiprocessor fills its softmax's gaps) */
    auto take_turn = [&]() {
        if (CONSUMERS > 1)
            named_barrier_sync(my_turn, Shape::consumer_threads);
    };
    auto pass_turn = [&]() {
        if (CONSUMERS > 1)
            named_barrier_arrive(other_turn, Shape::consumer_threads);
    };
    if (CONSUMERS > 1 && consumer == 1) /* consumer 0 issues first */
        named_barrier_arrive(BARRIER_TURN_FIRST, Shape::consumer_threads);

    int n0 = 0; /* the CTA's key blocks before this tile's */
    for (int round = 0, index = cta; index < tiles;) {
        SpecTile tile = spec_tile(index, groups, groups * B, pairs_per_band, query_blocks,
                                  heads_per_block, block_queries);
        int next = spec_tile_index(round + 1, cta, ctas);
        const bool last_tile = next >= tiles;
        const int top_block = top_block_of(tile), blocks = top_block + 1;
        const int head = tile.first_head + consumer % heads_per_block;
        const int row0 = tile.query0 + consumer / heads_per_block * WARPGROUP_ROWS;
        const int query_row[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};

        float o[HEAD_DIM / 8][4];
#pragma unroll
        for (int t = 0; t < HEAD_DIM / 8; t++)
            o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
        float s[SPEC_KEYS / 8][4];
        uint32_t p[SPEC_KEYS / 16][4];
        float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

        auto stage_of = [&](int i) { return (n0 + i) % SPEC_STAGES; };
        auto parity_of = [&](int i) { return (uint32_t)(((n0 + i) / SPEC_STAGES) & 1); };
        auto issue_scores = [&](int i) {
            const unsigned char *k_tile = shared + Tiles::k_ring + stage_of(i) * Tiles::kv_bytes;
#pragma unroll
            for (int k0 = 0; k0 < HEAD_DIM; k0 += 16)
                warpgroup_mma_shared<SPEC_KEYS, 0, 0>(
                    s, swizzled_k_major<HEAD_DIM>(q_tile, WARPGROUP_ROWS, 0, k0),
                    swizzled_k_major<HEAD_DIM>(k_tile, SPEC_KEYS, 0, k0), k0 > 0);
        };
        auto issue_values = [&](int i) {
            const unsigned char *v_tile = shared + Tiles::v_ring + stage_of(i) * Tiles::kv_bytes;
#pragma unroll
            for (int j = 0; j < SPEC_KEYS / 16; j++)
                warpgroup_mma_registers<HEAD_DIM, 1>(
                    o, p[j], swizzled_mn_major<HEAD_DIM>(v_tile, SPEC_KEYS, j * 16), true);
        };
        /* masks the scores of block i where the key follows the row (keys at or past T,
         * zeros from TMA, are among them) */
        auto mask_scores = [&](int i) {
            int key0 = (top_block - i) * SPEC_KEYS;
            if (key0 + SPEC_KEYS - 1 <= row0)
                return;
#pragma unroll
            for (int t = 0; t < SPEC_KEYS / 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = key0 + t * 8 + 2 * c + (e & 1);
                    if (key > query_row[e >> 1])
                        s[t][e] = -INFINITY;
                }
        };
        auto pack_probabilities = [&]() {
#pragma unroll
            for (int j = 0; j < SPEC_KEYS / 16; j++)
                accumulators_to_operand(p[j], s[2 * j], s[2 * j + 1]);
        };
        auto release = [&](int i) {
            if (thread % WARPGROUP_THREADS == 0)
                mbarrier_arrive(empty + stage_of(i));
        };

        mbarrier_wait(q_full, (uint32_t)(round & 1));
        /* block 0: the diagonal */
        mbarrier_wait(full_k + stage_of(0), parity_of(0));
        take_turn();
        warpgroup_fence();
        issue_scores(0);
        warpgroup_commit();
        pass_turn();
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(s);
        float correction[2];
        mask_scores(0);
        online_softmax_block<SPEC_KEYS>(s, row_max, row_sum, correction, scale_log2);
        pack_probabilities();

        for (int i = 1; i < blocks; i++) {
            mbarrier_wait(full_k + stage_of(i), parity_of(i));
            mbarrier_wait(full_v + stage_of(i - 1), parity_of(i - 1));
            take_turn();
            warpgroup_fence();
            issue_scores(i);
            warpgroup_commit();
            issue_values(i - 1);
            warpgroup_commit();
            pass_turn();
            warpgroup_wait<1>(); /* the scores of block i, while P V of block i - 1 runs */
            warpgroup_fence_accumulators(s);
            mask_scores(i);
            online_softmax_block<SPEC_KEYS>(s, row_max, row_sum, correction, scale_log2);
            warpgroup_wait<0>();
            warpgroup_fence_accumulators(o);
            release(i - 1);
            if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
                for (int t = 0; t < HEAD_DIM / 8; t++) {
                    o[t][0] *= correction[0];
                    o[t][1] *= correction[0];
                    o[t][2] *= correction[1];
                    o[t][3] *= correction[1];
                }
            }
            pack_probabilities();
        }
        /* every score product of the tile is done: the producer may load the next Q */
        if (thread % WARPGROUP_THREADS == 0)
            mbarrier_arrive(q_empty);
        /* the last block's P V; after the CTA's last one, consumer 1 owes consumer 0 no
         * further turn */
        int last = blocks - 1;
        mbarrier_wait(full_v + stage_of(last), parity_of(last));
        take_turn();
        warpgroup_fence();
        issue_values(last);
        warpgroup_commit();
        if (consumer == 0 || !last_tile)
            pass_turn();
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(o);
        release(last);

        /* normalise, save lse = ln(sum exp(scaled score)) = ln 2 * (max + log2(sum)) */
        float *lse_base = lse + ((size_t)tile.batch * n_heads + head) * T;
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

        size_t q_stride = (size_t)n_heads * HEAD_DIM;
        __nv_bfloat16 *out_base =
            out + (size_t)tile.batch * T * q_stride + (size_t)head * HEAD_DIM;
        if (!last_tile) {
            /* the rings hold the next tile's blocks: straight from the registers */
            spec_store_accumulators<HEAD_DIM>(out_base, q_stride, o, query_row, T, lane);
        } else {
            /* through fp32 staging over the K, V rings, in 16-byte stores: every copy has
             * landed (each block was waited for) and both consumers are past their last
             * product */
            named_barrier_sync(BARRIER_CONSUMERS, Shape::consumer_threads);
            int warp_row0 = consumer * WARPGROUP_ROWS + warp * 16;
            float *stage = reinterpret_cast<float *>(shared + Tiles::k_ring) +
                           warp_row0 * (HEAD_DIM + STAGE_PAD);
            warp_stage_accumulators<HEAD_DIM>(stage, o, 1.0f, lane);
            __syncwarp();
            warp_store_staged<HEAD_DIM>(out_base, q_stride, stage, row0 + warp * 16, T, false,
                                        lane);
        }
        n0 += blocks;
        round++;
        index = next;
    }
}

/* ---- host ---- */

/* The CTAs of a persistent launch: as many as the multiprocessors hold at once, or fewer
 * where attention_forward_specialised_limit_ctas asked (tests: several tiles a CTA at small
 * shapes; the bands then follow the rounds alone, whatever the L2 holds, so that the tests
 * see bands at shapes whose K, V fit in it). */
static int persistent_cta_limit;

extern "C" void attention_forward_specialised_limit_ctas(int ctas)
{
    persistent_cta_limit = ctas;
}

template <int HEAD_DIM, int CONSUMERS>
static void specialised_launch(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                               const __nv_bfloat16 *k, const __nv_bfloat16 *v, int B, int T,
                               int n_heads, int n_kv_heads, bool persistent,
                               cudaStream_t stream)
{
    using Shape = SpecShape<CONSUMERS>;
    constexpr size_t shared_bytes = SpecTiles<HEAD_DIM, CONSUMERS>::bytes;
    static bool configured; /* over 48 KiB of shared memory must be asked for, once */
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attention_forward_specialised_kernel<HEAD_DIM, CONSUMERS>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
        configured = true;
    }
    /* two heads of a KV group share a CTA's K, V tiles where there are two consumers */
    int heads_per_block = CONSUMERS == 2 && (n_heads / n_kv_heads) % 2 == 0 ? 2 : 1;
    int block_queries = Shape::rows / heads_per_block;
    const char *op = "attention_forward_cuda";
    const int query_blocks = (T + block_queries - 1) / block_queries;
    const long long pairs = (long long)(n_heads / heads_per_block) * B;
    if (pairs * query_blocks > INT_MAX)
        fatal(EXIT_CONFIG, "%s: B = %d, T = %d make more tiles than the launch grid allows",
              op, B, T);
    long long ctas = pairs * query_blocks; /* one a tile */
    if (persistent) {
        const int resident = cuda_multiprocessor_count() * Shape::blocks_per_multiprocessor;
        ctas = min(ctas, (long long)resident);
        if (persistent_cta_limit > 0)
            ctas = min(ctas, (long long)persistent_cta_limit);
    }
    /* bands of at least 8 rounds of the launch's CTAs (spec_tile): counted on the tile
     * lengths of the 1B, 8B and head_dim 64 shapes, the rounds then give the CTAs loads
     * within 3% of one another. One CTA a tile: one band, the whole launch heaviest first.
     * Where the launch's K, V fit in half the L2, bands have nothing to keep there and cost
     * the rounds' balance: one band (head_dim 64, B2 T4096: 16.8 MB, 0.376 ms in bands,
     * 0.362 as one; docs/performance.md, eleventh run). */
    const double kv_bytes = 2.0 * B * T * n_kv_heads * HEAD_DIM * sizeof(__nv_bfloat16);
    const bool kv_in_l2 = persistent_cta_limit == 0 && kv_bytes <= 0.5 * cuda_l2_bytes();
    const int pairs_per_band =
        kv_in_l2 ? (int)pairs : band_pairs_for((int)pairs, query_blocks, ctas, SPEC_BAND_ROUNDS);
    CUtensorMap q_map = tensor_map_rows<HEAD_DIM>(op, q, B, T, n_heads, WARPGROUP_ROWS);
    CUtensorMap k_map = tensor_map_rows<HEAD_DIM>(op, k, B, T, n_kv_heads, SPEC_KEYS);
    CUtensorMap v_map = tensor_map_rows<HEAD_DIM>(op, v, B, T, n_kv_heads, SPEC_KEYS);
    float scale_log2 = LOG2_E / sqrtf((float)HEAD_DIM);
    attention_forward_specialised_kernel<HEAD_DIM, CONSUMERS>
        <<<(unsigned)ctas, Shape::threads, shared_bytes, stream>>>(
            q_map, k_map, v_map, out, lse, B, T, n_heads, n_kv_heads, heads_per_block,
            pairs_per_band, scale_log2);
    CUDA_CHECK_LAUNCH();
}

template <int CONSUMERS>
static void specialised_launch_head_dim(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                        const bf16 *v, int B, int T, int n_heads,
                                        int n_kv_heads, int head_dim, bool persistent,
                                        cudaStream_t stream)
{
    __nv_bfloat16 *out_bf16 = reinterpret_cast<__nv_bfloat16 *>(out);
    const __nv_bfloat16 *q_bf16 = reinterpret_cast<const __nv_bfloat16 *>(q);
    const __nv_bfloat16 *k_bf16 = reinterpret_cast<const __nv_bfloat16 *>(k);
    const __nv_bfloat16 *v_bf16 = reinterpret_cast<const __nv_bfloat16 *>(v);
    switch (head_dim) {
    case 64:
        specialised_launch<64, CONSUMERS>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads,
                                          n_kv_heads, persistent, stream);
        break;
    case 80:
        specialised_launch<80, CONSUMERS>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads,
                                          n_kv_heads, persistent, stream);
        break;
    default:
        specialised_launch<128, CONSUMERS>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T,
                                           n_heads, n_kv_heads, persistent, stream);
        break;
    }
}

/* Shapes checked by attention_forward_cuda. */
extern "C" void attention_forward_specialised_launch(bf16 *out, float *lse, const bf16 *q,
                                                     const bf16 *k, const bf16 *v, int B, int T,
                                                     int n_heads, int n_kv_heads, int head_dim,
                                                     int consumers, bool persistent,
                                                     cudaStream_t stream)
{
    if (consumers == 1)
        specialised_launch_head_dim<1>(out, lse, q, k, v, B, T, n_heads, n_kv_heads, head_dim,
                                       persistent, stream);
    else
        specialised_launch_head_dim<2>(out, lse, q, k, v, B, T, n_heads, n_kv_heads, head_dim,
                                       persistent, stream);
}
