/* kernels/cuda/route_merge_cuda.cu — the replace form's merges (route_block_cuda.h,
 * cuda_route_merge_forward / backward; backend.h states the math):
 *   forward   r_p = rsqrt(mean(p^2) + eps), z_p = r_p < q*g, p > per head;
 *             w_c = e^(lse - l), w_p = e^(z_p - l) with l = log(e^lse + e^z_p) taken about
 *             max(lse, z_p); out = w_c result + w_p p; weights rows 0..N-1 *= w_c, row N = w_p.
 *   backward  mean = < dout, out >, and with a partial D = < dout, p > and
 *             P = < q*g, p >; dz = a (D - mean), e = r^2 (r sum_h dz P) / d;
 *             dp += a dout + r dz q*g - e p (GRAD_WRITE: dp = +0.0 + .., dp not read);
 *             S += r dz p per channel, summed per block (or warp) and reduced in a fixed
 *             order by route_block_reduce.
 * How fast should this be: the forward moves 3 rows a token (partial, result, out), the
 * backward 5 (dout, out, partial, dpartial read and written), 4 when it writes dpartial; at
 * d 1280 and 8192 tokens a row is 21 MB, so 63 MB and 105 (84) MB a site: 15 us and 25 (20)
 * us at 4.3 TB/s.
 *
 * Two layouts:
 * - a warp a token (route_merge_narrow_cuda.cu), for narrow rows (d % 256 == 0, d <= 2048,
 *   heads dividing 32, 16-byte pointers: the layout of route_narrow.cuh, lane l owning
 *   channels [l d/32, (l+1) d/32), so a head is whole lanes): no barrier, every per-head sum
 *   a few shuffles, each lane's loads of a token issued together. A block a token spent its
 *   time at three barriers a token (ncu at the 1B step: 31 us and 58 us a launch,
 *   docs/performance.md, ninth run).
 * - a block a token otherwise (persistent grid), a thread per `slots` vectors of the row in
 *   the strided placement of route_device.cuh. Per token a thread writes, for each of its
 *   vectors, its share of each per-head sum into shared memory [K][vectors]; after a barrier
 *   warp w adds the vectors of heads w, w + warps, .. (lanes strided, then warp_sum: a fixed
 *   order) into [K][H]; after another, a thread per head makes the head's scalars, and after a
 *   third every thread writes its vectors. Any d and H (d / H a multiple of VEC).
 * Deterministic: a token is one block's or warp's; the backward's channel sums go per block
 * or warp in token order, their count fixed by the shapes.
 */
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_block_device.cuh"
#include "kernels/cuda/route_device.cuh"
#include "kernels/cuda/route_merge.cuh"

#include <math.h>

/* ---- a block a token ---- */

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

