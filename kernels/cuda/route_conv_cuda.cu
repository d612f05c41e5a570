/* kernels/cuda/route_conv_cuda.cu — MSAR's stream route forward on the GPU (DESIGN 2.2), and
 * the dots kernel its backward shares. Contract, plan and expected speed in route_cuda.h;
 * row layout, pieces and the convolution in route_conv_device.cuh; the math is
 * kernels/cpu/route_conv_cpu.c's.
 *
 * dots     grid (source, chunk, token range), a block a chunk of one source's rows. Each
 *          thread walks its range in tiles of ROUTE_CONV_TILE tokens with the taps and a
 *          window of the last K - 1 + TILE rows in registers (the window's history comes from
 *          the previous tile: a row is loaded once). Per token it forms E and two sums over
 *          its channels: <E, E> (forward) or <dout, E> (backward), and <q*g, E>. A tile's
 *          2 TILE sums go over the warp at once (warp_transpose_sum) when a warp lies in one
 *          head, else per segment (warp_segment_sum); the segments of each piece are added
 *          in order by one thread and written to value_sums / key_sums [N, tokens, pieces].
 *          Two barriers a tile.
 * weights  a warp a token: r_n = rsqrt(sum of the pieces of <E,E> / d + eps), in piece order;
 *          z = r_n * (head h's pieces of <q*g, E>), written to `weights`, then the depth
 *          softmax of each head over it (max, exp, 1/sum correctly rounded, as
 *          cuda_route_forward). A warp reads back only what it wrote (__syncwarp orders it).
 * mix      grid (chunk, tile): out[t] = sum_n a_n E_n[t], n in order, fp32 until one rounding.
 *          Per source a thread loads the tile and its K - 1 rows of history (from L2: the
 *          neighbouring tile read them) and the tile's weights, and forms E exactly as the
 *          dots kernel did.
 */
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_conv_device.cuh"

#include <string.h>

enum { ROUTE_CONV_WARPS_PER_BLOCK = 8 }; /* weights kernel: a warp a token */

/* ---- dots ---- */

