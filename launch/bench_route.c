/* launch/bench_route.c — the routing cases of `fathom bench` that route a site at a time
 * (launch/bench.h): MSAR at the sites of the 8B graft, as the model runs it, and for
 * comparison with the two-phase cases (bench_route_block.c) Block MHAR delta at the 8B graft
 * (route-sites) and the routing of the 1B step (route-1b-sites), each site's forward and
 * backward through the per-site Route ops. */
#include "launch/bench_internal.h"

#include "runtime/error.h"

#include <math.h>

/* ---- routing at the 8B graft: Block MHAR delta, and MSAR ---- */

/* Everything the 64 sites read and write; the sites share buffers (each site's backward
 * follows its forward, so nothing of one site must outlive it). */
typedef struct {
    const Backend *backend;
    int d, heads, tokens, sites, sublayers_per_block, max_sources;
    bool msar, replace; /* replace: the Block AttnRes replace form, no base, partials read */
    bool forward_only;
    Activation *sources[16], *grad_sources[16];
    const Activation *taps_of_source[16]; /* msar: stream r's taps per source, NULL: null */
    float *grad_taps_of_source[16];
    Activation *streams[BENCH_STREAMS], *grad_streams[BENCH_STREAMS];
    Activation *mixed, *base, *out, *dout;
    Activation *query, *key_norm, *taps, *mix_proj;
    float *weights, *rstd, *mix_gates, *mix_rstd, *scratch;
    float *alpha; /* [1] 0.1, backend memory (the gate's master weight) */
    float *grad_query, *grad_key_norm, *grad_alpha, *grad_taps, *mix_bias, *grad_mix_bias;
    float *grad_mix_proj;
} RoutePass;


/* Delta: site j reads the null source and blocks b_0..b_n, N = j / S + 2 (as peer.py).
 * Replace: b_0..b_n and, inside a block, its partial: N = j / S + 1 + (j % S > 0). */
static int site_sources(const RoutePass *r, int site)
{
    if (r->replace)
        return site / r->sublayers_per_block + 1 + (site % r->sublayers_per_block > 0);
    return site / r->sublayers_per_block + 2;
}

static const Activation *row_of(const RoutePass *r, const Activation *tensor, int row)
{
    return activation_at_const(r->backend, tensor, (size_t)row * r->d);
}

static const Activation *taps_of(const RoutePass *r, int stream)
{
    return activation_at_const(r->backend, r->taps, (size_t)stream * BENCH_KERNEL_MAX * r->d);
}

/* Stream s's taps for sources 1..n-1; the null source (0) is not convolved (DESIGN 2.2). */
static void msar_taps(RoutePass *r, int n, int stream)
{
    r->taps_of_source[0] = NULL;
    r->grad_taps_of_source[0] = NULL;
    for (int k = 1; k < n; k++) {
        r->taps_of_source[k] = taps_of(r, stream);
        r->grad_taps_of_source[k] = r->grad_taps + (size_t)k * BENCH_KERNEL_MAX * r->d;
    }
}

/* The streams, and in the forward their mix; `recompute`: as the backward remakes them,
 * from the saved depth weights (route_conv_mix), without the mix. */
static void msar_streams_forward(RoutePass *r, int n, bool recompute)
{
    for (int s = 0; s < BENCH_STREAMS; s++) {
        msar_taps(r, n, s);
        float *weights = r->weights + (size_t)s * n * r->tokens * r->heads;
        if (recompute)
            r->backend->route_conv_mix(r->streams[s], weights,
                                       (const Activation *const *)r->sources, r->taps_of_source,
                                       n, bench_kernels[s], 1, r->tokens, r->d, r->heads);
        else
            r->backend->route_conv_forward(r->streams[s], weights,
                                           r->rstd + (size_t)s * n * r->tokens,
                                           (const Activation *const *)r->sources,
                                           r->taps_of_source, n, bench_kernels[s],
                                           row_of(r, r->query, s), row_of(r, r->key_norm, s),
                                           1, r->tokens, r->d, r->heads, 1e-5f);
    }
    if (!recompute)
        r->backend->stream_mix_forward(r->mixed, r->mix_gates, r->mix_rstd,
                                       (const Activation *const *)r->streams, BENCH_STREAMS,
                                       r->mix_bias, r->mix_proj, r->tokens, r->d, 1e-5f);
}

