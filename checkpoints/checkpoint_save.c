/* checkpoints/checkpoint_save.c — writing shards and committing a step directory (DESIGN 5).
 *
 * The order is what makes a save safe to kill at any point: shard(s) -> fsync -> index.h5 ->
 * fsync -> COMMITTED -> fsync the directory -> rename step_X.tmp to step_X -> fsync
 * checkpoints/ -> latest.tmp -> rename to latest -> fsync. Before the directory rename
 * nothing is visible; after it the step is complete and committed. A crash before `latest`
 * is replaced leaves it naming the previous step, which is still whole: the run resumes
 * there and saves this step again (the re-save replaces it).
 */
#include "checkpoints/checkpoint_layout.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoints/h5_tensor.h"
#include "runtime/crc32c.h"
#include "runtime/error.h"

/* The digest is of the fp32 little-endian bytes; in memory they are exactly those bytes. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "CRC32C digests assume little-endian");
_Static_assert(CHECKPOINT_RANK_MAX == H5_TENSOR_RANK_MAX, "every tensor rank must be writable");

void checkpoint_shard_write(const char *path, const CheckpointTensor *tensors, int n_tensors,
                            const CheckpointRows *rows, const float *const data[CKPT_GROUPS],
                            uint32_t *digests)
{
    hid_t file = h5_file_create(path);
    char dataset[CHECKPOINT_PATH_MAX];
    for (int group = 0; group < CKPT_GROUPS; group++) {
        if (!data[group])
            continue;
        for (int i = 0; i < n_tensors; i++) {
            const CheckpointTensor *tensor = &tensors[i];
            int64_t held = rows[i].row_end - rows[i].row_begin;
            digests[group * n_tensors + i] = 0;
            if (held <= 0)
                continue;
            /* the held rows keep the tensor's rank: [held, shape[1], shape[2]] */
            int64_t shape[CHECKPOINT_RANK_MAX] = {held, tensor->shape[1], tensor->shape[2]};
            size_t elements = (size_t)(held * checkpoint_tensor_row_elements(tensor));
            const float *values = data[group] + tensor->offset;
            checkpoint_dataset_path(group, tensor->name, dataset, sizeof dataset);
            h5_tensor_write(file, dataset, tensor->ndim, shape, H5T_IEEE_F32LE, values);
            digests[group * n_tensors + i] = crc32c(values, elements * sizeof(float));
        }
    }
    H5_CHECK(H5Fclose(file));
    checkpoint_sync_path(path);
}

/* Moves the finished step_X.tmp into place as step_X, replacing an older save of the same
 * step without a moment in which neither exists. */
