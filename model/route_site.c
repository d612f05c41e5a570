/* model/route_site.c — see route_site.h. */
#include "model/route_site.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

void site_views_add(UnitViews *views, SiteWeights *weights, SiteGrads *grads,
                    const ParamTable *table, const ResidualPlan *plan, int site)
{
    const char *prefix = plan->sites[site].name;
    char name[PARAM_NAME_MAX];
    void *weight_fields[] = {&weights->query, &weights->key_norm, &weights->alpha,
                             &weights->mix_bias, &weights->mix_proj};
    float **grad_fields[] = {&grads->query, &grads->key_norm, &grads->alpha, &grads->mix_bias,
                             &grads->mix_proj};
    static const char *const suffixes[] = {"query", "key_norm", "alpha", "mix_bias",
                                           "mix_proj"};
    /* alpha and mix_bias are taken as fp32 (route_site.h); query and key_norm always exist */
    static const ViewKind kinds[] = {VIEW_COMPUTE, VIEW_COMPUTE, VIEW_FP32, VIEW_FP32,
                                     VIEW_COMPUTE};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        snprintf(name, sizeof name, "%s.%s", prefix, suffixes[i]);
        unit_views_add(views, table, weight_fields[i], name, kinds[i], i < 2);
        unit_views_add(views, table, grad_fields[i], name, VIEW_GRADS, i < 2);
    }
}

/* Stream r's taps for each source of the site (NULL for the null source, which is not
 * convolved, DESIGN 2.2), and where their gradients go; host arrays in the scratch. */
static const Activation *const *stream_taps(const RouteContext *context, const SitePlan *site,
                                            int r)
{
    RouteScratch *scratch = context->scratch;
    for (int k = 0; k < site->n_sources; k++) {
        const int slot = site->sources[k].slot;
        scratch->taps[k] = slot == RESIDUAL_NO_SLOT ? NULL
                                                    : route_stream_taps(context, slot, r);
    }
    return scratch->taps;
}

static float *const *stream_grad_taps(const RouteContext *context, const SitePlan *site, int r)
{
    RouteScratch *scratch = context->scratch;
    for (int k = 0; k < site->n_sources; k++) {
        const int slot = site->sources[k].slot;
        scratch->grad_taps[k] = slot == RESIDUAL_NO_SLOT
                                    ? NULL
                                    : context->grad_conv[slot] + route_stream_taps_at(context, r);
    }
    return scratch->grad_taps;
}

/* o_r = Route(E_r(s_0), .., E_r(s_{N-1})): the stream route of the op table convolves each
 * source inside its read, so E_r is never stored. */
static void stream_route_forward(const RouteContext *context, const SitePlan *site,
                                 const SiteWeights *weights, const Activation *const *sources,
                                 int r, Activation *stream, float *depth_weights, float *rstd)
{
    context->backend->route_conv_forward(stream, depth_weights, rstd, sources,
                                         stream_taps(context, site, r), site->n_sources,
                                         context->plan->kernel_sizes[r],
                                         route_stream_row(context, weights->query, r),
                                         route_stream_row(context, weights->key_norm, r),
                                         context->B, context->T, context->d,
                                         context->plan->heads, context->eps);
}

/* the mix of the streams into `mixed` (m > 1), saving its gates and rstd; o_0 where m = 1 */
static const Activation *site_mix_into(const RouteContext *context, const SiteWeights *weights,
                                       SiteActivations *saved, const Activation *const *streams,
                                       Activation *mixed)
{
    const int m = context->plan->streams;
    if (m == 1)
        return streams[0];
    context->backend->stream_mix_forward(mixed, saved->mix_gates, saved->mix_rstd, streams, m,
                                         weights->mix_bias, weights->mix_proj,
                                         context->B * context->T, context->d, context->eps);
    return mixed;
}

void route_site_mix_forward(const RouteContext *context, const SiteWeights *weights,
                            SiteActivations *saved, const Activation *const *streams,
                            const Activation *base, Activation *out)
{
    const Activation *mix =
        site_mix_into(context, weights, saved, streams, base ? context->scratch->mixed : out);
    if (base) /* x = p + alpha * mix */
        context->backend->add_scaled(out, base, mix, weights->alpha,
                                     (size_t)context->B * context->T * context->d);
}

void route_site_forward(const RouteContext *context, const SitePlan *site,
                        const SiteWeights *weights, SiteActivations *saved,
                        const Activation *const *sources, const Activation *base,
                        Activation *out)
{
    const Backend *backend = context->backend;
    const ResidualPlan *plan = context->plan;
    const int rows = context->B * context->T, d = context->d, H = plan->heads;
    const int N = site->n_sources;

    if (plan->mode != RESIDUAL_MSAR) {
        backend->route_forward(out, saved->weights, saved->rstd, sources, N, weights->query,
                               weights->key_norm, base, weights->alpha, rows, d, H,
                               context->eps);
        return;
    }
    RouteScratch *scratch = context->scratch;
    const int m = plan->streams;
    /* with one stream and no gate the stream route writes x itself */
    const bool direct = m == 1 && !base;
    for (int r = 0; r < m; r++)
        stream_route_forward(context, site, weights, sources, r,
                             direct ? out : scratch->streams[r],
                             saved->weights + route_stream_weights_at(context, site->n_sources, r),
                             saved->rstd + route_stream_rstd_at(context, site->n_sources, r));
    if (!direct)
        route_site_mix_forward(context, weights, saved,
                               (const Activation *const *)scratch->streams, base, out);
}

