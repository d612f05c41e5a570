/* tests/test_pipeline_evaluation.c — evaluation during a pipeline run (eval.every with
 * parallel.pp > 1), under mpirun on the cpu (DESIGN 3, 7): the windows go through the
 * stages' chunks forward only, each dp rank its share, and every layout logs the val_loss
 * of the one-rank run (to the rounding of the weights each layout trained: relative 1e-5),
 * and the training after each evaluation goes on as the one-rank run's.
 *
 * 16 windows of 32 tokens, microbatches of 2: 8 microbatches on one dp rank, more than a
 * stage's summary stores, so an evaluation runs in several groups (pipeline/executor.c);
 * evaluations after steps 2, 4 and 5 (the last).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/layout_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

#define EVALUATION "--set eval.every=2 --set eval.samples=16"
#define EVALUATIONS 3

static void expect_layouts_evaluate_as_single(const char *config, const Layout *layouts, int n,
                                              const char *tag)
{
    Runs runs;
    runs_begin(&runs, tag);
    cr_assert_eq(layout_train(1, config, EVALUATION, runs.single, runs.output), 0, "%s",
                 runs.output);
    double single[EVALUATIONS + 1], got[EVALUATIONS + 1], single_losses[LAYOUT_STEPS];
    int steps[EVALUATIONS + 1], got_steps[EVALUATIONS + 1], loss_steps[LAYOUT_STEPS];
    cr_assert_eq(metrics_read_val_losses(runs.single, single, steps, EVALUATIONS + 1),
                 EVALUATIONS);
    cr_assert_eq(metrics_read_losses(runs.single, single_losses, loss_steps, LAYOUT_STEPS),
                 LAYOUT_STEPS);
    for (int l = 0; l < n; l++) {
        char extra[1024];
        snprintf(extra, sizeof extra, "%s %s", EVALUATION, layouts[l].overrides);
        test_remove_tree(runs.layout);
        cr_assert_eq(layout_train(layouts[l].ranks, config, extra, runs.layout, runs.output), 0,
                     "%s %s\n%s", config, extra, runs.output);
        cr_assert_eq(metrics_read_val_losses(runs.layout, got, got_steps, EVALUATIONS + 1),
                     EVALUATIONS, "%s %s", config, extra);
        for (int e = 0; e < EVALUATIONS; e++) {
            cr_expect_eq(got_steps[e], steps[e]);
            cr_expect(fabs(got[e] - single[e]) <= 1e-5 * fabs(single[e]),
                      "%s %s: val_loss after step %d %.9g, one rank %.9g", config, extra,
                      steps[e], got[e], single[e]);
        }
        char label[1300];
        snprintf(label, sizeof label, "%s %s", config, extra);
        expect_step_losses_equal(runs.layout, single_losses, label);
    }
    runs_end(&runs);
}

/* The delta form's hops carry p and the block summaries, with the cross-stage cache when a
 * stage has two chunks. */
Test(pipeline_evaluation, every_layout_of_mhar_delta_evaluates_the_one_rank_val_loss,
     .timeout = 300)
{
    const Layout layouts[] = {
        {2, "--set parallel.pp=2"},
        {2, "--set parallel.pp=2 --set parallel.virtual_stages=2 "
            "--set parallel.schedule=interleaved"},
        {4, "--set parallel.pp=2 --set parallel.dp=2"},
        {4, "--set parallel.pp=4 --set train.activation_checkpointing=full"},
    };
    expect_layouts_evaluate_as_single("demo_mhar_delta", layouts,
                                      (int)(sizeof layouts / sizeof layouts[0]),
                                      "eval-mhar-delta");
}

Test(pipeline_evaluation, every_layout_of_the_standard_residual_evaluates_the_one_rank_val_loss,
     .timeout = 300)
{
    const Layout layouts[] = {
        {2, "--set parallel.pp=2 --set parallel.schedule=gpipe"},
        {4, "--set parallel.pp=2 --set parallel.dp=2 --set parallel.virtual_stages=2 "
            "--set parallel.schedule=interleaved"},
    };
    expect_layouts_evaluate_as_single("demo", layouts, (int)(sizeof layouts / sizeof layouts[0]),
                                      "eval-standard");
}

/* The synthetic validation stream holds 1985 windows of 33 tokens: asked for 2000 through
 * pp2 x dp2 (microbatches of 2), the evaluation reads the 1984 that fill whole microbatches
 * on both dp ranks, says so, and logs what one rank logs for 1984. */
Test(pipeline_evaluation, validation_data_shorter_than_eval_samples_is_cut_to_whole_microbatches,
     .timeout = 300)
{
    Runs runs;
    runs_begin(&runs, "eval-cut");
    const char *last_step = "--set eval.every=5";
    char extra[512];
    snprintf(extra, sizeof extra, "%s --set eval.samples=1984", last_step);
    cr_assert_eq(layout_train(1, "demo", extra, runs.single, runs.output), 0, "%s", runs.output);
    snprintf(extra, sizeof extra, "%s --set eval.samples=2000 --set parallel.pp=2 "
             "--set parallel.dp=2", last_step);
    cr_assert_eq(layout_train(4, "demo", extra, runs.layout, runs.output), 0, "%s", runs.output);
    cr_expect(strstr(runs.output, "eval.samples = 2000, but the validation data holds 1985 "
                                  "windows: each evaluation reads 1984"),
              "%s", runs.output);
    double single, got;
    int step, got_step;
    cr_assert_eq(metrics_read_val_losses(runs.single, &single, &step, 1), 1);
    cr_assert_eq(metrics_read_val_losses(runs.layout, &got, &got_step, 1), 1);
    cr_expect(fabs(got - single) <= 1e-5 * fabs(single), "val_loss %.9g, one rank %.9g", got,
              single);
    runs_end(&runs);
}
