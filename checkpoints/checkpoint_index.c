/* checkpoints/checkpoint_index.c — index.h5: the run's metadata, one virtual dataset per
 * tensor over the shards' row ranges, and the /integrity table of CRC32C digests (DESIGN 5;
 * the layout is described in checkpoint.h). */
#include "checkpoints/checkpoint_layout.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoints/h5_tensor.h"
#include "runtime/error.h"

#define INTEGRITY_DATASET "/integrity"

static void meta_write(hid_t file, const CheckpointMeta *meta)
{
    h5_attribute_write_text(file, "format", CHECKPOINT_FORMAT);
    h5_attribute_write_int64(file, "version", CHECKPOINT_VERSION);
    h5_attribute_write_int64(file, "step", meta->step);
    h5_attribute_write_int64(file, "consumed_samples", meta->consumed_samples);
    h5_attribute_write_int64(file, "tokens_seen", meta->tokens_seen);
    h5_attribute_write_int64(file, "optimizer_steps", meta->optimizer_steps);
    h5_attribute_write_int64(file, "skipped_steps", meta->skipped_steps);
    h5_attribute_write_uint64(file, "rng", meta->rng_seed);
    h5_attribute_write_text(file, "config", meta->config_yaml ? meta->config_yaml : "");
    h5_attribute_write_int64(file, "layout_pp", meta->pp);
    h5_attribute_write_int64(file, "layout_dp", meta->dp);
    h5_attribute_write_int64(file, "layout_virtual_stages", meta->virtual_stages);
    h5_attribute_write_ints(file, "layout_split", meta->layer_split, meta->n_layer_split);
}

/* /<group>/<name> as a virtual dataset of the tensor's full shape whose rows come from the
 * same-named dataset of each shard that holds some. */
static void virtual_tensor_create(hid_t file, int group, const CheckpointTensor *tensor,
                                  int tensor_index, const CheckpointShard *shards, int n_shards)
{
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_dataset_path(group, tensor->name, path, sizeof path);
    hsize_t dims[CHECKPOINT_RANK_MAX] = {0, 1, 1};
    for (int axis = 0; axis < tensor->ndim; axis++)
        dims[axis] = (hsize_t)tensor->shape[axis];
    hid_t space = H5_CHECK(H5Screate_simple(tensor->ndim, dims, NULL));
    hid_t create_plist = H5_CHECK(H5Pcreate(H5P_DATASET_CREATE));
    for (int s = 0; s < n_shards; s++) {
        CheckpointRows rows = shards[s].rows[tensor_index];
        if (rows.row_end <= rows.row_begin)
            continue;
        /* rows [row_begin, row_end) of the tensor, whole in every other dim */
        hsize_t start[CHECKPOINT_RANK_MAX] = {(hsize_t)rows.row_begin, 0, 0};
        hsize_t count[CHECKPOINT_RANK_MAX] = {(hsize_t)(rows.row_end - rows.row_begin), dims[1],
                                              dims[2]};
        H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL));
        hid_t source_space = H5_CHECK(H5Screate_simple(tensor->ndim, count, NULL));
        /* the file name stays relative: HDF5 resolves it against index.h5's directory */
        H5_CHECK(H5Pset_virtual(create_plist, space, shards[s].file, path, source_space));
        H5_CHECK(H5Sclose(source_space));
    }
    H5_CHECK(H5Sselect_all(space));
    hid_t dataset = H5_CHECK(H5Dcreate2(file, path, H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                        create_plist, H5P_DEFAULT));
    H5_CHECK(H5Dclose(dataset));
    H5_CHECK(H5Pclose(create_plist));
    H5_CHECK(H5Sclose(space));
}

/* The in-memory compound of one CheckpointDigest; strings are variable-length UTF-8. */
static hid_t digest_type_create(void)
{
    hid_t text = H5_CHECK(H5Tcopy(H5T_C_S1));
    H5_CHECK(H5Tset_size(text, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(text, H5T_CSET_UTF8));
    hid_t type = H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(CheckpointDigest)));
    H5_CHECK(H5Tinsert(type, "shard", HOFFSET(CheckpointDigest, shard), text));
    H5_CHECK(H5Tinsert(type, "dataset", HOFFSET(CheckpointDigest, dataset), text));
    H5_CHECK(H5Tinsert(type, "row_begin", HOFFSET(CheckpointDigest, row_begin),
                       H5T_NATIVE_INT64));
    H5_CHECK(H5Tinsert(type, "row_end", HOFFSET(CheckpointDigest, row_end), H5T_NATIVE_INT64));
    H5_CHECK(H5Tinsert(type, "crc32c", HOFFSET(CheckpointDigest, crc32c), H5T_NATIVE_UINT32));
    H5_CHECK(H5Tclose(text));
    return type;
}

