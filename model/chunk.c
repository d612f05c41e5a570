/* model/chunk.c — see chunk.h: the one walk over a span of sublayers, for every residual
 * mode (DESIGN 2, 2.1, 2.2): the forward here, with the walk's shared pieces
 * (chunk_internal.h) and the payload's places; the backward, with its recomputation, in
 * chunk_backward.c.
 *
 * Per sublayer j of the span the walk does, by mode:
 *   standard  stream[j+1] = stream[j] + f_j(stream[j])
 *   routed    x_j = site_j(sources | delta: p + alpha_j * ...); f_j = f_j(x_j) lands in
 *             its block's buffer (written when it starts the block, else added to the
 *             previous partial); delta also runs p <- p + f_j
 * and the backward walks it in reverse (model_routed's rule, now per chunk):
 *   standard  d stream[j] = d stream[j+1] + J_j^T d stream[j+1], in place
 *   replace   d f_j = d b_n;  delta  d f_j = d p_{j+1} + d b_n,  d p_j = d p_{j+1} + d x_j
 *   then d x_j = J_j^T d f_j, and site j's backward sends d x_j into its sources' gradients.
 * The sites are routed block by block (route_block.h: a block's Route is made for all its
 * sites when the walk enters it, and its completed sources receive every site's gradient when
 * the walk leaves it); this file only says where each site stands.
 * d b_n accumulates in the store's grad_blocks[n]: from the sites that read the completed
 * block and, while block n is walked, from the partials its own sites read (every partial
 * read at j' > j contains f_j, so their gradients meet in one accumulator).
 */
#include "model/chunk.h"

#include <stdlib.h>

#include "model/chunk_internal.h"
#include "runtime/error.h"

static LayerContext layer_context(Model *model, int B)
{
    return (LayerContext){
        .backend = model->backend,
        .config = &model->config,
        .B = B,
        .T = model->scratch.T,
        .rope_cos = model->rope_cos,
        .rope_sin = model->rope_sin,
        .scratch = &model->scratch.layer,
    };
}

static RouteContext route_context(Model *model, int B)
{
    return (RouteContext){
        .backend = model->backend,
        .plan = &model->plan,
        .B = B,
        .T = model->scratch.T,
        .d = model->config.d_model,
        .max_rows = model->scratch.max_batch * model->scratch.T,
        .eps = (float)model->config.norm_eps,
        .conv = model->conv_params,
        .grad_conv = model->conv_grads,
        .scratch = &model->scratch.route,
    };
}

/* Sublayer j: layer j/2's attention (j even) or MLP (j odd), x -> out, x formed first from
 * the gate where one is given (model/layer.h). */
void chunk_sublayer_forward(Model *model, const LayerContext *context, int j,
                            LayerActivations *saved, Activation *x, const InputGate *gate,
                            Activation *out)
{
    const LayerWeights *weights = &model->layer_params[j / 2];
    if (j % 2 == 0)
        attention_sublayer_forward(context, weights, saved, x, gate, out);
    else
        mlp_sublayer_forward(context, weights, saved, x, gate, out);
}

Walk chunk_walk_begin(Model *model, Stash *stash, SummaryStore *store, int B)
{
    Walk walk = {
        .model = model,
        .backend = model->backend,
        .plan = &model->plan,
        .layer = layer_context(model, B),
        .route = route_context(model, B),
        .stash = stash,
        .store = store,
        .routed = model->plan.mode != RESIDUAL_STANDARD,
        .delta = model->plan.mode != RESIDUAL_STANDARD && model->plan.form == FORM_DELTA,
    };
    walk.count = (size_t)B * model->scratch.T * model->config.d_model;
    walk.bytes = walk.count * model->backend->activation_bytes;
    return walk;
}

/* The two-phase walk's rows lie in the logits' gradient buffer (model/activations.h), where
 * the head's forward may leave a chunk of logits for its backward (model/loss.h): a walk that
 * may write them takes that chunk from whichever batch's head left it. The head's own
 * forward and backward come after and before its chunk's walk of the layers, so a step of
 * one chunk keeps it. */
void chunk_walk_takes_spare_rows(Walk *walk)
{
    if (residual_two_phase(walk->plan))
        walk->model->scratch.spare_owner = NULL;
}

/* The route context must not move once the sites' walk points at it. */
void chunk_walk_sites_begin(Walk *walk, bool backward)
{
    if (walk->routed)
        route_walk_begin(&walk->sites, walk->model, walk->stash, walk->store, &walk->route,
                         walk->layer.B * walk->layer.T, backward);
}

