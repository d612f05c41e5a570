/* model/rope_table.h — RoPE frequencies and cos/sin tables (DESIGN 2).
 *
 * inv_freq[i] = 1 / rope_theta^(2i / head_dim), i < head_dim/2, with the optional `llama3`
 * rescaling, computed in fp32 with the same operations, in the same order, as Hugging Face
 * transformers (modeling_rope_utils._compute_llama3_parameters and the models'
 * compute_default_rope_parameters), so a converted model sees the angles it was trained
 * with. The tables are cos/sin of (float)t * inv_freq[i], both [T, head_dim/2] fp32, as the
 * rope ops of runtime/backend.h read them.
 *
 * Host memory, owned by the caller.
 */
#ifndef FATHOM_MODEL_ROPE_TABLE_H
#define FATHOM_MODEL_ROPE_TABLE_H

#include "runtime/config.h"

/* inv_freq [config->head_dim / 2]. Fails with EXIT_CONFIG when head_dim is odd or the
 * llama3 scaling factors are unusable. */
void rope_inverse_frequencies(float *inv_freq, const ModelConfig *config);

/* cos, sin [T, config->head_dim / 2] for positions 0 .. T-1. */
void rope_table_build(float *cos_table, float *sin_table, int T, const ModelConfig *config);

#endif
