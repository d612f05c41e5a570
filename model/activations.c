/* model/activations.c — see activations.h.
 *
 * Every buffer set is laid out twice by the same code: a first pass with no base address
 * only adds up the sizes, the second hands out pointers into the one allocation. Each buffer
 * starts on a 256-byte boundary (what vectorised and device loads like).
 */
#include "model/activations.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

#define ACTIVATION_ALIGNMENT 256

typedef struct {
    char *base;              /* NULL in the sizing pass */
    size_t used;             /* bytes handed out so far */
    size_t activation_bytes; /* the backend's activation element */
} Carver;

static void *carve_bytes(Carver *carver, size_t bytes)
{
    size_t start = carver->used;
    carver->used = start + (bytes + ACTIVATION_ALIGNMENT - 1) / ACTIVATION_ALIGNMENT *
                               ACTIVATION_ALIGNMENT;
    return carver->base ? carver->base + start : NULL;
}

static float *carve_floats(Carver *carver, size_t count)
{
    return carve_bytes(carver, count * sizeof(float));
}

static Activation *carve_activations(Carver *carver, size_t count)
{
    return carve_bytes(carver, count * carver->activation_bytes);
}

static uint32_t *carve_tokens(Carver *carver, size_t count)
{
    return carve_bytes(carver, count * sizeof(uint32_t));
}

typedef struct {
    size_t N, d, F, V, q_dim, kv_dim;
} Widths;

static Widths widths_of(const ModelConfig *config, int max_batch, int T)
{
    return (Widths){
        .N = (size_t)max_batch * T,
        .d = (size_t)config->d_model,
        .F = (size_t)config->ffn_dim,
        .V = (size_t)config->vocab_size,
        .q_dim = (size_t)config->n_heads * config->head_dim,
        .kv_dim = (size_t)config->n_kv_heads * config->head_dim,
    };
}

static void check_batch(int max_batch, int T)
{
    if (max_batch < 1)
        fatal(EXIT_CONFIG, "train.microbatch_size = %d must be >= 1", max_batch);
    if (T < 1)
        fatal(EXIT_CONFIG, "train.seq_len = %d must be >= 1", T);
}

/* Rows of one logits chunk: as many as fit in ACTIVATION_LOGIT_BYTES, at most N. */
static int logit_rows_for(const Backend *backend, const ModelConfig *config, size_t N)
{
    const size_t element = backend ? backend->activation_bytes : sizeof(float);
    const size_t row_bytes = (size_t)config->vocab_size * element;
    const size_t rows = row_bytes ? ACTIVATION_LOGIT_BYTES / row_bytes : N;
    return (int)(rows < 1 ? 1 : rows > N ? N : rows);
}

static void layer_layout(LayerActivations *layer, Carver *carver, const ModelConfig *config,
                         const Widths *w)
{
    const size_t N = w->N;
    layer->attention_normed = carve_activations(carver, N * w->d);
    layer->attention_rstd = carve_floats(carver, N);
    if (config->qk_norm) {
        layer->q_projected = carve_activations(carver, N * w->q_dim);
        layer->k_projected = carve_activations(carver, N * w->kv_dim);
        layer->q_norm_rstd = carve_floats(carver, N * config->n_heads);
        layer->k_norm_rstd = carve_floats(carver, N * config->n_kv_heads);
    }
    layer->q = carve_activations(carver, N * w->q_dim);
    layer->k = carve_activations(carver, N * w->kv_dim);
    layer->v = carve_activations(carver, N * w->kv_dim);
    layer->attention_output = carve_activations(carver, N * w->q_dim);
    layer->attention_lse = carve_floats(carver, N * config->n_heads);
    layer->mlp_normed = carve_activations(carver, N * w->d);
    layer->mlp_rstd = carve_floats(carver, N);
    layer->gate = carve_activations(carver, N * w->F);
    layer->up = carve_activations(carver, N * w->F);
    layer->hidden = carve_activations(carver, N * w->F);
}

