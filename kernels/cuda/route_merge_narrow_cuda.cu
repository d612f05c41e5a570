/* kernels/cuda/route_merge_narrow_cuda.cu — the replace form's merges a warp a token, for
 * narrow rows (route_merge.cuh says which; the math is route_merge_cuda.cu's). The layout is
 * route_narrow.cuh's: lane l owns channels [l d/32, (l+1) d/32), LV = d / 256 vectors of 8,
 * so a head is whole lanes and every per-head sum a few shuffles (head_sum), the sum over the
 * row a warp_sum. No barrier: a token's rows come into rows of the warp's in shared memory
 * (cp.async, 512 contiguous bytes an instruction) and the rows it writes leave through
 * them (narrow_store_row), whole sectors at a time, where a lane's own 16-byte vectors sent
 * the L2 half a sector a request (docs/performance.md, 2026-12-06 morning). The backward's
 * channel sums stay in registers over a warp's tokens; a block adds its four warps' in warp
 * order into one row of the workspace (narrow_store_block_floats), and route_block_reduce
 * adds those in block order. A row a warp (1056 of them at 8192 tokens) took the reduction
 * 7.4 us a launch, 2.1 ms of the 1B MHAR step's 288 (H100, 2026-12-07).
 */
#include "kernels/cuda/route_merge.cuh"
#include "kernels/cuda/route_merge_narrow.cuh"

#include <math.h>

enum {
    /* the backward's warps, whatever the device, so that the token partition (and the bits
     * of the channel sums) depend on the shapes only: 8 a multiprocessor of an H200, what
     * it holds at d 1280 (243 registers a thread: two blocks of four warps) */
    MERGE_NARROW_BACKWARD_WARPS = 132 * 8,
    MERGE_NARROW_BACKWARD_ROWS = 4, /* a warp's rows of shared memory in the backward */
};

bool merge_narrow_fits(int d, int heads, const void *const *pointers, int count)
{
    if (d % 256 != 0 || d / 256 > ROUTE_NARROW_MAX_LANE_VECTORS || 32 % heads != 0)
        return false;
    return pointers_aligned(pointers, count, 16);
}

template <int LV>
__global__ void __launch_bounds__(MERGE_NARROW_THREADS)
    merge_narrow_forward_kernel(const __grid_constant__ MergeArgs args)
{
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    const int H = args.heads, N = args.n_completed, tokens = args.tokens;
    /* a warp's two rows: the token's partial and phase-one rows come in whole sectors, and
     * out leaves through the second (out may alias the phase-one row: read first) */
    __shared__ BfVector<8> stages[MERGE_NARROW_THREADS / 32][2][NarrowRow<LV>::VECTORS];
    BfVector<8> *partial_stage = stages[threadIdx.x >> 5][0];
    BfVector<8> *result_stage = stages[threadIdx.x >> 5][1];
    float key_weight[8 * LV];
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
    for (int t = warp; t < tokens; t += warps) {
        float completed, held[MERGE_NARROW_HELD], p[8 * LV];
        BfVector<8> p_raw[LV], result_raw[LV], out_raw[LV];
        merge_narrow_fetch<LV>(args, t, lane, args.partial, partial_stage, NULL, NULL,
                               result_stage, &completed, held, p_raw, result_raw, p);
        merge_narrow_token<LV>(out_raw, args.weights, args.rstd, result_raw, completed, held, p,
                               key_weight, N, H, tokens, t, args.inverse_width, args.eps, lane);
        narrow_store_row<LV>(args.out, t, result_stage, out_raw, lane);
    }
}

