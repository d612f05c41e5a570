/* tests/test_model_route_identities.c — what the math of attention over depth guarantees
 * (DESIGN 2.1, 2.2), checked on the whole model, and finite differences of its gradient.
 *
 * Bit for bit: full granularity is the per-sublayer formula of DESIGN 2.1 (sources
 * e, f_0 .. f_{j-1}) written here with the ops directly; the delta form with every alpha = 0
 * is the standard model (logits and base gradients); MSAR at init is Block AttnRes at init.
 * To rounding: H = 1 is the single-query softmax; zero queries average the sources.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/activations.h"
#include "model/layer.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/residual.h"
#include "model/rope_table.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/route_support.h"
#include "tests/support.h"

static const int kernels_1_2_4_8[] = {1, 2, 4, 8};

static float *tensor_of(Model *model, const char *name)
{
    return model_params(model) + param_table_require(model_param_table(model), name)->offset;
}

/* Sets every site's alpha to `value`. */
static void set_every_alpha(Model *model, float value)
{
    for (int j = 0; j < model_site_count(model); j++) {
        char name[96];
        snprintf(name, sizeof name, "%s.alpha", model_site_name(model, j));
        route_test_fill(model, name, value);
    }
}

/* DESIGN 2.1's full granularity as written: site j routes over e, f_0 .. f_{j-1} (delta:
 * null first, and x_j = p + alpha_j * Route, p <- p + f_j), with the ops and the sublayers
 * called directly and no block bookkeeping. Returns the logits, malloc'd. */
static float *per_sublayer_logits(Model *model, bool delta)
{
    const Backend *backend = backend_cpu(); /* host memory: pointers are plain arrays */
    const ModelConfig *config = model_config(model);
    const ParamTable *table = model_param_table(model);
    const int L = config->n_layers, d = config->d_model, rows = ROUTE_TEST_ROWS;
    const int H = model_residual(model)->heads, half = config->head_dim / 2;
    ResidualPlan standard;
    residual_plan_build(&standard, config, NULL);
    ModelScratch scratch;
    Stash act; /* the whole network's stash of the standard plan: its streams and layers */
    scratch_create(&scratch, backend, config, &standard, ROUTE_TEST_B, ROUTE_TEST_T, false);
    stash_create(&act, backend, config, &standard, ROUTE_TEST_B, ROUTE_TEST_T,
                 (StashShape){0, 2 * L, true, true, false});
    float *cos_table = xmalloc((size_t)ROUTE_TEST_T * half * sizeof(float));
    float *sin_table = xmalloc((size_t)ROUTE_TEST_T * half * sizeof(float));
    rope_table_build(cos_table, sin_table, ROUTE_TEST_T, config);
    const LayerContext context = {backend, config, ROUTE_TEST_B, ROUTE_TEST_T, cos_table,
                                  sin_table, &scratch.layer};
    route_test_tokens(act.inputs, act.targets);

    const size_t bytes = (size_t)rows * d * sizeof(float);
    float **outputs = xcalloc((size_t)2 * L + 1, sizeof *outputs); /* e, f_0, .. */
    float *null_rows = xmalloc(bytes), *p = xmalloc(bytes);
    float *weights = xmalloc((size_t)(2 * L + 2) * rows * H * sizeof(float));
    float *rstd = xmalloc((size_t)(2 * L + 2) * rows * sizeof(float));
    const float **sources = xcalloc((size_t)2 * L + 2, sizeof *sources);
    outputs[0] = xmalloc(bytes);
    backend->embedding_forward(AS_ACTIVATIONS(outputs[0]), act.inputs,
                               AS_ACTIVATIONS(tensor_of(model, "model.embed_tokens.weight")),
                               rows, d);
    memcpy(p, outputs[0], bytes);
    if (delta)
        for (int t = 0; t < rows; t++)
            memcpy(null_rows + (size_t)t * d, tensor_of(model, "model.route_null"),
                   (size_t)d * sizeof(float));
    for (int j = 0; j <= 2 * L; j++) {
        char name[96];
        int n = 0;
        if (delta)
            sources[n++] = null_rows;
        for (int k = 0; k <= j; k++)
            sources[n++] = outputs[k];
        snprintf(name, sizeof name, "%s.query", model_site_name(model, j));
        const float *query = tensor_of(model, name);
        snprintf(name, sizeof name, "%s.key_norm", model_site_name(model, j));
        const float *key_norm = tensor_of(model, name);
        snprintf(name, sizeof name, "%s.alpha", model_site_name(model, j));
        const float alpha = delta ? *tensor_of(model, name) : 0.0f;
        Activation *x = act.stream[j];
        backend->route_forward(x, weights, rstd, (const Activation *const *)sources, n,
                               AS_ACTIVATIONS(query), AS_ACTIVATIONS(key_norm),
                               delta ? AS_ACTIVATIONS(p) : NULL, delta ? &alpha : NULL, rows, d, H,
                               (float)config->norm_eps);
        if (j == 2 * L)
            break;
        LayerWeights layer;
        layer_weights_resolve(&layer, backend, table, AS_ACTIVATIONS(model_params(model)),
                              j / 2, config);
        outputs[j + 1] = xmalloc(bytes);
        Activation *out = AS_ACTIVATIONS(outputs[j + 1]);
        if (j % 2 == 0)
            attention_sublayer_forward(&context, &layer, &act.layers[j / 2], x, NULL, out);
        else
            mlp_sublayer_forward(&context, &layer, &act.layers[j / 2], x, NULL, out);
        backend->add_inplace(AS_ACTIVATIONS(p), out, (size_t)rows * d);
    }
    HeadWeights head = {AS_ACTIVATIONS(tensor_of(model, "model.norm.weight")),
                        AS_ACTIVATIONS(tensor_of(model, "lm_head.weight"))};
    loss_forward(&context, &head, &scratch, &act.head, act.targets, act.stream[2 * L], 1e-4f,
                 0.0f);
    const size_t logit_bytes = (size_t)rows * config->vocab_size * sizeof(float);
    float *logits = xmalloc(logit_bytes);
    memcpy(logits, scratch.logits, logit_bytes);

    for (int k = 0; k <= 2 * L; k++)
        free(outputs[k]);
    free(outputs);
    free(null_rows);
    free(p);
    free(weights);
    free(rstd);
    free(sources);
    free(cos_table);
    free(sin_table);
    stash_destroy(&act, backend);
    scratch_destroy(&scratch, backend);
    residual_plan_free(&standard);
    return logits;
}

