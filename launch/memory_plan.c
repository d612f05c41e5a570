/* launch/memory_plan.c — see memory_plan.h. */
#include "launch/memory_plan.h"

#include "model/activations.h"
#include "model/chunk.h"
#include "model/params.h"
#include "model/residual.h"
#include "pipeline/payload.h"
#include "pipeline/schedule.h"
#include "runtime/error.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Past this many bytes per rank no machine holds the run (a pebibyte): the plan stops
 * sizing what would only add to it, and estimates instead of calling size_t functions that
 * could wrap. */
#define MEMORY_PLAN_BEYOND_ANY_MACHINE 1125899906842624.0 /* 2^50 */
/* Action lists longer than this are not built: the stash and store counts are then the
 * schedule's bound (pipeline/schedule.h), which they never exceed. */
enum { MEMORY_PLAN_MAX_ACTIONS = 1 << 22 };
/* Rows the per-token estimate of the activations is taken at. */
enum { MEMORY_PLAN_ESTIMATE_ROWS = 64 };
/* The synthetic corpus (runtime/data.c): at least these tokens and windows. */
enum {
    SYNTHETIC_TRAIN_TOKENS = 1 << 20,
    SYNTHETIC_TRAIN_WINDOWS = 256,
    SYNTHETIC_VALIDATION_TOKENS = 1 << 16,
    SYNTHETIC_VALIDATION_WINDOWS = 16,
};

/* ---- the parameter table, counted (model/params.c lays it out the same way) ---- */

typedef struct {
    double used, tensors, largest;
} TableCursor;

/* One tensor: it starts on the next multiple of PARAM_ALIGNMENT. */
static void place(TableCursor *cursor, double count)
{
    cursor->used = ceil(cursor->used / PARAM_ALIGNMENT) * PARAM_ALIGNMENT + count;
    cursor->tensors++;
    if (count > cursor->largest)
        cursor->largest = count;
}

/* query, key_norm, alpha, mix_bias, mix_proj of one routing site (DESIGN 2.3) */
static void place_site(TableCursor *cursor, const Config *config)
{
    const ResidualConfig *residual = &config->residual;
    const double d = config->model.d_model;
    const bool msar = residual->mode == RESIDUAL_MSAR;
    const double m = msar ? residual->streams : 1;
    place(cursor, m * d);
    place(cursor, m * d);
    if (residual->form == FORM_DELTA)
        place(cursor, 1);
    if (msar && m > 1) {
        place(cursor, m);
        place(cursor, m * d);
    }
}

