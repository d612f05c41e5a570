/* tests/test_config.c — the YAML config (DESIGN 6): defaults, types, --set, malformed files,
 * the round trip through config_to_yaml, the users' reference. Impossible values and keys
 * that do nothing: tests/test_config_validation.c. Bad input loads in a forked child
 * (config_support.h).
 */
#include "runtime/config.h"
#include "runtime/config_keys.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/config_support.h"

/* --- in-process loading ------------------------------------------------------------------ */

/* Loads in this process; what the load writes to stderr (its warnings) lands in `printed`. */
static Config load_text_printing(const char *yaml, const char *const *overrides,
                                 int n_overrides, int world_size, char *printed,
                                 size_t capacity)
{
    Config config;
    TestCapture capture;
    test_capture_begin(&capture, STDERR_FILENO);
    config_load_text(&config, yaml, "test.yaml", overrides, n_overrides, world_size);
    test_capture_end(&capture, printed, capacity);
    return config;
}

/* Loads in this process a config that warns about nothing. */
static Config load_text(const char *yaml, const char *const *overrides, int n_overrides,
                        int world_size)
{
    char printed[2048];
    Config config = load_text_printing(yaml, overrides, n_overrides, world_size, printed,
                                       sizeof printed);
    cr_assert_str_empty(printed, "the load printed: %s", printed);
    return config;
}

/* Exactly one warning line, holding `fragment`. */
static void assert_one_warning(const char *printed, const char *fragment)
{
    cr_assert(!strncmp(printed, "fathom: warning: ", 17), "not a warning: %s", printed);
    cr_assert(strstr(printed, fragment), "the warning does not say '%s': %s", fragment,
              printed);
    const char *newline = strchr(printed, '\n');
    cr_assert(newline && newline[1] == '\0', "more than one line: %s", printed);
}

static Config load_with_set(const char *override)
{
    const char *overrides[] = {override};
    return load_text("", overrides, 1, 1);
}

/* Every key set, none to its default; valid on 4 ranks (pp 2 x dp 2). */
static const char full_yaml[] =
    "model:\n"
    "  vocab_size: 512\n"
    "  d_model: 96\n"
    "  n_layers: 6\n"
    "  n_heads: 6\n"
    "  n_kv_heads: 3\n"
    "  head_dim: 16\n"
    "  ffn_dim: 256\n"
    "  rope_theta: 500000\n"
    "  rope_scaling:\n"
    "    type: llama3\n"
    "    factor: 4.5\n"
    "    low_freq_factor: 1.5\n"
    "    high_freq_factor: 3.25\n"
    "    original_max_position: 4096\n"
    "  norm_eps: 1e-6\n"
    "  qk_norm: true\n"
    "  tie_embeddings: true\n"
    "  init_std: 0.0125\n"
    "residual:\n"
    "  mode: msar\n"
    "  heads: 4\n"
    "  granularity: full\n"
    "  layers_per_block: 2\n"
    "  form: delta\n"
    "  streams: 3\n"
    "  stream_kernels:\n"
    "    - 1\n"
    "    - 3\n"
    "    - 5\n"
    "parallel:\n"
    "  pp: 2\n"
    "  dp: 2\n"
    "  virtual_stages: 3\n"
    "  schedule: interleaved\n"
    "  layer_split: [1, 1, 1, 1, 1, 1]\n"
    "  timeout_s: 42.5\n"
    "  gpus_per_node: 2\n"
    "fsdp:\n"
    "  reshard_after_forward: false\n"
    "train:\n"
    "  steps: 17\n"
    "  seq_len: 33\n"
    "  microbatch_size: 3\n"
    "  global_batch_size: 12\n"
    "  activation_checkpointing: full\n"
    "  max_skipped: 0\n"
    "  z_loss: 0\n"
    "optim:\n"
    "  lr: 1.5e-4\n"
    "  min_lr_ratio: 0.3333333333333333\n"
    "  warmup_steps: 0\n"
    "  schedule: wsd\n"
    "  decay_fraction: 0.25\n"
    "  beta1: 0.8\n"
    "  beta2: 0.99\n"
    "  eps: 1e-10\n"
    "  weight_decay: 0.05\n"
    "  no_decay: [norms, routing]\n"
    "  grad_clip: 0\n"
    "  ema_decay: 0\n"
    "  route_lr_mult: 2.5\n"
    "  route_weight_decay: 0.01\n"
    "data:\n"
    "  source: shards\n"
    "  train: /data/train-*.h5\n"
    "  val: '/data/val.h5'\n"
    "checkpoint:\n"
    "  every: 50\n"
    "  keep_last: 0\n"
    "  keep_every: 1000\n"
    "  save_final: false\n"
    "log:\n"
    "  every: 1\n"
    "eval:\n"
    "  every: 25\n"
    "  samples: 6\n"
    "run_dir: \"runs/full: \\\"quoted\\\" \\\\ path\\t# not a comment\"\n"
    "seed: 18446744073709551615\n"
    "device: cpu\n"
    "matmul_algorithms: tables/h200.matmul\n";

