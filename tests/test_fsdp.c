/* tests/test_fsdp.c — FSDP inside each pipeline stage, under mpirun on the cpu (DESIGN 3, 7):
 * every dp layout, with and without pipeline stages, both reshard policies, checkpointing
 * on and off, trains the losses and weights of the one-rank run; the shards shrink as 1/D;
 * a stopped or killed rank ends the job naming it; a NaN on one rank skips the step on
 * every rank; and the layout errors are exit 2 naming their key.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/layout_support.h"
#include "tests/pipeline_support.h"
#include "tests/support.h"
#include "runtime/timer.h"
#include "tests/train_support.h"

/* Both reshard policies, checkpointing off and on, dp 2 and 4, with and without stages
 * (interleaved, v 2: the cross-stage cache beside the gathers). */
static const Layout dp_layouts[] = {
    {2, "--set parallel.dp=2"},
    {2, "--set parallel.dp=2 --set fsdp.reshard_after_forward=true"},
    {4, "--set parallel.dp=4 --set fsdp.reshard_after_forward=true "
        "--set train.activation_checkpointing=full"},
    {4, "--set parallel.pp=2 --set parallel.dp=2 --set train.activation_checkpointing=full"},
    {4, "--set parallel.pp=2 --set parallel.dp=2 --set parallel.virtual_stages=2 "
        "--set parallel.schedule=interleaved --set fsdp.reshard_after_forward=true"},
};
#define DP_LAYOUTS (int)(sizeof dp_layouts / sizeof dp_layouts[0])

Test(fsdp, every_dp_layout_of_the_standard_residual_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo", "", dp_layouts, DP_LAYOUTS, "fsdp-std");
}

Test(fsdp, every_dp_layout_of_block_mhar_replace_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo_block_mhar", "", dp_layouts, DP_LAYOUTS, "fsdp-mhar");
}

Test(fsdp, every_dp_layout_of_mhar_delta_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo_mhar_delta", "", dp_layouts, DP_LAYOUTS, "fsdp-delta");
}

Test(fsdp, every_dp_layout_of_msar_delta_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo_msar", "--set residual.form=delta", dp_layouts,
                                DP_LAYOUTS, "fsdp-msar-delta");
}

Test(fsdp, blocks_of_two_layers_route_together_on_every_dp_layout, .timeout = 300)
{
    /* a block's sites live in one routing unit, read whole when the block starts: the
     * decoder layers are gathered one at a time around it */
    static const Layout layouts[] = {
        {2, "--set parallel.dp=2 --set fsdp.reshard_after_forward=true"},
        {4, "--set parallel.dp=4 --set train.activation_checkpointing=full"},
        {4, "--set parallel.pp=2 --set parallel.dp=2 --set fsdp.reshard_after_forward=true"},
    };
    expect_layouts_equal_single("demo_mhar_delta", "--set residual.layers_per_block=2", layouts,
                                3, "fsdp-block2");
    expect_layouts_equal_single("demo_block_mhar", "--set residual.layers_per_block=2", layouts,
                                3, "fsdp-block2-replace");
}

Test(fsdp, every_dp_layout_of_tied_embeddings_equals_one_rank, .timeout = 300)
{
    /* under pp the embedding is held by stage 0 and the last stage, sharded on both */
    expect_layouts_equal_single("demo", "--set model.tie_embeddings=true", dp_layouts,
                                DP_LAYOUTS, "fsdp-tied");
}

/* ---- memory ---- */

typedef struct {
    long long held, shards, gathered, optimizer;
} Measured;

