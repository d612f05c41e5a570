/* kernels/cuda/route_cuda.cu — Route forward on the GPU (DESIGN 2.1; contract in route_cuda.h).
 *
 * A persistent grid; a block routes one token at a time, each thread owning `slots` vectors
 * of the row in the warp-rows placement of route_device.cuh (a warp's vectors consecutive).
 * The sources come in passes of up to MAXK (one pass when N <= MAXK, as in the model). A pass:
 *   0. every thread starts the copies of its vectors of all the pass's rows (and of base,
 *      on the first pass) into shared memory, cp.async, and waits for its own: a whole
 *      token's rows fly at once, without registers, and no barrier guards them (a thread
 *      reads back only what it copied);
 *   1. every thread: its share of sum_c s_c^2 and of its heads' dots sum_c (q*g)_c s_c for
 *      every source of the pass, all reduced over the warp at once (warp_transpose_sum, see
 *      "parts" below) into shared memory; barrier;
 *   2. a thread per (source, head): r = rsqrt(squares / d + eps) from the warps' squares in
 *      warp order, z = r * dot from the head's parts in order (rstd saved); barrier;
 *   3. a thread per head: the online softmax over the pass (m' = max(m, z), scale
 *      e^(m - m'), coefficients e^(z - m'), l' = l scale + sum e), and 1/l after the last
 *      pass (correctly rounded: l = N a power of two divides exactly); barrier;
 *   4. every thread: mix = mix * scale + sum_k e_k s_k over its channels (fp32, registers).
 * Then out = base + alpha * (mix * 1/l) (or mix * 1/l), rounded once, and a thread per
 * (source, head) writes the weight a[n,h] = e^(z[n,h] - m) * 1/l. Three barriers a pass,
 * none a source. While one block reduces, the other blocks of its multiprocessor have their
 * rows in flight: at d = 4096 (256 threads, 80 registers) three blocks a multiprocessor,
 * two at N = 9 (82 KB of shared memory each).
 *
 * Parts. When a warp's vectors lie in one head (head_vectors % (32 * slots) == 0: at H = 8,
 * d = 4096 a warp is a head), a thread adds its dots over its slots, and one
 * warp_transpose_sum of the 2 MAXK values (squares and dot per source) gives the warp's
 * parts; head h's parts are its warps. Otherwise the dots' parts are the segments of
 * route_device.cuh (warp_segment_sum per source and slot) and the squares go through
 * warp_transpose_sum alone. Every sum has a fixed order, so the same inputs give the same
 * bits; shared sums are read only after the barrier that follows their writes, and
 * rewritten only after the barrier that ends their readers' step (hazards noted inline).
 */
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"
#include "kernels/cuda/route_narrow.cuh"

#include <math.h>

enum {
    ROUTE_FORWARD_MAXK = 9,       /* sources a pass: every site of a 32-layer, 8-block graft */
    ROUTE_FORWARD_SMALL_MAXK = 5, /* N <= 5: a shorter warp reduction (12 shuffles, not 20) */
};

struct RouteForwardArgs {
    bf16 *out;
    float *weights;   /* [N, tokens, heads] */
    float *rstd;      /* [N, tokens] */
    float *lse;       /* [tokens, heads] log sum_n e^z, or NULL */
    const bf16 *sources[CUDA_ROUTE_MAX_SOURCES];
    const bf16 *query, *key_norm, *base;
    const float *alpha; /* [1] fp32, device: read by the kernel (delta form) */
    float eps, inverse_width;
    int n_sources, tokens, heads;
    int vectors, head_vectors, segment_period, slots;
    int pass_sources;    /* min(N, MAXK) */
    int warp_heads;      /* a warp's vectors lie in one head: the parts are warps */
    int warps_per_head;  /* with warp_heads */
    int parts;           /* parts of a source's dots: warps, or segments */
};

/* Shared memory, in bytes from the start (16-byte aligned pieces): rows [pass_sources + 1]
 * [slots * threads] bf16 vectors (the pass's sources, then base), then floats: square parts
 * [MAXK][ROW_MAX_WARPS], dot parts [MAXK][parts], scores [N][H], coefficients [MAXK][H],
 * and per head the scale, the final max and 1/sum [H]. A row is 8 KB at d = 4096: a block
 * takes 82 KB at N = 9, 74 KB at N = 8. */
