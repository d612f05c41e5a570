/* launch/train.c — `fathom train` (see train.h). */
#include "launch/train.h"

#include "checkpoints/checkpoint.h"
#include "launch/backend_select.h"
#include "launch/run_state.h"
#include "model/model.h"
#include "model/params.h"
#include "pipeline/evaluate.h"
#include "pipeline/executor.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/error.h"
#include "runtime/lr_schedule.h"
#include "runtime/metrics.h"
#include "runtime/optim.h"
#include "runtime/timer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_OVERRIDES 256

static volatile sig_atomic_t stop_requested;

static void request_stop(int signal_number)
{
    (void)signal_number;
    stop_requested = 1;
}

static void make_directories(const char *path)
{
    char partial[CONFIG_PATH_MAX];
    snprintf(partial, sizeof partial, "%s", path);
    for (char *slash = partial + 1; *slash; slash++) {
        if (*slash != '/')
            continue;
        *slash = '\0';
        if (mkdir(partial, 0755) && errno != EEXIST)
            fatal(EXIT_DATA, "cannot create directory %s: %s", partial, strerror(errno));
        *slash = '/';
    }
    if (mkdir(partial, 0755) && errno != EEXIST)
        fatal(EXIT_DATA, "cannot create run_dir %s: %s", partial, strerror(errno));
}

static void parse_arguments(int argc, char **argv, const char **config_path,
                            const char **overrides, int *n_overrides)
{
    *config_path = NULL;
    *n_overrides = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--set")) {
            if (i + 1 >= argc)
                fatal(EXIT_CONFIG, "--set needs key=value");
            if (*n_overrides == MAX_OVERRIDES)
                fatal(EXIT_CONFIG, "more than %d --set overrides", MAX_OVERRIDES);
            overrides[(*n_overrides)++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) {
            if (*n_overrides == MAX_OVERRIDES)
                fatal(EXIT_CONFIG, "more than %d --set overrides", MAX_OVERRIDES);
            overrides[(*n_overrides)++] = argv[i] + 6;
        } else if (argv[i][0] == '-') {
            fatal(EXIT_CONFIG, "train: unknown option '%s' (usage: fathom train CONFIG.yaml "
                  "[--set key=value ...])", argv[i]);
        } else if (!*config_path) {
            *config_path = argv[i];
        } else {
            fatal(EXIT_CONFIG, "train: more than one config file ('%s' and '%s')",
                  *config_path, argv[i]);
        }
    }
    if (!*config_path)
        fatal(EXIT_CONFIG, "usage: fathom train CONFIG.yaml [--set key=value ...]");
}

/* "1.23 GiB", "45.6 MiB" or "789 KiB" */
static const char *format_bytes(char *buffer, size_t capacity, size_t bytes)
{
    if (bytes >= ((size_t)1 << 30))
        snprintf(buffer, capacity, "%.2f GiB", (double)bytes / (1 << 30));
    else if (bytes >= ((size_t)1 << 20))
        snprintf(buffer, capacity, "%.1f MiB", (double)bytes / (1 << 20));
    else
        snprintf(buffer, capacity, "%.0f KiB", (double)bytes / (1 << 10));
    return buffer;
}

static void print_banner(const Config *config, const Backend *backend, Model *model,
                         const ParamTable *table, const RunState *state, bool resumed)
{
    printf("fathom: %.2fM parameters (%d layers, d_model %d, %d/%d heads) on the %s backend\n",
           (double)table->total / 1e6, config->model.n_layers, config->model.d_model,
           config->model.n_heads, config->model.n_kv_heads, backend->name);
    printf("fathom: %d steps of %d sequences x %d tokens (%d microbatches of %d), run_dir %s\n",
           config->train.steps, config->train.global_batch_size, config->train.seq_len,
           config_microbatches_per_rank(config), config->train.microbatch_size,
           config->run_dir);
    size_t parameter_bytes, activation_bytes;
    model_memory_bytes(model, &parameter_bytes, &activation_bytes);
    const size_t optimizer_bytes = (state->ema ? 3 : 2) * table->total * sizeof(float);
    char parameters[32], optimizer[32], activations[32];
    printf("fathom: memory plan: parameters %s (master, gradients%s), optimizer %s, "
           "activations %s; allocated once, before the first step\n",
           format_bytes(parameters, sizeof parameters, parameter_bytes),
           model_compute_copy(model) ? ", compute copy" : "",
           format_bytes(optimizer, sizeof optimizer, optimizer_bytes),
           format_bytes(activations, sizeof activations, activation_bytes));
    if (resumed)
        printf("fathom: resumed at step %lld (%lld samples consumed)\n",
               (long long)state->step, (long long)state->consumed_samples);
    fflush(stdout);
}

typedef struct {
    double loss_sum, ce_sum, zloss_sum, seconds;
    int steps, skipped;
} LogWindow;

static double evaluate_during_training(Model *model, DataSet *val, const Config *config)
{
    int64_t windows = config->eval.samples;
    if ((uint64_t)windows > data_window_count(val))
        windows = (int64_t)data_window_count(val);
    EvalResult result = evaluate_loss(model, val, windows, config->train.microbatch_size,
                                      config->train.seq_len, (float)config->train.z_loss,
                                      NULL, NULL);
    return result.loss;
}

