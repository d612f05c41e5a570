/* checkpoints/checkpoint_load.c — verifying shard digests and reading tensors through
 * index.h5 (DESIGN 5).
 *
 * Order: the index and its groups, then every requested tensor's shape (cheap, and the most
 * useful message when a config and a checkpoint disagree), then the rows each tensor gets
 * from the shards, then the CRC32C of every shard dataset in a wanted group, then the data.
 * The digests are checked before any read because HDF5 fills the rows of a missing source
 * file with zeros instead of failing.
 */
#include "checkpoints/checkpoint_layout.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/h5_tensor.h"
#include "runtime/crc32c.h"
#include "runtime/error.h"
#include "runtime/timer.h"

/* Digest verification reads a dataset this many floats at a time (16 MiB). */
#define VERIFY_BLOCK_FLOATS ((size_t)1 << 22)

/* The group a shard dataset path "/optim/exp_avg/<name>" belongs to, or -1. */
static int dataset_group(const char *dataset)
{
    for (int group = 0; group < CKPT_GROUPS; group++) {
        const char *prefix = checkpoint_group_path(group);
        size_t length = strlen(prefix);
        if (strncmp(dataset, prefix, length) == 0 && dataset[length] == '/' &&
            !strchr(dataset + length + 1, '/'))
            return group;
    }
    return -1;
}

static void tensor_shape_check(hid_t index, const char *index_path, int group,
                               const CheckpointTensor *tensor)
{
    char path[CHECKPOINT_PATH_MAX];
    char found_text[CHECKPOINT_SHAPE_TEXT_MAX], expected_text[CHECKPOINT_SHAPE_TEXT_MAX];
    checkpoint_dataset_path(group, tensor->name, path, sizeof path);
    if (!h5_path_exists(index, path))
        fatal(EXIT_DATA, "checkpoint %s has no tensor %s (looked for %s)", index_path,
              tensor->name, path);
    hid_t dataset = H5_CHECK(H5Dopen2(index, path, H5P_DEFAULT));
    int ndim;
    int64_t shape[CHECKPOINT_RANK_MAX];
    h5_tensor_shape(dataset, index_path, path, &ndim, shape);
    H5_CHECK(H5Dclose(dataset));
    bool same = ndim == tensor->ndim;
    for (int axis = 0; same && axis < ndim; axis++)
        same = shape[axis] == tensor->shape[axis];
    if (!same) {
        checkpoint_shape_format(ndim, shape, found_text, sizeof found_text);
        checkpoint_shape_format(tensor->ndim, tensor->shape, expected_text,
                                sizeof expected_text);
        fatal(EXIT_DATA, "checkpoint %s: tensor %s has shape %s, expected %s", index_path,
              tensor->name, found_text, expected_text);
    }
}

/* Every row of the tensor must come from some shard: HDF5 would fill a gap with zeros. */
static void tensor_rows_check(const char *index_path, int group, const CheckpointTensor *tensor,
                              const CheckpointDigest *digests, int n_digests)
{
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_dataset_path(group, tensor->name, path, sizeof path);
    int64_t covered = 0;
    for (int d = 0; d < n_digests; d++) {
        if (strcmp(digests[d].dataset, path) != 0)
            continue;
        if (digests[d].row_begin < 0 || digests[d].row_end > tensor->shape[0])
            fatal(EXIT_DATA, "checkpoint %s: shard %s holds rows %lld..%lld of %s, which has "
                  "%lld rows", index_path, digests[d].shard, (long long)digests[d].row_begin,
                  (long long)digests[d].row_end, path, (long long)tensor->shape[0]);
        covered += digests[d].row_end - digests[d].row_begin;
    }
    if (covered != tensor->shape[0])
        fatal(EXIT_DATA, "checkpoint %s: the shards hold %lld of the %lld rows of %s",
              index_path, (long long)covered, (long long)tensor->shape[0], path);
}

/* Whole rows per verification read: about VERIFY_BLOCK_FLOATS, at least one row. */
static int64_t verify_block_rows(int64_t row_elements)
{
    int64_t rows = (int64_t)(VERIFY_BLOCK_FLOATS / (size_t)row_elements);
    return rows > 0 ? rows : 1;
}

/* CRC32C of one shard dataset of `rows` rows of `row_elements` each, read in blocks into
 * `buffer`: the bytes row after row, as the save digested them, whatever the rank. */
static uint32_t dataset_digest(hid_t dataset, int64_t rows, int64_t row_elements,
                               float *buffer)
{
    int64_t block_rows = verify_block_rows(row_elements);
    uint32_t crc = 0;
    for (int64_t row = 0; row < rows; row += block_rows) {
        int64_t end = row + block_rows < rows ? row + block_rows : rows;
        h5_tensor_read_rows(dataset, row, end, buffer);
        crc = crc32c_extend(crc, buffer, (size_t)((end - row) * row_elements) * sizeof(float));
    }
    return crc;
}

