/* kernels/cuda/route_block_one_pass_cuda.cu — phase one's backward in one pass over the
 * block's rows, where each warp's dots are one whole head (contract: route_block_cuda.h; the
 * math is route_block_backward_cuda.cu's, whose walker and dots this kernel does together).
 *
 * Why. The two-pass backward reads the N sources and the G rows of d x twice: once for the
 * dots (then the coefficients), once in the channel walker that adds the source gradients:
 * (4N + 2G) rows a token, against (3N + G) for one pass. The walker splits the channels
 * because a block a token cannot hold every site's q*g and S for the whole row in its
 * threads' registers (G x d floats each). On tensor cores it need not: per token and head,
 *   ds_n [N x head_dim] = C [N x 2G] . [d x_i ; q_i g_i] [2G x head_dim] - e_n s_n
 *   S^T  [head_dim x G] += s^T [head_dim x N] . K [N x G]
 * with C's columns a scale_i (value) and r dz (key) and K = r dz: the token's coefficients,
 * which the warp that made the head's dots holds in the mma's fragment layout already
 * (route_block_dots.cuh). S^T lives in mma accumulators: head_dim x G / 32 floats a lane
 * (40 at head_dim 160). Only e_n sums over every head: the warps' shares meet in shared
 * memory behind one barrier a token (the shares double-buffered by the token's parity).
 *
 * Layout. A block a token (persistent grid), a warp a head (the split layout's 16, 20 or 24
 * vectors a warp: block_dots_fused, head_dim 128 to 192), H <= 8 warps. The token's rows
 * are staged compactly, d / 8 vectors a row (the dots kernel pads each warp to 32 slots),
 * swizzled as route_block_mma.cuh swizzles them inside aligned groups of 8 (d / 8 a
 * multiple of 8):
 * vector v of row r at r * d/8 + (v ^ (r & 7)). Every lane reads only its own warp's
 * vectors, so only the e_n shares need the whole block. Stages: the sources and d x of
 * token t + 1 in flight while t is worked on; the source gradients (read where they are
 * added into) of token t + 1 issued once t's are spent, landing behind t + 1's dots; q g as
 * bf16 hi and lo rows, made once a block.
 *
 * Per token and warp (head h): the dots D, P (A = sources, B = d x and q g hi, lo: the
 * dots kernel's three chains); the coefficients (block_dots_lane_coefficients); the shares
 * into shared memory, the barrier, e_n of the lane's two sources (the shares in head order:
 * the self-sum kernel's bits). Then per pair of 8-channel tiles: B = [d x_i ; (q g)_i hi] by
 * ldmatrix.trans, D = C_hi B + C_lo B + K_hi (q g)_lo (m16n8k16 twice, m16n8k8 once), plus
 * the gradient as read, less e_n s_n, rounded once and stored a quad's 32 bytes a row
 * (block_mma_store_quad); and S^T += s^T K_hi + s^T K_lo. At the end, the block's S and its
 * dalpha terms for route_block_reduce, as the fused dots leave theirs.
 *
 * How fast should this be. Per token it reads N + G rows and the N gradients it adds into,
 * and writes N: (3N + G) rows. At the 1B step's N 9, G 8, d 1280: 35 rows of 2.5 KB a
 * token, 734 MB a launch of 8192 tokens, 260 us at 2.8 TB/s, where the walker took 294 us
 * and the dots 165 (H100, 2026-12-07). Its tensor-core work is about 110 mma a warp a token.
 * Measured (docs/performance.md, 2026-12-07, "(late night)"): 421 us at N 7-9 against the
 * two passes' 475, DRAM 63% busy at N 5-6: bound by what it issues (0.47 instructions a
 * cycle a scheduler, 8 warps a multiprocessor at 230 registers), and slower than the two
 * passes below 5 sources, where it does not run (ONE_PASS_MIN_SOURCES).
 * Deterministic: each token is one block's, each sum in a fixed order; S and dalpha follow
 * the persistent grid, which is the blocks 132 multiprocessors hold (shapes only, as the
 * fused dots' grid).
 */
#include "kernels/cuda/route_block_dots.cuh"
#include "kernels/cuda/route_block_mma.cuh"
#include "runtime/error.h"

