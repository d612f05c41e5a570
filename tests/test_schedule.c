/* tests/test_schedule.c — pipeline schedules and their simulator (DESIGN 3).
 *
 * The sweeps walk every schedule over P in 1..8, v in 1..4, M in 1..16 where schedule_check
 * accepts the configuration, simulate all stages together and check the claims of
 * pipeline/schedule.h. The action lists are also counted here, apart from the simulator's
 * own checks, and the simulator is shown broken lists so that a deadlock can be seen.
 */
#include "pipeline/schedule.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_P 8
#define MAX_V 4
#define MAX_M 16

static const PipelineSchedule all_schedules[] = { SCHEDULE_GPIPE, SCHEDULE_1F1B,
                                                  SCHEDULE_INTERLEAVED };
static const char *const schedule_names[] = { "gpipe", "1f1b", "interleaved" };

typedef struct {
    PipelineSchedule kind;
    int P, v, M;
} Layout;

typedef void (*LayoutCheck)(Layout layout);

/* Calls `check` on every accepted layout of the sweep; returns how many there were, so a
 * sweep cannot pass by visiting nothing. */
static int sweep_accepted_layouts(LayoutCheck check)
{
    int visited = 0;
    for (int k = 0; k < 3; k++)
        for (int P = 1; P <= MAX_P; P++)
            for (int v = 1; v <= MAX_V; v++)
                for (int M = 1; M <= MAX_M; M++) {
                    if (schedule_check(all_schedules[k], P, v, M))
                        continue;
                    check((Layout){ all_schedules[k], P, v, M });
                    visited++;
                }
    return visited;
}

/* gpipe: 8 * 16 (v = 1); 1f1b: M >= P, sum over P of 17 - P = 100; interleaved: M a multiple
 * of P, sum over P of 16 / P (= 16+8+5+4+3+2+2+2 = 42) times 4 values of v = 168. */
#define ACCEPTED_LAYOUTS (128 + 100 + 168)

#define LAYOUT_FORMAT "%s P=%d v=%d M=%d"
#define LAYOUT_ARGS(layout) \
    schedule_names[(layout).kind], (layout).P, (layout).v, (layout).M

static Action *actions_of_stage(Layout layout, int stage, int *count)
{
    *count = schedule_actions(layout.kind, layout.P, layout.v, layout.M, stage, NULL, 0);
    cr_assert_eq(*count, 2 * layout.M * layout.v, LAYOUT_FORMAT " stage %d: %d actions",
                 LAYOUT_ARGS(layout), stage, *count);
    Action *actions = malloc((size_t)*count * sizeof *actions);
    int filled = schedule_actions(layout.kind, layout.P, layout.v, layout.M, stage, actions,
                                  *count);
    cr_assert_eq(filled, *count);
    return actions;
}

/* --- every layout of the sweep ----------------------------------------------------------- */

static void check_completes(Layout layout)
{
    SimulationResult result = schedule_simulate(layout.kind, layout.P, layout.v, layout.M, 1, 2);
    cr_assert(result.completed, LAYOUT_FORMAT ": %s", LAYOUT_ARGS(layout), result.problem);
    cr_assert_str_empty(result.problem, LAYOUT_FORMAT ": %s", LAYOUT_ARGS(layout),
                        result.problem);
}

Test(schedule, every_accepted_layout_completes_without_deadlock)
{
    cr_assert_eq(sweep_accepted_layouts(check_completes), ACCEPTED_LAYOUTS);
}

static void check_forward_before_backward(Layout layout)
{
    SimulationResult result = schedule_simulate(layout.kind, layout.P, layout.v, layout.M, 1, 2);
    cr_assert(result.forward_before_backward, LAYOUT_FORMAT ": %s", LAYOUT_ARGS(layout),
              result.problem);
}

Test(schedule, every_forward_finishes_before_its_backward_starts)
{
    cr_assert_eq(sweep_accepted_layouts(check_forward_before_backward), ACCEPTED_LAYOUTS);
}

/* The hops one stage sends to another in one direction, as (microbatch, sending chunk)
 * codes in the order of the sender's list, or as the receiver consumes them in its list. */
