/* tests/test_data_errors.c — every way a shard set can be refused (DESIGN 4): each error ends
 * the process with the documented exit code (3 for the data, 2 for the config) and a message
 * that names the file, the pattern or the key at fault.
 *
 * Each case writes its damaged shard (tests/shard_support.h) and reads the whole training set
 * in a forked child, as a run would; the exit code and stderr come back through a pipe.
 * Reading well-formed shards is tested in tests/test_data.c.
 */
#include "runtime/data.h"
#include "tests/shard_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Opens the training set and reads every window, as a run would. */
static void read_whole_training_set(const Config *config)
{
    DataSet *set = data_open_train(config);
    uint32_t *window = malloc((size_t)data_window_tokens(set) * sizeof *window);
    for (uint64_t i = 0; i < data_window_count(set); i++)
        data_read_window(set, i, window);
    free(window);
    data_close(set);
}

/* Runs read_whole_training_set in a child (fatal() exits) and returns its exit code, with
 * its stderr in `message`. */
static int exit_code_reading(const Config *config, char *message, size_t capacity)
{
    int channel[2];
    cr_assert_eq(pipe(channel), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        close(channel[0]);
        dup2(channel[1], STDERR_FILENO);
        read_whole_training_set(config);
        _exit(0);
    }
    close(channel[1]);
    size_t used = 0;
    ssize_t got;
    while (used + 1 < capacity && (got = read(channel[0], message + used, capacity - used - 1)) > 0)
        used += (size_t)got;
    message[used] = '\0';
    close(channel[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Asserts the exit code and that every given word appears in the message. */
static void assert_fails(const Config *config, int code, const char *word, const char *word2,
                         const char *word3)
{
    char message[4096];
    int exit_code = exit_code_reading(config, message, sizeof message);
    cr_assert_eq(exit_code, code, "exit code %d, expected %d; stderr: %s", exit_code, code,
                 message);
    const char *words[3] = {word, word2, word3};
    for (int i = 0; i < 3; i++)
        cr_assert(!words[i] || strstr(message, words[i]), "'%s' is not in the message: %s",
                  words[i], message);
}

/* A temp directory and the path of a file `name` inside it. */
static void make_shard_path(char *directory, char *path, const char *name)
{
    test_make_temp_dir(directory, "data-error");
    sprintf(path, "%s/%s", directory, name);
}

Test(data, glob_matching_no_file_exits_3_naming_the_pattern)
{
    char directory[256], spec[300];
    make_shard_path(directory, spec, "train_*.h5");
    Config config = config_for_shards(spec, 512, 3, 1);
    assert_fails(&config, 3, spec, "no files match", NULL);
    test_remove_tree(directory);
}

Test(data, missing_shard_file_exits_3_naming_it)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "absent.h5");
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, path, "does not exist", NULL);
    test_remove_tree(directory);
}

Test(data, directory_without_shards_exits_3_naming_it)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "readme.txt");
    test_write_file(path, "no shards here\n");
    Config config = config_for_shards(directory, 512, 3, 1);
    assert_fails(&config, 3, directory, "no *.h5 files", NULL);
    test_remove_tree(directory);
}

Test(data, file_that_is_not_hdf5_exits_3_naming_it)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "text.h5");
    test_write_file(path, "this is a text file, not an HDF5 file\n");
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, path, "not an HDF5 file or truncated", NULL);
    test_remove_tree(directory);
}

Test(data, truncated_shard_exits_3_naming_it)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "cut.h5");
    write_counting_shard(path, 0, 4096);
    FILE *file = fopen(path, "rb");
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fclose(file);
    cr_assert_eq(truncate(path, size / 2), 0);
    Config config = config_for_shards(path, LARGE_VOCAB, 3, 1);
    assert_fails(&config, 3, path, "not an HDF5 file or truncated", NULL);
    test_remove_tree(directory);
}

Test(data, shard_without_tokens_dataset_exits_3_naming_it)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "empty.h5");
    write_shard_with(path, NULL, 0, (ShardLayout){.omit_tokens = 1, .vocab_size = 512});
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, path, "no /tokens dataset", NULL);
    test_remove_tree(directory);
}

