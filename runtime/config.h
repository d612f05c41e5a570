/* runtime/config.h — the run configuration (DESIGN 6).
 *
 * One Config holds every key of the YAML file, already validated: sizes >= 1, enums known,
 * combinations possible. config_load() reads YAML (libyaml) over the defaults, applies the
 * `--set key=value` overrides in order, validates, and fails through fatal(EXIT_CONFIG, ...)
 * with a message that names the key. config_to_yaml() prints the resolved config; loading
 * that text again gives the same Config.
 *
 * Strings are owned by the Config (fixed arrays): a Config can be copied by value.
 */
#ifndef FATHOM_RUNTIME_CONFIG_H
#define FATHOM_RUNTIME_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#define CONFIG_PATH_MAX 1024
/* An int key that takes the word `auto` (model.vocab_size) holds this until it is resolved
 * (data_resolve_vocab_size, runtime/data.h); a resolved config holds the number. */
#define CONFIG_AUTO INT_MIN
#define CONFIG_LIST_MAX 16
#define CONFIG_SPLIT_MAX 256

typedef enum { DEVICE_AUTO, DEVICE_CPU, DEVICE_CUDA } DeviceKind;
typedef enum { RESIDUAL_STANDARD, RESIDUAL_ATTNRES, RESIDUAL_MSAR } ResidualMode;
typedef enum { GRANULARITY_FULL, GRANULARITY_BLOCK } ResidualGranularity;
typedef enum { FORM_REPLACE, FORM_DELTA } ResidualForm;
typedef enum { SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED } PipelineSchedule;
typedef enum { CHECKPOINTING_NONE, CHECKPOINTING_FULL } ActivationCheckpointing;
typedef enum { LR_COSINE, LR_WSD, LR_CONSTANT } LrSchedule;
typedef enum { DATA_SYNTHETIC, DATA_SHARDS } DataSource;

/* optim.no_decay: which parameter kinds skip weight decay (a bit set) */
enum {
    NO_DECAY_EMBEDDINGS = 1 << 0, /* embed_tokens and an untied lm_head */
    NO_DECAY_NORMS = 1 << 1,      /* every RMSNorm weight, qk norms included */
    NO_DECAY_BIASES = 1 << 2,     /* biases (none in the Llama/Qwen3 families yet) */
    NO_DECAY_ROUTING = 1 << 3,    /* attention-over-depth weights (DESIGN 2.3) */
};

typedef struct {
    int vocab_size;             /* CONFIG_AUTO: `auto`, from the data */
    int d_model, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim;
    double rope_theta;
    struct {
        bool llama3;            /* rope_scaling.type: none | llama3 */
        double factor, low_freq_factor, high_freq_factor;
        int original_max_position;
    } rope_scaling;
    double norm_eps;
    bool qk_norm, tie_embeddings;
    double init_std;
} ModelConfig;

typedef struct {
    ResidualMode mode;
    int heads;                  /* H: 1 = AttnRes, > 1 = MHAR */
    ResidualGranularity granularity;
    int layers_per_block;
    ResidualForm form;
    int streams;                /* MSAR m */
    int stream_kernels[CONFIG_LIST_MAX];
    int n_stream_kernels;
} ResidualConfig;

typedef struct {
    int pp, dp, virtual_stages;
    PipelineSchedule schedule;
    int layer_split[CONFIG_SPLIT_MAX]; /* layers per chunk; n_layer_split = 0: even split */
    int n_layer_split;
    double timeout_s; /* every communication wait's deadline (runtime/comm.h), default 600 */
    int gpus_per_node; /* GPUs a node's ranks use (runtime/topo.h); 0: all the node has */
} ParallelConfig;

typedef struct {
    bool reshard_after_forward;
} FsdpConfig;

typedef struct {
    int steps, seq_len, microbatch_size, global_batch_size;
    ActivationCheckpointing activation_checkpointing;
    int max_skipped;
    double z_loss;
} TrainConfig;

typedef struct {
    double lr, min_lr_ratio;
    int warmup_steps;
    LrSchedule schedule;
    double decay_fraction;      /* wsd: the last fraction of steps decays to min_lr */
    double beta1, beta2, eps, weight_decay;
    unsigned no_decay;          /* NO_DECAY_* bits */
    double grad_clip;           /* <= 0: no clipping */
    double ema_decay;           /* 0: no EMA kept */
    double route_lr_mult, route_weight_decay;
} OptimConfig;

typedef struct {
    DataSource source;
    char train[CONFIG_PATH_MAX], val[CONFIG_PATH_MAX]; /* file, directory or glob */
} DataConfig;

typedef struct {
    int every;                  /* 0: never */
    int keep_last, keep_every;  /* 0: keep all / none extra */
    bool save_final;            /* the last step is saved whatever `every` says */
} CheckpointConfig;

typedef struct { int every; } LogConfig;
typedef struct { int every, samples; } EvalConfig;

typedef struct {
    ModelConfig model;
    ResidualConfig residual;
    ParallelConfig parallel;
    FsdpConfig fsdp;
    TrainConfig train;
    OptimConfig optim;
    DataConfig data;
    CheckpointConfig checkpoint;
    LogConfig log;
    EvalConfig eval;
    char run_dir[CONFIG_PATH_MAX];
    unsigned long long seed;
    DeviceKind device;
    /* the cuda products' algorithms chosen by `fathom tune` (runtime/matmul_table.h); "":
     * cuBLASLt's heuristic */
    char matmul_algorithms[CONFIG_PATH_MAX];
} Config;

/* The defaults: a small baseline model on the synthetic corpus. */
void config_defaults(Config *config);

/* Reads `path` (NULL: defaults only), applies `n_overrides` "key=value" strings, validates.
 * `world_size` is the number of ranks (1 for one process): pp * dp must equal it, unless it
 * is CONFIG_ANY_WORLD (a config read back from a run or a checkpoint, whose layout was the
 * writer's: everything else is still validated). */
#define CONFIG_ANY_WORLD 0
void config_load(Config *config, const char *path, const char *const *overrides,
                 int n_overrides, int world_size);

/* Parses YAML text instead of a file (checkpoints store the config as text). `origin` names
 * the text in messages. */
void config_load_text(Config *config, const char *yaml_text, const char *origin,
                      const char *const *overrides, int n_overrides, int world_size);

/* FATHOM_SET, in the environment: whitespace-separated key=value overrides that `fathom
 * train` applies after the config file and before the command line's --set (which so win).
 * Puts them in overrides[0..n) (pointers into a copy kept for the life of the process),
 * returns n, and says on stdout which they are (once, from rank 0 or a lone process). */
int config_environment_overrides(const char **overrides, int capacity);

/* The resolved config as YAML, every key present. Returns a malloc'd string. */
char *config_to_yaml(const Config *config);

/* Derived numbers. */
int config_microbatches_per_rank(const Config *config); /* global / (micro * dp) */

#endif
