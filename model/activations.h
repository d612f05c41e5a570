/* model/activations.h — what the forward keeps for the backward, and the scratch both use.
 *
 * Three kinds of backend memory, each ONE allocation carved into buffers (activations.c):
 *
 *   ModelScratch   per rank, reused by every chunk and microbatch; nothing in it outlives
 *                  one chunk's forward or backward (except the logits, see below).
 *   Stash          per (microbatch, chunk): what one chunk's forward keeps for its backward.
 *                  The pipeline holds as many as its schedule keeps in flight (DESIGN 3).
 *   SummaryStore   per microbatch: the block summaries of attention over depth that a rank
 *                  receives or makes, the running stream p of the delta form, and the
 *                  gradient accumulator of every block; shared by the rank's chunks of that
 *                  microbatch, which is what the cross-stage cache keeps (DESIGN 3).
 *
 * Sizes are for up to max_batch sequences of T tokens, N = max_batch * T rows. Activations
 * and their gradients are `Activation` arrays (the backend's dtype: fp32 cpu, bf16 cuda);
 * statistics (rstd, lse, routing weights, gates, token losses) are fp32 on every backend
 * (runtime/backend.h). q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim,
 * F = ffn_dim, V = vocab_size. Arrays of pointers are indexed GLOBALLY (sublayer j of the
 * whole network, layer i, site j, summary buffer b) and are NULL where a stash or store
 * keeps nothing, so a chunk walks the same indices as the whole network.
 *
 * The stream (DESIGN 2): stream[j], j = 0..2L-1, is the input of sublayer j (sublayer 2i is
 * layer i's attention, 2i+1 its MLP) and stream[2L] the input of the final norm. With the
 * standard residual stream[j+1] = stream[j] + f_j(stream[j]). With attention over depth
 * (DESIGN 2.1) stream[j] = x_j, what routing site j hands its sublayer, and the sources live
 * in the SummaryStore (model/residual.h says which buffer holds what).
 *
 * A stash of a chunk over sublayers [first, end) keeps, floats per token:
 *   streams          standard: stream[first..end] (the chunk's input, every sublayer's input,
 *                    its output); routed: x_j for j in [first, end), and x_2L with the head;
 *                    msar's replace form walked in two phases keeps only x_2L (its
 *                    backward makes x_j again: residual_site_keeps_input)
 *   per layer        attention: normed d, rstd 1, q q_dim, k and v 2 kv_dim, output q_dim,
 *                    lse n_heads; qk_norm adds the projections before the norm (q_dim +
 *                    kv_dim) and their rstd (n_heads + n_kv_heads);
 *                    MLP: normed d, rstd 1, gate, up and silu(gate) * up 3 F
 *   per site         m N_j (H + 1) (depth weights and key rstd per stream), msar m > 1 adds
 *                    2m (mix gates and rstd); msar's sites walked in two phases keep only
 *                    the mix's (residual_site_keeps_weights: their depth weights live in
 *                    the scratch for the open block, and the backward makes them again)
 *   head (last)      normed d, rstd 1, token losses and lse 2; tokens: inputs (chunk 0),
 *                    targets (last chunk)
 * With activation checkpointing (train.activation_checkpointing: full, DESIGN 3) a stash
 * keeps no layer intermediates and no x_j: only each layer's input (standard: stream[2i];
 * delta: p at the layer's start; replace: nothing, its partials are in the store), the
 * chunk's output stream, the site statistics and the head. The backward of a layer first
 * recomputes its forward, routing included, into the scratch's one-layer `recompute` buffers.
 *
 * A summary store keeps the summary buffers the rank reads or writes: replace up to
 * (2L + 1) d (every partial is read), delta (n_b + 1) d plus p; and (n_b + 1) d of block
 * gradients. For Block MHAR delta at the 8B shape (L 32, 8 blocks, d 4096) that is (9 + 1) d
 * beside the 65 d of the streams x_j: the routed stream costs little over the standard one.
 * The msar convolved sources E_r(source) are never stored: a site routed alone convolves each
 * source inside its read (the stream route op), and the two-phase walk convolves a block's
 * sources into the scratch for every stream at once, where they stay while the block is open
 * (DESIGN 2.2).
 *
 * The scratch, values per token: sublayer output d; stream gradient d, normed gradient d,
 * 2 q_dim, 3 kv_dim, 3 F, token loss gradient 1; routed: d x_j d, delta d f_j, the null
 * source and its gradient 2d; route backward M H; the delta form's two-phase walk
 * (model/route_block.h): the open block's phase-one results (its d x in the backward) S d,
 * and S d more with checkpointing (both live in a checkpointed backward); msar: routed
 * streams and their gradients 2 m d, the mix d, recomputed weights M (H + 1), and in two
 * phases the streams of a block's sites m (S + 1) d, one stream's convolved sources M d and
 * every stream's gradients of them m M d, the open block's depth weights and key statistics
 * S M (H + 1) (m S M (H + 1) in the replace form, which also convolves a site's partial
 * for every stream into m d and makes x_j again in d).
 * The rows of the two-phase walk take the logits' gradient as far as it goes, the rest is
 * carved (it is idle outside the head's backward, they outside the layers' walk; a chunk
 * walk that may write them first takes the chunk the head's forward may have left there,
 * model/chunk.c). With
 * checkpointing one layer's intermediates and 3d. The logits and their gradient are two
 * [logit_rows, V] buffers: the head and the loss walk the batch in chunks of logit_rows
 * tokens (model/loss.h), so the logits of a whole batch exist at once only when they fit in
 * ACTIVATION_LOGIT_BYTES (then logit_rows = N, and `logits_owner` says whose they are).
 */
