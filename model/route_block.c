/* model/route_block.c — see route_block.h: which routing op runs when, block by block. */
#include "model/route_block.h"

#include <stdlib.h>

#include "model/model_internal.h"
#include "runtime/error.h"

/* The sources site j reads, as backend pointers [n_sources] (model/residual.h). */
static void site_sources(const RouteWalk *walk, int site, const Activation **sources)
{
    const SitePlan *plan = &walk->plan->sites[site];
    for (int k = 0; k < plan->n_sources; k++) {
        const int buffer = plan->sources[k].buffer;
        sources[k] = buffer == RESIDUAL_NULL_BUFFER ? walk->model->scratch.null_rows
                                                    : walk->store->summaries[buffer];
    }
}

/* Where the gradients of site j's sources accumulate [n_sources]. */
static void site_grad_sources(const RouteWalk *walk, int site, Activation **grads)
{
    const SitePlan *plan = &walk->plan->sites[site];
    for (int k = 0; k < plan->n_sources; k++) {
        const int block = plan->sources[k].grad_block;
        grads[k] = block < 0 ? walk->model->scratch.grad_null_rows
                             : walk->store->grad_blocks[block];
    }
}

void route_walk_begin(RouteWalk *walk, Model *model, Stash *stash, SummaryStore *store,
                      const RouteContext *route, int rows)
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
        /* the delta form only: measured on an H200, two-phase replace (its per-site merges
         * with the partial) ran at half the per-site path's speed at the 1B shape, 27.8 ms
         * against 14.6 ms a microbatch (docs/performance.md, 2026-12-02) */
        .two_phase = plan->mode == RESIDUAL_ATTNRES && plan->form == FORM_DELTA,
        .replace = plan->form == FORM_REPLACE,
        .open_block = -1,
    };
    const size_t sources = (size_t)plan->max_sources + 1;
    const size_t S = plan->sublayers_per_block > 0 ? (size_t)plan->sublayers_per_block : 1;
    walk->sources = xcalloc(sources, sizeof *walk->sources);
    walk->grad_sources = xcalloc(sources, sizeof *walk->grad_sources);
    walk->results = xcalloc(S, sizeof *walk->results);
    walk->weights = xcalloc(S, sizeof *walk->weights);
    walk->rstd = xcalloc(S, sizeof *walk->rstd);
    walk->lse = xcalloc(S, sizeof *walk->lse);
    walk->means = xcalloc(S, sizeof *walk->means);
    walk->grad_queries = xcalloc(S, sizeof *walk->grad_queries);
    walk->grad_key_norms = xcalloc(S, sizeof *walk->grad_key_norms);
    walk->grad_alphas = xcalloc(S, sizeof *walk->grad_alphas);
    walk->const_weights = xcalloc(S, sizeof *walk->const_weights);
    walk->alphas = xcalloc(S, sizeof *walk->alphas);
    walk->const_means = xcalloc(S, sizeof *walk->const_means);
    walk->queries = xcalloc(S, sizeof *walk->queries);
    walk->key_norms = xcalloc(S, sizeof *walk->key_norms);
    walk->douts = xcalloc(S, sizeof *walk->douts);
}

void route_walk_end(RouteWalk *walk)
{
    void *arrays[] = {walk->sources, walk->grad_sources, walk->results, walk->weights,
                      walk->rstd, walk->lse, walk->means, walk->grad_queries,
                      walk->grad_key_norms, walk->grad_alphas, walk->const_weights,
                      walk->alphas, walk->const_means, walk->queries, walk->key_norms,
                      walk->douts};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        free(arrays[i]);
}

/* ---- the block of a site ---- */

static int block_first_site(const RouteWalk *walk, int block)
{
    return (block - 1) * walk->plan->sublayers_per_block;
}

/* sites of block n: S, or fewer in a short last block */
static int block_sites(const RouteWalk *walk, int block)
{
    const int first = block_first_site(walk, block), S = walk->plan->sublayers_per_block;
    const int left = walk->plan->n_sublayers - first;
    return left < S ? left : S;
}

/* per-site [max_rows, H] regions of the scratch's lse and centres */
static float *site_region(const RouteWalk *walk, float *base, int i)
{
    return base + (size_t)i * walk->route->max_rows * walk->plan->heads;
}

/* Phase one of block n: every site's Route over the completed sources (those of the block's
 * first site, which reads no partial), each source read once. The replace form's first site
 * takes its Route as its x directly where the stash keeps that x. */
static void block_open(RouteWalk *walk, int block)
{
    Model *model = walk->model;
    RouteScratch *scratch = &model->scratch.route;
    const int first = block_first_site(walk, block), G = block_sites(walk, block);
    const int N = walk->plan->sites[first].n_sources;
    site_sources(walk, first, walk->sources);
    for (int i = 0; i < G; i++) {
        const int j = first + i;
        SiteActivations *saved = &walk->stash->sites[j];
        walk->results[i] = walk->replace && i == 0 && walk->stash->stream[j]
                               ? walk->stash->stream[j]
                               : scratch->block_results[i];
        walk->weights[i] = saved->weights;
        walk->rstd[i] = saved->rstd;
        walk->lse[i] = walk->replace ? site_region(walk, scratch->block_lse, i) : NULL;
        walk->queries[i] = model->site_params[j].query;
        walk->key_norms[i] = model->site_params[j].key_norm;
    }
    walk->backend->route_block_forward(walk->results, walk->weights, walk->rstd,
                                       walk->replace ? walk->lse : NULL, walk->sources, N,
                                       walk->queries, walk->key_norms, G, walk->rows, walk->d,
                                       walk->plan->heads, walk->route->eps);
    walk->open_block = block;
}

