/* model/chunk.c — see chunk.h: the one walk over a span of sublayers, for every residual
 * mode (DESIGN 2, 2.1, 2.2), forward and backward, with optional recomputation.
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

#include "model/model_internal.h"
#include "model/route_block.h"
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
static void sublayer_forward(Model *model, const LayerContext *context, int j,
                             LayerActivations *saved, Activation *x, const InputGate *gate,
                             Activation *out)
{
    const LayerWeights *weights = &model->layer_params[j / 2];
    if (j % 2 == 0)
        attention_sublayer_forward(context, weights, saved, x, gate, out);
    else
        mlp_sublayer_forward(context, weights, saved, x, gate, out);
}

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

/* Everything one walk needs, made once per chunk call. */
typedef struct {
    Model *model;
    const Backend *backend;
    const ResidualPlan *plan;
    LayerContext layer;
    RouteContext route;
    Stash *stash;
    SummaryStore *store;
    size_t count, bytes;          /* rows * d, and in bytes */
    bool routed, delta;
    int first_sublayer, end_sublayer; /* the chunk's */
    GateAdd pending;              /* the forward's f_j, added in sublayer j + 1's norm ... */
    bool has_pending;             /* ... where this is set (adds_in_next_norm) */
    bool dout_written;            /* the backward's next d f_j is in scratch grad_output */
    RouteWalk sites;              /* the routing sites, block by block (route_block.h) */
} Walk;

static Walk walk_begin(Model *model, Stash *stash, SummaryStore *store, int B)
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
static void walk_takes_spare_rows(Walk *walk)
{
    if (residual_two_phase(walk->plan))
        walk->model->scratch.spare_owner = NULL;
}

/* The route context must not move once the sites' walk points at it. */
static void walk_sites_begin(Walk *walk, bool backward)
{
    if (walk->routed)
        route_walk_begin(&walk->sites, walk->model, walk->stash, walk->store, &walk->route,
                         walk->layer.B * walk->layer.T, backward);
}

static void walk_end(Walk *walk)
{
    if (walk->routed)
        route_walk_end(&walk->sites);
}

/* Site j's forward into x (base: p in the delta form), or, where the site is a gate, into
 * *gate for the sublayer's norm to form x: returns the gate then, else NULL. */
static const InputGate *site_forward(Walk *walk, int j, const Activation *base, Activation *x,
                                     InputGate *gate)
{
    if (route_walk_site_gate(&walk->sites, j, base, gate))
        return gate;
    route_walk_site_forward(&walk->sites, j, base, x);
    return NULL;
}

/* Site j's backward from d x = grad_x (route_walk_grad_x), x the site's output as its
 * sublayer read it. */
static void site_backward(Walk *walk, int j, const Activation *x, const Activation *grad_x)
{
    route_walk_site_backward(&walk->sites, j, x, grad_x);
}

/* Where routed sublayer j's input x_j goes outside checkpointing: the stash, or the scratch
 * where the stash keeps none (residual_site_keeps_input: its backward makes it again). */
