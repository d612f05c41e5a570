/* tests/checkpoint_support.c — see checkpoint_support.h. */
#include "tests/checkpoint_support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support.h"

void checkpoint_test_groups_fill(float *data[CKPT_GROUPS], size_t elements, uint64_t seed)
{
    for (int group = 0; group < CKPT_GROUPS; group++) {
        data[group] = malloc(elements * sizeof(float));
        cr_assert_not_null(data[group]);
        test_fill_normal(data[group], elements, 1.0f, seed * 10 + (uint64_t)group);
    }
}

void checkpoint_test_groups_poison(float *data[CKPT_GROUPS], size_t elements)
{
    for (int group = 0; group < CKPT_GROUPS; group++) {
        data[group] = malloc(elements * sizeof(float));
        cr_assert_not_null(data[group]);
        test_fill_nan(data[group], elements);
    }
}

void checkpoint_test_groups_free(float *data[CKPT_GROUPS])
{
    for (int group = 0; group < CKPT_GROUPS; group++)
        free(data[group]);
}

void checkpoint_test_write_two_shards(const char *run_dir, int64_t step, int n_tensors,
                                      const CheckpointTensor tensors[n_tensors],
                                      const CheckpointRows rows[2][n_tensors], const float *full,
                                      int n_shards_indexed)
{
    char tmp_dir[512], names[2][64], path[768];
    snprintf(tmp_dir, sizeof tmp_dir, "%s/checkpoints/step_%08lld.tmp", run_dir,
             (long long)step);
    checkpoint_make_directory(tmp_dir);
    CheckpointTensor *local = malloc((size_t)n_tensors * sizeof *local);
    uint32_t *digests[2];
    for (int s = 0; s < 2; s++) {
        /* a rank's buffer holds only its rows: offsets point at the first held row */
        for (int i = 0; i < n_tensors; i++) {
            local[i] = tensors[i];
            local[i].offset += (size_t)(rows[s][i].row_begin *
                                        checkpoint_tensor_row_elements(&tensors[i]));
        }
        const float *const data[CKPT_GROUPS] = {full, NULL, NULL, NULL};
        digests[s] = malloc((size_t)CKPT_GROUPS * n_tensors * sizeof(uint32_t));
        checkpoint_shard_name(0, s, names[s], sizeof names[s]);
        snprintf(path, sizeof path, "%s/%s", tmp_dir, names[s]);
        checkpoint_shard_write(path, local, n_tensors, rows[s], data, digests[s]);
    }
    CheckpointShard shards[2] = {{names[0], rows[0], digests[0]},
                                 {names[1], rows[1], digests[1]}};
    CheckpointMeta meta = {.step = step, .config_yaml = "", .pp = 1, .dp = 2,
                           .virtual_stages = 1};
    checkpoint_index_write(tmp_dir, &meta, tensors, n_tensors, 1u << CKPT_GROUP_MODEL, shards,
                           n_shards_indexed);
    snprintf(path, sizeof path, "%s/checkpoints", run_dir);
    checkpoint_commit(path, step);
    free(local);
    free(digests[0]);
    free(digests[1]);
}

void checkpoint_test_hex(const float *values, size_t n, char *text)
{
    const unsigned char *bytes = (const unsigned char *)values;
    for (size_t i = 0; i < n * sizeof(float); i++)
        sprintf(text + 2 * i, "%02x", bytes[i]);
}
