/* runtime/comm_collectives.c — the collectives of runtime/comm.h over MPI, on host memory.
 *
 * Every collective is one or two exchanges: each rank posts a receive from every peer and
 * a send to every peer (point-to-point, on the communicator's duplicate so that they never
 * meet the caller's tags), then polls them all against the deadline. MPI never reduces
 * anything: sums are added here in rank order (comm_reduce.c). Exchanging peer by peer,
 * rather than through MPI's own collectives, is what lets a rank that waits too long say
 * WHICH peers sent nothing: a dead or stopped rank is named in the message (DESIGN 3). The
 * groups are small (a stage's dp ranks, a pipeline), so n - 1 messages a rank cost little.
 * A 1-rank communicator never calls MPI: its collectives are copies.
 */
#include "runtime/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm_internal.h"
#include "runtime/comm_reduce.h"
#include "runtime/error.h"

/* Every collective message carries this tag on the duplicate communicator; messages
 * between two ranks keep their order, and every rank calls the collectives in one order. */
enum { COLLECTIVE_TAG = 1 };
/* A block size meaning "no message with this peer" (a broadcast's non-roots send none). */
#define NO_MESSAGE ((size_t)-1)

/* One exchange: send_blocks[r] (send_bytes[r]) goes to rank r and recv_blocks[r]
 * (recv_bytes[r]) comes from it, for every r; this rank's own block is copied when both
 * its pointers are given. `name` and `bytes` describe the collective in messages. */
typedef struct {
    const void *const *send_blocks;
    const size_t *send_bytes;
    void *const *recv_blocks;
    const size_t *recv_bytes;
} Exchange;

/* Past the deadline: name the peers whose message has not arrived. */
static void exchange_timeout(Comm *comm, const char *name, size_t bytes,
                             const MPI_Request *recvs, const int *peers, int n_recvs)
{
    char missing[512] = "";
    size_t used = 0;
    int n_missing = 0;
    for (int i = 0; i < n_recvs; i++) {
        if (recvs[i] == MPI_REQUEST_NULL)
            continue;
        used += (size_t)snprintf(missing + used, used < sizeof missing ? sizeof missing - used : 0,
                                 "%s%d", n_missing++ ? ", " : "",
                                 comm_world_rank_of(comm, peers[i]));
        if (used >= sizeof missing)
            break;
    }
    char silent[512];
    comm_rollcall_silent(silent, sizeof silent);
    fatal(EXIT_COMM, "%s of %zu bytes on a %d-rank communicator did not complete within "
          "parallel.timeout_s = %g s: nothing arrived from rank%s %s; %s", name, bytes,
          comm->size, comm_timeout(), n_missing == 1 ? "" : "s",
          n_missing ? missing : "(none: the sends are stuck)", silent);
}

static void exchange_run(Comm *comm, const Exchange *exchange, const char *name, size_t bytes)
{
    const int n = comm->size, me = comm->rank;
    MPI_Request *requests = xmalloc(2 * (size_t)n * sizeof *requests);
    int *peers = xmalloc((size_t)n * sizeof *peers);
    int n_recvs = 0, n_requests = 0;
    for (int r = 0; r < n; r++) {
        if (r == me || exchange->recv_bytes[r] == NO_MESSAGE)
            continue;
        peers[n_recvs] = r;
        MPI_CHECK(MPI_Irecv(exchange->recv_blocks[r],
                            comm_mpi_count(exchange->recv_bytes[r], name), MPI_BYTE, r,
                            COLLECTIVE_TAG, comm->collectives, &requests[n_recvs]));
        n_recvs++;
    }
    n_requests = n_recvs;
    for (int r = 0; r < n; r++) {
        if (r == me || exchange->send_bytes[r] == NO_MESSAGE)
            continue;
        MPI_CHECK(MPI_Isend(exchange->send_blocks[r],
                            comm_mpi_count(exchange->send_bytes[r], name), MPI_BYTE, r,
                            COLLECTIVE_TAG, comm->collectives, &requests[n_requests++]));
    }
    if (exchange->send_blocks[me] && exchange->recv_blocks[me] &&
        exchange->send_bytes[me] != NO_MESSAGE && exchange->send_bytes[me] > 0)
        memmove(exchange->recv_blocks[me], exchange->send_blocks[me], exchange->send_bytes[me]);

    const double start = comm_now_seconds(), deadline = start + comm_timeout();
    for (long polls = 0;; polls++) {
        int done = 0;
        MPI_CHECK(MPI_Testall(n_requests, requests, &done, MPI_STATUSES_IGNORE));
        if (done)
            break;
        const double now = comm_now_seconds();
        if (now > deadline)
            exchange_timeout(comm, name, bytes, requests, peers, n_recvs);
        comm_poll_pause(polls, start, now);
    }
    free(requests);
    free(peers);
}

