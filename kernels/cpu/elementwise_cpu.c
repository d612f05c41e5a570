/* kernels/cpu/elementwise_cpu.c — residual additions (runtime/backend.h, "elementwise"). */
#include "kernels/cpu/kernels_cpu.h"

void cpu_add_inplace(float *y, const float *x, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

/* out may alias a or b: each element is read before it is written, by the same thread */
void cpu_add(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void cpu_add_both(float *out, const float *a, float *y, const float *x, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + x[i];
        y[i] += x[i];
    }
}

void cpu_add_difference(float *y, const float *plus, const float *minus, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        y[i] = plus ? (y[i] - minus[i]) + plus[i] : y[i] - minus[i];
}
