/* tests/test_route_block_cpu.c — the two-phase Route ops on the cpu (runtime/backend.h
 * route_block_*, route_merge_*, add_scaled and its backward; DESIGN 2.1;
 * docs/design-notes.md, "Two-phase routing") against the per-site Route they split.
 *
 * Forward: each site's phase-one result, weights and rstd against a Route in double written
 * here, and lse against the log-sum-exp of its scores; the merge (backend.h's formula, from
 * phase one's float outputs) against that Route over the completed sources and the partial.
 * Backward: the split (route_merge_backward's share and centre,
 * then route_block_backward) against cpu_route_backward of each site over all its sources,
 * in both forms, from random gradient starts (the ops add). Outputs are poisoned with NaN
 * first. Sizes are odd: 3 sites, N = 1 and 4 completed sources, H = 1 and 3 heads of 5
 * channels, 7 tokens.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define TOLERANCE 1e-5
#define EPS 1e-5f

enum { SITES = 3, MAX_SOURCES = 8, TOKENS = 7 };

/* One block: SITES sites over N completed sources (and a partial, the replace form's
 * source N), all in float, with per-site queries and key norms. */
typedef struct {
    int N, d, heads;
    size_t size; /* TOKENS * d */
    float *sources;            /* [N + 1][size]: the completed ones, then a partial */
    const float *rows[MAX_SOURCES + 1];
    float *queries, *key_norms; /* [SITES][d] */
    const float *query[SITES], *key_norm[SITES];
} Block;

static Block block_make(int N, int d, int heads, uint64_t seed)
{
    Block b = {.N = N, .d = d, .heads = heads, .size = (size_t)TOKENS * d};
    b.sources = malloc((size_t)(N + 1) * b.size * sizeof(float));
    cr_assert_not_null(b.sources);
    for (int n = 0; n <= N; n++) {
        test_fill_uniform(b.sources + n * b.size, b.size, 0.5f + 0.4f * n, seed + (uint64_t)n);
        b.rows[n] = b.sources + n * b.size;
    }
    b.queries = random_floats((size_t)SITES * d, 1.0f, seed + 50);
    b.key_norms = random_floats((size_t)SITES * d, 0.5f, seed + 51);
    for (int i = 0; i < SITES; i++) {
        for (int c = 0; c < d; c++)
            b.key_norms[i * d + c] += 1.0f;
        b.query[i] = b.queries + (size_t)i * d;
        b.key_norm[i] = b.key_norms + (size_t)i * d;
    }
    return b;
}

static void block_free(Block *b)
{
    free_all(b->sources, b->queries, b->key_norms, NULL);
}

/* DESIGN 2.1 in double over rows[0..N-1]: out, weights [N, TOKENS, H] and lse [TOKENS, H] */
static void reference_route(double *out, double *weights, double *lse, const float *const *rows,
                            int N, const float *query, const float *key_norm, int d, int heads)
{
    const int head_dim = d / heads;
    for (int t = 0; t < TOKENS; t++) {
        double r[MAX_SOURCES + 1], z[MAX_SOURCES + 1];
        for (int n = 0; n < N; n++) {
            double squares = 0;
            for (int c = 0; c < d; c++)
                squares += (double)rows[n][t * d + c] * rows[n][t * d + c];
            r[n] = 1 / sqrt(squares / d + EPS);
        }
        for (int h = 0; h < heads; h++) {
            double max_z = -INFINITY, sum = 0;
            for (int n = 0; n < N; n++) {
                z[n] = 0;
                for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                    z[n] += (double)query[c] * key_norm[c] * rows[n][t * d + c] * r[n];
                max_z = fmax(max_z, z[n]);
            }
            for (int n = 0; n < N; n++)
                sum += exp(z[n] - max_z);
            if (lse)
                lse[t * heads + h] = max_z + log(sum);
            for (int n = 0; n < N; n++)
                weights[((size_t)n * TOKENS + t) * heads + h] = exp(z[n] - max_z) / sum;
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++) {
                double mix = 0;
                for (int n = 0; n < N; n++)
                    mix += exp(z[n] - max_z) / sum * rows[n][t * d + c];
                out[t * d + c] = mix;
            }
        }
    }
}

