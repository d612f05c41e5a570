/* launch/run_state.h — the training state that a checkpoint holds, and moving it in and out.
 *
 * The model owns parameters and gradients; the run owns the optimizer moments and the EMA
 * (flat fp32 buffers with the parameter table's layout, backend memory) and the counters.
 * run_state_save / run_state_restore translate between these and checkpoints/ (DESIGN 5).
 */
#ifndef FATHOM_LAUNCH_RUN_STATE_H
#define FATHOM_LAUNCH_RUN_STATE_H

#include "model/model.h"
#include "model/params.h"
#include "runtime/optim.h"
#include "runtime/config.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    float *exp_avg, *exp_avg_sq; /* AdamW moments, flat */
    float *ema;                  /* NULL when optim.ema_decay == 0 */
    int64_t step, consumed_samples, tokens_seen;
    int64_t optimizer_steps, skipped_steps; /* AdamW updates applied; non-finite steps skipped */
} RunState;

/* Allocates zeroed moments (and the EMA when enabled) for the model's parameter table. */
void run_state_create(RunState *state, Model *model, const Config *config);
void run_state_destroy(RunState *state, Model *model);

/* Saves model + state as step `state->step` under config->run_dir (rank 0 of one process). */
void run_state_save(const RunState *state, Model *model, const Config *config);

/* Restores from a step directory. The checkpoint's model and residual sections must equal
 * the config's (else exit 2 naming the first differing key). */
void run_state_restore(RunState *state, Model *model, const Config *config,
                       const char *step_dir);

/* Loads only the model weights of a checkpoint into the model's parameters: the EMA
 * (use_ema) or the raw weights. */
void run_state_load_weights(Model *model, const char *step_dir, bool use_ema);

/* One optimizer range per parameter tensor: its lr multiplier and weight decay by kind
 * (runtime/optim.h); malloc'd, the caller frees it. */
OptimRange *run_state_optimizer_ranges(const ParamTable *table, const OptimConfig *optim);

/* The AdamW of the run over the model's parameters, gradients and compute copy and the
 * state's moments and EMA, at the state's step counts. Its ranges are malloc'd: the caller
 * frees optimizer.ranges. */
Optimizer run_state_optimizer(const RunState *state, Model *model, const OptimConfig *optim);

/* The most memory the run has held: the backend's own count (device memory on cuda), or
 * the process's peak resident set where the backend keeps none (cpu). */
double run_state_peak_memory_gib(const Backend *backend);

#endif
