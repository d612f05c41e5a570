/* kernels/cuda/route_block_backward_cuda.cu — phase one of the two-phase Route, backward:
 * route_backward of every site of a block through the block's N completed sources
 * (contract: route_block_cuda.h; the math is route_backward_cuda.cu's, site by site).
 *
 * With scale_i = alpha_i (delta) or 1 (replace), per token, site i, source n and head h:
 *   D = < d x_i[h], s_n[h] >,  P = < q_i g_i [h], s_n[h] >
 *   mean = sum_n a scale D (or the merge's centre),  dz = a (scale D - mean)
 *   e_n = sum_i r^2 (r sum_h dz P) / d
 *   ds_n += sum_i (a scale d x_i + r dz q_i g_i) - e_n s_n
 *   S_i += sum_n r dz s_n  (dq_i += g_i S_i, dg_i += q_i S_i),  dalpha_i += sum_{n,h} a D
 * Three launches:
 *   dots     a block a token (route_block_device.cuh's layout; the N rows double-buffered
 *            in shared memory as in the forward, the G rows of d x single-buffered and
 *            refetched for the next token as soon as this token's dots are done): D and P
 *            per (site, source, head), then a thread per (site, head) writes the token's
 *            coefficients a scale and r dz [tokens][N][H][2G], its dalpha term [G][tokens],
 *            and a thread per source e_n [tokens][N];
 *   walker   a block owns a slice of 512 channels (128 threads x 4) and a range of tokens,
 *            with every site's q*g and S of its channels in registers (G x 8 floats a
 *            thread), and per token reads the slice of the N sources, their gradients and
 *            the G rows of d x: ds_n as above, S += ; per-block S at the end. A token's
 *            coefficients and e_n are staged in shared memory by the whole block (cp.async,
 *            one token ahead): read from global memory one by one they put up to N round
 *            trips to L2 between a token's loads and its stores (measured: the walker at
 *            0.9-1.0 TB/s, stalled on them; staged, 1.7-2.4 TB/s). Held to 128 registers
 *            (4 blocks a multiprocessor, the grid's all), a few bytes spilled at MAXN 9;
 *   reduce   route_block_cuda.cu's: S in range order, dalpha in token order.
 * The token layout cannot hold every site's q*g and S for the whole row (G x d each), hence
 * two passes over the sources and d x.
 *
 * How fast should this be. Per token: dots read N + G rows; the walker reads N + G and reads
 * and writes N (the gradients): (4N + 2G) rows, against (3N + G) for a single pass and
 * G (3N + 1) for the per-site kernels. At the 8B graft (8 blocks, G 8, sum N 44, 67 MB rows)
 * 304 rows = 20.4 GB: 4.7 ms at 4.3 TB/s (the per-site backward moved 98.8 GB in 25.2 ms).
 * The coefficients add 2 G N H floats a token (38 MB a block at N 9), read back through L2.
 * Deterministic: the token partition of the walker and the reduction orders depend on the
 * shapes only; each token's dots are one block's.
 */
#include "kernels/cuda/route_block_device.cuh"

#include <math.h>

/* ---- dots ---- */

struct BlockDotsArgs {
    const bf16 *sources[CUDA_BLOCK_MAX_SOURCES];
    const bf16 *douts[CUDA_BLOCK_MAX_SITES];
    const float *weights[CUDA_BLOCK_MAX_SITES]; /* site i's [N_i, tokens, H] */
    const float *rstd;                          /* [N, tokens] */
    const bf16 *query[CUDA_BLOCK_MAX_SITES], *key_norm[CUDA_BLOCK_MAX_SITES];
    const float *alpha[CUDA_BLOCK_MAX_SITES];   /* device [1] each, or all NULL */
    const float *means[CUDA_BLOCK_MAX_SITES];   /* [tokens, H] each, or all NULL */
    float *coefficients; /* [tokens][N][H][2G]: a scale_i at i, r dz at G + i */
    float *self_terms;   /* [tokens][N] e_n */
    float *alpha_terms;  /* [G][tokens] sum_{n,h} a D */
    BlockHeads layout;
    float inverse_width;
    int n_sources, n_sites, tokens, heads;
};

