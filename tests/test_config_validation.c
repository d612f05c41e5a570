/* tests/test_config_validation.c — configs the build cannot honour (DESIGN 6): impossible
 * values and combinations are exit 2 naming the keys; a key that does nothing in its mode is
 * one warning line naming it. Each bad input loads in a forked child (config_support.h).
 */
#include "tests/config_support.h"

#include <criterion/criterion.h>
#include <string.h>

/* --- impossible values and combinations ------------------------------------------------- */

Test(config, n_kv_heads_must_divide_n_heads)
{
    assert_config_error(load_text_in_child("model:\n  n_heads: 4\n  n_kv_heads: 3\n"),
                        "model.n_kv_heads", "model.n_heads");
}

Test(config, head_dim_must_be_even)
{
    assert_config_error(load_text_in_child("model:\n  head_dim: 33\n"), "model.head_dim", NULL);
}

Test(config, d_model_zero_is_an_error)
{
    assert_config_error(load_text_in_child("model:\n  d_model: 0\n"), "model.d_model", NULL);
}

Test(config, negative_n_layers_is_an_error)
{
    assert_config_error(load_text_in_child("model:\n  n_layers: -1\n"), "model.n_layers", NULL);
}

Test(config, residual_heads_must_divide_d_model)
{
    assert_config_error(load_text_in_child("residual:\n  heads: 3\n"), "residual.heads",
                        "model.d_model");
}

Test(config, layers_per_block_zero_is_an_error)
{
    assert_config_error(load_text_in_child("residual:\n  layers_per_block: 0\n"),
                        "residual.layers_per_block", NULL);
}

Test(config, layers_per_block_above_n_layers_is_an_error)
{
    assert_config_error(load_text_in_child("residual:\n  layers_per_block: 5\n"),
                        "residual.layers_per_block", "model.n_layers");
}

Test(config, msar_with_zero_streams_is_an_error)
{
    assert_config_error(load_text_in_child("residual:\n  mode: msar\n  streams: 0\n"),
                        "residual.streams", NULL);
}

Test(config, stream_kernel_zero_is_an_error)
{
    assert_config_error(
        load_text_in_child(
            "residual:\n  mode: msar\n  streams: 4\n  stream_kernels: [1, 0, 4, 8]\n"),
        "residual.stream_kernels", NULL);
}

Test(config, msar_needs_one_stream_kernel_per_stream)
{
    assert_config_error(load_text_in_child("residual:\n  mode: msar\n  streams: 2\n"),
                        "residual.stream_kernels", "residual.streams");
}

Test(config, global_batch_must_divide_into_microbatches)
{
    assert_config_error(
        load_text_in_child("train:\n  microbatch_size: 8\n  global_batch_size: 20\n"),
        "train.global_batch_size", "train.microbatch_size");
}

Test(config, pp_times_dp_must_equal_the_world_size)
{
    assert_config_error(load_text_in_child("parallel:\n  dp: 2\n"), "parallel.dp", NULL);
}

Test(config, layer_split_must_sum_to_n_layers)
{
    ChildResult result = load_in_child((LoadRequest){
        .yaml = "parallel:\n  pp: 2\n  layer_split: [1, 2]\n", .world_size = 2});
    assert_config_error(result, "parallel.layer_split", "model.n_layers");
}

Test(config, shards_need_data_train)
{
    assert_config_error(load_text_in_child("data:\n  source: shards\n"), "data.train", NULL);
}

Test(config, llama3_high_freq_factor_must_exceed_low)
{
    assert_config_error(
        load_text_in_child("model:\n  rope_scaling: {type: llama3, high_freq_factor: 1}\n"),
        "model.rope_scaling.high_freq_factor", NULL);
}

Test(config, beta_of_one_is_an_error)
{
    assert_config_error(load_text_in_child("optim:\n  beta2: 1\n"), "optim.beta2", NULL);
}

/* DESIGN 6: a key that does nothing is one warning line naming it, or an error. */
static void expect_warning(const char *yaml, const char *key)
{
    ChildResult result = load_text_in_child(yaml);
    cr_expect_eq(result.exit_code, 0, "%s", result.message);
    cr_expect(strstr(result.message, "warning") && strstr(result.message, key) &&
                  strstr(result.message, "does nothing"),
              "no warning naming %s: '%s'", key, result.message);
}

Test(config, residual_keys_of_another_mode_are_a_warning_naming_the_key)
{
    expect_warning("residual:\n  mode: standard\n  heads: 4\n", "residual.heads");
    expect_warning("residual:\n  mode: standard\n  form: delta\n", "residual.form");
    expect_warning("residual:\n  mode: attnres\n  streams: 2\n", "residual.streams");
    expect_warning("residual:\n  mode: attnres\n  granularity: full\n  layers_per_block: 2\n",
                   "residual.layers_per_block");
}

Test(config, the_defaults_warn_of_nothing)
{
    ChildResult result = load_text_in_child("");
    cr_expect_eq(result.exit_code, 0);
    cr_expect(!strstr(result.message, "warning"), "'%s'", result.message);
}

Test(config, an_msar_kernel_longer_than_the_sequence_is_refused)
{
    assert_config_error(load_text_in_child("train:\n  seq_len: 64\nresidual:\n  mode: msar\n"
                                           "  streams: 2\n  stream_kernels: [1, 1000]\n"),
                        "residual.stream_kernels", "train.seq_len");
}

Test(config, an_integer_too_large_for_a_key_is_out_of_range_not_a_wrong_type)
{
    assert_config_error(set_in_child("model.vocab_size=4000000000"), "model.vocab_size",
                        "out of range");
    assert_config_error(set_in_child("model.vocab_size=99999999999999999999999"),
                        "model.vocab_size", "out of range");
    assert_config_error(set_in_child("model.vocab_size=4e9"), "model.vocab_size",
                        "expected an integer");
}

Test(config, vocab_size_takes_auto_only_unquoted_and_numbers_from_1)
{
    assert_config_error(load_text_in_child("model:\n  vocab_size: \"auto\"\n"),
                        "model.vocab_size", "expected an integer or auto");
    assert_config_error(set_in_child("model.vocab_size=0"), "model.vocab_size = 0",
                        "must be >= 1, or auto");
    assert_config_error(set_in_child("model.vocab_size=-2147483648"), "model.vocab_size",
                        "must be >= 1, or auto");
    assert_config_error(set_in_child("model.d_model=auto"), "model.d_model",
                        "expected an integer, got 'auto'");
}
