/* kernels/cpu/backend_cpu_routing.c — the attention-over-depth and MSAR entries of the cpu op
 * table (route, two-phase route and merges, the delta form's gate, stream conv, stream mix,
 * stream route), split from backend_cpu.c as backend_cuda_routing.cu is from backend_cuda.cu.
 * Each wraps the fp32 kernels of kernels_cpu.h: the op table's Activation arrays are float
 * arrays here, so the wrappers only cast.
 */
#include "kernels/cpu/backend_cpu_routing.h"

#include "kernels/cpu/kernels_cpu.h"
#include "runtime/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define F(pointer) ((float *)(pointer))
#define CF(pointer) ((const float *)(pointer))

static void table_route_forward(Activation *out, float *weights, float *rstd,
                                const Activation *const *sources, int n_sources,
                                const Activation *query, const Activation *key_norm,
                                const Activation *base, const float *alpha, int tokens,
                                int d, int heads, float eps)
{
    cpu_route_forward(F(out), weights, rstd, (const float *const *)sources, n_sources,
                      CF(query), CF(key_norm), CF(base), base ? *alpha : 0.0f, tokens, d,
                      heads, eps);
}

static void table_route_backward(Activation *const *dsources, float *dquery, float *dkey_norm,
                                 float *dalpha, const Activation *dout,
                                 const Activation *const *sources, int n_sources,
                                 const float *weights, const float *rstd,
                                 const Activation *query, const Activation *key_norm,
                                 const float *alpha, float *scratch, int tokens, int d,
                                 int heads)
{
    cpu_route_backward((float *const *)dsources, dquery, dkey_norm, dalpha, CF(dout),
                       (const float *const *)sources, n_sources, weights, rstd, CF(query),
                       CF(key_norm), alpha != NULL, alpha ? *alpha : 0.0f, scratch, tokens, d,
                       heads);
}

static void table_stream_conv_forward(Activation *const *out, const Activation *const *x,
                                      const Activation *const *taps, int count, int streams,
                                      const int *kernel_sizes, int B, int T, int d)
{
    for (int r = 0; r < streams; r++)
        for (int n = 0; n < count; n++) {
            const size_t at = (size_t)r * count + n;
            cpu_stream_conv_forward(F(out[at]), CF(x[n]), CF(taps[at]), kernel_sizes[r], B, T,
                                    d);
        }
}

static void table_stream_conv_backward(Activation *const *dx, float *const *dtaps,
                                       const Activation *const *dout,
                                       const Activation *const *x,
                                       const Activation *const *taps, int count,
                                       int streams, const int *kernel_sizes, int B, int T,
                                       int d)
{
    for (int r = 0; r < streams; r++)
        for (int n = 0; n < count; n++) {
            const size_t at = (size_t)r * count + n;
            cpu_stream_conv_backward(dx ? F(dx[n]) : NULL, dtaps[at], CF(dout[at]), CF(x[n]),
                                     CF(taps[at]), kernel_sizes[r], B, T, d);
        }
}

static void table_route_conv_forward(Activation *out, float *weights, float *rstd,
                                     const Activation *const *sources,
                                     const Activation *const *taps, int n_sources,
                                     int kernel_size, const Activation *query,
                                     const Activation *key_norm, int B, int T, int d, int heads,
                                     float eps)
{
    cpu_route_conv_forward(F(out), weights, rstd, (const float *const *)sources,
                           (const float *const *)taps, n_sources, kernel_size, CF(query),
                           CF(key_norm), B, T, d, heads, eps);
}

static void table_route_conv_mix(Activation *out, const float *weights,
                                 const Activation *const *sources,
                                 const Activation *const *taps, int n_sources,
                                 int kernel_size, int B, int T, int d, int heads)
{
    cpu_route_conv_mix(F(out), weights, (const float *const *)sources,
                       (const float *const *)taps, n_sources, kernel_size, B, T, d, heads);
}

