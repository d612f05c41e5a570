/* kernels/cuda/bf16_vector.cuh — 16-byte loads and stores of 8 values, and the row sums the
 * kernels of kernels_cuda.h share (device code, included by .cu files only).
 *
 * A thread moves 8 consecutive elements at a time: 8 bf16 or 8 fp32 values starting at
 * element `index` of an array of `count` elements. With VECTOR = true, and when all 8 are in
 * range, that is one 16-byte access (two for fp32); otherwise (unaligned arrays, rows whose
 * length is not a multiple of 8, the tail of an array) the elements are moved one by one,
 * those past `count` read as 0 and are never written. The caller chooses VECTOR once per
 * launch on the host (pointers 16-byte aligned and row lengths multiples of 8), so both
 * paths compute the same values in the same order: only the memory instructions differ.
 */
#ifndef FATHOM_KERNELS_CUDA_BF16_VECTOR_CUH
#define FATHOM_KERNELS_CUDA_BF16_VECTOR_CUH

#include "kernels/cuda/cuda_common.h"

#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

typedef __nv_bfloat16 bfloat;

/* Host side: a pointer the 16-byte paths may use (NULL counts as aligned: it is not read). */
static inline bool is_aligned_16(const void *pointer)
{
    return ((uintptr_t)pointer & 15u) == 0;
}

/* Host side: blocks for a grid-stride loop over `items` work items, `per_block` a block:
 * at most enough to fill every multiprocessor once at full occupancy (8 blocks of 256
 * threads), so the loop, not the launch, walks over large arrays. */
static inline unsigned grid_stride_blocks(size_t items, unsigned per_block)
{
    size_t blocks = (items + per_block - 1) / per_block;
    size_t limit = (size_t)cuda_multiprocessor_count() * 8;
    if (blocks < 1)
        blocks = 1;
    return (unsigned)(blocks < limit ? blocks : limit);
}

/* 8 bf16 as their raw bits (one uint4), zero bits past `count`. */
template <bool VECTOR>
__device__ __forceinline__ uint4 load8_raw(const bfloat *base, size_t index, size_t count)
{
    if (VECTOR && index + 8 <= count)
        return *reinterpret_cast<const uint4 *>(base + index);
    uint4 raw = make_uint4(0, 0, 0, 0);
    uint16_t *halves = reinterpret_cast<uint16_t *>(&raw);
    const uint16_t *source = reinterpret_cast<const uint16_t *>(base);
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (index + k < count)
            halves[k] = source[index + k];
    return raw;
}

__device__ __forceinline__ void unpack8(float out[8], uint4 raw)
{
    const __nv_bfloat162 *pairs = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 pair = __bfloat1622float2(pairs[k]);
        out[2 * k] = pair.x;
        out[2 * k + 1] = pair.y;
    }
}

/* 8 bf16 widened to fp32 (exact), 0 past `count`. */
template <bool VECTOR>
__device__ __forceinline__ void load8(float out[8], const bfloat *base, size_t index,
                                      size_t count)
{
    unpack8(out, load8_raw<VECTOR>(base, index, count));
}

/* 8 fp32 rounded once to bf16 (nearest even), as their raw bits. */
__device__ __forceinline__ uint4 pack8(const float in[8])
{
    uint4 raw;
    __nv_bfloat162 *pairs = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++)
        pairs[k] = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
    return raw;
}

/* 8 bf16 given as their raw bits stored; nothing past `count`. */
template <bool VECTOR>
__device__ __forceinline__ void store8_raw(bfloat *base, size_t index, size_t count, uint4 raw)
{
    if (VECTOR && index + 8 <= count) {
        *reinterpret_cast<uint4 *>(base + index) = raw;
        return;
    }
    const bfloat *halves = reinterpret_cast<const bfloat *>(&raw);
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (index + k < count)
            base[index + k] = halves[k];
}

