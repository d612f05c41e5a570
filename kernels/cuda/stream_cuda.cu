/* kernels/cuda/stream_cuda.cu — MSAR's gated stream mix on the GPU (DESIGN 2.2; contract in
 * route_cuda.h; the math and its backward are kernels/cpu/stream_cpu.c's). The convolution
 * is kernels/cuda/stream_conv_cuda.cu's.
 *
 * Mix, m streams o_r [tokens, d] bf16, mix_bias fp32 [m], mix_proj (theta) bf16 [m, d]
 * (narrow rows, stream_mix.cuh: d % 256 == 0 up to 1536 and aligned, go to the warp-a-token
 * kernels of stream_mix_narrow_cuda.cu; the kernels here take every other width):
 * - forward: one block a token at a time (persistent grid), one read of each stream:
 *   squares and <theta_r, o_r> in one pass (warp sums, then the warps' sums in order, the
 *   same in every thread), rho = rsqrt(squares / d + eps), g = beta + rho <theta, o>,
 *   w = sigmoid(g) in double rounded once, out += w o in fp32; one barrier a stream (two
 *   alternating shared buffers).
 * - backward: block (token range, stream r): everything about stream r depends only on
 *   o_r, dout and the saved w, rho, so each block reads o_r and dout once a token:
 *   dw = <dout, o>, dg = dw w (1 - w), mean(du u) = dg rho <theta, o> / d,
 *   do += w dout + rho (dg theta - rho o mean(du u)); dtheta and dbeta per block in
 *   registers, then added over the token ranges in order by a second kernel. A stream not
 *   given is skipped (and the given ones take more token ranges, mix_range_count); with
 *   the gate (alpha) dout is d x, d out = alpha dout, and each block also sums
 *   w < dout, o > for d alpha, which the second kernel adds in a fixed order.
 */
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"
#include "kernels/cuda/stream_mix.cuh"

enum {
    STREAM_PARTIALS = 128,      /* fixed token ranges of the parameter-gradient sums */
    MIX_REDUCE_SLICES = 8,      /* warps splitting the ranges in the mix backward's sums */
};

static void stream_check_width(int d)
{
    if (d < 1 || d > CUDA_ROUTE_MAX_WIDTH)
        fatal(EXIT_CONFIG, "model.d_model = %d: the cuda stream kernels take 1 to %d channels",
              d, CUDA_ROUTE_MAX_WIDTH);
}

/* ---- mix ---- */

/* this thread's vectors of one row (zeros past the row); MUTABLE for an array this kernel
 * also writes (a "+=" target): plain loads, not the read-only path */
template <int VEC, bool MUTABLE = false>
__device__ __forceinline__ void load_owned(BfVector<VEC> *row, const bf16 *array,
                                           long long row_start, int vectors, int slots)
{
#pragma unroll
    for (int slot = 0; slot < ROW_MAX_SLOTS(VEC); slot++) {
        const int v = slot * blockDim.x + threadIdx.x;
        row[slot] = vector_zero<VEC>();
        if (slot < slots && v < vectors) {
            if constexpr (MUTABLE)
                row[slot] = vector_load_mutable<VEC>(array, row_start + v);
            else
                row[slot] = vector_load<VEC>(array, row_start + v);
        }
    }
}

/* Sums two values over the block, the same bits in every thread; `buffer` [2][ROW_MAX_WARPS]
 * shared, one of two alternating halves per call (the caller flips `parity`). */
__device__ __forceinline__ void block_sum_pair(float *first, float *second, float *buffer,
                                               int parity)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float *half = buffer + parity * 2 * ROW_MAX_WARPS;
    float a = warp_sum(*first), b = warp_sum(*second);
    if (lane == 0) {
        half[warp] = a;
        half[ROW_MAX_WARPS + warp] = b;
    }
    __syncthreads();
    a = 0.0f;
    b = 0.0f;
    for (int w = 0; w < warps; w++) {
        a += half[w];
        b += half[ROW_MAX_WARPS + w];
    }
    *first = a;
    *second = b;
}