static void site_layout(SiteActivations *site, Carver *carver, const ResidualPlan *plan,
                        int j, size_t N)
{
    const size_t H = (size_t)plan->heads, m = (size_t)plan->streams;
    const size_t sources = (size_t)plan->sites[j].n_sources;
    const bool msar = plan->mode == RESIDUAL_MSAR;
    if (residual_site_keeps_weights(plan)) {
        const size_t rstd_rows = (size_t)residual_site_rstd_rows(plan, j);
        site->weights = carve_floats(carver, m * sources * N * H);
        site->rstd = rstd_rows ? carve_floats(carver, rstd_rows * N) : NULL;
    }
    if (msar && m > 1) {
        site->mix_gates = carve_floats(carver, N * m);
        site->mix_rstd = carve_floats(carver, N * m);
    }
}

/* ---- the scratch ---- */

/* Hands out [N, d] rows of the two-phase walk: inside layer.grad_logits while it has room
 * (route_scratch_layout says why), then carved. Both passes hand out the same rows. */
typedef struct {
    Carver *carver;
    Activation *next; /* the next free row of grad_logits */
    size_t room;      /* rows grad_logits still takes */
    size_t count;     /* elements a row */
} BlockRows;

static Activation *block_row(BlockRows *rows)
{
    if (rows->room == 0)
        return carve_activations(rows->carver, rows->count);
    rows->room--;
    if (!rows->carver->base) /* the sizing pass: grad_logits is not placed yet */
        return NULL;
    Activation *row = rows->next;
    rows->next = (Activation *)((char *)row + rows->count * rows->carver->activation_bytes);
    return row;
}

static void route_scratch_layout(ModelScratch *scratch, Carver *carver,
                                 const ResidualPlan *plan, const Widths *w)
{
    const size_t N = w->N, d = w->d, H = (size_t)plan->heads, m = (size_t)plan->streams;
    const size_t M = (size_t)plan->max_sources;
    RouteScratch *route = &scratch->route;
    scratch->grad_input = carve_activations(carver, N * d);
    if (plan->form == FORM_DELTA) {
        scratch->grad_output = carve_activations(carver, N * d);
        scratch->null_rows = carve_activations(carver, N * d);
        scratch->grad_null_rows = carve_activations(carver, N * d);
        scratch->zero_tokens = carve_tokens(carver, N);
    }
    route->route_backward = carve_floats(carver, M * N * H);
    const bool msar_blocks = residual_two_phase(plan) && plan->mode == RESIDUAL_MSAR;
    if (residual_two_phase(plan)) { /* model/route_block.h */
        const size_t S = (size_t)plan->sublayers_per_block;
        /* The block buffers live inside one block of a chunk's layer walk; the logits'
         * gradient lives inside the head's backward. They never overlap, so the block
         * buffers take that buffer (1 GiB at a 128k vocabulary) as far as it goes, and the
         * rows past it are carved. */
        const size_t buffers = S * (scratch->checkpointing && !msar_blocks ? 2 : 1);
        BlockRows rows = {carver, scratch->layer.grad_logits,
                          (size_t)scratch->logit_capacity * w->V / (N * d), N * d};
        for (size_t b = 0; b < buffers; b++) {
            Activation *buffer = block_row(&rows);
            if (b < S)
                route->block_results[b] = buffer;
            if (b >= buffers - S)
                route->block_grads[b - (buffers - S)] = buffer;
        }
        if (msar_blocks) {
            for (size_t k = 0; k < m * (S + 1); k++)
                route->stream_slots[k] = block_row(&rows);
            for (size_t k = 0; k < M; k++)
                route->conv_rows[k] = block_row(&rows);
            if (plan->form == FORM_REPLACE) /* every stream's at once (route_block_streams.c) */
                for (size_t r = 0; r < m; r++)
                    route->partial_rows[r] = block_row(&rows);
            for (size_t k = 0; k < m * M; k++) /* every stream's: the convolutions'
                                                 * backward takes them at once */
                route->grad_conv_rows[k] = block_row(&rows);
            /* the open block's depth weights and key statistics, every stream's
             * (route_block_streams.c) */
            const size_t regions = m * S;
            route->block_weights = carve_floats(carver, regions * M * N * H);
            route->block_rstd = carve_floats(carver, regions * M * N);
        }
        if (plan->form == FORM_REPLACE) { /* each site's lse and softmax centre */
            route->block_lse = carve_floats(carver, m * S * N * H);
            route->block_means = carve_floats(carver, m * S * N * H);
        }
    }
    if (plan->mode != RESIDUAL_MSAR)
        return;
    /* A site routed alone (model_route_sites_alone) never runs while a block is open, so
     * with the two-phase rows laid out its o_r and d o_r take stream r's first two slots
     * (S + 1 >= 2). */
    for (size_t r = 0; r < m; r++) {
        const size_t S = (size_t)plan->sublayers_per_block;
        route->streams[r] = msar_blocks ? route->stream_slots[r * (S + 1)]
                                        : carve_activations(carver, N * d);
        route->grad_streams[r] = msar_blocks ? route->stream_slots[r * (S + 1) + 1]
                                             : carve_activations(carver, N * d);
    }
    route->mixed = carve_activations(carver, N * d);
    if (!residual_site_keeps_input(plan, 0)) /* x_j made again in the backward */
        route->site_input = carve_activations(carver, N * d);
}

