/* tests/test_convert.c — `fathom convert --from-hf` (DESIGN 5) end to end: Hugging Face
 * Llama-3 and Qwen3 directories made by transformers (tests/reference/make_convert_fixtures.py)
 * imported, then evaluated with `fathom eval --dump-logits` against the logits transformers
 * computed from the same files. */
#include <criterion/criterion.h>

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/checkpoint.h"
#include "model/params.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "support.h"

#define OUTPUT_CAPACITY 16384

static void fixture_path(char *path, size_t capacity, const char *name, const char *file)
{
    snprintf(path, capacity, "%s/tests/fixtures/hf/%s%s%s", test_source_dir(), name,
             file ? "/" : "", file ? file : "");
}

static int convert(const char *hf_dir, const char *config, const char *run_dir, char *output)
{
    char arguments[4096];
    snprintf(arguments, sizeof arguments, "convert --from-hf '%s' --config '%s' --to '%s'",
             hf_dir, config, run_dir);
    return test_run_fathom(arguments, output, OUTPUT_CAPACITY);
}

/* A dataset of an HDF5 file as floats, malloc'd. */
static float *read_floats(const char *path, const char *name, size_t *count)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert(file >= 0, "cannot open %s", path);
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    cr_assert(dataset >= 0, "%s has no %s", path, name);
    hid_t space = H5Dget_space(dataset);
    *count = (size_t)H5Sget_simple_extent_npoints(space);
    float *values = malloc(*count * sizeof *values);
    cr_assert(H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
    H5Sclose(space);
    H5Dclose(dataset);
    H5Fclose(file);
    return values;
}

/* `fathom eval` of the run's step 0 on the fixture's windows: its logits [N, T, V]. */
static float *eval_logits(const char *run_dir, const char *fixture, size_t *count)
{
    char windows[1024], arguments[4096], dump[1024], output[OUTPUT_CAPACITY];
    fixture_path(windows, sizeof windows, fixture, "windows.h5");
    snprintf(dump, sizeof dump, "%s/logits.h5", run_dir);
    snprintf(arguments, sizeof arguments, "eval --checkpoint '%s' --weights raw --data '%s' "
             "--samples 2 --dump-logits '%s'", run_dir, windows, dump);
    int code = test_run_fathom(arguments, output, sizeof output);
    cr_assert_eq(code, 0, "eval failed (%d):\n%s", code, output);
    return read_floats(dump, "logits", count);
}

/* convert + eval of a fixture with its own fathom.yaml: logits within 1e-5 of transformers'. */
static void expect_transformers_logits(const char *fixture)
{
    char dir[256], run[300], hf_dir[1024], config[1024], windows[1024];
    char output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-logits");
    snprintf(run, sizeof run, "%s/run", dir);
    fixture_path(hf_dir, sizeof hf_dir, fixture, NULL);
    fixture_path(config, sizeof config, fixture, "fathom.yaml");
    fixture_path(windows, sizeof windows, fixture, "windows.h5");
    int code = convert(hf_dir, config, run, output);
    cr_assert_eq(code, 0, "convert failed (%d):\n%s", code, output);
    cr_assert(strstr(output, "GB/s"), "no throughput in:\n%s", output);
    size_t n, n_reference;
    float *logits = eval_logits(run, fixture, &n);
    float *reference = read_floats(windows, "logits", &n_reference);
    cr_assert_eq(n, n_reference);
    double error = test_relative_error(logits, reference, n);
    cr_assert_leq(error, 1e-5, "%s: logits differ from transformers' by %.3g relative", fixture,
                  error);
    free(logits);
    free(reference);
    test_remove_tree(dir);
}

Test(convert, llama3_bf16_sharded_import_gives_the_logits_of_transformers)
{
    expect_transformers_logits("llama3_bf16_sharded");
}

Test(convert, llama3_f32_single_file_import_gives_the_logits_of_transformers)
{
    expect_transformers_logits("llama3_f32");
}

Test(convert, qwen3_f32_sharded_import_gives_the_logits_of_transformers)
{
    expect_transformers_logits("qwen3_f32_sharded");
}

Test(convert, qwen3_bf16_single_file_import_gives_the_logits_of_transformers)
{
    expect_transformers_logits("qwen3_bf16");
}

