/* tests/test_optim.c — learning-rate schedules and the optimizer step (DESIGN 3, 6).
 *
 * The optimizer is driven through a local reference Backend that fills only the ops it uses
 * (sum_squares, adamw_update with its EMA) plus copy, each a naive loop written from the
 * formulas in runtime/backend.h; AdamW is checked against a double-precision loop.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "runtime/lr_schedule.h"
#include "runtime/error.h"
#include "runtime/optim.h"
#include "tests/support.h"

/* ---- a reference backend with just the optimizer ops ---- */

static double reference_sum_squares(const float *x, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)x[i] * (double)x[i];
    return sum;
}

static void reference_adamw_update(float *params, const float *grads, float *exp_avg,
                                   float *exp_avg_sq, float *ema, size_t n,
                                   const AdamwScalars *s, Activation *compute_copy)
{
    cr_assert_null(compute_copy, "no compute copy was given to the optimizer");
    const float lr = s->lr, beta1 = s->beta1, beta2 = s->beta2;
    float correction1 = 1.0f - powf(beta1, (float)s->step);
    float correction2_sqrt = sqrtf(1.0f - powf(beta2, (float)s->step));
    for (size_t i = 0; i < n; i++) {
        const float g = grads[i] * s->grad_scale;
        params[i] -= lr * s->weight_decay * params[i];
        exp_avg[i] = beta1 * exp_avg[i] + (1 - beta1) * g;
        exp_avg_sq[i] = beta2 * exp_avg_sq[i] + (1 - beta2) * g * g;
        params[i] -= lr / correction1 * exp_avg[i] /
                     (sqrtf(exp_avg_sq[i]) / correction2_sqrt + s->eps);
        if (ema)
            ema[i] = s->ema_decay * ema[i] + (1 - s->ema_decay) * params[i];
    }
}

static void reference_adamw_update_ranges(float *params, const float *grads, float *exp_avg,
                                          float *exp_avg_sq, float *ema,
                                          const AdamwRange *ranges, int n_ranges,
                                          const AdamwScalars *s, Activation *compute_copy)
{
    for (int r = 0; r < n_ranges; r++) {
        AdamwScalars one = *s;
        one.lr = ranges[r].lr;
        one.weight_decay = ranges[r].weight_decay;
        const size_t at = ranges[r].offset;
        reference_adamw_update(params + at, grads + at, exp_avg + at, exp_avg_sq + at,
                               ema ? ema + at : NULL, ranges[r].count, &one, compute_copy);
    }
}

static void reference_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static const Backend reference_backend = {
    .name = "optimizer-reference",
    .copy = reference_copy,
    .sum_squares = reference_sum_squares,
    .adamw_update = reference_adamw_update,
    .adamw_update_ranges = reference_adamw_update_ranges,
};

/* ---- fixtures ---- */

#define COUNT 10

static OptimConfig optim_config_plain(void)
{
    OptimConfig config = {
        .lr = 1e-3, .min_lr_ratio = 0.1, .warmup_steps = 0, .schedule = LR_CONSTANT,
        .decay_fraction = 0.2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
        .weight_decay = 0.1, .no_decay = 0, .grad_clip = 0, .ema_decay = 0,
        .route_lr_mult = 1, .route_weight_decay = 0,
    };
    return config;
}

typedef struct {
    float params[COUNT], grads[COUNT], exp_avg[COUNT], exp_avg_sq[COUNT], ema[COUNT];
    OptimRange ranges[2];
    Optimizer opt;
} OptimFixture;

