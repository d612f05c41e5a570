/* kernels/cuda/route_merge_conv_cuda.cu — MSAR's replace-form merge of a site's partial into
 * every stream, the partial's convolution done inside the read (route_block_cuda.h,
 * cuda_route_merge_conv_forward and its backward; backend.h states the math):
 *   E_r = conv_r(b)  (stream_conv_forward's sum, from tau = 0, rounded to bf16 as it rounds)
 *   o_r = route_merge_forward(o_r, E_r)  for each stream r
 * so the merged streams have the bits of cuda_stream_conv_forward into rows followed by
 * cuda_route_merge_forward a stream at a time, and E_r is never written.
 *
 * How fast should this be: the composition moves 1 + m rows for the convolution (b read, E_r
 * written) and 3 a stream for the merges (E_r, o_r read, o_r written): 17 rows at m 4. Here
 * b is read once from DRAM (its window rows from L1: a warp walks consecutive tokens) and
 * each stream's o_r read and written: 1 + 2m = 9 rows, at d 1280 and 8192 tokens 189 MB
 * where 357 MB were.
 *
 * The layout is the narrow merges' (route_merge_narrow_cuda.cu, route_merge_narrow.cuh): a
 * warp a token, lane l owns channels [l d/32, (l+1) d/32), LV = d / 256 vectors of 8, a head
 * whole lanes. A warp walks MERGE_CONV_RUN consecutive tokens of the flattened [B T] rows,
 * stream by stream for each token; the convolution of token t reads rows t - tau (tau < k_r,
 * same sequence) of b and the taps through L1. Measured on an H100 at the 1B microbatch
 * (docs/performance.md, 2026-12-06): 0.159 ms against 0.215 for the composition, 1.2 TB/s.
 * A block that first copied its 8 tokens' rows and the 7 before them into shared memory
 * (cp.async, one barrier) took 0.180 ms, and its step 6 ms more. Other shapes (the wide
 * rows, misaligned pointers) take the composition, with the caller's rows for E_r.
 *
 * The backward (cuda_route_merge_conv_backward) is the same trade for
 * cuda_route_merge_backward with GRAD_WRITE: E_r made again inside the read, then a stream's
 * merge backward as route_merge_narrow.cuh has it. The composition moves 1 + m rows for the
 * convolution and 4 a stream (d out, out, E_r read, d E_r written): 21 at m 4; here b and, a
 * stream, d out and out read and d E_r written: 1 + 3m = 13 rows, 273 MB where 441 MB were at
 * the 1B microbatch. A warp takes one stream (its channel sums stay 8 LV registers, not m
 * times that) and the tokens of merge_narrow_backward_kernel's partition, so every output
 * has the composition's bits; the streams' blocks are interleaved in the grid, so a block of
 * each stream reads the same tokens at about the same time and b's rows come from L2 after
 * the first.
 *
 * Rows a warp reads once (the phase-one row; d out and out) come through a row of the
 * warp's in shared memory (cp.async, 512 contiguous bytes an instruction), and the rows it
 * writes leave through it (narrow_store_row): a lane's own vectors, 16 bytes in every 80
 * at d 1280, sent the L2 a request of half a sector a lane, and ncu put the L2 as the busiest
 * unit (60-75% of its peak, DRAM at 31-49%). The backward's channel sums leave the same way
 * (a block's four warps' added first, narrow_store_block_floats), where a float a lane an
 * instruction had been most of its L2 write requests. Measured on an H100
 * (docs/performance.md, 2026-12-06 morning): the forward 0.158 -> 0.137 ms, the backward
 * 0.236 -> 0.210 -> 0.158.
 *
 * Tried and not kept (docs/performance.md, 2026-12-06 later): each warp requesting the next
 * token-stream's rows before it works on this one's (the forward's phase-one row, lse and
 * held weights; the backward's d out and out). The forward went 0.160 -> 0.236 ms (139
 * registers where 110 were: three blocks a multiprocessor, not four) and the backward 0.238
 * -> 0.248 ms (255 registers), the 1B MSAR replace step 839 -> 883 ms.
 */
#include "kernels/cuda/route_merge_conv.cuh"

