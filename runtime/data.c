/* runtime/data.c — windows, training order and microbatches over a token stream (DESIGN 4).
 *
 * The stream is either the synthetic corpus, generated whole when the set is opened, or the
 * shards (data_shards.c), read lazily; everything above the stream is the same code.
 */
#include "runtime/data.h"

#include "runtime/error.h"
#include "runtime/rng.h"
#include "runtime/synthetic.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Synthetic corpus sizes: large enough to hold many windows at any seq_len. */
enum {
    SYNTHETIC_TRAIN_TOKENS = 1 << 20,
    SYNTHETIC_VALIDATION_TOKENS = 1 << 16,
    SYNTHETIC_TRAIN_MIN_WINDOWS = 256,
    SYNTHETIC_VALIDATION_MIN_WINDOWS = 16,
};

/* Rounds of the Feistel network behind the training order; four rounds of a good round
 * function already give a pseudo-random permutation (Luby-Rackoff). */
enum { ORDER_ROUNDS = 4 };

struct DataSet {
    char origin[CONFIG_PATH_MAX + 64]; /* names the set in messages */
    int window_tokens;                 /* T + 1 */
    uint64_t window_count;
    uint64_t seed;
    uint32_t eot_id;
    uint32_t *corpus;      /* synthetic source: the whole token stream */
    ShardStream *shards;   /* shard source */
    uint32_t *window;      /* one window, for data_read_microbatch */
};

static int data_window_tokens_of(const Config *config)
{
    if (config->train.seq_len < 1)
        fatal(EXIT_CONFIG, "train.seq_len = %d must be at least 1", config->train.seq_len);
    return config->train.seq_len + 1;
}

/* Cuts the stream of `token_count` tokens into windows; too short a stream is a data error. */
static DataSet *data_create(const Config *config, const char *origin, uint64_t token_count)
{
    DataSet *set = xcalloc(1, sizeof *set);
    snprintf(set->origin, sizeof set->origin, "%s", origin);
    set->window_tokens = data_window_tokens_of(config);
    set->window_count = token_count / (uint64_t)set->window_tokens;
    set->seed = config->seed;
    set->window = xmalloc((size_t)set->window_tokens * sizeof *set->window);
    return set;
}

static DataSet *data_open_synthetic(const Config *config, SyntheticSplit split)
{
    if (config->model.vocab_size < SYNTHETIC_VOCAB_SIZE)
        fatal(EXIT_CONFIG, "model.vocab_size = %d is too small for data.source = synthetic, "
              "which uses byte tokens 0..255 (vocab_size >= %d)", config->model.vocab_size,
              SYNTHETIC_VOCAB_SIZE);
    uint64_t window_tokens = (uint64_t)data_window_tokens_of(config);
    uint64_t tokens = split == SYNTHETIC_TRAIN ? SYNTHETIC_TRAIN_TOKENS
                                               : SYNTHETIC_VALIDATION_TOKENS;
    uint64_t min_windows = split == SYNTHETIC_TRAIN ? SYNTHETIC_TRAIN_MIN_WINDOWS
                                                    : SYNTHETIC_VALIDATION_MIN_WINDOWS;
    if (tokens < min_windows * window_tokens)
        tokens = min_windows * window_tokens;
    DataSet *set = data_create(config, split == SYNTHETIC_TRAIN
                                           ? "the synthetic training corpus"
                                           : "the synthetic validation corpus", tokens);
    set->corpus = xmalloc(tokens * sizeof *set->corpus);
    synthetic_generate(config->seed, split, set->corpus, tokens);
    set->eot_id = SYNTHETIC_EOT_ID;
    return set;
}

static DataSet *data_open_shards(const Config *config, const char *spec, const char *key)
{
    int window_tokens = data_window_tokens_of(config);
    ShardStream *shards = shards_open(spec, key, config->model.vocab_size);
    uint64_t tokens = shards_token_count(shards);
    if (tokens < (uint64_t)window_tokens) {
        const char *where = shards_file_count(shards) == 1 ? shards_file_path(shards, 0) : spec;
        fatal(EXIT_DATA, "%s: %s holds %llu tokens, fewer than one window of train.seq_len + 1 "
              "= %d tokens", key, where, (unsigned long long)tokens, window_tokens);
    }
    char origin[CONFIG_PATH_MAX + 64];
    snprintf(origin, sizeof origin, "%s '%s'", key, spec);
    DataSet *set = data_create(config, origin, tokens);
    set->shards = shards;
    set->eot_id = shards_eot_id(shards);
    return set;
}

/* The largest vocab_size attribute of the shards of `spec`. */
static int64_t shards_spec_vocab_size(const char *spec, const char *key)
{
    ShardStream *shards = shards_open(spec, key, INT_MAX); /* INT_MAX: no vocab mismatch */
    const int64_t vocab_size = shards_vocab_size(shards);
    shards_close(shards);
    return vocab_size;
}

