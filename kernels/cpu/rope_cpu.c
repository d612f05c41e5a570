/* kernels/cpu/rope_cpu.c — rotary position embedding, rotate-half convention (DESIGN 2).
 *
 * x, out, dx, dout [B, T, n_heads, head_dim]; cos, sin [T, head_dim / 2]. Channel i of the
 * first half and channel i + head_dim/2 form one rotated pair at angle theta(t, i):
 *   forward:  (a, b) -> (a cos - b sin, b cos + a sin)
 *   backward: the transpose (inverse) rotation, added into dx or written (GradMode).
 * Both values of a pair are read before either is written, so out may alias x.
 */
#include "kernels/cpu/kernels_cpu.h"

#include <stdbool.h>

/* Rotates every pair of `in` by theta(t, i), or by -theta(t, i) when sin_sign is -1 (the
 * inverse: sin(-theta) = -sin(theta), exact in fp32), into `out`: written (the forward), or,
 * for a gradient, added to the old value (`accumulate`) or to +0.0 in its place (GRAD_WRITE:
 * the bits of an add into zeros, kernels_cpu.h). Inlined with a constant `gradient`, the
 * forward and the backward each get their own loop. */
static inline void rope_rotate(float *out, const float *in, const float *cos, const float *sin,
                               int B, int T, int n_heads, int head_dim, float sin_sign,
                               bool gradient, bool accumulate)
{
    int half = head_dim / 2;
    int positions = B * T;
#pragma omp parallel for schedule(static) \
    if ((size_t)positions * n_heads * head_dim >= CPU_PARALLEL_MIN_WORK)
    for (int position = 0; position < positions; position++) {
        int t = position % T;
        const float *cos_row = cos + (size_t)t * half, *sin_row = sin + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            size_t offset = ((size_t)position * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = in[offset + i], b = in[offset + i + half];
                float c = cos_row[i], s = sin_sign * sin_row[i];
                float first = a * c - b * s, second = b * c + a * s;
                if (gradient) {
                    float old_first = accumulate ? out[offset + i] : 0.0f;
                    float old_second = accumulate ? out[offset + i + half] : 0.0f;
                    out[offset + i] = old_first + first;
                    out[offset + i + half] = old_second + second;
                } else {
                    out[offset + i] = first;
                    out[offset + i + half] = second;
                }
            }
        }
    }
}

void cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin, int B,
                      int T, int n_heads, int head_dim)
{
    rope_rotate(out, x, cos, sin, B, T, n_heads, head_dim, 1.0f, false, false);
}

void cpu_rope_backward(float *dx, GradMode dx_mode, const float *dout, const float *cos,
                       const float *sin, int B, int T, int n_heads, int head_dim)
{
    rope_rotate(dx, dout, cos, sin, B, T, n_heads, head_dim, -1.0f, true, dx_mode == GRAD_ADD);
}
