/* checkpoints/hf_config.c — see hf_config.h. */
#include "checkpoints/hf_config.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/json.h"
#include "runtime/error.h"

#define FLOAT_TOLERANCE 1e-6

typedef struct {
    const char *path;        /* <hf_dir>/config.json */
    const char *config_name; /* the fathom config */
} Where;

static const JsonValue *member_of_type(const Where *where, const JsonValue *object,
                                       const char *prefix, const char *key, JsonType type)
{
    const JsonValue *value = json_object_get(object, key);
    if (value && value->type != type && value->type != JSON_NULL)
        fatal(EXIT_DATA, "%s: %s%s is a %s, expected a %s", where->path, prefix, key,
              json_type_name(value->type), json_type_name(type));
    return value && value->type != JSON_NULL ? value : NULL;
}

/* An integer key (absent: `fallback`, or exit 3 when fallback < 0). */
static long long integer_of(const Where *where, const JsonValue *object, const char *key,
                            long long fallback)
{
    const JsonValue *value = member_of_type(where, object, "", key, JSON_NUMBER);
    if (!value) {
        if (fallback < 0)
            fatal(EXIT_DATA, "%s has no %s", where->path, key);
        return fallback;
    }
    if (!value->is_integer)
        fatal(EXIT_DATA, "%s: %s = %g is not an integer", where->path, key, value->number);
    return value->integer;
}

static void expect_integer(const Where *where, const char *key, long long value,
                           const char *fathom_key, long long expected)
{
    if (value != expected)
        fatal(EXIT_CONFIG, "%s: %s = %lld disagrees with %s = %lld in %s", where->path, key,
              value, fathom_key, expected, where->config_name);
}

static void expect_float(const Where *where, const char *key, double value,
                         const char *fathom_key, double expected)
{
    if (fabs(value - expected) > FLOAT_TOLERANCE * fabs(expected))
        fatal(EXIT_CONFIG, "%s: %s = %.10g disagrees with %s = %.10g in %s", where->path, key,
              value, fathom_key, expected, where->config_name);
}

static void expect_bool(const Where *where, const char *key, bool value,
                        const char *fathom_key, bool expected)
{
    if (value != expected)
        fatal(EXIT_CONFIG, "%s: %s = %s disagrees with %s = %s in %s", where->path, key,
              value ? "true" : "false", fathom_key, expected ? "true" : "false",
              where->config_name);
}

static double float_of(const Where *where, const JsonValue *object, const char *prefix,
                       const char *key, double fallback, bool required)
{
    const JsonValue *value = member_of_type(where, object, prefix, key, JSON_NUMBER);
    if (!value && required)
        fatal(EXIT_DATA, "%s has no %s%s", where->path, prefix, key);
    return value ? value->number : fallback;
}

static bool bool_of(const Where *where, const JsonValue *object, const char *key,
                    bool fallback)
{
    const JsonValue *value = member_of_type(where, object, "", key, JSON_BOOL);
    return value ? value->boolean : fallback;
}

/* rope_theta and the scaling, from rope_parameters (transformers 5) or rope_theta and
 * rope_scaling (4.x). */
static void check_rope(const Where *where, const JsonValue *root, const ModelConfig *model)
{
    const JsonValue *parameters = member_of_type(where, root, "", "rope_parameters",
                                                 JSON_OBJECT);
    const JsonValue *scaling = parameters ? parameters
                                          : member_of_type(where, root, "", "rope_scaling",
                                                           JSON_OBJECT);
    const char *prefix = parameters ? "rope_parameters." : "rope_scaling.";
    if (parameters && json_object_get(parameters, "rope_theta"))
        expect_float(where, "rope_parameters.rope_theta",
                     float_of(where, parameters, prefix, "rope_theta", 0, true),
                     "model.rope_theta", model->rope_theta);
    else
        expect_float(where, "rope_theta", float_of(where, root, "", "rope_theta", 10000, false),
                     "model.rope_theta", model->rope_theta);

    const char *type = "default";
    if (scaling) {
        const JsonValue *named = member_of_type(where, scaling, prefix, "rope_type",
                                                JSON_STRING);
        if (!named)
            named = member_of_type(where, scaling, prefix, "type", JSON_STRING);
        if (named)
            type = named->string;
    }
    const bool llama3 = !strcmp(type, "llama3");
    if (!llama3 && strcmp(type, "default"))
        fatal(EXIT_CONFIG, "%s: %srope_type = %s: fathom implements RoPE without scaling and "
              "with llama3 scaling", where->path, prefix, type);
    if (llama3 != model->rope_scaling.llama3)
        fatal(EXIT_CONFIG, "%s: %srope_type = %s disagrees with model.rope_scaling.type = %s "
              "in %s", where->path, scaling ? prefix : "rope_scaling.", type,
              model->rope_scaling.llama3 ? "llama3" : "none", where->config_name);
    if (!llama3)
        return;
    char key[64];
    static const char *const names[] = {"factor", "low_freq_factor", "high_freq_factor"};
    const double expected[] = {model->rope_scaling.factor, model->rope_scaling.low_freq_factor,
                               model->rope_scaling.high_freq_factor};
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "%s%s", prefix, names[i]);
        char fathom_key[64];
        snprintf(fathom_key, sizeof fathom_key, "model.rope_scaling.%s", names[i]);
        expect_float(where, key, float_of(where, scaling, prefix, names[i], 0, true),
                     fathom_key, expected[i]);
    }
    snprintf(key, sizeof key, "%soriginal_max_position_embeddings", prefix);
    const JsonValue *original = member_of_type(where, scaling, prefix,
                                               "original_max_position_embeddings", JSON_NUMBER);
    if (!original || !original->is_integer)
        fatal(EXIT_DATA, "%s has no integer %s", where->path, key);
    expect_integer(where, key, original->integer, "model.rope_scaling.original_max_position",
                   model->rope_scaling.original_max_position);
}

