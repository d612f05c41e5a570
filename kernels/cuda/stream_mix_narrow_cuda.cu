/* kernels/cuda/stream_mix_narrow_cuda.cu — MSAR's gated stream mix a warp a token, for
 * narrow rows (stream_mix.cuh says which and why; the math is stream_cuda.cu's, DESIGN 2.2:
 * g = beta + rho <theta, o>, rho = rsqrt(mean(o^2) + eps), w = sigmoid(g), out = sum_r w o_r).
 *
 * Forward: a warp walks its tokens (a grid-wide stride); for each stream it reads o_r once,
 * with the next stream's row already requested, and keeps out in fp32 registers until the
 * token's last stream. Backward: warp (range, given stream) walks the range's consecutive
 * tokens with the next token's rows requested before this one's sums, writes d o_r, and keeps
 * its dtheta, dbeta and d alpha sums in registers until the range ends; the four warps of a
 * block (one stream, four neighbouring ranges) then add theirs in warp order into one
 * partial row (stream_mix.cuh).
 */
#include "kernels/cuda/route_device.cuh"
#include "kernels/cuda/stream_mix.cuh"

#include <math.h>

enum {
    MIX_NARROW_THREADS = 128,          /* four warps a block */
    /* the backward up to d 1536: it holds two tokens' rows and a lane's dtheta sums in
     * registers, 248 of them at d 1280; wider rows would spill */
    MIX_NARROW_BACKWARD_MAX_LANE_VECTORS = 6,
    /* the backward's warps a call, whatever the device, so that the token partition (and
     * the bits of the parameter gradients) depend on the shapes only: eight a multiprocessor
     * of an H200's 132 (what 248 registers a thread allow at d 1280), each with two tokens'
     * rows in flight. Four left a stream's backward at 1.4 TB/s on an H100, bound by the
     * bytes in flight; a block's four warps add into one partial row of d floats. */
    MIX_NARROW_BACKWARD_WARPS = 132 * 8,
};

bool mix_narrow_fits(int d, bool backward, const void *const *pointers, int count)
{
    const int lane_vectors = d / 256;
    if (d % 256 != 0 || lane_vectors < 1)
        return false;
    if (backward ? lane_vectors > MIX_NARROW_BACKWARD_MAX_LANE_VECTORS
                 : lane_vectors > MIX_NARROW_FORWARD_PREFETCH_LANE_VECTORS &&
                       lane_vectors != 8 && lane_vectors != 12 && lane_vectors != 16)
        return false;
    return pointers_aligned(pointers, count, 16);
}

int mix_narrow_token_ranges(int tokens, int given)
{
    const int ranges = MIX_NARROW_BACKWARD_WARPS / (given > 0 ? given : 1);
    return tokens < ranges ? tokens : ranges;
}

int mix_narrow_ranges(int tokens, int given)
{
    const int warps = MIX_NARROW_THREADS / 32;
    return (mix_narrow_token_ranges(tokens, given) + warps - 1) / warps;
}

template <int LV>
__global__ void __launch_bounds__(MIX_NARROW_THREADS)
    mix_narrow_forward_kernel(const __grid_constant__ MixForwardArgs args)
{
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int t = warp; t < args.tokens; t += warps) {
        float mix[8 * LV];
        mix_narrow_token<LV>(mix, args, t, lane);
#pragma unroll
        for (int j = 0; j < LV; j++)
            vector_store<8>(args.out, (long long)t * 32 * LV + j * 32 + lane,
                            vector_from_floats<8>(mix + 8 * j));
    }
}

/* One token's rows for the backward, o_r and dout, with its saved gate and rstd. (Where d o_r
 * is added into, its row is read as it is written: holding it too would spill at d 1280.) */
template <int LV>
struct MixTokenRows {
    BfVector<8> o[LV], dout[LV];
    float w, rho;
};

