/* launch/step_budget.h — refuses a training step too long to finish or to stop
 * (docs/design-notes.md "Sizes that cannot fit").
 *
 * A signal (SIGTERM, SIGUSR1, Ctrl-C) is acted on between steps, so a step that runs for
 * days can be neither finished nor stopped cleanly. A step computes at least
 * train.global_batch_size x train.seq_len tokens x DESIGN 6's model FLOPs per token, spread
 * over the ranks, and no rank computes faster than its peak: METRICS_PEAK_TFLOPS for a GPU,
 * STEP_BUDGET_CPU_FLOPS_PER_CORE for each core a cpu rank has (machine.h). When even that
 * floor is longer than STEP_BUDGET_SECONDS, `fathom train` exits 2 naming
 * train.global_batch_size before it allocates anything.
 */
#ifndef FATHOM_LAUNCH_STEP_BUDGET_H
#define FATHOM_LAUNCH_STEP_BUDGET_H

#include "runtime/backend.h"
#include "runtime/config.h"

/* fp32 FLOP/s of one core, above what any x86 core reaches (two AVX-512 FMA units at
 * 3 GHz make 192 G): the floor is never longer than the real step. */
#define STEP_BUDGET_CPU_FLOPS_PER_CORE 2e11
/* The longest floor accepted: an hour at peak, many hours in practice. */
#define STEP_BUDGET_SECONDS 3600.0

/* The least time one step can take on `world_size` ranks of `backend`, each cpu rank with
 * `cores_per_rank` cores. */
double step_budget_floor_seconds(const Config *config, const Backend *backend,
                                 int world_size, int cores_per_rank);

/* Exits EXIT_CONFIG naming train.global_batch_size when the floor is past
 * STEP_BUDGET_SECONDS on this machine. */
void step_budget_check(const Config *config, const Backend *backend, int world_size);

#endif
