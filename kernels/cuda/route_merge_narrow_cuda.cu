/* kernels/cuda/route_merge_narrow_cuda.cu — the replace form's merges a warp a token, for
 * narrow rows (route_merge.cuh says which; the math is route_merge_cuda.cu's). The layout is
 * route_narrow.cuh's: lane l owns channels [l d/32, (l+1) d/32), LV = d / 256 vectors of 8,
 * so a head is whole lanes and every per-head sum a few shuffles (head_sum), the sum over the
 * row a warp_sum. No barrier; each lane's loads of a token go out together, and the rows a
 * warp writes leave through a row of its in shared memory, whole sectors at a time
 * (narrow_store_row). The backward's channel sums stay in registers over a warp's tokens
 * and go to one row a warp of the workspace, which route_block_reduce adds in warp order.
 */
#include "kernels/cuda/route_merge.cuh"
#include "kernels/cuda/route_merge_narrow.cuh"

#include <math.h>

enum {
    MERGE_NARROW_THREADS = 128, /* four warps a block */
    /* the backward's warps, whatever the device, so that the token partition (and the bits
     * of the channel sums) depend on the shapes only: 8 a multiprocessor of an H200, what
     * it holds at d 1280 (204 registers a thread: two blocks of four warps) */
    MERGE_NARROW_BACKWARD_WARPS = 132 * 8,
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
    const int lanes_per_head = 32 / H, head = lane / lanes_per_head;
    __shared__ BfVector<8> stages[MERGE_NARROW_THREADS / 32][NarrowRow<LV>::VECTORS];
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
        float held[MERGE_NARROW_HELD];
        merge_narrow_held_load(held, args.weights, N, H, tokens, t, lane);
        float p[8 * LV];
#pragma unroll
        for (int j = 0; j < LV; j++)
            vector_to_floats<8>(p_raw[j], p + 8 * j);
        BfVector<8> out_raw[LV];
        merge_narrow_token<LV>(out_raw, args.weights, args.rstd, result_raw, completed, held, p,
                               key_weight, N, H, tokens, t, args.inverse_width, args.eps, lane);
        narrow_store_row<LV>(args.out, t, stages[threadIdx.x >> 5], out_raw, lane);
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
    const bool has_partial = args.partial != NULL, adds = args.dpartial_add;
    /* a warp's two rows: d partial leaves through the first, the channel sums (d floats)
     * through both */
    __shared__ BfVector<8> stages[MERGE_NARROW_THREADS / 32][2 * NarrowRow<LV>::VECTORS];
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
            for (int j = 0; j < LV && adds; j++)
                grad_raw[j] = vector_load_mutable<8>(args.dpartial, row + j);
        }
        const float a = has_partial ? args.weights[((long long)N * tokens + t) * H + head] : 0.0f;
        const float r = has_partial ? args.rstd[(long long)N * tokens + t] : 0.0f;
        BfVector<8> grad_out[LV];
        merge_narrow_backward_token<LV>(grad_out, args.mean, dy_raw, x_raw, p_raw, grad_raw,
                                        has_partial, adds, a, r, key_weight, channel_sums, H, t,
                                        args.inverse_width, lane);
        if (has_partial)
            narrow_store_row<LV>(args.dpartial, t, stages[threadIdx.x >> 5], grad_out, lane);
    }
    if (!has_partial)
        return;
    /* the stage's two rows hold the warp's d floats */
    narrow_store_floats<LV>(args.partials + (long long)warp * args.d, channel_sums,
                            reinterpret_cast<float4 *>(stages[threadIdx.x >> 5]), lane);
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

int merge_narrow_backward_warps(int tokens)
{
    return tokens < MERGE_NARROW_BACKWARD_WARPS ? tokens : MERGE_NARROW_BACKWARD_WARPS;
}

void merge_narrow_forward(const MergeArgs &args, int d, cudaStream_t stream)
{
    const int warps_per_block = MERGE_NARROW_THREADS / 32;
    const int blocks = (args.tokens + warps_per_block - 1) / warps_per_block;
    MERGE_NARROW_LAUNCH(merge_narrow_forward_kernel, d / 256, blocks, args);
}

void merge_narrow_backward(const MergeArgs &args, int d, cudaStream_t stream)
{
    const int warps_per_block = MERGE_NARROW_THREADS / 32;
    MERGE_NARROW_LAUNCH(merge_narrow_backward_kernel, d / 256,
                        (args.warps + warps_per_block - 1) / warps_per_block, args);
}
