/* model/layer_backward.c — the sublayer backwards; see layer.h.
 *
 * Each runs its forward in reverse. A scratch gradient's first contribution is written
 * (GRAD_WRITE, runtime/backend.h), so no scratch buffer is zeroed; the later contributions
 * to the same buffer (grad_normed receives one from each projection that reads the normed
 * input) are added. The projections' weight gradients are written or added as
 * grads->matrix_mode says (the first microbatch after a clear writes them), the norms'
 * always added.
 */
#include "model/layer.h"

/* GRAD_WRITE only when the caller said so: a LayerGrads left zeroed adds */
static GradMode matrix_mode(const LayerGrads *grads)
{
    return grads->matrix_mode == GRAD_WRITE ? GRAD_WRITE : GRAD_ADD;
}

/* The sublayer's input norm, last op of its backward: into dx, and branch (layer.h). */
static void input_norm_backward(const Backend *backend, Activation *dx, GradMode dx_mode,
                                const GradBranch *branch, float *dweight,
                                const Activation *dout, const Activation *x,
                                const Activation *weight, const float *rstd, int rows, int d)
{
    if (branch && branch->merge) /* dx written (dx_mode is GRAD_WRITE), then the merge's */
        backend->route_merge_rmsnorm_backward(dx, dweight, dout, x, weight, rstd, rows, d,
                                              branch->merge);
    else if (branch) /* dx written (dx_mode is GRAD_WRITE), the stream added */
        backend->rmsnorm_backward_branch(dx, branch->stream, dweight, dout, x, weight, rstd,
                                         rows, d);
    else
        backend->rmsnorm_backward(dx, dx_mode, dweight, dout, x, weight, rstd, rows, d);
}

void attention_sublayer_backward(const LayerContext *context, const LayerWeights *weights,
                                 LayerGrads *grads, const LayerActivations *saved,
                                 const Activation *x, const Activation *dout, Activation *dx,
                                 GradMode dx_mode, const GradBranch *branch)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    ActivationScratch *scratch = context->scratch;
    const int B = context->B, T = context->T, rows = B * T;
    const int d = config->d_model, hd = config->head_dim;
    const int heads = config->n_heads, kv_heads = config->n_kv_heads;
    const int q_dim = heads * hd, kv_dim = kv_heads * hd;
    Activation *grad_output = scratch->grad_q[0]; /* d attention_output */
    Activation *grad_q = scratch->grad_q[1], *grad_k = scratch->grad_k[0];

    const GradMode weight_mode = matrix_mode(grads);
    backend->matmul_backward(grad_output, GRAD_WRITE, grads->o_proj, weight_mode, dout,
                             saved->attention_output, weights->o_proj, rows, q_dim, d);

    backend->attention_backward(grad_q, grad_k, scratch->grad_v, GRAD_WRITE, grad_output,
                                saved->q, saved->k, saved->v, saved->attention_output,
                                saved->attention_lse, B, T, heads, kv_heads, hd);

    /* through RoPE: grad_q[1] -> grad_q[0] (free again), grad_k[0] -> grad_k[1] */
    Activation *grad_q_unrotated = scratch->grad_q[0], *grad_k_unrotated = scratch->grad_k[1];
    backend->rope_backward(grad_q_unrotated, GRAD_WRITE, grad_q, context->rope_cos,
                           context->rope_sin, B, T, heads, hd);
    backend->rope_backward(grad_k_unrotated, GRAD_WRITE, grad_k, context->rope_cos,
                           context->rope_sin, B, T, kv_heads, hd);
    Activation *grad_q_projected = grad_q_unrotated, *grad_k_projected = grad_k_unrotated;

    if (config->qk_norm) {
        /* through the per-head norms: back into grad_q[1], grad_k[0] */
        grad_q_projected = scratch->grad_q[1];
        grad_k_projected = scratch->grad_k[0];
        backend->rmsnorm_backward(grad_q_projected, GRAD_WRITE, grads->q_norm, grad_q_unrotated,
                                  saved->q_projected, weights->q_norm, saved->q_norm_rstd,
                                  rows * heads, hd);
        backend->rmsnorm_backward(grad_k_projected, GRAD_WRITE, grads->k_norm, grad_k_unrotated,
                                  saved->k_projected, weights->k_norm, saved->k_norm_rstd,
                                  rows * kv_heads, hd);
    }

    /* the three projections read the same normed input: the first writes its gradient, the
     * other two add theirs */
    Activation *grad_normed = scratch->grad_normed;
    const Activation *n = saved->attention_normed;
    backend->matmul_backward(grad_normed, GRAD_WRITE, grads->q_proj, weight_mode,
                             grad_q_projected, n, weights->q_proj, rows, d, q_dim);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->k_proj, weight_mode,
                             grad_k_projected, n, weights->k_proj, rows, d, kv_dim);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->v_proj, weight_mode,
                             scratch->grad_v, n, weights->v_proj, rows, d, kv_dim);
    input_norm_backward(backend, dx, dx_mode, branch, grads->input_layernorm, grad_normed, x,
                        weights->input_layernorm, saved->attention_rstd, rows, d);
}

void mlp_sublayer_backward(const LayerContext *context, const LayerWeights *weights,
                           LayerGrads *grads, const LayerActivations *saved,
                           const Activation *x, const Activation *dout, Activation *dx,
                           GradMode dx_mode, const GradBranch *branch)
{
    const Backend *backend = context->backend;
    const ModelConfig *config = context->config;
    ActivationScratch *scratch = context->scratch;
    const int rows = context->B * context->T, d = config->d_model, F = config->ffn_dim;
    const size_t hidden_count = (size_t)rows * F;

    const GradMode weight_mode = matrix_mode(grads);
    backend->matmul_backward(scratch->grad_hidden, GRAD_WRITE, grads->down_proj, weight_mode,
                             dout, saved->hidden, weights->down_proj, rows, F, d);
    backend->swiglu_backward(scratch->grad_gate, scratch->grad_up, GRAD_WRITE,
                             scratch->grad_hidden, saved->gate, saved->up, hidden_count);

    /* gate_proj and up_proj read the same normed input: written, then added */
    Activation *grad_normed = scratch->grad_normed;
    backend->matmul_backward(grad_normed, GRAD_WRITE, grads->gate_proj, weight_mode,
                             scratch->grad_gate, saved->mlp_normed, weights->gate_proj, rows, d,
                             F);
    backend->matmul_backward(grad_normed, GRAD_ADD, grads->up_proj, weight_mode,
                             scratch->grad_up, saved->mlp_normed, weights->up_proj, rows, d, F);
    input_norm_backward(backend, dx, dx_mode, branch, grads->post_attention_layernorm,
                        grad_normed, x, weights->post_attention_layernorm, saved->mlp_rstd,
                        rows, d);
}
