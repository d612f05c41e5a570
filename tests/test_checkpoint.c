/* tests/test_checkpoint.c — saving, finding, loading and retiring checkpoints (DESIGN 5).
 *
 * The fixture is four tensors of both ranks in all four groups, filled with different random
 * values per group. Cases that must exit run in a forked child whose stderr is captured.
 * Retention works on directory names alone, so its tests build empty step directories.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "checkpoints/checkpoint.h"
#include "checkpoints/checkpoint_layout.h"
#include "tests/checkpoint_support.h"
#include "tests/support.h"

#define N_TENSORS 4
#define CONFIG_TEXT "model:\n  d_model: 5\n  vocab_size: 7\nseed: 17\n"

typedef struct {
    CheckpointTensor tensors[N_TENSORS];
    size_t elements;
    float *data[CKPT_GROUPS];
} Fixture;

static void fixture_make(Fixture *fixture, uint64_t seed)
{
    const CheckpointTensor tensors[N_TENSORS] = {
        {"model.embed_tokens.weight", 2, {7, 5}, 0},
        {"model.layers.0.self_attn.q_proj.weight", 2, {5, 5}, 35},
        {"model.norm.weight", 1, {5, 0}, 60},
        {"model.final_route.alpha", 1, {1, 0}, 65},
    };
    memcpy(fixture->tensors, tensors, sizeof tensors);
    fixture->elements = 66;
    checkpoint_test_groups_fill(fixture->data, fixture->elements, seed);
}

static void fixture_free(Fixture *fixture)
{
    checkpoint_test_groups_free(fixture->data);
}

static CheckpointMeta meta_make(int64_t step)
{
    CheckpointMeta meta = {
        .step = step, .consumed_samples = step * 32, .tokens_seen = step * 32 * 128,
        .optimizer_steps = step - 2, .skipped_steps = 2,
        .rng_seed = 0xFEEDFACECAFEBEEFull, .config_yaml = CONFIG_TEXT,
        .pp = 2, .dp = 4, .virtual_stages = 2, .n_layer_split = 4,
        .layer_split = {3, 2, 2, 1},
    };
    return meta;
}

static void save_step(const char *run_dir, int64_t step, const Fixture *fixture)
{
    CheckpointMeta meta = meta_make(step);
    const float *const data[CKPT_GROUPS] = {fixture->data[0], fixture->data[1],
                                            fixture->data[2], fixture->data[3]};
    checkpoint_save(run_dir, &meta, fixture->tensors, N_TENSORS, data);
}

/* A fresh run directory holding one checkpoint, at `step`, of a new fixture from `seed`. */
static void saved_run_make(char *run_dir, Fixture *fixture, uint64_t seed, int64_t step)
{
    test_make_temp_dir(run_dir, "ckpt");
    fixture_make(fixture, seed);
    save_step(run_dir, step, fixture);
}

/* Loads every group into NaN-filled buffers and says whether they equal the fixture's bits. */
static bool load_matches(const char *dir, const Fixture *fixture)
{
    float *loaded[CKPT_GROUPS];
    checkpoint_test_groups_poison(loaded, fixture->elements);
    checkpoint_load(dir, fixture->tensors, N_TENSORS, loaded);
    bool equal = true;
    for (int group = 0; group < CKPT_GROUPS; group++)
        equal = equal && memcmp(loaded[group], fixture->data[group],
                                fixture->elements * sizeof(float)) == 0;
    checkpoint_test_groups_free(loaded);
    return equal;
}

typedef struct {
    const char *dir;
    Fixture *fixture;
    int64_t step;
} ChildJob;

static void child_load(void *argument)
{
    ChildJob *job = argument;
    load_matches(job->dir, job->fixture);
}

/* Loads `dir` as the fixture's tensors in a forked child; asserts that it exits 3 and leaves
 * its stderr in `errors`. */
