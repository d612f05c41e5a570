/* model/route_block_streams.c — see route_block.h: MSAR's streams in the block walk: the
 * convolutions of a block's sources, each site's merge in the replace form, and the block's
 * backward (the rest of the walk is route_block.c's). */
#include "model/route_block.h"

#include "model/model_internal.h"
#include "model/route_block_internal.h"

/* ---- msar's phase one and its backward ----
 * MSAR: stream r of every site of a block reads the same E_r(s_0) .. E_r(s_{N-1}): the walk
 * convolves the block's sources once for every stream at once into the scratch
 * (walk_block_convolve: stream_conv_forward reads each source once for all m streams) and
 * routes all its sites over them at once, a stream at a time (route_block_forward); each site
 * mixes its m streams in its turn. In the replace form a site i > 0 first merges E_r of its
 * partial b_n^i into each stream (route_merge_forward, from phase one's lse): the partial is
 * complete only when the site's turn comes. E_r stays where the convolution put it until the
 * walk leaves the block (kept_conv_row), so the block's backward convolves no source again
 * once the block is open. The delta form's backward makes phase one again for every stream,
 * takes each site's d x through its mix to d o_r of every stream at once (d x read once),
 * every site's d o_r into d E_r a stream at a time (route_block_backward, into stream r's own
 * d E rows), then every stream's d E at once through the convolutions into the sources and
 * the taps (stream_conv_backward), which reads each source once for all m streams and adds
 * into its gradient once (docs/design-notes.md, "MSAR's convolution backward, every stream at
 * once", "MSAR's block backward, every stream's mix at once"). */

Activation *walk_stream_slot(const RouteWalk *walk, int r, int k)
{
    const size_t S = (size_t)walk->plan->sublayers_per_block;
    return walk->model->scratch.route.stream_slots[(size_t)r * (S + 1) + (size_t)k];
}

/* Stream r's d E row of the block's source k: the scratch holds every stream's, since the
 * convolutions' backward takes them all at once. */
static Activation *stream_grad_conv_row(const RouteWalk *walk, int r, int k)
{
    const size_t M = (size_t)walk->plan->max_sources;
    return walk->model->scratch.route.grad_conv_rows[(size_t)r * M + (size_t)k];
}

/* Where E_r of the block's source k stays from walk_block_convolve until the walk leaves the
 * block: stream r < m - 1 in stream r + 1's d E row of the source, the last stream in
 * conv_rows. The block's backward takes the streams in order, and stream r writes its d E
 * into its own d E rows, which hold stream r - 1's E, read by then (stream_block_backward). */
static Activation *kept_conv_row(const RouteWalk *walk, int r, int k)
{
    if (r + 1 < walk->plan->streams)
        return stream_grad_conv_row(walk, r + 1, k);
    return walk->model->scratch.route.conv_rows[k];
}

/* The stream_conv ops' rows of `site`'s sources (all of them, or only source `only` if >=
 * 0: the replace form's partial), the null source left out (it is not convolved, DESIGN
 * 2.2): each source, in a backward walk where its gradient goes; and for every stream r, at
 * [r * count + n], its row of E_r in the scratch (the block's sources' kept_conv_row, the
 * partial's partial_rows[r]), its taps, its d E_r row and in a backward walk where its taps'
 * gradient goes. Returns count, the rows a stream. */
static int conv_gather(RouteWalk *walk, const SitePlan *site, int only)
{
    const RouteContext *route = walk->route;
    const RouteScratch *scratch = &walk->model->scratch.route;
    const int first = only < 0 ? 0 : only, end = only < 0 ? site->n_sources : only + 1;
    int count = 0, n = 0;
    for (int k = first; k < end; k++)
        count += site->sources[k].slot != RESIDUAL_NO_SLOT;
    for (int k = first; k < end; k++) {
        const int slot = site->sources[k].slot;
        if (slot == RESIDUAL_NO_SLOT)
            continue;
        walk->conv.sources[n] = walk->sources[k];
        if (walk->backward)
            walk->conv.grad_sources[n] = walk->grad_sources[k];
        for (int r = 0; r < walk->plan->streams; r++) {
            const size_t at = (size_t)r * count + n;
            walk->conv.rows[at] = only >= 0 ? scratch->partial_rows[r] : kept_conv_row(walk, r, k);
            walk->conv.taps[at] = route_stream_taps(route, slot, r);
            walk->conv.grad_rows[at] = stream_grad_conv_row(walk, r, k);
            if (walk->backward)
                walk->conv.grad_taps[at] = route->grad_conv[slot] + route_stream_taps_at(route, r);
        }
        n++;
    }
    return count;
}

