/* kernels/cuda/backend_cuda.cu — the cuda op table (runtime/backend.h; DESIGN 1, 3).
 *
 * Every compute entry wraps one kernel of kernels_cuda.h, attention_cuda.h or route_cuda.h
 * with the same arguments in the same order: the table's Activation arrays are bf16 here, so
 * a wrapper casts them, adds the compute stream and, where a kernel needs scratch, the
 * workspace. The layers' entries are wrapped in backend_cuda_layers.cu and the
 * attention-over-depth and MSAR entries in backend_cuda_routing.cu, through the stream and
 * workspace this file hands out (backend_cuda_internal.h). The kernels check their own
 * limits (fatal, EXIT_CONFIG); nothing is checked twice here.
 *
 * Stream. One compute stream, cudaStreamNonBlocking, made by the first call of any entry on
 * the device chosen for the rank (cuda_device_use, kernels/cuda/cuda_module.h: runtime/topo
 * picks it before the backend starts; device 0 when nothing chose); cuBLASLt's handle and
 * workspace are made at the same moment. event_wait makes the stream wait for an event
 * recorded on another stream (the end of an NCCL work, nccl_cuda.cu). Every op, zero, copy,
 * upload, download and event record is ordered on that stream; nothing uses the legacy default
 * stream. alloc, release, download, activations_download, sum_squares and event_elapsed_ms
 * wait for the stream; every other entry returns at once. Host arrays handed to upload are
 * pageable (malloc): the copy has taken their bytes when the call returns, so the caller may
 * reuse them. One host thread drives the backend: the state below is not locked.
 *
 * Memory. alloc is cudaMalloc plus a zero fill on the stream, waited for before alloc
 * returns, so the memory reads zero from any stream (a communication stream too); 0 bytes
 * give NULL. release waits for the stream, then cudaFree. A table of (pointer, bytes) of
 * the live allocations gives memory_usage: in use = those bytes + the workspace + cuBLASLt's
 * 32 MiB; peak = the most in use at once so far. Running out of device memory is reported
 * with the sizes (exit 2: the configuration asks for more than the GPU has).
 *
 * Workspace. One device buffer the backend owns serves every op that needs scratch: the
 * rmsnorm, attention, route, stream conv and stream mix backwards, the stream route (forward
 * and backward), and sum_squares (its result double, then its partials). Ops run one after
 * another on the stream, so one buffer is enough. When a call needs more than the buffer
 * has, the old buffer is freed and a new one of the size asked for is allocated, both
 * ordered on the stream (cudaFreeAsync, cudaMallocAsync: no wait, and work still queued
 * finishes with the old buffer). The first training step meets every shape of the run, so
 * after it the workspace never grows again and nothing allocates inside the step loop
 * (runtime/backend.h). The `scratch` arguments of route_backward and route_conv_backward
 * are not used.
 *
 * How fast should this be: an entry adds one host call (and, for a backward with scratch,
 * one size comparison) to its kernel, whose floor its header gives. activations_from_floats
 * reads 4 and writes 2 bytes an element: a 4096 x 4096 weight (16.8 M elements, 101 MB)
 * in ~23 us at 4.3 TB/s. activations_upload / download move 2 bytes an element over PCIe
 * (pageable memory: a few GB/s) plus a host conversion of about a nanosecond an element.
 */
#include "kernels/cuda/backend_cuda.h"

#include "kernels/cuda/backend_cuda_event.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/kernels_cuda.h"
#include "runtime/error.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

enum {
    /* kernels_cuda.h: "one cuBLASLt handle and one 32 MiB workspace per process" */
    MATMUL_WORKSPACE_BYTES = 32 << 20,
    /* workspace sizes are rounded up to this; sum_squares' partials start this far in */
    WORKSPACE_ALIGNMENT = 256,
};

typedef struct DeviceAllocation {
    void *pointer;
    size_t bytes;
} DeviceAllocation;

typedef struct CudaBackendState {
    cudaStream_t stream; /* NULL until the first call */
    DeviceAllocation *allocations; /* live allocations of alloc() */
    size_t allocation_count, allocation_capacity;
    size_t allocated_bytes; /* their sum */
    size_t matmul_bytes; /* cuBLASLt's workspace, once made */
    void *workspace;
    size_t workspace_bytes;
    size_t peak_bytes;
} CudaBackendState;

static CudaBackendState state;

/* ---- stream, accounting, workspace ---- */

static size_t bytes_in_use(void)
{
    return state.allocated_bytes + state.workspace_bytes + state.matmul_bytes;
}

static void note_peak(void)
{
    size_t in_use = bytes_in_use();
    if (in_use > state.peak_bytes)
        state.peak_bytes = in_use;
}

static cudaStream_t compute_stream(void)
{
    if (!state.stream) {
        CUDA_CHECK(cudaSetDevice(cuda_device_ordinal()));
        CUDA_CHECK(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking));
        cuda_matmul_init();
        state.matmul_bytes = MATMUL_WORKSPACE_BYTES;
        note_peak();
    }
    return state.stream;
}