static int hop_sequence(Layout layout, int direction, int sender, bool as_sent, int *codes)
{
    const int P = layout.P, C = P * layout.v;
    const int receiver = direction == 0 ? (sender + 1) % P : (sender - 1 + P) % P;
    int count, n = 0;
    Action *actions = actions_of_stage(layout, as_sent ? sender : receiver, &count);
    for (int i = 0; i < count; i++) {
        const Action a = actions[i];
        const bool forward = a.kind == ACTION_FORWARD;
        if ((direction == 0) != forward)
            continue;
        /* the chunk that sends this hop, if any: the action's own (a send) or its
         * neighbour's (a receive) */
        int from;
        if (as_sent)
            from = forward ? (a.chunk < C - 1 ? a.chunk : -1) : (a.chunk > 0 ? a.chunk : -1);
        else
            from = forward ? a.chunk - 1 : (a.chunk < C - 1 ? a.chunk + 1 : -1);
        if (from >= 0 && from % P == sender)
            codes[n++] = a.microbatch * C + from;
    }
    free(actions);
    return n;
}

/* NCCL matches the messages between two ranks in the order they are issued (the hops carry
 * no tags; runtime/device_comm.h), so each stage must send its hops to a neighbour in the
 * order the neighbour receives them, per direction. */
static void check_hops_in_receive_order(Layout layout)
{
    const int capacity = 2 * layout.M * layout.v;
    int *sent = malloc((size_t)capacity * sizeof *sent);
    int *received = malloc((size_t)capacity * sizeof *received);
    for (int direction = 0; direction < 2; direction++)
        for (int sender = 0; sender < layout.P; sender++) {
            const int n_sent = hop_sequence(layout, direction, sender, true, sent);
            const int n_received = hop_sequence(layout, direction, sender, false, received);
            cr_assert_eq(n_sent, n_received, LAYOUT_FORMAT " %s hops of stage %d: %d sent, "
                         "%d received", LAYOUT_ARGS(layout), direction ? "backward" : "forward",
                         sender, n_sent, n_received);
            for (int i = 0; i < n_sent; i++)
                cr_assert_eq(sent[i], received[i], LAYOUT_FORMAT " %s hop %d of stage %d: "
                             "sent (mb %d, chunk %d), received as (mb %d, chunk %d)",
                             LAYOUT_ARGS(layout), direction ? "backward" : "forward", i, sender,
                             sent[i] / (layout.P * layout.v), sent[i] % (layout.P * layout.v),
                             received[i] / (layout.P * layout.v),
                             received[i] % (layout.P * layout.v));
        }
    free(sent);
    free(received);
}

Test(schedule, every_stage_sends_its_hops_in_the_order_its_neighbour_receives_them)
{
    cr_assert_eq(sweep_accepted_layouts(check_hops_in_receive_order), ACCEPTED_LAYOUTS);
}

/* Counted here from the lists themselves, not from the simulator. */
static void check_each_action_once_on_its_stage(Layout layout)
{
    int C = layout.P * layout.v;
    int *forwards = calloc((size_t)(layout.M * C), sizeof(int));
    int *backwards = calloc((size_t)(layout.M * C), sizeof(int));
    for (int stage = 0; stage < layout.P; stage++) {
        int count;
        Action *actions = actions_of_stage(layout, stage, &count);
        for (int i = 0; i < count; i++) {
            Action a = actions[i];
            cr_assert(a.microbatch >= 0 && a.microbatch < layout.M && a.chunk >= 0 &&
                      a.chunk < C, LAYOUT_FORMAT " stage %d action %d out of range",
                      LAYOUT_ARGS(layout), stage, i);
            cr_assert_eq(a.chunk % layout.P, stage, LAYOUT_FORMAT ": chunk %d on stage %d",
                         LAYOUT_ARGS(layout), a.chunk, stage);
            int *seen = a.kind == ACTION_FORWARD ? forwards : backwards;
            seen[a.microbatch * C + a.chunk]++;
        }
        free(actions);
    }
    for (int i = 0; i < layout.M * C; i++) {
        cr_assert_eq(forwards[i], 1, LAYOUT_FORMAT ": forward of microbatch %d chunk %d runs "
                     "%d times", LAYOUT_ARGS(layout), i / C, i % C, forwards[i]);
        cr_assert_eq(backwards[i], 1, LAYOUT_FORMAT ": backward of microbatch %d chunk %d "
                     "runs %d times", LAYOUT_ARGS(layout), i / C, i % C, backwards[i]);
    }
    free(forwards);
    free(backwards);
    SimulationResult result = schedule_simulate(layout.kind, layout.P, layout.v, layout.M, 1, 1);
    cr_assert(result.each_action_once, LAYOUT_FORMAT ": %s", LAYOUT_ARGS(layout),
              result.problem);
}

