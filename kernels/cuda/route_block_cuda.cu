/* kernels/cuda/route_block_cuda.cu — the two-phase Route's entries (route_block_cuda.h):
 * the dispatch of phase one to the block kernels (route_block_device.cuh) or, for shapes they
 * do not take, to the per-site kernels of route_cuda.h once a site; the merges of the
 * replace form; and the fixed-order reduction of per-block channel sums into
 * dquery, dkey_norm (and dalpha) that the backward kernels share.
 *
 * Merges, a block a token (persistent grid), a thread per `slots` vectors of the row in the
 * strided placement of route_device.cuh. Per token a thread writes, for each of its vectors,
 * its share of each per-head sum into shared memory [K][vectors]; after a barrier warp w adds
 * the vectors of heads w, w + warps, .. (lanes strided, then warp_sum: a fixed order) into
 * [K][H]; after another, a thread per head makes the head's scalars, and after a third every
 * thread writes its vectors. Three barriers a token, any d and H (d / H a multiple of VEC).
 *   forward   K = 2: sum p^2 (every head's, added in head order: r_p), < q*g, p >;
 *             w_c = e^(lse - l), w_p = e^(z_p - l) with l = log(e^lse + e^z_p) taken about
 *             max(lse, z_p); out = w_c result + w_p p; weights rows 0..N-1 *= w_c, row N = w_p.
 *   backward  K = 1 or 3: mean = < dout, out >, and with a partial D = < dout, p > and
 *             P = < q*g, p >; dz = a (D - mean), e = r^2 (r sum_h dz P) / d;
 *             dp += a dout + r dz q*g - e p; S += r dz p per channel, per block, reduced
 *             by route_block_reduce_kernel.
 * How fast should this be: the merge forward moves 3 rows a token (partial, result, out), the
 * backward 5 (dout, out, partial, dpartial read and written); at d 1280 and 8192 tokens a row
 * is 21 MB, so 63 MB and 105 MB a site: 15 us and 25 us at 4.3 TB/s.
 */
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_block_device.cuh"
#include "kernels/cuda/route_device.cuh"

#include "kernels/cuda/bf16_vector.cuh"

#include <math.h>

enum { REDUCE_SLICES = 8 };

/* ---- the reduction of per-block channel sums ---- */

/* For site i = blockIdx.y: S_c = the blocks' sums in block order (REDUCE_SLICES strided sums,
 * then those in order), dq_c += g_c S_c, dg_c += q_c S_c; *dalpha += its blocks' sums in
 * order. Block: REDUCE_SLICES warps x 32 channels. */
__global__ void route_block_reduce_kernel(const __grid_constant__ BlockReduceArgs args)
{
    __shared__ float slices[REDUCE_SLICES][32];
    const int site = blockIdx.y, d = args.d;
    const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    const float *partials = args.partials + (long long)site * args.blocks * d;
    float sum = 0.0f;
    if (c < d)
        for (int b = slice; b < args.blocks; b += REDUCE_SLICES)
            sum += partials[(long long)b * d + c];
    slices[slice][lane] = sum;
    __syncthreads();
    if (slice == 0 && c < d) {
        float total = 0.0f;
        for (int k = 0; k < REDUCE_SLICES; k++)
            total += slices[k][lane];
        args.dquery[site][c] += bf16_bits_to_float(args.key_norm[site][c]) * total;
        args.dkey_norm[site][c] += bf16_bits_to_float(args.query[site][c]) * total;
    }
    if (args.dalpha[site] && blockIdx.x == 0 && slice == 1) {
        const float *alpha_partials = args.alpha_partials + (long long)site * args.alpha_blocks;
        float alpha = 0.0f;
        for (int b = lane; b < args.alpha_blocks; b += 32)
            alpha += alpha_partials[b];
        alpha = warp_sum(alpha);
        if (lane == 0)
            *args.dalpha[site] += alpha;
    }
}

