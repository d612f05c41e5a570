/* checkpoints/safetensors.c — see safetensors.h. */
#include "checkpoints/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoints/json.h"
#include "runtime/error.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors bytes are little-endian");

#define PATH_CAPACITY 4096

/* Every dtype of the format and its size in bytes; the first three are the ones read. */
static const struct {
    const char *name;
    int size;
    SafetensorsDtype dtype;
} dtypes[] = {
    {"F32", 4, SAFETENSORS_F32},     {"F16", 2, SAFETENSORS_F16},
    {"BF16", 2, SAFETENSORS_BF16},   {"F64", 8, SAFETENSORS_OTHER},
    {"I64", 8, SAFETENSORS_OTHER},   {"U64", 8, SAFETENSORS_OTHER},
    {"I32", 4, SAFETENSORS_OTHER},   {"U32", 4, SAFETENSORS_OTHER},
    {"I16", 2, SAFETENSORS_OTHER},   {"U16", 2, SAFETENSORS_OTHER},
    {"I8", 1, SAFETENSORS_OTHER},    {"U8", 1, SAFETENSORS_OTHER},
    {"BOOL", 1, SAFETENSORS_OTHER},  {"F8_E4M3", 1, SAFETENSORS_OTHER},
    {"F8_E5M2", 1, SAFETENSORS_OTHER},
};

