/* model/layer.h — the two sublayers of a decoder layer, forward and backward (DESIGN 2).
 *
 *   attention:  n = RMSNorm(x; input_layernorm)
 *               f = o_proj(Attn(RoPE(qk_norm(q_proj(n))), RoPE(qk_norm(k_proj(n))), v_proj(n)))
 *               causal, grouped KV heads; qk_norm is per head over head_dim (Qwen3 only)
 *   MLP:        n = RMSNorm(x; post_attention_layernorm)
 *               f = down_proj(silu(gate_proj(n)) * up_proj(n))
 *
 * A sublayer maps its input x [B*T, d] to its output f [B*T, d]; it does not add the residual.
 * The caller chooses what x is and what becomes of f (DESIGN 2: x is the stream h and
 * h' = h + f; DESIGN 2.1 will put a routing site in front). The forward keeps its
 * intermediates in a LayerActivations; x itself is not copied, so the caller keeps it
 * unchanged until the backward.
 *
 * Backward: dx += J^T dout or dx = J^T dout (a GradMode, runtime/backend.h), and every
 * weight gradient += its contribution. dx may be the same buffer as dout (dout is consumed
 * before dx is touched), which is how the standard residual folds the identity path in for
 * free (GRAD_ADD).
 * Intermediate gradients use the ActivationScratch; the first op into each writes it
 * (GRAD_WRITE), so none is zeroed.
 */
#ifndef FATHOM_MODEL_LAYER_H
#define FATHOM_MODEL_LAYER_H

#include "model/activations.h"
#include "model/params.h"
#include "model/unit_views.h"
#include "runtime/backend.h"
#include "runtime/config.h"

/* Pointers to one layer's tensors: LayerWeights into the compute copy of the parameters
 * (what the ops read: the backend's activation dtype), LayerGrads into the fp32 gradients
 * (same layout). q_norm and k_norm are NULL without qk_norm. */
typedef struct {
    Activation *input_layernorm;          /* [d] */
    Activation *q_proj, *k_proj, *v_proj; /* [q_dim, d], [kv_dim, d], [kv_dim, d] */
    Activation *o_proj;                   /* [d, q_dim] */
    Activation *q_norm, *k_norm;          /* [head_dim] */
    Activation *post_attention_layernorm; /* [d] */
    Activation *gate_proj, *up_proj;      /* [F, d] */
    Activation *down_proj;                /* [d, F] */
} LayerWeights;

typedef struct {
    float *input_layernorm;
    float *q_proj, *k_proj, *v_proj;
    float *o_proj;
    float *q_norm, *k_norm;
    float *post_attention_layernorm;
    float *gate_proj, *up_proj;
    float *down_proj;
    /* How the projections' gradients (q, k, v, o, gate, up, down) enter their buffers:
     * GRAD_WRITE when none of them holds a contribution since the gradients were cleared
     * (their buffers are not zeroed then: runtime/fsdp.h, "written first"), else GRAD_ADD.
     * Set by the caller before each layer's backward; the norms' gradients are always
     * added. */
    GradMode matrix_mode;
} LayerGrads;

/* What every sublayer call needs besides its weights and buffers. */
typedef struct {
    const Backend *backend;
    const ModelConfig *config;
    int B, T;                         /* this batch: rows = B * T */
    const float *rope_cos, *rope_sin; /* [T, head_dim/2], backend memory */
    ActivationScratch *scratch;
} LayerContext;

/* Resolve layer `layer`'s tensors by their DESIGN 2.3 names in a flat compute copy laid out
 * as the table (elements of backend->activation_bytes). */
void layer_weights_resolve(LayerWeights *weights, const Backend *backend,
                           const ParamTable *table, Activation *flat, int layer,
                           const ModelConfig *config);

/* Registers layer `layer`'s weight and gradient views in its unit's views (model/unit_views.h),
 * by the same names. */
void layer_views_add(UnitViews *views, LayerWeights *weights, LayerGrads *grads,
                     const ParamTable *table, int layer, const ModelConfig *config);

/* A sublayer input that the sublayer's norm forms: x = base + *alpha * route, rounded once
 * and written to x, then normed (runtime/backend.h add_scaled_rmsnorm_forward). The delta
 * form's x_j = p_j + alpha_j * Route (DESIGN 2.1) takes one pass over the row where
 * add_scaled and the norm took two; the bits are the same. Where add is not NULL, the norm's
 * pass adds the sublayer before's output where it goes first (runtime/backend.h GateAdd:
 * into base, the stream p, and the block's partial), as model/chunk.c asks.
 * alpha NULL: x = base + route, add's bits (add_rmsnorm_forward; add NULL too): the standard
 * stream's x_j = x_{j-1} + f_{j-1}.
 * merge not NULL: base, route and alpha are not read; x is the replace form's merge of the
 * open block's partial into phase one's Route (route_merge_rmsnorm_forward), after add's
 * partial = partial_before + f where add is not NULL (its stream NULL).
 * mix not NULL: route is not read; the route is MSAR's mix of the site's streams, made in
 * the norm's pass (stream_mix_rmsnorm_forward), x = base + *alpha * mix. */
typedef struct {
    const Activation *base, *route;
    const float *alpha; /* fp32 [1], backend memory; NULL: a plain add */
    const GateAdd *add; /* NULL: nothing to add first */
    const RouteMerge *merge;
    const StreamMix *mix;
} InputGate;

/* Where a sublayer input's gradient goes on, past dx, one of:
 * - stream: the delta form's site x_j = p_j + alpha_j * Route sends it both to the site's
 *   route (dx) and to the stream p_j: stream += it (runtime/backend.h
 *   rmsnorm_backward_branch). Inside a block the stream's gradient carries the block's
 *   (model/chunk_backward.c).
 * - merge: the replace form's x_j is the merge of the open block's partial into phase one's
 *   Route; the norm's backward goes on through the merge's (runtime/backend.h
 *   route_merge_rmsnorm_backward, x the merge's output). */
typedef struct {
    Activation *stream;
    const RouteMergeGrad *merge;
} GradBranch;

/* The sublayers: out = f(x) [rows, d]; with a gate (not NULL) x is written first, as
 * InputGate says, otherwise read. A backward gives the input's gradient
 * J^T dout: branch NULL, dx += it (GRAD_ADD; dx may be dout: the standard stream) or dx = it
 * (GRAD_WRITE: a fresh buffer, not read); otherwise dx = it, written (dx_mode GRAD_WRITE),
 * and it goes to the branch as GradBranch says. */
void attention_sublayer_forward(const LayerContext *context, const LayerWeights *weights,
                                LayerActivations *saved, Activation *x, const InputGate *gate,
                                Activation *out);
void attention_sublayer_backward(const LayerContext *context, const LayerWeights *weights,
                                 LayerGrads *grads, const LayerActivations *saved,
                                 const Activation *x, const Activation *dout, Activation *dx,
                                 GradMode dx_mode, const GradBranch *branch);

void mlp_sublayer_forward(const LayerContext *context, const LayerWeights *weights,
                          LayerActivations *saved, Activation *x, const InputGate *gate,
                          Activation *out);
void mlp_sublayer_backward(const LayerContext *context, const LayerWeights *weights,
                           LayerGrads *grads, const LayerActivations *saved,
                           const Activation *x, const Activation *dout, Activation *dx,
                           GradMode dx_mode, const GradBranch *branch);

#endif
