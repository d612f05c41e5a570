/* kernels/cuda/warpgroup_mma.cuh — Hopper warpgroup matrix products (wgmma, sm_90a) and the
 * shared-memory matrix descriptors they read; CUDA C++ only, never included from C.
 *
 * Four consecutive warps (128 threads, the first warp's index a multiple of 4) issue one
 * wgmma.mma_async.m64nNk16: D [64, N] fp32 (+)= A [64, 16] B [16, N], bf16 operands. The
 * instruction is asynchronous: it is fenced (warpgroup_fence) after the registers it reads
 * were last written, issued, committed as a group, and its results are read only after
 * warpgroup_wait. The fragment layouts (PTX ISA "Register Fragments and Shared Memory Matrix
 * Layouts", the same per warp as mma.sync.m16n8k16), with warp w = 0..3 of the group,
 * lane = 4 g + c:
 *   accumulator D, tile t = columns 8t .. 8t+7:
 *     d[t][0], d[t][1] = row 16w + g,     columns 8t + 2c, 8t + 2c + 1
 *     d[t][2], d[t][3] = row 16w + g + 8, columns 8t + 2c, 8t + 2c + 1
 *   A in registers, bf16 pairs, k = 0 .. 15:
 *     a[0] = row 16w + g, k 2c, 2c+1;      a[1] = row 16w + g + 8, k 2c, 2c+1;
 *     a[2] = row 16w + g, k 8+2c, 9+2c;    a[3] = row 16w + g + 8, k 8+2c, 9+2c
 * so accumulator tiles 2j and 2j+1 of one product pack into the A operand (k = columns 16j ..
 * 16j+15) of the next without leaving registers.
 *
 * Operands in shared memory are named by a 64-bit descriptor (PTX ISA "Matrix Descriptor
 * Format"): bits 0-13 start address / 16, 16-29 leading byte offset (LBO) / 16, 32-45 stride
 * byte offset (SBO) / 16, 62-63 the layout (0 no swizzle, 1 128-byte, 2 64-byte, 3 32-byte
 * swizzle). A "core matrix" is 8 rows of 16 bytes. What LBO and SBO mean depends on the layout
 * and on which way the operand is read (CUTLASS's canonical GMMA layouts):
 *   no swizzle, K-major (contraction over the contiguous 16-byte rows of each core matrix):
 *     LBO = bytes between core matrices adjacent along K, SBO = adjacent along M or N;
 *   no swizzle, MN-major (transposed read): the same two meanings, LBO along K, SBO along N;
 *   swizzled, K-major: rows of the swizzle width W (32 / 64 / 128 bytes) hold the 16 K
 *     elements of one product; SBO = bytes between groups of 8 rows (8 W when rows are
 *     contiguous), LBO unused (1); a later K step moves the start address within the row;
 *   swizzled, MN-major: W bytes of M or N are contiguous, 8 K rows at W bytes;
 *     LBO = bytes between W-wide column groups, SBO = bytes between groups of 8 K rows.
 * A swizzled operand's 8-row group must start on a multiple of 8 W bytes of the shared window
 * (the XOR pattern is taken from address bits), as the TMA copies that fill it assume.
 */
#ifndef FATHOM_KERNELS_CUDA_WARPGROUP_MMA_CUH
#define FATHOM_KERNELS_CUDA_WARPGROUP_MMA_CUH

#include "kernels/cuda/hopper_async.cuh"

#include <stdint.h>

#define WARPGROUP_THREADS 128
#define WARPGROUP_ROWS 64 /* M of every warpgroup product */

/* Orders this thread's earlier register accesses before the next warpgroup products. */
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

/* Operand layouts of a descriptor (bits 62-63). */
enum SharedMatrixLayout {
    SHARED_MATRIX_INTERLEAVE = 0,
    SHARED_MATRIX_SWIZZLE_128B = 1,
    SHARED_MATRIX_SWIZZLE_64B = 2,
    SHARED_MATRIX_SWIZZLE_32B = 3,
};

/* The descriptor of an operand starting at `start` (base offset 0). */
static __device__ __forceinline__ uint64_t shared_matrix_descriptor(
    const void *start, uint32_t leading_bytes, uint32_t stride_bytes,
    SharedMatrixLayout layout = SHARED_MATRIX_INTERLEAVE)
{
    return (uint64_t)((shared_address(start) >> 4) & 0x3FFF) |
           (uint64_t)((leading_bytes >> 4) & 0x3FFF) << 16 |
           (uint64_t)((stride_bytes >> 4) & 0x3FFF) << 32 | (uint64_t)layout << 62;
}

