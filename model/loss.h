/* model/loss.h — the output end of the model: final norm, head, cross-entropy + z-loss
 * (DESIGN 2).
 *
 *   logits = RMSNorm(x; model.norm) @ head^T          x [B*T, d], head [V, d], logits [B*T, V]
 *   loss_t = lse_t - logits[t, target_t] + z_loss * lse_t^2,   lse_t = logsumexp(logits[t])
 *   loss   = mean over the B*T tokens, reduced on the host in double
 *
 * head is lm_head.weight, or model.embed_tokens.weight when tie_embeddings (its gradient is
 * then the embedding's, and both uses add into it). The forward keeps the normed input,
 * rstd, per-token losses and lse in the microbatch's HeadActivations (its stash).
 *
 * The head and the loss walk the rows in chunks of scratch->logit_rows (model/activations.h):
 * per chunk, the logits [chunk, V] are made, the loss read from them, and they are dropped.
 * The forward keeps its last chunk in the chunk buffer and the chunk before it in the
 * logits' gradient buffer (the spare: idle between the head's forward and its backward,
 * unless another chunk walk came in between whose two-phase routing took its rows, which
 * takes the chunk too: model/chunk.c).
 * The backward takes the spare chunk first, its gradient replacing its logits in place
 * (cross_entropy_backward allows dlogits == logits), then the chunks from last to first,
 * making a chunk's logits again (one more head matmul) unless they are still there: the
 * whole batch's, when it was one chunk (scratch->logits_owner), or the chunk the buffer was
 * left holding (scratch->chunk_owner, chunk_first: the forward's last, or the first after a
 * backward), when no other microbatch's forward or backward came in between (spare_owner
 * likewise; any backward's gradient overwrites the spare). So no [rows, V] array exists
 * beyond the two buffers, and a batch of two chunks makes none again. The chunking changes
 * no value but the order of the head's gradient sums over the chunks: every row is computed
 * alone.
 *
 * A forward for a backward (loss_scale not 0: training) replaces each chunk's logits by
 * their gradient as it reads the loss (cross_entropy_forward_backward: one pass over the
 * logits where the loss and its backward took two). The chunks it leaves in the two buffers
 * then hold gradients (scratch->chunk_gradient, spare_gradient, for gradient_scale), which a
 * backward of the same loss_scale takes as they are; a chunk no longer there, or made for
 * another loss_scale, is made again and its gradient taken as above. The same bits either
 * way. Not with model_keep_all_logits, whose logits the caller reads.
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

/* Pointers into the compute copy of the parameters, and into the fp32 gradients. */
typedef struct {
    Activation *norm; /* model.norm.weight [d] */
    Activation *head; /* lm_head.weight or model.embed_tokens.weight [V, d] */
} HeadWeights;

typedef struct {
    float *norm, *head;
    /* GRAD_WRITE: head holds no contribution since the gradients were cleared and is not
     * zeroed (runtime/fsdp.h, "written first"): the backward's first chunk writes it. Set
     * by the caller before each loss_backward; anything else adds. */
    GradMode head_mode;
} HeadGrads;

/* Fills head (final_normed, final_rstd, token_losses, token_lse) and the scratch's logits
 * from x [rows, d] and targets [rows] (backend memory); returns the means. loss_scale: 0,
 * or the loss_scale of the loss_backward that follows, whose gradient of the logits this
 * forward then makes in their place (see above). */
ModelLoss loss_forward(const LayerContext *context, const HeadWeights *weights,
                       ModelScratch *scratch, HeadActivations *head, const uint32_t *targets,
                       const Activation *x, float z_loss, float loss_scale);

/* dx += or = (dx_mode) d(loss_scale * loss)/dx; grads->norm += its gradient, grads->head
 * += or = its (grads->head_mode). */
void loss_backward(const LayerContext *context, const HeadWeights *weights, HeadGrads *grads,
                   ModelScratch *scratch, const HeadActivations *head,
                   const uint32_t *targets, const Activation *x, float z_loss,
                   float loss_scale, Activation *dx, GradMode dx_mode);

#endif
