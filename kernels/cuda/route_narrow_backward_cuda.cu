/* kernels/cuda/route_narrow_backward_cuda.cu — the Route backward for rows of d <= 2048,
 * a token to a block of up to four warps (DESIGN 2.1; why, layout and limits in
 * route_narrow.cuh; contract in route_cuda.h; the math is route_backward_cuda.cu's).
 *
 * Backward, per token (the symbols of route_backward_cuda.cu), a block of W = min(N, 4)
 * warps, warp w taking the sources w, w + W, ... (one warp a token, all N in turn, left the
 * kernel waiting on memory at 0.29 instructions a cycle a scheduler):
 *   A. the token's weights a and rstd r into shared memory; its N source rows and dout row
 *      have been in flight since the last token's step C (a source row is refetched for the
 *      next token as soon as its warp's step C is done with it); each warp's first
 *      gradient rows follow into its ring of NARROW_GRADIENT_RING; barrier;
 *   B. per source: D = < dout, s >, P = < q*g, s > per head (the head's lanes), kept by the
 *      head's first lane; barrier; every lane: its head's mean = sum_k a_k scale D_k;
 *   C. per source: dz = a (scale D - mean), e = r^2 (r sum_h dz P) / d, and each lane's
 *      ds += a scale dout + r dz q g - e s (bf16 read, fp32 add, one rounding), S += r dz s,
 *      the next gradient rows fetched while this one is used; ds goes back into its ring
 *      slot and leaves from there 512 contiguous bytes an instruction (whole sectors, where
 *      a lane's own vectors sent the L2 half a sector a lane: the 1B per-site replace case
 *      16.9 -> 15.8 ms on an H100, docs/performance.md, 2026-12-06 morning).
 * Each source row is read from memory once (the block-a-token backward reads it twice), so
 * shared memory grows with N: (N + 2 + 3W) rows a block. A streaming variant (a ring over
 * the rows, each source read twice, the second time from L2) was slower at d 1280: 147 us
 * against 137 us for one site (docs/performance.md). The block's S and dalpha are its
 * warps' added in warp order.
 */
#include "kernels/cuda/route_narrow_device.cuh"

struct NarrowBackwardArgs {
    bf16 *dsources[ROUTE_NARROW_MAX_SOURCES];
    const bf16 *sources[ROUTE_NARROW_MAX_SOURCES];
    float *partials; /* [blocks, d] channel sums S, then [blocks] dalpha sums */
    const bf16 *dout;
    const float *weights, *rstd;
    const bf16 *query, *key_norm;
    const float *alpha; /* [1] fp32, device: the mix scale (delta form); NULL: 1 */
    const float *means; /* [tokens, heads] the softmax centres, or NULL: from the sources */
    float inverse_width;
    int n_sources, tokens, heads, lanes_per_head, d;
};

/* Starts the gradient row of this warp's i-th source of token t (source warp + i W) into
 * its ring slot (nothing past N or for a NULL gradient) and commits, so that every step of
 * C has one group to wait for. */
template <int LV>
__device__ __forceinline__ void narrow_fetch_gradient(BfVector<8> *ring,
                                                      const NarrowBackwardArgs &args, int i,
                                                      int warp, int warps, long long t,
                                                      int lane)
{
    const int k = warp + i * warps;
    if (k < args.n_sources && args.dsources[k])
        narrow_copy_row<LV>(ring + (i % NARROW_GRADIENT_RING) * NarrowRow<LV>::VECTORS,
                            args.dsources[k], t, lane);
    copy_async_commit();
}

