/* kernels/cuda/route_block_mma.cuh — the tensor-core pieces of the block route kernels
 * (route_block_forward_cuda.cu, route_block_dots_cuda.cu; chosen by FATHOM_ROUTE_BLOCK=mma,
 * route_block_device.cuh). CUDA C++ only.
 *
 * One warp owns 32 consecutive 16-byte vectors of a row: 256 channels, inside one head
 * (the layouts where head_dim is a multiple of 256), or in the split layout
 * (route_block_device.cuh) 16, 20 or 24 vectors of one head, its other lanes idle in the
 * loads. Its dots against every source are one mma.m16n8k16 product over its K_STEPS
 * k-steps of 16 channels (16 for 32 vectors): A = the sources (M 16: N padded with a zero
 * row), B = 8 sites. Its mix is, per 8-channel tile, A = the softmax weights (M 16: G
 * padded), K = the sources, B = the rows' tile. The staged rows keep 32 slots a warp in
 * either layout (below), so a warp's k-step s reads its slots 2 s and 2 s + 1. Fragments as
 * the PTX ISA gives them for m16n8k16 (g = lane / 4, c = lane % 4):
 *   A: a0 (row g, cols 2c, 2c+1), a1 (row g+8), a2 (row g, cols +8), a3 (row g+8, cols +8)
 *   B: b0 (rows k = 2c, 2c+1, col g), b1 (rows k + 8)
 *   D: d0, d1 (row g, cols 2c, 2c+1), d2, d3 (row g+8)
 * fp32 operands (q*g, the weights) go in as two bf16 halves, hi + lo, which carry them to
 * about 2^-17: the products of bf16 values are exact and the tensor core adds in fp32, so
 * the dots and mixes differ from fp32 multiply-adds in the last bits of fp32 only.
 *
 * Staged rows are swizzled: vector v of row r sits in slot r * threads + (v ^ (r & 7)), so
 * that the 8 rows one ldmatrix reads at one vector fall on 8 different 16-byte bank groups
 * (unswizzled, rows 8 KB apart share their banks: 8-way conflicts). The swizzle stays inside
 * an aligned group of 8 vectors, so a warp's slots are its own.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_BLOCK_MMA_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_BLOCK_MMA_CUH

#include "kernels/cuda/route_block_device.cuh"

#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

/* The staged slot of vector v of row r (see the top of this file). */
__device__ __forceinline__ int block_mma_slot(int r, int v, int threads)
{
    return r * threads + (v ^ (r & 7));
}

/* The vector of the row that this thread owns in a tensor-core layout of K_STEPS k-steps a
 * warp, or -1 for a lane past its warp's 2 K_STEPS vectors (the split layout's idle lanes).
 * Known from K_STEPS alone: both layouts cover the row with whole warps (at 16, threads =
 * vectors and every lane owns one). */
template <int K_STEPS>
__device__ __forceinline__ int block_mma_thread_vector(void)
{
    const int lane = threadIdx.x & 31;
    if constexpr (K_STEPS == 16)
        return (int)threadIdx.x;
    return lane < 2 * K_STEPS ? (int)(threadIdx.x >> 5) * 2 * K_STEPS + lane : -1;
}

/* Starts the copies of this thread's vector (block_mma_thread_vector) of token t of each of
 * `count` rows into the thread's swizzled slots of `to` and commits (an empty group past the
 * tokens or for a lane without a vector). UNROLL (a bound on count) unrolls the loop, so
 * that each row's address is read from the kernel's parameters where it is used: in the
 * forward, a loop to `count` indexed them at run time and ptxas kept them in local memory,
 * whose reloads waited behind the copies (15% of its stalls, 2026-12-02). UNROLL 1 keeps the
 * loop, where unrolling costs more registers than it saves. */
template <int UNROLL, int K_STEPS>
__device__ __forceinline__ void block_mma_fetch_rows(BfVector<8> *to, const bf16 *const *rows,
                                                     int count, long long t, int tokens,
                                                     int vectors)
{
    const int vector = block_mma_thread_vector<K_STEPS>();
    if (t >= tokens || (K_STEPS != 16 && vector < 0)) {
        copy_async_commit();
        return;
    }
    if constexpr (UNROLL > 1) {
#pragma unroll
        for (int r = 0; r < UNROLL; r++)
            if (r < count)
                copy_vector_async<8>(to + block_mma_slot(r, threadIdx.x, blockDim.x), rows[r],
                                     t * vectors + vector);
    } else {
        for (int r = 0; r < count; r++)
            copy_vector_async<8>(to + block_mma_slot(r, threadIdx.x, blockDim.x), rows[r],
                                 t * vectors + vector);
    }
    copy_async_commit();
}