static void device_out_of_memory(size_t bytes)
{
    fatal(EXIT_CONFIG,
          "device memory exhausted: %.1f MiB more asked for with %.2f GiB in use through the "
          "backend; a smaller train.microbatch_size, a larger parallel.pp, "
          "train.activation_checkpointing: full or fsdp.reshard_after_forward: true need less",
          (double)bytes / (1 << 20), (double)bytes_in_use() / (1 << 30));
}

/* The workspace, at least `bytes` long (grown on the stream when it is shorter). */
static void *workspace_reserve(size_t bytes)
{
    cudaStream_t stream = compute_stream();
    if (bytes <= state.workspace_bytes)
        return state.workspace;
    size_t rounded = (bytes + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT;
    if (state.workspace)
        CUDA_CHECK(cudaFreeAsync(state.workspace, stream));
    state.workspace = NULL;
    state.workspace_bytes = 0;
    cudaError_t status = cudaMallocAsync(&state.workspace, rounded, stream);
    if (status == cudaErrorMemoryAllocation)
        device_out_of_memory(rounded);
    CUDA_CHECK(status);
    state.workspace_bytes = rounded;
    note_peak();
    return state.workspace;
}

static float *workspace_floats(size_t floats)
{
    return (float *)workspace_reserve(floats * sizeof(float));
}

static void allocation_remember(void *pointer, size_t bytes)
{
    if (state.allocation_count == state.allocation_capacity) {
        state.allocation_capacity = state.allocation_capacity ? 2 * state.allocation_capacity : 64;
        state.allocations = (DeviceAllocation *)xrealloc(
            state.allocations, state.allocation_capacity * sizeof(DeviceAllocation));
    }
    DeviceAllocation *entry = &state.allocations[state.allocation_count++];
    entry->pointer = pointer;
    entry->bytes = bytes;
    state.allocated_bytes += bytes;
    note_peak();
}

/* Drops `pointer` from the table (searched from the newest: buffers tend to go in the
 * reverse order they came). */
static void allocation_forget(void *pointer)
{
    for (size_t i = state.allocation_count; i-- > 0;) {
        if (state.allocations[i].pointer != pointer)
            continue;
        state.allocated_bytes -= state.allocations[i].bytes;
        state.allocations[i] = state.allocations[--state.allocation_count];
        return;
    }
    fatal(EXIT_COMM, "cuda backend: release(%p) of memory that alloc() did not return", pointer);
}

/* The cuda backend's Activation arrays are bf16. */
static bf16 *as_bf16(Activation *array)
{
    return (bf16 *)array;
}

/* ---- memory ---- */

static void *device_alloc(size_t bytes)
{
    if (bytes == 0)
        return NULL;
    cudaStream_t stream = compute_stream();
    void *pointer = NULL;
    cudaError_t status = cudaMalloc(&pointer, bytes);
    if (status == cudaErrorMemoryAllocation)
        device_out_of_memory(bytes);
    CUDA_CHECK(status);
    CUDA_CHECK(cudaMemsetAsync(pointer, 0, bytes, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream)); /* zero before any stream can touch it */
    allocation_remember(pointer, bytes);
    return pointer;
}

static void device_release(void *pointer)
{
    if (!pointer)
        return;
    allocation_forget(pointer);
    CUDA_CHECK(cudaStreamSynchronize(compute_stream())); /* no queued op still reads it */
    CUDA_CHECK(cudaFree(pointer));
}

static void device_zero(void *pointer, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemsetAsync(pointer, 0, bytes, compute_stream()));
}

static void device_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream()));
}

static void device_upload(void *dst, const void *host_src, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, compute_stream()));
}

static void device_download(void *host_dst, const void *src, size_t bytes)
{
    cudaStream_t stream = compute_stream();
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

static void device_synchronize(void)
{
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
}

static void device_memory_usage(size_t *in_use, size_t *peak)
{
    if (in_use)
        *in_use = bytes_in_use();
    if (peak)
        *peak = state.peak_bytes;
}

static void device_memory_peak_reset(void)
{
    state.peak_bytes = bytes_in_use();
}

/* ---- events ---- */

static BackendEvent *event_create(void)
{
    compute_stream(); /* the event belongs to the stream's device */
    BackendEvent *event = (BackendEvent *)xmalloc(sizeof *event);
    CUDA_CHECK(cudaEventCreate(&event->event));
    return event;
}

static void event_destroy(BackendEvent *event)
{
    if (!event)
        return;
    CUDA_CHECK(cudaEventDestroy(event->event));
    free(event);
}

static void event_record(BackendEvent *event)
{
    CUDA_CHECK(cudaEventRecord(event->event, compute_stream()));
}

static float event_elapsed_ms(const BackendEvent *start, const BackendEvent *end)
{
    float milliseconds = 0.0f;
    CUDA_CHECK(cudaEventSynchronize(end->event));
    CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start->event, end->event));
    return milliseconds;
}

