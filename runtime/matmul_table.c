/* runtime/matmul_table.c — see matmul_table.h. */
#include "runtime/matmul_table.h"

#include "runtime/error.h"
#include "runtime/text_file.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char MAGIC[] = "fathom-matmul-algorithms";

enum {
    ENTRY_FIELDS = 10 + MATMUL_ALGORITHM_WORDS, /* product .. tuned_ms, then the words */
    LINE_TOKENS_MAX = 2 * ENTRY_FIELDS,          /* more than a line has: counted, refused */
    HEADERS_ALL = 7,                             /* the bits of cublaslt, workspace, device */
};

static const char *const product_names[] = {"forward", "input_gradient", "weight_gradient"};

const char *matmul_product_name(MatmulProduct product)
{
    return (unsigned)product < 3 ? product_names[product] : "unknown";
}

void matmul_table_init(MatmulTable *table)
{
    memset(table, 0, sizeof *table);
}

void matmul_table_free(MatmulTable *table)
{
    free(table->entries);
    matmul_table_init(table);
}

MatmulTableEntry *matmul_table_add(MatmulTable *table)
{
    if (table->count == table->capacity) {
        table->capacity = table->capacity ? 2 * table->capacity : 32;
        table->entries = xrealloc(table->entries, (size_t)table->capacity * sizeof *table->entries);
    }
    MatmulTableEntry *entry = &table->entries[table->count++];
    memset(entry, 0, sizeof *entry);
    return entry;
}

static bool same_key(const MatmulTableEntry *a, const MatmulTableEntry *b)
{
    return a->product == b->product && a->rows == b->rows && a->in_dim == b->in_dim &&
           a->out_dim == b->out_dim && a->alignment_a == b->alignment_a &&
           a->alignment_b == b->alignment_b && a->alignment_c == b->alignment_c;
}

const MatmulTableEntry *matmul_table_find(const MatmulTable *table,
                                          const MatmulTableEntry *key)
{
    for (int i = 0; i < table->count; i++)
        if (same_key(&table->entries[i], key))
            return &table->entries[i];
    return NULL;
}

/* ---- parsing ---- */

typedef struct {
    char *error;
    size_t capacity;
    int line;
} ParseState;

static bool parse_failed(ParseState *state, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

static bool parse_failed(ParseState *state, const char *format, ...)
{
    int used = state->line > 0 ? snprintf(state->error, state->capacity, "line %d: ",
                                          state->line)
                               : 0;
    if (used < 0 || (size_t)used >= state->capacity)
        return false;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(state->error + used, state->capacity - (size_t)used, format, arguments);
    va_end(arguments);
    return false;
}

/* Splits `line` (modified) at blanks; returns the count, at most LINE_TOKENS_MAX. */
static int split_tokens(char *line, char *tokens[LINE_TOKENS_MAX])
{
    int count = 0;
    char *save = NULL;
    for (char *token = strtok_r(line, " \t\r", &save); token && count < LINE_TOKENS_MAX;
         token = strtok_r(NULL, " \t\r", &save))
        tokens[count++] = token;
    return count;
}

static bool parse_unsigned(const char *text, int base, uint64_t *value)
{
    if (!*text || *text == '-' || *text == '+')
        return false;
    char *end;
    errno = 0;
    unsigned long long parsed = strtoull(text, &end, base);
    if (*end || errno)
        return false;
    *value = (uint64_t)parsed;
    return true;
}

static bool parse_count(const char *text, int *value, int minimum)
{
    uint64_t parsed;
    if (!parse_unsigned(text, 10, &parsed) || parsed > (uint64_t)INT32_MAX ||
        parsed < (uint64_t)minimum)
        return false;
    *value = (int)parsed;
    return true;
}

static bool parse_alignment(const char *text, uint32_t *value)
{
    uint64_t parsed;
    if (!parse_unsigned(text, 10, &parsed) || parsed == 0 || parsed > 256 ||
        (parsed & (parsed - 1)) != 0)
        return false;
    *value = (uint32_t)parsed;
    return true;
}

static bool parse_milliseconds(const char *text, double *value)
{
    char *end;
    errno = 0;
    double parsed = strtod(text, &end);
    if (end == text || *end || errno || !(parsed >= 0) || parsed > 1e9)
        return false;
    *value = parsed;
    return true;
}

static bool parse_entry(MatmulTable *table, char **tokens, int count, ParseState *state)
{
    static const char *const field_names[] = {"rows", "in", "out", "align_a", "align_b",
                                              "align_c", "calls"};
    if (count != ENTRY_FIELDS)
        return parse_failed(state, "%d fields where a product has %d (product rows in out "
                            "align_a align_b align_c calls heuristic_ms tuned_ms and %d "
                            "words of algorithm)", count, ENTRY_FIELDS, MATMUL_ALGORITHM_WORDS);
    MatmulTableEntry entry;
    memset(&entry, 0, sizeof entry);
    int product = -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(tokens[0], product_names[i]))
            product = i;
    if (product < 0)
        return parse_failed(state, "unknown product '%s' (forward, input_gradient or "
                            "weight_gradient)", tokens[0]);
    entry.product = (MatmulProduct)product;
    int *shape[] = {&entry.rows, &entry.in_dim, &entry.out_dim};
    for (int i = 0; i < 3; i++)
        if (!parse_count(tokens[1 + i], shape[i], 1))
            return parse_failed(state, "%s '%s' is not a positive integer", field_names[i],
                                tokens[1 + i]);
    uint32_t *alignments[] = {&entry.alignment_a, &entry.alignment_b, &entry.alignment_c};
    for (int i = 0; i < 3; i++)
        if (!parse_alignment(tokens[4 + i], alignments[i]))
            return parse_failed(state, "%s '%s' is not a power of two up to 256",
                                field_names[3 + i], tokens[4 + i]);
    if (!parse_count(tokens[7], &entry.calls, 0))
        return parse_failed(state, "calls '%s' is not a count", tokens[7]);
    if (!parse_milliseconds(tokens[8], &entry.heuristic_ms) ||
        !parse_milliseconds(tokens[9], &entry.tuned_ms))
        return parse_failed(state, "the times '%s' and '%s' are not milliseconds", tokens[8],
                            tokens[9]);
    for (int i = 0; i < MATMUL_ALGORITHM_WORDS; i++) {
        const char *word = tokens[10 + i];
        if (strlen(word) != 16 || strspn(word, "0123456789abcdefABCDEF") != 16 ||
            !parse_unsigned(word, 16, &entry.algorithm[i]))
            return parse_failed(state, "algorithm word %d '%s' is not 16 hex digits", i + 1,
                                word);
    }
    if (matmul_table_find(table, &entry))
        return parse_failed(state, "a second line for the %s of rows %d, in %d, out %d at the "
                            "same alignments", product_names[product], entry.rows,
                            entry.in_dim, entry.out_dim);
    *matmul_table_add(table) = entry;
    return true;
}