/* q*g of this thread's vectors (0 past the row) */
template <int VEC, int MAX_SLOTS>
__device__ __forceinline__ void merge_key_weight(float (&key_weight)[MAX_SLOTS][VEC],
                                                 const MergeArgs &args)
{
#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const int v = slot * blockDim.x + threadIdx.x;
        float q[VEC] = {0}, g[VEC] = {0};
        if (slot < args.slots && v < args.vectors) {
            vector_to_floats<VEC>(vector_load<VEC>(args.query, v), q);
            vector_to_floats<VEC>(vector_load<VEC>(args.key_norm, v), g);
        }
#pragma unroll
        for (int i = 0; i < VEC; i++)
            key_weight[slot][i] = q[i] * g[i];
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
    merge_key_weight<VEC, MAX_SLOTS>(key_weight, args);
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
    float key_weight[MAX_SLOTS][VEC], channel_sums[MAX_SLOTS][VEC] = {};
    merge_key_weight<VEC, MAX_SLOTS>(key_weight, args);
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
                if (args.dpartial_add)
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
            float grad[VEC] = {}; /* GRAD_WRITE: +0.0, the bits of an add into zeros */
            if (args.dpartial_add)
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

/* ---- the entries ---- */

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

MergeArgs merge_forward_args(bf16 *out, float *weights, float *rstd, const bf16 *result,
                             const float *lse, const bf16 *partial, int n_sources,
                             const bf16 *query, const bf16 *key_norm, int tokens, int d,
                             int heads, float eps)
{
    MergeArgs args = merge_args(partial, query, key_norm, n_sources, tokens, d, heads,
                                RowShape{});
    args.out = out;
    args.weights = weights;
    args.rstd = rstd;
    args.result = result;
    args.lse = lse;
    args.eps = eps;
    return args;
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
    MergeArgs args = merge_forward_args(out, weights, rstd, result, lse, partial, n_sources,
                                        query, key_norm, tokens, d, heads, eps);
    args.vectors = shape.vectors;
    args.head_vectors = shape.head_vectors;
    args.slots = shape.slots;
    if (merge_narrow_fits(d, heads, pointers, 5)) {
        merge_narrow_forward(args, d, stream);
        return;
    }
    switch (shape.vec) {
    case 8: merge_forward_launch<8>(args, shape.threads, stream); break;
    case 4: merge_forward_launch<4>(args, shape.threads, stream); break;
    case 2: merge_forward_launch<2>(args, shape.threads, stream); break;
    default: merge_forward_launch<1>(args, shape.threads, stream); break;
    }
}

/* the backward's partitions of the tokens: blocks a token, or warps a token */
static int merge_backward_blocks(int tokens)
{
    return tokens < MERGE_BACKWARD_BLOCKS ? tokens : MERGE_BACKWARD_BLOCKS;
}

extern "C" size_t cuda_route_merge_backward_workspace_floats(int tokens, int d, int heads)
{
    (void)heads; /* the larger of the two partitions: the pointers choose at the call */
    const int blocks = merge_backward_blocks(tokens), warps = merge_narrow_backward_warps(tokens);
    const int most = blocks > warps ? blocks : warps;
    return (size_t)(most > 0 ? most : 1) * (size_t)d;
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

MergeArgs merge_backward_args(bf16 *dpartial, GradMode dpartial_mode, float *mean,
                              const bf16 *dout, const bf16 *out, const bf16 *partial,
                              int n_sources, const float *weights, const float *rstd,
                              const bf16 *query, const bf16 *key_norm, float *partials,
                              int tokens, int d, int heads, const RowShape &shape)
{
    MergeArgs args = merge_args(partial, query, key_norm, n_sources, tokens, d, heads, shape);
    args.weights = (float *)weights; /* read only in the backward */
    args.rstd = (float *)rstd;
    args.dpartial = dpartial;
    args.dpartial_add = dpartial_mode == GRAD_ADD;
    args.mean = mean;
    args.dout = dout;
    args.merged = out;
    args.partials = partials;
    return args;
}

void merge_channel_sums_reduce(float *dquery, float *dkey_norm, const bf16 *query,
                               const bf16 *key_norm, float *partials, float *plain_sum,
                               const float *plain_partials, int blocks, int d,
                               cudaStream_t stream)
{
    BlockReduceArgs reduce = {};
    reduce.dquery[0] = dquery;
    reduce.dkey_norm[0] = dkey_norm;
    reduce.query[0] = query;
    reduce.key_norm[0] = key_norm;
    reduce.partials = partials;
    reduce.plain_sum = plain_sum;
    reduce.plain_partials = plain_partials;
    reduce.blocks = blocks;
    reduce.d = d;
    route_block_reduce(reduce, partials ? 1 : 0, stream);
}

extern "C" void cuda_route_merge_backward(bf16 *dpartial, GradMode dpartial_mode,
                                          float *dquery, float *dkey_norm, float *mean,
                                          const bf16 *dout, const bf16 *out,
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
    MergeArgs args = merge_backward_args(dpartial, dpartial_mode, mean, dout, out, partial,
                                         n_sources, weights, rstd, query, key_norm, workspace,
                                         tokens, d, heads, shape);
    int blocks; /* the rows of channel sums to reduce */
    if (merge_narrow_fits(d, heads, pointers, 6)) {
        args.warps = merge_narrow_backward_warps(tokens);
        blocks = merge_narrow_backward_blocks(tokens);
        merge_narrow_backward(args, d, stream);
    } else {
        blocks = merge_backward_blocks(tokens);
        switch (shape.vec) {
        case 8: merge_backward_launch<8>(args, shape.threads, blocks, stream); break;
        case 4: merge_backward_launch<4>(args, shape.threads, blocks, stream); break;
        case 2: merge_backward_launch<2>(args, shape.threads, blocks, stream); break;
        default: merge_backward_launch<1>(args, shape.threads, blocks, stream); break;
        }
    }
    if (partial)
        merge_channel_sums_reduce(dquery, dkey_norm, query, key_norm, workspace, NULL, NULL,
                                  blocks, d, stream);
}
