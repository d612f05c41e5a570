/* tests/test_schedule_evaluation.c — the forward-only lists of an evaluation through the
 * pipeline (pipeline/schedule.h schedule_evaluation_actions), over P in 1..8, v in 1..4,
 * M in 1..16: every stage lists each of its forwards once, chunk-major; run together they
 * cannot deadlock; and every stage sends its hops to its neighbour in the order the
 * neighbour receives them (NCCL matches untagged messages in order, and with virtual stages
 * one link carries two chunks' hops).
 */
#include "pipeline/schedule.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#define MAX_P 8
#define MAX_V 4
#define MAX_M 16

static Action *evaluation_list(int P, int v, int M, int stage, int *count)
{
    *count = schedule_evaluation_actions(P, v, M, stage, NULL, 0);
    cr_assert_eq(*count, M * v, "P=%d v=%d M=%d stage %d: %d actions", P, v, M, stage, *count);
    Action *actions = malloc((size_t)*count * sizeof *actions);
    cr_assert_eq(schedule_evaluation_actions(P, v, M, stage, actions, *count), *count);
    return actions;
}

Test(schedule_evaluation, every_stage_lists_its_forwards_once_chunk_major)
{
    for (int P = 1; P <= MAX_P; P++)
        for (int v = 1; v <= MAX_V; v++)
            for (int M = 1; M <= MAX_M; M++)
                for (int stage = 0; stage < P; stage++) {
                    int n;
                    Action *actions = evaluation_list(P, v, M, stage, &n);
                    for (int i = 0; i < n; i++) {
                        const Action expected = {ACTION_FORWARD, i % M, (i / M) * P + stage};
                        cr_assert(actions[i].kind == expected.kind &&
                                      actions[i].microbatch == expected.microbatch &&
                                      actions[i].chunk == expected.chunk,
                                  "P=%d v=%d M=%d stage %d action %d: (%d, mb %d, chunk %d)",
                                  P, v, M, stage, i, actions[i].kind, actions[i].microbatch,
                                  actions[i].chunk);
                    }
                    free(actions);
                }
    cr_assert_eq(schedule_evaluation_actions(2, 1, 0, 0, NULL, 0), -1);
    cr_assert_eq(schedule_evaluation_actions(2, 1, 1, 2, NULL, 0), -1);
}

/* The simulator takes training lists: each stage's evaluation list, then its backwards
 * last chunk first (which cannot wait in a cycle either). A deadlock of the forwards would
 * stop the whole list, since no forward waits for a backward. */
Test(schedule_evaluation, every_layout_runs_its_forwards_without_deadlock)
{
    int layouts = 0;
    for (int P = 1; P <= MAX_P; P++)
        for (int v = 1; v <= MAX_V; v++)
            for (int M = 1; M <= MAX_M; M++) {
                Action *lists[MAX_P];
                int counts[MAX_P];
                for (int s = 0; s < P; s++) {
                    int n;
                    Action *forwards = evaluation_list(P, v, M, s, &n);
                    lists[s] = malloc(2 * (size_t)n * sizeof *lists[s]);
                    for (int i = 0; i < n; i++)
                        lists[s][i] = forwards[i];
                    int k = n;
                    for (int local = v - 1; local >= 0; local--)
                        for (int mb = 0; mb < M; mb++)
                            lists[s][k++] = (Action){ACTION_BACKWARD, mb, local * P + s};
                    counts[s] = k;
                    free(forwards);
                }
                const SimulationResult result = schedule_simulate_lists(
                    P, v, M, (const Action *const *)lists, counts, 1, 2);
                cr_assert(result.completed && result.each_action_once,
                          "P=%d v=%d M=%d: %s", P, v, M, result.problem);
                for (int s = 0; s < P; s++)
                    free(lists[s]);
                layouts++;
            }
    cr_assert_eq(layouts, MAX_P * MAX_V * MAX_M);
}

/* The forward hops stage `sender` sends, as microbatch * C + sending chunk, in the order of
 * its list (as_sent) or of the receiver's list. */
static int forward_hops(int P, int v, int M, int sender, bool as_sent, int *codes)
{
    const int C = P * v, receiver = (sender + 1) % P;
    int count, n = 0;
    Action *actions = evaluation_list(P, v, M, as_sent ? sender : receiver, &count);
    for (int i = 0; i < count; i++) {
        const int from = as_sent ? (actions[i].chunk < C - 1 ? actions[i].chunk : -1)
                                 : actions[i].chunk - 1;
        if (from >= 0 && from % P == sender)
            codes[n++] = actions[i].microbatch * C + from;
    }
    free(actions);
    return n;
}

Test(schedule_evaluation, every_stage_sends_its_hops_in_the_order_its_neighbour_receives_them)
{
    int sent[MAX_V * MAX_M], received[MAX_V * MAX_M];
    for (int P = 1; P <= MAX_P; P++)
        for (int v = 1; v <= MAX_V; v++)
            for (int M = 1; M <= MAX_M; M++)
                for (int sender = 0; sender < P; sender++) {
                    const int n_sent = forward_hops(P, v, M, sender, true, sent);
                    const int n_received = forward_hops(P, v, M, sender, false, received);
                    cr_assert_eq(n_sent, n_received, "P=%d v=%d M=%d stage %d: %d hops sent, "
                                 "%d received", P, v, M, sender, n_sent, n_received);
                    for (int i = 0; i < n_sent; i++)
                        cr_assert_eq(sent[i], received[i], "P=%d v=%d M=%d stage %d hop %d: "
                                     "sent %d, received as %d", P, v, M, sender, i, sent[i],
                                     received[i]);
                }
}