static void table_route_conv_backward(Activation *const *dsources, float *const *dtaps,
                                      float *dquery, float *dkey_norm, const Activation *dout,
                                      const Activation *const *sources,
                                      const Activation *const *taps, int n_sources,
                                      int kernel_size, const float *weights, const float *rstd,
                                      const Activation *query, const Activation *key_norm,
                                      float *scratch, int B, int T, int d, int heads)
{
    cpu_route_conv_backward((float *const *)dsources, dtaps, dquery, dkey_norm, CF(dout),
                            (const float *const *)sources, (const float *const *)taps,
                            n_sources, kernel_size, weights, rstd, CF(query), CF(key_norm),
                            scratch, B, T, d, heads);
}

static void table_stream_mix_forward(Activation *out, float *gates, float *rstd,
                                     const Activation *const *streams, int m,
                                     const float *mix_bias, const Activation *mix_proj,
                                     int tokens, int d, float eps)
{
    cpu_stream_mix_forward(F(out), gates, rstd, (const float *const *)streams, m, mix_bias,
                           CF(mix_proj), tokens, d, eps);
}

static void table_stream_mix_backward(Activation *const *dstreams, GradMode dstreams_mode,
                                      float *dmix_bias, float *dmix_proj, float *dalpha,
                                      const Activation *dout,
                                      const Activation *const *streams, int m,
                                      const float *gates, const float *rstd,
                                      const float *mix_bias, const Activation *mix_proj,
                                      const float *alpha, int tokens, int d)
{
    cpu_stream_mix_backward((float *const *)dstreams, dstreams_mode, dmix_bias, dmix_proj,
                            dalpha, CF(dout), (const float *const *)streams, m, gates, rstd,
                            mix_bias, CF(mix_proj), alpha, tokens, d);
}

/* the two-phase Route (route_block_cpu.c) */
static void table_route_block_forward(Activation *const *results, float *const *weights,
                                      float *const *rstd, float *const *lse,
                                      const Activation *const *sources, int n_sources,
                                      const Activation *const *queries,
                                      const Activation *const *key_norms, int n_sites,
                                      int tokens, int d, int heads, float eps)
{
    cpu_route_block_forward((float *const *)results, weights, rstd, lse,
                            (const float *const *)sources, n_sources,
                            (const float *const *)queries, (const float *const *)key_norms,
                            n_sites, tokens, d, heads, eps);
}

static void table_add_scaled(Activation *out, const Activation *base, const Activation *x,
                             const float *alpha, size_t n)
{
    cpu_add_scaled(F(out), CF(base), CF(x), *alpha, n);
}

static void table_add_scaled_rmsnorm_forward(Activation *x, Activation *out, float *rstd,
                                             const Activation *base, const Activation *route,
                                             const float *alpha, const Activation *weight,
                                             int rows, int d, float eps, const GateAdd *add)
{
    const size_t n = (size_t)rows * d;
    if (add && add->partial)
        cpu_add_both(F(add->partial), CF(add->partial_before), F(add->stream), CF(add->added),
                     n);
    else if (add)
        cpu_add_inplace(F(add->stream), CF(add->added), n);
    cpu_add_scaled(F(x), CF(base), CF(route), *alpha, n);
    cpu_rmsnorm_forward(F(out), rstd, CF(x), CF(weight), rows, d, eps);
}

/* The two ops in turn: the cpu is the reference the fused kernels are held to */
static void table_stream_mix_rmsnorm_forward(Activation *x, Activation *out, float *rstd,
                                             const StreamMix *mix, const Activation *base,
                                             const float *alpha, const Activation *weight,
                                             int rows, int d, float eps, const GateAdd *add)
{
    cpu_stream_mix_forward(F(mix->scratch), mix->gates, mix->rstd,
                           (const float *const *)mix->streams, mix->m, mix->mix_bias,
                           CF(mix->mix_proj), rows, d, mix->eps);
    table_add_scaled_rmsnorm_forward(x, out, rstd, base, mix->scratch, alpha, weight, rows, d,
                                     eps, add);
}

static void table_add_scaled_backward(Activation *dx, float *dalpha, const Activation *dout,
                                      const Activation *x, const float *alpha, size_t n)
{
    cpu_add_scaled_backward(F(dx), dalpha, CF(dout), CF(x), *alpha, n);
}

