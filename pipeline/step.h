/* pipeline/step.h — the one training step (DESIGN 3) that `fathom train`, `fathom bench`
 * and the tests all run:
 *
 *   zero the gradient accumulators; run the stage's schedule (pipeline/executor.h), each
 *   microbatch's backward scaled by 1 / (M x D), the units gathered and their gradients
 *   reduce-scattered by runtime/fsdp.h; sum the shared tensors' gradient shards over the
 *   stages that hold them; the step's loss, the mean over all M x D microbatches; a
 *   non-finite loss or global gradient norm skips the step on every rank; clip; AdamW and
 *   the EMA on this rank's shards (runtime/optim.h).
 *
 * Who holds what (DESIGN 3). A rank holds the shards (over its stage's dp group) of the
 * units its stage's chunks read, and updates exactly those. A unit read on several stages
 * (the shared routing unit: model.route_null and MSAR's stream convolutions; the embedding
 * when tied under pp > 1) is held by each of them; after the backward the copies' gradient
 * shards are summed over the stages (same dp rank) in rank order, so every copy takes the
 * same update. The global gradient norm counts each element once: a rank counts its
 * shards, and a unit several stages hold only on the lowest of them; the sum runs over the
 * whole world. All sums run in a fixed order (runtime/comm.h), so a layout repeats itself
 * bit for bit.
 */
#ifndef FATHOM_PIPELINE_STEP_H
#define FATHOM_PIPELINE_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "pipeline/executor.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/device_comm.h"
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
    Optimizer *optimizer;
    OptimRange *norm_ranges;  /* the shards this rank's norm counts */
    int n_norm_ranges;
    int *shared_units;        /* units held by more than one stage */
    int n_shared_units;
    int *releases;            /* [n_units]: FSDP releases of one step (fsdp_step_begin) */
    bool *writes_unit;        /* [n_units]: units this stage saves in a checkpoint (the
                                 lowest of the stages that hold one) */
    float *host;              /* staging for the shared units' sums */
} TrainingStep;

/* The model of this rank: its stage's units, sharded over `data_parallel` (the stage's dp
 * group on the model's backend; NULL with one dp rank), with config's reshard policy. */
Model *step_create_model(const Config *config, const RankGrid *grid, const Backend *backend,
                         DeviceComm *data_parallel);

/* Builds the executor for the grid's stage and sets the optimizer's norm ranges and
 * reduction; optimizer (from run_state_optimizer) must outlive the step. */
void step_create(TrainingStep *step, Model *model, const Config *config, const RankGrid *grid,
                 Optimizer *optimizer);
void step_destroy(TrainingStep *step);

/* Step number `step_number` (counted from 1: the fault switch of runtime/fault.h names it). */
StepResult step_run(TrainingStep *step, DataSet *data, uint64_t consumed_samples, double lr,
                    int step_number);

/* The mean loss (cross-entropy + z-loss over every token, the training objective) of the
 * first `windows` windows of `data` in file order, with the current weights; every rank
 * gets it. With one stage every rank runs the one-chunk model over all the windows
 * (pipeline/evaluate.h); with pp > 1 they go through the pipeline, each dp rank its share
 * (executor_run_evaluation), and `windows` must be a multiple of train.microbatch_size x
 * parallel.dp. The same windows give the same mean on any layout, to the rounding of the
 * weights a layout trained. Collective over the world. */
double step_evaluate(TrainingStep *step, DataSet *data, int64_t windows);

#endif