#include <string.h>

/* A warp a head, at most 8 heads: 256 threads, so that a thread may hold 255 registers
 * (S^T's accumulators and q g's fragments for the dots stay in registers a whole launch).
 * From 5 sources on: a token's products are the head's whole tiles of 16 sources whatever
 * N, and below 5 they cost more than the second reading of the rows saves (the 1B MHAR
 * step on an H100, 2026-12-07: 272 and 286 us a launch at N <= 2 and 3-4 against the two
 * passes' 189 and 255; 304 and 421 at N 5-6 and 7-9 against 338 and 475). */
enum { ONE_PASS_MAX_THREADS = 256, ONE_PASS_MIN_SOURCES = 5 };

struct OnePassArgs {
    BlockDotsArgs dots; /* sources, d x, weights, rstd, q, g, alpha, centres, dalpha terms */
    bf16 *dsources[CUDA_BLOCK_MAX_SOURCES];
    const bf16 *dsources_read[CUDA_BLOCK_MAX_SOURCES]; /* NULL: written, or not wanted */
    float *partials; /* S: [G][blocks][d] */
    int d;
};

/* Shared memory, in bytes from the (16-byte aligned) start. */
struct OnePassShared {
    size_t sources, douts, grads, key_high, key_low, zero, shares, key_table, total;
};

static OnePassShared one_pass_shared(int n_sources, int n_sites, int d, int heads)
{
    const size_t row = (size_t)d / 8 * 16;
    OnePassShared s;
    s.sources = 0;
    s.douts = s.sources + 2 * n_sources * row;
    s.grads = s.douts + 2 * n_sites * row;
    s.key_high = s.grads + n_sources * row;
    s.key_low = s.key_high + n_sites * row;
    s.zero = s.key_low + n_sites * row;
    s.shares = s.zero + 16;
    s.key_table = s.shares + ((size_t)2 * n_sources * heads * 4 + 15) / 16 * 16;
    s.total = s.key_table + (size_t)heads * 16 * 8 * 4;
    return s;
}

/* The staged slot of vector v of row r (rows of `vectors` slots) */
__device__ __forceinline__ int one_pass_slot(int r, int v, int vectors)
{
    return r * vectors + (v ^ (r & 7));
}

/* Starts the copies of this lane's vector of each of `count` rows of token t into its slots
 * (nothing past the tokens or for a lane without a vector; rows whose pointer is NULL are
 * skipped). The caller commits: the sources and d x of a token travel as one group. */
template <int UNROLL>
__device__ __forceinline__ void one_pass_fetch(BfVector<8> *to, const bf16 *const *rows,
                                               int count, long long t, int tokens, int vectors,
                                               int vector)
{
    if (t < tokens && vector >= 0) {
#pragma unroll
        for (int r = 0; r < UNROLL; r++)
            if (r < count && rows[r])
                copy_vector_async<8>(to + one_pass_slot(r, vector, vectors), rows[r],
                                     t * vectors + vector);
    }
}

__device__ __forceinline__ void one_pass_mma_k8(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ void one_pass_ldmatrix_x2_trans(uint32_t (&r)[2], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"((unsigned)__cvta_generic_to_shared(row)));
}

/* Two channels (bytes 4c .. 4c + 3 of a staged vector) as floats */
__device__ __forceinline__ float2 one_pass_pair(const BfVector<8> *slot, int c)
{
    const unsigned bits = reinterpret_cast<const unsigned *>(slot)[c];
    return make_float2(bf16_bits_to_float(bits & 0xffffu), bf16_bits_to_float(bits >> 16));
}

/* q g of the warp's vectors as bf16 hi and lo rows [G][vectors] (swizzled), once a block */
__device__ __forceinline__ void one_pass_key_rows(BfVector<8> *high, BfVector<8> *low,
                                                  const BlockDotsArgs &args, int vectors,
                                                  int vector)
{
    if (vector < 0)
        return;
    for (int i = 0; i < args.n_sites; i++) {
        float w[8];
        block_key_weight_load(args.query[i], args.key_norm[i], vector, true, w);
        BfVector<8> hi, lo;
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            uint32_t h, l;
            block_mma_split(w[k], w[k + 1], &h, &l);
            memcpy(&hi.bits[k], &h, 4);
            memcpy(&lo.bits[k], &l, 4);
        }
        high[one_pass_slot(i, vector, vectors)] = hi;
        low[one_pass_slot(i, vector, vectors)] = lo;
    }
}