template <int LV>
__device__ __forceinline__ void mix_token_load(MixTokenRows<LV> *rows,
                                               const MixBackwardArgs &args, const bf16 *stream,
                                               int r, int t, int lane)
{
    mix_lane_load<LV>(rows->o, stream, t, lane);
    mix_lane_load<LV>(rows->dout, args.dout, t, lane);
    rows->w = args.gates[(long long)t * args.m + r];
    rows->rho = args.rstd[(long long)t * args.m + r];
}

/* Block b: given stream k = b / groups (groups = args.ranges, one partial each), its four
 * warps the token ranges 4 q .. 4 q + 3 of that stream (q = b % groups; past
 * args.token_ranges a warp has no tokens and adds zeros). */
template <int LV>
__device__ __forceinline__ void mix_narrow_backward_block(const MixBackwardArgs &args, int block)
{
    constexpr int WARPS = MIX_NARROW_THREADS / 32;
    __shared__ float combined[WARPS][8 * LV * 32]; /* the warps' dtheta sums, by channel */
    __shared__ float scalars[WARPS][2];            /* their dbeta and d alpha sums */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = block % args.ranges;
    const int r = args.given_streams[block / args.ranges];
    const int range = group * WARPS + warp, ranges = args.token_ranges;
    const bf16 *stream = args.streams[r];
    bf16 *dstream = args.dstreams[r];
    const float scale = args.alpha ? *args.alpha : 1.0f; /* d out = scale dout */
    const bf16 *theta_row = args.mix_proj + (long long)r * args.d; /* read through L1 a token */
    float theta_sums[8 * LV] = {}, bias_sum = 0.0f, alpha_sum = 0.0f;

    const int first = range < ranges ? (int)((long long)args.tokens * range / ranges) : 0;
    const int last = range < ranges ? (int)((long long)args.tokens * (range + 1) / ranges) : 0;
    MixTokenRows<LV> rows, next;
    if (first < last)
        mix_token_load<LV>(&rows, args, stream, r, first, lane);
    for (int t = first; t < last; t++) {
        if (t + 1 < last)
            mix_token_load<LV>(&next, args, stream, r, t + 1, lane);
        float gate_dot = 0.0f, theta_dot = 0.0f;
#pragma unroll
        for (int j = 0; j < LV; j++) {
            float o[8], dy[8], theta[8];
            vector_to_floats<8>(rows.o[j], o);
            vector_to_floats<8>(rows.dout[j], dy);
            vector_to_floats<8>(vector_load<8>(theta_row, j * 32 + lane), theta);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                gate_dot += dy[i] * o[i];
                theta_dot += theta[i] * o[i];
            }
        }
        gate_dot = warp_sum(gate_dot);
        theta_dot = warp_sum(theta_dot);
        const float w = rows.w, rho = rows.rho;
        /* gate_dot = < dout, o >; < d out, o > = scale gate_dot (exact for scale 1) */
        const float dg = (float)((double)(scale * gate_dot) * w * (1.0 - w));
        bias_sum += dg;
        alpha_sum += w * gate_dot;
        const float mean = dg * rho * theta_dot * args.inverse_width; /* mean_d(du u) */
#pragma unroll
        for (int j = 0; j < LV; j++) { /* the rows converted again: registers, not loads */
            const long long v = (long long)t * 32 * LV + j * 32 + lane;
            float o[8], dy[8], theta[8], grad[8] = {};
            vector_to_floats<8>(rows.o[j], o);
            vector_to_floats<8>(rows.dout[j], dy);
            vector_to_floats<8>(vector_load<8>(theta_row, j * 32 + lane), theta);
            if (dstream && args.add)
                vector_to_floats<8>(vector_load_mutable<8>(dstream, v), grad);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float u = o[i] * rho;
                theta_sums[8 * j + i] += dg * u;
                grad[i] += mix_grad_channel(w, scale, dy[i], rho, dg, theta[i], u, mean);
            }
            if (dstream)
                vector_store<8>(dstream, v, vector_from_floats<8>(grad));
        }
        rows = next;
    }

    /* the block's four warps added in warp order into its partial: a quarter of the partial
     * rows that a row a warp would write, and that stream_mix_reduce_kernel reads */
