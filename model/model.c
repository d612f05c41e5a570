/* model/model.c — see model.h: the model's lifetime, the standard residual walk, and the
 * dispatch to the routed walk (model/model_routed.c). */
#include "model/model.h"

#include <stdlib.h>

#include "model/init.h"
#include "model/model_internal.h"
#include "model/rope_table.h"
#include "runtime/error.h"

static void model_check_config(const ModelConfig *config)
{
    if (config->n_kv_heads < 1 || config->n_heads < 1 ||
        config->n_heads % config->n_kv_heads != 0)
        fatal(EXIT_CONFIG, "model.n_kv_heads = %d must divide model.n_heads = %d",
              config->n_kv_heads, config->n_heads);
    if (!(config->norm_eps > 0))
        fatal(EXIT_CONFIG, "model.norm_eps = %g must be > 0", config->norm_eps);
}

Model *model_create(const Backend *backend, const ModelConfig *config,
                    const ResidualConfig *residual, int max_batch, int seq_len)
{
    model_check_config(config);
    Model *model = xcalloc(1, sizeof *model);
    model->backend = backend;
    model->config = *config;
    if (residual)
        model->residual = *residual;
    else
        model->residual.mode = RESIDUAL_STANDARD;
    residual_plan_build(&model->plan, config, residual);
    param_table_build_with_residual(&model->table, config, residual);

    const size_t bytes = model->table.total * sizeof(float);
    model->params = backend->alloc(bytes);
    model->grads = backend->alloc(bytes);
    if (!model->params || !model->grads)
        fatal(EXIT_CONFIG, "cannot allocate 2 x %.2f GiB of parameters and gradients on the "
              "%s backend", (double)bytes / (1 << 30), backend->name);

    const int L = config->n_layers;
    model->layer_params = xcalloc((size_t)L, sizeof *model->layer_params);
    model->layer_grads = xcalloc((size_t)L, sizeof *model->layer_grads);
    for (int i = 0; i < L; i++) {
        layer_weights_resolve(&model->layer_params[i], &model->table, model->params, i, config);
        layer_weights_resolve(&model->layer_grads[i], &model->table, model->grads, i, config);
    }
    const ParamEntry *embedding = param_table_require(&model->table, "model.embed_tokens.weight");
    const ParamEntry *norm = param_table_require(&model->table, "model.norm.weight");
    const ParamEntry *head = config->tie_embeddings
                                 ? embedding
                                 : param_table_require(&model->table, "lm_head.weight");
    model->embedding = model->params + embedding->offset;
    model->grad_embedding = model->grads + embedding->offset;
    model->head_params = (HeadWeights){model->params + norm->offset, model->params + head->offset};
    model->head_grads = (HeadWeights){model->grads + norm->offset, model->grads + head->offset};

    const size_t table_count = (size_t)seq_len * (config->head_dim / 2);
    const size_t table_bytes = (table_count ? table_count : 1) * sizeof(float);
    float *cos_host = xmalloc(table_bytes), *sin_host = xmalloc(table_bytes);
    activations_create(&model->act, backend, config, &model->plan, max_batch, seq_len);
    if (model->plan.mode != RESIDUAL_STANDARD)
        model_routing_resolve(model);
    rope_table_build(cos_host, sin_host, seq_len, config);
    model->rope_cos = backend->alloc(table_bytes);
    model->rope_sin = backend->alloc(table_bytes);
    backend->upload(model->rope_cos, cos_host, table_bytes);
    backend->upload(model->rope_sin, sin_host, table_bytes);
    free(cos_host);
    free(sin_host);
    return model;
}

void model_destroy(Model *model)
{
    if (!model)
        return;
    const Backend *backend = model->backend;
    activations_destroy(&model->act, backend);
    backend->release(model->rope_cos);
    backend->release(model->rope_sin);
    backend->release(model->params);
    backend->release(model->grads);
    free(model->layer_params);
    free(model->layer_grads);
    model_routing_free(model);
    residual_plan_free(&model->plan);
    param_table_free(&model->table);
    free(model);
}

const ParamTable *model_param_table(const Model *model) { return &model->table; }
const ModelConfig *model_config(const Model *model) { return &model->config; }
const ResidualConfig *model_residual(const Model *model) { return &model->residual; }
const Backend *model_backend(const Model *model) { return model->backend; }
float *model_params(Model *model) { return model->params; }
float *model_grads(Model *model) { return model->grads; }
const float *model_logits(const Model *model) { return model->act.logits; }

void model_init_params(Model *model, uint64_t seed, double init_std)
{
    /* one tensor at a time through a host buffer the size of the largest tensor */
    size_t largest = 0;
    for (int p = 0; p < model->table.n_params; p++)
        if (model->table.params[p].count > largest)
            largest = model->table.params[p].count;
    float *host = xmalloc(largest * sizeof *host);
    for (int p = 0; p < model->table.n_params; p++) {
        const ParamEntry *entry = &model->table.params[p];
        init_fill_param(host, entry, seed, init_std);
        model->backend->upload(model->params + entry->offset, host,
                               entry->count * sizeof *host);
    }
    free(host);
}

