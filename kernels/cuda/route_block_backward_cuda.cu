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
 * Four launches:
 *   dots, coefficients  route_block_dots_cuda.cu: D and P per (site, source, head) in the
 *            warps' shares, then a warp a token turns them into the token's coefficients
 *            a scale and r dz [tokens][N][H][2G], its dalpha term [G][tokens] and e_n
 *            [tokens][N]; where a warp's products are a whole head (block_dots_fused) the
 *            dots' warps make the coefficients themselves and the second launch only adds
 *            each token's e_n from its heads' shares;
 *   walker   a block owns a slice of channels (128 threads x 4, or 160 x 4 where that
 *            leaves fewer idle: block_walk_threads) and a range of tokens, with every
 *            site's q*g and S of its channels in registers (G x 8 floats a thread), and
 *            per token reads the slice of the N sources, their gradients and
 *            the G rows of d x: ds_n as above, S += ; per-block S at the end. A token's
 *            coefficients and e_n are staged in shared memory by the whole block (cp.async,
 *            one token ahead): read from global memory one by one they put up to N round
 *            trips to L2 between a token's loads and its stores (measured: the walker at
 *            0.9-1.0 TB/s, stalled on them; staged, 1.7-2.4 TB/s). The rows travel the same
 *            way, each thread its own slots (loaded where they were used, they left a third
 *            of the stalls waiting on DRAM; staged, the walker runs at about 3.5 TB/s at the
 *            training step's sizes). Held to 128 registers (up to 4 blocks of 128
 *            threads a multiprocessor, 3 of 160), no spills; the grid is one wave of the
 *            blocks the multiprocessors hold at the shape's shared memory
 *            (block_walk_ranges);
 *   reduce   route_block_cuda.cu's: S in range order, dalpha by a block in a fixed order.
 * The token layout cannot hold every site's q*g and S for the whole row (G x d each), hence
 * two passes over the sources and d x.
 *
 * How fast should this be. Per token: dots read N + G rows (and write 2 G N floats a warp);
 * the walker reads N + G and reads and writes N (the gradients): (4N + 2G) rows, against
 * (3N + G) for a single pass (route_block_one_pass_cuda.cu, which takes the split layout's
 * blocks from 5 sources on) and G (3N + 1) for the per-site kernels. At the 8B graft (8
 * blocks, G 8, sum N 44, 67 MB rows) 304 rows = 20.4 GB: 4.7 ms at 4.3 TB/s (the per-site
 * backward moved 98.8 GB in 25.2 ms).
 * The coefficients add 2 G N H floats a token (38 MB a block at N 9), read back through L2,
 * each walker block staging only its heads' share.
 * Deterministic: the token partition of the walker and the reduction orders depend on the
 * shapes only; each token's dots are one block's.
 */
#include "kernels/cuda/route_block_device.cuh"

#include <math.h>

/* ---- walker ---- */

struct BlockWalkArgs {
    const bf16 *sources[CUDA_BLOCK_MAX_SOURCES];
    bf16 *dsources[CUDA_BLOCK_MAX_SOURCES];
    const bf16 *douts[CUDA_BLOCK_MAX_SITES];
    const bf16 *query[CUDA_BLOCK_MAX_SITES], *key_norm[CUDA_BLOCK_MAX_SITES];
    /* dsources[n] as the walker reads it before adding: NULL where it is written (the
     * caller's dsources_written) or not wanted, so the token loop tests one pointer, as
     * before there was a write mode */
    const bf16 *dsources_read[CUDA_BLOCK_MAX_SOURCES];
    const float *coefficients, *self_terms;
    float *partials; /* [G][ranges][d] */
    int n_sources, n_sites, tokens, heads, head_dim, d, ranges;
};

/* The heads a walker block's channels touch: first .. last (its slice: `chunk` of
 * block_walk_threads(d) x BLOCK_WALK_VEC channels). */
__host__ __device__ __forceinline__ void block_walk_heads(int chunk, int d, int head_dim,
                                                          int *first, int *last)
{
    const int width = block_walk_threads(d) * BLOCK_WALK_VEC;
    const int from = chunk * width;
    const int to = from + width - 1 < d ? from + width - 1 : d - 1;
    *first = from / head_dim;
    *last = to / head_dim;
}

/* A token's rows in a walker block's shared memory, [G + 2N][threads] vectors a stage: the
 * sites' d x, the sources, the sources' gradients (as read before this token's update). */