/* Reads exactly `bytes` at `offset`, or exits 3 naming the file. */
static void read_exactly(int descriptor, void *buffer, size_t bytes, uint64_t offset,
                         const char *path, const char *what)
{
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = pread(descriptor, (char *)buffer + done, bytes - done,
                          (off_t)(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fatal(EXIT_DATA, "%s: cannot read %s: %s", path, what, strerror(errno));
        if (n == 0)
            fatal(EXIT_DATA, "%s: the file ends inside %s (truncated?)", path, what);
        done += (size_t)n;
    }
}

static bool json_nonnegative_integer(const JsonValue *value, int64_t *out)
{
    if (!value || value->type != JSON_NUMBER || !value->is_integer || value->integer < 0)
        return false;
    *out = value->integer;
    return true;
}

/* One header entry -> tensor; exits 3 naming the file and the tensor on any fault. */
static void entry_parse(const char *path, const char *name, const JsonValue *entry,
                        uint64_t buffer_start, uint64_t buffer_bytes, int file,
                        SafetensorsTensor *tensor)
{
    if (entry->type != JSON_OBJECT)
        fatal(EXIT_DATA, "%s: tensor %s: its header entry is a %s, not an object", path, name,
              json_type_name(entry->type));
    const JsonValue *dtype = json_object_get(entry, "dtype");
    const JsonValue *shape = json_object_get(entry, "shape");
    const JsonValue *offsets = json_object_get(entry, "data_offsets");
    if (!dtype || dtype->type != JSON_STRING)
        fatal(EXIT_DATA, "%s: tensor %s has no dtype string", path, name);
    int size = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        if (!strcmp(dtype->string, dtypes[d].name)) {
            size = dtypes[d].size;
            tensor->dtype = dtypes[d].dtype;
        }
    if (!size)
        fatal(EXIT_DATA, "%s: tensor %s has an unknown dtype \"%.20s\"", path, name,
              dtype->string);
    snprintf(tensor->dtype_name, sizeof tensor->dtype_name, "%s", dtype->string);
    if (!shape || shape->type != JSON_ARRAY || shape->count > SAFETENSORS_RANK_MAX)
        fatal(EXIT_DATA, "%s: tensor %s has no shape array of at most %d dims", path, name,
              SAFETENSORS_RANK_MAX);
    tensor->ndim = shape->count;
    tensor->elements = 1;
    for (int axis = 0; axis < shape->count; axis++) {
        /* 2^40 a dim and 2^60 in all: no product below overflows */
        if (!json_nonnegative_integer(&shape->items[axis], &tensor->shape[axis]) ||
            tensor->shape[axis] > ((int64_t)1 << 40))
            fatal(EXIT_DATA, "%s: tensor %s: shape entry %d is not a dimension", path, name,
                  axis);
        tensor->elements *= tensor->shape[axis];
        if (tensor->elements > ((int64_t)1 << 60))
            fatal(EXIT_DATA, "%s: tensor %s: shape too large", path, name);
    }
    int64_t begin, end;
    if (!offsets || offsets->type != JSON_ARRAY || offsets->count != 2 ||
        !json_nonnegative_integer(&offsets->items[0], &begin) ||
        !json_nonnegative_integer(&offsets->items[1], &end) || begin > end)
        fatal(EXIT_DATA, "%s: tensor %s has no valid data_offsets [begin, end]", path, name);
    if ((uint64_t)end > buffer_bytes)
        fatal(EXIT_DATA, "%s: tensor %s: data_offsets [%lld, %lld] reach past the %llu bytes "
              "of data the file holds (truncated?)", path, name, (long long)begin,
              (long long)end, (unsigned long long)buffer_bytes);
    if ((uint64_t)(end - begin) != (uint64_t)tensor->elements * (uint64_t)size)
        fatal(EXIT_DATA, "%s: tensor %s: data_offsets span %lld bytes, its shape and dtype %s "
              "need %lld", path, name, (long long)(end - begin), tensor->dtype_name,
              (long long)(tensor->elements * size));
    tensor->name = xstrdup(name);
    tensor->offset = buffer_start + (uint64_t)begin;
    tensor->bytes = (uint64_t)(end - begin);
    tensor->file = file;
}

/* Opens model->paths[file], reads and checks its header, appends its tensors. */
static void file_add(SafetensorsModel *model, int file, SafetensorsTensor **tensors, int *count)
{
    const char *path = model->paths[file];
    int descriptor = open(path, O_RDONLY | O_CLOEXEC);
    if (descriptor < 0)
        fatal(EXIT_DATA, "cannot open %s: %s", path, strerror(errno));
    model->descriptors[file] = descriptor;
    struct stat status;
    if (fstat(descriptor, &status) != 0)
        fatal(EXIT_DATA, "cannot stat %s: %s", path, strerror(errno));
    uint64_t file_bytes = (uint64_t)status.st_size;
    if (file_bytes < 8)
        fatal(EXIT_DATA, "%s: %llu bytes, too short for a safetensors header length (truncated?)",
              path, (unsigned long long)file_bytes);
    uint64_t header_bytes;
    read_exactly(descriptor, &header_bytes, 8, 0, path, "the header length");
    if (header_bytes < 2 || header_bytes > SAFETENSORS_HEADER_MAX)
        fatal(EXIT_DATA, "%s: header length %llu is not a safetensors header (2 to %llu bytes)",
              path, (unsigned long long)header_bytes, (unsigned long long)SAFETENSORS_HEADER_MAX);
    if (header_bytes > file_bytes - 8)
        fatal(EXIT_DATA, "%s: the header claims %llu bytes, the file has %llu after the length "
              "(truncated?)", path, (unsigned long long)header_bytes,
              (unsigned long long)(file_bytes - 8));
    char *header = xmalloc((size_t)header_bytes);
    read_exactly(descriptor, header, (size_t)header_bytes, 8, path, "the header");
    JsonDocument document;
    char error[256];
    if (!json_parse(header, (size_t)header_bytes, &document, error, sizeof error))
        fatal(EXIT_DATA, "%s: the header is not valid JSON: %s", path, error);
    free(header);
    const JsonValue *root = &document.root;
    if (root->type != JSON_OBJECT)
        fatal(EXIT_DATA, "%s: the header is a JSON %s, not an object", path,
              json_type_name(root->type));
    *tensors = xrealloc(*tensors, (size_t)(*count + root->count) * sizeof **tensors);
    for (int i = 0; i < root->count; i++) {
        if (!strcmp(root->keys[i], "__metadata__")) {
            if (root->items[i].type != JSON_OBJECT)
                fatal(EXIT_DATA, "%s: __metadata__ is a %s, not an object", path,
                      json_type_name(root->items[i].type));
            continue;
        }
        SafetensorsTensor *tensor = &(*tensors)[(*count)++];
        memset(tensor, 0, sizeof *tensor);
        entry_parse(path, root->keys[i], &root->items[i], 8 + header_bytes,
                    file_bytes - 8 - header_bytes, file, tensor);
        model->total_bytes += tensor->bytes;
    }
    json_free(&document);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(((const SafetensorsTensor *)a)->name, ((const SafetensorsTensor *)b)->name);
}

static void tensors_sort(SafetensorsModel *model, const char *where)
{
    qsort(model->tensors, (size_t)model->n_tensors, sizeof *model->tensors, compare_names);
    for (int i = 1; i < model->n_tensors; i++)
        if (!strcmp(model->tensors[i - 1].name, model->tensors[i].name))
            fatal(EXIT_DATA, "%s: tensor %s is stored twice", where, model->tensors[i].name);
}

static void model_init(SafetensorsModel *model, int n_files)
{
    memset(model, 0, sizeof *model);
    model->n_files = n_files;
    model->paths = xcalloc((size_t)n_files, sizeof *model->paths);
    model->descriptors = xcalloc((size_t)n_files, sizeof *model->descriptors);
    for (int f = 0; f < n_files; f++)
        model->descriptors[f] = -1;
}

void safetensors_open_file(SafetensorsModel *model, const char *path)
{
    model_init(model, 1);
    model->paths[0] = xstrdup(path);
    file_add(model, 0, &model->tensors, &model->n_tensors);
    tensors_sort(model, path);
}

/* The sharded form: every file the weight_map names, then only the tensors it maps, each
 * from the file it names. */
static void open_index(SafetensorsModel *model, const char *dir, const char *index_path)
{
    JsonDocument document;
    json_parse_file(index_path, &document);
    const JsonValue *map = json_object_get(&document.root, "weight_map");
    if (!map || map->type != JSON_OBJECT || map->count == 0)
        fatal(EXIT_DATA, "%s has no weight_map object", index_path);
    /* the distinct file names, in order of first mention */
    const char **names = xcalloc((size_t)map->count, sizeof *names);
    int n_files = 0;
    for (int i = 0; i < map->count; i++) {
        const JsonValue *file = &map->items[i];
        if (file->type != JSON_STRING || !file->string[0] || strchr(file->string, '/') ||
            !strcmp(file->string, ".") || !strcmp(file->string, ".."))
            fatal(EXIT_DATA, "%s: weight_map entry %s is not a file name in %s", index_path,
                  map->keys[i], dir);
        int f = 0;
        while (f < n_files && strcmp(names[f], file->string))
            f++;
        if (f == n_files)
            names[n_files++] = file->string;
    }
    model_init(model, n_files);
    SafetensorsTensor *stored = NULL;
    int n_stored = 0;
    for (int f = 0; f < n_files; f++) {
        char path[PATH_CAPACITY];
        if (snprintf(path, sizeof path, "%s/%s", dir, names[f]) >= (int)sizeof path)
            fatal(EXIT_DATA, "path %s/%s is too long", dir, names[f]);
        model->paths[f] = xstrdup(path);
        file_add(model, f, &stored, &n_stored);
    }
    model->tensors = xcalloc((size_t)map->count, sizeof *model->tensors);
    model->total_bytes = 0;
    for (int i = 0; i < map->count; i++) {
        int f = 0;
        while (strcmp(names[f], map->items[i].string))
            f++;
        int s = 0;
        while (s < n_stored && (stored[s].file != f || !stored[s].name ||
                                strcmp(stored[s].name, map->keys[i])))
            s++;
        if (s == n_stored)
            fatal(EXIT_DATA, "%s: tensor %s is mapped to %s, which does not hold it",
                  index_path, map->keys[i], model->paths[f]);
        model->tensors[model->n_tensors++] = stored[s];
        model->total_bytes += stored[s].bytes;
        stored[s].name = NULL; /* moved */
    }
    for (int s = 0; s < n_stored; s++)
        free(stored[s].name);
    free(stored);
    free(names);
    json_free(&document);
    tensors_sort(model, index_path);
}

void safetensors_open(SafetensorsModel *model, const char *dir)
{
    char index_path[PATH_CAPACITY], single_path[PATH_CAPACITY];
    struct stat status;
    if (stat(dir, &status) != 0 || !S_ISDIR(status.st_mode))
        fatal(EXIT_DATA, "Hugging Face model directory %s does not exist", dir);
    snprintf(index_path, sizeof index_path, "%s/%s", dir, SAFETENSORS_INDEX_FILE);
    snprintf(single_path, sizeof single_path, "%s/%s", dir, SAFETENSORS_SINGLE_FILE);
    if (stat(index_path, &status) == 0)
        open_index(model, dir, index_path);
    else if (stat(single_path, &status) == 0)
        safetensors_open_file(model, single_path);
    else
        fatal(EXIT_DATA, "%s holds neither %s nor %s", dir, SAFETENSORS_SINGLE_FILE,
              SAFETENSORS_INDEX_FILE);
}

void safetensors_close(SafetensorsModel *model)
{
    for (int f = 0; f < model->n_files; f++) {
        if (model->descriptors[f] >= 0)
            close(model->descriptors[f]);
        free(model->paths[f]);
    }
    for (int i = 0; i < model->n_tensors; i++)
        free(model->tensors[i].name);
    free(model->paths);
    free(model->descriptors);
    free(model->tensors);
    memset(model, 0, sizeof *model);
}

const SafetensorsTensor *safetensors_find(const SafetensorsModel *model, const char *name)
{
    SafetensorsTensor key = {.name = (char *)name};
    return bsearch(&key, model->tensors, (size_t)model->n_tensors, sizeof *model->tensors,
                   compare_names);
}

/* inline in the conversion loops below; the exported names are for the tests */
static inline float bf16_to_float(uint16_t bf16)
{
    uint32_t bits = (uint32_t)bf16 << 16; /* bf16 is the top half of an fp32 */
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline float half_to_float(uint16_t half)
{
    uint32_t sign = (uint32_t)(half >> 15) << 31;
    uint32_t exponent = (half >> 10) & 0x1F, mantissa = half & 0x3FF, bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13); /* infinity, NaN (payload kept) */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13); /* bias 15 -> 127 */
    } else if (mantissa == 0) {
        bits = sign; /* signed zero */
    } else {
        /* subnormal: mantissa * 2^-24, normal in fp32 */
        int shift = 0;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            shift++;
        }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3FF) << 13);
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