static void scratch_layout(ModelScratch *scratch, Carver *carver, const ModelConfig *config,
                           const ResidualPlan *plan, const Widths *w)
{
    const size_t N = w->N, d = w->d;
    ActivationScratch *layer = &scratch->layer;
    layer->sublayer_output = carve_activations(carver, N * d);
    layer->grad_stream = carve_activations(carver, N * d);
    layer->grad_normed = carve_activations(carver, N * d);
    for (int k = 0; k < 2; k++) {
        layer->grad_q[k] = carve_activations(carver, N * w->q_dim);
        layer->grad_k[k] = carve_activations(carver, N * w->kv_dim);
    }
    layer->grad_v = carve_activations(carver, N * w->kv_dim);
    layer->grad_gate = carve_activations(carver, N * w->F);
    layer->grad_up = carve_activations(carver, N * w->F);
    layer->grad_hidden = carve_activations(carver, N * w->F);
    layer->grad_logits = carve_activations(carver, (size_t)scratch->logit_capacity * w->V);
    layer->grad_token_loss = carve_floats(carver, N);
    scratch->logits = carve_activations(carver, (size_t)scratch->logit_capacity * w->V);
    if (scratch->checkpointing) {
        layer_layout(&scratch->recompute, carver, config, w);
        scratch->recompute_x[0] = carve_activations(carver, N * d);
        scratch->recompute_x[1] = carve_activations(carver, N * d);
        scratch->recompute_stream = carve_activations(carver, N * d);
    }
    if (plan->mode != RESIDUAL_STANDARD)
        route_scratch_layout(scratch, carver, plan, w);
}

static void scratch_arrays_create(ModelScratch *scratch, const ResidualPlan *plan)
{
    RouteScratch *route = &scratch->route;
    if (plan->mode == RESIDUAL_STANDARD)
        return;
    route->taps = xcalloc((size_t)plan->max_sources, sizeof *route->taps);
    route->block_results = xcalloc((size_t)plan->sublayers_per_block, sizeof *route->block_results);
    route->block_grads = xcalloc((size_t)plan->sublayers_per_block, sizeof *route->block_grads);
    route->grad_taps = xcalloc((size_t)plan->max_sources, sizeof *route->grad_taps);
    route->streams = xcalloc((size_t)plan->streams, sizeof *route->streams);
    route->grad_streams = xcalloc((size_t)plan->streams, sizeof *route->grad_streams);
    route->stream_slots = xcalloc((size_t)plan->streams * (plan->sublayers_per_block + 1),
                                  sizeof *route->stream_slots);
    route->conv_rows = xcalloc((size_t)plan->max_sources, sizeof *route->conv_rows);
    route->partial_rows = xcalloc((size_t)plan->streams, sizeof *route->partial_rows);
    route->grad_conv_rows = xcalloc((size_t)plan->streams * plan->max_sources,
                                    sizeof *route->grad_conv_rows);
}

