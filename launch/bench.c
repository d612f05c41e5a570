/* launch/bench.c — `fathom bench` (see bench.h). */
#include "launch/bench.h"

#include "launch/backend_select.h"
#include "launch/run_state.h"
#include "model/model.h"
#include "model/params.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char bench_usage[] =
    "usage: fathom bench [--cases layers,attention,route,msar,step] [--repeat N] "
    "[--device auto|cpu|cuda] [--small] [--json OUT.jsonl]";

enum { BENCH_MAX_ROWS = 16, BENCH_STREAMS = 4, BENCH_KERNEL_MAX = 8 };

/* The shapes of every case: the real ones, or --small. */
typedef struct {
    ModelConfig layers_model;
    int layers_T;
    int attention_B, attention_T, attention_heads, attention_kv_heads, attention_head_dim;
    int route_d, route_heads, route_tokens, route_sublayers, route_blocks;
    int step_route_sublayers, step_route_blocks; /* the routing of the step's MHAR */
    ModelConfig step_model;
    int step_microbatch, step_microbatches, step_T;
} BenchShapes;

typedef struct {
    char case_name[16], mode[24];
    double ms, rate, peak_gib;
    const char *unit; /* "TFLOP/s", "GB/s", "tok/s" */
} BenchRow;

typedef struct {
    const Backend *backend;
    BenchShapes shapes;
    int repeat;
    BenchRow rows[BENCH_MAX_ROWS];
    int n_rows;
    FILE *json;
} Bench;

static ModelConfig llama_config(int vocab, int d, int layers, int heads, int kv_heads,
                                int head_dim, int ffn)
{
    Config defaults;
    config_defaults(&defaults);
    ModelConfig model = defaults.model;
    model.vocab_size = vocab;
    model.d_model = d;
    model.n_layers = layers;
    model.n_heads = heads;
    model.n_kv_heads = kv_heads;
    model.head_dim = head_dim;
    model.ffn_dim = ffn;
    model.rope_theta = 500000.0;
    model.norm_eps = 1e-5;
    model.tie_embeddings = false;
    model.qk_norm = false;
    return model;
}

static BenchShapes bench_shapes(bool small)
{
    BenchShapes shapes;
    if (small) {
        shapes.layers_model = llama_config(256, 128, 2, 2, 1, 64, 256);
        shapes.layers_T = 64;
        shapes.attention_B = 1, shapes.attention_T = 64, shapes.attention_heads = 2;
        shapes.attention_kv_heads = 1, shapes.attention_head_dim = 64;
        shapes.route_d = 64, shapes.route_heads = 2, shapes.route_tokens = 96;
        shapes.route_sublayers = 8, shapes.route_blocks = 2;
        shapes.step_model = llama_config(256, 128, 4, 2, 1, 64, 256);
        shapes.step_microbatch = 2, shapes.step_microbatches = 2, shapes.step_T = 32;
        shapes.step_route_sublayers = 8, shapes.step_route_blocks = 4;
        return shapes;
    }
    shapes.layers_model = llama_config(256, 4096, 4, 32, 8, 128, 14336);
    shapes.layers_T = 4096;
    shapes.attention_B = 1, shapes.attention_T = 4096, shapes.attention_heads = 32;
    shapes.attention_kv_heads = 8, shapes.attention_head_dim = 128;
    shapes.route_d = 4096, shapes.route_heads = 8, shapes.route_tokens = 2 * 4096;
    shapes.route_sublayers = 64, shapes.route_blocks = 8;
    shapes.step_model = llama_config(128256, 1280, 36, 16, 8, 80, 5120);
    shapes.step_microbatch = 8, shapes.step_microbatches = 4, shapes.step_T = 1024;
    shapes.step_route_sublayers = 72, shapes.step_route_blocks = 9;
    return shapes;
}

/* ---- timing ---- */

typedef void (*BenchWork)(void *context);

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of `repeat` runs of work(context) after two warm-ups, in milliseconds between
 * events on the backend's stream. */
static double bench_time_ms(const Backend *backend, BenchWork work, void *context, int repeat)
{
    BackendEvent *start = backend->event_create(), *end = backend->event_create();
    for (int i = 0; i < 2; i++)
        work(context);
    double *times = xcalloc((size_t)repeat, sizeof *times);
    for (int i = 0; i < repeat; i++) {
        backend->event_record(start);
        work(context);
        backend->event_record(end);
        times[i] = backend->event_elapsed_ms(start, end);
    }
    qsort(times, (size_t)repeat, sizeof *times, compare_doubles);
    double median = times[repeat / 2];
    free(times);
    backend->event_destroy(start);
    backend->event_destroy(end);
    return median;
}