void route_block_reduce(const BlockReduceArgs &args, int n_sites, cudaStream_t stream)
{
    dim3 grid((unsigned)((args.d + 31) / 32), (unsigned)n_sites);
    route_block_reduce_kernel<<<grid, 32 * REDUCE_SLICES, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

/* ---- merges ---- */

struct MergeArgs {
    /* forward */
    bf16 *out;
    float *weights; /* [N + 1, tokens, heads]; backward: read only */
    float *rstd;    /* [N + 1, tokens]; backward: read only */
    const bf16 *result;
    const float *lse;
    /* backward */
    bf16 *dpartial;
    float *mean;
    const bf16 *dout, *merged;
    float *partials; /* [blocks, d] channel sums S */
    /* both */
    const bf16 *partial; /* NULL: no partial (backward only) */
    const bf16 *query, *key_norm;
    float eps, inverse_width;
    int n_completed, tokens, heads, vectors, head_vectors, slots, d;
};

/* Shared memory: parts [K][vectors], head sums [K][H], then [2][H] head scalars. */
static size_t merge_shared_bytes(int parts, int vectors, int heads)
{
    return ((size_t)parts * vectors + (size_t)parts * heads + 2 * (size_t)heads) * sizeof(float);
}

/* Warp w adds the parts of heads w, w + warps, ..: part k of head h into sums[k * H + h]. */
__device__ __forceinline__ void merge_head_sums(float *sums, const float *parts, int count,
                                                int vectors, int head_vectors, int heads)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int h = warp; h < heads; h += warps)
        for (int k = 0; k < count; k++) {
            float sum = 0.0f;
            for (int v = h * head_vectors + lane; v < (h + 1) * head_vectors; v += 32)
                sum += parts[k * vectors + v];
            sum = warp_sum(sum);
            if (lane == 0)
                sums[k * heads + h] = sum;
        }
}

template <int VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
    route_merge_forward_kernel(const __grid_constant__ MergeArgs args)
{
    constexpr int MAX_SLOTS = ROW_MAX_SLOTS(VEC);
    extern __shared__ __align__(16) float merge_shared[];
    const int V = args.vectors, H = args.heads, N = args.n_completed, tokens = args.tokens;
    const int hv = args.head_vectors;
    float *parts = merge_shared;           /* [2][V] squares, dots */
    float *sums = parts + 2 * V;           /* [2][H] */
    float *scales = sums + 2 * H;          /* [2][H] w_c, w_p */
    float key_weight[MAX_SLOTS][VEC];
#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const int v = slot * blockDim.x + threadIdx.x;
        float q[VEC] = {0}, g[VEC] = {0};
        if (slot < args.slots && v < V) {
            vector_to_floats<VEC>(vector_load<VEC>(args.query, v), q);
            vector_to_floats<VEC>(vector_load<VEC>(args.key_norm, v), g);
        }
#pragma unroll
        for (int i = 0; i < VEC; i++)
            key_weight[slot][i] = q[i] * g[i];
    }
    /* phase one's weights of a token, one a thread while N H fits the block (else the
     * last barrier's loop reads the rest) */
    const bool weight_held = (int)threadIdx.x < N * H;
    for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
        const long long row = (long long)t * V;
        /* every load of the token first, so that one DRAM round trip serves them all: a
         * chain of three (rows, lse, weights) held a token 4 us (docs/performance.md, ninth
         * run) */
        BfVector<VEC> p_raw[MAX_SLOTS], result_raw[MAX_SLOTS];
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot >= args.slots || v >= V)
                continue;
            p_raw[slot] = vector_load<VEC>(args.partial, row + v);
            result_raw[slot] = vector_load_mutable<VEC>(args.result, row + v); /* out may alias */
        }
        const float completed = (int)threadIdx.x < H ? args.lse[(long long)t * H + threadIdx.x]
                                                     : 0.0f;
        float *held_weight = weight_held ? &args.weights[((long long)(threadIdx.x / H) * tokens +
                                                          t) * H + threadIdx.x % H]
                                         : NULL;
        const float weight = held_weight ? *held_weight : 0.0f;
        float p[MAX_SLOTS][VEC];
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot >= args.slots || v >= V)
                continue;
            vector_to_floats<VEC>(p_raw[slot], p[slot]);
            float squares = 0.0f, dot = 0.0f;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                squares += p[slot][i] * p[slot][i];
                dot += key_weight[slot][i] * p[slot][i];
            }
            parts[v] = squares;
            parts[V + v] = dot;
        }
        __syncthreads();
        merge_head_sums(sums, parts, 2, V, hv, H);
        __syncthreads();
        if ((int)threadIdx.x < H) {
            const int h = threadIdx.x;
            float squares = 0.0f;
            for (int k = 0; k < H; k++)
                squares += sums[k];
            const float r = rsqrtf(squares * args.inverse_width + args.eps);
            const float z = r * sums[H + h];
            const float top = fmaxf(completed, z);
            const float total = top + __logf(__expf(completed - top) + __expf(z - top));
            const float w_c = __expf(completed - total), w_p = __expf(z - total);
            scales[h] = w_c;
            scales[H + h] = w_p;
            args.weights[((long long)N * tokens + t) * H + h] = w_p;
            if (h == 0)
                args.rstd[(long long)N * tokens + t] = r;
        }
        __syncthreads();
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot >= args.slots || v >= V)
                continue;
            const int h = v / hv;
            float result[VEC], out[VEC];
            vector_to_floats<VEC>(result_raw[slot], result);
