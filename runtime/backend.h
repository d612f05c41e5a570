/* runtime/backend.h — the op table every backend fills (DESIGN 1).
 *
 * The model is written once against this table; kernels/cpu fills it with plain fp32 C (the
 * readable reference) and kernels/cuda with the fast bf16 versions (DESIGN 3). Nothing here
 * knows what a transformer is: each op is a shape-annotated array function.
 *
 * Conventions, for every op:
 * - Pointers are backend memory (host memory for cpu). Tensors are dense and row-major; a
 *   shape written [B, T, H, hd] means the last index varies fastest.
 * - Dtypes (DESIGN 3). `Activation` arrays hold activations, their gradients and the
 *   compute copy of the weights in the backend's activation dtype: fp32 on cpu, bf16 on cuda
 *   (`activation_bytes` says which). `float` arrays are fp32 on every backend: master
 *   weights, weight gradients, optimizer state, and the statistics saved for a backward
 *   (rstd, lse, routing weights). Sums, norms, softmax and losses compute in fp32 or wider.
 *   Activation is an incomplete type on purpose: the compiler keeps the two kinds apart, and
 *   element offsets go through activation_at() below.
 * - Every backward ADDS into its weight gradients (dweight += ...): gradient accumulation
 *   over microbatches and over the two uses of a tied weight is free. The exception is
 *   matmul_backward, whose dweight takes a GradMode: the projections' gradients are most of
 *   the parameters, and writing a microbatch's first contribution spares zeroing them and
 *   reading the zeros back (runtime/fsdp.h, "written first"). Input gradients
 *   (dx, din, dq ...) are added too, except where an op takes a GradMode for them
 *   (matmul_backward's din; the rmsnorm, rope, attention, swiglu and cross-entropy
 *   backwards): GRAD_ADD
 *   adds (dx += g), GRAD_WRITE writes (dx = g) without reading the old contents, so the
 *   first contribution to a fresh gradient buffer needs no zeroed buffer to add into.
 *   GRAD_WRITE gives the bits GRAD_ADD gives on a zeroed buffer: the kernels add g to +0.0
 *   where they would have added it to the old value, so the two agree even on the sign of
 *   a zero (0.0f + -0.0f is +0.0f in both); the one exception is cuda's din
 *   (kernels/cuda/matmul_cuda.cu). Where an op adds without a mode, the caller zeroes a
 *   buffer before its first contribution.
 * - Results are deterministic: the same inputs give bitwise-identical outputs whatever the
 *   number of threads (no reduction whose order depends on scheduling).
 * - Ops are ordered on one compute stream (cuda) and may return before they finish; download,
 *   read_* and synchronize wait. Only alloc() allocates backend memory, and a backend's own
 *   workspaces (cuda) reach their size in the first step and then stay: nothing allocates
 *   inside a step loop after its first step.
 */
#ifndef FATHOM_RUNTIME_BACKEND_H
#define FATHOM_RUNTIME_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One element of an activation array; never dereferenced outside its backend. */
typedef struct Activation Activation;

/* What a backward does with an input-gradient output (conventions above). No value is 0:
 * a mode passed where a pointer belongs draws a warning instead of passing NULL. */
typedef enum GradMode {
    GRAD_ADD = 1,   /* dx += g: the buffer holds earlier contributions (or zeros) */
    GRAD_WRITE = 2, /* dx = g: the old contents are never read (they may be stale, or NaN) */
} GradMode;

/* A point on a backend's compute stream (a cudaEvent_t on cuda, a clock reading on cpu). */
typedef struct BackendEvent BackendEvent;

#include "runtime/backend_args.h" /* the structs some ops take: AdamwScalars, GateAdd, .. */

