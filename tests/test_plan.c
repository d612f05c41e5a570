/* tests/test_plan.c — `fathom plan`: a job's memory plan, stage by stage, from its config
 * alone (launch/plan.h), equal to launch/memory_plan.h's, and its verdict against a GPU.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/memory_plan.h"
#include "model/model.h"
#include "pipeline/traffic.h"
#include "runtime/config.h"
#include "tests/support.h"

static int run_plan(const char *arguments, char *output, size_t capacity)
{
    char command[1024];
    snprintf(command, sizeof command, "plan '%s/launch/configs/marin8b_block_mhar.yaml' %s",
             test_source_dir(), arguments);
    return test_run_fathom(command, output, capacity);
}

/* The 8B job's config, with one override or none */
static void load_8b(Config *config, const char *override)
{
    char path[512];
    snprintf(path, sizeof path, "%s/launch/configs/marin8b_block_mhar.yaml",
             test_source_dir());
    const char *overrides[1] = {override};
    config_load(config, path, overrides, override ? 1 : 0, CONFIG_ANY_WORLD);
}

/* A stage's plan (its dp rank 0) as memory_plan_build sizes it for the cuda backend */
static MemoryPlan stage_plan(const Config *config, int stage)
{
    Backend cuda_like = *backend_cpu();
    cuda_like.name = "cuda";
    cuda_like.activation_bytes = 2;
    MemoryPlan plan;
    memory_plan_build(&plan, config, &cuda_like,
                      (RankLayout){config->parallel.pp, config->parallel.dp, stage, 0});
    return plan;
}

/* The largest stage of the 8B job, as memory_plan_build sizes it for the cuda backend. */
static double largest_stage_gib(const char *override)
{
    Config config;
    load_8b(&config, override);
    double largest = 0;
    for (int stage = 0; stage < config.parallel.pp; stage++) {
        const MemoryPlan plan = stage_plan(&config, stage);
        const double bytes = memory_plan_backend_bytes(&plan);
        largest = bytes > largest ? bytes : largest;
    }
    return largest / (1 << 30);
}

Test(plan, the_8b_job_is_planned_stage_by_stage_and_fits_an_80_gib_gpu)
{
    char output[16384], want[128];
    const int code = run_plan("--gpu-memory 80", output, sizeof output);
    cr_assert_eq(code, 0, "exit %d: %s", code, output);
    cr_expect(strstr(output, "parallel.pp 2 x parallel.dp 4 = 8 ranks, cuda (bf16)"), "%s",
              output);
    cr_expect(strstr(output, "(stage 0, dp rank 0 of parallel.pp 2 x parallel.dp 4)"), "%s",
              output);
    cr_expect(strstr(output, "(stage 1, dp rank 0 of parallel.pp 2 x parallel.dp 4)"), "%s",
              output);
    snprintf(want, sizeof want, "the largest stage holds %.2f GiB a rank on its GPU; "
             "--gpu-memory 80: fits", largest_stage_gib(NULL));
    cr_expect(strstr(output, want), "'%s' not in:\n%s", want, output);
    /* each stage's bytes a rank sends, as pipeline/traffic.h predicts them in bf16 */
    char path[512];
    snprintf(path, sizeof path, "%s/launch/configs/marin8b_block_mhar.yaml",
             test_source_dir());
    Config config;
    config_load(&config, path, NULL, 0, CONFIG_ANY_WORLD);
    for (int stage = 0; stage < 2; stage++) {
        const RankTraffic traffic = traffic_predict_rank(&config, stage, 2);
        snprintf(want, sizeof want, "fathom: %5d %13.2f GB %13.2f GB %13.2f GB %13.2f GB "
                 "%13.2f GB", stage, traffic.pp_send / 1e9, traffic.pp_summary / 1e9,
                 traffic.pp_summary_uncached / 1e9, traffic.fsdp_allgather / 1e9,
                 traffic.fsdp_reducescatter / 1e9);
        cr_expect(strstr(output, want), "'%s' not in:\n%s", want, output);
    }
}

Test(plan, activations_past_the_gpu_are_exit_2_naming_the_keys_that_shrink_them)
{
    char output[16384], want[128];
    const int code = run_plan("--set train.activation_checkpointing=none --gpu-memory 80",
                              output, sizeof output);
    cr_assert_eq(code, 2, "exit %d: %s", code, output);
    cr_expect(strstr(output, "stage 0 does not fit"), "%s", output);
    cr_expect(strstr(output, "train.activation_checkpointing: full"), "%s", output);
    cr_expect(strstr(output, "train.microbatch_size = 2"), "%s", output);
    snprintf(want, sizeof want, "the largest stage holds %.2f GiB a rank",
             largest_stage_gib("train.activation_checkpointing=none"));
    cr_expect(strstr(output, want), "'%s' not in:\n%s", want, output);
    /* without a GPU size there is no verdict, only the plan */
    cr_assert_eq(run_plan("--set train.activation_checkpointing=none", output,
                          sizeof output), 0, "%s", output);
    cr_expect_null(strstr(output, "fit"), "%s", output);
}

