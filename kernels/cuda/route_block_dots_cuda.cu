/* kernels/cuda/route_block_dots_cuda.cu — the first two launches of the two-phase Route's
 * backward (route_block_backward_cuda.cu has the math, the walker and the entry; contract:
 * route_block_cuda.h).
 *
 *   dots          a block a token (route_block_device.cuh's layout; the N rows
 *                 double-buffered in shared memory as in the forward, the G rows of d x
 *                 too where both fit (on tensor cores), else single-buffered and refetched
 *                 for the next token as soon as this token's dots are done; a thread reads
 *                 back only its own copies): for each site
 *                 D = < d x_i, s_n > and P = < q_i g_i, s_n > per head, each warp's or
 *                 segment's share written to the workspace as it stands. No barrier: the
 *                 warps of a block run apart, each a token ahead in its loads.
 *                 Where a warp's products are one whole head (block_dots_fused), the warp
 *                 makes that head's coefficients from them at once (below) and the next
 *                 launch does not run.
 *   coefficients  a warp a token: the token's parts, saved weights, rstd and centres copied
 *                 into the warp's shared memory at once; then a lane per (site, head): D and
 *                 P from the parts in part order, the softmax backward, the token's
 *                 coefficients a scale and r dz [tokens][N][H][2G]; then a lane per source
 *                 e_n [tokens][N] and a lane per site the dalpha term [G][tokens].
 * The first version did the second launch's work inside the dots kernel, behind two barriers
 * a token and with a thread per (site, head) while the rest of the block waited: 0.85-1.05 ms
 * a launch at the 8B graft, 0.9 TB/s, stalled on the barriers (docs/performance.md).
 *
 * How fast should this be. The dots read N + G rows a token and write 2 G N parts floats
 * (1.3 rows' worth at N 9, G 8, H 8, d 4096: 16 warps a token); the coefficients kernel reads
 * them back with the saved weights and writes 2 G N H + N + G floats. Each sum is added in
 * one fixed order: the same bits as the first version, and deterministic.
 */
#include "kernels/cuda/route_block_device.cuh"
#include "kernels/cuda/route_block_dots.cuh"
#include "kernels/cuda/route_block_mma.cuh"

#include <math.h>

/* Offset of token t's parts: [parts][G][2][N] floats a token (value D at 0, key P at N). */
__device__ __forceinline__ long long block_parts_at(const BlockDotsArgs &args, long long t)
{
    return t * args.layout.parts * args.n_sites * 2 * args.n_sources;
}

/* ---- dots ---- */

/* Shared memory: rows [2][N][threads], then d x [G][threads] (16-byte vectors), then the
 * key weights where they fit. */
static size_t block_dots_douts_offset(int n_sources, int threads)
{
    return (size_t)2 * n_sources * threads * 16;
}

static size_t block_dots_shared(int n_sources, int n_sites, int threads)
{
    return block_dots_douts_offset(n_sources, threads) + (size_t)n_sites * threads * 16;
}

size_t route_block_dots_shared_bytes(const BlockHeads &layout, int n_sources, int n_sites)
{
    /* one stage of d x, and the tensor-core kernel's zero row */
    return block_dots_shared(n_sources, n_sites, layout.threads) +
           (layout.tensor_cores ? 16 : 0);
}

