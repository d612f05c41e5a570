/* runtime/config.c — defaults, loading and validation of the run configuration (DESIGN 6).
 *
 * Order: defaults, then the YAML file (config_yaml.c), then each `--set` in turn, then
 * validation: first every key's own range from the key table (config_keys.c), then the
 * combinations below. Validation stops at the first error, through fatal(EXIT_CONFIG, ...).
 */
#include "runtime/config.h"

#include "runtime/config_keys.h"
#include "runtime/config_yaml.h"
#include "runtime/error.h"
#include "runtime/text_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void config_defaults(Config *config)
{
    /* zero everything first, padding and unused list entries included, so that two Configs
     * holding the same values compare equal with memcmp */
    memset(config, 0, sizeof *config);

    ModelConfig *model = &config->model;
    model->vocab_size = 256; /* bytes: the synthetic corpus is byte-level (DESIGN 4) */
    model->d_model = 128;
    model->n_layers = 4;
    model->n_heads = 4;
    model->n_kv_heads = 2;
    model->head_dim = 32;
    model->ffn_dim = 384;
    model->rope_theta = 10000.0;
    /* the Llama-3.1 values, used once rope_scaling.type is llama3 */
    model->rope_scaling.llama3 = false;
    model->rope_scaling.factor = 8.0;
    model->rope_scaling.low_freq_factor = 1.0;
    model->rope_scaling.high_freq_factor = 4.0;
    model->rope_scaling.original_max_position = 8192;
    model->norm_eps = 1e-5;
    model->qk_norm = false;
    model->tie_embeddings = false;
    model->init_std = 0.02;

    ResidualConfig *residual = &config->residual;
    residual->mode = RESIDUAL_STANDARD;
    residual->heads = 1;
    residual->granularity = GRANULARITY_BLOCK;
    residual->layers_per_block = 1;
    residual->form = FORM_REPLACE;
    residual->streams = 1;
    static const int stream_kernels[] = {1, 2, 4, 8}; /* DESIGN 2.2 */
    residual->n_stream_kernels = 4;
    memcpy(residual->stream_kernels, stream_kernels, sizeof stream_kernels);

    config->parallel.pp = 1;
    config->parallel.dp = 1;
    config->parallel.virtual_stages = 1;
    config->parallel.schedule = SCHEDULE_1F1B;
    config->parallel.n_layer_split = 0;
    config->parallel.timeout_s = 600;
    config->parallel.gpus_per_node = 0;

    config->fsdp.reshard_after_forward = true;

    TrainConfig *train = &config->train;
    train->steps = 200;
    train->seq_len = 128;
    train->microbatch_size = 8;
    train->global_batch_size = 16;
    train->activation_checkpointing = CHECKPOINTING_NONE;
    train->max_skipped = 10;
    train->z_loss = 1e-4;

    OptimConfig *optim = &config->optim;
    optim->lr = 3e-3;
    optim->min_lr_ratio = 0.1;
    optim->warmup_steps = 20;
    optim->schedule = LR_COSINE;
    optim->decay_fraction = 0.2;
    optim->beta1 = 0.9;
    optim->beta2 = 0.95;
    optim->eps = 1e-8;
    optim->weight_decay = 0.1;
    optim->no_decay = NO_DECAY_EMBEDDINGS | NO_DECAY_NORMS | NO_DECAY_BIASES | NO_DECAY_ROUTING;
    optim->grad_clip = 1.0;
    optim->ema_decay = 0.999;
    optim->route_lr_mult = 1.0;
    optim->route_weight_decay = 0.0;

    config->data.source = DATA_SYNTHETIC; /* data.train and data.val stay "" */

    config->checkpoint.every = 0;
    config->checkpoint.keep_last = 2;
    config->checkpoint.keep_every = 0;
    config->checkpoint.save_final = true;
    config->log.every = 10;
    config->eval.every = 0;
    config->eval.samples = 16;

    snprintf(config->run_dir, sizeof config->run_dir, "runs/demo");
    config->seed = 1234;
    config->device = DEVICE_AUTO; /* matmul_algorithms stays "": the heuristic's */
}

