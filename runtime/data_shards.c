/* runtime/data_shards.c — the concatenated token stream of HDF5 shards (DESIGN 4).
 *
 * A shard holds a 1-D unsigned 32-bit dataset /tokens and, on its root group, the integer
 * attributes vocab_size and eot_id (and the tokenizer's name, which is not read here).
 * Opening checks every file once and keeps only its path and length; reading opens the
 * file that holds the range (keeping the last one open, since consecutive reads mostly hit
 * the same shard) and reads a hyperslab, so a multi-GB shard is never loaded whole.
 *
 * Failures that are a property of the file (cannot open, no /tokens, cannot read) are
 * checked here explicitly so the message names the shard; every other HDF5 call goes
 * through H5_CHECK.
 */
#include "runtime/data.h"

#include "runtime/error.h"

#include <dirent.h>
#include <glob.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char *path;
    uint64_t first_token; /* offset of its first token in the concatenated stream */
    uint64_t token_count;
} ShardFile;

struct ShardStream {
    ShardFile *files; /* only files holding at least one token, in path order */
    int file_count;
    uint64_t token_count;
    uint32_t eot_id;
    int64_t vocab_size;   /* the largest vocab_size attribute of the files */
    int model_vocab_size;
    hid_t access;     /* file access properties: read-only shards need no file locks */
    int open_index;   /* the file kept open between reads, -1 if none */
    hid_t open_file, open_dataset;
};

static int compare_paths(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_regular_file(const char *path)
{
    struct stat info;
    return stat(path, &info) == 0 && S_ISREG(info.st_mode);
}

static int has_suffix(const char *name, const char *suffix)
{
    size_t length = strlen(name), suffix_length = strlen(suffix);
    return length > suffix_length && !strcmp(name + length - suffix_length, suffix);
}

static void list_append(char ***paths, int *count, int *capacity, char *path)
{
    if (*count == *capacity) {
        *capacity = *capacity ? 2 * *capacity : 16;
        *paths = xrealloc(*paths, (size_t)*capacity * sizeof **paths);
    }
    (*paths)[(*count)++] = path;
}

static char **list_directory(const char *spec, const char *key, int *count)
{
    DIR *directory = opendir(spec);
    if (!directory)
        fatal(EXIT_DATA, "%s: cannot read directory %s", key, spec);
    char **paths = NULL;
    int capacity = 0;
    size_t spec_length = strlen(spec);
    int needs_slash = spec_length > 0 && spec[spec_length - 1] != '/';
    for (struct dirent *entry; (entry = readdir(directory));) {
        if (!has_suffix(entry->d_name, ".h5"))
            continue;
        char *path = xmalloc(spec_length + strlen(entry->d_name) + 2);
        sprintf(path, "%s%s%s", spec, needs_slash ? "/" : "", entry->d_name);
        if (is_regular_file(path))
            list_append(&paths, count, &capacity, path);
        else
            free(path);
    }
    closedir(directory);
    if (*count == 0)
        fatal(EXIT_DATA, "%s: no *.h5 files in directory %s", key, spec);
    return paths;
}

static char **list_glob(const char *spec, const char *key, int *count)
{
    glob_t matches;
    int status = glob(spec, 0, NULL, &matches);
    if (status == GLOB_NOMATCH)
        fatal(EXIT_DATA, "%s: no files match '%s'", key, spec);
    if (status != 0)
        fatal(EXIT_DATA, "%s: cannot expand '%s' (read error or out of memory)", key, spec);
    char **paths = NULL;
    int capacity = 0;
    for (size_t i = 0; i < matches.gl_pathc; i++)
        if (is_regular_file(matches.gl_pathv[i]))
            list_append(&paths, count, &capacity, xstrdup(matches.gl_pathv[i]));
    globfree(&matches);
    if (*count == 0)
        fatal(EXIT_DATA, "%s: no files match '%s'", key, spec);
    return paths;
}

/* The files of `spec`, sorted by path (byte order, whatever the locale). */
static char **list_shard_paths(const char *spec, const char *key, int *count)
{
    char **paths;
    struct stat info;
    *count = 0;
    if (strpbrk(spec, "*?[")) {
        paths = list_glob(spec, key, count);
    } else if (stat(spec, &info) != 0) {
        fatal(EXIT_DATA, "%s: shard file or directory %s does not exist", key, spec);
    } else if (S_ISDIR(info.st_mode)) {
        paths = list_directory(spec, key, count);
    } else {
        paths = xmalloc(sizeof *paths);
        paths[0] = xstrdup(spec);
        *count = 1;
    }
    qsort(paths, (size_t)*count, sizeof *paths, compare_paths);
    return paths;
}

static hid_t shard_open_file(const ShardStream *stream, const char *path)
{
    if (!is_regular_file(path))
        fatal(EXIT_DATA, "shard %s does not exist", path);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, stream->access);
    if (file < 0)
        fatal(EXIT_DATA, "cannot open shard %s: not an HDF5 file or truncated", path);
    return file;
}

