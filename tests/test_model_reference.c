/* tests/test_model_reference.c — the model against Hugging Face transformers (DESIGN 7).
 *
 * tests/fixtures/{llama,qwen3}_tiny.h5 were made by tests/reference/make_fixtures.py with
 * LlamaForCausalLM (llama3 RoPE scaling, untied head) and Qwen3ForCausalLM (q/k norms,
 * head_dim != d / n_heads, tied head) in float64. Each file holds the fathom YAML config of
 * the network (root attribute `config`), the batch (/tokens [B, T+1]), every weight under
 * its DESIGN 2.3 name (/weights), and the oracle: /logits, /loss, /ce, /zloss and every
 * gradient d loss / d weight (/grads), and the losses before and after each of 3 AdamW
 * steps on that batch (/adamw/losses). The cpu backend is fp32, so the tolerances are
 * relative 1e-5 on logits and losses and 1e-4 on gradients (||fathom - hf|| / ||hf||).
 */
#include <criterion/criterion.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/optim.h"
#include "tests/support.h"

typedef struct {
    hid_t file;
    Config config;
    int B, T;
    uint32_t *inputs, *targets; /* [B, T] */
    Model *model;
} Fixture;

static hid_t fixture_file_open(const char *family)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s_tiny.h5", FATHOM_SOURCE_DIR, family);
    h5_quiet();
    return (hid_t)H5_CHECK(H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT));
}

/* The variable- or fixed-length string attribute `name` of the file's root, malloc'd. */
static char *read_root_string(hid_t file, const char *name)
{
    hid_t attribute = (hid_t)H5_CHECK(H5Aopen(file, name, H5P_DEFAULT));
    hid_t stored = (hid_t)H5_CHECK(H5Aget_type(attribute));
    char *text;
    if (H5_CHECK(H5Tis_variable_str(stored)) > 0) {
        hid_t memory = (hid_t)H5_CHECK(H5Tcopy(H5T_C_S1));
        H5_CHECK(H5Tset_size(memory, H5T_VARIABLE));
        H5_CHECK(H5Tset_cset(memory, H5T_CSET_UTF8));
        char *value = NULL;
        H5_CHECK(H5Aread(attribute, memory, &value));
        text = xstrdup(value);
        H5_CHECK(H5free_memory(value));
        H5_CHECK(H5Tclose(memory));
    } else {
        size_t size = H5Tget_size(stored);
        text = xcalloc(size + 1, 1);
        H5_CHECK(H5Aread(attribute, stored, text));
    }
    H5_CHECK(H5Tclose(stored));
    H5_CHECK(H5Aclose(attribute));
    return text;
}

/* Reads dataset `path` converted to `memory_type`; its shape goes to shape/ndim (may be NULL).
 * Returns a malloc'd buffer of element_size * count bytes. */
static void *read_dataset(hid_t file, const char *path, hid_t memory_type, size_t element_size,
                          int *ndim, hsize_t shape[2], size_t *count)
{
    hid_t dataset = (hid_t)H5_CHECK(H5Dopen2(file, path, H5P_DEFAULT));
    hid_t space = (hid_t)H5_CHECK(H5Dget_space(dataset));
    int rank = (int)H5_CHECK(H5Sget_simple_extent_ndims(space));
    cr_assert(rank <= 3, "%s has rank %d", path, rank);
    hsize_t dims[3] = {1, 1, 1};
    H5_CHECK(H5Sget_simple_extent_dims(space, dims, NULL));
    size_t total = 1;
    for (int i = 0; i < rank; i++)
        total *= dims[i];
    void *values = xmalloc(total * element_size);
    H5_CHECK(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Dclose(dataset));
    if (ndim)
        *ndim = rank;
    if (shape) {
        shape[0] = rank > 0 ? dims[0] : 1;
        shape[1] = rank > 1 ? dims[1] : 1;
    }
    if (count)
        *count = total;
    return values;
}

static double read_scalar(hid_t file, const char *path)
{
    double *value = read_dataset(file, path, H5T_NATIVE_DOUBLE, sizeof(double), NULL, NULL,
                                 NULL);
    double result = *value;
    free(value);
    return result;
}

/* The names of the datasets directly under `group`, in HDF5's name order. */
static char **read_group_names(hid_t file, const char *group, int *count)
{
    hid_t handle = (hid_t)H5_CHECK(H5Gopen2(file, group, H5P_DEFAULT));
    H5G_info_t info;
    H5_CHECK(H5Gget_info(handle, &info));
    char **names = xcalloc(info.nlinks, sizeof *names);
    for (hsize_t i = 0; i < info.nlinks; i++) {
        ssize_t length = (ssize_t)H5_CHECK(H5Lget_name_by_idx(
            handle, ".", H5_INDEX_NAME, H5_ITER_INC, i, NULL, 0, H5P_DEFAULT));
        names[i] = xcalloc((size_t)length + 1, 1);
        H5_CHECK(H5Lget_name_by_idx(handle, ".", H5_INDEX_NAME, H5_ITER_INC, i, names[i],
                                    (size_t)length + 1, H5P_DEFAULT));
    }
    H5_CHECK(H5Gclose(handle));
    *count = (int)info.nlinks;
    return names;
}