/* Two ranges: [0, 6) decayed at lr x 1, [6, 10) not decayed at lr x 2. */
static void fixture_init(OptimFixture *f, const OptimConfig *config)
{
    memset(f, 0, sizeof *f);
    test_fill_normal(f->params, COUNT, 0.5f, 11);
    test_fill_normal(f->grads, COUNT, 0.1f, 12);
    f->ranges[0] = (OptimRange){.offset = 0, .count = 6, .lr_mult = 1, .weight_decay = 0.1f};
    f->ranges[1] = (OptimRange){.offset = 6, .count = 4, .lr_mult = 2, .weight_decay = 0};
    f->opt = (Optimizer){
        .backend = &reference_backend, .config = config, .params = f->params,
        .grads = f->grads, .exp_avg = f->exp_avg, .exp_avg_sq = f->exp_avg_sq,
        .ema = f->ema, .count = COUNT, .ranges = f->ranges, .n_ranges = 2,
    };
}

/* ---- learning-rate schedules ---- */

Test(optim, warmup_starts_at_lr_over_warmup_steps)
{
    OptimConfig config = optim_config_plain();
    config.schedule = LR_COSINE;
    config.warmup_steps = 10;
    cr_assert_float_eq(lr_at_step(&config, 1, 100), 1e-4, 1e-15);
}

Test(optim, warmup_reaches_lr_at_its_last_step)
{
    OptimConfig config = optim_config_plain();
    config.schedule = LR_COSINE;
    config.warmup_steps = 10;
    cr_assert_float_eq(lr_at_step(&config, 5, 100), 5e-4, 1e-15);
    cr_assert_float_eq(lr_at_step(&config, 10, 100), 1e-3, 1e-15);
}

Test(optim, without_warmup_the_decay_counts_from_step_0)
{
    OptimConfig config = optim_config_plain();
    config.schedule = LR_COSINE;
    cr_assert_float_eq(lr_at_step(&config, 1, 100), 0.5 * (1e-3 + 1e-4) +
                       0.5 * (1e-3 - 1e-4) * cos(M_PI / 100), 1e-15);
}

Test(optim, cosine_is_halfway_to_min_at_the_midpoint_of_the_decay)
{
    OptimConfig config = optim_config_plain();
    config.schedule = LR_COSINE;
    config.warmup_steps = 10;
    /* decay runs over steps 10..110; its midpoint is step 60 */
    cr_assert_float_eq(lr_at_step(&config, 60, 110), 0.5 * (1e-3 + 1e-4), 1e-15);
}

Test(optim, cosine_ends_at_lr_times_min_lr_ratio)
{
    OptimConfig config = optim_config_plain();
    config.schedule = LR_COSINE;
    config.warmup_steps = 10;
    cr_assert_float_eq(lr_at_step(&config, 110, 110), 1e-4, 1e-15);
    cr_assert_float_eq(lr_at_step(&config, 200, 110), 1e-4, 1e-15);
}

Test(optim, wsd_holds_lr_until_the_last_decay_fraction)
{
    OptimConfig config = optim_config_plain();
    config.schedule = LR_WSD;
    config.warmup_steps = 10;
    config.decay_fraction = 0.2; /* 100 steps: decay from step 80 */
    cr_assert_float_eq(lr_at_step(&config, 11, 100), 1e-3, 1e-15);
    cr_assert_float_eq(lr_at_step(&config, 80, 100), 1e-3, 1e-15);
}

Test(optim, wsd_decays_linearly_to_lr_times_min_lr_ratio)
{
    OptimConfig config = optim_config_plain();
    config.schedule = LR_WSD;
    config.warmup_steps = 10;
    config.decay_fraction = 0.2;
    cr_assert_float_eq(lr_at_step(&config, 90, 100), 0.5 * (1e-3 + 1e-4), 1e-15);
    cr_assert_float_eq(lr_at_step(&config, 95, 100), 1e-4 + 0.25 * (1e-3 - 1e-4), 1e-15);
    cr_assert_float_eq(lr_at_step(&config, 100, 100), 1e-4, 1e-15);
}