void data_resolve_vocab_size(Config *config)
{
    if (config->model.vocab_size != CONFIG_AUTO)
        return;
    if (config->data.source == DATA_SYNTHETIC) {
        config->model.vocab_size = SYNTHETIC_VOCAB_SIZE;
        return;
    }
    if (!config->data.train[0])
        fatal(EXIT_CONFIG, "model.vocab_size: auto reads the vocab_size of the shards of "
              "data.train, which is empty");
    int64_t vocab_size = shards_spec_vocab_size(config->data.train, "data.train");
    if (config->data.val[0]) {
        const int64_t val = shards_spec_vocab_size(config->data.val, "data.val");
        vocab_size = val > vocab_size ? val : vocab_size;
    }
    if (vocab_size < 1 || vocab_size > INT_MAX)
        fatal(EXIT_DATA, "model.vocab_size: auto found vocab_size %lld in the shards of %s, "
              "outside [1, %d]", (long long)vocab_size, config->data.train, INT_MAX);
    config->model.vocab_size = (int)vocab_size;
}

DataSet *data_open_train(const Config *config)
{
    if (config->data.source == DATA_SYNTHETIC)
        return data_open_synthetic(config, SYNTHETIC_TRAIN);
    if (!config->data.train[0])
        fatal(EXIT_CONFIG, "data.train is empty; data.source = shards needs a file, directory "
              "or glob of token shards");
    return data_open_shards(config, config->data.train, "data.train");
}

DataSet *data_open_eval(const Config *config, const char *spec)
{
    if (spec)
        return data_open_shards(config, spec, "--data");
    if (config->data.source == DATA_SYNTHETIC)
        return data_open_synthetic(config, SYNTHETIC_VALIDATION);
    if (!config->data.val[0])
        fatal(EXIT_CONFIG, "data.val is empty; evaluating data.source = shards needs a file, "
              "directory or glob of validation shards");
    return data_open_shards(config, config->data.val, "data.val");
}

void data_close(DataSet *set)
{
    if (!set)
        return;
    shards_close(set->shards);
    free(set->corpus);
    free(set->window);
    free(set);
}

uint64_t data_window_count(const DataSet *set) { return set->window_count; }
int data_window_tokens(const DataSet *set) { return set->window_tokens; }
uint32_t data_eot_id(const DataSet *set) { return set->eot_id; }

void data_read_window(DataSet *set, uint64_t index, uint32_t *window)
{
    if (index >= set->window_count)
        fatal(EXIT_DATA, "window %llu of %s does not exist: it has %llu windows",
              (unsigned long long)index, set->origin, (unsigned long long)set->window_count);
    uint64_t first = index * (uint64_t)set->window_tokens;
    if (set->corpus)
        memcpy(window, set->corpus + first, (size_t)set->window_tokens * sizeof *window);
    else
        shards_read(set->shards, first, (uint64_t)set->window_tokens, window);
}

/* The window at position `index` of epoch `epoch`: a Feistel network over the smallest
 * domain of 4^k >= count values, walked again while it lands outside [0, count) (cycle
 * walking keeps it a bijection of [0, count); fewer than 4 steps on average). It needs no
 * table, so any sample is computed on its own. */
static uint64_t data_permute_window(uint64_t index, uint64_t count, uint64_t seed,
                                    uint64_t epoch)
{
    uint64_t order_stream = rng_stream_of_name("data.order");
    int half_bits = 1;
    while (half_bits < 32 && (1ull << (2 * half_bits)) < count)
        half_bits++;
    uint64_t mask = (1ull << half_bits) - 1;
    uint64_t value = index;
    do {
        uint64_t left = value >> half_bits, right = value & mask;
        for (int round = 0; round < ORDER_ROUNDS; round++) {
            uint64_t mixed = rng_bits(seed, order_stream + epoch * ORDER_ROUNDS + round, right);
            uint64_t next_right = left ^ (mixed & mask);
            left = right;
            right = next_right;
        }
        value = (left << half_bits) | right;
    } while (value >= count);
    return value;
}

void data_read_sample(DataSet *set, uint64_t sample, uint32_t *window)
{
    uint64_t epoch = sample / set->window_count, position = sample % set->window_count;
    data_read_window(set, data_permute_window(position, set->window_count, set->seed, epoch),
                     window);
}

void data_read_microbatch(DataSet *set, uint64_t consumed_samples, int global_batch_size,
                          int dp_rank, int dp_size, int microbatch, int microbatch_size,
                          uint32_t *inputs, uint32_t *targets)
{
    if (dp_size < 1 || microbatch_size < 1 || global_batch_size < 1 ||
        global_batch_size % (dp_size * microbatch_size) != 0)
        fatal(EXIT_CONFIG, "train.global_batch_size = %d must be a multiple of "
              "train.microbatch_size = %d times parallel.dp = %d", global_batch_size,
              microbatch_size, dp_size);
    int per_rank = global_batch_size / dp_size;
    if (dp_rank < 0 || dp_rank >= dp_size || microbatch < 0 ||
        microbatch >= per_rank / microbatch_size)
        fatal(EXIT_CONFIG, "microbatch %d of dp rank %d does not exist: parallel.dp = %d and "
              "%d microbatches per rank", microbatch, dp_rank, dp_size,
              per_rank / microbatch_size);
    int seq_len = set->window_tokens - 1;
    uint64_t first = consumed_samples + (uint64_t)dp_rank * (uint64_t)per_rank +
                     (uint64_t)microbatch * (uint64_t)microbatch_size;
    for (int b = 0; b < microbatch_size; b++) {
        data_read_sample(set, first + (uint64_t)b, set->window);
        memcpy(inputs + (size_t)b * seq_len, set->window, (size_t)seq_len * sizeof *inputs);
        memcpy(targets + (size_t)b * seq_len, set->window + 1,
               (size_t)seq_len * sizeof *targets);
    }
}