static Activation *routed_input(Walk *walk, int j)
{
    return residual_site_keeps_input(walk->plan, j) ? walk->stash->stream[j]
                                                   : walk->model->scratch.route.site_input;
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

/* Whether the delta form's f_j may go into p and its partial in sublayer j + 1's norm
 * (model/layer.h InputGate's add), one row read fewer than add_both or add_inplace now:
 * site j + 1 is a gate (two-phase) of the same block in this chunk, so that nothing reads
 * p or the partial before that norm (its Route was made when the block opened, from
 * completed blocks), and no layer boundary under checkpointing lies between (the stash
 * copies p as each layer starts). */
static bool adds_in_next_norm(const Walk *walk, int j)
{
    const int next = j + 1;
    return walk->delta && next < walk->end_sublayer &&
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
        site_forward(walk, j, walk->delta ? store->stream : NULL, x, &gate_storage);
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
    sublayer_forward(walk->model, &walk->layer, j, saved, x, gate, out);
    const Activation *previous = starts_block ? NULL
                                              : store->summaries[plan->sublayer_buffer[j - 1]];
    if (adds_in_next_norm(walk, j)) {
        walk->pending = (GateAdd){out, store->stream, previous, previous ? partial : NULL};
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
        /* standard: checkpointed keeps stream[2i] and the layer's output only */
        Activation *in = checkpointed && j % 2 ? scratch->recompute_stream : stash->stream[j];
        Activation *next = checkpointed && j % 2 == 0 ? scratch->recompute_stream
                                                      : stash->stream[j + 1];
        Activation *out = scratch->layer.sublayer_output;
        sublayer_forward(model, &walk->layer, j, saved, in, NULL, out);
        backend->add(next, in, out, walk->count);
    }
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
        if (!walk->routed) {
            Activation *in = k ? scratch->recompute_stream : stash->stream[j];
            sublayer_forward(model, &walk->layer, j, &scratch->recompute, in, NULL, out);
            if (k == 0)
                backend->add(scratch->recompute_stream, in, out, walk->count);
            continue;
        }
        const Activation *base = NULL;
        if (walk->delta)
            base = k ? scratch->recompute_stream : stash->layer_stream[i];
        InputGate gate_storage;
        const InputGate *gate = site_forward(walk, j, base, scratch->recompute_x[k],
                                             &gate_storage);
        sublayer_forward(model, &walk->layer, j, &scratch->recompute, scratch->recompute_x[k],
                         gate, out);
        if (walk->delta && k == 0)
            backend->add(scratch->recompute_stream, base, out, walk->count);
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
static int walk_shared_unit(const Walk *walk)
{
    const ParamTable *table = &walk->model->table;
    return table->units[table->unit_shared].n_params > 0 ? table->unit_shared : -1;
}

/* The unit the walk reads after `unit` (forward) or before it (backward), to prefetch; -1
 * past the span. Forward: embedding, layers, head; the backward runs it in reverse. */
static int walk_next_unit(const ChunkSpan *span, const ParamTable *table, int unit,
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
static bool routing_unit_edge(const ParamTable *table, const ChunkSpan *span, int i, int side)
{
    const int neighbour = i + side;
    if (neighbour < span->first_layer || neighbour >= span->first_layer + span->n_layers)
        return true;
    return param_unit_of_layer_routing(table, neighbour) != param_unit_of_layer_routing(table, i);
}

/* The head reads the final site, norm and head weight; tied, the weight is unit 0's. */
static void head_acquire(Model *model, bool for_backward)
{
    model_unit_acquire(model, model->table.unit_head, for_backward);
    if (model->config.tie_embeddings)
        model_unit_acquire(model, 0, for_backward);
}

static void head_release(Model *model, bool gradients)
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

static void check_stash(const ChunkSpan *span, const Stash *stash)
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
                        int B, float z_loss)
{
    check_stash(span, stash);
    if (B < 1 || B > model->scratch.max_batch)
        fatal(EXIT_CONFIG, "a batch of %d sequences does not fit the model's activations "
              "(train.microbatch_size = %d)", B, model->scratch.max_batch);
    const size_t rows = (size_t)B * model->scratch.T;
    Walk walk = walk_begin(model, stash, store, B);
    walk.end_sublayer = span->end_sublayer;
    walk_sites_begin(&walk, false);
    walk_takes_spare_rows(&walk);
    const Backend *backend = model->backend;
    const int L2 = model->plan.n_sublayers;

    const ParamTable *table = &model->table;
    const int shared = walk_shared_unit(&walk);
    if (shared >= 0)
        model_unit_acquire(model, shared, false);
    if (span->has_embedding) {
        model_unit_acquire(model, 0, false);
        model_unit_prefetch(model, walk_next_unit(span, table, 0, true));
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
        if (routing >= 0 && routing_unit_edge(table, span, i, -1))
            model_unit_acquire(model, routing, false);
        model_unit_acquire(model, 1 + i, false);
        model_unit_prefetch(model, walk_next_unit(span, table, 1 + i, true));
        layer_forward(&walk, i);
        model_unit_release(model, 1 + i, false);
        if (routing >= 0 && routing_unit_edge(table, span, i, +1))
            model_unit_release(model, routing, false);
    }

    ModelLoss loss = {0};
    if (span->has_head) {
        head_acquire(model, false);
        Activation *final_input = stash->stream[walk.routed ? L2 : span->end_sublayer];
        if (walk.routed) /* the final norm, in the head, takes x: never a gate */
            route_walk_site_forward(&walk.sites, L2, walk.delta ? store->stream : NULL,
                                    final_input);
        loss = loss_forward(&walk.layer, &model->head_params, &model->scratch, &stash->head,
                            stash->targets, final_input, z_loss);
        head_release(model, false);
    }
    if (shared >= 0)
        model_unit_release(model, shared, false);
    stash->batch = B;
    stash->z_loss = z_loss;
    walk_end(&walk);
    return loss;
}

/* Whether sublayer j's input norm, in the delta form, may also write d f_{j-1} =
 * d p_j + d b_n (model/layer.h GradBranch), one row read fewer than an add before j - 1's
 * backward: j - 1 in this chunk and in j's block, whose gradient is then complete and
 * nothing adds into before j - 1's backward. Site j's sources are earlier blocks (checked:
 * its backward adds into their gradients, not b_n's), and a block's walker runs at its
 * first site. */
static bool writes_previous_dout(const Walk *walk, int j)
{
    const ResidualPlan *plan = walk->plan;
    if (!walk->delta || j - 1 < walk->first_sublayer ||
        plan->sublayer_block[j - 1] != plan->sublayer_block[j])
        return false;
    const SitePlan *site = &plan->sites[j];
    for (int k = 0; k < site->n_sources; k++)
        if (site->sources[k].grad_block == plan->sublayer_block[j])
            return false;
    return true;
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
    if (walk->delta) { /* d f_j = d p_{j+1} + d b_n, unless sublayer j + 1's norm wrote it */
        if (!walk->dout_written)
            backend->add(scratch->grad_output, grad_stream, grad_f, walk->count);
        grad_f = scratch->grad_output;
    }
    /* d x_j is written (its buffer holds nothing of this walk yet); in the delta form,
     * x_j = p_j + alpha * mix, it is also added into d p_j, and d f_{j-1} formed where it
     * may be (its dout is read before: the norm's backward is the sublayer's last op) */
    Activation *grad_x = route_walk_grad_x(&walk->sites, j);
    const bool writes_dout = writes_previous_dout(walk, j);
    const GradBranch branch = {
        grad_stream,
        writes_dout ? walk->store->grad_blocks[walk->plan->sublayer_block[j - 1]] : NULL,
        writes_dout ? scratch->grad_output : NULL,
    };
    sublayer_backward(walk->model, &walk->layer, j, saved, x, grad_f, grad_x, GRAD_WRITE,
                      walk->delta ? &branch : NULL);
    walk->dout_written = writes_dout;
    site_backward(walk, j, x, grad_x);
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
    site_backward(walk, L2, final_input, grad_final);
    if (walk->delta)
        backend->add_inplace(grad_stream, grad_final, walk->count);
}

void chunk_backward(Model *model, const ChunkSpan *span, Stash *stash, SummaryStore *store,
                    float loss_scale)
{
    check_stash(span, stash);
    if (stash->batch == 0)
        fatal(EXIT_CONFIG, "the backward of chunk %d needs its forward first", span->index);
    const int B = stash->batch, d = model->config.d_model;
    const size_t rows = (size_t)B * model->scratch.T;
    Walk walk = walk_begin(model, stash, store, B);
    walk.first_sublayer = span->first_sublayer;
    walk_sites_begin(&walk, true);
    const Backend *backend = model->backend;
    ModelScratch *scratch = &model->scratch;
    Activation *grad_stream = scratch->layer.grad_stream;

    const ParamTable *table = &model->table;
    const int shared = walk_shared_unit(&walk);
    if (shared >= 0)
        model_unit_acquire(model, shared, true);
    if (walk.delta)
        backend->zero(scratch->grad_null_rows, walk.bytes);
    if (span->has_head) {
        head_acquire(model, true);
        model_unit_prefetch(model, walk_next_unit(span, table, table->unit_head, false));
        head_backward(&walk, loss_scale);
        head_release(model, true);
    }
    walk_takes_spare_rows(&walk);
    for (int i = span->first_layer + span->n_layers - 1; i >= span->first_layer; i--) {
        const int routing = param_unit_of_layer_routing(table, i);
        if (routing >= 0 && routing_unit_edge(table, span, i, +1))
            model_unit_acquire(model, routing, true);
        model_unit_acquire(model, 1 + i, true);
        model_unit_prefetch(model, walk_next_unit(span, table, 1 + i, false));
        model->layer_grads[i].matrix_mode = model_unit_gradient_mode(model, 1 + i);
        layer_backward(&walk, i);
        model_unit_release(model, 1 + i, true);
        if (routing >= 0 && routing_unit_edge(table, span, i, -1))
            model_unit_release(model, routing, true);
    }

    if (span->has_embedding) {
        model_unit_acquire(model, 0, true);
        const Activation *grad_e = grad_stream;
        if (walk.delta)
            backend->add_inplace(grad_stream, store->grad_blocks[0], walk.count);
        else if (walk.routed)
            grad_e = store->grad_blocks[0];
        backend->embedding_backward(model->grad_embedding, grad_e, stash->inputs, (int)rows, d);
        model_unit_release(model, 0, true);
    }
    if (walk.delta) /* d route_null: the sum over tokens of the null source's gradient */
        backend->sum_rows(model->grad_route_null, scratch->grad_null_rows, (int)rows, d);
    if (shared >= 0)
        model_unit_release(model, shared, true);
    walk_end(&walk);
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