Test(optim, constant_holds_lr_after_warmup)
{
    OptimConfig config = optim_config_plain();
    config.warmup_steps = 4;
    cr_assert_float_eq(lr_at_step(&config, 2, 100), 5e-4, 1e-15);
    cr_assert_float_eq(lr_at_step(&config, 5, 100), 1e-3, 1e-15);
    cr_assert_float_eq(lr_at_step(&config, 100, 100), 1e-3, 1e-15);
}

/* ---- the AdamW step ---- */

Test(optim, adamw_matches_a_double_precision_reference_over_three_steps)
{
    OptimConfig config = optim_config_plain();
    OptimFixture f;
    fixture_init(&f, &config);
    double params[COUNT], m[COUNT] = {0}, v[COUNT] = {0};
    for (int i = 0; i < COUNT; i++)
        params[i] = f.params[i];
    const double lrs[3] = {1e-3, 2e-3, 5e-4};

    for (int step = 1; step <= 3; step++) {
        test_fill_normal(f.grads, COUNT, 0.1f, 100 + (uint64_t)step);
        for (int i = 0; i < COUNT; i++) {
            double lr = lrs[step - 1] * (i < 6 ? 1.0 : 2.0), wd = i < 6 ? 0.1 : 0.0;
            double g = f.grads[i];
            params[i] -= lr * wd * params[i];
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.95 * v[i] + 0.05 * g * g;
            double m_hat = m[i] / (1 - pow(0.9, step)), v_hat = v[i] / (1 - pow(0.95, step));
            params[i] -= lr * m_hat / (sqrt(v_hat) + 1e-8);
        }
        double norm;
        cr_assert(optim_step(&f.opt, lrs[step - 1], &norm));
    }
    cr_assert_eq(f.opt.step, 3);
    double error = test_relative_error_double(f.params, params, COUNT);
    cr_assert_lt(error, 1e-6, "relative error %g", error);
}

Test(optim, grad_norm_is_the_global_l2_norm_before_clipping)
{
    OptimConfig config = optim_config_plain();
    config.grad_clip = 0.01;
    OptimFixture f;
    fixture_init(&f, &config);
    double expected = sqrt(reference_sum_squares(f.grads, COUNT)), norm = 0;
    optim_step(&f.opt, 1e-3, &norm);
    cr_assert_float_eq(norm, expected, 1e-12);
}

Test(optim, clipping_leaves_gradients_alone_below_grad_clip)
{
    OptimConfig config = optim_config_plain();
    OptimFixture f;
    fixture_init(&f, &config);
    float before[COUNT];
    memcpy(before, f.grads, sizeof before);
    double norm_before = sqrt(reference_sum_squares(f.grads, COUNT)), norm;
    config.grad_clip = norm_before * 1.01;
    optim_step(&f.opt, 1e-3, &norm);
    cr_assert(memcmp(before, f.grads, sizeof before) == 0);
}

Test(optim, clipping_above_grad_clip_scales_by_the_torch_coefficient)
{
    OptimConfig config = optim_config_plain();
    config.grad_clip = 1.0;
    OptimFixture f;
    fixture_init(&f, &config);
    memset(f.grads, 0, sizeof f.grads);
    f.grads[0] = 3;
    f.grads[7] = 4; /* norm 5 */
    /* torch scales the gradients in place, then steps: the same step, bit for bit */
    OptimConfig unclipped_config = config;
    unclipped_config.grad_clip = 0;
    OptimFixture torch;
    fixture_init(&torch, &unclipped_config);
    memset(torch.grads, 0, sizeof torch.grads);
    float coef = (float)(1.0 / (5.0 + 1e-6));
    torch.grads[0] = 3 * coef;
    torch.grads[7] = 4 * coef;
    double norm;
    optim_step(&f.opt, 1e-3, &norm);
    optim_step(&torch.opt, 1e-3, NULL);
    cr_assert_float_eq(norm, 5.0, 1e-12);
    cr_assert(memcmp(f.params, torch.params, sizeof f.params) == 0);
    cr_assert(memcmp(f.exp_avg, torch.exp_avg, sizeof f.exp_avg) == 0);
    cr_assert(memcmp(f.exp_avg_sq, torch.exp_avg_sq, sizeof f.exp_avg_sq) == 0);
    cr_assert(f.grads[0] == 3 && f.grads[7] == 4, "the gradients are read scaled, not scaled");
}