/* E_r of the gathered sources (conv_gather) into their rows, every stream in one op. */
static void conv_forward(RouteWalk *walk, int count)
{
    const RouteContext *route = walk->route;
    walk->backend->stream_conv_forward(walk->conv.rows, walk->conv.sources, walk->conv.taps,
                                       count, walk->plan->streams, walk->plan->kernel_sizes,
                                       route->B, route->T, walk->d);
}

/* d E of the gathered sources (conv_gather) through their convolutions: into the sources'
 * gradients and the taps'. */
static void conv_backward(RouteWalk *walk, int count)
{
    const RouteContext *route = walk->route;
    walk->backend->stream_conv_backward(walk->conv.grad_sources, walk->conv.grad_taps,
                                        walk->conv.grad_rows, walk->conv.sources,
                                        walk->conv.taps, count, walk->plan->streams,
                                        walk->plan->kernel_sizes, route->B, route->T, walk->d);
}

void walk_block_convolve(RouteWalk *walk, const SitePlan *first)
{
    if (walk->streams)
        conv_forward(walk, conv_gather(walk, first, -1));
}

void walk_stream_sources(RouteWalk *walk, const SitePlan *first, int r)
{
    for (int k = 0; k < first->n_sources; k++)
        walk->stream_sources[k] = first->sources[k].slot == RESIDUAL_NO_SLOT
                                      ? walk->sources[k]
                                      : kept_conv_row(walk, r, k);
}

/* Where site i's depth weights and key rstd of stream r are.
 * msar's are in the scratch, which holds them for the one block being walked, since the
 * backward makes phase one again for its streams anyway (residual_site_keeps_weights). A
 * site's region holds all its sources, the partial's row last in the replace form. The
 * backward holds every stream of the block at once, [m, S, M, rows, H]: the replace form's
 * merges rescale the weights in place, and the delta form's phase one again of every stream
 * comes before any stream's route_block_backward reads them (walk_block_backward_streams).
 * attnres's are in the stash, which its block backward reads: the weights in the site's saved
 * state; the rstd in the region the block's first site keeps (residual_site_rstd_rows): the
 * completed sources' rows, which phase one writes once for every site, then in the replace
 * form site i's partial at row N + i - 1. Site i's view starts i - 1 rows in, so that its row
 * N, the only one its merge reads or writes, is its partial's; its other rows are not its
 * sources' and nothing reads them through it. */
static size_t site_region_of(const RouteWalk *walk, int i, int r)
{
    const size_t S = (size_t)walk->plan->sublayers_per_block;
    return (size_t)r * S + (size_t)i;
}

float *walk_site_weights(const RouteWalk *walk, int block, int i, int r)
{
    const int j = walk_block_first_site(walk, block) + i;
    if (!walk->streams)
        return walk->stash->sites[j].weights;
    const size_t region = (size_t)walk->plan->max_sources * (size_t)walk->route->max_rows *
                          (size_t)walk->plan->heads;
    return walk->model->scratch.route.block_weights + site_region_of(walk, i, r) * region;
}

float *walk_site_rstd(const RouteWalk *walk, int block, int i, int r)
{
    const int j = walk_block_first_site(walk, block) + i;
    if (!walk->streams) {
        float *region = walk->stash->sites[j - i].rstd;
        return walk->replace && i > 0 ? region + (size_t)(i - 1) * walk->rows : region;
    }
    const size_t region = (size_t)walk->plan->max_sources * (size_t)walk->route->max_rows;
    return walk->model->scratch.route.block_rstd + site_region_of(walk, i, r) * region;
}