template <int MAXN, int K_STEPS>
__global__ void __launch_bounds__(ONE_PASS_MAX_THREADS, 1)
    route_block_one_pass_kernel(const __grid_constant__ OnePassArgs args, OnePassShared place)
{
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    const BlockDotsArgs &dots = args.dots;
    BfVector<8> *sources = reinterpret_cast<BfVector<8> *>(shared_bytes + place.sources);
    BfVector<8> *douts = reinterpret_cast<BfVector<8> *>(shared_bytes + place.douts);
    BfVector<8> *grads = reinterpret_cast<BfVector<8> *>(shared_bytes + place.grads);
    BfVector<8> *key_high = reinterpret_cast<BfVector<8> *>(shared_bytes + place.key_high);
    BfVector<8> *key_low = reinterpret_cast<BfVector<8> *>(shared_bytes + place.key_low);
    BfVector<8> *zero = reinterpret_cast<BfVector<8> *>(shared_bytes + place.zero);
    float *shares = reinterpret_cast<float *>(shared_bytes + place.shares);
    const int N = dots.n_sources, G = dots.n_sites, H = dots.heads, tokens = dots.tokens;
    const int V = args.d / 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int first_vector = warp * 2 * K_STEPS; /* the warp's head */
    const int vector = lane < 2 * K_STEPS ? first_vector + lane : -1;
    float *key_table = reinterpret_cast<float *>(shared_bytes + place.key_table) + warp * 128;
    const size_t source_stage = (size_t)N * V, dout_stage = (size_t)G * V;

    one_pass_fetch<MAXN>(sources, dots.sources, N, blockIdx.x, tokens, V, vector);
    one_pass_fetch<CUDA_BLOCK_MAX_SITES>(douts, dots.douts, G, blockIdx.x, tokens, V, vector);
    copy_async_commit();
    one_pass_fetch<MAXN>(grads, args.dsources_read, N, blockIdx.x, tokens, V, vector);
    copy_async_commit();
    uint32_t key_weights[K_STEPS][4];
    block_mma_key_weights<K_STEPS>(key_weights, dots.query, dots.key_norm, G);
    one_pass_key_rows(key_high, key_low, dots, V, vector);
    if (threadIdx.x == 0)
        *zero = vector_zero<8>();
    __syncthreads();

    float scale[2] = {1.0f, 1.0f}, alpha_sums[2] = {0.0f, 0.0f};
    for (int b = 0; b < 2; b++)
        if (2 * c + b < G && dots.alpha[2 * c + b])
            scale[b] = *dots.alpha[2 * c + b];
    float channel_sums[K_STEPS][4]; /* S^T: m-tile k = channels 16k .. of the head */
#pragma unroll
    for (int k = 0; k < K_STEPS; k++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            channel_sums[k][e] = 0.0f;

    /* the rows this lane stores, sources g and g + 8 (ROWS of them: one where MAXN <= 8),
     * and whether it adds into them */
    constexpr int ROWS = MAXN > 8 ? 2 : 1;
    bf16 *store[2];
    bool added[2];
    int row[2]; /* the staged row it reads: its own, or the last source's past N */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int n = g + 8 * r;
        store[r] = n < N ? block_site_pointer(args.dsources, n) : NULL;
        added[r] = n < N && block_site_pointer(args.dsources_read, n) != NULL;
        row[r] = n < N ? n : N - 1;
    }

    /* a token's saved weights, rstd and centres travel a token ahead */
    DotsLaneInputs inputs = block_dots_lane_inputs(dots, blockIdx.x, warp, g, c);
    int half = 0;
    for (long long t = blockIdx.x; t < tokens; t += gridDim.x, half ^= 1) {
        const DotsLaneInputs next_inputs = t + gridDim.x < tokens
                                               ? block_dots_lane_inputs(dots, t + gridDim.x,
                                                                        warp, g, c)
                                               : inputs;
        BfVector<8> *token_sources = sources + half * source_stage;
        BfVector<8> *token_douts = douts + half * dout_stage;
        one_pass_fetch<MAXN>(sources + (half ^ 1) * source_stage, dots.sources, N,
                             t + gridDim.x, tokens, V, vector);
        one_pass_fetch<CUDA_BLOCK_MAX_SITES>(douts + (half ^ 1) * dout_stage, dots.douts, G,
                                             t + gridDim.x, tokens, V, vector);
        copy_async_commit();
        /* groups in flight: this token's rows, its gradients, the next token's rows */
        copy_async_wait<2>(); /* this token's sources and d x (its gradients may still fly) */
        __syncwarp();

        /* the dots, as the dots kernel makes them */
        float value[4] = {0, 0, 0, 0}, key_high_dots[4] = {0, 0, 0, 0};
        float key_low_dots[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < K_STEPS; s++) {
            const int matrix = lane >> 3, r = (lane & 7) + 8 * (matrix & 1);
            const int v = first_vector + 2 * s + (matrix >> 1);
            uint32_t a[4], b[4];
            block_ldmatrix_x4(a, r < N ? token_sources + one_pass_slot(r, v, V) : zero);
            block_ldmatrix_x4(b, r < G ? token_douts + one_pass_slot(r, v, V) : zero);
            block_mma(value, a, b[0], b[2]);
            block_mma(key_high_dots, a, key_weights[s][0], key_weights[s][1]);
            block_mma(key_low_dots, a, key_weights[s][2], key_weights[s][3]);
        }
        float key[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            key[e] = key_high_dots[e] + key_low_dots[e];
        const DotsLaneCoefficients coefficients =
            block_dots_lane_coefficients(dots, value, key, inputs, scale, alpha_sums);

        /* e_n: the heads' shares meet */
        float *token_shares = shares + half * N * H;
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (c == 0 && g + 8 * r < N)
                token_shares[(g + 8 * r) * H + warp] = coefficients.self_share[r];
#pragma unroll
        for (int e = 0; e < 4; e++) /* K^T's fragment order is not C's: through shared */
            key_table[(g + 8 * (e >> 1)) * 8 + 2 * c + (e & 1)] = coefficients.key[e];
        __syncthreads();
        float self[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int n = g + 8 * r;
            self[r] = 0.0f;
            if (n < N) { /* in head order: the self-sum kernel's bits */
                self[r] = token_shares[n * H];
                for (int h = 1; h < H; h++)
                    self[r] += token_shares[n * H + h];
            }
        }
        /* C = [value | key] (rows: sources g, g + 8; columns 2c, 2c + 1 and 8 on) */
        uint32_t c_high[4], c_low[4];
        block_mma_split(coefficients.value[0], coefficients.value[1], &c_high[0], &c_low[0]);
        block_mma_split(coefficients.value[2], coefficients.value[3], &c_high[1], &c_low[1]);
        block_mma_split(coefficients.key[0], coefficients.key[1], &c_high[2], &c_low[2]);
        block_mma_split(coefficients.key[2], coefficients.key[3], &c_high[3], &c_low[3]);
        /* K as B: rows (sources) 2c, 2c + 1 and 2c + 8, 2c + 9 of column (site) g */
        uint32_t k_high[2], k_low[2];
        block_mma_split(key_table[2 * c * 8 + g], key_table[(2 * c + 1) * 8 + g], &k_high[0],
                        &k_low[0]);
        block_mma_split(key_table[(2 * c + 8) * 8 + g], key_table[(2 * c + 9) * 8 + g],
                        &k_high[1], &k_low[1]);
        copy_async_wait<1>(); /* this token's gradients too */
        __syncwarp();

#pragma unroll
        for (int j = 0; j < 2 * K_STEPS; j += 2) { /* tiles j, j + 1: m-tile j / 2 of S^T */
            const int matrix = lane >> 3, r = lane & 7;
            const int v = first_vector + j + (matrix >> 1);
            uint32_t b[4], low[2];
            /* [d x ; q g hi] at tiles j (b[0], b[1]) and j + 1 (b[2], b[3]) */
            const BfVector<8> *row_b = r >= G ? zero
                                       : (matrix & 1)
                                           ? key_high + one_pass_slot(r, v, V)
                                           : token_douts + one_pass_slot(r, v, V);
            block_ldmatrix_x4_trans(b, row_b);
            one_pass_ldmatrix_x2_trans(
                low, r < G ? key_low + one_pass_slot(r, first_vector + j + (matrix & 1), V)
                           : zero);
            float tiles[2][4];
#pragma unroll
            for (int u = 0; u < 2; u++) {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    tiles[u][e] = 0.0f;
                block_mma(tiles[u], c_high, b[2 * u], b[2 * u + 1]);
                block_mma(tiles[u], c_low, b[2 * u], b[2 * u + 1]);
                one_pass_mma_k8(tiles[u], c_high[2], c_high[3], low[u]);
            }
            /* + the gradient as read, - e_n s_n; stored a quad's row at a time */
#pragma unroll
            for (int q = 0; q < ROWS; q++) {
                uint32_t packed[2];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    /* loaded without a branch from a row that exists (self is 0 past N), the
                     * gradient selected away where it is not added into */
                    const int slot = one_pass_slot(row[q], first_vector + j + u, V);
                    const float2 x = one_pass_pair(token_sources + slot, c);
                    float2 grad = one_pass_pair(grads + slot, c);
                    grad.x = added[q] ? grad.x : 0.0f;
                    grad.y = added[q] ? grad.y : 0.0f;
                    const float low_sum = tiles[u][2 * q] + grad.x - self[q] * x.x;
                    const float high_sum = tiles[u][2 * q + 1] + grad.y - self[q] * x.y;
                    packed[u] = block_mma_pack(low_sum, high_sum);
                }
                block_mma_store_quad(
                    store[q] ? reinterpret_cast<uint32_t *>(store[q] + t * args.d +
                                                            (long long)(first_vector + j) * 8)
                             : NULL,
                    packed[0], packed[1], store[q] != NULL, lane);
            }
            /* S^T += s^T K: A = the sources' tiles j, j + 1 transposed (sources 0-7 alone,
             * K 8, where MAXN <= 8) */
            const int source = (lane & 7) + 8 * (matrix >> 1);
            const BfVector<8> *row_a =
                source < N ? token_sources + one_pass_slot(source, first_vector + j +
                                                                       (matrix & 1), V)
                           : zero;
            if constexpr (ROWS == 2) {
                uint32_t a[4];
                block_ldmatrix_x4_trans(a, row_a);
                block_mma(channel_sums[j / 2], a, k_high[0], k_high[1]);
                block_mma(channel_sums[j / 2], a, k_low[0], k_low[1]);
            } else {
                uint32_t a[2];
                one_pass_ldmatrix_x2_trans(a, row_a);
                one_pass_mma_k8(channel_sums[j / 2], a[0], a[1], k_high[0]);
                one_pass_mma_k8(channel_sums[j / 2], a[0], a[1], k_low[0]);
            }
        }
        __syncwarp(); /* this token's gradients are read: the next token's may come */
        one_pass_fetch<MAXN>(grads, args.dsources_read, N, t + gridDim.x, tokens, V, vector);
        copy_async_commit();
        inputs = next_inputs;
    }
    copy_async_wait<0>();
    /* S^T's fragments: channel 16k + g (+ 8 for e >= 2) of the head, site 2c + e % 2 */
#pragma unroll
    for (int k = 0; k < K_STEPS; k++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 2 * c + (e & 1);
            const int channel = first_vector * 8 + 16 * k + g + 8 * (e >> 1);
            if (i < G)
                args.partials[((long long)i * gridDim.x + blockIdx.x) * args.d + channel] =
                    channel_sums[k][e];
        }
    for (int b = 0; b < 2; b++) /* [G][blocks][H]: this block's, head `warp`'s */
        if (g == 0 && 2 * c + b < G)
            dots.alpha_terms[((long long)(2 * c + b) * gridDim.x + blockIdx.x) * H + warp] =
                alpha_sums[b];
}