static void free_names(char **names, int count)
{
    for (int i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

/* Copies /weights/<name> into the model's flat parameters, for every tensor of the table. */
static void fixture_load_weights(Fixture *fixture)
{
    const ParamTable *table = model_param_table(fixture->model);
    const Backend *backend = backend_cpu();
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        char path[256];
        snprintf(path, sizeof path, "/weights/%s", entry->name);
        size_t count;
        float *values = read_dataset(fixture->file, path, H5T_NATIVE_FLOAT, sizeof(float),
                                     NULL, NULL, &count);
        cr_assert_eq(count, entry->count, "%s: %zu values in the fixture, %zu in the model",
                     entry->name, count, entry->count);
        backend->upload(model_params(fixture->model) + entry->offset, values,
                        count * sizeof(float));
        free(values);
    }
}

static void fixture_open(Fixture *fixture, const char *family)
{
    memset(fixture, 0, sizeof *fixture);
    fixture->file = fixture_file_open(family);
    char *yaml = read_root_string(fixture->file, "config");
    config_load_text(&fixture->config, yaml, family, NULL, 0, 1);
    free(yaml);

    int ndim;
    hsize_t shape[2];
    uint32_t *tokens = read_dataset(fixture->file, "/tokens", H5T_NATIVE_UINT32,
                                    sizeof(uint32_t), &ndim, shape, NULL);
    cr_assert_eq(ndim, 2);
    fixture->B = (int)shape[0];
    fixture->T = (int)shape[1] - 1;
    cr_assert_eq(fixture->T, fixture->config.train.seq_len);
    size_t rows = (size_t)fixture->B * fixture->T;
    fixture->inputs = xmalloc(rows * sizeof(uint32_t));
    fixture->targets = xmalloc(rows * sizeof(uint32_t));
    for (int b = 0; b < fixture->B; b++) {
        for (int t = 0; t < fixture->T; t++) {
            fixture->inputs[(size_t)b * fixture->T + t] = tokens[(size_t)b * shape[1] + t];
            fixture->targets[(size_t)b * fixture->T + t] = tokens[(size_t)b * shape[1] + t + 1];
        }
    }
    free(tokens);

    fixture->model = model_create(backend_cpu(), &fixture->config.model, NULL, fixture->B,
                                   fixture->T);
    fixture_load_weights(fixture);
}

static void fixture_close(Fixture *fixture)
{
    model_destroy(fixture->model);
    free(fixture->inputs);
    free(fixture->targets);
    H5_CHECK(H5Fclose(fixture->file));
}

static ModelLoss fixture_forward(Fixture *fixture)
{
    return model_forward(fixture->model, fixture->inputs, fixture->targets, fixture->B,
                         (float)fixture->config.train.z_loss);
}

/* ---- the claims, shared by both families ---- */

static void check_weight_names_match(const char *family)
{
    Fixture fixture;
    fixture_open(&fixture, family);
    const ParamTable *table = model_param_table(fixture.model);
    int count;
    char **names = read_group_names(fixture.file, "/weights", &count);
    for (int i = 0; i < count; i++) {
        const ParamEntry *entry = param_table_find(table, names[i]);
        cr_assert_not_null(entry, "fixture weight %s is not in the param table", names[i]);
        char path[256];
        snprintf(path, sizeof path, "/weights/%s", names[i]);
        int ndim;
        hsize_t shape[2];
        free(read_dataset(fixture.file, path, H5T_NATIVE_FLOAT, sizeof(float), &ndim, shape,
                          NULL));
        cr_assert_eq(ndim, entry->ndim, "%s: rank %d in the fixture, %d in the table",
                     names[i], ndim, entry->ndim);
        cr_assert(shape[0] == (hsize_t)entry->shape[0] && shape[1] == (hsize_t)entry->shape[1],
                  "%s: shape [%llu, %llu] in the fixture, [%d, %d] in the table", names[i],
                  (unsigned long long)shape[0], (unsigned long long)shape[1], entry->shape[0],
                  entry->shape[1]);
    }
    cr_assert_eq(count, table->n_params, "%d fixture weights, %d table entries", count,
                 table->n_params);
    free_names(names, count);
    fixture_close(&fixture);
}

static void check_logits_match(const char *family)
{
    Fixture fixture;
    fixture_open(&fixture, family);
    fixture_forward(&fixture);
    size_t count;
    double *expected = read_dataset(fixture.file, "/logits", H5T_NATIVE_DOUBLE, sizeof(double),
                                    NULL, NULL, &count);
    cr_assert_eq(count, (size_t)fixture.B * fixture.T * fixture.config.model.vocab_size);
    float *logits = xmalloc(count * sizeof(float));
    backend_cpu()->download(logits, model_logits(fixture.model), count * sizeof(float));
    double error = test_relative_error_double(logits, expected, count);
    cr_assert(error <= 1e-5, "%s logits: relative error %.3g", family, error);
    free(logits);
    free(expected);
    fixture_close(&fixture);
}

static void check_relative(double value, double expected, double tolerance, const char *what)
{
    double error = fabs(value - expected) / fabs(expected);
    cr_assert(error <= tolerance, "%s = %.10g, Hugging Face %.10g (relative error %.3g)", what,
              value, expected, error);
}

static void check_loss_matches(const char *family)
{
    Fixture fixture;
    fixture_open(&fixture, family);
    ModelLoss loss = fixture_forward(&fixture);
    check_relative(loss.loss, read_scalar(fixture.file, "/loss"), 1e-5, "loss");
    check_relative(loss.ce, read_scalar(fixture.file, "/ce"), 1e-5, "ce");
    check_relative(loss.zloss, read_scalar(fixture.file, "/zloss"), 1e-5, "zloss");
    fixture_close(&fixture);
}

static void check_gradients_match(const char *family)
{
    Fixture fixture;
    fixture_open(&fixture, family);
    fixture_forward(&fixture);
    model_backward(fixture.model, 1.0f);
    const ParamTable *table = model_param_table(fixture.model);
    float *grads = xmalloc(table->total * sizeof(float));
    backend_cpu()->download(grads, model_grads(fixture.model), table->total * sizeof(float));
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        char path[256];
        snprintf(path, sizeof path, "/grads/%s", entry->name);
        size_t count;
        double *expected = read_dataset(fixture.file, path, H5T_NATIVE_DOUBLE, sizeof(double),
                                        NULL, NULL, &count);
        cr_assert_eq(count, entry->count);
        double error = test_relative_error_double(grads + entry->offset, expected, count);
        cr_assert(error <= 1e-4, "%s gradient: relative error %.3g", entry->name, error);
        free(expected);
    }
    free(grads);
    fixture_close(&fixture);
}

