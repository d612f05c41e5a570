/* model/layer.c — the sublayer forwards and the weight lookup; see layer.h. */
#include "model/layer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* A layer's tensors in LayerWeights / LayerGrads field order (DESIGN 2.3 names). */
enum { LAYER_TENSORS = 11 };

static const char *const LAYER_SUFFIXES[LAYER_TENSORS] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight",
};

/* Their offsets; SIZE_MAX for q_norm and k_norm without qk_norm. */
static void layer_offsets(size_t offsets[LAYER_TENSORS], const ParamTable *table, int layer,
                          const ModelConfig *config)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "model.layers.%d", layer);
    for (int i = 0; i < LAYER_TENSORS; i++) {
        const bool qk_norm_tensor = i == 5 || i == 6;
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "%s.%s", prefix, LAYER_SUFFIXES[i]);
        offsets[i] = qk_norm_tensor && !config->qk_norm
                         ? SIZE_MAX
                         : param_table_require(table, name)->offset;
    }
}

void layer_views_add(UnitViews *views, LayerWeights *weights, LayerGrads *grads,
                     const ParamTable *table, int layer, const ModelConfig *config)
{
    Activation **weight_fields[LAYER_TENSORS] = {
        &weights->input_layernorm, &weights->q_proj, &weights->k_proj, &weights->v_proj,
        &weights->o_proj, &weights->q_norm, &weights->k_norm,
        &weights->post_attention_layernorm, &weights->gate_proj, &weights->up_proj,
        &weights->down_proj,
    };
    float **grad_fields[LAYER_TENSORS] = {
        &grads->input_layernorm, &grads->q_proj, &grads->k_proj, &grads->v_proj,
        &grads->o_proj, &grads->q_norm, &grads->k_norm, &grads->post_attention_layernorm,
        &grads->gate_proj, &grads->up_proj, &grads->down_proj,
    };
    for (int i = 0; i < LAYER_TENSORS; i++) {
        const bool required = !(i == 5 || i == 6) || config->qk_norm;
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, LAYER_SUFFIXES[i]);
        unit_views_add(views, table, weight_fields[i], name, VIEW_COMPUTE, required);
        unit_views_add(views, table, grad_fields[i], name, VIEW_GRADS, required);
    }
}

void layer_weights_resolve(LayerWeights *weights, const Backend *backend,
                           const ParamTable *table, Activation *flat, int layer,
                           const ModelConfig *config)
{
    size_t offsets[LAYER_TENSORS];
    layer_offsets(offsets, table, layer, config);
    Activation **fields[LAYER_TENSORS] = {
        &weights->input_layernorm, &weights->q_proj, &weights->k_proj, &weights->v_proj,
        &weights->o_proj, &weights->q_norm, &weights->k_norm,
        &weights->post_attention_layernorm, &weights->gate_proj, &weights->up_proj,
        &weights->down_proj,
    };
    for (int i = 0; i < LAYER_TENSORS; i++)
        *fields[i] = offsets[i] == SIZE_MAX ? NULL : activation_at(backend, flat, offsets[i]);
}

/* The sublayer's input norm, first op of its forward: x normed into normed, or formed from
 * the gate first. */
static void input_norm_forward(const Backend *backend, Activation *normed, float *rstd,
                               Activation *x, const InputGate *gate, const Activation *weight,
                               int rows, int d, float eps)
{
    if (gate && gate->merge)
        backend->route_merge_rmsnorm_forward(x, normed, rstd, gate->merge, weight, rows, d, eps,
                                             gate->add);
    else if (gate && gate->mix)
        backend->stream_mix_rmsnorm_forward(x, normed, rstd, gate->mix, gate->base, gate->alpha,
                                            weight, rows, d, eps, gate->add);
    else if (gate && !gate->alpha)
        backend->add_rmsnorm_forward(x, normed, rstd, gate->base, gate->route, weight, rows, d,
                                     eps);
    else if (gate)
        backend->add_scaled_rmsnorm_forward(x, normed, rstd, gate->base, gate->route,
                                            gate->alpha, weight, rows, d, eps, gate->add);
    else
        backend->rmsnorm_forward(normed, rstd, x, weight, rows, d, eps);
}

void attention_sublayer_forward(const LayerContext *context, const LayerWeights *weights,
                                LayerActivations *saved, Activation *x, const InputGate *gate,
                                Activation *out)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    const int B = context->B, T = context->T, rows = B * T;
    const int d = config->d_model, hd = config->head_dim;
    const int heads = config->n_heads, kv_heads = config->n_kv_heads;
    const int q_dim = heads * hd, kv_dim = kv_heads * hd;
    const float eps = (float)config->norm_eps;

    input_norm_forward(backend, saved->attention_normed, saved->attention_rstd, x, gate,
                       weights->input_layernorm, rows, d, eps);
    const Activation *n = saved->attention_normed;
    backend->matmul_forward(saved->v, n, weights->v_proj, rows, d, kv_dim);
    if (config->qk_norm) {
        /* Qwen3: RMSNorm over head_dim per head (rows = tokens * heads), before RoPE */
        backend->matmul_forward(saved->q_projected, n, weights->q_proj, rows, d, q_dim);
        backend->matmul_forward(saved->k_projected, n, weights->k_proj, rows, d, kv_dim);
        backend->rmsnorm_forward(saved->q, saved->q_norm_rstd, saved->q_projected,
                                 weights->q_norm, rows * heads, hd, eps);
        backend->rmsnorm_forward(saved->k, saved->k_norm_rstd, saved->k_projected,
                                 weights->k_norm, rows * kv_heads, hd, eps);
    } else {
        backend->matmul_forward(saved->q, n, weights->q_proj, rows, d, q_dim);
        backend->matmul_forward(saved->k, n, weights->k_proj, rows, d, kv_dim);
    }
    /* in place: the backward of a rotation needs only the tables, not its input */
    backend->rope_forward(saved->q, saved->q, context->rope_cos, context->rope_sin, B, T,
                          heads, hd);
    backend->rope_forward(saved->k, saved->k, context->rope_cos, context->rope_sin, B, T,
                          kv_heads, hd);
    backend->attention_forward(saved->attention_output, saved->attention_lse, saved->q,
                               saved->k, saved->v, B, T, heads, kv_heads, hd);
    backend->matmul_forward(out, saved->attention_output, weights->o_proj, rows, q_dim, d);
}

void mlp_sublayer_forward(const LayerContext *context, const LayerWeights *weights,
                          LayerActivations *saved, Activation *x, const InputGate *gate,
                          Activation *out)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    const int rows = context->B * context->T, d = config->d_model, F = config->ffn_dim;

    input_norm_forward(backend, saved->mlp_normed, saved->mlp_rstd, x, gate,
                       weights->post_attention_layernorm, rows, d, (float)config->norm_eps);
    backend->matmul_forward(saved->gate, saved->mlp_normed, weights->gate_proj, rows, d, F);
    backend->matmul_forward(saved->up, saved->mlp_normed, weights->up_proj, rows, d, F);
    backend->swiglu_forward(saved->hidden, saved->gate, saved->up, (size_t)rows * F);
    backend->matmul_forward(out, saved->hidden, weights->down_proj, rows, F, d);
}