static void scratch_arrays_destroy(ModelScratch *scratch)
{
    free((void *)scratch->route.taps);
    free(scratch->route.block_results);
    free(scratch->route.block_grads);
    free(scratch->route.grad_taps);
    free(scratch->route.streams);
    free(scratch->route.grad_streams);
    free(scratch->route.stream_slots);
    free(scratch->route.conv_rows);
    free(scratch->route.partial_rows);
    free(scratch->route.grad_conv_rows);
}

/* The one backend allocation of a create below; failing is the user's size to shrink. */
static void *allocate_carved(const Backend *backend, size_t bytes, const char *what,
                             int max_batch, int T)
{
    void *memory = backend->alloc(bytes);
    if (!memory)
        fatal(EXIT_CONFIG, "cannot allocate %.2f GiB of %s for %d x %d tokens on the %s "
              "backend (lower train.microbatch_size or train.seq_len, or set "
              "train.activation_checkpointing: full)",
              (double)bytes / (1 << 30), what, max_batch, T, backend->name);
    return memory;
}

static void scratch_prepare(ModelScratch *scratch, const Backend *backend,
                            const ModelConfig *config, int max_batch, int T,
                            bool checkpointing)
{
    check_batch(max_batch, T);
    memset(scratch, 0, sizeof *scratch);
    scratch->max_batch = max_batch;
    scratch->T = T;
    scratch->checkpointing = checkpointing;
    scratch->logit_rows = logit_rows_for(backend, config, (size_t)max_batch * T);
    scratch->logit_capacity = scratch->logit_rows;
}

size_t scratch_bytes(const Backend *backend, const ModelConfig *config,
                     const ResidualPlan *plan, int max_batch, int T, bool checkpointing)
{
    ModelScratch scratch;
    scratch_prepare(&scratch, backend, config, max_batch, T, checkpointing);
    scratch_arrays_create(&scratch, plan);
    const Widths w = widths_of(config, max_batch, T);
    Carver sizing = {NULL, 0, backend ? backend->activation_bytes : sizeof(float)};
    scratch_layout(&scratch, &sizing, config, plan, &w);
    scratch_arrays_destroy(&scratch);
    return sizing.used;
}

void scratch_create(ModelScratch *scratch, const Backend *backend, const ModelConfig *config,
                    const ResidualPlan *plan, int max_batch, int T, bool checkpointing)
{
    scratch_prepare(scratch, backend, config, max_batch, T, checkpointing);
    scratch_arrays_create(scratch, plan);
    const Widths w = widths_of(config, max_batch, T);
    scratch->bytes = scratch_bytes(backend, config, plan, max_batch, T, checkpointing);
    scratch->memory =
        allocate_carved(backend, scratch->bytes, "scratch", max_batch, T);
    Carver carving = {scratch->memory, 0, backend->activation_bytes};
    scratch_layout(scratch, &carving, config, plan, &w);
    if (scratch->zero_tokens) /* route_null is row 0 of a one-row table, for every token */
        backend->zero(scratch->zero_tokens, w.N * sizeof(uint32_t));
}

void scratch_destroy(ModelScratch *scratch, const Backend *backend)
{
    if (scratch->memory)
        backend->release(scratch->memory);
    if (scratch->all_logits)
        backend->release(scratch->all_logits);
    scratch_arrays_destroy(scratch);
    memset(scratch, 0, sizeof *scratch);
}

/* ---- the stash of one (microbatch, chunk) ---- */

