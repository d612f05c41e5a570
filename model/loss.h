/* model/loss.h — the output end of the model: final norm, head, cross-entropy + z-loss
 * (DESIGN 2).
 *
 *   logits = RMSNorm(x; model.norm) @ head^T          x [B*T, d], head [V, d], logits [B*T, V]
 *   loss_t = lse_t - logits[t, target_t] + z_loss * lse_t^2,   lse_t = logsumexp(logits[t])
 *   loss   = mean over the B*T tokens, reduced on the host in double
 *
 * head is lm_head.weight, or model.embed_tokens.weight when tie_embeddings (its gradient is
 * then the embedding's, and both uses add into it). The forward keeps the normed input,
 * rstd, logits, per-token losses and lse in the Activations.
 */
#ifndef FATHOM_MODEL_LOSS_H
#define FATHOM_MODEL_LOSS_H

#include "model/activations.h"
#include "model/layer.h"

typedef struct {
    double loss;  /* ce + zloss */
    double ce;    /* mean of lse_t - logits[t, target_t] */
    double zloss; /* mean of z_loss * lse_t^2 */
} ModelLoss;

/* Pointers into the flat parameter (or gradient) buffer. */
typedef struct {
    float *norm; /* model.norm.weight [d] */
    float *head; /* lm_head.weight or model.embed_tokens.weight [V, d] */
} HeadWeights;

/* Fills act->final_normed, final_rstd, logits, token_losses, token_lse from x and
 * act->targets; returns the means. */
ModelLoss loss_forward(const LayerContext *context, const HeadWeights *weights,
                       Activations *act, const float *x, float z_loss);

/* dx += d(loss_scale * loss)/dx; grads->norm and grads->head += theirs. */
void loss_backward(const LayerContext *context, const HeadWeights *weights,
                   HeadWeights *grads, const Activations *act, const float *x, float z_loss,
                   float loss_scale, float *dx);

#endif
