/* runtime/config_keys.c — the table of config keys and their value types (see config_keys.h).
 */
#include "runtime/config_keys.h"

#include "runtime/error.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* FIELD places a key's value in Config. The _Generic term adds zero to the offset, but does
 * not compile unless the member has the C type the key's type expects, so a table entry
 * cannot point a KEY_FLOAT at an int. */
#define FIELD(member, ctype)                                                                  \
    .offset = offsetof(Config, member) + 0 * sizeof(_Generic(((Config *)0)->member, ctype: 1)), \
    .size = sizeof(((Config *)0)->member)

#define AT_LEAST(x) .min = (x), .min_open = false
#define ABOVE(x) .min = (x), .min_open = true
#define NO_MIN .min = -INFINITY
#define AT_MOST(x) .max = (x), .max_open = false
#define BELOW(x) .max = (x), .max_open = true
#define NO_MAX .max = INFINITY

#define INT(path_, member, min_, max_) \
    { .path = path_, .type = KEY_INT, FIELD(member, int), min_, max_ }
#define INT_OR_AUTO(path_, member, min_, max_) \
    { .path = path_, .type = KEY_INT, FIELD(member, int), min_, max_, .takes_auto = true }
#define FLOAT(path_, member, min_, max_) \
    { .path = path_, .type = KEY_FLOAT, FIELD(member, double), min_, max_ }
#define BOOL(path_, member) \
    { .path = path_, .type = KEY_BOOL, FIELD(member, bool), NO_MIN, NO_MAX }
#define STRING(path_, member) \
    { .path = path_, .type = KEY_STRING, FIELD(member, char *), NO_MIN, NO_MAX }
#define SEED(path_, member) \
    { .path = path_, .type = KEY_SEED, FIELD(member, unsigned long long), NO_MIN, NO_MAX }
#define ENUM(path_, member, ctype, names_) \
    { .path = path_, .type = KEY_ENUM, FIELD(member, ctype), .names = names_, NO_MIN, NO_MAX }
#define NAME_LIST(path_, member, names_) \
    { .path = path_, .type = KEY_NAME_LIST, FIELD(member, unsigned), .names = names_, \
      NO_MIN, NO_MAX }
#define INT_LIST(path_, member, count_member, min_, max_)                                    \
    { .path = path_, .type = KEY_INT_LIST, FIELD(member, int *),                           \
      .count_offset = offsetof(Config, count_member) +                                      \
                      0 * sizeof(_Generic(((Config *)0)->count_member, int: 1)),            \
      .capacity = (int)(sizeof(((Config *)0)->member) / sizeof(int)), min_, max_ }

/* Names in the order of the C enums (runtime/config.h): a value is its index here. */
static const char *const rope_scaling_names[] = {"none", "llama3", NULL};
static const char *const residual_mode_names[] = {"standard", "attnres", "msar", NULL};
static const char *const granularity_names[] = {"full", "block", NULL};
static const char *const form_names[] = {"replace", "delta", NULL};
static const char *const pipeline_schedule_names[] = {"gpipe", "1f1b", "interleaved", NULL};
static const char *const checkpointing_names[] = {"none", "full", NULL};
static const char *const lr_schedule_names[] = {"cosine", "wsd", "constant", NULL};
static const char *const data_source_names[] = {"synthetic", "shards", NULL};
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
/* bit i is NO_DECAY_* = 1 << i */
static const char *const no_decay_names[] = {"embeddings", "norms", "biases", "routing", NULL};