#pragma unroll
            for (int i = 0; i < VEC; i++)
                out[i] = scales[h] * result[i] + scales[H + h] * p[slot][i];
            vector_store<VEC>(args.out, row + v, vector_from_floats<VEC>(out));
        }
        if (held_weight)
            *held_weight = weight * scales[threadIdx.x % H];
        for (int i = threadIdx.x + blockDim.x; i < N * H; i += blockDim.x) {
            const int n = i / H, h = i - n * H;
            args.weights[((long long)n * tokens + t) * H + h] *= scales[h];
        }
    }
}

template <int VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
    route_merge_backward_kernel(const __grid_constant__ MergeArgs args)
{
    constexpr int MAX_SLOTS = ROW_MAX_SLOTS(VEC);
    extern __shared__ __align__(16) float merge_shared[];
    const int V = args.vectors, H = args.heads, N = args.n_completed, tokens = args.tokens;
    const int hv = args.head_vectors, K = args.partial ? 3 : 1;
    float *parts = merge_shared;           /* [K][V] < dout, out >, < dout, p >, < q*g, p > */
    float *sums = parts + K * V;           /* [K][H] */
    float *scalars = sums + K * H;         /* [2][H] a, dz */
    float key_weight[MAX_SLOTS][VEC], channel_sums[MAX_SLOTS][VEC];
#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const int v = slot * blockDim.x + threadIdx.x;
        float q[VEC] = {0}, g[VEC] = {0};
        if (slot < args.slots && v < V) {
            vector_to_floats<VEC>(vector_load<VEC>(args.query, v), q);
            vector_to_floats<VEC>(vector_load<VEC>(args.key_norm, v), g);
        }
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            key_weight[slot][i] = q[i] * g[i];
            channel_sums[slot][i] = 0.0f;
        }
    }
    for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
        const long long row = (long long)t * V;
        /* every load of the token first (as in the forward): the rows, the partial's weight
         * and rstd, and the gradient the token adds into */
        BfVector<VEC> dy_raw[MAX_SLOTS], x_raw[MAX_SLOTS], p_raw[MAX_SLOTS], grad_raw[MAX_SLOTS];
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot >= args.slots || v >= V)
                continue;
            dy_raw[slot] = vector_load<VEC>(args.dout, row + v);
            x_raw[slot] = vector_load<VEC>(args.merged, row + v);
            if (args.partial) {
                p_raw[slot] = vector_load<VEC>(args.partial, row + v);
                grad_raw[slot] = vector_load_mutable<VEC>(args.dpartial, row + v);
            }
        }
        const bool head_thread = args.partial && (int)threadIdx.x < H;
        const float partial_weight =
            head_thread ? args.weights[((long long)N * tokens + t) * H + threadIdx.x] : 0.0f;
        const float r = args.partial ? args.rstd[(long long)N * tokens + t] : 0.0f;
        float dy[MAX_SLOTS][VEC], p[MAX_SLOTS][VEC];
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot >= args.slots || v >= V)
                continue;
            float x[VEC];
            vector_to_floats<VEC>(dy_raw[slot], dy[slot]);
            vector_to_floats<VEC>(x_raw[slot], x);
            float centre = 0.0f, value = 0.0f, key = 0.0f;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                centre += dy[slot][i] * x[i];
            parts[v] = centre;
            if (args.partial) {
                vector_to_floats<VEC>(p_raw[slot], p[slot]);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    value += dy[slot][i] * p[slot][i];
                    key += key_weight[slot][i] * p[slot][i];
                }
                parts[V + v] = value;
                parts[2 * V + v] = key;
            }
        }
        __syncthreads();
        merge_head_sums(sums, parts, K, V, hv, H);
        __syncthreads();
        if ((int)threadIdx.x < H) {
            const int h = threadIdx.x;
            const float mean = sums[h];
            args.mean[(long long)t * H + h] = mean;
            if (args.partial) {
                const float a = partial_weight;
                scalars[h] = a;
                scalars[H + h] = a * (sums[H + h] - mean);
            }
        }
        if (!args.partial)
            continue; /* uniform over the block: the next token's parts are written after
                         this token's readers passed the second barrier */
        __syncthreads();
        float self = 0.0f;
        for (int h = 0; h < H; h++)
            self += scalars[H + h] * sums[2 * H + h];
        const float self_term = r * r * (r * self * args.inverse_width);
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot >= args.slots || v >= V)
                continue;
            const int h = v / hv;
            const float a = scalars[h], key_coefficient = r * scalars[H + h];
            float grad[VEC];
            vector_to_floats<VEC>(grad_raw[slot], grad);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                grad[i] += a * dy[slot][i] + key_coefficient * key_weight[slot][i] -
                           self_term * p[slot][i];
                channel_sums[slot][i] += key_coefficient * p[slot][i];
            }
            vector_store<VEC>(args.dpartial, row + v, vector_from_floats<VEC>(grad));
        }
        /* the scalars are rewritten after the next token's second barrier, which every
         * thread reaches after these reads */
    }
    if (!args.partial)
        return;
