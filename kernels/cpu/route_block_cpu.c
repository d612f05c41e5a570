/* kernels/cpu/route_block_cpu.c — the two-phase Route ops of runtime/backend.h
 * (route_block_forward / backward, route_merge_forward / backward, add_scaled; DESIGN 2.1;
 * docs/design-notes.md, "Two-phase routing") on the cpu, as loops of the per-site math of
 * route_cpu.c.
 *
 * The cpu keeps the readable per-site reference: a block's forward is cpu_route_forward once
 * per site, so the delta form's two-phase walk gives the per-site walk's forward bit for bit:
 * x = p + alpha * Route is base + alpha * (float)mix in both (cpu_add_scaled is route_cpu.c's
 * delta expression).
 *
 * A merge works the formula of backend.h in double from phase one's float result and lse and
 * the partial, as the cuda merge does: the completed sources are not read again (the MSAR
 * walk no longer holds them when a site merges). It is the Route over the N + 1 sources up to
 * the rounding of result and lse to float.
 *
 * The backward splits each site's route_backward where the walk splits it, and that split is
 * this file's math: a merge's backward takes the softmax centre as < dout, out > per head
 * (= sum_n a_n <dout, s_n>, since out = sum_n a_n s_n) and the partial's share of the
 * gradients with that centre; the block's backward adds the completed sources' share with the
 * same centre (cpu_route_backward_centred). The two shares add up to cpu_route_backward's
 * gradients up to rounding.
 */
#include "kernels/cpu/kernels_cpu.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

void cpu_route_block_forward(float *const *results, float *const *weights, float *const *rstd,
                             float *const *lse, const float *const *sources, int n_sources,
                             const float *const *queries, const float *const *key_norms,
                             int n_sites, int tokens, int d, int heads, float eps)
{
    for (int i = 0; i < n_sites; i++) {
        cpu_route_forward(results[i], weights[i], rstd[i], sources, n_sources, queries[i],
                          key_norms[i], NULL, 0.0f, tokens, d, heads, eps);
        if (lse)
            cpu_route_lse(lse[i], sources, n_sources, queries[i], key_norms[i], rstd[i], tokens,
                          d, heads);
    }
}

void cpu_add_scaled(float *out, const float *base, const float *x, float alpha, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= CPU_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        out[i] = base[i] + alpha * x[i]; /* cpu_route_forward's delta expression */
}

void cpu_add_scaled_backward(float *dx, float *dalpha, const float *dout, const float *x,
                             float alpha, size_t n)
{
    double sum = 0; /* in index order: the same bits at any thread count */
    for (size_t i = 0; i < n; i++) {
        dx[i] = alpha * dout[i];
        sum += (double)dout[i] * x[i];
    }
    *dalpha += (float)sum;
}

/* weights and rstd rows, as route_cpu.c lays them out: [n_sources, tokens(, heads)] */
static size_t merge_weight_index(int n, int t, int h, int tokens, int heads)
{
    return ((size_t)n * tokens + t) * heads + h;
}

void cpu_route_merge_forward(float *out, float *weights, float *rstd, const float *result,
                             const float *lse, const float *partial, int n_sources,
                             const float *query, const float *key_norm, int tokens, int d,
                             int heads, float eps)
{
    const int head_dim = d / heads, N = n_sources - 1;
    const size_t work = (size_t)n_sources * tokens * d;
#pragma omp parallel for schedule(static) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int t = 0; t < tokens; t++) {
        const float *p = partial + (size_t)t * d;
        double sum_squares = 0;
        for (int c = 0; c < d; c++)
            sum_squares += (double)p[c] * p[c];
        const float r = (float)(1.0 / sqrt(sum_squares / d + (double)eps)); /* route_cpu.c's */
        rstd[(size_t)N * tokens + t] = r;
        for (int h = 0; h < heads; h++) {
            double z = 0; /* the partial's score, as cpu_route_forward scores a source */
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                z += (double)query[c] * (key_norm[c] * (p[c] * r));
            const double completed = lse[(size_t)t * heads + h];
            const double top = completed > z ? completed : z;
            const double total = top + log(exp(completed - top) + exp(z - top));
            const double w_c = exp(completed - total), w_p = exp(z - total);
            for (int n = 0; n < N; n++) {
                float *a = &weights[merge_weight_index(n, t, h, tokens, heads)];
                *a = (float)(*a * w_c);
            }
            weights[merge_weight_index(N, t, h, tokens, heads)] = (float)w_p;
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++) {
                const size_t at = (size_t)t * d + c;
                out[at] = (float)(w_c * result[at] + w_p * p[c]); /* result read first */
            }
        }
    }
}

void cpu_route_merge_backward(float *dpartial, GradMode dpartial_mode, float *dquery,
                              float *dkey_norm, float *mean, const float *dout,
                              const float *out, const float *partial,
                              int n_sources, const float *weights, const float *rstd,
                              const float *query, const float *key_norm, float *scratch,
                              int tokens, int d, int heads)
{
    const int head_dim = d / heads;
    const size_t work = (size_t)tokens * d;

    /* the centre of every head's softmax backward: < dout, out > = sum_n a_n < dout, s_n > */
#pragma omp parallel for schedule(static) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int t = 0; t < tokens; t++)
        for (int h = 0; h < heads; h++) {
            double centre = 0;
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                centre += (double)dout[(size_t)t * d + c] * out[(size_t)t * d + c];
            mean[(size_t)t * heads + h] = (float)centre;
        }
    if (!partial)
        return;
    /* the partial's share: route_backward over that one source, about the whole centre,
     * which adds (GRAD_WRITE: into zeros, the bits it would add into them) */
    if (dpartial_mode == GRAD_WRITE)
        memset(dpartial, 0, work * sizeof *dpartial);
    const int last = n_sources - 1;
    const float *partial_row[1] = {partial};
    float *grad[1] = {dpartial};
    cpu_route_backward_centred(grad, dquery, dkey_norm, NULL, dout, partial_row, 1,
                               weights + (size_t)last * tokens * heads,
                               rstd + (size_t)last * tokens, query, key_norm, false, 0.0f, mean,
                               scratch, tokens, d, heads);
}

void cpu_route_block_backward(float *const *dsources, float *const *dqueries,
                              float *const *dkey_norms, float *const *dalphas,
                              const float *const *douts, const float *const *sources,
                              int n_sources, const float *const *weights, const float *rstd,
                              const float *const *queries, const float *const *key_norms,
                              const float *const *alphas, const float *const *means,
                              int n_sites, float *scratch, int tokens, int d, int heads)
{
    for (int i = 0; i < n_sites; i++)
        cpu_route_backward_centred(dsources, dqueries[i], dkey_norms[i],
                                   alphas ? dalphas[i] : NULL, douts[i], sources, n_sources,
                                   weights[i], rstd, queries[i], key_norms[i], alphas != NULL,
                                   alphas ? *alphas[i] : 0.0f, means ? means[i] : NULL, scratch,
                                   tokens, d, heads);
}
