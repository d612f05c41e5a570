/* checkpoints/json.c — see json.h. A recursive-descent parser over the text; every value
 * owns its strings and children (json_free walks them). */
#include "checkpoints/json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

typedef struct {
    const char *text;
    size_t length, at;
    int depth;
    char *error;
    size_t error_capacity;
    bool failed;
} Parser;

static bool parse_value(Parser *parser, JsonValue *value);

__attribute__((format(printf, 2, 3))) static bool parse_fail(Parser *parser,
                                                              const char *format, ...)
{
    if (parser->failed)
        return false; /* keep the first, innermost message */
    parser->failed = true;
    char reason[160];
    va_list args;
    va_start(args, format);
    vsnprintf(reason, sizeof reason, format, args);
    va_end(args);
    if (parser->error_capacity)
        snprintf(parser->error, parser->error_capacity, "%s at byte %zu", reason, parser->at);
    return false;
}

static void skip_space(Parser *parser)
{
    while (parser->at < parser->length) {
        char c = parser->text[parser->at];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return;
        parser->at++;
    }
}

static bool at_end(const Parser *parser)
{
    return parser->at >= parser->length;
}

static char peek(const Parser *parser)
{
    return at_end(parser) ? '\0' : parser->text[parser->at];
}

static bool parse_literal(Parser *parser, const char *word)
{
    size_t length = strlen(word);
    if (parser->length - parser->at < length || memcmp(parser->text + parser->at, word, length))
        return parse_fail(parser, "invalid literal (expected %s)", word);
    parser->at += length;
    return true;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool parse_hex4(Parser *parser, unsigned *code)
{
    if (parser->length - parser->at < 4)
        return parse_fail(parser, "truncated \\u escape");
    *code = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_digit(parser->text[parser->at + i]);
        if (digit < 0)
            return parse_fail(parser, "invalid \\u escape");
        *code = *code * 16 + (unsigned)digit;
    }
    parser->at += 4;
    return true;
}

