/* launch/run_state.c — see run_state.h. */
#include "launch/run_state.h"

#include "checkpoints/checkpoint.h"
#include "model/params.h"
#include "runtime/metrics.h"
#include "runtime/config_keys.h"
#include "runtime/error.h"
#include "runtime/fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void run_state_create(RunState *state, Model *model, const Config *config)
{
    const Backend *backend = model_backend(model);
    size_t bytes = fsdp_local_count(model_fsdp(model)) * sizeof(float);
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

/* The checkpoint's view of the parameter table: names and shapes (offsets: the flat
 * layout, used by the single-process loads of run_state_load_weights). */
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

/* Moves a tensor's held rows between host memory and this rank's shards (backend memory,
 * runtime/fsdp.h's local layout), one tensor at a time (checkpoints/checkpoint.h). */
typedef struct {
    const Backend *backend;
    const Fsdp *fsdp;
    float *arrays[CKPT_GROUPS];
    int step, reads, total_reads; /* for the fault switch (runtime/fault.h) */
} ShardIo;

/* The io of the model's shards and, with a state, of its moments and EMA. */
static ShardIo shard_io(Model *model, const RunState *state)
{
    ShardIo io = {.backend = model_backend(model), .fsdp = model_fsdp(model)};
    if (state) {
        io.arrays[CKPT_GROUP_MODEL] = model_params(model);
        io.arrays[CKPT_GROUP_EMA] = state->ema;
        io.arrays[CKPT_GROUP_EXP_AVG] = state->exp_avg;
        io.arrays[CKPT_GROUP_EXP_AVG_SQ] = state->exp_avg_sq;
    }
    return io;
}

static void shard_read(void *context, int group, int tensor, float *host, size_t count)
{
    ShardIo *io = context;
    const size_t offset = fsdp_place(io->fsdp, tensor)->local_offset;
    io->backend->download(host, io->arrays[group] + offset, count * sizeof(float));
    fault_save_progress(io->step, ++io->reads, io->total_reads);
}

static void shard_write(void *context, int group, int tensor, const float *host, size_t count)
{
    const ShardIo *io = context;
    const size_t offset = fsdp_place(io->fsdp, tensor)->local_offset;
    io->backend->upload(io->arrays[group] + offset, host, count * sizeof(float));
}

/* The rows of each tensor this rank holds; with `writers`, only tensors whose unit this
 * stage writes (a unit several stages hold is written by the lowest). */
static CheckpointRows *held_rows(Model *model, const bool *writers)
{
    const ParamTable *table = model_param_table(model);
    CheckpointRows *rows = xcalloc((size_t)table->n_params + 1, sizeof *rows);
    for (int p = 0; p < table->n_params; p++) {
        const FsdpTensorPlace *place = fsdp_place(model_fsdp(model), p);
        if (place->local_offset == SIZE_MAX || (writers && !writers[table->params[p].unit]))
            continue;
        rows[p] = (CheckpointRows){(int64_t)place->row_begin,
                                   (int64_t)(place->row_begin + place->held_rows)};
    }
    return rows;
}

static double gigabytes_per_second(const CheckpointStats *stats)
{
    return stats->seconds > 0 ? (double)stats->bytes / 1e9 / stats->seconds : 0.0;
}

void run_state_save(const RunState *state, Model *model, const Config *config,
                    const RunLayout *layout)
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
    ShardIo io = shard_io(model, state);
    unsigned groups = 0;
    for (int g = 0; g < CKPT_GROUPS; g++)
        groups |= io.arrays[g] ? 1u << g : 0;
    CheckpointRows *rows = held_rows(model, layout ? layout->writes_unit : NULL);
    io.step = (int)state->step;
    for (int p = 0; p < table->n_params; p++)
        io.total_reads += rows[p].row_end > rows[p].row_begin;
    io.total_reads *= __builtin_popcount(groups);
    const CheckpointIo checkpoint_io = {&io, shard_read, shard_write};
    const CheckpointStats stats = checkpoint_save_sharded(
        layout ? layout->world : NULL, layout ? layout->stage : 0,
        layout ? layout->dp_rank : 0, config->run_dir, &meta, tensors, table->n_params, rows,
        groups, &checkpoint_io);
    const bool leader = !layout || comm_rank(layout->world) == 0;
    if (leader) {
        checkpoint_apply_retention(config->run_dir, config->checkpoint.keep_last,
                                   config->checkpoint.keep_every);
        printf("fathom: saved step %lld: %.2f GB in %d shard%s, %.2f s (%.2f GB/s)\n",
               (long long)state->step, (double)stats.bytes / 1e9, stats.shards,
               stats.shards == 1 ? "" : "s", stats.seconds, gigabytes_per_second(&stats));
        fflush(stdout);
    }
    free(rows);
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
                       const char *step_dir, const RunLayout *layout)
{
    CheckpointMeta meta;
    char *saved_yaml = NULL;
    char resolved_dir[CONFIG_PATH_MAX];
    const bool leader = !layout || comm_rank(layout->world) == 0;
    checkpoint_read_meta(step_dir, &meta, &saved_yaml, resolved_dir, sizeof resolved_dir);
    check_same_network(saved_yaml, config, resolved_dir);
    if (leader) {
        print_changed_keys(saved_yaml, config, resolved_dir);
        if (meta.pp != config->parallel.pp || meta.dp != config->parallel.dp ||
            meta.virtual_stages != config->parallel.virtual_stages)
            printf("fathom: resharding a checkpoint of pp %d x dp %d (virtual_stages %d) "
                   "onto pp %d x dp %d (virtual_stages %d)\n", meta.pp, meta.dp,
                   meta.virtual_stages, config->parallel.pp, config->parallel.dp,
                   config->parallel.virtual_stages);
    }

    const ParamTable *table = model_param_table(model);
    CheckpointTensor *tensors = checkpoint_tensors_of(table);
    ShardIo io = shard_io(model, state);
    /* a step-0 checkpoint of `fathom convert` holds the model only: the moments then start
     * at zero (as allocated) and the EMA at the weights (DESIGN 5) */
    const unsigned saved = checkpoint_saved_groups(resolved_dir);
    unsigned groups = 0;
    for (int g = 0; g < CKPT_GROUPS; g++)
        groups |= io.arrays[g] && (saved & (1u << g)) ? 1u << g : 0;
    CheckpointRows *rows = held_rows(model, NULL);
    const CheckpointIo checkpoint_io = {&io, shard_read, shard_write};
    const CheckpointStats stats = checkpoint_load_sharded(
        layout ? layout->world : NULL, resolved_dir, tensors, table->n_params, rows, groups,
        &checkpoint_io);
    if (state->ema && !(groups & (1u << CKPT_GROUP_EMA)))
        model_backend(model)->copy(state->ema, model_params(model),
                                   fsdp_local_count(model_fsdp(model)) * sizeof(float));
    model_refresh_compute_copy(model);
    if (leader) {
        printf("fathom: loaded %s: %.2f GB, %.2f s (%.2f GB/s)\n", resolved_dir,
               (double)stats.bytes / 1e9, stats.seconds, gigabytes_per_second(&stats));
        fflush(stdout);
    }
    state->step = meta.step;
    state->consumed_samples = meta.consumed_samples;
    state->tokens_seen = meta.tokens_seen;
    state->optimizer_steps = meta.optimizer_steps;
    state->skipped_steps = meta.skipped_steps;
    free(rows);
    free(tensors);
    free(saved_yaml);
}

