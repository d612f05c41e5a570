/* model/loss.c — see loss.h. */
#include "model/loss.h"

#include <stdlib.h>

#include "runtime/error.h"

ModelLoss loss_forward(const LayerContext *context, const HeadWeights *weights,
                       Activations *act, const float *x, float z_loss)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    const int rows = context->B * context->T, d = config->d_model, V = config->vocab_size;

    backend->rmsnorm_forward(act->final_normed, act->final_rstd, x, weights->norm, rows, d,
                             (float)config->norm_eps);
    backend->matmul_forward(act->logits, act->final_normed, weights->head, rows, d, V);
    backend->cross_entropy_forward(act->token_losses, act->token_lse, act->logits,
                                   act->targets, rows, V, z_loss);

    /* The means are taken in double on the host, in token order, so they do not depend on
     * the backend's reduction order. ce_t is recovered from loss_t and lse_t. */
    float *losses = xmalloc((size_t)rows * sizeof *losses);
    float *lse = xmalloc((size_t)rows * sizeof *lse);
    backend->download(losses, act->token_losses, (size_t)rows * sizeof *losses);
    backend->download(lse, act->token_lse, (size_t)rows * sizeof *lse);
    double loss_sum = 0, zloss_sum = 0;
    for (int t = 0; t < rows; t++) {
        loss_sum += losses[t];
        zloss_sum += (double)z_loss * (double)lse[t] * (double)lse[t];
    }
    free(losses);
    free(lse);
    ModelLoss result;
    result.loss = loss_sum / rows;
    result.zloss = zloss_sum / rows;
    result.ce = result.loss - result.zloss;
    return result;
}

void loss_backward(const LayerContext *context, const HeadWeights *weights,
                   HeadWeights *grads, const Activations *act, const float *x, float z_loss,
                   float loss_scale, float *dx)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    ActivationScratch *scratch = context->scratch;
    const int rows = context->B * context->T, d = config->d_model, V = config->vocab_size;

    /* d(loss_scale * mean_t loss_t) / d loss_t = loss_scale / rows for every token */
    float *grad_token_loss = xmalloc((size_t)rows * sizeof *grad_token_loss);
    for (int t = 0; t < rows; t++)
        grad_token_loss[t] = (float)((double)loss_scale / rows);
    backend->upload(scratch->grad_token_loss, grad_token_loss,
                    (size_t)rows * sizeof *grad_token_loss);
    free(grad_token_loss);

    backend->zero(scratch->grad_logits, (size_t)rows * V * sizeof(float));
    backend->cross_entropy_backward(scratch->grad_logits, scratch->grad_token_loss,
                                    act->logits, act->token_lse, act->targets, rows, V,
                                    z_loss);
    backend->zero(scratch->grad_normed, (size_t)rows * d * sizeof(float));
    backend->matmul_backward(scratch->grad_normed, grads->head, scratch->grad_logits,
                             act->final_normed, weights->head, rows, d, V);
    backend->rmsnorm_backward(dx, grads->norm, scratch->grad_normed, x, weights->norm,
                              act->final_rstd, rows, d);
}
