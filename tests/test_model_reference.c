/* tests/test_model_reference.c — the model against Hugging Face transformers (DESIGN 7).
 *
 * tests/fixtures/{llama,qwen3}_tiny.h5 were made by tests/reference/make_fixtures.py with
 * LlamaForCausalLM (llama3 RoPE scaling, untied head) and Qwen3ForCausalLM (q/k norms,
 * head_dim != d / n_heads, tied head) in float64; {llama,qwen3}_gpu.h5 are the same
 * families at head_dim 64 and 128, head dims the cuda attention also runs. Each file holds
 * the fathom YAML config of the network (root attribute `config`), the batch (/tokens
 * [B, T+1]), every weight under its DESIGN 2.3 name (/weights), and the oracle: /logits,
 * /loss, /ce, /zloss and every gradient d loss / d weight (/grads), and the losses before
 * and after each of 3 AdamW steps on that batch (/adamw/losses). The cpu backend is fp32, so
 * the tolerances are relative 1e-5 on logits and losses and 1e-4 on gradients
 * (||fathom - hf|| / ||hf||).
 * Reading and comparing: tests/fixture_support.h, shared with test_model_route_reference.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/optim.h"
#include "tests/fixture_support.h"

#define ORACLE "Hugging Face"
#define LOGITS_TOLERANCE 1e-5 /* logits and losses */
#define GRADIENT_TOLERANCE 1e-4

/* Three steps of runtime/optim on the fixture's batch, with one range per tensor and the
 * decay rule of optim.no_decay, against torch.optim.AdamW with clip_grad_norm_. */
static void check_adamw_losses_match(const char *stem)
{
    Fixture fixture;
    fixture_open(&fixture, stem);
    const Backend *backend = model_backend(fixture.model);
    const ParamTable *table = model_param_table(fixture.model);
    const OptimConfig *optim = &fixture.config.optim;
    OptimRange *ranges = xcalloc((size_t)table->n_params, sizeof *ranges);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        ranges[p].offset = entry->offset;
        ranges[p].count = entry->count;
        ranges[p].lr_mult = optim_range_lr_mult(optim, entry->kind == PARAM_ROUTING);
        ranges[p].weight_decay =
            optim_range_weight_decay(optim, param_kind_no_decay_bit(entry->kind));
    }
    const size_t bytes = table->total * sizeof(float);
    Optimizer optimizer = {
        .backend = backend,
        .config = optim,
        .params = model_params(fixture.model),
        .grads = model_grads(fixture.model),
        .compute = model_compute_copy(fixture.model),
        .exp_avg = backend->alloc(bytes),
        .exp_avg_sq = backend->alloc(bytes),
        .count = table->total,
        .ranges = ranges,
        .n_ranges = table->n_params,
    };
    size_t count;
    double *expected = fixture_read_dataset(&fixture, "/adamw/losses", H5T_NATIVE_DOUBLE,
                                            sizeof(double), NULL, NULL, &count);
    for (size_t step = 0; step < count; step++) {
        ModelLoss loss = fixture_forward(&fixture);
        char what[64];
        snprintf(what, sizeof what, "%s loss after %zu AdamW steps", stem, step);
        fixture_expect_relative(loss.loss, expected[step], LOGITS_TOLERANCE, what, ORACLE);
        if (step + 1 == count)
            break;
        model_zero_grads(fixture.model);
        model_backward(fixture.model, 1.0f);
        cr_assert(optim_step(&optimizer, optim->lr, NULL), "step %zu was skipped", step);
    }
    free(expected);
    backend->release(optimizer.exp_avg);
    backend->release(optimizer.exp_avg_sq);
    free(ranges);
    fixture_close(&fixture);
}

/* The five claims for one fixture; `name` begins the test names. */
#define REFERENCE_TESTS(name, stem)                                                        \
    Test(model_reference, name##_weight_names_and_shapes_match_the_param_table)           \
    {                                                                                      \
        fixture_check_weight_names_and_shapes(stem);                                       \
    }                                                                                      \
    Test(model_reference, name##_logits_match_hugging_face)                                \
    {                                                                                      \
        fixture_check_logits(stem, ORACLE, LOGITS_TOLERANCE);                              \
    }                                                                                      \
    Test(model_reference, name##_loss_ce_and_zloss_match_hugging_face)                     \
    {                                                                                      \
        fixture_check_losses(stem, ORACLE, LOGITS_TOLERANCE);                              \
    }                                                                                      \
    Test(model_reference, name##_gradients_match_hugging_face)                             \
    {                                                                                      \
        fixture_check_gradients(stem, GRADIENT_TOLERANCE);                                 \
    }                                                                                      \
    Test(model_reference, name##_three_adamw_steps_follow_torch)                           \
    {                                                                                      \
        check_adamw_losses_match(stem);                                                    \
    }

REFERENCE_TESTS(llama, "llama_tiny")
REFERENCE_TESTS(qwen3, "qwen3_tiny")
REFERENCE_TESTS(llama_head_dim_64, "llama_gpu")
REFERENCE_TESTS(qwen3_head_dim_128, "qwen3_gpu")