void chunk_walk_end(Walk *walk)
{
    if (walk->routed)
        route_walk_end(&walk->sites);
}

/* Site j's forward into x (base: p in the delta form), or, where the site is a gate, into
 * *gate for the sublayer's norm to form x: returns the gate then, else NULL. */
const InputGate *chunk_site_forward(Walk *walk, int j, const Activation *base, Activation *x,
                                    InputGate *gate)
{
    if (route_walk_site_gate(&walk->sites, j, base, gate))
        return gate;
    route_walk_site_forward(&walk->sites, j, base, x);
    return NULL;
}

/* Where routed sublayer j's input x_j goes outside checkpointing: the stash, or the scratch
 * where the stash keeps none (residual_site_keeps_input: its backward makes it again). */
static Activation *routed_input(Walk *walk, int j)
{
    return residual_site_keeps_input(walk->plan, j) ? walk->stash->stream[j]
                                                   : walk->model->scratch.route.site_input;
}

/* Whether f_j may go into its block's partial (and the delta form's p) in sublayer j + 1's
 * norm (model/layer.h InputGate's add), one row read fewer than add_both, add_inplace or
 * add now: site j + 1 is a gate (two-phase) of the same block in this chunk, so that nothing
 * reads p or the partial before that norm (its Route was made when the block opened, from
 * completed blocks; the replace form's merge there is the partial's first reader), and no
 * layer boundary under checkpointing lies between (the stash copies p as each layer
 * starts). */
static bool adds_in_next_norm(const Walk *walk, int j)
{
    const int next = j + 1;
    return next < walk->end_sublayer &&
           !residual_sublayer_starts_block(walk->plan, next) &&
           !(walk->stash->checkpointed && next % 2 == 0) &&
           route_walk_gates_site(&walk->sites, next);
}

/* Routed sublayer j in the forward: site j into x, f_j into its block (and p), now or in the
 * next sublayer's norm. */
static void routed_sublayer_forward(Walk *walk, int j, LayerActivations *saved, Activation *x)
{
    const Backend *backend = walk->backend;
    const ResidualPlan *plan = walk->plan;
    SummaryStore *store = walk->store;
    InputGate gate_storage;
    const InputGate *gate =
        chunk_site_forward(walk, j, walk->delta ? store->stream : NULL, x, &gate_storage);
    if (walk->has_pending) { /* f_{j-1}, in this norm's pass: site j is a gate, as
                                * adds_in_next_norm asked of route_walk_gates_site */
        gate_storage.add = &walk->pending;
        walk->has_pending = false;
    }
    const bool starts_block = residual_sublayer_starts_block(plan, j);
    Activation *partial = store->summaries[plan->sublayer_buffer[j]];
    /* f_j in the scratch stays there until sublayer j + 1's norm where it waits (that
     * sublayer writes its own output there after its norm) */
    Activation *out = starts_block ? partial : walk->model->scratch.layer.sublayer_output;
    chunk_sublayer_forward(walk->model, &walk->layer, j, saved, x, gate, out);
    const Activation *previous = starts_block ? NULL
                                              : store->summaries[plan->sublayer_buffer[j - 1]];
    if (adds_in_next_norm(walk, j) && (walk->delta || previous)) {
        walk->pending = (GateAdd){out, walk->delta ? store->stream : NULL, previous,
                                  previous ? partial : NULL};
        walk->has_pending = true;
        return;
    }
    if (previous && walk->delta) /* f_j into the partial and into p, read once */
        backend->add_both(partial, previous, store->stream, out, walk->count);
    else if (previous)
        backend->add(partial, previous, out, walk->count);
    else if (walk->delta)
        backend->add_inplace(store->stream, out, walk->count);
}

/* Layer i's forward: the sublayers' intermediates go to the stash, or with checkpointing
 * to the scratch's recompute buffers, and only the layer's input stays (activations.h). */