/* --- defaults and round trips ------------------------------------------------------------ */

Test(config, defaults_validate)
{
    ChildResult result = load_in_child((LoadRequest){.path = NULL, .world_size = 1});
    cr_assert_eq(result.exit_code, 0, "defaults rejected: %s", result.message);
}

Test(config, defaults_are_the_small_synthetic_baseline)
{
    Config config;
    config_defaults(&config);
    cr_assert_eq(config.model.vocab_size, 256);
    cr_assert_eq(config.model.d_model, 128);
    cr_assert_eq(config.model.n_layers, 4);
    cr_assert_eq(config.residual.mode, RESIDUAL_STANDARD);
    cr_assert_eq(config.data.source, DATA_SYNTHETIC);
    cr_assert_eq(config.train.global_batch_size, 16);
    cr_assert_str_eq(config.run_dir, "runs/demo");
}

/* The full file sets residual.layers_per_block with full granularity, which warns. */
static Config load_full_file(const char *yaml)
{
    char printed[2048];
    Config full = load_text_printing(yaml, NULL, 0, 4, printed, sizeof printed);
    assert_one_warning(printed, "test.yaml: residual.layers_per_block is set but does "
                                "nothing: residual.granularity is full");
    return full;
}

Test(config, full_file_sets_every_key_away_from_its_default)
{
    Config defaults, full = load_full_file(full_yaml);
    config_defaults(&defaults);
    for (int i = 0; i < config_key_count; i++) {
        const ConfigKey *key = &config_key_table[i];
        cr_expect(memcmp((char *)&full + key->offset, (char *)&defaults + key->offset,
                         key->size) != 0,
                  "the full test file leaves %s at its default", key->path);
    }
}

Test(config, full_file_round_trips_through_config_to_yaml)
{
    Config full = load_full_file(full_yaml);
    char *yaml = config_to_yaml(&full);
    Config again = load_full_file(yaml);
    cr_assert(memcmp(&full, &again, sizeof full) == 0, "round trip differs; YAML:\n%s", yaml);
    free(yaml);
}

Test(config, defaults_round_trip_through_config_to_yaml)
{
    Config defaults;
    config_defaults(&defaults);
    char *yaml = config_to_yaml(&defaults);
    Config again = load_text(yaml, NULL, 0, 1);
    cr_assert(memcmp(&defaults, &again, sizeof defaults) == 0, "round trip differs:\n%s", yaml);
    free(yaml);
}

Test(config, config_to_yaml_prints_every_key)
{
    Config defaults;
    config_defaults(&defaults);
    char *yaml = config_to_yaml(&defaults);
    for (int i = 0; i < config_key_count; i++) {
        const char *path = config_key_table[i].path, *dot = strrchr(path, '.');
        char line[128];
        snprintf(line, sizeof line, "%s: ", dot ? dot + 1 : path);
        cr_expect(strstr(yaml, line), "%s missing from:\n%s", path, yaml);
    }
    free(yaml);
}

Test(config, demo_yaml_holds_the_defaults)
{
    Config demo, defaults;
    config_load(&demo, FATHOM_SOURCE_DIR "/launch/configs/demo.yaml", NULL, 0, 1);
    config_defaults(&defaults);
    cr_assert(memcmp(&demo, &defaults, sizeof demo) == 0);
}

Test(config, small_examples_validate_on_one_rank)
{
    const char *names[] = {"demo_block_mhar.yaml", "demo_msar.yaml", "demo_attnres.yaml",
                           "demo_mhar_delta.yaml"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/launch/configs/%s", FATHOM_SOURCE_DIR, names[i]);
        ChildResult result = load_in_child((LoadRequest){.path = path, .world_size = 1});
        cr_expect_eq(result.exit_code, 0, "%s: %s", names[i], result.message);
    }
}

Test(config, marin8b_example_validates_on_eight_ranks)
{
    Config config;
    config_load(&config, FATHOM_SOURCE_DIR "/launch/configs/marin8b_block_mhar.yaml", NULL, 0,
                8);
    cr_assert_eq(config.model.d_model, 4096);
    cr_assert(config.model.rope_scaling.llama3);
}

/* --- YAML types ------------------------------------------------------------------------- */

Test(config, float_keys_accept_exponents_and_integers)
{
    Config config = load_text("optim:\n  lr: 1e-4\n  grad_clip: 3\n", NULL, 0, 1);
    cr_assert_eq(config.optim.lr, 1e-4);
    cr_assert_eq(config.optim.grad_clip, 3.0);
}

