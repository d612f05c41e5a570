/* kernels/cuda/hopper_async.cuh — Hopper's asynchronous machinery as small device functions
 * (PTX ISA 8.0, sm_90 / sm_90a); CUDA C++ only, never included from C.
 *
 * What is here and the ordering each one needs:
 * - cp.async (16 or 4 bytes a thread) into shared memory, completed by commit / wait groups.
 * - Named barriers (bar.sync / bar.arrive with a thread count): ids 1..15, id 0 is
 *   __syncthreads. A barrier whose producers only arrive and whose consumers sync lets one
 *   warp role hand a buffer to another without either waiting for the whole block.
 * - Bulk copies shared -> global (cp.async.bulk, and cp.reduce.async.bulk .add.f32 which adds
 *   fp32 elements in L2), completed by bulk groups: wait_group.read frees the shared source,
 *   wait_group (no .read) means the writes are performed.
 * - Proxy fences: shared memory written by ordinary stores and then read by the tensor cores
 *   or a bulk copy (the async proxy) needs fence.proxy.async.shared::cta in every writing
 *   thread before the barrier that hands it over; global memory written by a bulk operation
 *   and then published through an ordinary release needs fence.proxy.async.global.
 * - gpu-scope acquire loads and release adds (the ordered semaphores of the backward).
 * - mbarriers (transaction-counted barriers in shared memory) and TMA tensor copies that
 *   complete on them; tensor maps are passed by value as __grid_constant__ parameters.
 * - setmaxnreg: a warpgroup gives registers back to, or takes them from, the block's pool.
 *   It takes effect only in a kernel with a register cap at entry (__launch_bounds__ with a
 *   minimum of 1 block) and must be executed by all four warps of a warpgroup.
 * Instructions that exist on sm_90a only (setmaxnreg here, wgmma in warpgroup_mma.cuh) trap in
 * the compute_90 PTX the build also embeds; the host refuses other GPUs before any launch.
 */
#ifndef FATHOM_KERNELS_CUDA_HOPPER_ASYNC_CUH
#define FATHOM_KERNELS_CUDA_HOPPER_ASYNC_CUH

#include <cuda.h> /* CUtensorMap: a 128-byte value type, no driver library needed */
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WARPGROUP_MMA_MISSING 1
#endif

static __device__ __forceinline__ uint32_t shared_address(const void *pointer)
{
    return (uint32_t)__cvta_generic_to_shared(pointer);
}

/* ---- cp.async ---- */

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

/* One arrival on `barrier` once this thread's earlier cp.async copies have landed (counted in
 * the barrier's expected arrivals: .noinc). */
static __device__ __forceinline__ void copy_async_mbarrier_arrive(uint64_t *barrier)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                     shared_address(barrier))
                 : "memory");
}

/* Makes this thread's completed shared-memory writes visible to the tensor cores and bulk
 * copies (async proxy); a barrier after it publishes them to the other threads. */
static __device__ __forceinline__ void fence_async_proxy(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Orders this thread's global accesses through the generic proxy with its bulk operations. */
static __device__ __forceinline__ void fence_async_proxy_global(void)
{
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

/* ---- named barriers (threads: a multiple of 32, whole warps) ---- */

static __device__ __forceinline__ void named_barrier_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

static __device__ __forceinline__ void named_barrier_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- bulk copies shared -> global (sizes and addresses multiples of 16 bytes) ---- */

static __device__ __forceinline__ void bulk_copy_to_global(void *global, const void *shared,
                                                           uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(global),
                 "r"(shared_address(shared)), "r"(bytes)
                 : "memory");
}

/* global[i] += shared[i] for the fp32 elements, each addition made in L2. */
static __device__ __forceinline__ void bulk_add_to_global(float *global, const float *shared,
                                                          uint32_t bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(global), "r"(shared_address(shared)), "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void bulk_commit(void)
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Waits until at most `pending` bulk groups still read their shared source. */
template <int pending>
static __device__ __forceinline__ void bulk_wait_read(void)
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(pending) : "memory");
}

/* Waits until at most `pending` bulk groups are incomplete (their writes not performed). */
template <int pending>
static __device__ __forceinline__ void bulk_wait(void)
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(pending) : "memory");
}

/* ---- gpu-scope semaphores ---- */

