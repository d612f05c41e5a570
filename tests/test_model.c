/* tests/test_model.c — parameter table, init and model invariants (DESIGN 2, 3).
 *
 * The numbers the model must match bit for bit or to rounding come from Hugging Face
 * (tests/test_model_reference.c, and tests/test_rope_table.c for the RoPE tables); the
 * rest are identities that the layout and the math guarantee.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/init.h"
#include "model/model.h"
#include "model/params.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/support.h"

/* The parameters of a freshly initialised model, copied to the host. */
static float *initial_params(const ModelConfig *config, uint64_t seed, double init_std,
                             ParamTable *table)
{
    Model *model = model_create(backend_cpu(), config, NULL, 1, 4);
    model_init_params(model, seed, init_std);
    param_table_build(table, config);
    float *host = xmalloc(table->total * sizeof(float));
    backend_cpu()->download(host, model_params(model), table->total * sizeof(float));
    model_destroy(model);
    return host;
}

/* ---- the parameter table ---- */

Test(model, untied_table_lists_the_hugging_face_names_in_unit_order)
{
    static const char *expected[] = {
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    };
    static const int expected_unit[] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3};
    ModelConfig config = test_small_model_config(false, false);
    ParamTable table;
    param_table_build(&table, &config);
    int n = (int)(sizeof expected / sizeof expected[0]);
    cr_assert_eq(table.n_params, n);
    cr_assert_eq(table.n_units, 5); /* the shared routing unit is empty here */
    cr_assert_eq(table.units[table.unit_shared].n_params, 0);
    for (int p = 0; p < n; p++) {
        cr_assert_str_eq(table.params[p].name, expected[p]);
        cr_assert_eq(table.params[p].unit, expected_unit[p], "%s", expected[p]);
    }
    param_table_free(&table);
}

Test(model, shapes_are_vocab_by_width_out_by_in_and_width)
{
    ModelConfig config = test_small_model_config(true, false);
    ParamTable table;
    param_table_build(&table, &config);
    struct { const char *name; int ndim, rows, cols; } expected[] = {
        {"model.embed_tokens.weight", 2, 11, 8},
        {"model.layers.1.input_layernorm.weight", 1, 8, 1},
        {"model.layers.1.self_attn.q_proj.weight", 2, 16, 8},
        {"model.layers.1.self_attn.k_proj.weight", 2, 8, 8},
        {"model.layers.1.self_attn.v_proj.weight", 2, 8, 8},
        {"model.layers.1.self_attn.o_proj.weight", 2, 8, 16},
        {"model.layers.1.self_attn.q_norm.weight", 1, 4, 1},
        {"model.layers.1.self_attn.k_norm.weight", 1, 4, 1},
        {"model.layers.1.mlp.gate_proj.weight", 2, 12, 8},
        {"model.layers.1.mlp.up_proj.weight", 2, 12, 8},
        {"model.layers.1.mlp.down_proj.weight", 2, 8, 12},
        {"model.norm.weight", 1, 8, 1},
        {"lm_head.weight", 2, 11, 8},
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const ParamEntry *entry = param_table_find(&table, expected[i].name);
        cr_assert_not_null(entry, "%s", expected[i].name);
        cr_assert_eq(entry->ndim, expected[i].ndim, "%s", expected[i].name);
        cr_assert_eq(entry->shape[0], expected[i].rows, "%s", expected[i].name);
        cr_assert_eq(entry->shape[1], expected[i].cols, "%s", expected[i].name);
        cr_assert_eq(entry->count, (size_t)expected[i].rows * expected[i].cols);
    }
    param_table_free(&table);
}

Test(model, qk_norm_puts_q_norm_and_k_norm_in_each_layer_unit_after_o_proj)
{
    ModelConfig config = test_small_model_config(true, false);
    ParamTable table;
    param_table_build(&table, &config);
    cr_assert_eq(table.n_params, 1 + 2 * 11 + 2);
    for (int layer = 0; layer < 2; layer++) {
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", layer);
        const ParamEntry *o_proj = param_table_find(&table, name);
        cr_assert_str_eq(o_proj[1].name + strlen("model.layers.0."), "self_attn.q_norm.weight");
        cr_assert_str_eq(o_proj[2].name + strlen("model.layers.0."), "self_attn.k_norm.weight");
        cr_assert_eq(o_proj[1].unit, 1 + layer);
        cr_assert_eq(o_proj[2].unit, 1 + layer);
        cr_assert_eq(o_proj[1].kind, PARAM_NORM);
    }
    ModelConfig plain = test_small_model_config(false, false);
    ParamTable plain_table;
    param_table_build(&plain_table, &plain);
    cr_assert_null(param_table_find(&plain_table, "model.layers.0.self_attn.q_norm.weight"));
    param_table_free(&plain_table);
    param_table_free(&table);
}

