/* kernels/cuda/attention_tiles.cuh — tile plumbing shared by the attention kernels
 * (attention_cuda.cu, attention_backward_cuda.cu) and their host-side shape checks; CUDA
 * C++ only, never included from C.
 *
 * Everything here works on warp-level tensor-core tiles of mma.sync.m16n8k16 (bf16 inputs,
 * fp32 accumulators), the fragment layouts of the PTX ISA ("Matrix Fragments for
 * mma.m16n8k16"). With lane = 4 g + c (g = lane / 4, c = lane % 4):
 *   accumulator C (16 x 8, fp32):  c[0], c[1] = row g,     columns 2c, 2c+1
 *                                  c[2], c[3] = row g + 8, columns 2c, 2c+1
 *   operand A (16 x 16, bf16x2):   a[0] = row g, k 2c..; a[1] = row g+8, k 2c..;
 *                                  a[2] = row g, k 8+2c..; a[3] = row g+8, k 8+2c..
 *   operand B (16 x 8, bf16x2):    b[0] = k 2c, 2c+1 of column g; b[1] = k 8+2c, 9+2c
 * so two neighbouring accumulator tiles (16 x 16 of fp32) pack into one A operand: the
 * probabilities of one key block feed the next product without leaving registers.
 *
 * Shared-memory tiles are row-major with rows of head_dim + TILE_PAD bf16: the 16-byte pad
 * puts the 8 row addresses of one ldmatrix on distinct banks for head_dim 64, 80 and 128
 * (80 is no power of two, so an XOR swizzle would not fit; padding does). Global tiles move
 * with cp.async in 16-byte pieces; rows past the sequence end are filled with zeros, which
 * keeps every product finite (masked probabilities are exact zeros and 0 * 0 stays 0).
 */
#ifndef FATHOM_KERNELS_CUDA_ATTENTION_TILES_CUH
#define FATHOM_KERNELS_CUDA_ATTENTION_TILES_CUH

#include "runtime/error.h"

#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#define TILE_PAD 8              /* bf16 elements (16 bytes) after every shared-memory row */
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

/* Four 8x8 bf16 matrices; lane l gives the row address of matrix l / 8, row l % 8. */
static __device__ __forceinline__ void load_matrix_x4(uint32_t fragment[4], const void *shared)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
                 : "r"(shared_address(shared)));
}

/* The same, each 8x8 matrix transposed on the way. */
static __device__ __forceinline__ void load_matrix_x4_transposed(uint32_t fragment[4],
                                                                 const void *shared)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
                 : "r"(shared_address(shared)));
}

/* c += a * b, one 16x8x16 tensor-core product (bf16 in, fp32 accumulate). */
static __device__ __forceinline__ void mma_bf16_16x8x16(float c[4], const uint32_t a[4],
                                                        uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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
static __device__ __forceinline__ void accumulators_to_operand(uint32_t a[4], const float left[4],
                                                               const float right[4])
{
    a[0] = pack_bf16x2(left[0], left[1]);
    a[1] = pack_bf16x2(left[2], left[3]);
    a[2] = pack_bf16x2(right[0], right[1]);
    a[3] = pack_bf16x2(right[2], right[3]);
}

/* Shared-memory address, for this lane, of the A operand (rows row0 .. row0+15, k columns
 * k0 .. k0+15) of a row-major tile with `stride` elements a row: ldmatrix x4 from here gives
 * a[0..3] in mma order. */
static __device__ __forceinline__ const __nv_bfloat16 *
operand_a_address(const __nv_bfloat16 *tile, int stride, int row0, int k0, int lane)
{
    return tile + (row0 + (lane & 15)) * stride + k0 + (lane >> 4) * 8;
}

/* Address of the B operands of two column tiles (n0 .. n0+7 and n0+8 .. n0+15) over k0 ..
 * k0+15, from a tile stored with n as its row (B = tile^T: K of S = Q K^T): ldmatrix x4
 * gives b0, b1 of tile n0 then b0, b1 of tile n0+8. */
static __device__ __forceinline__ const __nv_bfloat16 *
operand_b_address(const __nv_bfloat16 *tile, int stride, int n0, int k0, int lane)
{
    return tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * stride + k0 + ((lane >> 3) & 1) * 8;
}

/* Address of the B operands of two column tiles (n0 .. n0+15) over k0 .. k0+15, from a
 * tile stored with k as its row (B = tile: V of O = P V); use ldmatrix x4 .trans: it gives
 * b0, b1 of tile n0 then b0, b1 of tile n0+8. */
static __device__ __forceinline__ const __nv_bfloat16 *
operand_b_transposed_address(const __nv_bfloat16 *tile, int stride, int n0, int k0, int lane)
{
    return tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * stride + n0 + (lane >> 4) * 8;
}

/* Copies rows [row0, row0 + ROWS) of a [rows_total, *] global array (row r at
 * global + r * row_stride, HEAD_DIM contiguous bf16) into a shared tile; rows at or past
 * rows_total become zeros. One cp.async of 16 bytes per piece, spread over THREADS. */
template <int ROWS, int HEAD_DIM, int THREADS>
static __device__ __forceinline__ void tile_load_async(__nv_bfloat16 *tile,
                                                       const __nv_bfloat16 *global,
                                                       size_t row_stride, int row0,
                                                       int rows_total)
{
    constexpr int pieces_per_row = HEAD_DIM / 8;
    constexpr int stride = HEAD_DIM + TILE_PAD;
    for (int piece = threadIdx.x; piece < ROWS * pieces_per_row; piece += THREADS) {
        int row = piece / pieces_per_row, column = (piece % pieces_per_row) * 8;
        bool valid = row0 + row < rows_total;
        const __nv_bfloat16 *source = valid ? global + (size_t)(row0 + row) * row_stride + column
                                            : global;
        copy_async_16(tile + row * stride + column, source, valid);
    }
}

/* Copies `count` fp32 values global[first ..] into shared (zeros past `total`). */
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
static __device__ __forceinline__ void warp_stage_accumulators(float *stage,
                                                               const float tiles[][4],
                                                               float factor, int lane)
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

/* Every tile moves in 16-byte pieces. */
static inline void attention_check_aligned(const char *op, const char *name, const void *pointer)
{
    if ((uintptr_t)pointer % 16 != 0)
        fatal(EXIT_CONFIG, "%s: %s is not 16-byte aligned", op, name);
}

#endif
