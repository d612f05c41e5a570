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

    const size_t total = model->table.total, bytes = total * sizeof(float);
    model->params = backend->alloc(bytes);
    model->grads = backend->alloc(bytes);
    if (!model->params || !model->grads)
        fatal(EXIT_CONFIG, "cannot allocate 2 x %.2f GiB of parameters and gradients on the "
              "%s backend", (double)bytes / (1 << 30), backend->name);
    /* DESIGN 3: the ops read a compute copy in the activation dtype; fp32 needs none */
    if (backend->activation_bytes == sizeof(float)) {
        model->compute = (Activation *)model->params;
    } else {
        model->compute = backend->alloc(total * backend->activation_bytes);
        if (!model->compute)
            fatal(EXIT_CONFIG, "cannot allocate %.2f GiB for the compute copy of the "
                  "parameters on the %s backend",
                  (double)(total * backend->activation_bytes) / (1 << 30), backend->name);
    }

    const int L = config->n_layers;
    model->layer_params = xcalloc((size_t)L, sizeof *model->layer_params);
    model->layer_grads = xcalloc((size_t)L, sizeof *model->layer_grads);
    for (int i = 0; i < L; i++) {
        layer_weights_resolve(&model->layer_params[i], backend, &model->table, model->compute,
                              i, config);
        layer_grads_resolve(&model->layer_grads[i], &model->table, model->grads, i, config);
    }
    const ParamEntry *embedding = param_table_require(&model->table, "model.embed_tokens.weight");
    const ParamEntry *norm = param_table_require(&model->table, "model.norm.weight");
    const ParamEntry *head = config->tie_embeddings
                                 ? embedding
                                 : param_table_require(&model->table, "lm_head.weight");
    model->embedding = activation_at(backend, model->compute, embedding->offset);
    model->grad_embedding = model->grads + embedding->offset;
    model->head_params = (HeadWeights){activation_at(backend, model->compute, norm->offset),
                                       activation_at(backend, model->compute, head->offset)};
    model->head_grads = (HeadGrads){model->grads + norm->offset, model->grads + head->offset};

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
    if (model->act.all_logits)
        backend->release(model->act.all_logits);
    activations_destroy(&model->act, backend);
    backend->release(model->rope_cos);
    backend->release(model->rope_sin);
    if (model->compute != (Activation *)model->params)
        backend->release(model->compute);
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

Activation *model_compute_copy(Model *model)
{
    return model->compute == (Activation *)model->params ? NULL : model->compute;
}

void model_refresh_compute_copy(Model *model)
{
    if (model->compute != (Activation *)model->params)
        model->backend->activations_from_floats(model->compute, model->params,
                                                model->table.total);
}

void model_memory_bytes(const Model *model, size_t *parameter_bytes, size_t *activation_bytes)
{
    const size_t total = model->table.total;
    *parameter_bytes = 2 * total * sizeof(float);
    if (model->compute != (Activation *)model->params)
        *parameter_bytes += total * model->backend->activation_bytes;
    *activation_bytes = model->act.bytes;
}

void model_set_logit_rows(Model *model, int rows)
{
    if (rows < 1 || rows > model->act.logit_capacity)
        fatal(EXIT_CONFIG, "logit chunks of %d rows: the model was made for 1 to %d", rows,
              model->act.logit_capacity);
    model->act.logit_rows = rows;
}

void model_keep_all_logits(Model *model)
{
    Activations *act = &model->act;
    if (act->all_logits)
        return;
    const size_t count = (size_t)act->max_batch * act->T * model->config.vocab_size;
    act->all_logits = model->backend->alloc(count * model->backend->activation_bytes);
    if (!act->all_logits)
        fatal(EXIT_CONFIG, "cannot allocate %.2f GiB to keep the logits of %d x %d tokens",
              (double)(count * model->backend->activation_bytes) / (1 << 30), act->max_batch,
              act->T);
}

int model_last_tokens(const Model *model)
{
    return model->last_batch * model->act.T;
}

void model_read_logits(const Model *model, float *host_out)
{
    const Activations *act = &model->act;
    if (model->last_batch == 0)
        fatal(EXIT_CONFIG, "model_read_logits needs a model_forward first");
    const size_t rows = (size_t)model->last_batch * act->T;
    if (!act->all_logits && rows > (size_t)act->logit_rows)
        fatal(EXIT_CONFIG, "the logits of %zu tokens were made in chunks of %d and not kept "
              "(model_keep_all_logits keeps them)", rows, act->logit_rows);
    model->backend->activations_download(host_out,
                                         act->all_logits ? act->all_logits : act->logits,
                                         rows * model->config.vocab_size);
}

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
    model_refresh_compute_copy(model);
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
void model_sublayer_forward(Model *model, const LayerContext *context, int j,
                            const Activation *x, Activation *out)
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
                             const Activation *x, const Activation *dout, Activation *dx)
{
    const LayerWeights *weights = &model->layer_params[j / 2];
    LayerGrads *grads = &model->layer_grads[j / 2];
    const LayerActivations *saved = &model->act.layers[j / 2];
    if (j % 2 == 0)
        attention_sublayer_backward(context, weights, grads, saved, x, dout, dx);
    else
        mlp_sublayer_backward(context, weights, grads, saved, x, dout, dx);
}

/* DESIGN 2: stream[j+1] = stream[j] + f_j(stream[j]); returns the final norm's input. */
static const Activation *standard_forward(Model *model, const LayerContext *context,
                                         size_t rows)
{
    const Backend *backend = model->backend;
    Activations *act = &model->act;
    const int L = model->config.n_layers, d = model->config.d_model;
    backend->embedding_forward(act->stream[0], act->inputs, model->embedding, (int)rows, d);
    for (int j = 0; j < 2 * L; j++) {
        Activation *out = act->scratch.sublayer_output;
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
    const Activation *final_input = model->plan.mode == RESIDUAL_STANDARD
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
    Activation *grad_stream = act->scratch.grad_stream;

    backend->zero(grad_stream, rows * d * backend->activation_bytes);
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
