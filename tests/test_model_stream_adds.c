/* tests/test_model_stream_adds.c — the standard stream's residual adds made inside the next
 * sublayer's norm (model/chunk.c layer_forward; runtime/backend.h add_rmsnorm_forward): which
 * ops a standard forward and a checkpointed backward call, and that the recompute forms each
 * layer's second input as the forward did, bit for bit.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/params.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/kernel_support.h"
#include "tests/support.h"

/* The cpu backend, counting the adds and the norms' forwards. */
static Backend counting_backend;
static int adds, sum_norms, plain_norms;

static void counting_add(Activation *out, const Activation *a, const Activation *b, size_t n)
{
    adds++;
    backend_cpu()->add(out, a, b, n);
}

static void counting_add_rmsnorm_forward(Activation *sum, Activation *out, float *rstd,
                                         const Activation *a, const Activation *b,
                                         const Activation *weight, int rows, int d, float eps)
{
    sum_norms++;
    backend_cpu()->add_rmsnorm_forward(sum, out, rstd, a, b, weight, rows, d, eps);
}

static void counting_rmsnorm_forward(Activation *out, float *rstd, const Activation *x,
                                     const Activation *weight, int rows, int d, float eps)
{
    plain_norms++;
    backend_cpu()->rmsnorm_forward(out, rstd, x, weight, rows, d, eps);
}

typedef struct {
    int adds, sum_norms, plain_norms;
} OpCounts;

typedef struct {
    OpCounts forward, backward;
    ModelLoss loss;
    float *grads;
    size_t total;
} StandardRun;

/* One forward and backward of a standard model of 3 layers on a 2 x 5 batch. */
static StandardRun run_standard(bool checkpointing)
{
    ModelConfig config = test_small_model_config(false, false);
    config.n_layers = 3;
    counting_backend = *backend_cpu();
    counting_backend.add = counting_add;
    counting_backend.add_rmsnorm_forward = counting_add_rmsnorm_forward;
    counting_backend.rmsnorm_forward = counting_rmsnorm_forward;
    const int B = 2, T = 5;
    Model *model = model_create(&counting_backend, &config, NULL, B, T);
    model_set_activation_checkpointing(model, checkpointing);
    model_init_params(model, 4, 0.2);
    uint32_t inputs[10], targets[10];
    test_fill_tokens(inputs, 10, config.vocab_size, 17);
    test_fill_tokens(targets, 10, config.vocab_size, 18);
    StandardRun run;
    adds = sum_norms = plain_norms = 0;
    run.loss = model_forward(model, inputs, targets, B, 1e-2f);
    run.forward = (OpCounts){adds, sum_norms, plain_norms};
    adds = sum_norms = plain_norms = 0;
    model_backward(model, 1.0f);
    run.backward = (OpCounts){adds, sum_norms, plain_norms};
    run.total = model_param_table(model)->total;
    run.grads = xmalloc(run.total * sizeof(float));
    memcpy(run.grads, model_grads(model), run.total * sizeof(float));
    model_destroy(model);
    return run;
}

/* 6 sublayers: the first's norm reads the embedding's rows, the next five form their input
 * from the sublayer before's (its input plus its output), and the last sublayer's output is
 * added into the chunk's output stream, which the final norm reads. */
Test(model, the_standard_streams_adds_are_made_by_the_next_sublayers_norm)
{
    StandardRun run = run_standard(false);
    cr_expect_eq(run.forward.sum_norms, 5);
    cr_expect_eq(run.forward.adds, 1);
    cr_expect_eq(run.forward.plain_norms, 2, "the first sublayer's and the final norm");
    cr_expect_eq(run.backward.sum_norms + run.backward.plain_norms, 0, "nothing made again");
    free(run.grads);
}

/* With checkpointing the backward makes each layer's forward again from the layer's input:
 * the first sublayer's plain norm, the second's input formed in its norm, as the forward
 * formed it, so the gradients and the loss have the bits of the run without checkpointing. */
Test(model, a_checkpointed_recompute_forms_the_second_input_as_the_forward_did)
{
    StandardRun plain = run_standard(false), checkpointed = run_standard(true);
    cr_expect_eq(checkpointed.forward.sum_norms, 5);
    cr_expect_eq(checkpointed.forward.adds, 1);
    cr_expect_eq(checkpointed.backward.sum_norms, 3, "a layer's second sublayer each");
    cr_expect_eq(checkpointed.backward.plain_norms, 3, "a layer's first sublayer each");
    cr_expect_eq(checkpointed.backward.adds, 0);
    cr_expect_eq(checkpointed.loss.loss, plain.loss.loss);
    cr_assert_eq(checkpointed.total, plain.total);
    expect_bitwise_equal(checkpointed.grads, plain.grads, plain.total,
                         "the checkpointed gradients");
    free(plain.grads);
    free(checkpointed.grads);
}