static void check_block_forward(int N, int d, int heads, uint64_t seed)
{
    Block b = block_make(N, d, heads, seed);
    const size_t n_weights = (size_t)N * TOKENS * heads;
    float *results[SITES], *weights[SITES], *rstd[SITES], *lse[SITES];
    for (int i = 0; i < SITES; i++) {
        results[i] = poisoned_floats(b.size);
        weights[i] = poisoned_floats(n_weights);
        rstd[i] = poisoned_floats((size_t)N * TOKENS);
        lse[i] = poisoned_floats((size_t)TOKENS * heads);
    }
    cpu_route_block_forward(results, weights, rstd, lse, b.rows, N, b.query, b.key_norm, SITES,
                            TOKENS, d, heads, EPS);
    double *out = malloc(b.size * sizeof(double)), *expected_weights = malloc(n_weights * 8);
    double *expected_lse = malloc((size_t)TOKENS * heads * sizeof(double));
    for (int i = 0; i < SITES; i++) {
        reference_route(out, expected_weights, expected_lse, b.rows, N, b.query[i],
                        b.key_norm[i], d, heads);
        expect_close(results[i], out, b.size, TOLERANCE, "result");
        expect_close(weights[i], expected_weights, n_weights, TOLERANCE, "weights");
        expect_close(lse[i], expected_lse, (size_t)TOKENS * heads, TOLERANCE, "lse");
        cr_assert(test_all_finite(rstd[i], (size_t)N * TOKENS), "site %d: rstd not written", i);
        expect_bitwise_equal(rstd[i], rstd[0], (size_t)N * TOKENS, "every site's rstd");
    }
    for (int i = 0; i < SITES; i++)
        free_all(results[i], weights[i], rstd[i], lse[i], NULL);
    free_all(out, expected_weights, expected_lse, NULL);
    block_free(&b);
}

Test(route_block_cpu, block_forward_gives_each_site_the_route_of_the_common_sources)
{
    check_block_forward(4, 15, 3, 10);
    check_block_forward(1, 15, 1, 20);
}

/* Phase one over the N completed sources, then the merge with the partial, in place of the
 * result (out aliases result, as the MSAR walk runs it): the Route over all N + 1 sources,
 * worked here in double. */
Test(route_block_cpu, merge_forward_is_the_route_over_the_completed_sources_and_the_partial)
{
    const int N = 4, d = 15, heads = 3;
    Block b = block_make(N, d, heads, 40);
    const size_t n_weights = (size_t)(N + 1) * TOKENS * heads;
    float *out = poisoned_floats(b.size), *weights = poisoned_floats(n_weights);
    float *rstd = poisoned_floats((size_t)(N + 1) * TOKENS);
    float *lse = poisoned_floats((size_t)TOKENS * heads);
    cpu_route_block_forward(&out, &weights, &rstd, &lse, b.rows, N, &b.query[1],
                            &b.key_norm[1], 1, TOKENS, d, heads, EPS);
    cpu_route_merge_forward(out, weights, rstd, out, lse, b.rows[N], N + 1, b.query[1],
                            b.key_norm[1], TOKENS, d, heads, EPS);
    double *expected = malloc(b.size * sizeof(double));
    double *expected_weights = malloc(n_weights * sizeof(double));
    reference_route(expected, expected_weights, NULL, b.rows, N + 1, b.query[1], b.key_norm[1],
                    d, heads);
    expect_close(out, expected, b.size, TOLERANCE, "out");
    expect_close(weights, expected_weights, n_weights, TOLERANCE, "weights");
    /* row N of rstd: the partial's, as the per-site Route saves it */
    float *site_out = zero_floats(b.size), *site_weights = zero_floats(n_weights);
    float *site_rstd = zero_floats((size_t)(N + 1) * TOKENS);
    cpu_route_forward(site_out, site_weights, site_rstd, b.rows, N + 1, b.query[1],
                      b.key_norm[1], NULL, 0.0f, TOKENS, d, heads, EPS);
    expect_bitwise_equal(rstd, site_rstd, (size_t)(N + 1) * TOKENS, "rstd");
    free_all(out, weights, rstd, lse, expected, expected_weights, site_out, site_weights,
             site_rstd, NULL);
    block_free(&b);
}