#ifndef FATHOM_MODEL_ACTIVATIONS_H
#define FATHOM_MODEL_ACTIVATIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/residual.h"
#include "runtime/backend.h"
#include "runtime/config.h"

/* One decoder layer's saved tensors (rows = B * T of the current batch). */
typedef struct {
    /* attention sublayer */
    Activation *attention_normed; /* [N, d] RMSNorm(x) */
    float *attention_rstd;        /* [N] */
    Activation *q_projected;      /* [N, q_dim] q_proj output before q_norm (qk_norm only) */
    Activation *k_projected;      /* [N, kv_dim] (qk_norm only) */
    float *q_norm_rstd;           /* [N * n_heads] (qk_norm only) */
    float *k_norm_rstd;           /* [N * n_kv_heads] (qk_norm only) */
    Activation *q;                /* [B, T, n_heads, head_dim] after qk-norm and RoPE */
    Activation *k;                /* [B, T, n_kv_heads, head_dim] after qk-norm and RoPE */
    Activation *v;                /* [B, T, n_kv_heads, head_dim] */
    Activation *attention_output; /* [N, q_dim] softmax(q k^T / sqrt(hd)) v, o_proj input */
    float *attention_lse;         /* [B, n_heads, T] */
    /* MLP sublayer */
    Activation *mlp_normed;       /* [N, d] */
    float *mlp_rstd;              /* [N] */
    Activation *gate;             /* [N, F] gate_proj output */
    Activation *up;               /* [N, F] up_proj output */
    Activation *hidden;           /* [N, F] silu(gate) * up, down_proj input */
} LayerActivations;

/* Buffers that live only inside one op sequence. A backward writes a gradient buffer's first
 * contribution (GRAD_WRITE) or zeroes it before an op that can only add into it. */
typedef struct {
    Activation *sublayer_output;  /* [N, d] f_j before the residual add */
    Activation *grad_stream;      /* [N, d] d loss / d stream[j], walking down */
    Activation *grad_normed;      /* [N, d] */
    Activation *grad_q[2];        /* [N, q_dim] ping-pong through o_proj, attention, RoPE, q_norm */
    Activation *grad_k[2];        /* [N, kv_dim] */
    Activation *grad_v;           /* [N, kv_dim] */
    Activation *grad_gate, *grad_up, *grad_hidden; /* [N, F] */
    Activation *grad_logits;      /* [logit_rows, V] (Activations.logit_rows) */
    float *grad_token_loss;       /* [N] */
} ActivationScratch;

