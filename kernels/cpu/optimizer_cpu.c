/* kernels/cpu/optimizer_cpu.c — the optimizer's flat-range ops (DESIGN 3): the squared norm
 * for gradient clipping, AdamW with the weight EMA in its pass, the adds of FSDP's
 * accumulators. Every range is fp32 [n].
 *
 * sum_squares must give the same double whatever the thread count, because the clip factor
 * (and so every later step) depends on it: the range is cut into fixed blocks of
 * SUM_BLOCK elements, each block is summed in double by one thread, and the block sums are
 * added in block order. Groups of SUM_GROUP blocks are summed in parallel into a small
 * array on the stack, so no scratch memory is needed.
 */
#include "kernels/cpu/kernels_cpu.h"

#include <math.h>

enum {
    SUM_BLOCK = 4096, /* elements summed by one thread, in order */
    SUM_GROUP = 64,   /* blocks summed in parallel before their sums are added in order */
    SUM_LANES = 4     /* interleaved partial sums inside a block, combined in order */
};

static double sum_squares_block(const float *x, size_t n)
{
    double lanes[SUM_LANES] = {0};
    size_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++)
            lanes[l] += (double)x[i + l] * x[i + l];
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++)
        sum += (double)x[i] * x[i];
    return sum;
}

double cpu_sum_squares(const float *x, size_t n)
{
    size_t n_blocks = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    double total = 0;
    for (size_t group = 0; group < n_blocks; group += SUM_GROUP) {
        double block_sums[SUM_GROUP];
        int in_group = n_blocks - group < SUM_GROUP ? (int)(n_blocks - group) : SUM_GROUP;
#pragma omp parallel for schedule(static) if (in_group > 1)
        for (int j = 0; j < in_group; j++) {
            size_t first = (group + j) * SUM_BLOCK;
            size_t count = n - first < SUM_BLOCK ? n - first : SUM_BLOCK;
            block_sums[j] = sum_squares_block(x + first, count);
        }
        for (int j = 0; j < in_group; j++)
            total += block_sums[j];
    }
    return total;
}

/* The formula of runtime/backend.h, term by term, in fp32; the bias corrections are computed
 * once in double. step counts from 1; g = grads[i] * grad_scale (the fp32 product that
 * scaling the gradients in place would store); the EMA of the new weight in the same pass
 * (the products a separate pass over the new weights would form). */
void cpu_adamw_update(float *params, const float *grads, float *exp_avg, float *exp_avg_sq,
                      float *ema, size_t n, const AdamwScalars *s)
{
    const float beta1 = s->beta1, beta2 = s->beta2, eps = s->eps, grad_scale = s->grad_scale;
    const float decay = s->lr * s->weight_decay, ema_decay = s->ema_decay;
    const float step_size = (float)(s->lr / (1.0 - pow(beta1, s->step)));
    const float bias_correction2_sqrt = (float)sqrt(1.0 - pow(beta2, s->step));
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++) {
        float p = params[i], g = grads[i] * grad_scale;
        p -= decay * p;
        float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
        float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
        p -= step_size * m / (sqrtf(v) / bias_correction2_sqrt + eps);
        params[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        if (ema)
            ema[i] = ema_decay * ema[i] + (1.0f - ema_decay) * p;
    }
}

void cpu_add_floats(float *y, const float *x, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

