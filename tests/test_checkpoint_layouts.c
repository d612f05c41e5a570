/* tests/test_checkpoint_layouts.c — checkpoints saved by several ranks and loaded under any
 * layout (DESIGN 5), under mpirun on the cpu: a resume of the same layout continues bit
 * for bit; a resume under another layout continues the run within fp32 rounding; h5py and
 * PyYAML read what was saved; one run directory takes one training at a time.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/layout_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

#define STEPS 6
#define BLOCK_MHAR "demo_block_mhar"

static const char *const PP2_DP2_V2 = "--set parallel.pp=2 --set parallel.dp=2 "
                                      "--set parallel.virtual_stages=2 "
                                      "--set parallel.schedule=interleaved";

/* `extra` + the steps of this file, saving at step 3 and at the end. */
static int train_steps(int ranks, const char *layout, int steps, const char *run_dir,
                       char *output)
{
    char extra[1024];
    snprintf(extra, sizeof extra, "%s --set train.steps=%d --set checkpoint.every=3", layout,
             steps);
    return layout_train(ranks, BLOCK_MHAR, extra, run_dir, output);
}

static void read_six(const char *run_dir, double *losses)
{
    int steps[STEPS];
    cr_assert_eq(metrics_read_losses(run_dir, losses, steps, STEPS), STEPS, "%s", run_dir);
}

/* 6 steps straight against 3 steps and a resume to 6, on the same layout. */
static void expect_resume_is_bitwise(int ranks, const char *layout, const char *tag)
{
    Runs runs;
    runs_begin(&runs, tag);
    cr_assert_eq(train_steps(ranks, layout, STEPS, runs.single, runs.output), 0, "%s",
                 runs.output);
    cr_assert_eq(train_steps(ranks, layout, 3, runs.layout, runs.output), 0, "%s", runs.output);
    cr_assert_eq(train_steps(ranks, layout, STEPS, runs.layout, runs.output), 0, "%s",
                 runs.output);
    cr_expect(strstr(runs.output, "resumed at step 3"), "%s", runs.output);
    cr_expect(!strstr(runs.output, "resharding"), "%s", runs.output);
    double straight[STEPS], resumed[STEPS];
    read_six(runs.single, straight);
    read_six(runs.layout, resumed);
    for (int s = 3; s < STEPS; s++)
        cr_expect(straight[s] == resumed[s], "%s: step %d loss %.9g, straight %.9g", layout,
                  s + 1, resumed[s], straight[s]);
    snprintf(runs.a, sizeof runs.a, "%s/checkpoints/step_00000006", runs.single);
    snprintf(runs.b, sizeof runs.b, "%s/checkpoints/step_00000006", runs.layout);
    cr_expect(checkpoints_bitwise_equal(runs.a, runs.b), "%s: the resumed run moved", layout);
    runs_end(&runs);
}

Test(checkpoint_layout, a_one_rank_resume_continues_bit_for_bit, .timeout = 120)
{
    expect_resume_is_bitwise(1, "", "resume-one");
}

Test(checkpoint_layout, a_pp2_dp2_v2_resume_continues_bit_for_bit, .timeout = 120)
{
    expect_resume_is_bitwise(4, PP2_DP2_V2, "resume-pp2dp2");
}

/* Saved at pp2 x dp2 (v 2), resumed on another layout: the steps after the resume equal the
 * straight run's within fp32 rounding (layouts sum in other orders). */
Test(checkpoint_layout, a_pp2_dp2_v2_checkpoint_resumes_on_one_rank_dp4_and_pp4, .timeout = 240)
{
    Runs runs;
    runs_begin(&runs, "reshard");
    cr_assert_eq(train_steps(4, PP2_DP2_V2, STEPS, runs.single, runs.output), 0, "%s",
                 runs.output);
    double straight[STEPS], resumed[STEPS];
    read_six(runs.single, straight);
    static const Layout targets[] = {
        {1, ""},
        {4, "--set parallel.dp=4"},
        {4, "--set parallel.pp=4"},
    };
    for (int t = 0; t < 3; t++) {
        test_remove_tree(runs.layout);
        cr_assert_eq(train_steps(4, PP2_DP2_V2, 3, runs.layout, runs.output), 0, "%s",
                     runs.output);
        cr_assert_eq(train_steps(targets[t].ranks, targets[t].overrides, STEPS, runs.layout,
                                 runs.output), 0, "%s\n%s", targets[t].overrides, runs.output);
        cr_expect(strstr(runs.output, "resharding a checkpoint of pp 2 x dp 2"), "%s",
                  runs.output);
        read_six(runs.layout, resumed);
        for (int s = 3; s < STEPS; s++)
            cr_expect(fabs(resumed[s] - straight[s]) <= 1e-5 * fabs(straight[s]),
                      "resumed on '%s': step %d loss %.9g, straight %.9g",
                      targets[t].overrides, s + 1, resumed[s], straight[s]);
    }
    runs_end(&runs);
}

