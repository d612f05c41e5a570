/* model/layer.c — the sublayer forwards and the weight lookup; see layer.h. */
#include "model/layer.h"

#include <stdio.h>

static float *resolve(const ParamTable *table, float *flat, const char *prefix,
                      const char *suffix)
{
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return flat + param_table_require(table, name)->offset;
}

void layer_weights_resolve(LayerWeights *weights, const ParamTable *table, float *flat,
                           int layer, const ModelConfig *config)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "model.layers.%d", layer);
    weights->input_layernorm = resolve(table, flat, prefix, "input_layernorm.weight");
    weights->q_proj = resolve(table, flat, prefix, "self_attn.q_proj.weight");
    weights->k_proj = resolve(table, flat, prefix, "self_attn.k_proj.weight");
    weights->v_proj = resolve(table, flat, prefix, "self_attn.v_proj.weight");
    weights->o_proj = resolve(table, flat, prefix, "self_attn.o_proj.weight");
    weights->q_norm = config->qk_norm ? resolve(table, flat, prefix, "self_attn.q_norm.weight")
                                      : NULL;
    weights->k_norm = config->qk_norm ? resolve(table, flat, prefix, "self_attn.k_norm.weight")
                                      : NULL;
    weights->post_attention_layernorm =
        resolve(table, flat, prefix, "post_attention_layernorm.weight");
    weights->gate_proj = resolve(table, flat, prefix, "mlp.gate_proj.weight");
    weights->up_proj = resolve(table, flat, prefix, "mlp.up_proj.weight");
    weights->down_proj = resolve(table, flat, prefix, "mlp.down_proj.weight");
}

void attention_sublayer_forward(const LayerContext *context, const LayerWeights *weights,
                                LayerActivations *saved, const float *x, float *out)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    const int B = context->B, T = context->T, rows = B * T;
    const int d = config->d_model, hd = config->head_dim;
    const int heads = config->n_heads, kv_heads = config->n_kv_heads;
    const int q_dim = heads * hd, kv_dim = kv_heads * hd;
    const float eps = (float)config->norm_eps;

    backend->rmsnorm_forward(saved->attention_normed, saved->attention_rstd, x,
                             weights->input_layernorm, rows, d, eps);
    const float *n = saved->attention_normed;
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
                          LayerActivations *saved, const float *x, float *out)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    const int rows = context->B * context->T, d = config->d_model, F = config->ffn_dim;

    backend->rmsnorm_forward(saved->mlp_normed, saved->mlp_rstd, x,
                             weights->post_attention_layernorm, rows, d,
                             (float)config->norm_eps);
    backend->matmul_forward(saved->gate, saved->mlp_normed, weights->gate_proj, rows, d, F);
    backend->matmul_forward(saved->up, saved->mlp_normed, weights->up_proj, rows, d, F);
    backend->swiglu_forward(saved->hidden, saved->gate, saved->up, (size_t)rows * F);
    backend->matmul_forward(out, saved->hidden, weights->down_proj, rows, F, d);
}