static void layer_forward(Walk *walk, int i)
{
    Model *model = walk->model;
    const Backend *backend = walk->backend;
    Stash *stash = walk->stash;
    ModelScratch *scratch = &model->scratch;
    const bool checkpointed = stash->checkpointed;
    LayerActivations *saved = checkpointed ? &scratch->recompute : &stash->layers[i];
    for (int j = 2 * i; j <= 2 * i + 1; j++) {
        if (walk->routed) {
            if (checkpointed && walk->delta && j == 2 * i)
                backend->copy(stash->layer_stream[i], walk->store->stream, walk->bytes);
            Activation *x = checkpointed ? scratch->recompute_x[j - 2 * i] : routed_input(walk, j);
            routed_sublayer_forward(walk, j, saved, x);
            continue;
        }
        /* standard: checkpointed keeps stream[2i] and the layer's output only. x_{j+1} =
         * x_j + f_j is formed by sublayer j + 1's norm where this walk runs it (model/layer.h
         * InputGate without alpha: one row read fewer than an add before the norm; f_j waits
         * in the scratch, which j + 1 writes only after its norm), else added now. */
        Activation *in = checkpointed && j % 2 ? scratch->recompute_stream : stash->stream[j];
        Activation *next = checkpointed && j % 2 == 0 ? scratch->recompute_stream
                                                      : stash->stream[j + 1];
        Activation *out = scratch->layer.sublayer_output;
        const InputGate sum = {.base = walk->sum_base, .route = out};
        chunk_sublayer_forward(model, &walk->layer, j, saved, in,
                               walk->sum_base ? &sum : NULL, out);
        walk->sum_base = NULL;
        if (j + 1 < walk->end_sublayer)
            walk->sum_base = in;
        else
            backend->add(next, in, out, walk->count);
    }
}

static void upload_tokens(Model *model, uint32_t *dst, const uint32_t *tokens, size_t n,
                          const char *what)
{
    for (size_t t = 0; t < n; t++)
        if (tokens[t] >= (uint32_t)model->config.vocab_size)
            fatal(EXIT_DATA, "%s token %u at position %zu is outside the vocabulary "
                  "(model.vocab_size = %d)", what, tokens[t], t, model->config.vocab_size);
    model->backend->upload(dst, tokens, n * sizeof *tokens);
}

/* ---- the units a walk reads (model/params.h), acquired around each use ---- */

/* The shared routing unit when the walk reads it (route_null, stream convs), else -1. */
int chunk_walk_shared_unit(const Walk *walk)
{
    const ParamTable *table = &walk->model->table;
    return table->units[table->unit_shared].n_params > 0 ? table->unit_shared : -1;
}

/* The unit the walk reads after `unit` (forward) or before it (backward), to prefetch; -1
 * past the span. Forward: embedding, layers, head; the backward runs it in reverse. */
int chunk_walk_next_unit(const ChunkSpan *span, const ParamTable *table, int unit,
                         bool forward)
{
    const int first = 1 + span->first_layer, last = span->first_layer + span->n_layers;
    if (forward) {
        if (unit == 0)
            return first;
        if (unit < last)
            return unit + 1;
        return span->has_head ? table->unit_head : -1;
    }
    if (unit == table->unit_head)
        return last;
    if (unit > first)
        return unit - 1;
    return span->has_embedding ? 0 : -1;
}

/* Whether layer i is the first (side -1) or last (side +1) layer of the span that its
 * routing unit covers: a block's sites are acquired together, for the whole block (a chunk
 * edge falls on a block edge, so a routing unit never straddles two chunks). */
bool chunk_routing_unit_edge(const ParamTable *table, const ChunkSpan *span, int i, int side)
{
    const int neighbour = i + side;
    if (neighbour < span->first_layer || neighbour >= span->first_layer + span->n_layers)
        return true;
    return param_unit_of_layer_routing(table, neighbour) != param_unit_of_layer_routing(table, i);
}

/* The head reads the final site, norm and head weight; tied, the weight is unit 0's. */
void chunk_head_acquire(Model *model, bool for_backward)
{
    model_unit_acquire(model, model->table.unit_head, for_backward);
    if (model->config.tie_embeddings)
        model_unit_acquire(model, 0, for_backward);
}

void chunk_head_release(Model *model, bool gradients)
{
    if (model->config.tie_embeddings)
        model_unit_release(model, 0, gradients);
    model_unit_release(model, model->table.unit_head, gradients);
}

/* The chunk's input from the embedding: e into the stream (standard) or b_0 (and p). */
static void embedding_forward(Walk *walk, size_t rows)
{
    Model *model = walk->model;
    const Backend *backend = walk->backend;
    const int d = model->config.d_model;
    Activation *e = walk->routed ? walk->store->summaries[0] : walk->stash->stream[0];
    backend->embedding_forward(e, walk->stash->inputs, model->embedding, (int)rows, d);
    if (walk->delta)
        backend->copy(walk->store->stream, e, walk->bytes);
}

void chunk_check_stash(const ChunkSpan *span, const Stash *stash)
{
    if (stash->first_sublayer != span->first_sublayer ||
        stash->end_sublayer != span->end_sublayer || stash->has_head != span->has_head ||
        stash->has_embedding != span->has_embedding)
        fatal(EXIT_CONFIG, "a stash made for sublayers [%d, %d) was given chunk %d over "
              "[%d, %d)", stash->first_sublayer, stash->end_sublayer, span->index,
              span->first_sublayer, span->end_sublayer);
}

