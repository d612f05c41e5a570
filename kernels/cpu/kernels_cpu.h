/* kernels/cpu/kernels_cpu.h — the cpu backend's kernels, one per op of runtime/backend.h.
 *
 * Each function here is the cpu implementation of the Backend entry of the same name; the
 * shapes, layouts and formulas are the ones written in runtime/backend.h and are not
 * repeated. backend_cpu() (backend_cpu.c) puts them in the op table; tests call them
 * directly as well.
 *
 * Every kernel is plain C11 fp32 on host memory. Work is split with OpenMP so that each
 * output element is computed by exactly one thread, always in the same order: results are
 * bitwise identical whatever the number of threads (DESIGN 3, "Determinism").
 * Row statistics (the RMSNorm mean and its backward's row dot, the cross-entropy
 * log-sum-exp) and sum_squares accumulate in double and round once; matmul, attention and
 * the gradient sums accumulate in fp32.
 * Every backward ADDS into its weight gradients; the input gradients of the ops that take a
 * GradMode are added (GRAD_ADD) or written (GRAD_WRITE: the old contents are not read, and
 * +0.0 takes their place in the same arithmetic, so the bits are those of an add into
 * zeros). Nothing allocates; the caller owns every buffer.
 */
#ifndef FATHOM_KERNELS_CPU_KERNELS_CPU_H
#define FATHOM_KERNELS_CPU_KERNELS_CPU_H

#include "runtime/backend.h" /* AdamwScalars, GradMode */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Below this many elements of work a kernel runs on the calling thread: starting a parallel
 * region costs microseconds, more than a small op itself. */
enum { CPU_PARALLEL_MIN_WORK = 1 << 14 };

/* elementwise_cpu.c */
void cpu_add_inplace(float *y, const float *x, size_t n);
void cpu_add(float *out, const float *a, const float *b, size_t n);
/* out = a + x and y += x (runtime/backend.h add_both) */
void cpu_add_both(float *out, const float *a, float *y, const float *x, size_t n);
/* y = (y - minus) + plus, plus NULL: y - minus (runtime/backend.h add_difference) */
void cpu_add_difference(float *y, const float *plus, const float *minus, size_t n);

/* embedding_cpu.c; tokens must be < V (the caller validates its data against V) */
void cpu_embedding_forward(float *out, const uint32_t *tokens, const float *table, int n,
                           int d);
void cpu_embedding_backward(float *dtable, const float *dout, const uint32_t *tokens, int n,
                            int d);
/* out[c] += x[t, c] for t = 0 .. rows-1 in that order, in fp32: the order, hence the bits, of
 * cpu_embedding_backward with every token on one row */
void cpu_sum_rows(float *out, const float *x, int rows, int d);

/* rmsnorm_cpu.c */
void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int rows,
                         int d, float eps);
void cpu_rmsnorm_backward(float *dx, GradMode dx_mode, float *dweight, const float *dout,
                          const float *x, const float *weight, const float *rstd, int rows,
                          int d);
/* dx = g (written) and branch += g:
 * runtime/backend.h rmsnorm_backward_branch */
void cpu_rmsnorm_backward_branch(float *dx, float *branch, float *dweight, const float *dout,
                                 const float *x, const float *weight, const float *rstd,
                                 int rows, int d);

/* matmul_cpu.c */
void cpu_matmul_forward(float *out, const float *in, const float *weight, int rows, int in_dim,
                        int out_dim);
void cpu_matmul_backward(float *din, GradMode din_mode, float *dweight, GradMode dweight_mode,
                         const float *dout, const float *in, const float *weight, int rows,
                         int in_dim, int out_dim);

/* rope_cpu.c; head_dim is even */
void cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin, int B,
                      int T, int n_heads, int head_dim);
void cpu_rope_backward(float *dx, GradMode dx_mode, const float *dout, const float *cos,
                       const float *sin, int B, int T, int n_heads, int head_dim);

/* attention_cpu.c; n_heads is a multiple of n_kv_heads */
void cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                           const float *v, int B, int T, int n_heads, int n_kv_heads,
                           int head_dim);
void cpu_attention_backward(float *dq, float *dk, float *dv, GradMode mode, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, int B, int T, int n_heads, int n_kv_heads,
                            int head_dim);

/* swiglu_cpu.c */
void cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void cpu_swiglu_backward(float *dgate, float *dup, GradMode mode, const float *dout,
                         const float *gate, const float *up, size_t n);

/* cross_entropy_cpu.c; a target >= V is a data error: fatal(EXIT_DATA, ...) */
void cpu_cross_entropy_forward(float *losses, float *lse, const float *logits,
                               const uint32_t *targets, int rows, int V, float z_loss);
void cpu_cross_entropy_backward(float *dlogits, GradMode mode, const float *dloss,
                                const float *logits, const float *lse, const uint32_t *targets,
                                int rows, int V, float z_loss);

/* route_cpu.c; d % heads == 0. Unlike the ops above, the routing and stream kernels sum
 * their parameter gradients over tokens in double and round once (see their files). */
void cpu_route_forward(float *out, float *weights, float *rstd, const float *const *sources,
                       int n_sources, const float *query, const float *key_norm,
                       const float *base, float alpha, int tokens, int d, int heads, float eps);
