/* tests/test_data.c — windows, training order, microbatches and every shard error of
 * DESIGN 4.
 *
 * Shards are written here with the HDF5 C API. In most of them token k of the concatenated
 * stream has the value k, so a window names its own position: window i starts with token
 * i * (T + 1).
 */
#include "runtime/data.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { LARGE_VOCAB = 1 << 20 };

static Config config_for_shards(const char *train, int vocab_size, int seq_len, uint64_t seed)
{
    Config config;
    memset(&config, 0, sizeof config);
    config.model.vocab_size = vocab_size;
    config.train.seq_len = seq_len;
    config.seed = seed;
    config.data.source = DATA_SHARDS;
    snprintf(config.data.train, sizeof config.data.train, "%s", train);
    return config;
}

typedef struct {
    hid_t token_type;        /* file type of /tokens; 0 means unsigned 32-bit */
    int two_dimensional;     /* /tokens stored as [count / 2, 2] */
    int omit_tokens, omit_vocab_size;
    int64_t vocab_size, eot_id;
} ShardLayout;

static void write_integer_attribute(hid_t file, const char *name, int64_t value)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attribute = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert(attribute >= 0 && H5Awrite(attribute, H5T_NATIVE_INT64, &value) >= 0);
    H5Aclose(attribute);
    H5Sclose(space);
}

static void write_shard_with(const char *path, const uint32_t *tokens, size_t count,
                             ShardLayout layout)
{
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert(file >= 0, "cannot create %s", path);
    if (!layout.omit_tokens) {
        hsize_t dims[2] = {count, 1};
        if (layout.two_dimensional) {
            dims[0] = count / 2;
            dims[1] = 2;
        }
        hid_t space = H5Screate_simple(layout.two_dimensional ? 2 : 1, dims, NULL);
        hid_t type = layout.token_type ? layout.token_type : H5T_STD_U32LE;
        hid_t dataset = H5Dcreate2(file, "tokens", type, space, H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT);
        cr_assert(dataset >= 0);
        cr_assert(H5Dwrite(dataset, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                           tokens) >= 0);
        H5Dclose(dataset);
        H5Sclose(space);
    }
    if (!layout.omit_vocab_size)
        write_integer_attribute(file, "vocab_size", layout.vocab_size);
    write_integer_attribute(file, "eot_id", layout.eot_id);
    H5Fclose(file);
}

/* A well-formed shard holding the stream values first .. first + count - 1. */
static void write_counting_shard(const char *path, uint32_t first, size_t count)
{
    uint32_t *tokens = malloc(count * sizeof *tokens);
    for (size_t i = 0; i < count; i++)
        tokens[i] = first + (uint32_t)i;
    write_shard_with(path, tokens, count, (ShardLayout){.vocab_size = LARGE_VOCAB});
    free(tokens);
}

/* A directory with one shard of `windows` windows of T + 1 = 4 tokens, counting from 0. */
static void make_counting_set(char *directory, char *shard, uint64_t windows)
{
    test_make_temp_dir(directory, "data");
    sprintf(shard, "%s/shard_00000.h5", directory);
    write_counting_shard(shard, 0, (size_t)windows * 4);
}

static uint64_t window_index_of_sample(DataSet *set, uint64_t sample)
{
    uint32_t window[4];
    data_read_sample(set, sample, window);
    return window[0] / 4;
}

Test(data, windows_are_exact_slices_of_the_stream_across_two_files)
{
    char directory[256], path[300];
    test_make_temp_dir(directory, "data");
    sprintf(path, "%s/a.h5", directory);
    write_counting_shard(path, 0, 10);
    sprintf(path, "%s/b.h5", directory);
    write_counting_shard(path, 10, 13);
    Config config = config_for_shards(directory, LARGE_VOCAB, 3, 1);
    DataSet *set = data_open_eval(&config, directory);
    for (uint64_t i = 0; i < data_window_count(set); i++) {
        uint32_t window[4];
        data_read_window(set, i, window);
        for (uint32_t t = 0; t < 4; t++)
            cr_assert_eq(window[t], i * 4 + t, "window %llu token %u", (unsigned long long)i, t);
    }
    data_close(set);
    test_remove_tree(directory);
}

