/* tests/test_pipeline.c — pipeline stages under mpirun on the cpu (DESIGN 3, 7): every
 * layout trains the losses and weights of the one-rank run, activation checkpointing
 * changes no bit, the pp bytes of metrics.jsonl equal pipeline/payload.h's prediction, and
 * each layout error is exit 2 naming its key.
 *
 * The runs use the 4-layer demo configs at d 32 for 5 steps of 4 microbatches, so a layout
 * takes about a second on 2 cores.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chunk.h"
#include "pipeline/payload.h"
#include "runtime/config.h"
#include "tests/layout_support.h"
#include "tests/pipeline_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

/* Every layout of the issue on 8 layers (so pp4 v2 has a layer a chunk), each schedule that
 * applies, checkpointing off and on. */
static const Layout every_layout[] = {
    {2, "--set parallel.pp=2"},
    {2, "--set parallel.pp=2 --set parallel.schedule=gpipe"},
    {2, "--set parallel.pp=2 --set train.activation_checkpointing=full"},
    {4, "--set parallel.pp=4"},
    {4, "--set parallel.pp=4 --set parallel.schedule=gpipe "
        "--set train.activation_checkpointing=full"},
    {2, "--set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved"},
    {2, "--set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved "
        "--set train.activation_checkpointing=full"},
    {4, "--set parallel.pp=4 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved"},
};
#define EVERY_LAYOUT (int)(sizeof every_layout / sizeof every_layout[0])

Test(pipeline, every_layout_of_the_standard_residual_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo", "--set model.n_layers=8", every_layout, EVERY_LAYOUT,
                                "every-std");
}

Test(pipeline, every_layout_of_block_mhar_replace_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo_block_mhar", "--set model.n_layers=8", every_layout,
                                EVERY_LAYOUT, "every-mhar");
}

Test(pipeline, every_layout_of_mhar_delta_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo_mhar_delta", "--set model.n_layers=8", every_layout,
                                EVERY_LAYOUT, "every-delta");
}

Test(pipeline, every_layout_of_msar_replace_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo_msar", "--set model.n_layers=8", every_layout,
                                EVERY_LAYOUT, "every-msar");
}

Test(pipeline, every_layout_of_msar_delta_equals_one_rank, .timeout = 300)
{
    expect_layouts_equal_single("demo_msar", "--set model.n_layers=8 --set residual.form=delta",
                                every_layout, EVERY_LAYOUT, "every-msar-delta");
}

Test(pipeline, one_stage_with_two_chunks_equals_one_rank)
{
    /* interleaved on one stage: the hop between its chunks goes to itself */
    expect_layout_equals_single("demo_mhar_delta", 1, "--set parallel.virtual_stages=2 "
                                "--set parallel.schedule=interleaved", "one-stage-v2");
}

Test(pipeline, pp2_with_tied_embeddings_equals_one_rank)
{
    /* the embedding is read by chunk 0 and by the head: a tensor two stages share */
    expect_network_layout_equals_single("demo", "--set model.tie_embeddings=true", 2,
                                        "--set parallel.pp=2", "pp-tied");
}

Test(pipeline, pp2_dp2_block_mhar_equals_one_rank)
{
    expect_layout_equals_single("demo_block_mhar", 4, "--set parallel.pp=2 --set parallel.dp=2",
                                "pp-dp");
}

/* The replace form walked in two phases (model/route_block.h; the ranks inherit the
 * variable from mpirun): each stage's chunk opens its own blocks. */
Test(pipeline, pp2_dp2_block_mhar_in_two_phases_equals_one_rank)
{
    setenv("FATHOM_ROUTE_REPLACE", "two_phase", 1);
    expect_layout_equals_single("demo_block_mhar", 4, "--set parallel.pp=2 --set parallel.dp=2",
                                "pp-dp-two-phase");
}

