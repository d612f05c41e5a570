/* checkpoints/checkpoint_stream.c — a model-only save that holds one tensor at a time, and
 * which groups a checkpoint holds (DESIGN 5; see checkpoint.h). */
#include "checkpoints/checkpoint_layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoints/h5_tensor.h"
#include "runtime/crc32c.h"
#include "runtime/error.h"

void checkpoint_save_model_streamed(const char *run_dir, const CheckpointMeta *meta,
                                    const CheckpointTensor *tensors, int n_tensors,
                                    CheckpointTensorFill fill, void *context)
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

    size_t largest = 1;
    for (int i = 0; i < n_tensors; i++) {
        size_t elements = (size_t)(tensors[i].shape[0] *
                                   checkpoint_tensor_row_elements(&tensors[i]));
        largest = elements > largest ? elements : largest;
    }
    float *values = xmalloc(largest * sizeof *values);
    CheckpointRows *rows = xcalloc((size_t)(n_tensors > 0 ? n_tensors : 1), sizeof *rows);
    uint32_t *digests = xcalloc((size_t)CKPT_GROUPS * (size_t)(n_tensors > 0 ? n_tensors : 1),
                                sizeof *digests);
    checkpoint_shard_name(0, 0, shard_file, sizeof shard_file);
    checkpoint_path_join(shard_path, sizeof shard_path, tmp_dir, shard_file);
    hid_t file = h5_file_create(shard_path);
    char dataset[CHECKPOINT_PATH_MAX];
    for (int i = 0; i < n_tensors; i++) {
        const CheckpointTensor *tensor = &tensors[i];
        rows[i] = (CheckpointRows){0, tensor->shape[0]};
        size_t elements = (size_t)(tensor->shape[0] * checkpoint_tensor_row_elements(tensor));
        fill(context, i, values);
        checkpoint_dataset_path(CKPT_GROUP_MODEL, tensor->name, dataset, sizeof dataset);
        h5_tensor_write(file, dataset, tensor->ndim, tensor->shape, H5T_IEEE_F32LE, values);
        digests[CKPT_GROUP_MODEL * n_tensors + i] = crc32c(values, elements * sizeof(float));
    }
    H5_CHECK(H5Fclose(file));
    checkpoint_sync_path(shard_path);
    free(values);

    CheckpointShard shard = {.file = shard_file, .rows = rows, .digests = digests};
    checkpoint_index_write(tmp_dir, meta, tensors, n_tensors, 1u << CKPT_GROUP_MODEL, &shard, 1);
    checkpoint_commit(checkpoints_dir, meta->step);
    free(digests);
    free(rows);
}

bool checkpoint_has_group(const char *step_dir, int group)
{
    if (!checkpoint_group_path(group))
        fatal(EXIT_DATA, "no checkpoint group %d", group);
    char resolved[CHECKPOINT_PATH_MAX], index_path[CHECKPOINT_PATH_MAX];
    checkpoint_resolve_step_dir(step_dir, resolved, sizeof resolved);
    hid_t index = checkpoint_index_open(resolved, index_path, sizeof index_path);
    bool present = h5_path_exists(index, checkpoint_group_path(group)) > 0;
    H5_CHECK(H5Fclose(index));
    return present;
}
