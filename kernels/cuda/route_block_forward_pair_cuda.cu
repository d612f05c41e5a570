/* kernels/cuda/route_block_forward_pair_cuda.cu — phase one of the two-phase Route, forward,
 * on tensor cores two tokens at a time (contract: route_block_cuda.h; the steps and the math
 * are route_block_forward_cuda.cu's tensor-core kernel, whose outputs these are, within the
 * rounding of fp32 sums taken in another order).
 *
 * Why two. The one-token kernel pads its mma.m16n8k16 products to 16 rows: N <= 9 sources
 * in the dots and G <= 8 sites in the mix, so at the training step's N 2-5 and G 4 most rows
 * are zero, and every token pays the per-token costs alone (a barrier, the softmax, the
 * loop of the mix); measured, it took 230 us a launch at N 4, G 4 and 4096 tokens where its
 * 268 MB of rows take 77 us (docs/performance.md, seventh run). Here rows 0-7 of every
 * product are token a's and rows 8-15 token b's:
 *   dots   A = [a's sources; b's sources] (8 rows each, zero rows past N), B = q*g: D rows
 *          0-7 are a's dots, 8-15 b's; the Gram products against A's two halves give a's
 *          squares (rows 0-7 against 0-7) and b's (8-15 against 8-15);
 *   mix    A = diag(W_a, W_b) (sites x sources, each in hi and lo bf16 halves), B = the
 *          tile's rows [a's sources; b's sources]: D rows 0-7 are a's results, 8-15 b's.
 * So the two tokens take the mma, ldmatrix and loop instructions one token took, and one
 * barrier. N <= 6 (ROUTE_BLOCK_PAIR_MAX_SOURCES): four token buffers (the pair being read,
 * the next pair in flight) of N rows fit 227 KB of shared memory at d 4096.
 * A block takes tokens t and t + grid as a pair, then t + 2 grid and t + 3 grid, ...; a pair
 * whose second token lies past the end computes it from whatever its buffer holds and
 * writes nothing of it.
 */
#include "kernels/cuda/route_block_forward.cuh"

#include "runtime/error.h"

enum { PAIR_BUFFERS = 4 };

/* Shared memory, in bytes: rows [4][N][threads] x 16, then per buffer b (pair parity x 2 +
 * token) the square parts [MAXN][warps] and dot parts [parts][G][N] floats, then each warp's
 * softmax weights for both tokens [warps][2][G][N][stride], the sites' output pointers
 * [CUDA_BLOCK_MAX_SITES], and the zero row: 32 zero vectors, so that a lane whose row is past
 * the sources reads zeros at every offset a row's 32 vectors take (pair_lane_offsets). */
struct PairLayout {
    size_t squares, dots, coefficients, sites, zero, total;
    size_t square_buffer, dot_buffer, warp_coefficients; /* floats */
};

static PairLayout pair_layout(const BlockForwardArgs &args, int threads)
{
    const int warps = threads / 32, N = args.n_sources, G = args.n_sites;
    PairLayout layout;
    layout.square_buffer = (size_t)CUDA_BLOCK_MAX_SOURCES * warps;
    layout.dot_buffer = (size_t)G * N * args.layout.parts;
    layout.warp_coefficients = (size_t)2 * G * N * args.warp_heads_max;
    layout.squares = (size_t)PAIR_BUFFERS * N * threads * 16;
    layout.dots = layout.squares + round_up_16(PAIR_BUFFERS * layout.square_buffer * 4);
    layout.coefficients = layout.dots + round_up_16(PAIR_BUFFERS * layout.dot_buffer * 4);
    layout.sites = layout.coefficients + round_up_16(warps * layout.warp_coefficients * 4);
    layout.zero = layout.sites + CUDA_BLOCK_MAX_SITES * sizeof(BlockSitePointers);
    layout.total = layout.zero + 32 * 16;
    return layout;
}

/* The lane's part of an x4 ldmatrix over the pair's rows: matrices 0 and 2 (rows 0-7) from
 * token a's buffer, 1 and 3 (rows 8-15) from token b's, at vectors v (matrices 0, 1) and
 * v + 1 (2, 3) of the warp's 32 slots, v even. Lane (matrix, r) = (lane / 8, lane % 8) reads
 * row r of its token at vector v + matrix / 2, whose swizzled slot (route_block_mma.cuh) lies
 * (v + matrix / 2) ^ r vectors past the row's first: with v even, (v | matrix / 2) ^ r, and
 * for v = 8 k + 2 e, 8 k + ((2 e + matrix / 2) ^ r). So the dots' k-steps take four byte
 * offsets a lane (e 0-3), made once, and an immediate 128 k; the mix's step one LOP3. (Made
 * per k-step from the lane index, the addresses took some 300 integer instructions a pair,
 * 2026-12-05.) */
