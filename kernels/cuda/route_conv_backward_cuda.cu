/* kernels/cuda/route_conv_backward_cuda.cu — MSAR's stream route backward on the GPU
 * (DESIGN 2.2). Contract, plan and expected speed in route_cuda.h; layout, pieces and the
 * convolution in route_conv_device.cuh; the derivation is kernels/cpu/route_conv_cpu.c's
 * (route_cpu.c's Route backward, stream_cpu.c's convolution backward). Four launches:
 *
 * dots     route_conv_cuda.cu's, with dout: D = <dout, E> and P = <q*g, E> per piece.
 * scores   a warp a token, lane h a head: D and P of head h from its pieces in order;
 *          mean = sum_n a D, dz = a (D - mean); coefficients [N, tokens, H] = (a, r dz);
 *          e[n] = r^2 (r sum_h dz P) / d over the warp (warp_sum, a fixed butterfly).
 * walker   grid (source, chunk, token range of ROUTE_CONV_GRADIENT_RANGES): a thread owns a
 *          vector of channels and walks its range backwards, from hi = the last token whose
 *          dE the range's ds needs (last - 1 + k - 1, within the sequence) down to first.
 *          A cp.async ring of ROUTE_CONV_RING stages brings each step's inputs ahead of use
 *          (no registers held): the row s[t - K + 1] that enters the window, dout[t], ds[t],
 *          (a, r dz) and e. Per token t, in registers:
 *            window[u] = s[t - K + 1 + u]        E = taps * window (route_conv_device.cuh)
 *            dE        = a dout + (r dz) q g - e E
 *            later[j]  = dE[t + j]               (shifted one place a step)
 *          and for t in the range: S += (r dz) E; dtaps[tau] += dE s[t - tau];
 *          ds[t] += sum_tau taps[tau] dE[t + tau] (bf16 read, fp32 sum, one rounding).
 *          Tokens past the range (at most k - 1) only feed `later`. At the end each thread
 *          writes its S and dtaps sums to the partials [range, source, ...]. No barriers:
 *          each thread reads back only the ring entries it copied (cp.async.wait_group).
 * reduce   per channel and tap: the ranges' partials in range order, sources in order for
 *          S; dtaps += , dq += g S, dg += q S.
 * Every partition depends on `tokens` alone: the same inputs give the same bits.
 */
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_conv_device.cuh"

#include <string.h>

enum {
    ROUTE_CONV_SCORE_WARPS = 8,      /* score kernel: a warp a token */
    ROUTE_CONV_REDUCE_THREADS = 256,
    ROUTE_CONV_REDUCE_BLOCKS = 1024, /* a grid-stride loop beyond */
};

/* ---- scores ---- */

__global__ void __launch_bounds__(32 * ROUTE_CONV_SCORE_WARPS)
route_conv_score_grads_kernel(const __grid_constant__ RouteConvArgs args)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x * ROUTE_CONV_SCORE_WARPS + warp;
    if (t >= args.tokens)
        return; /* a whole warp */
    const int N = args.n_sources, H = args.heads, tokens = args.tokens, pieces = args.pieces;
    const int h = lane;
    const bool speaks = h < H; /* lanes past the heads add zeros to the warp sums */
    int from = 0, to = -1;
    if (speaks) {
        from = piece_index(h * args.head_dim, args.head_dim, args.piece_period);
        to = piece_index((h + 1) * args.head_dim - 1, args.head_dim, args.piece_period);
    }

    /* mean = sum_n a D over the sources in order */
    float mean = 0.0f;
    for (int n = 0; n < N && speaks; n++) {
        const float *values = args.value_sums + ((long long)n * tokens + t) * pieces;
        float D = 0.0f;
        for (int p = from; p <= to; p++)
            D += values[p];
        mean += args.weights[((long long)n * tokens + t) * H + h] * D;
    }
    for (int n = 0; n < N; n++) {
        const long long row = (long long)n * tokens + t;
        const float r = args.rstd[row];
        float term = 0.0f;
        if (speaks) {
            float D = 0.0f, P = 0.0f;
            for (int p = from; p <= to; p++) {
                D += args.value_sums[row * pieces + p];
                P += args.key_sums[row * pieces + p];
            }
            const float a = args.weights[row * H + h];
            const float dz = a * (D - mean);
            args.coefficients[row * H + h] = make_float2(a, r * dz);
            term = dz * P;
        }
        const float total = warp_sum(term); /* every lane: N is the same for all */
        if (lane == 0)
            args.self_terms[row] = r * r * (r * total * args.inverse_width);
    }
}

/* ---- walker ---- */

/* One ring stage, in bytes from its start: the (a, r dz) pairs, the e values, then the rows
 * entering the window, dout and ds, each [threads], 16-byte aligned pieces. */