template <int MAXN>
__global__ void __launch_bounds__(BLOCK_MAX_THREADS, 1)
    route_block_dots_kernel(const __grid_constant__ BlockDotsArgs args, size_t douts_offset,
                            size_t key_weights_offset)
{
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    BfVector<8> *rows = reinterpret_cast<BfVector<8> *>(shared_bytes);
    BfVector<8> *douts = reinterpret_cast<BfVector<8> *>(shared_bytes + douts_offset);
    float4 *key_weights =
        key_weights_offset ? reinterpret_cast<float4 *>(shared_bytes + key_weights_offset)
                           : NULL;
    const BlockHeads &layout = args.layout;
    const int N = args.n_sources, G = args.n_sites, tokens = args.tokens;
    const int V = layout.vectors, v = threadIdx.x;
    const int part_stride = G * 2 * N; /* from one part of a sum to the next */
    const bool valid = v < V;
    const SlotPlace place = slot_place_at(v, V, layout.head_vectors, layout.segment_period);
    const int half_vectors = N * blockDim.x;
    block_key_weights_stage(key_weights, args.query, args.key_norm, G, v, valid);

    int half = 0;
    block_fetch_rows(rows, args.sources, N, blockIdx.x, tokens, V, valid);
    block_fetch_rows(douts, args.douts, G, blockIdx.x, tokens, V, valid);
    for (long long t = blockIdx.x; t < tokens; t += gridDim.x, half ^= 1) {
        block_fetch_rows(rows + (half ^ 1) * half_vectors, args.sources, N, t + gridDim.x,
                         tokens, V, valid);
        copy_async_wait<1>(); /* this token's rows and d x have landed */
        /* the rows as floats, converted once: every site reads every row */
        float x[MAXN][8];
        block_rows_to_floats<MAXN>(rows + half * half_vectors, N, valid, x);
        float *token_parts = args.parts + block_parts_at(args, t);
        for (int i = 0; i < G; i++) {
            float key_weight[8], dy[8] = {0};
            block_key_weight(key_weights, args.query[i], args.key_norm[i], i, v, valid,
                             key_weight);
            if (valid)
                vector_to_floats<8>(douts[i * blockDim.x + v], dy);
            float value_dots[MAXN], key_dots[MAXN];
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                value_dots[n] = key_dots[n] = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    value_dots[n] += dy[k] * x[n][k];
                    key_dots[n] += key_weight[k] * x[n][k];
                }
            }
            float *site_parts = token_parts + (size_t)i * 2 * N;
            block_head_reduce<MAXN>(value_dots, site_parts, 1, part_stride, N, layout, place);
            block_head_reduce<MAXN>(key_dots, site_parts + N, 1, part_stride, N, layout, place);
        }
        /* this thread's d x slots are read: the next token's may come */
        block_fetch_rows(douts, args.douts, G, t + gridDim.x, tokens, V, valid);
    }
    copy_async_wait<0>();
}

/* Token t's coefficients of head h written where the walker reads them: [tokens][N][H][2G],
 * and the head's share of e_n [tokens][N][H] in the parts' place. */
__device__ __forceinline__ void block_dots_coefficients(const BlockDotsArgs &args, long long t,
                                                        int h, int g, int c,
                                                        const float (&value)[4],
                                                        const float (&key)[4],
                                                        const DotsLaneInputs &in,
                                                        const float (&scale)[2],
                                                        float (&alpha_sums)[2])
{
    const int N = args.n_sources, G = args.n_sites, H = args.heads;
    const DotsLaneCoefficients out =
        block_dots_lane_coefficients(args, value, key, in, scale, alpha_sums);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int i = 2 * c + (e & 1), n = g + 8 * (e >> 1);
        if (n < N && i < G) {
            float *coefficient =
                args.coefficients + ((t * N + n) * H + h) * (long long)(2 * G);
            coefficient[i] = out.value[e];
            coefficient[G + i] = out.key[e];
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int n = g + 8 * r;
        if (c == 0 && n < N)
            args.parts[(t * N + n) * H + h] = out.self_share[r];
    }
}

/* On tensor cores (FATHOM_ROUTE_BLOCK=mma, route_block_mma.cuh): per k-step of a warp's
 * K_STEPS x 16 channels, A = the sources, B = the sites' d x (staged, swizzled) for D and q*g
 * in two halves for P. The same parts, in the same places. Where shared memory holds two
 * tokens of both (douts_stages 2: N + G <= 6 + 8 at d 4096), the d x rows are double-buffered
 * as the sources are: refetched after a token's products, they left the next token waiting
 * on DRAM (43% of the kernel's stall samples at the training step's N 2-5, 2026-12-02).
 * FUSED: the coefficients made here (above) instead of the parts. */
