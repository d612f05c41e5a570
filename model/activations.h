/* model/activations.h — what the forward keeps for the backward, and the scratch both use.
 *
 * Sizes are for up to max_batch sequences of T tokens, N = max_batch * T rows; everything is
 * fp32 in backend memory, carved out of ONE backend allocation that the Activations own.
 * q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim, F = ffn_dim, V = vocab_size.
 *
 * The stream (DESIGN 2): stream[j], j = 0..2L-1, is the input of sublayer j (sublayer 2i is
 * layer i's attention, 2i+1 its MLP) and stream[2L] the input of the final norm. With the
 * standard residual stream[0] = e and stream[j+1] = stream[j] + f_j(stream[j]). A routing
 * site (DESIGN 2.1) will stand between these buffers and the sublayers.
 *
 * Kept for the backward, floats per token:
 *   streams          (2L + 1) * d
 *   per layer        attention: normed d, rstd 1, q q_dim, k and v 2 kv_dim, output q_dim,
 *                    lse n_heads; qk_norm adds the projections before the norm (q_dim +
 *                    kv_dim) and their rstd (n_heads + n_kv_heads);
 *                    MLP: normed d, rstd 1, gate, up and silu(gate) * up 3 F
 *   final            normed d, rstd 1, logits V, token losses and lse 2
 * Scratch (reused by every layer), floats per token:
 *   forward          sublayer output d
 *   backward         stream gradient d, normed gradient d, 2 q_dim, 3 kv_dim, 3 F, logits
 *                    gradient V, token loss gradient 1
 * so per token about L * (4d + 2 q_dim + 2 kv_dim + 3F) + 2V floats are kept. Nothing is
 * recomputed (activation checkpointing, DESIGN 3, is not here yet).
 */
#ifndef FATHOM_MODEL_ACTIVATIONS_H
#define FATHOM_MODEL_ACTIVATIONS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/backend.h"
#include "runtime/config.h"

/* One decoder layer's saved tensors (rows = B * T of the current batch). */
typedef struct {
    /* attention sublayer */
    float *attention_normed;      /* [N, d] RMSNorm(x) */
    float *attention_rstd;        /* [N] */
    float *q_projected;           /* [N, q_dim] q_proj output before q_norm (qk_norm only) */
    float *k_projected;           /* [N, kv_dim] (qk_norm only) */
    float *q_norm_rstd;           /* [N * n_heads] (qk_norm only) */
    float *k_norm_rstd;           /* [N * n_kv_heads] (qk_norm only) */
    float *q;                     /* [B, T, n_heads, head_dim] after qk-norm and RoPE */
    float *k;                     /* [B, T, n_kv_heads, head_dim] after qk-norm and RoPE */
    float *v;                     /* [B, T, n_kv_heads, head_dim] */
    float *attention_output;      /* [N, q_dim] softmax(q k^T / sqrt(hd)) v, o_proj input */
    float *attention_lse;         /* [B, n_heads, T] */
    /* MLP sublayer */
    float *mlp_normed;            /* [N, d] */
    float *mlp_rstd;              /* [N] */
    float *gate;                  /* [N, F] gate_proj output */
    float *up;                    /* [N, F] up_proj output */
    float *hidden;                /* [N, F] silu(gate) * up, down_proj input */
} LayerActivations;

/* Buffers that live only inside one op sequence; every backward zeroes what it adds into. */
typedef struct {
    float *sublayer_output;       /* [N, d] f_j before the residual add */
    float *grad_stream;           /* [N, d] d loss / d stream[j], walking down */
    float *grad_normed;           /* [N, d] */
    float *grad_q[2];             /* [N, q_dim] ping-pong through o_proj, attention, RoPE, q_norm */
    float *grad_k[2];             /* [N, kv_dim] */
    float *grad_v;                /* [N, kv_dim] */
    float *grad_gate, *grad_up, *grad_hidden; /* [N, F] */
    float *grad_logits;           /* [N, V] */
    float *grad_token_loss;       /* [N] */
} ActivationScratch;

typedef struct {
    int max_batch, T;
    float **stream;               /* [2L + 1] pointers to [N, d] */
    LayerActivations *layers;     /* [L] */
    float *final_normed;          /* [N, d] */
    float *final_rstd;            /* [N] */
    float *logits;                /* [N, V] */
    float *token_losses;          /* [N] ce_t + z_loss * lse_t^2 */
    float *token_lse;             /* [N] logsumexp of the logits */
    uint32_t *inputs, *targets;   /* [N] tokens in backend memory */
    ActivationScratch scratch;
    size_t bytes;                 /* of the one backend allocation */
    void *memory;
} Activations;

void activations_create(Activations *activations, const Backend *backend,
                        const ModelConfig *config, int max_batch, int T);
void activations_destroy(Activations *activations, const Backend *backend);

#endif
