/* tests/test_memory_plan.c — the memory plan of launch/memory_plan.h: computed from the
 * config alone, it equals what the model, the optimizer state and the executor allocate,
 * and `fathom train` refuses, before allocating, a run that cannot fit or a step that
 * cannot finish (launch/step_budget.h). */
#include "launch/memory_plan.h"
#include "launch/step_budget.h"
#include "model/activations.h"
#include "model/chunk.h"
#include "model/model.h"
#include "model/params.h"
#include "pipeline/executor.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A small model (d 32), then the space-separated key=value `overrides`, for `world` ranks. */
static Config small_config(const char *overrides, int world)
{
    static const char yaml[] =
        "model: {d_model: 32, n_layers: 4, n_heads: 2, n_kv_heads: 1, head_dim: 16, "
        "ffn_dim: 64}\n"
        "train: {seq_len: 16, microbatch_size: 2, global_batch_size: 8}\n";
    char text[1024];
    snprintf(text, sizeof text, "%s", overrides);
    const char *list[32];
    int n = 0;
    for (char *item = strtok(text, " "); item && n < 32; item = strtok(NULL, " "))
        list[n++] = item;
    Config config;
    config_load_text(&config, yaml, "memory_plan.yaml", list, n, world);
    return config;
}

static const RankLayout one_rank = {1, 1, 0, 0};

static const char *const residuals[] = {
    "",
    "model.qk_norm=true model.tie_embeddings=true model.vocab_size=300",
    "residual.mode=attnres residual.granularity=full",
    "residual.mode=attnres residual.heads=4 residual.layers_per_block=2 residual.form=delta",
    "residual.mode=msar residual.heads=2 residual.form=delta residual.streams=4",
    "residual.mode=msar residual.granularity=full residual.streams=1 "
    "residual.stream_kernels=[3]",
    "model.d_model=36 model.head_dim=18 model.ffn_dim=50 residual.mode=attnres "
    "residual.form=delta", /* tensors of sizes off PARAM_ALIGNMENT */
};

Test(memory_plan, parameter_count_equals_the_parameter_table)
{
    for (size_t i = 0; i < sizeof residuals / sizeof residuals[0]; i++) {
        Config config = small_config(residuals[i], 1);
        ParameterCount count;
        memory_plan_count_parameters(&count, &config);
        ParamTable table;
        param_table_build_with_residual(&table, &config.model, &config.residual);
        cr_assert_eq((size_t)count.total, table.total, "%s: counted %.0f, table %zu",
                     residuals[i], count.total, table.total);
        cr_assert_eq((size_t)count.layer_matrix, table.layer_matrix_count, "%s", residuals[i]);
        cr_assert_eq((size_t)count.tensors, (size_t)table.n_params, "%s", residuals[i]);
        cr_assert_eq((size_t)count.layer_unit, table.units[2].offset - table.units[1].offset,
                     "%s", residuals[i]);
        size_t largest = 0;
        for (int p = 0; p < table.n_params; p++)
            if (table.params[p].count > largest)
                largest = table.params[p].count;
        cr_assert_eq((size_t)count.largest, largest, "%s", residuals[i]);
        param_table_free(&table);
    }
}

/* What the model, the run state and the executor of `stage` allocate, against the plan. */
static void expect_plan_equals_allocation(const Config *config, RankLayout layout)
{
    const Backend *backend = backend_cpu();
    MemoryPlan plan;
    memory_plan_build(&plan, config, backend, layout);
    cr_assert(plan.activations_sized && plan.activations_exact);

    /* the model of the stage: the units its chunks read (DESIGN 3), one dp rank */
    const int C = layout.pp * config->parallel.virtual_stages;
    ChunkSpan *spans = calloc((size_t)C, sizeof *spans), *mine = calloc((size_t)C, sizeof *mine);
    ResidualPlan residual;
    residual_plan_build(&residual, &config->model, &config->residual);
    chunk_spans_build(spans, C, &config->model, &residual, config->parallel.layer_split,
                      config->parallel.n_layer_split);
    residual_plan_free(&residual);
    int n_mine = 0;
    for (int c = layout.stage; c < C; c += layout.pp)
        mine[n_mine++] = spans[c];
    const ModelSharding sharding = {NULL, mine, n_mine, config->fsdp.reshard_after_forward,
                                    false};
    Model *model = model_create_sharded(backend, &config->model, &config->residual,
                                        config->train.microbatch_size, config->train.seq_len,
                                        &sharding);
    free(spans);
    free(mine);
    Executor *executor = executor_create(model, config, NULL, layout.stage);
    const size_t elements = fsdp_local_count(model_fsdp(model));
    size_t parameter_bytes, unused;
    model_memory_bytes(model, &parameter_bytes, &unused);
    cr_assert_eq((size_t)plan.elements, elements, "stage %d: plan %.0f, model %zu",
                 layout.stage, plan.elements, elements);
    cr_assert_eq((size_t)(plan.parameters + plan.gradients + plan.compute_copy),
                 parameter_bytes);
    cr_assert_eq((size_t)plan.optimizer,
                 (config->optim.ema_decay > 0 ? 3 : 2) * elements * sizeof(float));
    cr_assert_eq((size_t)(plan.stash_bytes + plan.store_bytes),
                 executor_activation_bytes(executor), "plan %.0f + %.0f, executor %zu",
                 plan.stash_bytes, plan.store_bytes, executor_activation_bytes(executor));
    cr_assert_eq(plan.stashes, executor_stash_count(executor));
    cr_assert_eq((size_t)plan.scratch_bytes,
                 scratch_bytes(backend, model_config(model), model_plan(model),
                               model_max_batch(model), config->train.seq_len,
                               model_activation_checkpointing(model)));
    executor_destroy(executor);
    model_destroy(model);
}