static void expect_load_exits_3(const char *dir, Fixture *fixture, char *errors, size_t capacity)
{
    ChildJob job = {.dir = dir, .fixture = fixture};
    cr_assert_eq(test_run_in_child(child_load, &job, errors, capacity), 3, "%s", errors);
}

static void child_save(void *argument)
{
    ChildJob *job = argument;
    save_step(job->dir, job->step, job->fixture);
}

static void path_of(char *out, const char *dir, const char *name)
{
    snprintf(out, 512, "%s/%s", dir, name);
}

Test(checkpoint, save_then_load_is_bitwise_identical_for_all_groups)
{
    char run_dir[256];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 1, 100);
    cr_assert(load_matches(run_dir, &fixture));
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, read_meta_returns_what_save_wrote)
{
    char run_dir[256], step_dir[512], expected_dir[512];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 1, 1200);
    CheckpointMeta meta, saved = meta_make(1200);
    char *config;
    checkpoint_read_meta(run_dir, &meta, &config, step_dir, sizeof step_dir);
    snprintf(expected_dir, sizeof expected_dir, "%s/checkpoints/step_00001200", run_dir);
    cr_assert_str_eq(step_dir, expected_dir);
    cr_assert_eq(meta.step, 1200);
    cr_assert_eq(meta.consumed_samples, saved.consumed_samples);
    cr_assert_eq(meta.tokens_seen, saved.tokens_seen);
    cr_assert_eq(meta.optimizer_steps, saved.optimizer_steps);
    cr_assert_eq(meta.skipped_steps, saved.skipped_steps);
    cr_assert_eq(meta.rng_seed, saved.rng_seed);
    cr_assert_str_eq(config, CONFIG_TEXT);
    cr_assert_eq(meta.config_yaml, config);
    cr_assert(meta.pp == 2 && meta.dp == 4 && meta.virtual_stages == 2);
    cr_assert_eq(meta.n_layer_split, 4);
    cr_assert_arr_eq(meta.layer_split, saved.layer_split, 4 * sizeof(int));
    free(config);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, h5py_reads_names_shapes_values_and_attributes_after_the_run_dir_moves)
{
    char run_dir[256], moved[300], command[2048], output[8192], line[1024], hex[512];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 2, 1200);
    /* the virtual datasets name their shards relative to index.h5: move, read from "/" */
    snprintf(moved, sizeof moved, "%s-moved", run_dir);
    cr_assert_eq(rename(run_dir, moved), 0);
    snprintf(command, sizeof command,
             "cd / && python3 -c '\n"
             "import h5py, json, sys\n"
             "f = h5py.File(sys.argv[1], \"r\")\n"
             "for key in (\"format\", \"step\", \"consumed_samples\"):\n"
             "    print(\"%%s=%%s\" %% (key, f.attrs[key]))\n"
             "print(\"config=\" + json.dumps(f.attrs[\"config\"]))\n"
             "for name, d in f[\"model\"].items():\n"
             "    print(name, list(d.shape), d[()].astype(\"<f4\").tobytes().hex())\n"
             "' '%s/checkpoints/step_00001200/index.h5'",
             moved);
    int code = test_run_command(command, output, sizeof output);
    cr_assert_eq(code, 0, "python3 failed:\n%s", output);
    cr_assert(strstr(output, "format=fathom-checkpoint\n"), "%s", output);
    cr_assert(strstr(output, "step=1200\n"), "%s", output);
    cr_assert(strstr(output, "consumed_samples=38400\n"), "%s", output);
    cr_assert(strstr(output, "config=\"model:\\n  d_model: 5\\n  vocab_size: 7\\nseed: 17\\n\""),
              "%s", output);
    for (int i = 0; i < N_TENSORS; i++) {
        const CheckpointTensor *tensor = &fixture.tensors[i];
        size_t count = (size_t)(tensor->shape[0] * (tensor->ndim == 2 ? tensor->shape[1] : 1));
        checkpoint_test_hex(fixture.data[CKPT_GROUP_MODEL] + tensor->offset, count, hex);
        if (tensor->ndim == 2)
            snprintf(line, sizeof line, "%s [%lld, %lld] %s\n", tensor->name,
                     (long long)tensor->shape[0], (long long)tensor->shape[1], hex);
        else
            snprintf(line, sizeof line, "%s [%lld] %s\n", tensor->name,
                     (long long)tensor->shape[0], hex);
        cr_assert(strstr(output, line), "missing line %s in:\n%s", line, output);
    }
    fixture_free(&fixture);
    test_remove_tree(moved);
}

