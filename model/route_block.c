/* model/route_block.c — see route_block.h: which routing op runs when, block by block: the
 * walk's sources and blocks, phase one, attnres's replace form and the sites' entry points
 * (MSAR's streams are route_block_streams.c's; the walk's arrays are made and freed in
 * route_walk.c). */
#include "model/route_block.h"

#include "model/model_internal.h"
#include "model/route_block_internal.h"

void walk_site_sources(const RouteWalk *walk, int site, const Activation **sources)
{
    const SitePlan *plan = &walk->plan->sites[site];
    for (int k = 0; k < plan->n_sources; k++) {
        const int buffer = plan->sources[k].buffer;
        sources[k] = buffer == RESIDUAL_NULL_BUFFER ? walk->model->scratch.null_rows
                                                    : walk->store->summaries[buffer];
    }
}

void walk_site_grad_sources(const RouteWalk *walk, int site, Activation **grads)
{
    const SitePlan *plan = &walk->plan->sites[site];
    for (int k = 0; k < plan->n_sources; k++) {
        const int block = plan->sources[k].grad_block;
        grads[k] = block < 0 ? walk->model->scratch.grad_null_rows
                             : walk->store->grad_blocks[block];
    }
}

/* ---- the block of a site ---- */

/* MSAR's final site 2L is a block of its own, n_blocks + 1, of one site: like a block's
 * first site it reads only completed blocks, so phase one gives it its Route (residual.h;
 * attnres's routes alone, routes_alone). */
static bool final_block(const RouteWalk *walk, int block)
{
    return block > walk->plan->n_blocks;
}

int walk_block_first_site(const RouteWalk *walk, int block)
{
    if (final_block(walk, block))
        return walk->plan->n_sublayers;
    return (block - 1) * walk->plan->sublayers_per_block;
}

int walk_block_sites(const RouteWalk *walk, int block)
{
    return residual_block_sites(walk->plan, block);
}

/* Site i's [rows, H] floats of stream r in a [m, S, max_rows, H] scratch array (the replace
 * form's lse and softmax centres; attnres's stream is r = 0). */
float *walk_site_stream_floats(const RouteWalk *walk, float *base, int r, int i)
{
    const size_t S = (size_t)walk->plan->sublayers_per_block;
    const size_t per_site = (size_t)walk->route->max_rows * walk->plan->heads;
    return base + ((size_t)r * S + (size_t)i) * per_site;
}

/* The backward of block n when the walk leaves it: every site's d x into the sources (the
 * replace form's about each site's softmax centre, from its merge's backward). */
static void block_backward(RouteWalk *walk, int block)
{
    Model *model = walk->model;
    RouteScratch *scratch = &model->scratch.route;
    const int first = walk_block_first_site(walk, block), G = walk_block_sites(walk, block);
    const int N = walk->plan->sites[first].n_sources;
    walk_site_sources(walk, first, walk->sources);
    walk_site_grad_sources(walk, first, walk->grad_sources);
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
        walk->means[i] =
            walk->replace ? walk_site_stream_floats(walk, scratch->block_means, 0, i) : NULL;
    }
    walk->backend->route_block_backward(
        walk->grad_sources, 0, walk->grad_queries, walk->grad_key_norms,
        walk->replace ? NULL : walk->grad_alphas, walk->douts, walk->sources, N,
        walk->const_weights, walk_site_rstd(walk, block, 0, 0), walk->queries, walk->key_norms,
        walk->replace ? NULL : walk->alphas,
        walk->replace ? (const float *const *)walk->means : NULL, G, scratch->route_backward,
        walk->rows, walk->d, walk->plan->heads);
}

/* ---- attnres's replace form in two phases (unless FATHOM_ROUTE_REPLACE=per_site) ----
 * Phase one leaves site i's Route over the block's completed sources in block_results[i],
 * its lse in the scratch and its depth weights and rstd in its stash, where the per-site
 * path keeps them. In its turn the site merges its partial b_n^i into x, inside its
 * sublayer's norm (route_walk_site_gate: route_merge_rmsnorm_forward, which also adds the
 * sublayer before's output into b_n^i where model/chunk.c leaves it there, two rows read and
 * two launches fewer than the add, the merge and the norm apart; route_merge_forward where
 * the caller asks for x alone). The block's first site reads no partial: x is its Route,
 * which phase one writes into x itself when the walk opens the block there, a row written
 * and a copy of two rows fewer a block. So in the forward and in a checkpointed backward's
 * recompute alike. Its backward needs no phase one
 * again: the merge's backward reads x as the sublayer saw it, gives the partial's share at
 * once (the block's earlier sublayers read it next) and the site's softmax centre; the
 * block's backward, when the walk leaves it, gives the completed sources theirs. */

