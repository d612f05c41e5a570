/* pipeline/schedule_simulate.c — runs every stage's action list together (DESIGN 3).
 *
 * The execution model is the header's: in list order, each action starts when its stage is
 * free and its inputs exist, and takes tf or tb. An action's start time depends only on the
 * previous action of its stage and on the actions it needs, so the simulation needs no
 * clock: sweep the stages, run every next action whose inputs have finished, until no stage
 * moves. A stage left with actions is waiting forever: a deadlock.
 *
 * The lists are checked, not trusted: an action naming a microbatch or chunk out of range,
 * or a chunk of another stage, or one that repeats, is reported and never run.
 */
#include "pipeline/schedule.h"

#include "runtime/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOT_YET (-1L)

typedef struct {
    int P, C, M;
    long *forward_finish;  /* [M * C]: when forward (mb, c) finished, NOT_YET before */
    long *backward_start;  /* [M * C] */
    long *backward_finish; /* [M * C] */
    int *forward_seen;     /* [M * C]: how often the lists name forward (mb, c) */
    int *backward_seen;    /* [M * C] */
} SimulationState;

static int state_index(const SimulationState *state, int microbatch, int chunk)
{
    return microbatch * state->C + chunk;
}

static const char *action_kind_name(ActionKind kind)
{
    return kind == ACTION_FORWARD ? "forward" : "backward";
}

/* The first problem wins: later ones are usually its consequences. */
static void result_note_problem(SimulationResult *result, const char *problem)
{
    if (result->problem[0] == '\0')
        snprintf(result->problem, sizeof result->problem, "%s", problem);
}

/* Every action names a (mb, chunk) in range, on its own stage, at most once per kind, and
 * every (mb, chunk) is named once as forward and once as backward. */
static bool simulation_check_lists(SimulationState *state, const Action *const *lists,
                                   const int *counts, SimulationResult *result)
{
    char problem[256];
    bool valid = true;
    for (int stage = 0; stage < state->P; stage++) {
        for (int i = 0; i < counts[stage]; i++) {
            Action action = lists[stage][i];
            bool in_range = action.microbatch >= 0 && action.microbatch < state->M &&
                            action.chunk >= 0 && action.chunk < state->C &&
                            (action.kind == ACTION_FORWARD || action.kind == ACTION_BACKWARD);
            if (!in_range || action.chunk % state->P != stage) {
                snprintf(problem, sizeof problem,
                         "stage %d action %d (%s microbatch %d chunk %d) is %s", stage, i,
                         action_kind_name(action.kind), action.microbatch, action.chunk,
                         in_range ? "on another stage's chunk" : "out of range");
                result_note_problem(result, problem);
                valid = false;
                continue;
            }
            int at = state_index(state, action.microbatch, action.chunk);
            int *seen = action.kind == ACTION_FORWARD ? state->forward_seen
                                                      : state->backward_seen;
            if (++seen[at] == 2) {
                snprintf(problem, sizeof problem,
                         "stage %d action %d repeats %s microbatch %d chunk %d", stage, i,
                         action_kind_name(action.kind), action.microbatch, action.chunk);
                result_note_problem(result, problem);
                valid = false;
            }
        }
    }
    for (int microbatch = 0; microbatch < state->M; microbatch++)
        for (int chunk = 0; chunk < state->C; chunk++) {
            int at = state_index(state, microbatch, chunk);
            if (state->forward_seen[at] == 0 || state->backward_seen[at] == 0) {
                snprintf(problem, sizeof problem,
                         "stage %d never runs the %s of microbatch %d chunk %d",
                         chunk % state->P,
                         state->forward_seen[at] == 0 ? "forward" : "backward", microbatch,
                         chunk);
                result_note_problem(result, problem);
                valid = false;
            }
        }
    return valid;
}

/* When the inputs of `action` are all there (NOT_YET if one is missing). */
static long simulation_inputs_ready(const SimulationState *state, Action action)
{
    int at = state_index(state, action.microbatch, action.chunk);
    if (action.kind == ACTION_FORWARD) {
        if (action.chunk == 0)
            return 0;
        return state->forward_finish[at - 1];
    }
    long own_forward = state->forward_finish[at];
    if (own_forward == NOT_YET)
        return NOT_YET;
    if (action.chunk == state->C - 1)
        return own_forward;
    long gradient = state->backward_finish[at + 1];
    if (gradient == NOT_YET)
        return NOT_YET;
    return gradient > own_forward ? gradient : own_forward;
}

