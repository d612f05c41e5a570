/* runtime/device_comm_internal.h — the DeviceComm shared by device_comm.c (creation and
 * collectives) and device_comm_hops.c (point to point). Nothing else includes it. */
#ifndef FATHOM_RUNTIME_DEVICE_COMM_INTERNAL_H
#define FATHOM_RUNTIME_DEVICE_COMM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/device_comm.h"
#include "runtime/nccl_table.h"

/* A buffer holding one sent message until it has left (device_comm.h). */
typedef struct {
    void *memory;
    size_t capacity;
    size_t bytes;         /* of the message it holds */
    bool busy;            /* its message has not left yet */
    CommRequest *request; /* mpi, host-staged: the MPI send */
    NcclWork *work;       /* nccl: the send's work */
} HeldBuffer;

typedef struct {
    HeldBuffer *held;
    int n_held;
    int *queue;           /* a group of one: held buffers waiting for their receive, FIFO */
    int queue_head, queue_length;
    uint32_t *sent, *received; /* [group size]: messages so far per peer (the MPI tags) */
    void *host_recv;      /* mpi, host-staged: where a message lands before the upload */
    size_t host_recv_bytes;
} DeviceCommHops;

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
    DeviceCommMethod method;
    bool local;                  /* one rank, not through NCCL: operations are copies */
    char reason[256];
    const NcclTable *nccl;       /* nccl only */
    NcclCommunicator *communicator;
    Operation *queued;
    int n_queued, capacity;
    int depth;                   /* group_begin nesting */
    NcclOperation *started;      /* nccl: the queue as NCCL operations, same capacity */
    DeviceCommWork *spare_works; /* nccl: waited-for works, reused */
    void *host_send, *host_recv; /* host-staged: staging, grown to the largest operation */
    size_t host_send_bytes, host_recv_bytes;
    DeviceCommHops hops;         /* point to point: device_comm_hops.c */
};


/* Called by device_comm_destroy: flushes and frees the point-to-point state. */
void device_comm_hops_destroy(DeviceComm *comm);

/* ---- timing slots (runtime/device_comm_timing.c; device_comm.h, "timing") ----
 * open gives a slot for one operation, or DEVICE_COMM_UNTIMED while timing is off (every
 * call below then does nothing). mark_compute records on the compute stream: the first
 * call where the operation can start holding the stream up, the second where it no longer
 * does. stream_marks hands out the two events for the NCCL table's start() to record on the
 * communication stream (NULLs when untimed). close: the slot is complete and may be read. */
enum { DEVICE_COMM_UNTIMED = -1 };
int device_comm_timing_open(const Backend *backend, CommKind kind);
void device_comm_timing_mark_compute(int timed);
void device_comm_timing_stream_marks(int timed, BackendEvent **begin, BackendEvent **end);
void device_comm_timing_close(int timed);

#endif
