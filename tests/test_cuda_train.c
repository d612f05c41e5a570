/* tests/test_cuda_train.c — `fathom train` on the GPU (DESIGN 3, 7): 20 steps of every
 * residual mode on the synthetic corpus follow the cpu run within bf16 tolerance, and two
 * cuda runs are bitwise identical. SKIP without a GPU.
 *
 * The network is the tiny one of tests/train_support.c widened to the head_dim the cuda
 * attention supports (d 128, 2 heads of 64, one KV head). bf16 activations and weights
 * against fp32 change every step's loss a little, and training compounds it: the bound is
 * CUDA_TRAIN_LOSS_TOLERANCE of the cpu loss at every step (measured on an H200:
 * docs/performance.md gives the largest deviation seen).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"
#include "launch/run_state.h"
#include "model/model.h"
#include "runtime/optim.h"
#include "tests/gpu_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

#define CUDA_TRAIN_STEPS 20
#define CUDA_TRAIN_LOSS_TOLERANCE 0.03

static char output[1 << 16];

static const char gpu_shape[] =
    "--set model.d_model=128 --set model.n_heads=2 --set model.n_kv_heads=1 "
    "--set model.head_dim=64 --set model.ffn_dim=256 --set train.steps=20 "
    "--set optim.warmup_steps=4";

/* Trains 20 steps on `device` with the residual `overrides`; returns the step losses. */
static void train_on(const char *directory, const char *device, const char *overrides,
                     double losses[CUDA_TRAIN_STEPS])
{
    char arguments[1024], run[300];
    tiny_config_write(directory, "checkpoint:\n  every: 20\n");
    snprintf(arguments, sizeof arguments, "%s --set device=%s %s", gpu_shape, device,
             overrides);
    /* the cpu run of a model this small wants few threads, and the GPU tests run in parallel */
    setenv("OMP_NUM_THREADS", "2", 1);
    int code = tiny_train(directory, arguments, output, sizeof output);
    cr_assert_eq(code, 0, "fathom train on %s failed (%d):\n%s", device, code, output);
    snprintf(run, sizeof run, "%s/run", directory);
    cr_assert_eq(metrics_read_losses(run, losses, NULL, CUDA_TRAIN_STEPS), CUDA_TRAIN_STEPS);
}

static void expect_cuda_follows_cpu(const char *tag, const char *overrides)
{
    gpu_require();
    char cpu_dir[256], cuda_dir[256];
    double cpu[CUDA_TRAIN_STEPS], cuda[CUDA_TRAIN_STEPS];
    test_make_temp_dir(cpu_dir, tag);
    test_make_temp_dir(cuda_dir, tag);
    train_on(cpu_dir, "cpu", overrides, cpu);
    train_on(cuda_dir, "cuda", overrides, cuda);
    double worst = 0;
    for (int i = 0; i < CUDA_TRAIN_STEPS; i++) {
        const double deviation = fabs(cuda[i] - cpu[i]) / cpu[i];
        worst = deviation > worst ? deviation : worst;
        cr_expect_leq(deviation, CUDA_TRAIN_LOSS_TOLERANCE,
                      "%s step %d: cuda loss %.5f, cpu loss %.5f", tag, i + 1, cuda[i], cpu[i]);
    }
    cr_expect_lt(cuda[CUDA_TRAIN_STEPS - 1], cuda[0] - 0.5, "%s: cuda loss %.3f -> %.3f", tag,
                 cuda[0], cuda[CUDA_TRAIN_STEPS - 1]);
    cr_log_info("%s: largest relative loss deviation over %d steps %.2e (loss %.3f -> %.3f)",
                tag, CUDA_TRAIN_STEPS, worst, cuda[0], cuda[CUDA_TRAIN_STEPS - 1]);
    printf("cuda-train %s: largest relative loss deviation %.2e\n", tag, worst);
    test_remove_tree(cpu_dir);
    test_remove_tree(cuda_dir);
}

Test(cuda_train, standard_residual_follows_the_cpu_for_20_steps, .timeout = 300)
{
    expect_cuda_follows_cpu("cuda-standard", "");
}

Test(cuda_train, attnres_full_replace_follows_the_cpu_for_20_steps, .timeout = 300)
{
    expect_cuda_follows_cpu("cuda-attnres-full",
                            "--set residual.mode=attnres --set residual.granularity=full "
                            "--set residual.form=replace");
}

Test(cuda_train, block_mhar_delta_follows_the_cpu_for_20_steps, .timeout = 300)
{
    expect_cuda_follows_cpu("cuda-mhar-delta",
                            "--set residual.mode=attnres --set residual.heads=4 "
                            "--set residual.granularity=block --set residual.layers_per_block=1 "
                            "--set residual.form=delta");
}

Test(cuda_train, msar_block_delta_follows_the_cpu_for_20_steps, .timeout = 300)
{
    expect_cuda_follows_cpu("cuda-msar-delta",
                            "--set residual.mode=msar --set residual.heads=2 "
                            "--set residual.streams=2 --set 'residual.stream_kernels=[1,3]' "
                            "--set residual.granularity=block --set residual.layers_per_block=1 "
                            "--set residual.form=delta");
}

