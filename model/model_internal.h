/* model/model_internal.h — the Model's state, shared by the files of model/ that use it
 * (model.c: lifetime and the one-chunk case; chunk.c: the walk over a span of sublayers;
 * model_sites.c: the routing weights' views and read access to the routing).
 * Nothing outside model/ includes this; the public view is model/model.h and chunk.h.
 */
#ifndef FATHOM_MODEL_MODEL_INTERNAL_H
#define FATHOM_MODEL_MODEL_INTERNAL_H

#include <stddef.h>

#include "model/activations.h"
#include "model/chunk.h"
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
    Activation **conv_params;       /* [n_slots] model.route_streams.{n}.conv (msar) */
    float **conv_grads;
    Activation *route_null;         /* [d] (delta) */
    float *grad_route_null;
    ModelScratch scratch;           /* per rank, shared by every chunk (activations.h) */
    /* the one-chunk case of model.h (model_forward / model_backward): the whole network as
     * one span, with its stash and store, made at the first forward */
    ChunkSpan whole;
    Stash whole_stash;
    SummaryStore whole_store;
    bool whole_ready;
    Stash *lent_stash;              /* model_lend_stash: the pipeline's, used instead */
    SummaryStore *lent_store;
};

/* model_sites.c: the routing weights' views (after the parameters are allocated) and
 * their release. */
void model_routing_resolve(Model *model);
void model_routing_free(Model *model);

#endif