static void check_full_granularity_is_the_per_sublayer_formula(ResidualForm form)
{
    ResidualConfig residual = route_test_attnres(2, 0, form);
    Model *model = route_test_model(&residual, 11);
    route_test_randomize_routing(model, 11);
    route_test_forward(model);
    float *expected = per_sublayer_logits(model, form == FORM_DELTA);
    float *logits = route_test_logits(model);
    cr_assert_eq(memcmp(logits, expected, (size_t)ROUTE_TEST_ROWS * 32 * sizeof(float)), 0,
                 "full granularity differs from the per-sublayer formula");
    free(expected);
    free(logits);
    model_destroy(model);
}

Test(model_route, full_granularity_replace_is_the_per_sublayer_formula_bit_for_bit)
{
    check_full_granularity_is_the_per_sublayer_formula(FORM_REPLACE);
}

Test(model_route, full_granularity_delta_is_the_per_sublayer_formula_bit_for_bit)
{
    check_full_granularity_is_the_per_sublayer_formula(FORM_DELTA);
}

/* The sources of `site` and the site's output, on the host. */
static float **download_sources(Model *model, int site, int *n_sources)
{
    const int N = model_site_sources(model, site);
    const Activation **pointers = xcalloc((size_t)N, sizeof *pointers);
    model_site_inputs(model, site, pointers);
    float **sources = xcalloc((size_t)N, sizeof *sources);
    for (int n = 0; n < N; n++) {
        sources[n] = xmalloc((size_t)ROUTE_TEST_ROWS * 16 * sizeof(float));
        backend_cpu()->download(sources[n], pointers[n], ROUTE_TEST_ROWS * 16 * sizeof(float));
    }
    free(pointers);
    *n_sources = N;
    return sources;
}

static void free_sources(float **sources, int n)
{
    for (int k = 0; k < n; k++)
        free(sources[k]);
    free(sources);
}