/* Whether the load reads from shard dataset `digest`: a wanted group, and rows of a tensor
 * this rank wants that overlap the rows the dataset holds. */
static bool digest_wanted(const CheckpointDigest *digest, unsigned wanted_mask,
                          const CheckpointTensor *tensors, int n_tensors,
                          const CheckpointRows *rows)
{
    const int group = dataset_group(digest->dataset);
    if (group < 0 || !(wanted_mask & (1u << group)))
        return false;
    const char *name = digest->dataset + strlen(checkpoint_group_path(group)) + 1;
    for (int i = 0; i < n_tensors; i++)
        if (!strcmp(tensors[i].name, name))
            return rows[i].row_begin < digest->row_end && digest->row_begin < rows[i].row_end;
    return false;
}

static void shard_datasets_verify(const char *step_dir, const CheckpointDigest *digests,
                                  int n_digests, unsigned wanted_mask,
                                  const CheckpointTensor *tensors, int n_tensors,
                                  const CheckpointRows *rows)
{
    char path[CHECKPOINT_PATH_MAX] = "";
    hid_t shard = -1;
    float *buffer = NULL;
    size_t buffer_floats = 0;
    for (int d = 0; d < n_digests; d++) {
        const CheckpointDigest *digest = &digests[d];
        if (!digest_wanted(digest, wanted_mask, tensors, n_tensors, rows))
            continue;
        /* records come shard by shard: open each file once */
        char wanted_path[CHECKPOINT_PATH_MAX];
        checkpoint_path_join(wanted_path, sizeof wanted_path, step_dir, digest->shard);
        if (shard < 0 || strcmp(wanted_path, path) != 0) {
            if (shard >= 0)
                H5_CHECK(H5Fclose(shard));
            strcpy(path, wanted_path);
            if (!checkpoint_path_exists(path))
                fatal(EXIT_DATA, "checkpoint shard %s is missing (it holds %s)", path,
                      digest->dataset);
            shard = h5_file_open_readonly(path);
        }
        if (!h5_path_exists(shard, digest->dataset))
            fatal(EXIT_DATA, "checkpoint shard %s has no dataset %s", path, digest->dataset);
        hid_t dataset = H5_CHECK(H5Dopen2(shard, digest->dataset, H5P_DEFAULT));
        int ndim;
        int64_t shape[CHECKPOINT_RANK_MAX];
        h5_tensor_shape(dataset, path, digest->dataset, &ndim, shape);
        if (shape[0] != digest->row_end - digest->row_begin)
            fatal(EXIT_DATA, "checkpoint shard %s: %s has %lld rows, the index says %lld", path,
                  digest->dataset, (long long)shape[0],
                  (long long)(digest->row_end - digest->row_begin));
        int64_t row_elements = shape[1] * shape[2]; /* trailing dims beyond the rank are 1 */
        if (row_elements < 1)
            fatal(EXIT_DATA, "checkpoint shard %s: %s has an empty dim", path, digest->dataset);
        int64_t block_rows = verify_block_rows(row_elements);
        size_t needed = (size_t)((shape[0] < block_rows ? shape[0] : block_rows) * row_elements);
        if (needed > buffer_floats) {
            buffer = xrealloc(buffer, needed * sizeof(float));
            buffer_floats = needed;
        }
        uint32_t crc = dataset_digest(dataset, shape[0], row_elements, buffer);
        H5_CHECK(H5Dclose(dataset));
        if (crc != digest->crc32c)
            fatal(EXIT_DATA, "checkpoint shard %s: %s fails its CRC32C check (recorded %08x, "
                  "read %08x): the file is corrupt", path, digest->dataset,
                  (unsigned)digest->crc32c, (unsigned)crc);
    }
    if (shard >= 0)
        H5_CHECK(H5Fclose(shard));
    free(buffer);
}

