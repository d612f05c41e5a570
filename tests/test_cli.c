/* tests/test_cli.c — bad input through the `fathom` binary: a message that names the key or
 * the file, the exit code of DESIGN 6, no crash. */
#include "tests/support.h"
#include "tests/train_support.h"
#include "runtime/cuda_module.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static char output[1 << 16];

static void expect_failure(const char *extra_yaml, const char *arguments, int exit_code,
                           const char *named)
{
    char dir[256];
    test_make_temp_dir(dir, "cli");
    tiny_config_write(dir, extra_yaml);
    int code = tiny_train(dir, arguments, output, sizeof output);
    cr_assert_eq(code, exit_code, "exit %d, expected %d:\n%s", code, exit_code, output);
    cr_assert(strstr(output, named), "message does not name '%s':\n%s", named, output);
    cr_assert_not(strstr(output, "Segmentation"), "crashed:\n%s", output);
    test_remove_tree(dir);
}

Test(cli, no_command_prints_usage_and_exits_2)
{
    cr_assert_eq(test_run_fathom("", output, sizeof output), 2);
    cr_assert(strstr(output, "usage: fathom"), "%s", output);
}

Test(cli, unknown_command_exits_2)
{
    cr_assert_eq(test_run_fathom("fly", output, sizeof output), 2);
    cr_assert(strstr(output, "fly"), "%s", output);
}

Test(cli, missing_config_file_exits_2_naming_it)
{
    cr_assert_eq(test_run_fathom("train /nonexistent/fathom.yaml", output, sizeof output), 2);
    cr_assert(strstr(output, "/nonexistent/fathom.yaml"), "%s", output);
}

Test(cli, unknown_key_exits_2_naming_it)
{
    expect_failure("eval:\n  everyy: 3\n", "", 2, "eval.everyy");
}

Test(cli, wrong_type_exits_2_naming_the_key)
{
    expect_failure("", "--set model.d_model=wide", 2, "model.d_model");
}

Test(cli, kv_heads_not_dividing_heads_exits_2)
{
    expect_failure("", "--set model.n_kv_heads=3", 2, "n_kv_heads");
}

Test(cli, odd_head_dim_exits_2)
{
    expect_failure("", "--set model.head_dim=15", 2, "head_dim");
}

Test(cli, size_below_one_exits_2)
{
    expect_failure("", "--set model.n_layers=0", 2, "model.n_layers");
}

Test(cli, missing_shard_exits_3_naming_it)
{
    expect_failure("data:\n  source: shards\n  train: /nonexistent/shards/train.h5\n", "", 3,
                   "/nonexistent/shards/train.h5");
}

static void write_shard(const char *path, int vocab, int tokens)
{
    char command[1024], result[4096];
    snprintf(command, sizeof command,
             "python3 -c \"import h5py, numpy as np; f = h5py.File('%s', 'w'); "
             "f['tokens'] = (np.arange(%d) %% 200).astype(np.uint32); "
             "f.attrs['vocab_size'] = %d; f.attrs['eot_id'] = 0; "
             "f.attrs['tokenizer'] = 'bytes'\"",
             path, tokens, vocab);
    cr_assert_eq(test_run_command(command, result, sizeof result), 0, "%s", result);
}

Test(cli, truncated_shard_exits_3_naming_it)
{
    char dir[256], shard[300], yaml[600], command[700];
    test_make_temp_dir(dir, "cli-trunc");
    snprintf(shard, sizeof shard, "%s/train.h5", dir);
    write_shard(shard, 256, 5000);
    snprintf(command, sizeof command, "truncate -s 3000 %s", shard);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0);
    snprintf(yaml, sizeof yaml, "data:\n  source: shards\n  train: %s\n", shard);
    expect_failure(yaml, "", 3, shard);
    test_remove_tree(dir);
}