Test(model, tied_embeddings_leave_no_lm_head_and_a_final_unit_of_one_norm)
{
    ModelConfig config = test_small_model_config(false, true);
    ParamTable table;
    param_table_build(&table, &config);
    cr_assert_null(param_table_find(&table, "lm_head.weight"));
    const ParamUnit *last = &table.units[table.unit_head];
    cr_assert_eq(last->n_params, 1);
    cr_assert_str_eq(table.params[last->first_param].name, "model.norm.weight");
    cr_assert_eq(last->count, 8);
    param_table_free(&table);
}

/* The next tensor starts at the first multiple of PARAM_ALIGNMENT from `end`. */
static size_t aligned_start(size_t end)
{
    return (end + PARAM_ALIGNMENT - 1) / PARAM_ALIGNMENT * PARAM_ALIGNMENT;
}

Test(model, units_are_contiguous_up_to_alignment_and_cover_the_flat_buffer)
{
    for (int variant = 0; variant < 4; variant++) {
        ModelConfig config = test_small_model_config(variant & 1, variant & 2);
        ParamTable table;
        param_table_build(&table, &config);
        size_t next = 0;
        int next_param = 0;
        for (int u = 0; u < table.n_units; u++) {
            const ParamUnit *unit = &table.units[u];
            cr_assert_eq(unit->offset, aligned_start(next), "variant %d unit %d", variant, u);
            cr_assert_eq(unit->first_param, next_param);
            size_t inside = unit->offset;
            for (int p = unit->first_param; p < unit->first_param + unit->n_params; p++) {
                cr_assert_eq(table.params[p].unit, u, "%s", table.params[p].name);
                cr_assert_eq(table.params[p].offset, aligned_start(inside), "%s",
                             table.params[p].name);
                inside = table.params[p].offset + table.params[p].count;
            }
            cr_assert_eq(inside, unit->offset + unit->count, "variant %d unit %d", variant, u);
            next = unit->offset + unit->count;
            next_param = unit->first_param + unit->n_params;
        }
        cr_assert_eq(next, table.total);
        cr_assert_eq(next_param, table.n_params);
        param_table_free(&table);
    }
}

Test(model, layer_matrix_count_is_the_seven_projections_over_all_layers)
{
    ModelConfig config = test_small_model_config(true, false);
    ParamTable table;
    param_table_build(&table, &config);
    size_t per_layer = 16 * 8 + 8 * 8 + 8 * 8 + 8 * 16 + 3 * 12 * 8;
    cr_assert_eq(table.layer_matrix_count, 2 * per_layer);
    param_table_free(&table);
}

Test(model, kinds_map_to_their_no_decay_bits_and_matrices_always_decay)
{
    cr_assert_eq(param_kind_no_decay_bit(PARAM_EMBEDDING), NO_DECAY_EMBEDDINGS);
    cr_assert_eq(param_kind_no_decay_bit(PARAM_NORM), NO_DECAY_NORMS);
    cr_assert_eq(param_kind_no_decay_bit(PARAM_BIAS), NO_DECAY_BIASES);
    cr_assert_eq(param_kind_no_decay_bit(PARAM_ROUTING), NO_DECAY_ROUTING);
    cr_assert_eq(param_kind_no_decay_bit(PARAM_MATRIX), 0);

    ModelConfig config = test_small_model_config(true, false);
    ParamTable table;
    param_table_build(&table, &config);
    cr_assert_eq(param_table_find(&table, "lm_head.weight")->kind, PARAM_EMBEDDING);
    cr_assert_eq(param_table_find(&table, "model.embed_tokens.weight")->kind, PARAM_EMBEDDING);
    cr_assert_eq(param_table_find(&table, "model.norm.weight")->kind, PARAM_NORM);
    cr_assert_eq(param_table_find(&table, "model.layers.0.mlp.up_proj.weight")->kind,
                 PARAM_MATRIX);
    param_table_free(&table);
}

