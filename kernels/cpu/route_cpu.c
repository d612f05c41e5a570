/* kernels/cpu/route_cpu.c — attention over depth: Route forward and backward (DESIGN 2.1).
 *
 * sources s_0..s_{N-1} [tokens, d]; query q and key_norm g [d]; H heads of hd = d / H
 * channels ([h] is channels h*hd .. h*hd + hd - 1, h(c) = c / hd); weights a [N, tokens, H];
 * rstd r [N, tokens]; scratch [N, tokens, H]. Per token (the token index is dropped):
 *   r_n      = rsqrt(mean_d(s_n^2) + eps)          sum of squares in double, rounded once
 *   xhat_n   = s_n * r_n,  khat_n = g * xhat_n     fp32, in this product order
 *   z_{n,h}  = < q[h], khat_n[h] >                 summed in double, rounded to fp32
 *   a_{.,h}  = softmax_n(z_{.,h})                  max-subtracted, exp and sum in double,
 *                                                  each weight rounded once
 *   mix[h]   = sum_n a_{n,h} s_n[h]                summed in double over n in order, rounded once
 *   out      = mix (replace) or base + alpha * mix (delta)
 * The double sums make two results exact that the model relies on: a zero query gives
 * weights that are all the same float (1/N rounded once), and a mix of equal sources with
 * power-of-two weights returns the source bit for bit.
 *
 * Backward, with dmix = dout (replace) or alpha * dout (delta):
 *   value path   mix[h] = sum_n a_n s_n[h]          ds_n[h] += a_{n,h} dmix[h]
 *   weights      da_{n,h} = < dmix[h], s_n[h] >
 *   softmax      dz_{n,h} = a_{n,h} (da_{n,h} - sum_m a_{m,h} da_{m,h})
 *   scores       z_{n,h} = sum_{c in h} q_c g_c xhat_{n,c}, so
 *                dq_c += sum_t sum_n dz_{n,h(c)} khat_{n,c} = g_c * sum_t sum_n dz xhat_{n,c}
 *                dg_c += sum_t sum_n dz_{n,h(c)} q_c xhat_{n,c} = q_c * (the same sum)
 *                dxhat_{n,c} = dz_{n,h(c)} q_c g_c
 *   key norm     ds_n += r_n (dxhat_n - xhat_n mean_d(dxhat_n xhat_n))
 *                (exact with eps: d xhat_i / d s_j = r delta_ij - r^3 s_i s_j / d, and
 *                r^3 s_i s_j = r xhat_i xhat_j)
 *   gate (delta) dalpha += sum_t < dout, mix > = sum_t sum_{n,h} a_{n,h} < dout[h], s_n[h] >
 * The normalised keys are recomputed from s and the saved r; the softmax uses the saved a.
 *
 * Work split, deterministic whatever the thread count (DESIGN 3):
 * - forward and the per-token part of the backward: one thread a token (the backward's
 *   tokens come in ROUTE_TOKEN_CHUNKS fixed chunks, so that the per-chunk dalpha partials
 *   are summed in chunk order: the chunk bounds depend on `tokens` only);
 * - dq and dg: one thread a block of channels, walking tokens and sources in order, summing
 *   in double and adding into the gradient once. dz goes through `scratch` between the two.
 */
#include "kernels/cpu/kernels_cpu.h"

#include <math.h>

enum {
    ROUTE_TOKEN_CHUNKS = 64,   /* fixed partition of tokens for the dalpha partial sums */
    ROUTE_CHANNEL_BLOCK = 64,  /* channels per thread task in the dq / dg pass */
};

/* index of (n, t, h) in weights and scratch [N, tokens, H] */
static inline size_t route_index(int n, int t, int h, int tokens, int heads)
{
    return ((size_t)n * tokens + t) * heads + h;
}

