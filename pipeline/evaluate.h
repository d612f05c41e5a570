/* pipeline/evaluate.h — the mean loss of a model over evaluation windows (DESIGN 4, 6).
 *
 * Windows are read in file order, `batch` at a time (the last batch may be short); the loss
 * is the mean over every target token of cross-entropy + z_loss * lse^2, the same objective
 * as training. `on_batch`, when given, sees each batch's tokens and the model right after
 * its forward, so a caller can read the logits (model_read_logits) and dump them.
 */
#ifndef FATHOM_PIPELINE_EVALUATE_H
#define FATHOM_PIPELINE_EVALUATE_H

#include "model/model.h"
#include "runtime/data.h"

#include <stdint.h>

typedef struct {
    double loss, ce; /* means over all evaluated tokens */
    int64_t windows, tokens;
} EvalResult;

typedef void (*EvalBatchFunction)(void *context, int64_t first_window, int batch,
                                  const uint32_t *inputs, const Model *model);

EvalResult evaluate_loss(Model *model, DataSet *data, int64_t windows, int batch,
                         int seq_len, float z_loss, EvalBatchFunction on_batch,
                         void *context);

#endif
