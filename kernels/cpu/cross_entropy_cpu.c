/* kernels/cpu/cross_entropy_cpu.c — fused cross-entropy and z-loss (DESIGN 2, "Loss").
 *
 * logits [rows, V], targets [rows], losses / dloss / lse [rows]:
 *   lse_r    = logsumexp(logits[r, :])
 *   loss_r   = lse_r - logits[r, target_r] + z_loss * lse_r^2
 *   dlogits += dloss_r * (softmax(logits[r]) * (1 + 2 z_loss lse_r) - onehot(target_r))
 * The log-sum-exp subtracts the row max before exponentiating (no overflow for any finite
 * logits) and sums the exponentials in double. One thread per row.
 */
#include "kernels/cpu/kernels_cpu.h"

#include "runtime/error.h"

#include <math.h>

/* A target outside the vocabulary would index past the row: it is bad data, not a crash. */
static void check_targets(const uint32_t *targets, int rows, int V)
{
    for (int r = 0; r < rows; r++)
        if (targets[r] >= (uint32_t)V)
            fatal(EXIT_DATA, "target token %u at row %d is outside the vocabulary of %d tokens",
                  targets[r], r, V);
}

void cpu_cross_entropy_forward(float *losses, float *lse, const float *logits,
                               const uint32_t *targets, int rows, int V, float z_loss)
{
    check_targets(targets, rows, V);
#pragma omp parallel for schedule(static) if ((size_t)rows * V >= CPU_PARALLEL_MIN_WORK)
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * V;
        float row_max = row[0];
        for (int i = 1; i < V; i++)
            row_max = row[i] > row_max ? row[i] : row_max;
        double sum = 0;
        for (int i = 0; i < V; i++)
            sum += expf(row[i] - row_max);
        double row_lse = row_max + log(sum);
        losses[r] = (float)(row_lse - row[targets[r]] + z_loss * row_lse * row_lse);
        lse[r] = (float)row_lse;
    }
}

void cpu_cross_entropy_backward(float *dlogits, GradMode mode, const float *dloss,
                                const float *logits, const float *lse, const uint32_t *targets,
                                int rows, int V, float z_loss)
{
    const bool write = mode == GRAD_WRITE;
    check_targets(targets, rows, V);
#pragma omp parallel for schedule(static) if ((size_t)rows * V >= CPU_PARALLEL_MIN_WORK)
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * V;
        float *grad = dlogits + (size_t)r * V;
        float softmax_factor = dloss[r] * (1.0f + 2.0f * z_loss * lse[r]);
        int target = (int)targets[r];
        for (int i = 0; i < V; i++) {
            float term = softmax_factor * expf(row[i] - lse[r]);
            if (i == target)
                term -= dloss[r];
            grad[i] = (write ? 0.0f : grad[i]) + term; /* a write: the bits of an add to 0 */
        }
    }
}