Test(cuda_train, msar_block_replace_follows_the_cpu_for_20_steps, .timeout = 300)
{
    expect_cuda_follows_cpu("cuda-msar-replace",
                            "--set residual.mode=msar --set residual.heads=2 "
                            "--set residual.streams=2 --set 'residual.stream_kernels=[1,3]' "
                            "--set residual.granularity=block --set residual.layers_per_block=1 "
                            "--set residual.form=replace");
}

Test(cuda_train, two_cuda_runs_are_bitwise_identical, .timeout = 300)
{
    gpu_require();
    static const char *const modes[] = {
        "",
        "--set residual.mode=msar --set residual.heads=2 --set residual.streams=2 "
        "--set 'residual.stream_kernels=[1,3]' --set residual.granularity=block "
        "--set residual.layers_per_block=1 --set residual.form=delta",
    };
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        char a[256], b[256], step_a[400], step_b[400];
        double losses_a[CUDA_TRAIN_STEPS], losses_b[CUDA_TRAIN_STEPS];
        test_make_temp_dir(a, "cuda-same-a");
        test_make_temp_dir(b, "cuda-same-b");
        train_on(a, "cuda", modes[m], losses_a);
        train_on(b, "cuda", modes[m], losses_b);
        for (int i = 0; i < CUDA_TRAIN_STEPS; i++)
            cr_assert(losses_a[i] == losses_b[i], "mode %zu step %d: %.17g vs %.17g", m, i + 1,
                      losses_a[i], losses_b[i]);
        snprintf(step_a, sizeof step_a, "%s/run/checkpoints/step_00000020", a);
        snprintf(step_b, sizeof step_b, "%s/run/checkpoints/step_00000020", b);
        cr_assert(checkpoints_bitwise_equal(step_a, step_b), "mode %zu: checkpoints differ", m);
        test_remove_tree(a);
        test_remove_tree(b);
    }
}

/* runtime/backend.h: nothing allocates inside the step loop after its first step. Three
 * training steps of a Block MHAR delta model on the cuda backend: the memory held after the
 * first step is the memory held after the third, and the peak does not move. */
Test(cuda_train, nothing_is_allocated_after_the_first_step, .timeout = 120)
{
    gpu_require();
    const Backend *backend = backend_cuda();
    Config config;
    config_defaults(&config);
    config.model.vocab_size = 256, config.model.d_model = 128, config.model.n_layers = 2;
    config.model.n_heads = 2, config.model.n_kv_heads = 1, config.model.head_dim = 64;
    config.model.ffn_dim = 256;
    config.residual.mode = RESIDUAL_ATTNRES, config.residual.heads = 4;
    config.residual.granularity = GRANULARITY_BLOCK, config.residual.layers_per_block = 1;
    config.residual.form = FORM_DELTA;
    const int B = 4, T = 32;
    Model *model = model_create(backend, &config.model, &config.residual, B, T);
    model_init_params(model, 3, 0.02);
    RunState state;
    run_state_create(&state, model, &config);
    Optimizer optimizer = run_state_optimizer(&state, model, &config.optim);
    uint32_t *tokens = gpu_test_random_tokens(B * T + 1, 256, 11);
    size_t in_use[3], peak[3];
    for (int step = 0; step < 3; step++) {
        model_zero_grads(model);
        model_forward(model, tokens, tokens + 1, B, 1e-4f);
        model_backward(model, 1.0f);
        double grad_norm;
        cr_assert(optim_step(&optimizer, 1e-3, &grad_norm));
        backend->synchronize();
        backend->memory_usage(&in_use[step], &peak[step]);
    }
    cr_expect_eq(in_use[2], in_use[0], "held %zu bytes after step 1, %zu after step 3",
                 in_use[0], in_use[2]);
    cr_expect_eq(peak[2], peak[0], "peak %zu bytes after step 1, %zu after step 3", peak[0],
                 peak[2]);
    free(tokens);
    free((void *)optimizer.ranges);
    run_state_destroy(&state, model);
    model_destroy(model);
}

/* A cuda run resumed from its step-3 checkpoint follows the uninterrupted one bit for bit
 * (the checkpoint goes through host memory both ways; the compute copy is remade from it). */
Test(cuda_train, three_steps_resume_three_steps_equals_six_straight, .timeout = 120)
{
    gpu_require();
    char straight[256], resumed[256], arguments[1024];
    test_make_temp_dir(straight, "cuda-straight");
    test_make_temp_dir(resumed, "cuda-resumed");
    snprintf(arguments, sizeof arguments,
             "--set model.d_model=128 --set model.n_heads=2 --set model.n_kv_heads=1 "
             "--set model.head_dim=64 --set model.ffn_dim=256 --set device=cuda "
             "--set residual.mode=attnres --set residual.heads=4 "
             "--set residual.granularity=block --set residual.layers_per_block=1 "
             "--set residual.form=delta");
    train_expect_resume_equals_straight(straight, resumed, arguments);
    test_remove_tree(straight);
    test_remove_tree(resumed);
}
