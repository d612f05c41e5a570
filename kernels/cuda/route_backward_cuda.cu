/* kernels/cuda/route_backward_cuda.cu — Route backward on the GPU (DESIGN 2.1; contract in
 * route_cuda.h; the derivation is kernels/cpu/route_cpu.c's).
 *
 * With dmix = scale * dout (scale = alpha in the delta form, 1 in the replace form) and, per
 * token, source n and head h:
 *   D[n,h]  = < dout[h], s_n[h] >          P[n,h] = < (q*g)[h], s_n[h] >
 *   dz[n,h] = a (scale D - sum_m a_m scale D_m)                       (softmax backward)
 *   e[n]    = r^2 * mean_d(dxhat xhat) = r^2 * (r sum_h dz[n,h] P[n,h]) / d
 *   ds_n   += a scale dout + r dz q g - e[n] s_n                      (value and key-norm paths)
 *   S_c    += sum_n r dz[n,h(c)] s_n,c;   dq_c += g_c S_c,  dg_c += q_c S_c
 *   dalpha += sum_{n,h} a D                                           (= < dout, mix >)
 *
 * Kernel 1, route_backward_kernel: route_backward_blocks() blocks (fewer for fewer tokens),
 * block b owning the tokens [tokens b / G, tokens (b+1) / G), one token at a time:
 *   pass 1  read each source row once: per-segment partial sums of D and P into shared
 *           memory (one slot per source, no barrier between sources);
 *   then    the (n, h) sums from the segments, the softmax backward per head and e[n] per
 *           source (warp 0), three barriers a token;
 *   pass 2  read each source row again (it is in L2: the block read it microseconds ago):
 *           ds_n += ... (bf16 read, fp32 add, one rounding) and the thread's S_c in registers.
 * At the end each block writes its S [d] and its dalpha sum to the workspace.
 * Kernel 2, route_backward_reduce_kernel: per channel, the blocks' S in block order (eight
 * fixed strided sums, then those eight in order), dq += g S, dg += q S; dalpha likewise.
 * Both orders depend on the shapes only (tokens, d, and the vector width the pointers'
 * alignment allows): the same inputs give the same bits.
 */
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"
#include "kernels/cuda/route_narrow.cuh"

/* Blocks of the per-token kernel: two 256-thread blocks on each of an H100/H200's 132
 * multiprocessors at d = 4096, one wave. Fixed, so that the order of the token sums does not
 * depend on the device. */
/* Blocks of the backward: enough warps in flight to cover the latency of its row reads,
 * ROUTE_BACKWARD_WARPS_PER_SM warps on each of ROUTE_BACKWARD_SMS multiprocessors (the
 * H200's 132). A row of d 4096 is a block of 8 warps, two a multiprocessor (264 blocks);
 * at d 1280 a block is 3 warps and five go on a multiprocessor (660 blocks): with 264 there
 * the backward ran at 9% occupancy and 1.2 TB/s (ncu, docs/performance.md). */
enum {
    ROUTE_BACKWARD_SMS = 132,
    ROUTE_BACKWARD_WARPS_PER_SM = 16,
    ROUTE_REDUCE_SLICES = 8,
};

struct RouteBackwardArgs {
    bf16 *dsources[CUDA_ROUTE_MAX_SOURCES];
    const bf16 *sources[CUDA_ROUTE_MAX_SOURCES];
    float *partials; /* workspace: [blocks, d] channel sums S, then [blocks] dalpha sums */
    const bf16 *dout;
    const float *weights, *rstd;
    const bf16 *query, *key_norm;
    const float *alpha; /* [1] fp32, device: the mix scale (delta form); NULL: 1 */
    const float *means; /* [tokens, heads] the softmax centres, or NULL: from the sources */
    float inverse_width;
    int n_sources, tokens, heads, d;
    int vectors, head_vectors, segment_period, segments, slots;
};

static int route_backward_blocks(int tokens, int threads)
{
    const int warps = threads / 32;
    int per_sm = ROUTE_BACKWARD_WARPS_PER_SM / warps;
    per_sm = per_sm < 1 ? 1 : per_sm;
    const int blocks = ROUTE_BACKWARD_SMS * per_sm;
    return tokens < blocks ? tokens : blocks;
}

/* The most blocks any launch at width d takes: the 16-byte vector path has the fewest
 * threads a block (row_shape), hence the most blocks. */