__host__ __device__ __forceinline__ int block_walk_rows(int n_sources, int n_sites)
{
    return n_sites + 2 * n_sources;
}

/* Starts the copies of token t's coefficients of this block's heads, [N][span][2G] out of
 * [N][H][2G], and its self terms [N] into `stage` (a warp a source, 4 bytes a lane), and
 * of this thread's vector of the token's rows into its own slots of `rows`, then commits;
 * an empty group past the range. A block of 512 channels at H 8 stages one head of the
 * eight, an eighth of the token's coefficients. The rows travel a token ahead as the
 * coefficients do: loaded where they were used, they left the walker waiting on DRAM for a
 * third of its stall samples (2026-12-02). Unrolled to MAXN and G_MAX, so that every row's
 * address comes from the kernel's parameters where it is used. SITES: G when the launch
 * fixed it (block_walk_launch), 0 when it is read from the arguments. */
template <int MAXN, int SITES, int THREADS>
__device__ __forceinline__ void block_walk_fetch(float *stage, BfVector<BLOCK_WALK_VEC> *rows,
                                                 const BlockWalkArgs &args, long long t,
                                                 int last, int first_head, int span, bool valid)
{
    constexpr int VEC = BLOCK_WALK_VEC;
    constexpr int G_LOOP = SITES ? SITES : CUDA_BLOCK_MAX_SITES;
    const int N = args.n_sources, G = SITES ? SITES : args.n_sites, per_head = 2 * G;
    const int row = span * per_head, source_stride = args.heads * per_head;
    if (t < last) {
        const float *coefficients =
            args.coefficients + (t * N * args.heads + first_head) * per_head;
        /* warp w stages sources w, w + 4, ... (a float's source found without a division,
         * and each warp walks a quarter of them), the self terms as source N */
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll 1
        for (int n = warp; n <= N; n += THREADS / 32) {
            const bool self = n == N;
            const float *from = self ? args.self_terms + t * N
                                     : coefficients + (long long)n * source_stride;
            float *to_floats = stage + n * row;
#pragma unroll 1
            for (int j = lane; j < (self ? N : row); j += 32)
                copy_float_async(to_floats + j, from + j);
        }
        if (valid) {
            const long long at = t * (args.d / VEC) + blockIdx.x * THREADS + threadIdx.x;
            BfVector<VEC> *mine = rows + threadIdx.x;
#pragma unroll
            for (int i = 0; i < G_LOOP; i++)
                if (SITES || i < G)
                    copy_vector_async<VEC>(mine + i * THREADS, args.douts[i], at);
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                if (n >= N)
                    continue;
                copy_vector_async<VEC>(mine + (G + n) * THREADS, args.sources[n], at);
                if (args.dsources_read[n])
                    copy_vector_async<VEC>(mine + (G + N + n) * THREADS, args.dsources[n], at);
            }
        }
    }
    copy_async_commit();
}