Test(schedule, every_forward_and_backward_runs_exactly_once_on_its_stage)
{
    cr_assert_eq(sweep_accepted_layouts(check_each_action_once_on_its_stage), ACCEPTED_LAYOUTS);
}

static void check_stash_bound_is_tight(Layout layout)
{
    SimulationResult result = schedule_simulate(layout.kind, layout.P, layout.v, layout.M, 1, 2);
    cr_assert_eq(result.stages, layout.P);
    for (int stage = 0; stage < layout.P; stage++) {
        int bound = schedule_stash_bound(layout.kind, layout.P, layout.v, layout.M, stage);
        cr_assert_leq(result.peak_stash[stage], bound, LAYOUT_FORMAT " stage %d: peak %d > "
                      "bound %d", LAYOUT_ARGS(layout), stage, result.peak_stash[stage], bound);
        cr_assert_eq(result.peak_stash[stage], bound, LAYOUT_FORMAT " stage %d: peak %d, "
                     "bound %d", LAYOUT_ARGS(layout), stage, result.peak_stash[stage], bound);
    }
}

Test(schedule, peak_stash_of_every_stage_equals_its_bound)
{
    cr_assert_eq(sweep_accepted_layouts(check_stash_bound_is_tight), ACCEPTED_LAYOUTS);
}

/* What the executor allocates and the memory plan counts: with one chunk a stage the stashes
 * and the open microbatches are both the stage's stash bound; gpipe holds every microbatch;
 * no chunk holds more than M or than the bound. */
static void check_count_in_flight(Layout layout)
{
    for (int stage = 0; stage < layout.P; stage++) {
        int count, slots[MAX_V], open = -1;
        Action *actions = actions_of_stage(layout, stage, &count);
        schedule_count_in_flight(actions, count, layout.P, layout.v, layout.M, slots, &open);
        free(actions);
        const int bound = schedule_stash_bound(layout.kind, layout.P, layout.v, layout.M,
                                               stage);
        for (int k = 0; k < layout.v; k++) {
            cr_assert(slots[k] >= 1 && slots[k] <= layout.M && slots[k] <= bound,
                      LAYOUT_FORMAT " stage %d chunk %d: %d stashes (bound %d)",
                      LAYOUT_ARGS(layout), stage, k, slots[k], bound);
            if (layout.kind == SCHEDULE_GPIPE)
                cr_assert_eq(slots[k], layout.M, LAYOUT_FORMAT, LAYOUT_ARGS(layout));
        }
        cr_assert(open >= 1 && open <= layout.M, LAYOUT_FORMAT " stage %d: %d open",
                  LAYOUT_ARGS(layout), stage, open);
        if (layout.v == 1) {
            cr_assert_eq(slots[0], bound, LAYOUT_FORMAT " stage %d", LAYOUT_ARGS(layout), stage);
            cr_assert_eq(open, bound, LAYOUT_FORMAT " stage %d", LAYOUT_ARGS(layout), stage);
        }
        if (layout.kind == SCHEDULE_GPIPE)
            cr_assert_eq(open, layout.M, LAYOUT_FORMAT, LAYOUT_ARGS(layout));
    }
}

Test(schedule, stashes_and_open_microbatches_in_flight_stay_within_the_bound)
{
    cr_assert_eq(sweep_accepted_layouts(check_count_in_flight), ACCEPTED_LAYOUTS);
}

static void check_bubble(Layout layout, long tf, long tb)
{
    SimulationResult result =
        schedule_simulate(layout.kind, layout.P, layout.v, layout.M, tf, tb);
    long work = (long)layout.M * layout.v * (tf + tb);
    long formula = schedule_bubble_formula(layout.kind, layout.P, layout.v, layout.M, tf, tb);
    cr_assert_eq(result.makespan - work, formula, LAYOUT_FORMAT " tf=%ld tb=%ld: makespan "
                 "%ld, work %ld, formula %ld", LAYOUT_ARGS(layout), tf, tb, result.makespan,
                 work, formula);
}