/* Shared memory: rows [2][N][threads], d x [G][threads] (16-byte vectors); then floats: D and
 * P parts [G][2][MAXN][parts], dz P [G][N][H] and each (site, head)'s dalpha term [G][H],
 * scales [G]. */
struct BlockDotsLayout {
    size_t douts, parts, products, scales, total;
};

static BlockDotsLayout block_dots_layout(int maxn, int n_sources, int n_sites, int d,
                                         int heads)
{
    const BlockHeads heads_layout = block_heads(d, heads);
    const int threads = (heads_layout.vectors + 31) / 32 * 32;
    BlockDotsLayout layout;
    layout.douts = (size_t)2 * n_sources * threads * 16;
    layout.parts = layout.douts + (size_t)n_sites * threads * 16;
    layout.products =
        layout.parts + round_up_16((size_t)n_sites * 2 * maxn * heads_layout.parts * 4);
    layout.scales =
        layout.products + round_up_16((size_t)n_sites * (n_sources + 1) * heads * 4);
    layout.total = layout.scales + round_up_16((size_t)n_sites * 4);
    return layout;
}

size_t route_block_dots_shared_bytes(int n_sources, int n_sites, int d, int heads)
{
    return block_dots_layout(CUDA_BLOCK_MAX_SOURCES, n_sources, n_sites, d, heads).total;
}

__device__ __forceinline__ void block_dots_fetch_rows(BfVector<8> *half, const BlockDotsArgs &args,
                                                      long long t, bool valid)
{
    if (t < args.tokens && valid)
        for (int n = 0; n < args.n_sources; n++)
            copy_vector_async<8>(half + n * blockDim.x + threadIdx.x, args.sources[n],
                                 t * args.layout.vectors + threadIdx.x);
    copy_async_commit();
}

__device__ __forceinline__ void block_dots_fetch_douts(BfVector<8> *douts,
                                                       const BlockDotsArgs &args, long long t,
                                                       bool valid)
{
    if (t < args.tokens && valid)
        for (int i = 0; i < args.n_sites; i++)
            copy_vector_async<8>(douts + i * blockDim.x + threadIdx.x, args.douts[i],
                                 t * args.layout.vectors + threadIdx.x);
    copy_async_commit();
}

