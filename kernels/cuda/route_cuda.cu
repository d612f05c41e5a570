/* kernels/cuda/route_cuda.cu — Route forward on the GPU (DESIGN 2.1; contract in route_cuda.h).
 *
 * One block a token at a time (a persistent grid walks the tokens), the row layout of
 * route_device.cuh: each thread owns up to 16 channels and keeps, for them, q*g and the
 * running mix. Per token, for each source n in order, from ONE read of the row s_n:
 *   squares  = sum_c s_c^2 (warp sums, then the warps' sums in warp order)
 *   dot[h]   = sum_{c in h} (q*g)_c s_c (warp segment sums, then the segments in order)
 *   r        = rsqrt(squares / d + eps),   z[h] = r * dot[h]
 *   online softmax per head: m' = max(m, z), l = l e^(m - m') + e^(z - m'),
 *   mix      = mix e^(m - m') + e^(z - m') s        (fp32, per channel)
 * and after the last source out = base + alpha * mix / l (or mix / l), rounded once; the
 * weights a[n,h] = e^(z[n,h] - m) / l from the scores kept in shared memory. 1/l is the
 * correctly rounded reciprocal, so l = N a power of two divides exactly.
 * Every thread computes r, z and the softmax state of its own heads from the same shared
 * sums in the same order (the same bits in every thread): one barrier a source. The sums of
 * a source go to one of two shared buffers, alternating, so the next source's writes never
 * meet a slow thread's reads of the previous one. Rows come through the ring of
 * route_device.cuh: while one is reduced, the next ROW_STAGES - 1 rows of the block's walk
 * (sources of this token, then of its next token) are in flight, across the barriers.
 */
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"

#include <math.h>

struct RouteForwardArgs {
    bf16 *out;
    float *weights;   /* [N, tokens, heads] */
    float *rstd;      /* [N, tokens] */
    const bf16 *sources[CUDA_ROUTE_MAX_SOURCES];
    const bf16 *query, *key_norm, *base;
    float alpha, eps, inverse_width;
    int n_sources, tokens, heads;
    int vectors, head_vectors, segment_period, segments, slots;
};

/* shared memory: the ring of source rows [ROW_STAGES][slots][threads] vectors, then floats:
 * segment dots [2][segments], warp squares [2][ROW_MAX_WARPS], scores [N][H], final running
 * max [H] and sum [H] */
static size_t route_forward_shared_bytes(const RowShape &shape, int n_sources, int heads)
{
    return (size_t)ROW_STAGES * shape.slots * shape.threads * 2 * shape.vec +
           (2 * (size_t)shape.segments + 2 * ROW_MAX_WARPS + (size_t)n_sources * heads +
            2 * (size_t)heads) * sizeof(float);
}

/* Starts the copy of the block's row number `item` into the ring and commits it (an empty
 * group past the last token, so that every thread counts the same groups). The block reads
 * source item % N of token blockIdx.x + (item / N) * gridDim.x. */
template <int VEC>
__device__ __forceinline__ void route_forward_issue(BfVector<VEC> *ring, int stage_vectors,
                                                    long long item,
                                                    const RouteForwardArgs &args,
                                                    const SlotPlace *place)
{
    const int n = (int)(item % args.n_sources);
    const long long t = blockIdx.x + (item / args.n_sources) * gridDim.x;
    if (t < args.tokens)
        ring_copy_row<VEC>(ring + (item % ROW_STAGES) * stage_vectors, args.sources[n],
                           t * args.vectors, place, args.slots);
    copy_async_commit();
}

