/* tests/test_model_two_phase.c — the two-phase walk (model/route_block.h) against the
 * per-site reference (model_route_sites_alone), on the cpu backend: the delta form of
 * attnres and msar, and msar's replace form.
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
 * last block of 3 layers), H (1, 2, 4), d (16, 24: not a multiple of 16), m (1 to 3) and
 * kernel sizes (1 to 5 over sequences of 6 tokens), with and without checkpointing.
 */
#include "model/model.h"
#include "model/params.h"
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
    bool replace; /* the replace form (msar) */
} TwoPhaseCase;

static Model *case_model(const TwoPhaseCase *c, bool alone)
{
    ModelConfig config = route_test_model_config();
    config.n_layers = 3;
    config.d_model = c->d;
    config.n_heads = c->d / config.head_dim;
    ResidualConfig residual = c->mode == RESIDUAL_MSAR
                                  ? route_test_msar(c->heads, c->streams, c->kernels,
                                                    c->replace ? FORM_REPLACE : FORM_DELTA)
                                  : route_test_attnres(c->heads, 1, FORM_DELTA);
    residual.layers_per_block = c->layers_per_block;
    Model *model = model_create(backend_cpu(), &config, &residual, ROUTE_TEST_B, ROUTE_TEST_T);
    model_init_params(model, 61, config.init_std);
    route_test_randomize_routing(model, 61);
    model_set_activation_checkpointing(model, c->checkpointing);
    model_route_sites_alone(model, alone);
    model_zero_grads(model);
    route_test_forward(model);
    model_backward(model, 1.0f);
    return model;
}

static void check_case(const TwoPhaseCase *c)
{
    Model *two_phase = case_model(c, false), *alone = case_model(c, true);
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
