/* runtime/comm.h — the one communication interface (DESIGN 3, "Communication").
 *
 * What it does: collectives (all-gather, reduce-scatter, all-reduce, broadcast, barrier) and
 * tagged point-to-point messages between the ranks of a communicator, with byte counters by
 * kind. Nothing here knows what a transformer is; callers say what bytes were for through
 * CommKind. This implementation (comm_mpi.c, comm_messages.c) moves host memory through MPI;
 * the CUDA module will add device memory through NCCL behind the same names.
 *
 * Memory: every buffer belongs to the caller; nothing here keeps a pointer after the call
 * returns, except a started send/recv, whose buffer must stay untouched until comm_wait or
 * a true comm_test. Counts are elements of the CommType; point-to-point sizes are bytes.
 * A Comm from comm_split belongs to the caller (comm_free); comm_world() is never freed.
 *
 * World of one: comm_init initialises MPI only when the process was started by a launcher
 * (Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMI_SIZE and PMIX_RANK are accepted too). A
 * plain `fathom train` is a world of one with no MPI at all: no MPI start-up cost, nothing to
 * finalise. Every operation on a 1-rank communicator, with or without MPI, is a local copy
 * (send/recv to oneself are matched in the process). comm_world() before comm_init, or
 * without a launcher, is that world of one.
 *
 * Fixed-order sums: fathom promises bitwise-identical runs for the same layout (DESIGN 3,
 * "Determinism"), so sums never use MPI's reduction, whose order depends on the algorithm MPI
 * picks. Each rank receives every rank's contribution to the elements it owns (an all-to-all)
 * and adds them itself in rank order 0, 1, .., n-1:
 *     float32, float64, bfloat16:  s = (double)x_0 + x_1 + ... + x_{n-1}, each addition in
 *                                  double, rounded once to the type at the end (bfloat16:
 *                                  to float32, then to bfloat16, nearest even);
 *     int64:                       the exact integer sum; byte: not summable (fatal).
 * With two ranks the double sum of two float32 is exact, so the result equals the float32
 * sum x_0 + x_1. The same layout therefore gives the same bits whatever the timing; the
 * 1-rank result is the input itself. Max takes the same path (a NaN anywhere gives NaN).
 *
 * Deadline: every wait (collectives included: they exchange point-to-point messages with
 * every peer, polled) has the deadline set by comm_set_timeout (parallel.timeout_s, default
 * 600 s). Past it the job ends with exit 5 (EXIT_COMM) and a message that names this rank,
 * the operation, the peers whose messages did not arrive, the timeout, and the ranks that
 * do not answer a roll call of the whole world (dead, stopped or hung: comm_rollcall.c).
 * Any failed MPI call also ends the job with exit 5, naming the call, file:line and MPI's
 * message.
 *
 * A job of several ranks: comm_init sets the error prefix ("fathom: error: rank N: ...",
 * runtime/error.h) and an abort hook, so fatal() on any rank calls
 * MPI_Abort(MPI_COMM_WORLD, code) and mpirun (Open MPI 4.1) exits with that code: one rank's
 * config error ends the job with 2, a timeout with 5 (docs/design-notes.md, Communication).
 *
 * Threads: MPI is initialised with MPI_THREAD_SERIALIZED. Any thread may call comm, one at a
 * time; in practice the thread that runs the schedule. OpenMP workers never call comm.
 *
 * Byte counters: per process (a rank is one stage), payload bytes only, no MPI envelope. The
 * rule is "the bytes this rank hands to other ranks", as this implementation moves them, on
 * a communicator of n ranks with element size e:
 *     allgather            (n-1) * count_per_rank * e
 *     reduce_scatter_sum   (n-1) * count_per_rank * e
 *     allreduce_sum / max  (count - own) * e + (n-1) * own * e, where own is this rank's
 *                          segment (count split in n parts, the first count % n one larger);
 *                          2 (n-1)/n * count * e when n divides count
 *     broadcast            root: (n-1) * count * e; the others 0
 *     send                 the bytes sent, when started
 *     recv                 the bytes received, when complete (book them as COMM_KIND_PP_RECV)
 *     barrier              0
 * A 1-rank communicator's collectives count 0; a send to oneself counts its bytes.
 */
#ifndef FATHOM_RUNTIME_COMM_H
#define FATHOM_RUNTIME_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Comm Comm;               /* a communicator: the world or a group of it */
typedef struct CommRequest CommRequest; /* a started send or recv; comm_wait frees it */

typedef enum { COMM_FLOAT32, COMM_BFLOAT16, COMM_BYTE, COMM_INT64, COMM_FLOAT64 } CommType;

/* What the bytes were for: the kinds the byte counters keep apart (DESIGN 6, `comm`). */
typedef enum {
    COMM_KIND_PP_SEND,              /* pipeline hop payloads sent */
    COMM_KIND_PP_RECV,              /* pipeline hop payloads received */
    COMM_KIND_PP_SUMMARY,           /* block summaries sent, with the cross-stage cache */
    COMM_KIND_PP_SUMMARY_UNCACHED,  /* what the same hops would carry without the cache */
    COMM_KIND_FSDP_ALLGATHER,
    COMM_KIND_FSDP_REDUCESCATTER,
    COMM_KIND_ALLREDUCE,
    COMM_KIND_OTHER,
    COMM_KIND_COUNT
} CommKind;