template <int VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
stream_mix_forward_kernel(const __grid_constant__ MixForwardArgs args)
{
    constexpr int MAX_SLOTS = ROW_MAX_SLOTS(VEC);
    __shared__ float sums[2 * 2 * ROW_MAX_WARPS];
    const int m = args.m, slots = args.slots;
    int parity = 0;
    for (int t = blockIdx.x; t < args.tokens; t += gridDim.x) {
        const long long row_start = (long long)t * args.vectors;
        float mix[MAX_SLOTS][VEC] = {};
        BfVector<VEC> current[MAX_SLOTS], next[MAX_SLOTS];
        load_owned<VEC>(current, args.streams[0], row_start, args.vectors, slots);
        for (int r = 0; r < m; r++) {
            if (r + 1 < m)
                load_owned<VEC>(next, args.streams[r + 1], row_start, args.vectors, slots);
            BfVector<VEC> theta_raw[MAX_SLOTS];
            load_owned<VEC>(theta_raw, args.mix_proj + (long long)r * args.vectors * VEC, 0,
                            args.vectors, slots);
            float values[MAX_SLOTS][VEC], squares = 0.0f, dot = 0.0f;
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++) {
                if (slot >= slots)
                    continue;
                float theta[VEC];
                vector_to_floats<VEC>(current[slot], values[slot]);
                vector_to_floats<VEC>(theta_raw[slot], theta);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    squares += values[slot][i] * values[slot][i];
                    dot += theta[i] * values[slot][i];
                }
            }
            block_sum_pair(&squares, &dot, sums, parity);
            parity ^= 1;
            const float rho = rsqrtf(squares * args.inverse_width + args.eps);
            const double g = (double)(args.mix_bias[r] + rho * dot);
            const float w = (float)(1.0 / (1.0 + exp(-g)));
            if (threadIdx.x == 0) {
                args.gates[(long long)t * m + r] = w;
                args.rstd[(long long)t * m + r] = rho;
            }
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++) {
                if (slot >= slots)
                    continue;
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    mix[slot][i] += w * values[slot][i];
            }
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++)
                current[slot] = next[slot];
        }
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot < slots && v < args.vectors)
                vector_store<VEC>(args.out, row_start + v, vector_from_floats<VEC>(mix[slot]));
        }
    }
}

