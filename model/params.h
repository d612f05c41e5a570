/* model/params.h — the parameter table: every tensor's name, shape and place (DESIGN 2.3, 3).
 *
 * All parameters live in ONE flat fp32 buffer of `total` elements; the gradients, the AdamW
 * moments and the EMA use the same layout. An entry gives a tensor's DESIGN 2.3 (Hugging
 * Face) name, its shape ([V, d], [out, in], [n], or [m, k_max, d] for an MSAR stream
 * convolution), its offset and count in elements, its FSDP unit and its kind.
 *
 * FSDP units (DESIGN 3), each contiguous in the flat buffer, in this order:
 *   unit 0        model.embed_tokens.weight
 *   unit 1 + i    decoder layer i: attn_route.*, input_layernorm, self_attn.{q,k,v,o}_proj,
 *                 self_attn.{q,k}_norm (qk_norm only), mlp_route.*,
 *                 post_attention_layernorm, mlp.{gate,up,down}_proj
 *   unit L + 1    model.final_route.*, model.norm.weight, lm_head.weight (absent when
 *                 tie_embeddings)
 *   unit L + 2    the shared routing tensors, read at every site: model.route_null (delta
 *                 form) and model.route_streams.{n}.conv for n = 0..n_blocks (msar); empty
 *                 otherwise. A unit of their own, so that a chunk that routes gathers a few
 *                 [d] rows, not the embedding (docs/design-notes.md)
 * A site's routing weights (DESIGN 2.3; mode standard has none) come in the order query,
 * key_norm ([d]; msar [m, d]), alpha [1] (delta form), mix_bias [m] and mix_proj [m, d]
 * (msar with m > 1), just before the norm of the sublayer they stand before
 * (docs/design-notes.md). All of them are PARAM_ROUTING.
 *
 * Every tensor, and so every unit, starts on a multiple of PARAM_ALIGNMENT elements; the
 * few elements of padding in front of it belong to no tensor and stay zero (their gradient
 * is zero, so AdamW and the EMA keep them at zero). Without it one [1] alpha shifts every
 * later tensor of the delta form to an odd element, and the compute copy's bf16 weights
 * reach cuBLASLt and the vector kernels 2-byte aligned: their slow paths.
 *
 * The table owns its arrays (param_table_free releases them); it holds no tensor data.
 */
#ifndef FATHOM_MODEL_PARAMS_H
#define FATHOM_MODEL_PARAMS_H

#include <stddef.h>

#include "runtime/config.h"

#define PARAM_NAME_MAX 96
/* 64 elements: 256 bytes of fp32, 128 of bf16 (cuBLASLt's largest alignment is 256 bytes) */
#define PARAM_ALIGNMENT 64

typedef enum {
    PARAM_EMBEDDING, /* embed_tokens, an untied lm_head */
    PARAM_NORM,      /* RMSNorm weights, qk norms included */
    PARAM_MATRIX,    /* projections */
    PARAM_BIAS,      /* none in the Llama/Qwen3 families yet */
    PARAM_ROUTING,   /* attention-over-depth weights (DESIGN 2.1) */
} ParamKind;

typedef struct {
    char name[PARAM_NAME_MAX];
    int ndim;         /* 1, 2 or 3 (the MSAR stream convolutions) */
    int shape[3];     /* trailing entries beyond ndim are 1 */
    size_t offset;    /* first element in the flat buffer, a multiple of PARAM_ALIGNMENT */
    size_t count;     /* shape[0] * shape[1] * shape[2] */
    int unit;         /* FSDP unit */
    ParamKind kind;
} ParamEntry;

typedef struct {
    size_t offset, count; /* the unit's contiguous range of the flat buffer (with padding) */
    int first_param;      /* its entries are params[first_param .. first_param+n_params-1] */
    int n_params;
} ParamUnit;

typedef struct {
    ParamEntry *params;
    int n_params;
    ParamUnit *units;
    int n_units;              /* n_layers + 3 */
    int unit_head, unit_shared; /* n_layers + 1, n_layers + 2 */
    size_t total;             /* elements in the flat buffer, padding included */
    size_t layer_matrix_count; /* q,k,v,o,gate,up,down elements over all layers (MFU, DESIGN 6) */
} ParamTable;

/* Lays out the parameters of `config` with the standard residual (no routing weights).
 * Fails with EXIT_CONFIG on impossible sizes. */
void param_table_build(ParamTable *table, const ModelConfig *config);
/* Same, with the routing weights of `residual` (NULL: standard). */
void param_table_build_with_residual(ParamTable *table, const ModelConfig *config,
                                     const ResidualConfig *residual);
void param_table_free(ParamTable *table);

/* The entry called `name`, or NULL when the model has no such tensor. */
const ParamEntry *param_table_find(const ParamTable *table, const char *name);
/* Same, but a missing name is a programming error: fatal(EXIT_CONFIG, ...) naming it. */
const ParamEntry *param_table_require(const ParamTable *table, const char *name);

/* The optim.no_decay bit (NO_DECAY_*) that covers `kind`; 0 for matrices (always decayed). */
unsigned param_kind_no_decay_bit(ParamKind kind);
/* "embedding", "norm", "matrix", "bias", "routing". */
const char *param_kind_name(ParamKind kind);

#endif
