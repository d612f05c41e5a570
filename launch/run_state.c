/* launch/run_state.c — see run_state.h. */
#include "launch/run_state.h"

#include "checkpoints/checkpoint.h"
#include "model/params.h"
#include "runtime/metrics.h"
#include "runtime/config_keys.h"
#include "runtime/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void run_state_create(RunState *state, Model *model, const Config *config)
{
    const Backend *backend = model_backend(model);
    size_t bytes = model_param_table(model)->total * sizeof(float);
    memset(state, 0, sizeof *state);
    state->exp_avg = backend->alloc(bytes);
    state->exp_avg_sq = backend->alloc(bytes);
    if (config->optim.ema_decay > 0)
        state->ema = backend->alloc(bytes);
}

void run_state_destroy(RunState *state, Model *model)
{
    const Backend *backend = model_backend(model);
    backend->release(state->exp_avg);
    backend->release(state->exp_avg_sq);
    if (state->ema)
        backend->release(state->ema);
    memset(state, 0, sizeof *state);
}

/* checkpoints/ reads and writes host memory. On a backend whose memory is elsewhere the
 * groups go through host copies of `count` floats each: staged[g] is the array the
 * checkpoint code sees (the backend array itself on cpu). */
typedef struct {
    const Backend *backend;
    size_t count;
    float *backend_arrays[CKPT_GROUPS];
    float *staged[CKPT_GROUPS];
} HostStage;

static bool backend_memory_is_host(const Backend *backend)
{
    return backend == backend_cpu();
}

static void stage_begin(HostStage *stage, const Backend *backend, size_t count,
                        float *const backend_arrays[CKPT_GROUPS], bool download)
{
    stage->backend = backend;
    stage->count = count;
    for (int g = 0; g < CKPT_GROUPS; g++) {
        float *array = backend_arrays[g];
        stage->backend_arrays[g] = array;
        stage->staged[g] = array;
        if (!array || backend_memory_is_host(backend))
            continue;
        stage->staged[g] = xmalloc(count * sizeof(float));
        if (download)
            backend->download(stage->staged[g], array, count * sizeof(float));
    }
}

/* upload: the staged values go back to the backend arrays (after a load) */
static void stage_end(HostStage *stage, bool upload)
{
    for (int g = 0; g < CKPT_GROUPS; g++) {
        if (stage->staged[g] == stage->backend_arrays[g])
            continue;
        if (upload)
            stage->backend->upload(stage->backend_arrays[g], stage->staged[g],
                                   stage->count * sizeof(float));
        free(stage->staged[g]);
    }
}

/* The checkpoint's view of the parameter table: names, shapes and flat offsets. */
static CheckpointTensor *checkpoint_tensors_of(const ParamTable *table)
{
    CheckpointTensor *tensors = xcalloc((size_t)table->n_params, sizeof *tensors);
    for (int i = 0; i < table->n_params; i++) {
        const ParamEntry *entry = &table->params[i];
        tensors[i] = (CheckpointTensor){
            .name = entry->name,
            .ndim = entry->ndim,
            .shape = {entry->shape[0], entry->shape[1], entry->shape[2]},
            .offset = entry->offset,
        };
    }
    return tensors;
}

void run_state_save(const RunState *state, Model *model, const Config *config)
{
    const ParamTable *table = model_param_table(model);
    CheckpointTensor *tensors = checkpoint_tensors_of(table);
    char *config_yaml = config_to_yaml(config);
    CheckpointMeta meta = {
        .step = state->step,
        .consumed_samples = state->consumed_samples,
        .tokens_seen = state->tokens_seen,
        .optimizer_steps = state->optimizer_steps,
        .skipped_steps = state->skipped_steps,
        .rng_seed = config->seed,
        .config_yaml = config_yaml,
        .pp = config->parallel.pp,
        .dp = config->parallel.dp,
        .virtual_stages = config->parallel.virtual_stages,
        .n_layer_split = config->parallel.n_layer_split,
    };
    memcpy(meta.layer_split, config->parallel.layer_split, sizeof meta.layer_split);
    float *const arrays[CKPT_GROUPS] = {
        [CKPT_GROUP_MODEL] = model_params(model),
        [CKPT_GROUP_EMA] = state->ema,
        [CKPT_GROUP_EXP_AVG] = state->exp_avg,
        [CKPT_GROUP_EXP_AVG_SQ] = state->exp_avg_sq,
    };
    HostStage stage;
    stage_begin(&stage, model_backend(model), table->total, arrays, true);
    const float *data[CKPT_GROUPS];
    for (int g = 0; g < CKPT_GROUPS; g++)
        data[g] = stage.staged[g];
    checkpoint_save(config->run_dir, &meta, tensors, table->n_params, data);
    stage_end(&stage, false);
    checkpoint_apply_retention(config->run_dir, config->checkpoint.keep_last,
                               config->checkpoint.keep_every);
    free(config_yaml);
    free(tensors);
}

