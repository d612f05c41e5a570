/* launch/bench_route_block.c — the routing cases of `fathom bench` as the model runs them
 * now: two-phase, block by block (model/route_block.h; launch/bench.h lists the cases).
 *
 *   route     Block MHAR delta at the 8B graft (d 4096, H 8, 2 x 4096 tokens, 8 blocks of
 *             8 sites over N = 2..9 sources: null and the completed blocks): per block
 *             route_block_forward, then each site's x = p + alpha * Route (add_scaled);
 *             backward, blocks last to first: route_block_backward. The (c) row of the table;
 *             a second row times the block ops without the gates' adds.
 *   route-1b  the Block MHAR replace-form routing of one microbatch of the 1B step (d 1280,
 *             8 x 1024 tokens, 9 blocks of 8 sites over N = 1..9 completed blocks, and the
 *             final site over all 10): per block phase one, the block's first site taking it
 *             as its x, the others merged with the open partial; backward, each site's merge
 *             backward, then the block's.
 * The rate is the traffic the ops are built to move (route_block_cuda.h): forward N + G rows
 * a block, 3 a delta site (p, Route, x), 3 a merge (partial, Route, x); backward 4N + 2G a
 * block (dots N + G, the walker 3N + G), 5 a merge (d x, x, partial, its gradient read and
 * written) or 2 without a partial; the final site as route_bench.c counts a site.
 */
#include "launch/bench_internal.h"

#include "runtime/error.h"

#include <math.h>
#include <stdlib.h>

enum { BLOCK_BENCH_SOURCES = 12, BLOCK_BENCH_SITES = 8 };

typedef struct {
    const Backend *backend;
    int d, heads, tokens, S, blocks, sites;
    bool replace, forward_only, block_ops_only; /* block_ops_only: no add_scaled */
    Activation *sources[BLOCK_BENCH_SOURCES], *grad_sources[BLOCK_BENCH_SOURCES];
    Activation *results[BLOCK_BENCH_SITES], *douts[BLOCK_BENCH_SITES];
    Activation *base, *x, *queries, *key_norms;
    float *weights, *rstd, *lse, *means, *alphas, *grad_queries, *grad_key_norms, *grad_alphas;
    float *scratch;
    /* the ops' host arrays of backend pointers */
    const Activation *site_sources[BLOCK_BENCH_SOURCES + 1];
    Activation *site_grads[BLOCK_BENCH_SOURCES + 1];
    const Activation *query_of[BLOCK_BENCH_SITES], *key_norm_of[BLOCK_BENCH_SITES];
    const Activation *dout_of[BLOCK_BENCH_SITES];
    float *weights_of[BLOCK_BENCH_SITES], *rstd_of[BLOCK_BENCH_SITES], *lse_of[BLOCK_BENCH_SITES];
    const float *const_weights_of[BLOCK_BENCH_SITES], *means_of[BLOCK_BENCH_SITES];
    const float *alpha_of[BLOCK_BENCH_SITES];
    float *grad_query_of[BLOCK_BENCH_SITES], *grad_key_norm_of[BLOCK_BENCH_SITES];
    float *grad_alpha_of[BLOCK_BENCH_SITES];
} BlockPass;

/* completed sources of block n (1-based): delta null, b_0..b_{n-1}; replace b_0..b_{n-1} */
static int block_sources(const BlockPass *p, int block)
{
    return p->replace ? block : block + 1;
}

static size_t rows_by_d(const BlockPass *p)
{
    return (size_t)p->tokens * p->d;
}

static size_t max_rows_weights(const BlockPass *p)
{
    return (size_t)(BLOCK_BENCH_SOURCES + 1) * p->tokens * p->heads;
}

/* The partial of the open block sits after the completed sources in `sources`. */
static void point_sources(BlockPass *p, int N, bool partial)
{
    for (int k = 0; k < N; k++) {
        p->site_sources[k] = p->sources[k];
        p->site_grads[k] = p->grad_sources[k];
    }
    if (partial) {
        p->site_sources[N] = p->sources[BLOCK_BENCH_SOURCES - 1];
        p->site_grads[N] = p->grad_sources[BLOCK_BENCH_SOURCES - 1];
    }
}

