/* tests/test_model_two_phase.c — the two-phase walk (model/route_block.h) against the
 * per-site reference (model_route_sites_alone), on the cpu backend: the delta form of
 * attnres and msar, msar's replace form, and attnres's replace form (in two phases by
 * default; FATHOM_ROUTE_REPLACE=per_site routes it a site at a time instead).
 *
 * Both run the same network from the same weights and batch: one routes a block's sites
 * together (attnres: route_block_forward / route_block_backward; msar: each stream's
 * sources convolved once a block, the block's sites routed over them at once, each site's
 * streams mixed in its turn; the replace form merges each site's partial into its streams
 * from phase one's lse), the other each site alone (route_site.h). The math is the same;
 * only the order of some fp32 sums differs (and a merge rounds phase one's result and lse
 * to float), so logits agree to 1e-6 and every
 * gradient, base and routing, to 1e-4 relative (the bound of the float64 fixtures; a
 * scalar such as alpha's gradient, a sum over every token, reaches 2e-5). A site whose share
 * went to another site, stream or source is off by order 1.
 *
 * The cases cover N (1 to 4 sources with the null), S (blocks of 1 and 2 layers, a short
 * last block of 3 layers, a block of 4 sites after 2 completed sources), H (1, 2, 4), d (16,
 * 24: not a multiple of 16), m (1 to 3) and kernel sizes (1 to 5 over sequences of 6
 * tokens), with and without checkpointing.
 *
 * msar's sites walked in two phases keep no depth weights in the stash (the walk's backward
 * makes phase one again, so they live in the scratch for the open block): the stash is
 * smaller by exactly those, and reading them is refused by name. attnres's keep their
 * weights and one rstd region a block: the stash is smaller by the rows its sites share.
 */
#include "model/activations.h"
#include "model/model.h"
#include "model/params.h"
#include "model/residual.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/route_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

typedef struct {
    const char *label;
    ResidualMode mode;
    int heads, layers_per_block, d, streams;
    int kernels[4];
    bool checkpointing;
    bool replace; /* the replace form (attnres's under FATHOM_ROUTE_REPLACE=two_phase) */
} TwoPhaseCase;

/* The head's logits in chunks of `logit_rows` rows over a vocabulary of `vocab`; 0: the
 * defaults (one chunk, route_test_model_config's vocabulary). */
typedef struct {
    int logit_rows, vocab;
} HeadShape;

static Model *case_model(const TwoPhaseCase *c, int n_layers, const HeadShape *head,
                         bool alone)
{
    ModelConfig config = route_test_model_config();
    config.n_layers = n_layers;
    config.d_model = c->d;
    config.n_heads = c->d / config.head_dim;
    if (head->vocab)
        config.vocab_size = head->vocab;
    ResidualConfig residual = c->mode == RESIDUAL_MSAR
                                  ? route_test_msar(c->heads, c->streams, c->kernels,
                                                    c->replace ? FORM_REPLACE : FORM_DELTA)
                                  : route_test_attnres(c->heads, 1,
                                                       c->replace ? FORM_REPLACE : FORM_DELTA);
    residual.layers_per_block = c->layers_per_block;
    Model *model = model_create(backend_cpu(), &config, &residual, ROUTE_TEST_B, ROUTE_TEST_T);
    model_init_params(model, 61, config.init_std);
    route_test_randomize_routing(model, 61);
    model_set_activation_checkpointing(model, c->checkpointing);
    if (head->logit_rows) {
        model_set_logit_rows(model, head->logit_rows);
        model_keep_all_logits(model); /* for the comparison of the logits */
    }
    model_route_sites_alone(model, alone);
    model_zero_grads(model);
    route_test_forward(model);
    model_backward(model, 1.0f);
    return model;
}