/* Site i > 0's merge of its partial b_n^i into phase one's Route, as the op takes it. */
static const RouteMerge *site_merge(RouteWalk *walk, int block, int i)
{
    Model *model = walk->model;
    const int j = walk_block_first_site(walk, block) + i;
    const SitePlan *site = &walk->plan->sites[j];
    SiteActivations *saved = &walk->stash->sites[j];
    walk_site_sources(walk, j, walk->sources);
    walk->merge_gate = (RouteMerge){
        .weights = saved->weights,
        .rstd = walk_site_rstd(walk, block, i, 0),
        .result = model->scratch.route.block_results[i],
        .lse = walk_site_stream_floats(walk, model->scratch.route.block_lse, 0, i),
        .partial = walk->sources[site->n_sources - 1],
        .query = model->site_params[j].query,
        .key_norm = model->site_params[j].key_norm,
        .n_sources = site->n_sources,
        .heads = walk->plan->heads,
        .eps = walk->route->eps,
    };
    return &walk->merge_gate;
}

static void attnres_replace_forward(RouteWalk *walk, int block, int i, Activation *x)
{
    const Backend *backend = walk->backend;
    if (i == 0) {
        backend->copy(x, walk->model->scratch.route.block_results[0],
                      (size_t)walk->rows * walk->d * backend->activation_bytes);
        return;
    }
    const RouteMerge *merge = site_merge(walk, block, i);
    backend->route_merge_forward(x, merge->weights, merge->rstd, merge->result, merge->lse,
                                 merge->partial, merge->n_sources, merge->query,
                                 merge->key_norm, walk->rows, walk->d, merge->heads,
                                 merge->eps);
}

/* Site i's merge backward as its norm's backward takes it on (route_walk_site_merge_grad):
 * the partial's share into the block's gradient, which later sites fed already; the first
 * site reads no partial and gives its softmax centre alone. */
static void site_merge_grad(RouteWalk *walk, int block, int i, RouteMergeGrad *merge)
{
    Model *model = walk->model;
    const int j = walk_block_first_site(walk, block) + i;
    const SitePlan *site = &walk->plan->sites[j];
    const SiteActivations *saved = &walk->stash->sites[j];
    const SiteWeights *weights = &model->site_params[j];
    const int last = site->n_sources - 1;
    walk_site_sources(walk, j, walk->sources);
    walk_site_grad_sources(walk, j, walk->grad_sources);
    *merge = (RouteMergeGrad){
        .dpartial = i > 0 ? walk->grad_sources[last] : NULL,
        .dpartial_mode = GRAD_ADD,
        .dquery = model->site_grads[j].query,
        .dkey_norm = model->site_grads[j].key_norm,
        .mean = walk_site_stream_floats(walk, model->scratch.route.block_means, 0, i),
        .partial = i > 0 ? walk->sources[last] : NULL,
        .weights = saved->weights,
        .rstd = walk_site_rstd(walk, block, i, 0),
        .query = weights->query,
        .key_norm = weights->key_norm,
        .scratch = model->scratch.route.route_backward,
        .n_sources = site->n_sources,
        .heads = walk->plan->heads,
    };
}

/* ---- phase one ----
 * attnres is the one-stream case: its sources have no conv slot, so walk_stream_sources hands
 * them over as they are and phase one routes them into block_results. MSAR's streams, their
 * convolutions and their backward are route_block_streams.c's. */

/* Phase one of stream r of block n (attnres: its one stream, r = 0): every site's Route
 * over walk->stream_sources (msar: the block's E_r, walk_block_convolve's), each read once,
 * into block_results (attnres) or stream r's slots (msar: o_r of site i in slot i + 1),
 * with each site's lse for its merge in the replace form. */
static void block_phase_one(RouteWalk *walk, int block, int r, Activation *first_result)
{
    Model *model = walk->model;
    RouteScratch *scratch = &model->scratch.route;
    const int first = walk_block_first_site(walk, block), G = walk_block_sites(walk, block);
    const int N = walk->plan->sites[first].n_sources;
    const RouteContext *route = walk->route;
    float **lse = walk->replace ? walk->lse : NULL;
    for (int i = 0; i < G; i++) {
        const SiteWeights *weights = &model->site_params[first + i];
        walk->results[i] =
            walk->streams ? walk_stream_slot(walk, r, i + 1) : scratch->block_results[i];
        if (i == 0 && first_result && !walk->streams)
            walk->results[0] = first_result;
        walk->weights[i] = walk_site_weights(walk, block, i, r);
        /* attnres: the block's one region, every site's completed sources in site 0's view */
        walk->rstd[i] = walk_site_rstd(walk, block, walk->streams ? i : 0, r);
        walk->queries[i] = route_stream_row(route, weights->query, r);
        walk->key_norms[i] = route_stream_row(route, weights->key_norm, r);
        if (lse)
            lse[i] = walk_site_stream_floats(walk, scratch->block_lse, r, i);
    }
    walk->backend->route_block_forward(walk->results, walk->weights, walk->rstd, lse,
                                       walk->stream_sources, N, walk->queries, walk->key_norms,
                                       G, walk->rows, walk->d, walk->plan->heads, route->eps);
}

