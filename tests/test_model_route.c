/* tests/test_model_route.c — attention over depth in the model: parameter table, init,
 * the combinations the model refuses and gradient accumulation (DESIGN 2.1-2.3). Which
 * sources each site reads, and the probe accessors that report them, are in
 * tests/test_model_route_sites.c.
 *
 * The numbers come from tests/test_model_route_reference.c (the PyTorch fixtures) and from
 * the identities in tests/test_model_route_identities.c; these tests pin the layout and the
 * bookkeeping that those rely on.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/init.h"
#include "model/model.h"
#include "model/params.h"
#include "model/residual.h"
#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "tests/route_support.h"
#include "tests/support.h"

static const int kernels_1_2_4_8[] = {1, 2, 4, 8};

/* ---- the parameter table ---- */

static void expect_names(const ParamTable *table, const char *const *expected, int count)
{
    cr_assert_eq(table->n_params, count, "%d entries, %d expected", table->n_params, count);
    for (int p = 0; p < count; p++)
        cr_assert_str_eq(table->params[p].name, expected[p], "entry %d", p);
}

Test(model_route, attnres_sites_form_a_routing_unit_per_block_and_the_final_site_the_head)
{
    static const char *expected[] = {
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.final_route.query", "model.final_route.key_norm",
        "model.norm.weight", "lm_head.weight",
        /* the shared unit is empty in the replace form; then a routing unit per block */
        "model.layers.0.attn_route.query", "model.layers.0.attn_route.key_norm",
        "model.layers.0.mlp_route.query", "model.layers.0.mlp_route.key_norm",
        "model.layers.1.attn_route.query", "model.layers.1.attn_route.key_norm",
        "model.layers.1.mlp_route.query", "model.layers.1.mlp_route.key_norm",
    };
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_attnres(4, 1, FORM_REPLACE);
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    expect_names(&table, expected, (int)(sizeof expected / sizeof *expected));
    const ParamEntry *query = param_table_find(&table, "model.layers.1.mlp_route.query");
    cr_assert_eq(query->ndim, 1); /* [d] whatever the number of depth heads */
    cr_assert_eq(query->shape[0], 16);
    cr_assert_eq(table.n_units, 2 + 3 + 2);
    cr_assert_eq(query->unit, table.unit_routing_first + 1);
    cr_assert_eq(query->unit, param_unit_of_layer_routing(&table, 1));
    cr_assert_eq(param_table_find(&table, "model.final_route.key_norm")->unit, table.unit_head);
    param_table_free(&table);
}

Test(model_route, a_block_of_two_layers_has_one_routing_unit_for_its_four_sites)
{
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_attnres(4, 2, FORM_DELTA);
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    cr_assert_eq(table.layers_per_routing_unit, 2);
    const int unit = param_unit_of_layer_routing(&table, 0);
    cr_assert_eq(unit, param_unit_of_layer_routing(&table, 1));
    cr_assert_eq(table.units[unit].n_params, 4 * 3); /* query, key_norm, alpha a site */
    cr_assert_eq(param_table_find(&table, "model.layers.1.mlp_route.alpha")->unit, unit);
    param_table_free(&table);
}

Test(model_route, delta_form_adds_an_alpha_per_site_and_route_null_to_the_shared_unit)
{
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_attnres(2, 0, FORM_DELTA);
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    const ParamEntry *null = param_table_require(&table, "model.route_null");
    cr_assert_eq(null->unit, table.unit_shared);
    cr_assert_eq(table.units[table.unit_shared].n_params, 1);
    cr_assert_eq(null->shape[0], 16);
    const ParamEntry *query = param_table_require(&table, "model.layers.0.attn_route.query");
    cr_assert_str_eq(query[1].name, "model.layers.0.attn_route.key_norm");
    cr_assert_str_eq(query[2].name, "model.layers.0.attn_route.alpha");
    cr_assert_str_eq(query[3].name, "model.layers.0.mlp_route.query");
    cr_assert_eq(query[2].unit, param_unit_of_layer_routing(&table, 0));
    const ParamEntry *alpha = param_table_find(&table, "model.final_route.alpha");
    cr_assert_eq(alpha->ndim, 1);
    cr_assert_eq(alpha->count, 1);
    cr_assert_eq(alpha->unit, table.unit_head);
    cr_assert_null(param_table_find(&table, "model.final_route.mix_bias"));
    param_table_free(&table);
}