/* One routing site's saved state. Per-stream regions are strided by the largest batch
 * (N rows) so that any batch up to max_batch fits; within a region the layout is the one
 * runtime/backend.h gives for `rows` = B * T of the current batch. */
typedef struct {
    float *weights;      /* stream r at r * N_j * N * H: [N_j, rows, H] depth weights */
    float *rstd;         /* stream r at r * N_j * N: [N_j, rows] key statistics; attnres's
                            two-phase walk: its block's region at the block's first site,
                            NULL at the others (residual_site_rstd_rows) */
    float *mix_gates;    /* [rows, m] (msar, m > 1) */
    float *mix_rstd;     /* [rows, m] (msar, m > 1) */
} SiteActivations;

/* Everything a routing site needs besides its saved state, per the op table's rules. */
typedef struct {
    const Activation **taps;      /* [M] host array: stream r's taps per source (NULL: null) */
    float **grad_taps;            /* [M] host array: where the taps' gradients go */
    Activation **streams;         /* [m] msar: o_r, the routed streams of a site routed
                                     alone (two-phase walk: stream r's slots 0 and 1) */
    Activation **grad_streams;    /* [m] */
    Activation *mixed;            /* [N, d] msar delta: the mix before alpha */
    Activation *site_input;       /* [N, d] msar replace: x_j when the stash keeps none
                                     (residual_site_keeps_input) */
    float *route_backward;    /* [M, N, H] route_backward's scratch */
    /* two-phase routing (model/route_block.h), S = sublayers_per_block: */
    Activation **block_results;  /* [S] [N, d]: phase one's Route of each site of the open
                                    block (forward, and the recompute of checkpointing) */
    Activation **block_grads;    /* [S] [N, d]: d x of each site, until the block's backward;
                                    the same buffers as block_results without checkpointing
                                    (a forward and a backward never overlap then); both may
                                    lie inside layer.grad_logits (see the top of this file) */
    /* msar two-phase: stream r's slots are stream_slots[r (S + 1) + k], k = 0..S; phase one
     * leaves o_r of site i in slot i + 1, and the block's backward writes d o_r of each site
     * into a slot whose o_r is spent (model/route_block_streams.c) */
    Activation **stream_slots;   /* [m (S + 1)] [N, d] */
    Activation **conv_rows;      /* [M] [N, d] E_r of each convolved source of the block */
    Activation **partial_rows;   /* [m] [N, d] replace form: E_r of a site's partial */
    Activation **grad_conv_rows; /* [m, M] [N, d] their gradients, every stream's */
    float *block_weights;        /* msar: the open block's depth weights, [S, M, N, H] a
                                    region, one region a site (delta: the stream being
                                    walked) or a site and stream (replace) */
    float *block_rstd;           /* [S, M, N] the same regions' key statistics */
    float *block_lse;            /* [m, S, N, H] msar replace: phase one's lse, for the merges */
    float *block_means;          /* [m, S, N, H] msar replace: the sites' softmax centres */
} RouteScratch;

/* The final norm and the loss of one microbatch (the last chunk's stash). */
typedef struct {
    Activation *final_normed;     /* [N, d] */
    float *final_rstd;            /* [N] */
    float *token_losses;          /* [N] ce_t + z_loss * lse_t^2 */
    float *token_lse;             /* [N] logsumexp of the logits */
} HeadActivations;

