/* tests/test_cuda_pipeline.c — pipeline stages and FSDP on the cuda backend with ranks
 * sharing one GPU (DESIGN 3: hops and gathers go through host copies, which is what lets
 * one GPU run every distributed path). pp2, pp2 v2, dp2 and pp2 x dp2 follow the one-rank
 * cuda run within bf16 tolerance over 5 steps, and so does an evaluation through pp2 v2.
 * SKIP where no GPU answers.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu_support.h"
#include "tests/layout_support.h"
#include "tests/pipeline_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

#define OUTPUT_CAPACITY (1 << 16)
#define STEPS 5

/* the demo configs at head_dim 64, which the cuda attention takes */
static const char *const COMMON =
    "--set device=cuda --set model.d_model=128 --set model.n_heads=2 "
    "--set model.n_kv_heads=1 --set model.head_dim=64 --set model.ffn_dim=256 "
    "--set train.seq_len=64 --set train.microbatch_size=2 --set train.global_batch_size=8 "
    "--set train.steps=5 --set log.every=1 --set eval.every=0";

/* the 1B shape of the performance table (d 1280, 16/8 heads of 80, FFN 5120) cut to 4
 * layers, with a 32k vocabulary, 2 x 512 tokens a microbatch */
static const char *const SHAPE_1B =
    "--set device=cuda --set model.d_model=1280 --set model.n_heads=16 "
    "--set model.n_kv_heads=8 --set model.head_dim=80 --set model.ffn_dim=5120 "
    "--set model.n_layers=4 --set model.vocab_size=32000 --set train.seq_len=512 "
    "--set train.microbatch_size=2 --set train.global_batch_size=8 --set train.steps=5 "
    "--set log.every=1 --set eval.every=0 --set optim.lr=3.0e-4";

static void expect_layout_follows_one_rank(const char *config, const char *common,
                                           int ranks, const char *layout, const char *tag)
{
    gpu_require();
    char root[256], single[300], multi[300];
    test_make_temp_dir(root, tag);
    snprintf(single, sizeof single, "%s/single", root);
    snprintf(multi, sizeof multi, "%s/layout", root);
    char *output = malloc(OUTPUT_CAPACITY);
    cr_assert_eq(pipeline_train(1, config, common, "", single, output, OUTPUT_CAPACITY), 0,
                 "%s", output);
    cr_assert_eq(pipeline_train(ranks, config, common, layout, multi, output,
                                OUTPUT_CAPACITY), 0, "%s", output);
    const char *table = strstr(output, "fathom: communication a step");
    if (table) /* the GPU log keeps what the communication cost: the table and its rows */
        printf("cuda %s %s: %s\n", config, layout, table);
    double one[STEPS], two[STEPS];
    int steps[STEPS];
    cr_assert_eq(metrics_read_losses(single, one, steps, STEPS), STEPS);
    cr_assert_eq(metrics_read_losses(multi, two, steps, STEPS), STEPS);
    for (int s = 0; s < STEPS; s++) {
        const double relative = fabs(two[s] - one[s]) / fabs(one[s]);
        printf("cuda pipeline %s %s step %d: relative loss deviation %.3g\n", config, layout,
               s + 1, relative);
        cr_expect(relative <= 1e-2, "%s %s step %d: %.6g against one rank %.6g", config,
                  layout, s + 1, two[s], one[s]);
    }
    free(output);
    test_remove_tree(root);
}

static void expect_cuda_layout_follows_one_rank(const char *config, const char *layout,
                                                const char *tag)
{
    expect_layout_follows_one_rank(config, COMMON, 2, layout, tag);
}

Test(cuda_pipeline, pp2_on_one_gpu_follows_one_rank_standard)
{
    expect_cuda_layout_follows_one_rank("demo", "--set parallel.pp=2", "cuda-pp2");
}

Test(cuda_pipeline, pp2_v2_on_one_gpu_follows_one_rank_mhar_delta)
{
    expect_cuda_layout_follows_one_rank("demo_mhar_delta",
                                        "--set parallel.pp=2 --set parallel.virtual_stages=2 "
                                        "--set parallel.schedule=interleaved",
                                        "cuda-pp2v2");
}

/* An evaluation through two stages of two chunks (forward only, the hops host-staged) logs
 * the one-rank cuda run's val_loss within bf16 tolerance. */