Test(model_route, msar_sites_have_per_stream_queries_mix_weights_and_one_conv_per_slot)
{
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_msar(2, 4, kernels_1_2_4_8, FORM_REPLACE);
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    /* layers_per_block 1: S = 2, n_blocks = 2, slots b_0..b_2 */
    const ParamUnit *shared = &table.units[table.unit_shared];
    cr_assert_eq(shared->n_params, 3);
    for (int slot = 0; slot < 3; slot++) {
        const ParamEntry *conv = &table.params[shared->first_param + slot];
        char name[64];
        snprintf(name, sizeof name, "model.route_streams.%d.conv", slot);
        cr_assert_str_eq(conv->name, name);
        cr_assert_eq(conv->ndim, 3);
        cr_assert(conv->shape[0] == 4 && conv->shape[1] == 8 && conv->shape[2] == 16);
        cr_assert_eq(conv->count, 4 * 8 * 16);
        cr_assert_eq(conv->unit, table.unit_shared);
        cr_assert_eq(conv->kind, PARAM_ROUTING);
    }
    cr_assert_null(param_table_find(&table, "model.route_streams.3.conv"));
    static const char *site[] = {"query", "key_norm", "mix_bias", "mix_proj"};
    static const int rows[] = {4, 4, 4, 4}, cols[] = {16, 16, 1, 16};
    const ParamEntry *first = param_table_find(&table, "model.layers.1.attn_route.query");
    for (int k = 0; k < 4; k++) {
        const ParamEntry *entry = first + k;
        char name[64];
        snprintf(name, sizeof name, "model.layers.1.attn_route.%s", site[k]);
        cr_assert_str_eq(entry->name, name);
        cr_assert(entry->shape[0] == rows[k] && entry->shape[1] == cols[k], "%s", name);
        cr_assert_eq(entry->unit, param_unit_of_layer_routing(&table, 1));
    }
    cr_assert_str_eq(first[4].name, "model.layers.1.mlp_route.query");
    cr_assert_null(param_table_find(&table, "model.route_null"));
    param_table_free(&table);
}

Test(model_route, msar_with_one_stream_has_no_mix_weights_but_keeps_m_by_d_queries)
{
    ModelConfig config = route_test_model_config();
    const int kernel[] = {3};
    ResidualConfig residual = route_test_msar(1, 1, kernel, FORM_DELTA);
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    cr_assert_null(param_table_find(&table, "model.final_route.mix_bias"));
    cr_assert_null(param_table_find(&table, "model.final_route.mix_proj"));
    const ParamEntry *query = param_table_find(&table, "model.final_route.query");
    cr_assert(query->ndim == 2 && query->shape[0] == 1 && query->shape[1] == 16);
    const ParamEntry *conv = param_table_find(&table, "model.route_streams.0.conv");
    cr_assert(conv->shape[0] == 1 && conv->shape[1] == 3 && conv->shape[2] == 16);
    cr_assert_not_null(param_table_find(&table, "model.route_null"));
    param_table_free(&table);
}

/* The next tensor starts at the first multiple of PARAM_ALIGNMENT from `end`. */
static size_t aligned_start(size_t end)
{
    return (end + PARAM_ALIGNMENT - 1) / PARAM_ALIGNMENT * PARAM_ALIGNMENT;
}

