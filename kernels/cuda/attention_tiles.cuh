/* kernels/cuda/attention_tiles.cuh — tile plumbing shared by the attention kernels
 * (attention_cuda.cu, attention_backward_cuda.cu) and their host-side shape checks; CUDA
 * C++ only, never included from C. sm_90a: the products are Hopper warpgroup MMAs (wgmma).
 *
 * Warpgroup products. Four consecutive warps (128 threads, the first warp's index a multiple
 * of 4) issue one wgmma.mma_async.m64nNk16: D [64, N] fp32 (+)= A [64, 16] B [16, N], bf16
 * operands. The instruction is asynchronous: it is fenced (warpgroup_fence) after the
 * registers it reads were last written, issued, committed as a group, and its results are
 * read only after warpgroup_wait. The fragment layouts (PTX ISA "Register Fragments and
 * Shared Memory Matrix Layouts", the same per warp as mma.sync.m16n8k16), with
 * warp w = 0..3 of the group, lane = 4 g + c:
 *   accumulator D, tile t = columns 8t .. 8t+7:
 *     d[t][0], d[t][1] = row 16w + g,     columns 8t + 2c, 8t + 2c + 1
 *     d[t][2], d[t][3] = row 16w + g + 8, columns 8t + 2c, 8t + 2c + 1
 *   A in registers, bf16 pairs, k = 0 .. 15:
 *     a[0] = row 16w + g, k 2c, 2c+1;      a[1] = row 16w + g + 8, k 2c, 2c+1;
 *     a[2] = row 16w + g, k 8+2c, 9+2c;    a[3] = row 16w + g + 8, k 8+2c, 9+2c
 * so accumulator tiles 2j and 2j+1 of one product pack into the A operand (k = columns 16j ..
 * 16j+15) of the next without leaving registers (accumulators_to_operand).
 *
 * Shared-memory tiles are "packed": a tile of `rows` x HEAD_DIM bf16 (rows a multiple of 8) is
 * stored as the no-swizzle core matrices of wgmma, 8 rows x 8 columns (16 bytes a row) each,
 * contiguous (128 bytes):
 *   element (r, col) at  (r / 8) * 8 * HEAD_DIM  +  (col / 8) * 64  +  (r % 8) * 8  +  col % 8
 * A 16-byte global piece (8 columns of one row) lands whole, so tiles still move with cp.async.
 * The same tile serves both ways a product can read it (descriptor fields: LBO = bytes between
 * core matrices adjacent along K, SBO = adjacent along M or N):
 *   K-major, contraction over the columns (S = Q K^T reads Q and K so):  LBO 128, SBO 16 HEAD_DIM;
 *   MN-major, contraction over the rows, N = the columns (O = P V reads V so; the instruction's
 *   transpose flag set): LBO 16 HEAD_DIM, SBO 128.
 * Each core matrix is 128 contiguous bytes, so the tensor cores read it without bank
 * conflicts; cp.async writes go lane by lane through whole core matrices (no conflicts either).
 *
 * Ordering. cp.async writes shared memory through the generic proxy and wgmma reads it through
 * the async proxy: every thread fences (fence_async_proxy) after its copies have landed and
 * before the barrier that publishes them. Rows past the sequence end are filled with zeros,
 * which keeps every product finite (masked probabilities are exact zeros and 0 * 0 stays 0).
 */
#ifndef FATHOM_KERNELS_CUDA_ATTENTION_TILES_CUH
#define FATHOM_KERNELS_CUDA_ATTENTION_TILES_CUH

#include "kernels/cuda/cuda_common.h"
#include "runtime/error.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

/* wgmma exists on sm_90a only. The build also embeds compute_90 PTX (for the JIT on other
 * GPUs), where these wrappers trap instead; attention_check_device refuses such GPUs before
 * any launch. */
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WARPGROUP_MMA_MISSING 1
#endif

#define WARPGROUP_THREADS 128
#define WARPGROUP_ROWS 64       /* M of every warpgroup product */
#define STAGE_PAD 8             /* fp32 elements after every fp32 staging row */
#define LOG2_E 1.4426950408889634f
#define LN_2 0.6931471805599453f

static __device__ __forceinline__ uint32_t shared_address(const void *pointer)
{
    return (uint32_t)__cvta_generic_to_shared(pointer);
}

/* 16 bytes global -> shared, asynchronous; zeros instead when !valid (nothing is read). */
static __device__ __forceinline__ void copy_async_16(void *shared, const void *global,
                                                     bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)),
                 "l"(global), "r"(valid ? 16 : 0));
}

/* 4 bytes global -> shared, asynchronous; zero instead when !valid. */
static __device__ __forceinline__ void copy_async_4(void *shared, const void *global, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(shared)),
                 "l"(global), "r"(valid ? 4 : 0));
}

