/* model/chunk_backward.c — the chunk's backward walk (model/chunk.h; the rule per residual
 * mode is chunk.c's top comment): the sublayers in reverse, each after its layer is made
 * again where checkpointing kept only its input, the head first on the last chunk, the
 * embedding last on the first.
 */
#include "model/chunk.h"

#include "model/chunk_internal.h"
#include "runtime/error.h"

/* dx += J_j^T dout (GRAD_ADD; dx may be dout) or dx = J_j^T dout (GRAD_WRITE), or with a
 * branch dx = J_j^T dout and the branch as model/layer.h's GradBranch says. */
static void sublayer_backward(Model *model, const LayerContext *context, int j,
                              const LayerActivations *saved, const Activation *x,
                              const Activation *dout, Activation *dx, GradMode dx_mode,
                              const GradBranch *branch)
{
    const LayerWeights *weights = &model->layer_params[j / 2];
    LayerGrads *grads = &model->layer_grads[j / 2];
    if (j % 2 == 0)
        attention_sublayer_backward(context, weights, grads, saved, x, dout, dx, dx_mode,
                                    branch);
    else
        mlp_sublayer_backward(context, weights, grads, saved, x, dout, dx, dx_mode, branch);
}


/* x_j made again before sublayer j's backward, where the stash keeps none (msar's replace
 * form in two phases). The backward's walk has the block open, and the site's forward in
 * its turn merges its streams again and mixes them into the forward's bits; o_r stay in
 * their slots until site j's own backward (model/route_block_streams.c, "msar's replace form"). */
static const Activation *routed_input_again(Walk *walk, int j)
{
    Activation *x = walk->model->scratch.route.site_input;
    route_walk_site_forward(&walk->sites, j, NULL, x);
    return x;
}

/* With checkpointing: layer i's forward again, into the recompute buffers, from what the
 * stash kept. Nothing kept is written: the summaries and p are complete already. Every op
 * is deterministic, so the values are the forward's to the bit. */
static void layer_recompute(Walk *walk, int i)
{
    Model *model = walk->model;
    const Backend *backend = walk->backend;
    Stash *stash = walk->stash;
    ModelScratch *scratch = &model->scratch;
    Activation *out = scratch->layer.sublayer_output;
    for (int j = 2 * i; j <= 2 * i + 1; j++) {
        const int k = j - 2 * i;
        if (!walk->routed) { /* the second's norm forms its input, as the forward's did */
            Activation *in = k ? scratch->recompute_stream : stash->stream[j];
            const InputGate sum = {.base = stash->stream[2 * i], .route = out};
            chunk_sublayer_forward(model, &walk->layer, j, &scratch->recompute, in,
                                   k ? &sum : NULL, out);
            continue;
        }
        const Activation *base = NULL;
        if (walk->delta)
            base = k ? scratch->recompute_stream : stash->layer_stream[i];
        InputGate gate_storage;
        const InputGate *gate = chunk_site_forward(walk, j, base, scratch->recompute_x[k],
                                                   &gate_storage);
        chunk_sublayer_forward(model, &walk->layer, j, &scratch->recompute, scratch->recompute_x[k],
                               gate, out);
        if (walk->delta && k == 0)
            backend->add(scratch->recompute_stream, base, out, walk->count);
    }
}

/* The delta form's stream gradient inside a block (docs/design-notes.md, "The delta form's
 * stream gradient carries its block's"). Sublayer j's output goes into p and into its
 * block's partial b_n, so d f_j = d p_{j+1} + d b_n; its input x_j = p_j + alpha_j * Route
 * sends the norm's gradient g_j into d p_j = d p_{j+1} + g_j. Where d b_n is complete and
 * nothing adds into it while the walk is in the block, the stream's gradient carries it:
 * Q_j = d p_j + d b_n gives Q_j = Q_{j+1} + g_j (the norm's branch adds g_j, as into d p)
 * and d f_{j-1} = Q_j, the sublayer before reading it as it is: no add a site. The walk
 * trades the carried gradient for the next block's, or takes it out, in one pass where it
 * leaves the block (stream_carry). */

/* Whether site j's backward adds into the gradient of its own block. */
static bool site_adds_into_own_block(const Walk *walk, int j)
{
    const SitePlan *site = &walk->plan->sites[j];
    for (int k = 0; k < site->n_sources; k++)
        if (site->sources[k].grad_block == walk->plan->sublayer_block[j])
            return true;
    return false;
}

