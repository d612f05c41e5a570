/* model/model.h — the decoder-only model on one backend: parameters, gradients, forward,
 * backward (DESIGN 2), with the standard residual or attention over depth (DESIGN 2.1, 2.2).
 *
 * A Model owns, in backend memory: the flat fp32 parameters and gradients laid out by its
 * ParamTable (model/params.h), the compute copy of the parameters that the ops read (DESIGN
 * 3: bf16 on cuda; on cpu it is the fp32 parameters themselves), the RoPE tables, and the
 * scratch for up to max_batch sequences of seq_len tokens (model/activations.h lists what
 * is kept and what it costs). It is written only against the op table of runtime/backend.h.
 *
 * The network runs in chunks (model/chunk.h): spans of layers with a payload in and out,
 * each microbatch's saved tensors in a stash the caller holds, which is how the pipeline
 * (pipeline/) keeps several microbatches in flight. model_forward / model_backward below
 * are the one-chunk case: the whole network as one span, with one stash of its own made at
 * the first forward; evaluation, probing and most tests use it.
 *
 *   e = embed_tokens[inputs]                                  [B, T, d]
 *   for each sublayer j = 0..2L-1 (attention, MLP, attention, ...):
 *       stream[j+1] = stream[j] + f_j(stream[j])               (standard residual)
 *   or, with residual.mode attnres / msar (model/residual.h, model/route_site.h):
 *       x_j = site_j(b_0..b_{n-1} [+ the partial b_n^i] | delta: p + alpha_j * ...)
 *       f_j = f_j(x_j) adds into the partial of its block n (delta: also p += f_j)
 *       x_2L = the final site over every block
 *   logits = head(RMSNorm(x_2L)), loss = mean_t (ce_t + z_loss * lse_t^2)
 *
 * Gradients follow the "ADDS into" rule: model_backward adds, model_zero_grads clears, so
 * microbatches accumulate. Tokens and losses cross the host boundary; nothing else does.
 */
#ifndef FATHOM_MODEL_MODEL_H
#define FATHOM_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/loss.h"
#include "model/params.h"
#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/device_comm.h"
#include "runtime/fsdp.h"

typedef struct Model Model;
typedef struct ChunkSpan ChunkSpan;

/* How a rank holds the parameters (DESIGN 3): sharded over its stage's data-parallel group
 * (runtime/fsdp.h), and only the units its chunks read. */
typedef struct {
    DeviceComm *data_parallel;  /* the stage's dp group; NULL: one rank */
    const ChunkSpan *spans;     /* the chunks this rank runs (model/chunk.h); NULL: all */
    int n_spans;
    bool reshard_after_forward; /* fsdp.reshard_after_forward: pool the decoder layers */
    bool forward_only;          /* eval, probe: no gradient buffers (runtime/fsdp.h); a
                                   backward or model_zero_grads is EXIT_CONFIG */
} ModelSharding;

/* Allocates parameters, gradients (backend memory, zeroed) and activations for up to
 * max_batch sequences of seq_len tokens, with the residual of `residual` (NULL: standard);
 * its routing weights join the parameter table (model/params.h). An impossible config or a
 * combination the model cannot build is EXIT_CONFIG (model/residual.h). */
Model *model_create(const Backend *backend, const ModelConfig *config,
                    const ResidualConfig *residual, int max_batch, int seq_len);
/* The same, with the parameters sharded as `sharding` says (NULL: one rank, every unit). */
Model *model_create_sharded(const Backend *backend, const ModelConfig *config,
                            const ResidualConfig *residual, int max_batch, int seq_len,
                            const ModelSharding *sharding);
void model_destroy(Model *model);

const ParamTable *model_param_table(const Model *model);
const ModelConfig *model_config(const Model *model);
const ResidualConfig *model_residual(const Model *model); /* mode standard when none given */
const Backend *model_backend(const Model *model);
/* This rank's parameter shards and gradient accumulators: fp32 backend memory in the local
 * layout of runtime/fsdp.h (fsdp_local_count elements; fsdp_place gives each tensor's
 * place). With one rank and every unit held it is the table's flat [total] layout. */
float *model_params(Model *model);
float *model_grads(Model *model);
/* The shards, their places and the gathers (pipeline/step.h drives a step through it). */
Fsdp *model_fsdp(Model *model);

/* The compute copy of the shards, in the activation dtype, when it is a separate array (the
 * optimizer refreshes it: runtime/optim.h); NULL when it is model_params itself (cpu). */
Activation *model_compute_copy(Model *model);
/* Makes the compute copy equal the parameters again; call it after writing model_params
 * other than through the optimizer (a checkpoint load, a test). No-op on cpu. */
void model_refresh_compute_copy(Model *model);

/* The backend memory the model holds: parameters (fp32 master, fp32 gradients and the
 * compute copy where it is separate) and activations: the scratch and the one-chunk case's
 * stash and store (made or, before the first forward, to be made; model/activations.h). */
void model_memory_bytes(const Model *model, size_t *parameter_bytes, size_t *activation_bytes);

/* DESIGN 2 init (model/init.h): element i of tensor `name` depends only on (seed, name, i),
 * so each rank fills only the rows it holds. Refreshes the compute copy. */