static void check_bubble_backward_twice_forward(Layout layout) { check_bubble(layout, 1, 2); }
static void check_bubble_equal_times(Layout layout) { check_bubble(layout, 1, 1); }
static void check_bubble_forward_slower(Layout layout) { check_bubble(layout, 3, 1); }

Test(schedule, bubble_equals_the_formula_when_a_backward_takes_twice_a_forward)
{
    cr_assert_eq(sweep_accepted_layouts(check_bubble_backward_twice_forward), ACCEPTED_LAYOUTS);
}

Test(schedule, bubble_equals_the_formula_when_forward_and_backward_take_the_same_time)
{
    cr_assert_eq(sweep_accepted_layouts(check_bubble_equal_times), ACCEPTED_LAYOUTS);
}

Test(schedule, bubble_equals_the_formula_when_a_forward_is_slower_than_a_backward)
{
    cr_assert_eq(sweep_accepted_layouts(check_bubble_forward_slower), ACCEPTED_LAYOUTS);
}

static void check_formula_value(Layout layout)
{
    cr_assert_eq(schedule_bubble_formula(layout.kind, layout.P, layout.v, layout.M, 1, 2),
                 (long)(layout.P - 1) * 3, LAYOUT_FORMAT, LAYOUT_ARGS(layout));
}

Test(schedule, bubble_formula_is_p_minus_one_forward_backward_pairs_for_every_schedule)
{
    cr_assert_eq(sweep_accepted_layouts(check_formula_value), ACCEPTED_LAYOUTS);
}

static void check_length_and_capacity(Layout layout)
{
    int count = 2 * layout.M * layout.v;
    Action *full = malloc((size_t)count * sizeof *full);
    Action partial[3];
    Action sentinel = { ACTION_BACKWARD, -7, -7 };
    for (int stage = 0; stage < layout.P; stage++) {
        cr_assert_eq(schedule_actions(layout.kind, layout.P, layout.v, layout.M, stage, full,
                                      count), count);
        partial[2] = sentinel;
        cr_assert_eq(schedule_actions(layout.kind, layout.P, layout.v, layout.M, stage, partial,
                                      2), count, "a short buffer still returns the count");
        cr_assert_eq(memcmp(partial, full, 2 * sizeof *full), 0);
        cr_assert_eq(partial[2].microbatch, -7, "nothing is written past capacity");
    }
    free(full);
}

Test(schedule, every_stage_lists_two_m_v_actions_and_never_writes_past_capacity)
{
    cr_assert_eq(sweep_accepted_layouts(check_length_and_capacity), ACCEPTED_LAYOUTS);
}

/* --- the orders themselves --------------------------------------------------------------- */

Test(schedule, interleaved_with_one_chunk_per_stage_gives_exactly_the_1f1b_lists)
{
    int compared = 0;
    for (int P = 1; P <= MAX_P; P++)
        for (int M = P; M <= MAX_M; M += P) { /* interleaved needs P | M; 1f1b needs M >= P */
            Layout interleaved = { SCHEDULE_INTERLEAVED, P, 1, M };
            Layout one_f_one_b = { SCHEDULE_1F1B, P, 1, M };
            for (int stage = 0; stage < P; stage++) {
                int count_a, count_b;
                Action *a = actions_of_stage(interleaved, stage, &count_a);
                Action *b = actions_of_stage(one_f_one_b, stage, &count_b);
                cr_assert_eq(count_a, count_b);
                cr_assert_eq(memcmp(a, b, (size_t)count_a * sizeof *a), 0,
                             "P=%d M=%d stage %d differs", P, M, stage);
                free(a);
                free(b);
                compared++;
            }
        }
    cr_assert_gt(compared, 0);
}

static void assert_list(Layout layout, int stage, const char *expected)
{
    int count;
    Action *actions = actions_of_stage(layout, stage, &count);
    char text[1024] = "";
    size_t used = 0;
    for (int i = 0; i < count; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%c%d.%d", i ? " " : "",
                                 actions[i].kind == ACTION_FORWARD ? 'F' : 'B',
                                 actions[i].microbatch, actions[i].chunk);
    free(actions);
    cr_assert_str_eq(text, expected, LAYOUT_FORMAT " stage %d", LAYOUT_ARGS(layout), stage);
}