static void table_route_merge_forward(Activation *out, float *weights, float *rstd,
                                      const Activation *result, const float *lse,
                                      const Activation *partial, int n_sources,
                                      const Activation *query, const Activation *key_norm,
                                      int tokens, int d, int heads, float eps)
{
    cpu_route_merge_forward(F(out), weights, rstd, CF(result), lse, CF(partial), n_sources,
                            CF(query), CF(key_norm), tokens, d, heads, eps);
}

/* the add, the merge and the norm in turn */
static void table_route_merge_rmsnorm_forward(Activation *x, Activation *out, float *rstd,
                                              const RouteMerge *merge, const Activation *weight,
                                              int rows, int d, float eps, const GateAdd *add)
{
    if (add)
        cpu_add(F(add->partial), CF(add->partial_before), CF(add->added), (size_t)rows * d);
    cpu_route_merge_forward(F(x), merge->weights, merge->rstd, CF(merge->result), merge->lse,
                            CF(merge->partial), merge->n_sources, CF(merge->query),
                            CF(merge->key_norm), rows, d, merge->heads, merge->eps);
    cpu_rmsnorm_forward(F(out), rstd, CF(x), CF(weight), rows, d, eps);
}

/* the two ops in turn, E_r in rows[r] */
static void table_route_merge_conv_forward(Activation *const *out, float *const *weights,
                                           float *const *rstd, const Activation *const *result,
                                           const float *const *lse, const Activation *partial,
                                           const Activation *const *taps,
                                           const int *kernel_sizes, int streams, int n_sources,
                                           const Activation *const *query,
                                           const Activation *const *key_norm,
                                           Activation *const *rows, int B, int T, int d,
                                           int heads, float eps)
{
    for (int r = 0; r < streams; r++) {
        cpu_stream_conv_forward(F(rows[r]), CF(partial), CF(taps[r]), kernel_sizes[r], B, T, d);
        cpu_route_merge_forward(F(out[r]), weights[r], rstd[r], CF(result[r]), lse[r],
                                CF(rows[r]), n_sources, CF(query[r]), CF(key_norm[r]), B * T, d,
                                heads, eps);
    }
}

/* the merges, then the mix of out (the readable order; the cuda op mixes as it merges). out
 * not kept is scratch: filled with NaN after the mix, so that a caller who reads it anyway
 * (the walk's bug, which the cuda op would hide in half its cases) fails here loudly. */
static void table_route_merge_conv_mix_forward(
    Activation *x, float *gates, float *mix_rstd, const float *mix_bias,
    const Activation *mix_proj, Activation *const *out, bool keep_streams, float *const *weights,
    float *const *rstd, const Activation *const *result, const float *const *lse,
    const Activation *partial, const Activation *const *taps, const int *kernel_sizes,
    int streams, int n_sources, const Activation *const *query,
    const Activation *const *key_norm, Activation *const *rows, int B, int T, int d, int heads,
    float eps)
{
    table_route_merge_conv_forward(out, weights, rstd, result, lse, partial, taps, kernel_sizes,
                                   streams, n_sources, query, key_norm, rows, B, T, d, heads,
                                   eps);
    table_stream_mix_forward(x, gates, mix_rstd, (const Activation *const *)out, streams,
                             mix_bias, mix_proj, B * T, d, eps);
    for (int r = 0; r < streams && !keep_streams; r++)
        for (size_t i = 0; i < (size_t)B * T * d; i++)
            F(out[r])[i] = NAN;
}

static void table_route_merge_backward(Activation *dpartial, GradMode dpartial_mode,
                                       float *dquery, float *dkey_norm, float *mean,
                                       const Activation *dout, const Activation *out,
                                       const Activation *partial, int n_sources,
                                       const float *weights, const float *rstd,
                                       const Activation *query, const Activation *key_norm,
                                       float *scratch, int tokens, int d, int heads)
{
    cpu_route_merge_backward(F(dpartial), dpartial_mode, dquery, dkey_norm, mean, CF(dout),
                             CF(out), CF(partial), n_sources, weights, rstd, CF(query),
                             CF(key_norm), scratch, tokens, d, heads);
}