Test(cli, shard_vocab_larger_than_the_model_exits_3)
{
    char dir[256], shard[300], yaml[600];
    test_make_temp_dir(dir, "cli-vocab");
    snprintf(shard, sizeof shard, "%s/train.h5", dir);
    write_shard(shard, 50000, 5000);
    snprintf(yaml, sizeof yaml, "data:\n  source: shards\n  train: %s\n", shard);
    expect_failure(yaml, "", 3, "vocab");
    test_remove_tree(dir);
}

Test(cli, shards_train_like_the_synthetic_corpus, .timeout = 60)
{
    char dir[256], shard[300], yaml[600];
    test_make_temp_dir(dir, "cli-shards");
    snprintf(shard, sizeof shard, "%s/train.h5", dir);
    write_shard(shard, 256, 20000);
    snprintf(yaml, sizeof yaml, "data:\n  source: shards\n  train: %s\n", shard);
    tiny_config_write(dir, yaml);
    int code = tiny_train(dir, "", output, sizeof output);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, output);
    test_remove_tree(dir);
}

Test(cli, resuming_with_another_network_exits_2)
{
    char dir[256];
    test_make_temp_dir(dir, "cli-other-net");
    tiny_config_write(dir, "checkpoint:\n  every: 1\n");
    cr_assert_eq(tiny_train(dir, "--set train.steps=1", output, sizeof output), 0, "%s",
                 output);
    int code = tiny_train(dir, "--set train.steps=2 --set model.ffn_dim=128", output,
                          sizeof output);
    cr_assert_eq(code, 2, "exit %d:\n%s", code, output);
    cr_assert(strstr(output, "ffn_dim"), "%s", output);
    test_remove_tree(dir);
}

/* On a machine without a GPU (or a build without nvcc) device: cuda is refused with the
 * reason; device: auto trains on the cpu. */
Test(cli, device_cuda_without_a_gpu_exits_2_with_the_reason)
{
    const CudaModuleInfo *cuda = cuda_module_probe();
    if (cuda->devices > 0)
        cr_skip_test("a GPU is present: %s", cuda->description);
    /* the reason differs (no module in a build without nvcc, no device or driver here) */
    expect_failure("", "--set device=cuda", 2, "device: cuda, but");
}

/* A table of cuda algorithms on the cpu backend is a key the run cannot honour. */
Test(cli, matmul_algorithms_on_the_cpu_exits_2_naming_the_key)
{
    expect_failure("", "--set device=cpu --set matmul_algorithms=/tmp/fathom.matmul", 2,
                   "matmul_algorithms names /tmp/fathom.matmul");
}

Test(cli, tune_of_a_cpu_config_exits_2)
{
    char dir[256], arguments[600];
    test_make_temp_dir(dir, "cli_tune");
    tiny_config_write(dir, "");
    snprintf(arguments, sizeof arguments, "tune %s/config.yaml --set device=cpu", dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 2, "%s", output);
    cr_assert(strstr(output, "device: cpu"), "%s", output);
    snprintf(arguments, sizeof arguments, "tune %s/config.yaml --candidates 65", dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 2, "%s", output);
    cr_assert(strstr(output, "--candidates 65 is not a count from 1 to 64"), "%s", output);
    test_remove_tree(dir);
}

/* Without a GPU fathom tune has nothing to time, whatever the config says. */
Test(cli, tune_without_a_gpu_exits_2_with_the_reason)
{
    const CudaModuleInfo *cuda = cuda_module_probe();
    if (cuda->devices > 0)
        cr_skip_test("a GPU is present: %s", cuda->description);
    char dir[256], arguments[600];
    test_make_temp_dir(dir, "cli_tune");
    tiny_config_write(dir, "");
    snprintf(arguments, sizeof arguments, "tune %s/config.yaml --set device=auto --out "
             "%s/table.txt", dir, dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 2, "%s", output);
    cr_assert(strstr(output, "fathom tune times the cuda backend's products, but"), "%s",
              output);
    test_remove_tree(dir);
}