Test(data, incomplete_tail_window_is_dropped)
{
    char directory[256], path[300];
    test_make_temp_dir(directory, "data");
    sprintf(path, "%s/a.h5", directory);
    write_counting_shard(path, 0, 10);
    sprintf(path, "%s/b.h5", directory);
    write_counting_shard(path, 10, 13);
    Config config = config_for_shards(directory, LARGE_VOCAB, 3, 1);
    DataSet *set = data_open_train(&config);
    cr_assert_eq(data_window_count(set), 5); /* 23 tokens hold 5 windows of 4 */
    data_close(set);
    test_remove_tree(directory);
}

Test(data, directory_shards_are_read_in_sorted_path_order)
{
    char directory[256], path[300];
    test_make_temp_dir(directory, "data");
    sprintf(path, "%s/shard_00001.h5", directory); /* written first, read second */
    write_counting_shard(path, 8, 8);
    sprintf(path, "%s/shard_00000.h5", directory);
    write_counting_shard(path, 0, 8);
    sprintf(path, "%s/notes.txt", directory);
    test_write_file(path, "not a shard\n");
    Config config = config_for_shards(directory, LARGE_VOCAB, 3, 1);
    DataSet *set = data_open_train(&config);
    uint32_t window[4];
    data_read_window(set, 2, window);
    cr_assert_eq(window[0], 8);
    data_close(set);
    test_remove_tree(directory);
}

Test(data, glob_selects_only_matching_files_in_sorted_order)
{
    char directory[256], path[300], spec[300];
    test_make_temp_dir(directory, "data");
    sprintf(path, "%s/train_1.h5", directory);
    write_counting_shard(path, 4, 4);
    sprintf(path, "%s/train_0.h5", directory);
    write_counting_shard(path, 0, 4);
    sprintf(path, "%s/val_0.h5", directory);
    write_counting_shard(path, 100, 4);
    sprintf(spec, "%s/train_*.h5", directory);
    Config config = config_for_shards(spec, LARGE_VOCAB, 3, 1);
    DataSet *set = data_open_train(&config);
    cr_assert_eq(data_window_count(set), 2);
    uint32_t window[4];
    data_read_window(set, 1, window);
    cr_assert_eq(window[0], 4);
    data_close(set);
    test_remove_tree(directory);
}

Test(data, eval_set_reads_windows_in_file_order_from_data_val)
{
    char directory[256], shard[300];
    make_counting_set(directory, shard, 20);
    Config config = config_for_shards("", LARGE_VOCAB, 3, 1);
    snprintf(config.data.val, sizeof config.data.val, "%s", shard);
    DataSet *set = data_open_eval(&config, NULL);
    for (uint64_t i = 0; i < 20; i++) {
        uint32_t window[4];
        data_read_window(set, i, window);
        cr_assert_eq(window[0], i * 4);
    }
    data_close(set);
    test_remove_tree(directory);
}

Test(data, each_epoch_is_a_permutation_of_all_windows)
{
    enum { WINDOWS = 37, EPOCHS = 3 };
    char directory[256], shard[300];
    make_counting_set(directory, shard, WINDOWS);
    Config config = config_for_shards(shard, LARGE_VOCAB, 3, 7);
    DataSet *set = data_open_train(&config);
    for (uint64_t epoch = 0; epoch < EPOCHS; epoch++) {
        int seen[WINDOWS] = {0};
        for (uint64_t i = 0; i < WINDOWS; i++)
            seen[window_index_of_sample(set, epoch * WINDOWS + i)]++;
        for (int w = 0; w < WINDOWS; w++)
            cr_assert_eq(seen[w], 1, "epoch %llu: window %d read %d times",
                         (unsigned long long)epoch, w, seen[w]);
    }
    data_close(set);
    test_remove_tree(directory);
}

