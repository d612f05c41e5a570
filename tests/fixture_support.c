/* tests/fixture_support.c — see fixture_support.h. */
#include "tests/fixture_support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "tests/support.h"

/* The backend of fixture_open's models; NULL means backend_cpu(). */
static const Backend *fixture_backend = NULL;

void fixture_use_backend(const Backend *backend)
{
    fixture_backend = backend;
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

void *fixture_read_dataset(const Fixture *fixture, const char *path, hid_t memory_type,
                           size_t element_size, int *ndim, hsize_t shape[3], size_t *count)
{
    hid_t dataset = (hid_t)H5_CHECK(H5Dopen2(fixture->file, path, H5P_DEFAULT));
    hid_t space = (hid_t)H5_CHECK(H5Dget_space(dataset));
    int rank = (int)H5_CHECK(H5Sget_simple_extent_ndims(space));
    cr_assert(rank <= 3, "%s has rank %d", path, rank);
    hsize_t dims[3] = {1, 1, 1};
    H5_CHECK(H5Sget_simple_extent_dims(space, dims, NULL));
    size_t total = dims[0] * dims[1] * dims[2];
    void *values = xmalloc(total * element_size);
    H5_CHECK(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Dclose(dataset));
    if (ndim)
        *ndim = rank;
    if (shape)
        memcpy(shape, dims, sizeof dims);
    if (count)
        *count = total;
    return values;
}

double fixture_read_scalar(const Fixture *fixture, const char *path)
{
    double *value = fixture_read_dataset(fixture, path, H5T_NATIVE_DOUBLE, sizeof(double), NULL,
                                         NULL, NULL);
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

/* Splits /tokens [B, T+1] into inputs tokens[:, :T] and targets tokens[:, 1:]. */
static void fixture_read_tokens(Fixture *fixture)
{
    int ndim;
    hsize_t shape[3];
    uint32_t *tokens = fixture_read_dataset(fixture, "/tokens", H5T_NATIVE_UINT32,
                                            sizeof(uint32_t), &ndim, shape, NULL);
    cr_assert_eq(ndim, 2);
    fixture->B = (int)shape[0];
    fixture->T = (int)shape[1] - 1;
    cr_assert_eq(fixture->T, fixture->config.train.seq_len);
    size_t rows = (size_t)fixture->B * fixture->T;
    fixture->inputs = xmalloc(rows * sizeof(uint32_t));
    fixture->targets = xmalloc(rows * sizeof(uint32_t));
    for (int b = 0; b < fixture->B; b++)
        for (int t = 0; t < fixture->T; t++) {
            fixture->inputs[(size_t)b * fixture->T + t] = tokens[(size_t)b * shape[1] + t];
            fixture->targets[(size_t)b * fixture->T + t] = tokens[(size_t)b * shape[1] + t + 1];
        }
    free(tokens);
}

/* Copies /weights/<name> into the model's flat fp32 parameters, for every tensor of the
 * table, then rounds them into the compute copy the ops read (bf16 on cuda; DESIGN 3). */
static void fixture_load_weights(Fixture *fixture)
{
    const Backend *backend = model_backend(fixture->model);
    const ParamTable *table = model_param_table(fixture->model);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        char path[256];
        snprintf(path, sizeof path, "/weights/%s", entry->name);
        size_t count;
        float *values = fixture_read_dataset(fixture, path, H5T_NATIVE_FLOAT, sizeof(float),
                                             NULL, NULL, &count);
        cr_assert_eq(count, entry->count, "%s: %zu values in the fixture, %zu in the model",
                     entry->name, count, entry->count);
        backend->upload(model_params(fixture->model) + entry->offset, values,
                        count * sizeof(float));
        free(values);
    }
    model_refresh_compute_copy(fixture->model);
}

void fixture_open(Fixture *fixture, const char *stem)
{
    memset(fixture, 0, sizeof *fixture);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s.h5", test_source_dir(), stem);
    h5_quiet();
    fixture->file = (hid_t)H5_CHECK(H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT));
    char *yaml = read_root_string(fixture->file, "config");
    /* a config written by the reference script, read back as a run's saved one is: its
     * keys that do nothing here are the writer's, not a user's to be warned about */
    config_load_text(&fixture->config, yaml, stem, NULL, 0, CONFIG_ANY_WORLD);
    free(yaml);
    fixture_read_tokens(fixture);
    const Backend *backend = fixture_backend ? fixture_backend : backend_cpu();
    fixture->model = model_create(backend, &fixture->config.model,
                                  &fixture->config.residual, fixture->B, fixture->T);
    fixture_load_weights(fixture);
}

void fixture_close(Fixture *fixture)
{
    model_destroy(fixture->model);
    free(fixture->inputs);
    free(fixture->targets);
    H5_CHECK(H5Fclose(fixture->file));
}

ModelLoss fixture_forward(Fixture *fixture)
{
    return model_forward(fixture->model, fixture->inputs, fixture->targets, fixture->B,
                         (float)fixture->config.train.z_loss);
}

