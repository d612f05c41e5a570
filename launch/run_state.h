/* launch/run_state.h — the training state that a checkpoint holds, and moving it in and out.
 *
 * The model owns this rank's parameter shards and gradients (runtime/fsdp.h); the run owns
 * the optimizer moments and the EMA (fp32 backend buffers in the same local layout) and the
 * counters. run_state_save / run_state_restore move them to and from checkpoints/
 * (DESIGN 5): every rank writes the rows it holds into its own shard file, and reads back
 * the rows it holds under whatever layout wrote the checkpoint, one tensor at a time.
 */
#ifndef FATHOM_LAUNCH_RUN_STATE_H
#define FATHOM_LAUNCH_RUN_STATE_H

#include "model/model.h"
#include "model/params.h"
#include "runtime/optim.h"
#include "runtime/comm.h"
#include "runtime/config.h"

#include <stdbool.h>
#include <stdint.h>

/* Where this rank stands in a job of several (NULL: one process). */
typedef struct {
    Comm *world;
    int stage, dp_rank;
    const bool *writes_unit; /* [n_units]: units this stage saves (the lowest stage of those
                                several hold); NULL: every unit it holds */
} RunLayout;

typedef struct {
    float *exp_avg, *exp_avg_sq; /* AdamW moments, in the local layout */
    float *ema;                  /* NULL when optim.ema_decay == 0 */
    int64_t step, consumed_samples, tokens_seen;
    int64_t optimizer_steps, skipped_steps; /* AdamW updates applied; non-finite steps skipped */
} RunState;

/* Allocates zeroed moments (and the EMA when enabled) for this rank's shards. */
void run_state_create(RunState *state, Model *model, const Config *config);
void run_state_destroy(RunState *state, Model *model);

/* Saves model + state as step `state->step` under config->run_dir; collective over the
 * layout's world. Prints the time and GB/s (rank 0). */
void run_state_save(const RunState *state, Model *model, const Config *config,
                    const RunLayout *layout);

/* Restores from a step directory, whatever layout saved it (it says when it reshards). The
 * checkpoint's model and residual sections must equal the config's (else exit 2 naming the
 * first differing key). A checkpoint with the model only starts the moments at zero and the
 * EMA at the weights. Collective over the layout's world. */
void run_state_restore(RunState *state, Model *model, const Config *config,
                       const char *step_dir, const RunLayout *layout);

/* Loads only the model weights of a checkpoint into the model's parameters: the EMA
 * (use_ema) or the raw weights. */
void run_state_load_weights(Model *model, const char *step_dir, bool use_ema);

/* One optimizer range per tensor shard this rank holds (runtime/fsdp.h's local layout; its
 * padding rows included, which stay zero): its lr multiplier and weight decay by kind
 * (runtime/optim.h); malloc'd, the caller frees it. */
OptimRange *run_state_optimizer_ranges(Model *model, const OptimConfig *optim, int *n_ranges);

/* The AdamW of the run over the model's parameters, gradients and compute copy and the
 * state's moments and EMA, at the state's step counts. Its ranges are malloc'd: the caller
 * frees optimizer.ranges. */
Optimizer run_state_optimizer(const RunState *state, Model *model, const OptimConfig *optim);

/* The most memory the run has held: the backend's own count (device memory on cuda), or
 * the process's peak resident set where the backend keeps none (cpu). */
double run_state_peak_memory_gib(const Backend *backend);

#endif