/* F<mb>.<chunk> / B<mb>.<chunk>, chunks global. */
Test(schedule, gpipe_runs_every_forward_then_every_backward_microbatch_zero_first)
{
    Layout gpipe = { SCHEDULE_GPIPE, 2, 1, 3 };
    assert_list(gpipe, 0, "F0.0 F1.0 F2.0 B0.0 B1.0 B2.0");
    assert_list(gpipe, 1, "F0.1 F1.1 F2.1 B0.1 B1.1 B2.1");
}

Test(schedule, one_f_one_b_warms_up_with_p_minus_stage_minus_one_forwards)
{
    Layout one_f_one_b = { SCHEDULE_1F1B, 3, 1, 4 };
    assert_list(one_f_one_b, 0, "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 B2.0 B3.0");
    assert_list(one_f_one_b, 1, "F0.1 F1.1 B0.1 F2.1 B1.1 F3.1 B2.1 B3.1");
    assert_list(one_f_one_b, 2, "F0.2 B0.2 F1.2 B1.2 F2.2 B2.2 F3.2 B3.2");
}

/* Megatron-LM's table for P = 2, v = 2: microbatches in groups of P, each group through
 * local chunk 0 then local chunk 1; warmup 2 (P - s - 1) + (v - 1) P = 4 on stage 0, 2 on
 * stage 1. Stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3. */
Test(schedule, interleaved_follows_megatron_order_for_two_stages_two_chunks)
{
    Layout interleaved = { SCHEDULE_INTERLEAVED, 2, 2, 4 };
    assert_list(interleaved, 0, "F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 "
                                "F2.2 B0.0 F3.2 B1.0 B2.2 B3.2 B2.0 B3.0");
    assert_list(interleaved, 1, "F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 "
                                "F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1");
}

Test(schedule, stash_bounds_for_four_stages_two_chunks_eight_microbatches)
{
    int expected[4] = { 11, 9, 7, 5 }; /* warmup 2 (3 - s) + 4, plus the steady forward */
    for (int stage = 0; stage < 4; stage++)
        cr_assert_eq(schedule_stash_bound(SCHEDULE_INTERLEAVED, 4, 2, 8, stage),
                     expected[stage], "stage %d", stage);
}

Test(schedule, stash_bounds_of_gpipe_and_1f1b)
{
    for (int stage = 0; stage < 4; stage++) {
        cr_assert_eq(schedule_stash_bound(SCHEDULE_GPIPE, 4, 1, 6, stage), 6);
        cr_assert_eq(schedule_stash_bound(SCHEDULE_1F1B, 4, 1, 6, stage), 4 - stage);
    }
}

Test(schedule, interleaved_with_few_microbatches_is_all_warmup_and_holds_everything)
{
    /* P = 4, v = 2, M = 4: stage 0's warmup 2 * 3 + 4 = 10 is capped at M v = 8 */
    cr_assert_eq(schedule_warmup_forwards(SCHEDULE_INTERLEAVED, 4, 2, 4, 0), 8);
    cr_assert_eq(schedule_stash_bound(SCHEDULE_INTERLEAVED, 4, 2, 4, 0), 8);
    cr_assert_eq(schedule_stash_bound(SCHEDULE_INTERLEAVED, 4, 2, 4, 3), 5);
}

/* --- schedule_check ---------------------------------------------------------------------- */

static void assert_refused(PipelineSchedule kind, int P, int v, int M,
                           const char *const *must_contain)
{
    const char *message = schedule_check(kind, P, v, M);
    cr_assert_not_null(message, "%s P=%d v=%d M=%d was accepted", schedule_names[kind], P, v,
                       M);
    for (int i = 0; must_contain[i]; i++)
        cr_assert(strstr(message, must_contain[i]), "\"%s\" does not name \"%s\"", message,
                  must_contain[i]);
    cr_assert_eq(schedule_actions(kind, P, v, M, 0, NULL, 0), -1);
    cr_assert_eq(schedule_stash_bound(kind, P, v, M, 0), -1);
    cr_assert_eq(schedule_bubble_formula(kind, P, v, M, 1, 2), -1);
    SimulationResult result = schedule_simulate(kind, P, v, M, 1, 2);
    cr_assert_not(result.completed);
    cr_assert_str_eq(result.problem, message);
}