void fixture_expect_relative(double value, double expected, double tolerance, const char *what,
                             const char *oracle)
{
    double error = fabs(value - expected) / fabs(expected);
    cr_log_info("%s: relative error %.3g against %s", what, error, oracle);
    cr_assert(error <= tolerance, "%s = %.10g, %s %.10g (relative error %.3g)", what, value,
              oracle, expected, error);
}

/* ---- the claims ---- */

void fixture_check_weight_names_and_shapes(const char *stem)
{
    Fixture fixture;
    fixture_open(&fixture, stem);
    const ParamTable *table = model_param_table(fixture.model);
    int count;
    char **names = read_group_names(fixture.file, "/weights", &count);
    for (int i = 0; i < count; i++) {
        const ParamEntry *entry = param_table_find(table, names[i]);
        cr_assert_not_null(entry, "fixture weight %s is not in the param table", names[i]);
        char path[256];
        snprintf(path, sizeof path, "/weights/%s", names[i]);
        int ndim;
        hsize_t shape[3];
        free(fixture_read_dataset(&fixture, path, H5T_NATIVE_FLOAT, sizeof(float), &ndim,
                                  shape, NULL));
        cr_assert_eq(ndim, entry->ndim, "%s: rank %d in the fixture, %d in the table",
                     names[i], ndim, entry->ndim);
        for (int axis = 0; axis < 3; axis++)
            cr_assert_eq(shape[axis], (hsize_t)entry->shape[axis],
                         "%s: dimension %d is %llu in the fixture, %d in the table", names[i],
                         axis, (unsigned long long)shape[axis], entry->shape[axis]);
    }
    cr_assert_eq(count, table->n_params, "%d fixture weights, %d table entries", count,
                 table->n_params);
    free_names(names, count);
    fixture_close(&fixture);
}

void fixture_check_logits(const char *stem, const char *oracle, double tolerance)
{
    Fixture fixture;
    fixture_open(&fixture, stem);
    fixture_forward(&fixture);
    size_t count;
    double *expected = fixture_read_dataset(&fixture, "/logits", H5T_NATIVE_DOUBLE,
                                            sizeof(double), NULL, NULL, &count);
    cr_assert_eq(count, (size_t)fixture.B * fixture.T * fixture.config.model.vocab_size);
    float *logits = xmalloc(count * sizeof(float));
    model_read_logits(fixture.model, logits);
    double error = test_relative_error_double(logits, expected, count);
    cr_log_info("%s logits: relative error %.3g against %s", stem, error, oracle);
    cr_assert(error <= tolerance, "%s logits: relative error %.3g against %s", stem, error,
              oracle);
    free(logits);
    free(expected);
    fixture_close(&fixture);
}

void fixture_check_losses(const char *stem, const char *oracle, double tolerance)
{
    Fixture fixture;
    fixture_open(&fixture, stem);
    ModelLoss loss = fixture_forward(&fixture);
    fixture_expect_relative(loss.loss, fixture_read_scalar(&fixture, "/loss"), tolerance,
                            "loss", oracle);
    fixture_expect_relative(loss.ce, fixture_read_scalar(&fixture, "/ce"), tolerance, "ce",
                            oracle);
    fixture_expect_relative(loss.zloss, fixture_read_scalar(&fixture, "/zloss"), tolerance,
                            "zloss", oracle);
    fixture_close(&fixture);
}

int fixture_check_gradients(const char *stem, double tolerance)
{
    Fixture fixture;
    fixture_open(&fixture, stem);
    fixture_forward(&fixture);
    model_backward(fixture.model, 1.0f);
    const ParamTable *table = model_param_table(fixture.model);
    float *grads = xmalloc(table->total * sizeof(float));
    /* weight gradients are fp32 on every backend (runtime/backend.h) */
    model_backend(fixture.model)->download(grads, model_grads(fixture.model),
                                           table->total * sizeof(float));
    int routing = 0;
    double worst = 0;
    const char *worst_name = "";
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        char path[256];
        snprintf(path, sizeof path, "/grads/%s", entry->name);
        size_t count;
        double *expected = fixture_read_dataset(&fixture, path, H5T_NATIVE_DOUBLE,
                                                sizeof(double), NULL, NULL, &count);
        cr_assert_eq(count, entry->count);
        double norm = 0;
        for (size_t i = 0; i < count; i++)
            norm += expected[i] * expected[i];
        const float *got = grads + entry->offset;
        if (norm == 0) {
            for (size_t i = 0; i < count; i++)
                cr_assert(got[i] == 0, "%s[%zu] = %g where the oracle's is exactly 0",
                          entry->name, i, got[i]);
        } else {
            double error = test_relative_error_double(got, expected, count);
            if (error > worst) {
                worst = error;
                worst_name = entry->name;
            }
            cr_assert(error <= tolerance, "%s gradient: relative error %.3g", entry->name,
                      error);
        }
        routing += entry->kind == PARAM_ROUTING;
        free(expected);
    }
    cr_log_info("%s gradients: largest relative error %.3g (%s)", stem, worst, worst_name);
    free(grads);
    fixture_close(&fixture);
    return routing;
}