/* One MSAR delta site, forward then backward, as model/route_site.c runs it: the stream
 * convolutions happen inside the routing reads (route_conv ops), never stored. */
static void msar_site(RoutePass *r, int n)
{
    const Backend *backend = r->backend;

    msar_streams_forward(r, n, false);
    backend->add_scaled(r->out, r->base, r->mixed, r->alpha, (size_t)r->tokens * r->d);
    /* backward: the streams again, then the gate and the mix in one op, then each stream */
    msar_streams_forward(r, n, true);
    backend->stream_mix_backward(r->grad_streams, GRAD_WRITE, r->grad_mix_bias,
                                 r->grad_mix_proj, r->grad_alpha, r->dout,
                                 (const Activation *const *)r->streams, BENCH_STREAMS,
                                 r->mix_gates, r->mix_rstd, r->mix_bias, r->mix_proj, r->alpha,
                                 r->tokens, r->d);
    for (int s = 0; s < BENCH_STREAMS; s++) {
        msar_taps(r, n, s);
        backend->route_conv_backward(r->grad_sources, r->grad_taps_of_source, r->grad_query,
                                     r->grad_key_norm, r->grad_streams[s],
                                     (const Activation *const *)r->sources, r->taps_of_source,
                                     n, bench_kernels[s],
                                     r->weights + (size_t)s * n * r->tokens * r->heads,
                                     r->rstd + (size_t)s * n * r->tokens,
                                     row_of(r, r->query, s), row_of(r, r->key_norm, s),
                                     r->scratch, 1, r->tokens, r->d, r->heads);
    }
}

static void route_pass(void *context)
{
    RoutePass *r = context;
    const Backend *backend = r->backend;
    for (int j = 0; j < r->sites; j++) {
        const int n = site_sources(r, j);
        if (r->msar) {
            msar_site(r, n);
            continue;
        }
        backend->route_forward(r->out, r->weights, r->rstd,
                               (const Activation *const *)r->sources, n, r->query, r->key_norm,
                               r->replace ? NULL : r->base, r->replace ? NULL : r->alpha,
                               r->tokens, r->d, r->heads, 1e-5f);
        if (r->forward_only)
            continue;
        backend->route_backward(r->grad_sources, r->grad_query, r->grad_key_norm,
                                r->replace ? NULL : r->grad_alpha, r->dout,
                                (const Activation *const *)r->sources, n, r->weights, r->rstd,
                                r->query, r->key_norm, r->replace ? NULL : r->alpha,
                                r->scratch, r->tokens, r->d, r->heads);
    }
}

/* msar: the MSAR sites of the 8B graft; step_routing: the Block MHAR replace-form routing of
 * one microbatch of the 1B step (d 1280, 8 x 1024 tokens, 73 sites); else the 8B graft. */
