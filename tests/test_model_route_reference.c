/* tests/test_model_route_reference.c — attention over depth against the PyTorch reference
 * (DESIGN 2.1-2.3, 7).
 *
 * tests/fixtures/route_*.h5 were made by tests/reference/make_routing_fixtures.py from
 * tests/reference/routing_reference.py, a float64 model of the family written from DESIGN's
 * text alone, which checks itself against Hugging Face (mode standard), the identities of
 * DESIGN 2.1-2.2 and float64 finite differences before it writes. One file per residual
 * configuration: AttnRes full (replace, delta), MHAR block (replace, delta), MSAR block
 * (replace with m = 2, delta with m = 4). Each holds the fathom YAML config (root attribute
 * `config`), the batch (/tokens [B, T+1]), every weight under its DESIGN 2.3 name
 * (/weights, float32; the routing weights random, not at init), and the oracle in float64:
 * /logits, /loss, /ce, /zloss, /grads/<name>. The cpu backend is fp32: relative 1e-5 on
 * logits and losses, 1e-4 on every gradient (||fathom - reference|| / ||reference||).
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
#include "tests/support.h"

typedef struct {
    hid_t file;
    Config config;
    int B, T;
    uint32_t *inputs, *targets; /* [B, T] */
    Model *model;
} RouteFixture;

/* The string attribute `name` of the file's root, malloc'd. */
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

/* Dataset `path` converted to `memory_type` (malloc'd); rank and dims (up to 3, trailing
 * dims 1) to ndim/shape when not NULL, the element count to count. */
static void *read_dataset(hid_t file, const char *path, hid_t memory_type, size_t element_size,
                          int *ndim, hsize_t shape[3], size_t *count)
{
    hid_t dataset = (hid_t)H5_CHECK(H5Dopen2(file, path, H5P_DEFAULT));
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

static double read_scalar(hid_t file, const char *path)
{
    double *value = read_dataset(file, path, H5T_NATIVE_DOUBLE, sizeof(double), NULL, NULL,
                                 NULL);
    double result = *value;
    free(value);
    return result;
}

static int count_group_members(hid_t file, const char *group)
{
    hid_t handle = (hid_t)H5_CHECK(H5Gopen2(file, group, H5P_DEFAULT));
    H5G_info_t info;
    H5_CHECK(H5Gget_info(handle, &info));
    H5_CHECK(H5Gclose(handle));
    return (int)info.nlinks;
}

static void fixture_open(RouteFixture *fixture, const char *stem)
{
    memset(fixture, 0, sizeof *fixture);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s.h5", FATHOM_SOURCE_DIR, stem);
    h5_quiet();
    fixture->file = (hid_t)H5_CHECK(H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT));
    char *yaml = read_root_string(fixture->file, "config");
    config_load_text(&fixture->config, yaml, stem, NULL, 0, 1);
    free(yaml);

    int ndim;
    hsize_t shape[3];
    uint32_t *tokens = read_dataset(fixture->file, "/tokens", H5T_NATIVE_UINT32,
                                    sizeof(uint32_t), &ndim, shape, NULL);
    cr_assert_eq(ndim, 2);
    fixture->B = (int)shape[0];
    fixture->T = (int)shape[1] - 1;
    size_t rows = (size_t)fixture->B * fixture->T;
    fixture->inputs = xmalloc(rows * sizeof(uint32_t));
    fixture->targets = xmalloc(rows * sizeof(uint32_t));
    for (int b = 0; b < fixture->B; b++)
        for (int t = 0; t < fixture->T; t++) {
            fixture->inputs[(size_t)b * fixture->T + t] = tokens[(size_t)b * shape[1] + t];
            fixture->targets[(size_t)b * fixture->T + t] = tokens[(size_t)b * shape[1] + t + 1];
        }
    free(tokens);

    fixture->model = model_create(backend_cpu(), &fixture->config.model,
                                                &fixture->config.residual, fixture->B,
                                                fixture->T);
    const ParamTable *table = model_param_table(fixture->model);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        snprintf(path, sizeof path, "/weights/%s", entry->name);
        size_t count;
        float *values = read_dataset(fixture->file, path, H5T_NATIVE_FLOAT, sizeof(float),
                                     NULL, NULL, &count);
        cr_assert_eq(count, entry->count, "%s: %zu values in the fixture, %zu in the model",
                     entry->name, count, entry->count);
        backend_cpu()->upload(model_params(fixture->model) + entry->offset, values,
                              count * sizeof(float));
        free(values);
    }
}

static void fixture_close(RouteFixture *fixture)
{
    model_destroy(fixture->model);
    free(fixture->inputs);
    free(fixture->targets);
    H5_CHECK(H5Fclose(fixture->file));
}

static ModelLoss fixture_forward(RouteFixture *fixture)
{
    return model_forward(fixture->model, fixture->inputs, fixture->targets, fixture->B,
                         (float)fixture->config.train.z_loss);
}

/* ---- the claims, one per fixture ---- */

