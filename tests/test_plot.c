/* tests/test_plot.c — launch/tools/plot.py draws the metrics of real `fathom train` runs
 * and the JSON of `fathom probe`, and refuses bad input with one line and exit 2.
 *
 * Each test trains a tiny model (tests/train_support.c: 2 layers, d 64, 6 steps of 8 x 32
 * tokens, a few seconds on the cpu), probes it where it needs a probe, and has
 * tests/plot_checks.py check the figures: PNG sizes, pixels that vary, and the labels the
 * matplotlib figures carry before they are saved. Without python3, matplotlib, numpy, h5py
 * and PyYAML these tests fail (launch/setup.sh installs them).
 */
#include "tests/pipeline_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>

static char output[1 << 16];

static const char block_mhar_yaml[] =
    "residual:\n  mode: attnres\n  heads: 4\n  granularity: block\n  layers_per_block: 1\n"
    "eval:\n  every: 3\n  samples: 8\ncheckpoint:\n  every: 6\n";

/* Trains the tiny model with `residual_yaml` into <dir>/run (a fresh temp directory). */
static void train_tiny(char *dir, const char *tag, const char *residual_yaml)
{
    test_make_temp_dir(dir, tag);
    tiny_config_write(dir, residual_yaml);
    int code = tiny_train(dir, "--set train.steps=6", output, sizeof output);
    cr_assert_eq(code, 0, "training failed:\n%s", output);
}

/* Probes <dir>/run into <dir>/probe.json. */
static void probe_tiny(const char *dir)
{
    char arguments[1024];
    snprintf(arguments, sizeof arguments,
             "probe --checkpoint %s/run --weights raw --samples 2 --json %s/probe.json", dir,
             dir);
    int code = test_run_fathom(arguments, output, sizeof output);
    cr_assert_eq(code, 0, "probe failed (%d):\n%s", code, output);
}

/* Runs `python3 tests/plot_checks.py <check> <arguments>`; asserts that the check holds. */
static void expect_check(const char *check, const char *arguments)
{
    char command[4096];
    snprintf(command, sizeof command, "python3 '%s/tests/plot_checks.py' %s %s",
             test_source_dir(), check, arguments);
    int code = test_run_command(command, output, sizeof output);
    cr_assert_eq(code, 0, "plot check %s failed (%d):\n%s", check, code, output);
}

/* 1 when `directory` is absent or holds nothing (not even a hidden temporary file). */
static int directory_is_empty(const char *directory)
{
    DIR *listing = opendir(directory);
    if (!listing)
        return 1;
    int entries = 0;
    for (struct dirent *entry; (entry = readdir(listing));)
        entries += strcmp(entry->d_name, ".") && strcmp(entry->d_name, "..");
    closedir(listing);
    return entries == 0;
}

/* Runs plot.py with `arguments` and --out <dir>/out; asserts exit 2, stderr one line
 * "plot: error: ..." holding `expected`, no traceback, and nothing in <dir>/out. */
static void expect_plot_error(const char *dir, const char *arguments, const char *expected)
{
    char command[4096], out[400];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(command, sizeof command, "python3 '%s/launch/tools/plot.py' %s --out '%s' "
             "2>&1 >/dev/null", test_source_dir(), arguments, out);
    int code = test_run_command(command, output, sizeof output);
    cr_assert_eq(code, 2, "exit %d, not 2:\n%s", code, output);
    cr_assert(!strncmp(output, "plot: error: ", 13), "not a plot error line:\n%s", output);
    const char *newline = strchr(output, '\n');
    cr_assert(newline && newline[1] == '\0', "more than one line on stderr:\n%s", output);
    cr_assert(!strstr(output, "Traceback"), "%s", output);
    cr_assert(strstr(output, expected), "the error does not say '%s':\n%s", expected, output);
    cr_assert(directory_is_empty(out), "%s is not empty after an error", out);
}

Test(plot, a_run_gives_loss_throughput_and_grad_norm_pngs_of_their_sizes, .timeout = 120)
{
    char dir[256], arguments[600];
    train_tiny(dir, "plot-run", block_mhar_yaml);
    snprintf(arguments, sizeof arguments, "%s/run %s/out", dir, dir);
    expect_check("run-pngs", arguments);
    test_remove_tree(dir);
}

Test(plot, run_figures_carry_their_axis_labels_and_the_residual_mode, .timeout = 120)
{
    char dir[256], arguments[600];
    train_tiny(dir, "plot-labels", block_mhar_yaml);
    snprintf(arguments, sizeof arguments, "%s/run", dir);
    expect_check("run-labels", arguments);
    test_remove_tree(dir);
}

Test(plot, skipped_steps_are_marked_on_the_gradient_norm, .timeout = 120)
{
    char dir[256], arguments[600];
    train_tiny(dir, "plot-skipped", block_mhar_yaml);
    snprintf(arguments, sizeof arguments, "%s/run", dir);
    expect_check("skipped-steps", arguments);
    test_remove_tree(dir);
}