extern "C" size_t cuda_route_backward_workspace_floats(int tokens, int d)
{
    const int vectors = (d + 7) / 8;
    int threads = ((vectors + 1) / 2 + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads > ROW_MAX_THREADS ? ROW_MAX_THREADS : threads;
    if (tokens <= 0)
        return 1;
    int blocks = route_backward_blocks(tokens, threads);
    if (route_narrow_backward_blocks(tokens) > blocks)
        blocks = route_narrow_backward_blocks(tokens);
    return (size_t)blocks * ((size_t)d + 1);
}

/* shared memory: the ring [ROW_STAGES][2][slots][threads] vectors (a source row, and in
 * pass 2 its gradient row), then floats: segment sums [N][2][segments]; D, P, dz, a [N][H];
 * r and e [N] */
static size_t route_backward_shared_bytes(const RowShape &shape, int n_sources, int heads)
{
    return (size_t)ROW_STAGES * 2 * shape.slots * shape.threads * 2 * shape.vec +
           ((size_t)n_sources * 2 * shape.segments + 4 * (size_t)n_sources * heads +
            2 * (size_t)n_sources) * sizeof(float);
}

/* Starts the copies of the block's ring item `item` and commits them (an empty group past
 * the block's tokens). A token is 2N items: pass 1 reads s_0 .. s_{N-1}, pass 2 reads them
 * again with their gradient rows. */
template <int VEC>
__device__ __forceinline__ void route_backward_issue(BfVector<VEC> *ring, int stage_vectors,
                                                     long long item, int first, int last,
                                                     const RouteBackwardArgs &args,
                                                     const SlotPlace *place)
{
    const int N = args.n_sources;
    const long long t = first + item / (2 * N);
    const int k = (int)(item % (2 * N));
    if (t < last) {
        BfVector<VEC> *entry = ring + (item % ROW_STAGES) * 2 * stage_vectors;
        const int n = k < N ? k : k - N;
        const long long row_start = t * args.vectors;
        ring_copy_row<VEC>(entry, args.sources[n], row_start, place, args.slots);
        if (k >= N && args.dsources[n])
            ring_copy_row<VEC>(entry + stage_vectors, args.dsources[n], row_start, place,
                               args.slots);
    }
    copy_async_commit();
}

template <int VEC>
__device__ __forceinline__ void load_slots(BfVector<VEC> *row, const bf16 *array,
                                           long long row_start, const SlotPlace *place,
                                           int slots)
{
#pragma unroll
    for (int slot = 0; slot < ROW_MAX_SLOTS(VEC); slot++) {
        row[slot] = vector_zero<VEC>();
        if (slot < slots && place[slot].valid)
            row[slot] = vector_load<VEC>(array, row_start + place[slot].vector);
    }
}

template <int VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
route_backward_kernel(const __grid_constant__ RouteBackwardArgs args)
{
    constexpr int MAX_SLOTS = ROW_MAX_SLOTS(VEC);
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    const int N = args.n_sources, H = args.heads, tokens = args.tokens;
    const int segments = args.segments, slots = args.slots;
    const int stage_vectors = slots * blockDim.x;
    BfVector<VEC> *ring = reinterpret_cast<BfVector<VEC> *>(shared_bytes);
    float *segment_sums = reinterpret_cast<float *>(ring + ROW_STAGES * 2 * stage_vectors);
    float *value_dots = segment_sums + 2 * N * segments; /* [N][H] D; segment sums
                                                            [N][2][segments] */
    float *key_dots = value_dots + N * H;                /* [N][H] P */
    float *score_grads = key_dots + N * H;               /* [N][H] dz */
    float *route_weights = score_grads + N * H;          /* [N][H] a */
    float *source_rstd = route_weights + N * H;          /* [N] r */
    float *self_terms = source_rstd + N;                 /* [N] e */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    SlotPlace place[MAX_SLOTS];
    float key_weight[MAX_SLOTS][VEC]; /* q * g */
    float channel_sums[MAX_SLOTS][VEC]; /* S over this block's tokens */
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
        for (int i = 0; i < VEC; i++) {
            key_weight[slot][i] = q[i] * g[i];
            channel_sums[slot][i] = 0.0f;
        }
    }
    const float mix_scale = args.alpha ? *args.alpha : 1.0f;
    float alpha_sum = 0.0f; /* thread 0: this block's dalpha, tokens in order */

    const int first = (int)((long long)tokens * blockIdx.x / gridDim.x);
    const int last = (int)((long long)tokens * (blockIdx.x + 1) / gridDim.x);
    long long item = 0; /* the ring item in use: items item + 1 .. item + ROW_STAGES - 1 fly */
    for (int k = 0; k < ROW_STAGES - 1; k++)
        route_backward_issue<VEC>(ring, stage_vectors, k, first, last, args, place);
    BfVector<VEC> dout_row[MAX_SLOTS], dout_next[MAX_SLOTS];
    if (first < last)
        load_slots<VEC>(dout_row, args.dout, (long long)first * args.vectors, place, slots);

    for (int t = first; t < last; t++) {
        const long long row_start = (long long)t * args.vectors;
        /* this token's weights and rstd, read now, stored to shared after pass 1 */
        const int pair = threadIdx.x;
        const float weight_early =
            pair < N * H ? args.weights[((long long)(pair / H) * tokens + t) * H + pair % H] : 0.0f;
        const float rstd_early = pair < N ? args.rstd[(long long)pair * tokens + t] : 0.0f;

        /* pass 1: per-segment parts of D and P for every source */
        for (int n = 0; n < N; n++, item++) {
            route_backward_issue<VEC>(ring, stage_vectors, item + ROW_STAGES - 1, first, last,
                                      args, place);
            copy_async_wait<ROW_STAGES - 1>();
            const BfVector<VEC> *entry = ring + (item % ROW_STAGES) * 2 * stage_vectors;
            float *value_parts = segment_sums + (2 * n) * segments;
            float *key_parts = value_parts + segments;
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++) {
                if (slot >= slots)
                    continue; /* uniform over the block */
                float s[VEC], dy[VEC];
                vector_to_floats<VEC>(ring_read<VEC>(entry, slot), s);
                vector_to_floats<VEC>(dout_row[slot], dy);
                float value_dot = 0.0f, key_dot = 0.0f;
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    value_dot += dy[i] * s[i];
                    key_dot += key_weight[slot][i] * s[i];
                }
                value_dot = warp_segment_sum(value_dot, lane, place[slot].reach);
                key_dot = warp_segment_sum(key_dot, lane, place[slot].reach);
                if (place[slot].starts_segment) {
                    value_parts[place[slot].segment] = value_dot;
                    key_parts[place[slot].segment] = key_dot;
                }
            }
        }
        __syncthreads();

        /* D and P per (source, head), segments in order; a and r of this token */
        for (int i = threadIdx.x; i < N * H; i += blockDim.x) {
            const int n = i / H, h = i - n * H;
            const int from = segment_index(h * args.head_vectors, args.head_vectors,
                                           args.segment_period);
            const int to = segment_index((h + 1) * args.head_vectors - 1, args.head_vectors,
                                         args.segment_period);
            const float *value_parts = segment_sums + (2 * n) * segments;
            const float *key_parts = value_parts + segments;
            float value_dot = 0.0f, key_dot = 0.0f;
            for (int k = from; k <= to; k++) {
                value_dot += value_parts[k];
                key_dot += key_parts[k];
            }
            value_dots[i] = value_dot;
            key_dots[i] = key_dot;
            route_weights[i] = i == pair ? weight_early
                                         : args.weights[((long long)n * tokens + t) * H + h];
        }
        for (int n = threadIdx.x; n < N; n += blockDim.x)
            source_rstd[n] = n == pair ? rstd_early : args.rstd[(long long)n * tokens + t];
        __syncthreads();

        /* softmax backward per head (a lane a head), then e[n] (a lane a source) */
        if (warp == 0) {
            float alpha_part = 0.0f;
            for (int h = lane; h < H; h += 32) {
                float mean = 0.0f;
                for (int n = 0; n < N; n++) {
                    const float a = route_weights[n * H + h], dot = value_dots[n * H + h];
                    mean += a * (mix_scale * dot);
                    alpha_part += a * dot;
                }
                if (args.means) /* the site read sources that are not here (a merge) */
                    mean = args.means[(long long)t * H + h];
                for (int n = 0; n < N; n++) {
                    const float a = route_weights[n * H + h];
                    score_grads[n * H + h] = a * (mix_scale * value_dots[n * H + h] - mean);
                }
            }
            __syncwarp();
            for (int n = lane; n < N; n += 32) {
                float sum = 0.0f;
                for (int h = 0; h < H; h++)
                    sum += score_grads[n * H + h] * key_dots[n * H + h];
                const float r = source_rstd[n];
                self_terms[n] = r * r * (r * sum * args.inverse_width);
            }
            alpha_part = warp_sum(alpha_part);
            if (lane == 0)
                alpha_sum += alpha_part;
        }
        if (t + 1 < last) /* the next token's dout, in flight during pass 2 */
            load_slots<VEC>(dout_next, args.dout, row_start + args.vectors, place, slots);
        __syncthreads();

        /* pass 2: ds_n += a scale dout + r dz q g - e s_n, and S += r dz s_n */
        for (int n = 0; n < N; n++, item++) {
            route_backward_issue<VEC>(ring, stage_vectors, item + ROW_STAGES - 1, first, last,
                                      args, place);
            copy_async_wait<ROW_STAGES - 1>();
            const BfVector<VEC> *entry = ring + (item % ROW_STAGES) * 2 * stage_vectors;
            bf16 *dsource = args.dsources[n];
            const float r = source_rstd[n], self_term = self_terms[n];
#pragma unroll
            for (int slot = 0; slot < MAX_SLOTS; slot++) {
                if (slot >= slots || !place[slot].valid)
                    continue;
                const int index = n * H + place[slot].head;
                const float key_coefficient = r * score_grads[index];
                float s[VEC];
                vector_to_floats<VEC>(ring_read<VEC>(entry, slot), s);
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    channel_sums[slot][i] += key_coefficient * s[i];
                if (!dsource)
                    continue;
                const float value_coefficient = route_weights[index] * mix_scale;
                float grad[VEC], dy[VEC];
                vector_to_floats<VEC>(ring_read<VEC>(entry + stage_vectors, slot), grad);
                vector_to_floats<VEC>(dout_row[slot], dy);
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    grad[i] += value_coefficient * dy[i] + key_coefficient * key_weight[slot][i] -
                               self_term * s[i];
                vector_store<VEC>(dsource, row_start + place[slot].vector,
                                  vector_from_floats<VEC>(grad));
            }
        }
