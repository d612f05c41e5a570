/* pipeline/evaluate.c — see evaluate.h. */
#include "pipeline/evaluate.h"

#include "runtime/error.h"

#include <stdlib.h>
#include <string.h>

EvalResult evaluate_loss(Model *model, DataSet *data, int64_t windows, int batch,
                         int seq_len, float z_loss, EvalBatchFunction on_batch,
                         void *context)
{
    size_t window_tokens = (size_t)seq_len + 1;
    uint32_t *window = xmalloc(window_tokens * sizeof(uint32_t));
    uint32_t *inputs = xmalloc((size_t)batch * seq_len * sizeof(uint32_t));
    uint32_t *targets = xmalloc((size_t)batch * seq_len * sizeof(uint32_t));
    double loss_sum = 0, ce_sum = 0;
    EvalResult result = {0};

    for (int64_t first = 0; first < windows; first += batch) {
        int rows = (int)(windows - first < batch ? windows - first : batch);
        for (int row = 0; row < rows; row++) {
            data_read_window(data, (uint64_t)(first + row), window);
            memcpy(inputs + (size_t)row * seq_len, window, seq_len * sizeof(uint32_t));
            memcpy(targets + (size_t)row * seq_len, window + 1, seq_len * sizeof(uint32_t));
        }
        ModelLoss loss = model_forward(model, inputs, targets, rows, z_loss);
        int64_t tokens = (int64_t)rows * seq_len;
        loss_sum += loss.loss * (double)tokens;
        ce_sum += loss.ce * (double)tokens;
        result.tokens += tokens;
        result.windows += rows;
        if (on_batch)
            on_batch(context, first, rows, inputs, model);
    }
    if (result.tokens > 0) {
        result.loss = loss_sum / (double)result.tokens;
        result.ce = ce_sum / (double)result.tokens;
    }
    free(window);
    free(inputs);
    free(targets);
    return result;
}
