/* pipeline/schedule.h — pipeline schedules as pure functions, and a simulator (DESIGN 3).
 *
 * A step runs M microbatches (microbatches per rank = train.global_batch_size /
 * (train.microbatch_size * parallel.dp)) through C = P * v chunks, P = parallel.pp stages,
 * v = parallel.virtual_stages. Chunk c runs on stage c % P (loop placement, DESIGN 3), so
 * stage s holds chunks s, s + P, ..., s + (v - 1) P. An Action is the forward or the backward
 * of one (microbatch, global chunk); schedule_actions lists one stage's 2 * M * v actions in
 * the order the stage runs them.
 *
 * Execution model (what the executor does and schedule_simulate models): a stage runs its
 * actions strictly in list order, blocking on an action until its inputs have arrived.
 *   forward  (mb, c) needs the forward payload of (mb, c - 1)  (none for c = 0);
 *   backward (mb, c) needs forward (mb, c) done on this stage and the gradient payload of
 *                    backward (mb, c + 1)  (none for c = C - 1: that chunk computes the loss).
 * Sends never block (buffered) and take no time; a forward takes tf and a backward tb.
 *
 * Order of the lists, for every schedule: each chunk's backwards run in the order of its
 * forwards (microbatch 0 first), so a stage's stash of one chunk is first in, first out.
 *   gpipe        v = 1: the M forwards, then the M backwards (microbatch 0 first).
 *   1f1b         v = 1, M >= P: warmup = min(P - s - 1, M) forwards, then pairs "one
 *                forward, one backward" (forward first), then the remaining backwards.
 *   interleaved  M >= P, M % P == 0 (Megatron-LM's interleaved 1F1B): virtual forward k
 *                (k = 0..Mv-1) is microbatch P * (k / (P v)) + k % P of local chunk
 *                (k / P) % v; virtual backward k is the same microbatch of local chunk
 *                v - 1 - (k / P) % v. Local chunk j on stage s is global chunk j P + s.
 *                warmup = min(2 (P - s - 1) + (v - 1) P, M v) virtual forwards, then
 *                pairs (forward first), then the remaining backwards. With v = 1 warmup is
 *                1f1b's P - s - 1 and the lists equal 1f1b's exactly.
 *
 * Stash (forwards of this stage whose backward has not run): the bound is tight, reached by
 * every stage of every runnable configuration:
 *   gpipe M;   1f1b min(P - s, M) = P - s;   interleaved min(warmup + 1, M v).
 *
 * Makespan, exact for every schedule here and any tf, tb >= 0 (tf, tb: time of ONE chunk):
 *   makespan = (M v + P - 1)(tf + tb),   bubble = makespan - M v (tf + tb) = (P - 1)(tf + tb).
 * It is also the least any schedule can take under this model: the last stage starts no
 * earlier than (P - 1) tf (microbatch 0 crosses the stages before it), has M v (tf + tb) of
 * work, and its last backward still crosses the P - 1 stages before it ((P - 1) tb). These
 * lists keep the last stage busy from its first action to its last. In units of a stage's
 * whole forward and backward (v chunks), the interleaved bubble is 1/v of 1f1b's.
 *
 * Nothing here allocates but the two simulate functions, which free what they take;
 * results are values. Everything is pure and thread-safe; schedule_check's message lives in
 * thread-local storage until that thread's next schedule_check call.
 */
#ifndef FATHOM_PIPELINE_SCHEDULE_H
#define FATHOM_PIPELINE_SCHEDULE_H

#include "runtime/config.h"

#include <stdbool.h>

typedef enum { ACTION_FORWARD, ACTION_BACKWARD } ActionKind;

typedef struct {
    ActionKind kind;
    int microbatch; /* 0..M-1 */
    int chunk;      /* GLOBAL chunk index c in 0..P*v-1; runs on stage c % P */
} Action;

/* The number of actions of `stage` (always 2 * M * v); fills out[0..min(count, capacity))
 * in execution order (out may be NULL with capacity 0). Returns -1 when schedule_check
 * refuses (kind, P, v, M) or stage is not in 0..P-1. Pure. */
