/* runtime/comm_mpi.c — runtime/comm.h over MPI, on host memory (DESIGN 3).
 *
 * Set-up, counters, the polled wait and the collectives; send/recv are in comm_messages.c.
 * Collectives run as non-blocking MPI calls whose request is polled against the deadline;
 * data moves as bytes (MPI never reduces anything: sums are added here in rank order,
 * comm_reduce.c). A 1-rank communicator never calls MPI: its collectives are copies.
 */
#include "runtime/comm.h"

#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm_internal.h"
#include "runtime/comm_reduce.h"
#include "runtime/error.h"

static struct {
    bool initialised, mpi_active;
    double timeout_seconds;
    Comm world;
    atomic_uint_least64_t counters[COMM_KIND_COUNT];
} comm_state = {
    .timeout_seconds = 600.0,
    .world = {.handle = MPI_COMM_NULL, .rank = 0, .size = 1},
};

static const char *const comm_kind_names[COMM_KIND_COUNT] = {
    [COMM_KIND_PP_SEND] = "pp_send_bytes",
    [COMM_KIND_PP_RECV] = "pp_recv_bytes",
    [COMM_KIND_PP_SUMMARY] = "pp_summary_bytes",
    [COMM_KIND_PP_SUMMARY_UNCACHED] = "pp_summary_bytes_uncached",
    [COMM_KIND_FSDP_ALLGATHER] = "fsdp_allgather_bytes",
    [COMM_KIND_FSDP_REDUCESCATTER] = "fsdp_reducescatter_bytes",
    [COMM_KIND_ALLREDUCE] = "allreduce_bytes",
    [COMM_KIND_OTHER] = "other_bytes",
};

void comm_mpi_check(int code, const char *expression, const char *file, int line)
{
    if (code == MPI_SUCCESS)
        return;
    char message[MPI_MAX_ERROR_STRING] = "unknown MPI error";
    int length = 0;
    MPI_Error_string(code, message, &length);
    fatal(EXIT_COMM, "%s:%d: MPI call %s failed: %s", file, line, expression, message);
}

/* ---- set-up ------------------------------------------------------------------------- */

/* Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMI / PMIx launchers (srun, hydra) set the
 * others. Without one of them MPI_Init would make a singleton world: slower to start and
 * of no use, so a plain run stays a world of one without MPI. */
static bool comm_launched_by_mpi_launcher(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* fatal()'s hook in a job of several ranks: end every rank, with this exit code. */
static void comm_abort_job(int exit_code)
{
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    exit(exit_code);
}

void comm_init(int *argc, char ***argv)
{
    if (comm_state.initialised)
        return;
    comm_state.initialised = true;
    if (!comm_launched_by_mpi_launcher())
        return;
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    comm_state.mpi_active = true;
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    comm_state.world.handle = MPI_COMM_WORLD;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &comm_state.world.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &comm_state.world.size));
    if (comm_state.world.size > 1) {
        error_set_rank(comm_state.world.rank);
        error_set_abort(comm_abort_job);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        fatal(EXIT_COMM, "MPI provides thread level %d; fathom needs MPI_THREAD_SERIALIZED",
              provided);
}

void comm_finalize(void)
{
    if (!comm_state.mpi_active)
        return;
    error_set_abort(NULL);
    MPI_CHECK(MPI_Finalize());
    comm_state.mpi_active = false;
    comm_state.world.handle = MPI_COMM_NULL;
}

bool comm_mpi_active(void)
{
    return comm_state.mpi_active;
}

Comm *comm_world(void)
{
    return &comm_state.world;
}

int comm_rank(const Comm *comm)
{
    return comm->rank;
}

int comm_size(const Comm *comm)
{
    return comm->size;
}

Comm *comm_split(Comm *parent, int color, int key)
{
    Comm *child = xcalloc(1, sizeof *child);
    child->handle = MPI_COMM_NULL;
    child->size = 1;
    if (parent->size > 1) {
        MPI_CHECK(MPI_Comm_split(parent->handle, color == COMM_NO_GROUP ? MPI_UNDEFINED : color,
                                 key, &child->handle));
        if (child->handle == MPI_COMM_NULL) {
            free(child);
            return NULL;
        }
        MPI_CHECK(MPI_Comm_rank(child->handle, &child->rank));
        MPI_CHECK(MPI_Comm_size(child->handle, &child->size));
    } else if (color == COMM_NO_GROUP) {
        free(child);
        return NULL;
    }
    return child;
}