template <int LV>
__global__ void __launch_bounds__(MERGE_CONV_THREADS)
    merge_conv_forward_kernel(const __grid_constant__ MergeConvArgs args)
{
    __shared__ BfVector<8> stages[MERGE_CONV_THREADS / 32][NarrowRow<LV>::VECTORS];
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long first = warp * MERGE_CONV_RUN;
    BfVector<8> *stage = stages[threadIdx.x >> 5];
    for (long long t = first; t < first + MERGE_CONV_RUN && t < args.tokens; t++)
        for (int r = 0; r < args.streams; r++) {
            BfVector<8> out_raw[LV];
            merge_conv_stream<LV>(args, stage, r, t, lane, out_raw);
            narrow_store_row<LV>(args.out[r], t, stage, out_raw, lane);
        }
}

/* ---- the backward ---- */

/* The streams of one backward launch */
struct MergeConvBackwardArgs {
    bf16 *dpartial[MERGE_CONV_STREAMS]; /* d E_r, written */
    float *mean[MERGE_CONV_STREAMS];    /* [tokens, heads] */
    const bf16 *dout[MERGE_CONV_STREAMS], *merged[MERGE_CONV_STREAMS];
    const float *weights[MERGE_CONV_STREAMS], *rstd[MERGE_CONV_STREAMS];
    const bf16 *taps[MERGE_CONV_STREAMS];
    const bf16 *query[MERGE_CONV_STREAMS], *key_norm[MERGE_CONV_STREAMS];
    int kernel_size[MERGE_CONV_STREAMS];
    const bf16 *partial; /* b [B T, d] */
    float *partials;     /* [streams][blocks][d] channel sums, for route_block_reduce */
    float inverse_width;
    int streams, n_completed, tokens, T, heads, warps, blocks, d;
};

/* Stream s = blockIdx.x % streams, so that the streams' blocks of the same tokens run side by
 * side and b's rows come from L2 for all but the first; within a stream, warp w takes tokens
 * w, w + warps, .. as merge_narrow_backward_kernel does, so the channel sums are the same
 * numbers added in the same order. */
template <int LV>
__global__ void __launch_bounds__(MERGE_CONV_THREADS)
    merge_conv_backward_kernel(const __grid_constant__ MergeConvBackwardArgs args)
{
    const int lane = threadIdx.x & 31, s = blockIdx.x % args.streams;
    const int block = blockIdx.x / args.streams;
    const int warp = block * (MERGE_CONV_THREADS / 32) + (threadIdx.x >> 5);
    const int H = args.heads, N = args.n_completed, tokens = args.tokens;
    const int head = lane / (32 / H);
    /* the warp's stage: d out and out come in whole sectors (in flight while E_r is summed),
     * d E_r leaves through the first */
    __shared__ BfVector<8> stages[MERGE_CONV_THREADS / 32][2][NarrowRow<LV>::VECTORS];
    BfVector<8> *stage = stages[threadIdx.x >> 5][0], *merged_stage = stages[threadIdx.x >> 5][1];
    float key_weight[8 * LV], channel_sums[8 * LV] = {};
    narrow_key_weight<LV>(args.query[s], args.key_norm[s], lane, key_weight);
    for (long long t = warp; warp < args.warps && t < tokens; t += args.warps) {
        narrow_copy_row<LV>(stage, args.dout[s], t, lane);
        narrow_copy_row<LV>(merged_stage, args.merged[s], t, lane);
        copy_async_commit();
        const float a = args.weights[s][((long long)N * tokens + t) * H + head];
        const float r = args.rstd[s][(long long)N * tokens + t];
        BfVector<8> dy_raw[LV], x_raw[LV], p_raw[LV], grad_out[LV];
        merge_conv_partial<LV>(p_raw, args.partial, args.taps[s],
                               merge_conv_taps_here(t, args.T, args.kernel_size[s]), t, lane);
        copy_async_wait<0>();
        __syncwarp();
        narrow_lane_vectors<LV>(dy_raw, stage, lane);
        narrow_lane_vectors<LV>(x_raw, merged_stage, lane);
        const MergeTokenRows rows = {dy_raw, x_raw, p_raw, NULL /* written, not added */,
                                     grad_out};
        merge_narrow_backward_token<LV>(rows, args.mean[s], true, false, a, r, key_weight,
                                        channel_sums, H, t, args.inverse_width, lane);
        narrow_store_row<LV>(args.dpartial[s], t, stage, grad_out, lane);
    }
    /* a warp's two rows hold its d floats; the block's row, as merge_narrow_backward's */
    narrow_store_block_floats<LV, MERGE_CONV_THREADS / 32>(
        args.partials + ((long long)s * args.blocks + block) * args.d, channel_sums,
        warp < args.warps, reinterpret_cast<float4 *>(stages), 2 * NarrowRow<LV>::VECTORS);
}