/* grid (ranges, m): block (range, r) walks its tokens for stream r */
template <int VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
stream_mix_backward_kernel(const __grid_constant__ MixBackwardArgs args)
{
    constexpr int MAX_SLOTS = ROW_MAX_SLOTS(VEC);
    __shared__ float sums[2 * 2 * ROW_MAX_WARPS];
    const int m = args.m, slots = args.slots, r = blockIdx.y;
    const int range = blockIdx.x, ranges = gridDim.x;
    const bf16 *stream = args.streams[r];
    if (!stream)
        return; /* a stream not given: its partials are not read (stream_mix_reduce_kernel) */
    bf16 *dstream = args.dstreams[r];
    const float scale = args.alpha ? *args.alpha : 1.0f; /* d out = scale dout */

    float theta[MAX_SLOTS][VEC], theta_sums[MAX_SLOTS][VEC] = {};
    {
        BfVector<VEC> theta_raw[MAX_SLOTS];
        load_owned<VEC>(theta_raw, args.mix_proj + (long long)r * args.d, 0, args.vectors, slots);
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++)
            vector_to_floats<VEC>(theta_raw[slot], theta[slot]);
    }
    float bias_sum = 0.0f, alpha_sum = 0.0f; /* thread 0 */
    int parity = 0;

    const int first = (int)((long long)args.tokens * range / ranges);
    const int last = (int)((long long)args.tokens * (range + 1) / ranges);
    for (int t = first; t < last; t++) {
        const long long row_start = (long long)t * args.vectors;
        BfVector<VEC> o_raw[MAX_SLOTS], dout_raw[MAX_SLOTS], grad_raw[MAX_SLOTS];
        load_owned<VEC>(o_raw, stream, row_start, args.vectors, slots);
        load_owned<VEC>(dout_raw, args.dout, row_start, args.vectors, slots);
        if (dstream && args.add)
            load_owned<VEC, true>(grad_raw, dstream, row_start, args.vectors, slots);
        float o[MAX_SLOTS][VEC], dy[MAX_SLOTS][VEC], gate_dot = 0.0f, theta_dot = 0.0f;
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            if (slot >= slots)
                continue;
            vector_to_floats<VEC>(o_raw[slot], o[slot]);
            vector_to_floats<VEC>(dout_raw[slot], dy[slot]);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                gate_dot += dy[slot][i] * o[slot][i];
                theta_dot += theta[slot][i] * o[slot][i];
            }
        }
        block_sum_pair(&gate_dot, &theta_dot, sums, parity);
        parity ^= 1;
        const float w = args.gates[(long long)t * m + r], rho = args.rstd[(long long)t * m + r];
        /* gate_dot = < dout, o >; < d out, o > = scale gate_dot (exact for scale 1) */
        const float dg = (float)((double)(scale * gate_dot) * w * (1.0 - w));
        if (threadIdx.x == 0) {
            bias_sum += dg;
            alpha_sum += w * gate_dot;
        }
        const float mean = dg * rho * theta_dot * args.inverse_width; /* mean_d(du u) */
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            const int v = slot * blockDim.x + threadIdx.x;
            if (slot >= slots || v >= args.vectors)
                continue;
            float grad[VEC] = {};
            if (dstream && args.add)
                vector_to_floats<VEC>(grad_raw[slot], grad);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const float u = o[slot][i] * rho;
                theta_sums[slot][i] += dg * u;
                if (dstream)
                    grad[i] += mix_grad_channel(w, scale, dy[slot][i], rho, dg,
                                                theta[slot][i], u, mean);
            }
            if (dstream)
                vector_store<VEC>(dstream, row_start + v, vector_from_floats<VEC>(grad));
        }
    }

#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const int v = slot * blockDim.x + threadIdx.x;
        if (slot >= slots || v >= args.vectors)
            continue;
        float *partial = args.partials + ((long long)range * m + r) * args.d + (long long)v * VEC;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            partial[i] = theta_sums[slot][i];
    }
    if (threadIdx.x == 0) {
        float *bias_partials = args.partials + (long long)ranges * m * args.d;
        bias_partials[(long long)range * m + r] = bias_sum;
        bias_partials[(long long)ranges * m + (long long)range * m + r] = alpha_sum;
    }
}

/* The given streams' sums over the ranges: dmix_proj[r] and dmix_bias[r] +=; warp 0 of
 * block 0 also adds the shares of d alpha (lanes striding the ranges, in double, then a fixed
 * shuffle tree). A block takes 32
 * consecutive sums (of the m x d channel sums, then the m bias sums) and its
 * MIX_REDUCE_SLICES warps split the ranges: warp w adds ranges w, w + slices, .. (lanes on
 * consecutive sums: coalesced, many loads in flight), then lane 0's warp adds the slices in
 * order. A fixed order whatever the hardware: the same bits every run. */
__device__ __forceinline__ void stream_mix_reduce_block(const MixBackwardArgs &args, int block)
{
    __shared__ float slices[MIX_REDUCE_SLICES][32];
    const int m = args.m, d = args.d, ranges = args.ranges;
    const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
    const long long count = (long long)m * d;
    const long long i = (long long)block * 32 + lane;
    const bool bias = i >= count, valid = i < count + m;
    const int r = !valid ? 0 : bias ? (int)(i - count) : (int)(i / d);
    const bool given = valid && args.streams[r] != NULL;
    const float *partials = bias ? args.partials + (long long)ranges * count + r
                                 : args.partials + i;
    const long long stride = bias ? m : count;
    float sum = 0.0f;
    if (given)
        for (int range = slice; range < ranges; range += MIX_REDUCE_SLICES)
            sum += partials[range * stride];
    slices[slice][lane] = sum;
    __syncthreads();
    if (slice == 0 && given) {
        float total = 0.0f;
        for (int w = 0; w < MIX_REDUCE_SLICES; w++)
            total += slices[w][lane];
        if (bias)
            args.dmix_bias[r] += total;
        else
            args.dmix_proj[i] += total;
    }
    if (args.alpha && block == 0 && slice == 0) { /* warp 0: lanes stride the ranges */
        const float *shares = args.partials + (long long)ranges * count + (long long)ranges * m;
        double total = 0.0;
        for (int stream = 0; stream < m; stream++)
            if (args.streams[stream])
                for (int range = lane; range < ranges; range += 32)
                    total += shares[(long long)range * m + stream];
        for (int offset = 16; offset > 0; offset >>= 1) /* a fixed shuffle order */
            total += __shfl_xor_sync(0xffffffffu, total, offset);
        if (lane == 0)
            *args.dalpha += (float)total;
    }
}