void model_init_params(Model *model, uint64_t seed, double init_std);

/* train.activation_checkpointing (DESIGN 3): with it, a stash keeps each layer's input only
 * and the backward recomputes the layer. Chosen before the first forward (EXIT_CONFIG after). */
void model_set_activation_checkpointing(Model *model, bool enabled);
bool model_activation_checkpointing(const Model *model);

/* Routes every site one at a time (model/route_site.h) instead of the delta form's blocks in
 * two phases (model/route_block.h): the per-site reference the two-phase walk is held to in
 * the tests and what `fathom probe` reads sites from (the two-phase walk of msar keeps no
 * per-site depth weights). The same math; sums may differ in order. Chosen before the first
 * forward and before a pipeline step is made (EXIT_CONFIG after the first forward). */
void model_route_sites_alone(Model *model, bool alone);
/* What the one-chunk case's stash and store take, with or without checkpointing (the memory
 * plan prints both). */
size_t model_whole_stash_bytes(const Model *model, bool checkpointed);

/* From now on the one-chunk case uses `stash` and `store` (a whole-network stash the
 * pipeline holds, with one stage and one chunk) instead of making its own: evaluation
 * during training then takes no second set of activations. The caller keeps them alive. */
void model_lend_stash(Model *model, Stash *stash, SummaryStore *store);

const ResidualPlan *model_plan(const Model *model);
int model_max_batch(const Model *model);

/* Forward on host tokens inputs/targets [B, T] (1 <= B <= max_batch, T = seq_len); keeps
 * what backward needs. A token >= vocab_size is a data error (EXIT_DATA). */
ModelLoss model_forward(Model *model, const uint32_t *inputs, const uint32_t *targets, int B,
                        float z_loss);

/* model_forward for a model_backward(loss_scale) that follows: the head's logits are
 * replaced by their gradient as the loss is read, one pass over them fewer (model/loss.h);
 * the backward gives the same bits as after model_forward. loss_scale 0 is model_forward. */
ModelLoss model_forward_train(Model *model, const uint32_t *inputs, const uint32_t *targets,
                              int B, float z_loss, float loss_scale);

/* Adds d(loss_scale * loss)/d(params) into the gradients (loss = the mean of the last
 * forward). May be called more than once per forward; each call adds again. */
void model_backward(Model *model, float loss_scale);

/* Clears every gradient accumulator (fsdp_step_begin without release counts): the
 * projections' are not zeroed but written by the next backward, and read as zeros if none
 * comes (runtime/fsdp.h, "written first"); model_grads always shows the sum so far. */
void model_zero_grads(Model *model);

/* The logits of the last forward, [B, T, V], converted to fp32 into host_out. Needs the
 * whole batch's logits: it holds when they fit in one chunk (model/loss.h), or after
 * model_keep_all_logits; otherwise EXIT_CONFIG. */
void model_read_logits(const Model *model, float *host_out);
/* B * T of the last forward (0 before the first). */
int model_last_tokens(const Model *model);
/* The head and the loss walk the batch in chunks of at most `rows` tokens from now on
 * (model/loss.h; the default is as many as fit in ACTIVATION_LOGIT_BYTES). Only fewer rows
 * than the default can be asked for (EXIT_CONFIG otherwise): the buffers are already made.
 * Results do not depend on it beyond the order of the head's fp32 gradient sums. */
void model_set_logit_rows(Model *model, int rows);
/* From now on keep the logits of the whole batch ([max_batch * T, V] more backend memory). */
void model_keep_all_logits(Model *model);

/* ---- the routing of the last forward, read only (for `fathom probe` and the tests) ----
 * Sites are numbered 0..2L: site j stands before sublayer j, site 2L before the final norm;
 * mode standard has none. A site or stream out of range, or a read before the first
 * forward, is EXIT_CONFIG. tokens = B * T of the last forward. */
int model_site_count(const Model *model);
/* "model.layers.3.attn_route", "model.layers.3.mlp_route", "model.final_route": the prefix
 * of the site's parameter names (its .query and .key_norm are in model_param_table). */
const char *model_site_name(const Model *model, int site);
int model_site_sources(const Model *model, int site); /* N */
int model_site_heads(const Model *model);             /* H = residual.heads */
int model_site_streams(const Model *model);           /* m for msar, else 1 */
/* The depth weights of `stream` (0 unless msar) at `site`: host_out [N, tokens, H]. A site
 * that keeps none (msar walked in two phases: residual_site_keeps_weights) is EXIT_CONFIG. */
void model_site_weights(const Model *model, int site, int stream, float *host_out);
/* The source buffers the site read, backend pointers [N] to [tokens, d], in Route order
 * (model/residual.h). For msar these are the single-stream sources before expansion. */
void model_site_inputs(const Model *model, int site, const Activation **sources);
/* What the site handed on, x_j (the final site's: the final norm's input): host_out
 * [tokens, d]. A site whose x_j the stash does not keep (msar's replace form walked in two
 * phases, residual_site_keeps_input) is EXIT_CONFIG. */
void model_site_output(const Model *model, int site, float *host_out);

#endif
