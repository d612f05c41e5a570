/* tests/test_model_logits.c — the head's logits in chunks of rows (model/loss.h): the loss
 * and gradients of a chunked batch against one chunk, which chunks the backward makes again
 * (the chunk buffer and the spare one, under two-phase routing too, and after another
 * batch's walk), a forward for a backward (the logits replaced by their gradient) against
 * the plain forward, and reading logits no buffer kept (DESIGN 2).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model/activations.h"
#include "model/chunk.h"
#include "model/model.h"
#include "model/params.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/kernel_support.h"
#include "tests/route_support.h"
#include "tests/support.h"

/* The head and the loss in chunks of 3 rows (the last one short) against one chunk of all
 * 10, with the chunks' logits kept and with the backward making each chunk's logits again:
 * the same loss and logits bit for bit, the same gradients up to the order of the head's
 * fp32 sums over the chunks. */
Test(model, the_loss_in_chunks_of_rows_equals_the_loss_in_one_chunk)
{
    ModelConfig config = test_small_model_config(true, true);
    const int B = 2, T = 5;
    Model *whole = model_create(backend_cpu(), &config, NULL, B, T);
    Model *kept = model_create(backend_cpu(), &config, NULL, B, T);
    Model *remade = model_create(backend_cpu(), &config, NULL, B, T);
    model_set_logit_rows(kept, 3);
    model_keep_all_logits(kept);
    model_set_logit_rows(remade, 3);
    const size_t total = model_param_table(whole)->total;
    Model *models[3] = {whole, kept, remade};
    float *grads[3];
    ModelLoss losses[3];
    uint32_t inputs[10], targets[10];
    test_fill_tokens(inputs, 10, config.vocab_size, 7);
    test_fill_tokens(targets, 10, config.vocab_size, 8);
    for (int k = 0; k < 3; k++) {
        model_init_params(models[k], 4, 0.2);
        losses[k] = model_forward(models[k], inputs, targets, B, 1e-3f);
        model_backward(models[k], 1.0f);
        grads[k] = xmalloc(total * sizeof(float));
        backend_cpu()->download(grads[k], model_grads(models[k]), total * sizeof(float));
    }
    cr_assert(test_logits_bitwise_equal(whole, kept));
    double norm = 0;
    for (size_t i = 0; i < total; i++)
        norm += (double)grads[0][i] * grads[0][i];
    cr_assert_gt(norm, 0.0);
    for (int k = 1; k < 3; k++) {
        cr_assert_eq(losses[k].loss, losses[0].loss, "model %d", k);
        cr_assert_eq(losses[k].zloss, losses[0].zloss, "model %d", k);
        double error = test_relative_error(grads[k], grads[0], total);
        cr_assert(error <= 1e-6, "model %d: chunked vs whole gradients %.3g", k, error);
    }
    for (int k = 0; k < 3; k++) {
        free(grads[k]);
        model_destroy(models[k]);
    }
}

/* The cpu backend, counting the head's matmuls (out_dim == the vocabulary). */
static Backend counting_backend;
static int head_matmuls, counted_vocabulary;

static void counting_matmul_forward(Activation *out, const Activation *in,
                                    const Activation *weight, int rows, int in_dim, int out_dim)
{
    if (out_dim == counted_vocabulary)
        head_matmuls++;
    backend_cpu()->matmul_forward(out, in, weight, rows, in_dim, out_dim);
}

static int gradient_passes; /* cross_entropy_backward calls: the logits' gradient made apart */

static void counting_cross_entropy_backward(Activation *dlogits, GradMode mode,
                                            const float *dloss, const Activation *logits,
                                            const float *lse, const uint32_t *targets,
                                            int rows, int V, float z_loss)
{
    gradient_passes++;
    backend_cpu()->cross_entropy_backward(dlogits, mode, dloss, logits, lse, targets, rows, V,
                                          z_loss);
}

typedef struct {
    float forward_scale;  /* 0: model_forward; else model_forward_train with it */
    float backward_scale; /* model_backward's */
    int backwards;        /* model_backward calls after the forward */
} HeadRun;

typedef struct {
    ModelLoss loss;
    float *grads;
    int made, remade; /* the head's matmuls in the forward and in the backwards */
    int gradient_passes;
} HeadResult;

/* One forward and its backwards of a 2 x 5 batch in chunks of `logit_rows` (residual NULL:
 * standard), counting the head's matmuls and the gradient passes of the backwards. */