template <int K, int VEC>
__global__ void __launch_bounds__(ROUTE_CONV_CHUNK / VEC, 1)
route_conv_dots_kernel(const __grid_constant__ RouteConvArgs args)
{
    constexpr int TILE = ROUTE_CONV_TILE, W = TILE + K - 1, SUMS = 2 * TILE;
    __shared__ float segment_sums[ROUTE_CONV_MAX_CHUNK_SEGMENTS][SUMS];
    const int n = blockIdx.x, chunk = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tokens = args.tokens, hv = args.head_vectors, period = args.segment_period;
    const int chunk_first = chunk * args.chunk_vectors;
    const int chunk_end = min(chunk_first + args.chunk_vectors, args.vectors);
    const int v = chunk_first + (int)threadIdx.x;
    const SlotPlace place = slot_place_at(v, args.vectors, hv, period);
    const bool valid = place.valid;
    const int first_segment = segment_index(chunk_first, hv, period);
    const bf16 *source = args.sources[n], *taps = args.taps[n];
    const int kernel_size = taps ? args.kernel_size : 1;

    float tap[K][VEC], key_weight[VEC];
    load_taps<K, VEC>(tap, taps, kernel_size, v, args.vectors, valid);
    load_key_weight<VEC>(key_weight, args.query, args.key_norm, v, valid);

    /* this block's share of the tiles, walked in order */
    const int tiles = (tokens + TILE - 1) / TILE;
    const int tile_first = (int)((long long)tiles * blockIdx.z / gridDim.z);
    const int tile_last = (int)((long long)tiles * (blockIdx.z + 1) / gridDim.z);

    /* window[u] = s[t0 - (K - 1) + u]: the history rows, then the tile's; the history of the
     * first tile is loaded here (only the rows the taps reach), later ones are shifted in */
    float window[W][VEC];
#pragma unroll
    for (int u = 0; u < K - 1; u++) {
        const int token = tile_first * TILE - (K - 1) + u;
        load_row_values<VEC>(window[u], source, token, args.vectors, v,
                             valid && token >= 0 && u >= K - kernel_size);
    }

    const int head_first = chunk_first / hv;
    const int chunk_pieces = (chunk_end - 1) / hv - head_first + 1;
    for (int tile = tile_first; tile < tile_last; tile++) {
        const int t0 = tile * TILE;
#pragma unroll
        for (int j = 0; j < TILE; j++)
            load_row_values<VEC>(window[K - 1 + j], source, t0 + j, args.vectors, v,
                                 valid && t0 + j < tokens);

        /* sums[j]: <E or dout, E> of token t0 + j over this thread's channels;
         * sums[TILE + j]: <q*g, E> */
        float sums[SUMS];
#pragma unroll
        for (int j = 0; j < TILE; j++) {
            const int token = t0 + j;
            float E[VEC], other[VEC];
            convolve_at<K, VEC, W>(E, tap, window, K - 1 + j, kernel_size, token % args.T);
            if (args.with_dout) {
                load_row_values<VEC>(other, args.dout, token, args.vectors, v,
                                     valid && token < tokens);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    other[i] = E[i];
            }
            float value = 0.0f, key = 0.0f;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                value += other[i] * E[i];
                key += key_weight[i] * E[i];
            }
            sums[j] = value;
            sums[TILE + j] = key;
        }

        /* over the warp: its segments' sums into segment_sums [segment of the chunk][sum].
         * The previous tile's readers finished before the barrier that ended it. */
        if (args.warp_heads) {
            /* the warp is one segment; its lanes all valid or all idle */
            int index;
            const float sum = warp_transpose_sum<SUMS>(sums, lane, &index);
            const int warp_first = chunk_first + warp * 32;
            if (index >= 0 && warp_first < args.vectors)
                segment_sums[segment_index(warp_first, hv, period) - first_segment][index] = sum;
        } else {
#pragma unroll
            for (int s = 0; s < SUMS; s++) {
                const float sum = warp_segment_sum(sums[s], lane, place.reach);
                if (place.starts_segment)
                    segment_sums[place.segment - first_segment][s] = sum;
            }
        }
        __syncthreads();

        /* a thread per (piece of the chunk, sum): the piece's segments in order */
        for (int i = threadIdx.x; i < SUMS * chunk_pieces; i += blockDim.x) {
            const int p = i / SUMS, s = i - p * SUMS;
            const int token = t0 + s % TILE;
            if (token >= tokens)
                continue;
            const int h = head_first + p;
            const int piece_first = max(h * hv, chunk_first);
            const int piece_end = min((h + 1) * hv, chunk_end);
            const int from = segment_index(piece_first, hv, period) - first_segment;
            const int to = segment_index(piece_end - 1, hv, period) - first_segment;
            float total = 0.0f;
            for (int k = from; k <= to; k++)
                total += segment_sums[k][s];
            const int piece = piece_index(piece_first * VEC, args.head_dim, args.piece_period);
            float *target = s < TILE ? args.value_sums : args.key_sums;
            target[((long long)n * tokens + token) * args.pieces + piece] = total;
        }
        __syncthreads();

        /* the tile's last K - 1 rows are the next tile's history */
#pragma unroll
        for (int u = 0; u < K - 1; u++)
#pragma unroll
            for (int i = 0; i < VEC; i++)
                window[u][i] = window[TILE + u][i];
    }
}