#pragma unroll
        for (int slot = 0; slot < MAX_SLOTS; slot++)
            dout_row[slot] = dout_next[slot];
        /* no barrier needed before the next token: pass 1 writes only the segment sums,
         * which nobody reads after this token's second barrier */
    }

    /* this block's partial sums */
#pragma unroll
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        if (slot >= slots || !place[slot].valid)
            continue;
        float *partial = args.partials + (long long)blockIdx.x * args.d +
                         (long long)place[slot].vector * VEC;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            partial[i] = channel_sums[slot][i];
    }
    if (threadIdx.x == 0)
        args.partials[(long long)gridDim.x * args.d + blockIdx.x] = alpha_sum;
}

/* dq_c += g_c S_c, dg_c += q_c S_c with S_c the blocks' sums in block order; *dalpha += the
 * blocks' dalpha sums in order. Block: ROUTE_REDUCE_SLICES warps x 32 channels; warp k sums
 * the blocks k, k + 8, ..., then warp 0 adds the eight in order. */
__global__ void route_backward_reduce_kernel(float *dquery, float *dkey_norm, float *dalpha,
                                             const float *partials, const bf16 *query,
                                             const bf16 *key_norm, int blocks, int d)
{
    __shared__ float slices[ROUTE_REDUCE_SLICES][32];
    const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    float sum = 0.0f;
    if (c < d)
        for (int b = slice; b < blocks; b += ROUTE_REDUCE_SLICES)
            sum += partials[(long long)b * d + c];
    slices[slice][lane] = sum;
    __syncthreads();
    if (slice == 0 && c < d) {
        float total = 0.0f;
        for (int k = 0; k < ROUTE_REDUCE_SLICES; k++)
            total += slices[k][lane];
        dquery[c] += bf16_bits_to_float(key_norm[c]) * total;
        dkey_norm[c] += bf16_bits_to_float(query[c]) * total;
    }
    if (dalpha && blockIdx.x == 0 && slice == 1) {
        float alpha = 0.0f;
        for (int b = lane; b < blocks; b += 32)
            alpha += partials[(long long)blocks * d + b];
        alpha = warp_sum(alpha);
        if (lane == 0)
            *dalpha += alpha;
    }
}