/* The numbers of the "measured after set-up" line of `fathom train` on `ranks` dp ranks. */
static Measured measure(int ranks, const char *run_dir, char *output)
{
    char extra[256];
    snprintf(extra, sizeof extra, "--set parallel.dp=%d --set train.steps=1 "
             "--set train.global_batch_size=8 --set model.d_model=256 --set model.n_heads=4 "
             "--set model.head_dim=64 --set model.ffn_dim=512 --set model.vocab_size=1000",
             ranks);
    cr_assert_eq(layout_train(ranks, "demo_mhar_delta", extra, run_dir, output), 0, "%s",
                 output);
    const char *line = strstr(output, "measured after set-up");
    cr_assert(line, "no measured line in\n%s", output);
    Measured m;
    cr_assert_eq(sscanf(strchr(line, '(') + 1,
                        "%lld bytes: parameter shards %lld, gathered units %lld, optimizer %lld",
                        &m.held, &m.shards, &m.gathered, &m.optimizer),
                 4, "%s", line);
    return m;
}

Test(fsdp, parameter_and_optimizer_bytes_fall_as_one_over_d, .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "fsdp-memory");
    Measured at[5];
    const int sizes[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        char run_dir[400];
        snprintf(run_dir, sizeof run_dir, "%s/dp%d", runs.root, sizes[i]);
        at[sizes[i]] = measure(sizes[i], run_dir, runs.output);
    }
    for (int i = 1; i < 3; i++) {
        const int D = sizes[i];
        const Measured *one = &at[1], *m = &at[D];
        /* within the padding: rows up to a multiple of D and each shard to 64 elements;
         * the delta model has about 70 tensors, so at most 70 * 64 * 4 bytes * 5 buffers */
        const double slack = 70.0 * 64 * 4 * 5;
        cr_expect(fabs((double)m->shards * D - (double)one->shards) <= D * slack,
                  "dp %d: shards %lld bytes, one rank %lld", D, m->shards, one->shards);
        cr_expect(fabs((double)m->optimizer * D - (double)one->optimizer) <= D * slack,
                  "dp %d: optimizer %lld bytes, one rank %lld", D, m->optimizer, one->optimizer);
        /* measured: what the backend holds moves by exactly what the plan says moved */
        const long long rest = m->held - m->shards - m->gathered - m->optimizer;
        const long long rest_one = one->held - one->shards - one->gathered - one->optimizer;
        cr_expect_eq(rest, rest_one, "dp %d: %lld bytes held besides the parameters, one rank "
                     "%lld", D, rest, rest_one);
    }
    runs_end(&runs);
}

/* ---- faults ---- */

/* `fathom train` of demo on `ranks` ranks with FATHOM_FAULT set, in the layout `parallel`
 * (NULL: dp over every rank); the exit code, output and time. */
static int train_with_fault_in(int ranks, const char *parallel, const char *fault,
                               const char *launcher_options, const char *run_dir,
                               char *output, double *seconds)
{
    char layout[128];
    if (!parallel) {
        snprintf(layout, sizeof layout, "--set parallel.dp=%d", ranks);
        parallel = layout;
    }
    char command[4096];
    snprintf(command, sizeof command,
             "FATHOM_FAULT=%s OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 "
             "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe %s -x FATHOM_FAULT "
             "-np %d '%s' train '%s/launch/configs/demo.yaml' %s %s "
             "--set parallel.timeout_s=2 --set run_dir='%s' </dev/null",
             fault, launcher_options, ranks, test_fathom_binary(), test_source_dir(),
             LAYOUT_COMMON, parallel, run_dir);
    const double started = timer_seconds();
    const int code = test_run_command(command, output, LAYOUT_OUTPUT_CAPACITY);
    *seconds = timer_seconds() - started;
    return code;
}

static int train_with_fault(int ranks, const char *fault, const char *launcher_options,
                            const char *run_dir, char *output, double *seconds)
{
    return train_with_fault_in(ranks, NULL, fault, launcher_options, run_dir, output,
                               seconds);
}