void cpu_route_forward(float *out, float *weights, float *rstd, const float *const *sources,
                       int n_sources, const float *query, const float *key_norm,
                       const float *base, float alpha, int tokens, int d, int heads, float eps)
{
    int head_dim = d / heads;
    size_t work = (size_t)n_sources * tokens * d;

#pragma omp parallel for schedule(static) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int t = 0; t < tokens; t++) {
        /* statistics and scores; the scores wait in `weights` until their softmax */
        for (int n = 0; n < n_sources; n++) {
            const float *s = sources[n] + (size_t)t * d;
            double sum_squares = 0;
            for (int c = 0; c < d; c++)
                sum_squares += (double)s[c] * s[c];
            float r = (float)(1.0 / sqrt(sum_squares / d + (double)eps));
            rstd[(size_t)n * tokens + t] = r;
            for (int h = 0; h < heads; h++) {
                double z = 0;
                for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                    z += (double)query[c] * (key_norm[c] * (s[c] * r));
                weights[route_index(n, t, h, tokens, heads)] = (float)z;
            }
        }
        /* one depth softmax per head */
        for (int h = 0; h < heads; h++) {
            double max_z = -INFINITY, sum = 0;
            for (int n = 0; n < n_sources; n++) {
                double z = weights[route_index(n, t, h, tokens, heads)];
                max_z = z > max_z ? z : max_z;
            }
            for (int n = 0; n < n_sources; n++)
                sum += exp((double)weights[route_index(n, t, h, tokens, heads)] - max_z);
            for (int n = 0; n < n_sources; n++) {
                float *a = &weights[route_index(n, t, h, tokens, heads)];
                *a = (float)(exp((double)*a - max_z) / sum);
            }
        }
        /* the mix of the raw sources; out may alias base, read before written per element */
        float *out_row = out + (size_t)t * d;
        const float *base_row = base ? base + (size_t)t * d : NULL;
        for (int h = 0; h < heads; h++)
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++) {
                double mix = 0;
                for (int n = 0; n < n_sources; n++)
                    mix += (double)weights[route_index(n, t, h, tokens, heads)] *
                           sources[n][(size_t)t * d + c];
                out_row[c] = base_row ? base_row[c] + alpha * (float)mix : (float)mix;
            }
    }
}

/* The per-token part of the backward for token t: dz into scratch, the value and key-norm
 * paths into dsources. Returns this token's contribution to dalpha (sum_{n,h} a <dout, s>). */
static double route_backward_token(float *const *dsources, const float *dout,
                                   const float *const *sources, int n_sources,
                                   const float *weights, const float *rstd, const float *query,
                                   const float *key_norm, float dmix_scale, const float *centre,
                                   float *scratch, int t, int tokens, int d, int heads)
{
    int head_dim = d / heads;
    const float *dout_row = dout + (size_t)t * d;
    double dalpha = 0;

    /* da = < dmix[h], s_n[h] >, kept in scratch until the softmax backward replaces it */
    for (int n = 0; n < n_sources; n++) {
        const float *s = sources[n] + (size_t)t * d;
        for (int h = 0; h < heads; h++) {
            double dot = 0;
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                dot += (double)dout_row[c] * s[c];
            size_t index = route_index(n, t, h, tokens, heads);
            dalpha += (double)weights[index] * dot;
            scratch[index] = (float)(dmix_scale * dot);
        }
    }
    /* dz = a (da - sum_m a_m da_m); the centre is given when the site read more sources
     * than these (a merge, route_block_cpu.c) */
    for (int h = 0; h < heads; h++) {
        double mean_da = 0;
        for (int n = 0; n < n_sources; n++) {
            size_t index = route_index(n, t, h, tokens, heads);
            mean_da += (double)weights[index] * scratch[index];
        }
        if (centre)
            mean_da = centre[(size_t)t * heads + h];
        for (int n = 0; n < n_sources; n++) {
            size_t index = route_index(n, t, h, tokens, heads);
            scratch[index] = (float)(weights[index] * (scratch[index] - mean_da));
        }
    }
    /* ds_n += a dmix + r (dxhat - xhat mean(dxhat xhat)),  dxhat = dz q g */
    for (int n = 0; n < n_sources; n++) {
        if (!dsources[n])
            continue;
        const float *s = sources[n] + (size_t)t * d;
        float *ds = dsources[n] + (size_t)t * d;
        float r = rstd[(size_t)n * tokens + t];
        const float *dz = scratch + route_index(n, t, 0, tokens, heads);
        const float *a = weights + route_index(n, t, 0, tokens, heads);
        double dot = 0;
        for (int h = 0; h < heads; h++)
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                dot += (double)(dz[h] * query[c] * key_norm[c]) * (double)(s[c] * r);
        float mean_dot = (float)(dot / d);
        for (int h = 0; h < heads; h++)
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++) {
                float xhat = s[c] * r;
                float dxhat = dz[h] * query[c] * key_norm[c];
                float dmix = dmix_scale * dout_row[c];
                ds[c] += a[h] * dmix + r * (dxhat - xhat * mean_dot);
            }
    }
    return dalpha;
}