struct RingLayout {
    int coefficients, self_terms, rows, douts, grads, stage;
};

static inline int round_up_16_bytes(int bytes)
{
    return (bytes + 15) / 16 * 16;
}

static RingLayout ring_layout(int threads, int vec)
{
    RingLayout layout;
    const int vector_bytes = round_up_16_bytes(threads * 2 * vec);
    layout.coefficients = 0;
    layout.self_terms = round_up_16_bytes(threads * 8);
    layout.rows = layout.self_terms + round_up_16_bytes(threads * 4);
    layout.douts = layout.rows + vector_bytes;
    layout.grads = layout.douts + vector_bytes;
    layout.stage = layout.grads + vector_bytes;
    return layout;
}

/* cp.async of 4 or 8 bytes (the ring's fp32 values) */
template <int BYTES>
__device__ __forceinline__ void copy_words_async(void *shared_destination, const void *source)
{
    const unsigned destination = (unsigned)__cvta_generic_to_shared(shared_destination);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(destination), "l"(source),
                 "n"(BYTES) : "memory");
}

/* What one walker thread works on. */
struct Walk {
    const bf16 *source;
    bf16 *grad; /* dsources[n], or NULL */
    int n, v, head, first, last, hi;
};

/* Starts the copies of ring item `item` (token hi - item) and commits them; an empty group
 * past the walk. */
template <int K, int VEC>
__device__ __forceinline__ void ring_issue(unsigned char *ring, const RingLayout &layout,
                                           const RouteConvArgs &args, const Walk &walk,
                                           int item)
{
    if (walk.hi - item >= walk.first) {
        const int t = walk.hi - item, entering = t - (K - 1);
        unsigned char *stage = ring + (item % ROUTE_CONV_RING) * layout.stage;
        const long long row = (long long)walk.n * args.tokens + t;
        BfVector<VEC> *rows = reinterpret_cast<BfVector<VEC> *>(stage + layout.rows);
        BfVector<VEC> *douts = reinterpret_cast<BfVector<VEC> *>(stage + layout.douts);
        BfVector<VEC> *grads = reinterpret_cast<BfVector<VEC> *>(stage + layout.grads);
        if (entering >= 0)
            copy_vector_async<VEC>(rows + threadIdx.x, walk.source,
                                   (long long)entering * args.vectors + walk.v);
        else
            rows[threadIdx.x] = vector_zero<VEC>();
        copy_vector_async<VEC>(douts + threadIdx.x, args.dout,
                               (long long)t * args.vectors + walk.v);
        if (walk.grad && t < walk.last)
            copy_vector_async<VEC>(grads + threadIdx.x, walk.grad,
                                   (long long)t * args.vectors + walk.v);
        copy_words_async<8>(stage + layout.coefficients + 8 * threadIdx.x,
                            &args.coefficients[row * args.heads + walk.head]);
        copy_words_async<4>(stage + layout.self_terms + 4 * threadIdx.x, &args.self_terms[row]);
    }
    copy_async_commit();
}