template <int VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
route_forward_kernel(const __grid_constant__ RouteForwardArgs args)
{
    constexpr int MAX_SLOTS = ROW_MAX_SLOTS(VEC);
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    const int N = args.n_sources, H = args.heads, tokens = args.tokens;
    const int segments = args.segments, slots = args.slots;
    const int stage_vectors = slots * blockDim.x;
    BfVector<VEC> *ring = reinterpret_cast<BfVector<VEC> *>(shared_bytes);
    float *segment_dots = reinterpret_cast<float *>(ring + ROW_STAGES * stage_vectors);
    float *warp_squares = segment_dots + 2 * segments;      /* [2][ROW_MAX_WARPS] */
    float *scores = warp_squares + 2 * ROW_MAX_WARPS;       /* [N][H] */
    float *head_max = scores + N * H;                       /* [H] */
    float *head_sum = head_max + H;                         /* [H] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;

    SlotPlace place[MAX_SLOTS];
    float key_weight[MAX_SLOTS][VEC]; /* q * g of this thread's channels */
#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        place[slot] = slot_place(slot, blockDim.x, args.vectors, args.head_vectors,
                                 args.segment_period);
        float q[VEC] = {0}, g[VEC] = {0};
        if (slot < slots && place[slot].valid) {
            vector_to_floats<VEC>(vector_load<VEC>(args.query, place[slot].vector), q);
            vector_to_floats<VEC>(vector_load<VEC>(args.key_norm, place[slot].vector), g);
        }
#pragma unroll
        for (int i = 0; i < VEC; i++)
            key_weight[slot][i] = q[i] * g[i];
    }

    long long item = 0; /* the ring row in use: rows item + 1 .. item + ROW_STAGES - 1 fly */
    for (int k = 0; k < ROW_STAGES - 1; k++)
        route_forward_issue<VEC>(ring, stage_vectors, k, args, place);
    int buffer = 0;
    for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
        const long long row_start = (long long)t * args.vectors;
        float mix[MAX_SLOTS][VEC], run_max[MAX_SLOTS], run_sum[MAX_SLOTS];
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            run_max[slot] = -INFINITY;
            run_sum[slot] = 0.0f;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                mix[slot][i] = 0.0f;
        }
        /* base is needed at the end of the token: loaded now; plain loads, out may alias it */
        BfVector<VEC> base_row[MAX_SLOTS];
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            base_row[slot] = vector_zero<VEC>();
            if (args.base && slot < slots && place[slot].valid)
                base_row[slot] = vector_load_mutable<VEC>(args.base, row_start + place[slot].vector);
        }

        for (int n = 0; n < N; n++, item++) {
            route_forward_issue<VEC>(ring, stage_vectors, item + ROW_STAGES - 1, args, place);
            copy_async_wait<ROW_STAGES - 1>();
            const BfVector<VEC> *entry = ring + (item % ROW_STAGES) * stage_vectors;
            float *dots = segment_dots + buffer * segments;
            float *squares_of_warps = warp_squares + buffer * ROW_MAX_WARPS;

            /* this thread's share of the sum of squares and of each head's dot */
            float values[MAX_SLOTS][VEC], squares = 0.0f;
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++) {
                if (slot >= slots)
                    continue; /* uniform over the block: no lane skips a shuffle alone */
                vector_to_floats<VEC>(ring_read<VEC>(entry, slot), values[slot]);
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    squares += values[slot][i] * values[slot][i];
                    dot += key_weight[slot][i] * values[slot][i];
                }
                dot = warp_segment_sum(dot, lane, place[slot].reach);
                if (place[slot].starts_segment)
                    dots[place[slot].segment] = dot;
            }
            squares = warp_sum(squares);
            if (lane == 0)
                squares_of_warps[warp] = squares;
            __syncthreads();

            /* r and the scores of this thread's heads; then the online softmax and mix */
            float total = 0.0f;
            for (int w = 0; w < warps; w++)
                total += squares_of_warps[w];
            const float r = rsqrtf(total * args.inverse_width + args.eps);
            if (threadIdx.x == 0)
                args.rstd[(long long)n * tokens + t] = r;
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++) {
                if (slot >= slots || !place[slot].valid)
                    continue;
                float dot = 0.0f;
                for (int k = place[slot].first_segment; k <= place[slot].last_segment; k++)
                    dot += dots[k];
                const float z = r * dot;
                if (place[slot].head_start)
                    scores[n * H + place[slot].head] = z;
                const float new_max = fmaxf(run_max[slot], z);
                const float decay = __expf(run_max[slot] - new_max);
                const float weight = __expf(z - new_max);
                run_sum[slot] = run_sum[slot] * decay + weight;
                run_max[slot] = new_max;
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    mix[slot][i] = mix[slot][i] * decay + weight * values[slot][i];
            }
            buffer ^= 1;
        }

        /* out = mix / l, or base + alpha * mix / l; rounded once */
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            if (slot >= slots || !place[slot].valid)
                continue;
            const float inverse = __frcp_rn(run_sum[slot]);
            float result[VEC];
            if (args.base) {
                float base_values[VEC];
                vector_to_floats<VEC>(base_row[slot], base_values);
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    result[i] = base_values[i] + args.alpha * (mix[slot][i] * inverse);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    result[i] = mix[slot][i] * inverse;
            }
            vector_store<VEC>(args.out, row_start + place[slot].vector,
                              vector_from_floats<VEC>(result));
            if (place[slot].head_start) {
                head_max[place[slot].head] = run_max[slot];
                head_sum[place[slot].head] = run_sum[slot];
            }
        }
        __syncthreads();

        /* the depth weights, for the backward */
        for (int i = threadIdx.x; i < N * H; i += blockDim.x) {
            const int n = i / H, h = i - n * H;
            args.weights[((long long)n * tokens + t) * H + h] =
                __expf(scores[i] - head_max[h]) * __frcp_rn(head_sum[h]);
        }
        /* no barrier needed before the next token: its first shared writes go to the other
         * sum buffer, and scores / head stats are rewritten only after its first barrier */
    }
}

