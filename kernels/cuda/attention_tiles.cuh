/* kernels/cuda/attention_tiles.cuh — tile plumbing shared by the attention kernels
 * (attention_cuda.cu, attention_forward_specialised_cuda.cu, attention_backward_cuda.cu,
 * attention_backward_fused_cuda.cu) and their host-side shape checks; CUDA C++ only, never
 * included from C. sm_90a: the products are Hopper warpgroup MMAs (wgmma).
 *
 * The products and their register fragments are described in warpgroup_mma.cuh;
 * accumulators_to_operand packs accumulator tiles 2j, 2j+1 of one product into the A operand
 * (k = columns 16j .. 16j+15) of the next; online_softmax_block is the forwards' softmax step
 * between the two products.
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
#include "kernels/cuda/hopper_async.cuh"
#include "kernels/cuda/warpgroup_mma.cuh"
#include "runtime/error.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#define STAGE_PAD 8             /* fp32 elements after every fp32 staging row */
#define LOG2_E 1.4426950408889634f
#define LN_2 0.6931471805599453f

/* ---- operands in the packed layout ---- */

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

/* s = A B^T over the HEAD_DIM columns of two packed tiles: A = the 64 rows from `a`, B = the
 * 64 rows from `b` (both K-major; scores q k^T and their kin). */
template <int HEAD_DIM>
static __device__ __forceinline__ void warpgroup_rows_times_rows(float (&s)[8][4],
                                                                 const __nv_bfloat16 *a,
                                                                 const __nv_bfloat16 *b)
{
#pragma unroll
    for (int k0 = 0; k0 < HEAD_DIM; k0 += 16)
        warpgroup_mma_shared<64, 0, 0>(s, packed_k_major<HEAD_DIM>(a, k0),
                                       packed_k_major<HEAD_DIM>(b, k0), k0 > 0);
}

/* d += A B: A = 64 x 64 bf16 fragments (a[j]: k = 16j .. 16j+15, the rows of `b`), B = the 64
 * rows from the packed tile `b` read MN-major (N = HEAD_DIM; p v and its kin). */
template <int HEAD_DIM>
static __device__ __forceinline__ void warpgroup_fragments_times_tile(
    float (&d)[HEAD_DIM / 8][4], const uint32_t (&a)[4][4], const __nv_bfloat16 *b)
{
#pragma unroll
    for (int k0 = 0; k0 < 64; k0 += 16)
        warpgroup_mma_registers<HEAD_DIM, 1>(d, a[k0 / 16], packed_mn_major<HEAD_DIM>(b, k0),
                                             true);
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

/* Base-2 online softmax over one block of scores s [64 rows, KEYS keys] (a thread holds two
 * rows of it, r = 0, 1; the four lanes of a quad hold a row's columns): raises row_max
 * (scaled, base 2) to cover the block, returns in correction[r] the factor that brings what
 * was summed under the old max to the new one (exactly 1 when the max stayed), rescales
 * row_sum (this thread's part of the row sum) and adds the block's probabilities
 * p = 2^(s * scale_log2 - row_max), which replace s. Masked scores are -inf and give exact
 * zeros; every row has at least one finite score in its first block. */
template <int KEYS>
static __device__ __forceinline__ void online_softmax_block(float (&s)[KEYS / 8][4],
                                                            float (&row_max)[2],
                                                            float (&row_sum)[2],
                                                            float (&correction)[2],
                                                            float scale_log2)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float maximum = -INFINITY;
#pragma unroll
        for (int t = 0; t < KEYS / 8; t++)
            maximum = fmaxf(maximum, fmaxf(s[t][2 * r], s[t][2 * r + 1]));
        maximum = fmaxf(maximum, __shfl_xor_sync(0xffffffffu, maximum, 1));
        maximum = fmaxf(maximum, __shfl_xor_sync(0xffffffffu, maximum, 2));
        float new_max = fmaxf(row_max[r], maximum * scale_log2);
        correction[r] = new_max == row_max[r] ? 1.0f : exp2f(row_max[r] - new_max);
        row_max[r] = new_max;
        float sum = row_sum[r] * correction[r];
#pragma unroll
        for (int t = 0; t < KEYS / 8; t++) {
            s[t][2 * r] = exp2f(fmaf(s[t][2 * r], scale_log2, -new_max));
            s[t][2 * r + 1] = exp2f(fmaf(s[t][2 * r + 1], scale_log2, -new_max));
            sum += s[t][2 * r] + s[t][2 * r + 1];
        }
        row_sum[r] = sum;
    }
}

