/* kernels/cuda/nccl_cuda.cu — the NCCL table (runtime/nccl_table.h; DESIGN 3, "Communication").
 *
 * Communicators. ncclCommInitRankConfig with blocking = 0 on the backend's device; the
 * calling thread polls ncclCommGetAsyncError until the communicator is ready, an error, or
 * the deadline. Each communicator has a communication stream (cudaStreamNonBlocking) and an
 * event it records on the compute stream at every start.
 *
 * start(). Record the event on the compute stream, make the communication stream wait for
 * it, then ncclGroupStart, one ncclAllGather / ncclReduceScatter / ncclSend / ncclRecv per
 * operation, ncclGroupEnd; the caller's timing events, if given, on either side of the
 * group on the communication stream.
 * In non-blocking mode ncclGroupEnd may answer ncclInProgress while NCCL is still launching;
 * the calling thread polls until ncclSuccess (the kernels are then queued on the stream),
 * with the deadline, before any other NCCL call on the communicator. Then the work's end
 * event is recorded on the communication stream and the work joins the watchdog's list.
 *
 * Watchdog. One thread per process, started by the first start(), asleep while no work is
 * in flight. Every WATCHDOG_PERIOD_MS it queries each work's end event (cudaEventQuery, which
 * never blocks) and each busy communicator's ncclCommGetAsyncError. NCCL's thread-safety
 * rules allow one thread at a time in NCCL calls on a communicator and name no exception
 * (the call is an atomic read in NCCL's sources, but that is not a promise), so a
 * communicator's NCCL calls hold its `calls` lock and the watchdog only tries the lock:
 * while the issuing thread is inside NCCL on that communicator, that thread polls the same
 * state itself, against the same deadline. A work whose event has not passed timeout_s
 * after its start(), or a communicator with an asynchronous error, ends the job: the
 * communicator is aborted (ncclCommAbort, from a thread of its own, waited for at most
 * ABORT_GRACE_S: an abort can itself hang on a dead peer), then fatal() writes the message
 * and exits 5 (MPI_Abort in a job of several ranks; _exit in a process of one, since exit()
 * from this thread would run CUDA's teardown under the main thread's blocked call). The
 * deadline counts from start(), so it also covers the compute queued before the work;
 * timeout_s is minutes and a step's compute is seconds. Because the thread watches the work
 * itself, every host wait is covered: a synchronize of the compute stream that waits behind
 * an NCCL work that will never finish ends at the deadline like the work does.
 *
 * Works are pooled (their events kept): a work returns to the pool once it is complete and
 * released. A process-exit handler stops the thread before CUDA's own teardown runs.
 */
#include "kernels/cuda/nccl_cuda.h"

#include "kernels/cuda/backend_cuda_event.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/cuda_common.h"
#include "runtime/error.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static_assert(sizeof(ncclUniqueId) == NCCL_TABLE_ID_BYTES, "ncclUniqueId is 128 bytes");

enum { WATCHDOG_PERIOD_MS = 5, NAME_BYTES = 160, WHAT_BYTES = 160 };
static const double ABORT_GRACE_S = 10.0;

struct NcclCommunicator {
    ncclComm_t handle;
    cudaStream_t stream;         /* the communication stream */
    cudaEvent_t compute_reached; /* recorded on the compute stream by start() */
    int nranks, rank;
    int in_flight;               /* works started and not yet complete (watchdog's lock) */
    double timeout_s;            /* of the last create or start: finalize's deadline */
    char name[NAME_BYTES];       /* "the group of world ranks 0-3" */
    pthread_mutex_t calls;       /* one thread at a time in NCCL on this communicator */
    NcclCommunicator *next;      /* the watchdog's list */
};

struct NcclWork {
    BackendEvent end;            /* recorded on the communication stream after the group */
    NcclCommunicator *communicator;
    double started, timeout_s;
    bool complete, released;
    char what[WHAT_BYTES];       /* "all-gather of 4.0 MiB" */
    NcclWork *next;
};

/* The watchdog's state, under watchdog_lock. */
static pthread_mutex_t watchdog_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watchdog_wake = PTHREAD_COND_INITIALIZER;
static struct {
    pthread_t thread;
    bool running, stopping;
    NcclWork *works;                 /* started, not yet complete and released */
    NcclWork *pool;                  /* complete and released: reused by start() */
    NcclCommunicator *communicators;
} watchdog;

static int failing; /* set once by the first failure; later ones wait for the end */

static double now_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* ---- failing ---------------------------------------------------------------------------- */

