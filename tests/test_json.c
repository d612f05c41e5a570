/* tests/test_json.c — checkpoints/json: the strict reader the safetensors import rests on. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/json.h"

static bool parses_length(const char *text, size_t length)
{
    JsonDocument document;
    char error[256];
    bool ok = json_parse(text, length, &document, error, sizeof error);
    if (ok)
        json_free(&document);
    return ok;
}

static bool parses(const char *text)
{
    return parses_length(text, strlen(text));
}

Test(json, a_safetensors_header_reads_into_objects_arrays_and_exact_integers)
{
    const char *text = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"w\":{\"dtype\":\"BF16\",\"shape\":[3, 4],"
                       "\"data_offsets\":[0, 9007199254740993]}}";
    JsonDocument document;
    char error[256];
    cr_assert(json_parse(text, strlen(text), &document, error, sizeof error), "%s", error);
    const JsonValue *w = json_object_get(&document.root, "w");
    cr_assert_not_null(w);
    cr_assert_str_eq(json_object_get(w, "dtype")->string, "BF16");
    const JsonValue *shape = json_object_get(w, "shape");
    cr_assert_eq(shape->type, JSON_ARRAY);
    cr_assert_eq(shape->count, 2);
    cr_assert_eq(shape->items[1].integer, 4);
    /* 2^53 + 1: a double cannot hold it, the integer must */
    const JsonValue *end = &json_object_get(w, "data_offsets")->items[1];
    cr_assert(end->is_integer);
    cr_assert_eq(end->integer, 9007199254740993LL);
    cr_assert_str_eq(document.root.keys[0], "__metadata__");
    json_free(&document);
}

Test(json, numbers_literals_and_escapes_decode_as_rfc_8259_says)
{
    const char *text = "[-0.5e-3, 1E2, 0, true, false, null, \"a\\\"\\\\\\/\\b\\f\\n\\r\\t\","
                       " \"\\u00e9\\ud83d\\ude00\"]";
    JsonDocument document;
    char error[256];
    cr_assert(json_parse(text, strlen(text), &document, error, sizeof error), "%s", error);
    const JsonValue *items = document.root.items;
    cr_assert_float_eq(items[0].number, -0.5e-3, 1e-18);
    cr_assert_not(items[0].is_integer);
    cr_assert_float_eq(items[1].number, 100.0, 0);
    cr_assert_not(items[1].is_integer);
    cr_assert(items[2].is_integer);
    cr_assert(items[3].type == JSON_BOOL && items[3].boolean);
    cr_assert(items[4].type == JSON_BOOL && !items[4].boolean);
    cr_assert_eq(items[5].type, JSON_NULL);
    cr_assert_str_eq(items[6].string, "a\"\\/\b\f\n\r\t");
    cr_assert_str_eq(items[7].string, "\xc3\xa9\xf0\x9f\x98\x80"); /* e acute, U+1F600 */
    json_free(&document);
}

Test(json, malformed_texts_are_refused_with_the_byte_offset)
{
    static const char *const bad[] = {
        "",                     /* nothing */
        "{\"a\":1,}",           /* trailing comma */
        "[1,]",                 /* trailing comma */
        "01",                   /* leading zero */
        "1.",                   /* no digit after the point */
        "1e",                   /* no exponent digit */
        "-",                    /* sign alone */
        "NaN",                  /* not JSON */
        "{\"a\" 1}",            /* no colon */
        "{a:1}",                /* unquoted key */
        "\"abc",                /* unterminated string */
        "\"a\nb\"",             /* raw control character */
        "\"\\x\"",              /* unknown escape */
        "\"\\u12\"",            /* short \u escape */
        "\"\\ud800\"",          /* lone high surrogate */
        "\"\\udc00\"",          /* lone low surrogate */
        "\"\\u0000\"",          /* NUL inside a string */
        "{\"a\":1,\"a\":2}",    /* duplicate key */
        "[1] [2]",              /* text after the value */
        "tru",                  /* truncated literal */
        "[1 2]",                /* no comma */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        JsonDocument document;
        char error[256];
        cr_expect_not(json_parse(bad[i], strlen(bad[i]), &document, error, sizeof error),
                      "accepted malformed text %zu: %s", i, bad[i]);
        cr_expect(strstr(error, "at byte") != NULL, "text %zu: message '%s'", i, error);
    }
}

Test(json, nesting_deeper_than_the_limit_is_refused_not_a_stack_overflow)
{
    char text[2 * (JSON_DEPTH_MAX + 2) + 1];
    for (int depth = JSON_DEPTH_MAX; depth <= JSON_DEPTH_MAX + 1; depth++) {
        memset(text, '[', (size_t)depth);
        memset(text + depth, ']', (size_t)depth);
        text[2 * depth] = '\0';
        cr_assert_eq(parses(text), depth <= JSON_DEPTH_MAX, "depth %d", depth);
    }
}

Test(json, a_text_need_not_end_in_nul_and_is_read_only_up_to_its_length)
{
    const char text[] = {'[', '7', ']', '9'}; /* the 9 lies beyond the length */
    JsonDocument document;
    char error[256];
    cr_assert(json_parse(text, 3, &document, error, sizeof error), "%s", error);
    cr_assert_eq(document.root.items[0].integer, 7);
    json_free(&document);
}

Test(json, every_prefix_and_every_one_byte_change_of_a_header_parses_or_fails_cleanly)
{
    const char *valid = "{\"__metadata__\":{\"format\":\"pt\"},\"model.norm.weight\":"
                        "{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]},"
                        "\"x\":[1.5e-3,-2,\"\\u00e9\",true,null]}";
    size_t length = strlen(valid);
    char *copy = malloc(length + 1);
    int accepted = 0;
    for (size_t cut = 0; cut < length; cut++) /* every truncation is malformed */
        cr_assert_not(parses_length(valid, cut), "prefix of %zu bytes accepted", cut);
    static const char replacements[] = "\"\\{}[],:0-e.tfnu \x01\x7f\xff";
    for (size_t at = 0; at < length; at++)
        for (size_t r = 0; r < sizeof replacements - 1; r++) {
            memcpy(copy, valid, length + 1);
            copy[at] = replacements[r];
            accepted += parses(copy); /* must return, whatever it decides */
        }
    cr_assert_gt(accepted, 0); /* some changes (a digit for a digit) stay valid */
    free(copy);
}