static HeadResult run_head(const ResidualConfig *residual, int logit_rows, HeadRun run)
{
    ModelConfig config = test_small_model_config(false, false);
    counting_backend = *backend_cpu();
    counting_backend.matmul_forward = counting_matmul_forward;
    counting_backend.cross_entropy_backward = counting_cross_entropy_backward;
    counted_vocabulary = config.vocab_size;
    const int B = 2, T = 5;
    Model *model = model_create(&counting_backend, &config, residual, B, T);
    model_init_params(model, 4, 0.2);
    model_set_logit_rows(model, logit_rows);
    uint32_t inputs[10], targets[10];
    test_fill_tokens(inputs, 10, config.vocab_size, 7);
    test_fill_tokens(targets, 10, config.vocab_size, 8);
    HeadResult result;
    head_matmuls = 0;
    result.loss = run.forward_scale != 0.0f
                      ? model_forward_train(model, inputs, targets, B, 1e-2f, run.forward_scale)
                      : model_forward(model, inputs, targets, B, 1e-2f);
    result.made = head_matmuls;
    head_matmuls = gradient_passes = 0;
    for (int k = 0; k < run.backwards; k++)
        model_backward(model, run.backward_scale);
    result.remade = head_matmuls;
    result.gradient_passes = gradient_passes;
    const size_t total = model_param_table(model)->total;
    result.grads = xmalloc(total * sizeof(float));
    memcpy(result.grads, model_grads(model), total * sizeof(float));
    model_destroy(model);
    return result;
}

/* The head's matmuls of one forward and one backward, with chunks of `logit_rows` rows
 * (residual NULL: standard). */
static void count_head_matmuls(const ResidualConfig *residual, int logit_rows, int *forward,
                               int *backward)
{
    HeadResult result = run_head(residual, logit_rows, (HeadRun){0.0f, 1.0f, 1});
    *forward = result.made;
    *backward = result.remade;
    free(result.grads);
}

/* The forward leaves its last chunk in the chunk buffer and the one before it in the spare
 * (the logits' gradient buffer): two chunks are made again in the backward for none, three
 * for one (model/loss.h). */
Test(model, the_backward_makes_again_only_the_chunks_no_buffer_kept)
{
    int forward, backward;
    count_head_matmuls(NULL, 6, &forward, &backward); /* rows 0-5 and 6-9 */
    cr_assert_eq(forward, 2, "the forward made %d chunks of logits", forward);
    cr_assert_eq(backward, 0, "two chunks: the backward made %d again", backward);
    count_head_matmuls(NULL, 4, &forward, &backward); /* rows 0-3, 4-7 and 8-9 */
    cr_assert_eq(forward, 3, "the forward made %d chunks of logits", forward);
    cr_assert_eq(backward, 1, "three chunks: the backward made %d again", backward);
}

/* A two-phase routing walk's rows lie in the spare buffer, but its walks run before the
 * head's forward and after the head's backward: the chunk kept there survives a step. */
Test(model, a_two_phase_walk_leaves_the_head_its_spare_chunk)
{
    const ResidualConfig residual = route_test_attnres(1, 1, FORM_DELTA);
    int forward, backward;
    count_head_matmuls(&residual, 6, &forward, &backward);
    cr_assert_eq(forward, 2, "the forward made %d chunks of logits", forward);
    cr_assert_eq(backward, 0, "the backward made %d chunks again", backward);
}

/* ---- a forward for a backward: the logits replaced by their gradient (model/loss.h) ---- */

static void expect_same_bits(const HeadResult *got, const HeadResult *expected, size_t total,
                             const char *what)
{
    cr_assert(memcmp(&got->loss, &expected->loss, sizeof got->loss) == 0, "%s: loss %.17g, %.17g",
              what, got->loss.loss, expected->loss.loss);
    expect_bitwise_equal(got->grads, expected->grads, total, what);
}

static size_t small_model_params(const ResidualConfig *residual)
{
    ModelConfig config = test_small_model_config(false, false);
    Model *model = model_create(backend_cpu(), &config, residual, 2, 5);
    const size_t total = model_param_table(model)->total;
    model_destroy(model);
    return total;
}

/* One chunk, two (the spare and the last kept) and three (one made again): the forward for
 * a backward leaves gradients in the buffers, which the backward takes without a gradient
 * pass of its own; only a chunk no buffer kept is made again and its gradient taken apart.
 * The loss and every gradient have the plain forward's bits, standard and two-phase. */