const ConfigKey config_key_table[] = {
    INT_OR_AUTO("model.vocab_size", model.vocab_size, AT_LEAST(1), NO_MAX),
    INT("model.d_model", model.d_model, AT_LEAST(1), NO_MAX),
    INT("model.n_layers", model.n_layers, AT_LEAST(1), NO_MAX),
    INT("model.n_heads", model.n_heads, AT_LEAST(1), NO_MAX),
    INT("model.n_kv_heads", model.n_kv_heads, AT_LEAST(1), NO_MAX),
    INT("model.head_dim", model.head_dim, AT_LEAST(1), NO_MAX),
    INT("model.ffn_dim", model.ffn_dim, AT_LEAST(1), NO_MAX),
    FLOAT("model.rope_theta", model.rope_theta, ABOVE(0), NO_MAX),
    ENUM("model.rope_scaling.type", model.rope_scaling.llama3, bool, rope_scaling_names),
    FLOAT("model.rope_scaling.factor", model.rope_scaling.factor, ABOVE(0), NO_MAX),
    FLOAT("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor, ABOVE(0),
          NO_MAX),
    FLOAT("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor, ABOVE(0),
          NO_MAX),
    INT("model.rope_scaling.original_max_position", model.rope_scaling.original_max_position,
        AT_LEAST(1), NO_MAX),
    FLOAT("model.norm_eps", model.norm_eps, ABOVE(0), NO_MAX),
    BOOL("model.qk_norm", model.qk_norm),
    BOOL("model.tie_embeddings", model.tie_embeddings),
    FLOAT("model.init_std", model.init_std, AT_LEAST(0), NO_MAX),

    ENUM("residual.mode", residual.mode, ResidualMode, residual_mode_names),
    INT("residual.heads", residual.heads, AT_LEAST(1), NO_MAX),
    ENUM("residual.granularity", residual.granularity, ResidualGranularity, granularity_names),
    INT("residual.layers_per_block", residual.layers_per_block, AT_LEAST(1), NO_MAX),
    ENUM("residual.form", residual.form, ResidualForm, form_names),
    INT("residual.streams", residual.streams, AT_LEAST(1), NO_MAX),
    INT_LIST("residual.stream_kernels", residual.stream_kernels, residual.n_stream_kernels,
             AT_LEAST(1), NO_MAX),

    INT("parallel.pp", parallel.pp, AT_LEAST(1), NO_MAX),
    INT("parallel.dp", parallel.dp, AT_LEAST(1), NO_MAX),
    INT("parallel.virtual_stages", parallel.virtual_stages, AT_LEAST(1), NO_MAX),
    ENUM("parallel.schedule", parallel.schedule, PipelineSchedule, pipeline_schedule_names),
    INT_LIST("parallel.layer_split", parallel.layer_split, parallel.n_layer_split, AT_LEAST(1),
             NO_MAX),
    FLOAT("parallel.timeout_s", parallel.timeout_s, ABOVE(0), NO_MAX),
    INT("parallel.gpus_per_node", parallel.gpus_per_node, AT_LEAST(0), NO_MAX),

    BOOL("fsdp.reshard_after_forward", fsdp.reshard_after_forward),

    INT("train.steps", train.steps, AT_LEAST(1), NO_MAX),
    INT("train.seq_len", train.seq_len, AT_LEAST(1), NO_MAX),
    INT("train.microbatch_size", train.microbatch_size, AT_LEAST(1), NO_MAX),
    INT("train.global_batch_size", train.global_batch_size, AT_LEAST(1), NO_MAX),
    ENUM("train.activation_checkpointing", train.activation_checkpointing,
         ActivationCheckpointing, checkpointing_names),
    INT("train.max_skipped", train.max_skipped, AT_LEAST(0), NO_MAX),
    FLOAT("train.z_loss", train.z_loss, AT_LEAST(0), NO_MAX),

    FLOAT("optim.lr", optim.lr, ABOVE(0), NO_MAX),
    FLOAT("optim.min_lr_ratio", optim.min_lr_ratio, AT_LEAST(0), AT_MOST(1)),
    INT("optim.warmup_steps", optim.warmup_steps, AT_LEAST(0), NO_MAX),
    ENUM("optim.schedule", optim.schedule, LrSchedule, lr_schedule_names),
    FLOAT("optim.decay_fraction", optim.decay_fraction, AT_LEAST(0), AT_MOST(1)),
    FLOAT("optim.beta1", optim.beta1, AT_LEAST(0), BELOW(1)),
    FLOAT("optim.beta2", optim.beta2, AT_LEAST(0), BELOW(1)),
    FLOAT("optim.eps", optim.eps, ABOVE(0), NO_MAX),
    FLOAT("optim.weight_decay", optim.weight_decay, AT_LEAST(0), NO_MAX),
    NAME_LIST("optim.no_decay", optim.no_decay, no_decay_names),
    FLOAT("optim.grad_clip", optim.grad_clip, NO_MIN, NO_MAX), /* <= 0: no clipping */
    FLOAT("optim.ema_decay", optim.ema_decay, AT_LEAST(0), BELOW(1)),
    FLOAT("optim.route_lr_mult", optim.route_lr_mult, AT_LEAST(0), NO_MAX),
    FLOAT("optim.route_weight_decay", optim.route_weight_decay, AT_LEAST(0), NO_MAX),

    ENUM("data.source", data.source, DataSource, data_source_names),
    STRING("data.train", data.train),
    STRING("data.val", data.val),

    INT("checkpoint.every", checkpoint.every, AT_LEAST(0), NO_MAX),
    INT("checkpoint.keep_last", checkpoint.keep_last, AT_LEAST(0), NO_MAX),
    INT("checkpoint.keep_every", checkpoint.keep_every, AT_LEAST(0), NO_MAX),
    BOOL("checkpoint.save_final", checkpoint.save_final),

    INT("log.every", log.every, AT_LEAST(1), NO_MAX),

    INT("eval.every", eval.every, AT_LEAST(0), NO_MAX),
    INT("eval.samples", eval.samples, AT_LEAST(1), NO_MAX),

    STRING("run_dir", run_dir),
    SEED("seed", seed),
    ENUM("device", device, DeviceKind, device_names),
    STRING("matmul_algorithms", matmul_algorithms),
};