/* o_r for every stream into scratch->streams, bit for bit as the forward made them: the
 * mix of the convolved sources by the depth weights the forward saved (route_conv_mix; the
 * dots and softmax that made those weights are not formed again). */
static void recompute_streams(const RouteContext *context, const SitePlan *site,
                              const SiteActivations *saved, const Activation *const *sources)
{
    RouteScratch *scratch = context->scratch;
    for (int r = 0; r < context->plan->streams; r++)
        context->backend->route_conv_mix(
            scratch->streams[r],
            saved->weights + route_stream_weights_at(context, site->n_sources, r), sources,
            stream_taps(context, site, r), site->n_sources,
            context->plan->kernel_sizes[r], context->B, context->T, context->d,
            context->plan->heads);
}

void route_site_mix_backward(const RouteContext *context, const SiteWeights *weights,
                             SiteGrads *grads, const SiteActivations *saved,
                             const Activation *const *streams, const Activation *dout,
                             Activation *const *grad_streams)
{
    const Backend *backend = context->backend;
    const ResidualPlan *plan = context->plan;
    const int rows = context->B * context->T, d = context->d, m = plan->streams;
    const bool delta = plan->form == FORM_DELTA;
    if (m > 1) { /* the gate folded into the mix's backward (stream_mix_backward's alpha) */
        backend->stream_mix_backward(grad_streams, GRAD_WRITE, grads->mix_bias, grads->mix_proj,
                                     delta ? grads->alpha : NULL, dout, streams, m,
                                     saved->mix_gates, saved->mix_rstd, weights->mix_bias,
                                     weights->mix_proj, delta ? weights->alpha : NULL, rows, d);
        return;
    }
    /* m = 1 comes here in the delta form only: x = p + alpha * o_0 */
    backend->add_scaled_backward(grad_streams[0], grads->alpha, dout, streams[0],
                                 weights->alpha, (size_t)rows * d);
}

/* Stream r: from d o_r through its Route and the slot convolutions (one op) into
 * grad_sources, the stream's query and key norm, and the conv taps. */
static void stream_backward(const RouteContext *context, const SitePlan *site,
                            const SiteWeights *weights, SiteGrads *grads,
                            const SiteActivations *saved, const Activation *const *sources,
                            Activation *const *grad_sources, const Activation *grad_stream,
                            int r)
{
    const int d = context->d;
    context->backend->route_conv_backward(
        grad_sources, stream_grad_taps(context, site, r), grads->query + (size_t)r * d,
        grads->key_norm + (size_t)r * d, grad_stream, sources, stream_taps(context, site, r),
        site->n_sources, context->plan->kernel_sizes[r],
        saved->weights + route_stream_weights_at(context, site->n_sources, r),
        saved->rstd + route_stream_rstd_at(context, site->n_sources, r),
        route_stream_row(context, weights->query, r),
        route_stream_row(context, weights->key_norm, r), context->scratch->route_backward,
        context->B, context->T, d, context->plan->heads);
}

void route_site_backward(const RouteContext *context, const SitePlan *site,
                         const SiteWeights *weights, SiteGrads *grads,
                         const SiteActivations *saved, const Activation *const *sources,
                         Activation *const *grad_sources, const Activation *dout)
{
    const Backend *backend = context->backend;
    const ResidualPlan *plan = context->plan;
    const int rows = context->B * context->T, d = context->d, H = plan->heads;
    const bool delta = plan->form == FORM_DELTA;

    if (plan->mode != RESIDUAL_MSAR) {
        backend->route_backward(grad_sources, grads->query, grads->key_norm,
                                delta ? grads->alpha : NULL, dout, sources, site->n_sources,
                                saved->weights, saved->rstd, weights->query, weights->key_norm,
                                delta ? weights->alpha : NULL, context->scratch->route_backward,
                                rows, d, H);
        return;
    }
    RouteScratch *scratch = context->scratch;
    const int m = plan->streams;
    if (m == 1 && !delta) { /* x = o_0: d o_0 is dout itself */
        stream_backward(context, site, weights, grads, saved, sources, grad_sources, dout, 0);
        return;
    }
    recompute_streams(context, site, saved, sources);
    route_site_mix_backward(context, weights, grads, saved,
                            (const Activation *const *)scratch->streams, dout,
                            scratch->grad_streams);
    for (int r = 0; r < m; r++)
        stream_backward(context, site, weights, grads, saved, sources, grad_sources,
                        scratch->grad_streams[r], r);
}