/* The combinations DESIGN 3 and 2.2 rely on; every key's own range is already checked. */
static void validate_combinations(const Config *config, const char *origin, int world_size)
{
    const ModelConfig *model = &config->model;
    const ResidualConfig *residual = &config->residual;
    const ParallelConfig *parallel = &config->parallel;
    const TrainConfig *train = &config->train;

    if (model->n_heads % model->n_kv_heads != 0)
        fatal(EXIT_CONFIG, "%s: model.n_kv_heads = %d must divide model.n_heads = %d", origin,
              model->n_kv_heads, model->n_heads);
    if (model->head_dim % 2 != 0) /* RoPE rotates pairs of channels */
        fatal(EXIT_CONFIG, "%s: model.head_dim = %d must be even (RoPE rotates pairs)", origin,
              model->head_dim);
    if (model->rope_scaling.llama3 &&
        !(model->rope_scaling.high_freq_factor > model->rope_scaling.low_freq_factor))
        fatal(EXIT_CONFIG,
              "%s: model.rope_scaling.high_freq_factor = %g must exceed "
              "model.rope_scaling.low_freq_factor = %g",
              origin, model->rope_scaling.high_freq_factor, model->rope_scaling.low_freq_factor);

    if (model->d_model % residual->heads != 0) /* each depth head reads d/H channels */
        fatal(EXIT_CONFIG, "%s: residual.heads = %d must divide model.d_model = %d", origin,
              residual->heads, model->d_model);
    if (residual->layers_per_block > model->n_layers)
        fatal(EXIT_CONFIG, "%s: residual.layers_per_block = %d exceeds model.n_layers = %d",
              origin, residual->layers_per_block, model->n_layers);
    if (residual->mode == RESIDUAL_MSAR && residual->n_stream_kernels != residual->streams)
        fatal(EXIT_CONFIG,
              "%s: residual.stream_kernels has %d entries; residual.streams = %d needs one "
              "kernel size per stream",
              origin, residual->n_stream_kernels, residual->streams);

    long long grid = (long long)parallel->pp * parallel->dp;
    if (world_size != CONFIG_ANY_WORLD && grid != world_size)
        fatal(EXIT_CONFIG, "%s: parallel.pp = %d times parallel.dp = %d is %lld, but %d %s "
              "launched (mpirun -np %lld)", origin, parallel->pp, parallel->dp, grid, world_size,
              world_size == 1 ? "rank was" : "ranks were", grid);
    long long chunks = (long long)parallel->pp * parallel->virtual_stages;
    if (model->n_layers < chunks)
        fatal(EXIT_CONFIG, "%s: model.n_layers = %d is fewer than parallel.pp * "
              "parallel.virtual_stages = %lld chunks", origin, model->n_layers, chunks);
    if (parallel->n_layer_split > 0) {
        if (parallel->n_layer_split != chunks)
            fatal(EXIT_CONFIG, "%s: parallel.layer_split has %d entries, parallel.pp * "
                  "parallel.virtual_stages = %lld needed", origin, parallel->n_layer_split,
                  chunks);
        long long sum = 0;
        for (int i = 0; i < parallel->n_layer_split; i++)
            sum += parallel->layer_split[i];
        if (sum != model->n_layers)
            fatal(EXIT_CONFIG, "%s: parallel.layer_split sums to %lld, not model.n_layers = %d",
                  origin, sum, model->n_layers);
    }

    long long per_step = (long long)train->microbatch_size * parallel->dp;
    if (train->global_batch_size % per_step != 0)
        fatal(EXIT_CONFIG, "%s: train.global_batch_size = %d is not divisible by "
              "train.microbatch_size * parallel.dp = %lld", origin, train->global_batch_size,
              per_step);
    /* through the pipeline an evaluation runs whole microbatches on every dp rank
     * (pipeline/step.h step_evaluate) */
    if (parallel->pp > 1 && config->eval.every > 0 && config->eval.samples % per_step != 0)
        fatal(EXIT_CONFIG, "%s: eval.samples = %d is not a multiple of train.microbatch_size * "
              "parallel.dp = %lld: with parallel.pp = %d an evaluation runs whole "
              "microbatches through the pipeline on every dp rank", origin,
              config->eval.samples, per_step, parallel->pp);

    if (config->data.source == DATA_SHARDS && !config->data.train[0])
        fatal(EXIT_CONFIG, "%s: data.source is shards but data.train is empty", origin);
}

/* DESIGN 6: a key that changes nothing is never accepted silently. Residual keys that the
 * chosen mode or granularity does not read, set away from their defaults, get one warning
 * line each; an MSAR kernel longer than the sequence is an error (its taps past T read
 * nothing). */
