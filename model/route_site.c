/* model/route_site.c — see route_site.h. */
#include "model/route_site.h"

#include <stdbool.h>
#include <stdio.h>

static float *resolve_optional(const ParamTable *table, float *flat, const char *prefix,
                               const char *suffix)
{
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    const ParamEntry *entry = param_table_find(table, name);
    return entry ? flat + entry->offset : NULL;
}

void site_weights_resolve(SiteWeights *weights, const ParamTable *table, float *flat,
                          const ResidualPlan *plan, int site)
{
    const char *prefix = plan->sites[site].name;
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, "%s.query", prefix);
    weights->query = flat + param_table_require(table, name)->offset;
    snprintf(name, sizeof name, "%s.key_norm", prefix);
    weights->key_norm = flat + param_table_require(table, name)->offset;
    weights->alpha = resolve_optional(table, flat, prefix, "alpha");
    weights->mix_bias = resolve_optional(table, flat, prefix, "mix_bias");
    weights->mix_proj = resolve_optional(table, flat, prefix, "mix_proj");
}

/* Where stream r's depth weights and key rstd start in a site's saved state. */
static size_t stream_weights_offset(const RouteContext *context, const SitePlan *site, int r)
{
    return (size_t)r * site->n_sources * context->max_rows * context->plan->heads;
}

static size_t stream_rstd_offset(const RouteContext *context, const SitePlan *site, int r)
{
    return (size_t)r * site->n_sources * context->max_rows;
}

/* Stream r's taps of slot `slot`: the first k_r rows of conv[slot][r] [k_max, d]. */
static size_t stream_taps_offset(const RouteContext *context, int r)
{
    return (size_t)r * context->plan->kernel_max * context->d;
}

/* E_r(s_k) for every source into scratch->sources (the null source passes through
 * unconvolved, DESIGN 2.2); returns the array the Route reads. */
static const float *const *expand_sources(const RouteContext *context, const SitePlan *site,
                                          const float *const *sources, int r)
{
    RouteScratch *scratch = context->scratch;
    const int kernel_size = context->plan->kernel_sizes[r];
    for (int k = 0; k < site->n_sources; k++) {
        const int slot = site->sources[k].slot;
        if (slot == RESIDUAL_NO_SLOT) {
            scratch->expanded[k] = sources[k];
            continue;
        }
        context->backend->stream_conv_forward(scratch->sources[k], sources[k],
                                              context->conv[slot] +
                                                  stream_taps_offset(context, r),
                                              kernel_size, context->B, context->T,
                                              context->d);
        scratch->expanded[k] = scratch->sources[k];
    }
    return scratch->expanded;
}

void route_site_forward(const RouteContext *context, const SitePlan *site,
                        const SiteWeights *weights, float alpha, SiteActivations *saved,
                        const float *const *sources, const float *base, float *out)
{
    const Backend *backend = context->backend;
    const ResidualPlan *plan = context->plan;
    const int rows = context->B * context->T, d = context->d, H = plan->heads;
    const int N = site->n_sources;

    if (plan->mode != RESIDUAL_MSAR) {
        backend->route_forward(out, saved->weights, saved->rstd, sources, N, weights->query,
                               weights->key_norm, base, alpha, rows, d, H, context->eps);
        return;
    }
    RouteScratch *scratch = context->scratch;
    const int m = plan->streams;
    float *mix = base ? scratch->mixed : out;
    for (int r = 0; r < m; r++) {
        const float *const *expanded = expand_sources(context, site, sources, r);
        float *stream = m == 1 ? mix : scratch->streams[r];
        backend->route_forward(stream, saved->weights + stream_weights_offset(context, site, r),
                               saved->rstd + stream_rstd_offset(context, site, r), expanded, N,
                               weights->query + (size_t)r * d,
                               weights->key_norm + (size_t)r * d, NULL, 0.0f, rows, d, H,
                               context->eps);
    }
    if (m > 1)
        backend->stream_mix_forward(mix, saved->mix_gates, saved->mix_rstd,
                                    (const float *const *)scratch->streams, m, weights->mix_bias,
                                    weights->mix_proj, rows, d, context->eps);
    if (base) {
        /* x = p + alpha * mix through a Route over the one source `mix` (see the header) */
        const float *one_source[1] = {mix};
        backend->route_forward(out, saved->gate_weights, saved->gate_rstd, one_source, 1,
                               scratch->gate_query, scratch->gate_query, base, alpha, rows, d,
                               H, context->eps);
    }
}

/* o_r for every stream into scratch->streams, as the forward made them (every op is
 * deterministic); the depth weights land in scratch, the saved ones stay untouched. */
static void recompute_streams(const RouteContext *context, const SitePlan *site,
                              const SiteWeights *weights, const float *const *sources)
{
    RouteScratch *scratch = context->scratch;
    const int rows = context->B * context->T, d = context->d;
    for (int r = 0; r < context->plan->streams; r++) {
        const float *const *expanded = expand_sources(context, site, sources, r);
        context->backend->route_forward(scratch->streams[r], scratch->weights, scratch->rstd,
                                        expanded, site->n_sources,
                                        weights->query + (size_t)r * d,
                                        weights->key_norm + (size_t)r * d, NULL, 0.0f, rows, d,
                                        context->plan->heads, context->eps);
    }
}