/* Replace form: site i > 0's partial convolved and merged into phase one's o_r of every
 * stream, in place in the slots (the weights and rstd where phase one put them), one op: a
 * backend may convolve inside the merge's read (partial_rows are its scratch otherwise).
 * With x (several streams) the merged streams are mixed into x in the same op
 * (route_merge_conv_mix_forward), which need not read them back; only the backward keeps
 * them (its site's backward reads o_r), so the forward's op need not store them. */
static void site_merge(RouteWalk *walk, int block, int i, Activation *x)
{
    const int j = walk_block_first_site(walk, block) + i, m = walk->plan->streams;
    const SitePlan *site = &walk->plan->sites[j];
    const SiteWeights *weights = &walk->model->site_params[j];
    const RouteContext *route = walk->route;
    walk_site_sources(walk, j, walk->sources);
    conv_gather(walk, site, site->n_sources - 1); /* the partial, its taps and rows */
    for (int r = 0; r < m; r++) {
        walk->merge.streams[r] = walk_stream_slot(walk, r, i + 1);
        walk->merge.weights[r] = walk_site_weights(walk, block, i, r);
        walk->merge.rstd[r] = walk_site_rstd(walk, block, i, r);
        walk->merge.lse[r] =
            walk_site_stream_floats(walk, walk->model->scratch.route.block_lse, r, i);
        walk->merge.queries[r] = route_stream_row(route, weights->query, r);
        walk->merge.key_norms[r] = route_stream_row(route, weights->key_norm, r);
    }
    if (x) {
        SiteActivations *saved = &walk->stash->sites[j];
        walk->backend->route_merge_conv_mix_forward(
            x, saved->mix_gates, saved->mix_rstd, weights->mix_bias, weights->mix_proj,
            walk->merge.streams, walk->backward, walk->merge.weights, walk->merge.rstd,
            (const Activation *const *)walk->merge.streams, walk->merge.lse,
            walk->conv.sources[0], walk->conv.taps, walk->plan->kernel_sizes, m,
            site->n_sources, walk->merge.queries, walk->merge.key_norms, walk->conv.rows,
            route->B, route->T, walk->d, walk->plan->heads, route->eps);
        return;
    }
    walk->backend->route_merge_conv_forward(
        walk->merge.streams, walk->merge.weights, walk->merge.rstd,
        (const Activation *const *)walk->merge.streams, walk->merge.lse, walk->conv.sources[0],
        walk->conv.taps, walk->plan->kernel_sizes, m, site->n_sources, walk->merge.queries,
        walk->merge.key_norms, walk->conv.rows, route->B, route->T, walk->d, walk->plan->heads,
        route->eps);
}

/* Site i > 0 of msar's replace form merges its partial into phase one's o_r, in place, in its
 * turn: in the forward, and in the backward once since its block reopened, before its
 * sublayer's backward reads x or its merge's backward reads o_r. With x (several streams)
 * the op mixes them into x as well. Whether it merged now. */
bool walk_site_merge_in_turn(RouteWalk *walk, int block, int i, Activation *x)
{
    if (i == 0 || (walk->backward && walk->merged[i]))
        return false;
    site_merge(walk, block, i, x);
    walk->merged[i] = true;
    return true;
}

/* Stream r's part of the block's backward, from d o_r of each site (walk->douts; the replace
 * form's softmax centres in walk->means): into d E_r (stream r's d E rows in the scratch;
 * the null source's straight into its gradient), the stream's queries and key norms. The
 * caller takes every stream's d E through the convolutions (block_convolutions_backward).
 * Expects walk->sources, walk->grad_sources and walk->stream_sources (E_r). */