static const char *const header_keys[] = {"cublaslt", "workspace", "device"};

/* header_keys' index of `token`, or -1 */
static int header_index(const char *token)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(token, header_keys[i]))
            return i;
    return -1;
}

static bool header_key(const char *token)
{
    return header_index(token) >= 0;
}

static bool product_name(const char *token)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(token, product_names[i]))
            return true;
    return false;
}

/* A header line ("cublaslt N", "workspace N", "device M NAME"); `rest` is what follows the
 * first token, unsplit (the device's name has blanks). */
static bool parse_header(MatmulTable *table, const char *key, const char *rest,
                         unsigned *seen, ParseState *state)
{
    const int which = header_index(key);
    if (*seen & (1u << which))
        return parse_failed(state, "a second '%s' line", key);
    *seen |= 1u << which;
    char text[256];
    snprintf(text, sizeof text, "%s", rest);
    char *tokens[LINE_TOKENS_MAX];
    const int count = split_tokens(text, tokens);
    if (which < 2) {
        uint64_t *value = which == 0 ? &table->library_version : &table->workspace_bytes;
        if (count != 1 || !parse_unsigned(tokens[0], 10, value))
            return parse_failed(state, "'%s' takes one unsigned integer", key);
        return true;
    }
    if (count < 2 || !parse_count(tokens[0], &table->multiprocessors, 1))
        return parse_failed(state, "'device' takes the multiprocessor count, then the name");
    const char *name = rest + strspn(rest, " \t"); /* past the count: the name, blanks kept */
    name += strcspn(name, " \t");
    name += strspn(name, " \t");
    snprintf(table->device, sizeof table->device, "%s", name);
    size_t length = strlen(table->device); /* without trailing blanks (or a CR) */
    while (length > 0 && strchr(" \t\r", table->device[length - 1]))
        table->device[--length] = '\0';
    return true;
}

