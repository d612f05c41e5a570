/* kernels/cuda/route_narrow_device.cuh — what the warp-a-token Route kernels share
 * (route_narrow_cuda.cu: the forward and the dispatch test; route_narrow_backward_cuda.cu):
 * the row layout in shared memory, the per-head sums, and the shared-memory sizes, which
 * the dispatch test and the launches must agree on. CUDA C++ only; layout and limits in
 * route_narrow.cuh.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_NARROW_DEVICE_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_NARROW_DEVICE_CUH

#include "kernels/cuda/route_device.cuh"
#include "kernels/cuda/route_narrow.cuh"

enum {
    NARROW_FORWARD_RING = 4,  /* rows a warp holds in the forward; all but one in flight */
    NARROW_GRADIENT_RING = 3,  /* a warp's gradient rows in flight in step C of the backward */
    NARROW_BACKWARD_WARPS = 4, /* at most, a token */
    /* the backward's grid: warps a multiprocessor on the H200's 132, whatever the device,
     * so that the token partition (and the bits of S) depend on the shapes only */
    NARROW_BACKWARD_SMS = 132,
    NARROW_BACKWARD_MAX_WARPS_PER_SM = 16,
    NARROW_SHARED_PER_SM = 227 * 1024,
};

/* A lane keeps its LV vectors of a row together at a stride of LV, or LV + 1 when LV is even:
 * the 16-byte reads of 8 consecutive lanes then start 16 B * odd apart, in different banks. */
template <int LV>
struct NarrowRow {
    static constexpr int STRIDE = LV % 2 ? LV : LV + 1;
    static constexpr int VECTORS = 32 * STRIDE; /* a row in shared memory */
};

/* where vector v of a row (coalesced order) sits in shared memory */
template <int LV>
__device__ __forceinline__ int narrow_slot(int v)
{
    return v / LV * NarrowRow<LV>::STRIDE + v % LV;
}

/* starts the copy of row t of `array` into `row`: lane copies vectors j * 32 + lane */
template <int LV>
__device__ __forceinline__ void narrow_copy_row(BfVector<8> *row, const bf16 *array,
                                                long long t, int lane)
{
#pragma unroll
    for (int j = 0; j < LV; j++) {
        const int v = j * 32 + lane;
        copy_vector_async<8>(row + narrow_slot<LV>(v), array, t * (32 * LV) + v);
    }
}

/* Puts this lane's LV vectors of a row into `stage`, a row of the warp's in shared memory,
 * where any lane may then read any vector (narrow_slot); the warp is in step before and
 * after. */
template <int LV>
__device__ __forceinline__ void narrow_stage_row(BfVector<8> *stage, const BfVector<8> (&raw)[LV],
                                                 int lane)
{
    __syncwarp();
#pragma unroll
    for (int j = 0; j < LV; j++)
        stage[lane * NarrowRow<LV>::STRIDE + j] = raw[j];
    __syncwarp();
}

/* Stores row t of `array` from `stage`, where narrow_stage_row put it: the warp's store
 * instructions each write 512 contiguous bytes. */
template <int LV>
__device__ __forceinline__ void narrow_store_staged(bf16 *array, long long t,
                                                    const BfVector<8> *stage, int lane)
{
#pragma unroll
    for (int j = 0; j < LV; j++) {
        const int v = j * 32 + lane;
        vector_store<8>(array, t * (32 * LV) + v, stage[narrow_slot<LV>(v)]);
    }
}

/* Stores this lane's LV vectors of row t of `array` through `stage`, a row of the warp's in
 * shared memory: each store instruction of the warp then writes 512 contiguous bytes, whole
 * sectors, where each lane writing its own vectors (16 bytes in every 16 LV) sends the L2 a
 * request of half a sector a lane. The warp is in step before (the stage's last readers)
 * and after (its next writers). */
template <int LV>
__device__ __forceinline__ void narrow_store_row(bf16 *array, long long t, BfVector<8> *stage,
                                                 const BfVector<8> (&raw)[LV], int lane)
{
    narrow_stage_row<LV>(stage, raw, lane);
    narrow_store_staged<LV>(array, t, stage, lane);
    __syncwarp();
}

/* The block's warps' rows of d floats (each lane's 8 LV: channels [l d/32, (l+1) d/32)) added
 * in warp order, ((w_0 + w_1) + w_2) + .., and stored to `row` as the block's one row: warp
 * w stages its row at warps_stage + w warp_stride (d floats of its own shared memory, in
 * float4s), then the block's threads add the WARPS rows a float4 at a time. A warp without
 * values (has_values false) adds zeros. Every thread of the block calls it, once (again only
 * after a __syncthreads): route_block_reduce then adds a row a block where it added one a
 * warp. CHUNKED: the values are in the norm kernels' layout for a row of a warp instead
 * (rmsnorm_row.cuh: values[8 k ..] are the channels of vector 32 k + lane). */
