/* tests/test_model_route_reference.c — attention over depth against the PyTorch reference
 * (DESIGN 2.1-2.3, 7).
 *
 * tests/fixtures/route_*.h5 were made by tests/reference/make_routing_fixtures.py from
 * tests/reference/routing_reference.py, a float64 model of the family written from DESIGN's
 * text alone, which checks itself against Hugging Face (mode standard), the identities of
 * DESIGN 2.1-2.2 and float64 finite differences before it writes. One file per residual
 * configuration: AttnRes full (replace, delta), MHAR block (replace, delta), MSAR block
 * (replace with m = 2, delta with m = 4). Each holds the fathom YAML config (root attribute
 * `config`), the batch (/tokens [B, T+1]), every weight under its DESIGN 2.3 name
 * (/weights, float32; the routing weights random, not at init), and the oracle in float64:
 * /logits, /loss, /ce, /zloss, /grads/<name>. The cpu backend is fp32: relative 1e-5 on
 * logits and losses, 1e-4 on every gradient (||fathom - reference|| / ||reference||).
 * Reading and comparing: tests/fixture_support.h, shared with test_model_reference.c.
 */
#include <criterion/criterion.h>

#include "tests/fixture_support.h"

#define ORACLE "the reference"
#define LOGITS_TOLERANCE 1e-5 /* logits and losses */
#define GRADIENT_TOLERANCE 1e-4

/* Every gradient, routing weights included, to 1e-4. A reference gradient that is exactly
 * zero (the conv taps beyond k_r, the one-source first site of the replace form) must be
 * exactly zero here too. */
static void check_gradients(const char *stem)
{
    int routing = fixture_check_gradients(stem, GRADIENT_TOLERANCE);
    cr_assert(routing > 0, "%s: the model has no routing weights", stem);
}

#define ROUTE_FIXTURE_TESTS(stem)                                                          \
    Test(model_route_reference, stem##_weight_names_and_shapes_match_the_param_table)     \
    {                                                                                      \
        fixture_check_weight_names_and_shapes(#stem);                                      \
    }                                                                                      \
    Test(model_route_reference, stem##_logits_match_the_reference)                         \
    {                                                                                      \
        fixture_check_logits(#stem, ORACLE, LOGITS_TOLERANCE);                             \
    }                                                                                      \
    Test(model_route_reference, stem##_loss_ce_and_zloss_match_the_reference)              \
    {                                                                                      \
        fixture_check_losses(#stem, ORACLE, LOGITS_TOLERANCE);                             \
    }                                                                                      \
    Test(model_route_reference, stem##_every_gradient_matches_the_reference)               \
    {                                                                                      \
        check_gradients(#stem);                                                            \
    }

ROUTE_FIXTURE_TESTS(route_attnres_full_replace)
ROUTE_FIXTURE_TESTS(route_attnres_full_delta)
ROUTE_FIXTURE_TESTS(route_mhar_block_replace)
ROUTE_FIXTURE_TESTS(route_mhar_block_delta)
ROUTE_FIXTURE_TESTS(route_msar_block_replace)
ROUTE_FIXTURE_TESTS(route_msar_block_delta)