template <int K, int VEC>
__global__ void __launch_bounds__(ROUTE_CONV_CHUNK / VEC)
route_conv_gradient_kernel(const __grid_constant__ RouteConvArgs args, RingLayout layout)
{
    extern __shared__ __align__(16) unsigned char ring[];
    const int n = blockIdx.x, range = blockIdx.z, tokens = args.tokens, T = args.T;
    const int v = blockIdx.y * args.chunk_vectors + (int)threadIdx.x;
    if (v >= args.vectors)
        return; /* no barriers in this kernel */
    const bf16 *taps = args.taps[n];
    const int kernel_size = taps ? args.kernel_size : 1;
    const bool tap_grads = taps && args.dtaps[n];

    Walk walk;
    walk.source = args.sources[n];
    walk.grad = args.dsources[n];
    walk.n = n;
    walk.v = v;
    walk.head = v / args.head_vectors;
    walk.first = (int)((long long)tokens * range / args.ranges);
    walk.last = (int)((long long)tokens * (range + 1) / args.ranges);
    const int sequence_end = (walk.last - 1) / T * T + T - 1;
    walk.hi = min(walk.last - 1 + kernel_size - 1, sequence_end);
    const int items = walk.hi - walk.first + 1;

    float tap[K][VEC], key_weight[VEC];
    load_taps<K, VEC>(tap, taps, kernel_size, v, args.vectors, true);
    load_key_weight<VEC>(key_weight, args.query, args.key_norm, v, true);

    /* window[u] = s[t - (K - 1) + u] at token t (u = K - 1: t itself); window[0] arrives
     * with the token's ring item, the others are here for t = hi */
    float window[K][VEC], later[K][VEC], tap_sums[K][VEC], key_sum[VEC];
#pragma unroll
    for (int u = 0; u < K; u++) {
        const int token = walk.hi - (K - 1) + u;
        load_row_values<VEC>(window[u], walk.source, token, args.vectors, v, u > 0 && token >= 0);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            later[u][i] = tap_sums[u][i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < VEC; i++)
        key_sum[i] = 0.0f;

    for (int item = 0; item < ROUTE_CONV_RING - 1; item++)
        ring_issue<K, VEC>(ring, layout, args, walk, item);
    for (int item = 0; item < items; item++) {
        ring_issue<K, VEC>(ring, layout, args, walk, item + ROUTE_CONV_RING - 1);
        copy_async_wait<ROUTE_CONV_RING - 1>();
        const unsigned char *stage = ring + (item % ROUTE_CONV_RING) * layout.stage;
        const int t = walk.hi - item, position = t % T;
        const float2 coefficient =
            reinterpret_cast<const float2 *>(stage + layout.coefficients)[threadIdx.x];
        const float self_term =
            reinterpret_cast<const float *>(stage + layout.self_terms)[threadIdx.x];
        float dy[VEC], E[VEC], dE[VEC];
        vector_to_floats<VEC>(
            reinterpret_cast<const BfVector<VEC> *>(stage + layout.rows)[threadIdx.x], window[0]);
        vector_to_floats<VEC>(
            reinterpret_cast<const BfVector<VEC> *>(stage + layout.douts)[threadIdx.x], dy);
        convolve_at<K, VEC, K>(E, tap, window, K - 1, kernel_size, position);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            dE[i] = coefficient.x * dy[i] + coefficient.y * key_weight[i] - self_term * E[i];
#pragma unroll
        for (int j = K - 1; j > 0; j--)
#pragma unroll
            for (int i = 0; i < VEC; i++)
                later[j][i] = later[j - 1][i];
#pragma unroll
        for (int i = 0; i < VEC; i++)
            later[0][i] = dE[i];

        if (t < walk.last) {
#pragma unroll
            for (int i = 0; i < VEC; i++)
                key_sum[i] += coefficient.y * E[i];
            if (tap_grads)
#pragma unroll
                for (int tau = 0; tau < K; tau++)
                    if (tau < kernel_size && tau <= position)
#pragma unroll
                        for (int i = 0; i < VEC; i++)
                            tap_sums[tau][i] += dE[i] * window[K - 1 - tau][i];
            if (walk.grad) {
                float sum[VEC], grad[VEC];
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    sum[i] = tap[0][i] * later[0][i];
#pragma unroll
                for (int tau = 1; tau < K; tau++)
                    if (tau < kernel_size && position + tau < T)
#pragma unroll
                        for (int i = 0; i < VEC; i++)
                            sum[i] += tap[tau][i] * later[tau][i];
                vector_to_floats<VEC>(
                    reinterpret_cast<const BfVector<VEC> *>(stage + layout.grads)[threadIdx.x],
                    grad);
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    grad[i] += sum[i];
                store_row_values<VEC>(walk.grad, (long long)t * args.vectors + v, grad);
            }
        }
        /* one token back: every row moves up one place, window[0] comes with the next item */
#pragma unroll
        for (int u = K - 1; u > 0; u--)
#pragma unroll
            for (int i = 0; i < VEC; i++)
                window[u][i] = window[u - 1][i];
    }

    const long long partial = (long long)range * args.n_sources + n;
    float *key_partial = args.key_partials + partial * args.d + (long long)v * VEC;
#pragma unroll
    for (int i = 0; i < VEC; i++)
        key_partial[i] = key_sum[i];
    if (tap_grads)
#pragma unroll
        for (int tau = 0; tau < K; tau++)
            if (tau < kernel_size)
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    args.tap_partials[(partial * args.kernel_size + tau) * args.d +
                                      (long long)v * VEC + i] = tap_sums[tau][i];
}

template <int K, int VEC>
static void route_conv_gradient_launch(const RouteConvArgs &args, const RouteConvShape &shape,
                                       cudaStream_t stream)
{
    const RingLayout layout = ring_layout(shape.threads, VEC);
    const size_t bytes = (size_t)ROUTE_CONV_RING * layout.stage;
    resident_blocks(route_conv_gradient_kernel<K, VEC>, shape.threads, bytes,
                    "the cuda stream route backward");
    const dim3 grid(args.n_sources, shape.chunks, args.ranges);
    route_conv_gradient_kernel<K, VEC><<<grid, shape.threads, bytes, stream>>>(args, layout);
    CUDA_CHECK_LAUNCH();
}

/* ---- reduce ---- */

__global__ void __launch_bounds__(ROUTE_CONV_REDUCE_THREADS)
route_conv_reduce_kernel(const __grid_constant__ RouteConvArgs args)
{
    const int N = args.n_sources, d = args.d;
    const long long tap_items = (long long)N * args.kernel_size * d, items = tap_items + d;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (long long)gridDim.x * blockDim.x) {
        if (i < tap_items) {
            const long long per_source = (long long)args.kernel_size * d;
            const int n = (int)(i / per_source);
            const long long offset = i - n * per_source;
            if (!args.taps[n] || !args.dtaps[n])
                continue;
            float sum = 0.0f;
            for (int range = 0; range < args.ranges; range++)
                sum += args.tap_partials[((long long)range * N + n) * per_source + offset];
            args.dtaps[n][offset] += sum;
        } else {
            const int c = (int)(i - tap_items);
            float sum = 0.0f;
            for (int range = 0; range < args.ranges; range++)
                for (int n = 0; n < N; n++)
                    sum += args.key_partials[((long long)range * N + n) * d + c];
            args.dquery[c] += bf16_bits_to_float(args.key_norm[c]) * sum;
            args.dkey_norm[c] += bf16_bits_to_float(args.query[c]) * sum;
        }
    }
}

