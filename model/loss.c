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

/* logits of rows [first, first + count) into `logits` */
static void head_forward_chunk(const LayerContext *context, const HeadWeights *weights,
                               Activation *logits, const HeadActivations *head, int first,
                               int count)
{
    const Backend *backend = context->backend;
    const int d = context->config->d_model, V = context->config->vocab_size;
    backend->matmul_forward(logits,
                            activation_at_const(backend, head->final_normed, (size_t)first * d),
                            weights->head, count, d, V);
}

/* The first row of the batch's last chunk, and of the chunk before it that a forward keeps
 * in the spare buffer (the logits' gradient, idle until the head's backward; loss.h), or -1
 * where there is none. */
static int last_chunk_first(int rows, int chunk)
{
    return (rows - 1) / chunk * chunk;
}

static int spare_chunk_first(const ModelScratch *scratch, int rows)
{
    const int first = last_chunk_first(rows, scratch->logit_rows) - scratch->logit_rows;
    return !scratch->all_logits && first >= 0 ? first : -1;
}

/* d(loss_scale * mean_t loss_t) / d loss_t = loss_scale / rows for every token, into the
 * scratch's grad_token_loss */
static void upload_token_loss_gradient(const LayerContext *context, int rows, float loss_scale)
{
    float *grad_token_loss = xmalloc((size_t)rows * sizeof *grad_token_loss);
    for (int t = 0; t < rows; t++)
        grad_token_loss[t] = (float)((double)loss_scale / rows);
    context->backend->upload(context->scratch->grad_token_loss, grad_token_loss,
                             (size_t)rows * sizeof *grad_token_loss);
    free(grad_token_loss);
}

ModelLoss loss_forward(const LayerContext *context, const HeadWeights *weights,
                       ModelScratch *scratch, HeadActivations *head, const uint32_t *targets,
                       const Activation *x, float z_loss, float loss_scale)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    const int rows = context->B * context->T, d = config->d_model, V = config->vocab_size;

    backend->rmsnorm_forward(head->final_normed, head->final_rstd, x, weights->norm, rows, d,
                             (float)config->norm_eps);
    const int chunk = scratch->logit_rows, spare_first = spare_chunk_first(scratch, rows);
    const bool gradient = loss_scale != 0.0f && !scratch->all_logits;
    if (gradient)
        upload_token_loss_gradient(context, rows, loss_scale);
    for (int first = 0; first < rows; first += chunk) {
        const int count = rows - first < chunk ? rows - first : chunk;
        Activation *logits = first == spare_first ? context->scratch->grad_logits
                                                  : chunk_logits(context, scratch, first);
        head_forward_chunk(context, weights, logits, head, first, count);
        if (gradient)
            backend->cross_entropy_forward_backward(
                head->token_losses + first, head->token_lse + first, logits,
                context->scratch->grad_token_loss + first, targets + first, count, V, z_loss);
        else
            backend->cross_entropy_forward(head->token_losses + first, head->token_lse + first,
                                           logits, targets + first, count, V, z_loss);
    }
    scratch->chunk_gradient = scratch->spare_gradient = gradient;
    scratch->gradient_scale = loss_scale;
    /* the logits buffer now holds this batch's whole logits, or only its last chunk's, and
     * the spare buffer the chunk before that */
    scratch->logits_owner = scratch->all_logits || rows <= chunk ? head : NULL;
    scratch->chunk_owner = head;
    scratch->chunk_first = last_chunk_first(rows, chunk);
    scratch->spare_owner = spare_first >= 0 ? head : NULL;
    scratch->spare_first = spare_first;

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
    /* the kept chunks' gradients, where the forward made them for this loss_scale */
    const bool scale_kept = model_scratch->gradient_scale == loss_scale;
    if (model_scratch->spare_gradient && !scale_kept)
        model_scratch->spare_owner = NULL; /* its logits are gone: made again below */
    upload_token_loss_gradient(context, rows, loss_scale);

    /* the logits' gradient and each chunk's rows of grad_normed are written: no zeroing.
     * The chunk the spare buffer holds first (its gradient in place), then the last chunk
     * (the chunk buffer may still hold it), then the others from last to first (loss.h).
     * The order is the batch's shape's, kept chunks or not, so a backward done again adds
     * the head's gradient in the same order (the same bits). */
    const int last_first = last_chunk_first(rows, chunk);
    const int spare_first = spare_chunk_first(model_scratch, rows);
    GradMode head_mode = grads->head_mode == GRAD_WRITE ? GRAD_WRITE : GRAD_ADD;
    for (int k = -1; k <= last_first / chunk; k++) {
        const int first = k < 0 ? spare_first : last_first - k * chunk;
        if (first < 0 || (k >= 0 && first == spare_first))
            continue;
        const int count = rows - first < chunk ? rows - first : chunk;
        Activation *logits, *grad_logits = scratch->grad_logits;
        bool made = false; /* the buffer holds this chunk's gradient already */
        if (model_scratch->spare_owner == head && model_scratch->spare_first == first) {
            logits = grad_logits; /* the spare chunk: the gradient replaces its logits */
            made = model_scratch->spare_gradient && scale_kept;
        } else {
            model_scratch->spare_owner = NULL; /* the gradient below overwrites it */
            logits = chunk_logits(context, model_scratch, first);
            bool kept = logits_kept || (model_scratch->chunk_owner == head &&
                                        model_scratch->chunk_first == first);
            if (kept && model_scratch->chunk_gradient && !scale_kept)
                kept = false; /* another loss_scale's gradient: the logits are gone */
            if (!kept) {
                head_forward_chunk(context, weights, logits, head, first, count);
                model_scratch->chunk_owner = head;
                model_scratch->chunk_first = first;
                model_scratch->chunk_gradient = false;
            }
            made = kept && model_scratch->chunk_gradient;
            if (made)
                grad_logits = logits;
        }
        if (!made)
            backend->cross_entropy_backward(grad_logits, GRAD_WRITE,
                                            scratch->grad_token_loss + first, logits,
                                            head->token_lse + first, targets + first, count, V,
                                            z_loss);
        const size_t offset = (size_t)first * d;
        backend->matmul_backward(activation_at(backend, scratch->grad_normed, offset),
                                 GRAD_WRITE, grads->head, head_mode, grad_logits,
                                 activation_at_const(backend, head->final_normed, offset),
                                 weights->head, count, d, V);
        head_mode = GRAD_ADD;
    }
    model_scratch->spare_owner = NULL; /* it holds a gradient now */
    /* a remade batch's logits now fill the buffer, or only its first chunk's (chunk_owner) */
    if (!logits_kept)
        model_scratch->logits_owner = model_scratch->all_logits || rows <= chunk ? head : NULL;
    backend->rmsnorm_backward(dx, dx_mode, grads->norm, scratch->grad_normed, x, weights->norm,
                              head->final_rstd, rows, d);
}
