/* model/params.c — see params.h. */
#include "model/params.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

/* Appends one tensor to the table; the caller has reserved room. */
static void table_append(ParamTable *table, int unit, ParamKind kind, int rows, int cols,
                         const char *format, ...) __attribute__((format(printf, 6, 7)));

static void table_append(ParamTable *table, int unit, ParamKind kind, int rows, int cols,
                         const char *format, ...)
{
    ParamEntry *entry = &table->params[table->n_params++];
    va_list args;
    va_start(args, format);
    int length = vsnprintf(entry->name, sizeof entry->name, format, args);
    va_end(args);
    if (length < 0 || (size_t)length >= sizeof entry->name)
        fatal(EXIT_CONFIG, "parameter name longer than %d characters", PARAM_NAME_MAX - 1);
    entry->ndim = cols > 0 ? 2 : 1;
    entry->shape[0] = rows;
    entry->shape[1] = cols > 0 ? cols : 1;
    entry->count = (size_t)rows * (size_t)entry->shape[1];
    entry->offset = table->total;
    entry->unit = unit;
    entry->kind = kind;
    table->total += entry->count;
}

static void check_positive(int value, const char *key)
{
    if (value < 1)
        fatal(EXIT_CONFIG, "model.%s = %d must be >= 1", key, value);
}

void param_table_build(ParamTable *table, const ModelConfig *config)
{
    check_positive(config->vocab_size, "vocab_size");
    check_positive(config->d_model, "d_model");
    check_positive(config->n_layers, "n_layers");
    check_positive(config->n_heads, "n_heads");
    check_positive(config->n_kv_heads, "n_kv_heads");
    check_positive(config->head_dim, "head_dim");
    check_positive(config->ffn_dim, "ffn_dim");

    const int d = config->d_model, layers = config->n_layers, ffn = config->ffn_dim;
    const int q_dim = config->n_heads * config->head_dim;
    const int kv_dim = config->n_kv_heads * config->head_dim;
    const int per_layer = 9 + (config->qk_norm ? 2 : 0);

    memset(table, 0, sizeof *table);
    table->params = xcalloc((size_t)per_layer * layers + 3, sizeof *table->params);
    table->n_units = layers + 2;
    table->units = xcalloc((size_t)table->n_units, sizeof *table->units);

    for (int unit = 0; unit < table->n_units; unit++) {
        ParamUnit *range = &table->units[unit];
        range->offset = table->total;
        range->first_param = table->n_params;
        if (unit == 0) {
            table_append(table, unit, PARAM_EMBEDDING, config->vocab_size, d,
                         "model.embed_tokens.weight");
        } else if (unit <= layers) {
            char layer[32];
            snprintf(layer, sizeof layer, "model.layers.%d", unit - 1);
            const int hd = config->head_dim;
            table_append(table, unit, PARAM_NORM, d, 0, "%s.input_layernorm.weight", layer);
            table_append(table, unit, PARAM_MATRIX, q_dim, d, "%s.self_attn.q_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, kv_dim, d, "%s.self_attn.k_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, kv_dim, d, "%s.self_attn.v_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, d, q_dim, "%s.self_attn.o_proj.weight", layer);
            if (config->qk_norm) {
                table_append(table, unit, PARAM_NORM, hd, 0, "%s.self_attn.q_norm.weight", layer);
                table_append(table, unit, PARAM_NORM, hd, 0, "%s.self_attn.k_norm.weight", layer);
            }
            table_append(table, unit, PARAM_NORM, d, 0, "%s.post_attention_layernorm.weight",
                         layer);
            table_append(table, unit, PARAM_MATRIX, ffn, d, "%s.mlp.gate_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, ffn, d, "%s.mlp.up_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, d, ffn, "%s.mlp.down_proj.weight", layer);
        } else {
            table_append(table, unit, PARAM_NORM, d, 0, "model.norm.weight");
            if (!config->tie_embeddings)
                table_append(table, unit, PARAM_EMBEDDING, config->vocab_size, d, "lm_head.weight");
        }
        range->count = table->total - range->offset;
        range->n_params = table->n_params - range->first_param;
    }

    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        int in_layer = entry->unit >= 1 && entry->unit <= layers;
        if (in_layer && entry->kind == PARAM_MATRIX)
            table->layer_matrix_count += entry->count;
    }
}

void param_table_free(ParamTable *table)
{
    free(table->params);
    free(table->units);
    memset(table, 0, sizeof *table);
}

/* A linear scan: a table holds about 11 entries per layer and lookups happen at setup, not
 * per step. */
const ParamEntry *param_table_find(const ParamTable *table, const char *name)
{
    for (int p = 0; p < table->n_params; p++)
        if (strcmp(table->params[p].name, name) == 0)
            return &table->params[p];
    return NULL;
}

const ParamEntry *param_table_require(const ParamTable *table, const char *name)
{
    const ParamEntry *entry = param_table_find(table, name);
    if (!entry)
        fatal(EXIT_CONFIG, "the model has no parameter named '%s'", name);
    return entry;
}

unsigned param_kind_no_decay_bit(ParamKind kind)
{
    switch (kind) {
    case PARAM_EMBEDDING: return NO_DECAY_EMBEDDINGS;
    case PARAM_NORM: return NO_DECAY_NORMS;
    case PARAM_BIAS: return NO_DECAY_BIASES;
    case PARAM_ROUTING: return NO_DECAY_ROUTING;
    case PARAM_MATRIX: return 0;
    }
    return 0;
}

const char *param_kind_name(ParamKind kind)
{
    switch (kind) {
    case PARAM_EMBEDDING: return "embedding";
    case PARAM_NORM: return "norm";
    case PARAM_MATRIX: return "matrix";
    case PARAM_BIAS: return "bias";
    case PARAM_ROUTING: return "routing";
    }
    return "unknown";
}