static __device__ __forceinline__ uint32_t load_acquire_gpu(const uint32_t *address)
{
    uint32_t value;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
    return value;
}

static __device__ __forceinline__ void add_release_gpu(uint32_t *address, uint32_t value)
{
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(address), "r"(value)
                 : "memory");
}

/* ---- register budget of a warpgroup (sm_90a) ---- */

template <int registers>
static __device__ __forceinline__ void warpgroup_registers_release(void)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(registers));
#endif
}

template <int registers>
static __device__ __forceinline__ void warpgroup_registers_claim(void)
{
#ifdef WARPGROUP_MMA_MISSING
    __trap();
#else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(registers));
#endif
}

/* ---- mbarriers (a uint64_t in shared memory) ---- */

static __device__ __forceinline__ void mbarrier_init(uint64_t *barrier, int arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)),
                 "r"(arrivals)
                 : "memory");
}

/* Makes the initialised mbarriers visible to the async proxy (TMA); a __syncthreads after it
 * publishes them to the block. */
static __device__ __forceinline__ void mbarrier_init_fence(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival that also expects `bytes` of transactions (the TMA copies that complete on it). */
static __device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t *barrier,
                                                                   uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     shared_address(barrier)),
                 "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void mbarrier_arrive(uint64_t *barrier)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier))
                 : "memory");
}

/* True once the phase of parity `parity` has completed (phases alternate 0, 1, 0, ...). */
static __device__ __forceinline__ bool mbarrier_try_wait(uint64_t *barrier, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n.reg .pred done;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, done;\n}\n"
                 : "=r"(done)
                 : "r"(shared_address(barrier)), "r"(parity)
                 : "memory");
    return done != 0;
}

/* Waits that outlast these are hangs (a whole kernel here takes milliseconds): the kernel
 * traps, so the launch fails with an error instead of never returning. An mbarrier poll
 * suspends the thread for up to a hardware time limit, so polls are counted (2^26: seconds
 * to a minute); a global poll is timed (2^33 cycles: about 4 s at 2 GHz). */
#define HOPPER_WAIT_POLLS (1u << 26)
#define HOPPER_WAIT_CYCLES (1ll << 33)

/* Waits for the phase of parity `parity` to complete (the poll loop inside one asm: a C++ loop
 * around mbarrier_try_wait costs the consumers of attention_forward_specialised_cuda.cu
 * registers at head_dim 128). */
static __device__ __forceinline__ void mbarrier_wait(uint64_t *barrier, uint32_t parity)
{
    asm volatile("{\n.reg .pred done;\n.reg .u32 polls;\n"
                 "mov.u32 polls, 0;\n"
                 "wait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@done bra end_%=;\n"
                 "add.u32 polls, polls, 1;\n"
                 "setp.ne.u32 done, polls, %2;\n"
                 "@done bra wait_%=;\n"
                 "trap;\n"
                 "end_%=:\n}\n" ::"r"(shared_address(barrier)),
                 "r"(parity), "n"(HOPPER_WAIT_POLLS)
                 : "memory");
}

/* Spins until *address (gpu scope, acquire) equals `value`, trapping after
 * HOPPER_WAIT_CYCLES. */
static __device__ __forceinline__ void wait_acquire_gpu(const uint32_t *address, uint32_t value)
{
    if (load_acquire_gpu(address) == value)
        return;
    long long start = clock64();
    while (load_acquire_gpu(address) != value)
        if (clock64() - start > HOPPER_WAIT_CYCLES)
            __trap();
}

/* ---- TMA: tensor tiles global -> shared, completing on an mbarrier ---- */

static __device__ __forceinline__ void tensor_map_prefetch(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

/* The box of `map` at element coordinates (c0 innermost, c1, c2) into `shared`; elements
 * outside the tensor arrive as zeros. Completes `bytes` (the box size) on `barrier`. */
static __device__ __forceinline__ void tensor_load_3d(void *shared, const CUtensorMap *map,
                                                      int c0, int c1, int c2, uint64_t *barrier)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(shared_address(shared)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2),
                 "r"(shared_address(barrier))
                 : "memory");
}

static __device__ __forceinline__ void tensor_load_4d(void *shared, const CUtensorMap *map,
                                                      int c0, int c1, int c2, int c3,
                                                      uint64_t *barrier)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(shared_address(shared)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "r"(shared_address(barrier))
                 : "memory");
}

#endif
