/* launch/step_budget.c — see step_budget.h. */
#include "launch/step_budget.h"

#include "launch/machine.h"
#include "launch/memory_plan.h"
#include "runtime/error.h"
#include "runtime/metrics.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

double step_budget_floor_seconds(const Config *config, const Backend *backend,
                                 int world_size, int cores_per_rank)
{
    ParameterCount count;
    memory_plan_count_parameters(&count, config);
    const ModelConfig *model = &config->model;
    const double flops_per_token = metrics_flops_per_token(
        (int64_t)fmin(count.layer_matrix, 9e18), model->vocab_size, model->d_model,
        model->n_layers, config->train.seq_len, model->n_heads, model->head_dim);
    const double tokens = (double)config->train.global_batch_size * config->train.seq_len;
    const int cores = cores_per_rank > 0 ? cores_per_rank : 1;
    const double peak = strcmp(backend->name, "cpu") ? METRICS_PEAK_TFLOPS * 1e12
                                                     : STEP_BUDGET_CPU_FLOPS_PER_CORE * cores;
    return tokens * flops_per_token / ((world_size > 0 ? world_size : 1) * peak);
}

/* "3.2 hours", "15 days" */
static void format_duration(char *buffer, size_t capacity, double seconds)
{
    if (seconds >= 2 * 86400.0)
        snprintf(buffer, capacity, "%.3g days", seconds / 86400);
    else
        snprintf(buffer, capacity, "%.3g hours", seconds / 3600);
}

void step_budget_check(const Config *config, const Backend *backend, int world_size)
{
    const int cores = machine_cores_per_rank();
    const double floor_seconds = step_budget_floor_seconds(config, backend, world_size, cores);
    if (floor_seconds <= STEP_BUDGET_SECONDS)
        return;
    char duration[48], peak[64];
    format_duration(duration, sizeof duration, floor_seconds);
    if (strcmp(backend->name, "cpu"))
        snprintf(peak, sizeof peak, "%.0f TFLOP/s a GPU", METRICS_PEAK_TFLOPS);
    else
        snprintf(peak, sizeof peak, "%d core%s at %.0f GFLOP/s each", cores,
                 cores == 1 ? "" : "s", STEP_BUDGET_CPU_FLOPS_PER_CORE / 1e9);
    fatal(EXIT_CONFIG, "train.global_batch_size = %d sequences of train.seq_len = %d tokens "
          "make a step that takes at least %s on %d rank%s (%s, more than any of them "
          "reaches); a stop signal waits for the end of a step, so such a step could be "
          "neither finished nor stopped: lower train.global_batch_size (or train.seq_len, or the "
          "model) until a step fits in %.0f hour at that peak", config->train.global_batch_size,
          config->train.seq_len, duration, world_size, world_size == 1 ? "" : "s", peak,
          STEP_BUDGET_SECONDS / 3600);
}