void cpu_route_backward(float *const *dsources, float *dquery, float *dkey_norm, float *dalpha,
                        const float *dout, const float *const *sources, int n_sources,
                        const float *weights, const float *rstd, const float *query,
                        const float *key_norm, bool delta, float alpha, float *scratch,
                        int tokens, int d, int heads);
/* cpu_route_backward with the softmax backward's centre given, centre[t, h] in place of
 * sum_n a[n,t,h] da[n,t,h] over these sources (NULL: that sum): the gradients through some of
 * the sources a site read (route_block_cpu.c) */
void cpu_route_backward_centred(float *const *dsources, float *dquery, float *dkey_norm,
                                float *dalpha, const float *dout, const float *const *sources,
                                int n_sources, const float *weights, const float *rstd,
                                const float *query, const float *key_norm, bool delta,
                                float alpha, const float *centre, float *scratch, int tokens,
                                int d, int heads);
/* lse[t, h] = log sum_n exp(z[n,t,h]) of cpu_route_forward's scores, from its saved rstd */
void cpu_route_lse(float *lse, const float *const *sources, int n_sources, const float *query,
                   const float *key_norm, const float *rstd, int tokens, int d, int heads);

/* route_block_cpu.c: the two-phase ops of runtime/backend.h as loops of the per-site math
 * above (cpu_route_forward, cpu_route_backward_centred); the merges from phase one's result
 * and lse, as backend.h states them */
void cpu_route_block_forward(float *const *results, float *const *weights, float *const *rstd,
                             float *const *lse, const float *const *sources, int n_sources,
                             const float *const *queries, const float *const *key_norms,
                             int n_sites, int tokens, int d, int heads, float eps);
void cpu_add_scaled(float *out, const float *base, const float *x, float alpha, size_t n);
void cpu_add_scaled_backward(float *dx, float *dalpha, const float *dout, const float *x,
                             float alpha, size_t n);
void cpu_route_merge_forward(float *out, float *weights, float *rstd, const float *result,
                             const float *lse, const float *partial, int n_sources,
                             const float *query, const float *key_norm, int tokens, int d,
                             int heads, float eps);
void cpu_route_merge_backward(float *dpartial, GradMode dpartial_mode, float *dquery,
                              float *dkey_norm, float *mean, const float *dout,
                              const float *out, const float *partial,
                              int n_sources, const float *weights, const float *rstd,
                              const float *query, const float *key_norm, float *scratch,
                              int tokens, int d, int heads);
void cpu_route_block_backward(float *const *dsources, float *const *dqueries,
                              float *const *dkey_norms, float *const *dalphas,
                              const float *const *douts, const float *const *sources,
                              int n_sources, const float *const *weights, const float *rstd,
                              const float *const *queries, const float *const *key_norms,
                              const float *const *alphas, const float *const *means, int n_sites,
                              float *scratch, int tokens, int d, int heads);

/* stream_cpu.c; the mix backward takes at most 4096 streams (more: fatal(EXIT_CONFIG, ...)) */
void cpu_stream_conv_forward(float *out, const float *x, const float *taps, int kernel_size,
                             int B, int T, int d);
void cpu_stream_conv_backward(float *dx, float *dtaps, const float *dout, const float *x,
                              const float *taps, int kernel_size, int B, int T, int d);
void cpu_stream_mix_forward(float *out, float *gates, float *rstd, const float *const *streams,
                            int m, const float *mix_bias, const float *mix_proj, int tokens,
                            int d, float eps);
/* alpha: NULL, or the gate's value (the table reads it from its [1]) */
void cpu_stream_mix_backward(float *const *dstreams, GradMode dstreams_mode, float *dmix_bias,
                             float *dmix_proj, float *dalpha, const float *dout,
                             const float *const *streams, int m, const float *gates,
                             const float *rstd, const float *mix_bias, const float *mix_proj,
                             const float *alpha, int tokens, int d);

/* route_conv_cpu.c: the stream route, convolution inside the read; kernel_size >= 1
 * (else fatal(EXIT_CONFIG, ...)). The results are stream_conv + route's bit for bit. */
void cpu_route_conv_forward(float *out, float *weights, float *rstd,
                            const float *const *sources, const float *const *taps,
                            int n_sources, int kernel_size, const float *query,
                            const float *key_norm, int B, int T, int d, int heads, float eps);
/* out = sum_k weights[k] E_k, weights as cpu_route_conv_forward saved them (its out, bit for
 * bit: the same sum in double, in source order, rounded once) */
void cpu_route_conv_mix(float *out, const float *weights, const float *const *sources,
                        const float *const *taps, int n_sources, int kernel_size, int B, int T,
                        int d, int heads);
void cpu_route_conv_backward(float *const *dsources, float *const *dtaps, float *dquery,
                             float *dkey_norm, const float *dout, const float *const *sources,
                             const float *const *taps, int n_sources, int kernel_size,
                             const float *weights, const float *rstd, const float *query,
                             const float *key_norm, float *scratch, int B, int T, int d,
                             int heads);

/* optimizer_cpu.c */
double cpu_sum_squares(const float *x, size_t n);
void cpu_adamw_update(float *params, const float *grads, float *exp_avg, float *exp_avg_sq,
                      float *ema, size_t n, const AdamwScalars *s);
void cpu_add_floats(float *y, const float *x, size_t n);

#endif