/* ---- the launch ---- */

/* FATHOM_ROUTE_BLOCK_BACKWARD, read once: one_pass (or unset) or two_pass */
static bool one_pass_allowed(void)
{
    static int allowed = -1;
    if (allowed < 0) {
        static const char *const names[] = {"one_pass", "two_pass"};
        allowed = env_choice("FATHOM_ROUTE_BLOCK_BACKWARD", names, 2) == 0;
    }
    return allowed;
}

bool route_block_one_pass_takes(const BlockHeads &layout, int n_sources, int n_sites, int d,
                                int heads)
{
    /* heads of 32 vectors a warp (head_dim 256) would hold 64 accumulators of S a lane, and
     * spill: they keep the two passes */
    return one_pass_allowed() && n_sources >= ONE_PASS_MIN_SOURCES &&
           block_dots_fused(layout) && layout.warp_vectors < 32 &&
           layout.vectors * 8 == d &&
           layout.threads == heads * 32 && heads * 32 <= ONE_PASS_MAX_THREADS &&
           (d / 8) % 8 == 0 &&
           one_pass_shared(n_sources, n_sites, d, heads).total <= BLOCK_SHARED_LIMIT;
}

template <int MAXN, int K_STEPS>
static int one_pass_blocks_of(int threads, size_t bytes, long long tokens)
{
    return block_persistent_grid<route_block_one_pass_kernel<MAXN, K_STEPS>>(
        threads, bytes, tokens, "the cuda block route backward (one pass)", true);
}