template <int LV>
__global__ void __launch_bounds__(32 * NARROW_BACKWARD_WARPS)
route_narrow_backward_kernel(const __grid_constant__ NarrowBackwardArgs args)
{
    constexpr int C = 8 * LV, VECTORS = NarrowRow<LV>::VECTORS;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int N = args.n_sources, H = args.heads, tokens = args.tokens;
    BfVector<8> *rows = reinterpret_cast<BfVector<8> *>(shared_bytes);
    BfVector<8> *dout_rows = rows + N * VECTORS; /* two: this token's and the next */
    BfVector<8> *ring = dout_rows + 2 * VECTORS + warp * NARROW_GRADIENT_RING * VECTORS;
    float *token_floats = reinterpret_cast<float *>(dout_rows + 2 * VECTORS +
                                                    warps * NARROW_GRADIENT_RING * VECTORS);
    const int head = lane / args.lanes_per_head;
    const bool head_leader = lane % args.lanes_per_head == 0;

    float key_weight[C], channel_sums[C];
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
#pragma unroll
    for (int c = 0; c < C; c++)
        channel_sums[c] = 0.0f;
    const float mix_scale = args.alpha ? *args.alpha : 1.0f;
    float alpha_part = 0.0f; /* head leaders: sum of a D over this warp's sources and tokens */

    const int first = (int)((long long)tokens * blockIdx.x / gridDim.x);
    const int last = (int)((long long)tokens * (blockIdx.x + 1) / gridDim.x);
    if (first < last) { /* the first token's rows; the later ones come during step C */
        for (int k = warp; k < N; k += warps)
            narrow_copy_row<LV>(rows + k * VECTORS, args.sources[k], first, lane);
        if (warp == 0)
            narrow_copy_row<LV>(dout_rows, args.dout, first, lane);
        copy_async_commit();
    }
    for (int t = first; t < last; t++) {
        const long long row_start = (long long)t * (32 * LV);
        const bool next = t + 1 < last;
        /* Per-token buffers alternate, so that a warp may start token t + 1 while another
         * still reads token t's: each is rewritten only two tokens later, past the barriers
         * of the token between. */
        const int buffer = (t - first) & 1;
        const BfVector<8> *dout_row = dout_rows + buffer * VECTORS;
        float *route_weights = token_floats + buffer * (3 * N * H + N); /* a [N][H] */
        float *source_rstd = route_weights + N * H;                     /* r [N] */
        float *value_dots = source_rstd + N;                            /* D [N][H] */
        float *key_dots = value_dots + N * H;                           /* P [N][H] */

        /* A. the token's weights and rstd; its rows (in flight since the last token's step
         * C) and each warp's first gradient rows */
        for (int i = threadIdx.x; i < N * H; i += blockDim.x) {
            const int k = i / H, h = i - k * H;
            route_weights[i] = args.weights[((long long)k * tokens + t) * H + h];
        }
        for (int k = threadIdx.x; k < N; k += blockDim.x)
            source_rstd[k] = args.rstd[(long long)k * tokens + t];
        for (int i = 0; i < NARROW_GRADIENT_RING - 1; i++)
            narrow_fetch_gradient<LV>(ring, args, i, warp, warps, t, lane);
        copy_async_wait<NARROW_GRADIENT_RING - 1>();
        __syncthreads(); /* every warp's copies and stores are seen by all */

        /* B. D and P per (source, head) for this warp's sources */
        for (int k = warp; k < N; k += warps) {
            float value_dot = 0.0f, key_dot = 0.0f;
#pragma unroll
            for (int j = 0; j < LV; j++) {
                float s[8], dy[8];
                narrow_read<LV>(rows + k * VECTORS, lane, j, s);
                narrow_read<LV>(dout_row, lane, j, dy);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    value_dot += dy[i] * s[i];
                    key_dot += key_weight[8 * j + i] * s[i];
                }
            }
            value_dot = head_sum(value_dot, args.lanes_per_head);
            key_dot = head_sum(key_dot, args.lanes_per_head);
            if (head_leader) {
                alpha_part += route_weights[k * H + head] * value_dot;
                value_dots[k * H + head] = value_dot;
                key_dots[k * H + head] = key_dot;
            }
        }
        __syncthreads();
        /* the head's mean of a scale D, every lane over every source in order */
        float mean = 0.0f;
        for (int k = 0; k < N; k++)
            mean += route_weights[k * H + head] * (mix_scale * value_dots[k * H + head]);
        if (args.means) /* the site read sources that are not here (a merge) */
            mean = args.means[(long long)t * H + head];

        /* C. the gradients of this warp's sources; source k - W's row, used, takes the next
         * token's (in the group of this step's gradient fetch) */
        int i = 0;
        for (int k = warp; k < N; k += warps, i++) {
            if (i > 0 && next)
                narrow_copy_row<LV>(rows + (k - warps) * VECTORS, args.sources[k - warps],
                                    t + 1, lane);
            narrow_fetch_gradient<LV>(ring, args, i + NARROW_GRADIENT_RING - 1, warp, warps, t,
                                      lane);
            const int index = k * H + head;
            const float a = route_weights[index];
            const float score_grad = a * (mix_scale * value_dots[index] - mean);
            /* e = r^2 (r sum_h dz P) / d: the heads' terms from their first lanes */
            const float self_sum = warp_sum(head_leader ? score_grad * key_dots[index] : 0.0f);
            const float r = source_rstd[k];
            const float self_term = r * r * (r * self_sum * args.inverse_width);
            const float key_coefficient = r * score_grad;
            const float value_coefficient = a * mix_scale;
            bf16 *dsource = args.dsources[k];
            copy_async_wait<NARROW_GRADIENT_RING - 1>(); /* gradient row i has landed */
            __syncwarp();
            BfVector<8> *gradient_row = ring + (i % NARROW_GRADIENT_RING) * VECTORS;
#pragma unroll
            for (int j = 0; j < LV; j++) {
                float s[8];
                narrow_read<LV>(rows + k * VECTORS, lane, j, s);
#pragma unroll
                for (int c = 0; c < 8; c++)
                    channel_sums[8 * j + c] += key_coefficient * s[c];
                if (!dsource)
                    continue;
                float grad[8], dy[8];
                narrow_read<LV>(gradient_row, lane, j, grad);
                narrow_read<LV>(dout_row, lane, j, dy);
#pragma unroll
                for (int c = 0; c < 8; c++)
                    grad[c] += value_coefficient * dy[c] + key_coefficient * key_weight[8 * j + c] -
                               self_term * s[c];
                /* back into its slot (this lane's own vector), then stored a warp's 512
                 * contiguous bytes at a time: whole sectors for the L2 */
                gradient_row[lane * NarrowRow<LV>::STRIDE + j] = vector_from_floats<8>(grad);
            }
            if (dsource) {
                __syncwarp();
#pragma unroll
                for (int j = 0; j < LV; j++) {
                    const int v = j * 32 + lane;
                    vector_store<8>(dsource, row_start + v, gradient_row[narrow_slot<LV>(v)]);
                }
            }
            __syncwarp(); /* the slot and the row are read before they are refilled */
        }
        if (next) { /* this warp's last source row, and the next dout row */
            if (i > 0) {
                const int k = warp + (i - 1) * warps;
                narrow_copy_row<LV>(rows + k * VECTORS, args.sources[k], t + 1, lane);
            }
            if (warp == 0)
                narrow_copy_row<LV>(dout_rows + (buffer ^ 1) * VECTORS, args.dout, t + 1, lane);
        }
        copy_async_commit();
    }
    copy_async_wait<0>(); /* the rings' empty tail groups */

    /* this block's partial sums: the warps' S and dalpha added in warp order (the rows'
     * shared memory, at least (N + 2 + 3W) rows of 2d bytes, holds W d + W floats) */
    __syncthreads();
    float *warp_sums = reinterpret_cast<float *>(shared_bytes);
