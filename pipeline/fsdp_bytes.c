/* pipeline/fsdp_bytes.c — see fsdp_bytes.h. */
#include "pipeline/fsdp_bytes.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/chunk.h"
#include "model/params.h"
#include "model/residual.h"
#include "runtime/error.h"

static bool ends_with(const char *name, const char *suffix)
{
    const size_t length = strlen(name), suffix_length = strlen(suffix);
    return length >= suffix_length && !strcmp(name + length - suffix_length, suffix);
}

size_t fsdp_shard_elements(const ParamEntry *entry, int D)
{
    const size_t rows = (size_t)entry->shape[0];
    return (rows + (size_t)D - 1) / (size_t)D * (entry->count / rows);
}

/* Per rank, one gather and one reduce-scatter of unit u. */
static void unit_bytes(const ParamTable *table, int u, uint64_t D, size_t activation_bytes,
                       uint64_t *gather, uint64_t *reduce)
{
    const ParamUnit *unit = &table->units[u];
    *gather = *reduce = 0;
    for (int p = unit->first_param; p < unit->first_param + unit->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        const uint64_t shard = fsdp_shard_elements(entry, (int)D);
        *gather += (D - 1) * shard * activation_bytes;
        const bool fp32_view = ends_with(entry->name, ".alpha") ||
                               ends_with(entry->name, ".mix_bias");
        if (fp32_view && activation_bytes != sizeof(float))
            *gather += (D - 1) * shard * sizeof(float);
        *reduce += (D - 1) * shard * sizeof(float);
    }
}

FsdpBytes fsdp_predict_step_bytes(const Config *config, int stage, size_t activation_bytes)
{
    FsdpBytes bytes = {0, 0};
    const uint64_t D = (uint64_t)config->parallel.dp;
    if (D == 1)
        return bytes;
    ParamTable table;
    param_table_build_with_residual(&table, &config->model, &config->residual);
    ResidualPlan plan;
    residual_plan_build(&plan, &config->model, &config->residual);
    const int P = config->parallel.pp, chunks = P * config->parallel.virtual_stages;
    ChunkSpan *spans = xcalloc((size_t)chunks, sizeof *spans);
    chunk_spans_build(spans, chunks, &config->model, &plan, config->parallel.layer_split,
                      config->parallel.n_layer_split);
    /* uses: how many chunk walks of one microbatch read each unit on this stage (a walk
     * acquires a unit it reads once, except the tied embedding at both ends of one chunk) */
    int *uses = xcalloc((size_t)table.n_units, sizeof *uses);
    bool *read = xcalloc((size_t)table.n_units, sizeof *read);
    for (int c = stage; c < chunks; c += P) {
        memset(read, 0, (size_t)table.n_units * sizeof *read);
        chunk_units_of_table(&table, config->model.tie_embeddings, &spans[c], read);
        for (int u = 0; u < table.n_units; u++)
            uses[u] += read[u];
        if (spans[c].has_embedding && spans[c].has_head && config->model.tie_embeddings)
            uses[0]++;
    }
    const uint64_t M = (uint64_t)config_microbatches_per_rank(config);
    for (int u = 0; u < table.n_units; u++) {
        if (!uses[u])
            continue;
        uint64_t gather, reduce;
        unit_bytes(&table, u, D, activation_bytes, &gather, &reduce);
        const bool pooled = config->fsdp.reshard_after_forward && u >= 1 &&
                            u <= config->model.n_layers;
        /* pooled: each forward and each backward gathers; persistent: once a step */
        bytes.allgather += gather * (pooled ? 2 * M * (uint64_t)uses[u] : 1);
        bytes.reducescatter += reduce * (pooled ? M * (uint64_t)uses[u] : 1);
    }
    free(uses);
    free(read);
    free(spans);
    residual_plan_free(&plan);
    param_table_free(&table);
    return bytes;
}
