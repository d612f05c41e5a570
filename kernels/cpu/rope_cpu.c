/* kernels/cpu/rope_cpu.c — rotary position embedding, rotate-half convention (DESIGN 2).
 *
 * x, out, dx, dout [B, T, n_heads, head_dim]; cos, sin [T, head_dim / 2]. Channel i of the
 * first half and channel i + head_dim/2 form one rotated pair at angle theta(t, i):
 *   forward:  (a, b) -> (a cos - b sin, b cos + a sin)
 *   backward: the transpose (inverse) rotation, added into dx.
 * Both values of a pair are read before either is written, so out may alias x.
 */
#include "kernels/cpu/kernels_cpu.h"

void cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin, int B,
                      int T, int n_heads, int head_dim)
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
                float a = x[offset + i], b = x[offset + i + half];
                out[offset + i] = a * cos_row[i] - b * sin_row[i];
                out[offset + i + half] = b * cos_row[i] + a * sin_row[i];
            }
        }
    }
}

void cpu_rope_backward(float *dx, const float *dout, const float *cos, const float *sin, int B,
                       int T, int n_heads, int head_dim)
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
                float da = dout[offset + i], db = dout[offset + i + half];
                dx[offset + i] += da * cos_row[i] + db * sin_row[i];
                dx[offset + i + half] += db * cos_row[i] - da * sin_row[i];
            }
        }
    }
}