template <int MAXN, int K_STEPS, bool FUSED>
__global__ void __launch_bounds__(BLOCK_MAX_THREADS, 1)
    route_block_dots_mma_kernel(const __grid_constant__ BlockDotsArgs args, size_t douts_offset,
                                size_t zero_offset, int douts_stages)
{
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    BfVector<8> *rows = reinterpret_cast<BfVector<8> *>(shared_bytes);
    BfVector<8> *douts = reinterpret_cast<BfVector<8> *>(shared_bytes + douts_offset);
    BfVector<8> *zero = reinterpret_cast<BfVector<8> *>(shared_bytes + zero_offset);
    const int N = args.n_sources, G = args.n_sites, tokens = args.tokens;
    const int V = args.layout.vectors, part_stride = G * 2 * N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int first_slot = warp * 32; /* the warp's first slot of a staged row */
    const int half_vectors = N * blockDim.x, douts_half = douts_stages == 2 ? G * blockDim.x : 0;
    /* the first token's rows travel while q*g's fragments are made */
    block_mma_fetch_rows<1, K_STEPS>(rows, args.sources, N, blockIdx.x, tokens, V);
    block_mma_fetch_rows<1, K_STEPS>(douts, args.douts, G, blockIdx.x, tokens, V);
    uint32_t key_weights[K_STEPS][4];
    block_mma_begin<K_STEPS>(zero, key_weights, args.query, args.key_norm, G);

    float scale[2] = {1.0f, 1.0f};      /* alpha of the lane's sites (FUSED) */
    float alpha_sums[2] = {0.0f, 0.0f}; /* their dalpha terms over this block's tokens */
    if (FUSED)
        for (int b = 0; b < 2; b++)
            if (2 * c + b < G && args.alpha[2 * c + b])
                scale[b] = *args.alpha[2 * c + b];

    int half = 0;
    for (long long t = blockIdx.x; t < tokens; t += gridDim.x, half ^= 1) {
        /* loaded here, used after the products: their round trip hides behind them */
        DotsLaneInputs inputs;
        if (FUSED)
            inputs = block_dots_lane_inputs(args, t, warp, g, c);
        block_mma_fetch_rows<1, K_STEPS>(rows + (half ^ 1) * half_vectors, args.sources, N,
                                         t + gridDim.x, tokens, V);
        if (douts_half) {
            block_mma_fetch_rows<1, K_STEPS>(douts + (half ^ 1) * douts_half, args.douts, G,
                                             t + gridDim.x, tokens, V);
            copy_async_wait<2>(); /* this token's rows and d x have landed */
        } else {
            copy_async_wait<1>();
        }
        __syncwarp(); /* every lane's */
        const BfVector<8> *token_rows = rows + half * half_vectors;
        const BfVector<8> *token_douts = douts + half * douts_half;
        /* q*g's hi and lo halves in accumulators of their own: three chains of K_STEPS
         * dependent mma, not one of twice as many (as the forward) */
        float value[4] = {0, 0, 0, 0}, key_high[4] = {0, 0, 0, 0}, key_low[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < K_STEPS; s++) {
            uint32_t a[4], b[4]; /* b[0], b[2]: sites 0-7 at the k-step's two vectors */
            block_ldmatrix_x4(a, block_mma_row_address(token_rows, zero, N, first_slot + 2 * s,
                                                       lane));
            block_ldmatrix_x4(b, block_mma_row_address(token_douts, zero, G,
                                                       first_slot + 2 * s, lane));
            block_mma(value, a, b[0], b[2]);
            block_mma(key_high, a, key_weights[s][0], key_weights[s][1]);
            block_mma(key_low, a, key_weights[s][2], key_weights[s][3]);
        }
        __syncwarp(); /* the warp's slots are read: the next token's may come */
        if (!douts_half)
            block_mma_fetch_rows<1, K_STEPS>(douts, args.douts, G, t + gridDim.x, tokens,
                                             V);
        if (FUSED) {
            float key[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                key[e] = key_high[e] + key_low[e];
            block_dots_coefficients(args, t, warp, g, c, value, key, inputs, scale, alpha_sums);
            continue;
        }
        float *token_parts = args.parts + block_parts_at(args, t) + (size_t)warp * part_stride;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = g + 8 * (e >> 1), i = 2 * c + (e & 1);
            if (n < N && i < G) {
                token_parts[(size_t)i * 2 * N + n] = value[e];
                token_parts[(size_t)i * 2 * N + N + n] = key_high[e] + key_low[e];
            }
        }
    }
    copy_async_wait<0>();
    if (FUSED) /* [G][blocks][H]: this block's, head `warp`'s */
        for (int b = 0; b < 2; b++)
            if (g == 0 && 2 * c + b < G)
                args.alpha_terms[((long long)(2 * c + b) * gridDim.x + blockIdx.x) * args.heads +
                                 warp] = alpha_sums[b];
}

