/* model/model_units.c — where the model's parameters live: the FSDP units of
 * model/params.h held through runtime/fsdp.h, the views aimed into them, and the
 * initialisation of this rank's shards (model.h: model_create_sharded, model_init_params).
 *
 * Which units a rank holds follows from the chunks it runs: every layer of its chunks, the
 * embedding where a chunk starts the network (and, tied, where one ends it), the head unit
 * where a chunk ends it, and the shared routing unit wherever a chunk routes.
 */
#include <stdlib.h>
#include <string.h>

#include "model/init.h"
#include "model/model_internal.h"
#include "runtime/error.h"

static bool ends_with(const char *name, const char *suffix)
{
    const size_t length = strlen(name), suffix_length = strlen(suffix);
    return length >= suffix_length && !strcmp(name + length - suffix_length, suffix);
}

void chunk_units_of_table(const ParamTable *table, bool tie_embeddings, const ChunkSpan *span,
                          bool *units)
{
    if (span->has_embedding)
        units[0] = true;
    for (int i = span->first_layer; i < span->first_layer + span->n_layers; i++) {
        units[1 + i] = true;
        if (table->unit_routing_first >= 0)
            units[param_unit_of_layer_routing(table, i)] = true;
    }
    if (span->has_head) {
        units[table->unit_head] = true;
        if (tie_embeddings)
            units[0] = true;
    }
    if (table->units[table->unit_shared].n_params > 0) /* route_null, stream convs */
        units[table->unit_shared] = true;
}

void chunk_units(const Model *model, const ChunkSpan *span, bool *units)
{
    chunk_units_of_table(&model->table, model->config.tie_embeddings, span, units);
}

void chunk_unit_releases(const Model *model, const ChunkSpan *span, int *releases)
{
    const ParamTable *table = &model->table;
    bool *units = xcalloc((size_t)table->n_units, sizeof *units);
    chunk_units(model, span, units);
    for (int u = 0; u < table->n_units; u++)
        releases[u] += units[u];
    if (span->has_embedding && span->has_head && model->config.tie_embeddings)
        releases[0]++; /* the head and the embedding each release it */
    free(units);
}

/* The views of the non-routing tensors (model_sites.c registers the routing ones). */
static void register_views(Model *model)
{
    const ParamTable *table = &model->table;
    const ModelConfig *config = &model->config;
    UnitViews *views = model->unit_views;
    const int L = config->n_layers;
    model->layer_params = xcalloc((size_t)L, sizeof *model->layer_params);
    model->layer_grads = xcalloc((size_t)L, sizeof *model->layer_grads);
    for (int i = 0; i < L; i++)
        layer_views_add(&views[1 + i], &model->layer_params[i], &model->layer_grads[i], table,
                        i, config);
    const char *embedding = "model.embed_tokens.weight";
    unit_views_add(&views[0], table, &model->embedding, embedding, VIEW_COMPUTE, true);
    unit_views_add(&views[0], table, &model->grad_embedding, embedding, VIEW_GRADS, true);
    UnitViews *head = &views[table->unit_head];
    unit_views_add(head, table, &model->head_params.norm, "model.norm.weight", VIEW_COMPUTE,
                   true);
    unit_views_add(head, table, &model->head_grads.norm, "model.norm.weight", VIEW_GRADS, true);
    /* tied: the head's weight is the embedding, so it moves with unit 0 */
    UnitViews *head_weight = config->tie_embeddings ? &views[0] : head;
    const char *name = config->tie_embeddings ? embedding : "lm_head.weight";
    unit_views_add(head_weight, table, &model->head_params.head, name, VIEW_COMPUTE, true);
    unit_views_add(head_weight, table, &model->head_grads.head, name, VIEW_GRADS, true);
}