__device__ __forceinline__ void pair_lane_offsets(unsigned (&offsets)[4], int lane_half,
                                                  int lane_row)
{
#pragma unroll
    for (int e = 0; e < 4; e++)
        offsets[e] = 16u * (unsigned)((2 * e + lane_half) ^ lane_row);
}

/* The shared address of the first of the warp's 32 slots in the lane's row: token a's
 * (rows_a) or b's, or the zero row where the row is at or past n_a (a's) or n_b (b's: 0 for a
 * pair without a second token, whose buffer holds stale rows or none), so that no NaN of an
 * unwritten buffer meets a zero weight in a product. */
__device__ __forceinline__ unsigned pair_row_base(unsigned rows_a, unsigned rows_b,
                                                  unsigned zero, int n_a, int n_b,
                                                  int first_slot)
{
    const int lane = threadIdx.x & 31, r = lane & 7;
    const bool second = (lane >> 3) & 1;
    return r < (second ? n_b : n_a)
               ? (second ? rows_b : rows_a) + 16u * (unsigned)(r * blockDim.x + first_slot)
               : zero;
}

/* The A fragment of one token's weights in hi and lo halves: row g's sources 2c and 2c + 1
 * (the token's 8 columns of the 16; the other token's 8 are zero there). */
__device__ __forceinline__ void pair_weight_halves(const float *coefficients, int g, int c,
                                                   int N, int G, int stride, uint32_t *high,
                                                   uint32_t *low)
{
    float w[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int n = 2 * c + e;
        w[e] = g < G && n < N ? coefficients[((size_t)g * N + n) * stride] : 0.0f;
    }
    block_mma_split(w[0], w[1], high, low);
}

/* One step of the mix: tiles j, j + 1 (b) against diag(W_a, W_b) in hi and lo halves, rows
 * 0-7 (token a's site g, channels 2c, 2c + 1 of each tile) to result_a, rows 8-15 to
 * result_b (each the site's row at tile j's channel 0), a quad's 32 bytes a row at once
 * (block_mma_store_quad: st.global, where a pointer read from shared memory, the sites'
 * table, would make a generic store). */
__device__ __forceinline__ void pair_mix_store(const uint32_t (&b)[4],
                                               const uint32_t (&weights_high)[4],
                                               const uint32_t (&weights_low)[4],
                                               unsigned *result_a, unsigned *result_b,
                                               bool write_a, bool write_b, int lane)
{
    float tiles[2][4];
    block_mma_mix_step(tiles, weights_high, weights_low, b);
    block_mma_store_quad(result_a, block_mma_pack(tiles[0][0], tiles[0][1]),
                         block_mma_pack(tiles[1][0], tiles[1][1]), write_a, lane);
    block_mma_store_quad(result_b, block_mma_pack(tiles[0][2], tiles[0][3]),
                         block_mma_pack(tiles[1][2], tiles[1][3]), write_b, lane);
}