Test(model_route, every_routing_weight_is_routing_kind_and_units_stay_contiguous)
{
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_msar(2, 2, kernels_1_2_4_8, FORM_DELTA);
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    size_t next = 0;
    int routing = 0;
    for (int u = 0; u < table.n_units; u++) {
        const ParamUnit *unit = &table.units[u];
        cr_assert_eq(unit->offset, aligned_start(next), "unit %d", u);
        size_t inside = unit->offset;
        for (int p = unit->first_param; p < unit->first_param + unit->n_params; p++) {
            const ParamEntry *entry = &table.params[p];
            cr_assert_eq(entry->unit, u, "%s", entry->name);
            cr_assert_eq(entry->offset, aligned_start(inside), "%s", entry->name);
            inside = entry->offset + entry->count;
            bool route = strstr(entry->name, "route") != NULL;
            cr_assert_eq(route, entry->kind == PARAM_ROUTING, "%s", entry->name);
            routing += route;
        }
        next = inside;
    }
    cr_assert_eq(next, table.total);
    /* 5 sites x (query, key_norm, alpha, mix_bias, mix_proj) + null + 3 convs */
    cr_assert_eq(routing, 5 * 5 + 1 + 3);
    param_table_free(&table);
}

/* A [1] alpha in front of a layer's weights must not shift them off the 16-byte boundary
 * the compute copy's bf16 matmul and vector paths need (docs/performance.md, 2026-12-01). */
Test(model_route, every_tensor_of_the_delta_form_starts_on_an_aligned_element)
{
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_msar(2, 2, kernels_1_2_4_8, FORM_DELTA);
    residual.mode = RESIDUAL_ATTNRES;
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    cr_assert_not_null(param_table_find(&table, "model.layers.0.attn_route.alpha"));
    for (int p = 0; p < table.n_params; p++)
        cr_assert_eq(table.params[p].offset % PARAM_ALIGNMENT, 0, "%s at %zu",
                     table.params[p].name, table.params[p].offset);
    param_table_free(&table);
}

Test(model_route, standard_mode_ignores_the_other_residual_keys)
{
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_msar(3, 2, kernels_1_2_4_8, FORM_DELTA);
    residual.mode = RESIDUAL_STANDARD; /* heads 3 does not divide d: not read */
    ParamTable plain, routed;
    param_table_build(&plain, &config);
    param_table_build_with_residual(&routed, &config, &residual);
    cr_assert_eq(plain.n_params, routed.n_params);
    cr_assert_eq(plain.total, routed.total);
    for (int p = 0; p < plain.n_params; p++)
        cr_assert_str_eq(plain.params[p].name, routed.params[p].name);
    param_table_free(&plain);
    param_table_free(&routed);
}

/* ---- init ---- */

static void expect_all(Model *model, const char *name, float value)
{
    size_t count = route_test_count(model, name);
    float *values = xmalloc(count * sizeof *values);
    route_test_get(model, name, false, values);
    for (size_t i = 0; i < count; i++)
        cr_assert_eq(values[i], value, "%s[%zu] = %g, not %g", name, i, values[i], value);
    free(values);
}

Test(model_route, init_sets_query_zero_key_norm_one_alpha_zero_and_null_zero)
{
    ResidualConfig residual = route_test_attnres(2, 1, FORM_DELTA);
    Model *model = route_test_model(&residual, 5);
    expect_all(model, "model.layers.0.attn_route.query", 0.0f);
    expect_all(model, "model.layers.1.mlp_route.key_norm", 1.0f);
    expect_all(model, "model.final_route.alpha", 0.0f);
    expect_all(model, "model.route_null", 0.0f);
    model_destroy(model);
}

Test(model_route, init_sets_conv_tap_zero_one_mix_bias_minus_log_m_minus_1_mix_proj_zero)
{
    ResidualConfig residual = route_test_msar(2, 4, kernels_1_2_4_8, FORM_REPLACE);
    Model *model = route_test_model(&residual, 5);
    expect_all(model, "model.layers.0.mlp_route.mix_bias", (float)-log(3.0));
    expect_all(model, "model.final_route.mix_proj", 0.0f);
    expect_all(model, "model.final_route.query", 0.0f);
    expect_all(model, "model.final_route.key_norm", 1.0f);
    float conv[4 * 8 * 16];
    route_test_get(model, "model.route_streams.2.conv", false, conv);
    for (int r = 0; r < 4; r++)
        for (int tau = 0; tau < 8; tau++)
            for (int c = 0; c < 16; c++)
                cr_assert_eq(conv[(r * 8 + tau) * 16 + c], tau == 0 ? 1.0f : 0.0f,
                             "stream %d tap %d channel %d", r, tau, c);
    model_destroy(model);
}