/* The same layout with and without checkpointing: the same bits, in losses and weights. */
static void expect_checkpointing_changes_nothing(const char *config, const char *extra,
                                                 const char *tag)
{
    Runs runs;
    runs_begin(&runs, tag);
    char with[1024];
    snprintf(with, sizeof with, "%s --set train.activation_checkpointing=full", extra);
    const int ranks = strstr(extra, "parallel.pp=2") ? 2 : 1;
    cr_assert_eq(layout_train(ranks, config, extra, runs.single, runs.output), 0, "%s",
                 runs.output);
    cr_assert_eq(layout_train(ranks, config, with, runs.layout, runs.output), 0, "%s",
                 runs.output);
    snprintf(runs.a, sizeof runs.a, "%s/checkpoints/step_00000005", runs.single);
    snprintf(runs.b, sizeof runs.b, "%s/checkpoints/step_00000005", runs.layout);
    cr_expect(checkpoints_bitwise_equal(runs.a, runs.b), "%s %s: checkpointing changed the weights",
              config, extra);
    double off[LAYOUT_STEPS], on[LAYOUT_STEPS];
    int steps[LAYOUT_STEPS];
    metrics_read_losses(runs.single, off, steps, LAYOUT_STEPS);
    metrics_read_losses(runs.layout, on, steps, LAYOUT_STEPS);
    cr_expect(memcmp(off, on, sizeof off) == 0, "%s: the losses moved", config);
    runs_end(&runs);
}

Test(pipeline, checkpointing_is_bitwise_free_for_the_standard_residual)
{
    expect_checkpointing_changes_nothing("demo", "", "ac-std");
}

Test(pipeline, checkpointing_is_bitwise_free_for_block_mhar_on_two_stages)
{
    expect_checkpointing_changes_nothing("demo_block_mhar", "--set parallel.pp=2", "ac-mhar");
}

Test(pipeline, checkpointing_is_bitwise_free_for_the_delta_form)
{
    expect_checkpointing_changes_nothing("demo_mhar_delta", "", "ac-delta");
}

Test(pipeline, gpipe_on_one_stage_equals_1f1b_bit_for_bit)
{
    /* four microbatches in flight: the logits of an earlier one are remade, not reused */
    expect_layout_equals_single("demo", 1, "--set parallel.schedule=gpipe", "gpipe-one");
}

/* ---- bytes ---- */

/* The value of field `key` in the comm object of stage `stage` of the last metrics line. */
static long long metrics_comm_field(const char *run_dir, int stage, const char *key)
{
    char path[512], line[1 << 14], last[1 << 14] = "";
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *file = fopen(path, "r");
    cr_assert(file, "no %s", path);
    while (fgets(line, sizeof line, file))
        if (strstr(line, "\"comm\""))
            strcpy(last, line);
    fclose(file);
    const char *at = strstr(last, "\"comm\"");
    for (int s = 0; at && s <= stage; s++)
        at = strchr(at + 1, '{');
    cr_assert(at, "stage %d has no comm object", stage);
    char pattern[96];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *field = strstr(at, pattern);
    cr_assert(field, "no %s", key);
    return atoll(field + strlen(pattern));
}

/* The prediction of pipeline/payload.h for the demo config with `overrides`. */
static PayloadBytes predicted(const char *config_name, const char *const *overrides, int n,
                              int world, int stage)
{
    char path[512];
    snprintf(path, sizeof path, "%s/launch/configs/%s.yaml", test_source_dir(), config_name);
    Config config;
    config_load(&config, path, overrides, n, world);
    ResidualPlan plan;
    residual_plan_build(&plan, &config.model, &config.residual);
    const int chunks = config.parallel.pp * config.parallel.virtual_stages;
    ChunkSpan *spans = calloc((size_t)chunks, sizeof *spans);
    chunk_spans_build(spans, chunks, &config.model, &plan, config.parallel.layer_split,
                      config.parallel.n_layer_split);
    const uint64_t tensor = (uint64_t)config.train.microbatch_size * config.train.seq_len *
                            config.model.d_model * sizeof(float);
    PayloadBytes bytes = payload_predict(&plan, spans, chunks, config.parallel.pp, stage,
                                         config_microbatches_per_rank(&config), tensor);
    free(spans);
    residual_plan_free(&plan);
    return bytes;
}

/* The leader's report of its hop links after the first step: something held, and no more
 * than the memory plan's bound. */
static void expect_held_within_the_plan(const char *output)
{
    const char *line = strstr(output, "hop sends held after the first step: ");
    cr_assert_not_null(line, "%s", output);
    unsigned long long held = 0;
    double bound = 0;
    const char *open = strchr(line, '(');
    const char *plan = strstr(line, "memory plan bound ");
    cr_assert(open && plan && sscanf(open, "(%llu bytes", &held) == 1 &&
              sscanf(strchr(plan, ',') + 1, "%lf bytes", &bound) == 1, "%s", line);
    cr_expect(held > 0 && held <= bound, "held %llu, bound %.0f", held, bound);
}