void cpu_route_backward(float *const *dsources, float *dquery, float *dkey_norm, float *dalpha,
                        const float *dout, const float *const *sources, int n_sources,
                        const float *weights, const float *rstd, const float *query,
                        const float *key_norm, bool delta, float alpha, float *scratch,
                        int tokens, int d, int heads)
{
    cpu_route_backward_centred(dsources, dquery, dkey_norm, dalpha, dout, sources, n_sources,
                               weights, rstd, query, key_norm, delta, alpha, NULL, scratch,
                               tokens, d, heads);
}

void cpu_route_backward_centred(float *const *dsources, float *dquery, float *dkey_norm,
                                float *dalpha, const float *dout, const float *const *sources,
                                int n_sources, const float *weights, const float *rstd,
                                const float *query, const float *key_norm, bool delta,
                                float alpha, const float *centre, float *scratch, int tokens,
                                int d, int heads)
{
    int head_dim = d / heads;
    int parallel = (size_t)n_sources * tokens * d >= CPU_PARALLEL_MIN_WORK;
    float dmix_scale = delta ? alpha : 1.0f;
    double dalpha_chunks[ROUTE_TOKEN_CHUNKS];

#pragma omp parallel for schedule(static) if (parallel)
    for (int chunk = 0; chunk < ROUTE_TOKEN_CHUNKS; chunk++) {
        int first = (int)((long long)tokens * chunk / ROUTE_TOKEN_CHUNKS);
        int last = (int)((long long)tokens * (chunk + 1) / ROUTE_TOKEN_CHUNKS);
        double sum = 0;
        for (int t = first; t < last; t++)
            sum += route_backward_token(dsources, dout, sources, n_sources, weights, rstd, query,
                                        key_norm, dmix_scale, centre, scratch, t, tokens, d,
                                        heads);
        dalpha_chunks[chunk] = sum;
    }
    if (delta) {
        double sum = 0;
        for (int chunk = 0; chunk < ROUTE_TOKEN_CHUNKS; chunk++)
            sum += dalpha_chunks[chunk];
        *dalpha += (float)sum;
    }

    /* dq_c += g_c S_c and dg_c += q_c S_c with S_c = sum_t sum_n dz_{n,t,h(c)} xhat_{n,t,c} */
    int n_blocks = (d + ROUTE_CHANNEL_BLOCK - 1) / ROUTE_CHANNEL_BLOCK;
#pragma omp parallel for schedule(static) if (parallel)
    for (int block = 0; block < n_blocks; block++) {
        int first = block * ROUTE_CHANNEL_BLOCK;
        int last = first + ROUTE_CHANNEL_BLOCK < d ? first + ROUTE_CHANNEL_BLOCK : d;
        double sums[ROUTE_CHANNEL_BLOCK] = {0};
        for (int t = 0; t < tokens; t++)
            for (int n = 0; n < n_sources; n++) {
                const float *s = sources[n] + (size_t)t * d;
                const float *dz = scratch + route_index(n, t, 0, tokens, heads);
                float r = rstd[(size_t)n * tokens + t];
                for (int h = first / head_dim; h * head_dim < last; h++) {
                    int c_first = h * head_dim > first ? h * head_dim : first;
                    int c_last = (h + 1) * head_dim < last ? (h + 1) * head_dim : last;
                    for (int c = c_first; c < c_last; c++)
                        sums[c - first] += (double)dz[h] * (s[c] * r);
                }
            }
        for (int c = first; c < last; c++) {
            dquery[c] += (float)(key_norm[c] * sums[c - first]);
            dkey_norm[c] += (float)(query[c] * sums[c - first]);
        }
    }
}

void cpu_route_lse(float *lse, const float *const *sources, int n_sources, const float *query,
                   const float *key_norm, const float *rstd, int tokens, int d, int heads)
{
    int head_dim = d / heads;
    size_t work = (size_t)n_sources * tokens * d;

#pragma omp parallel for schedule(static) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int t = 0; t < tokens; t++)
        for (int h = 0; h < heads; h++) {
            /* the scores as cpu_route_forward makes them, then its max-subtracted sum */
            double max_z = -INFINITY, sum = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int n = 0; n < n_sources; n++) {
                    const float *s = sources[n] + (size_t)t * d;
                    float r = rstd[(size_t)n * tokens + t];
                    double z = 0;
                    for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                        z += (double)query[c] * (key_norm[c] * (s[c] * r));
                    float score = (float)z;
                    if (pass == 0)
                        max_z = score > max_z ? score : max_z;
                    else
                        sum += exp((double)score - max_z);
                }
            lse[(size_t)t * heads + h] = (float)(max_z + log(sum));
        }
}