#pragma unroll
    for (int j = 0; j < LV; j++)
#pragma unroll
        for (int i = 0; i < 8; i++)
            combined[warp][(j * 32 + lane) * 8 + i] = theta_sums[8 * j + i];
    if (lane == 0) {
        scalars[warp][0] = bias_sum;
        scalars[warp][1] = alpha_sum;
    }
    __syncthreads();
    float *partial = args.partials + ((long long)group * args.m + r) * args.d;
    for (int c = threadIdx.x; c < args.d; c += blockDim.x) {
        float sum = combined[0][c];
#pragma unroll
        for (int w = 1; w < WARPS; w++)
            sum += combined[w][c];
        partial[c] = sum;
    }
    if (threadIdx.x == 0) {
        float bias = scalars[0][0], alpha = scalars[0][1];
        for (int w = 1; w < WARPS; w++) {
            bias += scalars[w][0];
            alpha += scalars[w][1];
        }
        float *bias_partials = args.partials + (long long)args.ranges * args.m * args.d;
        bias_partials[(long long)group * args.m + r] = bias;
        bias_partials[(long long)args.ranges * args.m + (long long)group * args.m + r] = alpha;
    }
}

template <int LV>
__global__ void __launch_bounds__(MIX_NARROW_THREADS)
    mix_narrow_backward_kernel(const __grid_constant__ MixBackwardArgs args)
{
    mix_narrow_backward_block<LV>(args, blockIdx.x);
}

/* a persistent grid: what the device holds at once, at most a token a warp */
template <int LV>
static void forward_launch(const MixForwardArgs &args, cudaStream_t stream)
{
    const int warps_per_block = MIX_NARROW_THREADS / 32;
    const int needed = (args.tokens + warps_per_block - 1) / warps_per_block;
    const int resident = resident_blocks(mix_narrow_forward_kernel<LV>, MIX_NARROW_THREADS, 0,
                                         "the cuda stream mix");
    mix_narrow_forward_kernel<LV>
        <<<needed < resident ? needed : resident, MIX_NARROW_THREADS, 0, stream>>>(args);
}

/* a block a (group of four token ranges, given stream) */
template <int LV>
static void backward_launch(const MixBackwardArgs &args, cudaStream_t stream)
{
    mix_narrow_backward_kernel<LV>
        <<<args.ranges * args.given, MIX_NARROW_THREADS, 0, stream>>>(args);
}

#define MIX_NARROW_DISPATCH(launch, LV_, args)                                                  \
    do {                                                                                         \
        switch (LV_) {                                                                           \
        case 1: launch<1>(args, stream); break;                                                  \
        case 2: launch<2>(args, stream); break;                                                  \
        case 3: launch<3>(args, stream); break;                                                  \
        case 4: launch<4>(args, stream); break;                                                  \
        case 5: launch<5>(args, stream); break;                                                  \
        default: launch<6>(args, stream); break;                                                 \
        }                                                                                        \
        CUDA_CHECK_LAUNCH();                                                                     \
    } while (0)

void mix_narrow_forward(const MixForwardArgs &args, int d, cudaStream_t stream)
{
    switch (d / 256) {
    case 8: forward_launch<8>(args, stream); break;
    case 12: forward_launch<12>(args, stream); break;
    case 16: forward_launch<16>(args, stream); break;
    default: MIX_NARROW_DISPATCH(forward_launch, d / 256, args); return;
    }
    CUDA_CHECK_LAUNCH();
}

void mix_narrow_backward(const MixBackwardArgs &args, int d, cudaStream_t stream)
{
    MIX_NARROW_DISPATCH(backward_launch, d / 256, args);
}
