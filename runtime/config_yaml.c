/* runtime/config_yaml.c — reads YAML into a Config and writes a Config as YAML (DESIGN 6).
 *
 * The reader walks libyaml's event stream, not a document tree: every value reaches the key
 * table (config_keys.c) with the mark of where it was written, so a message can say
 * "file:line:column: model.d_model: expected an integer, got 'abc'".
 */
#include "runtime/config_yaml.h"

#include "runtime/config_keys.h"
#include "runtime/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef struct {
    yaml_parser_t parser;
    Config *config;
    const char *origin;   /* the file name, or "--set key=value" */
    bool is_override;     /* a --set value: line and column would only confuse */
    char **seen;          /* dotted paths of the mapping keys read so far: duplicates */
    int n_seen, seen_capacity;
} Reader;

/* "origin:line:column" (1-based) of a mark, or the --set argument */
static void describe_mark(const Reader *reader, yaml_mark_t mark, char *out, size_t capacity)
{
    if (reader->is_override)
        snprintf(out, capacity, "%s", reader->origin);
    else
        snprintf(out, capacity, "%s:%zu:%zu", reader->origin, mark.line + 1, mark.column + 1);
}

static void reader_open(Reader *reader, Config *config, const char *text, const char *origin,
                        bool is_override)
{
    memset(reader, 0, sizeof *reader);
    if (!yaml_parser_initialize(&reader->parser))
        fatal(EXIT_CONFIG, "%s: cannot initialise the YAML parser (out of memory)", origin);
    yaml_parser_set_input_string(&reader->parser, (const unsigned char *)text, strlen(text));
    reader->config = config;
    reader->origin = origin;
    reader->is_override = is_override;
}

static void reader_close(Reader *reader)
{
    for (int i = 0; i < reader->n_seen; i++)
        free(reader->seen[i]);
    free(reader->seen);
    yaml_parser_delete(&reader->parser);
}

/* The next event; malformed YAML stops here with libyaml's own description. */
static void reader_next(Reader *reader, yaml_event_t *event)
{
    if (yaml_parser_parse(&reader->parser, event))
        return;
    const yaml_parser_t *parser = &reader->parser;
    char where[CONFIG_PATH_MAX + 64];
    describe_mark(reader, parser->problem_mark, where, sizeof where);
    if (parser->error == YAML_MEMORY_ERROR)
        fatal(EXIT_CONFIG, "%s: out of memory while reading YAML", where);
    fatal(EXIT_CONFIG, "%s: malformed YAML: %s%s%s", where,
          parser->problem ? parser->problem : "unknown problem",
          parser->context ? " " : "", parser->context ? parser->context : "");
}

/* Records a mapping key's dotted path; a second sighting is a duplicate key. */
static void reader_remember(Reader *reader, char *path, const char *where)
{
    for (int i = 0; i < reader->n_seen; i++)
        if (!strcmp(reader->seen[i], path))
            fatal(EXIT_CONFIG, "%s: duplicate key '%s'", where, path);
    if (reader->n_seen == reader->seen_capacity) {
        reader->seen_capacity = reader->seen_capacity ? 2 * reader->seen_capacity : 64;
        reader->seen = xrealloc(reader->seen, (size_t)reader->seen_capacity * sizeof(char *));
    }
    reader->seen[reader->n_seen++] = path;
}

static bool scalar_is_quoted(const yaml_event_t *event)
{
    /* quoted, literal (|) or folded (>) scalars are strings in YAML; only plain ones may be
     * numbers, booleans or null */
    return event->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
}

static void read_value(Reader *reader, const char *path, yaml_event_t *event);

/* After MAPPING_START: reads keys and values up to MAPPING_END. `prefix` is the mapping's
 * dotted path, NULL at the top. */
static void read_mapping(Reader *reader, const char *prefix)
{
    for (;;) {
        yaml_event_t event;
        char where[CONFIG_PATH_MAX + 64];
        reader_next(reader, &event);
        describe_mark(reader, event.start_mark, where, sizeof where);
        if (event.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&event);
            return;
        }
        if (event.type != YAML_SCALAR_EVENT)
            fatal(EXIT_CONFIG, "%s: expected a key name in %s", where,
                  prefix ? prefix : "the top-level mapping");
        const char *name = (const char *)event.data.scalar.value;
        size_t length = (prefix ? strlen(prefix) + 1 : 0) + strlen(name) + 1;
        char *path = xmalloc(length);
        snprintf(path, length, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", name);
        /* a dotted name would make "model.d_model: 5" at the top mean the nested key: nest
         * mappings instead, so each key has one spelling in a file */
        if (strchr(name, '.') || !*name ||
            (!config_key_find(path) && !config_key_is_mapping(path)))
            fatal(EXIT_CONFIG, "%s: unknown key '%s'", where, path);
        reader_remember(reader, path, where);
        yaml_event_delete(&event);

        reader_next(reader, &event);
        read_value(reader, path, &event);
        yaml_event_delete(&event);
    }
}