struct RouteForwardLayout {
    size_t square_parts, dot_parts, scores, coefficients, head_scale, final_max, inverse_sum,
        total;
};

static RouteForwardLayout route_forward_layout(int maxk, int stage_vectors, int vec,
                                               int pass_sources, int parts, int n_sources,
                                               int heads)
{
    RouteForwardLayout layout;
    layout.square_parts = round_up_16((size_t)(pass_sources + 1) * stage_vectors * vec * 2);
    layout.dot_parts = layout.square_parts + round_up_16((size_t)maxk * ROW_MAX_WARPS * 4);
    layout.scores = layout.dot_parts + round_up_16((size_t)maxk * parts * 4);
    layout.coefficients = layout.scores + round_up_16((size_t)n_sources * heads * 4);
    layout.head_scale = layout.coefficients + round_up_16((size_t)maxk * heads * 4);
    layout.final_max = layout.head_scale + round_up_16((size_t)heads * 4);
    layout.inverse_sum = layout.final_max + round_up_16((size_t)heads * 4);
    layout.total = layout.inverse_sum + round_up_16((size_t)heads * 4);
    return layout;
}

/* q*g of vector v, in fp32 (exact: a product of two bf16). q and g are read again each
 * pass: 16 KB that stay in L1, where keeping them would cost registers or shared memory. */
template <int VEC>
__device__ __forceinline__ void key_weight_of(const bf16 *query, const bf16 *key_norm, int v,
                                              float *out)
{
    float q[VEC], g[VEC];
    vector_to_floats<VEC>(vector_load<VEC>(query, v), q);
    vector_to_floats<VEC>(vector_load<VEC>(key_norm, v), g);
#pragma unroll
    for (int i = 0; i < VEC; i++)
        out[i] = q[i] * g[i];
}

/* Step 1 where a warp's vectors lie in one head: squares and dot of each source, summed
 * over the thread's slots, then over the warp, all sources at once. */
template <int VEC, int MAXK>
__device__ __forceinline__ void route_sums_by_warp(float *square_parts, float *dot_parts,
                                                   const BfVector<VEC> *rows,
                                                   const bf16 *query, const bf16 *key_norm,
                                                   const SlotPlace *place, int count,
                                                   int stage_vectors, int parts)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float sums[2 * MAXK]; /* squares of source k at 2k, its dot at 2k + 1 */
#pragma unroll
    for (int j = 0; j < 2 * MAXK; j++)
        sums[j] = 0.0f;
#pragma unroll
    for (int slot = 0; slot < ROW_MAX_SLOTS(VEC); slot++) {
        if (!place[slot].valid)
            continue;
        const int entry = slot * blockDim.x + threadIdx.x;
        float weight[VEC];
        key_weight_of<VEC>(query, key_norm, place[slot].vector, weight);
#pragma unroll
        for (int k = 0; k < MAXK; k++) {
            if (k >= count)
                continue;
            float values[VEC];
            vector_to_floats<VEC>(rows[k * stage_vectors + entry], values);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                sums[2 * k] += values[i] * values[i];
                sums[2 * k + 1] += weight[i] * values[i];
            }
        }
    }
    int index;
    const float sum = warp_transpose_sum<2 * MAXK>(sums, lane, &index);
    if (index >= 0 && index < 2 * count) {
        if (index % 2 == 0)
            square_parts[(index / 2) * ROW_MAX_WARPS + warp] = sum;
        else
            dot_parts[(index / 2) * parts + warp] = sum;
    }
}

/* Step 1 in general: each slot's dots are summed over the lanes of each segment (a warp's
 * slot may hold several heads, or part of one); the squares over the warp, all at once. */
template <int VEC, int MAXK>
__device__ __forceinline__ void route_sums_by_segment(float *square_parts, float *dot_parts,
                                                      const BfVector<VEC> *rows,
                                                      const bf16 *query,
                                                      const bf16 *key_norm,
                                                      const SlotPlace *place, int count,
                                                      int slots, int stage_vectors, int parts)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float squares[MAXK];