static void step_directory_publish(const char *tmp_dir, const char *final_dir)
{
    if (!checkpoint_path_exists(final_dir)) {
        if (rename(tmp_dir, final_dir) != 0)
            fatal(EXIT_DATA, "cannot rename %s to %s: %s", tmp_dir, final_dir, strerror(errno));
        return;
    }
    if (renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE) == 0) {
        /* the replaced save now carries the .tmp name: nothing reads it, retention would
         * remove it if we stopped here */
        checkpoint_remove_tree(tmp_dir);
        return;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        fatal(EXIT_DATA, "cannot swap %s into %s: %s", tmp_dir, final_dir, strerror(errno));
    /* a file system without atomic exchange: uncommit the old save first, so that a crash
     * in between leaves no half-removed directory that claims to be complete */
    char commit_file[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(commit_file, sizeof commit_file, final_dir, CHECKPOINT_COMMIT_FILE);
    if (remove(commit_file) != 0 && errno != ENOENT)
        fatal(EXIT_DATA, "cannot remove %s: %s", commit_file, strerror(errno));
    checkpoint_remove_tree(final_dir);
    if (rename(tmp_dir, final_dir) != 0)
        fatal(EXIT_DATA, "cannot rename %s to %s: %s", tmp_dir, final_dir, strerror(errno));
}

void checkpoint_commit(const char *checkpoints_dir, int64_t step)
{
    char name[64], text[80];
    char tmp_dir[CHECKPOINT_PATH_MAX], final_dir[CHECKPOINT_PATH_MAX];
    char path[CHECKPOINT_PATH_MAX], latest[CHECKPOINT_PATH_MAX];
    checkpoint_step_name(step, name, sizeof name);
    snprintf(text, sizeof text, "%s\n", name);
    checkpoint_path_join(final_dir, sizeof final_dir, checkpoints_dir, name);
    snprintf(path, sizeof path, "%s" CHECKPOINT_TMP_SUFFIX, name);
    checkpoint_path_join(tmp_dir, sizeof tmp_dir, checkpoints_dir, path);

    checkpoint_path_join(path, sizeof path, tmp_dir, CHECKPOINT_COMMIT_FILE);
    checkpoint_write_text_file(path, text);
    checkpoint_sync_path(tmp_dir);
    step_directory_publish(tmp_dir, final_dir);
    checkpoint_sync_path(checkpoints_dir);

    checkpoint_path_join(path, sizeof path, checkpoints_dir, CHECKPOINT_LATEST_FILE ".tmp");
    checkpoint_path_join(latest, sizeof latest, checkpoints_dir, CHECKPOINT_LATEST_FILE);
    checkpoint_write_text_file(path, text);
    if (rename(path, latest) != 0)
        fatal(EXIT_DATA, "cannot rename %s to %s: %s", path, latest, strerror(errno));
    checkpoint_sync_path(checkpoints_dir);
}

void checkpoint_save(const char *run_dir, const CheckpointMeta *meta,
                     const CheckpointTensor *tensors, int n_tensors,
                     const float *const data[CKPT_GROUPS])
{
    checkpoint_tensors_validate(tensors, n_tensors);
    if (meta->step < 0)
        fatal(EXIT_DATA, "cannot save a checkpoint of step %lld", (long long)meta->step);

    char checkpoints_dir[CHECKPOINT_PATH_MAX], tmp_dir[CHECKPOINT_PATH_MAX];
    char name[64], shard_file[64], shard_path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(checkpoints_dir, sizeof checkpoints_dir, run_dir, CHECKPOINT_DIRECTORY);
    checkpoint_make_directory(checkpoints_dir);
    checkpoint_step_name(meta->step, name, sizeof name);
    strcat(name, CHECKPOINT_TMP_SUFFIX);
    checkpoint_path_join(tmp_dir, sizeof tmp_dir, checkpoints_dir, name);
    checkpoint_remove_tree(tmp_dir); /* left by a save of this step that died */
    if (mkdir(tmp_dir, 0777) != 0)
        fatal(EXIT_DATA, "cannot create directory %s: %s", tmp_dir, strerror(errno));

    /* one process: one shard holding every row of every tensor */
    CheckpointRows *rows = xmalloc(sizeof *rows * (size_t)(n_tensors > 0 ? n_tensors : 1));
    uint32_t *digests = xcalloc((size_t)CKPT_GROUPS * (size_t)(n_tensors > 0 ? n_tensors : 1),
                                sizeof *digests);
    unsigned group_mask = 0;
    for (int group = 0; group < CKPT_GROUPS; group++)
        if (data[group])
            group_mask |= 1u << group;
    for (int i = 0; i < n_tensors; i++)
        rows[i] = (CheckpointRows){0, tensors[i].shape[0]};
    checkpoint_shard_name(0, 0, shard_file, sizeof shard_file);
    checkpoint_path_join(shard_path, sizeof shard_path, tmp_dir, shard_file);
    checkpoint_shard_write(shard_path, tensors, n_tensors, rows, data, digests);

    CheckpointShard shard = {.file = shard_file, .rows = rows, .digests = digests};
    checkpoint_index_write(tmp_dir, meta, tensors, n_tensors, group_mask, &shard, 1);
    checkpoint_commit(checkpoints_dir, meta->step);
    free(digests);
    free(rows);
}