static double peak_gib(const Backend *backend)
{
    size_t in_use = 0, peak = 0;
    backend->memory_usage(&in_use, &peak);
    return peak ? (double)peak / (1 << 30) : NAN;
}

static void bench_add(Bench *bench, const char *case_name, const char *mode, double ms,
                      double rate, const char *unit, double peak)
{
    if (bench->n_rows == BENCH_MAX_ROWS)
        fatal(EXIT_CONFIG, "bench: more than %d results", BENCH_MAX_ROWS);
    BenchRow *row = &bench->rows[bench->n_rows++];
    snprintf(row->case_name, sizeof row->case_name, "%s", case_name);
    snprintf(row->mode, sizeof row->mode, "%s", mode);
    row->ms = ms, row->rate = rate, row->unit = unit, row->peak_gib = peak;
    printf("bench: %-10s %-18s %9.3f ms  %8.1f %s\n", case_name, mode, ms, rate, unit);
    fflush(stdout);
    if (bench->json) {
        fprintf(bench->json, "{\"case\": \"%s\", \"mode\": \"%s\", \"ms\": %.4f, \"rate\": %.4f, "
                "\"unit\": \"%s\", \"peak_gib\": ", case_name, mode, ms, rate, unit);
        if (isfinite(peak))
            fprintf(bench->json, "%.3f}\n", peak);
        else
            fprintf(bench->json, "null}\n");
        fflush(bench->json);
    }
}

/* ---- random inputs ---- */

static uint64_t bench_random_state = 0x9e3779b97f4a7c15ull;

static double bench_uniform(void) /* [0, 1) */
{
    bench_random_state ^= bench_random_state << 13;
    bench_random_state ^= bench_random_state >> 7;
    bench_random_state ^= bench_random_state << 17;
    return (double)(bench_random_state >> 11) / (double)(1ull << 53);
}

static Activation *random_activations(const Backend *backend, size_t n, float scale)
{
    float *host = xmalloc(n * sizeof *host);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)((2.0 * bench_uniform() - 1.0) * scale);
    Activation *array = backend->alloc(n * backend->activation_bytes);
    backend->activations_upload(array, host, n);
    free(host);
    return array;
}

static Activation *zero_activations(const Backend *backend, size_t n)
{
    return backend->alloc(n * backend->activation_bytes);
}

static void random_tokens(uint32_t *tokens, size_t n, int vocab)
{
    for (size_t i = 0; i < n; i++)
        tokens[i] = (uint32_t)(bench_uniform() * vocab);
}

/* ---- layers: the model's forward + backward over 4 decoder layers ---- */

typedef struct {
    Model *model;
    const uint32_t *inputs, *targets;
} ModelPass;

static void model_pass(void *context)
{
    ModelPass *pass = context;
    model_forward(pass->model, pass->inputs, pass->targets, 1, 0.0f);
    model_backward(pass->model, 1.0f);
}

static void case_layers(Bench *bench)
{
    const Backend *backend = bench->backend;
    const ModelConfig *config = &bench->shapes.layers_model;
    const int T = bench->shapes.layers_T;
    backend->memory_peak_reset();
    Model *model = model_create(backend, config, NULL, 1, T);
    model_init_params(model, 1, 0.02);
    uint32_t *inputs = xmalloc((size_t)T * sizeof *inputs);
    uint32_t *targets = xmalloc((size_t)T * sizeof *targets);
    random_tokens(inputs, (size_t)T, config->vocab_size);
    random_tokens(targets, (size_t)T, config->vocab_size);
    ModelPass pass = {model, inputs, targets};
    double ms = bench_time_ms(backend, model_pass, &pass, bench->repeat);
    /* DESIGN 6: 6 FLOPs per matrix weight per token, causal attention counted once */
    const double matrix = (double)model_param_table(model)->layer_matrix_count;
    const double flops = 6.0 * matrix * T +
                         6.0 * config->n_layers * (double)T * config->n_heads *
                             config->head_dim * T;
    bench_add(bench, "layers", "forward+backward", ms, flops / ms / 1e9, "TFLOP/s",
              peak_gib(backend));
    free(inputs);
    free(targets);
    model_destroy(model);
}