const int config_key_count = (int)(sizeof config_key_table / sizeof config_key_table[0]);

const ConfigKey *config_key_find(const char *path)
{
    for (int i = 0; i < config_key_count; i++)
        if (!strcmp(config_key_table[i].path, path))
            return &config_key_table[i];
    return NULL;
}

bool config_key_is_mapping(const char *path)
{
    size_t length = strlen(path);
    for (int i = 0; i < config_key_count; i++) {
        const char *key = config_key_table[i].path;
        if (!strncmp(key, path, length) && key[length] == '.')
            return true;
    }
    return false;
}

bool config_scalar_is_null(const char *text)
{
    return !strcmp(text, "") || !strcmp(text, "~") || !strcmp(text, "null") ||
           !strcmp(text, "Null") || !strcmp(text, "NULL");
}

/* --- reading values ------------------------------------------------------------------- */

static void *value_at(Config *config, const ConfigKey *key)
{
    return (char *)config + key->offset;
}

static const void *value_in(const Config *config, const ConfigKey *key)
{
    return (const char *)config + key->offset;
}

/* "a|b|c" from a NULL-terminated name list */
static void join_names(const char *const *names, char *out, size_t capacity)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; names[i] && used < capacity; i++)
        used += (size_t)snprintf(out + used, capacity - used, "%s%s", i ? "|" : "", names[i]);
}

static int find_name(const char *const *names, const char *text)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], text))
            return i;
    return -1;
}

static _Noreturn void fail_type(const ConfigKey *key, const char *text, bool quoted,
                                const char *where)
{
    char names[256] = "";
    if (key->names)
        join_names(key->names, names, sizeof names);
    const char *expected = "";
    switch (key->type) {
    case KEY_INT: expected = key->takes_auto ? "an integer or auto" : "an integer"; break;
    case KEY_SEED: expected = "a non-negative integer"; break;
    case KEY_FLOAT: expected = "a number"; break;
    case KEY_BOOL: expected = "true or false"; break;
    case KEY_STRING: expected = "a string"; break;
    case KEY_ENUM: expected = "one of"; break;
    case KEY_INT_LIST: expected = "a list of integers"; break;
    case KEY_NAME_LIST: expected = "a list of names from"; break;
    }
    fatal(EXIT_CONFIG, "%s: %s: expected %s%s%s, got %s'%s'", where, key->path, expected,
          key->names ? " " : "", names, quoted ? "the quoted string " : "", text);
}

/* YAML 1.2 core-schema decimal integer: [-+]?[0-9]+ */
static bool looks_like_int(const char *text)
{
    const char *digits = text + (text[0] == '-' || text[0] == '+');
    return *digits && strspn(digits, "0123456789") == strlen(digits);
}

