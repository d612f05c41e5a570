/* runtime/device_comm.c — see device_comm.h. The operations of a group are queued here and
 * run at device_comm_group_end by the method chosen at create:
 *   local        a group of one (not forced through NCCL): backend copies on the compute
 *                stream;
 *   mpi          comm.h on the backend's host memory, in order, before group_end returns;
 *   host-staged  download, comm.h, upload, in order, before group_end returns;
 *   nccl         one start() of the CUDA module's NCCL table (runtime/nccl_table.h); the
 *                work is waited for on the compute stream by device_comm_work_wait.
 * Byte counters: comm.h books the mpi and host-staged bytes itself; nccl's are booked here
 * when the group starts, by the same rule ((n-1) * count_per_rank * element size for both
 * collectives); a group of one moves nothing.
 * Timing (device_comm.h): a synchronous group is marked on the compute stream around its
 * run at group_end; an nccl group on the communication stream around the group, and on the
 * compute stream around the wait at device_comm_work_wait.
 */
#include "runtime/device_comm.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cuda_module.h"
#include "runtime/device_comm_internal.h"
#include "runtime/error.h"
#include "runtime/nccl_table.h"

/* Synchronous work is complete when group_end returns: one shared, never freed marker. An
 * nccl work holds the module's work and comes back to its DeviceComm when waited for. */
struct DeviceCommWork {
    DeviceComm *comm;
    NcclWork *nccl;
    int timed;          /* its timing slot: exposed is marked at the wait */
    DeviceCommWork *next_spare;
};
static DeviceCommWork completed_work;

/* What this rank reports to the choice (device_comm_choose). */
static DeviceCommRank rank_report(void)
{
    DeviceCommRank mine;
    memset(&mine, 0, sizeof mine);
    mine.world_rank = comm_rank(comm_world());
    if (gethostname(mine.host, sizeof mine.host - 1) != 0)
        snprintf(mine.host, sizeof mine.host, "unknown");
    char bus_id[sizeof mine.bus_id + 64]; /* room for the reason when there is none */
    if (cuda_module_device_bus_id(-1, bus_id, sizeof bus_id) &&
        strlen(bus_id) < sizeof mine.bus_id)
        memcpy(mine.bus_id, bus_id, strlen(bus_id) + 1);
    return mine;
}

/* nccl: rank 0 of the group makes the id, the group's MPI communicator carries it. */
static void create_communicator(DeviceComm *comm, const DeviceCommRank *ranks, int n)
{
    char name[160];
    device_comm_describe_group(ranks, n, name, sizeof name);
    unsigned char id[NCCL_TABLE_ID_BYTES];
    memset(id, 0, sizeof id);
    if (comm_rank(comm->group) == 0)
        comm->nccl->unique_id(id);
    comm_broadcast(comm->group, id, sizeof id, COMM_BYTE, 0, COMM_KIND_OTHER);
    comm->communicator =
        comm->nccl->create(id, n, comm_rank(comm->group), comm_timeout(), name);
}

DeviceComm *device_comm_create(Comm *group, const Backend *backend)
{
    DeviceComm *comm = xcalloc(1, sizeof *comm);
    comm->group = group;
    comm->backend = backend;
    const int n = comm_size(group);
    const bool device_memory = backend != backend_cpu();
    DeviceCommRank *ranks = xcalloc((size_t)n, sizeof *ranks);
    char nccl_missing[256] = "";
    if (device_memory) {
        DeviceCommRank mine = rank_report();
        comm_allgather(group, &mine, ranks, sizeof mine, COMM_BYTE, COMM_KIND_OTHER);
        comm->nccl = cuda_module_nccl(nccl_missing, sizeof nccl_missing);
    } else {
        ranks[0].world_rank = comm_rank(comm_world());
    }
    comm->method = device_comm_choose(ranks, n, device_memory,
                                      comm->nccl ? NULL : nccl_missing,
                                      getenv("FATHOM_DEVICE_COMM"), comm->reason,
                                      sizeof comm->reason);
    const char *forced = getenv("FATHOM_DEVICE_COMM");
    const bool forced_nccl = device_memory && forced && !strcmp(forced, "nccl");
    comm->local = n == 1 && !forced_nccl;
    if (comm->method == DEVICE_COMM_NCCL && !comm->local)
        create_communicator(comm, ranks, n);
    free(ranks);
    return comm;
}