__global__ void __launch_bounds__(MIX_REDUCE_SLICES * 32)
    stream_mix_reduce_kernel(const __grid_constant__ MixBackwardArgs args)
{
    stream_mix_reduce_block(args, blockIdx.x);
}

static void mix_check_shape(int m, int d)
{
    stream_check_width(d);
    if (m < 1 || m > CUDA_STREAM_MAX_STREAMS)
        fatal(EXIT_CONFIG, "residual.streams = %d: the cuda stream mix takes 1 to %d streams", m,
              CUDA_STREAM_MAX_STREAMS);
}

extern "C" void cuda_stream_mix_forward(bf16 *out, float *gates, float *rstd,
                                        const bf16 *const *streams, int m, const float *mix_bias,
                                        const bf16 *mix_proj, int tokens, int d, float eps,
                                        cudaStream_t stream)
{
    mix_check_shape(m, d);
    if (tokens <= 0)
        return;
    MixForwardArgs args =
        mix_forward_args(out, gates, rstd, streams, m, mix_bias, mix_proj, eps, tokens, d);
    const void *pointers[CUDA_STREAM_MAX_STREAMS + 2];
    int count = 0;
    for (int r = 0; r < m; r++)
        pointers[count++] = streams[r];
    pointers[count++] = out;
    pointers[count++] = mix_proj;
    RowShape shape = row_shape(d, 1, pointers, count);
    args.vectors = shape.vectors;
    args.slots = shape.slots;
    if (mix_narrow_fits(d, false, pointers, count)) {
        mix_narrow_forward(args, d, stream);
        return;
    }
#define LAUNCH(V)                                                                                \
    do {                                                                                         \
        int blocks = resident_blocks(stream_mix_forward_kernel<V>, shape.threads, 0,             \
                                     "the cuda stream mix");                                     \
        stream_mix_forward_kernel<V><<<blocks < tokens ? blocks : tokens, shape.threads, 0,       \
                                       stream>>>(args);                                          \
    } while (0)
    switch (shape.vec) {
    case 8: LAUNCH(8); break;
    case 4: LAUNCH(4); break;
    case 2: LAUNCH(2); break;
    default: LAUNCH(1); break;
    }
#undef LAUNCH
    CUDA_CHECK_LAUNCH();
}

/* Token ranges of the mix backward: a block walks one range of one stream, so a call given
 * fewer streams takes more ranges (STREAM_PARTIALS * m / given): the same number of blocks
 * at work whether the streams come together or one at a time. At most `tokens`. */
static int mix_range_count(int tokens, int m, int given)
{
    const long long ranges = (long long)STREAM_PARTIALS * m / (given > 0 ? given : 1);
    return (int)(tokens < ranges ? tokens : ranges);
}

extern "C" size_t cuda_stream_mix_backward_workspace_floats(int m, int tokens, int d)
{
    /* the most ranges of either layout: one stream given */
    const int block = mix_range_count(tokens, m, 1), narrow = mix_narrow_ranges(tokens, 1);
    const int ranges = block > narrow ? block : narrow;
    return tokens > 0 ? (size_t)ranges * m * ((size_t)d + 2) : 1;
}

/* The backward's arguments, and whether the warp-a-token kernels take them (args->given 0:
 * no stream given, nothing to do) */