#pragma unroll
    for (int c = 0; c < C; c++)
        warp_sums[warp * args.d + lane * C + c] = channel_sums[c];
    alpha_part = warp_sum(alpha_part);
    if (lane == 0)
        warp_sums[warps * args.d + warp] = alpha_part;
    __syncthreads();
    for (int c = threadIdx.x; c < args.d; c += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < warps; w++)
            total += warp_sums[w * args.d + c];
        args.partials[(long long)blockIdx.x * args.d + c] = total;
    }
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < warps; w++)
            total += warp_sums[warps * args.d + w];
        args.partials[(long long)gridDim.x * args.d + blockIdx.x] = total;
    }
}

int route_narrow_backward_blocks(int tokens)
{
    /* the most any N takes: one-warp blocks (N = 1), NARROW_BACKWARD_MAX_WARPS_PER_SM each */
    const int blocks = NARROW_BACKWARD_SMS * NARROW_BACKWARD_MAX_WARPS_PER_SM;
    return tokens < blocks ? tokens : blocks;
}

/* Blocks for this shape: as many blocks of W warps as a multiprocessor holds at this N (by
 * its shared memory and the kernel's registers), on NARROW_BACKWARD_SMS multiprocessors: one
 * wave on an H200. Both limits are properties of the shapes and of the binary, not of the
 * device, so the token partition, and the bits of S, are the same on any GPU. */