__device__ __forceinline__ uint32_t block_mma_pack(float low, float high)
{
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    uint32_t bits;
    memcpy(&bits, &pair, sizeof bits);
    return bits;
}

/* The mix's output of one step as whole sectors: lane c of each quad (c = lane % 4, the
 * quad a site's row) holds `first` (channels 2c, 2c + 1 of tile j) and `second` (8 + 2c,
 * 9 + 2c, tile j + 1); after the quad's exchange lane c holds channels 4c .. 4c + 3 and the
 * quad stores the row's 32 bytes in one instruction, where two stores of 16 bytes a row
 * sent the L2 half a sector each. Every lane takes part in the shuffles; `write` says
 * whether this lane's row is stored. `row`: channel 0 of tile j in the site's row.
 * Two shuffles, each lane offering the value its puller wants: lane c needs channels
 * 4c, 4c + 1 and 4c + 2, 4c + 3, which lanes 2c % 4 and 2c % 4 + 1 hold (in `first` for
 * c < 2, `second` after). Pulling from lane f = 2 (c % 2) + c / 2 and then f ^ 1, an
 * odd lane offers `second` first and `first` second, an even lane the other way round:
 * every pull meets what its puller needs. (Four shuffles, a value each, were 12% of the
 * pair forward's stall samples, ncu 2026-12-06.) */
__device__ __forceinline__ void block_mma_store_quad(uint32_t *row, uint32_t first,
                                                     uint32_t second, bool write, int lane)
{
    const int c = lane & 3, from = (lane & ~3) + (((c & 1) << 1) | (c >> 1));
    const bool odd = c & 1;
    const uint32_t pulled = __shfl_sync(0xffffffffu, odd ? second : first, from);
    const uint32_t pulled_next = __shfl_sync(0xffffffffu, odd ? first : second, from ^ 1);
    const uint32_t low = c < 2 ? pulled : pulled_next, high = c < 2 ? pulled_next : pulled;
    if (write)
        asm volatile("st.global.v2.b32 [%0], {%1, %2};\n"
                     :
                     : "l"(row + 2 * c), "r"(low), "r"(high));
}

/* low + high as two bf16 pairs: hi the rounded values, lo the rounded remainders. */
__device__ __forceinline__ void block_mma_split(float low, float high, uint32_t *hi,
                                                uint32_t *lo)
{
    const __nv_bfloat162 rounded = __floats2bfloat162_rn(low, high);
    const float2 back = __bfloat1622float2(rounded);
    memcpy(hi, &rounded, sizeof *hi);
    *lo = block_mma_pack(low - back.x, high - back.y);
}

__device__ __forceinline__ void block_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* An x4 ldmatrix whose lane's row lies at `address`, a shared-memory address (the _at forms:
 * for kernels that keep their row addresses as 32-bit shared offsets). */
