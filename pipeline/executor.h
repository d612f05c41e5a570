/* pipeline/executor.h — runs one training step's microbatches on one stage (DESIGN 1, 3).
 *
 * With one pipeline stage the schedule is trivial: for each of this rank's microbatches,
 * read its tokens, run the forward, run the backward with the gradient scaled by
 * 1/microbatches, so the accumulated gradient is that of the mean loss over the step's
 * sequences. Multi-stage schedules (gpipe, 1f1b, interleaved) replace this loop later; the
 * contract stays: gradients of the step's mean loss, accumulated into the model's buffer.
 * The caller zeroes the gradients first.
 */
#ifndef FATHOM_PIPELINE_EXECUTOR_H
#define FATHOM_PIPELINE_EXECUTOR_H

#include "model/model.h"
#include "runtime/config.h"
#include "runtime/data.h"

#include <stdint.h>

typedef struct {
    double loss, ce, zloss; /* means over the step's tokens */
} StepLoss;

/* Token scratch for one microbatch, host memory, owned by the caller. */
typedef struct {
    uint32_t *inputs, *targets; /* [microbatch_size, seq_len] each */
} MicrobatchTokens;

MicrobatchTokens executor_tokens_create(const Config *config);
void executor_tokens_destroy(MicrobatchTokens *tokens);

/* The step that starts at global sample `consumed_samples`. */
StepLoss executor_run_step(Model *model, DataSet *data, const Config *config,
                           uint64_t consumed_samples, int dp_rank, MicrobatchTokens *tokens);

#endif