static __device__ __forceinline__ void copy_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Waits until at most `pending` of this thread's committed groups are still in flight. */
template <int pending>
static __device__ __forceinline__ void copy_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

/* Makes this thread's completed shared-memory writes visible to the tensor cores (async
 * proxy); a barrier after it publishes them to the whole block. */
static __device__ __forceinline__ void fence_async_proxy(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- warpgroup products (sm_90a) ---- */

/* Orders this thread's earlier register writes before the next warpgroup products. */
static __device__ __forceinline__ void warpgroup_fence(void)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

/* Closes the group of products issued since the last commit. */
static __device__ __forceinline__ void warpgroup_commit(void)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

/* Waits until at most `pending` committed groups are still running. */
template <int pending>
static __device__ __forceinline__ void warpgroup_wait(void)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
#endif
}

/* The compiler does not know that a product writes its accumulators at the wait: passing
 * them through an empty asm after the wait keeps every later use of them below it (and an
 * earlier write above the next product's fence). */
template <int TILES>
static __device__ __forceinline__ void warpgroup_fence_accumulators(float (&d)[TILES][4])
{
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(d[t][e])::"memory");
}

/* The shared-memory matrix descriptor of a wgmma operand (PTX ISA "Matrix Descriptor
 * Format"), no swizzle: bits 0-13 start address / 16, 16-29 leading byte offset / 16,
 * 32-45 stride byte offset / 16, base offset 0, layout type 0. */
static __device__ __forceinline__ uint64_t shared_matrix_descriptor(const void *start,
                                                                    uint32_t leading_bytes,
                                                                    uint32_t stride_bytes)
{
    return (uint64_t)((shared_address(start) >> 4) & 0x3FFF) |
           (uint64_t)((leading_bytes >> 4) & 0x3FFF) << 16 |
           (uint64_t)((stride_bytes >> 4) & 0x3FFF) << 32;
}

/* Operand "the rows of a packed tile from `tile` on, columns k0 .. k0+15" read K-major
 * (contraction over the columns): an A [64, 16] or a B read as [N, 16]. `tile` starts a row
 * group (row % 8 == 0); k0 % 16 == 0. */
template <int HEAD_DIM>
static __device__ __forceinline__ uint64_t packed_k_major(const __nv_bfloat16 *tile, int k0)
{
    return shared_matrix_descriptor(tile + k0 * 8, 128, 16 * HEAD_DIM);
}

/* Operand "rows k0 .. k0+15 of a packed tile, every column" read MN-major: a B [16, HEAD_DIM]
 * whose contraction runs over the rows. k0 % 16 == 0. */
template <int HEAD_DIM>
static __device__ __forceinline__ uint64_t packed_mn_major(const __nv_bfloat16 *tile, int k0)
{
    return shared_matrix_descriptor(tile + k0 * HEAD_DIM, 16 * HEAD_DIM, 128);
}

/* d [64, 64] (+)= A [64, 16] B^T, both operands K-major in shared memory (descriptors);
 * accumulate = false overwrites d (scale-d = 0: the old d is not read). */
static __device__ __forceinline__ void warpgroup_mma_64x64(float (&d)[8][4], uint64_t a_descriptor,
                                                          uint64_t b_descriptor, bool accumulate)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7,"
                 " %8, %9, %10, %11, %12, %13, %14, %15,"
                 " %16, %17, %18, %19, %20, %21, %22, %23,"
                 " %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, accumulate, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(a_descriptor), "l"(b_descriptor), "r"((int)accumulate));
#endif
}

/* d [64, N] += A [64, 16] B [16, N]: A bf16 in registers (layout above), B MN-major in
 * shared memory (descriptor, transposed read). N = 64, 80 or 128. */
template <int N>
static __device__ __forceinline__ void warpgroup_mma_registers(float (&d)[N / 8][4],
                                                              const uint32_t (&a)[4],
                                                              uint64_t b_descriptor)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    static_assert(N == 64 || N == 80 || N == 128, "head_dim 64, 80 or 128");
    if constexpr (N == 64) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "{%32, %33, %34, %35}, %36, accumulate, 1, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                       "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                       "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                       "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                       "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
                       "r"(1));
    } else if constexpr (N == 80) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %45, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39}, "
                     "{%40, %41, %42, %43}, %44, accumulate, 1, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                       "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                       "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                       "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                       "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                       "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                       "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
                       "r"(1));
    } else {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39,"
                     " %40, %41, %42, %43, %44, %45, %46, %47,"
                     " %48, %49, %50, %51, %52, %53, %54, %55,"
                     " %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "{%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                       "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                       "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                       "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                       "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                       "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                       "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                       "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
                       "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                       "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
                       "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                       "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                       "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
                       "r"(1));
    }
#endif
}