template <int MAXN>
__global__ void __launch_bounds__(BLOCK_MAX_THREADS, 1)
    route_block_dots_kernel(const __grid_constant__ BlockDotsArgs args, BlockDotsLayout shared)
{
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    BfVector<8> *rows = reinterpret_cast<BfVector<8> *>(shared_bytes);
    BfVector<8> *douts = reinterpret_cast<BfVector<8> *>(shared_bytes + shared.douts);
    float *parts = reinterpret_cast<float *>(shared_bytes + shared.parts);
    float *products = reinterpret_cast<float *>(shared_bytes + shared.products);
    float *scales = reinterpret_cast<float *>(shared_bytes + shared.scales);
    const BlockHeads &layout = args.layout;
    const int N = args.n_sources, G = args.n_sites, H = args.heads, tokens = args.tokens;
    const int V = layout.vectors, v = threadIdx.x, stride = layout.parts;
    const bool valid = v < V;
    const SlotPlace place = slot_place_at(v, V, layout.head_vectors, layout.segment_period);
    const int half_vectors = N * blockDim.x;
    for (int i = threadIdx.x; i < G; i += blockDim.x)
        scales[i] = args.alpha[i] ? *args.alpha[i] : 1.0f;
    /* the first barrier of the first token orders these writes before their readers */

    int half = 0;
    block_dots_fetch_rows(rows, args, blockIdx.x, valid);
    block_dots_fetch_douts(douts, args, blockIdx.x, valid);
    for (long long t = blockIdx.x; t < tokens; t += gridDim.x, half ^= 1) {
        block_dots_fetch_rows(rows + (half ^ 1) * half_vectors, args, t + gridDim.x, valid);
        copy_async_wait<1>(); /* this token's rows and d x have landed */
        /* the rows as floats, converted once: every site reads every row */
        float x[MAXN][8];
#pragma unroll
        for (int n = 0; n < MAXN; n++)
            vector_to_floats<8>(n < N && valid ? rows[half * half_vectors + n * blockDim.x + v]
                                               : vector_zero<8>(),
                                x[n]);
        /* the saved weights and r of this thread's first (site, head) pair, loaded now so that
         * their latency passes under the dots, not in the serial phase after the barrier */
        float early_a[MAXN], early_r[MAXN];
        const int early_pair = (int)threadIdx.x < G * H ? (int)threadIdx.x : -1;
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            early_a[n] = early_r[n] = 0.0f;
            if (n < N && early_pair >= 0) {
                const int i = early_pair / H, h = early_pair - i * H;
                early_a[n] = __ldg(args.weights[i] + ((long long)n * tokens + t) * H + h);
                early_r[n] = __ldg(args.rstd + (long long)n * tokens + t);
            }
        }

        /* D and P of each site against every row, reduced over heads into parts */
        for (int i = 0; i < G; i++) {
            float key_weight[8] = {0}, dy[8] = {0};
            if (valid) {
                float q[8], g[8];
                vector_to_floats<8>(vector_load<8>(args.query[i], v), q);
                vector_to_floats<8>(vector_load<8>(args.key_norm[i], v), g);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    key_weight[k] = q[k] * g[k];
                vector_to_floats<8>(douts[i * blockDim.x + v], dy);
            }
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
            float *site_parts = parts + (size_t)i * 2 * MAXN * stride;
            block_head_reduce<MAXN>(value_dots, site_parts, stride, N, layout, place);
            block_head_reduce<MAXN>(key_dots, site_parts + (size_t)MAXN * stride, stride, N,
                                    layout, place);
        }
        /* this thread's d x slots are read: the next token's may come */
        block_dots_fetch_douts(douts, args, t + gridDim.x, valid);
        __syncthreads();

        /* a thread per (site, head): the softmax backward and the coefficients */
        for (int pair = threadIdx.x; pair < G * H; pair += blockDim.x) {
            const int i = pair / H, h = pair - i * H;
            int from, to;
            block_head_parts(layout, h, &from, &to);
            const float *site_parts = parts + (size_t)i * 2 * MAXN * stride;
            const float scale = scales[i];
            float value[MAXN], key[MAXN], a[MAXN];
            float mean = 0.0f, alpha_term = 0.0f;
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                value[n] = key[n] = a[n] = 0.0f;
                if (n >= N)
                    continue;
                for (int p = from; p <= to; p++) {
                    value[n] += site_parts[n * stride + p];
                    key[n] += site_parts[(MAXN + n) * stride + p];
                }
                a[n] = pair == early_pair ? early_a[n]
                                          : args.weights[i][((long long)n * tokens + t) * H + h];
                mean += a[n] * (scale * value[n]);
                alpha_term += a[n] * value[n];
            }
            if (args.means[i])
                mean = args.means[i][t * H + h];
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                if (n >= N)
                    continue;
                const float r = pair == early_pair ? early_r[n]
                                                   : args.rstd[(long long)n * tokens + t];
                const float score_grad = a[n] * (scale * value[n] - mean);
                float *coefficient =
                    args.coefficients + ((t * N + n) * H + h) * (long long)(2 * G);
                coefficient[i] = a[n] * scale;
                coefficient[G + i] = r * score_grad;
                products[((size_t)i * N + n) * H + h] = score_grad * key[n];
            }
            products[(size_t)G * N * H + pair] = alpha_term; /* summed over heads below */
        }
        __syncthreads();

        /* a thread per source: e_n over the sites; a thread per site: its dalpha term */
        for (int n = threadIdx.x; n < N; n += blockDim.x) {
            const float r = args.rstd[(long long)n * tokens + t];
            float total = 0.0f;
            for (int i = 0; i < G; i++) {
                float sum = 0.0f;
                for (int h = 0; h < H; h++)
                    sum += products[((size_t)i * N + n) * H + h];
                total += r * r * (r * sum * args.inverse_width);
            }
            args.self_terms[t * N + n] = total;
        }
        for (int i = threadIdx.x; i < G; i += blockDim.x) {
            float total = 0.0f;
            for (int h = 0; h < H; h++)
                total += products[(size_t)G * N * H + i * H + h];
            args.alpha_terms[(long long)i * tokens + t] = total;
        }
        /* parts and products are rewritten after the next token's first barrier, which every
         * thread reaches after these reads */
    }
    copy_async_wait<0>();
}

