/* runtime/device_comm.h — collectives on backend memory (DESIGN 3, "Communication").
 *
 * runtime/comm.h moves host memory over MPI. FSDP's gathers and reduce-scatters move the
 * memory of a backend (runtime/backend.h): host memory on the cpu backend, device memory on
 * cuda. A DeviceComm wraps one communicator of comm.h for such buffers, by one of three
 * methods, chosen once, collectively, when it is created:
 *
 *   "mpi"          the backend's memory is host memory (cpu): straight through comm.h.
 *   "nccl"         cuda, and every rank of the group has a GPU of its own: an NCCL
 *                  communicator of the CUDA module, bootstrapped over the group's MPI
 *                  communicator (the unique id is broadcast from rank 0), non-blocking,
 *                  its operations on a communication stream of their own.
 *   "host-staged"  cuda, and some ranks of the group share a GPU (NCCL refuses them:
 *                  "Duplicate GPU detected"), or the CUDA module has no NCCL: download to
 *                  host memory, comm.h over MPI, upload. Correct and slow; what lets one GPU
 *                  run every distributed path.
 * The choice (device_comm_choose below) compares the (host, PCI bus id) of every rank's GPU,
 * gathered over the group. A group of one rank never communicates, whatever the method: its
 * operations are copies on the compute stream.
 *
 * FATHOM_DEVICE_COMM (environment, for tests and diagnosis) forces the cuda method:
 * "host-staged" stages even where NCCL could run; "nccl" takes NCCL even where it should not
 * (ranks sharing a GPU then fail in NCCL's init, exit 5) and runs a group of one through a
 * one-rank NCCL communicator, which is how one GPU tests the NCCL path. Any other value is
 * exit 2. The cpu backend ignores it.
 *
 * Operations are queued between device_comm_group_begin and device_comm_group_end and
 * started together at the end (one NCCL group; on MPI, one after the other). They run
 * after every op queued on the backend's compute stream before group_end (so they read the
 * send buffers those ops wrote, and overwrite recv buffers only once those ops are done
 * with them), and their results are visible to the compute ops queued after
 * device_comm_work_wait. Groups on one DeviceComm run in the order they were started.
 * Between group_end and work_wait the caller must not write a send buffer or touch a recv
 * buffer. On "mpi" and "host-staged" the work is complete when group_end returns; on
 * "nccl" it runs beside the compute stream (on one communication stream per DeviceComm,
 * which keeps the order of its groups), which is how the next unit's gather hides behind
 * this unit's compute.
 *
 * Sums are the fixed-order sums of comm.h on "mpi" and "host-staged" (bitwise repeatable
 * for a layout). NCCL's ring reductions are repeatable for a fixed group and NCCL version.
 *
 * Every host wait has the deadline of comm.h (parallel.timeout_s): a dead or hung peer ends
 * the job with exit 5 naming this rank, the operation and the group; an NCCL communicator
 * is polled for its asynchronous errors and aborted at the deadline, never left to hang.
 * Bytes are booked in comm.h's counters under the kind the caller passes, by comm.h's rule.
 *
 * Point to point (device_comm_send / device_comm_recv below) carries the pipeline's hops by
 * the same method: NCCL's ncclSend / ncclRecv, or MPI messages from host memory.
 *
 * Memory: every buffer is the caller's, in the backend's memory. A DeviceComm holds the
 * host staging buffers it needs (grown to the largest operation, then kept) and the buffers
 * of its sends in flight (below).
 */
#ifndef FATHOM_RUNTIME_DEVICE_COMM_H
#define FATHOM_RUNTIME_DEVICE_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/backend.h"
#include "runtime/comm.h"

typedef struct DeviceComm DeviceComm;
typedef struct DeviceCommWork DeviceCommWork; /* a started group of operations */

/* Collective over `group` (every rank calls it, in the same order for every group). The
 * group must outlive the DeviceComm. */
DeviceComm *device_comm_create(Comm *group, const Backend *backend);
/* Collective as create (an NCCL communicator is finalized with its peers); every work must
 * have been waited for. */
void device_comm_destroy(DeviceComm *comm);

/* The communicator it wraps. */
Comm *device_comm_group(const DeviceComm *comm);

/* "mpi", "nccl" or "host-staged" (above). */
const char *device_comm_method(const DeviceComm *comm);
/* Why that method, for the one line the run prints: "ranks 0 and 1 share GPU
 * 0000:19:00.0", "4 ranks on 4 GPUs". */
const char *device_comm_reason(const DeviceComm *comm);

void device_comm_group_begin(DeviceComm *comm);
/* recv [n * count_per_rank] = every rank's send [count_per_rank], in rank order. */
void device_comm_allgather(DeviceComm *comm, const void *send, void *recv,
                           size_t count_per_rank, CommType type, CommKind kind);
/* send [n * count_per_rank]; recv [count_per_rank] = the sum over ranks of their block
 * number comm_rank (runtime/comm.h). */
void device_comm_reduce_scatter_sum(DeviceComm *comm, const void *send, void *recv,
                                    size_t count_per_rank, CommType type, CommKind kind);
/* Starts the queued operations; returns the work to wait for (never NULL). */
DeviceCommWork *device_comm_group_end(DeviceComm *comm);
/* The compute stream waits for the work (ops queued after this see its results); frees
 * it. On mpi and host-staged the work is already complete. On nccl the host does not wait
 * for the communication itself (the op table's event_wait); the CUDA module's watchdog
 * keeps the deadline until the work has ended (runtime/nccl_table.h). */