Test(model, a_forward_for_a_backward_takes_the_kept_gradients_and_gives_the_same_bits)
{
    const ResidualConfig routed = route_test_attnres(1, 1, FORM_DELTA);
    const ResidualConfig *residuals[2] = {NULL, &routed};
    const int chunk_rows[3] = {10, 6, 4}, remade[3] = {0, 0, 1};
    for (int r = 0; r < 2; r++) {
        const size_t total = small_model_params(residuals[r]);
        for (int c = 0; c < 3; c++) {
            HeadResult plain = run_head(residuals[r], chunk_rows[c], (HeadRun){0.0f, 0.5f, 1});
            HeadResult trained =
                run_head(residuals[r], chunk_rows[c], (HeadRun){0.5f, 0.5f, 1});
            cr_assert_eq(plain.gradient_passes, (10 + chunk_rows[c] - 1) / chunk_rows[c]);
            cr_assert_eq(trained.remade, remade[c], "residual %d, chunks of %d: %d made again",
                         r, chunk_rows[c], trained.remade);
            cr_assert_eq(trained.gradient_passes, remade[c],
                         "residual %d, chunks of %d: %d gradient passes", r, chunk_rows[c],
                         trained.gradient_passes);
            expect_same_bits(&trained, &plain, total, "the forward for a backward");
            free(plain.grads), free(trained.grads);
        }
    }
}

/* A backward of another loss_scale cannot use the kept gradients: it makes every chunk's
 * logits again (two here: the last one's buffer and the spare's) and has the bits of the
 * plain forward's backward at its own scale. A second backward of the forward's scale takes
 * the kept gradient again, as a second backward after the plain forward adds again. */
Test(model, a_backward_of_another_scale_or_a_second_backward_gives_the_plain_bits)
{
    const size_t total = small_model_params(NULL);
    HeadResult plain = run_head(NULL, 6, (HeadRun){0.0f, 1.0f, 1});
    HeadResult other = run_head(NULL, 6, (HeadRun){0.5f, 1.0f, 1});
    cr_assert_eq(other.remade, 2, "another scale: %d chunks made again", other.remade);
    cr_assert_eq(other.gradient_passes, 2);
    expect_same_bits(&other, &plain, total, "a backward of another scale");
    free(plain.grads), free(other.grads);

    plain = run_head(NULL, 10, (HeadRun){0.0f, 0.5f, 2});
    HeadResult twice = run_head(NULL, 10, (HeadRun){0.5f, 0.5f, 2});
    cr_assert_eq(twice.remade, 0);
    cr_assert_eq(twice.gradient_passes, 0);
    expect_same_bits(&twice, &plain, total, "two backwards");
    free(plain.grads), free(twice.grads);
}

/* The forward of chunk c of batch k (2 x 5 tokens of its own) */
static void chunk_forward_batch(Model *model, const ChunkSpan *spans, Stash (*stashes)[2],
                                SummaryStore *stores, int c, int k, float loss_scale)
{
    const int vocabulary = model_config(model)->vocab_size;
    uint32_t inputs[10], targets[10];
    test_fill_tokens(inputs, 10, vocabulary, 7 + 2 * (uint64_t)k);
    test_fill_tokens(targets, 10, vocabulary, 8 + 2 * (uint64_t)k);
    chunk_forward(model, &spans[c], &stashes[k][c], &stores[k], inputs, targets, 2, 1e-3f,
                  loss_scale);
}

/* Two chunks of one layer on one rank, as an interleaved pipeline schedule holds them, and
 * a vocabulary large enough that the two-phase walk's rows lie in the spare buffer: batch
 * 1's walk of chunk 0 between batch 0's head forward and its backward writes them over the
 * spare chunk, so the backward makes that chunk again (in the chunk buffer, over the last
 * chunk, which it then makes again too: loss.h's order) and gives the gradients of the
 * schedule without batch 1, bit for bit. */