/* The fixture's fathom.yaml with `extra` appended, written to <dir>/<name>. */
static void config_variant(char *path, size_t capacity, const char *dir, const char *name,
                           const char *fixture, const char *extra)
{
    char source[1024], command[4096], output[256];
    fixture_path(source, sizeof source, fixture, "fathom.yaml");
    snprintf(path, capacity, "%s/%s", dir, name);
    snprintf(command, sizeof command, "cp '%s' '%s' && printf '%%s\\n' '%s' >> '%s'", source,
             path, extra, path);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
}

/* A delta graft of the import (alpha = 0, DESIGN 2.1) is the base model bit for bit. */
static void expect_graft_is_bitwise_the_base(const char *fixture, const char *residual)
{
    char dir[256], base_run[300], graft_run[300], hf_dir[1024], base_config[1024];
    char graft_config[512], output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-graft");
    snprintf(base_run, sizeof base_run, "%s/base", dir);
    snprintf(graft_run, sizeof graft_run, "%s/graft", dir);
    fixture_path(hf_dir, sizeof hf_dir, fixture, NULL);
    fixture_path(base_config, sizeof base_config, fixture, "fathom.yaml");
    config_variant(graft_config, sizeof graft_config, dir, "graft.yaml", fixture, residual);
    cr_assert_eq(convert(hf_dir, base_config, base_run, output), 0, "%s", output);
    cr_assert_eq(convert(hf_dir, graft_config, graft_run, output), 0, "%s", output);
    cr_assert(strstr(output, "routing weights fresh") && !strstr(output, " 0 routing weights"),
              "the graft made no routing weights:\n%s", output);
    size_t n_base, n_graft;
    float *base = eval_logits(base_run, fixture, &n_base);
    float *graft = eval_logits(graft_run, fixture, &n_graft);
    cr_assert_eq(n_base, n_graft);
    cr_assert_eq(memcmp(base, graft, n_base * sizeof(float)), 0,
                 "the graft's step-0 logits differ from the import's");
    free(base);
    free(graft);
    test_remove_tree(dir);
}

Test(convert, a_delta_mhar_graft_of_an_import_gives_the_standard_logits_bit_for_bit)
{
    expect_graft_is_bitwise_the_base("llama3_bf16_sharded",
                                     "residual: {mode: attnres, heads: 4, granularity: block, "
                                     "layers_per_block: 1, form: delta}");
}

Test(convert, a_delta_msar_graft_of_an_import_gives_the_standard_logits_bit_for_bit)
{
    expect_graft_is_bitwise_the_base("qwen3_bf16",
                                     "residual: {mode: msar, streams: 2, stream_kernels: [1, 2], "
                                     "heads: 2, granularity: block, layers_per_block: 1, "
                                     "form: delta}");
}

/* A copy of a fixture directory in <dir>/hf, for a test to damage. */
static void fixture_copy(char *copy, size_t capacity, const char *dir, const char *fixture)
{
    char source[1024], command[4096], output[256];
    fixture_path(source, sizeof source, fixture, NULL);
    snprintf(copy, capacity, "%s/hf", dir);
    snprintf(command, sizeof command, "cp -r '%s' '%s' && chmod -R u+w '%s'", source, copy, copy);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
}

/* Replaces the first `from` after `after` in a file by `to` (same length); the file may hold
 * binary bytes (a safetensors length) before them. */
static void file_replace(const char *path, const char *after, const char *from, const char *to)
{
    cr_assert_eq(strlen(from), strlen(to));
    FILE *file = fopen(path, "r+b");
    cr_assert_not_null(file, "cannot open %s", path);
    static char bytes[1 << 20];
    size_t n = fread(bytes, 1, sizeof bytes, file);
    char *anchor = memmem(bytes, n, after, strlen(after));
    cr_assert_not_null(anchor, "%s has no %s", path, after);
    char *at = memmem(anchor, n - (size_t)(anchor - bytes), from, strlen(from));
    cr_assert_not_null(at, "%s has no %s after %s", path, from, after);
    fseek(file, at - bytes, SEEK_SET);
    fwrite(to, 1, strlen(to), file);
    fclose(file);
}