Test(fsdp, a_stopped_rank_ends_the_job_with_exit_5_naming_it, .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "fsdp-stop");
    double seconds;
    const int code = train_with_fault(2, "rank=1,step=2,kind=stop", "", runs.layout,
                                      runs.output, &seconds);
    cr_expect_eq(code, 5, "exit %d:\n%s", code, runs.output);
    cr_expect(strstr(runs.output, "rank 1 does not answer a roll call"), "%s", runs.output);
    /* asked of the kernel, as the NCCL watchdog's path asks, without a roll call */
    cr_expect(strstr(runs.output, "fathom: error: rank 0: on this host, rank 1 (pid ") &&
              strstr(runs.output, ") is stopped"), "%s", runs.output);
    /* the deadline (2 s) and the roll call (2 s), with room for a loaded machine */
    cr_expect(seconds < 30, "took %.1f s", seconds);
    runs_end(&runs);
}

Test(fsdp, a_killed_rank_ends_the_job_naming_it, .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "fsdp-kill");
    double seconds;
    /* mpirun notices the death at once, ends the others and names the rank */
    int code = train_with_fault(2, "rank=1,step=2,kind=exit", "", runs.layout, runs.output,
                                &seconds);
    cr_expect_neq(code, 0, "%s", runs.output);
    cr_expect(strstr(runs.output, "rank 1"), "%s", runs.output);
    cr_expect(seconds < 30, "took %.1f s", seconds);
    /* with --enable-recovery mpirun lets the others run into their deadline: they exit 5
     * and name the dead rank themselves */
    test_remove_tree(runs.layout);
    code = train_with_fault(2, "rank=1,step=2,kind=exit", "--enable-recovery", runs.layout,
                            runs.output, &seconds);
    cr_expect(strstr(runs.output, "rank 1 does not answer a roll call"), "%s", runs.output);
    cr_expect(strstr(runs.output, "fathom: error: rank 0"), "%s", runs.output);
    cr_expect(strstr(runs.output, "fathom: error: rank 0: on this host, rank 1 (pid ") &&
              strstr(runs.output, ") has exited"), "%s", runs.output);
    cr_expect(seconds < 30, "took %.1f s", seconds);
    runs_end(&runs);
}

/* Stage 1's second dp rank (world rank 3) stops, or dies, at its first hop send of step 2:
 * its neighbour of stage 0 (world rank 1) waits for a hop, mid-step, and names world rank
 * 3, not its rank on the link between them. */
Test(fsdp, a_rank_that_stops_in_a_pipeline_hop_ends_the_job_with_exit_5_naming_it,
     .timeout = 120)
{
    static const char *const pp2_dp2 = "--set parallel.pp=2 --set parallel.dp=2";
    Runs runs;
    runs_begin(&runs, "fsdp-hop-stop");
    double seconds;
    const int code = train_with_fault_in(4, pp2_dp2, "rank=3,step=2,kind=stop,during=hop",
                                         "", runs.layout, runs.output, &seconds);
    cr_expect_eq(code, 5, "exit %d:\n%s", code, runs.output);
    cr_expect(strstr(runs.output, "rank 1: recv of"), "%s", runs.output);
    cr_expect(strstr(runs.output, "from rank 3"), "%s", runs.output);
    cr_expect(strstr(runs.output, "rank 3 does not answer a roll call"), "%s", runs.output);
    cr_expect(strstr(runs.output, "on this host, rank 3 (pid "), "%s", runs.output);
    cr_expect(seconds < 30, "took %.1f s", seconds);
    test_remove_tree(runs.layout);
    train_with_fault_in(4, pp2_dp2, "rank=3,step=2,kind=exit,during=hop",
                               "--enable-recovery", runs.layout, runs.output, &seconds);
    /* (mpirun --enable-recovery answers 0 whatever its ranks did: the message is the test) */
    cr_expect(strstr(runs.output, "rank 1: recv of"), "%s", runs.output);
    cr_expect(strstr(runs.output, "rank 3 does not answer a roll call"), "%s", runs.output);
    cr_expect(seconds < 30, "took %.1f s", seconds);
    runs_end(&runs);
}

