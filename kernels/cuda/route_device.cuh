/* kernels/cuda/route_device.cuh — the row layout and warp sums shared by the routing and
 * stream kernels (route_cuda.cu, route_backward_cuda.cu, stream_cuda.cu). CUDA C++ only.
 *
 * Row layout. A block works on rows of d bf16 channels cut into `vectors` = d / VEC vectors
 * of VEC consecutive channels (VEC = 8 is one 16-byte load). Thread `tid` of a block of
 * `threads` (a multiple of 32) owns `slots` vectors, in one of two placements:
 *   strided      v = slot * threads + tid                (slot_place; backward, MSAR)
 *   warp rows    v = (warp * slots + slot) * 32 + lane   (slot_place_at; the forward: a
 *                warp's vectors are consecutive, so a large head is whole warps)
 * Either way a warp's loads of one slot are 32 consecutive vectors starting at a multiple of
 * 32 (coalesced) and a thread holds at most ROW_THREAD_CHANNELS channels
 * (VEC * ROW_MAX_SLOTS(VEC)). Vectors past the row are idle.
 *
 * Heads. head_dim % VEC == 0, so a vector lies in one head: head(v) = v / head_vectors.
 * A per-head sum is made in two fixed-order steps:
 *  1. warp_segment_sum: inside one warp's slot (32 consecutive vectors), the lanes of each
 *     head add up; the lane of the first vector of each (warp slot, head) segment holds the
 *     segment's sum and writes it to shared memory at its segment index;
 *  2. the segments of head h are consecutive in that index, from segment_index(h * hv) to
 *     segment_index((h + 1) * hv - 1); whoever needs head h's sum adds them in that order.
 * Segment starts are the vectors that are multiples of 32 or of hv, so
 *     segment_index(v) = v/32 + v/hv - v/lcm(32, hv)   (count of starts in [0, v], minus 1)
 * and a row has segment_index(vectors - 1) + 1 <= vectors/32 + heads + 1 segments.
 * Every thread that reads a sum reads the same values in the same order, so they all get
 * the same bits (threads compute per-head statistics redundantly instead of waiting on one).
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_DEVICE_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_DEVICE_CUH

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/route_cuda.h"
#include "runtime/error.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

enum {
    ROW_STAGES = 4,           /* rows in a ring: ROW_STAGES - 1 in flight while one is used */
    ROW_THREAD_CHANNELS = 16, /* channels a thread owns at most */
    ROW_MAX_THREADS = 512,
    ROW_MAX_WARPS = ROW_MAX_THREADS / 32,
};

#define ROW_MAX_SLOTS(VEC) (ROW_THREAD_CHANNELS / (VEC))

/* ---- bf16 vectors ---- */

/* VEC bf16 values as one memory access (16, 8, 4 or 2 bytes) or as their bits. */
template <int VEC> union BfVector;
template <> union BfVector<8> { uint4 raw; unsigned short bits[8]; };
template <> union BfVector<4> { uint2 raw; unsigned short bits[4]; };
template <> union BfVector<2> { unsigned int raw; unsigned short bits[2]; };
template <> union BfVector<1> { unsigned short raw; unsigned short bits[1]; };

template <int VEC>
__device__ __forceinline__ BfVector<VEC> vector_zero()
{
    BfVector<VEC> x;
    x.raw = {};
    return x;
}

/* vector `v` of a bf16 array, through the read-only cache (for data this kernel never writes) */
template <int VEC>
__device__ __forceinline__ BfVector<VEC> vector_load(const bf16 *array, long long v)
{
    BfVector<VEC> x;
    x.raw = __ldg(reinterpret_cast<const decltype(x.raw) *>(array) + v);
    return x;
}

/* vector `v` of a bf16 array this kernel also writes (a "+=" target) */
template <int VEC>
__device__ __forceinline__ BfVector<VEC> vector_load_mutable(const bf16 *array, long long v)
{
    BfVector<VEC> x;
    x.raw = reinterpret_cast<const decltype(x.raw) *>(array)[v];
    return x;
}