Test(memory_plan, one_rank_plan_equals_what_training_allocates)
{
    for (size_t i = 0; i < sizeof residuals / sizeof residuals[0]; i++) {
        Config config = small_config(residuals[i], 1);
        expect_plan_equals_allocation(&config, one_rank);
    }
    Config checkpointed = small_config("train.activation_checkpointing=full "
                                       "residual.mode=attnres residual.heads=2", 1);
    expect_plan_equals_allocation(&checkpointed, one_rank);
}

Test(memory_plan, every_pipeline_stage_plan_equals_its_executor)
{
    Config config = small_config("parallel.pp=2 parallel.virtual_stages=2 "
                                 "parallel.schedule=interleaved residual.mode=attnres "
                                 "residual.heads=2 residual.form=delta", 2);
    for (int stage = 0; stage < 2; stage++)
        expect_plan_equals_allocation(&config, (RankLayout){2, 1, stage, 0});
    Config gpipe = small_config("parallel.pp=2 parallel.schedule=gpipe", 2);
    for (int stage = 0; stage < 2; stage++)
        expect_plan_equals_allocation(&gpipe, (RankLayout){2, 1, stage, 0});
}

Test(memory_plan, optimizer_holds_an_ema_only_when_ema_decay_is_set)
{
    MemoryPlan with, without;
    Config config = small_config("", 1);
    memory_plan_build(&with, &config, backend_cpu(), one_rank);
    config.optim.ema_decay = 0;
    memory_plan_build(&without, &config, backend_cpu(), one_rank);
    cr_assert_eq(with.optimizer, 12 * with.elements);
    cr_assert_eq(without.optimizer, 8 * without.elements);
}

Test(memory_plan, compute_copy_is_bf16_on_cuda_and_absent_on_cpu)
{
    Backend cuda_like = *backend_cpu();
    cuda_like.name = "cuda";
    cuda_like.activation_bytes = 2;
    Config config = small_config("", 1);
    MemoryPlan cpu, cuda;
    memory_plan_build(&cpu, &config, backend_cpu(), one_rank);
    memory_plan_build(&cuda, &config, &cuda_like, one_rank);
    cr_assert_eq(cpu.compute_copy, 0);
    cr_assert_eq(cuda.compute_copy, 2 * cuda.elements);
    cr_assert(cuda.activations < cpu.activations, "bf16 activations take less than fp32");
}

static const MachineMemory unknown = {.bytes = -1, .source = "unknown"};

Test(memory_plan, too_many_layers_name_the_model_keys)
{
    Config config = small_config("model.n_layers=100000", 1);
    MemoryPlan plan;
    memory_plan_build(&plan, &config, backend_cpu(), one_rank);
    const MachineMemory host = {.bytes = 1 << 30, .source = "a test's gibibyte"};
    char message[1024];
    cr_assert_not(memory_plan_fits(&plan, &config, backend_cpu(), host, host, message,
                                   sizeof message));
    cr_assert(strstr(message, "model.n_layers = 100000"), "%s", message);
    cr_assert(strstr(message, "a test's gibibyte"), "%s", message);
    cr_assert(memory_plan_fits(&plan, &config, backend_cpu(), unknown, unknown, message,
                               sizeof message), "an unknown amount of memory refuses nothing");
}

