/* runtime/optim.c — see optim.h for the contract and the order of one step. */
#include "runtime/optim.h"

#include <math.h>
#include <stdlib.h>

#include "runtime/error.h"

/* torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing. */
#define OPTIM_CLIP_EPSILON 1e-6

/* A range outside the buffers is a bug in whoever built the table, not a user's mistake,
 * but writing out of bounds would corrupt memory silently: stop with a message instead. */
static void optim_check_ranges(const Optimizer *opt)
{
    for (int r = 0; r < opt->n_ranges; r++) {
        const OptimRange *range = &opt->ranges[r];
        if (range->offset > opt->count || range->count > opt->count - range->offset)
            fatal(EXIT_DATA,
                  "optimizer range %d [%zu, %zu) lies outside the %zu-element buffers", r,
                  range->offset, range->offset + range->count, opt->count);
    }
}

static double optim_global_grad_norm(const Optimizer *opt)
{
    double sum_squares = 0;
    if (!opt->norm_ranges)
        sum_squares = opt->backend->sum_squares(opt->grads, opt->count);
    for (int r = 0; opt->norm_ranges && r < opt->n_norm_ranges; r++)
        if (opt->norm_ranges[r].count)
            sum_squares += opt->backend->sum_squares(opt->grads + opt->norm_ranges[r].offset,
                                                     opt->norm_ranges[r].count);
    if (opt->reduce_sum)
        sum_squares = opt->reduce_sum(sum_squares, opt->reduce_context);
    return sqrt(sum_squares);
}

bool optim_step(Optimizer *opt, double lr, double *grad_norm)
{
    return optim_step_checked(opt, lr, true, grad_norm);
}

bool optim_step_checked(Optimizer *opt, double lr, bool loss_finite, double *grad_norm)
{
    const Backend *backend = opt->backend;
    const OptimConfig *config = opt->config;
    optim_check_ranges(opt);

    double norm = optim_global_grad_norm(opt);
    if (grad_norm)
        *grad_norm = norm;
    if (!isfinite(norm) || !loss_finite) {
        opt->skipped++;
        return false;
    }

    /* clipping: AdamW reads each gradient times coef, one pass over them fewer than scaling
     * them in place first (the same fp32 products) */
    float grad_scale = 1.0f;
    if (config->grad_clip > 0) {
        double coef = config->grad_clip / (norm + OPTIM_CLIP_EPSILON);
        if (coef < 1.0)
            grad_scale = (float)coef;
    }

    int update_number = opt->step + 1; /* bias correction counts from 1 */
    /* the EMA in AdamW's pass, over the ranges: what lies between them is alignment padding,
     * zero in the weights and in the EMA alike, where a pass over all `count` kept it zero */
    const bool ema = config->ema_decay > 0 && opt->ema;
    AdamwScalars scalars = {
        .beta1 = (float)config->beta1,
        .beta2 = (float)config->beta2,
        .eps = (float)config->eps,
        .grad_scale = grad_scale,
        .ema_decay = ema ? (float)optim_ema_decay_at(config->ema_decay, update_number) : 0.0f,
        .step = update_number,
    };
    AdamwRange *ranges = xmalloc((size_t)(opt->n_ranges ? opt->n_ranges : 1) * sizeof *ranges);
    int n = 0;
    for (int r = 0; r < opt->n_ranges; r++) {
        const OptimRange *range = &opt->ranges[r];
        if (range->count > 0)
            ranges[n++] = (AdamwRange){range->offset, range->count,
                                       (float)(lr * range->lr_mult), range->weight_decay};
    }
    if (n > 0)
        backend->adamw_update_ranges(opt->params, opt->grads, opt->exp_avg, opt->exp_avg_sq,
                                     ema ? opt->ema : NULL, ranges, n, &scalars, opt->compute);
    free(ranges);

    opt->step = update_number;
    return true;
}

double optim_ema_decay_at(double ema_decay, int update_number)
{
    const double warming = (1.0 + update_number) / (10.0 + update_number);
    return warming < ema_decay ? warming : ema_decay;
}

void optim_ema_reset(Optimizer *opt)
{
    if (opt->ema)
        opt->backend->copy(opt->ema, opt->params, opt->count * sizeof(float));
}

void optim_check_skipped(const Optimizer *opt, int max_skipped)
{
    if (opt->skipped > max_skipped)
        fatal(EXIT_NUMERICAL,
              "%d optimizer steps were skipped for a non-finite gradient norm, more than "
              "train.max_skipped = %d",
              opt->skipped, max_skipped);
}

float optim_range_weight_decay(const OptimConfig *config, unsigned no_decay_bit)
{
    if (no_decay_bit & config->no_decay)
        return 0.0f;
    if (no_decay_bit == NO_DECAY_ROUTING)
        return (float)config->route_weight_decay;
    return (float)config->weight_decay;
}

float optim_range_lr_mult(const OptimConfig *config, bool routing)
{
    return routing ? (float)config->route_lr_mult : 1.0f;
}
