/* kernels/cuda/route_merge_cuda.cu — the replace form's merges (route_block_cuda.h,
 * cuda_route_merge_forward / backward; backend.h states the math):
 *   forward   r_p = rsqrt(mean(p^2) + eps), z_p = r_p < q*g, p > per head;
 *             w_c = e^(lse - l), w_p = e^(z_p - l) with l = log(e^lse + e^z_p) taken about
 *             max(lse, z_p); out = w_c result + w_p p; weights rows 0..N-1 *= w_c, row N = w_p.
 *   backward  mean = < dout, out >, and with a partial D = < dout, p > and
 *             P = < q*g, p >; dz = a (D - mean), e = r^2 (r sum_h dz P) / d;
 *             dp += a dout + r dz q*g - e p; S += r dz p per channel, summed per block (or
 *             warp) and reduced in a fixed order by route_block_reduce.
 * How fast should this be: the forward moves 3 rows a token (partial, result, out), the
 * backward 5 (dout, out, partial, dpartial read and written); at d 1280 and 8192 tokens a row
 * is 21 MB, so 63 MB and 105 MB a site: 15 us and 25 us at 4.3 TB/s.
 *
 * Two layouts:
 * - a warp a token, for narrow rows (d % 256 == 0, d <= 2048, heads dividing 32, 16-byte
 *   pointers: the layout of route_narrow.cuh, lane l owning channels [l d/32, (l+1) d/32),
 *   so a head is whole lanes): no barrier, every per-head sum a few shuffles, each lane's
 *   loads of a token issued together. A block a token spent its time at three barriers a
 *   token (ncu at the 1B step: 31 us and 58 us a launch, docs/performance.md, ninth run).
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
#include "kernels/cuda/route_narrow_device.cuh"

#include <math.h>

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
    int warps; /* the narrow backward's warps */
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

/* ---- a warp a token (narrow rows) ---- */

enum {
    MERGE_NARROW_THREADS = 128, /* four warps a block */
    /* the backward's warps, whatever the device, so that the token partition (and the bits
     * of the channel sums) depend on the shapes only: 8 a multiprocessor of an H200, what
     * it holds at d 1280 (about 150 registers a thread) */
    MERGE_NARROW_BACKWARD_WARPS = 132 * 8,
    MERGE_NARROW_HELD = 4, /* phase-one weights a lane loads with its token's rows (N H <= 128) */
};

static bool merge_narrow_fits(int d, int heads, const void *const *pointers, int count)
{
    if (d % 256 != 0 || d / 256 > ROUTE_NARROW_MAX_LANE_VECTORS || 32 % heads != 0)
        return false;
    for (int i = 0; i < count; i++)
        if (!pointer_aligned(pointers[i], 16))
            return false;
    return true;
}

/* this lane's LV vectors of row t */
template <int LV>
__device__ __forceinline__ void merge_lane_load(BfVector<8> *raw, const bf16 *array, long long t,
                                                int lane)
{
#pragma unroll
    for (int j = 0; j < LV; j++)
        raw[j] = vector_load<8>(array, t * 32 * LV + lane * LV + j);
}