void comm_free(Comm *comm)
{
    if (!comm || comm == &comm_state.world)
        return;
    if (comm->handle != MPI_COMM_NULL && comm_state.mpi_active)
        MPI_CHECK(MPI_Comm_free(&comm->handle));
    while (comm->messages) {
        LocalMessage *next = comm->messages->next;
        free(comm->messages->data);
        free(comm->messages);
        comm->messages = next;
    }
    free(comm);
}

void comm_set_timeout(double seconds)
{
    if (!(seconds > 0))
        fatal(EXIT_CONFIG, "parallel.timeout_s = %g must be > 0", seconds);
    comm_state.timeout_seconds = seconds;
}

double comm_timeout(void)
{
    return comm_state.timeout_seconds;
}

/* ---- counters ----------------------------------------------------------------------- */

void comm_counters_reset(void)
{
    for (int kind = 0; kind < COMM_KIND_COUNT; kind++)
        atomic_store_explicit(&comm_state.counters[kind], 0, memory_order_relaxed);
}

uint64_t comm_counter(CommKind kind)
{
    return atomic_load_explicit(&comm_state.counters[kind], memory_order_relaxed);
}

void comm_count(CommKind kind, uint64_t bytes)
{
    atomic_fetch_add_explicit(&comm_state.counters[kind], bytes, memory_order_relaxed);
}

const char *comm_kind_name(CommKind kind)
{
    return kind >= 0 && kind < COMM_KIND_COUNT ? comm_kind_names[kind] : "unknown";
}

/* ---- waiting ------------------------------------------------------------------------ */

static double comm_now_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* The world rank of `rank` in comm: what a message should name, since logs and the rank map
 * speak world ranks. */
int comm_world_rank_of(const Comm *comm, int rank)
{
    if (comm->handle == MPI_COMM_NULL || comm->handle == MPI_COMM_WORLD)
        return rank;
    MPI_Group group, world_group;
    int world_rank = rank;
    MPI_CHECK(MPI_Comm_group(comm->handle, &group));
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
    MPI_CHECK(MPI_Group_translate_ranks(group, 1, &rank, world_group, &world_rank));
    MPI_CHECK(MPI_Group_free(&group));
    MPI_CHECK(MPI_Group_free(&world_group));
    return world_rank;
}

/* Polls the request until it completes or the deadline passes; `describe` says what it
 * was, for the message. The first polls spin (latency); after that the rank
 * yields, then sleeps 50 us between polls, so that ranks sharing cores (mpirun
 * --oversubscribe, the tests) leave the CPU to the rank that must make progress. */
void comm_poll(MPI_Request *request, MPI_Status *status, CommDescribe describe,
               const void *context)
{
    const double start = comm_now_seconds();
    const double deadline = start + comm_state.timeout_seconds;
    for (long polls = 0;; polls++) {
        int done = 0;
        MPI_CHECK(MPI_Test(request, &done, status));
        if (done)
            return;
        const double now = comm_now_seconds();
        if (now > deadline) {
            char operation[256];
            describe(context, operation, sizeof operation);
            fatal(EXIT_COMM, "%s did not complete within parallel.timeout_s = %g s", operation,
                  comm_state.timeout_seconds);
        }
        if (polls < 1000)
            continue;
        if (now - start < 0.01) {
            sched_yield();
        } else {
            const struct timespec pause = {.tv_sec = 0, .tv_nsec = 50000};
            nanosleep(&pause, NULL);
        }
    }
}

typedef struct {
    const char *name;
    const Comm *comm;
    size_t bytes;
} CollectiveCall;

static void comm_describe_collective(const void *context, char *text, size_t capacity)
{
    const CollectiveCall *call = context;
    snprintf(text, capacity, "%s of %zu bytes on a %d-rank communicator (this rank is its "
             "rank %d)", call->name, call->bytes, call->comm->size, call->comm->rank);
}