static void block_forward(BlockPass *p, int block)
{
    const Backend *backend = p->backend;
    const int N = block_sources(p, block);
    point_sources(p, N, false);
    for (int i = 0; i < p->S; i++)
        p->results[0 + i] = p->replace && i == 0 ? p->x : p->douts[i]; /* scratch shared */
    backend->route_block_forward(p->results, p->weights_of, p->rstd_of,
                                 p->replace ? p->lse_of : NULL, p->site_sources, N,
                                 p->query_of, p->key_norm_of, p->S, p->tokens, p->d, p->heads,
                                 1e-5f);
    for (int i = 0; i < p->S; i++) {
        if (!p->replace) {
            if (!p->block_ops_only)
                backend->add_scaled(p->x, p->base, p->results[i], p->alpha_of[i], rows_by_d(p));
        } else if (i > 0) {
            point_sources(p, N, true);
            backend->route_merge_forward(p->x, p->weights_of[i], p->rstd_of[i], p->results[i],
                                         p->lse_of[i], p->site_sources[N], N + 1, p->query_of[i],
                                         p->key_norm_of[i], p->tokens, p->d, p->heads, 1e-5f);
        }
    }
}

static void block_backward(BlockPass *p, int block)
{
    const Backend *backend = p->backend;
    const int N = block_sources(p, block);
    for (int i = p->S - 1; i >= 0 && p->replace; i--) {
        point_sources(p, N, i > 0);
        backend->route_merge_backward(i > 0 ? p->site_grads[N] : NULL, GRAD_ADD,
                                      p->grad_query_of[i], p->grad_key_norm_of[i],
                                      (float *)p->means_of[i], p->dout_of[i], p->x,
                                      i > 0 ? p->site_sources[N] : NULL, N + (i > 0),
                                      p->weights_of[i], p->rstd_of[i], p->query_of[i],
                                      p->key_norm_of[i], p->scratch, p->tokens, p->d,
                                      p->heads);
    }
    point_sources(p, N, false);
    backend->route_block_backward(p->site_grads, 0, p->grad_query_of, p->grad_key_norm_of,
                                  p->replace ? NULL : p->grad_alpha_of, p->dout_of,
                                  p->site_sources, N, p->const_weights_of, p->rstd_of[0],
                                  p->query_of, p->key_norm_of,
                                  p->replace ? NULL : p->alpha_of,
                                  p->replace ? p->means_of : NULL, p->S, p->scratch, p->tokens,
                                  p->d, p->heads);
}

/* the final site (route-1b): one Route over every block, forward and backward */
static void final_site(BlockPass *p)
{
    const Backend *backend = p->backend;
    const int N = p->blocks + 1;
    point_sources(p, N, false);
    backend->route_forward(p->x, p->weights, p->rstd, p->site_sources, N, p->query_of[0],
                           p->key_norm_of[0], NULL, NULL, p->tokens, p->d, p->heads, 1e-5f);
    if (!p->forward_only)
        backend->route_backward(p->site_grads, p->grad_queries, p->grad_key_norms, NULL,
                                p->dout_of[0], p->site_sources, N, p->weights, p->rstd,
                                p->query_of[0], p->key_norm_of[0], NULL, p->scratch, p->tokens,
                                p->d, p->heads);
}

static void block_pass(void *context)
{
    BlockPass *p = context;
    for (int n = 1; n <= p->blocks; n++)
        block_forward(p, n);
    if (p->sites > p->blocks * p->S)
        final_site(p);
    if (p->forward_only)
        return;
    for (int n = p->blocks; n >= 1; n--)
        block_backward(p, n);
}

static double block_pass_bytes(const BlockPass *p, bool forward_only)
{
    double rows = 0;
    for (int n = 1; n <= p->blocks; n++) {
        const int N = block_sources(p, n), S = p->S;
        rows += N + S + (p->block_ops_only ? 0.0 : 3.0 * (p->replace ? S - 1 : S));
        if (!forward_only)
            rows += 4.0 * N + 2.0 * S + (p->replace ? 5.0 * (S - 1) + 2.0 : 0.0);
    }
    if (p->sites > p->blocks * p->S) /* the final site: N + 1 forward, 3N + 1 backward */
        rows += (p->blocks + 2.0) + (forward_only ? 0.0 : 3.0 * (p->blocks + 1) + 1.0);
    return rows * (double)rows_by_d(p) * p->backend->activation_bytes;
}