/* ---- attention alone ---- */

typedef struct {
    const Backend *backend;
    Activation *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
    int B, T, heads, kv_heads, head_dim;
    bool backward;
} AttentionPass;

static void attention_pass(void *context)
{
    AttentionPass *a = context;
    a->backend->attention_forward(a->out, a->lse, a->q, a->k, a->v, a->B, a->T, a->heads,
                                  a->kv_heads, a->head_dim);
    if (a->backward)
        a->backend->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out,
                                       a->lse, a->B, a->T, a->heads, a->kv_heads,
                                       a->head_dim);
}

static void case_attention(Bench *bench)
{
    const Backend *backend = bench->backend;
    const BenchShapes *s = &bench->shapes;
    const size_t rows = (size_t)s->attention_B * s->attention_T;
    const size_t q_count = rows * s->attention_heads * s->attention_head_dim;
    const size_t kv_count = rows * s->attention_kv_heads * s->attention_head_dim;
    AttentionPass a = {
        .backend = backend,
        .q = random_activations(backend, q_count, 1.0f),
        .k = random_activations(backend, kv_count, 1.0f),
        .v = random_activations(backend, kv_count, 1.0f),
        .out = zero_activations(backend, q_count),
        .dout = random_activations(backend, q_count, 1.0f),
        .dq = zero_activations(backend, q_count),
        .dk = zero_activations(backend, kv_count),
        .dv = zero_activations(backend, kv_count),
        .lse = backend->alloc(rows * s->attention_heads * sizeof(float)),
        .B = s->attention_B, .T = s->attention_T, .heads = s->attention_heads,
        .kv_heads = s->attention_kv_heads, .head_dim = s->attention_head_dim,
    };
    /* causal: half of the 4 B T^2 H hd of the full square; the backward is 2.5x that */
    const double forward_flops = 2.0 * s->attention_B * (double)s->attention_T *
                                 s->attention_T * s->attention_heads * s->attention_head_dim;
    double ms = bench_time_ms(backend, attention_pass, &a, bench->repeat);
    bench_add(bench, "attention", "forward", ms, forward_flops / ms / 1e9, "TFLOP/s", NAN);
    a.backward = true;
    ms = bench_time_ms(backend, attention_pass, &a, bench->repeat);
    bench_add(bench, "attention", "forward+backward", ms, 3.5 * forward_flops / ms / 1e9,
              "TFLOP/s", NAN);
    Activation *arrays[] = {a.q, a.k, a.v, a.out, a.dout, a.dq, a.dk, a.dv};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        backend->release(arrays[i]);
    backend->release(a.lse);
}

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
    Activation *mixed, *grad_mixed, *base, *out, *dout;
    Activation *query, *key_norm, *zero_query, *taps, *mix_proj;
    float *weights, *rstd, *gate_weights, *gate_rstd, *mix_gates, *mix_rstd, *scratch;
    float *grad_query, *grad_key_norm, *grad_alpha, *grad_taps, *mix_bias, *grad_mix_bias;
    float *grad_mix_proj;
} RoutePass;

static const int bench_kernels[BENCH_STREAMS] = {1, 2, 4, 8};

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

static void msar_streams_forward(RoutePass *r, int n)
{
    for (int s = 0; s < BENCH_STREAMS; s++) {
        msar_taps(r, n, s);
        r->backend->route_conv_forward(r->streams[s],
                                       r->weights + (size_t)s * n * r->tokens * r->heads,
                                       r->rstd + (size_t)s * n * r->tokens,
                                       (const Activation *const *)r->sources, r->taps_of_source,
                                       n, bench_kernels[s], row_of(r, r->query, s),
                                       row_of(r, r->key_norm, s), 1, r->tokens, r->d, r->heads,
                                       1e-5f);
    }
    r->backend->stream_mix_forward(r->mixed, r->mix_gates, r->mix_rstd,
                                   (const Activation *const *)r->streams, BENCH_STREAMS,
                                   r->mix_bias, r->mix_proj, r->tokens, r->d, 1e-5f);
}

/* One MSAR delta site, forward then backward, as model/route_site.c runs it: the stream
 * convolutions happen inside the routing reads (route_conv ops), never stored. */
