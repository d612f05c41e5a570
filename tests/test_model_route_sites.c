/* tests/test_model_route_sites.c — the routing sites of attention over depth (DESIGN 2.1,
 * 2.2): which sources each site reads, as the residual plan lays them out for every
 * granularity and form, and the probe accessors that report a model's sites (names, source
 * counts, inputs and depth weights) and refuse what they cannot answer.
 *
 * The parameter table, init, the combinations the model refuses and gradient accumulation are
 * in tests/test_model_route.c; the numbers these sources feed are checked in
 * tests/test_model_route_reference.c and tests/test_model_route_identities.c.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/residual.h"
#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "tests/route_support.h"
#include "tests/support.h"

/* ---- the source bookkeeping ---- */

Test(model_route, full_granularity_site_j_reads_e_and_every_earlier_sublayer_output)
{
    ModelConfig config = route_test_model_config();
    config.n_layers = 3;
    ResidualConfig residual = route_test_attnres(1, 0, FORM_REPLACE);
    ResidualPlan plan;
    residual_plan_build(&plan, &config, &residual);
    cr_assert_eq(plan.n_blocks, 6);
    cr_assert_eq(plan.n_sites, 7);
    for (int j = 0; j < 6; j++) {
        /* a block of one sublayer: f_j is written into its own buffer j + 1, never added */
        cr_assert(residual_sublayer_starts_block(&plan, j));
        cr_assert_eq(plan.sublayer_buffer[j], j + 1);
    }
    for (int j = 0; j <= 6; j++) {
        const SitePlan *site = &plan.sites[j];
        cr_assert_eq(site->n_sources, j + 1, "site %d", j);
        for (int k = 0; k <= j; k++) /* e = buffer 0, then f_0 .. f_{j-1} */
            cr_assert_eq(site->sources[k].buffer, k, "site %d source %d", j, k);
    }
    residual_plan_free(&plan);
}

Test(model_route, block_replace_sites_read_the_completed_blocks_then_the_partial)
{
    ModelConfig config = route_test_model_config();
    config.n_layers = 3;
    ResidualConfig residual = route_test_attnres(2, 2, FORM_REPLACE); /* S = 4, 2 blocks */
    ResidualPlan plan;
    residual_plan_build(&plan, &config, &residual);
    cr_assert_eq(plan.n_blocks, 2);
    cr_assert_eq(plan.block_buffer[1], 4);   /* b_1 = partial after sublayer 3 */
    cr_assert_eq(plan.block_buffer[2], 6);   /* b_2, short: sublayers 4, 5 */
    /* {buffers read} per site, and the block each source's gradient feeds */
    static const int expected[7][4] = {
        {0, -9}, {0, 1, -9}, {0, 2, -9}, {0, 3, -9}, {0, 4, -9}, {0, 4, 5, -9}, {0, 4, 6, -9}};
    static const int grad_block[7][3] = {
        {0}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1, 2}, {0, 1, 2}};
    for (int j = 0; j <= 6; j++) {
        const SitePlan *site = &plan.sites[j];
        int n = 0;
        while (expected[j][n] != -9)
            n++;
        cr_assert_eq(site->n_sources, n, "site %d reads %d sources", j, site->n_sources);
        for (int k = 0; k < n; k++) {
            cr_assert_eq(site->sources[k].buffer, expected[j][k], "site %d source %d", j, k);
            cr_assert_eq(site->sources[k].grad_block, grad_block[j][k], "site %d source %d",
                         j, k);
        }
    }
    cr_assert_str_eq(plan.sites[5].name, "model.layers.2.mlp_route");
    cr_assert_str_eq(plan.sites[6].name, "model.final_route");
    residual_plan_free(&plan);
}

Test(model_route, block_delta_sites_read_null_then_completed_blocks_and_no_partial)
{
    ModelConfig config = route_test_model_config();
    config.n_layers = 3;
    const int kernels[] = {1, 2};
    ResidualConfig residual = route_test_msar(2, 2, kernels, FORM_DELTA); /* S = 2 */
    ResidualPlan plan;
    residual_plan_build(&plan, &config, &residual);
    cr_assert_eq(plan.n_blocks, 3);
    cr_assert_eq(plan.n_slots, 4);
    cr_assert_eq(plan.n_buffers, 4); /* e and one buffer per block, added into in place */
    for (int j = 0; j <= 6; j++) {
        const SitePlan *site = &plan.sites[j];
        const int completed = j / 2 + 1; /* b_0 .. b_{n-1}; the final site: all 4 */
        cr_assert_eq(site->n_sources, 1 + completed, "site %d", j);
        cr_assert_eq(site->sources[0].buffer, RESIDUAL_NULL_BUFFER);
        cr_assert_eq(site->sources[0].slot, RESIDUAL_NO_SLOT);
        for (int k = 1; k <= completed; k++) {
            cr_assert_eq(site->sources[k].buffer, plan.block_buffer[k - 1]);
            cr_assert_eq(site->sources[k].slot, k - 1);
        }
    }
    residual_plan_free(&plan);
}