static bool stash_keeps_stream(const StashShape *shape, const ResidualPlan *plan, int j)
{
    const bool routed = plan->mode != RESIDUAL_STANDARD;
    if (routed) {
        if (j == plan->n_sublayers)
            return shape->has_head;
        return !shape->checkpointed && j >= shape->first_sublayer && j < shape->end_sublayer &&
               residual_site_keeps_input(plan, j);
    }
    if (j < shape->first_sublayer || j > shape->end_sublayer)
        return false;
    /* checkpointed: the layers' inputs and the chunk's output */
    return !shape->checkpointed || j % 2 == 0 || j == shape->end_sublayer;
}

static void stash_layout(Stash *stash, Carver *carver, const ModelConfig *config,
                         const ResidualPlan *plan, const Widths *w)
{
    const size_t N = w->N, d = w->d;
    const int L2 = 2 * config->n_layers;
    const StashShape shape = {stash->first_sublayer, stash->end_sublayer,
                              stash->has_embedding, stash->has_head, stash->checkpointed};
    for (int j = 0; j <= L2; j++)
        if (stash_keeps_stream(&shape, plan, j))
            stash->stream[j] = carve_activations(carver, N * d);
    for (int i = shape.first_sublayer / 2; i < shape.end_sublayer / 2; i++) {
        if (!shape.checkpointed)
            layer_layout(&stash->layers[i], carver, config, w);
        else if (plan->form == FORM_DELTA && plan->mode != RESIDUAL_STANDARD)
            stash->layer_stream[i] = carve_activations(carver, N * d);
    }
    for (int j = 0; j < plan->n_sites; j++) {
        const bool in_span = j >= shape.first_sublayer && j < shape.end_sublayer;
        if (in_span || (j == L2 && shape.has_head))
            site_layout(&stash->sites[j], carver, plan, j, N);
    }
    if (shape.has_head) {
        stash->head.final_normed = carve_activations(carver, N * d);
        stash->head.final_rstd = carve_floats(carver, N);
        stash->head.token_losses = carve_floats(carver, N);
        stash->head.token_lse = carve_floats(carver, N);
        stash->targets = carve_tokens(carver, N);
    }
    if (shape.has_embedding)
        stash->inputs = carve_tokens(carver, N);
}

static void stash_arrays_create(Stash *stash, const ModelConfig *config,
                                const ResidualPlan *plan, StashShape shape)
{
    memset(stash, 0, sizeof *stash);
    stash->first_sublayer = shape.first_sublayer;
    stash->end_sublayer = shape.end_sublayer;
    stash->has_embedding = shape.has_embedding;
    stash->has_head = shape.has_head;
    stash->checkpointed = shape.checkpointed;
    const int L = config->n_layers;
    stash->stream = xcalloc((size_t)2 * L + 1, sizeof *stash->stream);
    stash->layers = xcalloc((size_t)L, sizeof *stash->layers);
    stash->layer_stream = xcalloc((size_t)L, sizeof *stash->layer_stream);
    stash->sites = xcalloc((size_t)plan->n_sites + 1, sizeof *stash->sites);
}

static void stash_arrays_destroy(Stash *stash)
{
    free(stash->stream);
    free(stash->layers);
    free(stash->layer_stream);
    free(stash->sites);
}

static void check_shape(const ModelConfig *config, StashShape shape)
{
    const int L2 = 2 * config->n_layers;
    if (shape.first_sublayer < 0 || shape.first_sublayer % 2 || shape.end_sublayer % 2 ||
        shape.end_sublayer > L2 || shape.first_sublayer > shape.end_sublayer)
        fatal(EXIT_CONFIG, "a chunk over sublayers [%d, %d) of %d is not a span of layers",
              shape.first_sublayer, shape.end_sublayer, L2);
}