Test(fsdp, a_nan_on_one_rank_skips_the_step_on_every_rank, .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "fsdp-nan");
    double seconds;
    const int code = train_with_fault(2, "rank=1,step=3,kind=nan", "", runs.layout,
                                      runs.output, &seconds);
    cr_assert_eq(code, 0, "%s", runs.output);
    cr_expect(strstr(runs.output, "step 3: non-finite"), "%s", runs.output);
    double losses[LAYOUT_STEPS];
    int steps[LAYOUT_STEPS];
    cr_assert_eq(metrics_read_losses(runs.layout, losses, steps, LAYOUT_STEPS), LAYOUT_STEPS);
    for (int s = 0; s < LAYOUT_STEPS; s++)
        cr_expect(isfinite(losses[s]), "step %d loss %g", s + 1, losses[s]);
    /* every rank skipped it: the shards agree on 4 updates, and the run resumes from them */
    char command[1024];
    snprintf(command, sizeof command,
             "python3 -c \"import h5py\n"
             "f = h5py.File('%s/checkpoints/step_00000005/index.h5', 'r')\n"
             "assert f.attrs['optimizer_steps'] == 4, f.attrs['optimizer_steps']\n"
             "assert f.attrs['skipped_steps'] == 1, f.attrs['skipped_steps']\"",
             runs.layout);
    cr_expect_eq(test_run_command(command, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 runs.output);
    runs_end(&runs);
}

/* ---- bad input ---- */

static void expect_config_error(int ranks, const char *extra, const char *key)
{
    Runs runs;
    runs_begin(&runs, "fsdp-bad");
    const int code = layout_train(ranks, "demo", extra, runs.layout, runs.output);
    cr_expect_eq(code, 2, "%s: exit %d\n%s", extra, code, runs.output);
    cr_expect(strstr(runs.output, key), "%s: the message does not name %s:\n%s", extra, key,
              runs.output);
    runs_end(&runs);
}

Test(fsdp, a_timeout_that_is_not_positive_is_exit_2)
{
    expect_config_error(1, "--set parallel.timeout_s=0", "parallel.timeout_s");
    expect_config_error(1, "--set parallel.timeout_s=-5", "parallel.timeout_s");
}

Test(fsdp, a_dp_that_does_not_divide_the_batch_into_whole_microbatches_is_exit_2)
{
    /* 8 sequences in microbatches of 2 over 3 ranks */
    expect_config_error(3, "--set parallel.dp=3", "train.global_batch_size");
}

/* ---- bytes and times ---- */

/* Every logged step of the run in `dir` carries each stage's communication times: on the cpu
 * (mpi, synchronous) all of it exposed; every stage gathered for a while, and with pp > 1
 * every stage received hops. */
static void expect_comm_times(const char *dir, bool pipelined, char *output)
{
    char command[2048];
    snprintf(command, sizeof command,
             "python3 -c \"import json, sys\n"
             "lines = [json.loads(l) for l in open(sys.argv[1]) if '\\\"comm\\\"' in l]\n"
             "assert lines\n"
             "for line in lines:\n"
             "    for stage in line['comm']:\n"
             "        for kind in ('fsdp_allgather', 'fsdp_reducescatter', 'pp_send', "
             "'pp_recv'):\n"
             "            busy, exposed = stage[kind + '_ms'], stage[kind + '_exposed_ms']\n"
             "            assert busy >= 0 and abs(busy - exposed) <= 1e-6 * busy, (kind, stage)\n"
             "        assert stage['fsdp_allgather_ms'] > 0, stage\n"
             "        assert stage['fsdp_reducescatter_ms'] > 0, stage\n"
             "        assert (stage['pp_recv_ms'] > 0) == %s, stage\n"
             "print('ok', len(lines))\" '%s/metrics.jsonl'",
             pipelined ? "True" : "False", dir);
    cr_expect_eq(test_run_command(command, output, LAYOUT_OUTPUT_CAPACITY), 0, "%s", output);
}

/* inspect --comm's time table, in `inspected` (its output for the run in `dir`): each row's
 * step is the last logged line's (tokens a step / tokens_per_s), its times that line's
 * (to the table's 2 decimals), and its share the exposed times over the step. */
