/* runtime/comm_messages.c — send/recv of runtime/comm.h, and the group bracket.
 *
 * Between ranks: MPI_Isend / MPI_Irecv of bytes, waited on by comm_poll (the deadline). On a
 * 1-rank communicator MPI is never called: a send to oneself is matched in the process with
 * the oldest recv of its tag, or buffered until one is posted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm_internal.h"
#include "runtime/error.h"

/* comm_group_begin/end nesting, process-wide as NCCL's group is. */
static int comm_group_depth;

static CommRequest *comm_request_new(Comm *comm, void *buffer, size_t bytes, int peer, int tag,
                                     CommKind kind, bool is_recv)
{
    const char *operation = is_recv ? "recv" : "send";
    if (peer < 0 || peer >= comm->size)
        fatal(EXIT_COMM, "%s with rank %d on a %d-rank communicator", operation, peer,
              comm->size);
    if (tag < 0 || tag > COMM_TAG_MAX)
        fatal(EXIT_COMM, "%s tag %d outside 0..%d", operation, tag, COMM_TAG_MAX);
    CommRequest *request = xcalloc(1, sizeof *request);
    *request = (CommRequest){.handle = MPI_REQUEST_NULL, .comm = comm, .buffer = buffer,
                             .bytes = bytes, .peer = peer, .tag = tag, .kind = kind,
                             .is_recv = is_recv};
    return request;
}

/* A 1-rank communicator: a send finds the oldest waiting recv of its tag, or is buffered
 * (so a send to oneself always completes, as a small MPI send would). */
static void comm_local_send(Comm *comm, CommRequest *send)
{
    CommRequest **link = &comm->waiting_recvs;
    while (*link && (*link)->tag != send->tag)
        link = &(*link)->next_waiting;
    if (*link) {
        CommRequest *recv = *link;
        if (send->bytes > recv->bytes)
            fatal(EXIT_COMM, "recv of %zu bytes from rank 0 (tag %d) got a %zu-byte message",
                  recv->bytes, recv->tag, send->bytes);
        memcpy(recv->buffer, send->buffer, send->bytes);
        recv->local_done = true;
        comm_count(recv->kind, send->bytes);
        *link = recv->next_waiting;
    } else {
        LocalMessage *message = xcalloc(1, sizeof *message);
        *message = (LocalMessage){.tag = send->tag, .bytes = send->bytes,
                                  .data = xmalloc(send->bytes)};
        memcpy(message->data, send->buffer, send->bytes);
        LocalMessage **tail = &comm->messages;
        while (*tail)
            tail = &(*tail)->next;
        *tail = message;
    }
    send->local_done = true;
}

static void comm_local_recv(Comm *comm, CommRequest *recv)
{
    LocalMessage **link = &comm->messages;
    while (*link && (*link)->tag != recv->tag)
        link = &(*link)->next;
    if (*link) {
        LocalMessage *message = *link;
        if (message->bytes > recv->bytes)
            fatal(EXIT_COMM, "recv of %zu bytes from rank 0 (tag %d) got a %zu-byte message",
                  recv->bytes, recv->tag, message->bytes);
        memcpy(recv->buffer, message->data, message->bytes);
        recv->local_done = true;
        comm_count(recv->kind, message->bytes);
        *link = message->next;
        free(message->data);
        free(message);
        return;
    }
    CommRequest **tail = &comm->waiting_recvs;
    while (*tail)
        tail = &(*tail)->next_waiting;
    *tail = recv;
}

CommRequest *comm_send_start(Comm *comm, const void *buffer, size_t bytes, int peer, int tag,
                             CommKind kind)
{
    CommRequest *request = comm_request_new(comm, (void *)buffer, bytes, peer, tag, kind, false);
    comm_count(kind, bytes);
    if (comm->size == 1) {
        comm_local_send(comm, request);
        return request;
    }
    MPI_CHECK(MPI_Isend(buffer, comm_mpi_count(bytes, "send"), MPI_BYTE, peer, tag,
                        comm->handle, &request->handle));
    return request;
}

CommRequest *comm_recv_start(Comm *comm, void *buffer, size_t bytes, int peer, int tag,
                             CommKind kind)
{
    CommRequest *request = comm_request_new(comm, buffer, bytes, peer, tag, kind, true);
    if (comm->size == 1) {
        comm_local_recv(comm, request);
        return request;
    }
    MPI_CHECK(MPI_Irecv(buffer, comm_mpi_count(bytes, "recv"), MPI_BYTE, peer, tag,
                        comm->handle, &request->handle));
    return request;
}

static void comm_describe_request(const void *context, char *text, size_t capacity)
{
    const CommRequest *request = context;
    const int peer = comm_world_rank_of(request->comm, request->peer);
    snprintf(text, capacity, "%s of %zu bytes %s rank %d (tag %d)",
             request->is_recv ? "recv" : "send", request->bytes,
             request->is_recv ? "from" : "to", peer, request->tag);
}

static void comm_refuse_inside_group(const CommRequest *request, const char *call)
{
    if (comm_group_depth == 0)
        return;
    char operation[160];
    comm_describe_request(request, operation, sizeof operation);
    fatal(EXIT_COMM, "%s on the %s inside comm_group_begin/end: a grouped call starts only "
                     "at comm_group_end on NCCL", call, operation);
}

/* A completed MPI recv books the bytes that arrived. */
static void comm_finish_request(CommRequest *request, const MPI_Status *status)
{
    if (request->is_recv && status) {
        int received = 0;
        MPI_CHECK(MPI_Get_count(status, MPI_BYTE, &received));
        comm_count(request->kind, (uint64_t)received);
    }
    free(request);
}

void comm_wait(CommRequest *request)
{
    comm_refuse_inside_group(request, "comm_wait");
    if (request->comm->size == 1) {
        if (!request->local_done) {
            char operation[160];
            comm_describe_request(request, operation, sizeof operation);
            fatal(EXIT_COMM, "%s can never complete: no send of that tag on a 1-rank "
                             "communicator", operation);
        }
        free(request);
        return;
    }
    MPI_Status status;
    comm_poll(&request->handle, &status, comm_describe_request, request);
    comm_finish_request(request, request->is_recv ? &status : NULL);
}

bool comm_test(CommRequest *request)
{
    comm_refuse_inside_group(request, "comm_test");
    if (request->comm->size == 1) {
        if (!request->local_done)
            return false;
        free(request);
        return true;
    }
    int done = 0;
    MPI_Status status;
    MPI_CHECK(MPI_Test(&request->handle, &done, &status));
    if (!done)
        return false;
    comm_finish_request(request, request->is_recv ? &status : NULL);
    return true;
}

void comm_group_begin(Comm *comm)
{
    comm_group_depth++;
}

void comm_group_end(Comm *comm)
{
    if (comm_group_depth == 0)
        fatal(EXIT_COMM, "comm_group_end without comm_group_begin");
    comm_group_depth--;
}