Test(model, unknown_names_are_not_found)
{
    ModelConfig config = test_small_model_config(false, false);
    ParamTable table;
    param_table_build(&table, &config);
    cr_assert_null(param_table_find(&table, "model.layers.2.mlp.up_proj.weight"));
    cr_assert_null(param_table_find(&table, "model.layers.0.mlp.up_proj"));
    param_table_free(&table);
}

/* ---- init ---- */

Test(model, init_is_the_same_for_the_same_seed)
{
    ModelConfig config = test_small_model_config(true, false);
    ParamTable table;
    float *first = initial_params(&config, 7, 0.02, &table);
    param_table_free(&table);
    float *second = initial_params(&config, 7, 0.02, &table);
    cr_assert_eq(memcmp(first, second, table.total * sizeof(float)), 0);
    param_table_free(&table);
    free(first);
    free(second);
}

Test(model, init_of_matrices_changes_with_the_seed)
{
    ModelConfig config = test_small_model_config(false, false);
    ParamTable table;
    float *first = initial_params(&config, 7, 0.02, &table);
    param_table_free(&table);
    float *second = initial_params(&config, 8, 0.02, &table);
    for (int p = 0; p < table.n_params; p++) {
        const ParamEntry *entry = &table.params[p];
        if (entry->kind == PARAM_NORM)
            continue;
        size_t same = 0;
        for (size_t i = 0; i < entry->count; i++)
            same += first[entry->offset + i] == second[entry->offset + i];
        cr_assert_eq(same, 0, "%s: %zu of %zu values unchanged by the seed", entry->name, same,
                     entry->count);
    }
    param_table_free(&table);
    free(first);
    free(second);
}

Test(model, init_matrices_have_mean_zero_and_std_init_std)
{
    ModelConfig config = test_small_model_config(false, false);
    config.d_model = 64;
    config.ffn_dim = 256;
    ParamTable table;
    float *values = initial_params(&config, 3, 0.05, &table);
    for (int p = 0; p < table.n_params; p++) {
        const ParamEntry *entry = &table.params[p];
        if (entry->kind == PARAM_NORM || entry->count < 4096)
            continue;
        double sum = 0, squares = 0;
        for (size_t i = 0; i < entry->count; i++) {
            sum += values[entry->offset + i];
            squares += (double)values[entry->offset + i] * values[entry->offset + i];
        }
        double mean = sum / entry->count;
        double std = sqrt(squares / entry->count - mean * mean);
        /* 4096+ samples: the std of the sample mean is 0.05/64, of the sample std ~1.1% */
        cr_assert(fabs(mean) < 4 * 0.05 / 64, "%s mean %g", entry->name, mean);
        cr_assert(fabs(std / 0.05 - 1) < 0.05, "%s std %g, init_std 0.05", entry->name, std);
    }
    param_table_free(&table);
    free(values);
}

Test(model, init_norm_weights_are_one)
{
    ModelConfig config = test_small_model_config(true, false);
    ParamTable table;
    float *values = initial_params(&config, 3, 0.02, &table);
    int norms = 0;
    for (int p = 0; p < table.n_params; p++) {
        const ParamEntry *entry = &table.params[p];
        if (entry->kind != PARAM_NORM)
            continue;
        norms++;
        for (size_t i = 0; i < entry->count; i++)
            cr_assert_eq(values[entry->offset + i], 1.0f, "%s[%zu]", entry->name, i);
    }
    cr_assert_eq(norms, 2 * 4 + 1);
    param_table_free(&table);
    free(values);
}

Test(model, init_of_a_tensor_does_not_depend_on_the_other_tensors)
{
    ModelConfig plain = test_small_model_config(false, false),
        qwen = test_small_model_config(true, true);
    ParamTable plain_table, qwen_table;
    float *plain_values = initial_params(&plain, 11, 0.02, &plain_table);
    float *qwen_values = initial_params(&qwen, 11, 0.02, &qwen_table);
    const char *name = "model.layers.1.mlp.gate_proj.weight";
    const ParamEntry *a = param_table_find(&plain_table, name);
    const ParamEntry *b = param_table_find(&qwen_table, name);
    cr_assert_neq(a->offset, b->offset); /* the layouts differ ... */
    cr_assert_eq(memcmp(plain_values + a->offset, qwen_values + b->offset,
                        a->count * sizeof(float)), 0); /* ... the values do not */
    param_table_free(&plain_table);
    param_table_free(&qwen_table);
    free(plain_values);
    free(qwen_values);
}