Test(model_route, init_of_a_conv_row_slice_equals_that_slice_of_the_whole_tensor)
{
    ModelConfig config = route_test_model_config();
    ResidualConfig residual = route_test_msar(2, 4, kernels_1_2_4_8, FORM_REPLACE);
    ParamTable table;
    param_table_build_with_residual(&table, &config, &residual);
    const ParamEntry *conv = param_table_find(&table, "model.route_streams.1.conv");
    float *whole = xmalloc(conv->count * sizeof *whole);
    init_fill_param(whole, conv, 3, 0.1);
    const size_t first = 8 * 16 + 5, n = 300; /* starts inside stream 1, tap 0 */
    float slice[300];
    init_fill_param_range(slice, conv, first, n, 3, 0.1);
    cr_assert_eq(memcmp(slice, whole + first, sizeof slice), 0);
    free(whole);
    param_table_free(&table);
}

/* ---- combinations the model refuses ---- */

static void create_with_three_depth_heads(void *unused)
{
    (void)unused;
    ResidualConfig residual = route_test_attnres(3, 1, FORM_REPLACE);
    route_test_model(&residual, 1);
}

Test(model_route, depth_heads_that_do_not_divide_the_width_are_a_config_error)
{
    test_expect_fatal(create_with_three_depth_heads, NULL, EXIT_CONFIG,
                      "residual.heads = 3 must divide model.d_model = 16");
}

static void create_msar_with_four_kernels_for_two_streams(void *unused)
{
    (void)unused;
    ResidualConfig residual = route_test_msar(2, 2, kernels_1_2_4_8, FORM_REPLACE);
    residual.n_stream_kernels = 4;
    route_test_model(&residual, 1);
}

Test(model_route, msar_with_a_kernel_list_not_one_per_stream_is_a_config_error)
{
    test_expect_fatal(create_msar_with_four_kernels_for_two_streams, NULL, EXIT_CONFIG,
                      "residual.stream_kernels has 4 entries; residual.streams = 2 needs one "
                      "kernel size per stream");
}

/* Every combination of mode x granularity x form x heads x streams that the config accepts
 * builds, and runs forward and backward to finite numbers; the config text goes through
 * the same loader as a run's. */
Test(model_route, every_combination_the_config_accepts_runs_to_finite_gradients)
{
    static const char *modes[] = {"attnres", "msar"}, *forms[] = {"replace", "delta"};
    static const char *granularities[] = {"full", "block", "block"};
    static const int layers_per_block[] = {1, 1, 2}, heads[] = {1, 2, 4};
    static const char *streams[] = {"streams: 1, stream_kernels: [3]",
                                    "streams: 3, stream_kernels: [1, 2, 5]"};
    int built = 0;
    for (int mode = 0; mode < 2; mode++)
        for (int g = 0; g < 3; g++)
            for (int form = 0; form < 2; form++)
                for (int h = 0; h < 3; h++)
                    for (int m = 0; m < (mode == 1 ? 2 : 1); m++) {
                        char yaml[1024];
                        snprintf(yaml, sizeof yaml,
                                 "model: {vocab_size: 32, d_model: 16, n_layers: 3, n_heads: 2, "
                                 "n_kv_heads: 1, head_dim: 8, ffn_dim: 24}\n"
                                 "residual: {mode: %s, granularity: %s, layers_per_block: %d, "
                                 "form: %s, heads: %d, %s}\n",
                                 modes[mode], granularities[g], layers_per_block[g],
                                 forms[form], heads[h], mode == 1 ? streams[m] : "streams: 1");
                        Config config;
                        config_load_text(&config, yaml, "combination", NULL, 0, 1);
                        Model *model = model_create(
                            backend_cpu(), &config.model, &config.residual, ROUTE_TEST_B,
                            ROUTE_TEST_T);
                        model_init_params(model, 21, 0.1);
                        route_test_randomize_routing(model, 21);
                        double loss = route_test_forward(model);
                        model_backward(model, 1.0f);
                        const ParamTable *table = model_param_table(model);
                        float *grads = xmalloc(table->total * sizeof(float));
                        backend_cpu()->download(grads, model_grads(model),
                                                table->total * sizeof(float));
                        cr_assert(isfinite(loss) && test_all_finite(grads, table->total),
                                  "%s", yaml);
                        free(grads);
                        model_destroy(model);
                        built++;
                    }
    cr_assert_eq(built, 3 * 2 * 3 + 3 * 2 * 3 * 2);
}

