/* kernels/cpu/swiglu_cpu.c — the MLP gate (DESIGN 2): out = silu(gate) * up, all [n].
 *
 * silu(g) = g * sigmoid(g); d silu / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
 * sigmoid(g) = 1 / (1 + exp(-g)) is safe at both ends in fp32: exp(-g) overflows to +inf
 * for very negative g and the quotient is then exactly 0.
 */
#include "kernels/cpu/kernels_cpu.h"

#include <math.h>

static inline float sigmoid(float g)
{
    return 1.0f / (1.0f + expf(-g));
}

void cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

void cpu_swiglu_backward(float *dgate, float *dup, GradMode mode, const float *dout,
                         const float *gate, const float *up, size_t n)
{
    const bool accumulate = mode == GRAD_ADD;
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = sigmoid(g);
        /* GRAD_WRITE: +0.0 in place of the old values, never read (kernels_cpu.h) */
        float old_dgate = accumulate ? dgate[i] : 0.0f, old_dup = accumulate ? dup[i] : 0.0f;
        dgate[i] = old_dgate + dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = old_dup + dout[i] * g * s;
    }
}
