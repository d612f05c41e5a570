/* checkpoints/checkpoint.h — sharded HDF5 checkpoints: save, commit, find, load (DESIGN 5).
 *
 * This module knows nothing about transformers: a checkpoint is a list of named fp32 tensors
 * (DESIGN 2.3 names, dots kept) in four groups — model weights, EMA weights, AdamW's two
 * moments — plus the run's metadata. In memory each group is one flat fp32 buffer and a
 * tensor sits at the same element `offset` in every group's buffer; the caller owns the
 * buffers. On disk (DESIGN 5):
 *
 *   <run_dir>/checkpoints/step_00001000/index.h5          the logical view (virtual datasets)
 *                        /step_00001000/shard_p0_d0.h5    the bytes
 *                        /step_00001000/COMMITTED         written last
 *   <run_dir>/checkpoints/latest                          "step_00001000\n"
 *
 * index.h5, root attributes: format "fathom-checkpoint" (string), version 1 (int64), step,
 * consumed_samples, tokens_seen, optimizer_steps (updates applied: the AdamW bias-correction
 * count), skipped_steps (non-finite steps skipped) (int64), rng (uint64, the run's seed),
 * config (string, the
 * resolved YAML), layout_pp, layout_dp, layout_virtual_stages (int64), layout_split (int32
 * array; a null dataspace when the split is even). Groups /model, /ema, /optim/exp_avg,
 * /optim/exp_avg_sq (only those saved) each hold one virtual dataset per tensor, named by
 * the tensor, whose sources are row ranges of same-named datasets in the shard files, named
 * relative to the step directory so a run directory can be moved. /integrity is a table
 * (1-D compound dataset), one record per shard dataset: {shard (string, file name), dataset
 * (string, path in the shard), row_begin, row_end (int64, the tensor rows it holds), crc32c
 * (uint32, of its raw fp32 little-endian bytes, rows after rows)}. A tensor of rank 3 is
 * split by its first dim like any other: its virtual dataset maps [row_begin, row_end) x
 * all x all hyperslabs onto the shards' [rows, shape[1], shape[2]] datasets.
 *
 * Every failure (a library call, a missing or corrupt file, a shape that does not match)
 * exits 3 through fatal() with a message naming the file and the tensor. A save that fails
 * publishes nothing and leaves the previous checkpoint as it was.
 */
#ifndef FATHOM_CHECKPOINTS_CHECKPOINT_H
#define FATHOM_CHECKPOINTS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/comm.h"
#include "runtime/config.h"

/* The highest rank: [m, k_max, d], the MSAR stream convolutions (DESIGN 2.3). */
#define CHECKPOINT_RANK_MAX 3

/* A tensor of rank 1..3 is, for sharding, a matrix: shape[0] rows of "row elements" (the
 * product of the remaining dims) each, row-major. Shards hold row ranges; every dataset, in
 * the shards and in index.h5, keeps the tensor's true rank and trailing dims, so h5py shows
 * an MSAR convolution as [m, k_max, d]. */
typedef struct {
    const char *name;  /* DESIGN 2.3 name, dots kept: "model.layers.0.self_attn.q_proj.weight" */
    int ndim;          /* 1, 2 or 3 */
    int64_t shape[CHECKPOINT_RANK_MAX]; /* shape[ndim..] unused (ignored, whatever they hold) */
    size_t offset;     /* element offset of the tensor in each group's flat buffer */
} CheckpointTensor;

/* Elements of one row: shape[1] * .. * shape[ndim-1]; 1 for a rank-1 tensor. */
int64_t checkpoint_tensor_row_elements(const CheckpointTensor *tensor);

enum { CKPT_GROUP_MODEL, CKPT_GROUP_EMA, CKPT_GROUP_EXP_AVG, CKPT_GROUP_EXP_AVG_SQ, CKPT_GROUPS };

