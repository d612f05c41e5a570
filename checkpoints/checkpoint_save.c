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
#include "runtime/timer.h"

/* The digest is of the fp32 little-endian bytes; in memory they are exactly those bytes. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "CRC32C digests assume little-endian");
_Static_assert(CHECKPOINT_RANK_MAX == H5_TENSOR_RANK_MAX, "every tensor rank must be writable");

static void flat_read(void *context, int group, int tensor, float *host, size_t count)
{
    const CheckpointFlatBuffers *buffers = context;
    memcpy(host, buffers->data[group] + buffers->tensors[tensor].offset, count * sizeof *host);
}

static void flat_write(void *context, int group, int tensor, const float *host, size_t count)
{
    const CheckpointFlatBuffers *buffers = context;
    memcpy(buffers->data[group] + buffers->tensors[tensor].offset, host, count * sizeof *host);
}

CheckpointIo checkpoint_flat_io(CheckpointFlatBuffers *buffers)
{
    return (CheckpointIo){buffers, flat_read, flat_write};
}

unsigned checkpoint_groups_of(const float *const data[CKPT_GROUPS])
{
    unsigned mask = 0;
    for (int group = 0; group < CKPT_GROUPS; group++)
        if (data[group])
            mask |= 1u << group;
    return mask;
}

CheckpointRows *checkpoint_whole_rows(const CheckpointTensor *tensors, int n_tensors)
{
    CheckpointRows *rows = xmalloc(sizeof *rows * (size_t)(n_tensors > 0 ? n_tensors : 1));
    for (int i = 0; i < n_tensors; i++)
        rows[i] = (CheckpointRows){0, tensors[i].shape[0]};
    return rows;
}

uint64_t checkpoint_shard_write_io(const char *path, const CheckpointTensor *tensors,
                                   int n_tensors, const CheckpointRows *rows,
                                   unsigned group_mask, const CheckpointIo *io,
                                   uint32_t *digests)
{
    /* one host buffer, the size of the largest tensor this shard holds */
    size_t largest = 1;
    for (int i = 0; i < n_tensors; i++) {
        const int64_t held = rows[i].row_end - rows[i].row_begin;
        const size_t elements = held > 0 ? (size_t)held *
                                           (size_t)checkpoint_tensor_row_elements(&tensors[i])
                                         : 0;
        largest = elements > largest ? elements : largest;
    }
    float *values = xmalloc(largest * sizeof *values);
    hid_t file = h5_file_create(path);
    char dataset[CHECKPOINT_PATH_MAX];
    uint64_t bytes = 0;
    for (int group = 0; group < CKPT_GROUPS; group++) {
        if (!(group_mask & (1u << group)))
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
            io->read(io->context, group, i, values, elements);
            checkpoint_dataset_path(group, tensor->name, dataset, sizeof dataset);
            h5_tensor_write(file, dataset, tensor->ndim, shape, H5T_IEEE_F32LE, values);
            digests[group * n_tensors + i] = crc32c(values, elements * sizeof(float));
            bytes += elements * sizeof(float);
        }
    }
    H5_CHECK(H5Fclose(file));
    checkpoint_sync_path(path);
    free(values);
    return bytes;
}

void checkpoint_shard_write(const char *path, const CheckpointTensor *tensors, int n_tensors,
                            const CheckpointRows *rows, const float *const data[CKPT_GROUPS],
                            uint32_t *digests)
{
    const unsigned group_mask = checkpoint_groups_of((const float *const *)data);
    CheckpointFlatBuffers buffers = {tensors, (float *const *)data};
    const CheckpointIo io = checkpoint_flat_io(&buffers);
    checkpoint_shard_write_io(path, tensors, n_tensors, rows, group_mask, &io, digests);
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

    char commit_text[256];
    checkpoint_commit_text(tmp_dir, name, commit_text, sizeof commit_text);
    checkpoint_path_join(path, sizeof path, tmp_dir, CHECKPOINT_COMMIT_FILE);
    checkpoint_write_text_file(path, commit_text);
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
    /* one process: one shard holding every row of every tensor */
    CheckpointRows *rows = checkpoint_whole_rows(tensors, n_tensors);
    const unsigned group_mask = checkpoint_groups_of((const float *const *)data);
    CheckpointFlatBuffers buffers = {tensors, (float *const *)data};
    const CheckpointIo io = checkpoint_flat_io(&buffers);
    checkpoint_save_sharded(NULL, 0, 0, run_dir, meta, tensors, n_tensors, rows, group_mask,
                            &io);
    free(rows);
}

/* What each rank tells rank 0 after writing its shard, as int64: its stage and dp rank,
 * the bytes it wrote, then per tensor its rows (begin, end) and per group and tensor the
 * digest. */
static size_t report_length(int n_tensors)
{
    return 3 + 2 * (size_t)n_tensors + (size_t)CKPT_GROUPS * (size_t)n_tensors;
}