bool matmul_table_parse(MatmulTable *table, const char *text, char *error, size_t capacity)
{
    ParseState state = {error, capacity, 0};
    error[0] = '\0';
    bool magic_seen = false, products_begun = false;
    unsigned headers_seen = 0;
    const char *cursor = text;
    while (*cursor) {
        const char *newline = strchr(cursor, '\n');
        const size_t length = newline ? (size_t)(newline - cursor) : strlen(cursor);
        char line[1024];
        state.line++;
        if (length >= sizeof line)
            return parse_failed(&state, "longer than %zu characters", sizeof line - 1);
        memcpy(line, cursor, length);
        line[length] = '\0';
        cursor += length + (newline ? 1 : 0);

        char *rest_of_line = line + strspn(line, " \t");
        if (*rest_of_line == '#' || rest_of_line[strspn(rest_of_line, " \t\r")] == '\0')
            continue;
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", rest_of_line);
        char *tokens[LINE_TOKENS_MAX];
        const int count = split_tokens(copy, tokens);
        if (!magic_seen) {
            uint64_t version;
            if (count != 2 || strcmp(tokens[0], MAGIC) ||
                !parse_unsigned(tokens[1], 10, &version))
                return parse_failed(&state, "not a matmul algorithms table (it starts "
                                    "'%s %d')", MAGIC, MATMUL_TABLE_VERSION);
            if (version != MATMUL_TABLE_VERSION)
                return parse_failed(&state, "version %" PRIu64 ", this fathom reads version "
                                    "%d: run fathom tune again", version,
                                    MATMUL_TABLE_VERSION);
            magic_seen = true;
            continue;
        }
        if (header_key(tokens[0])) {
            if (products_begun)
                return parse_failed(&state, "'%s' after the first product", tokens[0]);
            const char *rest = rest_of_line + strlen(tokens[0]);
            if (!parse_header(table, tokens[0], rest, &headers_seen, &state))
                return false;
            continue;
        }
        if (headers_seen != HEADERS_ALL)
            return product_name(tokens[0])
                       ? parse_failed(&state, "a product before the cublaslt, workspace and "
                                      "device lines")
                       : parse_failed(&state, "unknown line '%s' before the first product "
                                      "(cublaslt, workspace or device)", tokens[0]);
        products_begun = true;
        if (!parse_entry(table, tokens, count, &state))
            return false;
    }
    if (!magic_seen)
        return parse_failed(&state, "empty: not a matmul algorithms table");
    if (headers_seen != HEADERS_ALL)
        return parse_failed(&state, "the table ends without its cublaslt, workspace and "
                            "device lines");
    return true;
}

/* ---- text ---- */

char *matmul_table_format(const MatmulTable *table)
{
    const size_t line_bytes = 64 + 16 * 11 + 17 * MATMUL_ALGORITHM_WORDS;
    const size_t capacity = 512 + MATMUL_DEVICE_NAME_MAX + (size_t)table->count * line_bytes;
    char *text = xmalloc(capacity);
    size_t used = (size_t)snprintf(
        text, capacity,
        "%s %d\ncublaslt %" PRIu64 "\nworkspace %" PRIu64 "\ndevice %d %s\n"
        "# product rows in out align_a align_b align_c calls heuristic_ms tuned_ms algorithm\n",
        MAGIC, MATMUL_TABLE_VERSION, table->library_version, table->workspace_bytes,
        table->multiprocessors, table->device);
    for (int i = 0; i < table->count && used < capacity; i++) {
        const MatmulTableEntry *e = &table->entries[i];
        used += (size_t)snprintf(text + used, capacity - used, "%s %d %d %d %u %u %u %d %.5f %.5f",
                                 matmul_product_name(e->product), e->rows, e->in_dim,
                                 e->out_dim, e->alignment_a, e->alignment_b, e->alignment_c,
                                 e->calls, e->heuristic_ms, e->tuned_ms);
        for (int w = 0; w < MATMUL_ALGORITHM_WORDS && used < capacity; w++)
            used += (size_t)snprintf(text + used, capacity - used, " %016" PRIx64,
                                     e->algorithm[w]);
        if (used < capacity)
            used += (size_t)snprintf(text + used, capacity - used, "\n");
    }
    return text;
}

void matmul_table_read(MatmulTable *table, const char *path)
{
    char *text = text_file_read(path, "the matmul_algorithms table, which fathom tune writes");
    char error[512];
    if (!matmul_table_parse(table, text, error, sizeof error))
        fatal(EXIT_CONFIG, "matmul_algorithms: %s, %s", path, error);
    free(text);
}

void matmul_table_write(const MatmulTable *table, const char *path)
{
    char temporary[4096];
    if ((size_t)snprintf(temporary, sizeof temporary, "%s.tmp", path) >= sizeof temporary)
        fatal(EXIT_CONFIG, "tune: the path %s is too long", path);
    char *text = matmul_table_format(table);
    FILE *file = fopen(temporary, "wb");
    if (!file)
        fatal(EXIT_CONFIG, "tune: cannot write %s: %s", temporary, strerror(errno));
    const size_t length = strlen(text);
    const bool written = fwrite(text, 1, length, file) == length && fflush(file) == 0 &&
                         fsync(fileno(file)) == 0;
    const bool closed = fclose(file) == 0;
    free(text);
    if (!written || !closed || rename(temporary, path) != 0) {
        const int saved = errno;
        unlink(temporary);
        fatal(EXIT_CONFIG, "tune: cannot write %s: %s", path, strerror(saved));
    }
}