Test(plot, a_two_stage_run_gives_one_comm_row_per_stage, .timeout = 120)
{
    char dir[256], run[300], arguments[900];
    test_make_temp_dir(dir, "plot-comm");
    snprintf(run, sizeof run, "%s/run", dir);
    /* block MHAR on 2 stages, 2 chunks each: pp bytes and the cache's saving are real */
    const int code = pipeline_train(
        2, "demo_block_mhar",
        "--set model.d_model=32 --set model.n_heads=2 --set model.n_kv_heads=1 "
        "--set model.head_dim=16 --set model.ffn_dim=64 --set train.seq_len=32 "
        "--set train.microbatch_size=2 --set train.global_batch_size=8 --set train.steps=4 "
        "--set log.every=1 --set eval.every=0",
        "--set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved",
        run, output, sizeof output);
    cr_assert_eq(code, 0, "training failed:\n%s", output);
    snprintf(arguments, sizeof arguments, "%s %s/out", run, dir);
    expect_check("comm", arguments);
    test_remove_tree(dir);
}

Test(plot, a_block_mhar_probe_gives_depth_weights_and_width_kl_pngs, .timeout = 120)
{
    char dir[256], arguments[600];
    train_tiny(dir, "plot-probe", block_mhar_yaml);
    probe_tiny(dir);
    snprintf(arguments, sizeof arguments, "%s/probe.json %s/out", dir, dir);
    expect_check("probe-pngs", arguments);
    test_remove_tree(dir);
}

Test(plot, depth_weights_has_a_panel_per_head_labelled_with_sites_and_sources,
     .timeout = 120)
{
    char dir[256], arguments[600];
    train_tiny(dir, "plot-heads", block_mhar_yaml);
    probe_tiny(dir);
    snprintf(arguments, sizeof arguments, "%s/probe.json", dir);
    expect_check("probe-labels", arguments);
    test_remove_tree(dir);
}

Test(plot, an_msar_probe_gives_a_panel_per_stream_and_no_width_kl, .timeout = 120)
{
    char dir[256], arguments[600];
    train_tiny(dir, "plot-msar",
               "residual:\n  mode: msar\n  heads: 1\n  granularity: block\n"
               "  layers_per_block: 1\n  streams: 2\n  stream_kernels: [1, 2]\n"
               "checkpoint:\n  every: 6\n");
    probe_tiny(dir);
    snprintf(arguments, sizeof arguments, "%s/probe.json %s/out", dir, dir);
    expect_check("msar-probe", arguments);
    test_remove_tree(dir);
}

Test(plot, several_runs_overlay_with_their_residual_modes_in_the_legend, .timeout = 180)
{
    char baseline[256], mhar[256], arguments[900];
    train_tiny(baseline, "plot-baseline", "eval:\n  every: 3\n  samples: 8\n"
                                          "checkpoint:\n  every: 6\n");
    train_tiny(mhar, "plot-mhar", block_mhar_yaml);
    snprintf(arguments, sizeof arguments, "%s/out %s/run %s/run", mhar, baseline, mhar);
    expect_check("overlay", arguments);
    test_remove_tree(baseline);
    test_remove_tree(mhar);
}

/* ---- bad input: one line, exit 2, no PNG ---- */

Test(plot, a_missing_run_directory_exits_2, .timeout = 60)
{
    char dir[256], arguments[600];
    test_make_temp_dir(dir, "plot-missing");
    snprintf(arguments, sizeof arguments, "%s/no_such_run", dir);
    expect_plot_error(dir, arguments, "does not exist");
    test_remove_tree(dir);
}

Test(plot, an_empty_metrics_file_exits_2, .timeout = 60)
{
    char dir[256], path[400], command[900];
    test_make_temp_dir(dir, "plot-empty");
    snprintf(path, sizeof path, "%s/run", dir);
    snprintf(command, sizeof command, "mkdir -p '%s' && : > '%s/metrics.jsonl'", path, path);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    expect_plot_error(dir, path, "no logged step");
    test_remove_tree(dir);
}

Test(plot, a_truncated_metrics_file_exits_2, .timeout = 120)
{
    char dir[256], command[900], arguments[600];
    train_tiny(dir, "plot-truncated", block_mhar_yaml);
    /* a run killed mid-write: the last line loses its second half */
    snprintf(command, sizeof command, "truncate -s -40 '%s/run/metrics.jsonl'", dir);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    snprintf(arguments, sizeof arguments, "%s/run", dir);
    expect_plot_error(dir, arguments, "is not a whole JSON object");
    test_remove_tree(dir);
}

Test(plot, a_probe_json_of_the_wrong_shape_exits_2, .timeout = 120)
{
    char dir[256], command[1200], arguments[600];
    train_tiny(dir, "plot-shape", block_mhar_yaml);
    probe_tiny(dir);
    /* the real probe with one head's weights dropped from site 2 */
    snprintf(command, sizeof command,
             "python3 -c \"import json; p = json.load(open('%s/probe.json')); "
             "del p['sites'][2]['mean_weights'][0][1]; "
             "json.dump(p, open('%s/bad.json', 'w'))\"", dir, dir);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    snprintf(arguments, sizeof arguments, "--probe %s/bad.json", dir);
    expect_plot_error(dir, arguments, "sites[2].mean_weights");
    test_remove_tree(dir);
}

Test(plot, a_probe_file_that_is_not_json_exits_2, .timeout = 60)
{
    char dir[256], path[400], arguments[600];
    test_make_temp_dir(dir, "plot-notjson");
    snprintf(path, sizeof path, "%s/probe.json", dir);
    test_write_file(path, "{\"sites\": [\n");
    snprintf(arguments, sizeof arguments, "--probe %s", path);
    expect_plot_error(dir, arguments, "is not valid JSON");
    test_remove_tree(dir);
}
