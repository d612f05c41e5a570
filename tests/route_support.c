/* tests/route_support.c — see route_support.h. */
#include "tests/route_support.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/rng.h"
#include "tests/support.h"

ModelConfig route_test_model_config(void)
{
    return (ModelConfig){
        .vocab_size = 32, .d_model = 16, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
        .head_dim = 8, .ffn_dim = 24, .rope_theta = 10000.0, .norm_eps = 1e-5,
        .init_std = 0.1,
    };
}

ResidualConfig route_test_attnres(int heads, int layers_per_block, ResidualForm form)
{
    ResidualConfig residual;
    memset(&residual, 0, sizeof residual);
    residual.mode = RESIDUAL_ATTNRES;
    residual.heads = heads;
    residual.granularity = layers_per_block > 0 ? GRANULARITY_BLOCK : GRANULARITY_FULL;
    residual.layers_per_block = layers_per_block > 0 ? layers_per_block : 1;
    residual.form = form;
    residual.streams = 1;
    residual.stream_kernels[0] = 1;
    residual.n_stream_kernels = 1;
    return residual;
}

ResidualConfig route_test_msar(int heads, int streams, const int *kernels, ResidualForm form)
{
    ResidualConfig residual = route_test_attnres(heads, 1, form);
    residual.mode = RESIDUAL_MSAR;
    residual.streams = streams;
    residual.n_stream_kernels = streams;
    for (int r = 0; r < streams; r++)
        residual.stream_kernels[r] = kernels[r];
    return residual;
}

Model *route_test_model(const ResidualConfig *residual, uint64_t seed)
{
    ModelConfig config = route_test_model_config();
    Model *model = model_create(backend_cpu(), &config, residual, ROUTE_TEST_B,
                                              ROUTE_TEST_T);
    model_init_params(model, seed, config.init_std);
    return model;
}

Model *route_test_model_on(const Backend *backend, int n_layers,
                           const ResidualConfig *residual, uint64_t seed, bool checkpointing)
{
    ModelConfig config = route_test_model_config();
    if (n_layers > 0)
        config.n_layers = n_layers;
    Model *model = model_create(backend, &config, residual, ROUTE_TEST_B, ROUTE_TEST_T);
    model_init_params(model, seed, config.init_std);
    route_test_randomize_routing(model, seed);
    model_set_activation_checkpointing(model, checkpointing);
    return model;
}

static bool ends_with(const char *name, const char *suffix)
{
    size_t length = strlen(name), suffix_length = strlen(suffix);
    return length >= suffix_length && strcmp(name + length - suffix_length, suffix) == 0;
}

void route_test_randomize_routing(Model *model, uint64_t seed)
{
    const ParamTable *table = model_param_table(model);
    const ResidualConfig *residual = model_residual(model);
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        if (entry->kind != PARAM_ROUTING)
            continue;
        float *values = xmalloc(entry->count * sizeof *values);
        /* by name, so a tensor's values do not depend on where the table puts it */
        const uint64_t tensor_seed = seed * 1000 + rng_stream_of_name(entry->name);
        if (ends_with(entry->name, ".conv")) { /* [m, k_max, d] */
            const int k_max = entry->shape[1], d = entry->shape[2];
            test_fill_normal(values, entry->count, 0.3f, tensor_seed);
            for (int r = 0; r < entry->shape[0]; r++)
                for (int tau = 0; tau < k_max; tau++)
                    for (int c = 0; c < d; c++) {
                        float *tap = &values[((size_t)r * k_max + tau) * d + c];
                        if (tau == 0)
                            *tap = 1.0f + *tap / 3.0f;
                        else if (tau >= residual->stream_kernels[r])
                            *tap = 0.0f;
                    }
        } else if (ends_with(entry->name, ".key_norm")) {
            test_fill_normal(values, entry->count, 0.1f, tensor_seed);
            for (size_t i = 0; i < entry->count; i++)
                values[i] += 1.0f;
        } else {
            float scale = ends_with(entry->name, "route_null") ? 0.1f
                          : ends_with(entry->name, ".mix_proj") ? 0.3f
                                                                 : 0.5f;
            test_fill_normal(values, entry->count, scale, tensor_seed);
        }
        route_test_set(model, entry->name, values);
        free(values);
    }
}

void route_test_set(Model *model, const char *name, const float *values)
{
    const ParamEntry *entry = param_table_require(model_param_table(model), name);
    model_backend(model)->upload(model_params(model) + entry->offset, values,
                                 entry->count * sizeof(float));
    model_refresh_compute_copy(model);
}

void route_test_fill(Model *model, const char *name, float value)
{
    size_t count = route_test_count(model, name);
    float *values = xmalloc(count * sizeof *values);
    for (size_t i = 0; i < count; i++)
        values[i] = value;
    route_test_set(model, name, values);
    free(values);
}

void route_test_get(Model *model, const char *name, bool gradient, float *values)
{
    const ParamEntry *entry = param_table_require(model_param_table(model), name);
    const float *flat = gradient ? model_grads(model) : model_params(model);
    model_backend(model)->download(values, flat + entry->offset, entry->count * sizeof(float));
}

size_t route_test_count(const Model *model, const char *name)
{
    return param_table_require(model_param_table(model), name)->count;
}

void route_test_tokens(uint32_t *inputs, uint32_t *targets)
{
    for (int t = 0; t < ROUTE_TEST_ROWS; t++) {
        inputs[t] = (uint32_t)test_random_int(0, 31, 100 + (uint64_t)t);
        targets[t] = (uint32_t)test_random_int(0, 31, 200 + (uint64_t)t);
    }
}

double route_test_forward(Model *model)
{
    uint32_t inputs[ROUTE_TEST_ROWS], targets[ROUTE_TEST_ROWS];
    route_test_tokens(inputs, targets);
    return model_forward(model, inputs, targets, ROUTE_TEST_B, 1e-4f).loss;
}

float *route_test_logits(const Model *model)
{
    size_t count = (size_t)ROUTE_TEST_ROWS * model_config(model)->vocab_size;
    float *logits = xmalloc(count * sizeof *logits);
    model_read_logits(model, logits);
    return logits;
}