void device_comm_destroy(DeviceComm *comm)
{
    if (!comm)
        return;
    device_comm_hops_destroy(comm);
    if (comm->communicator)
        comm->nccl->destroy(comm->communicator);
    while (comm->spare_works) {
        DeviceCommWork *next = comm->spare_works->next_spare;
        free(comm->spare_works);
        comm->spare_works = next;
    }
    free(comm->queued);
    free(comm->started);
    free(comm->host_send);
    free(comm->host_recv);
    free(comm);
}

const char *device_comm_method(const DeviceComm *comm)
{
    switch (comm->method) {
    case DEVICE_COMM_MPI: return "mpi";
    case DEVICE_COMM_NCCL: return "nccl";
    case DEVICE_COMM_HOST_STAGED: return "host-staged";
    }
    return "unknown";
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
        comm->started = xrealloc(comm->started, (size_t)comm->capacity * sizeof *comm->started);
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
    if (type == COMM_BYTE)
        fatal(EXIT_COMM, "device_comm_reduce_scatter_sum of bytes: bytes are not summable");
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

/* One operation of a synchronous method (local, mpi, host-staged). */
static void run(DeviceComm *comm, const Operation *operation)
{
    const size_t n = (size_t)comm_size(comm->group);
    const size_t block = operation->count_per_rank * comm_type_size(operation->type);
    const bool gather = operation->kind == OPERATION_ALLGATHER;
    if (comm->local) { /* one rank: its block is the whole result */
        comm->backend->copy(operation->recv, operation->send, block);
        return;
    }
    if (comm->method == DEVICE_COMM_MPI) {
        if (gather)
            comm_allgather(comm->group, operation->send, operation->recv,
                           operation->count_per_rank, operation->type, operation->counter);
        else
            comm_reduce_scatter_sum(comm->group, operation->send, operation->recv,
                                    operation->count_per_rank, operation->type,
                                    operation->counter);
        return;
    }
    const size_t send_bytes = gather ? block : n * block;
    const size_t recv_bytes = gather ? n * block : block;
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

/* nccl: the queue as one start() of the module; bytes booked by comm.h's rule. */
static DeviceCommWork *start_nccl(DeviceComm *comm)
{
    const uint64_t others = (uint64_t)comm_size(comm->group) - 1;
    for (int i = 0; i < comm->n_queued; i++) {
        const Operation *operation = &comm->queued[i];
        comm->started[i] = (NcclOperation){
            .kind = operation->kind == OPERATION_ALLGATHER ? NCCL_OPERATION_ALLGATHER
                                                           : NCCL_OPERATION_REDUCE_SCATTER_SUM,
            .send = operation->send,
            .recv = operation->recv,
            .count = operation->count_per_rank,
            .type = operation->type,
            .peer = -1,
        };
        comm_count(operation->counter,
                   others * operation->count_per_rank * comm_type_size(operation->type));
    }
    DeviceCommWork *work = comm->spare_works;
    if (work)
        comm->spare_works = work->next_spare;
    else
        work = xcalloc(1, sizeof *work);
    work->comm = comm;
    work->timed = device_comm_timing_open(comm->backend, comm->queued[0].counter);
    BackendEvent *begin, *end;
    device_comm_timing_stream_marks(work->timed, &begin, &end);
    work->nccl = comm->nccl->start(comm->communicator, comm->started, comm->n_queued,
                                   comm_timeout(), begin, end);
    return work;
}

DeviceCommWork *device_comm_group_end(DeviceComm *comm)
{
    if (comm->depth == 0)
        fatal(EXIT_COMM, "device_comm_group_end without device_comm_group_begin");
    if (--comm->depth > 0 || comm->n_queued == 0)
        return &completed_work;
    DeviceCommWork *work = &completed_work;
    if (comm->communicator) {
        work = start_nccl(comm);
    } else {
        const int timed = device_comm_timing_open(comm->backend, comm->queued[0].counter);
        device_comm_timing_mark_compute(timed);
        for (int i = 0; i < comm->n_queued; i++)
            run(comm, &comm->queued[i]);
        device_comm_timing_mark_compute(timed);
        device_comm_timing_close(timed);
    }
    comm->n_queued = 0;
    return work;
}

void device_comm_work_wait(DeviceCommWork *work)
{
    if (work == &completed_work)
        return; /* synchronous methods: complete at group_end */
    DeviceComm *comm = work->comm;
    device_comm_timing_mark_compute(work->timed);
    comm->backend->event_wait(comm->nccl->work_event(work->nccl));
    device_comm_timing_mark_compute(work->timed);
    device_comm_timing_close(work->timed);
    comm->nccl->work_release(work->nccl);
    work->nccl = NULL;
    work->next_spare = comm->spare_works;
    comm->spare_works = work;
}
