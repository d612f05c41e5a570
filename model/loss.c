/* model/loss.c — see loss.h. */
#include "model/loss.h"

#include <stdlib.h>

#include "runtime/error.h"

/* Where the logits of the chunk starting at row `first` live: the chunk buffer, or their
 * rows of all_logits when the whole batch's are kept. */
static Activation *chunk_logits(const LayerContext *context, ModelScratch *scratch, int first)
{
    if (!scratch->all_logits)
        return scratch->logits;
    return activation_at(context->backend, scratch->all_logits,
                         (size_t)first * context->config->vocab_size);
}

/* logits of rows [first, first + count) */
static void head_forward_chunk(const LayerContext *context, const HeadWeights *weights,
                               ModelScratch *scratch, const HeadActivations *head, int first,
                               int count)
{
    const Backend *backend = context->backend;
    const int d = context->config->d_model, V = context->config->vocab_size;
    backend->matmul_forward(chunk_logits(context, scratch, first),
                            activation_at_const(backend, head->final_normed, (size_t)first * d),
                            weights->head, count, d, V);
}

ModelLoss loss_forward(const LayerContext *context, const HeadWeights *weights,
                       ModelScratch *scratch, HeadActivations *head, const uint32_t *targets,
                       const Activation *x, float z_loss)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    const int rows = context->B * context->T, d = config->d_model, V = config->vocab_size;

    backend->rmsnorm_forward(head->final_normed, head->final_rstd, x, weights->norm, rows, d,
                             (float)config->norm_eps);
    const int chunk = scratch->logit_rows;
    for (int first = 0; first < rows; first += chunk) {
        const int count = rows - first < chunk ? rows - first : chunk;
        head_forward_chunk(context, weights, scratch, head, first, count);
        backend->cross_entropy_forward(head->token_losses + first, head->token_lse + first,
                                       chunk_logits(context, scratch, first), targets + first,
                                       count, V, z_loss);
    }
    /* the logits buffer now holds this batch's whole logits, or only its last chunk's */
    scratch->logits_owner = scratch->all_logits || rows <= chunk ? head : NULL;
    scratch->chunk_owner = head;
    scratch->chunk_first = (rows - 1) / chunk * chunk;

    /* The means are taken in double on the host, in token order, so they do not depend on
     * the backend's reduction order. ce_t is recovered from loss_t and lse_t. */
    float *losses = xmalloc((size_t)rows * sizeof *losses);
    float *lse = xmalloc((size_t)rows * sizeof *lse);
    backend->download(losses, head->token_losses, (size_t)rows * sizeof *losses);
    backend->download(lse, head->token_lse, (size_t)rows * sizeof *lse);
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

void loss_backward(const LayerContext *context, const HeadWeights *weights, HeadGrads *grads,
                   ModelScratch *model_scratch, const HeadActivations *head,
                   const uint32_t *targets, const Activation *x, float z_loss,
                   float loss_scale, Activation *dx, GradMode dx_mode)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    ActivationScratch *scratch = context->scratch;
    const int rows = context->B * context->T, d = config->d_model, V = config->vocab_size;
    /* this batch's logits are all still there (one chunk, or all kept, and no other batch's
     * forward since) */
    const bool logits_kept = model_scratch->logits_owner == head;
    const int chunk = model_scratch->logit_rows;

    /* d(loss_scale * mean_t loss_t) / d loss_t = loss_scale / rows for every token */
    float *grad_token_loss = xmalloc((size_t)rows * sizeof *grad_token_loss);
    for (int t = 0; t < rows; t++)
        grad_token_loss[t] = (float)((double)loss_scale / rows);
    backend->upload(scratch->grad_token_loss, grad_token_loss,
                    (size_t)rows * sizeof *grad_token_loss);
    free(grad_token_loss);

    /* the logits' gradient and each chunk's rows of grad_normed are written: no zeroing.
     * Last chunk first: the buffer may still hold it (loss.h) */
    const int last_first = (rows - 1) / chunk * chunk;
    for (int first = last_first; first >= 0; first -= chunk) {
        const int count = rows - first < chunk ? rows - first : chunk;
        const bool chunk_kept = logits_kept || (model_scratch->chunk_owner == head &&
                                                model_scratch->chunk_first == first);
        if (!chunk_kept) {
            head_forward_chunk(context, weights, model_scratch, head, first, count);
            model_scratch->chunk_owner = head;
            model_scratch->chunk_first = first;
        }
        backend->cross_entropy_backward(scratch->grad_logits, GRAD_WRITE,
                                        scratch->grad_token_loss + first,
                                        chunk_logits(context, model_scratch, first),
                                        head->token_lse + first, targets + first, count, V,
                                        z_loss);
        const size_t offset = (size_t)first * d;
        const GradMode head_mode =
            first == last_first && grads->head_mode == GRAD_WRITE ? GRAD_WRITE : GRAD_ADD;
        backend->matmul_backward(activation_at(backend, scratch->grad_normed, offset),
                                 GRAD_WRITE, grads->head, head_mode, scratch->grad_logits,
                                 activation_at_const(backend, head->final_normed, offset),
                                 weights->head, count, d, V);
    }
    /* a remade batch's logits now fill the buffer, or only its first chunk's (chunk_owner) */
    if (!logits_kept)
        model_scratch->logits_owner = model_scratch->all_logits || rows <= chunk ? head : NULL;
    backend->rmsnorm_backward(dx, dx_mode, grads->norm, scratch->grad_normed, x, weights->norm,
                              head->final_rstd, rows, d);
}
