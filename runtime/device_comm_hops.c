/* runtime/device_comm_hops.c — point to point on a DeviceComm (device_comm.h, "point to
 * point"): the pipeline's hops.
 *
 * By method:
 *   a group of one  send copies into a held buffer and queues it; recv takes the queue's
 *                   head and copies it out (forced onto NCCL: one group of the held send and
 *                   the receive, waited for on the compute stream);
 *   nccl            send copies into a held buffer on the compute stream and starts an
 *                   ncclSend of it; the buffer is busy until the work has ended (work_done).
 *                   recv starts an ncclRecv into the caller's buffer; the compute stream
 *                   waits for it;
 *   mpi,            send downloads into a held host buffer and starts an MPI send of it
 *   host-staged     (tag: the sequence number); recv waits for the MPI message in a host
 *                   buffer and uploads it.
 * The compute stream orders a held buffer's reuse: its copy-in is queued after everything
 * that read it before (the NCCL send is ordered after the compute stream's ops when it
 * starts, and a group of one copies out on the compute stream itself).
 * Timing (device_comm.h): every send and receive is a slot of its own; the synchronous
 * paths are marked on the compute stream around their copies and MPI calls, an NCCL send
 * on the communication stream only, an NCCL receive on both.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/device_comm_internal.h"
#include "runtime/error.h"

static bool held_in_backend_memory(const DeviceComm *comm)
{
    return comm->local || comm->communicator;
}

/* Marks the held buffer free if its message has left; never waits. */
static void held_poll(DeviceComm *comm, HeldBuffer *held)
{
    if (!held->busy)
        return;
    if (held->work) {
        if (!comm->nccl->work_done(held->work))
            return;
        comm->nccl->work_release(held->work);
        held->work = NULL;
    } else if (held->request) {
        if (!comm_test(held->request))
            return;
        held->request = NULL;
    } else {
        return; /* a group of one: waiting in the queue for its receive */
    }
    held->busy = false;
}

/* A free held buffer of at least `bytes`, busy from now on: a free one that is large
 * enough, else a new one. */
static int held_take(DeviceComm *comm, size_t bytes)
{
    DeviceCommHops *hops = &comm->hops;
    int chosen = -1;
    for (int i = 0; i < hops->n_held; i++) {
        held_poll(comm, &hops->held[i]);
        if (!hops->held[i].busy && hops->held[i].capacity >= bytes &&
            (chosen < 0 || hops->held[i].capacity < hops->held[chosen].capacity))
            chosen = i;
    }
    if (chosen < 0) {
        hops->held = xrealloc(hops->held, (size_t)(hops->n_held + 1) * sizeof *hops->held);
        chosen = hops->n_held++;
        HeldBuffer *held = &hops->held[chosen];
        memset(held, 0, sizeof *held);
        held->capacity = bytes;
        held->memory = held_in_backend_memory(comm) ? comm->backend->alloc(bytes + 1)
                                                    : xmalloc(bytes + 1);
    }
    hops->held[chosen].busy = true;
    hops->held[chosen].bytes = bytes;
    return chosen;
}

/* Starts one NCCL group, timed in slot `timed` on the communication stream. */
static NcclWork *start_one(DeviceComm *comm, NcclOperation *operations, int count, int timed)
{
    BackendEvent *begin, *end;
    device_comm_timing_stream_marks(timed, &begin, &end);
    return comm->nccl->start(comm->communicator, operations, count, comm_timeout(), begin,
                             end);
}

/* The compute stream waits for an NCCL receive; the wait is its exposed time. */
static void wait_for_receive(DeviceComm *comm, NcclWork *work, int timed)
{
    device_comm_timing_mark_compute(timed);
    comm->backend->event_wait(comm->nccl->work_event(work));
    device_comm_timing_mark_compute(timed);
    comm->nccl->work_release(work);
}

static void check_peer(const DeviceComm *comm, int peer, const char *operation)
{
    if (peer < 0 || peer >= comm_size(comm->group))
        fatal(EXIT_COMM, "device_comm_%s to group rank %d of a group of %d", operation, peer,
              comm_size(comm->group));
    if (comm->depth > 0)
        fatal(EXIT_COMM, "device_comm_%s inside device_comm_group_begin / end", operation);
}

static void ensure_counters(DeviceComm *comm)
{
    if (!comm->hops.sent) {
        comm->hops.sent = xcalloc((size_t)comm_size(comm->group), sizeof *comm->hops.sent);
        comm->hops.received = xcalloc((size_t)comm_size(comm->group),
                                      sizeof *comm->hops.received);
    }
}

static int sequence_tag(uint32_t *counter)
{
    return (int)((*counter)++ % (COMM_TAG_MAX + 1u));
}