void memory_plan_count_parameters(ParameterCount *count, const Config *config)
{
    const ModelConfig *model = &config->model;
    const ResidualConfig *residual = &config->residual;
    const bool routed = residual->mode != RESIDUAL_STANDARD;
    const bool msar = residual->mode == RESIDUAL_MSAR;
    const double d = model->d_model, V = model->vocab_size, F = model->ffn_dim;
    const double L = model->n_layers, hd = model->head_dim;
    const double q_dim = (double)model->n_heads * hd, kv_dim = (double)model->n_kv_heads * hd;
    memset(count, 0, sizeof *count);

    /* the units of model/params.h, in their order: the embedding, a decoder layer, the
     * head (final site, norm, lm_head), the shared routing rows, a block's routing sites */
    TableCursor unit0 = {0}, layer = {0}, last = {0}, shared = {0};
    place(&unit0, V * d);
    if (routed && residual->form == FORM_DELTA)
        place(&shared, d);
    if (msar) {
        const double S = residual->granularity == GRANULARITY_FULL
                             ? 1 : 2.0 * residual->layers_per_block;
        int kernel_max = 1;
        for (int r = 0; r < residual->streams && r < residual->n_stream_kernels; r++)
            if (residual->stream_kernels[r] > kernel_max)
                kernel_max = residual->stream_kernels[r];
        const double slots = ceil(2 * L / S) + 1;
        for (double slot = 0; slot < slots; slot++)
            place(&shared, residual->streams * (double)kernel_max * d);
    }
    place(&layer, d);
    place(&layer, q_dim * d);
    place(&layer, kv_dim * d);
    place(&layer, kv_dim * d);
    place(&layer, d * q_dim);
    if (model->qk_norm) {
        place(&layer, hd);
        place(&layer, hd);
    }
    place(&layer, d);
    place(&layer, F * d);
    place(&layer, F * d);
    place(&layer, d * F);
    if (routed)
        place_site(&last, config);
    place(&last, d);
    if (!model->tie_embeddings)
        place(&last, V * d);
    /* a routing unit: the two sites of each of its layers (params.h) */
    const double per_unit = routed && residual->granularity == GRANULARITY_BLOCK
                                ? residual->layers_per_block : 1;
    const double n_routing = routed ? ceil(L / per_unit) : 0;
    const double tail_layers = routed ? L - (n_routing - 1) * per_unit : 0;
    TableCursor routing = {0}, tail = {0};
    for (double i = 0; routed && i < per_unit; i++) {
        place_site(&routing, config);
        place_site(&routing, config);
    }
    for (double i = 0; routed && i < tail_layers; i++) {
        place_site(&tail, config);
        place_site(&tail, config);
    }

    const double align = PARAM_ALIGNMENT;
    count->embedding_unit = unit0.used;
    count->layer_unit = ceil(layer.used / align) * align;
    count->last_unit = last.used;
    count->shared_unit = shared.used;
    count->routing_unit = ceil(routing.used / align) * align;
    count->routing_tail = tail.used;
    count->routing_units = n_routing;
    count->layers_per_routing_unit = per_unit;
    /* every unit starts on a multiple of the alignment; the table ends where its last
     * unit does */
    double total = ceil(unit0.used / align) * align + L * count->layer_unit;
    total = ceil((total + last.used) / align) * align;
    total += shared.used;
    if (n_routing > 0)
        total = ceil(total / align) * align + (n_routing - 1) * count->routing_unit + tail.used;
    count->total = total;
    count->largest = fmax(fmax(unit0.largest, layer.largest), fmax(last.largest, shared.largest));
    count->layer_matrix = L * (2 * q_dim * d + 2 * kv_dim * d + 3 * F * d);
    count->tensors = unit0.tensors + L * layer.tensors + last.tensors + shared.tensors +
                     (n_routing > 0 ? (n_routing - 1) * routing.tensors + tail.tensors : 0);
}

/* The layers of the chunks stage `stage` runs (chunk c on stage c mod P; parallel.layer_split
 * or the even split of model/chunk.h, counted without building the spans). */
static double stage_layers(const Config *config, RankLayout layout)
{
    const int P = layout.pp, C = P * config->parallel.virtual_stages;
    const int L = config->model.n_layers;
    double layers = 0;
    for (int c = layout.stage; c < C; c += P)
        layers += config->parallel.n_layer_split > 0
                      ? config->parallel.layer_split[c]
                      : L / C + (c < L % C ? 1 : 0);
    return layers;
}

/* Which of the non-layer units the stage holds (runtime/fsdp.h, model/model_units.c): the
 * embedding on the first chunk's stage and, tied, on the last's; the head on the last's. */
static void stage_edges(const Config *config, RankLayout layout, bool *embedding, bool *head)
{
    const int C = layout.pp * config->parallel.virtual_stages;
    *head = (C - 1) % layout.pp == layout.stage;
    *embedding = layout.stage == 0 || (*head && config->model.tie_embeddings);
}

/* A rank of stage s holds the shards (1/D, rows padded) of the units its chunks read
 * (DESIGN 3, FSDP): its layers (with their routing weights), the embedding and the head
 * where its chunks start or end the network. The shared routing rows, a few [d], and the
 * per-tensor row padding are left out. */
double memory_plan_rank_elements(const ParameterCount *count, const Config *config,
                                 RankLayout layout)
{
    const double D = layout.dp, align = PARAM_ALIGNMENT;
    bool embedding, head;
    stage_edges(config, layout, &embedding, &head);
    const double layers = stage_layers(config, layout);
    /* the local layout of runtime/fsdp.h: units in order, each starting on a multiple of
     * the alignment whether held or not, the held ones' shards in them (with one rank and
     * every unit: the table itself) */
    double E = embedding ? ceil(count->embedding_unit / D) : 0;
    E = ceil(E / align) * align + layers * ceil(count->layer_unit / D);
    E = ceil(E / align) * align + (head ? ceil(count->last_unit / D) : 0);
    E = ceil(E / align) * align + ceil(count->shared_unit / D);
    if (count->routing_units > 0) {
        const double units = layout.pp == 1 ? count->routing_units
                                            : ceil(layers / count->layers_per_routing_unit);
        const double tail = layout.pp == 1 || head ? count->routing_tail : count->routing_unit;
        E = ceil(E / align) * align + (units - 1) * ceil(count->routing_unit / D) +
            ceil(tail / D);
    }
    return E;
}