/* ---- gradient accumulation ---- */

Test(model_route, backward_twice_doubles_the_routing_gradients)
{
    ResidualConfig residual = route_test_msar(2, 2, kernels_1_2_4_8, FORM_DELTA);
    Model *model = route_test_model(&residual, 6);
    route_test_randomize_routing(model, 6);
    route_test_forward(model);
    const ParamTable *table = model_param_table(model);
    const size_t bytes = table->total * sizeof(float);
    float *once = xmalloc(bytes), *twice = xmalloc(bytes);
    model_backward(model, 1.0f);
    backend_cpu()->download(once, model_grads(model), bytes);
    model_backward(model, 1.0f);
    backend_cpu()->download(twice, model_grads(model), bytes);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        if (entry->kind != PARAM_ROUTING)
            continue;
        float *doubled = once + entry->offset;
        for (size_t i = 0; i < entry->count; i++)
            doubled[i] *= 2;
        /* a gradient summed over several sites is re-summed in another order */
        double error = test_relative_error(twice + entry->offset, doubled, entry->count);
        cr_assert(error <= 1e-6, "%s: twice vs 2 x once, relative error %.3g", entry->name,
                  error);
    }
    free(once);
    free(twice);
    model_destroy(model);
}

/* Both walks: the two-phase one (logits and gradients), and every site alone, whose stash
 * keeps the depth weights (model_route_sites_alone). */
Test(model_route, a_batch_smaller_than_max_batch_routes_as_a_model_sized_for_it)
{
    const int kernels[] = {2, 3};
    ResidualConfig residual = route_test_msar(2, 2, kernels, FORM_DELTA);
    ModelConfig config = route_test_model_config();
    for (int alone = 0; alone <= 1; alone++) {
        Model *large = model_create(backend_cpu(), &config, &residual, 3, ROUTE_TEST_T);
        Model *exact = model_create(backend_cpu(), &config, &residual, 1, ROUTE_TEST_T);
        Model *models[2] = {large, exact};
        uint32_t inputs[ROUTE_TEST_ROWS], targets[ROUTE_TEST_ROWS];
        route_test_tokens(inputs, targets);
        float *grads[2];
        const size_t total = model_param_table(large)->total;
        for (int k = 0; k < 2; k++) {
            model_route_sites_alone(models[k], alone);
            model_init_params(models[k], 8, 0.1);
            route_test_randomize_routing(models[k], 8);
            model_forward(models[k], inputs, targets, 1, 0.0f);
            model_backward(models[k], 1.0f);
            grads[k] = xmalloc(total * sizeof(float));
            backend_cpu()->download(grads[k], model_grads(models[k]), total * sizeof(float));
        }
        cr_assert(test_logits_bitwise_equal(large, exact), "alone %d", alone);
        cr_assert_eq(memcmp(grads[0], grads[1], total * sizeof(float)), 0, "alone %d", alone);
        if (alone) { /* the final site's depth weights, stream 1 */
            const int last = model_site_count(large) - 1;
            const size_t count = (size_t)model_site_sources(large, last) * ROUTE_TEST_T * 2;
            float *a = xmalloc(count * sizeof(float)), *b = xmalloc(count * sizeof(float));
            model_site_weights(large, last, 1, a);
            model_site_weights(exact, last, 1, b);
            cr_assert_eq(memcmp(a, b, count * sizeof(float)), 0);
            free(a);
            free(b);
        }
        free(grads[0]);
        free(grads[1]);
        model_destroy(large);
        model_destroy(exact);
    }
}