static void expect_bytes_as_predicted(const char *config, const char *const *overrides, int n,
                                      int ranks, const char *tag)
{
    Runs runs;
    runs_begin(&runs, tag);
    char extra[1024] = "";
    for (int i = 0; i < n; i++) {
        strcat(extra, " --set ");
        strcat(extra, overrides[i]);
    }
    cr_assert_eq(layout_train(ranks, config, extra, runs.layout, runs.output), 0, "%s",
                 runs.output);
    expect_held_within_the_plan(runs.output);
    const char *all[16] = {"model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1",
                           "model.head_dim=16", "model.ffn_dim=64", "train.seq_len=32",
                           "train.microbatch_size=2", "train.global_batch_size=8"};
    const int fixed = 8;
    for (int i = 0; i < n; i++)
        all[fixed + i] = overrides[i];
    for (int stage = 0; stage < ranks; stage++) {
        const PayloadBytes expected = predicted(config, all, fixed + n, ranks, stage);
        cr_expect_eq(metrics_comm_field(runs.layout, stage, "pp_send_bytes"),
                     (long long)expected.send_bytes, "%s stage %d", extra, stage);
        cr_expect_eq(metrics_comm_field(runs.layout, stage, "pp_summary_bytes"),
                     (long long)expected.summary_bytes, "%s stage %d", extra, stage);
        cr_expect_eq(metrics_comm_field(runs.layout, stage, "pp_summary_bytes_uncached"),
                     (long long)expected.summary_bytes_uncached, "%s stage %d", extra, stage);
    }
    long long sent = 0, received = 0; /* every byte sent arrives */
    for (int stage = 0; stage < ranks; stage++) {
        sent += metrics_comm_field(runs.layout, stage, "pp_send_bytes");
        received += metrics_comm_field(runs.layout, stage, "pp_recv_bytes");
    }
    cr_expect_eq(sent, received);
    runs_end(&runs);
}

Test(pipeline, pp_bytes_of_a_delta_pp2_v2_run_equal_the_prediction)
{
    const char *overrides[] = {"parallel.pp=2", "parallel.virtual_stages=2",
                               "parallel.schedule=interleaved"};
    expect_bytes_as_predicted("demo_mhar_delta", overrides, 3, 2, "bytes-delta");
}

Test(pipeline, pp_bytes_of_a_replace_pp4_run_equal_the_prediction)
{
    const char *overrides[] = {"parallel.pp=4"};
    expect_bytes_as_predicted("demo_block_mhar", overrides, 1, 4, "bytes-replace");
}

Test(pipeline, one_stage_with_two_chunks_holds_its_hops_within_the_plan)
{
    Runs runs;
    runs_begin(&runs, "one-stage-held");
    cr_assert_eq(layout_train(1, "demo_mhar_delta", "--set parallel.virtual_stages=2 "
                              "--set parallel.schedule=interleaved", runs.layout, runs.output),
                 0, "%s", runs.output);
    expect_held_within_the_plan(runs.output);
    runs_end(&runs);
}

/* The closed forms of payload.h, for even splits of N_p blocks per chunk. */
Test(pipeline, summary_units_follow_the_closed_form_cached_and_uncached)
{
    for (int P = 2; P <= 4; P++)
        for (int v = 1; v <= 3; v++)
            for (int per_chunk = 1; per_chunk <= 2; per_chunk++) {
                const int C = P * v;
                ModelConfig model = {0};
                model.n_layers = C * per_chunk;
                ResidualConfig residual = {0};
                residual.mode = RESIDUAL_ATTNRES;
                residual.heads = 1;
                residual.granularity = GRANULARITY_BLOCK;
                residual.layers_per_block = 1;
                residual.form = FORM_REPLACE;
                residual.streams = 1;
                model.d_model = 16;
                model.n_heads = model.n_kv_heads = 1;
                model.head_dim = 16;
                model.ffn_dim = 16;
                model.vocab_size = 8;
                ResidualPlan plan;
                residual_plan_build(&plan, &model, &residual);
                ChunkSpan *spans = calloc((size_t)C, sizeof *spans);
                chunk_spans_build(spans, C, &model, &plan, NULL, 0);
                long cached = 0, uncached = 0;
                for (int c = 0; c + 1 < C; c++) {
                    HopPayload a = payload_hop(&plan, spans, C, P, c, true);
                    HopPayload b = payload_hop(&plan, spans, C, P, c, false);
                    cached += a.end_block - a.first_block;
                    uncached += b.end_block - b.first_block;
                }
                const long N = per_chunk; /* one block a layer */
                cr_expect_eq(uncached, N * C * (C - 1) / 2 + (C - 1), "P %d v %d", P, v);
                cr_expect_eq(cached, N * P * (P - 1) / 2 + (long)P * (v - 1) * (P - 1) * N +
                                         (P - 1), "P %d v %d", P, v);
                free(spans);
                residual_plan_free(&plan);
            }
}

