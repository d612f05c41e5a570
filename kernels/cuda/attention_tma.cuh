/* kernels/cuda/attention_tma.cuh — attention tiles as TMA writes them, shared by the kernels
 * that load through TMA (attention_forward_specialised_cuda.cu,
 * attention_backward_fused_cuda.cu); CUDA C++ only.
 *
 * A tile of `rows` x HEAD_DIM bf16 is stored as boxes of box_columns columns (64 at head_dim
 * 64 and 128: 128-byte rows, 128-byte swizzle; 16 at head_dim 80: 32-byte rows, 32-byte
 * swizzle), box after box, each box `rows` rows of row_bytes bytes; a tile starts on a
 * 1024-byte boundary, so every box and every 8-row group is where the swizzle pattern (taken
 * from address bits by both TMA and wgmma) expects it. The tensor maps describe a
 * [B, T, heads * HEAD_DIM] bf16 tensor as 3 dimensions (columns, T, B): rows past T or below 0
 * arrive as zeros.
 */
#ifndef FATHOM_KERNELS_CUDA_ATTENTION_TMA_CUH
#define FATHOM_KERNELS_CUDA_ATTENTION_TMA_CUH

#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/hopper_async.cuh"
#include "kernels/cuda/warpgroup_mma.cuh"

#include <cuda.h>
#include <cuda_runtime.h>

template <int HEAD_DIM>
struct TmaTile {
    static constexpr int box_columns = HEAD_DIM % 64 == 0 ? 64 : 16;
    static constexpr int row_bytes = box_columns * 2; /* the swizzle width */
    static constexpr int boxes = HEAD_DIM / box_columns;
    static constexpr SharedMatrixLayout layout =
        box_columns == 64 ? SHARED_MATRIX_SWIZZLE_128B : SHARED_MATRIX_SWIZZLE_32B;
    static_assert(HEAD_DIM % box_columns == 0, "whole boxes");
};

/* Operand "rows row0 .. of a TMA tile of tile_rows rows, columns k0 .. k0+15" read K-major
 * (row0 % 8 == 0, k0 % 16 == 0). */
template <int HEAD_DIM>
static __device__ __forceinline__ uint64_t swizzled_k_major(const unsigned char *tile,
                                                            int tile_rows, int row0, int k0)
{
    using Tile = TmaTile<HEAD_DIM>;
    const unsigned char *start = tile +
                                 (size_t)(k0 / Tile::box_columns) * tile_rows * Tile::row_bytes +
                                 (size_t)row0 * Tile::row_bytes + (k0 % Tile::box_columns) * 2;
    return shared_matrix_descriptor(start, 16, 8 * Tile::row_bytes, Tile::layout);
}

/* Operand "rows k0 .. k0+15 of a TMA tile of tile_rows rows, every column" read MN-major. */
template <int HEAD_DIM>
static __device__ __forceinline__ uint64_t swizzled_mn_major(const unsigned char *tile,
                                                             int tile_rows, int k0)
{
    using Tile = TmaTile<HEAD_DIM>;
    return shared_matrix_descriptor(tile + (size_t)k0 * Tile::row_bytes,
                                    tile_rows * Tile::row_bytes, 8 * Tile::row_bytes,
                                    Tile::layout);
}

/* Issues the TMA copies of one tile: ROWS rows from row0 of the head starting at column0 of
 * batch `batch`, completing ROWS * HEAD_DIM * 2 bytes on `barrier`. One thread. */
template <int HEAD_DIM, int ROWS>
static __device__ __forceinline__ void tma_tile_load(unsigned char *tile, const CUtensorMap *map,
                                                     int column0, int row0, int batch,
                                                     uint64_t *barrier)
{
    using Tile = TmaTile<HEAD_DIM>;
#pragma unroll
    for (int box = 0; box < Tile::boxes; box++)
        tensor_load_3d(tile + (size_t)box * ROWS * Tile::row_bytes, map,
                       column0 + box * Tile::box_columns, row0, batch, barrier);
}

/* ---- host ---- */

typedef CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                         const cuuint64_t *, const cuuint64_t *,
                                         const cuuint32_t *, const cuuint32_t *,
                                         CUtensorMapInterleave, CUtensorMapSwizzle,
                                         CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the driver, found through the runtime (no link to libcuda). */
static inline TensorMapEncodeTiled tensor_map_encoder(const char *op)
{
    static TensorMapEncodeTiled encode;
    if (!encode) {
        void *function = NULL;
        cudaDriverEntryPointQueryResult found;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                    cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || !function)
            fatal(EXIT_COMM, "%s: the driver has no cuTensorMapEncodeTiled", op);
        encode = (TensorMapEncodeTiled)function;
    }
    return encode;
}

/* A map of x [B, T, heads * HEAD_DIM] bf16 whose box is [1, rows, box_columns]. */
template <int HEAD_DIM>
static CUtensorMap tensor_map_rows(const char *op, const void *x, int B, int T, int heads,
                                   int rows)
{
    using Tile = TmaTile<HEAD_DIM>;
    CUtensorMap map;
    cuuint64_t dims[3] = {(cuuint64_t)heads * HEAD_DIM, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[2] = {(cuuint64_t)heads * HEAD_DIM * 2,
                             (cuuint64_t)T * heads * HEAD_DIM * 2};
    cuuint32_t box[3] = {(cuuint32_t)Tile::box_columns, (cuuint32_t)rows, 1};
    cuuint32_t element_strides[3] = {1, 1, 1};
    CUresult status = tensor_map_encoder(op)(
        &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(x), dims, strides, box,
        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        Tile::box_columns == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_32B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (status != CUDA_SUCCESS)
        fatal(EXIT_COMM, "%s: cuTensorMapEncodeTiled failed (%d)", op, (int)status);
    return map;
}

#endif
