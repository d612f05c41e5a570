/* model/route_walk.c — a route walk's lifetime (route_block.h): its flags from the plan and
 * the host arrays of backend pointers its ops take, made when a chunk call begins and freed
 * when it ends. What the walk does with them is route_block.c's. */
#include "model/route_block.h"

#include <stdlib.h>

#include "model/model_internal.h"
#include "runtime/error.h"

void route_walk_begin(RouteWalk *walk, Model *model, Stash *stash, SummaryStore *store,
                      const RouteContext *route, int rows, bool backward)
{
    const ResidualPlan *plan = &model->plan;
    *walk = (RouteWalk){
        .model = model,
        .backend = model->backend,
        .plan = plan,
        .route = route,
        .stash = stash,
        .store = store,
        .rows = rows,
        .d = model->config.d_model,
        .streams = plan->mode == RESIDUAL_MSAR,
        .replace = plan->form == FORM_REPLACE,
        .backward = backward,
        .open_block = -1,
    };
    const size_t sources = (size_t)plan->max_sources + 1;
    const size_t S = plan->sublayers_per_block > 0 ? (size_t)plan->sublayers_per_block : 1;
    walk->sources = xcalloc(sources, sizeof *walk->sources);
    walk->grad_sources = xcalloc(sources, sizeof *walk->grad_sources);
    walk->means = xcalloc(S, sizeof *walk->means);
    walk->lse = xcalloc(S, sizeof *walk->lse);
    walk->results = xcalloc(S, sizeof *walk->results);
    walk->weights = xcalloc(S, sizeof *walk->weights);
    walk->rstd = xcalloc(S, sizeof *walk->rstd);
    walk->grad_queries = xcalloc(S, sizeof *walk->grad_queries);
    walk->grad_key_norms = xcalloc(S, sizeof *walk->grad_key_norms);
    walk->grad_alphas = xcalloc(S, sizeof *walk->grad_alphas);
    walk->const_weights = xcalloc(S, sizeof *walk->const_weights);
    walk->alphas = xcalloc(S, sizeof *walk->alphas);
    walk->queries = xcalloc(S, sizeof *walk->queries);
    walk->key_norms = xcalloc(S, sizeof *walk->key_norms);
    walk->douts = xcalloc(S, sizeof *walk->douts);
    walk->merged = xcalloc(S, sizeof *walk->merged);
    walk->stream_sources = xcalloc(sources, sizeof *walk->stream_sources);
    walk->stream_grad_sources = xcalloc(sources, sizeof *walk->stream_grad_sources);
    const size_t stream_sources = sources * (size_t)(plan->streams > 0 ? plan->streams : 1);
    walk->conv.sources = xcalloc(sources, sizeof *walk->conv.sources);
    walk->conv.taps = xcalloc(stream_sources, sizeof *walk->conv.taps);
    walk->conv.grad_rows = xcalloc(stream_sources, sizeof *walk->conv.grad_rows);
    walk->conv.rows = xcalloc(stream_sources, sizeof *walk->conv.rows);
    walk->conv.grad_sources = xcalloc(sources, sizeof *walk->conv.grad_sources);
    walk->conv.grad_taps = xcalloc(stream_sources, sizeof *walk->conv.grad_taps);
    walk->site_streams = xcalloc((size_t)plan->streams, sizeof *walk->site_streams);
    walk->site_grad_streams = xcalloc((size_t)plan->streams, sizeof *walk->site_grad_streams);
    const size_t m = plan->streams > 0 ? (size_t)plan->streams : 1;
    walk->merge.streams = xcalloc(m, sizeof *walk->merge.streams);
    walk->merge.weights = xcalloc(m, sizeof *walk->merge.weights);
    walk->merge.rstd = xcalloc(m, sizeof *walk->merge.rstd);
    walk->merge.lse = xcalloc(m, sizeof *walk->merge.lse);
    walk->merge.queries = xcalloc(m, sizeof *walk->merge.queries);
    walk->merge.key_norms = xcalloc(m, sizeof *walk->merge.key_norms);
    walk->merge.grad_partials = xcalloc(m, sizeof *walk->merge.grad_partials);
    walk->merge.means = xcalloc(m, sizeof *walk->merge.means);
    walk->merge.grad_queries = xcalloc(m, sizeof *walk->merge.grad_queries);
    walk->merge.grad_key_norms = xcalloc(m, sizeof *walk->merge.grad_key_norms);
    walk->merge.douts = xcalloc(m, sizeof *walk->merge.douts);
}

void route_walk_end(RouteWalk *walk)
{
    void *arrays[] = {walk->sources, walk->grad_sources, walk->means, walk->lse, walk->results,
                      walk->weights,
                      walk->rstd, walk->grad_queries,
                      walk->grad_key_norms, walk->grad_alphas, walk->const_weights,
                      walk->alphas, walk->queries, walk->key_norms,
                      walk->douts, walk->merged, walk->stream_sources,
                      walk->stream_grad_sources, walk->site_streams, walk->site_grad_streams,
                      walk->conv.sources, walk->conv.taps, walk->conv.grad_rows, walk->conv.rows,
                      walk->conv.grad_sources, walk->conv.grad_taps, walk->merge.streams,
                      walk->merge.weights, walk->merge.rstd, walk->merge.lse,
                      walk->merge.queries, walk->merge.key_norms, walk->merge.grad_partials,
                      walk->merge.means, walk->merge.grad_queries, walk->merge.grad_key_norms,
                      walk->merge.douts};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        free(arrays[i]);
}