/* ---- the entries ---- */

template <int LV>
static void merge_conv_launch(const MergeConvArgs &args, cudaStream_t stream)
{
    const long long warps = (args.tokens + MERGE_CONV_RUN - 1) / MERGE_CONV_RUN;
    const unsigned blocks = (unsigned)((warps + MERGE_CONV_THREADS / 32 - 1) /
                                       (MERGE_CONV_THREADS / 32));
    merge_conv_forward_kernel<LV><<<blocks, MERGE_CONV_THREADS, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

template <int LV>
static void merge_conv_backward_launch(const MergeConvBackwardArgs &args, cudaStream_t stream)
{
    const unsigned blocks = (unsigned)(args.streams * args.blocks);
    merge_conv_backward_kernel<LV><<<blocks, MERGE_CONV_THREADS, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

bool merge_conv_fits(bf16 *const *out, const bf16 *const *result, const bf16 *const *taps,
                     const bf16 *const *query, const bf16 *const *key_norm,
                     const bf16 *partial, int streams, int d, int heads)
{
    for (int r = 0; r < streams; r++) {
        const void *pointers[] = {out[r], result[r], taps[r], query[r], key_norm[r], partial};
        if (!merge_narrow_fits(d, heads, pointers, 6))
            return false;
    }
    return true;
}

MergeConvArgs merge_conv_args(bf16 *const *out, float *const *weights,
                              float *const *rstd, const bf16 *const *result,
                              const float *const *lse, const bf16 *partial,
                              const bf16 *const *taps, const int *kernel_sizes, int streams,
                              int n_sources, const bf16 *const *query,
                              const bf16 *const *key_norm, int tokens, int T, int d, int heads,
                              float eps)
{
    MergeConvArgs args = {};
    args.streams = streams < MERGE_CONV_STREAMS ? streams : MERGE_CONV_STREAMS;
    for (int r = 0; r < args.streams; r++) {
        args.out[r] = out[r];
        args.weights[r] = weights[r];
        args.rstd[r] = rstd[r];
        args.result[r] = result[r];
        args.lse[r] = lse[r];
        args.taps[r] = taps[r];
        args.query[r] = query[r];
        args.key_norm[r] = key_norm[r];
        args.kernel_size[r] = kernel_sizes[r];
    }
    args.partial = partial;
    args.eps = eps;
    args.inverse_width = 1.0f / (float)d;
    args.n_completed = n_sources - 1;
    args.tokens = tokens;
    args.T = T;
    args.heads = heads;
    return args;
}

extern "C" void cuda_route_merge_conv_forward(
    bf16 *const *out, float *const *weights, float *const *rstd, const bf16 *const *result,
    const float *const *lse, const bf16 *partial, const bf16 *const *taps,
    const int *kernel_sizes, int streams, int n_sources, const bf16 *const *query,
    const bf16 *const *key_norm, bf16 *const *rows, int B, int T, int d, int heads, float eps,
    cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (!conv_check_streams(kernel_sizes, streams, d, B, T) || streams <= 0)
        return;
    const int tokens = B * T;
    if (!merge_conv_fits(out, result, taps, query, key_norm, partial, streams, d, heads)) {
        /* the composition: every stream's E_r into the caller's rows, then the merges */
        const bf16 *x[1] = {partial};
        cuda_stream_conv_forward(rows, x, taps, 1, streams, kernel_sizes, B, T, d, stream);
        for (int r = 0; r < streams; r++)
            cuda_route_merge_forward(out[r], weights[r], rstd[r], result[r], lse[r], rows[r],
                                     n_sources, query[r], key_norm[r], tokens, d, heads, eps,
                                     stream);
        return;
    }
    for (int first = 0; first < streams; first += MERGE_CONV_STREAMS) {
        const MergeConvArgs args =
            merge_conv_args(out + first, weights + first, rstd + first, result + first,
                            lse + first, partial, taps + first, kernel_sizes + first,
                            streams - first, n_sources, query + first, key_norm + first, B * T,
                            T, d, heads, eps);
        MERGE_NARROW_BY_WIDTH(d, merge_conv_launch, args, stream);
    }
}

extern "C" size_t cuda_route_merge_conv_backward_workspace_floats(int streams, int tokens, int d,
                                                                 int heads)
{
    const int launch = streams < MERGE_CONV_STREAMS ? streams : MERGE_CONV_STREAMS;
    const size_t fused = (size_t)(launch > 0 ? launch : 1) *
                         (size_t)merge_narrow_backward_warps(tokens) * (size_t)d;
    const size_t composed = cuda_route_merge_backward_workspace_floats(tokens, d, heads);
    return fused > composed ? fused : composed;
}

extern "C" void cuda_route_merge_conv_backward(
    bf16 *const *dpartial, float *const *dquery, float *const *dkey_norm, float *const *mean,
    const bf16 *const *dout, const bf16 *const *out, const bf16 *partial,
    const bf16 *const *taps, const int *kernel_sizes, int streams, int n_sources,
    const float *const *weights, const float *const *rstd, const bf16 *const *query,
    const bf16 *const *key_norm, bf16 *const *rows, float *workspace, int B, int T, int d,
    int heads, cudaStream_t stream)
{
    route_check_shape(n_sources, d, heads);
    if (!conv_check_streams(kernel_sizes, streams, d, B, T) || streams <= 0)
        return;
    const int tokens = B * T;
    bool fits = merge_conv_fits((bf16 *const *)dpartial, dout, taps, query, key_norm, partial,
                                streams, d, heads);
    for (int r = 0; r < streams && fits; r++) {
        const void *pointers[] = {out[r]};
        fits = merge_narrow_fits(d, heads, pointers, 1);
    }
    if (!fits) { /* the composition: every stream's E_r into the caller's rows */
        const bf16 *x[1] = {partial};
        cuda_stream_conv_forward(rows, x, taps, 1, streams, kernel_sizes, B, T, d, stream);
        for (int r = 0; r < streams; r++)
            cuda_route_merge_backward(dpartial[r], GRAD_WRITE, dquery[r], dkey_norm[r], mean[r],
                                      dout[r], out[r], rows[r], n_sources, weights[r], rstd[r],
                                      query[r], key_norm[r], workspace, tokens, d, heads,
                                      stream);
        return;
    }
    for (int first = 0; first < streams; first += MERGE_CONV_STREAMS) {
        MergeConvBackwardArgs args = {};
        BlockReduceArgs reduce = {};
        args.streams = streams - first < MERGE_CONV_STREAMS ? streams - first : MERGE_CONV_STREAMS;
        for (int s = 0; s < args.streams; s++) {
            const int r = first + s;
            args.dpartial[s] = dpartial[r];
            args.mean[s] = mean[r];
            args.dout[s] = dout[r];
            args.merged[s] = out[r];
            args.weights[s] = weights[r];
            args.rstd[s] = rstd[r];
            args.taps[s] = taps[r];
            args.query[s] = query[r];
            args.key_norm[s] = key_norm[r];
            args.kernel_size[s] = kernel_sizes[r];
            reduce.dquery[s] = dquery[r];
            reduce.dkey_norm[s] = dkey_norm[r];
            reduce.query[s] = query[r];
            reduce.key_norm[s] = key_norm[r];
        }
        args.partial = partial;
        args.partials = workspace;
        args.inverse_width = 1.0f / (float)d;
        args.n_completed = n_sources - 1;
        args.tokens = tokens;
        args.T = T;
        args.heads = heads;
        args.warps = merge_narrow_backward_warps(tokens);
        args.blocks = merge_narrow_backward_blocks(tokens);
        args.d = d;
        MERGE_NARROW_BY_WIDTH(d, merge_conv_backward_launch, args, stream);
        reduce.partials = workspace;
        reduce.blocks = args.blocks;
        reduce.d = d;
        route_block_reduce(reduce, args.streams, stream);
    }
}