void hf_config_check(const char *hf_dir, const ModelConfig *model, const char *config_name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    Where where = {.path = path, .config_name = config_name};
    JsonDocument document;
    json_parse_file(path, &document);
    const JsonValue *root = &document.root;
    if (root->type != JSON_OBJECT)
        fatal(EXIT_DATA, "%s is a JSON %s, not an object", path, json_type_name(root->type));

    const JsonValue *model_type = member_of_type(&where, root, "", "model_type", JSON_STRING);
    if (!model_type)
        fatal(EXIT_DATA, "%s has no model_type", path);
    const bool qwen3 = !strcmp(model_type->string, "qwen3");
    if (!qwen3 && strcmp(model_type->string, "llama"))
        fatal(EXIT_CONFIG, "%s: model_type = %s: fathom imports llama and qwen3", path,
              model_type->string);
    if (qwen3 != model->qk_norm)
        fatal(EXIT_CONFIG, "%s: model_type = %s %s q/k norms, but model.qk_norm = %s in %s",
              path, model_type->string, qwen3 ? "has" : "has no",
              model->qk_norm ? "true" : "false", config_name);

    expect_integer(&where, "vocab_size", integer_of(&where, root, "vocab_size", -1),
                   "model.vocab_size", model->vocab_size);
    const long long hidden = integer_of(&where, root, "hidden_size", -1);
    expect_integer(&where, "hidden_size", hidden, "model.d_model", model->d_model);
    expect_integer(&where, "num_hidden_layers", integer_of(&where, root, "num_hidden_layers", -1),
                   "model.n_layers", model->n_layers);
    const long long heads = integer_of(&where, root, "num_attention_heads", -1);
    expect_integer(&where, "num_attention_heads", heads, "model.n_heads", model->n_heads);
    expect_integer(&where, "num_key_value_heads",
                   integer_of(&where, root, "num_key_value_heads", heads), "model.n_kv_heads",
                   model->n_kv_heads);
    if (json_object_get(root, "head_dim") &&
        json_object_get(root, "head_dim")->type != JSON_NULL)
        expect_integer(&where, "head_dim", integer_of(&where, root, "head_dim", -1),
                       "model.head_dim", model->head_dim);
    else
        expect_integer(&where, "hidden_size / num_attention_heads",
                       heads > 0 ? hidden / heads : 0, "model.head_dim", model->head_dim);
    expect_integer(&where, "intermediate_size", integer_of(&where, root, "intermediate_size", -1),
                   "model.ffn_dim", model->ffn_dim);
    expect_float(&where, "rms_norm_eps", float_of(&where, root, "", "rms_norm_eps", 1e-6, false),
                 "model.norm_eps", model->norm_eps);
    expect_bool(&where, "tie_word_embeddings",
                bool_of(&where, root, "tie_word_embeddings", false), "model.tie_embeddings",
                model->tie_embeddings);
    check_rope(&where, root, model);

    /* what the fathom network does not have */
    if (bool_of(&where, root, "attention_bias", false) || bool_of(&where, root, "mlp_bias", false))
        fatal(EXIT_CONFIG, "%s: attention_bias / mlp_bias: fathom's layers have no biases", path);
    const JsonValue *activation = member_of_type(&where, root, "", "hidden_act", JSON_STRING);
    if (activation && strcmp(activation->string, "silu"))
        fatal(EXIT_CONFIG, "%s: hidden_act = %s: fathom's MLP is SwiGLU (silu)", path,
              activation->string);
    if (bool_of(&where, root, "use_sliding_window", false))
        fatal(EXIT_CONFIG, "%s: use_sliding_window = true: fathom attends over the whole "
              "sequence", path);
    json_free(&document);
}