/* "/model", "/ema", "/optim/exp_avg", "/optim/exp_avg_sq" */
const char *checkpoint_group_path(int group);

/* Rows [row_begin, row_end) of a tensor (along its first dim); empty: none. */
typedef struct {
    int64_t row_begin, row_end;
} CheckpointRows;

typedef struct {
    int64_t step, consumed_samples, tokens_seen;
    int64_t optimizer_steps, skipped_steps;
    uint64_t rng_seed;              /* the run's seed (attribute `rng`) */
    const char *config_yaml;        /* resolved config text (attribute `config`) */
    int pp, dp, virtual_stages;     /* the layout that wrote the checkpoint */
    int n_layer_split;              /* 0: layers split evenly */
    int layer_split[CONFIG_SPLIT_MAX];
} CheckpointMeta;

/* Writes <run_dir>/checkpoints/step_%08lld/ (creating run_dir/checkpoints if needed) through
 * step_%08lld.tmp/, then renames, then points `latest` at it. `data[g]` is the flat buffer of
 * group g; NULL skips the group (e.g. no EMA). An existing directory of the same step is
 * replaced atomically. Single process: one shard, shard_p0_d0.h5, holding whole tensors. */
void checkpoint_save(const char *run_dir, const CheckpointMeta *meta,
                     const CheckpointTensor *tensors, int n_tensors,
                     const float *const data[CKPT_GROUPS]);

/* ---- looking inside a checkpoint (checkpoint_inspect.c; `fathom inspect DIR`) ---- */

typedef struct {
    char *name;                          /* the dataset name: the tensor's DESIGN 2.3 name */
    int ndim;
    int64_t shape[CHECKPOINT_RANK_MAX];
    char dtype[16];                      /* "float32", "bfloat16", "float16", "float64" */
    double norm;                         /* L2 norm over every element, in double */
} CheckpointTensorInfo;

/* Every tensor of `group` in the committed checkpoint at step_dir (resolved as
 * checkpoint_read_meta does), in natural name order (layer 2 before layer 10), each read
 * whole through index.h5 for its norm, except those with a shard dataset among skip[0..
 * n_skip-1] (checkpoint_verify_all's findings: a corrupt file may not even read), whose norm
 * is NaN. Returns the count (0 when the group is absent); *infos is malloc'd, free it with
 * checkpoint_tensor_infos_free. */
typedef struct CheckpointCorruption CheckpointCorruption;
int checkpoint_tensor_infos(const char *step_dir, int group, CheckpointTensorInfo **infos,
                            const CheckpointCorruption *skip, int n_skip);
void checkpoint_tensor_infos_free(CheckpointTensorInfo *infos, int count);

struct CheckpointCorruption {
    char *shard;       /* file name, relative to the step directory */
    char *dataset;     /* "/model/<name>" */
    char problem[160]; /* why it fails: "CRC32C recorded 1234abcd, read 5678ef00", ... */
};

/* Checks every record of /integrity, every group: the shard exists, holds the dataset with
 * the recorded rows, and its bytes have the recorded CRC32C. Unlike a load it does not stop
 * at the first failure and never exits for one: returns the number of records checked and
 * fills *bad (malloc'd, *n_bad entries; free with checkpoint_corruptions_free). */
int checkpoint_verify_all(const char *step_dir, CheckpointCorruption **bad, int *n_bad);
void checkpoint_corruptions_free(CheckpointCorruption *bad, int n_bad);

/* The newest committed step directory of run_dir: the one `latest` names if it has
 * COMMITTED, else the highest step_* with COMMITTED. Writes its path into step_dir and
 * returns true; returns false when there is none. */
bool checkpoint_find_latest(const char *run_dir, char *step_dir, size_t capacity);

/* Reads the metadata of a checkpoint. `dir` is a step directory, or a run directory or its
 * checkpoints/ directory (then the latest committed step is used); the step directory used
 * is written into step_dir (NULL: not wanted). meta->config_yaml and *config_yaml point to
 * the same malloc'd text, the caller frees it. */