/* ---- the op ---- */

static int gradient_ranges(int tokens)
{
    return tokens < ROUTE_CONV_GRADIENT_RANGES ? tokens : ROUTE_CONV_GRADIENT_RANGES;
}

extern "C" size_t cuda_route_conv_backward_workspace_floats(int n_sources, int kernel_size,
                                                            int tokens, int d, int heads)
{
    if (n_sources < 1 || kernel_size < 1 || tokens < 1 || heads < 1 || d < 1 || d % heads != 0)
        return 1;
    const size_t per_token = 2 * (size_t)heads + 1 + 2 * (size_t)route_conv_pieces(d, heads);
    return (size_t)n_sources * tokens * per_token +
           (size_t)gradient_ranges(tokens) * n_sources * (kernel_size + 1) * d;
}

extern "C" void cuda_route_conv_backward(bf16 *const *dsources, float *const *dtaps,
                                         float *dquery, float *dkey_norm, const bf16 *dout,
                                         const bf16 *const *sources, const bf16 *const *taps,
                                         int n_sources, int kernel_size, const float *weights,
                                         const float *rstd, const bf16 *query,
                                         const bf16 *key_norm, int B, int T, int d, int heads,
                                         float *workspace, cudaStream_t stream)
{
    route_conv_check(n_sources, kernel_size, B, T, d, heads);
    const int tokens = B * T;
    if (tokens <= 0)
        return;
    RouteConvArgs args;
    memset(&args, 0, sizeof args);
    const void *extra[CUDA_ROUTE_MAX_SOURCES + 1];
    extra[0] = dout;
    for (int n = 0; n < n_sources; n++)
        extra[1 + n] = dsources[n];
    const RouteConvShape shape = route_conv_prepare(args, sources, taps, n_sources, kernel_size,
                                                    query, key_norm, B, T, d, heads, extra,
                                                    1 + n_sources);
    for (int n = 0; n < n_sources; n++) {
        args.dsources[n] = dsources[n];
        args.dtaps[n] = taps[n] ? dtaps[n] : NULL;
    }
    args.dout = dout;
    args.weights = (float *)weights; /* read only here */
    args.rstd = (float *)rstd;
    args.dquery = dquery;
    args.dkey_norm = dkey_norm;
    args.ranges = gradient_ranges(tokens);
    args.with_dout = 1;

    /* the workspace: (a, r dz) pairs first (8-byte aligned), then e, the piece sums and the
     * walkers' partials */
    const size_t rows = (size_t)n_sources * tokens;
    args.coefficients = reinterpret_cast<float2 *>(workspace);
    args.self_terms = workspace + 2 * rows * heads;
    args.value_sums = args.self_terms + rows;
    args.key_sums = args.value_sums + rows * shape.pieces;
    args.tap_partials = args.key_sums + rows * shape.pieces;
    args.key_partials = args.tap_partials + (size_t)args.ranges * n_sources * kernel_size * d;

    route_conv_dots_launch(args, shape, stream);
    const int warps = ROUTE_CONV_SCORE_WARPS;
    route_conv_score_grads_kernel<<<(tokens + warps - 1) / warps, 32 * warps, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
#define LAUNCH(K, VEC) route_conv_gradient_launch<K, VEC>(args, shape, stream)
    ROUTE_CONV_DISPATCH(shape, LAUNCH);
#undef LAUNCH
    const long long items = (long long)n_sources * kernel_size * d + d;
    long long blocks = (items + ROUTE_CONV_REDUCE_THREADS - 1) / ROUTE_CONV_REDUCE_THREADS;
    if (blocks > ROUTE_CONV_REDUCE_BLOCKS)
        blocks = ROUTE_CONV_REDUCE_BLOCKS;
    route_conv_reduce_kernel<<<(int)blocks, ROUTE_CONV_REDUCE_THREADS, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}