/* Converts the damaged copy <dir>/hf with the fixture's config; expects `code` and every one
 * of `needles` in the message. */
static void expect_convert_fails(const char *dir, const char *fixture, const char *config,
                                 int code, const char *const *needles, int n_needles)
{
    char hf_dir[300], run[300], fixture_config[1024], output[OUTPUT_CAPACITY];
    snprintf(hf_dir, sizeof hf_dir, "%s/hf", dir);
    snprintf(run, sizeof run, "%s/run", dir);
    fixture_path(fixture_config, sizeof fixture_config, fixture, "fathom.yaml");
    int got = convert(hf_dir, config ? config : fixture_config, run, output);
    cr_assert_eq(got, code, "exit %d, expected %d:\n%s", got, code, output);
    for (int i = 0; i < n_needles; i++)
        cr_assert(strstr(output, needles[i]), "'%s' missing from:\n%s", needles[i], output);
    char step_dir[512];
    cr_assert_not(checkpoint_find_latest(run, step_dir, sizeof step_dir),
                  "a failed convert left a checkpoint");
}

Test(convert, a_tensor_of_another_shape_is_exit_3_naming_it)
{
    char dir[256], copy[300], path[400];
    test_make_temp_dir(dir, "convert-shape");
    fixture_copy(copy, sizeof copy, dir, "llama3_f32");
    snprintf(path, sizeof path, "%s/model.safetensors", copy);
    /* [128, 64] -> [64, 128]: the same bytes, so only the shape check can catch it */
    file_replace(path, "\"model.layers.1.mlp.gate_proj.weight\"", "[128,64]", "[64,128]");
    const char *needles[] = {"model.layers.1.mlp.gate_proj.weight", "[64, 128]", "[128, 64]"};
    expect_convert_fails(dir, "llama3_f32", NULL, EXIT_DATA, needles, 3);
    test_remove_tree(dir);
}

Test(convert, a_missing_tensor_is_exit_3_naming_it)
{
    char dir[256], copy[300], path[400];
    test_make_temp_dir(dir, "convert-missing");
    fixture_copy(copy, sizeof copy, dir, "qwen3_bf16");
    snprintf(path, sizeof path, "%s/model.safetensors", copy);
    file_replace(path, "{", "model.layers.1.self_attn.k_norm.weight",
                 "model.layers.1.self_attn.k_norm.weighX");
    const char *needles[] = {"model.layers.1.self_attn.k_norm.weight", "missing"};
    expect_convert_fails(dir, "qwen3_bf16", NULL, EXIT_DATA, needles, 2);
    test_remove_tree(dir);
}