Test(optim, non_finite_gradient_skips_the_step_and_leaves_state_untouched)
{
    OptimConfig config = optim_config_plain();
    config.ema_decay = 0.9;
    OptimFixture f;
    fixture_init(&f, &config);
    optim_ema_reset(&f.opt);
    cr_assert(optim_step(&f.opt, 1e-3, NULL));
    f.grads[3] = NAN;
    OptimFixture saved = f;

    double norm = 0;
    cr_assert_not(optim_step(&f.opt, 1e-3, &norm));
    cr_assert(isnan(norm));
    cr_assert(memcmp(saved.params, f.params, sizeof f.params) == 0);
    cr_assert(memcmp(saved.exp_avg, f.exp_avg, sizeof f.exp_avg) == 0);
    cr_assert(memcmp(saved.exp_avg_sq, f.exp_avg_sq, sizeof f.exp_avg_sq) == 0);
    cr_assert(memcmp(saved.ema, f.ema, sizeof f.ema) == 0);
    cr_assert_eq(f.opt.step, 1);
    cr_assert_eq(f.opt.skipped, 1);
}

Test(optim, infinite_gradient_skips_the_step)
{
    OptimConfig config = optim_config_plain();
    OptimFixture f;
    fixture_init(&f, &config);
    f.grads[0] = INFINITY;
    cr_assert_not(optim_step(&f.opt, 1e-3, NULL));
    cr_assert_eq(f.opt.skipped, 1);
    cr_assert_eq(f.opt.step, 0);
}

Test(optim, skipped_steps_up_to_max_skipped_are_tolerated)
{
    Optimizer opt = {.skipped = 3};
    optim_check_skipped(&opt, 3);
}

static void check_four_skipped_of_three(void *unused)
{
    (void)unused;
    Optimizer opt = {.skipped = 4};
    optim_check_skipped(&opt, 3);
}

Test(optim, skipped_steps_past_max_skipped_exit_with_code_4)
{
    test_expect_fatal(check_four_skipped_of_three, NULL, EXIT_NUMERICAL,
                      "4 optimizer steps were skipped for a non-finite gradient norm, more "
                      "than train.max_skipped = 3");
}

Test(optim, ema_reset_copies_the_parameters)
{
    OptimConfig config = optim_config_plain();
    OptimFixture f;
    fixture_init(&f, &config);
    test_fill_nan(f.ema, COUNT);
    optim_ema_reset(&f.opt);
    cr_assert(memcmp(f.ema, f.params, sizeof f.ema) == 0);
}

Test(optim, ema_follows_its_closed_form_over_steps)
{
    /* lr 0 and no decay keep the parameters fixed at p, so after k steps
     * ema = p + prod_t decay_t (ema_0 - p), decay_t = min(0.9, (1 + t) / (10 + t)) */
    OptimConfig config = optim_config_plain();
    config.ema_decay = 0.9;
    OptimFixture f;
    fixture_init(&f, &config);
    test_fill_normal(f.ema, COUNT, 1.0f, 99);
    double product = 1, expected[COUNT];
    for (int t = 1; t <= 200; t++)
        product *= fmin(0.9, (1.0 + t) / (10.0 + t));
    for (int i = 0; i < COUNT; i++)
        expected[i] = f.params[i] + product * ((double)f.ema[i] - f.params[i]);
    for (int k = 0; k < 200; k++)
        cr_assert(optim_step(&f.opt, 0.0, NULL));
    double error = test_relative_error_double(f.ema, expected, COUNT);
    cr_assert_lt(error, 1e-6, "relative error %g", error);
}