/* The lines of one top-level section ("model:", "residual:") of a resolved config. */
static const char *section_line(const char *yaml, const char *section, int index)
{
    const char *line = yaml;
    size_t section_length = strlen(section);
    bool inside = false;
    int seen = 0;
    while (line && *line) {
        bool top_level = line[0] != ' ' && line[0] != '\n';
        if (top_level)
            inside = !strncmp(line, section, section_length) && line[section_length] == ':';
        else if (inside && seen++ == index)
            return line;
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return NULL;
}

static size_t line_length(const char *line)
{
    const char *end = strchr(line, '\n');
    return end ? (size_t)(end - line) : strlen(line);
}

/* A run continues only the network it started: every key of the model and residual
 * sections must match the checkpoint's. */
static void check_same_network(const char *saved_yaml, const Config *config,
                               const char *step_dir)
{
    Config saved;
    config_load_text(&saved, saved_yaml, step_dir, NULL, 0, CONFIG_ANY_WORLD);
    char *saved_text = config_to_yaml(&saved);
    char *current_text = config_to_yaml(config);
    static const char *const sections[] = {"model", "residual"};
    for (int s = 0; s < 2; s++) {
        for (int i = 0;; i++) {
            const char *a = section_line(saved_text, sections[s], i);
            const char *b = section_line(current_text, sections[s], i);
            if (!a && !b)
                break;
            if (!a || !b || line_length(a) != line_length(b) ||
                strncmp(a, b, line_length(a)))
                fatal(EXIT_CONFIG,
                      "%s holds a checkpoint of another network: %s section differs "
                      "(checkpoint '%.*s', config '%.*s'); use a new run_dir",
                      step_dir, sections[s], a ? (int)line_length(a) : 0, a ? a : "",
                      b ? (int)line_length(b) : 0, b ? b : "");
        }
    }
    free(saved_text);
    free(current_text);
}

/* Every key outside the network that differs from the checkpoint's config, on one line
 * (a resume may change the learning rate, the steps, the layout...; it should say so). */
static void print_changed_keys(const char *saved_yaml, const Config *config,
                               const char *step_dir)
{
    Config saved;
    config_load_text(&saved, saved_yaml, step_dir, NULL, 0, CONFIG_ANY_WORLD);
    char *changes = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&changes, &length);
    int n = 0;
    for (int i = 0; i < config_key_count; i++) {
        const ConfigKey *key = &config_key_table[i];
        char *before = NULL, *after = NULL;
        size_t before_length = 0, after_length = 0;
        FILE *a = open_memstream(&before, &before_length);
        FILE *b = open_memstream(&after, &after_length);
        config_key_write_value(&saved, key, a);
        config_key_write_value(config, key, b);
        fclose(a);
        fclose(b);
        if (strcmp(before, after))
            fprintf(out, "%s%s %s -> %s", n++ ? ", " : "", key->path, before, after);
        free(before);
        free(after);
    }
    fclose(out);
    if (n)
        printf("fathom: resuming with %d changed key%s: %s\n", n, n == 1 ? "" : "s", changes);
    free(changes);
}

