/* model/layer_backward.c — the sublayer backwards; see layer.h.
 *
 * Each runs its forward in reverse. A scratch gradient is zeroed right before the op that
 * first adds into it (GRAD_ADD, runtime/backend.h); weight gradients are never zeroed here,
 * so microbatches accumulate.
 */
#include "model/layer.h"

/* The sublayer's input norm, last op of its backward: into dx, and branch (layer.h). */
static void input_norm_backward(const Backend *backend, Activation *dx, Activation *branch,
                                float *dweight, const Activation *dout, const Activation *x,
                                const Activation *weight, const float *rstd, int rows, int d)
{
    if (branch)
        backend->rmsnorm_backward_branch(dx, branch, dweight, dout, x, weight, rstd, rows, d);
    else
        backend->rmsnorm_backward(dx, GRAD_ADD, dweight, dout, x, weight, rstd, rows, d);
}

void attention_sublayer_backward(const LayerContext *context, const LayerWeights *weights,
                                 LayerGrads *grads, const LayerActivations *saved,
                                 const Activation *x, const Activation *dout, Activation *dx,
                                 Activation *branch)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    ActivationScratch *scratch = context->scratch;
    const int B = context->B, T = context->T, rows = B * T;
    const int d = config->d_model, hd = config->head_dim;
    const int heads = config->n_heads, kv_heads = config->n_kv_heads;
    const int q_dim = heads * hd, kv_dim = kv_heads * hd;
    const size_t q_bytes = (size_t)rows * q_dim * backend->activation_bytes;
    const size_t kv_bytes = (size_t)rows * kv_dim * backend->activation_bytes;
    Activation *grad_output = scratch->grad_q[0]; /* d attention_output */
    Activation *grad_q = scratch->grad_q[1], *grad_k = scratch->grad_k[0];

    backend->zero(grad_output, q_bytes);
    backend->matmul_backward(grad_output, GRAD_ADD, grads->o_proj, dout,
                             saved->attention_output, weights->o_proj, rows, q_dim, d);

    backend->zero(grad_q, q_bytes);
    backend->zero(grad_k, kv_bytes);
    backend->zero(scratch->grad_v, kv_bytes);
    backend->attention_backward(grad_q, grad_k, scratch->grad_v, GRAD_ADD, grad_output,
                                saved->q, saved->k, saved->v, saved->attention_output,
                                saved->attention_lse, B, T, heads, kv_heads, hd);

    /* through RoPE: grad_q[1] -> grad_q[0] (free again), grad_k[0] -> grad_k[1] */
    Activation *grad_q_unrotated = scratch->grad_q[0], *grad_k_unrotated = scratch->grad_k[1];
    backend->zero(grad_q_unrotated, q_bytes);
    backend->zero(grad_k_unrotated, kv_bytes);
    backend->rope_backward(grad_q_unrotated, GRAD_ADD, grad_q, context->rope_cos,
                           context->rope_sin, B, T, heads, hd);
    backend->rope_backward(grad_k_unrotated, GRAD_ADD, grad_k, context->rope_cos,
                           context->rope_sin, B, T, kv_heads, hd);
    Activation *grad_q_projected = grad_q_unrotated, *grad_k_projected = grad_k_unrotated;

    if (config->qk_norm) {
        /* through the per-head norms: back into grad_q[1], grad_k[0] */
        grad_q_projected = scratch->grad_q[1];
        grad_k_projected = scratch->grad_k[0];
        backend->zero(grad_q_projected, q_bytes);
        backend->zero(grad_k_projected, kv_bytes);
        backend->rmsnorm_backward(grad_q_projected, GRAD_ADD, grads->q_norm, grad_q_unrotated,
                                  saved->q_projected, weights->q_norm, saved->q_norm_rstd,
                                  rows * heads, hd);
        backend->rmsnorm_backward(grad_k_projected, GRAD_ADD, grads->k_norm, grad_k_unrotated,
                                  saved->k_projected, weights->k_norm, saved->k_norm_rstd,
                                  rows * kv_heads, hd);
    }

    Activation *grad_normed = scratch->grad_normed;
    const Activation *n = saved->attention_normed;
    backend->zero(grad_normed, (size_t)rows * d * backend->activation_bytes);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->q_proj, grad_q_projected, n,
                             weights->q_proj, rows, d, q_dim);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->k_proj, grad_k_projected, n,
                             weights->k_proj, rows, d, kv_dim);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->v_proj, scratch->grad_v, n,
                             weights->v_proj, rows, d, kv_dim);
    input_norm_backward(backend, dx, branch, grads->input_layernorm, grad_normed, x,
                        weights->input_layernorm, saved->attention_rstd, rows, d);
}

void mlp_sublayer_backward(const LayerContext *context, const LayerWeights *weights,
                           LayerGrads *grads, const LayerActivations *saved,
                           const Activation *x, const Activation *dout, Activation *dx,
                           Activation *branch)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    ActivationScratch *scratch = context->scratch;
    const int rows = context->B * context->T, d = config->d_model, F = config->ffn_dim;
    const size_t hidden_count = (size_t)rows * F;

    const size_t hidden_bytes = hidden_count * backend->activation_bytes;
    backend->zero(scratch->grad_hidden, hidden_bytes);
    backend->matmul_backward(scratch->grad_hidden, GRAD_ADD, grads->down_proj, dout,
                             saved->hidden, weights->down_proj, rows, F, d);
    backend->zero(scratch->grad_gate, hidden_bytes);
    backend->zero(scratch->grad_up, hidden_bytes);
    backend->swiglu_backward(scratch->grad_gate, scratch->grad_up, GRAD_ADD,
                             scratch->grad_hidden, saved->gate, saved->up, hidden_count);

    Activation *grad_normed = scratch->grad_normed;
    backend->zero(grad_normed, (size_t)rows * d * backend->activation_bytes);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->gate_proj, scratch->grad_gate,
                             saved->mlp_normed, weights->gate_proj, rows, d, F);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->up_proj, scratch->grad_up,
                             saved->mlp_normed, weights->up_proj, rows, d, F);
    input_norm_backward(backend, dx, branch, grads->post_attention_layernorm, grad_normed, x,
                        weights->post_attention_layernorm, saved->mlp_rstd, rows, d);
}