/* ---- walker ---- */

struct BlockWalkArgs {
    const bf16 *sources[CUDA_BLOCK_MAX_SOURCES];
    bf16 *dsources[CUDA_BLOCK_MAX_SOURCES];
    const bf16 *douts[CUDA_BLOCK_MAX_SITES];
    const bf16 *query[CUDA_BLOCK_MAX_SITES], *key_norm[CUDA_BLOCK_MAX_SITES];
    const float *coefficients, *self_terms;
    float *partials; /* [G][ranges][d] */
    int n_sources, n_sites, tokens, heads, head_dim, d, ranges;
};

/* Starts the copies of token t's coefficients [N][H][2G] and self terms [N] into `stage`
 * (every thread a share, 4 bytes each) and commits; an empty group past the range. */
__device__ __forceinline__ void block_walk_fetch(float *stage, const BlockWalkArgs &args,
                                                 long long t, int last, int count)
{
    if (t < last) {
        const float *coefficients = args.coefficients + t * (count - args.n_sources);
        const float *self_terms = args.self_terms + t * args.n_sources;
        for (int j = threadIdx.x; j < count; j += blockDim.x) {
            const float *from = j < count - args.n_sources
                                    ? coefficients + j
                                    : self_terms + (j - (count - args.n_sources));
            const unsigned to = (unsigned)__cvta_generic_to_shared(stage + j);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(from)
                         : "memory");
        }
    }
    copy_async_commit();
}

template <int MAXN>
__global__ void __launch_bounds__(BLOCK_WALK_THREADS, 4)
    route_block_walk_kernel(const __grid_constant__ BlockWalkArgs args)
{
    constexpr int G_MAX = CUDA_BLOCK_MAX_SITES, VEC = BLOCK_WALK_VEC;
    extern __shared__ float staged[]; /* [2][count]: a token's coefficients, then e_n */
    const int N = args.n_sources, G = args.n_sites, H = args.heads, d = args.d;
    const int count = N * H * 2 * G + N;
    const int u = blockIdx.x * blockDim.x + threadIdx.x; /* this thread's vector */
    const int range = blockIdx.y;
    const bool valid = u * VEC < d; /* idle threads still stage and meet the barriers */
    const int h = valid ? u * VEC / args.head_dim : 0;
    float key_weight[G_MAX][VEC], channel_sums[G_MAX][VEC];
#pragma unroll
    for (int i = 0; i < G_MAX; i++) {
        float q[VEC] = {0}, g[VEC] = {0};
        if (i < G && valid) {
            vector_to_floats<VEC>(vector_load<VEC>(args.query[i], u), q);
            vector_to_floats<VEC>(vector_load<VEC>(args.key_norm[i], u), g);
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            key_weight[i][k] = q[k] * g[k];
            channel_sums[i][k] = 0.0f;
        }
    }
    const long long vectors = d / VEC;
    const int first = (int)((long long)args.tokens * range / args.ranges);
    const int last = (int)((long long)args.tokens * (range + 1) / args.ranges);
    block_walk_fetch(staged, args, first, last, count);
    for (long long t = first; t < last; t++) {
        const int half = (int)((t - first) & 1);
        /* every thread is done with the other half (token t - 1) before it is refilled */
        __syncthreads();
        block_walk_fetch(staged + (half ^ 1) * count, args, t + 1, last, count);
        const long long at = t * vectors + u;
        BfVector<VEC> s[MAXN], ds[MAXN];
        float dy[G_MAX][VEC]; /* converted once: every source reads every site's d x */
#pragma unroll
        for (int i = 0; i < G_MAX; i++)
            vector_to_floats<VEC>(i < G && valid ? vector_load<VEC>(args.douts[i], at)
                                                 : vector_zero<VEC>(),
                                  dy[i]);
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            s[n] = n < N && valid ? vector_load<VEC>(args.sources[n], at) : vector_zero<VEC>();
            ds[n] = n < N && valid && args.dsources[n]
                        ? vector_load_mutable<VEC>(args.dsources[n], at)
                        : vector_zero<VEC>();
        }
        copy_async_wait<1>(); /* this thread's share of token t has landed */
        __syncthreads();      /* and everyone's */
        const float *stage = staged + half * count;
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            if (n >= N || !valid)
                continue;
            const float *coefficient = stage + (n * H + h) * (2 * G);
            const float self = stage[count - N + n];
            float x[VEC], grad[VEC];
            vector_to_floats<VEC>(s[n], x);
            vector_to_floats<VEC>(ds[n], grad);
#pragma unroll
            for (int i = 0; i < G_MAX; i++) {
                if (i >= G)
                    continue;
                const float value = coefficient[i], key = coefficient[G + i];
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    grad[k] += value * dy[i][k] + key * key_weight[i][k];
                    channel_sums[i][k] += key * x[k];
                }
            }
