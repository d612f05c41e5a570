/* tests/shard_support.c — see shard_support.h. */
#include "tests/shard_support.h"

#include <criterion/criterion.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Config config_for_shards(const char *train, int vocab_size, int seq_len, uint64_t seed)
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

static void write_integer_attribute(hid_t file, const char *name, int64_t value)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attribute = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert(attribute >= 0 && H5Awrite(attribute, H5T_NATIVE_INT64, &value) >= 0);
    H5Aclose(attribute);
    H5Sclose(space);
}

void write_shard_with(const char *path, const uint32_t *tokens, size_t count,
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

void write_counting_shard(const char *path, uint32_t first, size_t count)
{
    uint32_t *tokens = malloc(count * sizeof *tokens);
    for (size_t i = 0; i < count; i++)
        tokens[i] = first + (uint32_t)i;
    write_shard_with(path, tokens, count, (ShardLayout){.vocab_size = LARGE_VOCAB});
    free(tokens);
}