void run_state_load_weights(Model *model, const char *step_dir, bool use_ema)
{
    const ParamTable *table = model_param_table(model);
    CheckpointTensor *tensors = checkpoint_tensors_of(table);
    ShardIo io = shard_io(model, NULL);
    io.arrays[use_ema ? CKPT_GROUP_EMA : CKPT_GROUP_MODEL] = model_params(model);
    CheckpointRows *rows = held_rows(model, NULL);
    const CheckpointIo checkpoint_io = {&io, shard_read, shard_write};
    checkpoint_load_sharded(NULL, step_dir, tensors, table->n_params, rows,
                            1u << (use_ema ? CKPT_GROUP_EMA : CKPT_GROUP_MODEL),
                            &checkpoint_io);
    model_refresh_compute_copy(model);
    free(rows);
    free(tensors);
}

OptimRange *run_state_optimizer_ranges(Model *model, const OptimConfig *optim, int *n_ranges)
{
    const ParamTable *table = model_param_table(model);
    OptimRange *ranges = xcalloc((size_t)table->n_params + 1, sizeof *ranges);
    *n_ranges = 0;
    for (int i = 0; i < table->n_params; i++) {
        const ParamEntry *entry = &table->params[i];
        const FsdpTensorPlace *place = fsdp_place(model_fsdp(model), i);
        if (place->local_offset == SIZE_MAX)
            continue; /* another stage holds it */
        unsigned kind_bit = param_kind_no_decay_bit(entry->kind);
        ranges[(*n_ranges)++] = (OptimRange){
            .offset = place->local_offset,
            .count = place->shard_rows * (entry->count / (size_t)entry->shape[0]),
            .lr_mult = optim_range_lr_mult(optim, kind_bit == NO_DECAY_ROUTING),
            .weight_decay = optim_range_weight_decay(optim, kind_bit),
        };
    }
    return ranges;
}

Optimizer run_state_optimizer(const RunState *state, Model *model, const OptimConfig *optim)
{
    int n_ranges;
    OptimRange *ranges = run_state_optimizer_ranges(model, optim, &n_ranges);
    return (Optimizer){
        .backend = model_backend(model),
        .config = optim,
        .params = model_params(model),
        .grads = model_grads(model),
        .compute = model_compute_copy(model),
        .exp_avg = state->exp_avg,
        .exp_avg_sq = state->exp_avg_sq,
        .ema = state->ema,
        .count = fsdp_local_count(model_fsdp(model)),
        .ranges = ranges,
        .n_ranges = n_ranges,
        .step = (int)state->optimizer_steps,
        .skipped = (int)state->skipped_steps,
    };
}

double run_state_peak_memory_gib(const Backend *backend)
{
    size_t in_use = 0, peak = 0;
    if (backend->memory_usage && backend != backend_cpu())
        backend->memory_usage(&in_use, &peak);
    return peak > 0 ? (double)peak / (1 << 30) : metrics_peak_rss_gib();
}