/* ---- layout errors ---- */

static void expect_layout_error(int ranks, const char *config, const char *extra,
                                const char *key)
{
    Runs runs;
    runs_begin(&runs, "layout-error");
    const int status = layout_train(ranks, config, extra, runs.layout, runs.output);
    cr_expect_eq(status, 2, "%s: exit %d\n%s", extra, status, runs.output);
    cr_expect(strstr(runs.output, key), "%s: the message names no %s:\n%s", extra, key,
              runs.output);
    runs_end(&runs);
}

Test(pipeline, a_grid_that_is_not_the_world_names_both_keys)
{
    expect_layout_error(2, "demo", "--set parallel.pp=4", "parallel.dp");
    expect_layout_error(2, "demo", "--set parallel.pp=4", "parallel.pp");
}

Test(pipeline, a_layer_split_that_does_not_sum_is_refused)
{
    expect_layout_error(2, "demo", "--set parallel.pp=2 --set parallel.layer_split=[1,2]",
                        "parallel.layer_split");
}

Test(pipeline, a_layer_split_that_cuts_a_block_is_refused)
{
    expect_layout_error(2, "demo_block_mhar",
                        "--set parallel.pp=2 --set residual.layers_per_block=2 "
                        "--set parallel.layer_split=[1,3]",
                        "parallel.layer_split");
}

Test(pipeline, fewer_microbatches_than_1f1b_needs_are_refused)
{
    expect_layout_error(4, "demo", "--set parallel.pp=4 --set train.global_batch_size=4",
                        "parallel.schedule");
}

Test(pipeline, virtual_stages_without_interleaved_are_refused)
{
    expect_layout_error(2, "demo", "--set parallel.pp=2 --set parallel.virtual_stages=2",
                        "parallel.virtual_stages");
}

/* an evaluation through the pipeline runs whole microbatches on every dp rank (2 x 2) */
Test(pipeline, eval_samples_that_leave_a_dp_rank_part_of_a_microbatch_are_refused)
{
    expect_layout_error(4, "demo", "--set parallel.pp=2 --set parallel.dp=2 "
                        "--set eval.every=2 --set eval.samples=6", "eval.samples = 6");
}

/* ---- fathom inspect --comm ---- */

