/* tests/test_probe.c — `fathom probe`: depth weights per site and head, width disagreement. */
#include "tests/support.h"
#include "tests/train_support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static char output[1 << 17];

/* A tiny block-MHAR (H 4) run of 3 steps with a checkpoint; `extra` adds --set options. */
static void train_routed(char *dir, const char *tag, const char *extra)
{
    test_make_temp_dir(dir, tag);
    tiny_config_write(dir, "residual:\n  mode: attnres\n  heads: 4\n  granularity: block\n"
                           "  layers_per_block: 1\ncheckpoint:\n  every: 3\n");
    char arguments[512];
    snprintf(arguments, sizeof arguments, "--set train.steps=3 %s", extra ? extra : "");
    int code = tiny_train(dir, arguments, output, sizeof output);
    cr_assert_eq(code, 0, "training failed:\n%s", output);
}

/* Runs probe on <dir>/run with `options`, writes <dir>/probe.json, then runs `check` (Python
 * reading `probe`, the parsed JSON) and returns its exit code. */
static int probe_and_check(const char *dir, const char *options, const char *check)
{
    char arguments[1024], command[4096];
    snprintf(arguments, sizeof arguments, "probe --checkpoint %s/run --json %s/probe.json %s",
             dir, dir, options);
    int code = test_run_fathom(arguments, output, sizeof output);
    cr_assert_eq(code, 0, "probe failed (%d):\n%s", code, output);
    snprintf(command, sizeof command,
             "python3 -c \"import json; probe = json.load(open('%s/probe.json')); %s\"", dir,
             check);
    return test_run_command(command, output, sizeof output);
}

/* With the routing learning rate at 0 the queries stay at their init, 0: every site then
 * weighs its sources uniformly, and a zero query has no width to disagree with. */
Test(probe, zero_queries_give_uniform_depth_weights_and_no_disagreement, .timeout = 120)
{
    char dir[256];
    train_routed(dir, "probe-zero", "--set optim.route_lr_mult=0");
    int code = probe_and_check(
        dir, "--weights raw --samples 2",
        "sites = probe['sites']; assert len(sites) == 5, len(sites); "
        "assert [s['sources'] for s in sites] == [1, 2, 2, 3, 3], [s['sources'] for s in sites]; "
        "assert all(abs(w - 1 / s['sources']) < 1e-6 for s in sites "
        "for head in s['mean_weights'][0] for w in head); "
        "assert all(s['kl_query'] == 0 for s in sites), [s['kl_query'] for s in sites]; "
        "assert sites[0]['name'] == 'model.layers.0.attn_route'; "
        "assert sites[-1]['name'] == 'model.final_route'");
    cr_assert_eq(code, 0, "%s", output);
    test_remove_tree(dir);
}

Test(probe, trained_weights_are_distributions_and_kl_is_nonnegative, .timeout = 120)
{
    char dir[256];
    train_routed(dir, "probe-trained", "--set optim.route_lr_mult=30");
    int code = probe_and_check(
        dir, "--weights raw --samples 2 --slices 4",
        "sites = probe['sites']; assert probe['slices'] == 4 and probe['tokens'] == 64; "
        "assert all(abs(sum(head) - 1) < 1e-5 for s in sites for head in s['mean_weights'][0]); "
        "assert all(len(s['mean_weights'][0]) == 4 for s in sites); "
        "assert all(s['kl_query'] >= 0 and s['kl_random'] >= 0 for s in sites); "
        "assert any(s['kl_query'] > 0 for s in sites[1:]); "
        "assert any(abs(w - 1 / s['sources']) > 1e-4 for s in sites[1:] "
        "for head in s['mean_weights'][0] for w in head)");
    cr_assert_eq(code, 0, "%s", output);
    test_remove_tree(dir);
}

/* MSAR: one weight table per stream; the width probe is defined on plain sites only. */
Test(probe, msar_reports_every_stream_and_no_width_probe, .timeout = 120)
{
    char dir[256];
    train_routed(dir, "probe-msar",
                 "--set residual.mode=msar --set residual.streams=2 "
                 "--set residual.stream_kernels=[1,2]");
    int code = probe_and_check(
        dir, "--weights raw --samples 2",
        "sites = probe['sites']; assert len(sites) == 5; "
        "assert all(s['streams'] == 2 and len(s['mean_weights']) == 2 for s in sites); "
        "assert all(abs(sum(head) - 1) < 1e-5 for s in sites for stream in s['mean_weights'] "
        "for head in stream); "
        "assert all(s['kl_query'] is None for s in sites)");
    cr_assert_eq(code, 0, "%s", output);
    test_remove_tree(dir);
}

Test(probe, a_standard_model_has_no_sites_and_exits_2, .timeout = 60)
{
    char dir[256], arguments[512];
    test_make_temp_dir(dir, "probe-standard");
    tiny_config_write(dir, "checkpoint:\n  every: 1\n");
    cr_assert_eq(tiny_train(dir, "--set train.steps=1", output, sizeof output), 0, "%s", output);
    snprintf(arguments, sizeof arguments, "probe --checkpoint %s/run", dir);
    int code = test_run_fathom(arguments, output, sizeof output);
    cr_assert_eq(code, 2, "exit %d:\n%s", code, output);
    cr_assert(strstr(output, "residual.mode standard"), "%s", output);
    test_remove_tree(dir);
}

Test(probe, slices_that_do_not_divide_the_width_exit_2, .timeout = 60)
{
    char dir[256], arguments[512];
    train_routed(dir, "probe-slices", NULL);
    snprintf(arguments, sizeof arguments, "probe --checkpoint %s/run --slices 5", dir);
    int code = test_run_fathom(arguments, output, sizeof output);
    cr_assert_eq(code, 2, "exit %d:\n%s", code, output);
    cr_assert(strstr(output, "--slices 5"), "%s", output);
    test_remove_tree(dir);
}
