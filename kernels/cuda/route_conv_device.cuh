/* kernels/cuda/route_conv_device.cuh — what the stream-route kernels share
 * (route_conv_cuda.cu, route_conv_backward_cuda.cu; contract and plan in route_cuda.h).
 * CUDA C++ only.
 *
 * Channel layout. A row of d channels is cut into chunks of ROUTE_CONV_CHUNK channels, one
 * block a chunk; a thread owns one vector of VEC consecutive channels (v = chunk *
 * chunk_vectors + threadIdx.x), so a warp's loads of a row are 32 consecutive vectors and a
 * warp slot starts at a multiple of 32 vectors, as route_device.cuh's placements require.
 * head_dim % VEC == 0: a vector lies in one head.
 *
 * Pieces. The per-token sums the Route needs (over a head, over the row) are made in fixed
 * order from "pieces": the intersections of a head with a chunk, numbered along the row.
 * In channels, with P = lcm(head_dim, ROUTE_CONV_CHUNK),
 *     piece_index(c) = c / head_dim + c / ROUTE_CONV_CHUNK - c / P
 * (the count of piece starts in [0, c], minus 1), so head h's pieces are piece_index(h hd) ..
 * piece_index((h+1) hd - 1) and a row has piece_index(d - 1) + 1 of them, whatever VEC is
 * (the workspace sizes do not depend on pointer alignment). Inside a block a piece is the sum
 * of its warp segments (route_device.cuh) in order.
 *
 * Convolution. E[t] = taps[0] s[t], then += taps[tau] s[t - tau] for tau = 1 .. k - 1 while
 * tau <= t's position in its sequence: fp32, tau ascending, in every kernel alike, so every
 * pass forms the same E bits, and identity taps give E = s exactly. K (1, 2, 4, 8) is the
 * compile-time bound of kernel_size that sizes the register windows; a null source (NULL
 * taps) is a kernel of size 1 with tap 1.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_CONV_DEVICE_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_CONV_DEVICE_CUH

#include "kernels/cuda/route_device.cuh"

enum {
    ROUTE_CONV_CHUNK = 512,            /* channels a block */
    ROUTE_CONV_TILE = 8,               /* tokens the dots and mix kernels hold at once */
    ROUTE_CONV_MAX_CHUNK_SEGMENTS = 64, /* >= 512/32 warp slots + 32 head starts + 1 */
    ROUTE_CONV_DOT_RANGES = 128,       /* token ranges of the dots kernel's walkers */
    ROUTE_CONV_GRADIENT_RANGES = 32,   /* token ranges of the gradient walkers (partials) */
    ROUTE_CONV_RING = 8,               /* stages of the gradient walker's cp.async ring */
};

/* Everything the stream-route kernels read and write (pointer arrays inside: the host arrays
 * travel in the kernel parameters). Unused fields are NULL / 0. */
struct RouteConvArgs {
    const bf16 *sources[CUDA_ROUTE_MAX_SOURCES];
    const bf16 *taps[CUDA_ROUTE_MAX_SOURCES];
    bf16 *dsources[CUDA_ROUTE_MAX_SOURCES];
    float *dtaps[CUDA_ROUTE_MAX_SOURCES];
    const bf16 *query, *key_norm, *dout;
    bf16 *out;
    float *weights, *rstd;           /* [N, tokens, H], [N, tokens] */
    float *value_sums, *key_sums;    /* [N, tokens, pieces]: <E or dout, E>, <q*g, E> */
    float2 *coefficients;            /* [N, tokens, H]: (a, r dz) */
    float *self_terms;               /* [N, tokens]: e */
    float *tap_partials;             /* [ranges, N, kernel_size, d] */
    float *key_partials;             /* [ranges, N, d]: S */
    float *dquery, *dkey_norm;       /* [d] */
    float eps, inverse_width;
    int n_sources, kernel_size, T, tokens, d, heads, head_dim;
    int vectors, head_vectors, segment_period, chunk_vectors, pieces, piece_period;
    int warp_heads;                  /* head_vectors % 32 == 0: a warp lies in one head */
    int ranges;
    int with_dout;                   /* dots kernel: <dout, E> (backward) or <E, E> */
};