/* With D > 1 the units are also gathered whole (runtime/fsdp.h): every held unit for the run
 * when fsdp.reshard_after_forward is false; else two pool slots of a layer, and the
 * embedding and head held whole. Each gathered element has a compute copy and an fp32
 * gradient. */
static double rank_gathered_elements(const ParameterCount *count, const Config *config,
                                     RankLayout layout)
{
    if (layout.dp == 1)
        return 0;
    bool embedding, head;
    stage_edges(config, layout, &embedding, &head);
    const double layers = config->fsdp.reshard_after_forward ? 2 : stage_layers(config, layout);
    return layers * count->layer_unit + (embedding ? count->embedding_unit : 0) +
           (head ? count->last_unit : 0);
}

/* ---- the activations, as pipeline/executor.c allocates them ---- */

/* The stashes each local chunk keeps and the stores the stage keeps, counted as the executor
 * counts them (schedule_count_in_flight); the schedule's bound where the list is long. */
static void count_in_flight(const Config *config, RankLayout layout, int M, int *slots,
                            int *stores)
{
    const PipelineSchedule kind = config->parallel.schedule;
    const int P = layout.pp, v = config->parallel.virtual_stages;
    const int bound = schedule_stash_bound(kind, P, v, M, layout.stage);
    if (2.0 * M * v > MEMORY_PLAN_MAX_ACTIONS) {
        for (int k = 0; k < v; k++)
            slots[k] = bound < M ? bound : M;
        *stores = bound < M ? bound : M;
        return;
    }
    const int n_actions = schedule_actions(kind, P, v, M, layout.stage, NULL, 0);
    Action *actions = xcalloc((size_t)n_actions, sizeof *actions);
    schedule_actions(kind, P, v, M, layout.stage, actions, n_actions);
    schedule_count_in_flight(actions, n_actions, P, v, M, slots, stores);
    free(actions);
}

/* The summary buffers the stage's chunks touch (model/chunk_span.c's store_needed_buffers,
 * which takes a Model for its plan only). NULL: all (mode standard has none). */
static bool *needed_buffers(const ResidualPlan *plan, const ChunkSpan *mine, int n)
{
    if (plan->mode == RESIDUAL_STANDARD)
        return NULL;
    bool *needed = xcalloc((size_t)plan->n_buffers, sizeof *needed);
    int end_block = 0;
    for (int k = 0; k < n; k++) {
        if (mine[k].end_block > end_block)
            end_block = mine[k].end_block;
        for (int j = mine[k].first_sublayer; j < mine[k].end_sublayer; j++)
            needed[plan->sublayer_buffer[j]] = true;
    }
    for (int block = 0; block < end_block && block <= plan->n_blocks; block++)
        needed[plan->block_buffer[block]] = true;
    return needed;
}

typedef struct {
    double stashes, stores, scratch;
} ActivationSizes;

static ActivationSizes size_activations(const Backend *backend, const Config *config,
                                        const ResidualPlan *residual, const ChunkSpan *mine,
                                        const int *slots, int stores, const bool *needed,
                                        int max_batch, int T)
{
    const bool checkpointed = config->train.activation_checkpointing == CHECKPOINTING_FULL;
    ActivationSizes sizes = {0};
    for (int k = 0; k < config->parallel.virtual_stages; k++)
        sizes.stashes += (double)slots[k] *
                         (double)stash_bytes(backend, &config->model, residual, max_batch, T,
                                             chunk_stash_shape(&mine[k], checkpointed));
    sizes.stores = (double)stores * (double)store_bytes(backend, &config->model, residual,
                                                        max_batch, T, needed);
    sizes.scratch = (double)scratch_bytes(backend, &config->model, residual, max_batch, T,
                                          checkpointed);
    return sizes;
}

/* Hop tensors this stage's links hold at once (runtime/device_comm.h: a sent tensor is held
 * until its receiver takes it). A forward hop from (mb, c) is taken by the receiver's
 * forward of (mb, c+1), which comes before this stage's backward of (mb, c): at most this
 * stage's stash bound of them are out. A backward hop into (mb, c-1) is taken by the
 * receiver's backward of it, while the receiver still keeps that stash: at most the
 * receiving stage's bound. Each at the largest hop of the network. */
