/* pipeline/step.h — the one training step (DESIGN 3) that `fathom train`, `fathom bench`
 * and the tests all run:
 *
 *   zero the gradients; run the stage's schedule (pipeline/executor.h), each microbatch's
 *   backward scaled by 1 / (M x D); sum the gradients over the data-parallel group; sum the
 *   shared tensors' gradients over the stages that hold them; the global gradient norm;
 *   clip; AdamW and the EMA (runtime/optim.h); the step's loss, the mean over all M x D
 *   microbatches, on every rank.
 *
 * Which rank updates what: a stage holds every parameter (no sharding yet), but only the
 * tensors its chunks read get gradients, and only those are updated there (the others are
 * never read on that stage; pipeline_gather_state brings them to rank 0 for a checkpoint).
 * A tensor read on several stages (model.route_null, MSAR's model.route_streams.{n}.conv,
 * and model.embed_tokens.weight when tied under pp > 1: DESIGN 3 "shared tensors") is
 * updated on every stage with the summed gradient, so every copy takes the same step; the
 * norm counts each element once, on stage 0. All sums run in rank order (runtime/comm.h), so
 * a layout repeats itself bit for bit; the one-rank step is exactly today's single process.
 */
#ifndef FATHOM_PIPELINE_STEP_H
#define FATHOM_PIPELINE_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "pipeline/executor.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/grid.h"
#include "runtime/optim.h"

typedef struct {
    double loss, ce, zloss; /* means over the step's M x D microbatches */
    double grad_norm;       /* before clipping; not finite for a skipped step */
    bool applied;           /* false: non-finite, nothing updated */
} StepResult;

typedef struct {
    const Config *config;
    Model *model;
    const RankGrid *grid;
    Executor *executor;
    Optimizer *optimizer;     /* its ranges cut down to this stage's tensors */
    OptimRange *ranges;       /* [n_ranges] what this stage updates */
    OptimRange *norm_ranges;  /* what its norm counts */
    OptimRange *shared;       /* the shared tensors' ranges */
    int n_ranges, n_norm_ranges, n_shared;
    int *owner;               /* [n_params] the stage that updates tensor p, -1 shared */
    float *host;              /* staging for sums of backend gradients (largest tensor) */
} TrainingStep;

/* Builds the executor for the grid's stage and cuts the optimizer (from run_state_optimizer)
 * down to the stage's tensors; optimizer must outlive the step. */
void step_create(TrainingStep *step, Model *model, const Config *config, const RankGrid *grid,
                 Optimizer *optimizer);
void step_destroy(TrainingStep *step);

StepResult step_run(TrainingStep *step, DataSet *data, uint64_t consumed_samples, double lr);

/* Before a checkpoint: every tensor's parameters, moments and EMA from the stage that
 * updates it to rank 0 (dp rank 0 of each stage sends). arrays: the four flat buffers in
 * that order (ema may be NULL). */
void pipeline_gather_state(TrainingStep *step, float *const arrays[4]);

#endif