static void msar_site(RoutePass *r, int n)
{
    const Backend *backend = r->backend;
    const size_t bytes = (size_t)r->tokens * r->d * backend->activation_bytes;
    const Activation *one_source[1] = {r->mixed};
    Activation *one_grad[1] = {r->grad_mixed};

    msar_streams_forward(r, n);
    backend->route_forward(r->out, r->gate_weights, r->gate_rstd, one_source, 1, r->zero_query,
                           r->zero_query, r->base, 0.1f, r->tokens, r->d, r->heads, 1e-5f);
    /* backward: the streams and the mix again, then the gate, the mix, each stream */
    msar_streams_forward(r, n);
    backend->zero(r->grad_mixed, bytes);
    backend->route_backward(one_grad, r->grad_query, r->grad_key_norm, r->grad_alpha, r->dout,
                            one_source, 1, r->gate_weights, r->gate_rstd, r->zero_query,
                            r->zero_query, true, 0.1f, r->scratch, r->tokens, r->d, r->heads);
    for (int s = 0; s < BENCH_STREAMS; s++)
        backend->zero(r->grad_streams[s], bytes);
    backend->stream_mix_backward(r->grad_streams, r->grad_mix_bias, r->grad_mix_proj,
                                 r->grad_mixed, (const Activation *const *)r->streams,
                                 BENCH_STREAMS, r->mix_gates, r->mix_rstd, r->mix_bias,
                                 r->mix_proj, r->tokens, r->d);
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
                               r->replace ? NULL : r->base, 0.1f, r->tokens, r->d, r->heads,
                               1e-5f);
        if (r->forward_only)
            continue;
        backend->route_backward(r->grad_sources, r->grad_query, r->grad_key_norm,
                                r->replace ? NULL : r->grad_alpha, r->dout,
                                (const Activation *const *)r->sources, n, r->weights, r->rstd,
                                r->query, r->key_norm, !r->replace, 0.1f, r->scratch,
                                r->tokens, r->d, r->heads);
    }
}

/* msar: the MSAR sites of the 8B graft; step_routing: the Block MHAR replace-form routing of
 * one microbatch of the 1B step (d 1280, 8 x 1024 tokens, 73 sites); else the 8B graft. */
static void case_route(Bench *bench, bool msar, bool step_routing)
{
    const Backend *backend = bench->backend;
    const BenchShapes *s = &bench->shapes;
    RoutePass r = {
        .backend = backend, .d = s->route_d, .heads = s->route_heads,
        .tokens = s->route_tokens, .sites = s->route_sublayers,
        .sublayers_per_block = s->route_sublayers / s->route_blocks, .msar = msar,
    };
    if (step_routing) {
        r.d = s->step_model.d_model, r.heads = 8 < r.d / 16 ? 8 : 2;
        r.tokens = s->step_microbatch * s->step_T, r.replace = true;
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
        r.sources[k] = random_activations(backend, rows, 1.0f);
        r.grad_sources[k] = zero_activations(backend, rows);
    }
    for (size_t i = 0; i < m && msar; i++) {
        r.streams[i] = zero_activations(backend, rows);
        r.grad_streams[i] = zero_activations(backend, rows);
    }
    r.mixed = zero_activations(backend, rows);
    r.grad_mixed = zero_activations(backend, rows);
    r.base = random_activations(backend, rows, 1.0f);
    r.out = zero_activations(backend, rows);
    r.dout = random_activations(backend, rows, 1.0f);
    r.query = random_activations(backend, m * r.d, 0.05f);
    r.key_norm = random_activations(backend, m * r.d, 1.0f);
    r.zero_query = zero_activations(backend, (size_t)r.d);
    r.taps = random_activations(backend, m * BENCH_KERNEL_MAX * r.d, 0.5f);
    r.mix_proj = random_activations(backend, m * r.d, 0.05f);
    const size_t weights = m * r.max_sources * (size_t)r.tokens * r.heads;
    r.weights = backend->alloc(weights * sizeof(float));
    r.rstd = backend->alloc(m * r.max_sources * (size_t)r.tokens * sizeof(float));
    r.gate_weights = backend->alloc((size_t)r.tokens * r.heads * sizeof(float));
    r.gate_rstd = backend->alloc((size_t)r.tokens * sizeof(float));
    r.mix_gates = backend->alloc((size_t)r.tokens * m * sizeof(float));
    r.mix_rstd = backend->alloc((size_t)r.tokens * m * sizeof(float));
    r.scratch = backend->alloc(weights * sizeof(float));
    r.grad_query = backend->alloc(r.d * sizeof(float));
    r.grad_key_norm = backend->alloc(r.d * sizeof(float));
    r.grad_alpha = backend->alloc(sizeof(float));
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
        bench_add(bench, "route-1b", "forward", forward_ms, forward_bytes / forward_ms / 1e6,
                  "GB/s", NAN);
    }
    bench_add(bench, msar ? "msar" : step_routing ? "route-1b" : "route",
              msar ? "conv in the read" : step_routing ? "block replace" : "fused delta", ms,
              bytes / ms / 1e6, "GB/s", peak_gib(backend));

    for (int k = 0; k < r.max_sources; k++) {
        backend->release(r.sources[k]);
        backend->release(r.grad_sources[k]);
    }
    for (size_t i = 0; i < m && msar; i++) {
        backend->release(r.streams[i]);
        backend->release(r.grad_streams[i]);
    }
    void *rest[] = {r.mixed, r.grad_mixed, r.base, r.out, r.dout, r.query, r.key_norm,
                    r.zero_query, r.taps, r.mix_proj, r.weights, r.rstd, r.gate_weights,
                    r.gate_rstd, r.mix_gates, r.mix_rstd, r.scratch, r.grad_query,
                    r.grad_key_norm, r.grad_alpha, r.grad_taps, r.mix_bias, r.grad_mix_bias,
                    r.grad_mix_proj};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        backend->release(rest[i]);
}

