/* model/init.h — parameter initialisation (DESIGN 2).
 *
 * Matrices and embeddings (embed_tokens, an untied lm_head) draw N(0, init_std^2); norm
 * weights are ones; routing weights (DESIGN 2.1-2.3) take their identity values, told
 * apart by the name's last part: query, alpha, route_null and mix_proj 0, key_norm 1,
 * mix_bias -ln(m-1), stream conv tap 0 = 1 and its other taps 0. Element `index` of a
 * tensor is a pure function of (seed, the tensor's DESIGN 2.3 name, index) through
 * runtime/rng: a tensor gets the same values whatever other tensors the model has, and a
 * rank that holds rows r0..r1 of a tensor can initialise just that slice and get the same
 * numbers as a single process.
 *
 * Everything here writes host memory that the caller owns.
 */
#ifndef FATHOM_MODEL_INIT_H
#define FATHOM_MODEL_INIT_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"

/* values[i] = the initial value of element first + i of `entry`, i < n. */
void init_fill_param_range(float *values, const ParamEntry *entry, size_t first, size_t n,
                           uint64_t seed, double init_std);

/* The whole tensor: values [entry->count]. */
void init_fill_param(float *values, const ParamEntry *entry, uint64_t seed, double init_std);

#endif