/* How a call cuts its rows. */
struct RouteConvShape {
    int vec, vectors, head_vectors, segment_period, chunk_vectors, chunks, threads;
    int pieces, piece_period, K;
};

__host__ __device__ __forceinline__ int piece_index(int channel, int head_dim,
                                                    int piece_period)
{
    return channel / head_dim + channel / ROUTE_CONV_CHUNK - channel / piece_period;
}

static inline int route_conv_piece_period(int head_dim)
{
    return ROUTE_CONV_CHUNK / greatest_common_divisor(ROUTE_CONV_CHUNK, head_dim) * head_dim;
}

static inline int route_conv_pieces(int d, int heads)
{
    const int head_dim = d / heads;
    return piece_index(d - 1, head_dim, route_conv_piece_period(head_dim)) + 1;
}

/* The limits of route_cuda.h, as config errors that name the key. */
static inline void route_conv_check(int n_sources, int kernel_size, int B, int T, int d,
                                    int heads)
{
    route_check_shape(n_sources, d, heads);
    if (kernel_size < 1 || kernel_size > CUDA_ROUTE_CONV_MAX_KERNEL)
        fatal(EXIT_CONFIG, "residual.stream_kernels: a kernel size is %d; the cuda stream route "
              "takes 1 to %d", kernel_size, CUDA_ROUTE_CONV_MAX_KERNEL);
    if (B < 0 || T < 1)
        fatal(EXIT_CONFIG, "train.seq_len = %d (microbatch %d): the cuda stream route needs "
              "sequences of at least one token", T, B);
}

/* The widest VEC (4, 2, 1) that head_dim and every pointer allow, and K from the kernel
 * size (1 when every source is a null source). */
static inline RouteConvShape route_conv_shape(int kernel_size, bool any_taps, int d, int heads,
                                              const void *const *pointers, int count)
{
    RouteConvShape shape;
    const int head_dim = d / heads;
    shape.vec = widest_vector(4, head_dim, pointers, count);
    shape.vectors = d / shape.vec;
    shape.head_vectors = head_dim / shape.vec;
    shape.segment_period = 32 / greatest_common_divisor(32, shape.head_vectors) *
                           shape.head_vectors;
    shape.chunk_vectors = ROUTE_CONV_CHUNK / shape.vec;
    shape.chunks = (shape.vectors + shape.chunk_vectors - 1) / shape.chunk_vectors;
    const int rounded = (shape.vectors + 31) / 32 * 32;
    shape.threads = rounded < shape.chunk_vectors ? rounded : shape.chunk_vectors;
    shape.piece_period = route_conv_piece_period(head_dim);
    shape.pieces = route_conv_pieces(d, heads);
    const int k = any_taps ? kernel_size : 1;
    shape.K = k <= 1 ? 1 : k <= 2 ? 2 : k <= 4 ? 4 : 8;
    return shape;
}

/* The shape fields of the arguments. */
static inline void route_conv_args_shape(RouteConvArgs &args, const RouteConvShape &shape)
{
    args.vectors = shape.vectors;
    args.head_vectors = shape.head_vectors;
    args.segment_period = shape.segment_period;
    args.chunk_vectors = shape.chunk_vectors;
    args.pieces = shape.pieces;
    args.piece_period = shape.piece_period;
    args.warp_heads = shape.head_vectors % 32 == 0;
}

/* Calls LAUNCH(K, VEC) for the shape's pair (every K with every VEC). */
#define ROUTE_CONV_DISPATCH(shape, LAUNCH)                                                       \
    do {                                                                                         \
        switch ((shape).K * 8 + (shape).vec) {                                                   \
        case 1 * 8 + 4: LAUNCH(1, 4); break;                                                     \
        case 1 * 8 + 2: LAUNCH(1, 2); break;                                                     \
        case 1 * 8 + 1: LAUNCH(1, 1); break;                                                     \
        case 2 * 8 + 4: LAUNCH(2, 4); break;                                                     \
        case 2 * 8 + 2: LAUNCH(2, 2); break;                                                     \
        case 2 * 8 + 1: LAUNCH(2, 1); break;                                                     \
        case 4 * 8 + 4: LAUNCH(4, 4); break;                                                     \
        case 4 * 8 + 2: LAUNCH(4, 2); break;                                                     \
        case 4 * 8 + 1: LAUNCH(4, 1); break;                                                     \
        case 8 * 8 + 4: LAUNCH(8, 4); break;                                                     \
        case 8 * 8 + 2: LAUNCH(8, 2); break;                                                     \
        default: LAUNCH(8, 1); break;                                                            \
        }                                                                                        \
    } while (0)