/* ---- coefficients ---- */

/* A warp a token, its inputs staged first. Read where they were used, the parts and the
 * saved weights put a round trip to L2 behind each source of each (site, head) pair, and a
 * launch took the time of one warp's chain of them (60-70 us at 8192 tokens, a tenth of its
 * bytes' pace; docs/performance.md, 2026-12-06, later). Now the warp's lanes start copies of
 * the token's parts, weights, rstd and centres into the warp's shared memory together (one
 * round trip), and the arithmetic below reads them there in the order it always had: the
 * same bits. */
enum { BLOCK_COEFFICIENT_WARPS = 4 };

/* A warp's shared memory, in floats: the token's parts [parts][G][2][N], the weights
 * [G][N][H], rstd [N], the centres [G][H] (where given), then dz P [G][N][H] and each
 * (site, head)'s dalpha term [G][H]. */
struct BlockCoefficientStage {
    int weights, rstd, means, products, alpha_terms, floats;
};

__host__ __device__ static BlockCoefficientStage block_coefficient_stage(int parts, int n_sources,
                                                                         int n_sites, int heads)
{
    BlockCoefficientStage stage;
    stage.weights = parts * n_sites * 2 * n_sources;
    stage.rstd = stage.weights + n_sites * n_sources * heads;
    stage.means = stage.rstd + n_sources;
    stage.products = stage.means + n_sites * heads;
    stage.alpha_terms = stage.products + n_sites * n_sources * heads;
    stage.floats = stage.alpha_terms + n_sites * heads;
    return stage;
}

/* Starts the copies of token t's inputs into `staged` (the warp's; each lane its share,
 * consecutive lanes consecutive floats where the source is contiguous) and waits for them. */
__device__ __forceinline__ void block_coefficients_fetch(float *staged,
                                                         const BlockCoefficientStage &stage,
                                                         const BlockDotsArgs &args,
                                                         const float *token_parts, long long t,
                                                         int lane)
{
    const int N = args.n_sources, G = args.n_sites, H = args.heads, tokens = args.tokens;
    for (int j = lane; j < stage.weights; j += 32)
        copy_float_async(staged + j, token_parts + j);
    for (int j = lane; j < G * N * H; j += 32) { /* site i's [N][tokens][H] */
        const int i = j / (N * H), n = j / H - i * N, h = j - (j / H) * H;
        copy_float_async(staged + stage.weights + j,
                         args.weights[i] + ((long long)n * tokens + t) * H + h);
    }
    for (int n = lane; n < N; n += 32)
        copy_float_async(staged + stage.rstd + n, args.rstd + (long long)n * tokens + t);
    for (int j = lane; j < G * H; j += 32)
        if (args.means[j / H])
            copy_float_async(staged + stage.means + j, args.means[j / H] + t * H + j % H);
    copy_async_commit();
    copy_async_wait<0>();
    __syncwarp(); /* every lane's copies */
}