template <int MAXN, int K_STEPS>
__global__ void __launch_bounds__(BLOCK_MAX_THREADS, 1)
    route_block_forward_pair_kernel(const __grid_constant__ BlockForwardArgs args,
                                    PairLayout shared)
{
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    BfVector<8> *rows = reinterpret_cast<BfVector<8> *>(shared_bytes);
    BfVector<8> *zero = reinterpret_cast<BfVector<8> *>(shared_bytes + shared.zero);
    BlockSitePointers *sites = reinterpret_cast<BlockSitePointers *>(shared_bytes + shared.sites);
    float *square_parts = reinterpret_cast<float *>(shared_bytes + shared.squares);
    float *dot_parts = reinterpret_cast<float *>(shared_bytes + shared.dots);
    const int N = args.n_sources, G = args.n_sites, tokens = args.tokens;
    const int V = args.layout.vectors, stride = args.warp_heads_max;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    /* the warp's first slot of a staged row (32 a warp) and its first vector of the row */
    const int first_slot = warp * 32, first_vector = warp * 2 * K_STEPS;
    const int buffer_vectors = N * blockDim.x;
    float *coefficients = reinterpret_cast<float *>(shared_bytes + shared.coefficients) +
                          warp * shared.warp_coefficients; /* [2][G][N][stride] */
    float *coefficients_b = coefficients + shared.warp_coefficients / 2;
    const long long grid = gridDim.x;
    const unsigned rows_address = (unsigned)__cvta_generic_to_shared(rows);
    const unsigned zero_address = (unsigned)__cvta_generic_to_shared(zero);
    /* the lane's matrix half (matrix / 2) and row (pair_lane_offsets) */
    const int lane_half = (lane >> 4) & 1, lane_row = lane & 7;
    unsigned offsets[4];
    pair_lane_offsets(offsets, lane_half, lane_row);

    /* the first pair's rows travel while q*g's fragments are made */
    block_mma_fetch_rows<MAXN, K_STEPS>(rows, args.sources, N, blockIdx.x, tokens, V);
    block_mma_fetch_rows<MAXN, K_STEPS>(rows + buffer_vectors, args.sources, N,
                                        blockIdx.x + grid, tokens, V);
    if (threadIdx.x < 32)
        zero[threadIdx.x] = vector_zero<8>();
    if (threadIdx.x < CUDA_BLOCK_MAX_SITES)
        sites[threadIdx.x] = block_site_pointers(args, threadIdx.x);
    uint32_t key_weights[K_STEPS][4];
    block_mma_begin<K_STEPS>(zero, key_weights, args.query, args.key_norm, G);

    int parity = 0;
    for (long long t = blockIdx.x; t < tokens; t += 2 * grid, parity ^= 1) {
        const long long t_b = t + grid;
        const bool has_b = t_b < tokens;
        BfVector<8> *next = rows + (size_t)(parity ^ 1) * 2 * buffer_vectors;
        block_mma_fetch_rows<MAXN, K_STEPS>(next, args.sources, N, t + 2 * grid, tokens, V);
        block_mma_fetch_rows<MAXN, K_STEPS>(next + buffer_vectors, args.sources, N,
                                            t_b + 2 * grid, tokens, V);
        copy_async_wait<2>(); /* this pair's rows have landed */
        __syncwarp();
        const unsigned rows_a = rows_address + 16u * (unsigned)(parity * 2 * buffer_vectors);
        const unsigned base = pair_row_base(rows_a, rows_a + 16u * (unsigned)buffer_vectors,
                                            zero_address, N, has_b ? N : 0, first_slot);

        /* 1. dots and squares of both tokens: rows 0-7 a's, 8-15 b's */
        float dots_high[4] = {0, 0, 0, 0}, dots_low[4] = {0, 0, 0, 0};
        float gram_a[4] = {0, 0, 0, 0}, gram_b[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < K_STEPS; s++) {
            uint32_t a[4];
            block_ldmatrix_x4_at(a, base + offsets[s & 3] + 128u * (s >> 2));
            block_mma(dots_high, a, key_weights[s][0], key_weights[s][1]);
            block_mma(dots_low, a, key_weights[s][2], key_weights[s][3]);
            block_mma(gram_a, a, a[0], a[2]); /* against a's rows */
            block_mma(gram_b, a, a[1], a[3]); /* against b's rows */
        }
        float *squares_a = square_parts + (size_t)(2 * parity) * shared.square_buffer;
        float *squares_b = squares_a + shared.square_buffer;
        float *dots_a = dot_parts + (size_t)(2 * parity) * shared.dot_buffer;
        float *dots_b = dots_a + shared.dot_buffer;
#pragma unroll
        for (int e = 0; e < 4; e++) { /* e 0, 1: a's source g; e 2, 3: b's */
            const int i = 2 * c + (e & 1);
            float *dot = e >> 1 ? dots_b : dots_a;
            if (g < N && i < G)
                dot[block_mma_dot_at(warp, i, g, G, N)] = dots_high[e] + dots_low[e];
        }
        /* (g, g) sits in element 0 where g = 2c, in 1 where g = 2c + 1 (a's), 2 and 3 (b's);
         * chosen by select: a run-time index would put the array in local memory */
        const int diagonal = g - 2 * c;
        if ((diagonal == 0 || diagonal == 1) && g < N) {
            squares_a[g * warps + warp] = diagonal ? gram_a[1] : gram_a[0];
            squares_b[g * warps + warp] = diagonal ? gram_b[3] : gram_b[2];
        }
        __syncthreads(); /* both tokens' parts are complete (double-buffered by pair) */

        /* 2. each token's softmax, all lanes at work; site g's pointers from the table */
        const BlockSitePointers site_out = sites[g];
        block_forward_mma_softmax<MAXN>(args, site_out, squares_a, dots_a, coefficients, t);
        if (has_b)
            block_forward_mma_softmax<MAXN>(args, site_out, squares_b, dots_b, coefficients_b,
                                            t_b);

        /* 3. the mix: A = diag(W_a, W_b) in two halves; a1, a2 stay zero */
        uint32_t weights_high[4] = {0, 0, 0, 0}, weights_low[4] = {0, 0, 0, 0};
        pair_weight_halves(coefficients, g, c, N, G, stride, &weights_high[0], &weights_low[0]);
        if (has_b)
            pair_weight_halves(coefficients_b, g, c, N, G, stride, &weights_high[3],
                               &weights_low[3]);
        const bool write_a = g < G, write_b = write_a && has_b;
        bf16 *result = site_out.result + first_vector * 8; /* site g's, where g < G */
        unsigned *result_a = reinterpret_cast<unsigned *>(result + t * V * 8);
        unsigned *result_b = reinterpret_cast<unsigned *>(result + t_b * V * 8);
        /* two steps an iteration, the tiles of one loading while the other's products run:
         * b_even holds tiles j, j + 1 and b_odd j + 2, j + 3, each loaded a step ahead of its
         * products (loaded right after the products read the last, the loads stalled the
         * next step: 17% of the stall samples, ncu 2026-12-05; at 16 k-steps ptxas spills
         * 20-28 bytes for it with the quad's exchange, 0-12 before, and the (c) route case
         * still ran 4% faster, docs/performance.md 2026-12-06 morning); the four products of
         * a step are independent. In each, b[0], b[1] are tile j (a's, b's sources), b[2],
         * b[3] j + 1. */
        uint32_t b_even[4], b_odd[4];
        block_ldmatrix_x4_trans_at(b_even, base + offsets[0]);
#pragma unroll 1
        for (int j = 0; j < 2 * K_STEPS; j += 4, result_a += 16, result_b += 16) {
            block_ldmatrix_x4_trans_at(
                b_odd, base + 16u * (unsigned)(((j + 2) | lane_half) ^ lane_row));
            pair_mix_store(b_even, weights_high, weights_low, result_a, result_b, write_a,
                           write_b, lane);
            if (j + 4 < 2 * K_STEPS)
                block_ldmatrix_x4_trans_at(
                    b_even, base + 16u * (unsigned)(((j + 4) | lane_half) ^ lane_row));
            pair_mix_store(b_odd, weights_high, weights_low, result_a + 8, result_b + 8,
                           write_a, write_b, lane);
        }
        __syncwarp(); /* this pair's slots are read before the pair after next refills them */
    }
    copy_async_wait<0>();
}