template <int MAXN, int SITES, int THREADS>
__global__ void __launch_bounds__(THREADS, block_walk_max_resident(THREADS))
    route_block_walk_kernel(const __grid_constant__ BlockWalkArgs args)
{
    constexpr int G_MAX = SITES ? SITES : CUDA_BLOCK_MAX_SITES, VEC = BLOCK_WALK_VEC;
    /* [2][count] floats: a token's coefficients, then e_n; then [2][G + 2N][threads] rows */
    extern __shared__ __align__(16) float staged[];
    const int N = args.n_sources, G = SITES ? SITES : args.n_sites, d = args.d;
    int first_head, last_head;
    block_walk_heads(blockIdx.x, d, args.head_dim, &first_head, &last_head);
    const int span = last_head - first_head + 1;
    const int count = N * span * 2 * G + N;
    const int stage_rows = block_walk_rows(N, G) * THREADS;
    BfVector<VEC> *rows = reinterpret_cast<BfVector<VEC> *>(staged + 2 * count);
    const int u = blockIdx.x * THREADS + threadIdx.x; /* this thread's vector */
    const int range = blockIdx.y;
    const bool valid = u * VEC < d; /* idle threads still stage and meet the barriers */
    const int h = valid ? u * VEC / args.head_dim : 0;
    const int first = (int)((long long)args.tokens * range / args.ranges);
    const int last = (int)((long long)args.tokens * (range + 1) / args.ranges);
    /* the first token travels while q*g is made */
    block_walk_fetch<MAXN, SITES, THREADS>(staged, rows, args, first, last, first_head, span,
                                           valid);
    float key_weight[G_MAX][VEC], channel_sums[G_MAX][VEC];
#pragma unroll
    for (int i = 0; i < G_MAX; i++) {
        float q[VEC] = {0}, g[VEC] = {0};
        if ((SITES || i < G) && valid) {
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
    for (long long t = first; t < last; t++) {
        const int half = (int)((t - first) & 1);
        /* every thread is done with the other half (token t - 1) before it is refilled */
        __syncthreads();
        block_walk_fetch<MAXN, SITES, THREADS>(staged + (half ^ 1) * count,
                                               rows + (half ^ 1) * stage_rows, args, t + 1,
                                               last, first_head, span, valid);
        copy_async_wait<1>(); /* this thread's share of token t has landed */
        __syncthreads();      /* and everyone's */
        const long long at = t * vectors + u;
        const float *stage = staged + half * count;
        const BfVector<VEC> *mine = rows + half * stage_rows + threadIdx.x;
        float dy[G_MAX][VEC]; /* converted once: every source reads every site's d x */
#pragma unroll
        for (int i = 0; i < G_MAX; i++)
            vector_to_floats<VEC>((SITES || i < G) && valid ? mine[i * THREADS]
                                                            : vector_zero<VEC>(),
                                  dy[i]);
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            if (n >= N || !valid)
                continue;
            const float *coefficient = stage + (n * span + h - first_head) * (2 * G);
            const float self = stage[count - N + n];
            float x[VEC], grad[VEC];
            vector_to_floats<VEC>(mine[(G + n) * THREADS], x);
            vector_to_floats<VEC>(args.dsources_read[n] ? mine[(G + N + n) * THREADS]
                                                        : vector_zero<VEC>(),
                                  grad);
#pragma unroll
            for (int i = 0; i < G_MAX; i++) {
                if (!SITES && i >= G)
                    continue;
                const float value = coefficient[i], key = coefficient[G + i];
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    /* two fused multiply-adds, not (value dy + key q g) added: a third
                     * fewer operations in the walker's inner loop */
                    grad[k] = fmaf(key, key_weight[i][k], fmaf(value, dy[i][k], grad[k]));
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
        if (!SITES && i >= G)
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
    const int per_block = block_walk_threads(d) * BLOCK_WALK_VEC;
    return (d + per_block - 1) / per_block;
}

/* The most heads a walker block's channels (at most 640) touch: head_dim 8 (the smallest
 * the block kernels take) gives 80. */
enum { BLOCK_WALK_MAX_SPAN = BLOCK_WALK_THREADS_WIDE * BLOCK_WALK_VEC / 8 };

/* The most heads any walker block's channels touch at (d, head_dim). */
static int block_walk_span(int d, int head_dim)
{
    int span = 1;
    for (int chunk = 0; chunk < block_walk_chunks(d); chunk++) {
        int first, last;
        block_walk_heads(chunk, d, head_dim, &first, &last);
        span = last - first + 1 > span ? last - first + 1 : span;
    }
    return span;
}

/* A walker block's shared memory: two stages of a token's coefficients and self terms
 * (floats), then two of its rows (8-byte vectors, aligned: the floats are an even count). */
static size_t block_walk_shared_bytes(int n_sources, int n_sites, int span, int threads)
{
    const size_t count = (size_t)n_sources * span * 2 * n_sites + n_sources;
    return 2 * count * 4 + (size_t)2 * block_walk_rows(n_sources, n_sites) * threads *
                               BLOCK_WALK_VEC * 2;
}

/* The walker's blocks a multiprocessor at this shape's shared memory (route_block_device.cuh):
 * a function of the shapes alone. */
int route_block_walk_resident(int n_sources, int n_sites, int d, int heads)
{
    const int threads = block_walk_threads(d), most = block_walk_max_resident(threads);
    const size_t bytes =
        block_walk_shared_bytes(n_sources, n_sites, block_walk_span(d, d / heads), threads) +
        BLOCK_RESERVED_SHARED;
    const int resident = (int)(BLOCK_MULTIPROCESSOR_SHARED / bytes);
    return resident < 1 ? 1 : resident > most ? most : resident;
}

/* Token ranges: one wave of walker blocks, as many as the multiprocessors hold at this
 * shape's shared memory. A fixed count of 4 a multiprocessor left a second wave a third
 * full where only 3 fit (d 1280 from N 9 on: 58 KB a block), and the walker ran at 1.6-2.0
 * TB/s there against 2.4-2.5 at N <= 6 (the 1B MHAR delta step, H100, 2026-12-06). */
static int block_walk_ranges(int tokens, int n_sources, int n_sites, int d, int heads)
{
    const int blocks =
        route_block_walk_resident(n_sources, n_sites, d, heads) * BLOCK_WALK_MULTIPROCESSORS;
    const int ranges = blocks / block_walk_chunks(d) > 1 ? blocks / block_walk_chunks(d) : 1;
    return ranges < tokens ? ranges : tokens;
}

int route_block_walk_blocks(int tokens, int n_sources, int n_sites, int d, int heads)
{
    return block_walk_chunks(d) * block_walk_ranges(tokens, n_sources, n_sites, d, heads);
}

/* Offsets into the workspace (floats, 16-byte aligned): coefficients, self terms, dalpha
 * terms, the walker's partial sums, the dots' parts. The one pass keeps each token's
 * coefficients and self terms in shared memory and writes no parts: its workspace is the
 * dalpha terms and S's partial sums, a block's each. Sized for the two passes as well, it
 * held the coefficients' 2 G N H floats a token for nothing: 38 MB at the 1B step's last
 * blocks (N 9, G 8, H 8, 8192 tokens), the largest workspace of the step, and the backend's
 * workspace keeps its largest size. */
struct BlockWorkspace {
    bool one_pass;
    size_t self_terms, alpha_terms, partials, parts, total;
};

static size_t round_up_4(size_t floats)
{
    return (floats + 3) / 4 * 4;
}

static BlockWorkspace block_workspace(int n_sources, int n_sites, int tokens, int d, int heads)
{
    BlockWorkspace w = {};
    const BlockHeads layout = block_heads(n_sources, n_sites, d, heads);
    w.one_pass = route_block_one_pass_takes(layout, n_sources, n_sites, d, heads);
    if (w.one_pass) { /* [G][blocks][H] dalpha terms, then [G][blocks][d] partial sums */
        const size_t blocks =
            route_block_one_pass_blocks(layout, n_sources, n_sites, tokens, d, heads);
        w.alpha_terms = 0;
        w.partials = round_up_4((size_t)n_sites * blocks * heads);
        w.total = w.partials + round_up_4((size_t)n_sites * blocks * d);
        return w;
    }
    w.self_terms = round_up_4((size_t)tokens * n_sources * heads * 2 * n_sites);
    w.alpha_terms = w.self_terms + round_up_4((size_t)tokens * n_sources);
    /* the dalpha terms at their widest: [G][blocks][H] of at most a block a token
     * (block_dots_fused) */
    w.partials = w.alpha_terms + round_up_4((size_t)n_sites * tokens * heads);
    /* S's partial sums: a walker range's each */
    const int ranges = block_walk_ranges(tokens, n_sources, n_sites, d, heads);
    w.parts = w.partials + round_up_4((size_t)n_sites * ranges * d);
    w.total = w.parts + route_block_parts_floats(n_sources, n_sites, tokens, d, heads);
    return w;
}

size_t route_block_backward_fast_workspace_floats(int n_sources, int n_sites, int tokens,
                                                  int d, int heads)
{
    if (tokens <= 0 || !route_block_fits(n_sources, n_sites, d, heads))
        return 1;
    return block_workspace(n_sources, n_sites, tokens, d, heads).total;
}

template <int MAXN, int SITES, int THREADS>
static void block_walk_launch_threads(const BlockWalkArgs &walk, dim3 grid, size_t staged,
                                      cudaStream_t stream)
{
    static bool attribute_set; /* one flag for each instance */
    if (!attribute_set) {
        CUDA_CHECK(cudaFuncSetAttribute(
            route_block_walk_kernel<MAXN, SITES, THREADS>,
            cudaFuncAttributeMaxDynamicSharedMemorySize,
            (int)block_walk_shared_bytes(MAXN, CUDA_BLOCK_MAX_SITES, BLOCK_WALK_MAX_SPAN,
                                         THREADS)));
        attribute_set = true;
    }
    route_block_walk_kernel<MAXN, SITES, THREADS><<<grid, THREADS, staged, stream>>>(walk);
    CUDA_CHECK_LAUNCH();
}

template <int MAXN, int SITES>
static void block_walk_launch_sites(const BlockWalkArgs &walk, dim3 grid, size_t staged,
                                    cudaStream_t stream)
{
    if (block_walk_threads(walk.d) == BLOCK_WALK_THREADS_WIDE)
        block_walk_launch_threads<MAXN, SITES, BLOCK_WALK_THREADS_WIDE>(walk, grid, staged,
                                                                        stream);
    else
        block_walk_launch_threads<MAXN, SITES, BLOCK_WALK_THREADS>(walk, grid, staged, stream);
}

/* The blocks of 2 and 4 layers (4 and 8 sites) take kernels with their site count fixed
 * at compile time: the loops over sites lose their tests and the rows' offsets become
 * constants (at N 3, G 4 a token took about 700 instructions a thread with G known only at
 * run time, the FP work being a third of them; docs/performance.md, 2026-12-05). Other
 * counts (a short last block) take the kernel that reads G from its arguments. The sums
 * are the same in the same order: the same bits either way. */
template <int MAXN>
static void block_walk_launch(const BlockWalkArgs &walk, int n_sources, int n_sites,
                              cudaStream_t stream)
{
    const dim3 grid((unsigned)block_walk_chunks(walk.d), (unsigned)walk.ranges);
    const size_t staged = block_walk_shared_bytes(
        n_sources, n_sites, block_walk_span(walk.d, walk.head_dim), block_walk_threads(walk.d));
    if (n_sites == 4)
        block_walk_launch_sites<MAXN, 4>(walk, grid, staged, stream);
    else if (n_sites == 8)
        block_walk_launch_sites<MAXN, 8>(walk, grid, staged, stream);
    else
        block_walk_launch_sites<MAXN, 0>(walk, grid, staged, stream);
}

void route_block_backward_fast(bf16 *const *dsources, unsigned dsources_written,
                               float *const *dqueries,
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
        walk.dsources_read[n] = dsources_written >> n & 1u ? NULL : dsources[n];
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
    dots.alpha_terms = workspace + w.alpha_terms;
    dots.layout = block_heads(n_sources, n_sites, d, heads);
    dots.inverse_width = 1.0f / (float)d;
    dots.n_sources = walk.n_sources = n_sources;
    dots.n_sites = walk.n_sites = n_sites;
    dots.tokens = walk.tokens = tokens;
    dots.heads = walk.heads = heads;
    walk.head_dim = d / heads;
    walk.d = d;
    walk.ranges = block_walk_ranges(tokens, n_sources, n_sites, d, heads);
    reduce.partials = workspace + w.partials;
    reduce.alpha_partials = workspace + w.alpha_terms;
    reduce.d = d;
    if (w.one_pass) { /* its workspace holds no coefficients, self terms or parts */
        const int blocks =
            route_block_one_pass(dots, dsources, dsources_written, workspace + w.partials, d,
                                 stream);
        reduce.blocks = blocks;
        reduce.alpha_blocks = blocks * heads;
        route_block_reduce(reduce, n_sites, stream);
        return;
    }
    dots.coefficients = workspace;
    walk.coefficients = workspace;
    dots.self_terms = workspace + w.self_terms;
    walk.self_terms = workspace + w.self_terms;
    dots.parts = workspace + w.parts;
    walk.partials = workspace + w.partials;
    const int alpha_terms = route_block_dots(dots, stream);
    /* the unrolled source loops sized near N: fewer predicated-off iterations, and at 6 the
     * walker keeps within its 128 registers without spilling */
    if (n_sources <= 2)
        block_walk_launch<2>(walk, n_sources, n_sites, stream);
    else if (n_sources <= 4)
        block_walk_launch<4>(walk, n_sources, n_sites, stream);
    else if (n_sources <= 6)
        block_walk_launch<6>(walk, n_sources, n_sites, stream);
    else if (n_sources <= 9)
        block_walk_launch<9>(walk, n_sources, n_sites, stream);
    else
        block_walk_launch<CUDA_BLOCK_MAX_SOURCES>(walk, n_sources, n_sites, stream);
    reduce.blocks = walk.ranges;
    reduce.alpha_blocks = alpha_terms;
    route_block_reduce(reduce, n_sites, stream);
}