Test(model_route, one_depth_head_is_the_single_query_softmax_over_the_full_width)
{
    ResidualConfig residual = route_test_attnres(1, 1, FORM_REPLACE);
    Model *model = route_test_model(&residual, 12);
    route_test_randomize_routing(model, 12);
    route_test_forward(model);
    const int d = 16, rows = ROUTE_TEST_ROWS;
    for (int j = 0; j < model_site_count(model); j++) {
        int N;
        float **s = download_sources(model, j, &N);
        float query[16], key_norm[16], out[ROUTE_TEST_ROWS * 16];
        char name[96];
        snprintf(name, sizeof name, "%s.query", model_site_name(model, j));
        route_test_get(model, name, false, query);
        snprintf(name, sizeof name, "%s.key_norm", model_site_name(model, j));
        route_test_get(model, name, false, key_norm);
        float *weights = xmalloc((size_t)N * rows * sizeof(float));
        model_site_weights(model, j, 0, weights);
        model_site_output(model, j, out);
        double *expected = xcalloc((size_t)rows * d, sizeof *expected);
        for (int t = 0; t < rows; t++) {
            double z[8], peak = -INFINITY, sum = 0;
            for (int n = 0; n < N; n++) {
                const float *row = s[n] + (size_t)t * d;
                double squares = 0, dot = 0;
                for (int c = 0; c < d; c++)
                    squares += (double)row[c] * row[c];
                double r = 1.0 / sqrt(squares / d + 1e-5);
                for (int c = 0; c < d; c++)
                    dot += (double)query[c] * key_norm[c] * row[c] * r;
                z[n] = dot;
                peak = fmax(peak, dot);
            }
            for (int n = 0; n < N; n++)
                sum += exp(z[n] - peak);
            for (int n = 0; n < N; n++) {
                double a = exp(z[n] - peak) / sum;
                double got = weights[(size_t)n * rows + t];
                cr_assert(fabs(got - a) <= 1e-6, "site %d token %d source %d: %g vs %g", j, t,
                          n, got, a);
                for (int c = 0; c < d; c++)
                    expected[(size_t)t * d + c] += a * s[n][(size_t)t * d + c];
            }
        }
        double error = test_relative_error_double(out, expected, (size_t)rows * d);
        cr_assert(error <= 1e-6, "site %d output: relative error %.3g", j, error);
        free(expected);
        free(weights);
        free_sources(s, N);
    }
    model_destroy(model);
}

/* Every site's output is the plain mean of its sources. */
static void check_sites_average_their_sources(Model *model)
{
    route_test_forward(model);
    const size_t count = (size_t)ROUTE_TEST_ROWS * 16;
    for (int j = 0; j < model_site_count(model); j++) {
        int N;
        float **s = download_sources(model, j, &N);
        float *out = xmalloc(count * sizeof *out);
        double *mean = xcalloc(count, sizeof *mean);
        model_site_output(model, j, out);
        for (int n = 0; n < N; n++)
            for (size_t i = 0; i < count; i++)
                mean[i] += s[n][i] / (double)N;
        double error = test_relative_error_double(out, mean, count);
        cr_assert(error <= 1e-6, "%s: output vs mean of %d sources, relative error %.3g",
                  model_site_name(model, j), N, error);
        free(out);
        free(mean);
        free_sources(s, N);
    }
}

Test(model_route, zero_queries_give_the_uniform_average_of_the_sources_at_every_site)
{
    ResidualConfig residual = route_test_attnres(2, 1, FORM_REPLACE);
    Model *model = route_test_model(&residual, 13);
    route_test_randomize_routing(model, 13); /* key norms random too: they must not matter */
    for (int j = 0; j < model_site_count(model); j++) {
        char name[96];
        snprintf(name, sizeof name, "%s.query", model_site_name(model, j));
        route_test_fill(model, name, 0.0f);
    }
    check_sites_average_their_sources(model);
    model_destroy(model);
}

/* Routed a site at a time: the replace form's two-phase walk keeps no x_j to read
 * (model_site_output); tests/test_model_two_phase.c holds that walk to this one. */
Test(model_route, msar_at_init_gives_the_uniform_average_of_the_sources_at_every_site)
{
    ResidualConfig residual = route_test_msar(2, 4, kernels_1_2_4_8, FORM_REPLACE);
    Model *model = route_test_model(&residual, 14);
    model_route_sites_alone(model, true);
    check_sites_average_their_sources(model);
    model_destroy(model);
}

/* The delta form with alpha = 0 against the standard model with the same base weights: the
 * logits and every base weight's gradient, bit for bit. */