void checkpoint_read_meta(const char *dir, CheckpointMeta *meta, char **config_yaml,
                          char *step_dir, size_t capacity);

/* Loads tensors into data[g] at their offsets; data[g] NULL: group not wanted. `dir` is
 * resolved as in checkpoint_read_meta and must be committed. First every shard dataset the
 * load reads is checked against its CRC32C in /integrity; then each tensor is read through
 * index.h5. A wanted group absent from the checkpoint, a tensor missing or of another shape,
 * a missing or corrupt shard: exit 3 naming it. Tensors of the checkpoint that are not asked
 * for are ignored. */
void checkpoint_load(const char *dir, const CheckpointTensor *tensors, int n_tensors,
                     float *const data[CKPT_GROUPS]);

/* ---- several ranks: each writes and reads only the rows it holds (DESIGN 5) ---- */

/* Moves one tensor's held rows between a rank's own buffers (backend memory, its layout)
 * and host memory, so that a save or load stages one tensor at a time: host memory stays
 * at one tensor's worth. count = held rows x row elements. */
typedef struct {
    void *context;
    /* host[0 .. count) = the rows of tensor i in group g (a save) */
    void (*read)(void *context, int group, int tensor, float *host, size_t count);
    /* the rows of tensor i in group g = host[0 .. count) (a load) */
    void (*write)(void *context, int group, int tensor, const float *host, size_t count);
} CheckpointIo;

/* Collective over `comm` (NULL: this process alone). tensors lists every tensor of the
 * model (the same list on every rank; offsets unused); rows[i] the rows of tensor i this
 * rank writes (empty: none; ranks' rows of one tensor must not overlap and must cover it).
 * Every rank with rows writes shard_p{stage}_d{dp_rank}.h5 into step_X.tmp; the row ranges
 * and digests gather to rank 0, which writes index.h5 and commits (checkpoint_commit).
 * Groups in group_mask are saved. A failure on any rank ends the job (exit 3 through
 * fatal) before anything is published. Returns, on every rank, the bytes all ranks wrote
 * and the seconds the save took (for the GB/s a run prints). */
typedef struct {
    uint64_t bytes;
    double seconds;
    int shards;
} CheckpointStats;
CheckpointStats checkpoint_save_sharded(Comm *comm, int stage, int dp_rank, const char *run_dir,
                             const CheckpointMeta *meta, const CheckpointTensor *tensors,
                             int n_tensors, const CheckpointRows *rows, unsigned group_mask,
                             const CheckpointIo *io);

/* Collective over `comm` (NULL: alone). Reads, for every tensor with rows[i] non-empty and
 * every group in group_mask, those rows through index.h5 (hyperslabs of the virtual
 * datasets), after checking the tensor's shape and the CRC32C of every shard dataset the
 * rows come from. `dir` is resolved as in checkpoint_read_meta. Any failure exits 3 naming
 * the file and the tensor. Returns the bytes all ranks read and the seconds it took. */
CheckpointStats checkpoint_load_sharded(Comm *comm, const char *dir,
                                        const CheckpointTensor *tensors, int n_tensors,
                                        const CheckpointRows *rows, unsigned group_mask,
                                        const CheckpointIo *io);

/* The groups a committed checkpoint holds, as bits 1 << CKPT_GROUP_* (a step-0 checkpoint
 * made by `fathom convert` holds the model only). */
unsigned checkpoint_saved_groups(const char *dir);

/* Retention (DESIGN 5): keeps the keep_last highest committed steps (0: all), every step that
 * is a multiple of keep_every (0: none), and the one `latest` names; deletes the other step
 * directories, uncommitted ones and stale *.tmp ones included. Call it between saves only. */
void checkpoint_apply_retention(const char *run_dir, int keep_last, int keep_every);

#endif
