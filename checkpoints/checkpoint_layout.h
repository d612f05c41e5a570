/* checkpoints/checkpoint_layout.h — the on-disk layout and the pieces a save is made of.
 *
 * Used by the checkpoint_*.c files and retention.c; not by callers of checkpoint.h. A save is
 * shard files (one per rank, each holding row ranges of its tensors) -> index.h5 (written by
 * one process, from every shard's row ranges and digests) -> commit. One process does all
 * three today; with several ranks each writes its shard, the digests gather to rank 0, and
 * rank 0 writes the index and commits (DESIGN 5).
 *
 * Paths are at most CHECKPOINT_PATH_MAX bytes; a longer one exits 3 naming it.
 */
#ifndef FATHOM_CHECKPOINTS_CHECKPOINT_LAYOUT_H
#define FATHOM_CHECKPOINTS_CHECKPOINT_LAYOUT_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoints/checkpoint.h"

#define CHECKPOINT_FORMAT "fathom-checkpoint"
#define CHECKPOINT_VERSION 1
#define CHECKPOINT_PATH_MAX 4096
#define CHECKPOINT_DIRECTORY "checkpoints"
#define CHECKPOINT_INDEX_FILE "index.h5"
#define CHECKPOINT_COMMIT_FILE "COMMITTED"
#define CHECKPOINT_LATEST_FILE "latest"
#define CHECKPOINT_TMP_SUFFIX ".tmp"

/* ---- names and paths (checkpoint.c) ---- */

/* out = dir + "/" + name; exits 3 when it does not fit. */
void checkpoint_path_join(char *out, size_t capacity, const char *dir, const char *name);
/* "step_%08lld" */
void checkpoint_step_name(int64_t step, char *name, size_t capacity);
/* "shard_p%d_d%d.h5" */
void checkpoint_shard_name(int stage, int dp_rank, char *name, size_t capacity);
/* Parses "step_<digits>" (is_tmp false) or "step_<digits>.tmp" (is_tmp true). */
bool checkpoint_parse_step_name(const char *name, int64_t *step, bool *is_tmp);
/* The "<dataset path>" of tensor `name` in group g: "/model/<name>". */
void checkpoint_dataset_path(int group, const char *name, char *out, size_t capacity);
/* "[7, 5]", "[3, 4, 5]": shape[0..ndim-1] (ndim 1..3) for messages; truncated to fit. */
#define CHECKPOINT_SHAPE_TEXT_MAX 80
void checkpoint_shape_format(int ndim, const int64_t *shape, char *text, size_t capacity);
/* Exits 3 unless every tensor has a legal, unique name (no '/' or '%', not "." or "..") and
 * rank 1..3 with positive dims. */
void checkpoint_tensors_validate(const CheckpointTensor *tensors, int n_tensors);

/* ---- the file system (checkpoint.c) ---- */

bool checkpoint_path_exists(const char *path);
bool checkpoint_is_directory(const char *path);
bool checkpoint_is_committed(const char *step_dir);
/* mkdir -p; an existing non-directory in the way exits 3 naming it. */
void checkpoint_make_directory(const char *path);
/* fsync a file or directory so its data (a directory: its entries) reach the disk. */
void checkpoint_sync_path(const char *path);
/* Writes text to a new file, fsyncs it. */
void checkpoint_write_text_file(const char *path, const char *text);
/* rm -rf; exits 3 when something cannot be removed. */
void checkpoint_remove_tree(const char *path);
/* The newest committed step directory inside a checkpoints/ directory (see
 * checkpoint_find_latest). */
bool checkpoint_find_latest_in(const char *checkpoints_dir, char *step_dir, size_t capacity);
/* A step directory, a run directory or a checkpoints/ directory -> a committed step
 * directory; none: exit 3. */
void checkpoint_resolve_step_dir(const char *dir, char *step_dir, size_t capacity);

/* ---- shards (checkpoint_save.c) ---- */