Test(checkpoint, load_from_a_moved_run_dir_is_bitwise_identical)
{
    char run_dir[256], moved[300];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 3, 5);
    snprintf(moved, sizeof moved, "%s-moved", run_dir);
    cr_assert_eq(rename(run_dir, moved), 0);
    cr_assert_eq(chdir("/"), 0);
    cr_assert(load_matches(moved, &fixture));
    fixture_free(&fixture);
    test_remove_tree(moved);
}

Test(checkpoint, latest_names_the_newest_step_and_committed_exists)
{
    char run_dir[256], path[512], found[512], text[64] = "";
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 4, 100);
    save_step(run_dir, 200, &fixture);
    path_of(path, run_dir, "checkpoints/latest");
    FILE *file = fopen(path, "r");
    cr_assert_not_null(file);
    cr_assert_not_null(fgets(text, sizeof text, file));
    fclose(file);
    cr_assert_str_eq(text, "step_00000200\n");
    path_of(path, run_dir, "checkpoints/step_00000200/COMMITTED");
    cr_assert(checkpoint_path_exists(path));
    path_of(path, run_dir, "checkpoints/step_00000200.tmp");
    cr_assert_not(checkpoint_path_exists(path), "the .tmp directory stayed behind");
    cr_assert(checkpoint_find_latest(run_dir, found, sizeof found));
    path_of(path, run_dir, "checkpoints/step_00000200");
    cr_assert_str_eq(found, path);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, find_latest_ignores_a_checkpoint_without_committed)
{
    char run_dir[256], path[512], found[512];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 5, 100);
    save_step(run_dir, 200, &fixture);
    path_of(path, run_dir, "checkpoints/step_00000200/COMMITTED");
    cr_assert_eq(unlink(path), 0);
    cr_assert(checkpoint_find_latest(run_dir, found, sizeof found));
    path_of(path, run_dir, "checkpoints/step_00000100");
    cr_assert_str_eq(found, path);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, find_latest_is_false_without_checkpoints)
{
    char run_dir[256], found[512];
    test_make_temp_dir(run_dir, "ckpt");
    cr_assert_not(checkpoint_find_latest(run_dir, found, sizeof found));
    test_remove_tree(run_dir);
}

Test(checkpoint, resaving_a_step_replaces_it)
{
    char run_dir[256], path[512];
    Fixture first, second;
    test_make_temp_dir(run_dir, "ckpt");
    fixture_make(&first, 6);
    fixture_make(&second, 7);
    save_step(run_dir, 300, &first);
    save_step(run_dir, 300, &second);
    cr_assert(load_matches(run_dir, &second));
    path_of(path, run_dir, "checkpoints/step_00000300.tmp");
    cr_assert_not(checkpoint_path_exists(path), "the replaced save stayed behind");
    fixture_free(&first);
    fixture_free(&second);
    test_remove_tree(run_dir);
}

