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
#include "model/unit_views.h"
#include "runtime/fsdp.h"

struct Model {
    const Backend *backend;
    ModelConfig config;
    ParamTable table;
    /* The parameters: this rank's shards and the gathered units (runtime/fsdp.h). With one
     * rank and every unit held, the local buffers are the flat [table.total] layout. */
    Fsdp *fsdp;
    UnitViews *unit_views;          /* [table.n_units]: the views below, by unit */
    LayerWeights *layer_params;     /* [L] views into their unit's compute copy */
    LayerGrads *layer_grads;        /* [L] views into its fp32 gradients */
    Activation *embedding;
    float *grad_embedding;
    HeadWeights head_params;
    HeadGrads head_grads;
    float *rope_cos, *rope_sin;     /* [T, head_dim/2] */
    /* attention over depth (DESIGN 2.1, 2.2); all empty when plan.mode is standard */
    ResidualConfig residual;
    ResidualPlan plan;
    SiteWeights *site_params;       /* [n_sites] views (alpha, mix_bias: fp32 views) */
    SiteGrads *site_grads;          /* [n_sites] */
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

/* model_sites.c: the routing weights' views, registered in their units' views, and their
 * release. */
void model_routing_resolve(Model *model);
void model_routing_free(Model *model);

/* model_units.c: the parameters' FSDP units (sharding NULL: one rank, every unit), the
 * views aimed at them once where they never move, and their release. */
void model_units_create(Model *model, const ModelSharding *sharding);
void model_units_bind_fixed(Model *model);
void model_units_destroy(Model *model);

/* model_units.c: the unit's full buffers from runtime/fsdp, and the views aimed at them. The
 * chunk walk brackets every use of a unit's weights (or gradients: for_backward) with
 * these; release after a backward hands the gradients to FSDP. */
void model_unit_acquire(Model *model, int unit, bool for_backward);
void model_unit_release(Model *model, int unit, bool gradients);
/* How the backward about to run on the acquired unit enters its projections' gradients:
 * GRAD_WRITE once after each clear (fsdp_gradient_mode), then GRAD_ADD. */
GradMode model_unit_gradient_mode(Model *model, int unit);
void model_unit_prefetch(Model *model, int unit);

#endif