/* The EMA runs in AdamW's pass over the ranges: what lies between ranges (alignment padding,
 * zero in the weights and the EMA of a real run) is left as it is. */
Test(optim, the_ema_follows_the_updated_weights_of_each_range_and_skips_the_gaps)
{
    OptimConfig config = optim_config_plain();
    config.ema_decay = 0.9;
    OptimFixture f;
    fixture_init(&f, &config);
    f.ranges[0].count = 4; /* elements 4 and 5 lie between the ranges */
    test_fill_normal(f.ema, COUNT, 1.0f, 98);
    float ema_before[COUNT];
    memcpy(ema_before, f.ema, sizeof ema_before);
    cr_assert(optim_step(&f.opt, 1e-2, NULL));
    const float decay = (float)optim_ema_decay_at(0.9, 1);
    for (int i = 0; i < COUNT; i++) {
        const bool gap = i == 4 || i == 5;
        const float want = gap ? ema_before[i] : decay * ema_before[i] + (1 - decay) * f.params[i];
        cr_expect_float_eq(f.ema[i], want, 1e-6f * (1 + fabsf(want)), "element %d", i);
    }
}

Test(optim, no_ema_update_without_ema_decay)
{
    OptimConfig config = optim_config_plain();
    OptimFixture f;
    fixture_init(&f, &config);
    optim_ema_reset(&f.opt);
    float before[COUNT];
    memcpy(before, f.ema, sizeof before);
    optim_step(&f.opt, 1e-2, NULL);
    cr_assert(memcmp(before, f.ema, sizeof before) == 0);
}

/* ---- per-range weight decay and learning-rate multiplier ---- */

Test(optim, range_weight_decay_follows_no_decay_and_routing)
{
    OptimConfig config = optim_config_plain();
    config.weight_decay = 0.1;
    config.route_weight_decay = 0.01;
    config.no_decay = NO_DECAY_NORMS | NO_DECAY_EMBEDDINGS;
    cr_assert_float_eq(optim_range_weight_decay(&config, 0), 0.1f, 1e-9);
    cr_assert_float_eq(optim_range_weight_decay(&config, NO_DECAY_NORMS), 0.0f, 1e-9);
    cr_assert_float_eq(optim_range_weight_decay(&config, NO_DECAY_EMBEDDINGS), 0.0f, 1e-9);
    cr_assert_float_eq(optim_range_weight_decay(&config, NO_DECAY_BIASES), 0.1f, 1e-9);
    cr_assert_float_eq(optim_range_weight_decay(&config, NO_DECAY_ROUTING), 0.01f, 1e-9);
    config.no_decay |= NO_DECAY_ROUTING;
    cr_assert_float_eq(optim_range_weight_decay(&config, NO_DECAY_ROUTING), 0.0f, 1e-9);
}

Test(optim, routing_ranges_take_route_lr_mult)
{
    OptimConfig config = optim_config_plain();
    config.route_lr_mult = 4;
    cr_assert_float_eq(optim_range_lr_mult(&config, true), 4.0f, 1e-9);
    cr_assert_float_eq(optim_range_lr_mult(&config, false), 1.0f, 1e-9);
}

/* An EMA is meaningful early: its decay warms up as (1 + t) / (10 + t) until ema_decay. */
Test(optim, the_ema_decay_warms_up_to_ema_decay)
{
    cr_expect_float_eq(optim_ema_decay_at(0.999, 1), 2.0 / 11.0, 1e-12);
    cr_expect_float_eq(optim_ema_decay_at(0.999, 200), 201.0 / 210.0, 1e-12);
    cr_expect_float_eq(optim_ema_decay_at(0.999, 100000), 0.999, 1e-12);
    cr_expect_float_eq(optim_ema_decay_at(0.5, 1), 2.0 / 11.0, 1e-12);
    cr_expect_float_eq(optim_ema_decay_at(0.5, 50), 0.5, 1e-12);
}