Test(config, lists_read_as_flow_or_block_sequences)
{
    char printed[2048];
    Config flow = load_text_printing("residual:\n  stream_kernels: [3, 5]\n", NULL, 0, 1,
                                     printed, sizeof printed);
    assert_one_warning(printed, "residual.stream_kernels is set but does nothing");
    Config block = load_text_printing("residual:\n  stream_kernels:\n    - 3\n    - 5\n",
                                      NULL, 0, 1, printed, sizeof printed);
    assert_one_warning(printed, "residual.stream_kernels is set but does nothing");
    cr_assert_eq(flow.residual.n_stream_kernels, 2);
    cr_assert(memcmp(&flow, &block, sizeof flow) == 0);
}

Test(config, null_rope_scaling_turns_scaling_off)
{
    const char *overrides[] = {"model.rope_scaling=null"};
    Config config = load_text("model:\n  rope_scaling: {type: llama3}\n", overrides, 1, 1);
    cr_assert_not(config.model.rope_scaling.llama3);
}

Test(config, quoted_number_is_not_an_integer)
{
    assert_config_error(load_text_in_child("model:\n  d_model: \"128\"\n"), "model.d_model",
                        "test.yaml:2");
}

/* --- --set ------------------------------------------------------------------------------ */

Test(config, set_overrides_an_int)
{
    cr_assert_eq(load_with_set("model.d_model=64").model.d_model, 64);
}

Test(config, set_overrides_a_float)
{
    cr_assert_eq(load_with_set("optim.lr=2.5e-4").optim.lr, 2.5e-4);
}

Test(config, set_overrides_a_bool)
{
    cr_assert(load_with_set("model.qk_norm=true").model.qk_norm);
}

Test(config, set_overrides_an_enum)
{
    cr_assert_eq(load_with_set("parallel.schedule=gpipe").parallel.schedule, SCHEDULE_GPIPE);
}

Test(config, set_overrides_a_list)
{
    const char *overrides[] = {"residual.stream_kernels=[3, 5]"};
    char printed[2048];
    Config config = load_text_printing("", overrides, 1, 1, printed, sizeof printed);
    assert_one_warning(printed, "test.yaml with --set: residual.stream_kernels is set but "
                                "does nothing: residual.mode is not msar");
    cr_assert_eq(config.residual.n_stream_kernels, 2);
    cr_assert_eq(config.residual.stream_kernels[0], 3);
    cr_assert_eq(config.residual.stream_kernels[1], 5);
    cr_assert_eq(config.residual.stream_kernels[2], 0, "entries past the list are cleared");
}

Test(config, set_overrides_a_nested_rope_scaling_key)
{
    cr_assert_eq(load_with_set("model.rope_scaling.factor=16").model.rope_scaling.factor, 16.0);
}

Test(config, set_applies_after_the_file_and_in_order)
{
    const char *overrides[] = {"model.d_model=96", "model.d_model=64"};
    Config config = load_text("model:\n  d_model: 256\n", overrides, 2, 1);
    cr_assert_eq(config.model.d_model, 64);
}

Test(config, set_without_equals_is_an_error)
{
    assert_config_error(set_in_child("model.d_model"), "--set model.d_model", NULL);
}

Test(config, set_unknown_key_is_an_error_naming_it)
{
    assert_config_error(set_in_child("model.d_modle=64"), "'model.d_modle'", NULL);
}

Test(config, set_value_of_the_wrong_type_is_an_error)
{
    assert_config_error(set_in_child("train.steps=many"), "train.steps", "many");
}

Test(config, microbatches_per_rank_divide_the_global_batch)
{
    const char *overrides[] = {"parallel.dp=2", "train.microbatch_size=2"};
    Config config = load_text("", overrides, 2, 2);
    cr_assert_eq(config_microbatches_per_rank(&config), 4);
}

/* --- bad files --------------------------------------------------------------------------- */

Test(config, unknown_top_level_key_is_an_error_naming_it)
{
    assert_config_error(load_text_in_child("modle:\n  d_model: 64\n"), "'modle'", "test.yaml:1");
}

Test(config, unknown_nested_key_is_an_error_naming_its_full_path)
{
    assert_config_error(load_text_in_child("model:\n  d_modle: 64\n"), "'model.d_modle'",
                        "test.yaml:2");
}

Test(config, string_for_an_int_is_an_error)
{
    assert_config_error(load_text_in_child("model:\n  d_model: abc\n"), "model.d_model",
                        "test.yaml:2");
}

Test(config, float_for_an_int_is_an_error)
{
    assert_config_error(load_text_in_child("model:\n  d_model: 1.5\n"), "model.d_model",
                        "test.yaml:2");
}

Test(config, unknown_enum_name_is_an_error)
{
    assert_config_error(load_text_in_child("residual:\n  mode: mhar\n"), "residual.mode",
                        "test.yaml:2");
}