static hid_t shard_open_tokens(hid_t file, const char *path)
{
    if (H5_CHECK(H5Lexists(file, "tokens", H5P_DEFAULT)) <= 0)
        fatal(EXIT_DATA, "shard %s has no /tokens dataset", path);
    hid_t dataset = H5Dopen2(file, "tokens", H5P_DEFAULT);
    if (dataset < 0)
        fatal(EXIT_DATA, "/tokens in shard %s is not a dataset", path);
    return dataset;
}

static int64_t shard_read_integer_attribute(hid_t file, const char *name, const char *path)
{
    if (H5_CHECK(H5Aexists(file, name)) <= 0)
        fatal(EXIT_DATA, "shard %s has no %s attribute", path, name);
    hid_t attribute = (hid_t)H5_CHECK(H5Aopen(file, name, H5P_DEFAULT));
    hid_t type = (hid_t)H5_CHECK(H5Aget_type(attribute));
    hid_t space = (hid_t)H5_CHECK(H5Aget_space(attribute));
    int is_integer = H5_CHECK(H5Tget_class(type)) == H5T_INTEGER;
    int64_t elements = H5_CHECK(H5Sget_simple_extent_npoints(space));
    if (!is_integer || elements != 1)
        fatal(EXIT_DATA, "the %s attribute of shard %s is not one integer", name, path);
    int64_t value = 0;
    if (H5Aread(attribute, H5T_NATIVE_INT64, &value) < 0)
        fatal(EXIT_DATA, "cannot read the %s attribute of shard %s", name, path);
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Tclose(type));
    H5_CHECK(H5Aclose(attribute));
    return value;
}

static void shard_check_token_type(hid_t dataset, const char *path)
{
    hid_t type = (hid_t)H5_CHECK(H5Dget_type(dataset));
    int is_uint32 = H5_CHECK(H5Tget_class(type)) == H5T_INTEGER &&
                    H5_CHECK(H5Tget_size(type)) == 4 &&
                    H5_CHECK(H5Tget_sign(type)) == H5T_SGN_NONE;
    H5_CHECK(H5Tclose(type));
    if (!is_uint32)
        fatal(EXIT_DATA, "/tokens in shard %s is not an unsigned 32-bit integer dataset", path);
}

static uint64_t shard_token_length(hid_t dataset, const char *path)
{
    hid_t space = (hid_t)H5_CHECK(H5Dget_space(dataset));
    int rank = (int)H5_CHECK(H5Sget_simple_extent_ndims(space));
    if (rank != 1)
        fatal(EXIT_DATA, "/tokens in shard %s has %d dimensions; it must be 1-D", path, rank);
    hsize_t length = 0;
    H5_CHECK(H5Sget_simple_extent_dims(space, &length, NULL));
    H5_CHECK(H5Sclose(space));
    return (uint64_t)length;
}

/* Checks one shard against DESIGN 4 and the model; returns its token count. */
static uint64_t shard_inspect(ShardStream *stream, const char *path, int64_t *eot_id)
{
    hid_t file = shard_open_file(stream, path);
    hid_t dataset = shard_open_tokens(file, path);
    uint64_t length = shard_token_length(dataset, path);
    shard_check_token_type(dataset, path);
    int64_t vocab_size = shard_read_integer_attribute(file, "vocab_size", path);
    *eot_id = shard_read_integer_attribute(file, "eot_id", path);
    if (vocab_size > stream->model_vocab_size)
        fatal(EXIT_DATA, "vocab mismatch: shard %s has vocab_size %lld but model.vocab_size is "
              "%d (a shard may use fewer ids than the model, not more)",
              path, (long long)vocab_size, stream->model_vocab_size);
    if (*eot_id < 0 || *eot_id >= vocab_size)
        fatal(EXIT_DATA, "shard %s has eot_id %lld outside its vocab_size %lld", path,
              (long long)*eot_id, (long long)vocab_size);
    if (vocab_size > stream->vocab_size)
        stream->vocab_size = vocab_size;
    H5_CHECK(H5Dclose(dataset));
    H5_CHECK(H5Fclose(file));
    return length;
}

static hid_t shard_access_properties(void)
{
    hid_t access = (hid_t)H5_CHECK(H5Pcreate(H5P_FILE_ACCESS));
#if H5_VERSION_GE(1, 10, 7)
    /* Shards are read-only and read by every rank at once; POSIX locks only fail on
     * filesystems that lack them (NFS, Lustre) and protect nothing here. */
    H5_CHECK(H5Pset_file_locking(access, 0, 1));
#endif
    return access;
}