#pragma unroll
            for (int k = 0; k < VEC; k++)
                grad[k] -= self * x[k];
            if (args.dsources[n])
                vector_store<VEC>(args.dsources[n], at, vector_from_floats<VEC>(grad));
        }
    }
    copy_async_wait<0>(); /* the empty group past the range */
    if (!valid)
        return;
#pragma unroll
    for (int i = 0; i < G_MAX; i++) {
        if (i >= G)
            continue;
        float *partial = args.partials + ((long long)i * args.ranges + range) * d + u * VEC;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            partial[k] = channel_sums[i][k];
    }
}

/* ---- the launches ---- */

static int block_walk_chunks(int d)
{
    const int per_block = BLOCK_WALK_THREADS * BLOCK_WALK_VEC;
    return (d + per_block - 1) / per_block;
}

/* Token ranges: about BLOCK_WALK_TARGET_BLOCKS blocks in all, whatever d. */
static int block_walk_ranges(int tokens, int d)
{
    int ranges = (BLOCK_WALK_TARGET_BLOCKS + block_walk_chunks(d) - 1) / block_walk_chunks(d);
    return ranges < tokens ? ranges : tokens;
}

/* Offsets into the workspace (floats, 16-byte aligned): coefficients, self terms, dalpha
 * terms, the walker's partial sums. */
struct BlockWorkspace {
    size_t self_terms, alpha_terms, partials, total;
};

static size_t round_up_4(size_t floats)
{
    return (floats + 3) / 4 * 4;
}

static BlockWorkspace block_workspace(int n_sources, int n_sites, int tokens, int d, int heads)
{
    BlockWorkspace w;
    w.self_terms = round_up_4((size_t)tokens * n_sources * heads * 2 * n_sites);
    w.alpha_terms = w.self_terms + round_up_4((size_t)tokens * n_sources);
    w.partials = w.alpha_terms + round_up_4((size_t)n_sites * tokens);
    w.total = w.partials + (size_t)n_sites * block_walk_ranges(tokens, d) * d;
    return w;
}

size_t route_block_backward_fast_workspace_floats(int n_sources, int n_sites, int tokens,
                                                  int d, int heads)
{
    if (tokens <= 0 || !route_block_fits(n_sources, n_sites, d, heads))
        return 1;
    return block_workspace(n_sources, n_sites, tokens, d, heads).total;
}