/* After SEQUENCE_START: collects plain values up to SEQUENCE_END and stores them. */
static void read_list(Reader *reader, const ConfigKey *key, const char *where)
{
    int n_items = 0, capacity = 16;
    char **items = xmalloc((size_t)capacity * sizeof(char *));
    bool *quoted = xmalloc((size_t)capacity * sizeof(bool));
    for (;;) {
        yaml_event_t event;
        reader_next(reader, &event);
        if (event.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&event);
            break;
        }
        if (event.type != YAML_SCALAR_EVENT) {
            char item_where[CONFIG_PATH_MAX + 64];
            describe_mark(reader, event.start_mark, item_where, sizeof item_where);
            fatal(EXIT_CONFIG, "%s: %s: a list entry must be a single value", item_where,
                  key->path);
        }
        if (n_items == capacity) {
            capacity *= 2;
            items = xrealloc(items, (size_t)capacity * sizeof(char *));
            quoted = xrealloc(quoted, (size_t)capacity * sizeof(bool));
        }
        items[n_items] = xstrdup((const char *)event.data.scalar.value);
        quoted[n_items] = scalar_is_quoted(&event);
        n_items++;
        yaml_event_delete(&event);
    }
    config_key_store_list(reader->config, key, (const char *const *)items, quoted, n_items,
                          where);
    for (int i = 0; i < n_items; i++)
        free(items[i]);
    free(items);
    free(quoted);
}

/* A section written as null (`rope_scaling: null`, `train:`) sets nothing, except that a
 * section with a `type` key is switched off: its type becomes the first name ("none"). This
 * is how Hugging Face configs write "no RoPE scaling". */
static void read_null_mapping(Reader *reader, const char *path, const char *where)
{
    char type_path[256];
    snprintf(type_path, sizeof type_path, "%s.type", path);
    const ConfigKey *type = config_key_find(type_path);
    if (type && type->type == KEY_ENUM)
        config_key_store_scalar(reader->config, type, type->names[0], false, where);
}

/* Reads the value that starts with `event` into the key or section at `path`. */
static void read_value(Reader *reader, const char *path, yaml_event_t *event)
{
    char where[CONFIG_PATH_MAX + 64];
    describe_mark(reader, event->start_mark, where, sizeof where);
    bool is_mapping = config_key_is_mapping(path);
    const ConfigKey *key = config_key_find(path);
    switch (event->type) {
    case YAML_MAPPING_START_EVENT:
        if (!is_mapping)
            fatal(EXIT_CONFIG, "%s: %s: expected a single value, got a mapping", where, path);
        read_mapping(reader, path);
        return;
    case YAML_SCALAR_EVENT: {
        const char *text = (const char *)event->data.scalar.value;
        bool quoted = scalar_is_quoted(event);
        if (!is_mapping) {
            config_key_store_scalar(reader->config, key, text, quoted, where);
        } else if (!quoted && config_scalar_is_null(text)) {
            read_null_mapping(reader, path, where);
        } else {
            fatal(EXIT_CONFIG, "%s: %s is a section: expected a mapping of its keys, got '%s'",
                  where, path, text);
        }
        return;
    }
    case YAML_SEQUENCE_START_EVENT:
        if (is_mapping)
            fatal(EXIT_CONFIG, "%s: %s is a section: expected a mapping of its keys, got a list",
                  where, path);
        read_list(reader, key, where);
        return;
    case YAML_ALIAS_EVENT:
        fatal(EXIT_CONFIG, "%s: %s: YAML aliases (*name) are not supported", where, path);
    default:
        fatal(EXIT_CONFIG, "%s: %s: unexpected YAML structure", where, path);
    }
}

/* Expects an event of `type`; `what` names it in the message. */
static void reader_expect(Reader *reader, yaml_event_type_t type, const char *what)
{
    yaml_event_t event;
    reader_next(reader, &event);
    if (event.type != type) {
        char where[CONFIG_PATH_MAX + 64];
        describe_mark(reader, event.start_mark, where, sizeof where);
        fatal(EXIT_CONFIG, "%s: expected %s", where, what);
    }
    yaml_event_delete(&event);
}

