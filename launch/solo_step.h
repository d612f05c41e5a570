/* launch/solo_step.h — a training step of one process over a config's model: what the step
 * cases of `fathom bench` time and `fathom tune` runs once to make every product's plan.
 *
 * The model is made whole on the backend (no pipeline, no FSDP: a grid of one), initialised
 * from config->seed and model.init_std, with AdamW's moments and no EMA, reading
 * data_open_train(config). The config is copied; everything made here is the SoloStep's and
 * solo_step_destroy frees it.
 */
#ifndef FATHOM_LAUNCH_SOLO_STEP_H
#define FATHOM_LAUNCH_SOLO_STEP_H

#include "launch/run_state.h"
#include "model/model.h"
#include "pipeline/step.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/grid.h"
#include "runtime/optim.h"

#include <stdbool.h>

typedef struct {
    Config config; /* the caller's, with optim.ema_decay 0 */
    Model *model;
    RunState state;
    Optimizer optimizer;
    RankGrid grid;
    TrainingStep step;
    DataSet *data;
} SoloStep;

/* sites_alone: every routing site routed on its own (model_route_sites_alone). */
void solo_step_create(SoloStep *solo, const Backend *backend, const Config *config,
                      bool sites_alone);
void solo_step_destroy(SoloStep *solo);

#endif