/* the norm's backward, then the merge's from the dx it wrote */
static void table_route_merge_rmsnorm_backward(Activation *dx, float *dweight,
                                               const Activation *dout, const Activation *x,
                                               const Activation *weight, const float *rstd,
                                               int rows, int d, const RouteMergeGrad *merge)
{
    cpu_rmsnorm_backward(F(dx), GRAD_WRITE, dweight, CF(dout), CF(x), CF(weight), rstd, rows,
                         d);
    cpu_route_merge_backward(F(merge->dpartial), merge->dpartial_mode, merge->dquery,
                             merge->dkey_norm, merge->mean, CF(dx), CF(x), CF(merge->partial),
                             merge->n_sources, merge->weights, merge->rstd, CF(merge->query),
                             CF(merge->key_norm), merge->scratch, rows, d, merge->heads);
}

/* the two ops in turn, E_r in rows[r] */
static void table_route_merge_conv_backward(
    Activation *const *dpartial, float *const *dquery, float *const *dkey_norm,
    float *const *mean, const Activation *const *dout, const Activation *const *out,
    const Activation *partial, const Activation *const *taps, const int *kernel_sizes,
    int streams, int n_sources, const float *const *weights, const float *const *rstd,
    const Activation *const *query, const Activation *const *key_norm, Activation *const *rows,
    float *scratch, int B, int T, int d, int heads)
{
    for (int r = 0; r < streams; r++) {
        cpu_stream_conv_forward(F(rows[r]), CF(partial), CF(taps[r]), kernel_sizes[r], B, T, d);
        table_route_merge_backward(dpartial[r], GRAD_WRITE, dquery[r], dkey_norm[r], mean[r],
                                   dout[r], out[r], rows[r], n_sources, weights[r], rstd[r],
                                   query[r], key_norm[r], scratch, B * T, d, heads);
    }
}

static void table_route_block_backward(Activation *const *dsources, unsigned dsources_written,
                                       float *const *dqueries,
                                       float *const *dkey_norms, float *const *dalphas,
                                       const Activation *const *douts,
                                       const Activation *const *sources, int n_sources,
                                       const float *const *weights, const float *rstd,
                                       const Activation *const *queries,
                                       const Activation *const *key_norms,
                                       const float *const *alphas, const float *const *means,
                                       int n_sites, float *scratch, int tokens, int d,
                                       int heads)
{
    for (int n = 0; n < n_sources; n++) /* written: the reference adds into zeros */
        if (dsources[n] && (dsources_written >> n & 1u))
            memset(dsources[n], 0, (size_t)tokens * d * sizeof(float));
    cpu_route_block_backward((float *const *)dsources, dqueries, dkey_norms, dalphas,
                             (const float *const *)douts, (const float *const *)sources,
                             n_sources, weights, rstd, (const float *const *)queries,
                             (const float *const *)key_norms, alphas, means, n_sites, scratch,
                             tokens, d, heads);
}

void backend_cpu_fill_routing(Backend *table)
{
    table->route_forward = table_route_forward;
    table->route_backward = table_route_backward;
    table->route_block_forward = table_route_block_forward;
    table->add_scaled = table_add_scaled;
    table->add_scaled_rmsnorm_forward = table_add_scaled_rmsnorm_forward;
    table->stream_mix_rmsnorm_forward = table_stream_mix_rmsnorm_forward;
    table->add_scaled_backward = table_add_scaled_backward;
    table->route_merge_forward = table_route_merge_forward;
    table->route_merge_rmsnorm_forward = table_route_merge_rmsnorm_forward;
    table->route_merge_conv_forward = table_route_merge_conv_forward;
    table->route_merge_conv_mix_forward = table_route_merge_conv_mix_forward;
    table->route_merge_conv_backward = table_route_merge_conv_backward;
    table->route_merge_backward = table_route_merge_backward;
    table->route_merge_rmsnorm_backward = table_route_merge_rmsnorm_backward;
    table->route_block_backward = table_route_block_backward;
    table->stream_conv_forward = table_stream_conv_forward;
    table->stream_conv_backward = table_stream_conv_backward;
    table->route_conv_forward = table_route_conv_forward;
    table->route_conv_mix = table_route_conv_mix;
    table->route_conv_backward = table_route_conv_backward;
    table->stream_mix_forward = table_stream_mix_forward;
    table->stream_mix_backward = table_stream_mix_backward;
}
