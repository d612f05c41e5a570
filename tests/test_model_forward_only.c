/* tests/test_model_forward_only.c — the model that `fathom eval` and `fathom probe` build
 * (launch/inference.c): made for the forward only (model.h ModelSharding.forward_only: no
 * gradient buffers) and with activation checkpointing (each layer's intermediates in one
 * layer's buffers). Its forward gives the training model's logits and loss bit for bit in
 * every residual mode, it holds half the parameter bytes on the cpu (fp32 master without
 * fp32 gradients), and a backward on it is refused by name.
 */
#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/route_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <string.h>

static Model *model_for(const ResidualConfig *residual, bool forward_only)
{
    const ModelConfig config = route_test_model_config();
    const ModelSharding sharding = {.forward_only = forward_only};
    Model *model = model_create_sharded(backend_cpu(), &config, residual, ROUTE_TEST_B,
                                        ROUTE_TEST_T, &sharding);
    model_init_params(model, 7, config.init_std);
    route_test_randomize_routing(model, 7);
    if (forward_only)
        model_set_activation_checkpointing(model, true);
    return model;
}

Test(model_forward_only, gives_the_training_models_logits_and_loss_bit_for_bit)
{
    const int kernels[] = {1, 3};
    const struct {
        const char *label;
        ResidualConfig residual;
    } cases[] = {
        {"standard", {.mode = RESIDUAL_STANDARD}},
        {"block mhar replace", route_test_attnres(2, 1, FORM_REPLACE)},
        {"mhar delta", route_test_attnres(2, 1, FORM_DELTA)},
        {"msar replace", route_test_msar(2, 2, kernels, FORM_REPLACE)},
        {"msar delta", route_test_msar(2, 2, kernels, FORM_DELTA)},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Model *training = model_for(&cases[k].residual, false);
        Model *forward = model_for(&cases[k].residual, true);
        const double a = route_test_forward(training), b = route_test_forward(forward);
        cr_expect(memcmp(&a, &b, sizeof a) == 0, "%s: loss %.17g, forward only %.17g",
                  cases[k].label, a, b);
        cr_expect(test_logits_bitwise_equal(training, forward), "%s: the logits differ",
                  cases[k].label);
        model_destroy(training);
        model_destroy(forward);
    }
}

/* What the cpu backend allocates for a model and its first forward. */
static size_t allocated_for(const ResidualConfig *residual, bool forward_only)
{
    size_t before, after, peak;
    backend_cpu()->memory_usage(&before, &peak);
    Model *model = model_for(residual, forward_only);
    route_test_forward(model);
    backend_cpu()->memory_usage(&after, &peak);
    model_destroy(model);
    return after - before;
}

Test(model_forward_only, holds_no_gradients_and_one_layers_intermediates)
{
    const ResidualConfig residual = route_test_attnres(2, 1, FORM_DELTA);
    Model *training = model_for(&residual, false);
    Model *forward = model_for(&residual, true);
    size_t training_parameters, training_activations, parameters, activations;
    model_memory_bytes(training, &training_parameters, &training_activations);
    model_memory_bytes(forward, &parameters, &activations);
    /* the cpu's master is its compute copy: master + gradients against master alone */
    cr_expect_eq(2 * parameters, training_parameters, "%zu against %zu", parameters,
                 training_parameters);
    cr_expect_lt(activations, training_activations, "%zu against %zu", activations,
                 training_activations);
    cr_expect_null(model_grads(forward));
    model_destroy(training);
    model_destroy(forward);
    /* and the backend holds that much less: the gradient shards at least */
    const size_t gradient_bytes = training_parameters - parameters;
    const size_t with = allocated_for(&residual, false), without = allocated_for(&residual, true);
    cr_expect_geq(with - without, gradient_bytes, "the backend holds %zu bytes for training, "
                  "%zu forward only: less than the %zu of the gradients apart", with, without,
                  gradient_bytes);
}

static void backward_on_a_forward_only_model(void *unused)
{
    (void)unused;
    const ResidualConfig residual = route_test_attnres(2, 1, FORM_DELTA);
    Model *model = model_for(&residual, true);
    route_test_forward(model);
    model_backward(model, 1.0f);
}

Test(model_forward_only, a_backward_is_a_config_error_naming_the_forward_only_model)
{
    test_expect_fatal(backward_on_a_forward_only_model, NULL, EXIT_CONFIG,
                      "made for the forward only");
}