static void check_delta_with_zero_gates_is_standard(const ResidualConfig *residual)
{
    ModelConfig config = route_test_model_config();
    Model *base = model_create(backend_cpu(), &config, NULL, ROUTE_TEST_B, ROUTE_TEST_T);
    model_init_params(base, 15, 0.1); /* element i of a tensor depends on (seed, name, i) */
    Model *graft = route_test_model(residual, 15);
    route_test_randomize_routing(graft, 15);
    set_every_alpha(graft, 0.0f);
    cr_assert_eq(route_test_forward(base), route_test_forward(graft));
    float *expected = route_test_logits(base), *logits = route_test_logits(graft);
    cr_assert_eq(memcmp(logits, expected, (size_t)ROUTE_TEST_ROWS * 32 * sizeof(float)), 0,
                 "the graft's logits differ from the base model's");
    model_backward(base, 1.0f);
    model_backward(graft, 1.0f);
    const ParamTable *table = model_param_table(base);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        float *a = xmalloc(entry->count * sizeof(float));
        float *b = xmalloc(entry->count * sizeof(float));
        route_test_get(base, entry->name, true, a);
        route_test_get(graft, entry->name, true, b);
        cr_assert_eq(memcmp(a, b, entry->count * sizeof(float)), 0, "%s gradient differs",
                     entry->name);
        free(a);
        free(b);
    }
    free(expected);
    free(logits);
    model_destroy(base);
    model_destroy(graft);
}

Test(model_route, attnres_delta_with_zero_gates_is_the_standard_model_bit_for_bit)
{
    ResidualConfig residual = route_test_attnres(2, 1, FORM_DELTA);
    check_delta_with_zero_gates_is_standard(&residual);
}

Test(model_route, msar_delta_with_zero_gates_is_the_standard_model_bit_for_bit)
{
    ResidualConfig residual = route_test_msar(2, 4, kernels_1_2_4_8, FORM_DELTA);
    check_delta_with_zero_gates_is_standard(&residual);
}

/* MSAR (m = 4, kernels 1, 2, 4, 8) at init against Block AttnRes at init, same H and
 * blocks; in the delta form alpha and null are random and the same in both, so the routed
 * mix is really read. `alone`: both models' sites routed one at a time. `tolerance`: the
 * logits' relative error allowed, 0 for bit for bit. */
static void check_msar_at_init_is_block_attnres(ResidualForm form, bool alone,
                                                double tolerance)
{
    ResidualConfig msar_residual = route_test_msar(2, 4, kernels_1_2_4_8, form);
    ResidualConfig attnres_residual = route_test_attnres(2, 1, form);
    Model *msar = route_test_model(&msar_residual, 16);
    Model *attnres = route_test_model(&attnres_residual, 16);
    model_route_sites_alone(msar, alone);
    model_route_sites_alone(attnres, alone);
    if (form == FORM_DELTA) {
        float null[16];
        test_fill_normal(null, 16, 0.5f, 16);
        route_test_set(msar, "model.route_null", null);
        route_test_set(attnres, "model.route_null", null);
        set_every_alpha(msar, 0.75f);
        set_every_alpha(attnres, 0.75f);
    }
    route_test_forward(msar);
    route_test_forward(attnres);
    float *a = route_test_logits(msar), *b = route_test_logits(attnres);
    const size_t count = (size_t)ROUTE_TEST_ROWS * 32;
    if (tolerance == 0) {
        cr_assert_eq(memcmp(a, b, count * sizeof(float)), 0,
                     "MSAR at init differs from Block AttnRes at init");
    } else {
        const double error = test_relative_error(a, b, count);
        cr_assert_leq(error, tolerance, "MSAR at init: logits relative error %.3g against "
                      "Block AttnRes at init", error);
    }
    free(a);
    free(b);
    model_destroy(msar);
    model_destroy(attnres);
}

Test(model_route, msar_at_init_is_block_attnres_at_init_bit_for_bit)
{
    check_msar_at_init_is_block_attnres(FORM_REPLACE, true, 0);
}

/* Both replace forms walked in two phases: the same phase one and the same merges, so bit
 * for bit as well. */
Test(model_route, msar_at_init_in_two_phases_is_block_attnres_at_init_bit_for_bit)
{
    check_msar_at_init_is_block_attnres(FORM_REPLACE, false, 0);
}