template <int MAXN>
__global__ void __launch_bounds__(BLOCK_COEFFICIENT_WARPS * 32)
    route_block_coefficients_kernel(const __grid_constant__ BlockDotsArgs args)
{
    extern __shared__ __align__(16) float staged_of_warps[];
    const BlockHeads &layout = args.layout;
    const int N = args.n_sources, G = args.n_sites, H = args.heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long t = (long long)blockIdx.x * blockDim.x / 32 + warp;
    if (t >= args.tokens)
        return; /* a whole warp: nothing below waits for the block */
    const BlockCoefficientStage stage = block_coefficient_stage(layout.parts, N, G, H);
    float *staged = staged_of_warps + (size_t)warp * stage.floats;
    block_coefficients_fetch(staged, stage, args, args.parts + block_parts_at(args, t), t,
                             lane);
    const float *rstd = staged + stage.rstd;
    float *products = staged + stage.products;
    const int part_stride = G * 2 * N;

    for (int pair = lane; pair < G * H; pair += 32) {
        const int i = pair / H, h = pair - i * H;
        int from, to;
        block_head_parts(layout, h, &from, &to);
        const float *site_parts = staged + (size_t)i * 2 * N;
        const float *site_weights = staged + stage.weights + (size_t)i * N * H;
        const float scale = args.alpha[i] ? *args.alpha[i] : 1.0f;
        float value[MAXN], key[MAXN], a[MAXN];
        float mean = 0.0f, alpha_term = 0.0f;
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            value[n] = key[n] = a[n] = 0.0f;
            if (n >= N)
                continue;
            for (int p = from; p <= to; p++) {
                value[n] += site_parts[(size_t)p * part_stride + n];
                key[n] += site_parts[(size_t)p * part_stride + N + n];
            }
            a[n] = site_weights[n * H + h];
            mean += a[n] * (scale * value[n]);
            alpha_term += a[n] * value[n];
        }
        if (args.means[i])
            mean = staged[stage.means + pair];
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            if (n >= N)
                continue;
            const float score_grad = a[n] * (scale * value[n] - mean);
            float *coefficient = args.coefficients + ((t * N + n) * H + h) * (long long)(2 * G);
            coefficient[i] = a[n] * scale;
            coefficient[G + i] = rstd[n] * score_grad;
            products[((size_t)i * N + n) * H + h] = score_grad * key[n];
        }
        staged[stage.alpha_terms + pair] = alpha_term; /* summed over heads below */
    }
    __syncwarp();

    /* a lane per source: e_n over the sites; a lane per site: its dalpha term */
    for (int n = lane; n < N; n += 32) {
        const float r = rstd[n];
        float total = 0.0f;
        for (int i = 0; i < G; i++) {
            float sum = 0.0f;
            for (int h = 0; h < H; h++)
                sum += products[((size_t)i * N + n) * H + h];
            total += r * r * (r * sum * args.inverse_width);
        }
        args.self_terms[t * N + n] = total;
    }
    for (int i = lane; i < G; i += 32) {
        float total = 0.0f;
        for (int h = 0; h < H; h++)
            total += staged[stage.alpha_terms + i * H + h];
        args.alpha_terms[(long long)i * args.tokens + t] = total;
    }
}

/* e_n [tokens][N] from the heads' shares [tokens][N][H] (block_dots_fused), a thread a
 * (token, source), added in head order. */
__global__ void route_block_self_sum_kernel(float *self_terms, const float *shares,
                                            long long count, int heads)
{
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= count)
        return;
    const float *share = shares + j * heads;
    float sum = share[0];
    for (int h = 1; h < heads; h++)
        sum += share[h];
    self_terms[j] = sum;
}

/* ---- the launches ---- */

size_t route_block_parts_floats(int n_sources, int n_sites, int tokens, int d, int heads)
{
    return (size_t)tokens * block_heads(n_sources, n_sites, d, heads).parts * n_sites * 2 *
           n_sources;
}

template <int MAXN, int K_STEPS, bool FUSED>
static int block_dots_mma_launch(const BlockDotsArgs &args, int threads, size_t shared,
                                 cudaStream_t stream)
{
    const size_t douts_bytes = (size_t)args.n_sites * threads * 16;
    const int douts_stages = shared + douts_bytes + 16 <= BLOCK_SHARED_LIMIT ? 2 : 1;
    shared += (size_t)(douts_stages - 1) * douts_bytes;
    const size_t bytes = shared + 16; /* and the zero row */
    /* FUSED: the dalpha terms are summed a block at a time */
    const int blocks = block_persistent_grid<route_block_dots_mma_kernel<MAXN, K_STEPS, FUSED>>(
        threads, bytes, args.tokens, "the cuda block route backward", FUSED);
    route_block_dots_mma_kernel<MAXN, K_STEPS, FUSED><<<blocks, threads, bytes, stream>>>(
        args, block_dots_douts_offset(args.n_sources, threads), shared, douts_stages);
    return blocks;
}