/* Flips four bytes in the middle of a shard dataset's data, found with H5Dget_offset. */
static void shard_corrupt(const char *shard_path, const char *dataset_path)
{
    hid_t file = H5Fopen(shard_path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t dataset = H5Dopen2(file, dataset_path, H5P_DEFAULT);
    haddr_t offset = H5Dget_offset(dataset);
    H5Dclose(dataset);
    H5Fclose(file);
    cr_assert_neq(offset, HADDR_UNDEF);
    int fd = open(shard_path, O_RDWR);
    unsigned char bytes[4];
    cr_assert_eq(pread(fd, bytes, 4, (off_t)offset + 40), 4);
    for (int i = 0; i < 4; i++)
        bytes[i] ^= 0x5A;
    cr_assert_eq(pwrite(fd, bytes, 4, (off_t)offset + 40), 4);
    close(fd);
}

Test(checkpoint, corrupted_shard_fails_load_with_exit_3_naming_tensor_and_shard)
{
    char run_dir[256], path[512], errors[4096];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 8, 100);
    path_of(path, run_dir, "checkpoints/step_00000100/shard_p0_d0.h5");
    shard_corrupt(path, "/optim/exp_avg/model.layers.0.self_attn.q_proj.weight");
    expect_load_exits_3(run_dir, &fixture, errors, sizeof errors);
    cr_assert(strstr(errors, "shard_p0_d0.h5"), "%s", errors);
    cr_assert(strstr(errors, "/optim/exp_avg/model.layers.0.self_attn.q_proj.weight"), "%s",
              errors);
    cr_assert(strstr(errors, "CRC32C"), "%s", errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, missing_shard_fails_load_with_exit_3_naming_it)
{
    char run_dir[256], path[512], errors[4096];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 9, 100);
    path_of(path, run_dir, "checkpoints/step_00000100/shard_p0_d0.h5");
    cr_assert_eq(unlink(path), 0);
    expect_load_exits_3(run_dir, &fixture, errors, sizeof errors);
    cr_assert(strstr(errors, "shard_p0_d0.h5") && strstr(errors, "missing"), "%s", errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

/* Replaces a file of the step directory by `size` bytes of `bytes` (NULL: its own first
 * `size` bytes: cut short), then expects the load to exit 3 naming `named`. */
static void expect_damaged_file_exits_3(const char *file, const char *bytes, long size,
                                        const char *named, uint64_t seed)
{
    char run_dir[256], path[512], errors[4096];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, seed, 100);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000100/%s", run_dir, file);
    if (bytes) {
        FILE *out = fopen(path, "wb");
        cr_assert(out);
        cr_assert_eq(fwrite(bytes, 1, (size_t)size, out), (size_t)size);
        fclose(out);
    } else {
        cr_assert_eq(truncate(path, size), 0);
    }
    expect_load_exits_3(run_dir, &fixture, errors, sizeof errors);
    cr_assert(strstr(errors, named), "%s: the message does not name %s:\n%s", file, named,
              errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, a_truncated_empty_or_foreign_file_fails_load_with_exit_3_naming_it)
{
    /* the shard cut short, and emptied */
    expect_damaged_file_exits_3("shard_p0_d0.h5", NULL, 2000, "shard_p0_d0.h5", 21);
    expect_damaged_file_exits_3("shard_p0_d0.h5", NULL, 0, "shard_p0_d0.h5", 22);
    /* the index cut short, emptied, or another file in its place: its digest in COMMITTED
     * refuses it before HDF5 reads it */
    expect_damaged_file_exits_3("index.h5", NULL, 1000, "index.h5", 23);
    expect_damaged_file_exits_3("index.h5", NULL, 0, "index.h5", 24);
    static const char text[] = "a text file where the index should be\n";
    expect_damaged_file_exits_3("index.h5", text, (long)sizeof text - 1, "index.h5", 25);
}

Test(checkpoint, an_hdf5_file_of_another_program_is_not_taken_for_an_index)
{
    /* a valid HDF5 file, without the format attribute, under a COMMITTED of an older save
     * (no digest line): the format check names it */
    char run_dir[256], path[512], errors[4096];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 26, 100);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000100/index.h5", run_dir);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert(file >= 0);
    H5Fclose(file);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000100/COMMITTED", run_dir);
    FILE *out = fopen(path, "w");
    fputs("step_00000100\n", out);
    fclose(out);
    expect_load_exits_3(run_dir, &fixture, errors, sizeof errors);
    cr_assert(strstr(errors, "is not a fathom checkpoint"), "%s", errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, shape_mismatch_exits_3_naming_the_tensor_and_both_shapes)
{
    char run_dir[256], errors[4096];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 10, 100);
    /* same element count, other shape: only the shape check can catch it */
    fixture.tensors[0].shape[0] = 5;
    fixture.tensors[0].shape[1] = 7;
    expect_load_exits_3(run_dir, &fixture, errors, sizeof errors);
    cr_assert(strstr(errors, "model.embed_tokens.weight"), "%s", errors);
    cr_assert(strstr(errors, "[7, 5]") && strstr(errors, "[5, 7]"), "%s", errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

static void child_load_model_and_ema(void *argument)
{
    ChildJob *job = argument;
    float *model = malloc(job->fixture->elements * sizeof(float));
    float *ema = malloc(job->fixture->elements * sizeof(float));
    float *const data[CKPT_GROUPS] = {model, ema, NULL, NULL};
    checkpoint_load(job->dir, job->fixture->tensors, N_TENSORS, data);
}

Test(checkpoint, loading_a_group_the_checkpoint_lacks_exits_3)
{
    char run_dir[256], errors[4096];
    Fixture fixture;
    test_make_temp_dir(run_dir, "ckpt");
    fixture_make(&fixture, 11);
    CheckpointMeta meta = meta_make(100);
    const float *const without_ema[CKPT_GROUPS] = {fixture.data[0], NULL, fixture.data[2],
                                                   fixture.data[3]};
    checkpoint_save(run_dir, &meta, fixture.tensors, N_TENSORS, without_ema);
    ChildJob job = {.dir = run_dir, .fixture = &fixture};
    cr_assert_eq(test_run_in_child(child_load_model_and_ema, &job, errors, sizeof errors), 3, "%s",
                 errors);
    cr_assert(strstr(errors, "/ema"), "%s", errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

Test(checkpoint, save_where_checkpoints_is_a_file_exits_3)
{
    char run_dir[256], path[512], errors[4096];
    Fixture fixture;
    test_make_temp_dir(run_dir, "ckpt");
    fixture_make(&fixture, 12);
    path_of(path, run_dir, "checkpoints");
    test_write_file(path, "not a directory\n");
    ChildJob job = {.dir = run_dir, .fixture = &fixture, .step = 100};
    cr_assert_eq(test_run_in_child(child_save, &job, errors, sizeof errors), 3, "%s", errors);
    cr_assert(strstr(errors, path), "%s", errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

/* A save that runs out of room mid-shard: the file size limit stands in for a full disk. */
static void child_save_into_a_full_disk(void *argument)
{
    signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead */
    struct rlimit limit = {.rlim_cur = 2048, .rlim_max = 2048};
    setrlimit(RLIMIT_FSIZE, &limit);
    child_save(argument);
}

Test(checkpoint, failed_save_exits_3_and_leaves_the_previous_checkpoint_loadable)
{
    char run_dir[256], path[512], found[512], errors[4096];
    Fixture previous, next;
    test_make_temp_dir(run_dir, "ckpt");
    fixture_make(&previous, 13);
    fixture_make(&next, 14);
    save_step(run_dir, 100, &previous);
    ChildJob job = {.dir = run_dir, .fixture = &next, .step = 200};
    cr_assert_eq(test_run_in_child(child_save_into_a_full_disk, &job, errors, sizeof errors), 3,
                 "%s", errors);
    path_of(path, run_dir, "checkpoints/step_00000200");
    cr_assert_not(checkpoint_path_exists(path), "a failed save was published");
    cr_assert(checkpoint_find_latest(run_dir, found, sizeof found));
    path_of(path, run_dir, "checkpoints/step_00000100");
    cr_assert_str_eq(found, path);
    cr_assert(load_matches(run_dir, &previous));
    fixture_free(&previous);
    fixture_free(&next);
    test_remove_tree(run_dir);
}

Test(checkpoint, loading_an_uncommitted_step_directory_exits_3)
{
    char run_dir[256], path[512], errors[4096];
    Fixture fixture;
    saved_run_make(run_dir, &fixture, 15, 100);
    path_of(path, run_dir, "checkpoints/step_00000100/COMMITTED");
    cr_assert_eq(unlink(path), 0);
    path_of(path, run_dir, "checkpoints/step_00000100");
    expect_load_exits_3(path, &fixture, errors, sizeof errors);
    cr_assert(strstr(errors, "COMMITTED"), "%s", errors);
    fixture_free(&fixture);
    test_remove_tree(run_dir);
}

/* An empty step directory checkpoints/step_%08lld[.tmp], with COMMITTED when `committed`. */
static void step_directory_fake(const char *run_dir, int64_t step, bool committed, bool tmp)
{
    char path[512];
    snprintf(path, sizeof path, "%s/checkpoints/step_%08lld%s", run_dir, (long long)step,
             tmp ? ".tmp" : "");
    checkpoint_make_directory(path);
    if (committed) {
        strcat(path, "/COMMITTED");
        test_write_file(path, "");
    }
}

static void latest_fake(const char *run_dir, int64_t step)
{
    char path[512], text[64];
    snprintf(path, sizeof path, "%s/checkpoints/latest", run_dir);
    snprintf(text, sizeof text, "step_%08lld\n", (long long)step);
    test_write_file(path, text);
}

static int name_is_a_step(const struct dirent *entry)
{
    return strncmp(entry->d_name, "step_", 5) == 0;
}

/* The step directories left, sorted, space-separated. */
static void steps_left(const char *run_dir, char *text, size_t capacity)
{
    char path[512];
    struct dirent **entries;
    snprintf(path, sizeof path, "%s/checkpoints", run_dir);
    int count = scandir(path, &entries, name_is_a_step, alphasort);
    cr_assert(count >= 0);
    text[0] = '\0';
    for (int i = 0; i < count; i++) {
        if (i > 0)
            strncat(text, " ", capacity - strlen(text) - 1);
        strncat(text, entries[i]->d_name, capacity - strlen(text) - 1);
        free(entries[i]);
    }
    free(entries);
}

Test(checkpoint, retention_keeps_the_newest_and_the_multiples_of_keep_every)
{
    char run_dir[256], left[1024];
    test_make_temp_dir(run_dir, "ckpt");
    for (int step = 100; step <= 1000; step += 100)
        step_directory_fake(run_dir, step, true, false);
    latest_fake(run_dir, 1000);
    checkpoint_apply_retention(run_dir, 2, 500);
    steps_left(run_dir, left, sizeof left);
    cr_assert_str_eq(left, "step_00000500 step_00000900 step_00001000");
    test_remove_tree(run_dir);
}

Test(checkpoint, retention_keeps_the_step_latest_names)
{
    char run_dir[256], left[1024];
    test_make_temp_dir(run_dir, "ckpt");
    for (int step = 100; step <= 300; step += 100)
        step_directory_fake(run_dir, step, true, false);
    latest_fake(run_dir, 100); /* a run resumed from an older step */
    checkpoint_apply_retention(run_dir, 1, 0);
    steps_left(run_dir, left, sizeof left);
    cr_assert_str_eq(left, "step_00000100 step_00000300");
    test_remove_tree(run_dir);
}

Test(checkpoint, retention_removes_stale_tmp_and_uncommitted_directories_only)
{
    char run_dir[256], left[1024], path[512];
    test_make_temp_dir(run_dir, "ckpt");
    step_directory_fake(run_dir, 100, true, false);
    step_directory_fake(run_dir, 200, true, true);
    step_directory_fake(run_dir, 300, false, false);
    latest_fake(run_dir, 100);
    path_of(path, run_dir, "checkpoints/notes.txt");
    test_write_file(path, "kept\n");
    checkpoint_apply_retention(run_dir, 0, 0);
    steps_left(run_dir, left, sizeof left);
    cr_assert_str_eq(left, "step_00000100");
    cr_assert(checkpoint_path_exists(path), "retention removed a file it does not own");
    test_remove_tree(run_dir);
}