/* ---- one training step of the 1B model ---- */

typedef struct {
    Model *model;
    Optimizer *optimizer;
    const uint32_t *inputs, *targets;
    int microbatch, microbatches, T;
} StepPass;

static void step_pass(void *context)
{
    StepPass *p = context;
    model_zero_grads(p->model);
    for (int i = 0; i < p->microbatches; i++) {
        const size_t first = (size_t)i * p->microbatch * p->T;
        model_forward(p->model, p->inputs + first, p->targets + first, p->microbatch, 1e-4f);
        model_backward(p->model, 1.0f / p->microbatches);
    }
    double grad_norm;
    optim_step(p->optimizer, 1e-4, &grad_norm);
}

static void case_step(Bench *bench, const char *mode)
{
    const Backend *backend = bench->backend;
    const BenchShapes *s = &bench->shapes;
    Config config;
    config_defaults(&config);
    ResidualConfig residual = config.residual;
    residual.mode = RESIDUAL_STANDARD;
    if (strcmp(mode, "standard")) {
        /* the MHAR paper's 1B graft: blocks of 4 layers, 8 heads, replace form */
        residual.mode = strcmp(mode, "msar") ? RESIDUAL_ATTNRES : RESIDUAL_MSAR;
        residual.heads = 8 < s->step_model.d_model / 16 ? 8 : 2;
        residual.granularity = GRANULARITY_BLOCK;
        residual.layers_per_block = s->step_model.n_layers >= 8 ? 4 : 2;
        residual.form = FORM_REPLACE;
        residual.streams = residual.mode == RESIDUAL_MSAR ? BENCH_STREAMS : 1;
        residual.n_stream_kernels = residual.mode == RESIDUAL_MSAR ? BENCH_STREAMS : 0;
        for (int i = 0; i < residual.n_stream_kernels; i++)
            residual.stream_kernels[i] = bench_kernels[i];
    }
    backend->memory_peak_reset();
    Model *model = model_create(backend, &s->step_model, &residual, s->step_microbatch,
                                s->step_T);
    model_init_params(model, 1, 0.02);
    const ParamTable *table = model_param_table(model);
    float *exp_avg = backend->alloc(table->total * sizeof(float));
    float *exp_avg_sq = backend->alloc(table->total * sizeof(float));
    OptimRange *ranges = run_state_optimizer_ranges(table, &config.optim);
    Optimizer optimizer = {
        .backend = backend, .config = &config.optim,
        .params = model_params(model), .grads = model_grads(model),
        .compute = model_compute_copy(model),
        .exp_avg = exp_avg, .exp_avg_sq = exp_avg_sq,
        .count = table->total, .ranges = ranges, .n_ranges = table->n_params,
    };
    const size_t tokens = (size_t)s->step_microbatch * s->step_microbatches * s->step_T;
    uint32_t *inputs = xmalloc(tokens * sizeof *inputs);
    uint32_t *targets = xmalloc(tokens * sizeof *targets);
    random_tokens(inputs, tokens, s->step_model.vocab_size);
    random_tokens(targets, tokens, s->step_model.vocab_size);
    StepPass pass = {model, &optimizer, inputs, targets, s->step_microbatch,
                     s->step_microbatches, s->step_T};
    const int repeat = bench->repeat / 3 > 3 ? bench->repeat / 3 : 3;
    double ms = bench_time_ms(backend, step_pass, &pass, repeat);
    bench_add(bench, "step", mode, ms, (double)tokens / ms * 1e3, "tok/s", peak_gib(backend));
    free(inputs);
    free(targets);
    free(ranges);
    backend->release(exp_avg);
    backend->release(exp_avg_sq);
    model_destroy(model);
}