CheckpointStats checkpoint_load_sharded(Comm *comm, const char *dir,
                                        const CheckpointTensor *tensors, int n_tensors,
                                        const CheckpointRows *rows, unsigned group_mask,
                                        const CheckpointIo *io)
{
    const double started = timer_seconds();
    char step_dir[CHECKPOINT_PATH_MAX], index_path[CHECKPOINT_PATH_MAX];
    checkpoint_tensors_validate(tensors, n_tensors);
    checkpoint_resolve_step_dir(dir, step_dir, sizeof step_dir);
    hid_t index = checkpoint_index_open(step_dir, index_path, sizeof index_path);

    size_t largest = 1;
    for (int i = 0; i < n_tensors; i++) {
        const int64_t wanted = rows[i].row_end - rows[i].row_begin;
        if (wanted <= 0)
            continue;
        if (rows[i].row_begin < 0 || rows[i].row_end > tensors[i].shape[0])
            fatal(EXIT_DATA, "rows %lld..%lld of %s asked for, which has %lld",
                  (long long)rows[i].row_begin, (long long)rows[i].row_end, tensors[i].name,
                  (long long)tensors[i].shape[0]);
        const size_t elements =
            (size_t)wanted * (size_t)checkpoint_tensor_row_elements(&tensors[i]);
        largest = elements > largest ? elements : largest;
    }
    for (int group = 0; group < CKPT_GROUPS; group++) {
        if (!(group_mask & (1u << group)))
            continue;
        if (!h5_path_exists(index, checkpoint_group_path(group)))
            fatal(EXIT_DATA, "checkpoint %s has no %s group (it was saved without it)",
                  index_path, checkpoint_group_path(group));
        for (int i = 0; i < n_tensors; i++)
            if (rows[i].row_end > rows[i].row_begin)
                tensor_shape_check(index, index_path, group, &tensors[i]);
    }

    CheckpointDigest *digests;
    int n_digests = checkpoint_digests_read(index, index_path, &digests);
    for (int group = 0; group < CKPT_GROUPS; group++)
        if (group_mask & (1u << group))
            for (int i = 0; i < n_tensors; i++)
                if (rows[i].row_end > rows[i].row_begin)
                    tensor_rows_check(index_path, group, &tensors[i], digests, n_digests);
    shard_datasets_verify(step_dir, digests, n_digests, group_mask, tensors, n_tensors, rows);
    checkpoint_digests_free(digests, n_digests);

    /* the shards are named relative to index.h5; say where that is, whatever the cwd */
    hid_t access_plist = H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS));
    H5_CHECK(H5Pset_virtual_prefix(access_plist, step_dir));
    float *values = xmalloc(largest * sizeof *values);
    char path[CHECKPOINT_PATH_MAX];
    int64_t bytes = 0;
    for (int group = 0; group < CKPT_GROUPS; group++) {
        if (!(group_mask & (1u << group)))
            continue;
        for (int i = 0; i < n_tensors; i++) {
            const int64_t wanted = rows[i].row_end - rows[i].row_begin;
            if (wanted <= 0)
                continue;
            const size_t elements =
                (size_t)wanted * (size_t)checkpoint_tensor_row_elements(&tensors[i]);
            checkpoint_dataset_path(group, tensors[i].name, path, sizeof path);
            hid_t dataset = H5_CHECK(H5Dopen2(index, path, access_plist));
            h5_tensor_read_rows(dataset, rows[i].row_begin, rows[i].row_end, values);
            H5_CHECK(H5Dclose(dataset));
            io->write(io->context, group, i, values, elements);
            bytes += (int64_t)(elements * sizeof(float));
        }
    }
    free(values);
    H5_CHECK(H5Pclose(access_plist));
    H5_CHECK(H5Fclose(index));
    CheckpointStats stats = {.bytes = (uint64_t)bytes, .shards = 0};
    if (comm) {
        int64_t total = 0;
        comm_allreduce_sum(comm, &bytes, &total, 1, COMM_INT64, COMM_KIND_OTHER);
        stats.bytes = (uint64_t)total;
    }
    stats.seconds = timer_seconds() - started;
    return stats;
}

void checkpoint_load(const char *dir, const CheckpointTensor *tensors, int n_tensors,
                     float *const data[CKPT_GROUPS])
{
    CheckpointRows *rows = checkpoint_whole_rows(tensors, n_tensors);
    const unsigned group_mask = checkpoint_groups_of((const float *const *)data);
    CheckpointFlatBuffers buffers = {tensors, data};
    const CheckpointIo io = checkpoint_flat_io(&buffers);
    checkpoint_load_sharded(NULL, dir, tensors, n_tensors, rows, group_mask, &io);
    free(rows);
}

unsigned checkpoint_saved_groups(const char *dir)
{
    char step_dir[CHECKPOINT_PATH_MAX], index_path[CHECKPOINT_PATH_MAX];
    checkpoint_resolve_step_dir(dir, step_dir, sizeof step_dir);
    hid_t index = checkpoint_index_open(step_dir, index_path, sizeof index_path);
    unsigned mask = 0;
    for (int group = 0; group < CKPT_GROUPS; group++)
        if (h5_path_exists(index, checkpoint_group_path(group)))
            mask |= 1u << group;
    H5_CHECK(H5Fclose(index));
    return mask;
}
