/* tests/test_checkpoint_rank3.c — checkpoints of rank-3 tensors (DESIGN 2.3, 5).
 *
 * MSAR's stream convolutions `model.route_streams.{n}.conv` are [m, k_max, d]. A rank-3
 * tensor is sharded like the others, by rows of its first dim, but every dataset keeps its
 * true rank. The fixture mixes two rank-3 tensors with rank-1 and rank-2 ones, so each test
 * also shows the ranks do not disturb one another's offsets. Cases that must exit run in a
 * forked child whose stderr is captured.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "checkpoints/checkpoint.h"
#include "tests/checkpoint_support.h"
#include "tests/support.h"

#define N_TENSORS 4
#define ELEMENTS (60 + 112 + 18 + 4)

/* [3, 4, 5] at 0, [2, 8, 7] at 60, [6, 3] at 172, [4] at 190. */
static const CheckpointTensor fixture_tensors[N_TENSORS] = {
    {"model.route_streams.0.conv", 3, {3, 4, 5}, 0},
    {"model.route_streams.1.conv", 3, {2, 8, 7}, 60},
    {"model.layers.0.self_attn.q_proj.weight", 2, {6, 3, 0}, 172},
    {"model.final_route.mix_bias", 1, {4, 0, 0}, 190},
};

typedef struct {
    float *data[CKPT_GROUPS];
} Groups;

static void groups_fill(Groups *groups, uint64_t seed)
{
    checkpoint_test_groups_fill(groups->data, ELEMENTS, seed);
}

static void groups_poison(Groups *groups)
{
    checkpoint_test_groups_poison(groups->data, ELEMENTS);
}

static void groups_free(Groups *groups)
{
    checkpoint_test_groups_free(groups->data);
}

static void fixture_save(const char *run_dir, int64_t step, const Groups *groups)
{
    CheckpointMeta meta = {.step = step, .config_yaml = "", .pp = 1, .dp = 1,
                           .virtual_stages = 1};
    const float *const data[CKPT_GROUPS] = {groups->data[0], groups->data[1], groups->data[2],
                                            groups->data[3]};
    checkpoint_save(run_dir, &meta, fixture_tensors, N_TENSORS, data);
}

Test(checkpoint, rank3_tensors_round_trip_bitwise_beside_rank_1_and_2_tensors)
{
    char run_dir[256];
    Groups saved, loaded;
    test_make_temp_dir(run_dir, "ckpt-rank3");
    groups_fill(&saved, 31);
    groups_poison(&loaded);
    fixture_save(run_dir, 10, &saved);
    checkpoint_load(run_dir, fixture_tensors, N_TENSORS, loaded.data);
    for (int group = 0; group < CKPT_GROUPS; group++)
        cr_assert_arr_eq(loaded.data[group], saved.data[group], ELEMENTS * sizeof(float),
                         "group %s differs", checkpoint_group_path(group));
    groups_free(&saved);
    groups_free(&loaded);
    test_remove_tree(run_dir);
}

Test(checkpoint, h5py_sees_the_rank3_shape_and_values_under_model)
{
    char run_dir[256], command[2048], output[8192], line[1024], hex[2 * 4 * 112 + 1];
    Groups saved;
    test_make_temp_dir(run_dir, "ckpt-rank3");
    groups_fill(&saved, 32);
    fixture_save(run_dir, 10, &saved);
    snprintf(command, sizeof command,
             "python3 -c '\n"
             "import h5py, sys\n"
             "f = h5py.File(sys.argv[1], \"r\")\n"
             "for name, d in f[\"model\"].items():\n"
             "    print(name, list(d.shape), d[()].astype(\"<f4\").tobytes().hex())\n"
             "' '%s/checkpoints/step_00000010/index.h5'",
             run_dir);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    checkpoint_test_hex(saved.data[CKPT_GROUP_MODEL], 60, hex);
    snprintf(line, sizeof line, "model.route_streams.0.conv [3, 4, 5] %s\n", hex);
    cr_assert(strstr(output, line), "missing line %s in:\n%s", line, output);
    checkpoint_test_hex(saved.data[CKPT_GROUP_MODEL] + 60, 112, hex);
    snprintf(line, sizeof line, "model.route_streams.1.conv [2, 8, 7] %s\n", hex);
    cr_assert(strstr(output, line), "missing line %s in:\n%s", line, output);
    groups_free(&saved);
    test_remove_tree(run_dir);
}

typedef struct {
    const char *run_dir;
    const CheckpointTensor *tensors;
} LoadJob;

static void child_load(void *argument)
{
    const LoadJob *job = argument;
    Groups loaded;
    groups_poison(&loaded);
    checkpoint_load(job->run_dir, job->tensors, N_TENSORS, loaded.data);
}

/* Saves the fixture (groups from `seed`) at step 10 in a fresh run directory, loads it in a
 * forked child as `tensors` describe, removes the directory; returns the child's exit code and
 * its stderr in `errors`. */
