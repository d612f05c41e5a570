/* runtime/lr_schedule.h — the learning rate of each step (DESIGN 6, optim.schedule).
 *
 * lr_at_step(optim, step, total_steps) is a pure function. `step` counts from 1: it is the
 * step about to be taken (the optimizer's update count plus one). With
 *   lr = optim->lr, min = lr * optim->min_lr_ratio, W = optim->warmup_steps, N = total_steps:
 *
 *   warmup (W > 0 and step <= W):  lr * step / W        (lr / W at step 1, lr at step W)
 *
 * then, by optim->schedule, with progress measured from the end of warmup:
 *   constant:  lr
 *   cosine:    p = (step - W) / (N - W), clamped to [0, 1]
 *              min + (lr - min) * 0.5 * (1 + cos(pi * p))    (lr at W, min at N)
 *   wsd:       decay starts at S = max(W, N - decay_fraction * N) (a real number)
 *              step <= S: lr
 *              step >  S: min + (lr - min) * (N - step) / (N - S), clamped at min past N
 *
 * Degenerate cases keep the rate finite: N <= W (nothing left to decay) holds lr after
 * warmup; decay_fraction <= 0 makes wsd constant. Steps past N stay at min.
 */
#ifndef FATHOM_RUNTIME_LR_SCHEDULE_H
#define FATHOM_RUNTIME_LR_SCHEDULE_H

#include "runtime/config.h"

double lr_at_step(const OptimConfig *optim, int step, int total_steps);

#endif