/* Whether sublayer j - 1 is in j's block and this chunk, and site j's backward leaves the
 * block's gradient alone: then d f_{j-1} may be the stream gradient carrying the block's.
 * Site j's sources are earlier blocks (checked), and a block's walker runs at its first
 * site. */
static bool carries_into_previous(const Walk *walk, int j)
{
    const ResidualPlan *plan = walk->plan;
    return walk->delta && j - 1 >= walk->first_sublayer &&
           plan->sublayer_block[j - 1] == plan->sublayer_block[j] &&
           !site_adds_into_own_block(walk, j);
}

/* The stream gradient made to carry block_grad (NULL: none) instead of what it carries. */
static void stream_carry(Walk *walk, const Activation *block_grad)
{
    if (walk->stream_carries == block_grad)
        return;
    Activation *grad_stream = walk->model->scratch.layer.grad_stream;
    if (walk->stream_carries)
        walk->backend->add_difference(grad_stream, block_grad, walk->stream_carries,
                                      walk->count);
    else
        walk->backend->add_inplace(grad_stream, block_grad, walk->count);
    walk->stream_carries = block_grad;
}

/* Sublayer j's backward, from the stream gradient (standard) or its block's gradient. */
static void sublayer_walk_backward(Walk *walk, int j, const LayerActivations *saved,
                                   const Activation *x)
{
    const Backend *backend = walk->backend;
    ModelScratch *scratch = &walk->model->scratch;
    Activation *grad_stream = scratch->layer.grad_stream;
    if (!walk->routed) { /* the stream's gradient: the identity path's, added to */
        sublayer_backward(walk->model, &walk->layer, j, saved, x, grad_stream, grad_stream,
                          GRAD_ADD, NULL);
        return;
    }
    const Activation *grad_f = walk->store->grad_blocks[walk->plan->sublayer_block[j]];
    if (walk->delta) { /* d f_j = d p_{j+1} + d b_n: the carrying stream gradient, or an add */
        const Activation *block_grad = grad_f;
        if (walk->stream_carries == block_grad || carries_into_previous(walk, j)) {
            stream_carry(walk, block_grad);
            grad_f = grad_stream;
        } else {
            stream_carry(walk, NULL);
            backend->add(scratch->grad_output, grad_stream, block_grad, walk->count);
            grad_f = scratch->grad_output;
        }
    }
    /* d x_j is written (its buffer holds nothing of this walk yet); in the delta form,
     * x_j = p_j + alpha * mix, it is also added into the stream's gradient (the norm's
     * backward is the sublayer's last op: its dout, maybe that same gradient, is read
     * before); in attnres's replace form the norm's backward goes on through the site's
     * merge */
    Activation *grad_x = route_walk_grad_x(&walk->sites, j);
    RouteMergeGrad merge;
    GradBranch branch = {walk->delta ? grad_stream : NULL, NULL};
    if (route_walk_site_merge_grad(&walk->sites, j, &merge))
        branch.merge = &merge;
    sublayer_backward(walk->model, &walk->layer, j, saved, x, grad_f, grad_x, GRAD_WRITE,
                      branch.stream || branch.merge ? &branch : NULL);
    if (walk->stream_carries && !carries_into_previous(walk, j) &&
        site_adds_into_own_block(walk, j))
        stream_carry(walk, NULL); /* before the site changes what the stream carries */
    route_walk_site_backward(&walk->sites, j, grad_x);
}

/* Layer i's backward: both sublayers in reverse, after recomputing it when checkpointed. */
static void layer_backward(Walk *walk, int i)
{
    Stash *stash = walk->stash;
    ModelScratch *scratch = &walk->model->scratch;
    const bool checkpointed = stash->checkpointed;
    if (checkpointed)
        layer_recompute(walk, i);
    const LayerActivations *saved = checkpointed ? &scratch->recompute : &stash->layers[i];
    for (int j = 2 * i + 1; j >= 2 * i; j--) {
        const Activation *x;
        if (walk->routed && checkpointed)
            x = scratch->recompute_x[j - 2 * i];
        else if (walk->routed)
            x = residual_site_keeps_input(walk->plan, j) ? stash->stream[j]
                                                         : routed_input_again(walk, j);
        else
            x = checkpointed && j % 2 ? scratch->recompute_stream : stash->stream[j];
        sublayer_walk_backward(walk, j, saved, x);
    }
}