void device_comm_work_wait(DeviceCommWork *work);

/* ---- point to point: the pipeline's hops (runtime/device_comm_hops.c) ----
 *
 * Messages from one rank to another are matched in the order they were sent, as NCCL
 * matches them (there are no tags): the k-th receive from a peer gets the k-th message that
 * peer sent on this DeviceComm, and must name the same size (else exit 5). On mpi and
 * host-staged the tag of the MPI message is that sequence number, so a caller whose two
 * sides disagree on the order fails the same way on every method, cpu included.
 *
 * device_comm_send never waits for the receiver. It copies `send`, at its place in the
 * compute stream's order, into a buffer the DeviceComm holds until the message has left
 * it (device memory on nccl and for a group of one; host memory on mpi and host-staged), so
 * the caller may write `send` right after the call and the compute stream never waits for
 * the peer. Held buffers are reused once their message has left; their number reaches the
 * most sends in flight during the first step, then stays (device_comm_held_bytes).
 * device_comm_recv: `recv` holds the message for the compute ops queued after the call. On
 * nccl the host does not wait (the watchdog keeps the deadline); on mpi and host-staged it
 * waits, with the deadline.
 * A group of one rank sends to itself: the message waits in the DeviceComm for its receive,
 * a copy on the compute stream; forced onto NCCL (FATHOM_DEVICE_COMM=nccl), the send and
 * the receive start together as one NCCL group at the receive, which is how one GPU runs
 * NCCL's point-to-point.
 * Bytes are booked under `kind`: a send's when sent, a receive's when received.
 * Neither may be called inside device_comm_group_begin / end. */
void device_comm_send(DeviceComm *comm, const void *send, size_t bytes, int peer,
                      CommKind kind);
void device_comm_recv(DeviceComm *comm, void *recv, size_t bytes, int peer, CommKind kind);
/* Waits, with the deadline, until every send has left its held buffer. */
void device_comm_flush(DeviceComm *comm);
/* The bytes of the held buffers, and whether they are backend (device) memory. */
size_t device_comm_held_bytes(const DeviceComm *comm, bool *backend_memory);

/* ---- timing (runtime/device_comm_timing.c) ----
 *
 * How long the communication of every DeviceComm of the process ran, and how long the
 * compute stream stood still for it, by the kind the caller books its bytes under (a group
 * under its first operation's kind). Process-wide, as comm.h's byte counters are. Off until
 * device_comm_timing_enable(true); a timed operation then records two events on the compute
 * stream around the point where it can hold the stream up, and on nccl two more on the
 * communication stream around the NCCL group:
 *
 *   busy     the communication itself. nccl: the communication stream's time from the
 *            group's start (once the compute it follows has been reached) to its end,
 *            including any wait for a late peer. The synchronous methods (mpi,
 *            host-staged, a group of one): the same as exposed.
 *   exposed  the time the compute stream stood still for it. nccl: from the moment the
 *            compute stream reached its wait for the work to the work's end, zero when
 *            the work ended first (hidden behind compute). A send never holds the stream
 *            up on nccl: its copy into the held buffer is compute. The synchronous
 *            methods: the whole operation, downloads and uploads included.
 * busy - exposed is what overlapped compute. A pipeline receive's times include the wait
 * for the sender to reach its send: the pipeline's bubble shows there.
 *
 * device_comm_timing_collect reads the events of every operation timed since the last
 * collect whose wait has happened (waiting for the device, and for sends to leave) and
 * starts over; an nccl group not yet waited for is read by a later collect. */
typedef struct {
    double busy_ms, exposed_ms;
    int operations; /* groups, sends and receives timed */
} DeviceCommTime;

void device_comm_timing_enable(bool enabled);
bool device_comm_timing_enabled(void);
/* Operations timed and not yet collected (each holds four events until it is). */
int device_comm_timing_pending(void);
/* times[COMM_KIND_COUNT]: what was timed since the last collect, by kind. */
void device_comm_timing_collect(DeviceCommTime *times);

/* ---- the choice of method, a pure function of what the ranks report (tested alone) ---- */

typedef enum { DEVICE_COMM_MPI, DEVICE_COMM_NCCL, DEVICE_COMM_HOST_STAGED } DeviceCommMethod;

/* What each rank of a group reports at device_comm_create. */
typedef struct {
    int world_rank;
    char host[64];
    char bus_id[32]; /* its GPU's PCI bus id ("0000:19:00.0"); "" when it could not tell */
} DeviceCommRank;

/* The method for the group whose rank i reported ranks[i]. device_memory: the backend's
 * memory is device memory (cuda); nccl_missing: why the module has no NCCL, or NULL when it
 * has; forced: FATHOM_DEVICE_COMM (NULL or "" when unset). The reason, for the run's one
 * line, goes into `reason`: "4 ranks on 4 GPUs", "ranks 0 and 1 share GPU 0000:19:00.0",
 * naming world ranks. */
DeviceCommMethod device_comm_choose(const DeviceCommRank *ranks, int n, bool device_memory,
                                    const char *nccl_missing, const char *forced,
                                    char *reason, size_t capacity);
/* "the group of world ranks 0-3" (ranges and lists: "0, 2, 4-5"), for messages. */
void device_comm_describe_group(const DeviceCommRank *ranks, int n, char *text,
                                size_t capacity);

#endif