/* Writes a shard file: for each group with data[g] and each tensor with rows[i] non-empty,
 * dataset /<group>/<name> of shape [row_end - row_begin, shape[1].., shape[ndim-1]] (the
 * tensor's rank and trailing dims) from data[g] + tensors[i].offset (the first held row).
 * Closes and fsyncs the file. digests[g * n_tensors + i] receives the CRC32C of the
 * dataset's fp32 little-endian bytes. */
void checkpoint_shard_write(const char *path, const CheckpointTensor *tensors, int n_tensors,
                            const CheckpointRows *rows, const float *const data[CKPT_GROUPS],
                            uint32_t *digests);

/* The same through io (checkpoint.h), one tensor at a time, for the groups in group_mask;
 * returns the bytes written. */
uint64_t checkpoint_shard_write_io(const char *path, const CheckpointTensor *tensors,
                                   int n_tensors, const CheckpointRows *rows,
                                   unsigned group_mask, const CheckpointIo *io,
                                   uint32_t *digests);

/* A CheckpointIo over flat host buffers data[g], the held rows of tensor i at
 * data[g] + tensors[i].offset (the single-process save and load). */
typedef struct {
    const CheckpointTensor *tensors;
    float *const *data;
} CheckpointFlatBuffers;
CheckpointIo checkpoint_flat_io(CheckpointFlatBuffers *buffers);
/* The groups with a buffer (bit g: data[g] != NULL), and every row of every tensor
 * (malloc'd): what a single process saves or loads. */
unsigned checkpoint_groups_of(const float *const data[CKPT_GROUPS]);
CheckpointRows *checkpoint_whole_rows(const CheckpointTensor *tensors, int n_tensors);

/* ---- index.h5 (checkpoint_index.c) ---- */

typedef struct {
    const char *file;            /* shard file name, relative to the step directory */
    const CheckpointRows *rows;  /* [n_tensors] */
    const uint32_t *digests;     /* [CKPT_GROUPS * n_tensors], as checkpoint_shard_write */
} CheckpointShard;

/* Writes <step_dir>/index.h5 for the groups in group_mask (bit g: group g saved), then
 * closes and fsyncs it. */
void checkpoint_index_write(const char *step_dir, const CheckpointMeta *meta,
                            const CheckpointTensor *tensors, int n_tensors,
                            unsigned group_mask, const CheckpointShard *shards, int n_shards);

/* COMMITTED holds the step's name, then the size and CRC32C of index.h5 ("index.h5 SIZE
 * CRC\n"), so that a damaged index is refused before HDF5 parses it (HDF5 does not
 * survive every damaged file). These write and check that line; a COMMITTED without it
 * (an older save) is accepted unchecked. */
void checkpoint_commit_text(const char *step_dir, const char *step_name, char *text,
                            size_t capacity);
void checkpoint_index_verify(const char *step_dir, const char *index_path);

/* Opens <step_dir>/index.h5 read-only, after checkpoint_index_verify, and checks format and
 * version; exits 3 otherwise. */
hid_t checkpoint_index_open(const char *step_dir, char *index_path, size_t capacity);

typedef struct {
    char *shard;       /* file name relative to the step directory */
    char *dataset;     /* "/model/<name>" */
    int64_t row_begin, row_end;
    uint32_t crc32c;
} CheckpointDigest;

/* Reads /integrity; *digests is malloc'd, free with checkpoint_digests_free. */
int checkpoint_digests_read(hid_t index, const char *index_path, CheckpointDigest **digests);
void checkpoint_digests_free(CheckpointDigest *digests, int count);

/* ---- commit (checkpoint_save.c) ---- */

/* Publishes checkpoints_dir/step_X.tmp as step_X: COMMITTED, fsync, rename (an existing
 * step_X is swapped out and removed), fsync, then `latest` by temp file + rename. */
void checkpoint_commit(const char *checkpoints_dir, int64_t step);

#endif