int train_main(int argc, char **argv)
{
    const char *config_path, *overrides[MAX_OVERRIDES];
    int n_overrides;
    parse_arguments(argc, argv, &config_path, overrides, &n_overrides);

    Config config;
    config_load(&config, config_path, overrides, n_overrides, 1);
    const Backend *backend = backend_select(config.device, &config);
    char *resolved = config_to_yaml(&config);
    printf("# resolved config\n%s\n", resolved);
    free(resolved);
    make_directories(config.run_dir);

    Model *model = model_create(backend, &config.model, &config.residual,
                                config.train.microbatch_size, config.train.seq_len);
    const ParamTable *table = model_param_table(model);
    RunState state;
    run_state_create(&state, model, &config);

    char step_dir[CONFIG_PATH_MAX];
    bool resumed = checkpoint_find_latest(config.run_dir, step_dir, sizeof step_dir);
    if (resumed) {
        run_state_restore(&state, model, &config, step_dir);
    } else {
        model_init_params(model, config.seed, config.model.init_std);
        if (state.ema)
            backend->copy(state.ema, model_params(model), table->total * sizeof(float));
    }
    print_banner(&config, backend, model, table, &state, resumed);

    DataSet *train_data = data_open_train(&config);
    DataSet *val_data = config.eval.every > 0 ? data_open_eval(&config, NULL) : NULL;
    MetricsLog *metrics = resumed ? metrics_open_resumed(config.run_dir, state.step)
                                 : metrics_open(config.run_dir, true);

    Optimizer optimizer = run_state_optimizer(&state, model, &config.optim);

    signal(SIGTERM, request_stop);
    signal(SIGUSR1, request_stop);

    double flops_per_token = metrics_flops_per_token(
        (int64_t)table->layer_matrix_count, config.model.vocab_size, config.model.d_model,
        config.model.n_layers, config.train.seq_len, config.model.n_heads,
        config.model.head_dim);
    int64_t tokens_per_step = (int64_t)config.train.global_batch_size * config.train.seq_len;
    MicrobatchTokens tokens = executor_tokens_create(&config);
    LogWindow window = {0};
    MetricsComm comm = {0}; /* one stage, one process: nothing crosses a wire */
    bool saved_last = false;

    while (state.step < config.train.steps && !stop_requested) {
        int step = (int)state.step + 1;
        double started = timer_seconds();
        double lr = lr_at_step(&config.optim, step, config.train.steps);

        model_zero_grads(model);
        StepLoss loss = executor_run_step(model, train_data, &config,
                                          (uint64_t)state.consumed_samples, 0, &tokens);
        double grad_norm = 0;
        bool applied = optim_step(&optimizer, lr, &grad_norm);
        if (!applied) {
            window.skipped++;
            warn("step %d: non-finite loss or gradient (loss %g, grad norm %g); update "
                 "skipped (%d so far, train.max_skipped %d)", step, loss.loss, grad_norm,
                 optimizer.skipped, config.train.max_skipped);
            optim_check_skipped(&optimizer, config.train.max_skipped);
        }
        backend->synchronize();
        state.step = step;
        state.consumed_samples += config.train.global_batch_size;
        state.tokens_seen += tokens_per_step;
        state.optimizer_steps = optimizer.step;
        state.skipped_steps = optimizer.skipped;
        saved_last = false;

        window.loss_sum += loss.loss;
        window.ce_sum += loss.ce;
        window.zloss_sum += loss.zloss;
        window.seconds += timer_seconds() - started;
        window.steps++;

        bool last = step == config.train.steps;
        if (step % config.log.every == 0 || last || stop_requested) {
            MetricsStep line = {
                .step = step,
                .loss = window.loss_sum / window.steps,
                .ce = window.ce_sum / window.steps,
                .zloss = window.zloss_sum / window.steps,
                .grad_norm = grad_norm,
                .lr = lr,
                .tokens = state.tokens_seen,
                .mem_gib = run_state_peak_memory_gib(backend),
                .skipped = window.skipped,
                .comm = &comm,
                .n_stages = 1,
            };
            metrics_fill_throughput(&line, (double)tokens_per_step * window.steps,
                                    window.seconds, 1, flops_per_token);
            metrics_write_step(metrics, &line);
            char console[256];
            metrics_format_console(&line, config.train.steps, console, sizeof console);
            puts(console);
            fflush(stdout);
            window = (LogWindow){0};
        }
        if (val_data && (step % config.eval.every == 0 || last)) {
            double val_loss = evaluate_during_training(model, val_data, &config);
            metrics_write_eval(metrics, step, val_loss);
            printf("eval step %d | val_loss %.4f | ppl %.2f\n", step, val_loss, exp(val_loss));
            fflush(stdout);
        }
        if (config.checkpoint.every > 0 && (step % config.checkpoint.every == 0 || last)) {
            run_state_save(&state, model, &config);
            saved_last = true;
        }
    }
    if (stop_requested && !saved_last && state.step > 0) {
        printf("fathom: stop requested; saving step %lld\n", (long long)state.step);
        run_state_save(&state, model, &config);
    }

    executor_tokens_destroy(&tokens);
    free((void *)optimizer.ranges);
    metrics_close(metrics);
    if (val_data)
        data_close(val_data);
    data_close(train_data);
    run_state_destroy(&state, model);
    model_destroy(model);
    return EXIT_DONE;
}