#pragma unroll
    for (int k = 0; k < MAXK; k++)
        squares[k] = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXK; k++) {
        if (k >= count)
            continue; /* uniform over the block: no lane skips a shuffle alone */
#pragma unroll
        for (int slot = 0; slot < ROW_MAX_SLOTS(VEC); slot++) {
            if (slot >= slots)
                continue; /* uniform over the block */
            const int entry = slot * blockDim.x + threadIdx.x;
            float values[VEC] = {0}, weight[VEC] = {0}, dot = 0.0f;
            if (place[slot].valid) {
                vector_to_floats<VEC>(rows[k * stage_vectors + entry], values);
                key_weight_of<VEC>(query, key_norm, place[slot].vector, weight);
            }
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                squares[k] += values[i] * values[i];
                dot += weight[i] * values[i];
            }
            dot = warp_segment_sum(dot, lane, place[slot].reach);
            if (place[slot].starts_segment)
                dot_parts[k * parts + place[slot].segment] = dot;
        }
    }
    int index;
    const float square = warp_transpose_sum<MAXK>(squares, lane, &index);
    if (index >= 0 && index < count)
        square_parts[index * ROW_MAX_WARPS + warp] = square;
}

/* At VEC 8, 80 registers (no spills) let three 256-thread blocks share a multiprocessor
 * (d = 4096); the narrower paths keep the 128 that 512 threads allow. */