float safetensors_bf16_to_float(uint16_t bf16)
{
    return bf16_to_float(bf16);
}

float safetensors_half_to_float(uint16_t half)
{
    return half_to_float(half);
}

void safetensors_read(const SafetensorsModel *model, const SafetensorsTensor *tensor,
                      float *values)
{
    const char *path = model->paths[tensor->file];
    char what[256];
    snprintf(what, sizeof what, "tensor %s", tensor->name);
    if (tensor->dtype == SAFETENSORS_OTHER)
        fatal(EXIT_DATA, "%s: tensor %s is %s; fathom imports BF16, F16 and F32", path,
              tensor->name, tensor->dtype_name);
    if (tensor->dtype == SAFETENSORS_F32) {
        read_exactly(model->descriptors[tensor->file], values, (size_t)tensor->bytes,
                     tensor->offset, path, what);
        return;
    }
    /* 2-byte dtypes: read a block, widen it */
    size_t block = tensor->bytes < SAFETENSORS_BLOCK_BYTES ? (size_t)tensor->bytes
                                                           : SAFETENSORS_BLOCK_BYTES;
    uint16_t *raw = xmalloc(block > 0 ? block : 2);
    for (uint64_t done = 0; done < tensor->bytes; done += block) {
        size_t bytes = tensor->bytes - done < block ? (size_t)(tensor->bytes - done) : block;
        read_exactly(model->descriptors[tensor->file], raw, bytes, tensor->offset + done, path,
                     what);
        float *out = values + done / 2;
        size_t n = bytes / 2;
        if (tensor->dtype == SAFETENSORS_BF16)
            for (size_t i = 0; i < n; i++)
                out[i] = bf16_to_float(raw[i]);
        else
            for (size_t i = 0; i < n; i++)
                out[i] = half_to_float(raw[i]);
    }
    free(raw);
}