void bench_case_route(Bench *bench, bool msar, bool step_routing)
{
    const Backend *backend = bench->backend;
    const BenchShapes *s = &bench->shapes;
    RoutePass r = {
        .backend = backend, .d = s->route_d, .heads = s->route_heads,
        .tokens = s->route_tokens, .sites = s->route_sublayers,
        .sublayers_per_block = s->route_sublayers / s->route_blocks, .msar = msar,
    };
    if (step_routing) {
        const BenchStepShape *step = &s->steps[BENCH_STEP_1B];
        r.d = step->model.d_model, r.heads = 8 < r.d / 16 ? 8 : 2;
        r.tokens = step->microbatch * step->T, r.replace = true;
        r.sites = s->step_route_sublayers + 1;
        r.sublayers_per_block = s->step_route_sublayers / s->step_route_blocks;
    }
    r.max_sources = 0;
    for (int j = 0; j < r.sites; j++)
        r.max_sources = site_sources(&r, j) > r.max_sources ? site_sources(&r, j)
                                                              : r.max_sources;
    if (r.max_sources > 16)
        fatal(EXIT_CONFIG, "bench: %d sources per site, at most 16", r.max_sources);
    const size_t rows = (size_t)r.tokens * r.d, m = msar ? BENCH_STREAMS : 1;
    backend->memory_peak_reset();
    for (int k = 0; k < r.max_sources; k++) {
        r.sources[k] = bench_random_activations(backend, rows, 1.0f);
        r.grad_sources[k] = bench_zero_activations(backend, rows);
    }
    for (size_t i = 0; i < m && msar; i++) {
        r.streams[i] = bench_zero_activations(backend, rows);
        r.grad_streams[i] = bench_zero_activations(backend, rows);
    }
    r.mixed = bench_zero_activations(backend, rows);
    r.base = bench_random_activations(backend, rows, 1.0f);
    r.out = bench_zero_activations(backend, rows);
    r.dout = bench_random_activations(backend, rows, 1.0f);
    r.query = bench_random_activations(backend, m * r.d, 0.05f);
    r.key_norm = bench_random_activations(backend, m * r.d, 1.0f);
    r.taps = bench_random_activations(backend, m * BENCH_KERNEL_MAX * r.d, 0.5f);
    r.mix_proj = bench_random_activations(backend, m * r.d, 0.05f);
    const size_t weights = m * r.max_sources * (size_t)r.tokens * r.heads;
    r.weights = backend->alloc(weights * sizeof(float));
    r.rstd = backend->alloc(m * r.max_sources * (size_t)r.tokens * sizeof(float));
    r.mix_gates = backend->alloc((size_t)r.tokens * m * sizeof(float));
    r.mix_rstd = backend->alloc((size_t)r.tokens * m * sizeof(float));
    r.scratch = backend->alloc(weights * sizeof(float));
    r.grad_query = backend->alloc(r.d * sizeof(float));
    r.grad_key_norm = backend->alloc(r.d * sizeof(float));
    r.grad_alpha = backend->alloc(sizeof(float));
    const float alpha = 0.1f;
    r.alpha = backend->alloc(sizeof(float));
    backend->upload(r.alpha, &alpha, sizeof alpha);
    /* each source its own taps gradient, as each source has its own slot in the model */
    r.grad_taps = backend->alloc((size_t)r.max_sources * BENCH_KERNEL_MAX * r.d * sizeof(float));
    r.mix_bias = backend->alloc(m * sizeof(float));
    r.grad_mix_bias = backend->alloc(m * sizeof(float));
    r.grad_mix_proj = backend->alloc(m * r.d * sizeof(float));

    double ms = bench_time_ms(backend, route_pass, &r, bench->repeat);
    /* the ideal traffic: each source read once forward and twice backward, the stream and
     * the output once each way (bf16), as peer.py counts it */
    double bytes = 0;
    for (int j = 0; j < r.sites; j++)
        bytes += (2.0 * site_sources(&r, j) + 2.0) * (double)rows * backend->activation_bytes;
    if (step_routing) {
        /* the forward alone too: where the time goes at d 1280 */
        r.forward_only = true;
        const double forward_ms = bench_time_ms(backend, route_pass, &r, bench->repeat);
        double forward_bytes = 0;
        for (int j = 0; j < r.sites; j++)
            forward_bytes += (site_sources(&r, j) + 1.0) * (double)rows * backend->activation_bytes;
        bench_add(bench, "route-1b", "per site forward", forward_ms,
                  forward_bytes / forward_ms / 1e6, "GB/s", NAN);
    }
    bench_add(bench, msar ? "msar" : step_routing ? "route-1b" : "route",
              msar ? "conv in the read" : step_routing ? "per site replace" : "per site delta", ms,
              bytes / ms / 1e6, "GB/s", bench_peak_gib(backend));

    for (int k = 0; k < r.max_sources; k++) {
        backend->release(r.sources[k]);
        backend->release(r.grad_sources[k]);
    }
    for (size_t i = 0; i < m && msar; i++) {
        backend->release(r.streams[i]);
        backend->release(r.grad_streams[i]);
    }
    void *rest[] = {r.mixed, r.base, r.out, r.dout, r.query, r.key_norm,
                    r.taps, r.mix_proj, r.weights, r.rstd, r.mix_gates, r.mix_rstd, r.scratch,
                    r.grad_query, r.grad_key_norm, r.grad_alpha, r.alpha, r.grad_taps, r.mix_bias,
                    r.grad_mix_bias, r.grad_mix_proj};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        backend->release(rest[i]);
}