static void stream_block_backward(RouteWalk *walk, int block, int r)
{
    Model *model = walk->model;
    const Backend *backend = walk->backend;
    RouteScratch *scratch = &model->scratch.route;
    const RouteContext *route = walk->route;
    const int first = walk_block_first_site(walk, block), G = walk_block_sites(walk, block);
    const SitePlan *plan = &walk->plan->sites[first];
    const int N = plan->n_sources, d = walk->d;
    Activation **grad_stream_sources = walk->stream_grad_sources;
    unsigned written = 0; /* d E_r of the convolved sources: written, no zeroing first */
    for (int k = 0; k < N; k++) {
        if (plan->sources[k].slot == RESIDUAL_NO_SLOT) {
            grad_stream_sources[k] = walk->grad_sources[k];
            continue;
        }
        written |= 1u << k;
        grad_stream_sources[k] = stream_grad_conv_row(walk, r, k);
    }
    for (int i = 0; i < G; i++) {
        const int j = first + i;
        walk->const_weights[i] = walk_site_weights(walk, block, i, r);
        walk->queries[i] = route_stream_row(route, model->site_params[j].query, r);
        walk->key_norms[i] = route_stream_row(route, model->site_params[j].key_norm, r);
        walk->grad_queries[i] = model->site_grads[j].query + (size_t)r * d;
        walk->grad_key_norms[i] = model->site_grads[j].key_norm + (size_t)r * d;
    }
    backend->route_block_backward(grad_stream_sources, written, walk->grad_queries,
                                  walk->grad_key_norms,
                                  NULL, walk->douts, walk->stream_sources, N,
                                  walk->const_weights, walk_site_rstd(walk, block, 0, r),
                                  walk->queries, walk->key_norms, NULL,
                                  walk->replace ? (const float *const *)walk->means : NULL, G,
                                  scratch->route_backward, walk->rows, d, walk->plan->heads);
}

/* d o_r of site i of stream r in the replace form's backward (below, "msar's replace form"):
 * with m = 1 the site's d x itself (x = o_0) */
static Activation *site_grad_stream(const RouteWalk *walk, int r, int i)
{
    if (walk->plan->streams == 1)
        return walk->model->scratch.route.block_grads[i];
    const int k = i + 2 <= walk->plan->sublayers_per_block ? i + 2 : 0;
    return walk_stream_slot(walk, r, k);
}

void walk_block_sources_backward(RouteWalk *walk, int block)
{
    const int first = walk_block_first_site(walk, block), G = walk_block_sites(walk, block);
    const SitePlan *plan = &walk->plan->sites[first];
    walk_site_sources(walk, first, walk->sources);
    walk_site_grad_sources(walk, first, walk->grad_sources);
    for (int r = 0; r < walk->plan->streams; r++) {
        walk_stream_sources(walk, plan, r);
        for (int i = 0; i < G; i++) {
            walk->douts[i] =
                walk->replace ? site_grad_stream(walk, r, i) : walk_stream_slot(walk, r, i);
            if (walk->replace)
                walk->means[i] = walk_site_stream_floats(
                    walk, walk->model->scratch.route.block_means, r, i);
        }
        stream_block_backward(walk, block, r);
    }
    conv_backward(walk, conv_gather(walk, plan, -1));
    walk->open_block = -1;
}

/* The backward of the delta form's block n when the walk leaves it. First the block opened
 * again (the sources convolved for every stream, phase one of every stream: o_r of site i in
 * slot i + 1, the depth weights of every stream in the scratch), unless a checkpointed
 * backward's recompute opened it already (the same bits). Then each site's d x through its
 * gate and mix to d o_r of every stream at once (route_site_mix_backward: d x read once for
 * the m streams), site by site in order, d o_r of site i into slot i, where site i - 1's o_r
 * was, spent by then; then the completed sources' share. */
void walk_block_backward_streams(RouteWalk *walk, int block)
{
    Model *model = walk->model;
    const int first = walk_block_first_site(walk, block), G = walk_block_sites(walk, block);
    if (walk->open_block != block)
        walk_block_open(walk, block, NULL);
    for (int i = 0; i < G; i++) {
        const int j = first + i;
        for (int r = 0; r < walk->plan->streams; r++) {
            walk->site_streams[r] = walk_stream_slot(walk, r, i + 1);
            walk->site_grad_streams[r] = walk_stream_slot(walk, r, i);
        }
        route_site_mix_backward(walk->route, &model->site_params[j], &model->site_grads[j],
                                &walk->stash->sites[j], walk->site_streams,
                                model->scratch.route.block_grads[i], walk->site_grad_streams);
    }
    walk_block_sources_backward(walk, block);
}