void model_zero_grads(Model *model)
{
    model->backend->zero(model->grads, model->table.total * sizeof(float));
}

static LayerContext model_context(Model *model, int B)
{
    return (LayerContext){
        .backend = model->backend,
        .config = &model->config,
        .B = B,
        .T = model->act.T,
        .rope_cos = model->rope_cos,
        .rope_sin = model->rope_sin,
        .scratch = &model->act.scratch,
    };
}

static void upload_tokens(Model *model, uint32_t *dst, const uint32_t *tokens, size_t n,
                          const char *what)
{
    for (size_t t = 0; t < n; t++)
        if (tokens[t] >= (uint32_t)model->config.vocab_size)
            fatal(EXIT_DATA, "%s token %u at position %zu is outside the vocabulary "
                  "(model.vocab_size = %d)", what, tokens[t], t, model->config.vocab_size);
    model->backend->upload(dst, tokens, n * sizeof *tokens);
}

/* Sublayer j: layer j/2's attention (j even) or MLP (j odd), x -> out (model/layer.h). */
void model_sublayer_forward(Model *model, const LayerContext *context, int j, const float *x,
                            float *out)
{
    const LayerWeights *weights = &model->layer_params[j / 2];
    LayerActivations *saved = &model->act.layers[j / 2];
    if (j % 2 == 0)
        attention_sublayer_forward(context, weights, saved, x, out);
    else
        mlp_sublayer_forward(context, weights, saved, x, out);
}

/* dx += J_j^T dout; dx may be dout. */
void model_sublayer_backward(Model *model, const LayerContext *context, int j,
                             const float *x, const float *dout, float *dx)
{
    const LayerWeights *weights = &model->layer_params[j / 2];
    LayerWeights *grads = &model->layer_grads[j / 2];
    const LayerActivations *saved = &model->act.layers[j / 2];
    if (j % 2 == 0)
        attention_sublayer_backward(context, weights, grads, saved, x, dout, dx);
    else
        mlp_sublayer_backward(context, weights, grads, saved, x, dout, dx);
}

/* DESIGN 2: stream[j+1] = stream[j] + f_j(stream[j]); returns the final norm's input. */
static const float *standard_forward(Model *model, const LayerContext *context, size_t rows)
{
    const Backend *backend = model->backend;
    Activations *act = &model->act;
    const int L = model->config.n_layers, d = model->config.d_model;
    backend->embedding_forward(act->stream[0], act->inputs, model->embedding, (int)rows, d);
    for (int j = 0; j < 2 * L; j++) {
        float *out = act->scratch.sublayer_output;
        model_sublayer_forward(model, context, j, act->stream[j], out);
        backend->add(act->stream[j + 1], act->stream[j], out, rows * d);
    }
    return act->stream[2 * L];
}

ModelLoss model_forward(Model *model, const uint32_t *inputs, const uint32_t *targets, int B,
                        float z_loss)
{
    if (B < 1 || B > model->act.max_batch)
        fatal(EXIT_CONFIG, "a batch of %d sequences does not fit the model's activations "
              "(train.microbatch_size = %d)", B, model->act.max_batch);
    Activations *act = &model->act;
    const LayerContext context = model_context(model, B);
    const size_t rows = (size_t)B * act->T;

    upload_tokens(model, act->inputs, inputs, rows, "input");
    upload_tokens(model, act->targets, targets, rows, "target");
    const float *final_input = model->plan.mode == RESIDUAL_STANDARD
                                   ? standard_forward(model, &context, rows)
                                   : model_routed_forward(model, &context, rows);
    model->last_batch = B;
    model->last_z_loss = z_loss;
    return loss_forward(&context, &model->head_params, act, final_input, z_loss);
}

/* Standard residual: d stream[j] = d stream[j+1] + J_j^T d stream[j+1], done in place (the
 * sublayer backwards allow dx == dout). */
static void standard_backward(Model *model, const LayerContext *context, float loss_scale,
                              size_t rows)
{
    const Backend *backend = model->backend;
    Activations *act = &model->act;
    const int L = model->config.n_layers, d = model->config.d_model;
    float *grad_stream = act->scratch.grad_stream;

    backend->zero(grad_stream, rows * d * sizeof(float));
    loss_backward(context, &model->head_params, &model->head_grads, act, act->stream[2 * L],
                  model->last_z_loss, loss_scale, grad_stream);
    for (int j = 2 * L - 1; j >= 0; j--)
        model_sublayer_backward(model, context, j, act->stream[j], grad_stream, grad_stream);
    backend->embedding_backward(model->grad_embedding, grad_stream, act->inputs, (int)rows, d);
}

void model_backward(Model *model, float loss_scale)
{
    if (model->last_batch == 0)
        fatal(EXIT_CONFIG, "model_backward needs a model_forward first");
    const LayerContext context = model_context(model, model->last_batch);
    const size_t rows = (size_t)model->last_batch * model->act.T;
    if (model->plan.mode == RESIDUAL_STANDARD)
        standard_backward(model, &context, loss_scale, rows);
    else
        model_routed_backward(model, &context, loss_scale, rows);
}