template <int VEC>
static void route_forward_launch(const RouteForwardArgs &args, const RowShape &shape,
                                 size_t bytes, cudaStream_t stream)
{
    int blocks = resident_blocks(route_forward_kernel<VEC>, shape.threads, bytes,
                                 "the cuda route forward");
    if (blocks > args.tokens)
        blocks = args.tokens;
    route_forward_kernel<VEC><<<blocks, shape.threads, bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_route_forward(bf16 *out, float *weights, float *rstd,
                                   const bf16 *const *sources, int n_sources, const bf16 *query,
                                   const bf16 *key_norm, const bf16 *base, float alpha,
                                   int tokens, int d, int heads, float eps, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0)
        return;

    RouteForwardArgs args;
    const void *pointers[CUDA_ROUTE_MAX_SOURCES + 4];
    int count = 0;
    for (int n = 0; n < n_sources; n++)
        pointers[count++] = args.sources[n] = sources[n];
    for (int n = n_sources; n < CUDA_ROUTE_MAX_SOURCES; n++)
        args.sources[n] = NULL;
    pointers[count++] = out;
    pointers[count++] = base;
    pointers[count++] = query;
    pointers[count++] = key_norm;
    RowShape shape = row_shape(d, heads, pointers, count);

    args.out = out;
    args.weights = weights;
    args.rstd = rstd;
    args.query = query;
    args.key_norm = key_norm;
    args.base = base;
    args.alpha = alpha;
    args.eps = eps;
    args.inverse_width = 1.0f / (float)d;
    args.n_sources = n_sources;
    args.tokens = tokens;
    args.heads = heads;
    args.vectors = shape.vectors;
    args.head_vectors = shape.head_vectors;
    args.segment_period = shape.segment_period;
    args.segments = shape.segments;
    args.slots = shape.slots;
    size_t bytes = route_forward_shared_bytes(shape, n_sources, heads);

    switch (shape.vec) {
    case 8: route_forward_launch<8>(args, shape, bytes, stream); break;
    case 4: route_forward_launch<4>(args, shape, bytes, stream); break;
    case 2: route_forward_launch<2>(args, shape, bytes, stream); break;
    default: route_forward_launch<1>(args, shape, bytes, stream); break;
    }
}