template <int VEC, int MAXK>
__global__ void __launch_bounds__(ROW_MAX_THREADS) __maxnreg__(VEC == 8 ? 80 : 128)
route_forward_kernel(const __grid_constant__ RouteForwardArgs args, RouteForwardLayout layout)
{
    constexpr int MAX_SLOTS = ROW_MAX_SLOTS(VEC);
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    const int N = args.n_sources, H = args.heads, tokens = args.tokens, slots = args.slots;
    const int parts = args.parts, stage_vectors = slots * blockDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    BfVector<VEC> *rows = reinterpret_cast<BfVector<VEC> *>(shared_bytes);
    BfVector<VEC> *base_row = rows + args.pass_sources * stage_vectors;
    float *square_parts = reinterpret_cast<float *>(shared_bytes + layout.square_parts);
    float *dot_parts = reinterpret_cast<float *>(shared_bytes + layout.dot_parts);
    float *scores = reinterpret_cast<float *>(shared_bytes + layout.scores);
    float *coefficients = reinterpret_cast<float *>(shared_bytes + layout.coefficients);
    float *head_scale = reinterpret_cast<float *>(shared_bytes + layout.head_scale);
    float *final_max = reinterpret_cast<float *>(shared_bytes + layout.final_max);
    float *inverse_sum = reinterpret_cast<float *>(shared_bytes + layout.inverse_sum);

    SlotPlace place[MAX_SLOTS];
#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        place[slot] = slot_place_at((warp * slots + slot) * 32 + lane, args.vectors,
                                    args.head_vectors, args.segment_period);
        if (slot >= slots)
            place[slot].valid = place[slot].starts_segment = 0;
    }

    const float alpha = args.base ? *args.alpha : 0.0f;
    /* thread h < H: the running max and sum of head h's softmax over the token's sources */
    float head_max = -INFINITY, head_sum = 0.0f;
    for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
        const long long row_start = (long long)t * args.vectors;
        head_max = -INFINITY;
        head_sum = 0.0f;
        float mix[MAX_SLOTS][VEC];

        for (int first = 0; first < N; first += args.pass_sources) {
            const int count = N - first < args.pass_sources ? N - first : args.pass_sources;

            /* 0. the pass's rows (and base, read at the end of the token; out may alias
             * it: each thread reads its vectors of base before it writes out there) */
            for (int k = 0; k < count; k++)
#pragma unroll
                for (int slot = 0; slot < MAX_SLOTS; slot++)
                    if (place[slot].valid)
                        copy_vector_async<VEC>(rows + k * stage_vectors + slot * blockDim.x +
                                                   threadIdx.x,
                                               args.sources[first + k],
                                               row_start + place[slot].vector);
            if (first == 0 && args.base)
#pragma unroll
                for (int slot = 0; slot < MAX_SLOTS; slot++)
                    if (place[slot].valid)
                        copy_vector_async<VEC>(base_row + slot * blockDim.x + threadIdx.x,
                                               args.base, row_start + place[slot].vector);
            copy_async_commit();
            copy_async_wait<0>();

            /* 1. squares and dots of every source of the pass, reduced over the warp. The
             * previous readers of the parts (step 2) finished before the last step-2 barrier. */
            if (args.warp_heads)
                route_sums_by_warp<VEC, MAXK>(square_parts, dot_parts, rows, args.query,
                                              args.key_norm, place, count, stage_vectors,
                                              parts);
            else
                route_sums_by_segment<VEC, MAXK>(square_parts, dot_parts, rows, args.query,
                                                 args.key_norm, place, count, slots,
                                                 stage_vectors, parts);
            __syncthreads();

            /* 2. r and the scores, a thread per (source, head); every thread of a source adds
             * the same parts in the same order, so they agree on r to the bit */
            for (int i = threadIdx.x; i < count * H; i += blockDim.x) {
                const int k = i / H, h = i - k * H;
                float total = 0.0f;
#pragma unroll
                for (int w = 0; w < ROW_MAX_WARPS; w++)
                    if (w < warps)
                        total += square_parts[k * ROW_MAX_WARPS + w];
                const float r = rsqrtf(total * args.inverse_width + args.eps);
                int from, to;
                if (args.warp_heads) {
                    from = h * args.warps_per_head;
                    to = from + args.warps_per_head - 1;
                } else {
                    from = segment_index(h * args.head_vectors, args.head_vectors,
                                         args.segment_period);
                    to = segment_index((h + 1) * args.head_vectors - 1, args.head_vectors,
                                       args.segment_period);
                }
                float dot = 0.0f;
                for (int p = from; p <= to; p++)
                    dot += dot_parts[k * parts + p];
                /* scores: their last reader (the weights below, thread h) is past the previous
                 * token before it reaches this token's first barrier */
                scores[(first + k) * H + h] = r * dot;
                if (h == 0)
                    args.rstd[(long long)(first + k) * tokens + t] = r;
            }
            __syncthreads();

            /* 3. the online softmax of each head over the pass. Coefficients and the head
             * values were last read in step 4, the output and the weights, before step 1's
             * barrier. */
            if ((int)threadIdx.x < H) {
                const int h = threadIdx.x;
                float new_max = head_max;
                for (int k = 0; k < count; k++)
                    new_max = fmaxf(new_max, scores[(first + k) * H + h]);
                const float scale = __expf(head_max - new_max); /* 0 for the first pass */
                float sum = head_sum * scale;
                for (int k = 0; k < count; k++) {
                    const float e = __expf(scores[(first + k) * H + h] - new_max);
                    coefficients[k * H + h] = e;
                    sum += e;
                }
                head_max = new_max;
                head_sum = sum;
                head_scale[h] = scale;
                if (first + count == N) {
                    final_max[h] = new_max;
                    inverse_sum[h] = __frcp_rn(sum);
                    if (args.lse)
                        args.lse[(long long)t * H + h] = new_max + __logf(sum);
                }
            }
            __syncthreads();

            /* 4. the mix of the raw rows. The rows are rewritten by this thread's next copies
             * only, after these reads. */
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++) {
                if (!place[slot].valid)
                    continue;
                const int h = place[slot].head;
                const float scale = head_scale[h];
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    mix[slot][i] = first > 0 ? mix[slot][i] * scale : 0.0f;
                for (int k = 0; k < count; k++) {
                    const float coefficient = coefficients[k * H + h];
                    float values[VEC];
                    const int entry = k * stage_vectors + slot * blockDim.x + threadIdx.x;
                    vector_to_floats<VEC>(rows[entry], values);
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        mix[slot][i] += coefficient * values[i];
                }
            }
        }

        /* out = mix / l, or base + alpha * mix / l; rounded once */
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            if (!place[slot].valid)
                continue;
            const float inverse = inverse_sum[place[slot].head];
            float result[VEC];
            if (args.base) {
                float base_values[VEC];
                vector_to_floats<VEC>(base_row[slot * blockDim.x + threadIdx.x], base_values);
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    result[i] = base_values[i] + alpha * (mix[slot][i] * inverse);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    result[i] = mix[slot][i] * inverse;
            }
            vector_store<VEC>(args.out, row_start + place[slot].vector,
                              vector_from_floats<VEC>(result));
        }

        /* the depth weights, for the backward, a thread per (source, head): the scores were
         * written in step 2 (read after two barriers) and are rewritten only after the next
         * token's first barrier, which this thread reaches after this loop */
        for (int i = threadIdx.x; i < N * H; i += blockDim.x) {
            const int n = i / H, h = i - n * H;
            args.weights[((long long)n * tokens + t) * H + h] =
                __expf(scores[i] - final_max[h]) * inverse_sum[h];
        }
    }
}