/* Per-peer arrays of one exchange, in one allocation. */
typedef struct {
    const void **send_blocks;
    void **recv_blocks;
    size_t *send_bytes, *recv_bytes;
} Blocks;

static Blocks blocks_create(int n)
{
    Blocks blocks;
    blocks.send_blocks = xcalloc((size_t)n, sizeof *blocks.send_blocks);
    blocks.recv_blocks = xcalloc((size_t)n, sizeof *blocks.recv_blocks);
    blocks.send_bytes = xcalloc((size_t)n, sizeof *blocks.send_bytes);
    blocks.recv_bytes = xcalloc((size_t)n, sizeof *blocks.recv_bytes);
    return blocks;
}

static void blocks_run(Comm *comm, const Blocks *blocks, const char *name, size_t bytes)
{
    const Exchange exchange = {(const void *const *)blocks->send_blocks, blocks->send_bytes,
                               (void *const *)blocks->recv_blocks, blocks->recv_bytes};
    exchange_run(comm, &exchange, name, bytes);
}

static void blocks_free(Blocks *blocks)
{
    free(blocks->send_blocks);
    free(blocks->recv_blocks);
    free(blocks->send_bytes);
    free(blocks->recv_bytes);
}

void comm_allgather(Comm *comm, const void *send, void *recv, size_t count_per_rank,
                    CommType type, CommKind kind)
{
    const size_t bytes = count_per_rank * comm_type_size(type);
    if (comm->size == 1) {
        memmove(recv, send, bytes);
        return;
    }
    Blocks blocks = blocks_create(comm->size);
    for (int r = 0; r < comm->size; r++) {
        blocks.send_blocks[r] = send;
        blocks.send_bytes[r] = bytes;
        blocks.recv_blocks[r] = (char *)recv + (size_t)r * bytes;
        blocks.recv_bytes[r] = bytes;
    }
    blocks_run(comm, &blocks, "allgather", bytes);
    blocks_free(&blocks);
    comm_count(kind, (uint64_t)(comm->size - 1) * bytes);
}

void comm_reduce_scatter_sum(Comm *comm, const void *send, void *recv, size_t count_per_rank,
                             CommType type, CommKind kind)
{
    const size_t bytes = count_per_rank * comm_type_size(type);
    if (comm->size == 1) {
        memmove(recv, send, bytes);
        return;
    }
    /* terms[r] = rank r's block number comm->rank: all of this rank's terms, in rank order */
    char *terms = xmalloc(bytes * (size_t)comm->size + 1);
    Blocks blocks = blocks_create(comm->size);
    for (int r = 0; r < comm->size; r++) {
        blocks.send_blocks[r] = (const char *)send + (size_t)r * bytes;
        blocks.send_bytes[r] = bytes;
        blocks.recv_blocks[r] = terms + (size_t)r * bytes;
        blocks.recv_bytes[r] = bytes;
    }
    blocks_run(comm, &blocks, "reduce_scatter_sum", bytes);
    blocks_free(&blocks);
    comm_reduce_blocks(terms, comm->size, count_per_rank, type, COMM_REDUCE_SUM, recv);
    free(terms);
    comm_count(kind, (uint64_t)(comm->size - 1) * bytes);
}

/* All-reduce = reduce-scatter of uneven segments, then all-gather of the segments: each
 * rank adds only its segment's terms (in rank order), so every element is summed once and
 * every rank ends with the same bits. Segment r holds count / n elements, one more for the
 * first count % n ranks. */