Test(data, tokens_that_are_not_one_dimensional_exit_3_naming_the_file)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "matrix.h5");
    uint32_t tokens[16] = {0};
    write_shard_with(path, tokens, 16, (ShardLayout){.two_dimensional = 1, .vocab_size = 512});
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, path, "1-D", NULL);
    test_remove_tree(directory);
}

/* Tokens written as `type` instead of unsigned 32-bit. */
static void assert_token_type_is_refused(hid_t type, const char *name)
{
    char directory[256], path[300];
    make_shard_path(directory, path, name);
    uint32_t tokens[16] = {0};
    write_shard_with(path, tokens, 16, (ShardLayout){.token_type = type, .vocab_size = 512});
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, path, "unsigned 32-bit", NULL);
    test_remove_tree(directory);
}

Test(data, signed_32_bit_tokens_exit_3_naming_the_file)
{
    assert_token_type_is_refused(H5T_STD_I32LE, "int32.h5");
}

Test(data, unsigned_64_bit_tokens_exit_3_naming_the_file)
{
    assert_token_type_is_refused(H5T_STD_U64LE, "uint64.h5");
}

Test(data, shard_without_vocab_size_attribute_exits_3_naming_it)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "novocab.h5");
    uint32_t tokens[16] = {0};
    write_shard_with(path, tokens, 16, (ShardLayout){.omit_vocab_size = 1});
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, path, "vocab_size attribute", NULL);
    test_remove_tree(directory);
}

Test(data, shard_vocab_larger_than_the_model_is_a_vocab_mismatch)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "big.h5");
    uint32_t tokens[16] = {0};
    write_shard_with(path, tokens, 16, (ShardLayout){.vocab_size = 1000});
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, "vocab mismatch", path, "1000 but model.vocab_size is 512");
    test_remove_tree(directory);
}

Test(data, shard_shorter_than_one_window_exits_3_naming_it)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "short.h5");
    write_counting_shard(path, 0, 3);
    Config config = config_for_shards(path, LARGE_VOCAB, 3, 1);
    assert_fails(&config, 3, path, "fewer than one window", NULL);
    test_remove_tree(directory);
}

Test(data, token_outside_the_model_vocab_exits_3_when_read)
{
    char directory[256], path[300];
    make_shard_path(directory, path, "bad_token.h5");
    uint32_t tokens[12] = {1, 2, 3, 0, 4, 5, 6, 0, 7, 600, 8, 0};
    write_shard_with(path, tokens, 12, (ShardLayout){.vocab_size = 100});
    Config config = config_for_shards(path, 512, 3, 1);
    assert_fails(&config, 3, path, "token id 600 at position 9", "model.vocab_size = 512");
    test_remove_tree(directory);
}

Test(data, shards_with_different_eot_ids_exit_3_naming_both)
{
    char directory[256], first[300], second[300];
    test_make_temp_dir(directory, "data-error");
    sprintf(first, "%s/a.h5", directory);
    sprintf(second, "%s/b.h5", directory);
    uint32_t tokens[8] = {0};
    write_shard_with(first, tokens, 8, (ShardLayout){.vocab_size = 512, .eot_id = 2});
    write_shard_with(second, tokens, 8, (ShardLayout){.vocab_size = 512, .eot_id = 3});
    Config config = config_for_shards(directory, 512, 3, 1);
    assert_fails(&config, 3, first, second, "eot_id");
    test_remove_tree(directory);
}

Test(data, empty_data_train_for_shards_exits_2_naming_the_key)
{
    Config config = config_for_shards("", 512, 3, 1);
    assert_fails(&config, 2, "data.train", NULL, NULL);
}

Test(data, synthetic_source_with_vocab_below_256_exits_2_naming_the_key)
{
    Config config = config_for_shards("", 200, 3, 1);
    config.data.source = DATA_SYNTHETIC;
    assert_fails(&config, 2, "model.vocab_size = 200", NULL, NULL);
}
