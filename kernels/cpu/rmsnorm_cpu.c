/* kernels/cpu/rmsnorm_cpu.c — RMSNorm over the rows of [rows, d] (DESIGN 2).
 *
 * Forward: rstd[r] = rsqrt(mean(x[r]^2) + eps), out = weight * (x * rstd), the product order
 * of Hugging Face's LlamaRMSNorm. The mean is accumulated in double and rstd rounded to fp32
 * once, so the saved statistic is the best fp32 value.
 *
 * Backward, with xhat = x * rstd and dxhat = dout * weight:
 *   g        = rstd * (dxhat - xhat * mean(dxhat * xhat))        (per row, one thread a row)
 *   dx      += g or dx = g (GradMode), or for an input that branches: dx = g, branch += g
 *   dweight += sum over rows of dout * xhat                      (per column, rows in order)
 * dweight is a sum over rows, so it gets its own pass split over columns: a split over rows
 * would make its summation order depend on the thread count.
 */
#include "kernels/cpu/kernels_cpu.h"

#include <math.h>

enum { RMSNORM_COLUMN_BLOCK = 64 };

void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int rows,
                         int d, float eps)
{
#pragma omp parallel for schedule(static) if ((size_t)rows * d >= CPU_PARALLEL_MIN_WORK)
    for (int r = 0; r < rows; r++) {
        const float *x_row = x + (size_t)r * d;
        float *out_row = out + (size_t)r * d;
        double sum_squares = 0;
        for (int i = 0; i < d; i++)
            sum_squares += (double)x_row[i] * x_row[i];
        float row_rstd = (float)(1.0 / sqrt(sum_squares / d + (double)eps));
        for (int i = 0; i < d; i++)
            out_row[i] = weight[i] * (x_row[i] * row_rstd);
        rstd[r] = row_rstd;
    }
}

/* branch NULL: dx += g (accumulate) or dx = +0.0 + g (GRAD_WRITE: the bits of an add into
 * zeros, kernels_cpu.h); otherwise dx = g and branch += g. */
static void rmsnorm_backward_rows(float *dx, bool accumulate, float *branch, float *dweight,
                                  const float *dout, const float *x, const float *weight,
                                  const float *rstd, int rows, int d)
{
    int parallel = (size_t)rows * d >= CPU_PARALLEL_MIN_WORK;

#pragma omp parallel for schedule(static) if (parallel)
    for (int r = 0; r < rows; r++) {
        const float *x_row = x + (size_t)r * d;
        const float *dout_row = dout + (size_t)r * d;
        float *dx_row = dx + (size_t)r * d;
        float row_rstd = rstd[r];
        double dot = 0; /* sum of dxhat * xhat */
        for (int i = 0; i < d; i++)
            dot += (double)(dout_row[i] * weight[i]) * (double)(x_row[i] * row_rstd);
        float mean_dot = (float)(dot / d);
        float *branch_row = branch ? branch + (size_t)r * d : NULL;
        for (int i = 0; i < d; i++) {
            float xhat = x_row[i] * row_rstd;
            float dxhat = dout_row[i] * weight[i];
            float g = row_rstd * (dxhat - xhat * mean_dot);
            if (branch_row) {
                dx_row[i] = g;
                branch_row[i] += g;
            } else {
                float old = accumulate ? dx_row[i] : 0.0f;
                dx_row[i] = old + g;
            }
        }
    }

    int n_blocks = (d + RMSNORM_COLUMN_BLOCK - 1) / RMSNORM_COLUMN_BLOCK;
#pragma omp parallel for schedule(static) if (parallel)
    for (int block = 0; block < n_blocks; block++) {
        int first = block * RMSNORM_COLUMN_BLOCK;
        int last = first + RMSNORM_COLUMN_BLOCK < d ? first + RMSNORM_COLUMN_BLOCK : d;
        for (int r = 0; r < rows; r++) {
            const float *x_row = x + (size_t)r * d;
            const float *dout_row = dout + (size_t)r * d;
            float row_rstd = rstd[r];
            for (int i = first; i < last; i++)
                dweight[i] += dout_row[i] * (x_row[i] * row_rstd);
        }
    }
}

void cpu_rmsnorm_backward(float *dx, GradMode dx_mode, float *dweight, const float *dout,
                          const float *x, const float *weight, const float *rstd, int rows,
                          int d)
{
    rmsnorm_backward_rows(dx, dx_mode == GRAD_ADD, NULL, dweight, dout, x, weight, rstd, rows,
                          d);
}

void cpu_rmsnorm_backward_branch(float *dx, float *branch, float *dweight, const float *dout,
                                 const float *x, const float *weight, const float *rstd,
                                 int rows, int d)
{
    rmsnorm_backward_rows(dx, false, branch, dweight, dout, x, weight, rstd, rows, d);
}
