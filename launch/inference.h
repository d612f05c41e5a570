/* launch/inference.h — a checkpoint opened for reading its model (eval, probe).
 *
 * inference_open() resolves DIR (a step directory, or a run directory whose latest committed
 * step is used), reads the config stored in it, builds the model on the backend its `device`
 * names, and loads the chosen weights: "ema", "raw", or NULL for the EMA when the checkpoint
 * has one and the raw weights otherwise. Errors exit 3 (checkpoint) or 2 (config).
 */
#ifndef FATHOM_LAUNCH_INFERENCE_H
#define FATHOM_LAUNCH_INFERENCE_H

#include "model/model.h"
#include "runtime/config.h"

#include <stdint.h>

typedef struct {
    Model *model;
    Config config;
    char step_dir[CONFIG_PATH_MAX];
    int64_t step;
    const char *weights; /* "ema" or "raw": what was loaded */
} Inference;

void inference_open(Inference *inference, const char *checkpoint, const char *weights);
void inference_close(Inference *inference);

#endif