typedef struct {
    int max_batch, T;
    ActivationScratch layer;      /* the sublayers' scratch (model/layer.h) */
    RouteScratch route;           /* the sites' scratch (model/route_site.h) */
    Activation *grad_input;       /* [N, d] d x_j, what a site's backward starts from */
    Activation *grad_output;      /* [N, d] d f_j in the delta form (dp_{j+1} + d b_n) */
    Activation *null_rows;        /* [N, d] delta: model.route_null on every token */
    Activation *grad_null_rows;   /* [N, d] delta: d null per token, summed into d route_null */
    uint32_t *zero_tokens;        /* [N] all 0: route_null is looked up as a one-row table */
    int logit_rows;               /* rows of the logits chunk (model/loss.h) */
    int logit_capacity;           /* the rows its buffers were made for */
    Activation *logits;           /* [logit_rows, V] */
    const void *logits_owner;     /* the HeadActivations whose whole batch `logits` holds */
    const void *chunk_owner;      /* the HeadActivations of whose batch `logits` holds the */
    int chunk_first;              /*   chunk from row chunk_first (model/loss.h) */
    const void *spare_owner;      /* the HeadActivations of whose batch layer.grad_logits */
    int spare_first;              /*   holds the chunk from row spare_first (model/loss.h) */
    bool chunk_gradient;          /* `logits`, and the spare, hold their chunk's gradient, */
    bool spare_gradient;          /*   not its logits: made by a forward for a backward of */
    float gradient_scale;         /*   this loss_scale (model/loss.h) */
    Activation *all_logits;       /* [N, V] its own allocation, when asked for (model.h) */
    bool checkpointing;           /* the recompute buffers exist */
    LayerActivations recompute;   /* one layer's intermediates, remade in its backward */
    Activation *recompute_x[2];   /* [N, d] x of the layer's attention and MLP */
    Activation *recompute_stream; /* [N, d] h or p between the layer's two sublayers */
    size_t bytes;                 /* of the one backend allocation */
    void *memory;
} ModelScratch;

typedef struct {
    int first_sublayer, end_sublayer; /* the chunk's sublayers [first, end) */
    bool has_embedding, has_head, checkpointed;
    Activation **stream;          /* [2L + 1] (see the top of this file) */
    LayerActivations *layers;     /* [L]; all NULL outside the span or when checkpointed */
    Activation **layer_stream;    /* [L] delta and checkpointed: p at the layer's start */
    SiteActivations *sites;       /* [n_sites]; the span's sites and, with the head, 2L */
    HeadActivations head;         /* has_head */
    uint32_t *inputs, *targets;   /* [N] tokens in backend memory (chunk 0, last chunk) */
    int batch;                    /* B of the forward it holds; 0: none */
    float z_loss;
    size_t bytes;
    void *memory;
} Stash;

typedef struct {
    Activation **summaries;       /* [n_buffers] [N, d]; NULL where the rank needs none */
    Activation *stream;           /* [N, d] delta: p, the running stream (forward only) */
    Activation **grad_blocks;     /* [n_blocks + 1] [N, d]: d b_n, and the open block's
                                     accumulator while it is walked */
    int n_buffers, n_blocks;
    size_t bytes;
    void *memory;
} SummaryStore;

/* What a stash holds: a chunk over sublayers [first, end) of the network. */
typedef struct {
    int first_sublayer, end_sublayer;
    bool has_embedding, has_head, checkpointed;
} StashShape;

/* The most bytes one logits chunk may take: 4096 rows of Llama-3's 128256 bf16 logits. */
#define ACTIVATION_LOGIT_BYTES ((size_t)1 << 30)

/* Each create allocates once (EXIT_CONFIG naming the keys that shrink it when that fails);
 * `backend` NULL only sizes: the *_bytes functions return what create would allocate. */
void scratch_create(ModelScratch *scratch, const Backend *backend, const ModelConfig *config,
                    const ResidualPlan *plan, int max_batch, int T, bool checkpointing);
void scratch_destroy(ModelScratch *scratch, const Backend *backend);
size_t scratch_bytes(const Backend *backend, const ModelConfig *config,
                     const ResidualPlan *plan, int max_batch, int T, bool checkpointing);

void stash_create(Stash *stash, const Backend *backend, const ModelConfig *config,
                  const ResidualPlan *plan, int max_batch, int T, StashShape shape);
void stash_destroy(Stash *stash, const Backend *backend);
size_t stash_bytes(const Backend *backend, const ModelConfig *config, const ResidualPlan *plan,
                   int max_batch, int T, StashShape shape);

/* needed[b] (n_buffers entries; NULL: all) says which summary buffers the rank touches. */
void store_create(SummaryStore *store, const Backend *backend, const ModelConfig *config,
                  const ResidualPlan *plan, int max_batch, int T, const bool *needed);
void store_destroy(SummaryStore *store, const Backend *backend);
size_t store_bytes(const Backend *backend, const ModelConfig *config, const ResidualPlan *plan,
                   int max_batch, int T, const bool *needed);

#endif