/* ---- the command ---- */

static void print_table(const Bench *bench)
{
    printf("\n%-10s %-18s %10s %18s %9s\n", "case", "mode", "ms", "rate", "peak GiB");
    for (int i = 0; i < bench->n_rows; i++) {
        const BenchRow *row = &bench->rows[i];
        char rate[32], peak[16] = "-";
        snprintf(rate, sizeof rate, "%.1f %s", row->rate, row->unit);
        if (isfinite(row->peak_gib))
            snprintf(peak, sizeof peak, "%.2f", row->peak_gib);
        printf("%-10s %-18s %10.3f %18s %9s\n", row->case_name, row->mode, row->ms, rate, peak);
    }
}

int bench_main(int argc, char **argv)
{
    const char *cases = "layers,attention,route,msar,step", *json_path = NULL;
    DeviceKind device = DEVICE_AUTO;
    bool small = false;
    int repeat = 10;
    for (int i = 2; i < argc; i++) {
        const char *option = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(option, "--small")) {
            small = true;
            continue;
        }
        if (!value)
            fatal(EXIT_CONFIG, "bench: %s needs a value\n%s", option, bench_usage);
        i++;
        if (!strcmp(option, "--cases")) {
            cases = value;
        } else if (!strcmp(option, "--json")) {
            json_path = value;
        } else if (!strcmp(option, "--repeat")) {
            repeat = atoi(value);
            if (repeat < 1)
                fatal(EXIT_CONFIG, "bench: --repeat %s must be a positive count", value);
        } else if (!strcmp(option, "--device")) {
            if (!strcmp(value, "auto"))
                device = DEVICE_AUTO;
            else if (!strcmp(value, "cpu"))
                device = DEVICE_CPU;
            else if (!strcmp(value, "cuda"))
                device = DEVICE_CUDA;
            else
                fatal(EXIT_CONFIG, "bench: --device %s is not auto, cpu or cuda", value);
        } else {
            fatal(EXIT_CONFIG, "bench: unknown option '%s'\n%s", option, bench_usage);
        }
    }
    Bench bench = {.backend = backend_select(device), .shapes = bench_shapes(small),
                   .repeat = repeat};
    if (json_path && !(bench.json = fopen(json_path, "w")))
        fatal(EXIT_DATA, "bench: cannot open %s for writing", json_path);
    printf("bench: %s backend, %s shapes, median of %d\n", bench.backend->name,
           small ? "small" : "full", repeat);

    char list[256];
    snprintf(list, sizeof list, "%s", cases);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        if (!strcmp(name, "layers"))
            case_layers(&bench);
        else if (!strcmp(name, "attention"))
            case_attention(&bench);
        else if (!strcmp(name, "route"))
            case_route(&bench, false, false);
        else if (!strcmp(name, "route-1b"))
            case_route(&bench, false, true);
        else if (!strcmp(name, "msar"))
            case_route(&bench, true, false);
        else if (!strcmp(name, "step")) {
            case_step(&bench, "standard");
            case_step(&bench, "mhar");
            case_step(&bench, "msar");
        } else if (!strncmp(name, "step-", 5) && (!strcmp(name + 5, "standard") ||
                                                  !strcmp(name + 5, "mhar") ||
                                                  !strcmp(name + 5, "msar")))
            case_step(&bench, name + 5);
        else
            fatal(EXIT_CONFIG, "bench: unknown case '%s' (layers, attention, route, msar, "
                  "step, or one of route-1b, step-standard, step-mhar, step-msar)", name);
    }
    print_table(&bench);
    if (bench.json)
        fclose(bench.json);
    return EXIT_DONE;
}