int schedule_actions(PipelineSchedule kind, int P, int v, int M, int stage, Action *out,
                     int capacity);

/* The forward-only pass of an evaluation (pipeline/executor.h executor_run_evaluation):
 * `stage`'s M * v forwards, chunk-major (every microbatch of its first chunk, then of its
 * next, ...), into out[0..min(count, capacity)); returns the count, or -1 for P, v, M < 1 or
 * a stage outside 0..P-1. Deadlock free under the execution model above: a forward (mb, c)
 * waits only for (mb, c - 1), and every list is ordered by (c, mb), so every wait and every
 * earlier action of a list is smaller in (c, mb) order: nothing waits in a cycle. Any M and
 * v (there is no backward to interleave); a stage holds each microbatch's summary store from
 * its first chunk to its last, M at once. Pure. */
int schedule_evaluation_actions(int P, int v, int M, int stage, Action *out, int capacity);

/* NULL when (kind, P, v, M) can run; else a message naming the config keys and their
 * values, and what is needed. */
const char *schedule_check(PipelineSchedule kind, int P, int v, int M);

/* The most forwards whose backward has not run yet that `stage` holds at once: the stash
 * slots the executor allocates before step 1. -1 when schedule_check refuses. */
int schedule_stash_bound(PipelineSchedule kind, int P, int v, int M, int stage);

/* Walks one stage's action list (schedule_actions of P stages, v chunks a stage, M
 * microbatches): slots[k] = the most forwards of local chunk k (global chunk k*P + stage)
 * whose backward has not run, at once; *open = the most microbatches open at once, from
 * their first forward to the backward of the stage's first chunk. What the executor
 * allocates (stashes per chunk, summary stores) and the memory plan counts. Pure. */
void schedule_count_in_flight(const Action *actions, int n_actions, int P, int v, int M,
                              int *slots, int *open);

/* The warmup length of `stage`: how many forwards it runs before its first backward is
 * due (1f1b, interleaved; gpipe: M). -1 when schedule_check refuses. */
int schedule_warmup_forwards(PipelineSchedule kind, int P, int v, int M, int stage);

/* makespan - M v (tf + tb), the time a stage (each does M v (tf + tb) of work) is idle
 * over the step: (P - 1)(tf + tb) for every schedule (see above). -1 when schedule_check
 * refuses. */
long schedule_bubble_formula(PipelineSchedule kind, int P, int v, int M, long tf, long tb);

#define SCHEDULE_MAX_STAGES 64

typedef struct {
    bool completed;               /* every stage ran its whole list (no deadlock) */
    bool forward_before_backward; /* every backward started after its forward finished */
    bool each_action_once;        /* every (mb, chunk) forward and backward exactly once, on
                                     stage chunk % P, and nothing else */
    long makespan;                /* finish time of the last action (of those that ran) */
    int stages;                   /* P: peak_stash[0..P) and finish[0..P) are filled */
    int peak_stash[SCHEDULE_MAX_STAGES]; /* the most forwards held awaiting their backward */
    long finish[SCHEDULE_MAX_STAGES];    /* when each stage's last action that ran ended */
    char problem[512];            /* "" when all of the above hold; else the first problem
                                     (a deadlock names every waiting stage and action) */
} SimulationResult;

/* Runs lists[s][0..counts[s]) for every stage s in 0..P-1 together under the execution
 * model above. Any list is accepted (that is the point: a broken one is reported, never
 * trusted); 1 <= P <= SCHEDULE_MAX_STAGES, v >= 1, M >= 1, tf, tb >= 0. */
SimulationResult schedule_simulate_lists(int P, int v, int M, const Action *const *lists,
                                         const int *counts, long tf, long tb);

/* schedule_actions for every stage, then schedule_simulate_lists. A refused configuration
 * comes back not completed, with schedule_check's message as the problem. */
SimulationResult schedule_simulate(PipelineSchedule kind, int P, int v, int M, long tf,
                                   long tb);

#endif