template <int LV>
__global__ void __launch_bounds__(MERGE_NARROW_THREADS)
    merge_narrow_forward_kernel(const __grid_constant__ MergeArgs args)
{
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    const int H = args.heads, N = args.n_completed, tokens = args.tokens;
    const int lanes_per_head = 32 / H, head = lane / lanes_per_head;
    float key_weight[8 * LV];
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
    for (int t = warp; t < tokens; t += warps) {
        /* every load of the token first */
        BfVector<8> p_raw[LV], result_raw[LV];
        merge_lane_load<LV>(p_raw, args.partial, t, lane);
#pragma unroll
        for (int j = 0; j < LV; j++) /* out may alias result: not through the read-only path */
            result_raw[j] = vector_load_mutable<8>(args.result, (long long)t * 32 * LV + lane * LV + j);
        const float completed = args.lse[(long long)t * H + head];
        float held[MERGE_NARROW_HELD]; /* rows 0..N-1 of the weights, entries lane + 32 k */
#pragma unroll
        for (int k = 0; k < MERGE_NARROW_HELD; k++) {
            const int i = lane + 32 * k;
            held[k] = i < N * H ? args.weights[((long long)(i / H) * tokens + t) * H + i % H]
                                : 0.0f;
        }
        float p[8 * LV], squares = 0.0f, dot = 0.0f;
#pragma unroll
        for (int j = 0; j < LV; j++) {
            vector_to_floats<8>(p_raw[j], p + 8 * j);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                squares += p[8 * j + i] * p[8 * j + i];
                dot += key_weight[8 * j + i] * p[8 * j + i];
            }
        }
        squares = warp_sum(squares);
        dot = head_sum(dot, lanes_per_head);
        const float r = rsqrtf(squares * args.inverse_width + args.eps), z = r * dot;
        const float top = fmaxf(completed, z);
        const float total = top + __logf(__expf(completed - top) + __expf(z - top));
        const float w_c = __expf(completed - total), w_p = __expf(z - total);
#pragma unroll
        for (int j = 0; j < LV; j++) {
            float result[8], out[8];
            vector_to_floats<8>(result_raw[j], result);
#pragma unroll
            for (int i = 0; i < 8; i++)
                out[i] = w_c * result[i] + w_p * p[8 * j + i];
            vector_store<8>(args.out, (long long)t * 32 * LV + lane * LV + j,
                            vector_from_floats<8>(out));
        }
        if (lane % lanes_per_head == 0)
            args.weights[((long long)N * tokens + t) * H + head] = w_p;
        if (lane == 0)
            args.rstd[(long long)N * tokens + t] = r;
        /* entry i's head is i % H; with 32 % H == 0 that is lane % H for every k, so one
         * shuffle gives each lane the w_c of all its entries */
        const float scale = __shfl_sync(0xffffffffu, w_c, (lane % H) * lanes_per_head);
#pragma unroll
        for (int k = 0; k < MERGE_NARROW_HELD; k++) {
            const int i = lane + 32 * k;
            if (i < N * H)
                args.weights[((long long)(i / H) * tokens + t) * H + i % H] = held[k] * scale;
        }
        for (int i = lane + 32 * MERGE_NARROW_HELD; i < N * H; i += 32) /* past the held ones */
            args.weights[((long long)(i / H) * tokens + t) * H + i % H] *= scale;
    }
}