Test(pipeline, inspect_comm_shows_measured_bytes_equal_to_the_prediction)
{
    Runs runs;
    runs_begin(&runs, "inspect");
    cr_assert_eq(layout_train(2, "demo_mhar_delta",
                              "--set parallel.pp=2 --set parallel.virtual_stages=2 "
                              "--set parallel.schedule=interleaved",
                              runs.layout, runs.output),
                 0, "%s", runs.output);
    char arguments[512];
    snprintf(arguments, sizeof arguments, "inspect --comm '%s'", runs.layout);
    cr_expect_eq(test_run_fathom(arguments, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 runs.output);
    cr_expect(strstr(runs.output, "every measured value equals the prediction"), "%s",
              runs.output);
    /* a stage that sent a byte more than predicted is a mismatch, exit 3 */
    char command[1024];
    snprintf(command, sizeof command,
             "sed -i '$ s/\"pp_send_bytes\":\\([0-9]*\\)/\"pp_send_bytes\":1\\1/' "
             "'%s/metrics.jsonl'",
             runs.layout);
    cr_assert_eq(test_run_command(command, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 runs.output);
    cr_expect_eq(test_run_fathom(arguments, runs.output, LAYOUT_OUTPUT_CAPACITY), 3, "%s",
                 runs.output);
    cr_expect(strstr(runs.output, "differ from the prediction"), "%s", runs.output);
    runs_end(&runs);
}

Test(pipeline, inspect_of_a_pp2_checkpoint_shows_the_layout_that_saved_it)
{
    Runs runs;
    runs_begin(&runs, "inspect-layout");
    cr_assert_eq(layout_train(2, "demo_block_mhar",
                              "--set parallel.pp=2 --set parallel.virtual_stages=2 "
                              "--set parallel.schedule=interleaved --set train.steps=1",
                              runs.layout, runs.output),
                 0, "%s", runs.output);
    char arguments[512];
    snprintf(arguments, sizeof arguments, "inspect '%s'", runs.layout);
    cr_expect_eq(test_run_fathom(arguments, runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s",
                 runs.output);
    cr_expect(strstr(runs.output, "layout: pp 2, dp 1, virtual_stages 2, layer split even"),
              "%s", runs.output);
    cr_expect(strstr(runs.output, "residual: mode attnres, heads 4, granularity block"), "%s",
              runs.output);
    cr_expect(strstr(runs.output, "integrity: OK"), "%s", runs.output);
    runs_end(&runs);
}

Test(pipeline, a_pp2_run_resumed_from_its_checkpoint_equals_the_straight_run_bit_for_bit)
{
    Runs runs;
    runs_begin(&runs, "pp-resume");
    const char *layout = "--set parallel.pp=2 --set parallel.virtual_stages=2 "
                         "--set parallel.schedule=interleaved";
    char first_part[512];
    snprintf(first_part, sizeof first_part, "%s --set train.steps=3 --set checkpoint.every=3",
             layout);
    cr_assert_eq(layout_train(2, "demo_block_mhar", layout, runs.single, runs.output), 0,
                 "%s", runs.output);
    cr_assert_eq(layout_train(2, "demo_block_mhar", first_part, runs.layout, runs.output), 0,
                 "%s", runs.output);
    cr_assert_eq(layout_train(2, "demo_block_mhar", layout, runs.layout, runs.output), 0,
                 "%s", runs.output);
    cr_expect(strstr(runs.output, "resumed at step 3"), "%s", runs.output);
    snprintf(runs.a, sizeof runs.a, "%s/checkpoints/step_00000005", runs.single);
    snprintf(runs.b, sizeof runs.b, "%s/checkpoints/step_00000005", runs.layout);
    cr_expect(checkpoints_bitwise_equal(runs.a, runs.b), "the resumed pp2 v2 run moved");
    runs_end(&runs);
}

/* ---- launch/bench/gpus_nccl.sh, rehearsed on the cpu ---- */

/* The script a machine of two GPUs runs (issue of NCCL across GPUs) works end to end on the
 * cpu: two ranks against one in dp2, pp2 and pp2 v2 follow the one-rank losses, every byte as
 * predicted, and the bandwidth part reports fathom's six unit collectives. */
Test(pipeline, the_two_gpu_script_rehearsed_on_the_cpu_finds_every_layout_equal, .timeout = 240)
{
    char directory[256], command[1024];
    test_make_temp_dir(directory, "gpus-nccl");
    char *output = malloc(LAYOUT_OUTPUT_CAPACITY);
    snprintf(command, sizeof command,
             "cd '%s' && OUT='%s' DEVICE=cpu FATHOM_BINARY='%s' "
             "launch/bench/gpus_nccl.sh equivalence 1b mhar_delta 2>&1 && OUT='%s' DEVICE=cpu "
             "FATHOM_BINARY='%s' launch/bench/gpus_nccl.sh bandwidth 2>&1",
             test_source_dir(), directory, test_fathom_binary(), directory,
             test_fathom_binary());
    cr_assert_eq(test_run_command(command, output, LAYOUT_OUTPUT_CAPACITY), 0, "%s", output);
    static const char *const layouts[3] = {"dp2", "pp2", "pp2v2"};
    for (int l = 0; l < 3; l++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "mhar_delta  %-6s ", layouts[l]);
        const char *row = strstr(output, prefix);
        cr_assert_not_null(row, "no %s row:\n%s", layouts[l], output);
        double deviation = 1;
        cr_expect_eq(sscanf(row + strlen(prefix), "%lf", &deviation), 1, "%.80s", row);
        cr_expect_leq(deviation, 1e-5, "%.80s", row);
        const char *end = strchr(row, '\n');
        cr_expect(end && strstr(row, "as-predicted") && strstr(row, "as-predicted") < end,
                  "%.80s", row);
        cr_expect(strstr(row, " mpi ") && strstr(row, " mpi ") < end, "%.80s", row);
    }
    cr_expect_not_null(strstr(output, "fathom bench --cases comm: exit 0"), "%s", output);
    cr_expect_not_null(strstr(output, "scatter 8B embedding"), "%s", output);
    free(output);
    test_remove_tree(directory);
}