Test(config, bool_other_than_true_or_false_is_an_error)
{
    assert_config_error(load_text_in_child("model:\n  qk_norm: yes\n"), "model.qk_norm",
                        "test.yaml:2");
}

Test(config, duplicate_key_is_an_error)
{
    assert_config_error(load_text_in_child("model:\n  d_model: 64\n  d_model: 96\n"),
                        "duplicate key 'model.d_model'", "test.yaml:3");
}

Test(config, malformed_yaml_is_an_error_with_file_and_line)
{
    assert_config_error(load_text_in_child("model:\n  d_model: 64\n\tn_layers: 2\n"),
                        "test.yaml:3", "malformed YAML");
}

Test(config, missing_file_is_an_error_naming_the_path)
{
    ChildResult result =
        load_in_child((LoadRequest){.path = "/nonexistent/fathom.yaml", .world_size = 1});
    assert_config_error(result, "/nonexistent/fathom.yaml", NULL);
}

/* DESIGN 5: the saved config is YAML that a YAML 1.1 reader (PyYAML, which reads 1e-05 as a
 * string and 10000 as an int) types as fathom does: every float key a float, every int key
 * an int, for the defaults and for values that print with an exponent. */
Test(config, saved_yaml_types_every_number_as_pyyaml_reads_it)
{
    Config config;
    config_load_text(&config, "model:\n  norm_eps: 1e-5\n  rope_theta: 500000\n"
                              "optim:\n  eps: 1e-8\n  lr: 3e-4\n", "test", NULL, 0, 1);
    char *yaml = config_to_yaml(&config);
    char dir[256], path[300], command[1 << 14];
    test_make_temp_dir(dir, "yaml-types");
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    test_write_file(path, yaml);
    free(yaml);
    int n = snprintf(command, sizeof command,
                     "python3 -c \"import yaml, sys\n"
                     "c = yaml.safe_load(open('%s'))\n"
                     "def at(p):\n"
                     "    v = c\n"
                     "    for k in p.split('.'):\n"
                     "        v = v[k]\n"
                     "    return v\n"
                     "bad = [(p, t, repr(at(p))) for p, t in [", path);
    for (int i = 0; i < config_key_count; i++) {
        const ConfigKey *key = &config_key_table[i];
        if (key->type == KEY_FLOAT || key->type == KEY_INT)
            n += snprintf(command + n, sizeof command - (size_t)n, "('%s', %s), ", key->path,
                          key->type == KEY_FLOAT ? "float" : "int");
    }
    snprintf(command + n, sizeof command - (size_t)n,
             "] if type(at(p)) is not t]\n"
             "print(bad)\n"
             "sys.exit(1 if bad else 0)\"");
    char output[8192];
    cr_expect_eq(test_run_command(command, output, sizeof output), 0,
                 "PyYAML types these keys otherwise: %s", output);
    test_remove_tree(dir);
}

Test(config, vocab_size_auto_reads_back_as_auto_until_resolved)
{
    Config config = load_text("model:\n  vocab_size: auto\n", NULL, 0, 1);
    cr_assert_eq(config.model.vocab_size, CONFIG_AUTO);
    char *yaml = config_to_yaml(&config);
    cr_assert(strstr(yaml, "vocab_size: auto\n"), "%s", yaml);
    Config again = load_text(yaml, NULL, 0, 1);
    cr_assert(memcmp(&config, &again, sizeof config) == 0);
    free(yaml);
}

/* docs/config.md is the users' reference: every key of the table has a row, and the row
 * states the key's default as config_to_yaml writes it. */
Test(config, every_key_is_in_the_config_reference_with_its_default)
{
    char path[512];
    snprintf(path, sizeof path, "%s/docs/config.md", test_source_dir());
    FILE *file = fopen(path, "r");
    cr_assert(file, "no %s", path);
    static char text[1 << 16];
    const size_t length = fread(text, 1, sizeof text - 1, file);
    text[length] = '\0';
    fclose(file);
    Config defaults;
    config_defaults(&defaults);
    for (int i = 0; i < config_key_count; i++) {
        const ConfigKey *key = &config_key_table[i];
        char name[128];
        snprintf(name, sizeof name, "| `%s` |", key->path);
        const char *row = strstr(text, name);
        cr_expect(row, "docs/config.md has no row for %s", key->path);
        if (!row)
            continue;
        char *value = NULL;
        size_t size = 0;
        FILE *out = open_memstream(&value, &size);
        config_key_write_value(&defaults, key, out);
        fclose(out);
        const char *end = strchr(row, '\n');
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(end ? end - row : (long)strlen(row)), row);
        cr_expect(strstr(line, value) || (!strcmp(value, "\"\"") && strstr(line, "\"\"")),
                  "the row of %s does not state its default %s: %s", key->path, value, line);
        free(value);
    }
}