#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const int v = slot * blockDim.x + threadIdx.x;
        if (slot >= args.slots || v >= V)
            continue;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            args.partials[(long long)blockIdx.x * args.d + (long long)v * VEC + i] =
                channel_sums[slot][i];
    }
}

/* The merge's blocks: the device's resident blocks, at most the tokens; the backward's count
 * is fixed (MERGE_BACKWARD_BLOCKS) so that the channel sums' partition, hence their bits,
 * depend on the shapes only. Each block walks its tokens one after another, three barriers
 * and a DRAM round trip a token, so the count is what an H200 holds at once at d 1280 (5 a
 * multiprocessor: 96 threads of 128 registers): 264 left the 1B step's merge backward at
 * 183 us a launch, 7 times its bytes (docs/performance.md, ninth run). */
enum { MERGE_BACKWARD_BLOCKS = 660 };

static MergeArgs merge_args(const bf16 *partial, const bf16 *query, const bf16 *key_norm,
                            int n_sources, int tokens, int d, int heads, const RowShape &shape)
{
    MergeArgs args = {};
    args.partial = partial;
    args.query = query;
    args.key_norm = key_norm;
    args.inverse_width = 1.0f / (float)d;
    args.n_completed = n_sources - 1;
    args.tokens = tokens;
    args.heads = heads;
    args.vectors = shape.vectors;
    args.head_vectors = shape.head_vectors;
    args.slots = shape.slots;
    args.d = d;
    return args;
}