static double hop_held_tensors(const Config *config, RankLayout layout,
                               const ResidualPlan *residual, const ChunkSpan *spans, int M)
{
    const int P = layout.pp, v = config->parallel.virtual_stages, C = P * v;
    if (C == 1)
        return 0;
    int largest = 0;
    for (int c = 0; c < C - 1; c++) {
        const HopPayload hop = payload_hop(residual, spans, C, P, c, true);
        const int tensors = (hop.stream ? 1 : 0) + hop.end_block - hop.first_block;
        largest = tensors > largest ? tensors : largest;
    }
    const PipelineSchedule kind = config->parallel.schedule;
    const int previous = (layout.stage - 1 + P) % P;
    return (double)largest * (schedule_stash_bound(kind, P, v, M, layout.stage) +
                              schedule_stash_bound(kind, P, v, M, previous));
}

static void plan_activations(MemoryPlan *plan, const Config *config, const Backend *backend,
                             RankLayout layout)
{
    const ModelConfig *model = &config->model;
    const int P = layout.pp, v = config->parallel.virtual_stages, C = P * v;
    const int M = config_microbatches_per_rank(config);
    const char *problem = schedule_check(config->parallel.schedule, P, v, M);
    if (problem)
        fatal(EXIT_CONFIG, "%s", problem);
    ResidualPlan residual;
    residual_plan_build(&residual, model, &config->residual);
    ChunkSpan *spans = xcalloc((size_t)C, sizeof *spans);
    chunk_spans_build(spans, C, model, &residual, config->parallel.layer_split,
                      config->parallel.n_layer_split);
    ChunkSpan *mine = xcalloc((size_t)v, sizeof *mine);
    for (int k = 0; k < v; k++)
        mine[k] = spans[k * P + layout.stage];
    int *slots = xcalloc((size_t)v, sizeof *slots);
    count_in_flight(config, layout, M, slots, &plan->stores);
    for (int k = 0; k < v; k++)
        plan->stashes += slots[k];
    bool *needed = needed_buffers(&residual, mine, v);

    /* sized per token first: the exact size_t sums only where they cannot wrap */
    const int max_batch = config->train.microbatch_size, T = config->train.seq_len;
    const double rows = (double)max_batch * T;
    ActivationSizes sizes;
    plan->activations_exact = true;
    if (rows > MEMORY_PLAN_ESTIMATE_ROWS) {
        sizes = size_activations(backend, config, &residual, mine, slots, plan->stores, needed,
                                 1, MEMORY_PLAN_ESTIMATE_ROWS);
        const double scale = rows / MEMORY_PLAN_ESTIMATE_ROWS;
        sizes.stashes *= scale;
        sizes.stores *= scale;
        sizes.scratch *= scale;
        plan->activations_exact =
            sizes.stashes + sizes.stores + sizes.scratch < MEMORY_PLAN_BEYOND_ANY_MACHINE;
    }
    if (plan->activations_exact)
        sizes = size_activations(backend, config, &residual, mine, slots, plan->stores, needed,
                                 max_batch, T);
    plan->stash_bytes = sizes.stashes;
    plan->store_bytes = sizes.stores;
    plan->scratch_bytes = sizes.scratch;
    /* model.c: cos and sin tables [T, head_dim / 2] fp32; executor.c: one [rows, d]
     * activation tensor where a received gradient lands, under pp; the hop links' held
     * sends (an upper bound; host memory where the link stages through MPI) */
    plan->rope_bytes = 2.0 * fmax((double)T * (model->head_dim / 2), 1) * sizeof(float);
    plan->staging_bytes = P > 1 ? rows * model->d_model * backend->activation_bytes : 0;
    plan->held_bytes = hop_held_tensors(config, layout, &residual, spans, M) * rows *
                       model->d_model * backend->activation_bytes;
    plan->activations = plan->stash_bytes + plan->store_bytes + plan->scratch_bytes +
                        plan->rope_bytes + plan->staging_bytes + plan->held_bytes;
    plan->activations_sized = true;
    free(needed);
    free(slots);
    free(mine);
    free(spans);
    residual_plan_free(&residual);
}

