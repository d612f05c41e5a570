/* tests/train_support.c — see train_support.h. */
#include "tests/train_support.h"

#include "tests/support.h"

#include <criterion/criterion.h>
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

int metrics_read_losses(const char *run_dir, double *losses, int *steps, int capacity)
{
    char path[512], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *file = fopen(path, "r");
    cr_assert_not_null(file, "no %s", path);
    int count = 0;
    while (count < capacity && fgets(line, sizeof line, file)) {
        if (strstr(line, "\"val_loss\""))
            continue;
        const char *loss = strstr(line, "\"loss\":");
        const char *step = strstr(line, "\"step\":");
        cr_assert(loss && step, "metrics line without step/loss: %s", line);
        losses[count] = strtod(loss + 7, NULL);
        if (steps)
            steps[count] = atoi(step + 7);
        count++;
    }
    fclose(file);
    return count;
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