template <int VEC>
static void route_backward_launch(const RouteBackwardArgs &args, const RowShape &shape,
                                  size_t bytes, int blocks, cudaStream_t stream)
{
    resident_blocks(route_backward_kernel<VEC>, shape.threads, bytes, "the cuda route backward");
    route_backward_kernel<VEC><<<blocks, shape.threads, bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

/* The block-a-token backward (kernel 1); returns its block count. */
static int route_backward_block_a_token(bf16 *const *dsources, const bf16 *dout,
                                        const bf16 *const *sources, int n_sources,
                                        const float *weights, const float *rstd,
                                        const bf16 *query, const bf16 *key_norm,
                                        const float *alpha, const float *means,
                                        float *workspace, int tokens, int d, int heads,
                                        const void *const *pointers, int count,
                                        cudaStream_t stream)
{
    RouteBackwardArgs args;
    for (int n = 0; n < CUDA_ROUTE_MAX_SOURCES; n++) {
        args.sources[n] = n < n_sources ? sources[n] : NULL;
        args.dsources[n] = n < n_sources ? dsources[n] : NULL;
    }
    RowShape shape = row_shape(d, heads, pointers, count);

    const int blocks = route_backward_blocks(tokens, shape.threads);
    args.partials = workspace;
    args.dout = dout;
    args.weights = weights;
    args.rstd = rstd;
    args.query = query;
    args.key_norm = key_norm;
    args.alpha = alpha;
    args.means = means;
    args.inverse_width = 1.0f / (float)d;
    args.n_sources = n_sources;
    args.tokens = tokens;
    args.heads = heads;
    args.d = d;
    args.vectors = shape.vectors;
    args.head_vectors = shape.head_vectors;
    args.segment_period = shape.segment_period;
    args.segments = shape.segments;
    args.slots = shape.slots;
    size_t bytes = route_backward_shared_bytes(shape, n_sources, heads);

    switch (shape.vec) {
    case 8: route_backward_launch<8>(args, shape, bytes, blocks, stream); break;
    case 4: route_backward_launch<4>(args, shape, bytes, blocks, stream); break;
    case 2: route_backward_launch<2>(args, shape, bytes, blocks, stream); break;
    default: route_backward_launch<1>(args, shape, bytes, blocks, stream); break;
    }
    return blocks;
}

extern "C" void cuda_route_backward(bf16 *const *dsources, float *dquery, float *dkey_norm,
                                    float *dalpha, const bf16 *dout, const bf16 *const *sources,
                                    int n_sources, const float *weights, const float *rstd,
                                    const bf16 *query, const bf16 *key_norm, const float *alpha,
                                    float *workspace, int tokens, int d, int heads,
                                    cudaStream_t stream)
{
    route_backward_centred(dsources, dquery, dkey_norm, dalpha, dout, sources, n_sources,
                           weights, rstd, query, key_norm, alpha, NULL, workspace, tokens, d,
                           heads, stream);
}

extern "C" void route_backward_centred(bf16 *const *dsources, float *dquery, float *dkey_norm,
                                       float *dalpha, const bf16 *dout,
                                       const bf16 *const *sources, int n_sources,
                                       const float *weights, const float *rstd,
                                       const bf16 *query, const bf16 *key_norm,
                                       const float *alpha, const float *means, float *workspace,
                                       int tokens, int d, int heads, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (tokens <= 0)
        return;

    const void *pointers[2 * CUDA_ROUTE_MAX_SOURCES + 3];
    int count = 0;
    for (int n = 0; n < n_sources; n++) {
        pointers[count++] = sources[n];
        pointers[count++] = dsources[n];
    }
    pointers[count++] = dout;
    pointers[count++] = query;
    pointers[count++] = key_norm;
    const int blocks = route_narrow_fits(n_sources, d, heads, pointers, count)
                           ? route_narrow_backward(dsources, workspace, dout, sources,
                                                   n_sources, weights, rstd, query, key_norm,
                                                   alpha, means, tokens, d, heads, stream)
                           : route_backward_block_a_token(dsources, dout, sources, n_sources,
                                                          weights, rstd, query, key_norm, alpha,
                                                          means, workspace, tokens, d, heads,
                                                          pointers, count, stream);

    const int reduce_blocks = (d + 31) / 32;
    route_backward_reduce_kernel<<<reduce_blocks, 32 * ROUTE_REDUCE_SLICES, 0, stream>>>(
        dquery, dkey_norm, alpha ? dalpha : NULL, workspace, query, key_norm, blocks, d);
    CUDA_CHECK_LAUNCH();
}
