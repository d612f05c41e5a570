/* runtime/nccl_table.h — the NCCL function table the CUDA module fills (DESIGN 3,
 * "Communication").
 *
 * fathom never links CUDA or NCCL: the CUDA module (kernels/cuda/nccl_cuda.cu, built with
 * libnccl) exports nccl_cuda(), which returns this table, and runtime/cuda_module finds it
 * with dlsym, as it finds the op table. runtime/device_comm is its one caller. Nothing here
 * knows MPI: the caller bootstraps a communicator by broadcasting the unique id of rank 0
 * over its own communicator (runtime/comm.h).
 *
 * What the module promises:
 * - Every communicator is non-blocking (ncclCommInitRankConfig with blocking = 0) and runs
 *   its operations on a communication stream of its own, on the device the backend uses
 *   (cuda_device_use, kernels/cuda/cuda_module.h).
 * - start() orders the operations after everything queued on the backend's compute stream
 *   so far (an event recorded there, waited for by the communication stream), starts them as
 *   one NCCL group, and records the work's end on the communication stream: work_event()
 *   is that point, a BackendEvent the compute stream waits for through the op table's
 *   event_wait. The host never waits for the communication itself.
 * - Deadline: create, start and destroy poll ncclCommGetAsyncError against timeout_s; a
 *   started work is watched by a thread of the module (the watchdog) until its end event
 *   has passed, whoever waits for it and however (a later synchronize of the compute
 *   stream included). Past timeout_s, or on an asynchronous NCCL error, the communicator
 *   is aborted (ncclCommAbort) and the job ends with exit 5 through fatal(), naming the
 *   operation, this rank in the group and the group (group_name). Nothing hangs silently.
 * - Errors of NCCL and CUDA calls: exit 5 with file:line, the call and NCCL's message.
 *
 * Operations are a list: the two collectives FSDP needs and the point-to-point hops of the
 * pipeline (ncclSend / ncclRecv to a peer, matched by NCCL in the order they are issued).
 * Memory: every buffer is the caller's device memory and must stay untouched (send) or
 * unread (recv) until the compute stream has waited for the work's event. A work belongs
 * to the module; the caller hands it back with work_release once the compute stream waits
 * for it (the module keeps watching it until it is complete, then reuses it).
 */
#ifndef FATHOM_RUNTIME_NCCL_TABLE_H
#define FATHOM_RUNTIME_NCCL_TABLE_H

#include <stddef.h>

#include "runtime/backend.h"
#include "runtime/comm.h"

enum { NCCL_TABLE_ID_BYTES = 128 }; /* sizeof(ncclUniqueId) */

typedef enum {
    NCCL_OPERATION_ALLGATHER,          /* recv [nranks * count] = every rank's send [count] */
    NCCL_OPERATION_REDUCE_SCATTER_SUM, /* recv [count] = sum over ranks of send block `rank` */
    NCCL_OPERATION_SEND,               /* send [count] to `peer` (recv unused) */
    NCCL_OPERATION_RECV,               /* recv [count] from `peer` (send unused) */
} NcclOperationKind;

typedef struct {
    NcclOperationKind kind;
    const void *send;
    void *recv;
    size_t count;  /* elements per rank */
    CommType type; /* COMM_BYTE is not summable */
    int peer;      /* the group rank of the other side of a send or recv; collectives: -1 */
} NcclOperation;

typedef struct NcclCommunicator NcclCommunicator;
typedef struct NcclWork NcclWork;

typedef struct NcclTable {
    size_t table_bytes; /* sizeof(NcclTable) as the module was built: a stale module is refused */
    int version; /* NCCL_VERSION_CODE of the loaded libnccl (22809 for 2.28.9) */
    /* rank 0 of a group: a fresh id, to be broadcast to the others */
    void (*unique_id)(unsigned char id[NCCL_TABLE_ID_BYTES]);
    /* Collective over the nranks processes holding the same id; returns when the
     * communicator is ready. group_name ("the group of world ranks 0-3") is kept for
     * messages. */
    NcclCommunicator *(*create)(const unsigned char id[NCCL_TABLE_ID_BYTES], int nranks,
                                int rank, double timeout_s, const char *group_name);
    /* Waits (with the deadline) for the communicator's works, then ncclCommFinalize and
     * ncclCommDestroy. Every work must have been released. Collective, as create. */
    void (*destroy)(NcclCommunicator *communicator);
    /* Starts `count` operations as one group (see above); never NULL. begin and end, when
     * not NULL, are the caller's events (made by the op table's event_create), recorded on
     * the communication stream just before the group (after its wait for the compute
     * stream) and just after it: the group's time on that stream (device_comm.h,
     * "timing"). */
    NcclWork *(*start)(NcclCommunicator *communicator, const NcclOperation *operations,
                       int count, double timeout_s, BackendEvent *begin, BackendEvent *end);
    /* The point on the communication stream where the work ends. */
    const BackendEvent *(*work_event)(const NcclWork *work);
    /* Whether the work has ended (its event has passed); never waits. A send's buffer may
     * be written again once it has. */
    int (*work_done)(const NcclWork *work);
    /* The caller is done with the work: its compute stream waits for the event, or (a send)
     * it has seen work_done. */
    void (*work_release)(NcclWork *work);
} NcclTable;

/* The module's exported getter (kernels/cuda/nccl_cuda.h). */
typedef const NcclTable *(*NcclTableGetter)(void);

#endif