template <int VEC>
static void merge_forward_launch(const MergeArgs &args, int threads, cudaStream_t stream)
{
    const size_t bytes = merge_shared_bytes(2, args.vectors, args.heads);
    int blocks = resident_blocks(route_merge_forward_kernel<VEC>, threads, bytes,
                                 "the cuda route merge");
    blocks = blocks < args.tokens ? blocks : args.tokens;
    route_merge_forward_kernel<VEC><<<blocks, threads, bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_route_merge_forward(bf16 *out, float *weights, float *rstd,
                                         const bf16 *result, const float *lse,
                                         const bf16 *partial, int n_sources,
                                         const bf16 *query, const bf16 *key_norm, int tokens,
                                         int d, int heads, float eps, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0)
        return;
    const void *pointers[] = {out, result, partial, query, key_norm};
    const RowShape shape = row_shape(d, heads, pointers, 5);
    MergeArgs args = merge_args(partial, query, key_norm, n_sources, tokens, d, heads, shape);
    args.out = out;
    args.weights = weights;
    args.rstd = rstd;
    args.result = result;
    args.lse = lse;
    args.eps = eps;
    switch (shape.vec) {
    case 8: merge_forward_launch<8>(args, shape.threads, stream); break;
    case 4: merge_forward_launch<4>(args, shape.threads, stream); break;
    case 2: merge_forward_launch<2>(args, shape.threads, stream); break;
    default: merge_forward_launch<1>(args, shape.threads, stream); break;
    }
}

extern "C" size_t cuda_route_merge_backward_workspace_floats(int tokens, int d, int heads)
{
    (void)heads;
    const int blocks = tokens < MERGE_BACKWARD_BLOCKS ? tokens : MERGE_BACKWARD_BLOCKS;
    return (size_t)(blocks > 0 ? blocks : 1) * (size_t)d;
}

template <int VEC>
static void merge_backward_launch(const MergeArgs &args, int threads, int blocks,
                                  cudaStream_t stream)
{
    const size_t bytes = merge_shared_bytes(args.partial ? 3 : 1, args.vectors, args.heads);
    resident_blocks(route_merge_backward_kernel<VEC>, threads, bytes, "the cuda route merge");
    route_merge_backward_kernel<VEC><<<blocks, threads, bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_route_merge_backward(bf16 *dpartial, float *dquery, float *dkey_norm,
                                          float *mean, const bf16 *dout, const bf16 *out,
                                          const bf16 *partial, int n_sources,
                                          const float *weights, const float *rstd,
                                          const bf16 *query, const bf16 *key_norm,
                                          float *workspace, int tokens, int d, int heads,
                                          cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0)
        return;
    const void *pointers[] = {dpartial, dout, out, partial, query, key_norm};
    const RowShape shape = row_shape(d, heads, pointers, 6);
    MergeArgs args = merge_args(partial, query, key_norm, n_sources, tokens, d, heads, shape);
    args.weights = (float *)weights; /* read only in the backward */
    args.rstd = (float *)rstd;
    args.dpartial = dpartial;
    args.mean = mean;
    args.dout = dout;
    args.merged = out;
    args.partials = workspace;
    const int blocks = tokens < MERGE_BACKWARD_BLOCKS ? tokens : MERGE_BACKWARD_BLOCKS;
    switch (shape.vec) {
    case 8: merge_backward_launch<8>(args, shape.threads, blocks, stream); break;
    case 4: merge_backward_launch<4>(args, shape.threads, blocks, stream); break;
    case 2: merge_backward_launch<2>(args, shape.threads, blocks, stream); break;
    default: merge_backward_launch<1>(args, shape.threads, blocks, stream); break;
    }
    if (!partial)
        return;
    BlockReduceArgs reduce = {};
    reduce.dquery[0] = dquery;
    reduce.dkey_norm[0] = dkey_norm;
    reduce.query[0] = query;
    reduce.key_norm[0] = key_norm;
    reduce.partials = workspace;
    reduce.blocks = blocks;
    reduce.d = d;
    route_block_reduce(reduce, 1, stream);
}

/* ---- phase one: the block kernels, or the per-site kernels once a site ---- */

static bool block_pointers_fit(const void *const *pointers, int count)
{
    for (int i = 0; i < count; i++)
        if (!pointer_aligned(pointers[i], 16))
            return false;
    return true;
}