/* false also when the integer is too large for a long long */
static bool parse_int(const char *text, long long *value)
{
    if (!looks_like_int(text))
        return false;
    errno = 0;
    *value = strtoll(text, NULL, 10);
    return errno == 0;
}

/* YAML 1.2 core-schema float, finite only: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
 * (strtod alone would also take "inf", "nan", hex and leading spaces). */
static bool parse_float(const char *text, double *value)
{
    const char *p = text + (text[0] == '-' || text[0] == '+');
    size_t whole = strspn(p, "0123456789");
    p += whole;
    size_t fraction = 0;
    if (*p == '.') {
        fraction = strspn(p + 1, "0123456789");
        p += 1 + fraction;
    }
    if (whole == 0 && fraction == 0)
        return false;
    if (*p == 'e' || *p == 'E') {
        p += 1 + (p[1] == '-' || p[1] == '+');
        size_t exponent = strspn(p, "0123456789");
        if (exponent == 0)
            return false;
        p += exponent;
    }
    if (*p)
        return false;
    errno = 0;
    *value = strtod(text, NULL);
    return errno == 0 && isfinite(*value);
}

static bool parse_bool(const char *text, bool *value)
{
    if (!strcmp(text, "true") || !strcmp(text, "True") || !strcmp(text, "TRUE"))
        return (*value = true), true;
    if (!strcmp(text, "false") || !strcmp(text, "False") || !strcmp(text, "FALSE"))
        return (*value = false), true;
    return false;
}

static void store_enum(Config *config, const ConfigKey *key, int index)
{
    if (key->size == sizeof(bool))
        *(bool *)value_at(config, key) = index != 0;
    else
        *(int *)value_at(config, key) = index;
}

static int load_enum(const Config *config, const ConfigKey *key)
{
    if (key->size == sizeof(bool))
        return *(const bool *)value_in(config, key) ? 1 : 0;
    return *(const int *)value_in(config, key);
}

void config_key_store_scalar(Config *config, const ConfigKey *key, const char *text,
                             bool quoted, const char *where)
{
    long long integer;
    double number;
    bool flag;
    int index;
    switch (key->type) {
    case KEY_INT:
        if (key->takes_auto && !quoted && !strcmp(text, "auto")) {
            *(int *)value_at(config, key) = CONFIG_AUTO;
            return;
        }
        if (quoted || !looks_like_int(text))
            fail_type(key, text, quoted, where);
        if (!parse_int(text, &integer) || integer < INT_MIN || integer > INT_MAX)
            fatal(EXIT_CONFIG, "%s: %s = %s is out of range (at most %d)", where, key->path,
                  text, INT_MAX);
        if (key->takes_auto && integer == CONFIG_AUTO) /* the number that means auto */
            fatal(EXIT_CONFIG, "%s: %s = %s must be >= 1, or auto", where, key->path, text);
        *(int *)value_at(config, key) = (int)integer;
        return;
    case KEY_SEED:
        if (quoted || !*text || strspn(text, "0123456789") != strlen(text))
            fail_type(key, text, quoted, where);
        errno = 0;
        unsigned long long seed = strtoull(text, NULL, 10);
        if (errno)
            fail_type(key, text, quoted, where);
        *(unsigned long long *)value_at(config, key) = seed;
        return;
    case KEY_FLOAT:
        if (quoted || !parse_float(text, &number))
            fail_type(key, text, quoted, where);
        *(double *)value_at(config, key) = number;
        return;
    case KEY_BOOL:
        if (quoted || !parse_bool(text, &flag))
            fail_type(key, text, quoted, where);
        *(bool *)value_at(config, key) = flag;
        return;
    case KEY_STRING:
        if (!quoted && config_scalar_is_null(text))
            text = "";
        if (strlen(text) >= key->size)
            fatal(EXIT_CONFIG, "%s: %s: longer than %zu bytes", where, key->path,
                  key->size - 1);
        /* zero the whole array, so two Configs holding one string compare equal byte-wise */
        memset(value_at(config, key), 0, key->size);
        memcpy(value_at(config, key), text, strlen(text));
        return;
    case KEY_ENUM:
        index = find_name(key->names, text);
        if (index < 0)
            fail_type(key, text, quoted, where);
        store_enum(config, key, index);
        return;
    case KEY_INT_LIST:
    case KEY_NAME_LIST:
        fatal(EXIT_CONFIG, "%s: %s: expected a list such as [a, b] (a YAML sequence), got '%s'",
              where, key->path, text);
    }
}