ModelLoss chunk_forward(Model *model, const ChunkSpan *span, Stash *stash,
                        SummaryStore *store, const uint32_t *inputs, const uint32_t *targets,
                        int B, float z_loss, float loss_scale)
{
    chunk_check_stash(span, stash);
    if (B < 1 || B > model->scratch.max_batch)
        fatal(EXIT_CONFIG, "a batch of %d sequences does not fit the model's activations "
              "(train.microbatch_size = %d)", B, model->scratch.max_batch);
    const size_t rows = (size_t)B * model->scratch.T;
    Walk walk = chunk_walk_begin(model, stash, store, B);
    walk.end_sublayer = span->end_sublayer;
    chunk_walk_sites_begin(&walk, false);
    chunk_walk_takes_spare_rows(&walk);
    const Backend *backend = model->backend;
    const int L2 = model->plan.n_sublayers;

    const ParamTable *table = &model->table;
    const int shared = chunk_walk_shared_unit(&walk);
    if (shared >= 0)
        model_unit_acquire(model, shared, false);
    if (span->has_embedding) {
        model_unit_acquire(model, 0, false);
        model_unit_prefetch(model, chunk_walk_next_unit(span, table, 0, true));
        upload_tokens(model, stash->inputs, inputs, rows, "input");
        embedding_forward(&walk, rows);
        model_unit_release(model, 0, false);
    }
    if (span->has_head)
        upload_tokens(model, stash->targets, targets, rows, "target");
    if (walk.delta) /* the null source on every token: a lookup in a table of one row */
        backend->embedding_forward(model->scratch.null_rows, model->scratch.zero_tokens,
                                   model->route_null, (int)rows, model->config.d_model);
    for (int i = span->first_layer; i < span->first_layer + span->n_layers; i++) {
        const int routing = param_unit_of_layer_routing(table, i);
        if (routing >= 0 && chunk_routing_unit_edge(table, span, i, -1))
            model_unit_acquire(model, routing, false);
        model_unit_acquire(model, 1 + i, false);
        model_unit_prefetch(model, chunk_walk_next_unit(span, table, 1 + i, true));
        layer_forward(&walk, i);
        model_unit_release(model, 1 + i, false);
        if (routing >= 0 && chunk_routing_unit_edge(table, span, i, +1))
            model_unit_release(model, routing, false);
    }

    ModelLoss loss = {0};
    if (span->has_head) {
        chunk_head_acquire(model, false);
        Activation *final_input = stash->stream[walk.routed ? L2 : span->end_sublayer];
        if (walk.routed) /* the final norm, in the head, takes x: never a gate */
            route_walk_site_forward(&walk.sites, L2, walk.delta ? store->stream : NULL,
                                    final_input);
        loss = loss_forward(&walk.layer, &model->head_params, &model->scratch, &stash->head,
                            stash->targets, final_input, z_loss, loss_scale);
        chunk_head_release(model, false);
    }
    if (shared >= 0)
        model_unit_release(model, shared, false);
    stash->batch = B;
    stash->z_loss = z_loss;
    chunk_walk_end(&walk);
    return loss;
}

/* ---- the payload's places ---- */

Activation *chunk_input_stream(const Model *model, const ChunkSpan *span, Stash *stash,
                               SummaryStore *store)
{
    if (model->plan.mode == RESIDUAL_STANDARD)
        return stash->stream[span->first_sublayer];
    return model->plan.form == FORM_DELTA ? store->stream : NULL;
}

Activation *chunk_output_stream(const Model *model, const ChunkSpan *span, Stash *stash,
                                SummaryStore *store)
{
    if (model->plan.mode == RESIDUAL_STANDARD)
        return stash->stream[span->end_sublayer];
    return model->plan.form == FORM_DELTA ? store->stream : NULL;
}

Activation *chunk_grad_stream(Model *model)
{
    return model->scratch.layer.grad_stream;
}

Activation *store_summary(const Model *model, SummaryStore *store, int block)
{
    return store->summaries[model->plan.block_buffer[block]];
}

Activation *store_summary_grad(SummaryStore *store, int block)
{
    return store->grad_blocks[block];
}

void store_zero_grads(const Model *model, SummaryStore *store)
{
    const size_t bytes = (size_t)model->scratch.max_batch * model->scratch.T *
                         model->config.d_model * model->backend->activation_bytes;
    for (int n = 0; n <= store->n_blocks; n++)
        if (store->grad_blocks[n])
            model->backend->zero(store->grad_blocks[n], bytes);
}
