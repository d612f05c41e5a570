/* runtime/backend.h — the op table every backend fills (DESIGN 1).
 *
 * The model is written once against this table; kernels/cpu fills it with plain fp32 C (the
 * readable reference) and kernels/cuda will fill it with the fast versions. Nothing here
 * knows what a transformer is: each op is a shape-annotated array function.
 *
 * Conventions, for every op:
 * - Pointers are backend memory (host memory for cpu). Tensors are dense and row-major; a
 *   shape written [B, T, H, hd] means the last index varies fastest.
 * - Activations and weights are fp32 on the cpu backend. Statistics saved for a backward
 *   (rstd, lse) are fp32 on every backend.
 * - Every backward ADDS into its gradient outputs (dx += ..., dweight += ...); the caller
 *   zeroes a gradient buffer before its first contribution. This makes gradient
 *   accumulation over microbatches and over the two uses of a tied weight free.
 * - Results are deterministic: the same inputs give bitwise-identical outputs whatever the
 *   number of threads (no reduction whose order depends on scheduling).
 * - Nothing allocates except alloc(); the caller owns every buffer.
 */
#ifndef FATHOM_RUNTIME_BACKEND_H
#define FATHOM_RUNTIME_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct Backend {
    const char *name; /* "cpu" or "cuda" */

    /* ---- memory ---- */
    void *(*alloc)(size_t bytes);                  /* zero-filled */
    void (*release)(void *pointer);
    void (*zero)(void *pointer, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);          /* backend -> backend */
    void (*upload)(void *dst, const void *host_src, size_t bytes);   /* host -> backend */
    void (*download)(void *host_dst, const void *src, size_t bytes); /* backend -> host */
    void (*synchronize)(void);

    /* ---- elementwise ---- */
    /* y[i] += x[i], i < n */
    void (*add_inplace)(float *y, const float *x, size_t n);
    /* out[i] = a[i] + b[i]; out may alias a or b */
    void (*add)(float *out, const float *a, const float *b, size_t n);

    /* ---- embedding: out[t, :] = table[tokens[t], :]   table [V, d], out [n, d] ---- */
    void (*embedding_forward)(float *out, const uint32_t *tokens, const float *table,
                              int n, int d);
    /* dtable[tokens[t], :] += dout[t, :] (deterministic: fixed order over t per row) */
    void (*embedding_backward)(float *dtable, const float *dout, const uint32_t *tokens,
                               int n, int d);

    /* ---- RMSNorm over rows (DESIGN 2): out = weight * (x * rstd), rstd = rsqrt(mean(x^2)+eps)
     * x, out [rows, d]; weight [d]; rstd [rows] saved for the backward ---- */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *weight,
                            int rows, int d, float eps);
    void (*rmsnorm_backward)(float *dx, float *dweight, const float *dout, const float *x,
                             const float *weight, const float *rstd, int rows, int d);

    /* ---- matmul: out[rows, out_dim] = in[rows, in_dim] @ weight[out_dim, in_dim]^T
     * (the [out, in] layout of Hugging Face Linear weights) ---- */
    void (*matmul_forward)(float *out, const float *in, const float *weight,
                           int rows, int in_dim, int out_dim);
    /* din += dout @ weight; dweight += dout^T @ in. din may be NULL (no input gradient). */
    void (*matmul_backward)(float *din, float *dweight, const float *dout, const float *in,
                            const float *weight, int rows, int in_dim, int out_dim);

    /* ---- RoPE, rotate-half convention (DESIGN 2): for i < hd/2,
     *   out[i]      = x[i] * cos[t, i] - x[i + hd/2] * sin[t, i]
     *   out[i+hd/2] = x[i + hd/2] * cos[t, i] + x[i] * sin[t, i]
     * x, out [B, T, n_heads, head_dim]; cos, sin [T, head_dim/2] (position t of the window);
     * out may alias x ---- */
    void (*rope_forward)(float *out, const float *x, const float *cos, const float *sin,
                         int B, int T, int n_heads, int head_dim);
    /* dx += R^T dout (the inverse rotation) */
    void (*rope_backward)(float *dx, const float *dout, const float *cos, const float *sin,
                          int B, int T, int n_heads, int head_dim);

    /* ---- causal attention with grouped KV heads (DESIGN 2):
     *   out[b,t,h] = sum_{s<=t} softmax_s(q[b,t,h] . k[b,s,h/g] / sqrt(hd)) v[b,s,h/g],
     *   g = n_heads / n_kv_heads
     * q, out [B, T, n_heads, hd]; k, v [B, T, n_kv_heads, hd];
     * lse [B, n_heads, T] = log-sum-exp of the scaled scores, saved for the backward
     * (no T x T matrix is kept; the backward recomputes the probabilities) ---- */
    void (*attention_forward)(float *out, float *lse, const float *q, const float *k,
                              const float *v, int B, int T, int n_heads, int n_kv_heads,
                              int head_dim);
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse, int B, int T,
                               int n_heads, int n_kv_heads, int head_dim);

    /* ---- SwiGLU: out = silu(gate) * up, all [n] ---- */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);

    /* ---- cross-entropy + z-loss, fused (DESIGN 2):
     *   loss[r] = lse_r - logits[r, target[r]] + z_loss * lse_r^2,  lse_r = logsumexp(logits[r,:])
     * logits [rows, V]; losses, lse [rows] ---- */
    void (*cross_entropy_forward)(float *losses, float *lse, const float *logits,
                                  const uint32_t *targets, int rows, int V, float z_loss);
    /* dlogits[r, :] += dloss[r] * (softmax(logits[r]) * (1 + 2 z_loss lse_r) - onehot(target)) */
    void (*cross_entropy_backward)(float *dlogits, const float *dloss, const float *logits,
                                   const float *lse, const uint32_t *targets, int rows, int V,
                                   float z_loss);

    /* ---- optimizer, over flat fp32 ranges (DESIGN 3) ---- */
    /* sum of x[i]^2 in double, summed in a fixed order */
    double (*sum_squares)(const float *x, size_t n);
    /* x[i] *= factor */
    void (*scale)(float *x, float factor, size_t n);
    /* AdamW (decoupled decay), `step` counts from 1:
     *   p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     *   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps) */
    void (*adamw_update)(float *params, const float *grads, float *exp_avg, float *exp_avg_sq,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int step);
    /* ema = decay * ema + (1 - decay) * params */
    void (*ema_update)(float *ema, const float *params, size_t n, float decay);
} Backend;

/* The cpu backend (kernels/cpu). Always available. */
const Backend *backend_cpu(void);

#endif