Test(model, init_of_a_row_slice_equals_that_slice_of_the_whole_tensor)
{
    ModelConfig config = test_small_model_config(false, false);
    ParamTable table;
    param_table_build(&table, &config);
    const ParamEntry *entry = param_table_find(&table, "model.layers.0.mlp.down_proj.weight");
    float *whole = xmalloc(entry->count * sizeof(float));
    init_fill_param(whole, entry, 5, 0.02);
    /* rows 3..6 of [8, 12], starting at an odd element (inside a Box-Muller pair) */
    size_t first = 3 * 12 + 1, n = 3 * 12 + 5;
    float *slice = xmalloc(n * sizeof(float));
    init_fill_param_range(slice, entry, first, n, 5, 0.02);
    cr_assert_eq(memcmp(slice, whole + first, n * sizeof(float)), 0);
    free(whole);
    free(slice);
    param_table_free(&table);
}

/* ---- the model ---- */

Test(model, backward_twice_doubles_the_gradients)
{
    ModelConfig config = test_small_model_config(true, true);
    const int B = 2, T = 5;
    Model *model = model_create(backend_cpu(), &config, NULL, B, T);
    model_init_params(model, 1, 0.2);
    uint32_t inputs[10], targets[10];
    test_fill_tokens(inputs, 10, config.vocab_size, 1);
    test_fill_tokens(targets, 10, config.vocab_size, 2);
    model_forward(model, inputs, targets, B, 1e-3f);
    const size_t total = model_param_table(model)->total;
    float *once = xmalloc(total * sizeof(float)), *twice = xmalloc(total * sizeof(float));
    model_backward(model, 1.0f);
    backend_cpu()->download(once, model_grads(model), total * sizeof(float));
    model_backward(model, 1.0f);
    backend_cpu()->download(twice, model_grads(model), total * sizeof(float));
    size_t nonzero = 0;
    for (size_t i = 0; i < total; i++) {
        nonzero += once[i] != 0;
        once[i] *= 2;
    }
    /* a gradient made of several contributions (here the tied embedding: head and lookup)
     * is re-summed in another order the second time, so allow rounding */
    double error = test_relative_error(twice, once, total);
    cr_assert(error <= 1e-6, "twice vs 2 x once: relative error %.3g", error);
    cr_assert_gt(nonzero, total / 2);
    free(once);
    free(twice);
    model_destroy(model);
}

/* The projections' gradients are not zeroed by model_zero_grads but written by the next
 * backward (runtime/fsdp.h, "written first"; the untied head in chunks: its first chunk
 * writes, the others add): cleared gradients read as zeros, a backward after a clear gives
 * the bits of the first one, and one more adds to it. */
Test(model, cleared_gradients_read_as_zeros_and_the_next_backward_writes_them)
{
    ModelConfig config = test_small_model_config(true, false);
    const int B = 2, T = 5;
    Model *model = model_create(backend_cpu(), &config, NULL, B, T);
    model_init_params(model, 4, 0.2);
    model_set_logit_rows(model, 3); /* four chunks of the head's gradient */
    uint32_t inputs[10], targets[10];
    test_fill_tokens(inputs, 10, config.vocab_size, 7);
    test_fill_tokens(targets, 10, config.vocab_size, 8);
    const size_t total = model_param_table(model)->total;
    float *first = xmalloc(total * sizeof(float)), *again = xmalloc(total * sizeof(float));
    model_forward(model, inputs, targets, B, 1e-3f);
    model_backward(model, 1.0f);
    model_zero_grads(model);
    backend_cpu()->download(again, model_grads(model), total * sizeof(float));
    for (size_t i = 0; i < total; i++)
        cr_assert_eq(again[i], 0.0f, "element %zu after model_zero_grads: %g", i, again[i]);

    test_fill_tokens(inputs, 10, config.vocab_size, 9); /* another batch over stale gradients */
    model_forward(model, inputs, targets, B, 1e-3f);
    model_backward(model, 0.5f);
    backend_cpu()->download(first, model_grads(model), total * sizeof(float));
    model_zero_grads(model);
    model_backward(model, 0.5f);
    backend_cpu()->download(again, model_grads(model), total * sizeof(float));
    cr_assert_eq(memcmp(first, again, total * sizeof(float)), 0,
                 "a backward after a clear differs from the first");
    model_backward(model, 0.5f);
    backend_cpu()->download(again, model_grads(model), total * sizeof(float));
    const ParamTable *table = model_param_table(model);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        for (size_t i = entry->offset; i < entry->offset + entry->count; i++)
            cr_assert_float_eq(again[i], 2.0f * first[i], 1e-6f * (1.0f + fabsf(first[i])),
                               "%s: %g after two backwards, %g after one", entry->name,
                               again[i], first[i]);
    }
    free(first);
    free(again);
    model_destroy(model);
}