void bench_case_route_blocks(Bench *bench, bool step_routing)
{
    const Backend *backend = bench->backend;
    const BenchShapes *s = &bench->shapes;
    BlockPass p = {.backend = backend, .d = s->route_d, .heads = s->route_heads,
                   .tokens = s->route_tokens, .blocks = s->route_blocks,
                   .S = s->route_sublayers / s->route_blocks, .sites = s->route_sublayers};
    if (step_routing) {
        const BenchStepShape *step = &s->steps[BENCH_STEP_1B];
        p.d = step->model.d_model, p.heads = 8 < p.d / 16 ? 8 : 2;
        p.tokens = step->microbatch * step->T, p.replace = true;
        p.blocks = s->step_route_blocks, p.S = s->step_route_sublayers / s->step_route_blocks;
        p.sites = s->step_route_sublayers + 1;
    }
    if (p.S > BLOCK_BENCH_SITES || p.blocks + 2 > BLOCK_BENCH_SOURCES)
        fatal(EXIT_CONFIG, "bench: %d sites a block and %d blocks, at most %d and %d", p.S,
              p.blocks, BLOCK_BENCH_SITES, BLOCK_BENCH_SOURCES - 2);
    const size_t rows = rows_by_d(&p), H = (size_t)p.heads, T = (size_t)p.tokens;
    const size_t d = (size_t)p.d, S = (size_t)p.S;
    backend->memory_peak_reset();
    for (int k = 0; k < BLOCK_BENCH_SOURCES; k++) {
        p.sources[k] = bench_random_activations(backend, rows, 1.0f);
        p.grad_sources[k] = bench_zero_activations(backend, rows);
    }
    for (size_t i = 0; i < S; i++)
        p.douts[i] = bench_random_activations(backend, rows, 1.0f);
    p.base = bench_random_activations(backend, rows, 1.0f);
    p.x = bench_zero_activations(backend, rows);
    p.queries = bench_random_activations(backend, S * d, 0.05f);
    p.key_norms = bench_random_activations(backend, S * d, 1.0f);
    p.weights = backend->alloc(S * max_rows_weights(&p) * sizeof(float));
    p.rstd = backend->alloc(S * (BLOCK_BENCH_SOURCES + 1) * T * sizeof(float));
    p.lse = backend->alloc(S * T * H * sizeof(float));
    p.means = backend->alloc(S * T * H * sizeof(float));
    p.alphas = backend->alloc(S * sizeof(float));
    p.grad_queries = backend->alloc(S * d * sizeof(float));
    p.grad_key_norms = backend->alloc(S * d * sizeof(float));
    p.grad_alphas = backend->alloc(S * sizeof(float));
    p.scratch = backend->alloc((BLOCK_BENCH_SOURCES + 1) * T * H * sizeof(float));
    float alphas[BLOCK_BENCH_SITES];
    for (size_t i = 0; i < S; i++)
        alphas[i] = 0.1f;
    backend->upload(p.alphas, alphas, S * sizeof(float));
    for (size_t i = 0; i < S; i++) {
        p.query_of[i] = activation_at_const(backend, p.queries, i * d);
        p.key_norm_of[i] = activation_at_const(backend, p.key_norms, i * d);
        p.dout_of[i] = p.douts[i];
        p.weights_of[i] = p.weights + i * max_rows_weights(&p);
        p.const_weights_of[i] = p.weights_of[i];
        p.rstd_of[i] = p.rstd + i * (BLOCK_BENCH_SOURCES + 1) * T;
        p.lse_of[i] = p.lse + i * T * H;
        p.means_of[i] = p.means + i * T * H;
        p.alpha_of[i] = p.alphas + i;
        p.grad_query_of[i] = p.grad_queries + i * d;
        p.grad_key_norm_of[i] = p.grad_key_norms + i * d;
        p.grad_alpha_of[i] = p.grad_alphas + i;
    }

    const char *name = step_routing ? "route-1b" : "route";
    if (step_routing) { /* the forward alone too */
        p.forward_only = true;
        const double ms = bench_time_ms(backend, block_pass, &p, bench->repeat);
        bench_add(bench, name, "two-phase forward", ms, block_pass_bytes(&p, true) / ms / 1e6,
                  "GB/s", NAN);
        p.forward_only = false;
    }
    const double ms = bench_time_ms(backend, block_pass, &p, bench->repeat);
    bench_add(bench, name, step_routing ? "two-phase replace" : "two-phase delta", ms,
              block_pass_bytes(&p, false) / ms / 1e6, "GB/s", bench_peak_gib(backend));
    if (!step_routing) { /* the block ops alone, without the gates' x = p + alpha Route */
        p.block_ops_only = true;
        const double ops_ms = bench_time_ms(backend, block_pass, &p, bench->repeat);
        bench_add(bench, name, "block ops only", ops_ms,
                  block_pass_bytes(&p, false) / ops_ms / 1e6, "GB/s", NAN);
    }

    for (int k = 0; k < BLOCK_BENCH_SOURCES; k++) {
        backend->release(p.sources[k]);
        backend->release(p.grad_sources[k]);
    }
    for (size_t i = 0; i < S; i++)
        backend->release(p.douts[i]);
    void *rest[] = {p.base, p.x, p.queries, p.key_norms, p.weights, p.rstd, p.lse, p.means,
                    p.alphas, p.grad_queries, p.grad_key_norms, p.grad_alphas, p.scratch};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        backend->release(rest[i]);
}