Test(model_route, msar_partial_is_expanded_by_its_own_blocks_stream_slot)
{
    ModelConfig config = route_test_model_config();
    const int kernels[] = {1, 2};
    ResidualConfig residual = route_test_msar(2, 2, kernels, FORM_REPLACE);
    ResidualPlan plan;
    residual_plan_build(&plan, &config, &residual);
    const SitePlan *site = &plan.sites[3]; /* layer 1's MLP: block 2, position 1 */
    cr_assert_eq(site->n_sources, 3);
    cr_assert_eq(site->sources[2].buffer, 3); /* the partial after sublayer 2 */
    cr_assert_eq(site->sources[2].slot, 2);
    cr_assert_eq(site->sources[2].grad_block, 2);
    residual_plan_free(&plan);
}

/* ---- the probe accessors ---- */

Test(model_route, site_names_and_source_counts_follow_the_residual_plan)
{
    ResidualConfig residual = route_test_attnres(2, 1, FORM_DELTA);
    Model *model = route_test_model(&residual, 2);
    cr_assert_eq(model_site_count(model), 5);
    cr_assert_str_eq(model_site_name(model, 0), "model.layers.0.attn_route");
    cr_assert_str_eq(model_site_name(model, 3), "model.layers.1.mlp_route");
    cr_assert_str_eq(model_site_name(model, 4), "model.final_route");
    static const int sources[] = {2, 2, 3, 3, 4}; /* null + completed blocks */
    for (int j = 0; j < 5; j++)
        cr_assert_eq(model_site_sources(model, j), sources[j], "site %d", j);
    model_destroy(model);
}

Test(model_route, site_depth_weights_are_a_softmax_over_the_sources_per_token_and_head)
{
    const int kernels[] = {1, 3};
    ResidualConfig residual = route_test_msar(2, 2, kernels, FORM_REPLACE);
    Model *model = route_test_model(&residual, 3);
    model_route_sites_alone(model, true); /* the two-phase walk keeps msar's in the scratch */
    route_test_randomize_routing(model, 3);
    route_test_forward(model);
    const int H = model_site_heads(model), site = 4, N = model_site_sources(model, site);
    float *weights = xmalloc((size_t)N * ROUTE_TEST_ROWS * H * sizeof *weights);
    for (int r = 0; r < model_site_streams(model); r++) {
        model_site_weights(model, site, r, weights);
        for (int t = 0; t < ROUTE_TEST_ROWS; t++)
            for (int h = 0; h < H; h++) {
                double sum = 0;
                for (int n = 0; n < N; n++)
                    sum += weights[((size_t)n * ROUTE_TEST_ROWS + t) * H + h];
                cr_assert(fabs(sum - 1.0) < 1e-6, "stream %d token %d head %d: sum %g", r, t,
                          h, sum);
            }
    }
    free(weights);
    model_destroy(model);
}

Test(model_route, the_first_site_reads_the_embedding)
{
    ResidualConfig residual = route_test_attnres(1, 1, FORM_REPLACE);
    Model *model = route_test_model(&residual, 4);
    route_test_forward(model);
    const Activation *sources[1];
    model_site_inputs(model, 0, sources);
    float e[ROUTE_TEST_ROWS * 16], table[32 * 16];
    backend_cpu()->download(e, sources[0], sizeof e);
    route_test_get(model, "model.embed_tokens.weight", false, table);
    uint32_t inputs[ROUTE_TEST_ROWS], targets[ROUTE_TEST_ROWS];
    route_test_tokens(inputs, targets);
    for (int t = 0; t < ROUTE_TEST_ROWS; t++)
        cr_assert_eq(memcmp(e + t * 16, table + inputs[t] * 16, 16 * sizeof(float)), 0);
    model_destroy(model);
}

static void name_site_five(void *unused)
{
    (void)unused;
    ResidualConfig residual = route_test_attnres(1, 1, FORM_REPLACE);
    Model *model = route_test_model(&residual, 4);
    model_site_name(model, 5);
}

Test(model_route, a_site_out_of_range_is_a_config_error)
{
    test_expect_fatal(name_site_five, NULL, EXIT_CONFIG, "routing site 5 does not exist");
}

static void read_site_weights_before_a_forward(void *unused)
{
    (void)unused;
    ResidualConfig residual = route_test_attnres(1, 1, FORM_REPLACE);
    Model *model = route_test_model(&residual, 4);
    float weights[64];
    model_site_weights(model, 0, 0, weights);
}

Test(model_route, reading_site_weights_before_a_forward_is_a_config_error)
{
    test_expect_fatal(read_site_weights_before_a_forward, NULL, EXIT_CONFIG,
                      "model_site_weights needs a model_forward first");
}