Test(schedule, gpipe_with_virtual_stages_is_refused_naming_virtual_stages_and_interleaved)
{
    assert_refused(SCHEDULE_GPIPE, 2, 2, 4, (const char *const[]){
        "parallel.virtual_stages = 2", "parallel.schedule: interleaved", NULL });
}

Test(schedule, one_f_one_b_with_virtual_stages_is_refused_naming_virtual_stages_and_interleaved)
{
    assert_refused(SCHEDULE_1F1B, 2, 3, 4, (const char *const[]){
        "parallel.virtual_stages = 3", "parallel.schedule: interleaved", NULL });
}

Test(schedule, one_f_one_b_with_fewer_microbatches_than_stages_is_refused_with_the_numbers)
{
    assert_refused(SCHEDULE_1F1B, 4, 1, 3, (const char *const[]){
        "parallel.schedule = 1f1b", "parallel.pp = 4", "train.global_batch_size",
        "train.microbatch_size", "parallel.dp", "is 3", NULL });
}

Test(schedule, interleaved_with_fewer_microbatches_than_stages_is_refused)
{
    assert_refused(SCHEDULE_INTERLEAVED, 4, 2, 2, (const char *const[]){
        "parallel.schedule = interleaved", "parallel.pp = 4", "train.global_batch_size",
        NULL });
}

Test(schedule, interleaved_with_microbatches_not_divisible_by_stages_is_refused)
{
    assert_refused(SCHEDULE_INTERLEAVED, 4, 2, 6, (const char *const[]){
        "divisible by parallel.pp = 4", "= 6", "train.global_batch_size",
        "train.microbatch_size", "parallel.dp", NULL });
}

Test(schedule, non_positive_stages_chunks_or_microbatches_are_refused_naming_the_key)
{
    assert_refused(SCHEDULE_1F1B, 0, 1, 4, (const char *const[]){ "parallel.pp = 0", NULL });
    assert_refused(SCHEDULE_INTERLEAVED, 2, 0, 4,
                   (const char *const[]){ "parallel.virtual_stages = 0", NULL });
    assert_refused(SCHEDULE_GPIPE, 2, 1, 0,
                   (const char *const[]){ "train.global_batch_size", "is 0", NULL });
}

Test(schedule, gpipe_accepts_fewer_microbatches_than_stages)
{
    cr_assert_null(schedule_check(SCHEDULE_GPIPE, 8, 1, 1));
    cr_assert(schedule_simulate(SCHEDULE_GPIPE, 8, 1, 1, 1, 2).completed);
}

Test(schedule, a_stage_outside_the_pipeline_has_no_actions)
{
    cr_assert_eq(schedule_actions(SCHEDULE_1F1B, 2, 1, 4, 2, NULL, 0), -1);
    cr_assert_eq(schedule_actions(SCHEDULE_1F1B, 2, 1, 4, -1, NULL, 0), -1);
    cr_assert_eq(schedule_stash_bound(SCHEDULE_1F1B, 2, 1, 4, 2), -1);
}

/* --- the simulator catches broken lists -------------------------------------------------- */

typedef struct {
    Action actions[MAX_P][2 * MAX_M * MAX_V];
    const Action *lists[MAX_P];
    int counts[MAX_P];
} StageLists;

static void stage_lists_fill(StageLists *lists, Layout layout)
{
    for (int stage = 0; stage < layout.P; stage++) {
        lists->counts[stage] = schedule_actions(layout.kind, layout.P, layout.v, layout.M,
                                                stage, lists->actions[stage],
                                                2 * MAX_M * MAX_V);
        lists->lists[stage] = lists->actions[stage];
    }
}

static SimulationResult stage_lists_simulate(const StageLists *lists, Layout layout)
{
    return schedule_simulate_lists(layout.P, layout.v, layout.M, lists->lists, lists->counts,
                                   1, 2);
}

static void swap_actions(StageLists *lists, int stage, int i, int j)
{
    Action kept = lists->actions[stage][i];
    lists->actions[stage][i] = lists->actions[stage][j];
    lists->actions[stage][j] = kept;
}

