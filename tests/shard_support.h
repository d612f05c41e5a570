/* tests/shard_support.h — HDF5 token shards written for the data tests (tests/test_data.c,
 * tests/test_data_errors.c), well-formed or damaged in one chosen way, and the config that
 * reads them (DESIGN 4).
 *
 * A shard is /tokens (1-D, unsigned 32-bit) with the attributes vocab_size and eot_id; the
 * layout below says which of those to get wrong. A counting shard holds consecutive values, so
 * a window read back names the position it came from.
 */
#ifndef FATHOM_TESTS_SHARD_SUPPORT_H
#define FATHOM_TESTS_SHARD_SUPPORT_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/config.h"

/* vocab_size of a counting shard: above every value it holds */
enum { LARGE_VOCAB = 1 << 20 };

/* A config that reads training shards from `train` (a file, a directory or a glob). */
Config config_for_shards(const char *train, int vocab_size, int seq_len, uint64_t seed);

typedef struct {
    hid_t token_type;        /* file type of /tokens; 0 means unsigned 32-bit */
    int two_dimensional;     /* /tokens stored as [count / 2, 2] */
    int omit_tokens, omit_vocab_size;
    int64_t vocab_size, eot_id;
} ShardLayout;

/* A shard at `path` with `count` tokens (NULL when layout.omit_tokens), made as `layout` says. */
void write_shard_with(const char *path, const uint32_t *tokens, size_t count,
                      ShardLayout layout);
/* A well-formed shard holding the stream values first .. first + count - 1. */
void write_counting_shard(const char *path, uint32_t first, size_t count);

#endif