/* ---- backward ---- */

/* Gradients of SITES sites, from random starts; sources [N + 1][size] (the partial last). */
typedef struct {
    float *dsources, *dqueries, *dkey_norms, dalphas[SITES];
} Grads;

static Grads grads_start(const Block *b, uint64_t seed)
{
    Grads g;
    g.dsources = random_floats((size_t)(b->N + 1) * b->size, 1.0f, seed);
    g.dqueries = random_floats((size_t)SITES * b->d, 1.0f, seed + 1);
    g.dkey_norms = random_floats((size_t)SITES * b->d, 1.0f, seed + 2);
    for (int i = 0; i < SITES; i++)
        g.dalphas[i] = 0.25f * (float)i - 0.5f;
    return g;
}

static void grads_expect_close(const Grads *got, const Grads *expected, const Block *b,
                               bool delta)
{
    const size_t n = (size_t)(b->N + 1) * b->size, params = (size_t)SITES * b->d;
    double *e = malloc((n > params ? n : params) * sizeof(double));
    for (size_t i = 0; i < n; i++)
        e[i] = expected->dsources[i];
    expect_close(got->dsources, e, n, TOLERANCE, "dsources");
    for (size_t i = 0; i < params; i++)
        e[i] = expected->dqueries[i];
    expect_close(got->dqueries, e, params, TOLERANCE, "dqueries");
    for (size_t i = 0; i < params; i++)
        e[i] = expected->dkey_norms[i];
    expect_close(got->dkey_norms, e, params, TOLERANCE, "dkey_norms");
    for (int i = 0; i < SITES; i++)
        e[i] = expected->dalphas[i];
    expect_close(got->dalphas, e, SITES, TOLERANCE, delta ? "dalphas" : "dalphas untouched");
    free(e);
}

static void grads_free(Grads *g)
{
    free_all(g->dsources, g->dqueries, g->dkey_norms, NULL);
}

/* Each site's forward over its sources (N, or N + 1 with the partial for sites i > 0 when
 * `partials`), then the split backward against cpu_route_backward site by site. */
static void check_split_backward(int N, int d, int heads, bool delta, bool partials,
                                 uint64_t seed)
{
    Block b = block_make(N, d, heads, seed);
    const size_t per_site_weights = (size_t)(N + 1) * TOKENS * heads;
    const float alphas[SITES] = {0.7f, -0.3f, 1.1f};
    const float *alpha_of[SITES] = {&alphas[0], &alphas[1], &alphas[2]};
    float *weights = zero_floats(SITES * per_site_weights);
    float *rstd = zero_floats((size_t)SITES * (N + 1) * TOKENS);
    float *out = zero_floats((size_t)SITES * b.size);
    float *douts = random_floats((size_t)SITES * b.size, 1.0f, seed + 7);
    float *scratch = zero_floats((size_t)(N + 1) * TOKENS * heads);
    int n_sources[SITES];
    for (int i = 0; i < SITES; i++) {
        n_sources[i] = N + (partials && i > 0);
        cpu_route_forward(out + i * b.size, weights + i * per_site_weights,
                          rstd + (size_t)i * (N + 1) * TOKENS, b.rows, n_sources[i],
                          b.query[i], b.key_norm[i], NULL, 0.0f, TOKENS, d, heads, EPS);
    }

    Grads expected = grads_start(&b, seed + 20), got = grads_start(&b, seed + 20);
    for (int i = 0; i < SITES; i++) {
        float *dsources[MAX_SOURCES + 1];
        for (int n = 0; n <= N; n++)
            dsources[n] = expected.dsources + n * b.size;
        cpu_route_backward(dsources, expected.dqueries + i * d, expected.dkey_norms + i * d,
                           &expected.dalphas[i], douts + i * b.size, b.rows, n_sources[i],
                           weights + i * per_site_weights, rstd + (size_t)i * (N + 1) * TOKENS,
                           b.query[i], b.key_norm[i], delta, alphas[i], scratch, TOKENS, d,
                           heads);
    }

    float *means = poisoned_floats((size_t)SITES * TOKENS * heads);
    const float *mean_of[SITES], *weights_of[SITES], *dout_of[SITES];
    float *dqueries[SITES], *dkey_norms[SITES], *dalphas[SITES], *dsources[MAX_SOURCES + 1];
    for (int n = 0; n <= N; n++)
        dsources[n] = got.dsources + n * b.size;
    for (int i = 0; i < SITES; i++) {
        mean_of[i] = means + (size_t)i * TOKENS * heads;
        weights_of[i] = weights + i * per_site_weights;
        dout_of[i] = douts + i * b.size;
        dqueries[i] = got.dqueries + i * d;
        dkey_norms[i] = got.dkey_norms + i * d;
        dalphas[i] = &got.dalphas[i];
        if (!delta) /* the walk's order: each site's merge backward as it comes */
            cpu_route_merge_backward(dsources[N], GRAD_ADD, dqueries[i], dkey_norms[i],
                                     means + (size_t)i * TOKENS * heads, dout_of[i],
                                     out + i * b.size, n_sources[i] > N ? b.rows[N] : NULL,
                                     n_sources[i], weights_of[i],
                                     rstd + (size_t)i * (N + 1) * TOKENS, b.query[i],
                                     b.key_norm[i], scratch, TOKENS, d, heads);
    }
    cpu_route_block_backward(dsources, dqueries, dkey_norms, dalphas, dout_of, b.rows, N,
                             weights_of, rstd, b.query, b.key_norm, delta ? alpha_of : NULL,
                             delta ? NULL : mean_of, SITES, scratch, TOKENS, d, heads);
    grads_expect_close(&got, &expected, &b, delta);

    grads_free(&expected);
    grads_free(&got);
    free_all(weights, rstd, out, douts, scratch, means, NULL);
    block_free(&b);
}