/* s = A B^T over the HEAD_DIM columns of two packed tiles: A = the 64 rows from `a`, B = the
 * 64 rows from `b` (both K-major; scores q k^T and their kin). */
template <int HEAD_DIM>
static __device__ __forceinline__ void warpgroup_rows_times_rows(float (&s)[8][4],
                                                                 const __nv_bfloat16 *a,
                                                                 const __nv_bfloat16 *b)
{
#pragma unroll
    for (int k0 = 0; k0 < HEAD_DIM; k0 += 16)
        warpgroup_mma_64x64(s, packed_k_major<HEAD_DIM>(a, k0), packed_k_major<HEAD_DIM>(b, k0),
                            k0 > 0);
}

/* d += A B: A = 64 x 64 bf16 fragments (a[j]: k = 16j .. 16j+15, the rows of `b`), B = the 64
 * rows from the packed tile `b` read MN-major (N = HEAD_DIM; p v and its kin). */
template <int HEAD_DIM>
static __device__ __forceinline__ void warpgroup_fragments_times_tile(
    float (&d)[HEAD_DIM / 8][4], const uint32_t (&a)[4][4], const __nv_bfloat16 *b)
{
#pragma unroll
    for (int k0 = 0; k0 < 64; k0 += 16)
        warpgroup_mma_registers<HEAD_DIM>(d, a[k0 / 16], packed_mn_major<HEAD_DIM>(b, k0));
}

/* ---- tiles and vectors ---- */

/* Two floats rounded to bf16 (round to nearest even), `low` in the low half. */
static __device__ __forceinline__ uint32_t pack_bf16x2(float low, float high)
{
    __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    uint32_t bits;
    memcpy(&bits, &pair, sizeof bits); /* a register move; no type-punned access */
    return bits;
}

/* The eight bf16 of a 16-byte piece, as floats. */
static __device__ __forceinline__ void unpack_bf16x8(float value[8], uint4 piece)
{
    __nv_bfloat162 pairs[4];
    memcpy(pairs, &piece, sizeof pairs);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 pair = __bfloat1622float2(pairs[i]);
        value[2 * i] = pair.x;
        value[2 * i + 1] = pair.y;
    }
}

/* Accumulator tiles 2j and 2j+1 (columns 16j .. 16j+15) as the A operand over k = those
 * columns. */
static __device__ __forceinline__ void accumulators_to_operand(uint32_t (&a)[4],
                                                               const float (&left)[4],
                                                               const float (&right)[4])
{
    a[0] = pack_bf16x2(left[0], left[1]);
    a[1] = pack_bf16x2(left[2], left[3]);
    a[2] = pack_bf16x2(right[0], right[1]);
    a[3] = pack_bf16x2(right[2], right[3]);
}

/* Copies rows [row0, row0 + ROWS) of a [rows_total, *] global array (row r at
 * global + r * row_stride, HEAD_DIM contiguous bf16) into a packed shared tile; rows at or
 * past rows_total become zeros. One cp.async of 16 bytes per piece, spread over the THREADS
 * threads of the block: eight neighbouring lanes fill one core matrix (eight rows of one
 * 16-byte column), so a warp writes 512 contiguous bytes and reads 64 contiguous bytes from
 * each of eight rows. */
template <int ROWS, int HEAD_DIM, int THREADS>
static __device__ __forceinline__ void packed_tile_load_async(__nv_bfloat16 *tile,
                                                              const __nv_bfloat16 *global,
                                                              size_t row_stride, int row0,
                                                              int rows_total)
{
    static_assert(ROWS % 8 == 0, "whole core matrices");
    constexpr int pieces_per_row = HEAD_DIM / 8;
    /* unsigned: the divisions by constants become shifts and multiplies */
    for (unsigned piece = threadIdx.x; piece < ROWS * pieces_per_row; piece += THREADS) {
        int row_in_group = (int)(piece % 8), column_piece = (int)(piece / 8 % pieces_per_row);
        int row = (int)(piece / (8 * pieces_per_row)) * 8 + row_in_group;
        bool valid = row0 + row < rows_total;
        const __nv_bfloat16 *source =
            valid ? global + (size_t)(row0 + row) * row_stride + column_piece * 8 : global;
        copy_async_16(tile + (row - row_in_group) * HEAD_DIM + column_piece * 64 +
                          row_in_group * 8,
                      source, valid);
    }
}

/* Copies COUNT fp32 values global[first ..] into shared (zeros past `total`). */
template <int COUNT>
static __device__ __forceinline__ void vector_load_async(float *shared, const float *global,
                                                         int first, int total)
{
    for (int i = threadIdx.x; i < COUNT; i += blockDim.x) {
        bool valid = first + i < total;
        copy_async_4(shared + i, valid ? global + first + i : global, valid);
    }
}