/* ---- msar's replace form: each site's own share in its turn ----
 * The backward reopens the block (walk_block_open: phase one), and site i in its
 * turn (last to first) merges again, mixing its x for its sublayer's backward
 * (walk_site_merge_in_turn; its slot, i + 1, still holds phase one's o_r then), then takes d x
 * through its mix to d o_r of every stream (the slot where site i + 1's o_r was, spent by now;
 * slot 0 for a full block's last site, so d o_r of sites i.. and o_r of sites ..i - 1 never
 * meet), then per stream its merge's backward: the softmax centre, and the partial's share
 * through E_r into the block's gradient and the taps. That share must be in before
 * sublayer i - 1's backward reads the block's gradient. When the walk leaves the block, every
 * site's d o_r goes into the completed sources (stream_block_backward, with the centres). */

void walk_site_merge_backward(RouteWalk *walk, int block, int i)
{
    Model *model = walk->model;
    const Backend *backend = walk->backend;
    const RouteContext *route = walk->route;
    const int j = walk_block_first_site(walk, block) + i, m = walk->plan->streams;
    const SitePlan *site = &walk->plan->sites[j];
    const SiteWeights *weights = &model->site_params[j];
    SiteGrads *grads = &model->site_grads[j];
    const SiteActivations *saved = &walk->stash->sites[j];
    RouteScratch *scratch = &model->scratch.route;
    const int last = site->n_sources - 1, d = walk->d;
    walk_site_merge_in_turn(walk, block, i, NULL); /* where x did not come from its turn */
    if (m > 1) {
        for (int r = 0; r < m; r++) {
            walk->site_streams[r] = walk_stream_slot(walk, r, i + 1);
            walk->site_grad_streams[r] = site_grad_stream(walk, r, i);
        }
        route_site_mix_backward(route, weights, grads, saved, walk->site_streams,
                                scratch->block_grads[i], walk->site_grad_streams);
    }
    walk_site_sources(walk, j, walk->sources);
    walk_site_grad_sources(walk, j, walk->grad_sources);
    if (i == 0) { /* the block's first site read no partial: its softmax centres alone */
        for (int r = 0; r < m; r++)
            backend->route_merge_backward(
                NULL, GRAD_WRITE, grads->query + (size_t)r * d, grads->key_norm + (size_t)r * d,
                walk_site_stream_floats(walk, scratch->block_means, r, i),
                site_grad_stream(walk, r, i), walk_stream_slot(walk, r, i + 1), NULL,
                site->n_sources, walk_site_weights(walk, block, i, r),
                walk_site_rstd(walk, block, i, r),
                route_stream_row(route, weights->query, r),
                route_stream_row(route, weights->key_norm, r), scratch->route_backward,
                walk->rows, d, walk->plan->heads);
        return;
    }
    /* the partial's E_r made again inside the merges' read, d E_r(b) written (it is the
     * partial's alone), then through the convolutions of every stream at once */
    const int count = conv_gather(walk, site, last);
    for (int r = 0; r < m; r++) {
        walk->merge.grad_partials[r] = stream_grad_conv_row(walk, r, last);
        walk->merge.grad_queries[r] = grads->query + (size_t)r * d;
        walk->merge.grad_key_norms[r] = grads->key_norm + (size_t)r * d;
        walk->merge.means[r] = walk_site_stream_floats(walk, scratch->block_means, r, i);
        walk->merge.douts[r] = site_grad_stream(walk, r, i);
        walk->merge.streams[r] = walk_stream_slot(walk, r, i + 1);
        walk->merge.weights[r] = walk_site_weights(walk, block, i, r);
        walk->merge.rstd[r] = walk_site_rstd(walk, block, i, r);
        walk->merge.queries[r] = route_stream_row(route, weights->query, r);
        walk->merge.key_norms[r] = route_stream_row(route, weights->key_norm, r);
    }
    backend->route_merge_conv_backward(
        walk->merge.grad_partials, walk->merge.grad_queries, walk->merge.grad_key_norms,
        walk->merge.means, walk->merge.douts, (const Activation *const *)walk->merge.streams,
        walk->conv.sources[0], walk->conv.taps, walk->plan->kernel_sizes, m, site->n_sources,
        (const float *const *)walk->merge.weights, (const float *const *)walk->merge.rstd,
        walk->merge.queries, walk->merge.key_norms, walk->conv.rows, scratch->route_backward,
        route->B, route->T, d, walk->plan->heads);
    conv_backward(walk, count);
}
