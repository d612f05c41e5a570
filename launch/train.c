/* launch/train.c — `fathom train` (see train.h). */
#include "launch/train.h"

#include "checkpoints/checkpoint.h"
#include "launch/backend_select.h"
#include "launch/config_arguments.h"
#include "launch/memory_plan.h"
#include "launch/step_budget.h"
#include "launch/train_comm.h"
#include "launch/run_state.h"
#include "model/model.h"
#include "model/params.h"
#include "pipeline/executor.h"
#include "pipeline/step.h"
#include "runtime/comm.h"
#include "runtime/grid.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/device_comm.h"
#include "runtime/cuda_module.h"
#include "runtime/error.h"
#include "runtime/fault.h"
#include "runtime/lr_schedule.h"
#include "runtime/metrics.h"
#include "runtime/optim.h"
#include "runtime/timer.h"
#include "runtime/topo.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t stop_requested;

/* SIGTERM, SIGUSR1 and a first SIGINT (Ctrl-C): finish the step, save, exit 0. A second
 * SIGINT ends the process at once, saving nothing more (exit 130, the shell's code). */
static void request_stop(int signal_number)
{
    if (signal_number == SIGINT && stop_requested)
        _exit(128 + SIGINT);
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

/* After the first step of the process: what the hop links hold against the plan's bound. */
static void report_held_hops(const Config *config, const Backend *backend,
                             const RankGrid *grid, const TrainingStep *step)
{
    const size_t held = executor_held_bytes(step->executor);
    if (held == 0)
        return;
    MemoryPlan plan;
    memory_plan_build(&plan, config, backend,
                      (RankLayout){grid->pp, grid->dp, grid->stage, grid->dp_rank});
    char measured[32], bound[32];
    printf("fathom: hop sends held after the first step: %s (%zu bytes; memory plan bound "
           "%s, %.0f bytes)\n", format_bytes(measured, sizeof measured, held), held,
           format_bytes(bound, sizeof bound, (size_t)plan.held_bytes), plan.held_bytes);
    fflush(stdout);
}

/* After the first step: how many of its products the matmul_algorithms table chose; one it
 * lacks (a shape or operand alignment the tuned step did not have) took the heuristic's. */
static void report_matmul_algorithms(const Config *config)
{
    if (!config->matmul_algorithms[0])
        return;
    int from_table, from_heuristic;
    cuda_module_matmul_table_counts(&from_table, &from_heuristic);
    printf("fathom: matmul products: %d from %s, %d by cuBLASLt's heuristic%s\n", from_table,
           config->matmul_algorithms, from_heuristic,
           from_heuristic ? " (not in the table: fathom tune of this config adds them)" : "");
}

static void print_banner(const Config *config, const Backend *backend, Model *model,
                         const ParamTable *table, const RunState *state, bool resumed,
                         const TrainingStep *step)
{
    const int M = config_microbatches_per_rank(config);
    printf("fathom: %.2fM parameters (%d layers, d_model %d, %d/%d heads) on the %s backend\n",
           (double)table->total / 1e6, config->model.n_layers, config->model.d_model,
           config->model.n_heads, config->model.n_kv_heads, backend->name);
    printf("fathom: %d step%s of %d sequences x %d tokens (%d microbatch%s of %d per rank), "
           "run_dir %s\n", config->train.steps, config->train.steps == 1 ? "" : "s",
           config->train.global_batch_size,
           config->train.seq_len, M, M == 1 ? "" : "es", config->train.microbatch_size,
           config->run_dir);
    if (step->grid->world_size > 1)
        printf("fathom: %d ranks: parallel.pp %d x parallel.dp %d, %d chunk%s (virtual_stages "
               "%d), schedule %s\n", step->grid->world_size, config->parallel.pp,
               config->parallel.dp, config->parallel.pp * config->parallel.virtual_stages,
               config->parallel.pp * config->parallel.virtual_stages == 1 ? "" : "s",
               config->parallel.virtual_stages,
               config->parallel.schedule == SCHEDULE_GPIPE  ? "gpipe"
               : config->parallel.schedule == SCHEDULE_1F1B ? "1f1b"
                                                            : "interleaved");
    const char *hop_reason = NULL;
    const char *hop_method = executor_hop_method(step->executor, &hop_reason);
    if (hop_method && config->parallel.pp > 1)
        printf("fathom: pipeline hops: %s (%s)\n", hop_method, hop_reason);
    size_t shard_bytes, full_bytes;
    fsdp_memory_bytes(model_fsdp(model), &shard_bytes, &full_bytes);
    const size_t local = fsdp_local_count(model_fsdp(model));
    const size_t optimizer_bytes = (state->ema ? 3 : 2) * local * sizeof(float);
    const bool checkpointing = model_activation_checkpointing(model);
    const size_t scratch = scratch_bytes(backend, model_config(model), model_plan(model),
                                         config->train.microbatch_size, config->train.seq_len,
                                         checkpointing);
    const size_t kept = executor_plan_bytes(step->executor, checkpointing);
    const size_t other = executor_plan_bytes(step->executor, !checkpointing);
    char parameters[32], gathered[32], optimizer[32], activations[32], alternative[32];
    const int dp = config->parallel.dp;
    char share[64] = "";
    if (dp > 1)
        snprintf(share, sizeof share, ", 1/%d of %.2fM in shards", dp,
                 (double)table->total / 1e6);
    printf("fathom: memory plan (rank 0): parameters %s (master, gradients%s%s) + gathered "
           "units %s, optimizer %s, activations %s in %d stash%s (activation_checkpointing "
           "%s; %s: %s); allocated once, before the first step\n",
           format_bytes(parameters, sizeof parameters, shard_bytes),
           model_compute_copy(model) ? ", compute copy" : "", share,
           format_bytes(gathered, sizeof gathered, full_bytes),
           format_bytes(optimizer, sizeof optimizer, optimizer_bytes),
           format_bytes(activations, sizeof activations, kept + scratch),
           executor_stash_count(step->executor),
           executor_stash_count(step->executor) == 1 ? "" : "es",
           checkpointing ? "full" : "none", checkpointing ? "none" : "full",
           format_bytes(alternative, sizeof alternative, other + scratch_bytes(
               backend, model_config(model), model_plan(model), config->train.microbatch_size,
               config->train.seq_len, !checkpointing)));
    size_t in_use = 0, peak = 0;
    backend->memory_usage(&in_use, &peak);
    char held[32];
    printf("fathom: measured after set-up: %s held by the %s backend (%zu bytes: parameter "
           "shards %zu, gathered units %zu, optimizer %zu; the rest: activations, scratch, "
           "tables)\n",
           format_bytes(held, sizeof held, in_use), backend->name, in_use, shard_bytes,
           full_bytes, optimizer_bytes);
    if (resumed)
        printf("fathom: resumed at step %lld (%lld samples consumed)\n",
               (long long)state->step, (long long)state->consumed_samples);
    fflush(stdout);
}

typedef struct {
    double loss_sum, ce_sum, zloss_sum, seconds;
    int steps, skipped;
} LogWindow;

/* The windows each evaluation during training reads: eval.samples, or as many as the
 * validation data holds; through the pipeline (pp > 1), whole microbatches on every dp rank
 * (pipeline/step.h step_evaluate). */
static int64_t evaluation_windows(const Config *config, DataSet *val, bool leader)
{
    const uint64_t held = data_window_count(val);
    if ((uint64_t)config->eval.samples <= held)
        return config->eval.samples;
    if (config->parallel.pp == 1)
        return (int64_t)held;
    const int64_t per_step = (int64_t)config->train.microbatch_size * config->parallel.dp;
    const int64_t windows = (int64_t)held / per_step * per_step;
    if (windows == 0)
        fatal(EXIT_DATA, "the validation data holds %llu windows of train.seq_len + 1 tokens, "
              "fewer than one microbatch on every dp rank (train.microbatch_size * "
              "parallel.dp = %lld) for an evaluation through the pipeline",
              (unsigned long long)held, (long long)per_step);
    if (leader)
        printf("fathom: eval.samples = %d, but the validation data holds %llu windows: each "
               "evaluation reads %lld (whole microbatches on every dp rank)\n",
               config->eval.samples, (unsigned long long)held, (long long)windows);
    return windows;
}

static double evaluate_during_training(TrainingStep *step, DataSet *val, int64_t windows)
{
    /* the evaluation's gathers are not a step's: the metrics' comm counts and times stay
     * the steps', and the next step gathers afresh, as `fathom inspect --comm` predicts */
    uint64_t counters[COMM_KIND_COUNT];
    comm_counters_save(counters);
    const bool timing = device_comm_timing_enabled();
    device_comm_timing_enable(false);
    const double loss = step_evaluate(step, val, windows);
    comm_counters_restore(counters);
    device_comm_timing_enable(timing);
    fsdp_params_changed(model_fsdp(step->model));
    return loss;
}

/* One training a run directory: rank 0 holds an exclusive lock on <run_dir>/.lock for the
 * whole run (the kernel drops it when the process ends, however it ends). A second
 * training on the same directory stops before it changes anything there. */
static void lock_run_dir(const char *run_dir)
{
    char path[CONFIG_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.lock", run_dir);
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        fatal(EXIT_DATA, "cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[32] = "";
        const ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
        holder[got > 0 ? got : 0] = '\0';
        fatal(EXIT_CONFIG, "run_dir %s is in use by another training (process %s); wait for "
              "it or choose another run_dir", run_dir, got > 0 ? holder : "unknown");
    }
    char pid[32];
    const int length = snprintf(pid, sizeof pid, "%ld", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)length, 0) != length)
        fatal(EXIT_DATA, "cannot write %s: %s", path, strerror(errno));
    /* fd stays open (and locked) until the process ends */
}