extern "C" size_t cuda_route_block_forward_workspace_floats(int n_sources, int n_sites,
                                                            int tokens, int d, int heads)
{
    (void)n_sources, (void)n_sites, (void)tokens, (void)d, (void)heads;
    return 1; /* neither path needs one */
}

extern "C" void cuda_route_block_forward(bf16 *const *results, float *const *weights,
                                         float *const *rstd, float *const *lse,
                                         const bf16 *const *sources, int n_sources,
                                         const bf16 *const *queries,
                                         const bf16 *const *key_norms, int n_sites,
                                         int tokens, int d, int heads, float eps,
                                         float *workspace, cudaStream_t stream)
{
    (void)workspace;
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0 || n_sites <= 0)
        return;
    const void *pointers[CUDA_ROUTE_MAX_SOURCES + 3 * CUDA_BLOCK_MAX_SITES];
    int count = 0;
    for (int n = 0; n < n_sources && count < CUDA_ROUTE_MAX_SOURCES; n++)
        pointers[count++] = sources[n];
    for (int i = 0; i < n_sites && i < CUDA_BLOCK_MAX_SITES; i++) {
        pointers[count++] = results[i];
        pointers[count++] = queries[i];
        pointers[count++] = key_norms[i];
    }
    if (route_block_fits(n_sources, n_sites, d, heads) && block_pointers_fit(pointers, count)) {
        route_block_forward_fast(results, weights, rstd, lse, sources, n_sources, queries,
                                 key_norms, n_sites, tokens, d, heads, eps, stream);
        return;
    }
    for (int i = 0; i < n_sites; i++)
        route_forward_lse(results[i], weights[i], rstd[i], lse ? lse[i] : NULL, sources,
                          n_sources, queries[i], key_norms[i], NULL, NULL, tokens, d, heads,
                          eps, stream);
}

extern "C" size_t cuda_route_block_backward_workspace_floats(int n_sources, int n_sites,
                                                             int tokens, int d, int heads)
{
    const size_t per_site = cuda_route_backward_workspace_floats(tokens, d);
    const size_t fast = route_block_backward_fast_workspace_floats(n_sources, n_sites, tokens,
                                                                    d, heads);
    return per_site > fast ? per_site : fast;
}

extern "C" void cuda_route_block_backward(bf16 *const *dsources, float *const *dqueries,
                                          float *const *dkey_norms, float *const *dalphas,
                                          const bf16 *const *douts, const bf16 *const *sources,
                                          int n_sources, const float *const *weights,
                                          const float *rstd, const bf16 *const *queries,
                                          const bf16 *const *key_norms,
                                          const float *const *alphas, const float *const *means,
                                          int n_sites, float *workspace, int tokens, int d,
                                          int heads, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0 || n_sites <= 0)
        return;
    const void *pointers[2 * CUDA_ROUTE_MAX_SOURCES + 3 * CUDA_BLOCK_MAX_SITES];
    int count = 0;
    for (int n = 0; n < n_sources && n < CUDA_ROUTE_MAX_SOURCES; n++) {
        pointers[count++] = sources[n];
        pointers[count++] = dsources[n];
    }
    for (int i = 0; i < n_sites && i < CUDA_BLOCK_MAX_SITES; i++) {
        pointers[count++] = douts[i];
        pointers[count++] = queries[i];
        pointers[count++] = key_norms[i];
    }
    if (route_block_fits(n_sources, n_sites, d, heads) && block_pointers_fit(pointers, count)) {
        route_block_backward_fast(dsources, dqueries, dkey_norms, dalphas, douts, sources,
                                  n_sources, weights, rstd, queries, key_norms, alphas, means,
                                  n_sites, workspace, tokens, d, heads, stream);
        return;
    }
    for (int i = 0; i < n_sites; i++)
        route_backward_centred(dsources, dqueries[i], dkey_norms[i], alphas ? dalphas[i] : NULL,
                               douts[i], sources, n_sources, weights[i], rstd, queries[i],
                               key_norms[i], alphas ? alphas[i] : NULL, means ? means[i] : NULL,
                               workspace, tokens, d, heads, stream);
}