static void check_keys_that_do_nothing(const Config *config, const char *origin)
{
    Config defaults;
    config_defaults(&defaults);
    const ResidualConfig *residual = &config->residual, *base = &defaults.residual;
    const bool standard = residual->mode == RESIDUAL_STANDARD;
    const bool kernels_differ =
        residual->n_stream_kernels != base->n_stream_kernels ||
        memcmp(residual->stream_kernels, base->stream_kernels,
               (size_t)residual->n_stream_kernels * sizeof residual->stream_kernels[0]) != 0;
    const struct {
        bool ignored;
        const char *key, *why;
    } unused[] = {
        {standard && residual->heads != base->heads, "residual.heads", "residual.mode is standard"},
        {standard && residual->granularity != base->granularity, "residual.granularity",
         "residual.mode is standard"},
        {standard && residual->form != base->form, "residual.form", "residual.mode is standard"},
        {residual->mode != RESIDUAL_MSAR && residual->streams != base->streams,
         "residual.streams", "residual.mode is not msar"},
        {residual->mode != RESIDUAL_MSAR && kernels_differ, "residual.stream_kernels",
         "residual.mode is not msar"},
        {(standard || residual->granularity == GRANULARITY_FULL) &&
             residual->layers_per_block != base->layers_per_block,
         "residual.layers_per_block",
         standard ? "residual.mode is standard" : "residual.granularity is full"},
    };
    for (size_t i = 0; i < sizeof unused / sizeof unused[0]; i++)
        if (unused[i].ignored)
            warn("%s: %s is set but does nothing: %s", origin, unused[i].key, unused[i].why);
    if (residual->mode == RESIDUAL_MSAR)
        for (int r = 0; r < residual->n_stream_kernels; r++)
            if (residual->stream_kernels[r] > config->train.seq_len)
                fatal(EXIT_CONFIG, "%s: residual.stream_kernels[%d] = %d is longer than "
                      "train.seq_len = %d: a causal convolution over the sequence has at most "
                      "seq_len taps", origin, r, residual->stream_kernels[r],
                      config->train.seq_len);
}

static void config_validate(const Config *config, const char *origin, int world_size)
{
    if (world_size < 1 && world_size != CONFIG_ANY_WORLD)
        fatal(EXIT_CONFIG, "%s: world size %d (ranks launched) must be >= 1", origin,
              world_size);
    for (int i = 0; i < config_key_count; i++)
        config_key_check_range(config, &config_key_table[i], origin);
    validate_combinations(config, origin, world_size);
    if (world_size != CONFIG_ANY_WORLD) /* a config read back was checked when it was written */
        check_keys_that_do_nothing(config, origin);
}

void config_load_text(Config *config, const char *yaml_text, const char *origin,
                      const char *const *overrides, int n_overrides, int world_size)
{
    config_defaults(config);
    config_yaml_apply_text(config, yaml_text, origin);
    for (int i = 0; i < n_overrides; i++)
        config_yaml_apply_override(config, overrides[i]);

    /* after overrides a value may come from the file or from --set: say both */
    char where[CONFIG_PATH_MAX + 32];
    snprintf(where, sizeof where, "%s%s", origin, n_overrides ? " with --set" : "");
    config_validate(config, where, world_size);
}

void config_load(Config *config, const char *path, const char *const *overrides,
                 int n_overrides, int world_size)
{
    if (!path) {
        config_load_text(config, "", "defaults", overrides, n_overrides, world_size);
        return;
    }
    char *text = text_file_read(path, "config file");
    config_load_text(config, text, path, overrides, n_overrides, world_size);
    free(text);
}

int config_environment_overrides(const char **overrides, int capacity)
{
    const char *text = getenv("FATHOM_SET");
    if (!text || !text[strspn(text, " \t\n")])
        return 0;
    char *copy = xstrdup(text); /* the overrides point into it until the process ends */
    int n = 0;
    for (char *item = strtok(copy, " \t\n"); item; item = strtok(NULL, " \t\n")) {
        if (n == capacity)
            fatal(EXIT_CONFIG, "FATHOM_SET holds more than %d overrides", capacity);
        overrides[n++] = item;
    }
    if (error_rank_prefix() <= 0) { /* one process, or rank 0 of a job */
        printf("fathom: FATHOM_SET adds %d override%s before the command line's:", n,
               n == 1 ? "" : "s");
        for (int i = 0; i < n; i++)
            printf(" %s", overrides[i]);
        printf("\n");
    }
    return n;
}

int config_microbatches_per_rank(const Config *config)
{
    return config->train.global_batch_size /
           (config->train.microbatch_size * config->parallel.dp);
}
