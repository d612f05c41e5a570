/* runtime/comm_internal.h — what the two halves of the MPI implementation of runtime/comm.h
 * share: the structs behind Comm and CommRequest, the MPI check and the polled wait.
 * comm_mpi.c holds set-up, counters and collectives; comm_messages.c send/recv. Nothing
 * outside runtime/comm_*.c includes this file.
 */
#ifndef FATHOM_RUNTIME_COMM_INTERNAL_H
#define FATHOM_RUNTIME_COMM_INTERNAL_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include "runtime/comm.h"

/* Every MPI call: on failure, file:line, the call and MPI's own message; exit 5. Errors come
 * back as codes because comm_init sets MPI_ERRORS_RETURN on the world (split communicators
 * inherit it). */
#define MPI_CHECK(call) comm_mpi_check((call), #call, __FILE__, __LINE__)

void comm_mpi_check(int code, const char *expression, const char *file, int line);

/* A buffered message to oneself on a 1-rank communicator, waiting for its recv. */
typedef struct LocalMessage {
    int tag;
    size_t bytes;
    void *data;
    struct LocalMessage *next;
} LocalMessage;

struct Comm {
    MPI_Comm handle;            /* MPI_COMM_NULL for a communicator MPI never sees */
    MPI_Comm collectives;       /* a duplicate of handle: the collectives' messages, apart
                                   from the caller's tags */
    int rank, size;
    LocalMessage *messages;     /* size 1 only: sends not yet received, oldest first */
    CommRequest *waiting_recvs; /* size 1 only: recvs not yet matched, oldest first */
};

struct CommRequest {
    MPI_Request handle;         /* MPI_REQUEST_NULL for a local (1-rank) request */
    Comm *comm;
    void *buffer;
    size_t bytes;
    int peer, tag;
    CommKind kind;
    bool is_recv;
    bool local_done;            /* a local request: matched and copied */
    CommRequest *next_waiting;
};

/* Writes what a waited-on operation is ("recv of 4096 bytes from rank 0 (tag 7)"); called
 * only when the deadline has passed, so a wait costs no formatting. */
typedef void (*CommDescribe)(const void *context, char *text, size_t capacity);
/* Polls an MPI request until it completes or parallel.timeout_s passes (then exit 5 with
 * "<operation> did not complete within parallel.timeout_s = ..."). */
void comm_poll(MPI_Request *request, MPI_Status *status, CommDescribe describe,
               const void *context);
/* The monotonic clock in seconds, and a pause between polls that leaves the CPU to the
 * rank that must progress (spin, then yield, then 50 us sleeps; polls counted from 0 at a
 * wait's start, started = its start time). */
double comm_now_seconds(void);
void comm_poll_pause(long polls, double started, double now);

/* The roll call (comm_rollcall.c): set up with the world, answered from every poll loop,
 * and asked past a deadline: text names the world ranks that did not answer. */
void comm_rollcall_init(void);
void comm_rollcall_free(void);
void comm_rollcall_answer(void);
void comm_rollcall_silent(char *text, size_t capacity);

/* The ranks of this host that are gone (comm_neighbours.c): every rank's (host, pid),
 * gathered once by comm_init; then, from any thread and without MPI, "rank 1 (pid 4242)
 * has exited; rank 3 (pid 4250) is stopped" for those of this host whose process has
 * exited or is stopped. Returns how many it named. */
void comm_neighbours_init(MPI_Comm world, int size);
void comm_neighbours_free(void);
int comm_neighbours_describe(char *text, size_t capacity);

/* The world rank of a communicator's rank: what messages name. */
int comm_world_rank_of(const Comm *comm, int rank);
/* bytes as an MPI int count, or exit 5 naming the operation. */
int comm_mpi_count(size_t bytes, const char *operation);

#endif