template <int K, int VEC>
static void route_conv_dots_launch_shape(const RouteConvArgs &args, const RouteConvShape &shape,
                                         cudaStream_t stream)
{
    const int tiles = (args.tokens + ROUTE_CONV_TILE - 1) / ROUTE_CONV_TILE;
    const dim3 grid(args.n_sources, shape.chunks,
                    tiles < ROUTE_CONV_DOT_RANGES ? tiles : ROUTE_CONV_DOT_RANGES);
    route_conv_dots_kernel<K, VEC><<<grid, shape.threads, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

void route_conv_dots_launch(const RouteConvArgs &args, const RouteConvShape &shape,
                            cudaStream_t stream)
{
#define LAUNCH(K, VEC) route_conv_dots_launch_shape<K, VEC>(args, shape, stream)
    ROUTE_CONV_DISPATCH(shape, LAUNCH);
#undef LAUNCH
}

/* ---- weights ---- */

__global__ void __launch_bounds__(32 * ROUTE_CONV_WARPS_PER_BLOCK)
route_conv_weights_kernel(const __grid_constant__ RouteConvArgs args)
{
    __shared__ float source_rstd[ROUTE_CONV_WARPS_PER_BLOCK][CUDA_ROUTE_MAX_SOURCES];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x * ROUTE_CONV_WARPS_PER_BLOCK + warp;
    if (t >= args.tokens)
        return; /* a whole warp; no block barrier below */
    const int N = args.n_sources, H = args.heads, tokens = args.tokens, pieces = args.pieces;

    for (int n = lane; n < N; n += 32) {
        const float *parts = args.value_sums + ((long long)n * tokens + t) * pieces;
        float squares = 0.0f;
        for (int p = 0; p < pieces; p++)
            squares += parts[p];
        const float r = rsqrtf(squares * args.inverse_width + args.eps);
        source_rstd[warp][n] = r;
        args.rstd[(long long)n * tokens + t] = r;
    }
    __syncwarp();
    for (int i = lane; i < N * H; i += 32) {
        const int n = i / H, h = i - n * H;
        const float *parts = args.key_sums + ((long long)n * tokens + t) * pieces;
        const int from = piece_index(h * args.head_dim, args.head_dim, args.piece_period);
        const int to = piece_index((h + 1) * args.head_dim - 1, args.head_dim, args.piece_period);
        float dot = 0.0f;
        for (int p = from; p <= to; p++)
            dot += parts[p];
        args.weights[((long long)n * tokens + t) * H + h] = source_rstd[warp][n] * dot;
    }
    __syncwarp(); /* the scores are in `weights`; each head's are read by one lane */
    for (int h = lane; h < H; h += 32) {
        float max_score = -INFINITY, sum = 0.0f;
        for (int n = 0; n < N; n++)
            max_score = fmaxf(max_score, args.weights[((long long)n * tokens + t) * H + h]);
        for (int n = 0; n < N; n++)
            sum += __expf(args.weights[((long long)n * tokens + t) * H + h] - max_score);
        const float inverse = __frcp_rn(sum);
        for (int n = 0; n < N; n++) {
            float *weight = &args.weights[((long long)n * tokens + t) * H + h];
            *weight = __expf(*weight - max_score) * inverse;
        }
    }
}

/* ---- mix ---- */

template <int K, int VEC>
__global__ void __launch_bounds__(ROUTE_CONV_CHUNK / VEC)
route_conv_mix_kernel(const __grid_constant__ RouteConvArgs args)
{
    constexpr int TILE = ROUTE_CONV_TILE, W = TILE + K - 1;
    const int chunk = blockIdx.x, tokens = args.tokens, H = args.heads;
    const int v = chunk * args.chunk_vectors + (int)threadIdx.x;
    if (v >= args.vectors)
        return; /* no barriers in this kernel */
    const int head = v / args.head_vectors;
    const int tiles = (tokens + TILE - 1) / TILE;

    for (int tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
        const int t0 = tile * TILE;
        float mix[TILE][VEC];
#pragma unroll
        for (int j = 0; j < TILE; j++)
#pragma unroll
            for (int i = 0; i < VEC; i++)
                mix[j][i] = 0.0f;

        for (int n = 0; n < args.n_sources; n++) {
            const bf16 *source = args.sources[n], *taps = args.taps[n];
            const int kernel_size = taps ? args.kernel_size : 1;
            float tap[K][VEC], window[W][VEC], weight[TILE];
            load_taps<K, VEC>(tap, taps, kernel_size, v, args.vectors, true);
#pragma unroll
            for (int u = 0; u < W; u++) {
                const int token = t0 - (K - 1) + u;
                load_row_values<VEC>(window[u], source, token, args.vectors, v,
                                     token >= 0 && token < tokens && u >= K - kernel_size);
            }
#pragma unroll
            for (int j = 0; j < TILE; j++)
                weight[j] = t0 + j < tokens
                                ? args.weights[((long long)n * tokens + t0 + j) * H + head]
                                : 0.0f;
#pragma unroll
            for (int j = 0; j < TILE; j++) {
                float E[VEC];
                convolve_at<K, VEC, W>(E, tap, window, K - 1 + j, kernel_size, (t0 + j) % args.T);
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    mix[j][i] += weight[j] * E[i];
            }
        }
#pragma unroll
        for (int j = 0; j < TILE; j++)
            if (t0 + j < tokens)
                store_row_values<VEC>(args.out, (long long)(t0 + j) * args.vectors + v, mix[j]);
    }
}

template <int K, int VEC>
static void route_conv_mix_launch(const RouteConvArgs &args, const RouteConvShape &shape,
                                  cudaStream_t stream)
{
    const int tiles = (args.tokens + ROUTE_CONV_TILE - 1) / ROUTE_CONV_TILE;
    const dim3 grid(shape.chunks, tiles < 65535 ? tiles : 65535);
    route_conv_mix_kernel<K, VEC><<<grid, shape.threads, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

/* ---- the op ---- */

extern "C" size_t cuda_route_conv_forward_workspace_floats(int n_sources, int tokens, int d,
                                                           int heads)
{
    if (n_sources < 1 || tokens < 1 || heads < 1 || d < 1 || d % heads != 0)
        return 1;
    return 2 * (size_t)n_sources * tokens * route_conv_pieces(d, heads);
}

/* (route_conv_device.cuh) */
RouteConvShape route_conv_prepare(RouteConvArgs &args, const bf16 *const *sources,
                                  const bf16 *const *taps, int n_sources, int kernel_size,
                                  const bf16 *query, const bf16 *key_norm, int B, int T, int d,
                                  int heads, const void *const *extra, int extra_count)
{
    const void *pointers[3 * CUDA_ROUTE_MAX_SOURCES + 4];
    int count = 0;
    bool any_taps = false;
    for (int n = 0; n < CUDA_ROUTE_MAX_SOURCES; n++) {
        args.sources[n] = n < n_sources ? sources[n] : NULL;
        args.taps[n] = n < n_sources ? taps[n] : NULL;
        if (n < n_sources) {
            pointers[count++] = sources[n];
            pointers[count++] = taps[n];
            any_taps = any_taps || taps[n] != NULL;
        }
    }
    pointers[count++] = query;
    pointers[count++] = key_norm;
    for (int i = 0; i < extra_count; i++)
        pointers[count++] = extra[i];
    const RouteConvShape shape = route_conv_shape(kernel_size, any_taps, d, heads, pointers, count);
    route_conv_args_shape(args, shape);
    args.query = query;
    args.key_norm = key_norm;
    args.inverse_width = 1.0f / (float)d;
    args.n_sources = n_sources;
    args.kernel_size = kernel_size;
    args.T = T;
    args.tokens = B * T;
    args.d = d;
    args.heads = heads;
    args.head_dim = d / heads;
    return shape;
}

extern "C" void cuda_route_conv_forward(bf16 *out, float *weights, float *rstd,
                                        const bf16 *const *sources, const bf16 *const *taps,
                                        int n_sources, int kernel_size, const bf16 *query,
                                        const bf16 *key_norm, int B, int T, int d, int heads,
                                        float eps, float *workspace, cudaStream_t stream)
{
    route_conv_check(n_sources, kernel_size, B, T, d, heads);
    const int tokens = B * T;
    if (tokens <= 0)
        return;
    RouteConvArgs args;
    memset(&args, 0, sizeof args);
    const void *extra[] = {out};
    const RouteConvShape shape = route_conv_prepare(args, sources, taps, n_sources, kernel_size,
                                                    query, key_norm, B, T, d, heads, extra, 1);
    args.out = out;
    args.weights = weights;
    args.rstd = rstd;
    args.eps = eps;
    args.value_sums = workspace;
    args.key_sums = workspace + (size_t)n_sources * tokens * shape.pieces;
    args.with_dout = 0;

    route_conv_dots_launch(args, shape, stream);
    const int warps = ROUTE_CONV_WARPS_PER_BLOCK;
    route_conv_weights_kernel<<<(tokens + warps - 1) / warps, 32 * warps, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
#define LAUNCH(K, VEC) route_conv_mix_launch<K, VEC>(args, shape, stream)
    ROUTE_CONV_DISPATCH(shape, LAUNCH);
#undef LAUNCH
}

extern "C" void cuda_route_conv_mix(bf16 *out, const float *weights,
                                    const bf16 *const *sources, const bf16 *const *taps,
                                    int n_sources, int kernel_size, int B, int T, int d,
                                    int heads, cudaStream_t stream)
{
    route_conv_check(n_sources, kernel_size, B, T, d, heads);
    if (B * T <= 0)
        return;
    RouteConvArgs args;
    memset(&args, 0, sizeof args);
    /* the vector width from the pointers the mix reads (query and key_norm it does not:
     * NULL suits every width); each channel's sum is the same whatever the width */
    const void *extra[] = {out};
    const RouteConvShape shape = route_conv_prepare(args, sources, taps, n_sources, kernel_size,
                                                    NULL, NULL, B, T, d, heads, extra, 1);
    args.out = out;
    args.weights = const_cast<float *>(weights); /* the mix only reads them */
#define LAUNCH(K, VEC) route_conv_mix_launch<K, VEC>(args, shape, stream)
    ROUTE_CONV_DISPATCH(shape, LAUNCH);
#undef LAUNCH
}