/* <run_dir>/config.yaml: the resolved config with the device the run took, which `fathom
 * inspect --comm` and the plots read (written to a temporary name, then renamed). */
static void write_run_config(const Config *config, const Backend *backend)
{
    Config resolved = *config;
    resolved.device = strcmp(backend->name, "cuda") ? DEVICE_CPU : DEVICE_CUDA;
    char path[CONFIG_PATH_MAX + 32], temporary[CONFIG_PATH_MAX + 48];
    snprintf(path, sizeof path, "%s/config.yaml", config->run_dir);
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    char *text = config_to_yaml(&resolved);
    FILE *file = fopen(temporary, "w");
    if (!file || fputs(text, file) < 0 || fclose(file) != 0 || rename(temporary, path) != 0)
        fatal(EXIT_DATA, "cannot write %s: %s", path, strerror(errno));
    free(text);
}

/* Two lines for a person, instead of every key: where the config came from and went, and
 * the residual it trains. */
static void print_config_summary(const Config *config, const char *path, int n_overrides)
{
    static const char *const modes[] = {"standard", "attnres", "msar"};
    const ResidualConfig *residual = &config->residual;
    printf("fathom: config %s with %d override%s, every key resolved in %s/config.yaml\n",
           path, n_overrides, n_overrides == 1 ? "" : "s", config->run_dir);
    if (residual->mode == RESIDUAL_STANDARD) {
        printf("fathom: residual standard\n");
        return;
    }
    char granularity[48] = "full granularity", streams[32] = "";
    if (residual->granularity == GRANULARITY_BLOCK)
        snprintf(granularity, sizeof granularity, "blocks of %d layer%s",
                 residual->layers_per_block, residual->layers_per_block == 1 ? "" : "s");
    if (residual->mode == RESIDUAL_MSAR)
        snprintf(streams, sizeof streams, ", %d stream%s", residual->streams,
                 residual->streams == 1 ? "" : "s");
    printf("fathom: residual %s, %s, %d head%s%s, %s form\n", modes[residual->mode],
           granularity, residual->heads, residual->heads == 1 ? "" : "s", streams,
           residual->form == FORM_DELTA ? "delta" : "replace");
}