Test(model_route, msar_delta_at_init_is_block_attnres_delta_at_init_bit_for_bit)
{
    check_msar_at_init_is_block_attnres(FORM_DELTA, false, 0);
}

/* ---- finite differences of the whole model ---- */

/* The element of `name` with the largest gradient (for a stream conv: among the taps
 * 1 .. k_r - 1, which shift the sequence), against a central difference of the loss. */
static void check_finite_difference(Model *model, const char *name)
{
    const ParamEntry *entry = param_table_require(model_param_table(model), name);
    float *grad = xmalloc(entry->count * sizeof(float));
    float *values = xmalloc(entry->count * sizeof(float));
    model_zero_grads(model);
    route_test_forward(model);
    model_backward(model, 1.0f);
    route_test_get(model, name, true, grad);
    route_test_get(model, name, false, values);
    size_t best = 0;
    for (size_t i = 0; i < entry->count; i++) {
        bool conv_tap_zero = entry->ndim == 3 && (i / entry->shape[2]) % entry->shape[1] == 0;
        if (!conv_tap_zero && fabsf(grad[i]) > fabsf(grad[best]))
            best = i;
    }
    const float original = values[best], step = 1e-2f;
    double loss[2];
    for (int side = 0; side < 2; side++) {
        values[best] = original + (side ? step : -step);
        route_test_set(model, name, values);
        loss[side] = route_test_forward(model);
    }
    values[best] = original;
    route_test_set(model, name, values);
    const double numeric = (loss[1] - loss[0]) / (2.0 * (double)step);
    const double analytic = grad[best];
    /* the loss is fp32 (noise ~1e-7 relative), so the difference resolves ~1e-5 */
    cr_assert(fabs(analytic) > 1e-3, "%s[%zu]: gradient %g is too small to check", name, best,
              analytic);
    cr_assert(fabs(numeric - analytic) <= 1e-2 * fabs(analytic),
              "%s[%zu]: analytic %.6g, finite difference %.6g", name, best, analytic, numeric);
    free(grad);
    free(values);
}

Test(model_route, finite_differences_match_the_routing_gradients_of_the_replace_form)
{
    ResidualConfig attnres = route_test_attnres(2, 1, FORM_REPLACE);
    Model *model = route_test_model(&attnres, 17);
    route_test_randomize_routing(model, 17);
    check_finite_difference(model, "model.layers.1.attn_route.query");
    check_finite_difference(model, "model.layers.0.mlp_route.key_norm");
    model_destroy(model);

    const int kernels[] = {1, 3};
    ResidualConfig msar = route_test_msar(2, 2, kernels, FORM_REPLACE);
    model = route_test_model(&msar, 18);
    route_test_randomize_routing(model, 18);
    check_finite_difference(model, "model.final_route.query");
    check_finite_difference(model, "model.layers.1.mlp_route.key_norm");
    check_finite_difference(model, "model.route_streams.1.conv");
    check_finite_difference(model, "model.layers.1.attn_route.mix_bias");
    check_finite_difference(model, "model.layers.0.mlp_route.mix_proj");
    model_destroy(model);
}

Test(model_route, finite_differences_match_the_routing_gradients_of_the_delta_form)
{
    ResidualConfig attnres = route_test_attnres(2, 0, FORM_DELTA);
    Model *model = route_test_model(&attnres, 19);
    route_test_randomize_routing(model, 19);
    check_finite_difference(model, "model.layers.1.attn_route.query");
    check_finite_difference(model, "model.final_route.key_norm");
    check_finite_difference(model, "model.layers.0.mlp_route.alpha");
    check_finite_difference(model, "model.route_null");
    model_destroy(model);

    const int kernels[] = {2, 3};
    ResidualConfig msar = route_test_msar(2, 2, kernels, FORM_DELTA);
    model = route_test_model(&msar, 20);
    route_test_randomize_routing(model, 20);
    check_finite_difference(model, "model.layers.1.attn_route.query");
    check_finite_difference(model, "model.final_route.key_norm");
    check_finite_difference(model, "model.final_route.alpha");
    check_finite_difference(model, "model.route_null");
    check_finite_difference(model, "model.route_streams.0.conv");
    check_finite_difference(model, "model.final_route.mix_bias");
    check_finite_difference(model, "model.final_route.mix_proj");
    model_destroy(model);
}