template <int LV, int WARPS, bool CHUNKED = false>
__device__ __forceinline__ void narrow_store_block_floats(float *row,
                                                          const float (&values)[8 * LV],
                                                          bool has_values, float4 *warps_stage,
                                                          int warp_stride)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float4 *mine = warps_stage + warp * warp_stride;
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 2 * LV; i++)
        mine[CHUNKED ? (32 * (i / 2) + lane) * 2 + i % 2 : lane * 2 * LV + i] =
            has_values ? make_float4(values[4 * i], values[4 * i + 1], values[4 * i + 2],
                                     values[4 * i + 3])
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();
    for (int k = threadIdx.x; k < 64 * LV; k += 32 * WARPS) { /* d / 4 float4s */
        float4 total = warps_stage[k];
#pragma unroll
        for (int w = 1; w < WARPS; w++) {
            const float4 other = warps_stage[w * warp_stride + k];
            total.x += other.x, total.y += other.y, total.z += other.z, total.w += other.w;
        }
        reinterpret_cast<float4 *>(row)[k] = total;
    }
}

/* this lane's LV vectors of a row in shared memory, as loaded */
template <int LV>
__device__ __forceinline__ void narrow_lane_vectors(BfVector<8> (&raw)[LV],
                                                    const BfVector<8> *row, int lane)
{
#pragma unroll
    for (int j = 0; j < LV; j++)
        raw[j] = row[lane * NarrowRow<LV>::STRIDE + j];
}

/* this lane's vector j of a row in shared memory, in fp32 */
template <int LV>
__device__ __forceinline__ void narrow_read(const BfVector<8> *row, int lane, int j, float *x)
{
    vector_to_floats<8>(row[lane * NarrowRow<LV>::STRIDE + j], x);
}

/* The sum over the lanes of this lane's head (lanes_per_head a power of two, the head's
 * lanes aligned to it): xor partners stay inside the head, and every lane of the head gets
 * the same bits (each step adds the same two values, in either order). */
__device__ __forceinline__ float head_sum(float value, int lanes_per_head)
{
    for (int offset = 1; offset < lanes_per_head; offset <<= 1)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

/* q*g of this lane's channels, in fp32 (exact: a product of two bf16) */
template <int LV>
__device__ __forceinline__ void narrow_key_weight(const bf16 *query, const bf16 *key_norm,
                                                  int lane, float *key_weight)
{
#pragma unroll
    for (int j = 0; j < LV; j++) {
        float q[8], g[8];
        vector_to_floats<8>(vector_load<8>(query, lane * LV + j), q);
        vector_to_floats<8>(vector_load<8>(key_norm, lane * LV + j), g);
#pragma unroll
        for (int i = 0; i < 8; i++)
            key_weight[8 * j + i] = q[i] * g[i];
    }
}

static inline int lane_vectors_of(int d)
{
    return d / 256;
}

static inline size_t narrow_row_bytes(int d)
{
    const int lane_vectors = lane_vectors_of(d);
    const int stride = lane_vectors % 2 ? lane_vectors : lane_vectors + 1;
    return (size_t)32 * stride * 16;
}

/* the ring, then the scores [N][H] of the token */
static inline size_t narrow_forward_bytes(int n_sources, int d, int heads)
{
    return NARROW_FORWARD_RING * narrow_row_bytes(d) +
           round_up_16((size_t)n_sources * heads * sizeof(float));
}

/* Warps a token in the backward: each takes every W-th source, so a token's latency is
 * about ceil(N / W) sources' worth. */
static inline int narrow_backward_warps(int n_sources)
{
    return n_sources < NARROW_BACKWARD_WARPS ? n_sources : NARROW_BACKWARD_WARPS;
}

/* rows: N sources, two dout rows, a gradient ring a warp; then floats, two buffers each of
 * the token's a [N][H] and r [N], and of D and P [N][H] */
static inline size_t narrow_backward_bytes(int n_sources, int d, int heads)
{
    const int rows = n_sources + 2 + narrow_backward_warps(n_sources) * NARROW_GRADIENT_RING;
    return (size_t)rows * narrow_row_bytes(d) +
           round_up_16((size_t)2 * (3 * n_sources * heads + n_sources) * sizeof(float));
}

#endif