void config_key_store_list(Config *config, const ConfigKey *key, const char *const *items,
                           const bool *quoted, int n_items, const char *where)
{
    if (key->type == KEY_INT_LIST) {
        if (n_items > key->capacity)
            fatal(EXIT_CONFIG, "%s: %s: %d entries, at most %d allowed", where, key->path,
                  n_items, key->capacity);
        int *values = value_at(config, key);
        memset(values, 0, key->size);
        for (int i = 0; i < n_items; i++) {
            long long integer;
            if (quoted[i] || !parse_int(items[i], &integer) || integer < INT_MIN ||
                integer > INT_MAX)
                fail_type(key, items[i], quoted[i], where);
            values[i] = (int)integer;
        }
        *(int *)((char *)config + key->count_offset) = n_items;
    } else if (key->type == KEY_NAME_LIST) {
        unsigned bits = 0;
        for (int i = 0; i < n_items; i++) {
            int index = find_name(key->names, items[i]);
            if (index < 0)
                fail_type(key, items[i], quoted[i], where);
            bits |= 1u << index;
        }
        *(unsigned *)value_at(config, key) = bits;
    } else {
        fatal(EXIT_CONFIG, "%s: %s: expected a single value, got a list", where, key->path);
    }
}

/* --- ranges --------------------------------------------------------------------------- */

/* The shortest %g form that reads back to the same double (at most 17 digits); whole
 * numbers without an exponent. */
static void format_double(double value, char *out, size_t capacity)
{
    if (value == floor(value) && fabs(value) < 1e15) { /* 10000, not 1e+04 */
        snprintf(out, capacity, "%.0f", value);
        return;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, capacity, "%.*g", digits, value);
        if (strtod(out, NULL) == value)
            return;
    }
}

/* A float as YAML that every common reader types as a float (DESIGN 5): YAML 1.1 readers
 * such as PyYAML take only numbers with a dot, and an exponent with its sign, as floats, so
 * 10000 is written 10000.0 and 1e-05 is written 1.0e-05. The value reads back exactly. */
static void format_yaml_double(double value, char *out, size_t capacity)
{
    if (isnan(value)) {
        snprintf(out, capacity, ".nan");
        return;
    }
    if (isinf(value)) {
        snprintf(out, capacity, value > 0 ? ".inf" : "-.inf");
        return;
    }
    if (value == floor(value) && fabs(value) < 1e15) {
        snprintf(out, capacity, "%.1f", value);
        return;
    }
    char shortest[32];
    format_double(value, shortest, sizeof shortest);
    char *exponent = strchr(shortest, 'e');
    if (!exponent || memchr(shortest, '.', (size_t)(exponent - shortest))) {
        snprintf(out, capacity, "%s", shortest); /* 0.25, 1.5e-05: a dot already */
        return;
    }
    /* %g's exponent always has its sign; the mantissa needs the dot */
    snprintf(out, capacity, "%.*s.0%s", (int)(exponent - shortest), shortest, exponent);
}

static void describe_range(const ConfigKey *key, char *out, size_t capacity)
{
    char low[32], high[32];
    format_double(key->min, low, sizeof low);
    format_double(key->max, high, sizeof high);
    if (isinf(key->min) && isinf(key->max))
        snprintf(out, capacity, "finite");
    else if (isinf(key->max))
        snprintf(out, capacity, "%s %s", key->min_open ? ">" : ">=", low);
    else if (isinf(key->min))
        snprintf(out, capacity, "%s %s", key->max_open ? "<" : "<=", high);
    else
        snprintf(out, capacity, "in %c%s, %s%c", key->min_open ? '(' : '[', low, high,
                 key->max_open ? ')' : ']');
}

