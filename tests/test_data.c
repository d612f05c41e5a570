/* tests/test_data.c — windows, training order, microbatches and model.vocab_size: auto
 * (DESIGN 4); every shard error is in tests/test_data_errors.c.
 *
 * Shards are written with the HDF5 C API (tests/shard_support.h). In most of them token k of
 * the concatenated stream has the value k, so a window names its own position: window i
 * starts with token i * (T + 1).
 */
#include "runtime/data.h"
#include "tests/shard_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