template <int LV>
static int narrow_backward_grid(int tokens, int warps, size_t bytes)
{
    static int registers;
    if (!registers) {
        cudaFuncAttributes attributes;
        CUDA_CHECK(cudaFuncGetAttributes(&attributes, route_narrow_backward_kernel<LV>));
        registers = (attributes.numRegs + 7) / 8 * 8;
    }
    int per_sm = (int)(NARROW_SHARED_PER_SM / (bytes + 1024));
    const int by_registers = 65536 / (32 * warps * registers);
    per_sm = per_sm < by_registers ? per_sm : by_registers;
    const int most = NARROW_BACKWARD_MAX_WARPS_PER_SM / warps;
    per_sm = per_sm < 1 ? 1 : per_sm > most ? most : per_sm;
    const int blocks = NARROW_BACKWARD_SMS * per_sm;
    return tokens < blocks ? tokens : blocks;
}

template <int LV>
static int narrow_backward_launch(const NarrowBackwardArgs &args, size_t bytes,
                                  cudaStream_t stream)
{
    static bool carveout_set;
    if (!carveout_set) {
        CUDA_CHECK(cudaFuncSetAttribute(route_narrow_backward_kernel<LV>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        carveout_set = true;
    }
    const int warps = narrow_backward_warps(args.n_sources);
    resident_blocks(route_narrow_backward_kernel<LV>, 32 * warps, bytes,
                    "the cuda route backward");
    const int blocks = narrow_backward_grid<LV>(args.tokens, warps, bytes);
    route_narrow_backward_kernel<LV><<<blocks, 32 * warps, bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
    return blocks;
}

int route_narrow_backward(bf16 *const *dsources, float *partials, const bf16 *dout,
                          const bf16 *const *sources, int n_sources, const float *weights,
                          const float *rstd, const bf16 *query, const bf16 *key_norm,
                          const float *alpha, const float *means, int tokens, int d, int heads,
                          cudaStream_t stream)
{
    NarrowBackwardArgs args;
    for (int k = 0; k < ROUTE_NARROW_MAX_SOURCES; k++) {
        args.sources[k] = k < n_sources ? sources[k] : NULL;
        args.dsources[k] = k < n_sources ? dsources[k] : NULL;
    }
    args.partials = partials;
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
    args.lanes_per_head = 32 / heads;
    args.d = d;
    const size_t bytes = narrow_backward_bytes(n_sources, d, heads);
    switch (lane_vectors_of(d)) {
    case 1: return narrow_backward_launch<1>(args, bytes, stream);
    case 2: return narrow_backward_launch<2>(args, bytes, stream);
    case 3: return narrow_backward_launch<3>(args, bytes, stream);
    case 4: return narrow_backward_launch<4>(args, bytes, stream);
    case 5: return narrow_backward_launch<5>(args, bytes, stream);
    case 6: return narrow_backward_launch<6>(args, bytes, stream);
    case 7: return narrow_backward_launch<7>(args, bytes, stream);
    default: return narrow_backward_launch<8>(args, bytes, stream);
    }
}