/* Copies rows [row0, row0 + ROWS) of a [rows_total, *] global array (row r at
 * global + r * row_stride, HEAD_DIM contiguous bf16) into a packed shared tile; rows at or
 * past rows_total become zeros. One cp.async of 16 bytes per piece, spread over THREADS
 * threads of which this is `thread`: eight neighbouring lanes fill one core matrix (eight rows
 * of one 16-byte column), so a warp writes 512 contiguous bytes and reads 64 contiguous bytes
 * from each of eight rows. */
template <int ROWS, int HEAD_DIM, int THREADS>
static __device__ __forceinline__ void packed_tile_load_async_by(__nv_bfloat16 *tile,
                                                                 const __nv_bfloat16 *global,
                                                                 size_t row_stride, int row0,
                                                                 int rows_total, unsigned thread)
{
    static_assert(ROWS % 8 == 0, "whole core matrices");
    constexpr int pieces_per_row = HEAD_DIM / 8;
    /* unsigned: the divisions by constants become shifts and multiplies */
    for (unsigned piece = thread; piece < ROWS * pieces_per_row; piece += THREADS) {
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

/* The same with every thread of the block taking part (THREADS = blockDim.x). */
template <int ROWS, int HEAD_DIM, int THREADS>
static __device__ __forceinline__ void packed_tile_load_async(__nv_bfloat16 *tile,
                                                              const __nv_bfloat16 *global,
                                                              size_t row_stride, int row0,
                                                              int rows_total)
{
    packed_tile_load_async_by<ROWS, HEAD_DIM, THREADS>(tile, global, row_stride, row0,
                                                       rows_total, threadIdx.x);
}

/* Copies COUNT fp32 values global[first ..] into shared (zeros past `total`), spread over
 * `threads` threads of which this is `thread`. */
template <int COUNT>
static __device__ __forceinline__ void vector_load_async_by(float *shared, const float *global,
                                                            int first, int total, int thread,
                                                            int threads)
{
    for (int i = thread; i < COUNT; i += threads) {
        bool valid = first + i < total;
        copy_async_4(shared + i, valid ? global + first + i : global, valid);
    }
}

/* The same with every thread of the block taking part. */
template <int COUNT>
static __device__ __forceinline__ void vector_load_async(float *shared, const float *global,
                                                         int first, int total)
{
    vector_load_async_by<COUNT>(shared, global, first, total, threadIdx.x, blockDim.x);
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
 * row stride row_stride) in 16-byte pieces: out = bf16(float(out) + stage) when
 * accumulating, rounded once, and otherwise bf16(0.0 + stage) without reading out (the bits
 * of the add into zeros, -0.0 included: runtime/backend.h). Rows at or past rows_total are
 * skipped. */
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
        float old[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (accumulate)
            unpack_bf16x8(old, *destination);
#pragma unroll
        for (int i = 0; i < 8; i++)
            value[i] += old[i];
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

/* ---- tiles in bands of pairs ----
 * A launch's tiles are (pair, item): a pair is a (batch, head group) whose tiles read the
 * same K, V (forward) or q, dout and dq (backward); an item is a query block (forward) or a
 * key block (backward). Tiles are numbered by bands of pairs_per_band pairs, item-major
 * inside a band: tiles of one pair run close together and share L2, and inside a band the
 * items keep their order (heaviest first; key blocks in the order the dq additions need).
 * The last band may hold fewer pairs. */
static __host__ __device__ __forceinline__ void band_tile(int tile, int pairs,
                                                          int pairs_per_band, int items,
                                                          int *pair, int *item)
{
    const int first_pair = tile / (pairs_per_band * items) * pairs_per_band;
    const int band_pairs = min(pairs_per_band, pairs - first_pair);
    const int in_band = tile - first_pair * items;
    *pair = first_pair + in_band % band_pairs;
    *item = in_band / band_pairs;
}

/* Pairs a band: enough for `rounds` rounds of `ctas` CTAs, at most every pair. */
static inline int band_pairs_for(int pairs, int items, long long ctas, int rounds)
{
    const long long wanted = (rounds * ctas + items - 1) / items;
    return (int)(wanted < 1 ? 1 : wanted < pairs ? wanted : pairs);
}

#endif
