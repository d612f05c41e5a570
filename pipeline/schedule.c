/* pipeline/schedule.c — gpipe, 1f1b and interleaved action lists (DESIGN 3).
 *
 * 1f1b is interleaved 1F1B with one chunk per stage, so both come from one walk over
 * "virtual" microbatches (one per (microbatch, local chunk)); gpipe is the walk with every
 * forward in the warmup. The orderings are Megatron-LM's (schedules.py, PipeDream-flush and
 * the interleaved schedule of Narayanan et al. 2021), written here from their description.
 */
#include "pipeline/schedule.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/error.h"

static const char *schedule_name(PipelineSchedule kind)
{
    switch (kind) {
    case SCHEDULE_GPIPE: return "gpipe";
    case SCHEDULE_1F1B: return "1f1b";
    case SCHEDULE_INTERLEAVED: return "interleaved";
    }
    return "unknown";
}

/* Where M comes from, so a refusal tells the user which keys to change. */
#define MICROBATCHES_KEYS \
    "microbatches per rank = train.global_batch_size / (train.microbatch_size * parallel.dp)"

const char *schedule_check(PipelineSchedule kind, int P, int v, int M)
{
    static _Thread_local char message[512];
    if (kind != SCHEDULE_GPIPE && kind != SCHEDULE_1F1B && kind != SCHEDULE_INTERLEAVED) {
        snprintf(message, sizeof message,
                 "parallel.schedule = %d is not one of gpipe, 1f1b, interleaved", (int)kind);
        return message;
    }
    if (P < 1) {
        snprintf(message, sizeof message, "parallel.pp = %d: at least 1 stage is needed", P);
        return message;
    }
    if (v < 1) {
        snprintf(message, sizeof message,
                 "parallel.virtual_stages = %d: at least 1 chunk per stage is needed", v);
        return message;
    }
    if (M < 1) {
        snprintf(message, sizeof message,
                 MICROBATCHES_KEYS " is %d: at least 1 is needed", M);
        return message;
    }
    if (kind != SCHEDULE_INTERLEAVED && v != 1) {
        snprintf(message, sizeof message,
                 "parallel.virtual_stages = %d needs parallel.schedule: interleaved "
                 "(parallel.schedule = %s runs one chunk per stage)", v, schedule_name(kind));
        return message;
    }
    /* 1f1b with M < P would hold every microbatch in its warmup: it would be gpipe under
     * another name, so it is refused rather than silently changed (DESIGN 3). */
    if (kind != SCHEDULE_GPIPE && M < P) {
        snprintf(message, sizeof message,
                 "parallel.schedule = %s needs at least parallel.pp = %d microbatches per "
                 "rank, but " MICROBATCHES_KEYS " is %d (or use parallel.schedule: gpipe)",
                 schedule_name(kind), P, M);
        return message;
    }
    /* Megatron-LM's constraint: the interleaved order walks microbatches in groups of P. */
    if (kind == SCHEDULE_INTERLEAVED && M % P != 0) {
        snprintf(message, sizeof message,
                 "parallel.schedule = interleaved needs " MICROBATCHES_KEYS
                 " = %d to be divisible by parallel.pp = %d", M, P);
        return message;
    }
    return NULL;
}

int schedule_warmup_forwards(PipelineSchedule kind, int P, int v, int M, int stage)
{
    if (schedule_check(kind, P, v, M) || stage < 0 || stage >= P)
        return -1;
    int total = M * v;
    int warmup;
    if (kind == SCHEDULE_GPIPE)
        warmup = total;
    else if (v == 1)
        /* A forward sent downstream comes back as a gradient after P - s - 1 pairs of the
         * stages below: that many forwards fill the wait. */
        warmup = P - stage - 1;
    else
        /* Megatron-LM: every stage first runs (v - 1) P forwards (a group through all its
         * chunks but the last), and stage s 2 (P - s - 1) more: a chunk-sized forward and
         * backward step of each stage below it. Without communication time P - s - 1 more
         * would do; the rest is slack for the hops (docs/design-notes.md). */
        warmup = 2 * (P - stage - 1) + (v - 1) * P;
    return warmup < total ? warmup : total;
}