typedef struct Backend {
    const char *name; /* "cpu" or "cuda" */
    size_t activation_bytes; /* 4 (fp32, cpu) or 2 (bf16, cuda) */

    /* ---- memory ---- */
    void *(*alloc)(size_t bytes);                  /* zero-filled */
    void (*release)(void *pointer);
    void (*zero)(void *pointer, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);          /* backend -> backend */
    void (*upload)(void *dst, const void *host_src, size_t bytes);   /* host -> backend */
    void (*download)(void *host_dst, const void *src, size_t bytes); /* backend -> host */
    void (*synchronize)(void);
    /* bytes held through alloc() now, and the most held at once so far (including the
     * backend's own workspaces) */
    void (*memory_usage)(size_t *in_use, size_t *peak);
    void (*memory_peak_reset)(void); /* peak = in_use from now on */

    /* ---- events on the compute stream: timing now, ordering against communication later */
    BackendEvent *(*event_create)(void);
    void (*event_destroy)(BackendEvent *event);
    void (*event_record)(BackendEvent *event); /* marks the point the stream has reached */
    /* milliseconds between two recorded events; waits for `end` */
    float (*event_elapsed_ms)(const BackendEvent *start, const BackendEvent *end);
    /* Ops queued on the compute stream after this call start once `event` has passed. The
     * event may have been recorded on another stream of the backend's device (the end of an
     * NCCL work, runtime/nccl_table.h). Returns at once; the host does not wait. cpu: nothing
     * to do (every op has finished when it returns). */
    void (*event_wait)(const BackendEvent *event);

    /* ---- conversions between fp32 and the activation dtype (round to nearest even) ---- */
    /* dst[i] = src[i]: fp32 backend array -> activations (the compute copy of the weights) */
    void (*activations_from_floats)(Activation *dst, const float *src, size_t n);
    void (*activations_upload)(Activation *dst, const float *host_src, size_t n);
    void (*activations_download)(float *host_dst, const Activation *src, size_t n);

    /* ---- elementwise ---- */
    /* y[i] += x[i], i < n */
    void (*add_inplace)(Activation *y, const Activation *x, size_t n);
    /* out[i] = a[i] + b[i]; out may alias a or b */
    void (*add)(Activation *out, const Activation *a, const Activation *b, size_t n);
    /* out[i] = a[i] + x[i] and y[i] += x[i]: one x into two sums (the delta form's sublayer
     * output into its block's partial and the stream, DESIGN 2.1), x read once. out may
     * alias a; y must not alias out, a or x. */
    void (*add_both)(Activation *out, const Activation *a, Activation *y, const Activation *x,
                     size_t n);
    /* y[i] = (y[i] - minus[i]) + plus[i] (plus NULL: y[i] - minus[i]), one rounding of the
     * fp32 result on a bf16 backend: the delta form's stream gradient trading the block
     * gradient it carries for the next block's (model/chunk_backward.c). y must not alias
     * plus or minus. */
    void (*add_difference)(Activation *y, const Activation *plus, const Activation *minus,
                           size_t n);

    /* ---- embedding: out[t, :] = table[tokens[t], :]   table [V, d], out [n, d] ---- */
    void (*embedding_forward)(Activation *out, const uint32_t *tokens, const Activation *table,
                              int n, int d);
    /* dtable[tokens[t], :] += dout[t, :] (deterministic: fixed order over t per row) */
    void (*embedding_backward)(float *dtable, const Activation *dout, const uint32_t *tokens,
                               int n, int d);
    /* out[c] += sum over t of x[t, c]   x [rows, d], out [d] fp32: the gradient of one [d]
     * row read by every token (the delta form's null source, DESIGN 2.1), which
     * embedding_backward would sum on one row, serially. Deterministic: a fixed order over t
     * that depends on the shapes only. */
    void (*sum_rows)(float *out, const Activation *x, int rows, int d);

    /* ---- RMSNorm over rows (DESIGN 2): out = weight * (x * rstd), rstd = rsqrt(mean(x^2)+eps)
     * x, out [rows, d]; weight [d]; rstd [rows] saved for the backward ---- */
    void (*rmsnorm_forward)(Activation *out, float *rstd, const Activation *x,
                            const Activation *weight, int rows, int d, float eps);
    /* sum = a + b (add's bits), then rmsnorm_forward of that sum into out and rstd, in one
     * pass: the standard stream's residual add x_{j+1} = x_j + f_j formed by sublayer
     * j + 1's norm (model/layer.h InputGate, alpha NULL), one row read fewer than add
     * before the norm; the same bits as the two ops. sum aliases neither a nor b. */
    void (*add_rmsnorm_forward)(Activation *sum, Activation *out, float *rstd,
                                const Activation *a, const Activation *b,
                                const Activation *weight, int rows, int d, float eps);
    /* g, the gradient w.r.t. x: dx += g or dx = g (dx_mode); dweight += its gradient */
    void (*rmsnorm_backward)(Activation *dx, GradMode dx_mode, float *dweight,
                             const Activation *dout, const Activation *x,
                             const Activation *weight, const float *rstd, int rows, int d);
    /* The same gradient g (what rmsnorm_backward gives dx) for an input that branches, the
     * delta form's x_j = p_j + alpha_j * Route (DESIGN 2.1): dx = g, written, not added (the
     * site's d x_j), and branch += g (the stream's d p_j), both the rounded g of dx. One pass
     * instead of rmsnorm_backward and an add. No buffer aliases another. */
    void (*rmsnorm_backward_branch)(Activation *dx, Activation *branch, float *dweight,
                                    const Activation *dout, const Activation *x,
                                    const Activation *weight, const float *rstd, int rows,
                                    int d);

    /* ---- matmul: out[rows, out_dim] = in[rows, in_dim] @ weight[out_dim, in_dim]^T
     * (the [out, in] layout of Hugging Face Linear weights) ---- */
    void (*matmul_forward)(Activation *out, const Activation *in, const Activation *weight,
                           int rows, int in_dim, int out_dim);
    /* din += dout @ weight or din = dout @ weight (din_mode); dweight += dout^T @ in or
     * dweight = dout^T @ in (dweight_mode: added where microbatches accumulate, written by
     * the first). din may be NULL (no input gradient). */
    void (*matmul_backward)(Activation *din, GradMode din_mode, float *dweight,
                            GradMode dweight_mode, const Activation *dout,
                            const Activation *in, const Activation *weight, int rows,
                            int in_dim, int out_dim);

    /* ---- RoPE, rotate-half convention (DESIGN 2): for i < hd/2,
     *   out[i]      = x[i] * cos[t, i] - x[i + hd/2] * sin[t, i]
     *   out[i+hd/2] = x[i + hd/2] * cos[t, i] + x[i] * sin[t, i]
     * x, out [B, T, n_heads, head_dim]; cos, sin [T, head_dim/2] (position t of the window);
     * out may alias x ---- */
    void (*rope_forward)(Activation *out, const Activation *x, const float *cos,
                         const float *sin, int B, int T, int n_heads, int head_dim);
    /* dx += R^T dout or dx = R^T dout (dx_mode; R^T the inverse rotation) */
    void (*rope_backward)(Activation *dx, GradMode dx_mode, const Activation *dout,
                          const float *cos, const float *sin, int B, int T, int n_heads,
                          int head_dim);

    /* ---- causal attention with grouped KV heads (DESIGN 2):
     *   out[b,t,h] = sum_{s<=t} softmax_s(q[b,t,h] . k[b,s,h/g] / sqrt(hd)) v[b,s,h/g],
     *   g = n_heads / n_kv_heads
     * q, out [B, T, n_heads, hd]; k, v [B, T, n_kv_heads, hd];
     * lse [B, n_heads, T] = log-sum-exp of the scaled scores, saved for the backward
     * (no T x T matrix is kept; the backward recomputes the probabilities) ---- */
    void (*attention_forward)(Activation *out, float *lse, const Activation *q,
                              const Activation *k, const Activation *v, int B, int T,
                              int n_heads, int n_kv_heads, int head_dim);
    /* dq, dk, dv += or = (mode, one for all three) the gradients w.r.t. q, k, v */
    void (*attention_backward)(Activation *dq, Activation *dk, Activation *dv, GradMode mode,
                               const Activation *dout, const Activation *q,
                               const Activation *k, const Activation *v,
                               const Activation *out, const float *lse, int B, int T,
                               int n_heads, int n_kv_heads, int head_dim);

    /* ---- SwiGLU: out = silu(gate) * up, all [n] ---- */
    void (*swiglu_forward)(Activation *out, const Activation *gate, const Activation *up,
                           size_t n);
    /* dgate, dup += or = (mode, one for both) the gradients w.r.t. gate, up */
    void (*swiglu_backward)(Activation *dgate, Activation *dup, GradMode mode,
                            const Activation *dout, const Activation *gate,
                            const Activation *up, size_t n);

    /* ---- cross-entropy + z-loss, fused (DESIGN 2):
     *   loss[r] = lse_r - logits[r, target[r]] + z_loss * lse_r^2,  lse_r = logsumexp(logits[r,:])
     * logits [rows, V]; losses, lse [rows] ---- */
    void (*cross_entropy_forward)(float *losses, float *lse, const Activation *logits,
                                  const uint32_t *targets, int rows, int V, float z_loss);
    /* dlogits[r, :] += or = (mode) dloss[r] * (softmax(logits[r]) * (1 + 2 z_loss lse_r)
     *                                         - onehot(target))
     * dlogits may be logits itself (GRAD_WRITE): the gradient replaces the logits in place. */
    void (*cross_entropy_backward)(Activation *dlogits, GradMode mode, const float *dloss,
                                   const Activation *logits, const float *lse,
                                   const uint32_t *targets, int rows, int V, float z_loss);
    /* cross_entropy_forward, then the logits replaced in place by their gradient
     * (cross_entropy_backward, GRAD_WRITE, dlogits == logits): the bits of the two in turn,
     * with the logits read once where the two read them twice. For a forward whose backward
     * follows (model/loss.h). */
    void (*cross_entropy_forward_backward)(float *losses, float *lse, Activation *logits,
                                           const float *dloss, const uint32_t *targets,
                                           int rows, int V, float z_loss);

    /* ---- attention over depth: Route (DESIGN 2.1), per token t and head h over N sources
     *   r[n,t]     = rsqrt(mean_d(s_n[t]^2) + eps)
     *   z[n,t,h]   = < query[h], key_norm[h] * s_n[t][h] * r[n,t] >   ([h]: channels h*d/H ..)
     *   a[n,t,h]   = softmax over n of z[., t, h]
     *   mix[t][h]  = sum_n a[n,t,h] * s_n[t][h]
     *   out[t]     = mix[t]                      when base == NULL (replace form)
     *   out[t]     = base[t] + alpha * mix[t]    otherwise (delta form; out may alias base)
     * sources: N pointers to [tokens, d]; query, key_norm [d]; d % heads == 0. alpha is fp32
     * backend memory [1] (the master weight, read where the op runs: no host copy, no
     * synchronisation); NULL in the replace form.
     * Saved for the backward: weights [N, tokens, heads] (a) and rstd [N, tokens] (r); the
     * normalised keys are not kept. Statistics, softmax and sums in fp32 (or wider). ---- */
    void (*route_forward)(Activation *out, float *weights, float *rstd,
                          const Activation *const *sources, int n_sources,
                          const Activation *query, const Activation *key_norm,
                          const Activation *base, const float *alpha, int tokens, int d,
                          int heads, float eps);
    /* Gradients of out w.r.t. sources, query, key_norm and alpha, from dout [tokens, d]:
     * dsources[n] += ..., dquery += ..., dkey_norm += ..., *dalpha += ... (delta form only:
     * alpha != NULL marks it, fp32 backend memory [1] as in the forward, and dalpha is fp32
     * backend memory [1]; the gradient of base is dout and is the caller's to add).
     * dsources[n] may be NULL (no gradient wanted for that source). `scratch` holds
     * [N, tokens, heads] floats (a backend with its own workspace may ignore it).
     * Deterministic (fixed-order reductions, no atomics). */
    void (*route_backward)(Activation *const *dsources, float *dquery, float *dkey_norm,
                           float *dalpha, const Activation *dout,
                           const Activation *const *sources, int n_sources,
                           const float *weights, const float *rstd, const Activation *query,
                           const Activation *key_norm, const float *alpha, float *scratch,
                           int tokens, int d, int heads);

    /* ---- two-phase Route over a block (DESIGN 2.1; docs/design-notes.md, "Two-phase
     * routing"): the sites of one block read the same N completed sources, and these ops
     * read each source once for all of them instead of once a site. The sources are known
     * when the block starts, so phase one runs then, for every site of the block; each site
     * finishes its own Route when its turn comes (phase two: add_scaled in the delta form,
     * route_merge_forward with the open block's partial in the replace form). The backward
     * mirrors it: a merged site's share through its partial at once (route_merge_backward),
     * the rest of the block's sites together when the walk leaves the block
     * (route_block_backward). ----
     * route_block_forward, for each site i < G over s_0..s_{N-1}:
     *   results[i] [tokens, d] = Route(s; queries[i], key_norms[i], heads)  (no base)
     *   weights[i] [N, tokens, heads], rstd[i] [N, tokens]: as route_forward saves them
     *                            (every site gets the same rstd)
     *   lse[i] [tokens, heads] = log sum_n exp(z[n,t,h]), what a merge needs (lse NULL:
     *                            not written)
     * queries, key_norms: G pointers to [d]. */
    void (*route_block_forward)(Activation *const *results, float *const *weights,
                                float *const *rstd, float *const *lse,
                                const Activation *const *sources, int n_sources,
                                const Activation *const *queries,
                                const Activation *const *key_norms, int n_sites, int tokens,
                                int d, int heads, float eps);
    /* out[i] = base[i] + alpha * x[i], alpha fp32 backend memory [1]: the delta form's
     * x_j = p + alpha_j * (a phase-one result). out may alias base. */
    void (*add_scaled)(Activation *out, const Activation *base, const Activation *x,
                       const float *alpha, size_t n);
    /* add_scaled into x [rows, d] (n = rows * d; x may alias base), then rmsnorm_forward of
     * that x into out and rstd, in one pass: the delta form's x_j = p + alpha_j * Route
     * formed by the sublayer's norm (model/layer.h InputGate). The same bits as the two ops
     * one after the other; x is written, for the norm's backward. Where add is not NULL,
     * its adds (GateAdd, runtime/backend_args.h) come first, as add_both or add_inplace
     * before would: base is add->stream, the gate reads it as added to, and x does not
     * alias it. */
    void (*add_scaled_rmsnorm_forward)(Activation *x, Activation *out, float *rstd,
                                       const Activation *base, const Activation *route,
                                       const float *alpha, const Activation *weight, int rows,
                                       int d, float eps, const GateAdd *add);
    /* stream_mix_forward (mix's arguments) into mix->scratch, then add_scaled_rmsnorm_forward
     * with that mix as its route, in one pass: MSAR's delta-form x_j = p + alpha_j * mix(o_r)
     * formed by the sublayer's norm (model/layer.h InputGate). The same bits as the two ops
     * one after the other for x, out, rstd, the gates and the mix's rstd (and add's rows);
     * the mix itself need not be stored: mix->scratch is left undefined. Two rows moved
     * fewer than the two ops (the mix written and read back). */
    void (*stream_mix_rmsnorm_forward)(Activation *x, Activation *out, float *rstd,
                                       const StreamMix *mix, const Activation *base,
                                       const float *alpha, const Activation *weight, int rows,
                                       int d, float eps, const GateAdd *add);
    /* add_scaled's backward through its x term: dx = alpha * dout (WRITTEN; base's gradient
     * is dout itself, the caller's) and *dalpha += sum_i dout[i] x[i] (fp32 backend memory
     * [1], summed in a fixed order). dx must not alias dout or x. */
    void (*add_scaled_backward)(Activation *dx, float *dalpha, const Activation *dout,
                                const Activation *x, const float *alpha, size_t n);
    /* route_merge_forward: the Route of a replace-form site over N completed sources and
     * the open block's partial p (n_sources = N + 1 in all, p the last), from
     * route_block_forward's result and lse over the N completed ones, which are not read
     * again:
     *   r_p = rsqrt(mean_d(p^2) + eps),  z_p[h] = r_p < query[h] * key_norm[h], p[h] >
     *   l[h] = log(e^lse[h] + e^z_p[h]),  w_c = e^(lse - l),  w_p = e^(z_p - l)
     *   out[h] = w_c[h] * result[h] + w_p[h] * p[h]
     * weights [N + 1, tokens, heads]: rows 0..N-1 (route_block_forward's) *= w_c in place, row
     * N = w_p; rstd [N + 1, tokens]: row N = r_p. This is route_forward over the N + 1
     * sources up to rounding. out may alias result (read before written, element by
     * element). */
    void (*route_merge_forward)(Activation *out, float *weights, float *rstd,
                                const Activation *result, const float *lse,
                                const Activation *partial, int n_sources,
                                const Activation *query, const Activation *key_norm,
                                int tokens, int d, int heads, float eps);
    /* route_merge_forward (merge's arguments) into x [rows, d], then rmsnorm_forward of
     * that x into out and rstd (weight, eps), in one pass: a replace-form site's x_j formed
     * by its sublayer's norm (model/layer.h InputGate), one row read fewer than the two ops.
     * The same bits as the ops one after the other; x is written, for the norm's backward
     * and the merge's. Where add is not NULL, partial = partial_before + added comes first
     * (add's bits; add->partial is merge->partial, add->stream NULL): the output of the
     * sublayer before into the open block's partial, which the merge then reads, one row
     * read and a launch fewer than the add before. */
    void (*route_merge_rmsnorm_forward)(Activation *x, Activation *out, float *rstd,
                                        const RouteMerge *merge, const Activation *weight,
                                        int rows, int d, float eps, const GateAdd *add);
    /* route_merge_backward: what of a replace-form site's route_backward cannot wait for
     * its block, from dout [tokens, d] and the site's output `out`:
     *   mean[t,h] = < dout[t][h], out[t][h] >  (= sum_n a[n,t,h] < dout[t][h], s_n[t][h] >
     *               over all the site's sources: the softmax backward's centre, fp32
     *               [tokens, heads], for route_block_backward)
     * and, when `partial` is given (the site's last source, n_sources - 1, was the open
     * block's partial; NULL: the site read completed sources only), that source's share of
     * route_backward: dpartial += (GRAD_WRITE: =), dquery +=, dkey_norm +=. MSAR's walk
     * writes a convolved partial's fresh gradient row; AttnRes's adds into the block's
     * gradient, which later sites fed already. weights and rstd are the site's
     * [n_sources, tokens(, heads)]. `scratch` holds [tokens, heads] floats (a backend with
     * its own workspace may ignore it). */
    void (*route_merge_backward)(Activation *dpartial, GradMode dpartial_mode, float *dquery,
                                 float *dkey_norm, float *mean, const Activation *dout,
                                 const Activation *out, const Activation *partial, int n_sources,
                                 const float *weights, const float *rstd,
                                 const Activation *query, const Activation *key_norm,
                                 float *scratch, int tokens, int d, int heads);
    /* rmsnorm_backward(dx, GRAD_WRITE, dweight, dout, x, weight, rstd), then
     * route_merge_backward(merge's dpartial .. mean, dout = dx, out = x, merge's partial ..),
     * in one pass: a replace-form site's x_j, the merge's output and its sublayer's norm
     * input, takes the norm's gradient through the merge (model/layer.h GradBranch), two rows
     * of [rows, d] fewer than the ops apart. dx, mean and dpartial have the two ops' bits;
     * dweight, dquery and dkey_norm are the same sums, in a fixed order that may differ from
     * theirs. dx is written (the merge's dout, for the block's backward). */
    void (*route_merge_rmsnorm_backward)(Activation *dx, float *dweight,
                                         const Activation *dout, const Activation *x,
                                         const Activation *weight, const float *rstd, int rows,
                                         int d, const RouteMergeGrad *merge);
    /* route_merge_conv_forward: MSAR's replace form, a site's merge in every stream at once:
     * for r < streams, E_r = stream_conv_forward of `partial` [B T, d] with taps[r]
     * ([kernel_sizes[r], d]), then route_merge_forward(out[r], weights[r], rstd[r],
     * result[r], lse[r], E_r, n_sources, query[r], key_norm[r]). The results of those ops
     * in turn, bit for bit (E_r rounded to the activation dtype as stream_conv_forward
     * rounds it); a backend may convolve inside its read and never store E_r, or store it in
     * rows[r] ([B T, d] each: scratch, contents unspecified after the call). out[r] may alias
     * result[r]. */
    void (*route_merge_conv_forward)(Activation *const *out, float *const *weights,
                                     float *const *rstd, const Activation *const *result,
                                     const float *const *lse, const Activation *partial,
                                     const Activation *const *taps, const int *kernel_sizes,
                                     int streams, int n_sources, const Activation *const *query,
                                     const Activation *const *key_norm, Activation *const *rows,
                                     int B, int T, int d, int heads, float eps);
    /* route_merge_conv_mix_forward: route_merge_conv_forward, then stream_mix_forward(x,
     * gates, mix_rstd, out, streams, mix_bias, mix_proj) of the merged streams: the results
     * of the two in turn, bit for bit (out[r] may alias result[r]). A backend may mix the
     * streams as it merges them, without reading o_r back, and with keep_streams false need
     * not store them: out[r] is scratch then. A site i > 0 of MSAR's replace form, in the
     * forward's turn (o_r not kept) and in the backward's (kept for its backward). */
    void (*route_merge_conv_mix_forward)(
        Activation *x, float *gates, float *mix_rstd, const float *mix_bias,
        const Activation *mix_proj, Activation *const *out, bool keep_streams,
        float *const *weights, float *const *rstd, const Activation *const *result,
        const float *const *lse, const Activation *partial, const Activation *const *taps,
        const int *kernel_sizes, int streams, int n_sources, const Activation *const *query,
        const Activation *const *key_norm, Activation *const *rows, int B, int T, int d,
        int heads, float eps);
    /* route_merge_conv_backward: the backward of route_merge_conv_forward's merges, every
     * stream at once: for r < streams, E_r = stream_conv_forward of `partial` with taps[r]
     * (as the forward made it), then route_merge_backward(dpartial[r], GRAD_WRITE, dquery[r],
     * dkey_norm[r], mean[r], dout[r], out[r], E_r, n_sources, weights[r], rstd[r], query[r],
     * key_norm[r]). The results of those ops in turn, bit for bit: d E_r written into
     * dpartial[r] (the convolution's backward takes it from there), dquery[r] and
     * dkey_norm[r] added into. rows[r] ([B T, d]): scratch, as in the forward. `scratch`
     * holds route_merge_backward's [tokens, heads] floats. */
    void (*route_merge_conv_backward)(Activation *const *dpartial, float *const *dquery,
                                      float *const *dkey_norm, float *const *mean,
                                      const Activation *const *dout,
                                      const Activation *const *out, const Activation *partial,
                                      const Activation *const *taps, const int *kernel_sizes,
                                      int streams, int n_sources, const float *const *weights,
                                      const float *const *rstd, const Activation *const *query,
                                      const Activation *const *key_norm,
                                      Activation *const *rows, float *scratch, int B, int T,
                                      int d, int heads);
    /* route_block_backward: route_backward of the G sites of a block through their N common
     * sources, each source read once for all of them:
     *   dsources[n] += sum_i ..., dqueries[i] +=, dkey_norms[i] +=, *dalphas[i] +=
     * except the sources whose bit n is set in dsources_written: those are written (=), not
     * added into (the caller's scratch rows need no zeroing, and the GPU reads them not).
     * douts[i] [tokens, d]: d x of site i. alphas: NULL (replace form: the mix gradient is
     * d x, dalphas is not read) or G fp32 [1] backend pointers (delta: alpha_i d x).
     * means: NULL (each softmax's centre from these N sources, all the site read) or G
     * [tokens, heads] arrays from route_merge_backward (the site read a partial as well).
     * weights[i]: site i's [N_i >= N, tokens, heads] (its first N rows are these sources');
     * rstd: the sources' [N, tokens] (any site's: they are the same). dsources[n] may be
     * NULL (no gradient wanted) and must not alias one another. `scratch` holds
     * [N, tokens, heads] floats (a backend with its own workspace may ignore it).
     * Deterministic (fixed-order sums, no atomics). */
    void (*route_block_backward)(Activation *const *dsources, unsigned dsources_written,
                                 float *const *dqueries,
                                 float *const *dkey_norms, float *const *dalphas,
                                 const Activation *const *douts,
                                 const Activation *const *sources, int n_sources,
                                 const float *const *weights, const float *rstd,
                                 const Activation *const *queries,
                                 const Activation *const *key_norms,
                                 const float *const *alphas, const float *const *means,
                                 int n_sites, float *scratch, int tokens, int d, int heads);

    /* ---- MSAR stream convolution (DESIGN 2.2): causal depthwise over the sequence, for
     * each of `count` rows n (a block's sources, each with its own taps) and each of
     * `streams` streams r (kernel size kernel_sizes[r]; one launch on the GPU, x[n] read
     * once for every stream), at = r * count + n:
     *   out[at][b,t,c] = sum_{tau < k_r, tau <= t} taps[at][tau, c] * x[n][b, t - tau, c]
     * x[n], out[at] [B, T, d]; taps[at] [k_r, d] (the first k_r rows of a [k_max, d]
     * parameter). out and taps [streams * count]. No out aliases any x. ---- */
    void (*stream_conv_forward)(Activation *const *out, const Activation *const *x,
                                const Activation *const *taps, int count, int streams,
                                const int *kernel_sizes, int B, int T, int d);
    /* The backward of `streams` convolutions of the same rows x[n] (stream r with taps
     * taps[r * count + n] of kernel_sizes[r]; a block's sources in every stream at once, so
     * that x[n] is read once for all and dx[n] written once):
     *   dx[n] += sum_r conv_r^T dout[r * count + n]
     *   dtaps[r * count + n] += sum_{b, t >= tau} dout[r * count + n][b,t,c] x[n][b,t-tau,c]
     * dout, taps, dtaps [streams * count]; dx NULL skips every dx; no dx[n] aliases another's
     * or any dout. */
    void (*stream_conv_backward)(Activation *const *dx, float *const *dtaps,
                                 const Activation *const *dout, const Activation *const *x,
                                 const Activation *const *taps, int count, int streams,
                                 const int *kernel_sizes, int B, int T, int d);

    /* ---- MSAR stream route (DESIGN 2.2): the Route of one stream over convolved sources,
     * the convolution done inside the read (E_k is never stored):
     *   E_k[b,t,c] = sum_{tau < kernel_size, tau <= t} taps[k][tau, c] * s_k[b, t - tau, c]
     *                (taps[k] == NULL: E_k = s_k, the null source is not convolved)
     *   out = Route(E_0 .. E_{N-1}; query, key_norm, heads)       (replace form, no base)
     * sources: N pointers to [B, T, d]; taps: N pointers to [kernel_size, d] (or NULL).
     * Saved: weights [N, B*T, heads] and rstd [N, B*T], the statistics of E_k.
     * The same math as stream_conv_forward into a buffer and route_forward over the buffers,
     * except that E is not rounded to the activation dtype in between. ---- */
    void (*route_conv_forward)(Activation *out, float *weights, float *rstd,
                               const Activation *const *sources,
                               const Activation *const *taps, int n_sources, int kernel_size,
                               const Activation *query, const Activation *key_norm, int B,
                               int T, int d, int heads, float eps);
    /* out = sum_k weights[k] E_k from the weights route_conv_forward saved, without forming
     * its dots and softmax again: bit for bit route_conv_forward's out (the backward's
     * recompute of a stream). */
    void (*route_conv_mix)(Activation *out, const float *weights,
                           const Activation *const *sources, const Activation *const *taps,
                           int n_sources, int kernel_size, int B, int T, int d, int heads);
    /* dsources[k] += d s_k (the conv transposed of d E_k), dtaps[k] += d taps[k] (fp32
     * [kernel_size, d]; NULL where taps[k] is NULL), dquery += , dkey_norm += .
     * dsources[k] and dtaps[k] may be NULL (no gradient wanted); the dsources must not alias
     * one another. `scratch` holds [N, B*T, heads] floats (a backend with its own workspace
     * may ignore it). Deterministic. */
    void (*route_conv_backward)(Activation *const *dsources, float *const *dtaps,
                                float *dquery, float *dkey_norm, const Activation *dout,
                                const Activation *const *sources,
                                const Activation *const *taps, int n_sources,
                                int kernel_size, const float *weights, const float *rstd,
                                const Activation *query, const Activation *key_norm,
                                float *scratch, int B, int T, int d, int heads);

    /* ---- MSAR mix (DESIGN 2.2), per token over m streams o_r [tokens, d]:
     *   g[t,r]  = beta[r] + < theta[r], o_r[t] * rsqrt(mean(o_r[t]^2) + eps) >
     *   w[t,r]  = sigmoid(g[t,r])   (computed in double, rounded once)
     *   out[t]  = sum_r w[t,r] * o_r[t]
     * beta (mix_bias, the fp32 master: a bias is added, never multiplied into bf16) [m],
     * theta (mix_proj) [m, d]. Saved: gates w [tokens, m] and rstd [tokens, m]. ---- */
    void (*stream_mix_forward)(Activation *out, float *gates, float *rstd,
                               const Activation *const *streams, int m, const float *mix_bias,
                               const Activation *mix_proj, int tokens, int d, float eps);
    /* The backward, stream by stream: stream r's share depends on its own o_r only, so a
     * NULL streams[r] skips it (its dstreams[r], dmix_bias[r], dmix_proj[r] untouched) and a
     * caller may take the streams one at a time. For each stream given:
     *   dstreams[r] = or += (dstreams_mode) d o_r;  dmix_bias[r] +=;  dmix_proj[r] +=
     * alpha NULL: dout = d out. alpha (fp32 backend memory [1]; the delta form's gate
     * x = p + alpha * out): dout = d x, d out = alpha * dout, and
     *   *dalpha += sum over the given streams in order of sum_t w[t,r] < dout[t], o_r[t] >
     * (their share of sum_t < dout[t], out[t] >, in a fixed order). */
    void (*stream_mix_backward)(Activation *const *dstreams, GradMode dstreams_mode,
                                float *dmix_bias, float *dmix_proj, float *dalpha,
                                const Activation *dout, const Activation *const *streams, int m,
                                const float *gates, const float *rstd, const float *mix_bias,
                                const Activation *mix_proj, const float *alpha, int tokens,
                                int d);

    /* ---- optimizer, over flat fp32 ranges (DESIGN 3) ---- */
    /* sum of x[i]^2 in double, summed in a fixed order */
    double (*sum_squares)(const float *x, size_t n);
    /* y[i] += x[i], fp32 (FSDP adds a reduce-scattered gradient into its accumulator) */
    void (*add_floats)(float *y, const float *x, size_t n);
    /* AdamW (decoupled decay) with the scalars `s` (AdamwScalars, runtime/backend_args.h),
     * g = s.grad_scale * grads[i] (the clipping coefficient, applied as the gradient is read:
     * grads are left as they are):
     *   p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     *   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
     * then, when ema is not NULL, the weight EMA of the new p in the same pass:
     *   ema = s.ema_decay * ema + (1 - s.ema_decay) * p
     * and, when compute_copy is not NULL, compute_copy[i] = p[i] in the activation dtype
     * (the weights the next forward reads; cpu passes NULL, its compute copy IS params).
     * The six buffers do not overlap. */
    void (*adamw_update)(float *params, const float *grads, float *exp_avg, float *exp_avg_sq,
                         float *ema, size_t n, const AdamwScalars *s, Activation *compute_copy);
    /* adamw_update of each range of the six flat buffers (compute_copy indexed as they are),
     * with s's lr and weight_decay replaced by the range's: the same bits as one adamw_update
     * a range. Elements outside the ranges are not touched. The step's optimizer makes one
     * call; cuda updates the small ranges (a model's norms and routing weights, one range a
     * tensor) many to a launch. */
    void (*adamw_update_ranges)(float *params, const float *grads, float *exp_avg,
                                float *exp_avg_sq, float *ema, const AdamwRange *ranges,
                                int n_ranges, const AdamwScalars *s, Activation *compute_copy);
} Backend;

/* &array[elements] of an activation array (the element size is the backend's). */
static inline Activation *activation_at(const Backend *backend, Activation *array,
                                        size_t elements)
{
    return (Activation *)((char *)array + elements * backend->activation_bytes);
}

static inline const Activation *activation_at_const(const Backend *backend,
                                                    const Activation *array, size_t elements)
{
    return (const Activation *)((const char *)array + elements * backend->activation_bytes);
}

/* The cpu backend (kernels/cpu). Always available. */
const Backend *backend_cpu(void);

/* The cuda backend, exported by the CUDA module (kernels/cuda/backend_cuda.c) under the name
 * "backend_cuda"; runtime/cuda_module.h finds it. It runs on the device runtime/topo chose
 * for the rank (cuda_module_device_use; device 0 when nothing chose) with one compute stream
 * of its own. */
typedef const Backend *(*BackendGetter)(void);

#endif