void walk_block_open(RouteWalk *walk, int block, Activation *first_result)
{
    const int first = walk_block_first_site(walk, block);
    const SitePlan *plan = &walk->plan->sites[first];
    walk_site_sources(walk, first, walk->sources);
    walk_block_convolve(walk, plan);
    for (int r = 0; r < walk->plan->streams; r++) {
        walk_stream_sources(walk, plan, r);
        block_phase_one(walk, block, r, first_result);
    }
    for (int i = 0; i < walk_block_sites(walk, block); i++)
        walk->merged[i] = false;
    walk->open_block = block;
}

/* ---- the sites ---- */

/* walk->site_streams = site i's o_r of every stream, where phase one left them */
static const Activation *const *site_streams_of(RouteWalk *walk, int i)
{
    for (int r = 0; r < walk->plan->streams; r++)
        walk->site_streams[r] = walk_stream_slot(walk, r, i + 1);
    return walk->site_streams;
}

/* Site j's (site i of its block) mix of its streams, as its sublayer's norm makes it into
 * its gate (msar, m > 1): the mix's saved gates and rstd in the site's stash */
static const StreamMix *site_mix(RouteWalk *walk, int j, int i)
{
    const SiteWeights *weights = &walk->model->site_params[j];
    SiteActivations *saved = &walk->stash->sites[j];
    walk->mix_gate = (StreamMix){
        .streams = site_streams_of(walk, i),
        .m = walk->plan->streams,
        .gates = saved->mix_gates,
        .rstd = saved->mix_rstd,
        .mix_bias = weights->mix_bias,
        .mix_proj = weights->mix_proj,
        .eps = walk->route->eps,
        .scratch = walk->route->scratch->mixed,
    };
    return &walk->mix_gate;
}

/* Whether site j routes alone, through the per-site ops: every site outside the two-phase
 * walk, and attnres's final site. A block of one site shares no read, and pays the block
 * kernels' four passes where attnres's per-site Route makes two: its final site cost 2.79
 * ms a step as a block against 1.47 alone at the 1B MHAR delta step, 2.23 against 1.58 at 8
 * layers of the 8B width (CUPTI, docs/performance.md, 2026-12-06 afternoon). MSAR's per-site
 * stream route convolves every source inside each stream's reads, and costs more than its
 * block of one. */
static bool routes_alone(const RouteWalk *walk, int j)
{
    return !residual_site_in_walk(walk->plan, j);
}

/* attnres's replace form at site i > 0 of its block: the merge in the sublayer's norm
 * (route_merge_rmsnorm_forward), one row read fewer than route_merge_forward before it. */
static bool merges_in_norm(const RouteWalk *walk, int j)
{
    const int block = walk->plan->sites[j].block;
    return walk->replace && !walk->streams && j > walk_block_first_site(walk, block);
}

/* attnres's replace form in two phases: the merge's backward, every site's, in the
 * sublayer's norm backward (route_merge_rmsnorm_backward), two rows fewer than the norm's
 * backward and route_merge_backward after it. */
static bool merges_in_norm_backward(const RouteWalk *walk, int j)
{
    return walk->replace && !walk->streams && !routes_alone(walk, j);
}

bool route_walk_site_merge_grad(RouteWalk *walk, int j, RouteMergeGrad *merge)
{
    if (!merges_in_norm_backward(walk, j))
        return false;
    const int block = walk->plan->sites[j].block;
    site_merge_grad(walk, block, j - walk_block_first_site(walk, block), merge);
    return true;
}

bool route_walk_gates_site(const RouteWalk *walk, int j)
{
    return !routes_alone(walk, j) && (!walk->replace || merges_in_norm(walk, j));
}

