/* pipeline/executor.h — runs one stage's share of a training step's microbatches
 * (DESIGN 1, 3): the stage's actions from pipeline/schedule.h, in order, with the hops of
 * pipeline/payload.h sent and received through runtime/comm.h; and the forward-only pass of
 * an evaluation through the same stages (executor_run_evaluation).
 *
 * Per action:
 *   forward (mb, c)   c > 0: wait for the payload from stage (c-1) % P and put it in place;
 *                     run the chunk; c < C-1: start the send of its payload to (c+1) % P.
 *   backward (mb, c)  c < C-1: wait for the gradient payload from (c+1) % P (the stream's
 *                     gradient, and the summaries' gradients ADDED into the store); run the
 *                     chunk's backward; c > 0: start the send of the gradients of what the
 *                     forward hop into c carried, to (c-1) % P.
 * Hops travel over runtime/device_comm.h, one DeviceComm ("link") per direction and
 * sending stage, of the two stages of the hop (one with one stage): NCCL between ranks with
 * GPUs of their own, MPI from host copies where ranks share a GPU or on the cpu. Each hop
 * is one message per tensor. A send starts at once and completes in the background from a
 * buffer of the link's own, so nothing the stage writes later can change a message in
 * flight; a receive is waited for at its action (by the host on MPI, by the compute stream
 * on NCCL), with the deadline of parallel.timeout_s, which is the simulator's execution
 * model: every schedule there is deadlock free. Messages carry no tags: NCCL matches them in
 * order, so every stage sends its hops to a neighbour in the order that neighbour receives
 * them (a property of every schedule, tests/test_schedule.c), and one link per direction
 * keeps a send waiting for its receive from blocking a receive behind it.
 *
 * Memory, allocated once in executor_create (before step 1): per local chunk as many
 * stashes as its most forwards in flight in the schedule (the schedule's stash bound, over
 * the stage's chunks), and one summary store per microbatch the stage holds at once (from
 * its first forward to the backward of its first chunk), sized to the buffers this stage's
 * chunks touch. With one stage this is one stash and one store: the one-process step.
 *
 * Each microbatch's backward is scaled by `loss_scale` (1 / (M * D), DESIGN 3); the caller
 * zeroes the gradients first. The loss returned is the sum over the stage's microbatches of
 * their means, on the stage that holds the last chunk, zero elsewhere.
 */
#ifndef FATHOM_PIPELINE_EXECUTOR_H
#define FATHOM_PIPELINE_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "model/chunk.h"
#include "model/model.h"
#include "pipeline/payload.h"
#include "pipeline/schedule.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "runtime/data.h"

typedef struct {
    double loss, ce, zloss; /* sums of microbatch means (the last chunk's stage only) */
} StepLoss;

typedef struct Executor Executor;

/* The executor of `stage` of the pipeline `pp` (a communicator of parallel.pp ranks whose
 * rank is the stage; a group of one when pp is 1: with virtual_stages > 1 the stage hands
 * payloads to itself through it; NULL when the network is one chunk, or for an executor
 * that only sizes memory and runs no step), for config's schedule, virtual_stages,
 * layer_split, activation checkpointing and microbatches per rank. A layout the schedule
 * cannot run is EXIT_CONFIG naming the keys. Collective over `pp`: it makes the hop links
 * (below). */
Executor *executor_create(Model *model, const Config *config, Comm *pp, int stage);
void executor_destroy(Executor *executor);

/* All chunks [n_chunks], this stage's chunk list, and sizes for the memory plan. */
const ChunkSpan *executor_spans(const Executor *executor, int *n_chunks);
int executor_stage(const Executor *executor);
size_t executor_activation_bytes(const Executor *executor); /* stashes and stores */
int executor_stash_count(const Executor *executor);
/* What the stage's stashes and stores would take with and without checkpointing. */
size_t executor_plan_bytes(const Executor *executor, bool checkpointed);

/* The microbatches of the step that starts at global sample consumed_samples, for data-
 * parallel rank dp_rank of dp_size. */
StepLoss executor_run_step(Executor *executor, DataSet *data, uint64_t consumed_samples,
                           int dp_rank, int dp_size, float loss_scale);

/* A forward-only pass over an evaluation's windows, read in file order: `microbatches` of
 * train.microbatch_size windows for this dp rank, whose microbatch i is the (i * dp_size +
 * dp_rank)-th run of microbatch_size windows, through the stage's chunks with their hops
 * (schedule_evaluation_actions, in groups of as many microbatches as the stage has summary
 * stores). Nothing is kept for a backward. The loss returned is the sum over the stage's
 * microbatches of their means, on the stage that holds the last chunk, zero elsewhere.
 * Collective over the pipeline, and over each stage's dp group (FSDP gathers): every rank
 * passes the same `microbatches`. */
StepLoss executor_run_evaluation(Executor *executor, DataSet *data, int64_t microbatches,
                                 int dp_rank, int dp_size);

/* How this stage's forward hops travel ("nccl", "host-staged" or "mpi") and why
 * (runtime/device_comm.h); NULL with one chunk or no links. */
const char *executor_hop_method(const Executor *executor, const char **reason);
/* The bytes this stage's links hold for its sends in flight: the most they held at once so
 * far (launch/memory_plan.h bounds it). */
size_t executor_held_bytes(const Executor *executor);

/* The bytes this stage's hops of one step carry (pipeline/payload.h). */
PayloadBytes executor_predicted_bytes(const Executor *executor);

#endif