/* Adds <copy>/extra.safetensors holding one [2] fp32 tensor `name` to the weight_map. */
static void index_add_tensor(const char *copy, const char *name)
{
    char path[400], header[512], index[400];
    snprintf(path, sizeof path, "%s/extra.safetensors", copy);
    snprintf(header, sizeof header,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", name);
    FILE *file = fopen(path, "wb");
    uint64_t length = strlen(header);
    const float values[2] = {1, 2};
    fwrite(&length, 8, 1, file);
    fputs(header, file);
    fwrite(values, sizeof values, 1, file);
    fclose(file);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", copy);
    file = fopen(index, "rb");
    static char text[1 << 16], updated[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, file);
    text[n] = '\0';
    fclose(file);
    char *map = strstr(text, "\"weight_map\": {");
    cr_assert_not_null(map);
    map += strlen("\"weight_map\": {");
    snprintf(updated, sizeof updated, "%.*s\"%s\": \"extra.safetensors\", %s",
             (int)(map - text), text, name, map);
    test_write_file(index, updated);
}

Test(convert, a_tensor_fathom_has_no_place_for_is_exit_3_naming_it)
{
    char dir[256], copy[300];
    test_make_temp_dir(dir, "convert-extra");
    fixture_copy(copy, sizeof copy, dir, "qwen3_f32_sharded");
    index_add_tensor(copy, "model.layers.0.self_attn.q_proj.bias");
    const char *needles[] = {"model.layers.0.self_attn.q_proj.bias", "no place"};
    expect_convert_fails(dir, "qwen3_f32_sharded", NULL, EXIT_DATA, needles, 2);
    test_remove_tree(dir);
}

Test(convert, rotary_inv_freq_tensors_are_skipped)
{
    char dir[256], copy[300], run[300], config[1024], output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-inv-freq");
    fixture_copy(copy, sizeof copy, dir, "qwen3_f32_sharded");
    index_add_tensor(copy, "model.layers.0.self_attn.rotary_emb.inv_freq");
    snprintf(run, sizeof run, "%s/run", dir);
    fixture_path(config, sizeof config, "qwen3_f32_sharded", "fathom.yaml");
    cr_assert_eq(convert(copy, config, run, output), 0, "%s", output);
    cr_assert(strstr(output, "1 skipped"), "%s", output);
    test_remove_tree(dir);
}

Test(convert, a_config_json_that_disagrees_is_exit_2_naming_the_key)
{
    /* where, what, by what (the first `what` after `where` in config.json) */
    static const char *const cases[][3] = {
        {"\"intermediate_size\": 128", "128", "256"},
        {"\"rope_parameters\"", "8.0", "4.0"},                /* factor */
        {"\"rope_parameters\"", "64", "32"},                  /* original_max_position_... */
        {"\"num_key_value_heads\": 2", "2", "4"},
        {"\"rms_norm_eps\"", "1e-05", "1e-04"},
        {"\"tie_word_embeddings\"", "false", "true "},
    };
    static const char *const keys[][3] = {
        {"intermediate_size = 256", "model.ffn_dim = 128", NULL},
        {"rope_parameters.factor = 4", "model.rope_scaling.factor = 8", NULL},
        {"rope_parameters.original_max_position_embeddings = 32",
         "model.rope_scaling.original_max_position = 64", NULL},
        {"num_key_value_heads = 4", "model.n_kv_heads = 2", NULL},
        {"rms_norm_eps", "model.norm_eps", NULL},
        {"tie_word_embeddings = true", "model.tie_embeddings = false", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[256], copy[300], path[400];
        test_make_temp_dir(dir, "convert-config");
        fixture_copy(copy, sizeof copy, dir, "llama3_f32");
        snprintf(path, sizeof path, "%s/config.json", copy);
        file_replace(path, cases[i][0], cases[i][1], cases[i][2]);
        expect_convert_fails(dir, "llama3_f32", NULL, EXIT_CONFIG, keys[i], 2);
        test_remove_tree(dir);
    }
}

Test(convert, a_qwen3_config_json_under_a_config_without_qk_norm_is_exit_2)
{
    char dir[256], copy[300], config[512];
    test_make_temp_dir(dir, "convert-qk-norm");
    fixture_copy(copy, sizeof copy, dir, "qwen3_bf16");
    config_variant(config, sizeof config, dir, "no_qk_norm.yaml", "llama3_f32", "");
    /* llama3's config (no qk_norm, llama3 rope, untied) against the qwen3 files */
    const char *needles[] = {"model_type = qwen3", "model.qk_norm = false"};
    expect_convert_fails(dir, "qwen3_bf16", config, EXIT_CONFIG, needles, 2);
    test_remove_tree(dir);
}

/* transformers 4.x wrote rope_theta at the top and the scaling as rope_scaling, with the
 * key `rope_type` (or `type` before 4.45). */
Test(convert, the_transformers_4_rope_scaling_form_is_read_and_checked)
{
    static const char *const forms[] = {
        "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", "
        "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 64}",
        "\"rope_theta\": 500000.0, \"rope_scaling\": {\"type\": \"llama3\", "
        "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 64}",
        "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", "
        "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 2.0, "
        "\"original_max_position_embeddings\": 64}",
        "\"rope_theta\": 10000.0, \"rope_scaling\": null",
    };
    static const int codes[] = {0, 0, EXIT_CONFIG, EXIT_CONFIG};
    static const char *const needles[] = {"step 0", "step 0",
                                          "rope_scaling.high_freq_factor = 2",
                                          "rope_theta = 10000"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char dir[256], copy[300], path[400], run[300], config[1024], output[OUTPUT_CAPACITY];
        test_make_temp_dir(dir, "convert-rope4");
        fixture_copy(copy, sizeof copy, dir, "llama3_f32");
        snprintf(path, sizeof path, "%s/config.json", copy);
        char text[4096];
        snprintf(text, sizeof text,
                 "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 64, "
                 "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                 "\"num_key_value_heads\": 2, \"intermediate_size\": 128, "
                 "\"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false, "
                 "\"hidden_act\": \"silu\", %s}", forms[i]);
        test_write_file(path, text);
        snprintf(run, sizeof run, "%s/run", dir);
        fixture_path(config, sizeof config, "llama3_f32", "fathom.yaml");
        int code = convert(copy, config, run, output);
        cr_expect_eq(code, codes[i], "form %zu: exit %d:\n%s", i, code, output);
        cr_expect(strstr(output, needles[i]), "form %zu: '%s' missing from:\n%s", i,
                  needles[i], output);
        test_remove_tree(dir);
    }
}

Test(convert, a_missing_directory_or_file_is_exit_3_naming_it)
{
    char dir[256], copy[300], path[400], run[300], config[1024], output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-missing-file");
    snprintf(run, sizeof run, "%s/run", dir);
    fixture_path(config, sizeof config, "llama3_f32", "fathom.yaml");
    snprintf(path, sizeof path, "%s/nowhere", dir);
    cr_assert_eq(convert(path, config, run, output), EXIT_DATA, "%s", output);
    cr_assert(strstr(output, path), "%s", output);
    /* one shard of a sharded import gone */
    fixture_copy(copy, sizeof copy, dir, "llama3_bf16_sharded");
    snprintf(path, sizeof path, "%s/model-00003-of-00007.safetensors", copy);
    cr_assert_eq(remove(path), 0);
    cr_assert_eq(convert(copy, config, run, output), EXIT_DATA, "%s", output);
    cr_assert(strstr(output, path), "%s", output);
    test_remove_tree(dir);
}

Test(convert, a_truncated_safetensors_is_exit_3_naming_the_file)
{
    char dir[256], copy[300], path[400], command[1024], output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-truncated");
    fixture_copy(copy, sizeof copy, dir, "qwen3_bf16");
    snprintf(path, sizeof path, "%s/model.safetensors", copy);
    snprintf(command, sizeof command, "truncate -s -100 '%s'", path);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    const char *needles[] = {path, "truncated"};
    expect_convert_fails(dir, "qwen3_bf16", NULL, EXIT_DATA, needles, 2);
    test_remove_tree(dir);
}

Test(convert, a_run_dir_that_holds_a_checkpoint_is_refused)
{
    char dir[256], run[300], hf_dir[1024], config[1024], output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-twice");
    snprintf(run, sizeof run, "%s/run", dir);
    fixture_path(hf_dir, sizeof hf_dir, "qwen3_bf16", NULL);
    fixture_path(config, sizeof config, "qwen3_bf16", "fathom.yaml");
    cr_assert_eq(convert(hf_dir, config, run, output), 0, "%s", output);
    cr_assert_eq(convert(hf_dir, config, run, output), EXIT_CONFIG, "%s", output);
    cr_assert(strstr(output, "already holds a checkpoint"), "%s", output);
    test_remove_tree(dir);
}

/* One step of `fathom train` from the import: AdamW from zero moments gives
 * exp_avg = (1 - beta1) g and exp_avg_sq = (1 - beta2) g^2, so exp_avg_sq (1 - beta1)^2 =
 * exp_avg^2 (1 - beta2) element by element (any other start breaks it); and with lr 0 the
 * weights stay, so an EMA that starts at the weights stays at them (one from zero would be
 * (1 - decay) times them). */
Test(convert, training_continues_from_step_0_with_zero_moments_and_the_ema_at_the_weights)
{
    char dir[256], run[300], hf_dir[1024], config[512], arguments[2048];
    char output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-train");
    snprintf(run, sizeof run, "%s/run", dir);
    fixture_path(hf_dir, sizeof hf_dir, "llama3_f32", NULL);
    config_variant(config, sizeof config, dir, "train.yaml", "llama3_f32",
                   "optim: {lr: 1.0e-30, warmup_steps: 0, schedule: constant, weight_decay: 0.0, "
                   "grad_clip: 0.0, ema_decay: 0.9, beta1: 0.9, beta2: 0.95}");
    cr_assert_eq(convert(hf_dir, config, run, output), 0, "%s", output);
    snprintf(arguments, sizeof arguments, "train '%s' --set run_dir='%s' --set train.steps=1",
             config, run);
    int code = test_run_fathom(arguments, output, sizeof output);
    cr_assert_eq(code, 0, "train failed (%d):\n%s", code, output);
    cr_assert(strstr(output, "resumed at step 0"), "%s", output);

    Config loaded;
    config_load(&loaded, config, NULL, 0, CONFIG_ANY_WORLD);
    ParamTable table;
    param_table_build(&table, &loaded.model);
    CheckpointTensor *tensors = calloc((size_t)table.n_params, sizeof *tensors);
    for (int p = 0; p < table.n_params; p++)
        tensors[p] = (CheckpointTensor){table.params[p].name, table.params[p].ndim,
                                        {table.params[p].shape[0], table.params[p].shape[1],
                                         table.params[p].shape[2]},
                                        table.params[p].offset};
    float *step0[CKPT_GROUPS] = {0}, *step1[CKPT_GROUPS];
    for (int g = 0; g < CKPT_GROUPS; g++)
        step1[g] = calloc(table.total, sizeof(float));
    step0[CKPT_GROUP_MODEL] = calloc(table.total, sizeof(float));
    char step_dir[512];
    snprintf(step_dir, sizeof step_dir, "%s/checkpoints/step_00000000", run);
    cr_assert_eq(checkpoint_saved_groups(step_dir), 1u << CKPT_GROUP_MODEL,
                 "the import holds more than /model");
    checkpoint_load(step_dir, tensors, table.n_params, step0);
    snprintf(step_dir, sizeof step_dir, "%s/checkpoints/step_00000001", run);
    checkpoint_load(step_dir, tensors, table.n_params, step1);

    cr_assert_leq(test_relative_error(step1[CKPT_GROUP_EMA], step0[CKPT_GROUP_MODEL],
                                      table.total), 1e-6, "the EMA did not start at the weights");
    const float *m = step1[CKPT_GROUP_EXP_AVG], *v = step1[CKPT_GROUP_EXP_AVG_SQ];
    double worst = 0, scale = 0;
    for (size_t i = 0; i < table.total; i++) {
        double left = (double)v[i] * 0.01, right = (double)m[i] * m[i] * 0.05;
        worst = fabs(left - right) > worst ? fabs(left - right) : worst;
        scale = right > scale ? right : scale;
    }
    cr_assert_gt(scale, 0, "no gradient reached the moments");
    cr_assert_leq(worst, 1e-5 * scale, "the moments did not start at zero (%.3g of %.3g)",
                  worst, scale);
    for (int g = 0; g < CKPT_GROUPS; g++) {
        free(step0[g]);
        free(step1[g]);
    }
    free(tensors);
    param_table_free(&table);
    test_remove_tree(dir);
}

Test(convert, eval_of_an_import_reads_its_raw_weights_without_being_told)
{
    /* a step-0 import holds the model only: eval's default (the EMA) falls back to it */
    char dir[256], run[300], hf_dir[1024], config[1024], windows[1024], arguments[4096];
    char output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "convert-eval-default");
    snprintf(run, sizeof run, "%s/run", dir);
    fixture_path(hf_dir, sizeof hf_dir, "llama3_f32", NULL);
    fixture_path(config, sizeof config, "llama3_f32", "fathom.yaml");
    fixture_path(windows, sizeof windows, "llama3_f32", "windows.h5");
    cr_assert_eq(convert(hf_dir, config, run, output), 0, "%s", output);
    snprintf(arguments, sizeof arguments, "eval --checkpoint '%s' --data '%s' --samples 1", run,
             windows);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    cr_expect(strstr(output, "raw"), "eval does not say it read the raw weights:\n%s", output);
    snprintf(arguments, sizeof arguments,
             "eval --checkpoint '%s' --data '%s' --samples 1 --weights ema", run, windows);
    cr_expect_eq(test_run_fathom(arguments, output, sizeof output), 3, "%s", output);
    cr_expect(strstr(output, "step-0 import holds the model only"), "%s", output);
    test_remove_tree(dir);
}