template <int LV>
__global__ void __launch_bounds__(MERGE_NARROW_THREADS)
    merge_narrow_backward_kernel(const __grid_constant__ MergeArgs args)
{
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    /* the partition, fixed by the shapes; the grid may round up, and the warps past it (only
     * where warps = tokens) meet the block's barrier with zeros */
    const int warps = args.warps;
    const int H = args.heads, tokens = args.tokens;
    const bool has_partial = args.partial != NULL, adds = args.dpartial_add;
    /* a warp's MERGE_NARROW_BACKWARD_ROWS rows (dynamic shared memory): d out, out, the
     * partial and d partial's old value come in whole sectors; d partial leaves through the
     * first, the channel sums (d floats) through the first two */
    extern __shared__ __align__(16) unsigned char merge_shared[];
    BfVector<8> *dout_stage = reinterpret_cast<BfVector<8> *>(merge_shared) +
                              (threadIdx.x >> 5) * MERGE_NARROW_BACKWARD_ROWS *
                                  NarrowRow<LV>::VECTORS;
    BfVector<8> *merged_stage = dout_stage + NarrowRow<LV>::VECTORS;
    BfVector<8> *partial_stage = merged_stage + NarrowRow<LV>::VECTORS;
    BfVector<8> *grad_stage = partial_stage + NarrowRow<LV>::VECTORS;
    float key_weight[8 * LV], channel_sums[8 * LV] = {};
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
    for (int t = warp; warp < warps && t < tokens; t += warps) {
        float a, r;
        merge_narrow_backward_fetch<LV>(args, t, lane, args.dout, dout_stage, &a, &r);
        BfVector<8> dy_raw[LV], x_raw[LV], p_raw[LV], grad_raw[LV], grad_out[LV];
        copy_async_wait<0>();
        __syncwarp();
        narrow_lane_vectors<LV>(dy_raw, dout_stage, lane);
        narrow_lane_vectors<LV>(x_raw, merged_stage, lane);
        if (has_partial) {
            narrow_lane_vectors<LV>(p_raw, partial_stage, lane);
            if (adds)
                narrow_lane_vectors<LV>(grad_raw, grad_stage, lane);
        }
        const MergeTokenRows rows = {dy_raw, x_raw, p_raw, grad_raw, grad_out};
        merge_narrow_backward_token<LV>(rows, args.mean, has_partial, adds, a, r, key_weight,
                                        channel_sums, H, t, args.inverse_width, lane);
        if (has_partial)
            narrow_store_row<LV>(args.dpartial, t, dout_stage, grad_out, lane);
        __syncwarp(); /* every stage read before the next token's copies */
    }
    if (!has_partial) /* uniform over the launch */
        return;
    narrow_store_block_floats<LV, MERGE_NARROW_THREADS / 32>(
        args.partials + (long long)blockIdx.x * args.d, channel_sums, warp < warps,
        reinterpret_cast<float4 *>(merge_shared),
        MERGE_NARROW_BACKWARD_ROWS * NarrowRow<LV>::VECTORS);
}

template <int LV>
static void merge_narrow_forward_launch(const MergeArgs &args, int blocks, cudaStream_t stream)
{
    merge_narrow_forward_kernel<LV><<<blocks, MERGE_NARROW_THREADS, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

template <int LV>
static void merge_narrow_backward_launch(const MergeArgs &args, int blocks, cudaStream_t stream)
{
    const size_t bytes = (size_t)(MERGE_NARROW_THREADS / 32) * MERGE_NARROW_BACKWARD_ROWS *
                         NarrowRow<LV>::VECTORS * sizeof(BfVector<8>);
    CUDA_CHECK(cudaFuncSetAttribute(merge_narrow_backward_kernel<LV>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    merge_narrow_backward_kernel<LV><<<blocks, MERGE_NARROW_THREADS, bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

int merge_narrow_backward_warps(int tokens)
{
    return tokens < MERGE_NARROW_BACKWARD_WARPS ? tokens : MERGE_NARROW_BACKWARD_WARPS;
}

int merge_narrow_backward_blocks(int tokens)
{
    const int warps_per_block = MERGE_NARROW_THREADS / 32;
    return (merge_narrow_backward_warps(tokens) + warps_per_block - 1) / warps_per_block;
}

void merge_narrow_forward(const MergeArgs &args, int d, cudaStream_t stream)
{
    const int warps_per_block = MERGE_NARROW_THREADS / 32;
    const int blocks = (args.tokens + warps_per_block - 1) / warps_per_block;
    MERGE_NARROW_BY_WIDTH(d, merge_narrow_forward_launch, args, blocks, stream);
}

void merge_narrow_backward(const MergeArgs &args, int d, cudaStream_t stream)
{
    const int warps_per_block = MERGE_NARROW_THREADS / 32;
    const int blocks = (args.warps + warps_per_block - 1) / warps_per_block;
    MERGE_NARROW_BY_WIDTH(d, merge_narrow_backward_launch, args, blocks, stream);
}
