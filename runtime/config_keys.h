/* runtime/config_keys.h — the one table of config keys (DESIGN 6), private to runtime/config*.
 *
 * Every key a YAML file or `--set` may name is one ConfigKey: its dotted path
 * ("model.rope_scaling.factor"), its type, where its value lives inside Config and the range
 * it must lie in. The YAML reader, `--set`, validation and config_to_yaml all walk this
 * table; there is no other list of keys. A dotted path that is a strict prefix of some key
 * ("model", "model.rope_scaling") is a mapping.
 *
 * Storing a value (config_key_store_*) checks its YAML type and fails through
 * fatal(EXIT_CONFIG, ...) with a message that starts with `where` (file:line:column or the
 * `--set` argument) and names the key. Ranges are checked later, by config_key_check_range,
 * once every override is applied.
 */
#ifndef FATHOM_RUNTIME_CONFIG_KEYS_H
#define FATHOM_RUNTIME_CONFIG_KEYS_H

#include "runtime/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
    KEY_INT,        /* int */
    KEY_SEED,       /* unsigned long long, decimal digits only */
    KEY_FLOAT,      /* double; YAML ints are accepted ("3") */
    KEY_BOOL,       /* bool: true | false */
    KEY_STRING,     /* char[size]; a plain null (`~`, `null`, nothing) is "" */
    KEY_ENUM,       /* one of names[], stored as its index in an int-sized enum or a bool */
    KEY_INT_LIST,   /* int[capacity] plus an int count, from a YAML sequence */
    KEY_NAME_LIST,  /* unsigned bit set: names[i] sets bit i, from a YAML sequence */
} ConfigKeyType;

typedef struct {
    const char *path;           /* dotted, from the top of the file */
    ConfigKeyType type;
    size_t offset;              /* of the value inside Config */
    size_t size;                /* bytes of the value (enums: sizeof(int) or sizeof(bool)) */
    size_t count_offset;        /* KEY_INT_LIST: of the int holding the number of entries */
    int capacity;               /* KEY_INT_LIST: most entries */
    const char *const *names;   /* KEY_ENUM, KEY_NAME_LIST: NULL-terminated, in value order */
    double min, max;            /* allowed range of the value (of every entry, for lists) */
    bool min_open, max_open;    /* the bound itself excluded */
    bool takes_auto;            /* KEY_INT: the word `auto` stores CONFIG_AUTO */
} ConfigKey;

/* The table, in the order config_to_yaml prints it (sections as DESIGN 6 lists them). */
extern const ConfigKey config_key_table[];
extern const int config_key_count;

/* The key at `path`, or NULL. */
const ConfigKey *config_key_find(const char *path);
/* true when `path` names a mapping: some key's path starts with `path` followed by a dot. */
bool config_key_is_mapping(const char *path);

/* A scalar value. `quoted` says it was written in quotes: only strings and enum names may
 * be. A plain null is `text` "" (or "~", "null"). */
void config_key_store_scalar(Config *config, const ConfigKey *key, const char *text,
                             bool quoted, const char *where);
/* A sequence of scalars, for KEY_INT_LIST and KEY_NAME_LIST. */
void config_key_store_list(Config *config, const ConfigKey *key, const char *const *items,
                           const bool *quoted, int n_items, const char *where);

/* Fails, naming the key and `origin`, when a value lies outside the key's range. */
void config_key_check_range(const Config *config, const ConfigKey *key, const char *origin);

/* Writes the value as YAML text that config_key_store_* reads back to the same bits. */
void config_key_write_value(const Config *config, const ConfigKey *key, FILE *out);

/* Plain YAML nulls: "", "~", "null", "Null", "NULL". */
bool config_scalar_is_null(const char *text);

#endif