/* Three steps of runtime/optim on the fixture's batch, with one range per tensor and the
 * decay rule of optim.no_decay, against torch.optim.AdamW with clip_grad_norm_. */
static void check_adamw_losses_match(const char *family)
{
    Fixture fixture;
    fixture_open(&fixture, family);
    const Backend *backend = backend_cpu();
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
        .exp_avg = backend->alloc(bytes),
        .exp_avg_sq = backend->alloc(bytes),
        .count = table->total,
        .ranges = ranges,
        .n_ranges = table->n_params,
    };
    size_t count;
    double *expected = read_dataset(fixture.file, "/adamw/losses", H5T_NATIVE_DOUBLE,
                                    sizeof(double), NULL, NULL, &count);
    for (size_t step = 0; step < count; step++) {
        ModelLoss loss = fixture_forward(&fixture);
        char what[64];
        snprintf(what, sizeof what, "%s loss after %zu AdamW steps", family, step);
        check_relative(loss.loss, expected[step], 1e-5, what);
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

Test(model_reference, llama_weight_names_and_shapes_match_the_param_table)
{
    check_weight_names_match("llama");
}

Test(model_reference, llama_logits_match_hugging_face) { check_logits_match("llama"); }

Test(model_reference, llama_loss_ce_and_zloss_match_hugging_face)
{
    check_loss_matches("llama");
}

Test(model_reference, llama_gradients_match_hugging_face) { check_gradients_match("llama"); }

Test(model_reference, llama_three_adamw_steps_follow_torch)
{
    check_adamw_losses_match("llama");
}

Test(model_reference, qwen3_weight_names_and_shapes_match_the_param_table)
{
    check_weight_names_match("qwen3");
}

Test(model_reference, qwen3_logits_match_hugging_face) { check_logits_match("qwen3"); }

Test(model_reference, qwen3_loss_ce_and_zloss_match_hugging_face)
{
    check_loss_matches("qwen3");
}

Test(model_reference, qwen3_gradients_match_hugging_face) { check_gradients_match("qwen3"); }

Test(model_reference, qwen3_three_adamw_steps_follow_torch)
{
    check_adamw_losses_match("qwen3");
}
