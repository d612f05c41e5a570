/* runtime/device_comm.c — see device_comm.h: the "mpi" and "host-staged" methods. Both are
 * synchronous: the queued operations run, in order, inside device_comm_group_end. */
#include "runtime/device_comm.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

typedef enum { OPERATION_ALLGATHER, OPERATION_REDUCE_SCATTER } OperationKind;

typedef struct {
    OperationKind kind;
    const void *send;
    void *recv;
    size_t count_per_rank;
    CommType type;
    CommKind counter;
} Operation;

struct DeviceComm {
    Comm *group;
    const Backend *backend;
    bool staged;               /* host-staged: buffers are device memory */
    char reason[160];
    Operation *queued;
    int n_queued, capacity;
    int depth;                 /* group_begin nesting */
    void *host_send, *host_recv; /* staging, grown to the largest operation */
    size_t host_send_bytes, host_recv_bytes;
};

/* Synchronous work is complete when group_end returns: one shared, never freed marker. */
struct DeviceCommWork {
    int unused;
};
static DeviceCommWork completed_work;

DeviceComm *device_comm_create(Comm *group, const Backend *backend)
{
    DeviceComm *comm = xcalloc(1, sizeof *comm);
    comm->group = group;
    comm->backend = backend;
    comm->staged = backend != backend_cpu();
    if (comm->staged)
        snprintf(comm->reason, sizeof comm->reason,
                 "%d rank%s: device memory staged through host memory", comm_size(group),
                 comm_size(group) == 1 ? "" : "s");
    else
        snprintf(comm->reason, sizeof comm->reason, "%d rank%s on host memory",
                 comm_size(group), comm_size(group) == 1 ? "" : "s");
    return comm;
}

void device_comm_destroy(DeviceComm *comm)
{
    if (!comm)
        return;
    free(comm->queued);
    free(comm->host_send);
    free(comm->host_recv);
    free(comm);
}

const char *device_comm_method(const DeviceComm *comm)
{
    return comm->staged ? "host-staged" : "mpi";
}

const char *device_comm_reason(const DeviceComm *comm) { return comm->reason; }

Comm *device_comm_group(const DeviceComm *comm) { return comm->group; }

void device_comm_group_begin(DeviceComm *comm) { comm->depth++; }

static void queue(DeviceComm *comm, Operation operation)
{
    if (comm->depth == 0)
        fatal(EXIT_COMM, "device_comm: an operation outside device_comm_group_begin/end");
    if (comm->n_queued == comm->capacity) {
        comm->capacity = comm->capacity ? 2 * comm->capacity : 16;
        comm->queued = xrealloc(comm->queued, (size_t)comm->capacity * sizeof *comm->queued);
    }
    comm->queued[comm->n_queued++] = operation;
}

void device_comm_allgather(DeviceComm *comm, const void *send, void *recv,
                           size_t count_per_rank, CommType type, CommKind kind)
{
    queue(comm, (Operation){OPERATION_ALLGATHER, send, recv, count_per_rank, type, kind});
}

void device_comm_reduce_scatter_sum(DeviceComm *comm, const void *send, void *recv,
                                    size_t count_per_rank, CommType type, CommKind kind)
{
    queue(comm, (Operation){OPERATION_REDUCE_SCATTER, send, recv, count_per_rank, type, kind});
}

static void *grow(void **buffer, size_t *capacity, size_t bytes)
{
    if (bytes > *capacity) {
        free(*buffer);
        *buffer = xmalloc(bytes);
        *capacity = bytes;
    }
    return *buffer;
}

static void run(DeviceComm *comm, const Operation *operation)
{
    const size_t n = (size_t)comm_size(comm->group);
    const size_t block = operation->count_per_rank * comm_type_size(operation->type);
    const bool gather = operation->kind == OPERATION_ALLGATHER;
    const size_t send_bytes = gather ? block : n * block;
    const size_t recv_bytes = gather ? n * block : block;
    if (!comm->staged) {
        if (gather)
            comm_allgather(comm->group, operation->send, operation->recv,
                           operation->count_per_rank, operation->type, operation->counter);
        else
            comm_reduce_scatter_sum(comm->group, operation->send, operation->recv,
                                    operation->count_per_rank, operation->type,
                                    operation->counter);
        return;
    }
    void *send = grow(&comm->host_send, &comm->host_send_bytes, send_bytes);
    void *recv = grow(&comm->host_recv, &comm->host_recv_bytes, recv_bytes);
    comm->backend->download(send, operation->send, send_bytes);
    if (gather)
        comm_allgather(comm->group, send, recv, operation->count_per_rank, operation->type,
                       operation->counter);
    else
        comm_reduce_scatter_sum(comm->group, send, recv, operation->count_per_rank,
                                operation->type, operation->counter);
    comm->backend->upload(operation->recv, recv, recv_bytes);
}

DeviceCommWork *device_comm_group_end(DeviceComm *comm)
{
    if (comm->depth == 0)
        fatal(EXIT_COMM, "device_comm_group_end without device_comm_group_begin");
    if (--comm->depth > 0)
        return &completed_work;
    for (int i = 0; i < comm->n_queued; i++)
        run(comm, &comm->queued[i]);
    comm->n_queued = 0;
    return &completed_work;
}

void device_comm_work_wait(DeviceCommWork *work)
{
    (void)work; /* synchronous methods: complete at group_end */
}