static bool mix_backward_args(MixBackwardArgs *args, RowShape *shape, bf16 *const *dstreams,
                              GradMode dstreams_mode, float *dmix_bias, float *dmix_proj,
                              float *dalpha, const bf16 *dout, const bf16 *const *streams, int m,
                              const float *gates, const float *rstd, const bf16 *mix_proj,
                              const float *alpha, int tokens, int d, float *workspace)
{
    const void *pointers[2 * CUDA_STREAM_MAX_STREAMS + 2];
    int count = 0, given = 0;
    for (int r = 0; r < CUDA_STREAM_MAX_STREAMS; r++) {
        args->streams[r] = r < m ? streams[r] : NULL;
        args->dstreams[r] = r < m && streams[r] ? dstreams[r] : NULL;
        if (args->streams[r]) {
            pointers[count++] = streams[r];
            pointers[count++] = dstreams[r];
            args->given_streams[given++] = r;
        }
    }
    args->given = given;
    if (given == 0)
        return false;
    pointers[count++] = dout;
    pointers[count++] = mix_proj;
    *shape = row_shape(d, 1, pointers, count);
    const bool narrow = mix_narrow_fits(d, true, pointers, count);
    const int ranges =
        narrow ? mix_narrow_ranges(tokens, given) : mix_range_count(tokens, m, given);
    args->partials = workspace;
    args->dmix_bias = dmix_bias;
    args->dmix_proj = dmix_proj;
    args->dalpha = dalpha;
    args->dout = dout;
    args->mix_proj = mix_proj;
    args->gates = gates;
    args->rstd = rstd;
    args->alpha = alpha;
    args->inverse_width = 1.0f / (float)d;
    args->m = m;
    args->tokens = tokens;
    args->d = d;
    args->vectors = shape->vectors;
    args->slots = shape->slots;
    args->ranges = ranges;
    args->token_ranges = narrow ? mix_narrow_token_ranges(tokens, given) : ranges;
    args->add = dstreams_mode == GRAD_ADD;
    return narrow;
}

/* the reduce's blocks: 32 consecutive sums each, of the m d channel sums and the m bias sums */
static unsigned mix_reduce_blocks(int m, int d)
{
    return (unsigned)(((long long)m * d + m + 31) / 32);
}

/* One launch's backward of the arguments mix_backward_args made, then its reduce */
static void mix_backward_launch(const MixBackwardArgs &args, const RowShape &shape, bool narrow,
                                cudaStream_t stream)
{
    if (narrow) {
        mix_narrow_backward(args, args.d, stream);
    } else {
        dim3 grid(args.ranges, args.m);
#define LAUNCH(V) stream_mix_backward_kernel<V><<<grid, shape.threads, 0, stream>>>(args)
        switch (shape.vec) {
        case 8: LAUNCH(8); break;
        case 4: LAUNCH(4); break;
        case 2: LAUNCH(2); break;
        default: LAUNCH(1); break;
        }
#undef LAUNCH
        CUDA_CHECK_LAUNCH();
    }
    stream_mix_reduce_kernel<<<mix_reduce_blocks(args.m, args.d), MIX_REDUCE_SLICES * 32, 0,
                               stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_stream_mix_backward(bf16 *const *dstreams, GradMode dstreams_mode,
                                         float *dmix_bias, float *dmix_proj, float *dalpha,
                                         const bf16 *dout, const bf16 *const *streams, int m,
                                         const float *gates, const float *rstd,
                                         const float *mix_bias, const bf16 *mix_proj,
                                         const float *alpha, int tokens, int d,
                                         float *workspace, cudaStream_t stream)
{
    (void)mix_bias; /* the saved gates already hold beta's effect */
    mix_check_shape(m, d);
    if (tokens <= 0)
        return;
    MixBackwardArgs args;
    RowShape shape;
    const bool narrow =
        mix_backward_args(&args, &shape, dstreams, dstreams_mode, dmix_bias, dmix_proj, dalpha,
                          dout, streams, m, gates, rstd, mix_proj, alpha, tokens, d, workspace);
    if (args.given > 0)
        mix_backward_launch(args, shape, narrow, stream);
}