/* Phase one of the backward of block n: every site's d x into the completed sources. */
static void block_backward(RouteWalk *walk, int block)
{
    Model *model = walk->model;
    RouteScratch *scratch = &model->scratch.route;
    const int first = block_first_site(walk, block), G = block_sites(walk, block);
    const int N = walk->plan->sites[first].n_sources;
    site_sources(walk, first, walk->sources);
    site_grad_sources(walk, first, walk->grad_sources);
    for (int i = 0; i < G; i++) {
        const int j = first + i;
        walk->douts[i] = scratch->block_grads[i];
        walk->const_weights[i] = walk->stash->sites[j].weights;
        walk->queries[i] = model->site_params[j].query;
        walk->key_norms[i] = model->site_params[j].key_norm;
        walk->alphas[i] = model->site_params[j].alpha;
        walk->grad_queries[i] = model->site_grads[j].query;
        walk->grad_key_norms[i] = model->site_grads[j].key_norm;
        walk->grad_alphas[i] = model->site_grads[j].alpha;
        walk->const_means[i] = walk->replace ? site_region(walk, scratch->block_means, i) : NULL;
    }
    walk->backend->route_block_backward(
        walk->grad_sources, walk->grad_queries, walk->grad_key_norms,
        walk->replace ? NULL : walk->grad_alphas, walk->douts, walk->sources, N,
        walk->const_weights, walk->stash->sites[first].rstd, walk->queries, walk->key_norms,
        walk->replace ? NULL : walk->alphas, walk->replace ? walk->const_means : NULL, G,
        scratch->route_backward, walk->rows, walk->d, walk->plan->heads);
}

/* ---- the sites ---- */

static bool routes_alone(const RouteWalk *walk, int j)
{
    return !walk->two_phase || j == walk->plan->n_sublayers;
}

void route_walk_site_forward(RouteWalk *walk, int j, const Activation *base, Activation *x)
{
    Model *model = walk->model;
    const Backend *backend = walk->backend;
    const SitePlan *site = &walk->plan->sites[j];
    SiteActivations *saved = &walk->stash->sites[j];
    if (routes_alone(walk, j)) {
        site_sources(walk, j, walk->sources);
        route_site_forward(walk->route, site, &model->site_params[j], saved, walk->sources,
                           base, x);
        return;
    }
    const int block = walk->plan->sublayer_block[j];
    if (walk->open_block != block)
        block_open(walk, block);
    const int i = j - block_first_site(walk, block);
    const size_t count = (size_t)walk->rows * walk->d;
    const SiteWeights *weights = &model->site_params[j];
    if (!walk->replace) { /* x = p + alpha * Route */
        backend->add_scaled(x, base, walk->results[i], weights->alpha, count);
        return;
    }
    if (i == 0) { /* no partial yet: x is the Route */
        if (x != walk->results[0])
            backend->copy(x, walk->results[0], count * backend->activation_bytes);
        return;
    }
    site_sources(walk, j, walk->sources);
    backend->route_merge_forward(x, saved->weights, saved->rstd, walk->results[i],
                                 site_region(walk, model->scratch.route.block_lse, i),
                                 walk->sources, site->n_sources, weights->query,
                                 weights->key_norm, walk->rows, walk->d, walk->plan->heads,
                                 walk->route->eps);
}

Activation *route_walk_grad_x(RouteWalk *walk, int j)
{
    ModelScratch *scratch = &walk->model->scratch;
    if (routes_alone(walk, j))
        return scratch->grad_input;
    const int block = walk->plan->sublayer_block[j];
    return scratch->route.block_grads[j - block_first_site(walk, block)];
}

void route_walk_site_backward(RouteWalk *walk, int j, const Activation *x,
                              const Activation *grad_x)
{
    Model *model = walk->model;
    const SitePlan *site = &walk->plan->sites[j];
    const SiteActivations *saved = &walk->stash->sites[j];
    if (routes_alone(walk, j)) {
        site_sources(walk, j, walk->sources);
        site_grad_sources(walk, j, walk->grad_sources);
        route_site_backward(walk->route, site, &model->site_params[j], &model->site_grads[j],
                            saved, walk->sources, walk->grad_sources, grad_x);
        return;
    }
    const int block = walk->plan->sublayer_block[j];
    const int i = j - block_first_site(walk, block);
    if (walk->replace) {
        /* the softmax centre, and the share through the partial, which the block's own
         * earlier sublayers need next */
        const SiteWeights *weights = &model->site_params[j];
        const bool partial = i > 0;
        const int N = site->n_sources;
        site_sources(walk, j, walk->sources);
        site_grad_sources(walk, j, walk->grad_sources);
        walk->backend->route_merge_backward(
            partial ? walk->grad_sources[N - 1] : NULL, model->site_grads[j].query,
            model->site_grads[j].key_norm,
            site_region(walk, model->scratch.route.block_means, i), grad_x, x, walk->sources,
            N, partial, saved->weights, saved->rstd, weights->query, weights->key_norm,
            model->scratch.route.route_backward, walk->rows, walk->d, walk->plan->heads);
    }
    if (i == 0) /* the walk leaves the block: its completed sources get every site's share */
        block_backward(walk, block);
}
