/* launch/tune.c — `fathom tune`: the config's matrix products timed, the fastest written to a
 * table (see tune.h). */
#include "launch/tune.h"

#include "launch/backend_select.h"
#include "launch/config_arguments.h"
#include "launch/solo_step.h"
#include "runtime/config.h"
#include "runtime/cuda_module.h"
#include "runtime/error.h"
#include "runtime/matmul_table.h"
#include "runtime/synthetic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] = "usage: fathom tune CONFIG.yaml [--set key=value ...] [--out FILE] "
                            "[--candidates N] [--repeats N]";

enum {
    TUNE_CANDIDATES_DEFAULT = 32,
    TUNE_CANDIDATES_MOST = 64, /* kernels/cuda/matmul_tune_cuda.cu's limits */
    TUNE_REPEATS_DEFAULT = 20,
    TUNE_REPEATS_MOST = 200,
};

typedef struct {
    const char *out;
    int candidates, repeats;
} TuneOptions;

static int parse_count(const char *option, const char *text, int most)
{
    char *end;
    const long value = strtol(text, &end, 10);
    if (end == text || *end || value < 1 || value > most)
        fatal(EXIT_CONFIG, "tune: %s %s is not a count from 1 to %d (%s)", option, text, most,
              usage);
    return (int)value;
}

static int tune_option(void *context, int argc, char **argv, int i)
{
    TuneOptions *options = context;
    const bool out = !strcmp(argv[i], "--out");
    if (!out && strcmp(argv[i], "--candidates") && strcmp(argv[i], "--repeats"))
        return 0;
    if (i + 1 >= argc)
        fatal(EXIT_CONFIG, "tune: %s needs a value (%s)", argv[i], usage);
    if (out)
        options->out = argv[i + 1];
    else if (!strcmp(argv[i], "--candidates"))
        options->candidates = parse_count(argv[i], argv[i + 1], TUNE_CANDIDATES_MOST);
    else
        options->repeats = parse_count(argv[i], argv[i + 1], TUNE_REPEATS_MOST);
    return 2;
}

/* The config cut to the step that makes every product of it (tune.h): one process, one
 * microbatch, one block of layers, synthetic tokens (the config's own data where its
 * vocabulary is smaller than the synthetic corpus's bytes). */
static void tune_config_reduce(Config *config)
{
    Config defaults;
    config_defaults(&defaults);
    config->parallel = defaults.parallel;
    config->fsdp = defaults.fsdp;
    config->train.global_batch_size = config->train.microbatch_size;
    config->train.steps = 1;
    if (config->model.vocab_size >= SYNTHETIC_VOCAB_SIZE) /* else the config's own data */
        config->data = defaults.data;
    config->eval.every = 0;
    config->matmul_algorithms[0] = '\0'; /* tune from the heuristic's choices */
    const ResidualConfig *residual = &config->residual;
    int layers = residual->mode != RESIDUAL_STANDARD && residual->granularity == GRANULARITY_BLOCK
                     ? residual->layers_per_block
                     : 1;
    if (layers < config->model.n_layers)
        config->model.n_layers = layers;
}

/* One training step of `config`: every product it runs gets its plan in the CUDA module. */
static void tune_run_step(const Config *config, const Backend *backend)
{
    SoloStep solo;
    solo_step_create(&solo, backend, config, false);
    step_run(&solo.step, solo.data, 0, config->optim.lr, 1);
    backend->synchronize();
    solo_step_destroy(&solo); /* the timings get the memory; the plans stay in the module */
}

/* What the table moves in one microbatch of the config's whole model, counted from the
 * medians: the tuned step ran `tuned` of the `n_layers` layers, and a layer's products are
 * the same in every layer (the head's, out_dim = the vocabulary, run once). */
static void tune_print_total(const MatmulTable *table, const Config *tuned, int n_layers)
{
    const double layers = (double)n_layers / tuned->model.n_layers;
    double heuristic = 0, chosen = 0;
    for (int i = 0; i < table->count; i++) {
        const MatmulTableEntry *entry = &table->entries[i];
        const double times = entry->calls *
                             (entry->out_dim == tuned->model.vocab_size ? 1.0 : layers);
        heuristic += times * entry->heuristic_ms;
        chosen += times * entry->tuned_ms;
    }
    if (heuristic > 0)
        printf("fathom tune: a microbatch of %d x %d tokens through all %d layers and the head, "
               "counted from these medians: %.2f ms of products with the heuristic's "
               "algorithms, %.2f ms tuned (%+.1f%%)\n", tuned->train.microbatch_size,
               tuned->train.seq_len, n_layers, heuristic, chosen,
               100.0 * (chosen - heuristic) / heuristic);
}

int tune_main(int argc, char **argv)
{
    static ConfigArguments arguments; /* 2 KiB of pointers: off the stack */
    TuneOptions options = {"matmul_algorithms.txt", TUNE_CANDIDATES_DEFAULT,
                           TUNE_REPEATS_DEFAULT};
    config_arguments_parse(&arguments, argc, argv, usage, tune_option, &options);
    Config config;
    config_load(&config, arguments.path, arguments.overrides, arguments.n_overrides,
                CONFIG_ANY_WORLD);
    data_resolve_vocab_size(&config);
    if (config.device == DEVICE_CPU)
        fatal(EXIT_CONFIG, "tune: the config says device: cpu, and the cpu backend's products "
              "have no algorithms to choose: fathom tune times the cuda backend's");
    if (!cuda_module_backend())
        fatal(EXIT_CONFIG, "tune: fathom tune times the cuda backend's products, but %s",
              cuda_module_probe()->description);
    const int n_layers = config.model.n_layers;
    tune_config_reduce(&config);
    const Backend *backend = backend_select(DEVICE_CUDA, &config);
    printf("fathom tune: one step of %d x %d tokens through %d of the %d layers on one GPU "
           "(a layer's products do not depend on the depth or the layout), then up to %d "
           "candidates a product, %d timed runs each\n", config.train.microbatch_size,
           config.train.seq_len, config.model.n_layers, n_layers, options.candidates,
           options.repeats);
    fflush(stdout);
    tune_run_step(&config, backend);

    MatmulTable table;
    matmul_table_init(&table);
    cuda_module_matmul_tune(&table, options.candidates, options.repeats);
    tune_print_total(&table, &config, n_layers);
    matmul_table_write(&table, options.out);
    printf("fathom tune: wrote %d products to %s; a run takes them with matmul_algorithms: %s "
           "(or --set matmul_algorithms=%s)\n", table.count, options.out, options.out,
           options.out);
    matmul_table_free(&table);
    return EXIT_DONE;
}
