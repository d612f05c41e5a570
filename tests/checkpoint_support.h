/* tests/checkpoint_support.h — set-up shared by the checkpoint tests (DESIGN 5).
 *
 * Group buffers: one flat float buffer per checkpoint group (CKPT_GROUPS of them, in the
 * order of checkpoint.h), malloc'd here and freed by checkpoint_test_groups_free.
 * Two shards: what two ranks of one stage write for one step, made from the layout pieces
 * (checkpoint_layout.h) without going through checkpoint_save, so a test chooses the row
 * ranges each shard holds.
 */
#ifndef FATHOM_TESTS_CHECKPOINT_SUPPORT_H
#define FATHOM_TESTS_CHECKPOINT_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoints/checkpoint.h"
#include "checkpoints/checkpoint_layout.h"

/* Group g of [elements] values: N(0, 1) from seed 10 * seed + g. */
void checkpoint_test_groups_fill(float *data[CKPT_GROUPS], size_t elements, uint64_t seed);
/* Every group [elements] NaN, so a value a load never writes cannot pass for a right one. */
void checkpoint_test_groups_poison(float *data[CKPT_GROUPS], size_t elements);
void checkpoint_test_groups_free(float *data[CKPT_GROUPS]);

/* Writes <run_dir>/checkpoints/step_<step> of the model group of `full` (laid out as
 * `tensors` say) in two shards, shard s holding rows[s][i] of tensor i, as ranks dp 0 and 1
 * of one stage would; the index lists the first `n_shards_indexed` of them; then commits. */
void checkpoint_test_write_two_shards(const char *run_dir, int64_t step, int n_tensors,
                                      const CheckpointTensor tensors[n_tensors],
                                      const CheckpointRows rows[2][n_tensors], const float *full,
                                      int n_shards_indexed);

/* The bytes of values [n] as lower-case hex (as Python's bytes.hex()) into text, which
 * holds 8 n + 1 characters. */
void checkpoint_test_hex(const float *values, size_t n, char *text);

#endif
