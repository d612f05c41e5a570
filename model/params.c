/* model/params.c — see params.h. */
#include "model/params.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/residual.h"
#include "runtime/error.h"

/* The next multiple of PARAM_ALIGNMENT from `elements`. */
static size_t param_align(size_t elements)
{
    return (elements + PARAM_ALIGNMENT - 1) / PARAM_ALIGNMENT * PARAM_ALIGNMENT;
}

/* Appends one tensor of shape[0..ndim-1]; the caller has reserved room. */
static void table_append_shape(ParamTable *table, int unit, ParamKind kind, int ndim,
                               const int shape[3], const char *name)
{
    ParamEntry *entry = &table->params[table->n_params++];
    if (strlen(name) >= sizeof entry->name)
        fatal(EXIT_CONFIG, "parameter name longer than %d characters", PARAM_NAME_MAX - 1);
    snprintf(entry->name, sizeof entry->name, "%s", name);
    entry->ndim = ndim;
    entry->count = 1;
    for (int axis = 0; axis < 3; axis++) {
        entry->shape[axis] = axis < ndim ? shape[axis] : 1;
        entry->count *= (size_t)entry->shape[axis];
    }
    entry->offset = param_align(table->total);
    entry->unit = unit;
    entry->kind = kind;
    table->total = entry->offset + entry->count;
}

/* A [rows] (cols = 0) or [rows, cols] tensor named by a printf format. */
static void table_append(ParamTable *table, int unit, ParamKind kind, int rows, int cols,
                         const char *format, ...) __attribute__((format(printf, 6, 7)));

static void table_append(ParamTable *table, int unit, ParamKind kind, int rows, int cols,
                         const char *format, ...)
{
    char name[PARAM_NAME_MAX + 1];
    va_list args;
    va_start(args, format);
    int length = vsnprintf(name, sizeof name, format, args);
    va_end(args);
    if (length < 0 || (size_t)length >= PARAM_NAME_MAX)
        fatal(EXIT_CONFIG, "parameter name longer than %d characters", PARAM_NAME_MAX - 1);
    const int shape[3] = {rows, cols, 1};
    table_append_shape(table, unit, kind, cols > 0 ? 2 : 1, shape, name);
}

static void check_positive(int value, const char *key)
{
    if (value < 1)
        fatal(EXIT_CONFIG, "model.%s = %d must be >= 1", key, value);
}

/* The routing weights of one site (DESIGN 2.3), in the order query, key_norm, alpha,
 * mix_bias, mix_proj. */
static void append_site(ParamTable *table, int unit, const ResidualPlan *plan, int d,
                        int site, int n_layers)
{
    char prefix[RESIDUAL_SITE_NAME_MAX];
    residual_site_name(prefix, sizeof prefix, site, n_layers);
    const bool msar = plan->mode == RESIDUAL_MSAR;
    const int m = plan->streams;
    /* msar keeps one query and key norm per stream, [m, d], even for m = 1 */
    table_append(table, unit, PARAM_ROUTING, msar ? m : d, msar ? d : 0, "%s.query", prefix);
    table_append(table, unit, PARAM_ROUTING, msar ? m : d, msar ? d : 0, "%s.key_norm",
                 prefix);
    if (plan->form == FORM_DELTA)
        table_append(table, unit, PARAM_ROUTING, 1, 0, "%s.alpha", prefix);
    if (msar && m > 1) {
        table_append(table, unit, PARAM_ROUTING, m, 0, "%s.mix_bias", prefix);
        table_append(table, unit, PARAM_ROUTING, m, d, "%s.mix_proj", prefix);
    }
}

void param_table_build(ParamTable *table, const ModelConfig *config)
{
    param_table_build_with_residual(table, config, NULL);
}

