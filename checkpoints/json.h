/* checkpoints/json.h — a small, strict JSON reader (RFC 8259) for the Hugging Face files
 * fathom imports: safetensors headers, model.safetensors.index.json, config.json.
 *
 * json_parse reads a whole text into a tree the document owns. Strict: one value, nothing
 * after it but white space; no comments, trailing commas, NaN or Infinity; strings must be
 * valid escapes (\uXXXX surrogate pairs become UTF-8; \u0000 and raw control characters are
 * refused); an object may not repeat a key. Limits: nesting depth JSON_DEPTH_MAX; a number is
 * a double, and an integer literal (no fraction or exponent) that fits int64 is also kept
 * exactly in `integer`. On a malformed text it returns false and writes a message with the
 * byte offset into `error` (the document is then empty); it never exits. json_parse_file
 * reads and parses a file and exits 3 naming it when it is missing or malformed.
 */
#ifndef FATHOM_CHECKPOINTS_JSON_H
#define FATHOM_CHECKPOINTS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_DEPTH_MAX 64

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue JsonValue;
struct JsonValue {
    JsonType type;
    bool boolean;          /* JSON_BOOL */
    double number;         /* JSON_NUMBER */
    bool is_integer;       /* JSON_NUMBER written as an integer that fits int64 */
    int64_t integer;       /* exact when is_integer */
    char *string;          /* JSON_STRING, NUL-terminated UTF-8 (no NUL inside) */
    int count;             /* JSON_ARRAY items, JSON_OBJECT members */
    JsonValue *items;      /* [count]: array items, or object member values */
    char **keys;           /* JSON_OBJECT: [count] member names, in the text's order */
};

typedef struct {
    JsonValue root;
} JsonDocument;

/* Parses text[0..length-1] (need not be NUL-terminated). */
bool json_parse(const char *text, size_t length, JsonDocument *document, char *error,
                size_t error_capacity);
void json_free(JsonDocument *document);
/* A whole file of at most JSON_FILE_MAX bytes; exit 3 naming it when missing, larger or
 * malformed. */
#define JSON_FILE_MAX ((size_t)100 << 20)
void json_parse_file(const char *path, JsonDocument *document);

/* The member `key` of an object; NULL when absent or when `object` is not an object. */
const JsonValue *json_object_get(const JsonValue *object, const char *key);
/* "null", "boolean", "number", "string", "array", "object" */
const char *json_type_name(JsonType type);

#endif