static bool in_range(const ConfigKey *key, double value)
{
    if (key->min_open ? value <= key->min : value < key->min)
        return false;
    if (key->max_open ? value >= key->max : value > key->max)
        return false;
    return true;
}

void config_key_check_range(const Config *config, const ConfigKey *key, const char *origin)
{
    char range[96], text[32];
    describe_range(key, range, sizeof range);
    if (key->type == KEY_INT) {
        int value = *(const int *)value_in(config, key);
        if (key->takes_auto && value == CONFIG_AUTO)
            return;
        if (!in_range(key, value))
            fatal(EXIT_CONFIG, "%s: %s = %d must be %s%s", origin, key->path, value, range,
                  key->takes_auto ? ", or auto" : "");
    } else if (key->type == KEY_FLOAT) {
        double value = *(const double *)value_in(config, key);
        format_double(value, text, sizeof text);
        if (!isfinite(value) || !in_range(key, value))
            fatal(EXIT_CONFIG, "%s: %s = %s must be %s", origin, key->path, text, range);
    } else if (key->type == KEY_INT_LIST) {
        const int *values = value_in(config, key);
        int count = *(const int *)((const char *)config + key->count_offset);
        if (count < 0 || count > key->capacity)
            fatal(EXIT_CONFIG, "%s: %s has %d entries, at most %d allowed", origin, key->path,
                  count, key->capacity);
        for (int i = 0; i < count; i++)
            if (!in_range(key, values[i]))
                fatal(EXIT_CONFIG, "%s: %s[%d] = %d must be %s", origin, key->path, i,
                      values[i], range);
    } else if (key->type == KEY_ENUM) {
        int index = load_enum(config, key), n_names = 0;
        while (key->names[n_names])
            n_names++;
        if (index < 0 || index >= n_names)
            fatal(EXIT_CONFIG, "%s: %s holds %d, which names no choice", origin, key->path,
                  index);
    } else if (key->type == KEY_NAME_LIST) {
        unsigned bits = *(const unsigned *)value_in(config, key), known = 0;
        for (int i = 0; key->names[i]; i++)
            known |= 1u << i;
        if (bits & ~known)
            fatal(EXIT_CONFIG, "%s: %s holds bits 0x%x that name no choice", origin, key->path,
                  bits & ~known);
    }
}

/* --- writing values ------------------------------------------------------------------- */

/* A YAML double-quoted scalar: any byte string reads back unchanged. */
static void write_quoted(const char *text, FILE *out)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(out, "\\x%02x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

void config_key_write_value(const Config *config, const ConfigKey *key, FILE *out)
{
    char number[32];
    switch (key->type) {
    case KEY_INT:
        if (key->takes_auto && *(const int *)value_in(config, key) == CONFIG_AUTO)
            fputs("auto", out);
        else
            fprintf(out, "%d", *(const int *)value_in(config, key));
        return;
    case KEY_SEED:
        fprintf(out, "%llu", *(const unsigned long long *)value_in(config, key));
        return;
    case KEY_FLOAT:
        format_yaml_double(*(const double *)value_in(config, key), number, sizeof number);
        fputs(number, out);
        return;
    case KEY_BOOL:
        fputs(*(const bool *)value_in(config, key) ? "true" : "false", out);
        return;
    case KEY_STRING:
        write_quoted(value_in(config, key), out);
        return;
    case KEY_ENUM:
        config_key_check_range(config, key, "config_to_yaml");
        fputs(key->names[load_enum(config, key)], out);
        return;
    case KEY_INT_LIST: {
        const int *values = value_in(config, key);
        int count = *(const int *)((const char *)config + key->count_offset);
        fputc('[', out);
        for (int i = 0; i < count && i < key->capacity; i++)
            fprintf(out, "%s%d", i ? ", " : "", values[i]);
        fputc(']', out);
        return;
    }
    case KEY_NAME_LIST: {
        unsigned bits = *(const unsigned *)value_in(config, key);
        bool first = true;
        fputc('[', out);
        for (int i = 0; key->names[i]; i++)
            if (bits & (1u << i)) {
                fprintf(out, "%s%s", first ? "" : ", ", key->names[i]);
                first = false;
            }
        fputc(']', out);
        return;
    }
    }
}