Test(model, another_batch_walk_takes_the_spare_chunk_and_the_backward_makes_it_again)
{
    const ResidualConfig residual = route_test_attnres(1, 1, FORM_DELTA);
    ModelConfig config = test_small_model_config(false, false);
    config.vocab_size = 64; /* 6 x 64 logits: four rows of [10, 8] in the spare */
    counting_backend = *backend_cpu();
    counting_backend.matmul_forward = counting_matmul_forward;
    counted_vocabulary = config.vocab_size;
    const int B = 2, T = 5;
    float *grads[4];
    int remade[4];
    size_t total = 0;
    /* runs 0, 1: the plain forward, alone and interleaved; 2, 3: the forward for a backward */
    for (int run = 0; run < 4; run++) {
        const int interleaved = run % 2;
        const float loss_scale = run < 2 ? 0.0f : 1.0f;
        Model *model = model_create(&counting_backend, &config, &residual, B, T);
        model_init_params(model, 4, 0.2);
        model_set_logit_rows(model, 6);
        ChunkSpan spans[2];
        chunk_spans_build(spans, 2, &config, model_plan(model), NULL, 0);
        Stash stashes[2][2]; /* [batch][chunk] */
        SummaryStore stores[2];
        for (int k = 0; k < 2; k++) {
            for (int c = 0; c < 2; c++)
                stash_create(&stashes[k][c], &counting_backend, &config, model_plan(model), B,
                             T, chunk_stash_shape(&spans[c], false));
            store_create(&stores[k], &counting_backend, &config, model_plan(model), B, T, NULL);
        }
        chunk_forward_batch(model, spans, stashes, stores, 0, 0, loss_scale);
        chunk_forward_batch(model, spans, stashes, stores, 1, 0, loss_scale);
        if (interleaved)
            chunk_forward_batch(model, spans, stashes, stores, 0, 1, loss_scale);
        head_matmuls = 0;
        chunk_backward(model, &spans[1], &stashes[0][1], &stores[0], 1.0f);
        remade[run] = head_matmuls;
        chunk_backward(model, &spans[0], &stashes[0][0], &stores[0], 1.0f);
        total = model_param_table(model)->total;
        grads[run] = xmalloc(total * sizeof(float));
        memcpy(grads[run], model_grads(model), total * sizeof(float));
        for (int k = 0; k < 2; k++) {
            for (int c = 0; c < 2; c++)
                stash_destroy(&stashes[k][c], &counting_backend);
            store_destroy(&stores[k], &counting_backend);
        }
        model_destroy(model);
    }
    for (int run = 0; run < 4; run += 2) {
        cr_assert_eq(remade[run], 0, "run %d alone: the backward made %d chunks again", run,
                     remade[run]);
        cr_assert_eq(remade[run + 1], 2,
                     "run %d, after another batch's walk: the backward made %d chunks again",
                     run + 1, remade[run + 1]);
    }
    for (int run = 1; run < 4; run++)
        for (size_t i = 0; i < total; i++)
            cr_assert(memcmp(&grads[0][i], &grads[run][i], sizeof(float)) == 0,
                      "gradient %zu: %a in run %d, %a alone after the plain forward", i,
                      grads[run][i], run, grads[0][i]);
    for (int run = 0; run < 4; run++)
        free(grads[run]);
}

/* How the batch whose logits are read was made: in chunks of `logit_rows` (10: one), by
 * model_forward or (loss_scale not 0) model_forward_train. */
typedef struct {
    int logit_rows;
    float loss_scale;
} LogitsMade;

static void read_logits_made(void *argument)
{
    const LogitsMade *made = argument;
    ModelConfig config = test_small_model_config(false, false);
    Model *model = model_create(backend_cpu(), &config, NULL, 2, 5);
    model_init_params(model, 1, 0.2);
    model_set_logit_rows(model, made->logit_rows);
    uint32_t inputs[10], targets[10];
    test_fill_tokens(inputs, 10, config.vocab_size, 1);
    test_fill_tokens(targets, 10, config.vocab_size, 2);
    model_forward_train(model, inputs, targets, 2, 0.0f, made->loss_scale);
    float logits[10 * 64];
    cr_assert_leq((size_t)10 * config.vocab_size, sizeof logits / sizeof logits[0]);
    model_read_logits(model, logits);
}

/* Without model_keep_all_logits the chunk buffer holds only the last chunk: reading the
 * whole batch's logits is refused, not answered with stale rows. */
Test(model, reading_the_logits_of_a_batch_made_in_chunks_is_a_config_error)
{
    LogitsMade made = {4, 0.0f};
    test_expect_fatal(read_logits_made, &made, EXIT_CONFIG,
                      "the logits of 10 tokens were made in chunks of 4 and not kept");
}

/* One chunk keeps the whole batch, but a forward for a backward replaced its logits by
 * their gradient: reading them is refused. */
Test(model, reading_the_logits_replaced_by_their_gradient_is_a_config_error)
{
    LogitsMade made = {10, 1.0f};
    test_expect_fatal(read_logits_made, &made, EXIT_CONFIG,
                      "the logits of the last forward were replaced by their gradient");
}