/* The tensor-core kernel at the layout's k-steps (route_block_device.cuh's split layout, or
 * 16); returns its blocks. */
template <int MAXN, bool FUSED>
static int block_dots_mma_dispatch(const BlockDotsArgs &args, int threads, size_t shared,
                                   cudaStream_t stream)
{
    switch (args.layout.k_steps) {
    case 8: return block_dots_mma_launch<MAXN, 8, FUSED>(args, threads, shared, stream);
    case 10: return block_dots_mma_launch<MAXN, 10, FUSED>(args, threads, shared, stream);
    case 12: return block_dots_mma_launch<MAXN, 12, FUSED>(args, threads, shared, stream);
    default: return block_dots_mma_launch<MAXN, 16, FUSED>(args, threads, shared, stream);
    }
}

/* Returns the dalpha terms a site: a token's each, or where the dots make the coefficients
 * (block_dots_fused) a (block, head)'s each. */
template <int MAXN>
static int block_dots_launch(const BlockDotsArgs &args, cudaStream_t stream)
{
    const int threads = args.layout.threads;
    size_t shared = block_dots_shared(args.n_sources, args.n_sites, threads);
    if (block_dots_fused(args.layout)) { /* the coefficients made in the dots' warps */
        const int blocks = block_dots_mma_dispatch<MAXN, true>(args, threads, shared, stream);
        CUDA_CHECK_LAUNCH();
        const long long count = args.tokens * (long long)args.n_sources;
        route_block_self_sum_kernel<<<(unsigned)((count + 255) / 256), 256, 0, stream>>>(
            args.self_terms, args.parts, count, args.heads);
        CUDA_CHECK_LAUNCH();
        return blocks * args.heads;
    }
    if (args.layout.tensor_cores) {
        block_dots_mma_dispatch<MAXN, false>(args, threads, shared, stream);
    } else {
        size_t key_weights = 0; /* staged where they fit (route_block_device.cuh) */
        if (shared + block_key_weights_bytes(args.n_sites, threads) <= BLOCK_SHARED_LIMIT) {
            key_weights = shared;
            shared += block_key_weights_bytes(args.n_sites, threads);
        }
        const int blocks = block_persistent_grid<route_block_dots_kernel<MAXN>>(
            threads, shared, args.tokens, "the cuda block route backward");
        route_block_dots_kernel<MAXN><<<blocks, threads, shared, stream>>>(
            args, block_dots_douts_offset(args.n_sources, threads), key_weights);
    }
    CUDA_CHECK_LAUNCH();

    /* as many warps a block as the staging allows, up to BLOCK_COEFFICIENT_WARPS (at the
     * largest shapes the block kernels take, a warp stages about 60 KB) */
    const size_t warp_bytes = (size_t)block_coefficient_stage(args.layout.parts, args.n_sources,
                                                              args.n_sites, args.heads)
                                  .floats * sizeof(float);
    int warps = BLOCK_COEFFICIENT_WARPS;
    while (warps > 1 && warps * warp_bytes > BLOCK_SHARED_LIMIT)
        warps--;
    static bool attribute_set; /* one flag for each instance */
    if (!attribute_set) {
        CUDA_CHECK(cudaFuncSetAttribute(route_block_coefficients_kernel<MAXN>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        BLOCK_SHARED_LIMIT));
        attribute_set = true;
    }
    const int coefficient_blocks = (int)((args.tokens + warps - 1) / warps);
    route_block_coefficients_kernel<MAXN>
        <<<coefficient_blocks, warps * 32, warps * warp_bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
    return args.tokens;
}

int route_block_dots(const BlockDotsArgs &args, cudaStream_t stream)
{
    /* the unrolled source loops sized near N: fewer predicated-off iterations */
    if (args.n_sources <= 2)
        return block_dots_launch<2>(args, stream);
    if (args.n_sources <= 4)
        return block_dots_launch<4>(args, stream);
    if (args.n_sources <= 6)
        return block_dots_launch<6>(args, stream);
    if (args.n_sources <= 9)
        return block_dots_launch<9>(args, stream);
    return block_dots_launch<CUDA_BLOCK_MAX_SOURCES>(args, stream);
}