static void check_case_shape(const TwoPhaseCase *c, int n_layers, const HeadShape *head)
{
    Model *two_phase = case_model(c, n_layers, head, false);
    Model *alone = case_model(c, n_layers, head, true);
    const size_t logit_count = (size_t)ROUTE_TEST_ROWS * model_config(alone)->vocab_size;
    float *expected = route_test_logits(alone), *got = route_test_logits(two_phase);
    const double logit_error = test_relative_error(got, expected, logit_count);
    cr_expect_leq(logit_error, 1e-6, "%s: logits relative error %.3g", c->label, logit_error);
    free(expected);
    free(got);

    const ParamTable *table = model_param_table(alone);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        expected = xmalloc(entry->count * sizeof *expected);
        got = xmalloc(entry->count * sizeof *got);
        route_test_get(alone, entry->name, true, expected);
        route_test_get(two_phase, entry->name, true, got);
        double largest = 0;
        for (size_t i = 0; i < entry->count; i++)
            largest = fmax(largest, fabs(expected[i]));
        const double error = test_relative_error(got, expected, entry->count);
        /* a gradient exactly zero in the reference (taps beyond k_r) must stay zero */
        if (largest == 0)
            for (size_t i = 0; i < entry->count; i++)
                cr_expect_eq(got[i], 0.0f, "%s: %s[%zu] = %g where the per-site walk has 0",
                             c->label, entry->name, i, got[i]);
        else
            cr_expect_leq(error, 1e-4, "%s: %s gradient relative error %.3g", c->label,
                          entry->name, error);
        free(expected);
        free(got);
    }
    model_destroy(two_phase);
    model_destroy(alone);
}

static void check_case(const TwoPhaseCase *c)
{
    check_case_shape(c, 3, &(HeadShape){0, 0});
}