Test(model, loss_scale_scales_the_gradients)
{
    ModelConfig config = test_small_model_config(false, false);
    Model *model = model_create(backend_cpu(), &config, NULL, 1, 6);
    model_init_params(model, 2, 0.2);
    uint32_t inputs[6], targets[6];
    test_fill_tokens(inputs, 6, config.vocab_size, 3);
    test_fill_tokens(targets, 6, config.vocab_size, 4);
    model_forward(model, inputs, targets, 1, 0.0f);
    const size_t total = model_param_table(model)->total;
    float *unit = xmalloc(total * sizeof(float)), *scaled = xmalloc(total * sizeof(float));
    model_backward(model, 1.0f);
    backend_cpu()->download(unit, model_grads(model), total * sizeof(float));
    model_zero_grads(model);
    model_backward(model, 0.25f); /* a power of two: the scaled gradients are exact */
    backend_cpu()->download(scaled, model_grads(model), total * sizeof(float));
    for (size_t i = 0; i < total; i++)
        cr_assert_eq(scaled[i], 0.25f * unit[i], "element %zu", i);
    free(unit);
    free(scaled);
    model_destroy(model);
}

Test(model, a_batch_smaller_than_max_batch_gives_the_logits_of_a_model_sized_for_it)
{
    ModelConfig config = test_small_model_config(true, false);
    const int T = 4;
    Model *large = model_create(backend_cpu(), &config, NULL, 3, T);
    Model *exact = model_create(backend_cpu(), &config, NULL, 1, T);
    model_init_params(large, 9, 0.2);
    model_init_params(exact, 9, 0.2);
    uint32_t inputs[4], targets[4];
    test_fill_tokens(inputs, 4, config.vocab_size, 5);
    test_fill_tokens(targets, 4, config.vocab_size, 6);
    ModelLoss a = model_forward(large, inputs, targets, 1, 0.0f);
    ModelLoss b = model_forward(exact, inputs, targets, 1, 0.0f);
    cr_assert_eq(a.loss, b.loss);
    cr_assert(test_logits_bitwise_equal(large, exact));
    model_destroy(large);
    model_destroy(exact);
}

static void forward_a_token_outside_the_vocabulary(void *unused)
{
    (void)unused;
    ModelConfig config = test_small_model_config(false, false);
    Model *model = model_create(backend_cpu(), &config, NULL, 1, 2);
    uint32_t inputs[2] = {0, 11}, targets[2] = {1, 2};
    model_forward(model, inputs, targets, 1, 0.0f);
}

Test(model, a_token_outside_the_vocabulary_is_a_data_error)
{
    test_expect_fatal(forward_a_token_outside_the_vocabulary, NULL, EXIT_DATA,
                      "input token 11 at position 1 is outside the vocabulary "
                      "(model.vocab_size = 11)");
}

static void create_with_three_kv_heads(void *unused)
{
    (void)unused;
    ModelConfig config = test_small_model_config(false, false);
    config.n_kv_heads = 3;
    model_create(backend_cpu(), &config, NULL, 1, 2);
}

Test(model, kv_heads_that_do_not_divide_the_heads_are_a_config_error)
{
    test_expect_fatal(create_with_three_kv_heads, NULL, EXIT_CONFIG,
                      "model.n_kv_heads = 3 must divide model.n_heads = 4");
}