Test(memory_plan, long_sequences_name_the_activation_keys)
{
    Config config = small_config("train.seq_len=1000000", 1);
    MemoryPlan plan;
    memory_plan_build(&plan, &config, backend_cpu(), one_rank);
    const MachineMemory host = {.bytes = 1 << 30, .source = "a test's gibibyte"};
    char message[1024];
    cr_assert_not(memory_plan_fits(&plan, &config, backend_cpu(), host, host, message,
                                   sizeof message));
    cr_assert(strstr(message, "train.seq_len = 1000000"), "%s", message);
    cr_assert(strstr(message, "train.activation_checkpointing: full"), "%s", message);
    cr_assert_not(strstr(message, "model.n_layers"), "the weights are small: %s", message);
}

Test(memory_plan, cuda_compares_the_device_part_with_the_gpu)
{
    Backend cuda_like = *backend_cpu();
    cuda_like.name = "cuda";
    cuda_like.activation_bytes = 2;
    Config config = small_config("model.n_layers=1000", 1);
    MemoryPlan plan;
    memory_plan_build(&plan, &config, &cuda_like, one_rank);
    const MachineMemory gpu = {.bytes = memory_plan_backend_bytes(&plan) - 1, .source = "gpu"};
    const MachineMemory host = {.bytes = plan.host, .source = "host"};
    char message[1024];
    cr_assert_not(memory_plan_fits(&plan, &config, &cuda_like, gpu, host, message,
                                   sizeof message));
    cr_assert(strstr(message, "device memory"), "%s", message);
    const MachineMemory enough = {.bytes = memory_plan_backend_bytes(&plan), .source = "gpu"};
    cr_assert(memory_plan_fits(&plan, &config, &cuda_like, enough, host, message,
                               sizeof message), "%s", message);
}

Test(memory_plan, step_floor_grows_with_the_global_batch)
{
    Config config = small_config("", 1);
    const double floor = step_budget_floor_seconds(&config, backend_cpu(), 1, 2);
    cr_assert(floor > 0 && floor < 1, "%g s", floor);
    config.train.global_batch_size *= 1000;
    cr_assert_float_eq(step_budget_floor_seconds(&config, backend_cpu(), 1, 2), 1000 * floor,
                       1e-9 * floor);
    cr_assert_float_eq(step_budget_floor_seconds(&config, backend_cpu(), 4, 2), 250 * floor,
                       1e-9 * floor);
}

/* ---- `fathom train` end to end ---- */

static int train_demo(const char *overrides, char *output, size_t capacity)
{
    char directory[256], arguments[1024];
    test_make_temp_dir(directory, "memory-plan");
    snprintf(arguments, sizeof arguments, "train '%s/launch/configs/demo.yaml' --set "
             "run_dir=%s/run --set train.steps=2 %s", test_source_dir(), directory, overrides);
    char command[1400];
    /* a step that never ends ignores SIGTERM until it does: KILL 5 s after the TERM */
    snprintf(command, sizeof command, "timeout -k 5 60 '%s' %s", test_fathom_binary(),
             arguments);
    const int code = test_run_command(command, output, capacity);
    test_remove_tree(directory);
    return code;
}

Test(memory_plan, train_refuses_a_model_that_cannot_fit_naming_its_keys)
{
    char output[8192];
    const int code = train_demo("--set model.n_layers=1000000", output, sizeof output);
    cr_assert_eq(code, 2, "exit %d: %s", code, output);
    cr_assert(strstr(output, "memory plan of one rank"), "%s", output);
    cr_assert(strstr(output, "model.n_layers = 1000000"), "%s", output);
    cr_assert_not(strstr(output, "out of host memory"), "%s", output);
}

Test(memory_plan, train_refuses_a_sequence_that_cannot_fit_naming_its_keys)
{
    char output[8192];
    const int code = train_demo("--set train.seq_len=1000000000", output, sizeof output);
    cr_assert_eq(code, 2, "exit %d: %s", code, output);
    cr_assert(strstr(output, "memory plan of one rank"), "%s", output);
    cr_assert(strstr(output, "the activations take"), "%s", output);
    cr_assert(strstr(output, "train.seq_len = 1000000000"), "%s", output);
}

Test(memory_plan, train_refuses_a_step_too_long_to_finish_or_stop)
{
    char output[8192];
    const int code = train_demo("--set train.global_batch_size=2000000000", output,
                                sizeof output);
    cr_assert_eq(code, 2, "exit %d (124: still running after 60 s): %s", code, output);
    cr_assert(strstr(output, "train.global_batch_size = 2000000000"), "%s", output);
}