void device_comm_send(DeviceComm *comm, const void *send, size_t bytes, int peer,
                      CommKind kind)
{
    check_peer(comm, peer, "send");
    ensure_counters(comm);
    DeviceCommHops *hops = &comm->hops;
    const int index = held_take(comm, bytes);
    HeldBuffer *held = &hops->held[index];
    const int timed = device_comm_timing_open(comm->backend, kind);
    if (comm_size(comm->group) == 1) {
        device_comm_timing_mark_compute(timed);
        comm->backend->copy(held->memory, send, bytes);
        device_comm_timing_mark_compute(timed);
        device_comm_timing_close(timed);
        hops->queue = xrealloc(hops->queue, (size_t)(hops->queue_head + hops->queue_length + 1) *
                                                sizeof *hops->queue);
        hops->queue[hops->queue_head + hops->queue_length++] = index;
        held->request = NULL;
        held->work = NULL;
        hops->sent[peer]++;
        comm_count(kind, bytes);
        return;
    }
    if (comm->communicator) {
        comm->backend->copy(held->memory, send, bytes);
        NcclOperation operation = {NCCL_OPERATION_SEND, held->memory, NULL, bytes, COMM_BYTE,
                                   peer};
        held->work = start_one(comm, &operation, 1, timed);
        device_comm_timing_close(timed); /* nothing waits for a send: nothing exposed */
        hops->sent[peer]++;
        comm_count(kind, bytes);
        return;
    }
    device_comm_timing_mark_compute(timed);
    comm->backend->download(held->memory, send, bytes);
    held->request = comm_send_start(comm->group, held->memory, bytes, peer,
                                    sequence_tag(&hops->sent[peer]), kind);
    device_comm_timing_mark_compute(timed);
    device_comm_timing_close(timed);
}

/* A group of one: the oldest queued message, which must be `bytes` long. */
static int queue_pop(DeviceComm *comm, size_t bytes)
{
    DeviceCommHops *hops = &comm->hops;
    if (hops->queue_length == 0)
        fatal(EXIT_COMM, "device_comm_recv of %zu bytes from itself, with no message sent "
              "(the caller's sends and receives disagree)", bytes);
    const int index = hops->queue[hops->queue_head++];
    if (--hops->queue_length == 0)
        hops->queue_head = 0;
    if (hops->held[index].bytes != bytes)
        fatal(EXIT_COMM, "device_comm_recv of %zu bytes from itself got a %zu-byte message "
              "(the caller's sends and receives disagree)", bytes, hops->held[index].bytes);
    return index;
}

void device_comm_recv(DeviceComm *comm, void *recv, size_t bytes, int peer, CommKind kind)
{
    check_peer(comm, peer, "recv");
    ensure_counters(comm);
    DeviceCommHops *hops = &comm->hops;
    const int timed = device_comm_timing_open(comm->backend, kind);
    if (comm_size(comm->group) == 1) {
        HeldBuffer *held = &hops->held[queue_pop(comm, bytes)];
        if (comm->communicator) { /* forced NCCL: the send and its receive as one group */
            NcclOperation operations[2] = {
                {NCCL_OPERATION_SEND, held->memory, NULL, bytes, COMM_BYTE, 0},
                {NCCL_OPERATION_RECV, NULL, recv, bytes, COMM_BYTE, 0},
            };
            wait_for_receive(comm, start_one(comm, operations, 2, timed), timed);
        } else {
            device_comm_timing_mark_compute(timed);
            comm->backend->copy(recv, held->memory, bytes);
            device_comm_timing_mark_compute(timed);
        }
        device_comm_timing_close(timed);
        held->busy = false; /* its reuse is queued after the copy-out on the compute stream */
        hops->received[peer]++;
        comm_count(kind, bytes);
        return;
    }
    if (comm->communicator) {
        NcclOperation operation = {NCCL_OPERATION_RECV, NULL, recv, bytes, COMM_BYTE, peer};
        wait_for_receive(comm, start_one(comm, &operation, 1, timed), timed);
        device_comm_timing_close(timed);
        hops->received[peer]++;
        comm_count(kind, bytes);
        return;
    }
    if (bytes > hops->host_recv_bytes) {
        free(hops->host_recv);
        hops->host_recv = xmalloc(bytes + 1);
        hops->host_recv_bytes = bytes;
    }
    device_comm_timing_mark_compute(timed);
    comm_wait(comm_recv_start(comm->group, hops->host_recv, bytes, peer,
                              sequence_tag(&hops->received[peer]), kind));
    comm->backend->upload(recv, hops->host_recv, bytes);
    device_comm_timing_mark_compute(timed);
    device_comm_timing_close(timed);
}

void device_comm_flush(DeviceComm *comm)
{
    DeviceCommHops *hops = &comm->hops;
    for (int i = 0; i < hops->n_held; i++) {
        HeldBuffer *held = &hops->held[i];
        if (held->request) {
            comm_wait(held->request);
            held->request = NULL;
            held->busy = false;
        }
        /* nccl: the watchdog ends the job at the deadline, so polling cannot hang */
        while (held->work) {
            held_poll(comm, held);
            if (held->work)
                usleep(50);
        }
    }
}

size_t device_comm_held_bytes(const DeviceComm *comm, bool *backend_memory)
{
    size_t bytes = 0;
    for (int i = 0; i < comm->hops.n_held; i++)
        bytes += comm->hops.held[i].capacity;
    if (backend_memory)
        *backend_memory = held_in_backend_memory(comm);
    return bytes;
}

void device_comm_hops_destroy(DeviceComm *comm)
{
    DeviceCommHops *hops = &comm->hops;
    device_comm_flush(comm);
    for (int i = 0; i < hops->n_held; i++) {
        if (held_in_backend_memory(comm))
            comm->backend->release(hops->held[i].memory);
        else
            free(hops->held[i].memory);
    }
    free(hops->held);
    free(hops->queue);
    free(hops->sent);
    free(hops->received);
    free(hops->host_recv);
    memset(hops, 0, sizeof *hops);
}