int schedule_stash_bound(PipelineSchedule kind, int P, int v, int M, int stage)
{
    int warmup = schedule_warmup_forwards(kind, P, v, M, stage);
    if (warmup < 0)
        return -1;
    /* The steady phase runs its forward before its backward, so it holds one more than the
     * warmup; with no steady phase (warmup = M v) the warmup holds everything. */
    int total = M * v;
    return warmup < total ? warmup + 1 : total;
}

/* Virtual microbatch k of stage s (k = 0..Mv-1) -> (microbatch, global chunk). Microbatches
 * go in groups of P; within a group the stage runs local chunk 0 for all P of them, then
 * local chunk 1, ...; backwards walk the local chunks from the last. With v = 1 virtual
 * microbatch k is microbatch k, whatever M. */
static Action schedule_virtual_action(ActionKind kind, int P, int v, int stage, int k)
{
    int group = k / (P * v);
    int local_chunk = (k / P) % v;
    if (kind == ACTION_BACKWARD)
        local_chunk = v - 1 - local_chunk;
    int microbatch = v == 1 ? k : group * P + k % P;
    return (Action){ .kind = kind, .microbatch = microbatch, .chunk = local_chunk * P + stage };
}

/* snprintf's contract: count everything, store what fits. */
static void schedule_emit(Action *out, int capacity, int *count, Action action)
{
    if (out && *count < capacity)
        out[*count] = action;
    (*count)++;
}

int schedule_actions(PipelineSchedule kind, int P, int v, int M, int stage, Action *out,
                     int capacity)
{
    int warmup = schedule_warmup_forwards(kind, P, v, M, stage);
    if (warmup < 0)
        return -1;
    int total = M * v;
    int count = 0;
    int forwards = 0, backwards = 0;
    while (forwards < warmup)
        schedule_emit(out, capacity, &count,
                      schedule_virtual_action(ACTION_FORWARD, P, v, stage, forwards++));
    while (forwards < total) { /* steady: one forward, then one backward */
        schedule_emit(out, capacity, &count,
                      schedule_virtual_action(ACTION_FORWARD, P, v, stage, forwards++));
        schedule_emit(out, capacity, &count,
                      schedule_virtual_action(ACTION_BACKWARD, P, v, stage, backwards++));
    }
    while (backwards < total) /* cooldown */
        schedule_emit(out, capacity, &count,
                      schedule_virtual_action(ACTION_BACKWARD, P, v, stage, backwards++));
    return count;
}

/* The makespan argument is in schedule.h; the simulator checks it for every configuration
 * the tests walk, with tf < tb, tf = tb and tf > tb. */
long schedule_bubble_formula(PipelineSchedule kind, int P, int v, int M, long tf, long tb)
{
    if (schedule_check(kind, P, v, M))
        return -1;
    return (long)(P - 1) * (tf + tb);
}

void schedule_count_in_flight(const Action *actions, int n_actions, int P, int v, int M,
                              int *slots, int *open)
{
    int *live = xcalloc((size_t)v, sizeof *live);
    bool *seen = xcalloc((size_t)M, sizeof *seen);
    int now_open = 0;
    for (int k = 0; k < v; k++)
        slots[k] = 0;
    *open = 0;
    for (int a = 0; a < n_actions; a++) {
        const int local = actions[a].chunk / P;
        if (actions[a].kind == ACTION_FORWARD) {
            if (++live[local] > slots[local])
                slots[local] = live[local];
            if (!seen[actions[a].microbatch]) {
                seen[actions[a].microbatch] = true;
                if (++now_open > *open)
                    *open = now_open;
            }
        } else {
            live[local]--;
            if (local == 0) /* the backward of the stage's first chunk ends the microbatch */
                now_open--;
        }
    }
    free(live);
    free(seen);
}

int schedule_evaluation_actions(int P, int v, int M, int stage, Action *out, int capacity)
{
    if (P < 1 || v < 1 || M < 1 || stage < 0 || stage >= P)
        return -1;
    int n = 0;
    for (int local = 0; local < v; local++)
        for (int mb = 0; mb < M; mb++, n++)
            if (n < capacity)
                out[n] = (Action){ACTION_FORWARD, mb, local * P + stage};
    return n;
}