void config_yaml_apply_text(Config *config, const char *text, const char *origin)
{
    Reader reader;
    yaml_event_t event;
    char where[CONFIG_PATH_MAX + 64];
    reader_open(&reader, config, text, origin, false);
    reader_expect(&reader, YAML_STREAM_START_EVENT, "the start of the YAML stream");
    reader_next(&reader, &event);
    if (event.type == YAML_STREAM_END_EVENT) { /* nothing but comments: the defaults */
        yaml_event_delete(&event);
        reader_close(&reader);
        return;
    }
    yaml_event_delete(&event); /* DOCUMENT_START: the only other event libyaml gives here */

    reader_next(&reader, &event);
    describe_mark(&reader, event.start_mark, where, sizeof where);
    if (event.type == YAML_MAPPING_START_EVENT)
        read_mapping(&reader, NULL);
    else if (event.type != YAML_SCALAR_EVENT || scalar_is_quoted(&event) ||
             !config_scalar_is_null((const char *)event.data.scalar.value))
        fatal(EXIT_CONFIG, "%s: the top level must be a mapping of sections (model:, train:, ...)",
              where);
    yaml_event_delete(&event);

    reader_expect(&reader, YAML_DOCUMENT_END_EVENT, "the end of the YAML document");
    reader_expect(&reader, YAML_STREAM_END_EVENT,
                  "the end of the file (one YAML document per config)");
    reader_close(&reader);
}

void config_yaml_apply_override(Config *config, const char *assignment)
{
    const char *equals = strchr(assignment, '=');
    if (!equals)
        fatal(EXIT_CONFIG, "--set %s: expected key=value (a dotted key such as model.d_model)",
              assignment);
    size_t key_length = (size_t)(equals - assignment);
    char *path = xmalloc(key_length + 1);
    memcpy(path, assignment, key_length);
    path[key_length] = '\0';
    if (!config_key_find(path) && !config_key_is_mapping(path))
        fatal(EXIT_CONFIG, "--set %s: unknown key '%s'", assignment, path);

    size_t origin_length = strlen(assignment) + sizeof "--set ";
    char *origin = xmalloc(origin_length);
    snprintf(origin, origin_length, "--set %s", assignment);

    Reader reader;
    yaml_event_t event;
    reader_open(&reader, config, equals + 1, origin, true);
    reader_expect(&reader, YAML_STREAM_START_EVENT, "the start of the value");
    reader_next(&reader, &event);
    if (event.type == YAML_STREAM_END_EVENT) {
        /* "key=" with nothing after it: a plain null, as `key:` would be in a file */
        yaml_event_delete(&event);
        if (!yaml_scalar_event_initialize(&event, NULL, NULL, (yaml_char_t *)"", 0, 1, 1,
                                          YAML_PLAIN_SCALAR_STYLE))
            fatal(EXIT_CONFIG, "%s: out of memory", origin);
        read_value(&reader, path, &event);
        yaml_event_delete(&event);
    } else {
        yaml_event_delete(&event); /* DOCUMENT_START */
        reader_next(&reader, &event);
        read_value(&reader, path, &event);
        yaml_event_delete(&event);
        reader_expect(&reader, YAML_DOCUMENT_END_EVENT, "a single value");
        reader_expect(&reader, YAML_STREAM_END_EVENT, "a single value");
    }
    reader_close(&reader);
    free(origin);
    free(path);
}

/* --- writing ------------------------------------------------------------------------- */

#define PATH_DEPTH_MAX 8

/* Splits "a.b.c" into its parent components {"a", "b"} and returns their count; the last
 * component (the key's own name) is left out. */
static int split_parents(const char *path, char parts[PATH_DEPTH_MAX][64])
{
    int depth = 0;
    const char *start = path;
    for (const char *dot; (dot = strchr(start, '.')) && depth < PATH_DEPTH_MAX; start = dot + 1)
        snprintf(parts[depth++], 64, "%.*s", (int)(dot - start), start);
    return depth;
}

char *config_to_yaml(const Config *config)
{
    char *text = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&text, &length);
    if (!out)
        fatal(EXIT_CONFIG, "config_to_yaml: cannot open a memory stream (out of memory)");
    fputs("# fathom config: every key, resolved (docs/config.md says what each means)\n", out);

    /* the table lists each section's keys together, so a section header is printed the
     * first time its path differs from the previous key's */
    char previous[PATH_DEPTH_MAX][64];
    int previous_depth = 0;
    for (int i = 0; i < config_key_count; i++) {
        const ConfigKey *key = &config_key_table[i];
        char parts[PATH_DEPTH_MAX][64];
        int depth = split_parents(key->path, parts), shared = 0;
        while (shared < depth && shared < previous_depth &&
               !strcmp(parts[shared], previous[shared]))
            shared++;
        for (int level = shared; level < depth; level++) {
            if (level == 0)
                fputc('\n', out);
            fprintf(out, "%*s%s:\n", 2 * level, "", parts[level]);
        }
        if (depth == 0 && previous_depth > 0)
            fputc('\n', out);
        const char *name = strrchr(key->path, '.');
        fprintf(out, "%*s%s: ", 2 * depth, "", name ? name + 1 : key->path);
        config_key_write_value(config, key, out);
        fputc('\n', out);
        memcpy(previous, parts, sizeof parts);
        previous_depth = depth;
    }
    bool failed = ferror(out) != 0;
    failed |= fclose(out) != 0;
    if (failed)
        fatal(EXIT_CONFIG, "config_to_yaml: writing to a memory stream failed (out of memory)");
    return text;
}