Test(cuda_pipeline, pp2_v2_evaluation_on_one_gpu_follows_one_rank_mhar_delta)
{
    gpu_require();
    Runs runs;
    runs_begin(&runs, "cuda-pp2v2-eval");
    const char *evaluation = "--set eval.every=5 --set eval.samples=8";
    char layout[512];
    snprintf(layout, sizeof layout, "%s --set parallel.pp=2 --set parallel.virtual_stages=2 "
             "--set parallel.schedule=interleaved", evaluation);
    cr_assert_eq(pipeline_train(1, "demo_mhar_delta", COMMON, evaluation, runs.single,
                                runs.output, LAYOUT_OUTPUT_CAPACITY), 0, "%s", runs.output);
    cr_assert_eq(pipeline_train(2, "demo_mhar_delta", COMMON, layout, runs.layout, runs.output,
                                LAYOUT_OUTPUT_CAPACITY), 0, "%s", runs.output);
    double one, two;
    int step;
    cr_assert_eq(metrics_read_val_losses(runs.single, &one, &step, 1), 1);
    cr_assert_eq(metrics_read_val_losses(runs.layout, &two, &step, 1), 1);
    const double relative = fabs(two - one) / fabs(one);
    printf("cuda pipeline evaluation pp2 v2: val_loss %.6g, one rank %.6g, relative %.3g\n",
           two, one, relative);
    cr_expect(relative <= 1e-2, "val_loss %.6g against one rank %.6g", two, one);
    runs_end(&runs);
}

Test(cuda_pipeline, pp2_with_checkpointing_on_one_gpu_follows_one_rank_block_mhar)
{
    expect_cuda_layout_follows_one_rank("demo_block_mhar",
                                        "--set parallel.pp=2 "
                                        "--set train.activation_checkpointing=full",
                                        "cuda-pp2ac");
}

Test(cuda_pipeline, dp2_fsdp_on_one_gpu_follows_one_rank_at_the_1b_shape, .timeout = 600)
{
    expect_layout_follows_one_rank("demo", SHAPE_1B, 2, "--set parallel.dp=2", "cuda-dp2");
}

Test(cuda_pipeline, dp2_fsdp_keeping_the_layers_follows_one_rank_mhar_delta, .timeout = 600)
{
    expect_layout_follows_one_rank("demo_mhar_delta", SHAPE_1B, 2,
                                   "--set parallel.dp=2 --set fsdp.reshard_after_forward=false",
                                   "cuda-dp2-delta");
}

Test(cuda_pipeline, pp2_dp2_fsdp_on_one_gpu_follows_one_rank_at_the_1b_shape, .timeout = 600)
{
    expect_layout_follows_one_rank("demo_block_mhar", SHAPE_1B, 4,
                                   "--set parallel.pp=2 --set parallel.dp=2", "cuda-pp2dp2");
}

/* One stage of two chunks hands its hops to itself; forced onto NCCL (a one-rank
 * communicator: every hop one group of ncclSend and ncclRecv, and FSDP's gathers through
 * NCCL too) the run must equal the plain one bit for bit, since every transfer is a copy. */
Test(cuda_pipeline, hops_through_nccl_on_one_stage_equal_copies_bit_for_bit, .timeout = 300)
{
    gpu_require();
    char root[256], plain[300], nccl[300];
    test_make_temp_dir(root, "cuda-hops-nccl");
    snprintf(plain, sizeof plain, "%s/plain", root);
    snprintf(nccl, sizeof nccl, "%s/nccl", root);
    const char *layout = "--set parallel.virtual_stages=2 --set parallel.schedule=interleaved";
    char *output = malloc(OUTPUT_CAPACITY);
    cr_assert_eq(pipeline_train(1, "demo_mhar_delta", COMMON, layout, plain, output,
                                OUTPUT_CAPACITY), 0, "%s", output);
    setenv("FATHOM_DEVICE_COMM", "nccl", 1);
    const int status = pipeline_train(1, "demo_mhar_delta", COMMON, layout, nccl, output,
                                      OUTPUT_CAPACITY);
    unsetenv("FATHOM_DEVICE_COMM");
    cr_assert_eq(status, 0, "%s", output);
    double a[STEPS], b[STEPS];
    int steps[STEPS];
    cr_assert_eq(metrics_read_losses(plain, a, steps, STEPS), STEPS);
    cr_assert_eq(metrics_read_losses(nccl, b, steps, STEPS), STEPS);
    for (int s = 0; s < STEPS; s++)
        cr_expect(a[s] == b[s], "step %d: %.9g through NCCL, %.9g as copies", s + 1, b[s], a[s]);
    free(output);
    test_remove_tree(root);
}