size_t stash_bytes(const Backend *backend, const ModelConfig *config, const ResidualPlan *plan,
                   int max_batch, int T, StashShape shape)
{
    check_batch(max_batch, T);
    check_shape(config, shape);
    Stash stash;
    stash_arrays_create(&stash, config, plan, shape);
    const Widths w = widths_of(config, max_batch, T);
    Carver sizing = {NULL, 0, backend ? backend->activation_bytes : sizeof(float)};
    stash_layout(&stash, &sizing, config, plan, &w);
    stash_arrays_destroy(&stash);
    return sizing.used;
}

void stash_create(Stash *stash, const Backend *backend, const ModelConfig *config,
                  const ResidualPlan *plan, int max_batch, int T, StashShape shape)
{
    const size_t bytes = stash_bytes(backend, config, plan, max_batch, T, shape);
    stash_arrays_create(stash, config, plan, shape);
    const Widths w = widths_of(config, max_batch, T);
    stash->bytes = bytes;
    stash->memory = allocate_carved(backend, bytes, "activations", max_batch, T);
    Carver carving = {stash->memory, 0, backend->activation_bytes};
    stash_layout(stash, &carving, config, plan, &w);
}

void stash_destroy(Stash *stash, const Backend *backend)
{
    if (stash->memory)
        backend->release(stash->memory);
    stash_arrays_destroy(stash);
    memset(stash, 0, sizeof *stash);
}

/* ---- the summary store of one microbatch ---- */

static void store_layout(SummaryStore *store, Carver *carver, const ResidualPlan *plan,
                         const Widths *w, const bool *needed)
{
    const size_t N = w->N, d = w->d;
    for (int b = 0; b < plan->n_buffers; b++)
        if (!needed || needed[b])
            store->summaries[b] = carve_activations(carver, N * d);
    if (plan->form == FORM_DELTA)
        store->stream = carve_activations(carver, N * d);
    for (int n = 0; n <= plan->n_blocks; n++)
        if (!needed || needed[plan->block_buffer[n]])
            store->grad_blocks[n] = carve_activations(carver, N * d);
}

static void store_arrays_create(SummaryStore *store, const ResidualPlan *plan)
{
    memset(store, 0, sizeof *store);
    store->n_buffers = plan->mode == RESIDUAL_STANDARD ? 0 : plan->n_buffers;
    store->n_blocks = plan->mode == RESIDUAL_STANDARD ? -1 : plan->n_blocks;
    store->summaries = xcalloc((size_t)store->n_buffers + 1, sizeof *store->summaries);
    store->grad_blocks = xcalloc((size_t)store->n_blocks + 2, sizeof *store->grad_blocks);
}

size_t store_bytes(const Backend *backend, const ModelConfig *config, const ResidualPlan *plan,
                   int max_batch, int T, const bool *needed)
{
    if (plan->mode == RESIDUAL_STANDARD)
        return 0;
    check_batch(max_batch, T);
    SummaryStore store;
    store_arrays_create(&store, plan);
    const Widths w = widths_of(config, max_batch, T);
    Carver sizing = {NULL, 0, backend ? backend->activation_bytes : sizeof(float)};
    store_layout(&store, &sizing, plan, &w, needed);
    free(store.summaries);
    free(store.grad_blocks);
    return sizing.used;
}

void store_create(SummaryStore *store, const Backend *backend, const ModelConfig *config,
                  const ResidualPlan *plan, int max_batch, int T, const bool *needed)
{
    const size_t bytes = store_bytes(backend, config, plan, max_batch, T, needed);
    store_arrays_create(store, plan);
    if (plan->mode == RESIDUAL_STANDARD)
        return;
    const Widths w = widths_of(config, max_batch, T);
    store->bytes = bytes;
    store->memory = allocate_carved(backend, bytes, "block summaries", max_batch, T);
    Carver carving = {store->memory, 0, backend->activation_bytes};
    store_layout(store, &carving, plan, &w, needed);
}

void store_destroy(SummaryStore *store, const Backend *backend)
{
    if (store->memory)
        backend->release(store->memory);
    free(store->summaries);
    free(store->grad_blocks);
    memset(store, 0, sizeof *store);
}