template <int MAXN>
static void block_backward_launch(const BlockDotsArgs &dots, const BlockWalkArgs &walk,
                                  int threads, int n_sources, int n_sites, int d, int heads,
                                  cudaStream_t stream)
{
    static bool carveout_set;
    if (!carveout_set) {
        CUDA_CHECK(cudaFuncSetAttribute(route_block_dots_kernel<MAXN>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        carveout_set = true;
    }
    const BlockDotsLayout layout = block_dots_layout(MAXN, n_sources, n_sites, d, heads);
    int blocks = resident_blocks(route_block_dots_kernel<MAXN>, threads, layout.total,
                                 "the cuda block route backward");
    blocks = blocks < dots.tokens ? blocks : dots.tokens;
    route_block_dots_kernel<MAXN><<<blocks, threads, layout.total, stream>>>(dots, layout);
    CUDA_CHECK_LAUNCH();
    const dim3 grid((unsigned)block_walk_chunks(d), (unsigned)walk.ranges);
    const size_t staged = (size_t)2 * (n_sources * heads * 2 * n_sites + n_sources) * 4;
    route_block_walk_kernel<MAXN><<<grid, BLOCK_WALK_THREADS, staged, stream>>>(walk);
    CUDA_CHECK_LAUNCH();
}

void route_block_backward_fast(bf16 *const *dsources, float *const *dqueries,
                               float *const *dkey_norms, float *const *dalphas,
                               const bf16 *const *douts, const bf16 *const *sources,
                               int n_sources, const float *const *weights, const float *rstd,
                               const bf16 *const *queries, const bf16 *const *key_norms,
                               const float *const *alphas, const float *const *means,
                               int n_sites, float *workspace, int tokens, int d, int heads,
                               cudaStream_t stream)
{
    const BlockWorkspace w = block_workspace(n_sources, n_sites, tokens, d, heads);
    BlockDotsArgs dots = {};
    BlockWalkArgs walk = {};
    BlockReduceArgs reduce = {};
    for (int n = 0; n < n_sources; n++) {
        dots.sources[n] = walk.sources[n] = sources[n];
        walk.dsources[n] = dsources[n];
    }
    for (int i = 0; i < n_sites; i++) {
        dots.douts[i] = walk.douts[i] = douts[i];
        dots.weights[i] = weights[i];
        dots.query[i] = walk.query[i] = reduce.query[i] = queries[i];
        dots.key_norm[i] = walk.key_norm[i] = reduce.key_norm[i] = key_norms[i];
        dots.alpha[i] = alphas ? alphas[i] : NULL;
        dots.means[i] = means ? means[i] : NULL;
        reduce.dquery[i] = dqueries[i];
        reduce.dkey_norm[i] = dkey_norms[i];
        reduce.dalpha[i] = alphas ? dalphas[i] : NULL;
    }
    dots.rstd = rstd;
    dots.coefficients = workspace;
    walk.coefficients = workspace;
    dots.self_terms = workspace + w.self_terms;
    walk.self_terms = workspace + w.self_terms;
    dots.alpha_terms = workspace + w.alpha_terms;
    dots.layout = block_heads(d, heads);
    dots.inverse_width = 1.0f / (float)d;
    dots.n_sources = walk.n_sources = n_sources;
    dots.n_sites = walk.n_sites = n_sites;
    dots.tokens = walk.tokens = tokens;
    dots.heads = walk.heads = heads;
    walk.head_dim = d / heads;
    walk.d = d;
    walk.ranges = block_walk_ranges(tokens, d);
    walk.partials = workspace + w.partials;
    const int threads = (dots.layout.vectors + 31) / 32 * 32;
    /* the unrolled source loops sized near N: fewer predicated-off iterations, and at 6 the
     * walker keeps within its 128 registers without spilling */
    if (n_sources <= 2)
        block_backward_launch<2>(dots, walk, threads, n_sources, n_sites, d, heads, stream);
    else if (n_sources <= 4)
        block_backward_launch<4>(dots, walk, threads, n_sources, n_sites, d, heads, stream);
    else if (n_sources <= 6)
        block_backward_launch<6>(dots, walk, threads, n_sources, n_sites, d, heads, stream);
    else
        block_backward_launch<CUDA_BLOCK_MAX_SOURCES>(dots, walk, threads, n_sources, n_sites,
                                                      d, heads, stream);
    reduce.partials = workspace + w.partials;
    reduce.alpha_partials = workspace + w.alpha_terms;
    reduce.blocks = walk.ranges;
    reduce.alpha_blocks = tokens;
    reduce.d = d;
    route_block_reduce(reduce, n_sites, stream);
}