void param_table_build_with_residual(ParamTable *table, const ModelConfig *config,
                                     const ResidualConfig *residual)
{
    check_positive(config->vocab_size, "vocab_size");
    check_positive(config->d_model, "d_model");
    check_positive(config->n_layers, "n_layers");
    check_positive(config->n_heads, "n_heads");
    check_positive(config->n_kv_heads, "n_kv_heads");
    check_positive(config->head_dim, "head_dim");
    check_positive(config->ffn_dim, "ffn_dim");
    ResidualPlan plan;
    residual_plan_build(&plan, config, residual);
    const bool routed = plan.mode != RESIDUAL_STANDARD;

    const int d = config->d_model, layers = config->n_layers, ffn = config->ffn_dim;
    const int q_dim = config->n_heads * config->head_dim;
    const int kv_dim = config->n_kv_heads * config->head_dim;
    const int per_layer = 9 + (config->qk_norm ? 2 : 0);
    enum { PER_SITE_MAX = 5 };
    const size_t routing_max = routed ? (size_t)PER_SITE_MAX * plan.n_sites + 1 + plan.n_slots
                                      : 0;

    memset(table, 0, sizeof *table);
    table->params = xcalloc((size_t)per_layer * layers + 3 + routing_max, sizeof *table->params);
    table->n_units = layers + 3;
    table->unit_head = layers + 1;
    table->unit_shared = layers + 2;
    table->units = xcalloc((size_t)table->n_units, sizeof *table->units);

    for (int unit = 0; unit < table->n_units; unit++) {
        ParamUnit *range = &table->units[unit];
        table->total = param_align(table->total);
        range->offset = table->total;
        range->first_param = table->n_params;
        if (unit == 0) {
            table_append(table, unit, PARAM_EMBEDDING, config->vocab_size, d,
                         "model.embed_tokens.weight");
        } else if (unit == table->unit_shared) {
            if (routed && plan.form == FORM_DELTA)
                table_append(table, unit, PARAM_ROUTING, d, 0, "model.route_null");
            for (int slot = 0; slot < plan.n_slots; slot++) {
                char name[PARAM_NAME_MAX];
                snprintf(name, sizeof name, "model.route_streams.%d.conv", slot);
                const int shape[3] = {plan.streams, plan.kernel_max, d};
                table_append_shape(table, unit, PARAM_ROUTING, 3, shape, name);
            }
        } else if (unit <= layers) {
            char layer[32];
            snprintf(layer, sizeof layer, "model.layers.%d", unit - 1);
            const int hd = config->head_dim;
            if (routed)
                append_site(table, unit, &plan, d, 2 * (unit - 1), layers);
            table_append(table, unit, PARAM_NORM, d, 0, "%s.input_layernorm.weight", layer);
            table_append(table, unit, PARAM_MATRIX, q_dim, d, "%s.self_attn.q_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, kv_dim, d, "%s.self_attn.k_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, kv_dim, d, "%s.self_attn.v_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, d, q_dim, "%s.self_attn.o_proj.weight", layer);
            if (config->qk_norm) {
                table_append(table, unit, PARAM_NORM, hd, 0, "%s.self_attn.q_norm.weight", layer);
                table_append(table, unit, PARAM_NORM, hd, 0, "%s.self_attn.k_norm.weight", layer);
            }
            if (routed)
                append_site(table, unit, &plan, d, 2 * (unit - 1) + 1, layers);
            table_append(table, unit, PARAM_NORM, d, 0, "%s.post_attention_layernorm.weight",
                         layer);
            table_append(table, unit, PARAM_MATRIX, ffn, d, "%s.mlp.gate_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, ffn, d, "%s.mlp.up_proj.weight", layer);
            table_append(table, unit, PARAM_MATRIX, d, ffn, "%s.mlp.down_proj.weight", layer);
        } else if (unit == table->unit_head) {
            if (routed)
                append_site(table, unit, &plan, d, 2 * layers, layers);
            table_append(table, unit, PARAM_NORM, d, 0, "model.norm.weight");
            if (!config->tie_embeddings)
                table_append(table, unit, PARAM_EMBEDDING, config->vocab_size, d, "lm_head.weight");
        }
        range->count = table->total - range->offset;
        range->n_params = table->n_params - range->first_param;
    }
    residual_plan_free(&plan);

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