template <int VEC>
__device__ __forceinline__ void vector_store(bf16 *array, long long v, BfVector<VEC> x)
{
    reinterpret_cast<decltype(x.raw) *>(array)[v] = x.raw;
}

__device__ __forceinline__ float bf16_bits_to_float(unsigned short bits)
{
    return __uint_as_float((unsigned int)bits << 16);
}

__device__ __forceinline__ unsigned short float_to_bf16_bits(float value)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

template <int VEC>
__device__ __forceinline__ void vector_to_floats(BfVector<VEC> x, float *out)
{
#pragma unroll
    for (int i = 0; i < VEC; i++)
        out[i] = bf16_bits_to_float(x.bits[i]);
}

/* VEC floats, each rounded once. The words are packed here, not through the union's bits: at
 * VEC 4 that trip went through local memory (ptxas: an 8-byte stack frame). */
template <int VEC>
__device__ __forceinline__ BfVector<VEC> vector_from_floats(const float *in)
{
    BfVector<VEC> x;
    if constexpr (VEC == 1) {
        x.raw = float_to_bf16_bits(in[0]);
    } else {
        unsigned int words[VEC / 2];
#pragma unroll
        for (int i = 0; i < VEC / 2; i++)
            words[i] = (unsigned int)float_to_bf16_bits(in[2 * i]) |
                       ((unsigned int)float_to_bf16_bits(in[2 * i + 1]) << 16);
        if constexpr (VEC == 2)
            x.raw = words[0];
        else if constexpr (VEC == 4)
            x.raw = make_uint2(words[0], words[1]);
        else
            x.raw = make_uint4(words[0], words[1], words[2], words[3]);
    }
    return x;
}

/* ---- rows in flight: a per-thread ring of rows in shared memory ---- */

/* A ring holds ROW_STAGES rows (or groups of rows) per block; entry (stage, slot, thread)
 * holds the thread's vector of that slot. Copies go through cp.async (no registers held,
 * several rows in flight across barriers and reductions); every thread reads back only the
 * vectors it copied itself, so cp.async.wait_group alone orders them: no barrier guards the
 * ring. A stage is refilled only after its reader (the same thread) has used the values.
 * VEC = 1 (2 bytes, below cp.async's 4) copies synchronously through a register. */
__device__ __forceinline__ void copy_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* waits until at most PENDING committed groups of this thread are still in flight */
template <int PENDING>
__device__ __forceinline__ void copy_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

template <int VEC>
__device__ __forceinline__ void copy_vector_async(BfVector<VEC> *shared_destination,
                                                  const bf16 *array, long long v)
{
    const void *source = reinterpret_cast<const BfVector<VEC> *>(array) + v;
    const unsigned destination = (unsigned)__cvta_generic_to_shared(shared_destination);
    if constexpr (VEC == 8)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(destination),
                     "l"(source) : "memory");
    else if constexpr (VEC == 4)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(destination),
                     "l"(source) : "memory");
    else if constexpr (VEC == 2)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(destination),
                     "l"(source) : "memory");
    else
        *shared_destination = *reinterpret_cast<const BfVector<VEC> *>(source);
}

/* ---- warp sums (fixed shuffle order: deterministic) ---- */

/* every lane gets the sum over the warp */
__device__ __forceinline__ float warp_sum(float value)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

/* One halving step of warp_transpose_sum: a lane keeps the lower or upper half of its L
 * values (upper when its OFFSET bit is set; the upper half is one shorter when L is odd) and
 * adds its partner's copy of the same half. Afterwards values [0, ceil(L/2)) are live. */