ShardStream *shards_open(const char *spec, const char *key, int model_vocab_size)
{
    h5_quiet();
    ShardStream *stream = xcalloc(1, sizeof *stream);
    stream->model_vocab_size = model_vocab_size;
    stream->access = shard_access_properties();
    stream->open_index = -1;
    int path_count = 0;
    char **paths = list_shard_paths(spec, key, &path_count);
    stream->files = xcalloc((size_t)path_count, sizeof *stream->files);
    const char *eot_source = NULL;
    for (int i = 0; i < path_count; i++) {
        int64_t eot_id = 0;
        uint64_t length = shard_inspect(stream, paths[i], &eot_id);
        if (!eot_source) {
            stream->eot_id = (uint32_t)eot_id;
            eot_source = paths[i];
        } else if ((uint32_t)eot_id != stream->eot_id) {
            fatal(EXIT_DATA, "shard %s has eot_id %lld but shard %s has %u: the shards of %s "
                  "come from different tokenizers", paths[i], (long long)eot_id, eot_source,
                  stream->eot_id, key);
        }
        if (length == 0) {
            free(paths[i]);
            continue;
        }
        ShardFile *file = &stream->files[stream->file_count++];
        file->path = paths[i];
        file->first_token = stream->token_count;
        file->token_count = length;
        stream->token_count += length;
    }
    free(paths);
    return stream;
}

static void shard_close_open_file(ShardStream *stream)
{
    if (stream->open_index < 0)
        return;
    H5_CHECK(H5Dclose(stream->open_dataset));
    H5_CHECK(H5Fclose(stream->open_file));
    stream->open_index = -1;
}

void shards_close(ShardStream *stream)
{
    if (!stream)
        return;
    shard_close_open_file(stream);
    H5_CHECK(H5Pclose(stream->access));
    for (int i = 0; i < stream->file_count; i++)
        free(stream->files[i].path);
    free(stream->files);
    free(stream);
}

uint64_t shards_token_count(const ShardStream *stream) { return stream->token_count; }
uint32_t shards_eot_id(const ShardStream *stream) { return stream->eot_id; }
int64_t shards_vocab_size(const ShardStream *stream) { return stream->vocab_size; }
int shards_file_count(const ShardStream *stream) { return stream->file_count; }
const char *shards_file_path(const ShardStream *stream, int file)
{
    return stream->files[file].path;
}

/* The file holding stream token `position` (< token_count): the last one starting at or
 * before it. */
static int shard_find_file(const ShardStream *stream, uint64_t position)
{
    int low = 0, high = stream->file_count - 1;
    while (low < high) {
        int middle = low + (high - low + 1) / 2;
        if (stream->files[middle].first_token <= position)
            low = middle;
        else
            high = middle - 1;
    }
    return low;
}

static void shard_read_range(ShardStream *stream, int index, uint64_t offset, uint64_t count,
                             uint32_t *tokens)
{
    const char *path = stream->files[index].path;
    if (stream->open_index != index) {
        shard_close_open_file(stream);
        stream->open_file = shard_open_file(stream, path);
        stream->open_dataset = shard_open_tokens(stream->open_file, path);
        stream->open_index = index;
    }
    hsize_t start = offset, length = count;
    hid_t file_space = (hid_t)H5_CHECK(H5Dget_space(stream->open_dataset));
    H5_CHECK(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &start, NULL, &length, NULL));
    hid_t memory_space = (hid_t)H5_CHECK(H5Screate_simple(1, &length, NULL));
    if (H5Dread(stream->open_dataset, H5T_NATIVE_UINT32, memory_space, file_space,
                H5P_DEFAULT, tokens) < 0)
        fatal(EXIT_DATA, "cannot read tokens [%llu, %llu) of shard %s: the file is damaged",
              (unsigned long long)offset, (unsigned long long)(offset + count), path);
    H5_CHECK(H5Sclose(memory_space));
    H5_CHECK(H5Sclose(file_space));
    for (uint64_t i = 0; i < count; i++)
        if (tokens[i] >= (uint32_t)stream->model_vocab_size)
            fatal(EXIT_DATA, "shard %s: token id %u at position %llu is >= model.vocab_size "
                  "= %d", path, tokens[i], (unsigned long long)(offset + i),
                  stream->model_vocab_size);
}

void shards_read(ShardStream *stream, uint64_t first, uint64_t count, uint32_t *tokens)
{
    if (first + count > stream->token_count || first + count < first)
        fatal(EXIT_DATA, "token range [%llu, %llu) is beyond the %llu tokens of the shards",
              (unsigned long long)first, (unsigned long long)(first + count),
              (unsigned long long)stream->token_count);
    while (count > 0) {
        int index = shard_find_file(stream, first);
        const ShardFile *file = &stream->files[index];
        uint64_t offset = first - file->first_token;
        uint64_t available = file->token_count - offset;
        uint64_t chunk = count < available ? count : available;
        shard_read_range(stream, index, offset, chunk, tokens);
        first += chunk;
        count -= chunk;
        tokens += chunk;
    }
}