/* Tags of send/recv: 0 .. COMM_TAG_MAX (the MPI standard guarantees 32767). Collectives
 * run on a duplicate of the communicator, so the whole range belongs to the caller. */
#define COMM_TAG_MAX 32767
/* comm_split's color for "not in any group": that rank gets NULL. */
#define COMM_NO_GROUP (-1)

/* Starts MPI when launched by mpirun (see above); otherwise a world of one. Call once, first
 * thing in main; a second call does nothing. */
void comm_init(int *argc, char ***argv);
/* MPI_Finalize when MPI runs; it waits for nobody, so every rank must have finished its
 * communication. No comm call may follow it. */
void comm_finalize(void);
/* Whether MPI was initialised (false in a world of one started without a launcher). */
bool comm_mpi_active(void);

Comm *comm_world(void);
int comm_rank(const Comm *comm);
int comm_size(const Comm *comm);
/* Collective over parent: ranks with the same color form a group, ordered by key (ties by
 * parent rank), as MPI_Comm_split. The rank grid (DESIGN 3, rank = stage * D + dp_rank):
 * the dp group of a stage is comm_split(world, stage, dp_rank), the pipeline of a dp rank
 * comm_split(world, dp_rank, stage). color COMM_NO_GROUP returns NULL. */
Comm *comm_split(Comm *parent, int color, int key);
void comm_free(Comm *comm);   /* NULL and the world are ignored */

/* The deadline of every wait, in seconds (> 0). Process-wide; default 600. */
void comm_set_timeout(double seconds);
double comm_timeout(void);

/* Collectives: every rank of comm calls them in the same order with the same counts. They
 * return when this rank's result is complete. */

/* recv[r * count_per_rank ..] = rank r's send, for every r (rank order). send != recv. */
void comm_allgather(Comm *comm, const void *send, void *recv, size_t count_per_rank,
                    CommType type, CommKind kind);
/* send holds n blocks of count_per_rank; recv = sum over ranks r (in rank order) of rank r's
 * block number comm_rank(comm). send != recv. */
void comm_reduce_scatter_sum(Comm *comm, const void *send, void *recv, size_t count_per_rank,
                             CommType type, CommKind kind);
/* recv = sum over ranks, in rank order, of send; send may equal recv. */
void comm_allreduce_sum(Comm *comm, const void *send, void *recv, size_t count, CommType type,
                        CommKind kind);
/* recv = element-wise max over ranks; send may equal recv. For the collective decisions
 * (DESIGN 3: every rank skips the same non-finite step). */
void comm_allreduce_max(Comm *comm, const void *send, void *recv, size_t count, CommType type,
                        CommKind kind);
void comm_broadcast(Comm *comm, void *buffer, size_t count, CommType type, int root,
                    CommKind kind);
void comm_barrier(Comm *comm);

/* Point-to-point: starts a message and returns at once. Messages between two ranks with the
 * same tag arrive in the order they were started; different tags match independently, so a
 * receiver may post tags in any order. A recv's bytes is its capacity; a longer message is an
 * error (exit 5). */
CommRequest *comm_send_start(Comm *comm, const void *buffer, size_t bytes, int peer, int tag,
                             CommKind kind);
CommRequest *comm_recv_start(Comm *comm, void *buffer, size_t bytes, int peer, int tag,
                             CommKind kind);
/* Waits for the request and frees it. Past the deadline: exit 5 naming this rank, the peer,
 * the operation, the tag and the timeout. */
void comm_wait(CommRequest *request);
/* true when the request is complete (it is then freed and must not be used again). */
bool comm_test(CommRequest *request);

/* A bracket around sends, recvs and collectives that the caller means as one group. On MPI
 * it changes nothing (every call starts at once); the NCCL implementation will start the
 * group at comm_group_end. The bracket is process-wide, as NCCL's is; comm names the
 * communicator the group is for. So that code written against MPI also runs on NCCL,
 * waiting on a request (comm_wait, comm_test) inside a bracket is refused (exit 5).
 * Brackets nest. */
void comm_group_begin(Comm *comm);
void comm_group_end(Comm *comm);

/* Byte counters (rule above), since the last reset. */
void comm_counters_reset(void);
uint64_t comm_counter(CommKind kind);
/* All counters into counts[COMM_KIND_COUNT], and back: work that is not a step's (an
 * evaluation between steps) can leave the step's counts as they were. */
void comm_counters_save(uint64_t *counts);
void comm_counters_restore(const uint64_t *counts);
/* Books bytes a caller accounts for itself (e.g. the uncached summary bytes it did not send). */
void comm_count(CommKind kind, uint64_t bytes);
/* The metrics field of a kind (DESIGN 6, `comm`): "pp_send_bytes", .., "allreduce_bytes";
 * COMM_KIND_OTHER is "other_bytes". */
const char *comm_kind_name(CommKind kind);
size_t comm_type_size(CommType type);

#endif