template <int L, int OFFSET>
__device__ __forceinline__ void warp_transpose_step(float *x, int lane)
{
    constexpr int HALF = (L + 1) / 2;
    const bool upper = (lane & OFFSET) != 0;
#pragma unroll
    for (int j = 0; j < HALF; j++) {
        const float low = x[j], high = j + HALF < L ? x[j + HALF] : 0.0f;
        const float keep = upper ? high : low, send = upper ? low : high;
        x[j] = keep + __shfl_xor_sync(0xffffffffu, send, OFFSET);
    }
}

/* Sums V values (V <= 32) over the warp at once, a reduce-scatter: on return this lane holds
 * the warp's sum of value *index, or *index = -1 (it holds padding). Five halving steps
 * (offsets 16, 8, 4, 2, 1) take ceil(V/2) + ceil(V/4) + ... shuffles where V warp_sums take
 * 5 V. Each sum is the same butterfly tree whatever its index (a + b == b + a), so equal
 * inputs give equal sums, and the order is fixed: deterministic. All lanes call it. */
template <int V>
__device__ __forceinline__ float warp_transpose_sum(float (&x)[V], int lane, int *index)
{
    static_assert(V >= 1 && V <= 32, "warp_transpose_sum takes 1 to 32 values");
    constexpr int L1 = (V + 1) / 2, L2 = (L1 + 1) / 2, L3 = (L2 + 1) / 2, L4 = (L3 + 1) / 2;
    warp_transpose_step<V, 16>(x, lane);
    warp_transpose_step<L1, 8>(x, lane);
    warp_transpose_step<L2, 4>(x, lane);
    warp_transpose_step<L3, 2>(x, lane);
    warp_transpose_step<L4, 1>(x, lane);
    /* walk back from position 0 after the last step: an upper lane of the step from L to
     * L' values held positions L' .. L - 1; a position past L was padding */
    const int lengths[6] = {V, L1, L2, L3, L4, 1};
    int position = 0;
    bool valid = true;
#pragma unroll
    for (int step = 4; step >= 0; step--) {
        if (lane & (16 >> step))
            position += lengths[step + 1];
        valid = valid && position < lengths[step];
    }
    *index = valid ? position : -1;
    return x[0];
}

/* Sums `value` over the lanes of this lane's segment (consecutive lanes whose vectors share a
 * head). `reach` = vectors from this lane's to the end of its head (hv - v % hv). Afterwards
 * a lane holds the sum over itself and the following lanes of its segment; the first lane of
 * a segment holds the segment's sum. After the step of offset k a lane holds the sum over
 * [lane, lane + 2k) inside its segment: the partner's partial is added only when the partner
 * is in the same segment, and when it is not, no later lane is either. All lanes call it. */
__device__ __forceinline__ float warp_segment_sum(float value, int lane, int reach)
{
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        float other = __shfl_down_sync(0xffffffffu, value, offset);
        if (offset < reach && lane + offset < 32)
            value += other;
    }
    return value;
}

/* ---- per-slot geometry ---- */