static void integrity_write(hid_t file, const CheckpointTensor *tensors, int n_tensors,
                            unsigned group_mask, const CheckpointShard *shards, int n_shards)
{
    size_t capacity = (size_t)n_shards * CKPT_GROUPS * (size_t)n_tensors + 1;
    CheckpointDigest *records = xcalloc(capacity, sizeof *records);
    int count = 0;
    char path[CHECKPOINT_PATH_MAX];
    for (int s = 0; s < n_shards; s++)
        for (int group = 0; group < CKPT_GROUPS; group++) {
            if (!(group_mask & (1u << group)))
                continue;
            for (int i = 0; i < n_tensors; i++) {
                CheckpointRows rows = shards[s].rows[i];
                if (rows.row_end <= rows.row_begin)
                    continue;
                checkpoint_dataset_path(group, tensors[i].name, path, sizeof path);
                records[count++] = (CheckpointDigest){
                    .shard = xstrdup(shards[s].file),
                    .dataset = xstrdup(path),
                    .row_begin = rows.row_begin,
                    .row_end = rows.row_end,
                    .crc32c = shards[s].digests[group * n_tensors + i],
                };
            }
        }
    hid_t memory_type = digest_type_create();
    hid_t file_type = H5_CHECK(H5Tcopy(memory_type));
    H5_CHECK(H5Tpack(file_type));
    hsize_t dims[1] = {(hsize_t)count};
    hid_t space = H5_CHECK(H5Screate_simple(1, dims, NULL));
    hid_t dataset = H5_CHECK(H5Dcreate2(file, INTEGRITY_DATASET, file_type, space, H5P_DEFAULT,
                                        H5P_DEFAULT, H5P_DEFAULT));
    if (count > 0)
        H5_CHECK(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, records));
    H5_CHECK(H5Dclose(dataset));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Tclose(file_type));
    H5_CHECK(H5Tclose(memory_type));
    checkpoint_digests_free(records, count);
}

void checkpoint_index_write(const char *step_dir, const CheckpointMeta *meta,
                            const CheckpointTensor *tensors, int n_tensors,
                            unsigned group_mask, const CheckpointShard *shards, int n_shards)
{
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(path, sizeof path, step_dir, CHECKPOINT_INDEX_FILE);
    hid_t file = h5_file_create(path);
    meta_write(file, meta);
    hid_t link_plist = H5_CHECK(H5Pcreate(H5P_LINK_CREATE));
    H5_CHECK(H5Pset_create_intermediate_group(link_plist, 1));
    for (int group = 0; group < CKPT_GROUPS; group++) {
        if (!(group_mask & (1u << group)))
            continue;
        hid_t group_id = H5_CHECK(H5Gcreate2(file, checkpoint_group_path(group), link_plist,
                                             H5P_DEFAULT, H5P_DEFAULT));
        H5_CHECK(H5Gclose(group_id));
        for (int i = 0; i < n_tensors; i++)
            virtual_tensor_create(file, group, &tensors[i], i, shards, n_shards);
    }
    H5_CHECK(H5Pclose(link_plist));
    integrity_write(file, tensors, n_tensors, group_mask, shards, n_shards);
    H5_CHECK(H5Fclose(file));
    checkpoint_sync_path(path);
}

hid_t checkpoint_index_open(const char *step_dir, char *index_path, size_t capacity)
{
    checkpoint_path_join(index_path, capacity, step_dir, CHECKPOINT_INDEX_FILE);
    checkpoint_index_verify(step_dir, index_path);
    hid_t file = h5_file_open_readonly(index_path);
    if (!h5_attribute_exists(file, "format"))
        fatal(EXIT_DATA, "%s is not a fathom checkpoint (no `format` attribute)", index_path);
    char *format = h5_attribute_read_text(file, "format", index_path);
    if (strcmp(format, CHECKPOINT_FORMAT) != 0)
        fatal(EXIT_DATA, "%s is not a fathom checkpoint (format \"%s\")", index_path, format);
    free(format);
    int64_t version = h5_attribute_read_int64(file, "version", index_path);
    if (version != CHECKPOINT_VERSION)
        fatal(EXIT_DATA, "%s has checkpoint format version %lld; this build reads version %d",
              index_path, (long long)version, CHECKPOINT_VERSION);
    return file;
}