/* The last chunk's head: loss and final norm, then (routed) the final site. */
static void head_backward(Walk *walk, float loss_scale)
{
    Model *model = walk->model;
    const Backend *backend = walk->backend;
    Stash *stash = walk->stash;
    ModelScratch *scratch = &model->scratch;
    const int L2 = walk->plan->n_sublayers;
    Activation *grad_stream = scratch->layer.grad_stream;
    /* the loss writes the gradient of the final input: the stream's (standard) or the final
     * site's d x (routed); the delta form's stream gradient starts from zeros, for the add
     * below */
    if (walk->routed && walk->delta)
        backend->zero(grad_stream, walk->bytes);
    Activation *grad_final = walk->routed ? route_walk_grad_x(&walk->sites, L2) : grad_stream;
    const Activation *final_input = stash->stream[walk->routed ? L2 : stash->end_sublayer];
    model->head_grads.head_mode = model_unit_gradient_mode(
        model, model->config.tie_embeddings ? 0 : model->table.unit_head);
    loss_backward(&walk->layer, &model->head_params, &model->head_grads, scratch, &stash->head,
                  stash->targets, final_input, stash->z_loss, loss_scale, grad_final,
                  GRAD_WRITE);
    if (!walk->routed)
        return;
    route_walk_site_backward(&walk->sites, L2, grad_final);
    if (walk->delta)
        backend->add_inplace(grad_stream, grad_final, walk->count);
}

void chunk_backward(Model *model, const ChunkSpan *span, Stash *stash, SummaryStore *store,
                    float loss_scale)
{
    chunk_check_stash(span, stash);
    if (stash->batch == 0)
        fatal(EXIT_CONFIG, "the backward of chunk %d needs its forward first", span->index);
    const int B = stash->batch, d = model->config.d_model;
    const size_t rows = (size_t)B * model->scratch.T;
    Walk walk = chunk_walk_begin(model, stash, store, B);
    walk.first_sublayer = span->first_sublayer;
    chunk_walk_sites_begin(&walk, true);
    const Backend *backend = model->backend;
    ModelScratch *scratch = &model->scratch;
    Activation *grad_stream = scratch->layer.grad_stream;

    const ParamTable *table = &model->table;
    const int shared = chunk_walk_shared_unit(&walk);
    if (shared >= 0)
        model_unit_acquire(model, shared, true);
    if (walk.delta)
        backend->zero(scratch->grad_null_rows, walk.bytes);
    if (span->has_head) {
        chunk_head_acquire(model, true);
        model_unit_prefetch(model, chunk_walk_next_unit(span, table, table->unit_head, false));
        head_backward(&walk, loss_scale);
        chunk_head_release(model, true);
    }
    chunk_walk_takes_spare_rows(&walk);
    for (int i = span->first_layer + span->n_layers - 1; i >= span->first_layer; i--) {
        const int routing = param_unit_of_layer_routing(table, i);
        if (routing >= 0 && chunk_routing_unit_edge(table, span, i, +1))
            model_unit_acquire(model, routing, true);
        model_unit_acquire(model, 1 + i, true);
        model_unit_prefetch(model, chunk_walk_next_unit(span, table, 1 + i, false));
        model->layer_grads[i].matrix_mode = model_unit_gradient_mode(model, 1 + i);
        layer_backward(&walk, i);
        model_unit_release(model, 1 + i, true);
        if (routing >= 0 && chunk_routing_unit_edge(table, span, i, -1))
            model_unit_release(model, routing, true);
    }

    /* the delta form's stream gradient leaves the chunk as d p, or reaches the embedding
     * as d p_0 + d b_0 */
    if (walk.delta)
        stream_carry(&walk, span->has_embedding ? store->grad_blocks[0] : NULL);
    if (span->has_embedding) {
        model_unit_acquire(model, 0, true);
        const Activation *grad_e = grad_stream;
        if (walk.routed && !walk.delta)
            grad_e = store->grad_blocks[0];
        backend->embedding_backward(model->grad_embedding, grad_e, stash->inputs, (int)rows, d);
        model_unit_release(model, 0, true);
    }
    if (walk.delta) /* d route_null: the sum over tokens of the null source's gradient */
        backend->sum_rows(model->grad_route_null, scratch->grad_null_rows, (int)rows, d);
    if (shared >= 0)
        model_unit_release(model, shared, true);
    chunk_walk_end(&walk);
}