/* A collective's request, with its name and communicator in the message. */
static void comm_poll_collective(MPI_Request *request, const char *name, const Comm *comm,
                                 size_t bytes)
{
    const CollectiveCall call = {.name = name, .comm = comm, .bytes = bytes};
    comm_poll(request, MPI_STATUS_IGNORE, comm_describe_collective, &call);
}

/* MPI counts are int: a larger call must be split by the caller. */
int comm_mpi_count(size_t bytes, const char *operation)
{
    if (bytes > (size_t)INT_MAX)
        fatal(EXIT_COMM, "%s of %zu bytes exceeds MPI's int count (%d bytes); split the call",
              operation, bytes, INT_MAX);
    return (int)bytes;
}

/* ---- collectives -------------------------------------------------------------------- */

void comm_allgather(Comm *comm, const void *send, void *recv, size_t count_per_rank,
                    CommType type, CommKind kind)
{
    const size_t bytes = count_per_rank * comm_type_size(type);
    if (comm->size == 1) {
        memmove(recv, send, bytes);
        return;
    }
    comm_mpi_count(bytes * (size_t)comm->size, "allgather");
    MPI_Request request;
    MPI_CHECK(MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                             comm->handle, &request));
    comm_poll_collective(&request, "allgather", comm, bytes);
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
    comm_mpi_count(bytes * (size_t)comm->size, "reduce_scatter_sum");
    /* blocks[r] = rank r's block number comm->rank: all of this rank's terms, in rank order */
    void *blocks = xmalloc(bytes * (size_t)comm->size);
    MPI_Request request;
    MPI_CHECK(MPI_Ialltoall(send, (int)bytes, MPI_BYTE, blocks, (int)bytes, MPI_BYTE,
                            comm->handle, &request));
    comm_poll_collective(&request, "reduce_scatter_sum", comm, bytes);
    comm_reduce_blocks(blocks, comm->size, count_per_rank, type, COMM_REDUCE_SUM, recv);
    free(blocks);
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
    comm_mpi_count(count * element, name);
    const int n = comm->size, me = comm->rank;
    int *send_counts = xmalloc(4 * sizeof(int) * (size_t)n);
    int *send_offsets = send_counts + n, *recv_counts = send_counts + 2 * n,
        *recv_offsets = send_counts + 3 * n;
    size_t offset = 0;
    for (int r = 0; r < n; r++) {
        const size_t segment = count / (size_t)n + ((size_t)r < count % (size_t)n);
        send_counts[r] = (int)(segment * element);
        send_offsets[r] = (int)(offset * element);
        offset += segment;
    }
    const size_t own = (size_t)send_counts[me] / element;
    for (int r = 0; r < n; r++) {
        recv_counts[r] = send_counts[me];
        recv_offsets[r] = (int)((size_t)r * own * element);
    }
    char *blocks = xmalloc(own * element * (size_t)n + 1);
    char *reduced = xmalloc(own * element + 1);
    MPI_Request request;
    MPI_CHECK(MPI_Ialltoallv(send, send_counts, send_offsets, MPI_BYTE, blocks, recv_counts,
                             recv_offsets, MPI_BYTE, comm->handle, &request));
    comm_poll_collective(&request, name, comm, count * element);
    comm_reduce_blocks(blocks, n, own, type, op, reduced);
    /* the segments go back to every rank; send may be recv, and it has been read by now */
    MPI_CHECK(MPI_Iallgatherv(reduced, send_counts[me], MPI_BYTE, recv, send_counts,
                              send_offsets, MPI_BYTE, comm->handle, &request));
    comm_poll_collective(&request, name, comm, count * element);
    comm_count(kind, (uint64_t)((count - own) * element + (size_t)(n - 1) * own * element));
    free(reduced);
    free(blocks);
    free(send_counts);
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
    MPI_Request request;
    MPI_CHECK(MPI_Ibcast(buffer, comm_mpi_count(bytes, "broadcast"), MPI_BYTE, root,
                         comm->handle, &request));
    comm_poll_collective(&request, "broadcast", comm, bytes);
    if (comm->rank == root)
        comm_count(kind, (uint64_t)(comm->size - 1) * bytes);
}

void comm_barrier(Comm *comm)
{
    if (comm->size == 1)
        return;
    MPI_Request request;
    MPI_CHECK(MPI_Ibarrier(comm->handle, &request));
    comm_poll_collective(&request, "barrier", comm, 0);
}