Test(plan, bad_arguments_are_usage_errors)
{
    char output[8192];
    cr_expect_eq(test_run_fathom("plan", output, sizeof output), 2, "%s", output);
    cr_expect(strstr(output, "usage: fathom plan CONFIG.yaml"), "%s", output);
    cr_expect_eq(run_plan("--gpu-memory -3", output, sizeof output), 2, "%s", output);
    cr_expect(strstr(output, "--gpu-memory -3 is not a positive number"), "%s", output);
    cr_expect_eq(run_plan("--set device=cpu --gpu-memory 80", output, sizeof output), 2,
                 "%s", output);
    cr_expect_eq(run_plan("--frobnicate", output, sizeof output), 2, "%s", output);
    cr_expect(strstr(output, "plan: unknown option '--frobnicate'"), "%s", output);
}

Test(plan, a_vocabulary_size_of_auto_is_read_from_the_data_as_train_reads_it)
{
    char output[16384], auto_plan[16384], arguments[1024];
    snprintf(arguments, sizeof arguments,
             "plan '%s/launch/configs/demo.yaml' --set model.vocab_size=auto",
             test_source_dir());
    cr_assert_eq(test_run_fathom(arguments, auto_plan, sizeof auto_plan), 0, "%s", auto_plan);
    /* the synthetic corpus is byte-level: auto is 256 */
    snprintf(arguments, sizeof arguments,
             "plan '%s/launch/configs/demo.yaml' --set model.vocab_size=256",
             test_source_dir());
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    const char *largest = strstr(output, "the largest stage holds");
    cr_assert_not_null(largest, "%s", output);
    char line[128];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(largest, "\n"), largest);
    cr_expect(strstr(auto_plan, line), "'%s' not in the auto plan:\n%s", line, auto_plan);
}

/* `fathom eval` builds the model for the forward only, checkpointed (launch/inference.c):
 * the plan's figure is what that model holds, byte for byte (its parameters, scratch, whole
 * stash and store, and the RoPE tables), and the 8B job's checkpoint fits one 80 GB GPU. */
Test(plan, the_evaluation_of_a_checkpoint_is_planned_as_the_forward_only_model_holds_it)
{
    char path[512];
    snprintf(path, sizeof path, "%s/launch/configs/demo_mhar_delta.yaml", test_source_dir());
    const char *overrides[] = {"model.d_model=64", "model.head_dim=16", "train.seq_len=48",
                               "train.microbatch_size=3", "train.global_batch_size=6"};
    Config config;
    config_load(&config, path, overrides, 5, 1);
    const ModelSharding forward_only = {.forward_only = true};
    Model *model = model_create_sharded(backend_cpu(), &config.model, &config.residual,
                                        config.train.microbatch_size, config.train.seq_len,
                                        &forward_only);
    model_set_activation_checkpointing(model, true);
    size_t parameters, activations;
    model_memory_bytes(model, &parameters, &activations);
    const double rope = 2.0 * config.train.seq_len * (config.model.head_dim / 2) * sizeof(float);
    cr_expect_eq(memory_plan_evaluation_bytes(&config, backend_cpu()),
                 (double)parameters + (double)activations + rope);
    model_destroy(model);

    char output[16384];
    cr_assert_eq(run_plan("", output, sizeof output), 0, "%s", output);
    const char *line = strstr(output, "fathom eval of a checkpoint of this config holds ");
    cr_assert_not_null(line, "%s", output);
    const double gib = strtod(line + strlen("fathom eval of a checkpoint of this config holds "),
                              NULL);
    cr_expect(gib > 40 && gib < 80, "the 8B job's checkpoint: %g GiB", gib);
}

/* The activations line names each part with its bytes: the stashes, the summary stores
 * (where the replace form keeps its partials), the scratch and the hops in flight, each as
 * the plan sizes it (GiB, two decimals) */
Test(plan, the_activations_line_gives_each_parts_bytes)
{
    char output[16384];
    const int code = run_plan("", output, sizeof output);
    cr_assert_eq(code, 0, "exit %d: %s", code, output);
    Config config;
    load_8b(&config, NULL);
    const MemoryPlan plan = stage_plan(&config, 0);
    const char *line = strstr(output, "fathom:   activations");
    cr_assert_not_null(line, "%s", output);
    int stashes, stores;
    double stash, store, scratch, hops;
    const int read = sscanf(line, "fathom:   activations %*f GiB %d stashes %lf GiB, %d summary "
                            "stores %lf GiB, scratch %lf GiB, RoPE tables, hops in flight "
                            "%lf GiB", &stashes, &stash, &stores, &store, &scratch, &hops);
    cr_assert_eq(read, 6, "read %d fields of: %.300s", read, line);
    const double gib = 1 << 30;
    cr_expect_eq(stashes, plan.stashes);
    cr_expect_eq(stores, plan.stores);
    cr_expect(fabs(stash - plan.stash_bytes / gib) < 0.006, "stashes %.2f: %.3f", stash,
              plan.stash_bytes / gib);
    cr_expect(fabs(store - plan.store_bytes / gib) < 0.006, "stores %.2f: %.3f", store,
              plan.store_bytes / gib);
    cr_expect(fabs(scratch - plan.scratch_bytes / gib) < 0.006, "scratch %.2f: %.3f", scratch,
              plan.scratch_bytes / gib);
    cr_expect(fabs(hops - plan.held_bytes / gib) < 0.006, "hops %.2f: %.3f", hops,
              plan.held_bytes / gib);
    cr_expect(plan.store_bytes > 0 && plan.held_bytes > 0);
}