Test(data, consecutive_epochs_use_different_orders)
{
    enum { WINDOWS = 50 };
    char directory[256], shard[300];
    make_counting_set(directory, shard, WINDOWS);
    Config config = config_for_shards(shard, LARGE_VOCAB, 3, 7);
    DataSet *set = data_open_train(&config);
    int differences = 0;
    for (uint64_t i = 0; i < WINDOWS; i++)
        differences += window_index_of_sample(set, i) != window_index_of_sample(set, WINDOWS + i);
    cr_assert_gt(differences, WINDOWS / 2);
    data_close(set);
    test_remove_tree(directory);
}

/* How many of the first `samples` samples agree between seed_a and seed_b. */
static int samples_agreeing(const char *shard, uint64_t seed_a, uint64_t seed_b, int samples)
{
    Config config_a = config_for_shards(shard, LARGE_VOCAB, 3, seed_a);
    Config config_b = config_for_shards(shard, LARGE_VOCAB, 3, seed_b);
    DataSet *a = data_open_train(&config_a), *b = data_open_train(&config_b);
    int agreeing = 0;
    for (uint64_t s = 0; s < (uint64_t)samples; s++)
        agreeing += window_index_of_sample(a, s) == window_index_of_sample(b, s);
    data_close(a);
    data_close(b);
    return agreeing;
}

Test(data, sample_order_is_fixed_by_the_seed)
{
    char directory[256], shard[300];
    make_counting_set(directory, shard, 64);
    cr_assert_eq(samples_agreeing(shard, 11, 11, 200), 200);
    test_remove_tree(directory);
}

Test(data, another_seed_gives_another_sample_order)
{
    char directory[256], shard[300];
    make_counting_set(directory, shard, 64);
    cr_assert_lt(samples_agreeing(shard, 11, 12, 200), 50);
    test_remove_tree(directory);
}

Test(data, sample_read_at_resume_point_matches_uninterrupted_run)
{
    enum { WINDOWS = 30, RESUME = 47 };
    char directory[256], shard[300];
    make_counting_set(directory, shard, WINDOWS);
    Config config = config_for_shards(shard, LARGE_VOCAB, 3, 5);
    DataSet *uninterrupted = data_open_train(&config);
    uint64_t expected[RESUME + 10];
    for (uint64_t s = 0; s < RESUME + 10; s++)
        expected[s] = window_index_of_sample(uninterrupted, s);
    data_close(uninterrupted);
    DataSet *resumed = data_open_train(&config);
    for (uint64_t s = RESUME; s < RESUME + 10; s++)
        cr_assert_eq(window_index_of_sample(resumed, s), expected[s], "sample %llu",
                     (unsigned long long)s);
    data_close(resumed);
    test_remove_tree(directory);
}

Test(data, dp_rank_microbatch_holds_its_contiguous_slice_of_the_global_batch)
{
    enum { GLOBAL = 8, DP = 2, MICRO = 2, CONSUMED = 24 };
    char directory[256], shard[300];
    make_counting_set(directory, shard, 40);
    Config config = config_for_shards(shard, LARGE_VOCAB, 3, 3);
    DataSet *set = data_open_train(&config);
    for (int rank = 0; rank < DP; rank++)
        for (int micro = 0; micro < GLOBAL / (DP * MICRO); micro++) {
            uint32_t inputs[MICRO * 3], targets[MICRO * 3];
            data_read_microbatch(set, CONSUMED, GLOBAL, rank, DP, micro, MICRO, inputs, targets);
            for (int b = 0; b < MICRO; b++) {
                uint64_t sample = CONSUMED + (uint64_t)(rank * GLOBAL / DP + micro * MICRO + b);
                cr_assert_eq(inputs[b * 3] / 4, window_index_of_sample(set, sample),
                             "rank %d microbatch %d row %d", rank, micro, b);
            }
        }
    data_close(set);
    test_remove_tree(directory);
}