template <int VEC, int MAXK>
static void route_forward_launch(RouteForwardArgs &args, int threads, cudaStream_t stream)
{
    /* all of the L1 that can be shared memory: the blocks' rows in flight are the point;
     * L1 keeps only q and g (a hint, set once) */
    static bool carveout_set;
    if (!carveout_set) {
        CUDA_CHECK(cudaFuncSetAttribute(route_forward_kernel<VEC, MAXK>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        carveout_set = true;
    }
    args.pass_sources = args.n_sources < MAXK ? args.n_sources : MAXK;
    const RouteForwardLayout layout =
        route_forward_layout(MAXK, args.slots * threads, VEC, args.pass_sources, args.parts,
                             args.n_sources, args.heads);
    int blocks = resident_blocks(route_forward_kernel<VEC, MAXK>, threads, layout.total,
                                 "the cuda route forward");
    if (blocks > args.tokens)
        blocks = args.tokens;
    route_forward_kernel<VEC, MAXK><<<blocks, threads, layout.total, stream>>>(args, layout);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_route_forward(bf16 *out, float *weights, float *rstd,
                                   const bf16 *const *sources, int n_sources, const bf16 *query,
                                   const bf16 *key_norm, const bf16 *base, const float *alpha,
                                   int tokens, int d, int heads, float eps, cudaStream_t stream)
{
    route_forward_lse(out, weights, rstd, NULL, sources, n_sources, query, key_norm, base,
                      alpha, tokens, d, heads, eps, stream);
}

extern "C" void route_forward_lse(bf16 *out, float *weights, float *rstd, float *lse,
                                  const bf16 *const *sources, int n_sources, const bf16 *query,
                                  const bf16 *key_norm, const bf16 *base, const float *alpha,
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
    if (route_narrow_fits(n_sources, d, heads, pointers, count)) {
        route_narrow_forward(out, weights, rstd, lse, sources, n_sources, query, key_norm,
                             base, alpha, tokens, d, heads, eps, stream);
        return;
    }
    RowShape shape = row_shape(d, heads, pointers, count);

    args.out = out;
    args.weights = weights;
    args.rstd = rstd;
    args.lse = lse;
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
    args.slots = shape.slots;
    args.warp_heads = shape.head_vectors % (32 * shape.slots) == 0;
    args.warps_per_head = args.warp_heads ? shape.head_vectors / (32 * shape.slots) : 0;
    args.parts = args.warp_heads ? shape.threads / 32 : shape.segments;

    switch (shape.vec) {
    case 8:
        if (n_sources <= ROUTE_FORWARD_SMALL_MAXK)
            route_forward_launch<8, ROUTE_FORWARD_SMALL_MAXK>(args, shape.threads, stream);
        else
            route_forward_launch<8, ROUTE_FORWARD_MAXK>(args, shape.threads, stream);
        break;
    /* the narrower paths (odd head_dim, unaligned pointers) take the shorter passes: their
     * places (up to 16 slots) need the registers */
    case 4:
        route_forward_launch<4, ROUTE_FORWARD_SMALL_MAXK>(args, shape.threads, stream);
        break;
    case 2:
        route_forward_launch<2, ROUTE_FORWARD_SMALL_MAXK>(args, shape.threads, stream);
        break;
    default:
        route_forward_launch<1, ROUTE_FORWARD_SMALL_MAXK>(args, shape.threads, stream);
        break;
    }
}