static void expect_inspected_shares(const char *dir, char *inspected)
{
    char table[1024], command[3072];
    const char *at = strstr(inspected, "communication time per step");
    cr_assert_not_null(at, "%s", inspected);
    snprintf(table, sizeof table, "%s", at);
    for (char *c = table; *c; c++) /* one shell word: rows split by ';', no quote */
        if (*c == '\n' || *c == '\'')
            *c = *c == '\n' ? ';' : ' ';
    snprintf(command, sizeof command,
             "python3 -c \"import json, sys\n"
             "lines = [json.loads(l) for l in open(sys.argv[1]) if '\\\"comm\\\"' in l]\n"
             "last, before = lines[-1], lines[-2]\n"
             "per_step = (last['tokens'] - before['tokens']) / (last['step'] - before['step'])\n"
             "step_ms = 1e3 * per_step / last['tokens_per_s']\n"
             "rows = [r.split() for r in sys.argv[2].split(';') if r.split()[:1] and "
             "r.split()[0].isdigit()]\n"
             "assert len(rows) == len(last['comm']), rows\n"
             "keys = ['fsdp_allgather', 'fsdp_reducescatter', 'pp_send', 'pp_recv']\n"
             "for row, stage in zip(rows, last['comm']):\n"
             "    times = [stage[k + s] for k in keys for s in ('_ms', '_exposed_ms')]\n"
             "    assert all(abs(float(a) - b) <= 0.006 for a, b in zip(row[1:9], times)), row\n"
             "    assert abs(float(row[9]) - step_ms) <= 0.006, (row, step_ms)\n"
             "    share = 100 * sum(times[1::2]) / step_ms\n"
             "    assert abs(float(row[10].rstrip('%%')) - share) <= 0.06, (row, share)\n"
             "print('ok')\" '%s/metrics.jsonl' '%s'", dir, table);
    cr_expect_eq(test_run_command(command, inspected, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 inspected);
}

Test(fsdp, inspect_comm_shows_fsdp_bytes_equal_to_the_prediction_with_evaluations_between,
     .timeout = 120)
{
    Runs runs;
    runs_begin(&runs, "fsdp-bytes");
    /* dp 2 with evaluation every step (persistent units), and pp2 x dp2 v2 (pooled) */
    static const Layout layouts[] = {
        {2, "--set parallel.dp=2 --set fsdp.reshard_after_forward=false --set eval.every=1 "
            "--set eval.samples=4"},
        {4, "--set parallel.pp=2 --set parallel.dp=2 --set parallel.virtual_stages=2 "
            "--set parallel.schedule=interleaved"},
    };
    for (int l = 0; l < 2; l++) {
        test_remove_tree(runs.layout);
        cr_assert_eq(layout_train(layouts[l].ranks, "demo_mhar_delta", layouts[l].overrides,
                                  runs.layout, runs.output), 0, "%s", runs.output);
        cr_expect(strstr(runs.output, "fathom: communication a step, ms"), "%s", runs.output);
        expect_comm_times(runs.layout, l == 1, runs.output);
        char arguments[512];
        snprintf(arguments, sizeof arguments, "inspect --comm '%s'", runs.layout);
        cr_expect_eq(test_run_fathom(arguments, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                     runs.output);
        cr_expect(strstr(runs.output, "every measured value equals the prediction"), "%s",
                  runs.output);
        cr_expect(!strstr(runs.output, "all-gather           0  B"), "%s", runs.output);
        cr_expect(strstr(runs.output, "communication time per step, ms"), "%s", runs.output);
        cr_expect(strstr(runs.output, "pp recv  exposed       step  exposed"), "%s",
                  runs.output);
        expect_inspected_shares(runs.layout, runs.output);
    }
    runs_end(&runs);
}

/* ---- the 8B job's layout, rehearsed ---- */

/* launch/configs/marin8b_block_mhar.yaml as it is (32 layers, blocks of 4, delta MHAR with 8
 * depth heads, pp 2 x dp 4, interleaved with 2 chunks a rank, checkpointing) at a tiny width,
 * on 8 ranks: the losses and weights of one rank, and every byte as predicted */
static const char *const MARIN_TINY =
    "--set model.vocab_size=256 --set model.d_model=32 --set model.n_heads=4 "
    "--set model.n_kv_heads=2 --set model.head_dim=8 --set model.ffn_dim=64 "
    "--set train.seq_len=16 --set train.microbatch_size=1 --set train.global_batch_size=16 "
    "--set data.source=synthetic --set device=cpu";

Test(fsdp, the_8b_jobs_layout_at_a_tiny_width_on_8_ranks_equals_one_rank, .timeout = 600)
{
    static const Layout eight = {8, ""};
    char network[1024];
    snprintf(network, sizeof network, "%s", MARIN_TINY);
    /* the one-rank run needs the layout keys of one rank */
    Runs runs;
    runs_begin(&runs, "marin-tiny");
    char single[1400];
    snprintf(single, sizeof single, "%s --set parallel.pp=1 --set parallel.dp=1 "
             "--set parallel.virtual_stages=1 --set parallel.schedule=1f1b", network);
    cr_assert_eq(layout_train(1, "marin8b_block_mhar", single, runs.single, runs.output), 0,
                 "%s", runs.output);
    cr_assert_eq(layout_train(eight.ranks, "marin8b_block_mhar", network, runs.layout,
                              runs.output), 0, "%s", runs.output);
    double one[LAYOUT_STEPS], many[LAYOUT_STEPS];
    int steps[LAYOUT_STEPS];
    cr_assert_eq(metrics_read_losses(runs.single, one, steps, LAYOUT_STEPS), LAYOUT_STEPS);
    cr_assert_eq(metrics_read_losses(runs.layout, many, steps, LAYOUT_STEPS), LAYOUT_STEPS);
    for (int s = 0; s < LAYOUT_STEPS; s++)
        cr_expect(fabs(many[s] - one[s]) <= 1e-5 * fabs(one[s]),
                  "step %d: 8 ranks %.9g, one rank %.9g", s + 1, many[s], one[s]);
    cr_expect_eq(layout_weights_agree(runs.layout, runs.single, runs.output), 0, "%s",
                 runs.output);
    char arguments[512];
    snprintf(arguments, sizeof arguments, "inspect --comm '%s'", runs.layout);
    cr_expect_eq(test_run_fathom(arguments, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 runs.output);
    cr_expect(strstr(runs.output, "every measured value equals the prediction"), "%s",
              runs.output);
    printf("%s", runs.output); /* the rehearsal's comm table, for the record */
    runs_end(&runs);
}

/* launch/bench/job_8b.sh, the script the eight-GPU node runs, rehearsed on the cpu at a tiny
 * width: the job's layout trains, resumes bit for bit, and reports its bytes as predicted,
 * its communication table, and its save and load times. */
Test(fsdp, the_8b_job_script_rehearsed_on_the_cpu_reports_a_bitwise_resume, .timeout = 300)
{
    char directory[256], command[1024];
    test_make_temp_dir(directory, "job-8b");
    char *output = malloc(LAYOUT_OUTPUT_CAPACITY);
    snprintf(command, sizeof command,
             "cd '%s' && OUT='%s' DEVICE=cpu FATHOM_BINARY='%s' launch/bench/job_8b.sh 4 2>&1",
             test_source_dir(), directory, test_fathom_binary());
    cr_assert_eq(test_run_command(command, output, LAYOUT_OUTPUT_CAPACITY), 0, "%s", output);
    static const char *const lines[] = {
        "run A: exit 0", "run B, first half: exit 0", "run B, resumed: exit 0",
        "bytes            every measured value equals the prediction",
        "fathom: communication a step, ms", "save             saved step 2:",
        "load             loaded ",
        "resume           bitwise (loss and gradient norm of steps 3-4: equal",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        cr_expect_not_null(strstr(output, lines[i]), "no '%s' in:\n%s", lines[i], output);
    free(output);
    test_remove_tree(directory);
}