/* ---- device helpers ---- */

/* taps[tau] of vector v as floats, tau < K; zeros past kernel_size; a null source is the
 * kernel (1, 0, ..) */
template <int K, int VEC>
__device__ __forceinline__ void load_taps(float (&tap)[K][VEC], const bf16 *taps,
                                          int kernel_size, int v, int vectors, bool valid)
{
#pragma unroll
    for (int tau = 0; tau < K; tau++)
#pragma unroll
        for (int i = 0; i < VEC; i++)
            tap[tau][i] = !taps && tau == 0 ? 1.0f : 0.0f;
    if (!taps || !valid)
        return;
#pragma unroll
    for (int tau = 0; tau < K; tau++)
        if (tau < kernel_size)
            vector_to_floats<VEC>(vector_load<VEC>(taps, (long long)tau * vectors + v), tap[tau]);
}

/* q * g of vector v (exact in fp32: a product of two bf16), zeros for an idle thread */
template <int VEC>
__device__ __forceinline__ void load_key_weight(float *out, const bf16 *query,
                                                const bf16 *key_norm, int v, bool valid)
{
    float q[VEC] = {0}, g[VEC] = {0};
    if (valid) {
        vector_to_floats<VEC>(vector_load<VEC>(query, v), q);
        vector_to_floats<VEC>(vector_load<VEC>(key_norm, v), g);
    }
#pragma unroll
    for (int i = 0; i < VEC; i++)
        out[i] = q[i] * g[i];
}

/* E of the token whose row sits at window[at]; window[at - tau] holds s[t - tau], at >= K - 1
 * (a constant once the caller's loops are unrolled: the window stays in registers).
 * position: the token's place in its sequence (the taps reach no further back);
 * kernel_size: this source's (1 for a null source). */
template <int K, int VEC, int W>
__device__ __forceinline__ void convolve_at(float *E, const float (&tap)[K][VEC],
                                            const float (&window)[W][VEC], int at,
                                            int kernel_size, int position)
{
#pragma unroll
    for (int i = 0; i < VEC; i++)
        E[i] = tap[0][i] * window[at][i];
#pragma unroll
    for (int tau = 1; tau < K; tau++)
        if (tau < kernel_size && tau <= position)
#pragma unroll
            for (int i = 0; i < VEC; i++)
                E[i] += tap[tau][i] * window[at - tau][i];
}

/* window values of vector v of row `token` of a bf16 [tokens, d] array, or zeros */
template <int VEC>
__device__ __forceinline__ void load_row_values(float *out, const bf16 *array, int token,
                                                int vectors, int v, bool wanted)
{
    if (wanted) {
        vector_to_floats<VEC>(vector_load<VEC>(array, (long long)token * vectors + v), out);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++)
            out[i] = 0.0f;
    }
}

/* vector `index` of a bf16 array from VEC floats, each rounded once */
template <int VEC>
__device__ __forceinline__ void store_row_values(bf16 *array, long long index,
                                                 const float *values)
{
    vector_store<VEC>(array, index, vector_from_floats<VEC>(values));
}

/* ---- host functions of route_conv_cuda.cu the backward shares ---- */

/* Fills the arguments and the shape common to forward and backward (sources, taps, query,
 * key_norm, sizes); `extra` lists the other pointers the vector width must suit. */
RouteConvShape route_conv_prepare(RouteConvArgs &args, const bf16 *const *sources,
                                  const bf16 *const *taps, int n_sources, int kernel_size,
                                  const bf16 *query, const bf16 *key_norm, int B, int T, int d,
                                  int heads, const void *const *extra, int extra_count);

/* Launches the dots kernel: value_sums / key_sums of every piece, token and source;
 * <dout, E> when args.with_dout, else <E, E>. */
void route_conv_dots_launch(const RouteConvArgs &args, const RouteConvShape &shape,
                            cudaStream_t stream);

#endif