Test(model_two_phase, attnres_delta_blocks_route_as_each_site_alone)
{
    const TwoPhaseCase cases[] = {
        {"attnres H 1, blocks of 1 layer", RESIDUAL_ATTNRES, 1, 1, 16, 1, {1}, false, false},
        {"mhar H 4, blocks of 2 layers (one short), d 24", RESIDUAL_ATTNRES, 4, 2, 24, 1, {1},
         false, false},
        {"mhar H 2, blocks of 2 layers, checkpointed", RESIDUAL_ATTNRES, 2, 2, 16, 1, {1}, true,
         false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_case(&cases[k]);
}

/* MSAR's final site is a block of its own in the two-phase walk (attnres's routes alone), and
 * its block rows lie inside the logits' gradient buffer as far as they fit, where the head
 * keeps its spare chunk of logits: its phase one comes before the head's forward, its
 * backward after the head's, and its d x (block_grads[0]) is written by the head's final
 * norm backward, after the last chunk. Here the logits come in three chunks and a row of
 * them holds 16 block rows, so the two share the buffer. */
Test(model_two_phase, the_final_site_in_two_phases_beside_the_heads_chunks_of_logits)
{
    const TwoPhaseCase cases[] = {
        {"mhar delta H 2", RESIDUAL_ATTNRES, 2, 2, 16, 1, {1}, false, false},
        {"mhar replace H 2", RESIDUAL_ATTNRES, 2, 1, 16, 1, {1}, false, true},
        {"msar delta m 2", RESIDUAL_MSAR, 2, 1, 16, 2, {2, 1}, false, false},
        {"msar replace m 2", RESIDUAL_MSAR, 2, 2, 16, 2, {1, 3}, false, true},
        {"msar replace m 1, checkpointed", RESIDUAL_MSAR, 2, 1, 16, 1, {2}, true, true},
    };
    const HeadShape head = {5, 256};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_case_shape(&cases[k], 3, &head);
}

/* attnres's replace form in two phases (FATHOM_ROUTE_REPLACE=two_phase, model/route_block.c):
 * each site merges its partial in its turn; the backward reads x and the stash, no phase one
 * again (with checkpointing, the recompute's). */
Test(model_two_phase, attnres_replace_blocks_merge_the_partial_as_each_site_alone)
{
    setenv("FATHOM_ROUTE_REPLACE", "two_phase", 1);
    const TwoPhaseCase cases[] = {
        {"attnres replace H 1, blocks of 1 layer", RESIDUAL_ATTNRES, 1, 1, 16, 1, {1}, false,
         true},
        {"mhar replace H 4, blocks of 2 layers (one short), d 24", RESIDUAL_ATTNRES, 4, 2, 24,
         1, {1}, false, true},
        {"mhar replace H 2, blocks of 2 layers, checkpointed", RESIDUAL_ATTNRES, 2, 2, 16, 1,
         {1}, true, true},
        {"mhar replace H 4, blocks of 1 layer, checkpointed", RESIDUAL_ATTNRES, 4, 1, 24, 1,
         {1}, true, true},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_case(&cases[k]);
    /* 4 layers: a block of 4 sites over 2 completed sources, each later site's partial in a
     * row of the block's rstd region past the sources' (residual_site_rstd_rows) */
    const TwoPhaseCase four_sites = {"mhar replace H 2, 4 layers in blocks of 2",
                                     RESIDUAL_ATTNRES, 2, 2, 16, 1, {1}, false, true};
    check_case_shape(&four_sites, 4, &(HeadShape){0, 0});
}

Test(model_two_phase, msar_delta_blocks_route_stream_by_stream_as_each_site_alone)
{
    const TwoPhaseCase cases[] = {
        {"msar m 1 (k 3), H 2, blocks of 1 layer", RESIDUAL_MSAR, 2, 1, 16, 1, {3}, false,
         false},
        {"msar m 2 (k 1 3), H 1, blocks of 2 layers (one short), d 24", RESIDUAL_MSAR, 1, 2, 24,
         2, {1, 3}, false, false},
        {"msar m 3 (k 2 1 5), H 4, blocks of 2 layers", RESIDUAL_MSAR, 4, 2, 16, 3, {2, 1, 5},
         false, false},
        {"msar m 3 (k 4 1 2), H 2, blocks of 1 layer, checkpointed", RESIDUAL_MSAR, 2, 1, 24, 3,
         {4, 1, 2}, true, false},
        {"msar m 2 (k 2 5), H 4, blocks of 2 layers, checkpointed", RESIDUAL_MSAR, 4, 2, 16, 2,
         {2, 5}, true, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_case(&cases[k]);
}

/* The replace form: sites after a block's first read the block's partial, merged into each
 * stream in the site's turn; m 1 is x = o_0 without a mix. */
Test(model_two_phase, msar_replace_blocks_merge_the_partial_as_each_site_alone)
{
    const TwoPhaseCase cases[] = {
        {"msar replace m 1 (k 3), H 2, blocks of 1 layer", RESIDUAL_MSAR, 2, 1, 16, 1, {3},
         false, true},
        {"msar replace m 2 (k 1 3), H 1, blocks of 2 layers (one short), d 24", RESIDUAL_MSAR,
         1, 2, 24, 2, {1, 3}, false, true},
        {"msar replace m 3 (k 2 1 5), H 4, blocks of 2 layers", RESIDUAL_MSAR, 4, 2, 16, 3,
         {2, 1, 5}, false, true},
        {"msar replace m 3 (k 4 1 2), H 2, blocks of 1 layer, checkpointed", RESIDUAL_MSAR, 2,
         1, 24, 3, {4, 1, 2}, true, true},
        {"msar replace m 2 (k 2 5), H 4, blocks of 2 layers, checkpointed", RESIDUAL_MSAR, 4, 2,
         16, 2, {2, 5}, true, true},
        {"msar replace m 1 (k 2), H 4, blocks of 2 layers, checkpointed", RESIDUAL_MSAR, 4, 2,
         16, 1, {2}, true, true},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_case(&cases[k]);
}

/* Bytes the whole network's stash takes for ROUTE_TEST_B x ROUTE_TEST_T tokens, with msar's
 * block sites walked in two phases or each alone. */
static size_t whole_stash_bytes(const ModelConfig *config, const ResidualConfig *residual,
                                bool alone)
{
    ResidualPlan plan;
    residual_plan_build(&plan, config, residual);
    plan.sites_alone = alone;
    const StashShape whole = {0, plan.n_sublayers, true, true, false};
    const size_t bytes =
        stash_bytes(backend_cpu(), config, &plan, ROUTE_TEST_B, ROUTE_TEST_T, whole);
    residual_plan_free(&plan);
    return bytes;
}

/* The replace form's block sites keep no x_j either: its backward makes it again
 * (residual_site_keeps_input). */
Test(model_two_phase, msar_block_sites_keep_no_depth_weights_in_the_stash_and_replace_no_x)
{
    const int kernels[] = {2, 1, 3};
    ModelConfig config = route_test_model_config();
    config.n_layers = 3;
    for (int replace = 0; replace <= 1; replace++) {
        ResidualConfig residual =
            route_test_msar(2, 3, kernels, replace ? FORM_REPLACE : FORM_DELTA);
        residual.layers_per_block = 1;
        ResidualPlan plan;
        residual_plan_build(&plan, &config, &residual);
        /* every site, the final one too (a block of its own): m N_j (H + 1) floats a
         * token, and x_j's d but the final site's (the head's backward reads it) */
        size_t floats = 0;
        for (int j = 0; j < plan.n_sites; j++) {
            const bool keeps_x = !replace || j == plan.n_sublayers;
            floats += ((size_t)plan.streams * plan.sites[j].n_sources * (plan.heads + 1) +
                       (keeps_x ? 0 : (size_t)config.d_model)) * ROUTE_TEST_ROWS;
        }
        const size_t sites = (size_t)plan.n_sites;
        residual_plan_free(&plan);
        const size_t saved = whole_stash_bytes(&config, &residual, true) -
                             whole_stash_bytes(&config, &residual, false);
        /* each carve rounds up to 256 bytes: two a site, three with x_j */
        cr_expect_geq(saved, floats * sizeof(float), "%s: the stash is %zu bytes smaller, the "
                      "sites' statistics and inputs are %zu", replace ? "replace" : "delta",
                      saved, floats * sizeof(float));
        cr_expect_leq(saved, floats * sizeof(float) + (2 + replace) * 256 * sites);
    }
}

/* attnres's block backward reads the weights its forward saved: the stash keeps them, and one
 * rstd region a block (residual_site_rstd_rows): the sites after a block's first keep none of
 * their own, only the replace form's row of each one's partial in the first's region. At 4 x
 * 256 tokens a row is 4 KB, so the carves' rounding to 256 bytes cannot hide a row. */
Test(model_two_phase, attnres_block_sites_keep_their_weights_and_one_rstd_region_a_block)
{
    enum { B = 4, T = 256 };
    ModelConfig config = route_test_model_config();
    config.n_layers = 3;
    for (int replace = 0; replace <= 1; replace++) {
        ResidualConfig attnres = route_test_attnres(2, 1, replace ? FORM_REPLACE : FORM_DELTA);
        ResidualPlan plan;
        residual_plan_build(&plan, &config, &attnres);
        /* blocks of 2 sites: the second's rows, less the row of its partial */
        size_t shared = 0, later_sites = 0;
        for (int j = 0; j < plan.n_sublayers; j++)
            if (plan.sites[j].position > 0) {
                shared += (size_t)(plan.sites[j].n_sources - replace) * B * T * sizeof(float);
                later_sites++;
            }
        const StashShape whole = {0, plan.n_sublayers, true, true, false};
        size_t bytes[2];
        for (int alone = 0; alone <= 1; alone++) {
            plan.sites_alone = alone;
            bytes[alone] = stash_bytes(backend_cpu(), &config, &plan, B, T, whole);
        }
        residual_plan_free(&plan);
        const size_t saved = bytes[1] - bytes[0];
        cr_expect_geq(saved + 256 * later_sites, shared, "%s: the stash is %zu bytes smaller, "
                      "the shared rows are %zu", replace ? "replace" : "delta", saved, shared);
        cr_expect_leq(saved, shared + 256 * later_sites);
    }
}

static Model *msar_after_forward(bool alone)
{
    const int kernels[] = {2, 1};
    ResidualConfig residual = route_test_msar(2, 2, kernels, FORM_DELTA);
    Model *model = route_test_model(&residual, 16);
    model_route_sites_alone(model, alone);
    route_test_forward(model);
    return model;
}

static void read_a_two_phase_site(void *unused)
{
    (void)unused;
    Model *model = msar_after_forward(false);
    float weights[4 * ROUTE_TEST_ROWS * 2];
    model_site_weights(model, 1, 0, weights);
}

Test(model_two_phase, reading_a_two_phase_msar_sites_weights_names_the_choice_that_keeps_them)
{
    test_expect_fatal(read_a_two_phase_site, NULL, EXIT_CONFIG,
                      "choose model_route_sites_alone before the forward");
    /* routed alone, the same site's weights are kept: a softmax over its sources */
    Model *model = msar_after_forward(true);
    const int n = model_site_sources(model, 1);
    float weights[4 * ROUTE_TEST_ROWS * 2];
    cr_assert_leq((size_t)n * ROUTE_TEST_ROWS * 2, sizeof weights / sizeof weights[0]);
    for (int stream = 0; stream < 2; stream++) {
        model_site_weights(model, 1, stream, weights);
        for (int t = 0; t < ROUTE_TEST_ROWS * 2; t++) { /* token t / 2, head t % 2 */
            double sum = 0;
            for (int source = 0; source < n; source++)
                sum += weights[(size_t)source * ROUTE_TEST_ROWS * 2 + t];
            cr_expect_float_eq(sum, 1.0, 1e-5, "stream %d, token and head %d: %g", stream, t,
                               sum);
        }
    }
    model_destroy(model);
}

static void read_a_two_phase_replace_sites_input(void *unused)
{
    (void)unused;
    const int kernels[] = {2, 1};
    ResidualConfig residual = route_test_msar(2, 2, kernels, FORM_REPLACE);
    Model *model = route_test_model(&residual, 16);
    route_test_forward(model);
    float x[ROUTE_TEST_ROWS * 16];
    model_site_output(model, 1, x);
}

Test(model_two_phase, reading_a_two_phase_msar_replace_sites_input_names_the_choice_that_keeps_it)
{
    test_expect_fatal(read_a_two_phase_replace_sites_input, NULL, EXIT_CONFIG,
                      "choose model_route_sites_alone before the forward");
}

static void choose_sites_alone_after_a_forward(void *unused)
{
    (void)unused;
    Model *model = msar_after_forward(false);
    model_route_sites_alone(model, true);
}

Test(model_two_phase, choosing_sites_alone_after_the_first_forward_is_a_config_error)
{
    test_expect_fatal(choose_sites_alone_after_a_forward, NULL, EXIT_CONFIG,
                      "model_route_sites_alone is chosen before the first forward");
}

static void build_a_replace_plan_named_fastest(void *unused)
{
    (void)unused;
    setenv("FATHOM_ROUTE_REPLACE", "fastest", 1);
    const ModelConfig config = route_test_model_config();
    const ResidualConfig residual = route_test_attnres(2, 1, FORM_REPLACE);
    ResidualPlan plan;
    residual_plan_build(&plan, &config, &residual);
}

Test(model_two_phase, an_unknown_replace_walk_name_exits_with_the_config_code)
{
    test_expect_fatal(build_a_replace_plan_named_fastest, NULL, EXIT_CONFIG,
                      "FATHOM_ROUTE_REPLACE = 'fastest' (two_phase or per_site)");
}

/* The choice is the replace form's of attnres: msar walks in two phases anyway, and the
 * delta form too; unset or two_phase, attnres's replace form walks in two phases, per_site
 * routes it a site at a time. */
Test(model_two_phase, two_phase_replace_is_chosen_for_attnres_replace_only)
{
    const ModelConfig config = route_test_model_config();
    const ResidualConfig replace = route_test_attnres(2, 1, FORM_REPLACE);
    const ResidualConfig delta = route_test_attnres(2, 1, FORM_DELTA);
    ResidualPlan plan;
    const char *const two_phase_names[] = {NULL, "two_phase"};
    for (int i = 0; i < 2; i++) {
        if (two_phase_names[i])
            setenv("FATHOM_ROUTE_REPLACE", two_phase_names[i], 1);
        else
            unsetenv("FATHOM_ROUTE_REPLACE");
        residual_plan_build(&plan, &config, &replace);
        cr_expect(residual_two_phase(&plan), "FATHOM_ROUTE_REPLACE %s",
                  two_phase_names[i] ? two_phase_names[i] : "unset");
        cr_expect(plan.replace_two_phase);
        residual_plan_free(&plan);
    }
    setenv("FATHOM_ROUTE_REPLACE", "per_site", 1);
    residual_plan_build(&plan, &config, &replace);
    cr_expect_not(residual_two_phase(&plan));
    residual_plan_free(&plan);
    residual_plan_build(&plan, &config, &delta);
    cr_expect(residual_two_phase(&plan));
    cr_expect_not(plan.replace_two_phase);
    residual_plan_free(&plan);
    unsetenv("FATHOM_ROUTE_REPLACE");
}
