/* runtime/lr_schedule.c — warmup, then cosine, warmup-stable-decay or constant. The exact
 * formulas are in the header. */
#include "runtime/lr_schedule.h"

#include <math.h>

static double clamp01(double x)
{
    return x < 0 ? 0 : (x > 1 ? 1 : x);
}

/* Half-cosine from peak to floor: `progress` goes from 0 (end of warmup) to 1 (total_steps). */
static double lr_decay_cosine(double peak, double floor, double progress)
{
    return floor + (peak - floor) * 0.5 * (1.0 + cos(M_PI * clamp01(progress)));
}

/* Stable at peak, then linear to floor over the last decay_fraction of the run;
 * `fraction_left` goes from 1 (start of the decay) to 0 (total_steps). */
static double lr_decay_wsd(const OptimConfig *optim, double peak, double floor, int step,
                           int total_steps)
{
    double total = total_steps;
    double decay_start = total - optim->decay_fraction * total;
    if (decay_start < optim->warmup_steps)
        decay_start = optim->warmup_steps;
    if (optim->decay_fraction <= 0 || step <= decay_start || total <= decay_start)
        return peak;
    double fraction_left = clamp01((total - step) / (total - decay_start));
    return floor + (peak - floor) * fraction_left;
}

double lr_at_step(const OptimConfig *optim, int step, int total_steps)
{
    double peak = optim->lr;
    double floor = optim->lr * optim->min_lr_ratio;
    int warmup = optim->warmup_steps;

    if (warmup > 0 && step <= warmup)
        return peak * (double)step / (double)warmup;

    switch (optim->schedule) {
    case LR_CONSTANT:
        return peak;
    case LR_COSINE:
        if (total_steps <= warmup)
            return peak;
        return lr_decay_cosine(peak, floor,
                               (double)(step - warmup) / (double)(total_steps - warmup));
    case LR_WSD:
        return lr_decay_wsd(optim, peak, floor, step, total_steps);
    }
    return peak;
}