void model_units_create(Model *model, const ModelSharding *sharding)
{
    const ParamTable *table = &model->table;
    const int n_units = table->n_units;
    bool *local = xcalloc((size_t)n_units, sizeof *local);
    bool *pooled = xcalloc((size_t)n_units, sizeof *pooled);
    if (!sharding || !sharding->spans)
        for (int u = 0; u < n_units; u++)
            local[u] = true;
    else
        for (int s = 0; s < sharding->n_spans; s++)
            chunk_units(model, &sharding->spans[s], local);
    /* the decoder layers are gathered at each use under reshard_after_forward; the
     * embedding, head and shared units stay gathered (docs/design-notes.md) */
    for (int u = 1; sharding && sharding->reshard_after_forward && u <= model->config.n_layers;
         u++)
        pooled[u] = true;
    FsdpTensorSpec *tensors = xcalloc((size_t)table->n_params + 1, sizeof *tensors);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        tensors[p] = (FsdpTensorSpec){
            .rows = (size_t)entry->shape[0],
            .row_elements = entry->count / (size_t)entry->shape[0],
            .unit = entry->unit,
            .fp32_view = ends_with(entry->name, ".alpha") || ends_with(entry->name, ".mix_bias"),
            /* every contribution to these comes from matmul_backward, which can write the
             * first one (the projections, and the untied head; model.h) */
            .written_first = entry->kind == PARAM_MATRIX ||
                             !strcmp(entry->name, "lm_head.weight"),
        };
    }
    const FsdpSpec spec = {
        .backend = model->backend,
        .group = sharding ? sharding->data_parallel : NULL,
        .tensors = tensors,
        .n_tensors = table->n_params,
        .n_units = n_units,
        .local_units = local,
        .pooled_units = pooled,
        .alignment = PARAM_ALIGNMENT,
        .without_gradients = sharding && sharding->forward_only,
    };
    model->fsdp = fsdp_create(&spec);
    free(tensors);
    free(local);
    free(pooled);
    model->unit_views = xcalloc((size_t)n_units, sizeof *model->unit_views);
    register_views(model);
}

void model_units_bind_fixed(Model *model)
{
    /* one rank: every unit's buffers are its local shards, for the whole run */
    if (fsdp_dp_size(model->fsdp) > 1)
        return;
    for (int u = 0; u < model->table.n_units; u++)
        if (fsdp_unit_local(model->fsdp, u))
            unit_views_bind(&model->unit_views[u], model->backend, model->fsdp,
                            fsdp_acquire(model->fsdp, u, fsdp_has_gradients(model->fsdp)));
}

void model_units_destroy(Model *model)
{
    for (int u = 0; u < model->table.n_units; u++)
        unit_views_free(&model->unit_views[u]);
    free(model->unit_views);
    free(model->layer_params);
    free(model->layer_grads);
    fsdp_destroy(model->fsdp);
}

void model_unit_acquire(Model *model, int unit, bool for_backward)
{
    const FsdpUnitBuffers buffers = fsdp_acquire(model->fsdp, unit, for_backward);
    if (fsdp_dp_size(model->fsdp) > 1)
        unit_views_bind(&model->unit_views[unit], model->backend, model->fsdp, buffers);
}

void model_unit_release(Model *model, int unit, bool gradients)
{
    fsdp_release(model->fsdp, unit, gradients);
}

GradMode model_unit_gradient_mode(Model *model, int unit)
{
    return fsdp_gradient_mode(model->fsdp, unit);
}

void model_unit_prefetch(Model *model, int unit)
{
    fsdp_prefetch(model->fsdp, unit);
}

void model_init_params(Model *model, uint64_t seed, double init_std)
{
    /* one tensor's rows at a time through a host buffer the size of the largest shard */
    const ParamTable *table = &model->table;
    size_t largest = 1;
    for (int p = 0; p < table->n_params; p++) {
        const FsdpTensorPlace *place = fsdp_place(model->fsdp, p);
        const size_t count = place->held_rows * (table->params[p].count /
                                                 (size_t)table->params[p].shape[0]);
        largest = count > largest ? count : largest;
    }
    float *host = xmalloc(largest * sizeof *host);
    float *params = fsdp_local_params(model->fsdp);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        const FsdpTensorPlace *place = fsdp_place(model->fsdp, p);
        if (place->local_offset == SIZE_MAX || place->held_rows == 0)
            continue;
        const size_t row = entry->count / (size_t)entry->shape[0];
        init_fill_param_range(host, entry, place->row_begin * row, place->held_rows * row,
                              seed, init_std);
        model->backend->upload(params + place->local_offset, host,
                               place->held_rows * row * sizeof *host);
    }
    free(host);
    fsdp_refresh_compute(model->fsdp);
}

void model_zero_grads(Model *model)
{
    fsdp_step_begin(model->fsdp, NULL);
}