/* Writes a warp's accumulators, tiles [HEAD_DIM / 8][4] for 16 rows, times `factor`, into a
 * fp32 staging area of 16 rows (stride HEAD_DIM + STAGE_PAD). */
template <int HEAD_DIM>
static __device__ __forceinline__ void
warp_stage_accumulators(float *stage, const float (&tiles)[HEAD_DIM / 8][4], float factor,
                        int lane)
{
    constexpr int stride = HEAD_DIM + STAGE_PAD;
    int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++) {
        int column = t * 8 + 2 * c;
        *reinterpret_cast<float2 *>(stage + g * stride + column) =
            make_float2(tiles[t][0] * factor, tiles[t][1] * factor);
        *reinterpret_cast<float2 *>(stage + (g + 8) * stride + column) =
            make_float2(tiles[t][2] * factor, tiles[t][3] * factor);
    }
}

/* Stores 16 staged fp32 rows (rows row0 .. row0+15 of a [rows_total, *] global bf16 array,
 * row stride row_stride) in 16-byte pieces: out = bf16(stage) or, when accumulating,
 * bf16(float(out) + stage), rounded once. Rows at or past rows_total are skipped. */
template <int HEAD_DIM>
static __device__ __forceinline__ void warp_store_staged(__nv_bfloat16 *global, size_t row_stride,
                                                         const float *stage, int row0,
                                                         int rows_total, bool accumulate,
                                                         int lane)
{
    constexpr int pieces_per_row = HEAD_DIM / 8;
    constexpr int stride = HEAD_DIM + STAGE_PAD;
    for (int piece = lane; piece < 16 * pieces_per_row; piece += 32) {
        int row = piece / pieces_per_row, column = (piece % pieces_per_row) * 8;
        if (row0 + row >= rows_total)
            continue;
        const float4 *source = reinterpret_cast<const float4 *>(stage + row * stride + column);
        float4 first = source[0], second = source[1];
        float value[8] = {first.x, first.y, first.z, first.w,
                          second.x, second.y, second.z, second.w};
        uint4 *destination =
            reinterpret_cast<uint4 *>(global + (size_t)(row0 + row) * row_stride + column);
        if (accumulate) {
            float old[8];
            unpack_bf16x8(old, *destination);
#pragma unroll
            for (int i = 0; i < 8; i++)
                value[i] += old[i];
        }
        /* __stwb: an ordinary store, spelled so that it stays one 16-byte access */
        __stwb(destination,
               make_uint4(pack_bf16x2(value[0], value[1]), pack_bf16x2(value[2], value[3]),
                          pack_bf16x2(value[4], value[5]), pack_bf16x2(value[6], value[7])));
    }
}

/* The shape rules of attention_cuda.h, checked on the host before any launch: a shape the
 * kernels cannot run is a configuration error naming the value, never a wrong result. */
static inline void attention_check_shape(const char *op, int B, int T, int n_heads,
                                         int n_kv_heads, int head_dim)
{
    if (head_dim != 64 && head_dim != 80 && head_dim != 128)
        fatal(EXIT_CONFIG, "%s: model.head_dim = %d is not supported on cuda (64, 80 or 128)",
              op, head_dim);
    if (B < 0 || T < 0 || n_heads < 1 || n_kv_heads < 1)
        fatal(EXIT_CONFIG, "%s: invalid shape B = %d, T = %d, n_heads = %d, n_kv_heads = %d",
              op, B, T, n_heads, n_kv_heads);
    if (n_heads % n_kv_heads != 0)
        fatal(EXIT_CONFIG, "%s: model.n_kv_heads = %d must divide model.n_heads = %d", op,
              n_kv_heads, n_heads);
    if (B > 65535)
        fatal(EXIT_CONFIG, "%s: batch %d exceeds the 65535 the launch grid allows", op, B);
}

/* The kernels are Hopper warpgroup MMAs: another GPU gets a message naming it, not a trap.
 * Checked once per device. */
static inline void attention_check_device(const char *op)
{
    static signed char checked[64]; /* per device: 0 unknown, 1 Hopper */
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (device >= 0 && device < 64 && checked[device])
        return;
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major != 9 || minor != 0)
        fatal(EXIT_CONFIG,
              "%s: needs a Hopper GPU (sm_90, warpgroup MMA); device %d is sm_%d%d "
              "(device: cpu runs everywhere)",
              op, device, major, minor);
    if (device >= 0 && device < 64)
        checked[device] = 1;
}

/* Every tile moves in 16-byte pieces. */
static inline void attention_check_aligned(const char *op, const char *name, const void *pointer)
{
    if ((uintptr_t)pointer % 16 != 0)
        fatal(EXIT_CONFIG, "%s: %s is not 16-byte aligned", op, name);
}

#endif