__device__ __forceinline__ void block_ldmatrix_x4_at(uint32_t (&r)[4], unsigned address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

__device__ __forceinline__ void block_ldmatrix_x4_trans_at(uint32_t (&r)[4], unsigned address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

__device__ __forceinline__ void block_ldmatrix_x4(uint32_t (&r)[4], const void *row)
{
    block_ldmatrix_x4_at(r, (unsigned)__cvta_generic_to_shared(row));
}

__device__ __forceinline__ void block_ldmatrix_x4_trans(uint32_t (&r)[4], const void *row)
{
    block_ldmatrix_x4_trans_at(r, (unsigned)__cvta_generic_to_shared(row));
}

/* One step of a mix: tiles j (b[0], b[1]) and j + 1 (b[2], b[3]) of B against A in its hi
 * and lo halves: four independent products, so that a step waits for one mma, not two in a
 * row, the halves added after in fp32. tiles[0] is tile j's D fragment, tiles[1] tile j + 1's. */
__device__ __forceinline__ void block_mma_mix_step(float (&tiles)[2][4], const uint32_t (&high)[4],
                                                   const uint32_t (&low)[4],
                                                   const uint32_t (&b)[4])
{
    float high_j[4] = {0, 0, 0, 0}, low_j[4] = {0, 0, 0, 0};
    float high_next[4] = {0, 0, 0, 0}, low_next[4] = {0, 0, 0, 0};
    block_mma(high_j, high, b[0], b[1]);
    block_mma(low_j, low, b[0], b[1]);
    block_mma(high_next, high, b[2], b[3]);
    block_mma(low_next, low, b[2], b[3]);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        tiles[0][e] = high_j[e] + low_j[e];
        tiles[1][e] = high_next[e] + low_next[e];
    }
}

/* The row address lane `lane` gives an x4 ldmatrix whose four 8 x 8 matrices are rows
 * 0-7 and 8-15 (matrices 0 and 1 of each pair) at vectors `vector` and `vector + 1`
 * (matrices 0, 1 and 2, 3): for the dots' A (k-step at 2 s) and the mix's B (tiles j,
 * j + 1). Rows at or past `count` read the zero vector. */
__device__ __forceinline__ const BfVector<8> *block_mma_row_address(const BfVector<8> *rows,
                                                                    const BfVector<8> *zero,
                                                                    int count, int vector,
                                                                    int lane)
{
    const int matrix = lane >> 3, r = (lane & 7) + 8 * (matrix & 1);
    return r < count ? rows + block_mma_slot(r, vector + (matrix >> 1), blockDim.x) : zero;
}

/* array[i] of a parameter array (a site's or a source's pointers) for a lane's own i:
 * selected from the constant bank in registers, where an index that varies across the warp
 * made ptxas copy the array to local memory (a stack frame, and reloads waiting behind the
 * copies). */
template <typename T, int COUNT>
__device__ __forceinline__ T *block_site_pointer(T *const (&array)[COUNT], int i)
{
    T *chosen = array[0];
#pragma unroll
    for (int k = 1; k < COUNT; k++)
        chosen = i == k ? array[k] : chosen;
    return chosen;
}

/* B fragments of q*g for the warp's K_STEPS k-steps, site g = lane / 4 (zeros past G): per
 * k-step hi b0, hi b1, lo b0, lo b1. Made once a block: the same for every token. */
template <int K_STEPS>
__device__ __forceinline__ void
block_mma_key_weights(uint32_t (&fragments)[K_STEPS][4],
                      const bf16 *const (&queries)[CUDA_BLOCK_MAX_SITES],
                      const bf16 *const (&key_norms)[CUDA_BLOCK_MAX_SITES], int G)
{
    const int lane = threadIdx.x & 31, site = lane >> 2, column = 2 * (lane & 3);
    const int first = (threadIdx.x >> 5) * K_STEPS * 16; /* the warp's first channel */
    const bf16 *query = block_site_pointer(queries, site);
    const bf16 *key_norm = block_site_pointer(key_norms, site);
    /* channels 2c, 2c + 1 (and 8 on) side by side: one 32-bit load a pair, where 2-byte
     * loads (128 a thread) filled the load queue at every block's start (9% of the pair
     * forward's stall samples, ncu 2026-12-05) */
#pragma unroll
    for (int s = 0; s < K_STEPS; s++) {
        float w[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (site < G)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int channel = first + 16 * s + column + 8 * half;
                const unsigned q = *reinterpret_cast<const unsigned *>(query + channel);
                const unsigned k = *reinterpret_cast<const unsigned *>(key_norm + channel);
                w[2 * half] = bf16_bits_to_float(q & 0xffffu) * bf16_bits_to_float(k & 0xffffu);
                w[2 * half + 1] = bf16_bits_to_float(q >> 16) * bf16_bits_to_float(k >> 16);
            }
        block_mma_split(w[0], w[1], &fragments[s][0], &fragments[s][2]);
        block_mma_split(w[2], w[3], &fragments[s][1], &fragments[s][3]);
    }
}

/* A block's start: the zero row written, q*g's fragments made, and a barrier before any
 * warp reads the zero row. */
template <int K_STEPS>
__device__ __forceinline__ void
block_mma_begin(BfVector<8> *zero, uint32_t (&key_weights)[K_STEPS][4],
                const bf16 *const (&query)[CUDA_BLOCK_MAX_SITES],
                const bf16 *const (&key_norm)[CUDA_BLOCK_MAX_SITES], int G)
{
    if (threadIdx.x == 0)
        *zero = vector_zero<8>();
    block_mma_key_weights<K_STEPS>(key_weights, query, key_norm, G);
    __syncthreads();
}

#endif