void run_state_restore(RunState *state, Model *model, const Config *config,
                       const char *step_dir)
{
    CheckpointMeta meta;
    char *saved_yaml = NULL;
    char resolved_dir[CONFIG_PATH_MAX];
    checkpoint_read_meta(step_dir, &meta, &saved_yaml, resolved_dir, sizeof resolved_dir);
    check_same_network(saved_yaml, config, resolved_dir);
    print_changed_keys(saved_yaml, config, resolved_dir);

    const ParamTable *table = model_param_table(model);
    CheckpointTensor *tensors = checkpoint_tensors_of(table);
    /* A step-0 import (fathom convert) holds only /model (DESIGN 5): the moments stay at
     * the zeros run_state_create gave them and the EMA starts at the weights. */
    float *arrays[CKPT_GROUPS] = {
        [CKPT_GROUP_MODEL] = model_params(model),
        [CKPT_GROUP_EMA] = state->ema,
        [CKPT_GROUP_EXP_AVG] = state->exp_avg,
        [CKPT_GROUP_EXP_AVG_SQ] = state->exp_avg_sq,
    };
    for (int g = CKPT_GROUP_EMA; g < CKPT_GROUPS; g++)
        if (arrays[g] && !checkpoint_has_group(resolved_dir, g))
            arrays[g] = NULL;
    HostStage stage;
    stage_begin(&stage, model_backend(model), table->total, arrays, false);
    checkpoint_load(resolved_dir, tensors, table->n_params, stage.staged);
    stage_end(&stage, true);
    if (state->ema && !arrays[CKPT_GROUP_EMA])
        model_backend(model)->copy(state->ema, model_params(model),
                                   table->total * sizeof(float));
    model_refresh_compute_copy(model);
    state->step = meta.step;
    state->consumed_samples = meta.consumed_samples;
    state->tokens_seen = meta.tokens_seen;
    state->optimizer_steps = meta.optimizer_steps;
    state->skipped_steps = meta.skipped_steps;
    free(tensors);
    free(saved_yaml);
}

void run_state_load_weights(Model *model, const char *step_dir, bool use_ema)
{
    const ParamTable *table = model_param_table(model);
    CheckpointTensor *tensors = checkpoint_tensors_of(table);
    float *arrays[CKPT_GROUPS] = {0};
    arrays[use_ema ? CKPT_GROUP_EMA : CKPT_GROUP_MODEL] = model_params(model);
    HostStage stage;
    stage_begin(&stage, model_backend(model), table->total, arrays, false);
    checkpoint_load(step_dir, tensors, table->n_params, stage.staged);
    stage_end(&stage, true);
    model_refresh_compute_copy(model);
    free(tensors);
}

OptimRange *run_state_optimizer_ranges(const ParamTable *table, const OptimConfig *optim)
{
    OptimRange *ranges = xcalloc((size_t)table->n_params, sizeof *ranges);
    for (int i = 0; i < table->n_params; i++) {
        const ParamEntry *entry = &table->params[i];
        unsigned kind_bit = param_kind_no_decay_bit(entry->kind);
        ranges[i] = (OptimRange){
            .offset = entry->offset,
            .count = entry->count,
            .lr_mult = optim_range_lr_mult(optim, kind_bit == NO_DECAY_ROUTING),
            .weight_decay = optim_range_weight_decay(optim, kind_bit),
        };
    }
    return ranges;
}

Optimizer run_state_optimizer(const RunState *state, Model *model, const OptimConfig *optim)
{
    const ParamTable *table = model_param_table(model);
    return (Optimizer){
        .backend = model_backend(model),
        .config = optim,
        .params = model_params(model),
        .grads = model_grads(model),
        .compute = model_compute_copy(model),
        .exp_avg = state->exp_avg,
        .exp_avg_sq = state->exp_avg_sq,
        .ema = state->ema,
        .count = table->total,
        .ranges = run_state_optimizer_ranges(table, optim),
        .n_ranges = table->n_params,
        .step = (int)state->optimizer_steps,
        .skipped = (int)state->skipped_steps,
    };
}

double run_state_peak_memory_gib(const Backend *backend)
{
    size_t in_use = 0, peak = 0;
    if (backend->memory_usage)
        backend->memory_usage(&in_use, &peak);
    return peak > 0 ? (double)peak / (1 << 30) : metrics_peak_rss_gib();
}