bool route_walk_site_gate(RouteWalk *walk, int j, const Activation *base, InputGate *gate)
{
    if (routes_alone(walk, j) || (!base && !merges_in_norm(walk, j)))
        return false;
    const int block = walk->plan->sites[j].block;
    if (!base) { /* attnres's replace form */
        if (walk->open_block != block)
            walk_block_open(walk, block, NULL);
        const int i = j - walk_block_first_site(walk, block);
        *gate = (InputGate){.merge = site_merge(walk, block, i)};
        return true;
    }
    if (walk->open_block != block)
        walk_block_open(walk, block, NULL);
    Model *model = walk->model;
    const int i = j - walk_block_first_site(walk, block);
    const Activation *route = model->scratch.route.block_results[i];
    const StreamMix *mix = NULL;
    if (walk->streams && walk->plan->streams > 1) /* msar: its streams' mix, made by the norm */
        mix = site_mix(walk, j, i);
    else if (walk->streams) /* one stream: the mix is o_0 */
        route = site_streams_of(walk, i)[0];
    *gate = (InputGate){.base = base, .route = route, .alpha = model->site_params[j].alpha,
                        .mix = mix};
    return true;
}

void route_walk_site_forward(RouteWalk *walk, int j, const Activation *base, Activation *x)
{
    Model *model = walk->model;
    const SitePlan *site = &walk->plan->sites[j];
    SiteActivations *saved = &walk->stash->sites[j];
    if (routes_alone(walk, j)) {
        walk_site_sources(walk, j, walk->sources);
        route_site_forward(walk->route, site, &model->site_params[j], saved, walk->sources,
                           base, x);
        return;
    }
    InputGate gate;
    if (route_walk_site_gate(walk, j, base, &gate)) { /* x = p + alpha * Route */
        if (gate.mix) /* msar: the mix apart, then the gate */
            route_site_mix_forward(walk->route, &model->site_params[j], saved,
                                   gate.mix->streams, base, x);
        else
            walk->backend->add_scaled(x, gate.base, gate.route, gate.alpha,
                                      (size_t)walk->rows * walk->d);
        return;
    }
    const int block = walk->plan->sites[j].block;
    const int i = j - walk_block_first_site(walk, block);
    /* attnres's replace form opening the block at its first site: x is that site's Route */
    Activation *first_result = !walk->streams && i == 0 ? x : NULL;
    const bool opens = walk->open_block != block;
    if (opens)
        walk_block_open(walk, block, first_result);
    if (!walk->streams) { /* attnres's replace form */
        if (!(opens && first_result))
            attnres_replace_forward(walk, block, i, x);
        return;
    }
    /* a merge needs the site's partial, complete now; several streams are mixed into x as
     * they are merged */
    Activation *mixed = walk->plan->streams > 1 ? x : NULL;
    if (walk->replace && walk_site_merge_in_turn(walk, block, i, mixed) && mixed)
        return;
    const Activation *const *streams = site_streams_of(walk, i);
    if (walk->plan->streams == 1 && !base) { /* x = o_0 */
        walk->backend->copy(x, streams[0],
                            (size_t)walk->rows * walk->d * walk->backend->activation_bytes);
        return;
    }
    route_site_mix_forward(walk->route, &model->site_params[j], saved, streams, base, x);
}

Activation *route_walk_grad_x(RouteWalk *walk, int j)
{
    if (routes_alone(walk, j))
        return walk->model->scratch.grad_input;
    const int block = walk->plan->sites[j].block;
    return walk->model->scratch.route.block_grads[j - walk_block_first_site(walk, block)];
}

void route_walk_site_backward(RouteWalk *walk, int j, const Activation *grad_x)
{
    Model *model = walk->model;
    const SitePlan *site = &walk->plan->sites[j];
    const SiteActivations *saved = &walk->stash->sites[j];
    if (routes_alone(walk, j)) {
        walk_site_sources(walk, j, walk->sources);
        walk_site_grad_sources(walk, j, walk->grad_sources);
        route_site_backward(walk->route, site, &model->site_params[j], &model->site_grads[j],
                            saved, walk->sources, walk->grad_sources, grad_x);
        return;
    }
    const int block = walk->plan->sites[j].block;
    const int first = walk_block_first_site(walk, block);
    if (merges_in_norm_backward(walk, j)) { /* attnres: the merge's went with the norm's */
        if (j == first)
            block_backward(walk, block);
        return;
    }
    if (walk->replace) { /* msar: the site's own share now, the block's when the walk leaves */
        if (walk->open_block != block)
            walk_block_open(walk, block, NULL);
        walk_site_merge_backward(walk, block, j - first);
        if (j == first)
            walk_block_sources_backward(walk, block);
        return;
    }
    if (j == first) /* the walk leaves the block */
        (walk->streams ? walk_block_backward_streams : block_backward)(walk, block);
}