/* The delta gate: d mix = alpha * dout into scratch->grad_mixed, d alpha += sum <dout, mix>.
 * Needs scratch->streams recomputed; returns d mix. */
static const float *gate_backward(const RouteContext *context, const SiteWeights *weights,
                                  SiteWeights *grads, float alpha,
                                  const SiteActivations *saved, const float *dout)
{
    const Backend *backend = context->backend;
    RouteScratch *scratch = context->scratch;
    const int rows = context->B * context->T, d = context->d, m = context->plan->streams;
    const float *mix = scratch->streams[0];
    if (m > 1) {
        backend->stream_mix_forward(scratch->mixed, scratch->mix_gates, scratch->mix_rstd,
                                    (const float *const *)scratch->streams, m,
                                    weights->mix_bias, weights->mix_proj, rows, d,
                                    context->eps);
        mix = scratch->mixed;
    }
    backend->zero(scratch->grad_mixed, (size_t)rows * d * sizeof(float));
    const float *one_source[1] = {mix};
    float *one_grad[1] = {scratch->grad_mixed};
    backend->route_backward(one_grad, scratch->gate_grad_query, scratch->gate_grad_key_norm,
                            grads->alpha, dout, one_source, 1, saved->gate_weights,
                            saved->gate_rstd, scratch->gate_query, scratch->gate_query, true,
                            alpha, scratch->route_backward, rows, d, context->plan->heads);
    return scratch->grad_mixed;
}

/* Stream r: from d o_r through its Route and the slot convolutions into grad_sources,
 * the stream's query and key norm, and the conv taps. */
static void stream_backward(const RouteContext *context, const SitePlan *site,
                            const SiteWeights *weights, SiteWeights *grads,
                            const SiteActivations *saved, const float *const *sources,
                            float *const *grad_sources, const float *grad_stream, int r)
{
    const Backend *backend = context->backend;
    RouteScratch *scratch = context->scratch;
    const ResidualPlan *plan = context->plan;
    const int rows = context->B * context->T, d = context->d, N = site->n_sources;
    const size_t bytes = (size_t)rows * d * sizeof(float);

    const float *const *expanded = expand_sources(context, site, sources, r);
    for (int k = 0; k < N; k++) {
        if (site->sources[k].slot == RESIDUAL_NO_SLOT) {
            scratch->grad_expanded[k] = grad_sources[k]; /* the null source: straight through */
            continue;
        }
        backend->zero(scratch->grad_sources[k], bytes);
        scratch->grad_expanded[k] = scratch->grad_sources[k];
    }
    backend->route_backward(scratch->grad_expanded, grads->query + (size_t)r * d,
                            grads->key_norm + (size_t)r * d, NULL, grad_stream, expanded, N,
                            saved->weights + stream_weights_offset(context, site, r),
                            saved->rstd + stream_rstd_offset(context, site, r),
                            weights->query + (size_t)r * d, weights->key_norm + (size_t)r * d,
                            false, 0.0f, scratch->route_backward, rows, d, plan->heads);
    for (int k = 0; k < N; k++) {
        const int slot = site->sources[k].slot;
        if (slot == RESIDUAL_NO_SLOT)
            continue;
        const size_t taps = stream_taps_offset(context, r);
        backend->stream_conv_backward(grad_sources[k], context->grad_conv[slot] + taps,
                                      scratch->grad_sources[k], sources[k],
                                      context->conv[slot] + taps, plan->kernel_sizes[r],
                                      context->B, context->T, d);
    }
}

void route_site_backward(const RouteContext *context, const SitePlan *site,
                         const SiteWeights *weights, SiteWeights *grads, float alpha,
                         const SiteActivations *saved, const float *const *sources,
                         float *const *grad_sources, const float *dout)
{
    const Backend *backend = context->backend;
    const ResidualPlan *plan = context->plan;
    const int rows = context->B * context->T, d = context->d, H = plan->heads;
    const bool delta = plan->form == FORM_DELTA;

    if (plan->mode != RESIDUAL_MSAR) {
        backend->route_backward(grad_sources, grads->query, grads->key_norm,
                                delta ? grads->alpha : NULL, dout, sources, site->n_sources,
                                saved->weights, saved->rstd, weights->query, weights->key_norm,
                                delta, alpha, context->scratch->route_backward, rows, d, H);
        return;
    }
    RouteScratch *scratch = context->scratch;
    const int m = plan->streams;
    if (m > 1 || delta) /* the mix backward and the gate need the routed streams */
        recompute_streams(context, site, weights, sources);
    const float *grad_mix = delta ? gate_backward(context, weights, grads, alpha, saved, dout)
                                  : dout;
    if (m > 1) {
        for (int r = 0; r < m; r++)
            backend->zero(scratch->grad_streams[r], (size_t)rows * d * sizeof(float));
        backend->stream_mix_backward(scratch->grad_streams, grads->mix_bias, grads->mix_proj,
                                     grad_mix, (const float *const *)scratch->streams, m,
                                     saved->mix_gates, saved->mix_rstd, weights->mix_bias,
                                     weights->mix_proj, rows, d);
    }
    for (int r = 0; r < m; r++)
        stream_backward(context, site, weights, grads, saved, sources, grad_sources,
                        m > 1 ? scratch->grad_streams[r] : grad_mix, r);
}
