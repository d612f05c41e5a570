/* launch/tools/kernel_trace.c — a CUDA injection library that writes a timeline of a run:
 * every kernel, copy and memset the GPU ran, and every CUDA runtime call the host made, with
 * start and end times on one clock (CUPTI's activity API). Machines without Nsight Systems
 * can then see where the GPU waits between kernels (launch/bench/trace_gaps.py reads it).
 *
 *   CUDA_INJECTION64_PATH=build/launch/libfathom-kernel-trace.so \
 *   FATHOM_TRACE=/tmp/trace.csv build/fathom train ...
 *
 * The driver loads the library at cuInit and calls InitializeInjection(), which enables the
 * activity kinds; CUPTI hands over filled buffers, whose records are written as CSV lines
 *   K,start_ns,end_ns,kernel name       (a kernel)
 *   C,start_ns,end_ns,bytes,copy kind   (a copy: 1 host to device, 2 device to host, ...)
 *   S,start_ns,end_ns,bytes             (a memset)
 *   R,start_ns,end_ns,runtime call name (a host call into the CUDA runtime)
 * The last buffers are flushed at exit. Tracing costs a little host time at every call; the
 * timeline is for finding gaps, not for timing kernels to the microsecond.
 * Errors go to stderr and turn the tracing off; the traced program runs on regardless.
 */
#include <cupti.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { TRACE_BUFFER_BYTES = 8 << 20, TRACE_ALIGN = 8 };

static FILE *trace_file;

static int trace_check(CUptiResult result, const char *call, int line)
{
    if (result == CUPTI_SUCCESS)
        return 1;
    const char *text = "unknown error";
    cuptiGetResultString(result, &text);
    fprintf(stderr, "kernel_trace.c:%d: %s: %s (tracing off)\n", line, call, text);
    return 0;
}
#define TRACE_CHECK(call) trace_check((call), #call, __LINE__)

static void CUPTIAPI trace_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(TRACE_ALIGN, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void trace_write(const CUpti_Activity *record)
{
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *kernel = (const CUpti_ActivityKernel10 *)record;
        fprintf(trace_file, "K,%llu,%llu,%s\n", (unsigned long long)kernel->start,
                (unsigned long long)kernel->end, kernel->name ? kernel->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *copy = (const CUpti_ActivityMemcpy6 *)record;
        fprintf(trace_file, "C,%llu,%llu,%llu,%u\n", (unsigned long long)copy->start,
                (unsigned long long)copy->end, (unsigned long long)copy->bytes,
                (unsigned)copy->copyKind);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *set = (const CUpti_ActivityMemset4 *)record;
        fprintf(trace_file, "S,%llu,%llu,%llu\n", (unsigned long long)set->start,
                (unsigned long long)set->end, (unsigned long long)set->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const CUpti_ActivityAPI *api = (const CUpti_ActivityAPI *)record;
        const char *name = "?";
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, api->cbid, &name);
        fprintf(trace_file, "R,%llu,%llu,%s\n", (unsigned long long)api->start,
                (unsigned long long)api->end, name);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI trace_buffer_completed(CUcontext context, uint32_t stream_id,
                                            uint8_t *buffer, size_t size, size_t valid_size)
{
    (void)context, (void)stream_id, (void)size;
    CUpti_Activity *record = NULL;
    while (trace_file &&
           cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS)
        trace_write(record);
    free(buffer);
}

static void trace_finish(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (trace_file)
        fclose(trace_file);
    trace_file = NULL;
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void)
{
    const char *path = getenv("FATHOM_TRACE");
    if (!path || !*path)
        path = "kernel-trace.csv";
    trace_file = fopen(path, "w");
    if (!trace_file) {
        perror(path);
        return 1;
    }
    if (!TRACE_CHECK(cuptiActivityRegisterCallbacks(trace_buffer_requested,
                                                    trace_buffer_completed)) ||
        !TRACE_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) ||
        !TRACE_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY)) ||
        !TRACE_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET)) ||
        !TRACE_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME))) {
        fclose(trace_file);
        trace_file = NULL;
        return 1;
    }
    atexit(trace_finish);
    return 1;
}