/* d [64, N] (+)= A [64, 16] B [16, N], both operands in shared memory (descriptors). TRANS_A /
 * TRANS_B: 0 reads the operand K-major, 1 MN-major (transposed). accumulate = false
 * overwrites d (scale-d 0: the old d is not read). N = 32, 40, 64, 80 or 128. */
template <int N, int TRANS_A, int TRANS_B>
static __device__ __forceinline__ void warpgroup_mma_shared(float (&d)[N / 8][4],
                                                          uint64_t a_descriptor,
                                                          uint64_t b_descriptor, bool accumulate)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    static_assert(N == 32 || N == 40 || N == 64 || N == 80 || N == 128, "N of a product");
    if constexpr (N == 32) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15}, "
                     "%16, %17, accumulate, 1, 1, %19, %20;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                     : "l"(a_descriptor), "l"(b_descriptor), "r"((int)accumulate), "n"(TRANS_A),
                       "n"(TRANS_B));
    } else if constexpr (N == 40) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %22, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19}, "
                     "%20, %21, accumulate, 1, 1, %23, %24;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                       "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3])
                     : "l"(a_descriptor), "l"(b_descriptor), "r"((int)accumulate), "n"(TRANS_A),
                       "n"(TRANS_B));
    } else if constexpr (N == 64) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "%32, %33, accumulate, 1, 1, %35, %36;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                       "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                       "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                       "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                       "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "l"(a_descriptor), "l"(b_descriptor), "r"((int)accumulate), "n"(TRANS_A),
                       "n"(TRANS_B));
    } else if constexpr (N == 80) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %42, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39}, "
                     "%40, %41, accumulate, 1, 1, %43, %44;\n}\n"
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
                     : "l"(a_descriptor), "l"(b_descriptor), "r"((int)accumulate), "n"(TRANS_A),
                       "n"(TRANS_B));
    } else if constexpr (N == 128) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39,"
                     " %40, %41, %42, %43, %44, %45, %46, %47,"
                     " %48, %49, %50, %51, %52, %53, %54, %55,"
                     " %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "%64, %65, accumulate, 1, 1, %67, %68;\n}\n"
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
                     : "l"(a_descriptor), "l"(b_descriptor), "r"((int)accumulate), "n"(TRANS_A),
                       "n"(TRANS_B));
    }
#endif
}

/* d [64, N] (+)= A [64, 16] B [16, N]: A bf16 in registers (layout above), B in shared memory
 * (descriptor; TRANS_B 1 reads it MN-major). The registers of A must stay unchanged until the
 * product has been waited for. N = 32, 40, 64, 80 or 128. */
template <int N, int TRANS_B>
static __device__ __forceinline__ void warpgroup_mma_registers(float (&d)[N / 8][4],
                                                              const uint32_t (&a)[4],
                                                              uint64_t b_descriptor,
                                                              bool accumulate)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    static_assert(N == 32 || N == 40 || N == 64 || N == 80 || N == 128, "N of a product");
    if constexpr (N == 32) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15}, "
                     "{%16, %17, %18, %19}, %20, accumulate, 1, 1, %22;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
                       "r"((int)accumulate), "n"(TRANS_B));
    } else if constexpr (N == 40) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %25, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19}, "
                     "{%20, %21, %22, %23}, %24, accumulate, 1, 1, %26;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                       "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
                       "r"((int)accumulate), "n"(TRANS_B));
    } else if constexpr (N == 64) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "{%32, %33, %34, %35}, %36, accumulate, 1, 1, %38;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                       "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                       "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                       "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                       "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                       "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                       "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
                       "r"((int)accumulate), "n"(TRANS_B));
    } else if constexpr (N == 80) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %45, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7,"
                     " %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23,"
                     " %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39}, "
                     "{%40, %41, %42, %43}, %44, accumulate, 1, 1, %46;\n}\n"
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
                       "r"((int)accumulate), "n"(TRANS_B));
    } else if constexpr (N == 128) {
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
                     "{%64, %65, %66, %67}, %68, accumulate, 1, 1, %70;\n}\n"
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
                       "r"((int)accumulate), "n"(TRANS_B));
    }
#endif
}

#endif
