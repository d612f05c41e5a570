/* tests/train_support.c — see train_support.h. */
#include "tests/train_support.h"

#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tiny_config_write(const char *directory, const char *extra)
{
    char path[512], text[4096];
    snprintf(path, sizeof path, "%s/config.yaml", directory);
    snprintf(text, sizeof text,
             "run_dir: %s/run\n"
             "seed: 7\n"
             "device: cpu\n"
             "model:\n"
             "  vocab_size: 256\n"
             "  d_model: 64\n"
             "  n_layers: 2\n"
             "  n_heads: 4\n"
             "  n_kv_heads: 2\n"
             "  head_dim: 16\n"
             "  ffn_dim: 160\n"
             "train:\n"
             "  steps: 6\n"
             "  seq_len: 32\n"
             "  microbatch_size: 4\n"
             "  global_batch_size: 8\n"
             "optim:\n"
             "  lr: 3.0e-3\n"
             "  warmup_steps: 2\n"
             "log:\n"
             "  every: 1\n"
             "%s",
             directory, extra ? extra : "");
    test_write_file(path, text);
}

int tiny_train(const char *directory, const char *arguments, char *output, size_t capacity)
{
    char command[1024];
    snprintf(command, sizeof command, "train %s/config.yaml %s", directory,
             arguments ? arguments : "");
    return test_run_fathom(command, output, capacity);
}

/* The `key` values of metrics.jsonl's step lines (evaluation false) or evaluation lines
 * (true), with their steps, up to `capacity`. */
static int metrics_read(const char *run_dir, bool evaluation, const char *key, double *values,
                        int *steps, int capacity)
{
    char path[512], line[8192], quoted[64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    FILE *file = fopen(path, "r");
    cr_assert_not_null(file, "no %s", path);
    int count = 0;
    while (count < capacity && fgets(line, sizeof line, file)) {
        if ((strstr(line, "\"val_loss\"") != NULL) != evaluation)
            continue;
        const char *value = strstr(line, quoted);
        const char *step = strstr(line, "\"step\":");
        cr_assert(value && step, "metrics line without step/%s: %s", key, line);
        values[count] = strtod(value + strlen(quoted), NULL);
        if (steps)
            steps[count] = atoi(step + strlen("\"step\":"));
        count++;
    }
    fclose(file);
    return count;
}

int metrics_read_losses(const char *run_dir, double *losses, int *steps, int capacity)
{
    return metrics_read(run_dir, false, "loss", losses, steps, capacity);
}

int metrics_read_val_losses(const char *run_dir, double *losses, int *steps, int capacity)
{
    return metrics_read(run_dir, true, "val_loss", losses, steps, capacity);
}

int checkpoints_bitwise_equal(const char *step_dir_a, const char *step_dir_b)
{
    /* h5diff compares every dataset value exactly when given no tolerance (exit 0: equal,
     * 1: some value differs); the shard files hold all the data of a one-process run */
    char command[1024], output[4096];
    snprintf(command, sizeof command, "h5diff -q '%s/shard_p0_d0.h5' '%s/shard_p0_d0.h5'",
             step_dir_a, step_dir_b);
    int code = test_run_command(command, output, sizeof output);
    cr_assert(code == 0 || code == 1, "h5diff failed (exit %d): %s", code, output);
    return code == 0;
}

/* The runs under <a>/run and <b>/run logged 6 equal losses and wrote bitwise equal step-6
 * checkpoints. */
void train_expect_six_equal_steps(const char *a, const char *b)
{
    double losses_a[8], losses_b[8];
    char run_a[300], run_b[300], step_a[400], step_b[400];
    snprintf(run_a, sizeof run_a, "%s/run", a);
    snprintf(run_b, sizeof run_b, "%s/run", b);
    cr_assert_eq(metrics_read_losses(run_a, losses_a, NULL, 8), 6);
    cr_assert_eq(metrics_read_losses(run_b, losses_b, NULL, 8), 6);
    for (int i = 0; i < 6; i++)
        cr_assert(losses_a[i] == losses_b[i], "step %d: %.17g vs %.17g", i + 1, losses_a[i],
                  losses_b[i]);
    snprintf(step_a, sizeof step_a, "%s/checkpoints/step_00000006", run_a);
    snprintf(step_b, sizeof step_b, "%s/checkpoints/step_00000006", run_b);
    cr_assert(checkpoints_bitwise_equal(step_a, step_b));
}

/* Trains `straight` 6 steps, and `resumed` from a copy of straight's step-3 checkpoint (as
 * if it died after step 3), both with `arguments`; asserts equal losses and bitwise equal
 * step-6 checkpoints. The caller makes and removes both directories. */
void train_expect_resume_equals_straight(const char *straight, const char *resumed,
                                         const char *arguments)
{
    static char output[1 << 16];
    char command[2400];
    const char *extra = "checkpoint:\n  every: 3\n  keep_last: 5\n";
    tiny_config_write(straight, extra);
    tiny_config_write(resumed, extra);
    cr_assert_eq(tiny_train(straight, arguments, output, sizeof output), 0, "%s", output);

    /* The interrupted run: its last committed checkpoint is step 3, but it logged steps 4..6
     * before it died; the resumed run must drop those lines and take the steps again. */
    snprintf(command, sizeof command,
             "mkdir -p %s/run/checkpoints && cp -r %s/run/checkpoints/step_00000003 "
             "%s/run/checkpoints/ && printf step_00000003 > %s/run/checkpoints/latest && "
             "cp %s/run/metrics.jsonl %s/run/metrics.jsonl",
             resumed, straight, resumed, resumed, straight, resumed);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    cr_assert_eq(tiny_train(resumed, arguments, output, sizeof output), 0, "%s", output);
    cr_assert(strstr(output, "resumed at step 3"), "no resume message:\n%s", output);

    train_expect_six_equal_steps(straight, resumed);
}