Test(data, targets_are_the_window_shifted_by_one_token)
{
    char directory[256], shard[300];
    make_counting_set(directory, shard, 40);
    Config config = config_for_shards(shard, LARGE_VOCAB, 3, 3);
    DataSet *set = data_open_train(&config);
    uint32_t inputs[2 * 3], targets[2 * 3], window[4];
    data_read_microbatch(set, 0, 4, 0, 1, 1, 2, inputs, targets);
    for (int b = 0; b < 2; b++) {
        data_read_sample(set, (uint64_t)(2 + b), window);
        for (int t = 0; t < 3; t++) {
            cr_assert_eq(inputs[b * 3 + t], window[t]);
            cr_assert_eq(targets[b * 3 + t], window[t + 1]);
        }
    }
    data_close(set);
    test_remove_tree(directory);
}

Test(data, global_batch_is_the_same_under_any_dp)
{
    enum { GLOBAL = 8 };
    char directory[256], shard[300];
    make_counting_set(directory, shard, 40);
    Config config = config_for_shards(shard, LARGE_VOCAB, 3, 3);
    DataSet *set = data_open_train(&config);
    uint32_t one_rank[GLOBAL * 3], four_ranks[GLOBAL * 3], targets[GLOBAL * 3];
    data_read_microbatch(set, 16, GLOBAL, 0, 1, 0, GLOBAL, one_rank, targets);
    for (int rank = 0; rank < 4; rank++)
        data_read_microbatch(set, 16, GLOBAL, rank, 4, 0, 2, four_ranks + rank * 2 * 3, targets);
    cr_assert_arr_eq(one_rank, four_ranks, sizeof one_rank);
    data_close(set);
    test_remove_tree(directory);
}

Test(data, shard_with_smaller_vocab_than_the_model_is_accepted)
{
    char directory[256], path[300];
    test_make_temp_dir(directory, "data");
    sprintf(path, "%s/small.h5", directory);
    uint32_t tokens[8] = {1, 2, 0, 3, 4, 0, 5, 0};
    write_shard_with(path, tokens, 8, (ShardLayout){.vocab_size = 6});
    Config config = config_for_shards(path, 512, 3, 1);
    DataSet *set = data_open_train(&config);
    cr_assert_eq(data_window_count(set), 2);
    cr_assert_eq(data_eot_id(set), 0);
    data_close(set);
    test_remove_tree(directory);
}

/* ---- errors: each one ends the process with the documented code and names its file ---- */

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

/* ---- model.vocab_size: auto ---- */

Test(data, vocab_size_auto_takes_the_largest_vocab_size_of_the_train_and_val_shards)
{
    char directory[256], train[300], val[300];
    test_make_temp_dir(directory, "data-auto");
    sprintf(train, "%s/train.h5", directory);
    sprintf(val, "%s/val.h5", directory);
    uint32_t tokens[8] = {1, 2, 0, 3, 4, 0, 5, 0};
    write_shard_with(train, tokens, 8, (ShardLayout){.vocab_size = 300});
    write_shard_with(val, tokens, 8, (ShardLayout){.vocab_size = 301});
    Config config = config_for_shards(train, CONFIG_AUTO, 3, 1);
    data_resolve_vocab_size(&config);
    cr_assert_eq(config.model.vocab_size, 300);
    config = config_for_shards(train, CONFIG_AUTO, 3, 1);
    snprintf(config.data.val, sizeof config.data.val, "%s", val);
    data_resolve_vocab_size(&config);
    cr_assert_eq(config.model.vocab_size, 301);
    test_remove_tree(directory);
}

Test(data, vocab_size_auto_is_256_on_the_synthetic_corpus_and_a_number_stays)
{
    Config config = config_for_shards("", CONFIG_AUTO, 3, 1);
    config.data.source = DATA_SYNTHETIC;
    data_resolve_vocab_size(&config);
    cr_assert_eq(config.model.vocab_size, 256);
    config = config_for_shards("/nonexistent/shards", 1000, 3, 1);
    data_resolve_vocab_size(&config); /* a number reads no shard */
    cr_assert_eq(config.model.vocab_size, 1000);
}