static size_t utf8_encode(unsigned code, char *out)
{
    if (code < 0x80) {
        out[0] = (char)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (char)(0xC0 | (code >> 6));
        out[1] = (char)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (char)(0xE0 | (code >> 12));
        out[1] = (char)(0x80 | ((code >> 6) & 0x3F));
        out[2] = (char)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (code >> 18));
    out[1] = (char)(0x80 | ((code >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((code >> 6) & 0x3F));
    out[3] = (char)(0x80 | (code & 0x3F));
    return 4;
}

/* A string at the opening quote -> *out (malloc'd, NUL-terminated). The decoded text is never
 * longer than the escaped one, so one buffer of the raw length suffices. */
static bool parse_string(Parser *parser, char **out)
{
    parser->at++; /* the opening quote */
    size_t start = parser->at;
    while (!at_end(parser) && parser->text[parser->at] != '"')
        parser->at += parser->text[parser->at] == '\\' ? 2 : 1;
    if (at_end(parser)) {
        parser->at = start;
        return parse_fail(parser, "unterminated string");
    }
    size_t end = parser->at;
    char *decoded = xmalloc(end - start + 1);
    size_t used = 0;
    for (parser->at = start; parser->at < end;) {
        unsigned char c = (unsigned char)parser->text[parser->at];
        if (c < 0x20) {
            free(decoded);
            return parse_fail(parser, "control character in a string");
        }
        if (c != '\\') {
            decoded[used++] = (char)c;
            parser->at++;
            continue;
        }
        char escape = parser->text[parser->at + 1];
        parser->at += 2;
        const char *simple = strchr("\"\\/bfnrt", escape);
        if (escape && simple) {
            static const char replacement[] = "\"\\/\b\f\n\r\t";
            decoded[used++] = replacement[simple - "\"\\/bfnrt"];
            continue;
        }
        unsigned code;
        if (escape != 'u' || !parse_hex4(parser, &code)) {
            free(decoded);
            return parse_fail(parser, "invalid escape in a string");
        }
        if (code >= 0xD800 && code <= 0xDBFF) { /* a high surrogate needs its low half */
            unsigned low;
            if (parser->length - parser->at < 2 || parser->text[parser->at] != '\\' ||
                parser->text[parser->at + 1] != 'u') {
                free(decoded);
                return parse_fail(parser, "unpaired surrogate in a string");
            }
            parser->at += 2;
            if (!parse_hex4(parser, &low) || low < 0xDC00 || low > 0xDFFF) {
                free(decoded);
                return parse_fail(parser, "unpaired surrogate in a string");
            }
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if ((code >= 0xDC00 && code <= 0xDFFF) || code == 0) {
            free(decoded);
            return parse_fail(parser, code ? "unpaired surrogate in a string"
                                           : "\\u0000 in a string");
        }
        used += utf8_encode(code, decoded + used);
    }
    decoded[used] = '\0';
    parser->at = end + 1; /* past the closing quote */
    *out = decoded;
    return true;
}

/* RFC 8259 number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool parse_number(Parser *parser, JsonValue *value)
{
    size_t start = parser->at;
    bool integral = true;
    if (peek(parser) == '-')
        parser->at++;
    if (peek(parser) == '0') {
        parser->at++;
    } else if (peek(parser) >= '1' && peek(parser) <= '9') {
        while (peek(parser) >= '0' && peek(parser) <= '9')
            parser->at++;
    } else {
        return parse_fail(parser, "invalid number");
    }
    if (peek(parser) == '.') {
        integral = false;
        parser->at++;
        if (!(peek(parser) >= '0' && peek(parser) <= '9'))
            return parse_fail(parser, "invalid number (no digit after the point)");
        while (peek(parser) >= '0' && peek(parser) <= '9')
            parser->at++;
    }
    if (peek(parser) == 'e' || peek(parser) == 'E') {
        integral = false;
        parser->at++;
        if (peek(parser) == '+' || peek(parser) == '-')
            parser->at++;
        if (!(peek(parser) >= '0' && peek(parser) <= '9'))
            return parse_fail(parser, "invalid number (no digit in the exponent)");
        while (peek(parser) >= '0' && peek(parser) <= '9')
            parser->at++;
    }
    char digits[64];
    size_t length = parser->at - start;
    if (length >= sizeof digits)
        return parse_fail(parser, "number longer than %zu characters", sizeof digits - 1);
    memcpy(digits, parser->text + start, length);
    digits[length] = '\0';
    value->type = JSON_NUMBER;
    value->number = strtod(digits, NULL);
    if (integral) {
        errno = 0;
        long long integer = strtoll(digits, NULL, 10);
        value->is_integer = errno == 0;
        value->integer = integer;
    }
    return true;
}

/* Appends one child to an array or object being built (capacity doubles). */
static JsonValue *append_item(JsonValue *container, int *capacity, bool with_key)
{
    if (container->count == *capacity) {
        *capacity = *capacity ? 2 * *capacity : 4;
        container->items = xrealloc(container->items, (size_t)*capacity * sizeof *container->items);
        if (with_key)
            container->keys = xrealloc(container->keys, (size_t)*capacity * sizeof(char *));
    }
    JsonValue *item = &container->items[container->count];
    memset(item, 0, sizeof *item);
    if (with_key)
        container->keys[container->count] = NULL;
    container->count++;
    return item;
}

static bool parse_array(Parser *parser, JsonValue *value)
{
    value->type = JSON_ARRAY;
    parser->at++;
    int capacity = 0;
    skip_space(parser);
    if (peek(parser) == ']') {
        parser->at++;
        return true;
    }
    for (;;) {
        if (!parse_value(parser, append_item(value, &capacity, false)))
            return false;
        skip_space(parser);
        char c = peek(parser);
        parser->at++;
        if (c == ']')
            return true;
        if (c != ',') {
            parser->at--;
            return parse_fail(parser, "expected ',' or ']' in an array");
        }
    }
}

static bool parse_object(Parser *parser, JsonValue *value)
{
    value->type = JSON_OBJECT;
    parser->at++;
    int capacity = 0;
    skip_space(parser);
    if (peek(parser) == '}') {
        parser->at++;
        return true;
    }
    for (;;) {
        skip_space(parser);
        if (peek(parser) != '"')
            return parse_fail(parser, "expected a string key in an object");
        size_t key_at = parser->at;
        char *key;
        if (!parse_string(parser, &key))
            return false;
        if (json_object_get(value, key)) {
            parser->at = key_at;
            parse_fail(parser, "duplicate key \"%.80s\"", key);
            free(key);
            return false;
        }
        JsonValue *member = append_item(value, &capacity, true);
        value->keys[value->count - 1] = key;
        skip_space(parser);
        if (peek(parser) != ':')
            return parse_fail(parser, "expected ':' after a key");
        parser->at++;
        if (!parse_value(parser, member))
            return false;
        skip_space(parser);
        char c = peek(parser);
        parser->at++;
        if (c == '}')
            return true;
        if (c != ',') {
            parser->at--;
            return parse_fail(parser, "expected ',' or '}' in an object");
        }
    }
}

static bool parse_value(Parser *parser, JsonValue *value)
{
    skip_space(parser);
    if (at_end(parser))
        return parse_fail(parser, "unexpected end of text");
    if (++parser->depth > JSON_DEPTH_MAX)
        return parse_fail(parser, "nested deeper than %d", JSON_DEPTH_MAX);
    bool ok;
    switch (peek(parser)) {
    case '{': ok = parse_object(parser, value); break;
    case '[': ok = parse_array(parser, value); break;
    case '"':
        value->type = JSON_STRING;
        ok = parse_string(parser, &value->string);
        break;
    case 't':
        value->type = JSON_BOOL;
        value->boolean = true;
        ok = parse_literal(parser, "true");
        break;
    case 'f':
        value->type = JSON_BOOL;
        ok = parse_literal(parser, "false");
        break;
    case 'n':
        value->type = JSON_NULL;
        ok = parse_literal(parser, "null");
        break;
    default: ok = parse_number(parser, value); break;
    }
    parser->depth--;
    return ok;
}

static void value_free(JsonValue *value)
{
    for (int i = 0; i < value->count; i++) {
        value_free(&value->items[i]);
        if (value->keys)
            free(value->keys[i]);
    }
    free(value->items);
    free(value->keys);
    free(value->string);
    memset(value, 0, sizeof *value);
}

bool json_parse(const char *text, size_t length, JsonDocument *document, char *error,
                size_t error_capacity)
{
    Parser parser = {.text = text, .length = length, .error = error,
                     .error_capacity = error_capacity};
    memset(document, 0, sizeof *document);
    if (error_capacity)
        error[0] = '\0';
    bool ok = parse_value(&parser, &document->root);
    if (ok) {
        skip_space(&parser);
        if (!at_end(&parser))
            ok = parse_fail(&parser, "text after the JSON value");
    }
    if (!ok)
        value_free(&document->root);
    return ok;
}

void json_free(JsonDocument *document)
{
    value_free(&document->root);
}

void json_parse_file(const char *path, JsonDocument *document)
{
    FILE *file = fopen(path, "rb");
    if (!file)
        fatal(EXIT_DATA, "cannot open %s: %s", path, strerror(errno));
    size_t capacity = 1 << 16, used = 0;
    char *text = xmalloc(capacity);
    for (size_t n; (n = fread(text + used, 1, capacity - used, file)) > 0;) {
        used += n;
        if (used == capacity) {
            if (capacity >= JSON_FILE_MAX)
                fatal(EXIT_DATA, "%s is larger than %zu bytes", path, JSON_FILE_MAX);
            capacity *= 2;
            text = xrealloc(text, capacity);
        }
    }
    bool failed = ferror(file);
    fclose(file);
    if (failed)
        fatal(EXIT_DATA, "cannot read %s", path);
    char error[256];
    if (!json_parse(text, used, document, error, sizeof error))
        fatal(EXIT_DATA, "%s is not valid JSON: %s", path, error);
    free(text);
}

const JsonValue *json_object_get(const JsonValue *object, const char *key)
{
    if (!object || object->type != JSON_OBJECT)
        return NULL;
    for (int i = 0; i < object->count; i++)
        if (object->keys[i] && !strcmp(object->keys[i], key))
            return &object->items[i];
    return NULL;
}

const char *json_type_name(JsonType type)
{
    static const char *const names[] = {"null", "boolean", "number", "string", "array",
                                        "object"};
    return names[type];
}