SimulationResult schedule_simulate_lists(int P, int v, int M, const Action *const *lists,
                                         const int *counts, long tf, long tb)
{
    SimulationResult result = { .forward_before_backward = true, .stages = P };
    if (P < 1 || P > SCHEDULE_MAX_STAGES || v < 1 || M < 1 || tf < 0 || tb < 0) {
        snprintf(result.problem, sizeof result.problem,
                 "cannot simulate P = %d, v = %d, M = %d, tf = %ld, tb = %ld (P must be in "
                 "1..%d)", P, v, M, tf, tb, SCHEDULE_MAX_STAGES);
        result.stages = 0;
        result.forward_before_backward = false;
        return result;
    }
    int C = P * v;
    size_t cells = (size_t)M * (size_t)C;
    SimulationState state = {
        .P = P, .C = C, .M = M,
        .forward_finish = xmalloc(cells * sizeof(long)),
        .backward_start = xmalloc(cells * sizeof(long)),
        .backward_finish = xmalloc(cells * sizeof(long)),
        .forward_seen = xcalloc(cells, sizeof(int)),
        .backward_seen = xcalloc(cells, sizeof(int)),
    };
    for (size_t i = 0; i < cells; i++)
        state.forward_finish[i] = state.backward_start[i] = state.backward_finish[i] = NOT_YET;

    result.each_action_once = simulation_check_lists(&state, lists, counts, &result);
    if (result.each_action_once) {
        int next[SCHEDULE_MAX_STAGES] = {0};  /* index of each stage's next action */
        int stash[SCHEDULE_MAX_STAGES] = {0}; /* forwards awaiting their backward */
        long free_at[SCHEDULE_MAX_STAGES] = {0};
        bool moved = true;
        while (moved) {
            moved = false;
            for (int stage = 0; stage < P; stage++) {
                while (next[stage] < counts[stage]) {
                    Action action = lists[stage][next[stage]];
                    long ready = simulation_inputs_ready(&state, action);
                    if (ready == NOT_YET)
                        break;
                    long start = ready > free_at[stage] ? ready : free_at[stage];
                    int at = state_index(&state, action.microbatch, action.chunk);
                    if (action.kind == ACTION_FORWARD) {
                        free_at[stage] = start + tf;
                        state.forward_finish[at] = free_at[stage];
                        if (++stash[stage] > result.peak_stash[stage])
                            result.peak_stash[stage] = stash[stage];
                    } else {
                        free_at[stage] = start + tb;
                        state.backward_start[at] = start;
                        state.backward_finish[at] = free_at[stage];
                        stash[stage]--;
                    }
                    next[stage]++;
                    moved = true;
                }
            }
        }
        /* Every stage left waiting is named: the one that causes the wait is among them,
         * not always the first. */
        result.completed = true;
        char deadlock[sizeof result.problem] = "deadlock, waiting forever:";
        for (int stage = 0; stage < P; stage++) {
            result.finish[stage] = free_at[stage];
            if (free_at[stage] > result.makespan)
                result.makespan = free_at[stage];
            if (next[stage] < counts[stage]) {
                Action stuck = lists[stage][next[stage]];
                size_t used = strlen(deadlock);
                snprintf(deadlock + used, sizeof deadlock - used,
                         "%s stage %d action %d (%s mb %d chunk %d)",
                         result.completed ? "" : ";", stage, next[stage],
                         action_kind_name(stuck.kind), stuck.microbatch, stuck.chunk);
                result.completed = false;
            }
        }
        if (!result.completed)
            result_note_problem(&result, deadlock);
        /* Checked from the recorded times, apart from the rule that let them run. */
        for (size_t i = 0; i < cells; i++) {
            if (state.backward_start[i] == NOT_YET)
                continue;
            if (state.forward_finish[i] == NOT_YET ||
                state.forward_finish[i] > state.backward_start[i]) {
                char problem[256];
                snprintf(problem, sizeof problem,
                         "backward of microbatch %zu chunk %zu started before its forward "
                         "finished", i / (size_t)C, i % (size_t)C);
                result_note_problem(&result, problem);
                result.forward_before_backward = false;
            }
        }
    } else {
        result.forward_before_backward = false;
    }
    free(state.forward_finish);
    free(state.backward_start);
    free(state.backward_finish);
    free(state.forward_seen);
    free(state.backward_seen);
    return result;
}

SimulationResult schedule_simulate(PipelineSchedule kind, int P, int v, int M, long tf,
                                   long tb)
{
    const char *refusal = schedule_check(kind, P, v, M);
    if (refusal || P > SCHEDULE_MAX_STAGES) {
        SimulationResult result = {0};
        if (refusal)
            snprintf(result.problem, sizeof result.problem, "%s", refusal);
        else
            snprintf(result.problem, sizeof result.problem,
                     "parallel.pp = %d: the simulator takes at most %d stages", P,
                     SCHEDULE_MAX_STAGES);
        return result;
    }
    int count = 2 * M * v;
    Action *storage = xmalloc((size_t)P * (size_t)count * sizeof(Action));
    const Action *lists[SCHEDULE_MAX_STAGES];
    int counts[SCHEDULE_MAX_STAGES];
    for (int stage = 0; stage < P; stage++) {
        Action *list = storage + (size_t)stage * (size_t)count;
        counts[stage] = schedule_actions(kind, P, v, M, stage, list, count);
        lists[stage] = list;
    }
    SimulationResult result = schedule_simulate_lists(P, v, M, lists, counts, tf, tb);
    free(storage);
    return result;
}
