/* tests/layout_support.c — see layout_support.h. */
#include "tests/layout_support.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/pipeline_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

const char *const LAYOUT_COMMON =
    "--set model.d_model=32 --set model.n_heads=2 --set model.n_kv_heads=1 "
    "--set model.head_dim=16 --set model.ffn_dim=64 --set train.seq_len=32 "
    "--set train.microbatch_size=2 --set train.global_batch_size=8 --set train.steps=5 "
    "--set log.every=1 --set eval.every=0 --set checkpoint.every=5";

int layout_train(int ranks, const char *config, const char *extra, const char *run_dir,
                 char *output)
{
    return pipeline_train(ranks, config, LAYOUT_COMMON, extra, run_dir, output,
                          LAYOUT_OUTPUT_CAPACITY);
}

void runs_begin(Runs *runs, const char *tag)
{
    test_make_temp_dir(runs->root, tag);
    snprintf(runs->single, sizeof runs->single, "%s/single", runs->root);
    snprintf(runs->layout, sizeof runs->layout, "%s/layout", runs->root);
    runs->output = malloc(LAYOUT_OUTPUT_CAPACITY);
}

void runs_end(Runs *runs)
{
    test_remove_tree(runs->root);
    free(runs->output);
}

/* Every /model tensor of the two runs' step-5 checkpoints agrees to relative 1e-5: the
 * largest difference against the tensor's largest value, or against the learning rate for
 * a tensor smaller than it. Layouts sum gradients in other orders (a summary's gradient
 * meets its readers stage by stage), and the tensors that start at zero (alpha, queries,
 * null) sit where AdamW's step of about lr turns such last-bit differences into relative
 * ones of their own tiny size: alpha at 3e-5 after 5 steps differs by 1e-9. */
int layout_weights_agree(const char *run_a, const char *run_b, char *output)
{
    char command[2048];
    snprintf(command, sizeof command,
             "python3 -c \"import h5py, numpy, sys\n"
             "a = h5py.File('%s/checkpoints/step_00000005/index.h5', 'r')['model']\n"
             "b = h5py.File('%s/checkpoints/step_00000005/index.h5', 'r')['model']\n"
             "assert sorted(a) == sorted(b)\n"
             "worst = max(float(numpy.abs(a[k][()] - b[k][()]).max() / "
             "max(numpy.abs(b[k][()]).max(), %g)) for k in a)\n"
             "print('worst relative difference', worst)\n"
             "sys.exit(0 if worst <= 1e-5 else 1)\"",
             run_a, run_b, LAYOUT_LR);
    return test_run_command(command, output, LAYOUT_OUTPUT_CAPACITY);
}

void expect_step_losses_equal(const char *run_dir, const double *single, const char *label)
{
    double losses[LAYOUT_STEPS];
    int steps[LAYOUT_STEPS];
    cr_assert_eq(metrics_read_losses(run_dir, losses, steps, LAYOUT_STEPS), LAYOUT_STEPS,
                 "%s", label);
    for (int s = 0; s < LAYOUT_STEPS; s++)
        cr_expect(fabs(losses[s] - single[s]) <= 1e-5 * fabs(single[s]),
                  "%s: step %d loss %.9g, one rank %.9g", label, s + 1, losses[s], single[s]);
}

/* Trains `config` + `network` on one rank, then on each layout (ranks, overrides), and
 * holds every layout's losses and step-5 weights to the one-rank run's. */
void expect_layouts_equal_single(const char *config, const char *network,
                                        const Layout *layouts, int n, const char *tag)
{
    Runs runs;
    runs_begin(&runs, tag);
    cr_assert_eq(layout_train(1, config, network, runs.single, runs.output), 0, "%s",
                 runs.output);
    double single[LAYOUT_STEPS];
    int steps[LAYOUT_STEPS];
    cr_assert_eq(metrics_read_losses(runs.single, single, steps, LAYOUT_STEPS), LAYOUT_STEPS);
    for (int l = 0; l < n; l++) {
        char extra[1024];
        snprintf(extra, sizeof extra, "%s %s", network, layouts[l].overrides);
        test_remove_tree(runs.layout);
        cr_assert_eq(layout_train(layouts[l].ranks, config, extra, runs.layout, runs.output), 0,
                     "%s %s\n%s", config, extra, runs.output);
        char label[1300];
        snprintf(label, sizeof label, "%s %s", config, extra);
        expect_step_losses_equal(runs.layout, single, label);
        cr_expect_eq(layout_weights_agree(runs.layout, runs.single, runs.output), 0, "%s %s: %s",
                     config, extra, runs.output);
    }
    runs_end(&runs);
}

void expect_network_layout_equals_single(const char *config, const char *network,
                                                int ranks, const char *layout, const char *tag)
{
    const Layout one = {ranks, layout};
    expect_layouts_equal_single(config, network, &one, 1, tag);
}

void expect_layout_equals_single(const char *config, int ranks, const char *extra,
                                        const char *tag)
{
    expect_network_layout_equals_single(config, "", ranks, extra, tag);
}