__host__ __device__ __forceinline__ int greatest_common_divisor(int a, int b)
{
    while (b) {
        int r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* index of the segment that starts at or before vector v (see the header comment) */
__device__ __forceinline__ int segment_index(int v, int head_vectors, int segment_period)
{
    return v / 32 + v / head_vectors - v / segment_period;
}

/* Where one vector slot of a thread sits in the row and in its head. */
struct SlotPlace {
    int vector;        /* v, the index of the vector in the row */
    int valid;         /* v < vectors */
    int head;          /* v / hv */
    int reach;         /* hv - v % hv, for warp_segment_sum */
    int segment;       /* this lane's segment index, when it starts a segment */
    int starts_segment;/* valid and (first lane of the warp or first vector of its head) */
    int first_segment; /* head's segments: first_segment .. last_segment */
    int last_segment;
    int head_start;    /* v is the head's first vector: this lane speaks for the head */
};

/* The place of this thread's vector `vector`; the vectors of one slot of a warp must be 32
 * consecutive ones starting at a multiple of 32, lane i holding the i-th. */
__device__ __forceinline__ SlotPlace slot_place_at(int vector, int vectors, int head_vectors,
                                                   int segment_period)
{
    SlotPlace place;
    int lane = threadIdx.x & 31;
    place.vector = vector;
    place.valid = place.vector < vectors;
    place.head = place.vector / head_vectors;
    int offset_in_head = place.vector % head_vectors;
    place.reach = head_vectors - offset_in_head;
    place.segment = segment_index(place.vector, head_vectors, segment_period);
    place.starts_segment = place.valid && (lane == 0 || offset_in_head == 0);
    place.head_start = place.valid && offset_in_head == 0;
    place.first_segment = segment_index(place.head * head_vectors, head_vectors, segment_period);
    place.last_segment =
        segment_index((place.head + 1) * head_vectors - 1, head_vectors, segment_period);
    return place;
}

/* the strided placement: v = slot * threads + tid */
__device__ __forceinline__ SlotPlace slot_place(int slot, int threads, int vectors,
                                                int head_vectors, int segment_period)
{
    return slot_place_at(slot * threads + (int)threadIdx.x, vectors, head_vectors,
                         segment_period);
}

/* Starts copying this thread's vectors of row `row_start` (a vector offset) of `array` into
 * `entry` (one ring stage: [slots][threads]); idle vectors get zeros. Does not commit. */
template <int VEC>
__device__ __forceinline__ void ring_copy_row(BfVector<VEC> *entry, const bf16 *array,
                                              long long row_start, const SlotPlace *place,
                                              int slots)
{
#pragma unroll
    for (int slot = 0; slot < ROW_MAX_SLOTS(VEC); slot++) {
        if (slot >= slots)
            continue;
        BfVector<VEC> *destination = entry + slot * blockDim.x + threadIdx.x;
        if (place[slot].valid)
            copy_vector_async<VEC>(destination, array, row_start + place[slot].vector);
        else
            *destination = vector_zero<VEC>();
    }
}

/* this thread's vector of `slot` in a ring stage */
template <int VEC>
__device__ __forceinline__ BfVector<VEC> ring_read(const BfVector<VEC> *entry, int slot)
{
    return entry[slot * blockDim.x + threadIdx.x];
}

/* ---- host side ---- */

/* How a launch cuts its rows: VEC, threads, slots, and the segment bookkeeping. */
struct RowShape {
    int vec;
    int threads;
    int slots;
    int vectors;
    int head_vectors;
    int segment_period; /* lcm(32, head_vectors) */
    int segments;
};

/* bytes rounded up to a multiple of 16: where a piece of a shared-memory layout may start */
static inline size_t round_up_16(size_t bytes)
{
    return (bytes + 15) / 16 * 16;
}

static inline bool pointer_aligned(const void *pointer, int bytes)
{
    return ((uintptr_t)pointer % (uintptr_t)bytes) == 0; /* NULL is aligned: never read */
}

/* every one of `count` pointers aligned to `bytes` (the 16-byte vectors of the warp and
 * block kernels) */
static inline bool pointers_aligned(const void *const *pointers, int count, int bytes)
{
    for (int i = 0; i < count; i++)
        if (!pointer_aligned(pointers[i], bytes))
            return false;
    return true;
}

/* The widest vector of widest, widest / 2, .., 1 bf16 elements that divides head_dim and at
 * which every pointer is aligned. */
static inline int widest_vector(int widest, int head_dim, const void *const *pointers,
                                int count)
{
    int vec = widest;
    while (vec > 1) {
        bool fits = head_dim % vec == 0;
        for (int i = 0; i < count && fits; i++)
            fits = pointer_aligned(pointers[i], 2 * vec);
        if (fits)
            break;
        vec /= 2;
    }
    return vec;
}

/* The widest VEC (8, 4, 2, 1) that divides head_dim and every pointer allows; `threads` a
 * multiple of 32 giving each thread about two slots (more when d needs it). */
static inline RowShape row_shape(int d, int heads, const void *const *pointers, int count)
{
    RowShape shape;
    int head_dim = d / heads;
    shape.vec = widest_vector(8, head_dim, pointers, count);
    shape.vectors = d / shape.vec;
    int threads = ((shape.vectors + 1) / 2 + 31) / 32 * 32;
    shape.threads = threads < 32 ? 32 : threads > ROW_MAX_THREADS ? ROW_MAX_THREADS : threads;
    shape.slots = (shape.vectors + shape.threads - 1) / shape.threads;
    shape.head_vectors = head_dim / shape.vec;
    shape.segment_period = 32 / greatest_common_divisor(32, shape.head_vectors) *
                           shape.head_vectors;
    int last = shape.vectors - 1;
    shape.segments = last / 32 + last / shape.head_vectors - last / shape.segment_period + 1;
    return shape;
}

/* The limits of route_cuda.h, as config errors that name the key. */
static inline void route_check_shape(int n_sources, int d, int heads)
{
    if (n_sources < 1 || n_sources > CUDA_ROUTE_MAX_SOURCES)
        fatal(EXIT_CONFIG, "a routing site reads %d sources; the cuda route kernels take 1 to %d "
              "(residual.layers_per_block sets how many)", n_sources, CUDA_ROUTE_MAX_SOURCES);
    if (d < 1 || d > CUDA_ROUTE_MAX_WIDTH)
        fatal(EXIT_CONFIG, "model.d_model = %d: the cuda route kernels take 1 to %d channels", d,
              CUDA_ROUTE_MAX_WIDTH);
    if (heads < 1 || heads > CUDA_ROUTE_MAX_HEADS || d % heads != 0)
        fatal(EXIT_CONFIG, "residual.heads = %d: the cuda route kernels take 1 to %d heads "
              "dividing model.d_model = %d", heads, CUDA_ROUTE_MAX_HEADS, d);
}

/* Lets `kernel` use `bytes` of dynamic shared memory (fatal when the device has less) and
 * returns how many blocks of `threads` fit on the device at once (at least 1). The answer is
 * remembered per (kernel, threads, bytes): the launchers ask on every call. */
template <typename Kernel>
static inline int resident_blocks(Kernel kernel, int threads, size_t bytes, const char *what)
{
    enum { CACHE_SIZE = 8 };
    static struct {
        const void *kernel;
        int threads;
        size_t bytes;
        int blocks;
    } cache[CACHE_SIZE];
    static int cache_next;
    for (int i = 0; i < CACHE_SIZE; i++)
        if (cache[i].kernel == (const void *)kernel && cache[i].threads == threads &&
            cache[i].bytes == bytes)
            return cache[i].blocks;

    int device, limit;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)limit)
        fatal(EXIT_CONFIG, "%s needs %zu bytes of shared memory a block, the device has %d "
              "(fewer sources, heads or a narrower model)", what, bytes, limit);
    /* Raise the kernel's limit to the device's opt-in maximum, not to `bytes`: the attribute
     * belongs to the kernel, so setting it per size would let a smaller launch lower it
     * under a larger one whose answer is already cached here. */
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        limit));
    int per_multiprocessor = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel,
                                                             threads, bytes));
    if (per_multiprocessor < 1)
        fatal(EXIT_CONFIG, "%s: no block of %d threads fits on the device", what, threads);
    int blocks = per_multiprocessor * cuda_multiprocessor_count();
    cache[cache_next].kernel = (const void *)kernel;
    cache[cache_next].threads = threads;
    cache[cache_next].bytes = bytes;
    cache[cache_next].blocks = blocks;
    cache_next = (cache_next + 1) % CACHE_SIZE;
    return blocks;
}

#endif
