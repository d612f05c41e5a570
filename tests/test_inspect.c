/* tests/test_inspect.c — `fathom inspect DIR [--json]` (DESIGN 6) on the checkpoint of a tiny
 * training run: layout, config, tensors with shape, dtype and norm, and the integrity
 * verdict, which names the file and tensor of a corrupt shard dataset. */
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
#include "train_support.h"

#define OUTPUT_CAPACITY (1 << 17)

/* A tiny run of 2 steps with an EMA: its step-2 checkpoint holds all four groups. */
static void train_tiny(char *dir, const char *tag)
{
    char output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, tag);
    tiny_config_write(dir, "");
    int code = tiny_train(dir, "--set train.steps=2", output, sizeof output);
    cr_assert_eq(code, 0, "training failed (%d):\n%s", code, output);
}

static int inspect(const char *arguments, char *output)
{
    char command[2048];
    snprintf(command, sizeof command, "inspect %s", arguments);
    return test_run_fathom(command, output, OUTPUT_CAPACITY);
}

/* The L2 norm of a tensor of group `group`, loaded through checkpoint_load. */
static double tensor_norm(const char *step_dir, int group, const char *name)
{
    Config config;
    char path[1024];
    snprintf(path, sizeof path, "%s/../../config.yaml", step_dir);
    config_load(&config, path, NULL, 0, CONFIG_ANY_WORLD);
    ParamTable table;
    param_table_build(&table, &config.model);
    const ParamEntry *entry = param_table_require(&table, name);
    CheckpointTensor tensor = {entry->name, entry->ndim,
                               {entry->shape[0], entry->shape[1], entry->shape[2]}, 0};
    float *data[CKPT_GROUPS] = {0};
    data[group] = malloc(entry->count * sizeof(float));
    checkpoint_load(step_dir, &tensor, 1, data);
    double sum = 0;
    for (size_t i = 0; i < entry->count; i++)
        sum += (double)data[group][i] * data[group][i];
    free(data[group]);
    param_table_free(&table);
    return sqrt(sum);
}

Test(inspect, a_run_directory_shows_layout_config_tensors_and_an_ok_verdict)
{
    char dir[256], arguments[512], output[OUTPUT_CAPACITY];
    train_tiny(dir, "inspect-text");
    snprintf(arguments, sizeof arguments, "'%s/run'", dir);
    int code = inspect(arguments, output);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, output);
    const char *expected[] = {
        "step_00000002", "step 2 |", "layout: pp 1, dp 1, virtual_stages 1, layer split even",
        "vocab_size 256, d_model 64, n_layers 2, n_heads 4, n_kv_heads 2, head_dim 16",
        "residual: mode standard", "/model: 21 tensors", "/ema: 21 tensors",
        "/optim/exp_avg: 21 tensors", "/optim/exp_avg_sq: 21 tensors",
        "integrity: OK (84 shard datasets",
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        cr_expect(strstr(output, expected[i]), "'%s' missing from:\n%s", expected[i], output);
    /* a tensor line: name, shape, dtype and the norm the checkpoint really holds */
    char step_dir[512];
    snprintf(step_dir, sizeof step_dir, "%s/run/checkpoints/step_00000002", dir);
    double norm = tensor_norm(step_dir, CKPT_GROUP_MODEL, "model.layers.1.mlp.down_proj.weight");
    const char *line = strstr(output, "  model.layers.1.mlp.down_proj.weight ");
    cr_assert_not_null(line, "%s", output);
    cr_assert(strstr(line, "[64, 160]") && strstr(line, "float32"), "%.200s", line);
    double printed = atof(strstr(line, "norm ") + 5);
    cr_assert_float_eq(printed, norm, 1e-6 * norm, "printed %g, the tensor's norm is %g",
                       printed, norm);
    /* layers in numeric order, lm_head first (names sort naturally) */
    cr_assert_lt(strstr(output, "model.layers.0.input_layernorm"),
                 strstr(output, "model.layers.1.input_layernorm"));
    test_remove_tree(dir);
}