template <int MAXN, int K_STEPS>
static int one_pass_launch(const OnePassArgs &args, const OnePassShared &place,
                           cudaStream_t stream, bool launch)
{
    const int threads = args.dots.heads * 32;
    const int blocks = one_pass_blocks_of<MAXN, K_STEPS>(threads, place.total, args.dots.tokens);
    if (launch) {
        route_block_one_pass_kernel<MAXN, K_STEPS>
            <<<blocks, threads, place.total, stream>>>(args, place);
        CUDA_CHECK_LAUNCH();
    }
    return blocks;
}

template <int MAXN>
static int one_pass_dispatch(const OnePassArgs &args, const OnePassShared &place,
                             cudaStream_t stream, bool launch)
{
    switch (args.dots.layout.k_steps) { /* the split layout's: route_block_device.cuh */
    case 8: return one_pass_launch<MAXN, 8>(args, place, stream, launch);
    case 10: return one_pass_launch<MAXN, 10>(args, place, stream, launch);
    default: return one_pass_launch<MAXN, 12>(args, place, stream, launch);
    }
}

/* The launch, or only its block count (launch false: for the workspace's size). */
static int one_pass_run(const OnePassArgs &args, cudaStream_t stream, bool launch)
{
    const OnePassShared place = one_pass_shared(args.dots.n_sources, args.dots.n_sites,
                                                args.d, args.dots.heads);
    const int N = args.dots.n_sources; /* at least ONE_PASS_MIN_SOURCES */
    if (N <= 6)
        return one_pass_dispatch<6>(args, place, stream, launch);
    if (N <= 9)
        return one_pass_dispatch<9>(args, place, stream, launch);
    return one_pass_dispatch<CUDA_BLOCK_MAX_SOURCES>(args, place, stream, launch);
}

int route_block_one_pass_blocks(const BlockHeads &layout, int n_sources, int n_sites,
                                int tokens, int d, int heads)
{
    OnePassArgs args = {};
    args.dots.layout = layout;
    args.dots.n_sources = n_sources;
    args.dots.n_sites = n_sites;
    args.dots.tokens = tokens;
    args.dots.heads = heads;
    args.d = d;
    return one_pass_run(args, 0, false);
}

int route_block_one_pass(const BlockDotsArgs &dots, bf16 *const *dsources,
                         unsigned dsources_written, float *partials, int d,
                         cudaStream_t stream)
{
    OnePassArgs args = {};
    args.dots = dots;
    for (int n = 0; n < dots.n_sources; n++) {
        args.dsources[n] = dsources[n];
        args.dsources_read[n] = dsources_written >> n & 1u ? NULL : dsources[n];
    }
    args.partials = partials;
    args.d = d;
    return one_pass_run(args, stream, true);
}
