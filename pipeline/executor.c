/* pipeline/executor.c — the single-stage step loop (see executor.h). */
#include "pipeline/executor.h"

#include "runtime/error.h"

#include <stdlib.h>

MicrobatchTokens executor_tokens_create(const Config *config)
{
    size_t count = (size_t)config->train.microbatch_size * config->train.seq_len;
    MicrobatchTokens tokens = {
        .inputs = xmalloc(count * sizeof(uint32_t)),
        .targets = xmalloc(count * sizeof(uint32_t)),
    };
    return tokens;
}

void executor_tokens_destroy(MicrobatchTokens *tokens)
{
    free(tokens->inputs);
    free(tokens->targets);
    tokens->inputs = tokens->targets = NULL;
}

StepLoss executor_run_step(Model *model, DataSet *data, const Config *config,
                           uint64_t consumed_samples, int dp_rank, MicrobatchTokens *tokens)
{
    int microbatches = config_microbatches_per_rank(config);
    int batch = config->train.microbatch_size;
    StepLoss step = {0};
    for (int micro = 0; micro < microbatches; micro++) {
        data_read_microbatch(data, consumed_samples, config->train.global_batch_size,
                             dp_rank, config->parallel.dp, micro, batch,
                             tokens->inputs, tokens->targets);
        ModelLoss loss = model_forward(model, tokens->inputs, tokens->targets, batch,
                                       (float)config->train.z_loss);
        /* every microbatch holds the same number of tokens, so the step's mean loss is
         * the mean of the microbatch means */
        model_backward(model, 1.0f / (float)microbatches);
        step.loss += loss.loss / microbatches;
        step.ce += loss.ce / microbatches;
        step.zloss += loss.zloss / microbatches;
    }
    return step;
}