/* 8 fp32 rounded once to bf16 (nearest even) and stored; nothing past `count`. */
template <bool VECTOR>
__device__ __forceinline__ void store8(bfloat *base, size_t index, size_t count,
                                       const float in[8])
{
    store8_raw<VECTOR>(base, index, count, pack8(in));
}

/* base + scale * x in one rounding (a fused multiply-add): the delta form's gate, the same
 * bits wherever it is formed (add_scaled, add_scaled_rmsnorm_forward). */
__device__ __forceinline__ float scaled_add(float base, float scale, float x)
{
    return __fmaf_rn(scale, x, base);
}

/* COUNT fp32 (a multiple of 4), 0 past `count`: COUNT / 4 16-byte loads on the vector
 * path. */
template <int COUNT, bool VECTOR>
__device__ __forceinline__ void load_floats(float out[COUNT], const float *base, size_t index,
                                            size_t count)
{
    if (VECTOR && index + COUNT <= count) {
#pragma unroll
        for (int q = 0; q < COUNT / 4; q++) {
            const float4 v = *reinterpret_cast<const float4 *>(base + index + 4 * q);
            out[4 * q] = v.x, out[4 * q + 1] = v.y, out[4 * q + 2] = v.z, out[4 * q + 3] = v.w;
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < COUNT; k++)
        out[k] = index + k < count ? base[index + k] : 0.0f;
}

/* COUNT fp32 stored (COUNT / 4 16-byte stores on the vector path); nothing past `count`. */
template <int COUNT, bool VECTOR>
__device__ __forceinline__ void store_floats(float *base, size_t index, size_t count,
                                             const float in[COUNT])
{
    if (VECTOR && index + COUNT <= count) {
#pragma unroll
        for (int q = 0; q < COUNT / 4; q++)
            *reinterpret_cast<float4 *>(base + index + 4 * q) =
                make_float4(in[4 * q], in[4 * q + 1], in[4 * q + 2], in[4 * q + 3]);
        return;
    }
#pragma unroll
    for (int k = 0; k < COUNT; k++)
        if (index + k < count)
            base[index + k] = in[k];
}

template <bool VECTOR>
__device__ __forceinline__ void load8_float(float out[8], const float *base, size_t index,
                                            size_t count)
{
    load_floats<8, VECTOR>(out, base, index, count);
}

template <bool VECTOR>
__device__ __forceinline__ void store8_float(float *base, size_t index, size_t count,
                                             const float in[8])
{
    store_floats<8, VECTOR>(base, index, count, in);
}

/* 4 fp32 rounded once to bf16 (nearest even) and stored, one 8-byte store on the vector
 * path; nothing past `count`. */
template <bool VECTOR>
__device__ __forceinline__ void store4(bfloat *base, size_t index, size_t count,
                                       const float in[4])
{
    if (VECTOR && index + 4 <= count) {
        const __nv_bfloat162 pairs[2] = {__floats2bfloat162_rn(in[0], in[1]),
                                         __floats2bfloat162_rn(in[2], in[3])};
        *reinterpret_cast<uint2 *>(base + index) = *reinterpret_cast<const uint2 *>(pairs);
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (index + k < count)
            base[index + k] = __float2bfloat16_rn(in[k]);
}

/* Sum of `value` over the ROW_THREADS consecutive threads of a row (32: one warp; a multiple
 * of 32: the whole block, which must then be one row). Fixed butterfly and fixed warp order,
 * so the result is the same bits run to run, and every thread of the row receives it.
 * `scratch` holds ROW_THREADS / 32 floats of shared memory; all threads of the block must
 * call this together when ROW_THREADS > 32. */
template <int ROW_THREADS>
__device__ __forceinline__ float row_sum(float value, float *scratch)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (ROW_THREADS == 32)
        return value;
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0)
        scratch[warp] = value;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < ROW_THREADS / 32; w++)
        total += scratch[w];
    __syncthreads(); /* scratch is reused by the caller's next row */
    return total;
}

#endif
