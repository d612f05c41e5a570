/* checkpoints/hf_import.c — see hf_import.h. */
#include "checkpoints/hf_import.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/checkpoint_layout.h"
#include "checkpoints/hf_config.h"
#include "checkpoints/safetensors.h"
#include "model/init.h"
#include "model/params.h"
#include "runtime/error.h"
#include "runtime/timer.h"

typedef struct {
    const Config *config;
    const ParamTable *table;
    SafetensorsModel *source;
    const SafetensorsTensor **sources; /* [n_params]: the tensor each entry copies; NULL: fresh */
    HfImportSummary *summary;
    double started, last_report;
} ImportState;

static bool ends_with(const char *name, const char *suffix)
{
    size_t length = strlen(name), suffix_length = strlen(suffix);
    return length >= suffix_length && !strcmp(name + length - suffix_length, suffix);
}

/* Matches every base weight of the table to a safetensors tensor of the same name and shape,
 * and accounts for every safetensors tensor (DESIGN 2.3: the names are the same). */
static void match_tensors(ImportState *state, const char *hf_dir)
{
    const ParamTable *table = state->table;
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        if (entry->kind == PARAM_ROUTING)
            continue;
        const SafetensorsTensor *tensor = safetensors_find(state->source, entry->name);
        int64_t expected[3] = {entry->shape[0], entry->shape[1], entry->shape[2]};
        char expected_text[CHECKPOINT_SHAPE_TEXT_MAX], found_text[CHECKPOINT_SHAPE_TEXT_MAX];
        checkpoint_shape_format(entry->ndim, expected, expected_text, sizeof expected_text);
        if (!tensor)
            fatal(EXIT_DATA, "%s: tensor %s %s is missing from the safetensors", hf_dir,
                  entry->name, expected_text);
        bool same = tensor->ndim == entry->ndim;
        for (int axis = 0; same && axis < entry->ndim; axis++)
            same = tensor->shape[axis] == expected[axis];
        if (!same) {
            checkpoint_shape_format(tensor->ndim, tensor->shape, found_text, sizeof found_text);
            fatal(EXIT_DATA, "%s: tensor %s has shape %s in %s, the config makes it %s", hf_dir,
                  entry->name, found_text, state->source->paths[tensor->file], expected_text);
        }
        state->sources[p] = tensor;
    }
    for (int i = 0; i < state->source->n_tensors; i++) {
        const SafetensorsTensor *tensor = &state->source->tensors[i];
        const ParamEntry *entry = param_table_find(table, tensor->name);
        if (entry && entry->kind != PARAM_ROUTING)
            continue;
        if (ends_with(tensor->name, ".rotary_emb.inv_freq") ||
            (!strcmp(tensor->name, "lm_head.weight") && state->config->model.tie_embeddings)) {
            state->summary->n_skipped++;
            continue;
        }
        fatal(EXIT_DATA, "%s: tensor %s (in %s) has no place in the fathom model of the config",
              hf_dir, tensor->name, state->source->paths[tensor->file]);
    }
}

static void report_progress(ImportState *state, int index, int n_tensors)
{
    double now = timer_seconds();
    if (index + 1 < n_tensors && now - state->last_report < 1.0)
        return;
    state->last_report = now;
    double gigabytes = (double)state->summary->bytes_read / 1e9;
    double elapsed = now - state->started;
    printf("convert: tensor %d/%d | %.2f GB read | %.2f GB/s\n", index + 1, n_tensors,
           gigabytes, elapsed > 0 ? gigabytes / elapsed : 0.0);
    fflush(stdout);
}

/* CheckpointIo.read: the whole tensor `index` (the model group is the only one saved) */
static void fill_tensor(void *context, int group, int index, float *values, size_t count)
{
    ImportState *state = context;
    const ParamEntry *entry = &state->table->params[index];
    if (group != CKPT_GROUP_MODEL || count != entry->count)
        fatal(EXIT_DATA, "convert: the save asked for %zu elements of %s in group %d; it has "
              "%zu in /model", count, entry->name, group, entry->count);
    const SafetensorsTensor *source = state->sources[index];
    if (source) {
        safetensors_read(state->source, source, values);
        state->summary->bytes_read += source->bytes;
        state->summary->n_imported++;
    } else {
        init_fill_param(values, entry, state->config->seed, state->config->model.init_std);
        state->summary->n_fresh++;
    }
    report_progress(state, index, state->table->n_params);
}

void hf_import(const char *hf_dir, const Config *config, const char *config_name,
               HfImportSummary *summary)
{
    memset(summary, 0, sizeof *summary);
    hf_config_check(hf_dir, &config->model, config_name);
    ImportState state = {.config = config, .summary = summary, .started = timer_seconds()};
    SafetensorsModel source;
    safetensors_open(&source, hf_dir);
    ParamTable table;
    param_table_build_with_residual(&table, &config->model, &config->residual);
    state.source = &source;
    state.table = &table;
    state.sources = xcalloc((size_t)table.n_params, sizeof *state.sources);
    match_tensors(&state, hf_dir);
    printf("convert: %d tensors, %.2f GB in %d file%s; %d tensors to write\n",
           source.n_tensors, (double)source.total_bytes / 1e9, source.n_files,
           source.n_files == 1 ? "" : "s", table.n_params);
    fflush(stdout);

    CheckpointTensor *tensors = xcalloc((size_t)table.n_params, sizeof *tensors);
    for (int p = 0; p < table.n_params; p++) {
        const ParamEntry *entry = &table.params[p];
        tensors[p] = (CheckpointTensor){
            .name = entry->name,
            .ndim = entry->ndim,
            .shape = {entry->shape[0], entry->shape[1], entry->shape[2]},
            .offset = entry->offset,
        };
    }
    char *config_yaml = config_to_yaml(config);
    /* the layout of what is written: one process, one shard of whole tensors */
    CheckpointMeta meta = {.step = 0, .rng_seed = config->seed, .config_yaml = config_yaml,
                           .pp = 1, .dp = 1, .virtual_stages = 1};
    /* one process writing every row: checkpoint_save_sharded stages one tensor at a time */
    CheckpointRows *rows = xcalloc((size_t)table.n_params, sizeof *rows);
    for (int p = 0; p < table.n_params; p++)
        rows[p] = (CheckpointRows){0, tensors[p].shape[0]};
    const CheckpointIo io = {.context = &state, .read = fill_tensor};
    checkpoint_save_sharded(NULL, 0, 0, config->run_dir, &meta, tensors, table.n_params, rows,
                            1u << CKPT_GROUP_MODEL, &io);
    free(rows);
    summary->n_tensors = table.n_params;
    summary->seconds = timer_seconds() - state.started;
    free(config_yaml);
    free(tensors);
    free(state.sources);
    param_table_free(&table);
    safetensors_close(&source);
}