template <int LV>
__global__ void __launch_bounds__(MERGE_NARROW_THREADS)
    merge_narrow_backward_kernel(const __grid_constant__ MergeArgs args)
{
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int warps = args.warps; /* the partition, fixed by the shapes; the grid may round up */
    if (warp >= warps)
        return;
    const int H = args.heads, N = args.n_completed, tokens = args.tokens;
    const int lanes_per_head = 32 / H, head = lane / lanes_per_head;
    const bool has_partial = args.partial != NULL;
    float key_weight[8 * LV], channel_sums[8 * LV] = {};
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
    for (int t = warp; t < tokens; t += warps) {
        const long long row = (long long)t * 32 * LV + lane * LV;
        BfVector<8> dy_raw[LV], x_raw[LV], p_raw[LV], grad_raw[LV];
        merge_lane_load<LV>(dy_raw, args.dout, t, lane);
        merge_lane_load<LV>(x_raw, args.merged, t, lane);
        if (has_partial) {
            merge_lane_load<LV>(p_raw, args.partial, t, lane);
#pragma unroll
            for (int j = 0; j < LV; j++)
                grad_raw[j] = vector_load_mutable<8>(args.dpartial, row + j);
        }
        const float a = has_partial ? args.weights[((long long)N * tokens + t) * H + head] : 0.0f;
        const float r = has_partial ? args.rstd[(long long)N * tokens + t] : 0.0f;
        float centre = 0.0f, value = 0.0f, key = 0.0f;
#pragma unroll
        for (int j = 0; j < LV; j++) {
            float dy[8], x[8], p[8];
            vector_to_floats<8>(dy_raw[j], dy);
            vector_to_floats<8>(x_raw[j], x);
#pragma unroll
            for (int i = 0; i < 8; i++)
                centre += dy[i] * x[i];
            if (has_partial) {
                vector_to_floats<8>(p_raw[j], p);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    value += dy[i] * p[i];
                    key += key_weight[8 * j + i] * p[i];
                }
            }
        }
        const float mean = head_sum(centre, lanes_per_head);
        if (lane % lanes_per_head == 0)
            args.mean[(long long)t * H + head] = mean;
        if (!has_partial)
            continue;
        const float dz = a * (head_sum(value, lanes_per_head) - mean);
        const float key_sum = head_sum(key, lanes_per_head);
        const float self = warp_sum(lane % lanes_per_head == 0 ? dz * key_sum : 0.0f);
        const float self_term = r * r * (r * self * args.inverse_width);
        const float key_coefficient = r * dz;
#pragma unroll
        for (int j = 0; j < LV; j++) { /* the rows converted again: registers, not loads */
            float dy[8], p[8], grad[8];
            vector_to_floats<8>(dy_raw[j], dy);
            vector_to_floats<8>(p_raw[j], p);
            vector_to_floats<8>(grad_raw[j], grad);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int c = 8 * j + i;
                grad[i] += a * dy[i] + key_coefficient * key_weight[c] - self_term * p[i];
                channel_sums[c] += key_coefficient * p[i];
            }
            vector_store<8>(args.dpartial, row + j, vector_from_floats<8>(grad));
        }
    }
    if (!has_partial)
        return;
    float *partial = args.partials + (long long)warp * args.d + lane * 8 * LV;
#pragma unroll
    for (int c = 0; c < 8 * LV; c++)
        partial[c] = channel_sums[c];
}

#define MERGE_NARROW_LAUNCH(kernel, LV_, blocks, args)                                          \
    do {                                                                                         \
        switch (LV_) {                                                                           \
        case 1: kernel<1><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;             \
        case 2: kernel<2><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;             \
        case 3: kernel<3><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;             \
        case 4: kernel<4><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;             \
        case 5: kernel<5><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;             \
        case 6: kernel<6><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;             \
        case 7: kernel<7><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;             \
        default: kernel<8><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args); break;            \
        }                                                                                        \
        CUDA_CHECK_LAUNCH();                                                                     \
    } while (0)

/* ---- a block a token: the entries ---- */

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
    if (merge_narrow_fits(d, heads, pointers, 5)) {
        const int warps_per_block = MERGE_NARROW_THREADS / 32;
        const int blocks = (tokens + warps_per_block - 1) / warps_per_block;
        MERGE_NARROW_LAUNCH(merge_narrow_forward_kernel, d / 256, blocks, args);
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

static int merge_narrow_backward_warps(int tokens)
{
    return tokens < MERGE_NARROW_BACKWARD_WARPS ? tokens : MERGE_NARROW_BACKWARD_WARPS;
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
    int blocks; /* the rows of channel sums to reduce */
    if (merge_narrow_fits(d, heads, pointers, 6)) {
        blocks = merge_narrow_backward_warps(tokens);
        args.warps = blocks;
        const int warps_per_block = MERGE_NARROW_THREADS / 32;
        MERGE_NARROW_LAUNCH(merge_narrow_backward_kernel, d / 256,
                            (blocks + warps_per_block - 1) / warps_per_block, args);
    } else {
        blocks = merge_backward_blocks(tokens);
        switch (shape.vec) {
        case 8: merge_backward_launch<8>(args, shape.threads, blocks, stream); break;
        case 4: merge_backward_launch<4>(args, shape.threads, blocks, stream); break;
        case 2: merge_backward_launch<2>(args, shape.threads, blocks, stream); break;
        default: merge_backward_launch<1>(args, shape.threads, blocks, stream); break;
        }
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