static int load_saved_fixture_as(const CheckpointTensor *tensors, uint64_t seed, char *errors,
                                 size_t capacity)
{
    char run_dir[256];
    Groups saved;
    test_make_temp_dir(run_dir, "ckpt-rank3");
    groups_fill(&saved, seed);
    fixture_save(run_dir, 10, &saved);
    LoadJob job = {run_dir, tensors};
    int code = test_run_in_child(child_load, &job, errors, capacity);
    groups_free(&saved);
    test_remove_tree(run_dir);
    return code;
}

Test(checkpoint, rank3_shape_with_two_dims_swapped_exits_3_naming_the_tensor_and_both_shapes)
{
    char errors[4096];
    /* same element count, the last two dims swapped: only a full-shape check catches it */
    CheckpointTensor tensors[N_TENSORS];
    memcpy(tensors, fixture_tensors, sizeof tensors);
    tensors[0].shape[1] = 5;
    tensors[0].shape[2] = 4;
    cr_assert_eq(load_saved_fixture_as(tensors, 33, errors, sizeof errors), 3, "%s", errors);
    cr_assert(strstr(errors, "model.route_streams.0.conv"), "%s", errors);
    cr_assert(strstr(errors, "[3, 4, 5]") && strstr(errors, "[3, 5, 4]"), "%s", errors);
}

Test(checkpoint, rank3_shape_differing_in_the_last_dim_only_exits_3_naming_both_shapes)
{
    char errors[4096];
    CheckpointTensor tensors[N_TENSORS];
    memcpy(tensors, fixture_tensors, sizeof tensors);
    tensors[1].shape[2] = 6; /* [2, 8, 6] against the saved [2, 8, 7] */
    cr_assert_eq(load_saved_fixture_as(tensors, 34, errors, sizeof errors), 3, "%s", errors);
    cr_assert(strstr(errors, "model.route_streams.1.conv"), "%s", errors);
    cr_assert(strstr(errors, "[2, 8, 7]") && strstr(errors, "[2, 8, 6]"), "%s", errors);
}

Test(checkpoint, rank3_tensor_asked_for_as_rank2_exits_3_though_its_unused_dim_matches)
{
    char errors[4096];
    /* shape[2] still says 7, but with ndim 2 it is unused: the caller wants [2, 8] */
    CheckpointTensor tensors[N_TENSORS];
    memcpy(tensors, fixture_tensors, sizeof tensors);
    tensors[1].ndim = 2;
    cr_assert_eq(load_saved_fixture_as(tensors, 35, errors, sizeof errors), 3, "%s", errors);
    cr_assert(strstr(errors, "model.route_streams.1.conv"), "%s", errors);
    cr_assert(strstr(errors, "[2, 8, 7]") && strstr(errors, "[2, 8]"), "%s", errors);
}

/* Two ranks' worth of shards of the fixture, model group only: shard 0 holds row 0 of
 * [3, 4, 5], all of [2, 8, 7] and rows 0..3 of [6, 3]; shard 1 the rest. */
static const CheckpointRows shard_rows[2][N_TENSORS] = {
    {{0, 1}, {0, 2}, {0, 4}, {0, 1}},
    {{1, 3}, {0, 0}, {4, 6}, {1, 4}},
};

Test(checkpoint, two_row_range_shards_of_a_rank3_tensor_load_whole)
{
    char run_dir[256];
    float full[ELEMENTS], loaded[ELEMENTS];
    test_make_temp_dir(run_dir, "ckpt-rank3");
    test_fill_normal(full, ELEMENTS, 1.0f, 37);
    test_fill_nan(loaded, ELEMENTS);
    checkpoint_test_write_two_shards(run_dir, 7, N_TENSORS, fixture_tensors, shard_rows, full, 2);
    float *const data[CKPT_GROUPS] = {loaded, NULL, NULL, NULL};
    checkpoint_load(run_dir, fixture_tensors, N_TENSORS, data);
    cr_assert_arr_eq(loaded, full, sizeof loaded);
    test_remove_tree(run_dir);
}

Test(checkpoint, shard_datasets_of_a_rank3_tensor_keep_its_trailing_dims)
{
    char run_dir[256], command[1024], output[4096];
    float full[ELEMENTS];
    test_make_temp_dir(run_dir, "ckpt-rank3");
    test_fill_normal(full, ELEMENTS, 1.0f, 38);
    checkpoint_test_write_two_shards(run_dir, 7, N_TENSORS, fixture_tensors, shard_rows, full, 2);
    snprintf(command, sizeof command,
             "cd '%s/checkpoints/step_00000007' && python3 -c '\n"
             "import h5py\n"
             "for s in (0, 1):\n"
             "    d = h5py.File(\"shard_p0_d%%d.h5\" %% s, \"r\")"
             "[\"model/model.route_streams.0.conv\"]\n"
             "    print(s, list(d.shape))\n"
             "'",
             run_dir);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    cr_assert_str_eq(output, "0 [1, 4, 5]\n1 [2, 4, 5]\n");
    test_remove_tree(run_dir);
}