/* Whether any rank was asked to stop: every rank leaves after the same step. */
static bool stop_agreed(const RankGrid *grid)
{
    int64_t mine = stop_requested, any = 0;
    comm_allreduce_max(grid->world, &mine, &any, 1, COMM_INT64, COMM_KIND_OTHER);
    return any != 0;
}

/* Every rank saves the rows it holds (run_state.h). */
static void save_checkpoint(TrainingStep *step, RunState *state, Model *model,
                            const Config *config)
{
    const RunLayout layout = {step->grid->world, step->grid->stage, step->grid->dp_rank,
                              step->writes_unit};
    run_state_save(state, model, config, &layout);
}

int train_main(int argc, char **argv)
{
    const double process_started = timer_seconds();
    static ConfigArguments arguments; /* 2 KiB of pointers: off the stack */
    config_arguments_parse(&arguments, argc, argv,
                           "usage: fathom train CONFIG.yaml [--set key=value ...]", NULL, NULL);
    const char *config_path = arguments.path;
    const int n_overrides = arguments.n_overrides;
    signal(SIGTERM, request_stop);
    signal(SIGUSR1, request_stop);
    signal(SIGINT, request_stop);

    Config config;
    config_load(&config, config_path, arguments.overrides, n_overrides, comm_size(comm_world()));
    data_resolve_vocab_size(&config); /* model.vocab_size: auto */
    comm_set_timeout(config.parallel.timeout_s);
    RankGrid grid;
    grid_create(&grid, config.parallel.pp, config.parallel.dp);
    const bool leader = grid.rank == 0;
    /* set-up's phases, timed for the line before step 1 (start-up is a cost users pay at
     * every launch and resume) */
    double phase_started = timer_seconds(), placing, starting_backend, allocating, filling;
    TopoPlacement placement;
    topo_place(&grid, &config, &placement); /* the rank's GPU and cores, before any CUDA */
    placing = timer_seconds() - phase_started;
    phase_started = timer_seconds();
    const Backend *backend = backend_select(config.device, &config);
    starting_backend = timer_seconds() - phase_started;
    topo_print_map(&grid, &placement);
    memory_plan_check(&config, backend, &grid); /* before anything is allocated */
    step_budget_check(&config, backend, grid.world_size);
    if (leader) {
        make_directories(config.run_dir);
        lock_run_dir(config.run_dir); /* before anything in it is touched */
        write_run_config(&config, backend);
        print_config_summary(&config, config_path, n_overrides);
    }
    comm_barrier(grid.world);

    fault_init(grid.rank);
    /* FSDP inside each stage (DESIGN 3): the dp group's gathers and reduce-scatters */
    DeviceComm *data_parallel = device_comm_create(grid.data_parallel, backend);
    if (leader && grid.dp > 1)
        printf("fathom: fsdp over dp groups of %d ranks: %s (%s)\n", grid.dp,
               device_comm_method(data_parallel), device_comm_reason(data_parallel));
    phase_started = timer_seconds();
    Model *model = step_create_model(&config, &grid, backend, data_parallel);
    const ParamTable *table = model_param_table(model);
    RunState state;
    run_state_create(&state, model, &config);
    const RunLayout layout = {grid.world, grid.stage, grid.dp_rank, NULL};
    backend->synchronize();
    allocating = timer_seconds() - phase_started;
    phase_started = timer_seconds();

    char step_dir[CONFIG_PATH_MAX];
    bool resumed = checkpoint_find_latest(config.run_dir, step_dir, sizeof step_dir);
    if (resumed) {
        run_state_restore(&state, model, &config, step_dir, &layout);
    } else {
        model_init_params(model, config.seed, config.model.init_std);
        if (state.ema)
            backend->copy(state.ema, model_params(model),
                          fsdp_local_count(model_fsdp(model)) * sizeof(float));
    }
    backend->synchronize();
    filling = timer_seconds() - phase_started;
    Optimizer optimizer = run_state_optimizer(&state, model, &config.optim);
    TrainingStep step;
    step_create(&step, model, &config, &grid, &optimizer);
    if (leader)
        print_banner(&config, backend, model, table, &state, resumed, &step);

    DataSet *train_data = data_open_train(&config);
    DataSet *val_data = config.eval.every > 0 ? data_open_eval(&config, NULL) : NULL;
    const int64_t val_windows = val_data ? evaluation_windows(&config, val_data, leader) : 0;
    MetricsLog *metrics = NULL;
    if (leader)
        metrics = resumed ? metrics_open_resumed(config.run_dir, state.step)
                          : metrics_open(config.run_dir, true);

    double flops_per_token = metrics_flops_per_token(
        (int64_t)table->layer_matrix_count, config.model.vocab_size, config.model.d_model,
        config.model.n_layers, config.train.seq_len, config.model.n_heads,
        config.model.head_dim);
    int64_t tokens_per_step = (int64_t)config.train.global_batch_size * config.train.seq_len;
    LogWindow window = {0};
    bool hops_reported = false;
    MetricsComm *comm = xcalloc((size_t)grid.pp, sizeof *comm);
    TrainComm train_comm;
    train_comm_begin(&train_comm, &grid);
    bool saved_last = false, stopping = false;

    if (leader && state.step >= config.train.steps)
        printf("fathom: %s is at step %lld already and train.steps = %d: nothing to train "
               "(raise train.steps to continue)\n", config.run_dir, (long long)state.step,
               config.train.steps);
    if (leader && state.step < config.train.steps) {
        const double total = timer_seconds() - process_started;
        printf("fathom: ready to train after %.2f s of set-up: placement %.2f, backend %.2f, "
               "allocation %.2f, %s %.2f, the rest %.2f\n", total, placing, starting_backend,
               allocating, resumed ? "checkpoint" : "initialisation", filling,
               total - placing - starting_backend - allocating - filling);
        fflush(stdout);
    }
    while (state.step < config.train.steps && !stopping) {
        int step_number = (int)state.step + 1;
        double started = timer_seconds();
        double lr = lr_at_step(&config.optim, step_number, config.train.steps);

        StepResult result = step_run(&step, train_data, (uint64_t)state.consumed_samples, lr,
                                     step_number);
        if (!result.applied) {
            window.skipped++;
            if (leader)
                warn("step %d: non-finite loss or gradient (loss %g, grad norm %g); update "
                     "skipped (%d so far, train.max_skipped %d)", step_number, result.loss,
                     result.grad_norm, optimizer.skipped, config.train.max_skipped);
            optim_check_skipped(&optimizer, config.train.max_skipped);
        }
        backend->synchronize();
        train_comm_step_end(&train_comm, timer_seconds() - started);
        if (leader && !hops_reported) {
            report_held_hops(&config, backend, &grid, &step);
            report_matmul_algorithms(&config);
            hops_reported = true;
        }
        state.step = step_number;
        state.consumed_samples += config.train.global_batch_size;
        state.tokens_seen += tokens_per_step;
        state.optimizer_steps = optimizer.step;
        state.skipped_steps = optimizer.skipped;
        saved_last = false;
        stopping = stop_agreed(&grid);

        window.loss_sum += result.loss;
        window.ce_sum += result.ce;
        window.zloss_sum += result.zloss;
        window.seconds += timer_seconds() - started;
        window.steps++;

        bool last = step_number == config.train.steps;
        if (step_number % config.log.every == 0 || last || stopping) {
            train_comm_gather(&train_comm, &grid, window.steps, comm);
            MetricsStep line = {
                .step = step_number,
                .loss = window.loss_sum / window.steps,
                .ce = window.ce_sum / window.steps,
                .zloss = window.zloss_sum / window.steps,
                .grad_norm = result.grad_norm,
                .lr = lr,
                .tokens = state.tokens_seen,
                .mem_gib = run_state_peak_memory_gib(backend),
                .skipped = window.skipped,
                .comm = comm,
                .n_stages = grid.pp,
            };
            metrics_fill_throughput(&line, (double)tokens_per_step * window.steps,
                                    window.seconds, grid.world_size, flops_per_token);
            if (!strcmp(backend->name, "cpu"))
                line.mfu = NAN; /* the peak of DESIGN 6 is a GPU's; a cpu has none known */
            if (leader) {
                metrics_write_step(metrics, &line);
                char console[256];
                metrics_format_console(&line, config.train.steps, console, sizeof console);
                puts(console);
                fflush(stdout);
            }
            window = (LogWindow){0};
        }
        if (val_data && (step_number % config.eval.every == 0 || last)) {
            double val_loss = evaluate_during_training(&step, val_data, val_windows);
            if (leader) {
                metrics_write_eval(metrics, step_number, val_loss);
                printf("eval step %d | val_loss %.4f | ppl %.2f\n", step_number, val_loss,
                       exp(val_loss));
                fflush(stdout);
            }
        }
        const bool periodic = config.checkpoint.every > 0 &&
                              step_number % config.checkpoint.every == 0;
        if (periodic || (last && config.checkpoint.save_final)) {
            save_checkpoint(&step, &state, model, &config);
            saved_last = true;
        }
    }
    if (stopping && !saved_last && state.step > 0) {
        if (leader)
            printf("fathom: stop requested; saving step %lld\n", (long long)state.step);
        save_checkpoint(&step, &state, model, &config);
    }

    train_comm_report(&train_comm, &grid);
    free(comm);
    step_destroy(&step);
    free((void *)optimizer.ranges);
    if (metrics)
        metrics_close(metrics);
    if (val_data)
        data_close(val_data);
    data_close(train_data);
    run_state_destroy(&state, model);
    model_destroy(model);
    device_comm_destroy(data_parallel);
    grid_destroy(&grid);
    return EXIT_DONE;
}