/* ---- readers ---- */

Test(checkpoint_layout, h5py_reads_a_sharded_checkpoint_as_whole_tensors, .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "readers");
    cr_assert_eq(train_steps(4, PP2_DP2_V2, 3, runs.layout, runs.output), 0, "%s",
                 runs.output);
    cr_assert_eq(train_steps(1, "", 3, runs.single, runs.output), 0, "%s", runs.output);
    /* whole logical tensors, each equal to the rows of the shards, and to the one-rank run's
     * within the layouts' rounding */
    char command[4096];
    snprintf(command, sizeof command,
             "python3 -c \"import h5py, numpy, glob, os\n"
             "step = '%s/checkpoints/step_00000003'\n"
             "index = h5py.File(step + '/index.h5', 'r')\n"
             "one = h5py.File('%s/checkpoints/step_00000003/index.h5', 'r')\n"
             "shards = [h5py.File(p, 'r') for p in sorted(glob.glob(step + '/shard_*.h5'))]\n"
             "assert len(shards) == 4, len(shards)\n"
             "for group in ['model', 'ema', 'optim/exp_avg', 'optim/exp_avg_sq']:\n"
             "    assert sorted(index[group]) == sorted(one[group]), group\n"
             "    for name in index[group]:\n"
             "        whole = index[group][name][()]\n"
             "        assert whole.shape == one[group][name].shape, name\n"
             "        rows = [s[group][name][()] for s in shards if name in s.get(group, {})]\n"
             "        assert sum(r.shape[0] for r in rows) == whole.shape[0], name\n"
             "        assert numpy.array_equal(whole, numpy.concatenate(rows)), name\n"
             "        scale = max(numpy.abs(one[group][name][()]).max(), 3e-3)\n"
             "        assert numpy.abs(whole - one[group][name][()]).max() <= 1e-5 * scale, name\n"
             "print('ok')\"",
             runs.layout, runs.single);
    cr_expect_eq(test_run_command(command, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 runs.output);
    runs_end(&runs);
}

Test(checkpoint_layout, pyyaml_and_ruamel_read_the_saved_config_with_the_config_files_types,
     .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "yaml");
    cr_assert_eq(train_steps(1, "", 3, runs.single, runs.output), 0, "%s", runs.output);
    char command[4096];
    snprintf(command, sizeof command,
             "python3 -c \"import h5py, yaml, ruamel.yaml\n"
             "def flat(d, prefix=''):\n"
             "    out = {}\n"
             "    for k, v in d.items():\n"
             "        if isinstance(v, dict): out.update(flat(v, prefix + k + '.'))\n"
             "        else: out[prefix + k] = v\n"
             "    return out\n"
             "config = flat(yaml.safe_load(open('%s/launch/configs/demo.yaml')))\n"
             "index = h5py.File('%s/checkpoints/step_00000003/index.h5', 'r')\n"
             "text = index.attrs['config']\n"
             "saved = flat(yaml.safe_load(text if isinstance(text, str) else text.decode()))\n"
             "run = flat(yaml.safe_load(open('%s/config.yaml')))\n"
             "ruamel = flat(ruamel.yaml.YAML(typ='safe', pure=True).load(open('%s/config.yaml')))\n"
             "for name, values in (('checkpoint', saved), ('run_dir/config.yaml', run),\n"
             "                     ('ruamel.yaml', ruamel)):\n"
             "    assert set(values) == set(config), (name, set(values) ^ set(config))\n"
             "    for key, value in config.items():\n"
             "        assert type(values[key]) is type(value), (name, key, value, values[key])\n"
             "print('ok')\"",
             test_source_dir(), runs.single, runs.single, runs.single);
    cr_expect_eq(test_run_command(command, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 runs.output);
    runs_end(&runs);
}

/* ---- one training a run directory ---- */

