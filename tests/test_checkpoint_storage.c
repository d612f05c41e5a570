/* tests/test_checkpoint_storage.c — the pieces under a checkpoint (DESIGN 5): CRC32C, the
 * bf16 HDF5 type, and shards that each hold a row range of every tensor. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/checkpoint.h"
#include "checkpoints/checkpoint_layout.h"
#include "checkpoints/h5_tensor.h"
#include "runtime/crc32c.h"
#include "tests/checkpoint_support.h"
#include "tests/support.h"

Test(checkpoint, crc32c_of_123456789_is_e3069283)
{
    cr_assert_eq(crc32c("123456789", 9), 0xE3069283u);
    cr_assert_eq(crc32c_extend_portable(0, "123456789", 9), 0xE3069283u);
    cr_assert_eq(crc32c("", 0), 0u);
}

Test(checkpoint, crc32c_fast_path_equals_table_at_every_length_and_alignment)
{
    float words[128];
    const unsigned char *bytes = (const unsigned char *)words;
    test_fill_uniform(words, 128, 1e30f, 5);
    for (size_t start = 0; start < 8; start++)
        for (size_t length = 0; length + start <= 300; length++) {
            uint32_t whole = crc32c(bytes + start, length);
            cr_assert_eq(whole, crc32c_extend_portable(0, bytes + start, length),
                         "start %zu length %zu", start, length);
            size_t third = length / 3;
            cr_assert_eq(crc32c_extend(crc32c(bytes + start, third), bytes + start + third,
                                       length - third), whole);
        }
}

/* Values exact in bf16; 2^40 does not fit fp16, so a reader taking it for fp16 fails. */
static const float bf16_values[6] = {1.0f, -2.5f, 0.15625f, 65536.0f, 1099511627776.0f,
                                     -0.0078125f};

/* Writes /x [2, 3] in bf16 to a new file under `dir`; its path goes to `path`. */
static void bf16_file_write(const char *dir, char *path)
{
    snprintf(path, 512, "%s/bf16.h5", dir);
    hid_t file = h5_file_create(path);
    hid_t type = h5_bf16_type_create();
    int64_t shape[2] = {2, 3};
    h5_tensor_write(file, "/x", 2, shape, type, bf16_values);
    H5Tclose(type);
    H5Fclose(file);
}

Test(checkpoint, bf16_type_stores_two_bytes_and_round_trips_exactly)
{
    char dir[256], path[512];
    float read[6];
    test_make_temp_dir(dir, "bf16");
    bf16_file_write(dir, path);
    hid_t file = h5_file_open_readonly(path);
    hid_t dataset = H5Dopen2(file, "/x", H5P_DEFAULT);
    cr_assert_eq(H5Dget_storage_size(dataset), 6 * 2);
    h5_tensor_read_rows(dataset, 0, 2, read);
    H5Dclose(dataset);
    H5Fclose(file);
    cr_assert_arr_eq(read, bf16_values, sizeof read);
    test_remove_tree(dir);
}

Test(checkpoint, bf16_dataset_reads_exactly_in_h5py)
{
    char dir[256], path[512], command[1024], output[4096];
    test_make_temp_dir(dir, "bf16");
    bf16_file_write(dir, path);
    snprintf(command, sizeof command,
             "python3 -c 'import h5py, sys; d = h5py.File(sys.argv[1], \"r\")[\"x\"]; "
             "print(d.id.get_type().get_size(), d[()].ravel().tolist())' '%s'", path);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    cr_assert_str_eq(output, "2 [1.0, -2.5, 0.15625, 65536.0, 1099511627776.0, -0.0078125]\n");
    test_remove_tree(dir);
}

Test(checkpoint, bf16_dataset_reads_in_h5dump)
{
    char dir[256], path[512], command[1024], output[4096];
    test_make_temp_dir(dir, "bf16");
    bf16_file_write(dir, path);
    snprintf(command, sizeof command, "h5dump -d /x '%s'", path);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    cr_assert(strstr(output, "1, -2.5, 0.15625"), "%s", output);
    cr_assert(strstr(output, "65536, 1.09951e+12, -0.0078125"), "%s", output);
    test_remove_tree(dir);
}

/* Two ranks' worth of shards: A [6, 3] split at row 4, B [4] split at row 1. */
typedef struct {
    CheckpointTensor tensors[2];   /* full shapes; offsets into `full` */
    float full[22];
    char run_dir[256];
} TwoShards;

static void two_shards_write(TwoShards *two, int n_shards_indexed)
{
    const CheckpointTensor tensors[2] = {{"a.weight", 2, {6, 3}, 0}, {"b.bias", 1, {4, 0}, 18}};
    const CheckpointRows rows[2][2] = {{{0, 4}, {0, 1}}, {{4, 6}, {1, 4}}};
    memcpy(two->tensors, tensors, sizeof tensors);
    test_fill_normal(two->full, 22, 1.0f, 77);
    test_make_temp_dir(two->run_dir, "shards");
    checkpoint_test_write_two_shards(two->run_dir, 7, 2, two->tensors, rows, two->full,
                                     n_shards_indexed);
}

Test(checkpoint, row_range_shards_load_as_whole_tensors)
{
    TwoShards two;
    float loaded[22];
    two_shards_write(&two, 2);
    test_fill_nan(loaded, 22);
    float *const data[CKPT_GROUPS] = {loaded, NULL, NULL, NULL};
    checkpoint_load(two.run_dir, two.tensors, 2, data);
    cr_assert_arr_eq(loaded, two.full, sizeof loaded);
    test_remove_tree(two.run_dir);
}

static void child_load(void *argument)
{
    TwoShards *two = argument;
    float loaded[22];
    float *const data[CKPT_GROUPS] = {loaded, NULL, NULL, NULL};
    checkpoint_load(two->run_dir, two->tensors, 2, data);
}

Test(checkpoint, rows_no_shard_holds_fail_load_with_exit_3)
{
    TwoShards two;
    char errors[4096];
    two_shards_write(&two, 1); /* the index forgets the second shard */
    cr_assert_eq(test_run_in_child(child_load, &two, errors, sizeof errors), 3, "%s", errors);
    test_remove_tree(two.run_dir);
}
