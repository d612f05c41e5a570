/* tests/test_cuda_pipeline.c — pipeline stages on the cuda backend with two ranks sharing
 * one GPU (DESIGN 3: the hops go through host copies, which is what lets one GPU run every
 * pipeline path). pp2 and pp2 v2 follow the one-rank cuda run within bf16 tolerance over
 * 5 steps. SKIP where no GPU answers.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/gpu_support.h"
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

static void expect_cuda_layout_follows_one_rank(const char *config, const char *layout,
                                                const char *tag)
{
    gpu_require();
    char root[256], single[300], multi[300];
    test_make_temp_dir(root, tag);
    snprintf(single, sizeof single, "%s/single", root);
    snprintf(multi, sizeof multi, "%s/layout", root);
    char *output = malloc(OUTPUT_CAPACITY);
    cr_assert_eq(pipeline_train(1, config, COMMON, "", single, output, OUTPUT_CAPACITY), 0,
                 "%s", output);
    cr_assert_eq(pipeline_train(2, config, COMMON, layout, multi, output, OUTPUT_CAPACITY), 0,
                 "%s", output);
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

Test(cuda_pipeline, pp2_with_checkpointing_on_one_gpu_follows_one_rank_block_mhar)
{
    expect_cuda_layout_follows_one_rank("demo_block_mhar",
                                        "--set parallel.pp=2 "
                                        "--set train.activation_checkpointing=full",
                                        "cuda-pp2ac");
}