static void event_wait(const BackendEvent *event)
{
    CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), event->event, 0));
}

/* ---- conversions ---- */

static void op_activations_from_floats(Activation *dst, const float *src, size_t n)
{
    cuda_bf16_from_floats(as_bf16(dst), src, n, compute_stream());
}

/* rounded on the host, so only 2 bytes an element cross the bus */
static void op_activations_upload(Activation *dst, const float *host_src, size_t n)
{
    if (n == 0)
        return;
    bf16 *staging = (bf16 *)xmalloc(n * sizeof(bf16));
    bf16_from_floats(staging, host_src, n);
    device_upload(dst, staging, n * sizeof(bf16));
    free(staging); /* pageable: the copy has taken the bytes (see the opening comment) */
}

static void op_activations_download(float *host_dst, const Activation *src, size_t n)
{
    if (n == 0) {
        device_synchronize();
        return;
    }
    bf16 *staging = (bf16 *)xmalloc(n * sizeof(bf16));
    device_download(staging, src, n * sizeof(bf16));
    bf16_to_floats(host_dst, staging, n);
    free(staging);
}

/* ---- the layers' and routing's entries: backend_cuda_layers.cu, backend_cuda_routing.cu ---- */

extern "C" cudaStream_t backend_cuda_compute_stream(void)
{
    return compute_stream();
}

extern "C" float *backend_cuda_workspace_floats(size_t floats)
{
    return workspace_floats(floats);
}

extern "C" void backend_cuda_check_table(const char *file, size_t callee_bytes,
                                         size_t caller_bytes)
{
    if (callee_bytes != caller_bytes)
        fatal(EXIT_CONFIG,
              "%s was compiled against another runtime/backend.h (an op table of %zu bytes, "
              "not %zu): rebuild the CUDA module (touch kernels/cuda/*.cu, or "
              "launch/bench/gpu_bundle.sh)",
              file, callee_bytes, caller_bytes);
}

/* ---- optimizer ---- */

/* The result double sits at the start of the workspace, the partials one alignment in. */
static double op_sum_squares(const float *x, size_t n)
{
    cudaStream_t stream = compute_stream();
    char *space = (char *)workspace_reserve(WORKSPACE_ALIGNMENT +
                                            CUDA_SUM_SQUARES_PARTIALS * sizeof(double));
    double *result = (double *)space;
    double *partials = (double *)(space + WORKSPACE_ALIGNMENT);
    CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
    cuda_sum_squares(result, x, n, partials, stream);
    return cuda_sum_squares_read(result, stream);
}

static void op_add_floats(float *y, const float *x, size_t n)
{
    cuda_add_floats(y, x, n, compute_stream());
}

static void op_adamw_update(float *params, const float *grads, float *exp_avg,
                            float *exp_avg_sq, float *ema, size_t n, const AdamwScalars *s,
                            Activation *compute_copy)
{
    cuda_adamw_update(params, grads, exp_avg, exp_avg_sq, ema, n, s, as_bf16(compute_copy),
                      compute_stream());
}

static void op_adamw_update_ranges(float *params, const float *grads, float *exp_avg,
                                   float *exp_avg_sq, float *ema, const AdamwRange *ranges,
                                   int n_ranges, const AdamwScalars *s, Activation *compute_copy)
{
    cuda_adamw_update_ranges(params, grads, exp_avg, exp_avg_sq, ema, ranges, n_ranges, s,
                             as_bf16(compute_copy), compute_stream());
}

/* ---- the table ---- */

static Backend cuda_backend; /* filled by the first backend_cuda() call */

extern "C" size_t backend_cuda_table_bytes(void)
{
    return sizeof(Backend);
}

extern "C" const Backend *backend_cuda(void)
{
    Backend *table = &cuda_backend;
    if (table->name)
        return table;
    table->activation_bytes = sizeof(bf16);

    table->alloc = device_alloc;
    table->release = device_release;
    table->zero = device_zero;
    table->copy = device_copy;
    table->upload = device_upload;
    table->download = device_download;
    table->synchronize = device_synchronize;
    table->memory_usage = device_memory_usage;
    table->memory_peak_reset = device_memory_peak_reset;

    table->event_create = event_create;
    table->event_destroy = event_destroy;
    table->event_record = event_record;
    table->event_elapsed_ms = event_elapsed_ms;
    table->event_wait = event_wait;

    table->activations_from_floats = op_activations_from_floats;
    table->activations_upload = op_activations_upload;
    table->activations_download = op_activations_download;

    backend_cuda_fill_layers(table, sizeof *table);
    backend_cuda_fill_routing(table, sizeof *table);

    table->sum_squares = op_sum_squares;
    table->add_floats = op_add_floats;
    table->adamw_update = op_adamw_update;
    table->adamw_update_ranges = op_adamw_update_ranges;

    table->name = "cuda"; /* last: a named table is a filled one */
    return table;
}
