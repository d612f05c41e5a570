/* runtime/comm_mpi.c — runtime/comm.h over MPI, on host memory (DESIGN 3).
 *
 * Set-up, counters and the polled wait; the collectives are in comm_collectives.c and
 * send/recv in comm_messages.c. A 1-rank communicator never calls MPI.
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
    .world = {.handle = MPI_COMM_NULL, .collectives = MPI_COMM_NULL, .rank = 0, .size = 1},
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

/* fatal()'s hook in a job of several ranks: end every rank, with this exit code. A
 * communication failure first names the ranks of this host that are gone, which the NCCL
 * watchdog's message (from a thread of its own, without a roll call) cannot. */
static void comm_abort_job(int exit_code)
{
    char lost[512];
    if (exit_code == EXIT_COMM && comm_neighbours_describe(lost, sizeof lost) > 0) {
        fprintf(stderr, "fathom: error: rank %d: on this host, %s\n", comm_state.world.rank,
                lost);
        fflush(stderr);
    }
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
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_state.world.collectives));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &comm_state.world.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &comm_state.world.size));
    if (comm_state.world.size > 1) {
        error_set_rank(comm_state.world.rank);
        error_set_abort(comm_abort_job);
        comm_rollcall_init();
        comm_neighbours_init(MPI_COMM_WORLD, comm_state.world.size);
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
    MPI_CHECK(MPI_Comm_free(&comm_state.world.collectives));
    comm_rollcall_free();
    comm_neighbours_free();
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
    child->collectives = MPI_COMM_NULL;
    child->size = 1;
    if (parent->size > 1) {
        MPI_CHECK(MPI_Comm_split(parent->handle, color == COMM_NO_GROUP ? MPI_UNDEFINED : color,
                                 key, &child->handle));
        if (child->handle == MPI_COMM_NULL) {
            free(child);
            return NULL;
        }
        MPI_CHECK(MPI_Comm_dup(child->handle, &child->collectives));
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
    if (comm->handle != MPI_COMM_NULL && comm_state.mpi_active) {
        MPI_CHECK(MPI_Comm_free(&comm->collectives));
        MPI_CHECK(MPI_Comm_free(&comm->handle));
    }
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

void comm_counters_save(uint64_t *counts)
{
    for (int kind = 0; kind < COMM_KIND_COUNT; kind++)
        counts[kind] = atomic_load_explicit(&comm_state.counters[kind], memory_order_relaxed);
}

void comm_counters_restore(const uint64_t *counts)
{
    for (int kind = 0; kind < COMM_KIND_COUNT; kind++)
        atomic_store_explicit(&comm_state.counters[kind], counts[kind], memory_order_relaxed);
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

double comm_now_seconds(void)
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

void comm_poll_pause(long polls, double started, double now)
{
    if (polls % 64 == 0)
        comm_rollcall_answer();
    if (polls < 1000)
        return;
    if (now - started < 0.01) {
        sched_yield();
    } else {
        const struct timespec pause = {.tv_sec = 0, .tv_nsec = 50000};
        nanosleep(&pause, NULL);
    }
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
            char operation[256], silent[512];
            describe(context, operation, sizeof operation);
            comm_rollcall_silent(silent, sizeof silent);
            fatal(EXIT_COMM, "%s did not complete within parallel.timeout_s = %g s; %s",
                  operation, comm_state.timeout_seconds, silent);
        }
        comm_poll_pause(polls, start, now);
    }
}

/* MPI counts are int: a larger call must be split by the caller. */
int comm_mpi_count(size_t bytes, const char *operation)
{
    if (bytes > (size_t)INT_MAX)
        fatal(EXIT_COMM, "%s of %zu bytes exceeds MPI's int count (%d bytes); split the call",
              operation, bytes, INT_MAX);
    return (int)bytes;
}