static void check_weight_names_and_shapes(const char *stem)
{
    RouteFixture fixture;
    fixture_open(&fixture, stem); /* reads /weights/<name> for every table entry */
    const ParamTable *table = model_param_table(fixture.model);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        char path[256];
        snprintf(path, sizeof path, "/weights/%s", entry->name);
        int ndim;
        hsize_t shape[3];
        free(read_dataset(fixture.file, path, H5T_NATIVE_FLOAT, sizeof(float), &ndim, shape,
                          NULL));
        cr_assert_eq(ndim, entry->ndim, "%s: rank %d in the fixture, %d in the table",
                     entry->name, ndim, entry->ndim);
        for (int axis = 0; axis < 3; axis++)
            cr_assert_eq(shape[axis], (hsize_t)entry->shape[axis],
                         "%s: dimension %d is %llu in the fixture, %d in the table",
                         entry->name, axis, (unsigned long long)shape[axis],
                         entry->shape[axis]);
    }
    int count = count_group_members(fixture.file, "/weights");
    cr_assert_eq(count, table->n_params, "%d fixture weights, %d table entries", count,
                 table->n_params);
    fixture_close(&fixture);
}

static void check_logits(const char *stem)
{
    RouteFixture fixture;
    fixture_open(&fixture, stem);
    fixture_forward(&fixture);
    size_t count;
    double *expected = read_dataset(fixture.file, "/logits", H5T_NATIVE_DOUBLE, sizeof(double),
                                    NULL, NULL, &count);
    cr_assert_eq(count, (size_t)fixture.B * fixture.T * fixture.config.model.vocab_size);
    float *logits = xmalloc(count * sizeof(float));
    backend_cpu()->download(logits, model_logits(fixture.model), count * sizeof(float));
    double error = test_relative_error_double(logits, expected, count);
    cr_assert(error <= 1e-5, "%s logits: relative error %.3g", stem, error);
    free(logits);
    free(expected);
    fixture_close(&fixture);
}

static void check_relative(double value, double expected, double tolerance, const char *what)
{
    double error = fabs(value - expected) / fabs(expected);
    cr_assert(error <= tolerance, "%s = %.10g, reference %.10g (relative error %.3g)", what,
              value, expected, error);
}

static void check_losses(const char *stem)
{
    RouteFixture fixture;
    fixture_open(&fixture, stem);
    ModelLoss loss = fixture_forward(&fixture);
    check_relative(loss.loss, read_scalar(fixture.file, "/loss"), 1e-5, "loss");
    check_relative(loss.ce, read_scalar(fixture.file, "/ce"), 1e-5, "ce");
    check_relative(loss.zloss, read_scalar(fixture.file, "/zloss"), 1e-5, "zloss");
    fixture_close(&fixture);
}

/* Every gradient, routing weights included, to 1e-4. A reference gradient that is exactly
 * zero (the conv taps beyond k_r, the one-source first site of the replace form) must be
 * exactly zero here too. */
static void check_gradients(const char *stem)
{
    RouteFixture fixture;
    fixture_open(&fixture, stem);
    fixture_forward(&fixture);
    model_backward(fixture.model, 1.0f);
    const ParamTable *table = model_param_table(fixture.model);
    float *grads = xmalloc(table->total * sizeof(float));
    backend_cpu()->download(grads, model_grads(fixture.model), table->total * sizeof(float));
    int routing = 0;
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        char path[256];
        snprintf(path, sizeof path, "/grads/%s", entry->name);
        size_t count;
        double *expected = read_dataset(fixture.file, path, H5T_NATIVE_DOUBLE, sizeof(double),
                                        NULL, NULL, &count);
        cr_assert_eq(count, entry->count);
        double norm = 0;
        for (size_t i = 0; i < count; i++)
            norm += expected[i] * expected[i];
        const float *got = grads + entry->offset;
        if (norm == 0) {
            for (size_t i = 0; i < count; i++)
                cr_assert(got[i] == 0, "%s[%zu] = %g where the reference is exactly 0",
                          entry->name, i, got[i]);
        } else {
            double error = test_relative_error_double(got, expected, count);
            cr_assert(error <= 1e-4, "%s gradient: relative error %.3g", entry->name, error);
        }
        routing += entry->kind == PARAM_ROUTING;
        free(expected);
    }
    cr_assert(routing > 0, "%s: the model has no routing weights", stem);
    free(grads);
    fixture_close(&fixture);
}

#define ROUTE_FIXTURE_TESTS(stem)                                                          \
    Test(model_route_reference, stem##_weight_names_and_shapes_match_the_param_table)     \
    {                                                                                      \
        check_weight_names_and_shapes(#stem);                                              \
    }                                                                                      \
    Test(model_route_reference, stem##_logits_match_the_reference) { check_logits(#stem); } \
    Test(model_route_reference, stem##_loss_ce_and_zloss_match_the_reference)              \
    {                                                                                      \
        check_losses(#stem);                                                               \
    }                                                                                      \
    Test(model_route_reference, stem##_every_gradient_matches_the_reference)               \
    {                                                                                      \
        check_gradients(#stem);                                                            \
    }

ROUTE_FIXTURE_TESTS(route_attnres_full_replace)
ROUTE_FIXTURE_TESTS(route_attnres_full_delta)
ROUTE_FIXTURE_TESTS(route_mhar_block_replace)
ROUTE_FIXTURE_TESTS(route_mhar_block_delta)
ROUTE_FIXTURE_TESTS(route_msar_block_replace)
ROUTE_FIXTURE_TESTS(route_msar_block_delta)