/* Rank 0: index.h5 over every rank's shard, then the commit. */
static void index_and_commit(const char *checkpoints_dir, const char *tmp_dir,
                             const CheckpointMeta *meta, const CheckpointTensor *tensors,
                             int n_tensors, unsigned group_mask, const int64_t *reports,
                             int n_ranks)
{
    const size_t length = report_length(n_tensors);
    CheckpointShard *shards = xcalloc((size_t)n_ranks, sizeof *shards);
    char (*files)[64] = xcalloc((size_t)n_ranks, sizeof *files);
    CheckpointRows *rows = xcalloc((size_t)n_ranks * (size_t)(n_tensors + 1), sizeof *rows);
    uint32_t *digests = xcalloc((size_t)n_ranks * CKPT_GROUPS * (size_t)(n_tensors + 1),
                                sizeof *digests);
    int n_shards = 0;
    for (int r = 0; r < n_ranks; r++) {
        const int64_t *report = reports + (size_t)r * length;
        CheckpointRows *own_rows = rows + (size_t)n_shards * (size_t)(n_tensors + 1);
        uint32_t *own_digests = digests + (size_t)n_shards * CKPT_GROUPS * (n_tensors + 1);
        bool holds = false;
        for (int i = 0; i < n_tensors; i++) {
            own_rows[i] = (CheckpointRows){report[3 + 2 * i], report[4 + 2 * i]};
            holds |= own_rows[i].row_end > own_rows[i].row_begin;
        }
        if (!holds)
            continue;
        for (int k = 0; k < CKPT_GROUPS * n_tensors; k++)
            own_digests[k] = (uint32_t)report[3 + 2 * n_tensors + k];
        checkpoint_shard_name((int)report[0], (int)report[1], files[n_shards], sizeof files[0]);
        shards[n_shards] = (CheckpointShard){files[n_shards], own_rows, own_digests};
        n_shards++;
    }
    checkpoint_index_write(tmp_dir, meta, tensors, n_tensors, group_mask, shards, n_shards);
    checkpoint_commit(checkpoints_dir, meta->step);
    free(shards);
    free(files);
    free(rows);
    free(digests);
}

CheckpointStats checkpoint_save_sharded(Comm *comm, int stage, int dp_rank, const char *run_dir,
                                        const CheckpointMeta *meta,
                                        const CheckpointTensor *tensors, int n_tensors,
                                        const CheckpointRows *rows, unsigned group_mask,
                                        const CheckpointIo *io)
{
    const double started = timer_seconds();
    const int rank = comm ? comm_rank(comm) : 0, n_ranks = comm ? comm_size(comm) : 1;
    checkpoint_tensors_validate(tensors, n_tensors);
    if (meta->step < 0)
        fatal(EXIT_DATA, "cannot save a checkpoint of step %lld", (long long)meta->step);

    char checkpoints_dir[CHECKPOINT_PATH_MAX], tmp_dir[CHECKPOINT_PATH_MAX];
    char name[64], shard_file[64], shard_path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(checkpoints_dir, sizeof checkpoints_dir, run_dir, CHECKPOINT_DIRECTORY);
    checkpoint_step_name(meta->step, name, sizeof name);
    strcat(name, CHECKPOINT_TMP_SUFFIX);
    checkpoint_path_join(tmp_dir, sizeof tmp_dir, checkpoints_dir, name);
    if (rank == 0) {
        checkpoint_make_directory(checkpoints_dir);
        checkpoint_remove_tree(tmp_dir); /* left by a save of this step that died */
        if (mkdir(tmp_dir, 0777) != 0)
            fatal(EXIT_DATA, "cannot create directory %s: %s", tmp_dir, strerror(errno));
    }
    if (comm)
        comm_barrier(comm);

    const size_t length = report_length(n_tensors);
    int64_t *report = xcalloc(length, sizeof *report);
    uint32_t *digests = xcalloc((size_t)CKPT_GROUPS * (size_t)(n_tensors + 1), sizeof *digests);
    bool holds = false;
    for (int i = 0; i < n_tensors; i++)
        holds |= rows[i].row_end > rows[i].row_begin;
    report[0] = stage;
    report[1] = dp_rank;
    if (holds) {
        checkpoint_shard_name(stage, dp_rank, shard_file, sizeof shard_file);
        checkpoint_path_join(shard_path, sizeof shard_path, tmp_dir, shard_file);
        report[2] = (int64_t)checkpoint_shard_write_io(shard_path, tensors, n_tensors, rows,
                                                       group_mask, io, digests);
    }
    for (int i = 0; i < n_tensors; i++) {
        report[3 + 2 * i] = rows[i].row_begin;
        report[4 + 2 * i] = rows[i].row_end;
    }
    for (int k = 0; k < CKPT_GROUPS * n_tensors; k++)
        report[3 + 2 * n_tensors + k] = digests[k];

    int64_t *reports = xcalloc((size_t)n_ranks * length, sizeof *reports);
    if (comm)
        comm_allgather(comm, report, reports, length, COMM_INT64, COMM_KIND_OTHER);
    else
        memcpy(reports, report, length * sizeof *report);
    CheckpointStats stats = {0};
    for (int r = 0; r < n_ranks; r++) {
        stats.bytes += (uint64_t)reports[(size_t)r * length + 2];
        stats.shards += reports[(size_t)r * length + 2] > 0;
    }
    if (rank == 0)
        index_and_commit(checkpoints_dir, tmp_dir, meta, tensors, n_tensors, group_mask,
                         reports, n_ranks);
    if (comm)
        comm_barrier(comm); /* nobody runs ahead of a checkpoint being published */
    free(report);
    free(reports);
    free(digests);
    stats.seconds = timer_seconds() - started;
    return stats;
}
