/* model/model.h — the decoder-only model on one backend: parameters, gradients, forward,
 * backward (DESIGN 2, baseline residual).
 *
 * A Model owns, in backend memory: the flat fp32 parameters and gradients laid out by its
 * ParamTable (model/params.h), the RoPE tables, and the activations for up to max_batch
 * sequences of seq_len tokens (model/activations.h lists what is kept and what it costs).
 * It is written only against the op table of runtime/backend.h.
 *
 *   e = embed_tokens[inputs]                                  [B, T, d]
 *   for each sublayer j = 0..2L-1 (attention, MLP, attention, ...):
 *       stream[j+1] = stream[j] + f_j(stream[j])               (standard residual)
 *   logits = head(RMSNorm(stream[2L])), loss = mean_t (ce_t + z_loss * lse_t^2)
 *
 * Gradients follow the "ADDS into" rule: model_backward adds, model_zero_grads clears, so
 * microbatches accumulate. Tokens and losses cross the host boundary; nothing else does.
 */
#ifndef FATHOM_MODEL_MODEL_H
#define FATHOM_MODEL_MODEL_H

#include <stdint.h>

#include "model/loss.h"
#include "model/params.h"
#include "runtime/backend.h"
#include "runtime/config.h"

typedef struct Model Model;

/* Allocates parameters, gradients (backend memory, zeroed) and activations for up to
 * max_batch sequences of seq_len tokens. Fails with EXIT_CONFIG on an impossible config. */
Model *model_create(const Backend *backend, const ModelConfig *config, int max_batch,
                    int seq_len);
void model_destroy(Model *model);

const ParamTable *model_param_table(const Model *model);
const ModelConfig *model_config(const Model *model);
const Backend *model_backend(const Model *model);
float *model_params(Model *model); /* flat [total] in backend memory */
float *model_grads(Model *model);  /* flat [total], same layout */

/* DESIGN 2 init (model/init.h): element i of tensor `name` depends only on (seed, name, i). */
void model_init_params(Model *model, uint64_t seed, double init_std);

/* Forward on host tokens inputs/targets [B, T] (1 <= B <= max_batch, T = seq_len); keeps
 * what backward needs. A token >= vocab_size is a data error (EXIT_DATA). */
ModelLoss model_forward(Model *model, const uint32_t *inputs, const uint32_t *targets, int B,
                        float z_loss);

/* Adds d(loss_scale * loss)/d(params) into the gradients (loss = the mean of the last
 * forward). May be called more than once per forward; each call adds again. */
void model_backward(Model *model, float loss_scale);

void model_zero_grads(Model *model);

/* Logits of the last forward, [B, T, V], backend memory. */
const float *model_logits(const Model *model);

#endif