Test(inspect, json_is_one_object_with_the_same_content)
{
    char dir[256], command[2048], output[OUTPUT_CAPACITY];
    train_tiny(dir, "inspect-json");
    /* python3's json module parses it and checks what the text form shows */
    snprintf(command, sizeof command,
             "'%s' inspect '%s/run/checkpoints/step_00000002' --json > '%s/inspect.json' && "
             "python3 -c \"\nimport json, sys\nd = json.load(open(sys.argv[1]))\n"
             "assert d['step'] == 2 and d['layout'] == {'pp': 1, 'dp': 1, 'virtual_stages': 1,"
             " 'layer_split': []}, d['layout']\n"
             "assert d['config']['model']['d_model'] == 64 and d['config']['residual']['mode'] "
             "== 'standard'\n"
             "assert sorted(d['groups']) == ['/ema', '/model', '/optim/exp_avg', "
             "'/optim/exp_avg_sq'], list(d['groups'])\n"
             "t = {x['name']: x for x in d['groups']['/model']}\n"
             "assert len(t) == 21 and t['model.embed_tokens.weight']['shape'] == [256, 64]\n"
             "assert all(x['dtype'] == 'float32' and x['norm'] > 0 for x in t.values())\n"
             "assert d['integrity'] == {'ok': True, 'checked': 84, 'corrupt': []}, "
             "d['integrity']\n"
             "assert 'seed: 7' in d['config']['yaml']\n"
             "print('json ok', t['model.norm.weight']['norm'])\n\" '%s/inspect.json'",
             test_fathom_binary(), dir, dir, dir);
    int code = test_run_command(command, output, sizeof output);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, output);
    cr_assert(strstr(output, "json ok"), "%s", output);
    test_remove_tree(dir);
}

/* The file offset of a shard dataset's first byte (contiguous storage). */
static haddr_t dataset_offset(const char *path, const char *dataset_path)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert(file >= 0);
    hid_t dataset = H5Dopen2(file, dataset_path, H5P_DEFAULT);
    cr_assert(dataset >= 0, "no %s in %s", dataset_path, path);
    haddr_t offset = H5Dget_offset(dataset);
    H5Dclose(dataset);
    H5Fclose(file);
    cr_assert_neq(offset, HADDR_UNDEF);
    return offset;
}

Test(inspect, a_flipped_byte_in_a_shard_is_exit_3_naming_the_file_and_tensor)
{
    char dir[256], shard[512], arguments[1024], output[OUTPUT_CAPACITY];
    train_tiny(dir, "inspect-corrupt");
    snprintf(shard, sizeof shard, "%s/run/checkpoints/step_00000002/shard_p0_d0.h5", dir);
    const char *dataset = "/ema/model.layers.0.self_attn.k_proj.weight";
    haddr_t offset = dataset_offset(shard, dataset);
    FILE *file = fopen(shard, "r+b");
    fseek(file, (long)offset + 100, SEEK_SET);
    int byte = fgetc(file);
    fseek(file, (long)offset + 100, SEEK_SET);
    fputc(byte ^ 0x10, file);
    fclose(file);
    snprintf(arguments, sizeof arguments, "'%s/run'", dir);
    int code = inspect(arguments, output);
    cr_assert_eq(code, EXIT_DATA, "exit %d:\n%s", code, output);
    cr_assert(strstr(output, "integrity: CORRUPT (1 of 84"), "%s", output);
    cr_assert(strstr(output, "shard_p0_d0.h5") && strstr(output, dataset), "%s", output);
    cr_assert(strstr(output, "CRC32C recorded"), "%s", output);
    /* the corrupt tensor, and only it, is not read for its norm */
    const char *unread = strstr(output, "norm not read (corrupt)");
    cr_assert(unread && !strstr(unread + 1, "norm not read"), "%s", output);
    cr_assert(strstr(strstr(output, "/ema:"), "model.layers.0.self_attn.k_proj.weight") <
              unread, "%s", output);
    /* the JSON says the same, and still parses */
    snprintf(arguments, sizeof arguments, "--json '%s/run' 2>/dev/null | python3 -c \"import "
             "json, sys; d = json.load(sys.stdin); c = d['integrity']['corrupt']; "
             "assert not d['integrity']['ok'] and len(c) == 1 and c[0]['dataset'] == '%s' "
             "and c[0]['shard'] == 'shard_p0_d0.h5', c; print('json ok')\"", dir, dataset);
    inspect(arguments, output);
    cr_assert(strstr(output, "json ok"), "%s", output);
    test_remove_tree(dir);
}

Test(inspect, a_directory_without_a_checkpoint_is_exit_3)
{
    char dir[256], arguments[512], output[OUTPUT_CAPACITY];
    test_make_temp_dir(dir, "inspect-empty");
    snprintf(arguments, sizeof arguments, "'%s'", dir);
    cr_assert_eq(inspect(arguments, output), EXIT_DATA, "%s", output);
    cr_assert(strstr(output, "no committed checkpoint"), "%s", output);
    test_remove_tree(dir);
}