int checkpoint_digests_read(hid_t index, const char *index_path, CheckpointDigest **digests)
{
    if (H5_CHECK(H5Lexists(index, INTEGRITY_DATASET, H5P_DEFAULT)) <= 0)
        fatal(EXIT_DATA, "%s has no %s table", index_path, INTEGRITY_DATASET);
    hid_t dataset = H5_CHECK(H5Dopen2(index, INTEGRITY_DATASET, H5P_DEFAULT));
    hid_t space = H5_CHECK(H5Dget_space(dataset));
    int count = (int)H5_CHECK(H5Sget_simple_extent_npoints(space));
    hid_t type = digest_type_create();
    CheckpointDigest *library = xcalloc((size_t)count + 1, sizeof *library);
    if (count > 0)
        H5_CHECK(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, library));
    /* copy the strings out of HDF5's allocations, so the caller frees with plain free() */
    CheckpointDigest *copies = xcalloc((size_t)count + 1, sizeof *copies);
    for (int i = 0; i < count; i++) {
        copies[i] = library[i];
        copies[i].shard = xstrdup(library[i].shard ? library[i].shard : "");
        copies[i].dataset = xstrdup(library[i].dataset ? library[i].dataset : "");
    }
    if (count > 0) {
#if H5_VERSION_GE(1, 12, 0)
        H5_CHECK(H5Treclaim(type, space, H5P_DEFAULT, library));
#else
        H5_CHECK(H5Dvlen_reclaim(type, space, H5P_DEFAULT, library));
#endif
    }
    free(library);
    H5_CHECK(H5Tclose(type));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Dclose(dataset));
    *digests = copies;
    return count;
}

void checkpoint_digests_free(CheckpointDigest *digests, int count)
{
    for (int i = 0; i < count; i++) {
        free(digests[i].shard);
        free(digests[i].dataset);
    }
    free(digests);
}

void checkpoint_read_meta(const char *dir, CheckpointMeta *meta, char **config_yaml,
                          char *step_dir, size_t capacity)
{
    char resolved[CHECKPOINT_PATH_MAX], index_path[CHECKPOINT_PATH_MAX];
    checkpoint_resolve_step_dir(dir, resolved, sizeof resolved);
    hid_t file = checkpoint_index_open(resolved, index_path, sizeof index_path);
    memset(meta, 0, sizeof *meta);
    meta->step = h5_attribute_read_int64(file, "step", index_path);
    meta->consumed_samples = h5_attribute_read_int64(file, "consumed_samples", index_path);
    meta->tokens_seen = h5_attribute_read_int64(file, "tokens_seen", index_path);
    meta->optimizer_steps = h5_attribute_read_int64(file, "optimizer_steps", index_path);
    meta->skipped_steps = h5_attribute_read_int64(file, "skipped_steps", index_path);
    meta->rng_seed = h5_attribute_read_uint64(file, "rng", index_path);
    meta->pp = (int)h5_attribute_read_int64(file, "layout_pp", index_path);
    meta->dp = (int)h5_attribute_read_int64(file, "layout_dp", index_path);
    meta->virtual_stages = (int)h5_attribute_read_int64(file, "layout_virtual_stages",
                                                        index_path);
    meta->n_layer_split = h5_attribute_read_ints(file, "layout_split", meta->layer_split,
                                                 CONFIG_SPLIT_MAX, index_path);
    *config_yaml = h5_attribute_read_text(file, "config", index_path);
    meta->config_yaml = *config_yaml;
    H5_CHECK(H5Fclose(file));
    if (step_dir) {
        if (strlen(resolved) >= capacity)
            fatal(EXIT_DATA, "checkpoint path %s is longer than %zu bytes", resolved,
                  capacity - 1);
        strcpy(step_dir, resolved);
    }
}