static void comm_allreduce(Comm *comm, const void *send, void *recv, size_t count,
                           CommType type, CommReduceOp op, CommKind kind, const char *name)
{
    const size_t element = comm_type_size(type);
    if (comm->size == 1) {
        memmove(recv, send, count * element);
        return;
    }
    const int n = comm->size, me = comm->rank;
    size_t *segment_offsets = xmalloc(2 * (size_t)n * sizeof *segment_offsets);
    size_t *segment_bytes = segment_offsets + n;
    size_t offset = 0;
    for (int r = 0; r < n; r++) {
        const size_t segment = count / (size_t)n + ((size_t)r < count % (size_t)n);
        segment_offsets[r] = offset * element;
        segment_bytes[r] = segment * element;
        offset += segment;
    }
    const size_t own = segment_bytes[me];
    char *terms = xmalloc(own * (size_t)n + 1);
    char *reduced = xmalloc(own + 1);
    Blocks blocks = blocks_create(n);
    for (int r = 0; r < n; r++) {
        blocks.send_blocks[r] = (const char *)send + segment_offsets[r];
        blocks.send_bytes[r] = segment_bytes[r];
        blocks.recv_blocks[r] = terms + (size_t)r * own;
        blocks.recv_bytes[r] = own;
    }
    blocks_run(comm, &blocks, name, count * element);
    comm_reduce_blocks(terms, n, own / element, type, op, reduced);
    /* the segments go back to every rank; send may be recv, and it has been read by now */
    for (int r = 0; r < n; r++) {
        blocks.send_blocks[r] = reduced;
        blocks.send_bytes[r] = own;
        blocks.recv_blocks[r] = (char *)recv + segment_offsets[r];
        blocks.recv_bytes[r] = segment_bytes[r];
    }
    blocks_run(comm, &blocks, name, count * element);
    blocks_free(&blocks);
    comm_count(kind, (uint64_t)(count * element - own + (size_t)(n - 1) * own));
    free(reduced);
    free(terms);
    free(segment_offsets);
}

void comm_allreduce_sum(Comm *comm, const void *send, void *recv, size_t count, CommType type,
                        CommKind kind)
{
    comm_allreduce(comm, send, recv, count, type, COMM_REDUCE_SUM, kind, "allreduce_sum");
}

void comm_allreduce_max(Comm *comm, const void *send, void *recv, size_t count, CommType type,
                        CommKind kind)
{
    comm_allreduce(comm, send, recv, count, type, COMM_REDUCE_MAX, kind, "allreduce_max");
}

void comm_broadcast(Comm *comm, void *buffer, size_t count, CommType type, int root,
                    CommKind kind)
{
    const size_t bytes = count * comm_type_size(type);
    if (root < 0 || root >= comm->size)
        fatal(EXIT_COMM, "broadcast from rank %d on a %d-rank communicator", root, comm->size);
    if (comm->size == 1)
        return;
    Blocks blocks = blocks_create(comm->size);
    for (int r = 0; r < comm->size; r++) {
        const bool root_sends = comm->rank == root, from_root = r == root;
        blocks.send_blocks[r] = buffer;
        blocks.send_bytes[r] = root_sends ? bytes : NO_MESSAGE;
        blocks.recv_blocks[r] = buffer;
        blocks.recv_bytes[r] = from_root && !root_sends ? bytes : NO_MESSAGE;
    }
    blocks.send_blocks[comm->rank] = NULL; /* nothing to copy to itself */
    blocks_run(comm, &blocks, "broadcast", bytes);
    blocks_free(&blocks);
    if (comm->rank == root)
        comm_count(kind, (uint64_t)(comm->size - 1) * bytes);
}

void comm_barrier(Comm *comm)
{
    if (comm->size == 1)
        return;
    Blocks blocks = blocks_create(comm->size);
    char nothing = 0;
    for (int r = 0; r < comm->size; r++) {
        blocks.send_blocks[r] = &nothing;
        blocks.recv_blocks[r] = &nothing;
    }
    blocks.send_blocks[comm->rank] = NULL;
    blocks_run(comm, &blocks, "barrier", 0);
    blocks_free(&blocks);
}