template <int MAXN, int K_STEPS>
static void pair_launch(const BlockForwardArgs &args, int threads, const PairLayout &layout,
                        cudaStream_t stream)
{
    const long long pairs = (args.tokens + 1) / 2;
    const int blocks = block_persistent_grid<route_block_forward_pair_kernel<MAXN, K_STEPS>>(
        threads, layout.total, pairs, "the cuda block route forward");
    route_block_forward_pair_kernel<MAXN, K_STEPS>
        <<<blocks, threads, layout.total, stream>>>(args, layout);
    CUDA_CHECK_LAUNCH();
}

template <int MAXN>
static void pair_launch_steps(const BlockForwardArgs &args, int threads,
                              const PairLayout &layout, cudaStream_t stream)
{
    switch (args.layout.k_steps) { /* route_block_device.cuh's split layout, or 16 */
    case 8: pair_launch<MAXN, 8>(args, threads, layout, stream); break;
    case 10: pair_launch<MAXN, 10>(args, threads, layout, stream); break;
    case 12: pair_launch<MAXN, 12>(args, threads, layout, stream); break;
    default: pair_launch<MAXN, 16>(args, threads, layout, stream); break;
    }
}

bool route_block_forward_pairs(const BlockForwardArgs &args, int threads, cudaStream_t stream)
{
    if (!args.layout.tensor_cores || args.n_sources > ROUTE_BLOCK_PAIR_MAX_SOURCES)
        return false;
    const PairLayout layout = pair_layout(args, threads);
    if (layout.total > BLOCK_SHARED_LIMIT)
        return false;
    if (args.n_sources <= 2)
        pair_launch_steps<2>(args, threads, layout, stream);
    else if (args.n_sources <= 4)
        pair_launch_steps<4>(args, threads, layout, stream);
    else
        pair_launch_steps<ROUTE_BLOCK_PAIR_MAX_SOURCES>(args, threads, layout, stream);
    return true;
}