Test(route_block_cpu, split_backward_is_each_sites_backward_in_the_replace_form_with_partials)
{
    check_split_backward(4, 15, 3, false, true, 60);
    check_split_backward(1, 15, 1, false, true, 70);
}

Test(route_block_cpu, split_backward_is_each_sites_backward_in_the_replace_form_without_partials)
{
    check_split_backward(4, 15, 3, false, false, 80);
}

Test(route_block_cpu, block_backward_is_each_sites_backward_in_the_delta_form)
{
    check_split_backward(4, 15, 3, true, false, 90);
    check_split_backward(1, 15, 1, true, false, 100);
}

Test(route_block_cpu, add_scaled_is_the_delta_forms_expression_and_zero_alpha_returns_base)
{
    float *base = random_floats(33, 1.0f, 5), *x = random_floats(33, 2.0f, 6);
    float *out = poisoned_floats(33);
    cpu_add_scaled(out, base, x, 0.0f, 33);
    expect_bitwise_equal(out, base, 33, "out at alpha 0");
    cpu_add_scaled(out, base, x, 0.375f, 33);
    for (int i = 0; i < 33; i++)
        cr_assert_eq(out[i], base[i] + 0.375f * x[i], "element %d", i);
    cpu_add_scaled(base, base, x, 0.375f, 33); /* in place over base */
    expect_bitwise_equal(base, out, 33, "out written over base");
    free_all(base, x, out, NULL);
}

Test(route_block_cpu, add_scaled_backward_writes_alpha_dout_and_adds_the_dot_to_dalpha)
{
    float *dout = random_floats(33, 1.0f, 7), *x = random_floats(33, 2.0f, 8);
    float *dx = poisoned_floats(33);
    float dalpha = 0.5f;
    double dot = 0;
    for (int i = 0; i < 33; i++)
        dot += (double)dout[i] * x[i];
    cpu_add_scaled_backward(dx, &dalpha, dout, x, -0.625f, 33);
    for (int i = 0; i < 33; i++)
        cr_assert_eq(dx[i], -0.625f * dout[i], "element %d", i);
    cr_expect_float_eq(dalpha, (float)(0.5 + dot), 1e-6, "dalpha %g, expected %g", dalpha,
                       0.5 + dot);
    free_all(dout, x, dx, NULL);
}
