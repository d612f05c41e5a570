/* runtime/optim.h — AdamW with global-norm clipping, non-finite step skipping and weight EMA
 * over flat fp32 buffers (DESIGN 3, 6).
 *
 * The buffers params, grads, exp_avg, exp_avg_sq and ema are backend memory of `count`
 * floats each, owned by the caller (under FSDP: this rank's shards, DESIGN 3). They are cut
 * into ranges, one per parameter tensor, each with its own learning-rate multiplier and
 * weight decay; everything is done through the Backend op table (sum_squares, adamw_update,
 * copy), so the same code runs on cpu and cuda.
 *
 * One step, optim_step(opt, lr, &grad_norm):
 *   1. norm = sqrt(sum over all `count` grads of g^2, or over norm_ranges when given), in
 *      double. When reduce_sum is set the
 *      per-rank sum of squares goes through it first, so every rank sees the global norm and
 *      takes the same decision.
 *   2. norm not finite: nothing changes except `skipped` (+1); returns false.
 *   3. grad_clip > 0: coef = grad_clip / (norm + 1e-6); when coef < 1 AdamW reads every
 *      gradient multiplied by coef (the update of torch.nn.utils.clip_grad_norm_, bit for
 *      bit; the gradients themselves are left unscaled, one pass over them fewer).
 *   4. AdamW on each range with lr * range.lr_mult and range.weight_decay, bias correction
 *      for update number step + 1 (the formula is in runtime/backend.h); the compute copy,
 *      when there is one, gets the new weights in the same pass.
 *   5. ema_decay > 0 and ema != NULL: ema = decay_t * ema + (1 - decay_t) * params (in
 *      AdamW's pass over each range: elements outside every range are alignment padding,
 *      zero in params and ema alike), with the decay warming up:
 *      decay_t = min(ema_decay, (1 + t) / (10 + t)) at update t = 1, 2, ..
 *      (optim_ema_decay_at). Without the warm-up an EMA of 0.999 keeps most of the initial
 *      weights for thousands of steps and looks untrained early in a run (0.18 at t = 1,
 *      0.96 at t = 200, 0.999 from about t = 9000).
 *   6. step += 1; returns true.
 * *grad_norm (grad_norm may be NULL) receives the pre-clip norm, NaN or inf for a skipped step.
 *
 * `skipped` counts every skipped step of the run (not only consecutive ones): it is the
 * `skipped` of metrics.jsonl. optim_step never exits; the caller decides the run's fate with
 * optim_check_skipped(), which fails with exit 4 once skipped exceeds train.max_skipped.
 */
#ifndef FATHOM_RUNTIME_OPTIM_H
#define FATHOM_RUNTIME_OPTIM_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/backend.h"
#include "runtime/config.h"

/* A contiguous span [offset, offset + count) of the flat buffers: one parameter tensor. */
typedef struct {
    size_t offset, count;
    float lr_mult, weight_decay;
} OptimRange;

/* Sums `local` over every rank that holds a part of the parameters and returns the total
 * (the same value on every rank). */
typedef double (*OptimReduceSum)(double local, void *context);

typedef struct {
    const Backend *backend;
    const OptimConfig *config;
    float *params, *grads, *exp_avg, *exp_avg_sq, *ema; /* flat, `count` each; ema may be NULL */
    Activation *compute;        /* flat compute copy refreshed by every update (DESIGN 3), or
                                   NULL when the ops read params itself (model_compute_copy) */
    size_t count;
    const OptimRange *ranges;
    int n_ranges;
    /* The ranges whose gradients the norm counts, when not every element of the buffers
     * (NULL: all `count`): under pipeline stages each rank counts its own tensors, and a
     * tensor several stages share only on the lowest of them (DESIGN 3). */
    const OptimRange *norm_ranges;
    int n_norm_ranges;
    OptimReduceSum reduce_sum;  /* NULL: this process holds every parameter */
    void *reduce_context;
    int step;                   /* updates taken so far; a skipped step does not count */
    int skipped;                /* non-finite steps skipped over the whole run */
} Optimizer;

/* One optimizer step as described above. Returns false when the step was skipped. */
bool optim_step(Optimizer *opt, double lr, double *grad_norm);
/* The same, skipping it also when loss_finite is false (a non-finite loss, decided on every
 * rank alike: DESIGN 3); the norm is still computed and reported. */
bool optim_step_checked(Optimizer *opt, double lr, bool loss_finite, double *grad_norm);

/* The EMA decay of update number t (step 5 above). */
double optim_ema_decay_at(double ema_decay, int update_number);

/* ema = params (at initialisation, or when a run starts keeping an EMA). No-op without ema. */
void optim_ema_reset(Optimizer *opt);

/* fatal(EXIT_NUMERICAL, ...) when opt->skipped > max_skipped; otherwise returns. */
void optim_check_skipped(const Optimizer *opt, int max_skipped);

/* Weight decay of a range of kind `no_decay_bit` (one NO_DECAY_* bit of runtime/config.h, 0
 * for ordinary matrices): 0 when the kind is in optim.no_decay, route_weight_decay for a
 * NO_DECAY_ROUTING range that is not, weight_decay otherwise. */
float optim_range_weight_decay(const OptimConfig *config, unsigned no_decay_bit);

/* Learning-rate multiplier of a range: route_lr_mult for routing weights, else 1. */
float optim_range_lr_mult(const OptimConfig *config, bool routing);

#endif
