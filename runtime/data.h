/* runtime/data.h — training and evaluation windows of tokens (DESIGN 4).
 *
 * A DataSet is a token stream cut into non-overlapping windows of T + 1 tokens
 * (T = train.seq_len); the tail that does not fill a window is dropped. The stream is either
 * the concatenation of HDF5 token shards in sorted path order (a window may span two files)
 * or the synthetic corpus generated from the seed (runtime/synthetic.h). Both serve windows
 * through the same code.
 *
 * Order. Training reads global samples 0, 1, 2, ... forever: sample s is window
 * permute(s mod N) of epoch s / N, where permute is a bijection of [0, N) that depends only
 * on (seed, epoch). It is computed per sample, with no state, so reading sample s gives the
 * same window whether or not the samples before it were read: a run that resumes at
 * consumed_samples continues the exact sequence, under any dp. Evaluation reads window i in
 * file order.
 *
 * Tokens are uint32. Every token read from a shard is checked against model.vocab_size.
 * Errors in the data (missing, unreadable or inconsistent shards) end the process through
 * fatal(EXIT_DATA, ...) naming the file; errors in the config through fatal(EXIT_CONFIG, ...)
 * naming the key.
 *
 * Memory: a DataSet owns everything it holds (the synthetic corpus, or one open shard at a
 * time and the list of shard paths); the caller owns every window and batch buffer. A
 * DataSet is not thread-safe: one per rank, used from one thread.
 */
#ifndef FATHOM_RUNTIME_DATA_H
#define FATHOM_RUNTIME_DATA_H

#include <stdint.h>

#include "runtime/config.h"

typedef struct DataSet DataSet;

/* `model.vocab_size: auto` (CONFIG_AUTO) becomes a number: with data.source shards the
 * largest vocab_size attribute of the shards of data.train and data.val (each file is
 * checked as shards_open checks it), with synthetic data 256 (the bytes). Any other value is
 * left as it is. Call it once after config_load, before the config is used or saved. */
void data_resolve_vocab_size(Config *config);

/* Opens the training set of `config`: data.source (synthetic or shards), data.train (file,
 * directory of *.h5, or glob), model.vocab_size, train.seq_len, seed. */
DataSet *data_open_train(const Config *config);
/* Opens an evaluation set. `spec` is a file, directory or glob of shards; NULL means
 * data.val, or for data.source = synthetic the synthetic validation stream. */
DataSet *data_open_eval(const Config *config, const char *spec);
void data_close(DataSet *set);

uint64_t data_window_count(const DataSet *set);
/* T + 1: the tokens of one window. */
int data_window_tokens(const DataSet *set);
uint32_t data_eot_id(const DataSet *set);

/* Training order: writes the T + 1 tokens of the window holding global sample `sample`. */
void data_read_sample(DataSet *set, uint64_t sample, uint32_t *window);
/* Evaluation order: writes the T + 1 tokens of window `index` (< data_window_count). */
void data_read_window(DataSet *set, uint64_t index, uint32_t *window);

/* One microbatch of this rank. The step's global batch covers the global samples
 * [consumed_samples, consumed_samples + global_batch_size); dp rank r holds the contiguous
 * slice r of dp_size equal slices, cut into microbatches of `microbatch_size` samples.
 * For sample b of microbatch `microbatch`: inputs[b, :] = window[0 .. T-1] and
 * targets[b, :] = window[1 .. T]. inputs and targets: [microbatch_size, T] uint32. */
void data_read_microbatch(DataSet *set, uint64_t consumed_samples, int global_batch_size,
                          int dp_rank, int dp_size, int microbatch, int microbatch_size,
                          uint32_t *inputs, uint32_t *targets);

/* ---- Token shards (data_shards.c), the stream behind a shard DataSet ----
 *
 * shards_open lists the files of `spec` (a file; a directory: every *.h5 inside; or a glob;
 * sorted by path), checks each one (HDF5, a 1-D unsigned 32-bit /tokens, vocab_size and
 * eot_id attributes, vocab_size <= model_vocab_size, one eot_id across files) and keeps
 * only the path and the length of each; files are opened again when read. `key` names the
 * config key the spec came from ("data.train", "data.val", "--data") in messages. */
typedef struct ShardStream ShardStream;

ShardStream *shards_open(const char *spec, const char *key, int model_vocab_size);
void shards_close(ShardStream *stream);
uint64_t shards_token_count(const ShardStream *stream);
uint32_t shards_eot_id(const ShardStream *stream);
/* The largest vocab_size attribute of the stream's files. */
int64_t shards_vocab_size(const ShardStream *stream);
int shards_file_count(const ShardStream *stream);
const char *shards_file_path(const ShardStream *stream, int file);
/* Writes tokens [first, first + count) of the concatenated stream, reading by hyperslab.
 * A token >= model_vocab_size is fatal(EXIT_DATA, ...) naming the file and position. */
void shards_read(ShardStream *stream, uint64_t first, uint64_t count, uint32_t *tokens);

#endif