Test(schedule, simulator_of_unchanged_lists_agrees_with_schedule_simulate)
{
    Layout layout = { SCHEDULE_INTERLEAVED, 4, 2, 8 };
    StageLists lists;
    stage_lists_fill(&lists, layout);
    SimulationResult by_lists = stage_lists_simulate(&lists, layout);
    SimulationResult direct = schedule_simulate(layout.kind, 4, 2, 8, 1, 2);
    cr_assert(by_lists.completed);
    cr_assert_eq(by_lists.makespan, direct.makespan);
    cr_assert_eq(by_lists.makespan, (8 * 2 + 4 - 1) * 3);
}

/* gpipe P = 2, M = 2, stage 0 "F0.0 F1.0 B0.0 B1.0": swapping its second and third actions
 * makes B0.0 wait for B0.1, which waits (on stage 1) for F1.1, which waits for F1.0, which
 * stage 0 runs only after B0.0: a cycle across stages. */
Test(schedule, swapping_two_actions_into_a_cycle_across_stages_is_reported_as_a_deadlock)
{
    Layout layout = { SCHEDULE_GPIPE, 2, 1, 2 };
    StageLists lists;
    stage_lists_fill(&lists, layout);
    cr_assert(stage_lists_simulate(&lists, layout).completed);
    swap_actions(&lists, 0, 1, 2);
    SimulationResult result = stage_lists_simulate(&lists, layout);
    cr_assert_not(result.completed);
    cr_assert(result.each_action_once, "the swapped lists still name every action once");
    cr_assert(strstr(result.problem, "deadlock"), "%s", result.problem);
}

Test(schedule, a_backward_listed_before_its_own_forward_is_reported_as_a_deadlock)
{
    Layout layout = { SCHEDULE_INTERLEAVED, 4, 2, 8 };
    StageLists lists;
    stage_lists_fill(&lists, layout);
    /* stage 3: "F0.3 F1.3 F2.3 F3.3 F0.7 B0.7 ...": swap F0.7 and B0.7 */
    cr_assert_eq(lists.actions[3][4].kind, ACTION_FORWARD);
    cr_assert_eq(lists.actions[3][5].kind, ACTION_BACKWARD);
    cr_assert_eq(lists.actions[3][5].chunk, lists.actions[3][4].chunk);
    swap_actions(&lists, 3, 4, 5);
    SimulationResult result = stage_lists_simulate(&lists, layout);
    cr_assert_not(result.completed);
    cr_assert(strstr(result.problem, "stage 3 action 4 (backward mb 0 chunk 7)"), "%s",
              result.problem);
}

Test(schedule, a_missing_action_is_reported)
{
    Layout layout = { SCHEDULE_1F1B, 2, 1, 4 };
    StageLists lists;
    stage_lists_fill(&lists, layout);
    lists.counts[1]--; /* drop stage 1's last backward */
    SimulationResult result = stage_lists_simulate(&lists, layout);
    cr_assert_not(result.each_action_once);
    cr_assert_not(result.completed);
    cr_assert(strstr(result.problem, "never runs the backward of microbatch 3 chunk 1"), "%s",
              result.problem);
}

Test(schedule, a_repeated_action_is_reported)
{
    Layout layout = { SCHEDULE_1F1B, 2, 1, 4 };
    StageLists lists;
    stage_lists_fill(&lists, layout);
    lists.actions[0][1] = lists.actions[0][0];
    SimulationResult result = stage_lists_simulate(&lists, layout);
    cr_assert_not(result.each_action_once);
    cr_assert(strstr(result.problem, "repeats forward microbatch 0 chunk 0"), "%s",
              result.problem);
}

Test(schedule, an_action_on_another_stages_chunk_is_reported)
{
    Layout layout = { SCHEDULE_1F1B, 2, 1, 4 };
    StageLists lists;
    stage_lists_fill(&lists, layout);
    lists.actions[0][0].chunk = 1;
    SimulationResult result = stage_lists_simulate(&lists, layout);
    cr_assert_not(result.each_action_once);
    cr_assert(strstr(result.problem, "another stage's chunk"), "%s", result.problem);
}

Test(schedule, one_stage_runs_back_to_back_with_no_bubble)
{
    /* P = 1: nothing to wait for, the makespan is the work, 3 * (1 + 2) */
    SimulationResult result = schedule_simulate(SCHEDULE_1F1B, 1, 1, 3, 1, 2);
    cr_assert(result.completed);
    cr_assert_eq(result.makespan, 9);
    cr_assert_eq(result.finish[0], 9);
}
