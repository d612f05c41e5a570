/* model/route_site.h — one routing site, forward and backward (DESIGN 2.1, 2.2).
 *
 * A site turns its sources s_0..s_{N-1} (each [rows, d], rows = B * T; model/residual.h says
 * which) into the input x of the sublayer it stands before, or of the final norm:
 *   attnres   x = Route(s; q, g, H)                        (replace form)
 *             x = p + alpha * Route(s; q, g, H)            (delta form; p = the stream)
 *   msar      o_r = Route(E_r(s); Q[r], G[r], H) for each stream r < m, where
 *             E_r(s_k) = the causal conv of s_k with model.route_streams.{slot_k}.conv[r]
 *             (k_r taps; the null source is not convolved), made inside the Route's read
 *             by the op table's route_conv ops and never stored;
 *             mix = sum_r w_r o_r through stream_mix (m > 1), mix = o_0 (m = 1);
 *             x = mix (replace) or x = p + alpha * mix (delta)
 * In the msar delta form the gate is add_scaled, x = p + alpha * mix (as the attnres delta
 * form's two-phase walk applies it). Its backward, d mix = alpha * dx and d alpha += sum
 * <dx, mix>, is folded into the mix's (stream_mix_backward's alpha: sum_r w_r <dx, o_r>
 * stream by stream), or add_scaled_backward when m = 1. MSAR at init is then Block AttnRes
 * bit for bit where both route a block in two phases.
 *
 * Saved (SiteActivations): the depth weights and key rstd of every stream, the mix gates
 * and rstd (m > 1). The routed streams o_r and the mix are not kept: the backward
 * recomputes them in the RouteScratch, from the saved depth weights (route_conv_mix).
 *
 * Backward, ADDS into: grad_sources[k] += d s_k (the caller zeroes them once per backward;
 * a source read by several sites accumulates), the site's weight gradients, the stream
 * convolution gradients. In the delta form d p = dout is the caller's to add. Sources and
 * saved state are read only, so a second backward of the same forward adds again.
 */
#ifndef FATHOM_MODEL_ROUTE_SITE_H
#define FATHOM_MODEL_ROUTE_SITE_H

#include "model/activations.h"
#include "model/params.h"
#include "model/residual.h"
#include "model/unit_views.h"
#include "runtime/backend.h"

/* Pointers to one site's tensors: what the ops read (the compute copy, except alpha and
 * mix_bias, which are added or read as scalars and stay the fp32 master), and where their
 * gradients go (fp32, same layout). NULL where the site has no such tensor. Every pointer
 * is backend memory: the ops read alpha where they run (no host copy). The walk reads a
 * site's alpha only through SiteWeights.alpha, so its fp32 value may come from another
 * buffer (a gathered one) by pointing it there. */
typedef struct {
    Activation *query;     /* [d]; msar [m, d] */
    Activation *key_norm;  /* [d]; msar [m, d] */
    const float *alpha;    /* [1], delta form only (fp32, backend memory) */
    const float *mix_bias; /* [m], msar with m > 1 only (fp32 master) */
    Activation *mix_proj;  /* [m, d], msar with m > 1 only */
} SiteWeights;

typedef struct {
    float *query, *key_norm, *alpha, *mix_bias, *mix_proj;
} SiteGrads;

/* What every site call needs besides its own weights and buffers. */
typedef struct {
    const Backend *backend;
    const ResidualPlan *plan;
    int B, T, d;
    int max_rows;             /* N = max_batch * T: the stride of per-stream saved regions */
    float eps;                /* model.norm_eps (docs/design-notes.md) */
    Activation *const *conv;  /* [n_slots] model.route_streams.{n}.conv [m, k_max, d] (msar) */
    float *const *grad_conv;  /* [n_slots] their gradients */
    RouteScratch *scratch;
} RouteContext;

/* ---- msar: where stream r's pieces live (route_site.c and the two-phase walk) ---- */

/* Stream r's depth weights [N_j, rows, H] and key rstd [N_j, rows] in a site's saved state
 * (SiteActivations, regions strided by max_rows), for a site of n_sources sources. */
static inline size_t route_stream_weights_at(const RouteContext *context, int n_sources, int r)
{
    return (size_t)r * n_sources * context->max_rows * context->plan->heads;
}

static inline size_t route_stream_rstd_at(const RouteContext *context, int n_sources, int r)
{
    return (size_t)r * n_sources * context->max_rows;
}

/* Stream r's taps in a slot's conv [m, k_max, d] (its first k_r rows), and the same offset
 * into the conv's fp32 gradient. */
static inline size_t route_stream_taps_at(const RouteContext *context, int r)
{
    return (size_t)r * context->plan->kernel_max * context->d;
}

static inline const Activation *route_stream_taps(const RouteContext *context, int slot, int r)
{
    return activation_at_const(context->backend, context->conv[slot],
                               route_stream_taps_at(context, r));
}

/* Row r of a site's [m, d] query or key norm (the compute copy). */
static inline const Activation *route_stream_row(const RouteContext *context,
                                                 const Activation *tensor, int r)
{
    return activation_at_const(context->backend, tensor, (size_t)r * context->d);
}

/* Registers site `site`'s weight and gradient views in its unit's views (unit_views.h). */
void site_views_add(UnitViews *views, SiteWeights *weights, SiteGrads *grads,
                    const ParamTable *table, const ResidualPlan *plan, int site);

/* out [rows, d] = x of the site; sources [N] as listed by `site`; base = the stream p in
 * the delta form, NULL in the replace form. out must not alias a source. */
void route_site_forward(const RouteContext *context, const SitePlan *site,
                        const SiteWeights *weights, SiteActivations *saved,
                        const Activation *const *sources, const Activation *base,
                        Activation *out);

/* msar: the rest of the site once its m routed streams o_r [rows, d] are made: the mix
 * (m > 1; saves its gates and rstd; into out without base) and, with base (delta), the gate,
 * x = p + alpha * mix. Not for m = 1 without base: there x is o_0 itself. */
void route_site_mix_forward(const RouteContext *context, const SiteWeights *weights,
                            SiteActivations *saved, const Activation *const *streams,
                            const Activation *base, Activation *out);

/* msar: from dout = d x back through the gate (delta: grads->alpha +=) and the mix (m > 1:
 * grads->mix_bias, mix_proj +=) to the routed streams given: WRITES grad_streams[r] = d o_r
 * for each r whose streams[r] is not NULL (with m > 1 a caller may give one stream at a
 * time: a stream's share depends on its own o_r only). With m = 1 only in the delta form
 * (streams[0] given); without a gate d o_0 is dout itself.
 * streams: the o_r the forward mixed, bit for bit; grad_streams must not alias them. */
void route_site_mix_backward(const RouteContext *context, const SiteWeights *weights,
                             SiteGrads *grads, const SiteActivations *saved,
                             const Activation *const *streams, const Activation *dout,
                             Activation *const *grad_streams);

/* From dout = d x [rows, d]: grad_sources[k] += d s_k, grads += the site's weight
 * gradients, context->grad_conv += the stream convolutions' (msar). */
void route_site_backward(const RouteContext *context, const SitePlan *site,
                         const SiteWeights *weights, SiteGrads *grads,
                         const SiteActivations *saved, const Activation *const *sources,
                         Activation *const *grad_sources, const Activation *dout);

#endif
