/* kernels/cpu/attention_cpu.c — causal attention with grouped KV heads (DESIGN 2).
 *
 * q, out, dq, dout [B, T, n_heads, head_dim]; k, v, dk, dv [B, T, n_kv_heads, head_dim];
 * lse [B, n_heads, T]. Query head h reads kv head h / g, g = n_heads / n_kv_heads; scores are
 * q . k / sqrt(head_dim); position t sees s <= t.
 *
 * No T x T matrix exists anywhere. The forward runs an online softmax along s (running max,
 * running sum, output rescaled when the max grows) and keeps only lse = max + log(sum) per
 * (b, h, t). The backward recomputes each probability as p = exp(score - lse) and, with
 * D_t = dout_t . out_t, dP = dout_t . v_s and dS = p * (dP - D_t):
 *   dq_t += dS * k_s / sqrt(hd),  dk_s += dS * q_t / sqrt(hd),  dv_s += p * dout_t.
 * Every query head of a group and every position t >= s add into the same dk_s and dv_s, so
 * the backward gives one thread a whole (b, kv head) and walks its query heads and positions
 * in a fixed order: deterministic whatever the thread count (dq_t belongs to one group too).
 * GRAD_WRITE: the thread zeroes its own rows of dq, dk, dv first and adds into them, instead
 * of adding onto the old contents (the bits of an add into zeros, kernels_cpu.h).
 */
#include "kernels/cpu/kernels_cpu.h"

#include <math.h>

static inline float dot(const float *a, const float *b, int n)
{
    float sum = 0;
    for (int i = 0; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

/* y += alpha * x */
static inline void axpy(float *y, float alpha, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

void cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                           const float *v, int B, int T, int n_heads, int n_kv_heads,
                           int head_dim)
{
    int group = n_heads / n_kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
    size_t q_row_stride = (size_t)n_heads * head_dim, kv_row_stride = (size_t)n_kv_heads * head_dim;
    size_t work = (size_t)B * n_heads * T * T * head_dim;
    /* rows near t = T-1 cost T times more than t = 0: hand them out dynamically (each row is
     * still computed by one thread, so the schedule cannot change a result) */
#pragma omp parallel for collapse(3) schedule(dynamic, 8) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < n_heads; h++)
            for (int t = 0; t < T; t++) {
                const float *q_row = q + ((size_t)b * T + t) * q_row_stride + (size_t)h * head_dim;
                size_t kv_offset = (size_t)b * T * kv_row_stride + (size_t)(h / group) * head_dim;
                const float *k_base = k + kv_offset, *v_base = v + kv_offset;
                float *out_row = out + ((size_t)b * T + t) * q_row_stride + (size_t)h * head_dim;
                for (int i = 0; i < head_dim; i++)
                    out_row[i] = 0;
                float running_max = -INFINITY, running_sum = 0;
                for (int s = 0; s <= t; s++) {
                    float score = dot(q_row, k_base + s * kv_row_stride, head_dim) * scale;
                    if (score > running_max) {
                        /* exp(-inf) = 0 on the first score: nothing to rescale yet */
                        float correction = expf(running_max - score);
                        running_sum *= correction;
                        for (int i = 0; i < head_dim; i++)
                            out_row[i] *= correction;
                        running_max = score;
                    }
                    float p = expf(score - running_max);
                    running_sum += p;
                    axpy(out_row, p, v_base + s * kv_row_stride, head_dim);
                }
                float inverse_sum = 1.0f / running_sum;
                for (int i = 0; i < head_dim; i++)
                    out_row[i] *= inverse_sum;
                lse[((size_t)b * n_heads + h) * T + t] = running_max + logf(running_sum);
            }
}

/* Zeroes `rows` rows of `count` floats, `stride` floats apart. */
static void zero_rows(float *first, size_t stride, int rows, int count)
{
    for (int row = 0; row < rows; row++)
        for (int i = 0; i < count; i++)
            first[(size_t)row * stride + i] = 0.0f;
}

void cpu_attention_backward(float *dq, float *dk, float *dv, GradMode mode, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, int B, int T, int n_heads, int n_kv_heads,
                            int head_dim)
{
    const bool accumulate = mode == GRAD_ADD;
    int group = n_heads / n_kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
    size_t q_row_stride = (size_t)n_heads * head_dim, kv_row_stride = (size_t)n_kv_heads * head_dim;
    size_t work = (size_t)B * n_heads * T * T * head_dim;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int kv_head = 0; kv_head < n_kv_heads; kv_head++) {
            size_t kv_offset = (size_t)b * T * kv_row_stride + (size_t)kv_head * head_dim;
            const float *k_base = k + kv_offset, *v_base = v + kv_offset;
            float *dk_base = dk + kv_offset, *dv_base = dv + kv_offset;
            if (!accumulate) { /* this thread's rows: dk, dv of the kv head, dq of its group */
                zero_rows(dk_base, kv_row_stride, T, head_dim);
                zero_rows(dv_base, kv_row_stride, T, head_dim);
                for (int h = kv_head * group; h < (kv_head + 1) * group; h++)
                    zero_rows(dq + (size_t)b * T * q_row_stride + (size_t)h * head_dim,
                              q_row_stride, T, head_dim);
            }
            for (int h = kv_head * group; h < (kv_head + 1) * group; h++)
                for (int t = 0; t < T; t++) {
                    size_t q_offset = ((size_t)b * T + t) * q_row_stride + (size_t)h * head_dim;
                    const float *q_row = q + q_offset, *dout_row = dout + q_offset;
                    float *dq_row = dq + q_offset;
                    float row_lse = lse[((size_t)b * n_heads + h) * T + t];
                    float d_row = dot(dout_row, out + q_offset, head_dim);
                    for (int s = 0; s <= t; s++) {
                        const float *k_row = k_base + s * kv_row_stride;
                        float score = dot(q_row, k_row, head_dim) * scale;
                        float p = expf(score - row_lse);
                        float dp = dot(dout_row, v_base + s * kv_row_stride, head_dim);
                        float dscore = p * (dp - d_row) * scale;
                        axpy(dq_row, dscore, k_row, head_dim);
                        axpy(dk_base + s * kv_row_stride, dscore, q_row, head_dim);
                        axpy(dv_base + s * kv_row_stride, p, dout_row, head_dim);
                    }
                }
        }
}