Test(checkpoint_layout, a_second_training_on_a_run_dir_in_use_exits_2_and_touches_nothing,
     .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "lock");
    /* the first: a long run in the background, on one rank */
    char command[4096];
    snprintf(command, sizeof command,
             "OMP_NUM_THREADS=1 exec '%s' train '%s/launch/configs/demo.yaml' %s "
             "--set train.steps=100000 --set checkpoint.every=0 --set run_dir='%s' "
             ">/dev/null 2>&1 </dev/null",
             test_fathom_binary(), test_source_dir(), LAYOUT_COMMON, runs.layout);
    const pid_t first = fork();
    cr_assert(first >= 0);
    if (first == 0) {
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    /* wait until it logs, then take a snapshot of its directory */
    char metrics[512];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", runs.layout);
    for (int tries = 0; tries < 600 && access(metrics, F_OK) != 0; tries++)
        usleep(50000);
    cr_assert(access(metrics, F_OK) == 0, "the first training never logged");
    char before[600], after[1300], config[512];
    snprintf(config, sizeof config, "%s/config.yaml", runs.layout);
    snprintf(before, sizeof before, "%s.before", config);
    snprintf(command, sizeof command, "cp '%s' '%s'", config, before);
    cr_assert_eq(system(command), 0);

    const int code = layout_train(1, "demo", "--set model.d_model=64", runs.layout,
                                  runs.output);
    cr_expect_eq(code, 2, "exit %d\n%s", code, runs.output);
    cr_expect(strstr(runs.output, "in use by another training"), "%s", runs.output);
    snprintf(after, sizeof after, "cmp -s '%s' '%s'", config, before);
    cr_expect_eq(system(after), 0, "the second training rewrote the first's config.yaml");
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl.1", runs.layout);
    cr_expect(access(metrics, F_OK) != 0, "the second training moved the first's metrics");
    kill(first, SIGKILL);
    waitpid(first, NULL, 0);
    runs_end(&runs);
}

/* ---- a rank killed while it saves ---- */

Test(checkpoint_layout, a_rank_killed_midway_through_a_save_leaves_the_previous_checkpoint,
     .timeout = 180)
{
    Runs runs;
    runs_begin(&runs, "killed-save");
    /* pp2 x dp2 v2 saving every 3 steps; rank 1 dies halfway through writing step 6 */
    char command[4096];
    snprintf(command, sizeof command,
             "FATHOM_FAULT=rank=1,step=6,kind=exit,during=save OMP_NUM_THREADS=1 "
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe "
             "-x FATHOM_FAULT -np 4 '%s' train '%s/launch/configs/%s.yaml' %s %s "
             "--set train.steps=6 --set checkpoint.every=3 --set run_dir='%s' </dev/null",
             test_fathom_binary(), test_source_dir(), BLOCK_MHAR, LAYOUT_COMMON, PP2_DP2_V2,
             runs.layout);
    cr_assert_neq(test_run_command(command, runs.output, LAYOUT_OUTPUT_CAPACITY), 0,
                  "the save of step 6 should have died\n%s", runs.output);
    /* step 6 was never published: no step directory of it, `latest` names step 3 */
    char path[512];
    snprintf(path, sizeof path, "%s/checkpoints/step_00000006", runs.layout);
    cr_expect(access(path, F_OK) != 0, "a half-written step 6 was published");
    snprintf(path, sizeof path, "%s/checkpoints/step_00000006.tmp", runs.layout);
    cr_expect(access(path, F_OK) == 0, "the save should have died inside step_00000006.tmp");
    /* the next start loads step 3 and finishes; its steps 4-6 equal a straight run's */
    cr_assert_eq(train_steps(4, PP2_DP2_V2, STEPS, runs.layout, runs.output), 0, "%s",
                 runs.output);
    cr_expect(strstr(runs.output, "resumed at step 3"), "%s", runs.output);
    cr_assert_eq(train_steps(4, PP2_DP2_V2, STEPS, runs.single, runs.output), 0, "%s",
                 runs.output);
    snprintf(runs.a, sizeof runs.a, "%s/checkpoints/step_00000006", runs.single);
    snprintf(runs.b, sizeof runs.b, "%s/checkpoints/step_00000006", runs.layout);
    cr_expect(checkpoints_bitwise_equal(runs.a, runs.b), "the run after the failed save moved");
    runs_end(&runs);
}