static volatile int abort_returned;

static void *abort_communicator(void *handle)
{
    ncclCommAbort((ncclComm_t)handle); /* its result changes nothing: the job ends */
    __atomic_store_n(&abort_returned, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* A process of one has no abort hook: end it without exit()'s handlers (see the top). */
static void exit_at_once(int exit_code)
{
    fflush(stdout);
    fflush(stderr);
    _exit(exit_code);
}

/* Aborts the communicator, then writes the message and ends the job with exit 5. Any
 * thread; a second failure (another thread) waits for the first to end the job. */
[[noreturn]] static void nccl_fail(NcclCommunicator *communicator, const char *format, ...)
{
    if (__atomic_exchange_n(&failing, 1, __ATOMIC_ACQ_REL))
        for (;;)
            pause(); /* another thread is ending the job */
    char message[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    const char *aborted = "";
    pthread_t thread;
    if (communicator && communicator->handle &&
        pthread_create(&thread, NULL, abort_communicator, communicator->handle) == 0) {
        pthread_detach(thread);
        const double give_up = now_seconds() + ABORT_GRACE_S;
        while (!__atomic_load_n(&abort_returned, __ATOMIC_ACQUIRE) && now_seconds() < give_up)
            usleep(10000);
        aborted = __atomic_load_n(&abort_returned, __ATOMIC_ACQUIRE)
                      ? "; the NCCL communicator was aborted"
                      : "; ncclCommAbort did not return within 10 s";
    }
    if (!error_abort_hook())
        error_set_abort(exit_at_once);
    fatal(EXIT_COMM, "%s%s", message, aborted);
}

/* Every NCCL call: ncclInProgress is an answer of a non-blocking communicator, not an error. */
#define NCCL_CHECK(communicator, call) \
    nccl_check((communicator), (call), #call, __FILE__, __LINE__)

static ncclResult_t nccl_check(NcclCommunicator *communicator, ncclResult_t result,
                               const char *expression, const char *file, int line)
{
    if (result != ncclSuccess && result != ncclInProgress)
        nccl_fail(communicator, "%s:%d: NCCL call %s failed: %s (%s)", file, line, expression,
                  ncclGetErrorString(result),
                  ncclGetLastError(communicator ? communicator->handle : NULL));
    return result;
}

/* Polls the communicator until NCCL has finished what the last call began (init, a group's
 * launch, finalize): ncclSuccess, an error, or the deadline. */
static void wait_until_ready(NcclCommunicator *communicator, const char *what, double timeout_s)
{
    const double start = now_seconds();
    for (long polls = 0;; polls++) {
        ncclResult_t state = ncclInProgress;
        NCCL_CHECK(communicator, ncclCommGetAsyncError(communicator->handle, &state));
        if (state == ncclSuccess)
            return;
        if (state != ncclInProgress)
            nccl_fail(communicator, "NCCL %s on %s, as its rank %d, failed: %s (%s)", what,
                      communicator->name, communicator->rank, ncclGetErrorString(state),
                      ncclGetLastError(communicator->handle));
        if (now_seconds() - start > timeout_s)
            nccl_fail(communicator, "NCCL %s on %s, as its rank %d, did not complete within "
                      "parallel.timeout_s = %g s", what, communicator->name,
                      communicator->rank, timeout_s);
        if (polls < 1000)
            sched_yield();
        else
            usleep(50); /* ranks sharing cores leave them to the one that must progress */
    }
}

/* ---- the watchdog ----------------------------------------------------------------------- */

/* One pass over the works and communicators; the lock is held. */
static void watchdog_check(void)
{
    const double now = now_seconds();
    for (NcclWork **link = &watchdog.works; *link;) {
        NcclWork *work = *link;
        if (!work->complete) {
            cudaError_t status = cudaEventQuery(work->end.event);
            if (status == cudaSuccess) {
                work->complete = true;
                work->communicator->in_flight--;
            } else if (status == cudaErrorNotReady) {
                if (now - work->started > work->timeout_s)
                    nccl_fail(work->communicator, "NCCL %s on %s, as its rank %d, did not "
                              "complete within parallel.timeout_s = %g s", work->what,
                              work->communicator->name, work->communicator->rank,
                              work->timeout_s);
            } else if (status == cudaErrorCudartUnloading) {
                return; /* the process is ending */
            } else {
                nccl_fail(work->communicator, "NCCL %s on %s: its CUDA event failed: %s",
                          work->what, work->communicator->name, cudaGetErrorString(status));
            }
        }
        if (work->complete && work->released) {
            *link = work->next;
            work->next = watchdog.pool;
            watchdog.pool = work;
        } else {
            link = &work->next;
        }
    }
    for (NcclCommunicator *communicator = watchdog.communicators; communicator;
         communicator = communicator->next) {
        if (communicator->in_flight == 0 || pthread_mutex_trylock(&communicator->calls) != 0)
            continue;
        ncclResult_t state = ncclSuccess;
        NCCL_CHECK(communicator, ncclCommGetAsyncError(communicator->handle, &state));
        pthread_mutex_unlock(&communicator->calls);
        if (state != ncclSuccess && state != ncclInProgress)
            nccl_fail(communicator, "NCCL reported an error on %s, as its rank %d: %s (%s)",
                      communicator->name, communicator->rank, ncclGetErrorString(state),
                      ncclGetLastError(communicator->handle));
    }
}

static bool any_in_flight(void)
{
    for (NcclWork *work = watchdog.works; work; work = work->next)
        if (!work->complete || !work->released)
            return true;
    return false;
}

static void *watchdog_run(void *unused)
{
    (void)unused;
    CUDA_CHECK(cudaSetDevice(cuda_device_ordinal()));
    pthread_mutex_lock(&watchdog_lock);
    while (!watchdog.stopping) {
        if (!any_in_flight()) {
            pthread_cond_wait(&watchdog_wake, &watchdog_lock);
            continue;
        }
        watchdog_check();
        pthread_mutex_unlock(&watchdog_lock);
        usleep(WATCHDOG_PERIOD_MS * 1000);
        pthread_mutex_lock(&watchdog_lock);
    }
    pthread_mutex_unlock(&watchdog_lock);
    return NULL;
}

/* At exit, before CUDA's teardown (registered earlier, so it runs later). */
static void watchdog_stop(void)
{
    pthread_mutex_lock(&watchdog_lock);
    const bool running = watchdog.running;
    watchdog.stopping = true;
    pthread_cond_signal(&watchdog_wake);
    pthread_mutex_unlock(&watchdog_lock);
    if (running && !pthread_equal(pthread_self(), watchdog.thread))
        pthread_join(watchdog.thread, NULL);
}

/* With the lock held. */
static void watchdog_start(void)
{
    if (watchdog.running)
        return;
    int status = pthread_create(&watchdog.thread, NULL, watchdog_run, NULL);
    if (status != 0)
        fatal(EXIT_COMM, "cannot start the NCCL watchdog thread: %s", strerror(status));
    watchdog.running = true;
    atexit(watchdog_stop);
}

/* ---- the table -------------------------------------------------------------------------- */

static void nccl_unique_id(unsigned char id[NCCL_TABLE_ID_BYTES])
{
    ncclUniqueId unique;
    NCCL_CHECK(NULL, ncclGetUniqueId(&unique));
    memcpy(id, &unique, sizeof unique);
}

static NcclCommunicator *nccl_create(const unsigned char id[NCCL_TABLE_ID_BYTES], int nranks,
                                     int rank, double timeout_s, const char *group_name)
{
    CUDA_CHECK(cudaSetDevice(cuda_device_ordinal()));
    backend_cuda_compute_stream(); /* the backend's context and stream exist first */
    NcclCommunicator *communicator = (NcclCommunicator *)xcalloc(1, sizeof *communicator);
    communicator->nranks = nranks;
    communicator->rank = rank;
    communicator->timeout_s = timeout_s;
    snprintf(communicator->name, sizeof communicator->name, "%s", group_name);
    pthread_mutex_init(&communicator->calls, NULL);
    CUDA_CHECK(cudaStreamCreateWithFlags(&communicator->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&communicator->compute_reached,
                                        cudaEventDisableTiming));
    ncclUniqueId unique;
    memcpy(&unique, id, sizeof unique);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result =
        ncclCommInitRankConfig(&communicator->handle, nranks, unique, rank, &config);
    if (result != ncclSuccess && result != ncclInProgress)
        nccl_fail(communicator, "NCCL communicator init on %s, as its rank %d, failed: %s (%s)",
                  communicator->name, rank, ncclGetErrorString(result),
                  ncclGetLastError(communicator->handle));
    wait_until_ready(communicator, "communicator init", timeout_s);
    pthread_mutex_lock(&watchdog_lock);
    communicator->next = watchdog.communicators;
    watchdog.communicators = communicator;
    pthread_mutex_unlock(&watchdog_lock);
    return communicator;
}

static ncclDataType_t nccl_type(CommType type)
{
    switch (type) {
    case COMM_FLOAT32: return ncclFloat32;
    case COMM_BFLOAT16: return ncclBfloat16;
    case COMM_BYTE: return ncclUint8;
    case COMM_INT64: return ncclInt64;
    case COMM_FLOAT64: return ncclFloat64;
    }
    fatal(EXIT_COMM, "NCCL: unknown CommType %d", (int)type);
}

/* The module links no runtime/comm.c: the element sizes of CommType (runtime/comm.h). */
static size_t element_bytes(CommType type)
{
    switch (type) {
    case COMM_FLOAT32: return 4;
    case COMM_BFLOAT16: return 2;
    case COMM_BYTE: return 1;
    case COMM_INT64: return 8;
    case COMM_FLOAT64: return 8;
    }
    fatal(EXIT_COMM, "NCCL: unknown CommType %d", (int)type);
}

/* "all-gather of 4.0 MiB", "group of 2 all-gathers and 1 reduce-scatter of 12.0 MiB",
 * "send of 2.0 MiB to rank 1": bytes over the whole group for collectives, the message for
 * point-to-point. */
static void describe(char *what, size_t capacity, const NcclOperation *operations, int count,
                     int nranks)
{
    static const char *const names[] = {"all-gather", "reduce-scatter", "send", "recv"};
    int of_kind[4] = {0};
    double bytes = 0;
    for (int i = 0; i < count; i++) {
        const NcclOperationKind kind = operations[i].kind;
        const double block = (double)operations[i].count * element_bytes(operations[i].type);
        of_kind[kind]++;
        bytes += kind == NCCL_OPERATION_SEND || kind == NCCL_OPERATION_RECV ? block
                                                                            : block * nranks;
    }
    const double mib = bytes / (1 << 20);
    if (count == 1) {
        const NcclOperationKind kind = operations[0].kind;
        if (kind == NCCL_OPERATION_SEND || kind == NCCL_OPERATION_RECV)
            snprintf(what, capacity, "%s of %.1f MiB %s rank %d", names[kind], mib,
                     kind == NCCL_OPERATION_SEND ? "to" : "from", operations[0].peer);
        else
            snprintf(what, capacity, "%s of %.1f MiB", names[kind], mib);
        return;
    }
    size_t used = (size_t)snprintf(what, capacity, "group of");
    for (int kind = 0, listed = 0; kind < 4 && used < capacity; kind++)
        if (of_kind[kind])
            used += (size_t)snprintf(what + used, capacity - used, "%s %d %s%s",
                                     listed++ ? " and" : "", of_kind[kind], names[kind],
                                     of_kind[kind] == 1 ? "" : "s");
    if (used < capacity)
        snprintf(what + used, capacity - used, " of %.1f MiB", mib);
}

static NcclWork *take_work(void)
{
    pthread_mutex_lock(&watchdog_lock);
    NcclWork *work = watchdog.pool;
    if (work)
        watchdog.pool = work->next;
    pthread_mutex_unlock(&watchdog_lock);
    if (!work) {
        work = (NcclWork *)xcalloc(1, sizeof *work);
        CUDA_CHECK(cudaEventCreateWithFlags(&work->end.event, cudaEventDisableTiming));
    }
    return work;
}

static NcclWork *nccl_start(NcclCommunicator *communicator, const NcclOperation *operations,
                            int count, double timeout_s, BackendEvent *begin, BackendEvent *end)
{
    NcclWork *work = take_work();
    communicator->timeout_s = timeout_s;
    describe(work->what, sizeof work->what, operations, count, communicator->nranks);
    cudaStream_t compute = backend_cuda_compute_stream();
    CUDA_CHECK(cudaEventRecord(communicator->compute_reached, compute));
    CUDA_CHECK(cudaStreamWaitEvent(communicator->stream, communicator->compute_reached, 0));
    if (begin)
        CUDA_CHECK(cudaEventRecord(begin->event, communicator->stream));
    const double started = now_seconds();
    pthread_mutex_lock(&communicator->calls);
    NCCL_CHECK(communicator, ncclGroupStart());
    for (int i = 0; i < count; i++) {
        const NcclOperation *operation = &operations[i];
        const ncclDataType_t type = nccl_type(operation->type);
        if (operation->kind == NCCL_OPERATION_ALLGATHER) {
            NCCL_CHECK(communicator,
                       ncclAllGather(operation->send, operation->recv, operation->count, type,
                                     communicator->handle, communicator->stream));
        } else if (operation->kind == NCCL_OPERATION_SEND) {
            NCCL_CHECK(communicator, ncclSend(operation->send, operation->count, type,
                                              operation->peer, communicator->handle,
                                              communicator->stream));
        } else if (operation->kind == NCCL_OPERATION_RECV) {
            NCCL_CHECK(communicator, ncclRecv(operation->recv, operation->count, type,
                                              operation->peer, communicator->handle,
                                              communicator->stream));
        } else {
            if (operation->type == COMM_BYTE)
                fatal(EXIT_COMM, "NCCL reduce-scatter of bytes: bytes are not summable");
            NCCL_CHECK(communicator,
                       ncclReduceScatter(operation->send, operation->recv, operation->count,
                                         type, ncclSum, communicator->handle,
                                         communicator->stream));
        }
    }
    if (NCCL_CHECK(communicator, ncclGroupEnd()) == ncclInProgress)
        wait_until_ready(communicator, work->what, timeout_s);
    pthread_mutex_unlock(&communicator->calls);
    if (end)
        CUDA_CHECK(cudaEventRecord(end->event, communicator->stream));
    CUDA_CHECK(cudaEventRecord(work->end.event, communicator->stream));
    work->communicator = communicator;
    work->started = started;
    work->timeout_s = timeout_s;
    work->complete = work->released = false;
    pthread_mutex_lock(&watchdog_lock);
    work->next = watchdog.works;
    watchdog.works = work;
    communicator->in_flight++;
    watchdog_start();
    pthread_cond_signal(&watchdog_wake);
    pthread_mutex_unlock(&watchdog_lock);
    return work;
}

static const BackendEvent *nccl_work_event(const NcclWork *work)
{
    return &work->end;
}

static int nccl_work_done(const NcclWork *work)
{
    const cudaError_t status = cudaEventQuery(work->end.event);
    if (status == cudaErrorNotReady) {
        /* not an error, but the runtime may keep it as this thread's last error, where the
         * next launch check would take it for one; every launch is checked when made, so
         * nothing else is pending here */
        (void)cudaGetLastError();
        return 0;
    }
    CUDA_CHECK(status);
    return 1;
}

static void nccl_work_release(NcclWork *work)
{
    pthread_mutex_lock(&watchdog_lock);
    work->released = true; /* the watchdog pools it once complete */
    pthread_mutex_unlock(&watchdog_lock);
}

static void nccl_destroy(NcclCommunicator *communicator)
{
    if (!communicator)
        return;
    /* the watchdog keeps the deadline of the works still running; wait until they end */
    for (;;) {
        pthread_mutex_lock(&watchdog_lock);
        bool busy = communicator->in_flight > 0;
        for (NcclWork *work = watchdog.works; work; work = work->next)
            if (work->communicator == communicator && !work->released)
                fatal(EXIT_COMM, "the NCCL communicator of %s is destroyed before its %s was "
                      "waited for", communicator->name, work->what);
        if (!busy)
            for (NcclCommunicator **link = &watchdog.communicators; *link;
                 link = &(*link)->next)
                if (*link == communicator) {
                    *link = communicator->next;
                    break;
                }
        pthread_mutex_unlock(&watchdog_lock);
        if (!busy)
            break;
        usleep(100);
    }
    if (NCCL_CHECK(communicator, ncclCommFinalize(communicator->handle)) == ncclInProgress)
        wait_until_ready(communicator, "communicator finalize", communicator->timeout_s);
    NCCL_CHECK(communicator, ncclCommDestroy(communicator->handle));
    pthread_mutex_destroy(&communicator->calls);
    CUDA_CHECK(cudaEventDestroy(communicator->compute_reached));
    CUDA_CHECK(cudaStreamDestroy(communicator->stream));
    free(communicator);
}

static NcclTable nccl_table; /* filled by the first nccl_cuda() call */

extern "C" const NcclTable *nccl_cuda(void)
{
    NcclTable *table = &nccl_table;
    if (table->unique_id)
        return table;
    NCCL_CHECK(NULL, ncclGetVersion(&table->version));
    table->table_bytes = sizeof *table;
    table->create = nccl_create;
    table->destroy = nccl_destroy;
    table->start = nccl_start;
    table->work_event = nccl_work_event;
    table->work_done = nccl_work_done;
    table->work_release = nccl_work_release;
    table->unique_id = nccl_unique_id; /* last: a table with it is a filled one */
    return table;
}
