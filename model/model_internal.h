/* model/model_internal.h — the Model's state, shared by the files of model/ that walk it
 * (model.c: lifetime and the standard residual; model_routed.c: attention over depth).
 * Nothing outside model/ includes this; the public view is model/model.h.
 */
#ifndef FATHOM_MODEL_MODEL_INTERNAL_H
#define FATHOM_MODEL_MODEL_INTERNAL_H

#include <stddef.h>

#include "model/activations.h"
#include "model/layer.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/residual.h"
#include "model/route_site.h"

struct Model {
    const Backend *backend;
    ModelConfig config;
    ParamTable table;
    float *params, *grads;          /* flat fp32 [table.total]: master weights, gradients */
    Activation *compute;            /* flat [table.total]: what the ops read (DESIGN 3); the
                                       params themselves when activations are fp32 */
    LayerWeights *layer_params;     /* [L] views into compute */
    LayerGrads *layer_grads;        /* [L] views into grads */
    Activation *embedding;
    float *grad_embedding;
    HeadWeights head_params;
    HeadGrads head_grads;
    float *rope_cos, *rope_sin;     /* [T, head_dim/2] */
    /* attention over depth (DESIGN 2.1, 2.2); all empty when plan.mode is standard */
    ResidualConfig residual;
    ResidualPlan plan;
    SiteWeights *site_params;       /* [n_sites] views into compute (and params) */
    SiteGrads *site_grads;          /* [n_sites] views into grads */
    float *site_alpha;              /* [n_sites] host copies of alpha for the Route op (delta) */
    Activation **conv_params;       /* [n_slots] model.route_streams.{n}.conv (msar) */
    float **conv_grads;
    Activation *route_null;         /* [d] (delta) */
    float *grad_route_null;
    Activations act;
    int last_batch;                 /* B of the last forward; 0 before the first */
    float last_z_loss;
};

/* Sublayer j: layer j/2's attention (j even) or MLP (j odd), x -> out (model/layer.h). */
void model_sublayer_forward(Model *model, const LayerContext *context, int j,
                            const Activation *x, Activation *out);
/* dx += J_j^T dout; dx may be dout. */
void model_sublayer_backward(Model *model, const LayerContext *context, int j,
                             const Activation *x, const Activation *dout, Activation *dx);

/* model_routed.c: the routing weights' views (after the parameters are allocated) and
 * their release. */
void model_routing_resolve(Model *model);
void model_routing_free(Model *model);
/* The routed forward over rows = B * T tokens; returns the final norm's input. */
const Activation *model_routed_forward(Model *model, const LayerContext *context,
                                      size_t rows);
/* The routed backward from the loss to the embedding; adds loss_scale times the gradient. */
void model_routed_backward(Model *model, const LayerContext *context, float loss_scale,
                           size_t rows);

#endif