/* Host memory besides the backend's (the rest of memory_plan.h's `host`). */
static double host_bytes(const Config *config, const ParameterCount *count)
{
    const double T = config->train.seq_len, window = (T + 1) * sizeof(uint32_t);
    const double rows = (double)config->train.microbatch_size * T;
    double bytes = 2 * rows * sizeof(uint32_t) + window; /* batch inputs, targets; a window */
    if (config->data.source == DATA_SYNTHETIC) {
        bytes += fmax(SYNTHETIC_TRAIN_TOKENS, SYNTHETIC_TRAIN_WINDOWS * (T + 1)) *
                 sizeof(uint32_t);
        if (config->eval.every > 0)
            bytes += fmax(SYNTHETIC_VALIDATION_TOKENS, SYNTHETIC_VALIDATION_WINDOWS * (T + 1)) *
                         sizeof(uint32_t) + window;
    }
    bytes += count->largest * sizeof(float); /* the step's staging of one tensor */
    /* bookkeeping: the parameter table, the residual plan's sources (at most n_blocks + 2
     * per site, 2L + 1 sites) and the executor's action list */
    const ResidualConfig *residual = &config->residual;
    const double L = config->model.n_layers;
    bytes += count->tensors * sizeof(ParamEntry);
    if (residual->mode != RESIDUAL_STANDARD) {
        const double S = residual->granularity == GRANULARITY_FULL
                             ? 1 : 2.0 * residual->layers_per_block;
        bytes += (2 * L + 1) * (ceil(2 * L / S) + 2) * sizeof(SiteSource);
    }
    const double M = config_microbatches_per_rank(config);
    bytes += 2 * M * config->parallel.virtual_stages * sizeof(Action) + M * sizeof(int);
    return bytes;
}

void memory_plan_build(MemoryPlan *plan, const Config *config, const Backend *backend,
                       RankLayout layout)
{
    memset(plan, 0, sizeof *plan);
    ParameterCount count;
    memory_plan_count_parameters(&count, config);
    const double E = memory_plan_rank_elements(&count, config, layout);
    plan->elements = E;
    plan->parameters = 4 * E;
    plan->gradients = 4 * E;
    plan->compute_copy = backend->activation_bytes == sizeof(float)
                             ? 0 : E * backend->activation_bytes;
    const double gathered = rank_gathered_elements(&count, config, layout);
    plan->compute_copy += gathered * backend->activation_bytes;
    plan->gradients += gathered * 4;
    plan->optimizer = (config->optim.ema_decay > 0 ? 3 : 2) * 4 * E;
    plan->host = host_bytes(config, &count);
    const double so_far = plan->parameters + plan->gradients + plan->compute_copy +
                          plan->optimizer + plan->host;
    if (so_far < MEMORY_PLAN_BEYOND_ANY_MACHINE)
        plan_activations(plan, config, backend, layout);
}

double memory_plan_backend_bytes(const MemoryPlan *plan)
{
    return plan->parameters + plan->gradients + plan->compute_copy + plan->optimizer +
           plan->activations;
}

double memory_plan_evaluation_bytes(const Config *config, const Backend *backend)
{
    const ModelConfig *model = &config->model;
    ParameterCount count;
    memory_plan_count_parameters(&count, config);
    const double E = memory_plan_rank_elements(&count, config, (RankLayout){1, 1, 0, 0});
    const double compute = backend->activation_bytes == sizeof(float)
                               ? 0 : (double)backend->activation_bytes;
    ResidualPlan residual;
    residual_plan_build(&residual, model, &config->residual);
    ChunkSpan whole;
    chunk_spans_build(&whole, 1, model, &residual, NULL, 0);
    const StashShape shape = chunk_stash_shape(&whole, true);
    /* sized per token first, as plan_activations does: exactly only where the size_t sums
     * cannot wrap */
    const int B = config->train.microbatch_size, T = config->train.seq_len;
    const double rows = (double)B * T;
    double activations =
        ((double)stash_bytes(backend, model, &residual, 1, MEMORY_PLAN_ESTIMATE_ROWS, shape) +
         (double)store_bytes(backend, model, &residual, 1, MEMORY_PLAN_ESTIMATE_ROWS, NULL) +
         (double)scratch_bytes(backend, model, &residual, 1, MEMORY_PLAN_ESTIMATE_ROWS, true)) *
        (rows / MEMORY_PLAN_ESTIMATE_ROWS);
    if (activations < MEMORY_PLAN_BEYOND_ANY_MACHINE)
        activations = (double)stash_bytes(backend, model, &residual, B, T, shape) +
                      (double)store_bytes(backend, model, &residual, B, T, NULL) +
                      (double)scratch_bytes(backend, model, &residual, B, T, true);
    residual_plan_free(&residual);
    const double rope = 2.0 * fmax((double)T * (model->head_dim / 2), 1) * sizeof(float);
    return E * (sizeof(float) + compute) + activations + rope;
}
