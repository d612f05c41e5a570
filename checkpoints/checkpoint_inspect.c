/* checkpoints/checkpoint_inspect.c — listing a checkpoint's tensors and checking every shard
 * dataset's digest without stopping at the first failure (see checkpoint.h). */
#include "checkpoints/checkpoint_layout.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/h5_tensor.h"
#include "runtime/crc32c.h"
#include "runtime/error.h"

/* "model.layers.2.x" < "model.layers.10.x": digit runs compare as numbers. */
static int natural_compare(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            char *a_end, *b_end;
            unsigned long long x = strtoull(a, &a_end, 10), y = strtoull(b, &b_end, 10);
            if (x != y)
                return x < y ? -1 : 1;
            a = a_end;
            b = b_end;
            continue;
        }
        if (*a != *b)
            return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        a++;
        b++;
    }
    return (unsigned char)*a - (unsigned char)*b;
}

static int compare_infos(const void *a, const void *b)
{
    return natural_compare(((const CheckpointTensorInfo *)a)->name,
                           ((const CheckpointTensorInfo *)b)->name);
}

typedef struct {
    char **names;
    int count, capacity;
} NameList;

#if H5_VERSION_GE(1, 12, 0)
typedef H5L_info2_t LinkInfo;
#define LINK_ITERATE H5Literate2
#else
typedef H5L_info_t LinkInfo;
#define LINK_ITERATE H5Literate
#endif

static herr_t collect_name(hid_t group, const char *name, const LinkInfo *info, void *data)
{
    (void)group;
    (void)info;
    NameList *list = data;
    if (list->count == list->capacity) {
        list->capacity = list->capacity ? 2 * list->capacity : 64;
        list->names = xrealloc(list->names, (size_t)list->capacity * sizeof *list->names);
    }
    list->names[list->count++] = xstrdup(name);
    return 0;
}

static void dtype_describe(hid_t type, char *text, size_t capacity)
{
    size_t size = H5Tget_size(type);
    if (H5Tget_class(type) != H5T_FLOAT)
        snprintf(text, capacity, "non-float");
    else if (size == 2) {
        size_t sign, exponent_position, exponent_size, mantissa_position, mantissa_size;
        H5_CHECK(H5Tget_fields(type, &sign, &exponent_position, &exponent_size,
                               &mantissa_position, &mantissa_size));
        snprintf(text, capacity, exponent_size == 8 ? "bfloat16" : "float16");
    } else {
        snprintf(text, capacity, "float%zu", 8 * size);
    }
}

int checkpoint_tensor_infos(const char *step_dir, int group, CheckpointTensorInfo **infos,
                            const CheckpointCorruption *skip, int n_skip)
{
    char resolved[CHECKPOINT_PATH_MAX], index_path[CHECKPOINT_PATH_MAX];
    checkpoint_resolve_step_dir(step_dir, resolved, sizeof resolved);
    hid_t index = checkpoint_index_open(resolved, index_path, sizeof index_path);
    *infos = NULL;
    const char *group_path = checkpoint_group_path(group);
    if (!h5_path_exists(index, group_path)) {
        H5_CHECK(H5Fclose(index));
        return 0;
    }
    NameList list = {0};
    hid_t group_id = H5_CHECK(H5Gopen2(index, group_path, H5P_DEFAULT));
    H5_CHECK(LINK_ITERATE(group_id, H5_INDEX_NAME, H5_ITER_INC, NULL, collect_name, &list));
    CheckpointTensorInfo *result = xcalloc((size_t)list.count + 1, sizeof *result);
    hid_t access_plist = H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS));
    H5_CHECK(H5Pset_virtual_prefix(access_plist, resolved));
    float *values = NULL;
    size_t capacity = 0;
    for (int i = 0; i < list.count; i++) {
        CheckpointTensorInfo *info = &result[i];
        info->name = list.names[i];
        hid_t dataset = H5_CHECK(H5Dopen2(group_id, info->name, access_plist));
        int64_t shape[H5_TENSOR_RANK_MAX];
        h5_tensor_shape(dataset, index_path, info->name, &info->ndim, shape);
        memcpy(info->shape, shape, sizeof info->shape);
        hid_t type = H5_CHECK(H5Dget_type(dataset));
        dtype_describe(type, info->dtype, sizeof info->dtype);
        H5_CHECK(H5Tclose(type));
        char path[CHECKPOINT_PATH_MAX];
        checkpoint_dataset_path(group, info->name, path, sizeof path);
        bool corrupt = false;
        for (int k = 0; k < n_skip && !corrupt; k++)
            corrupt = !strcmp(skip[k].dataset, path);
        if (corrupt) {
            info->norm = NAN;
            H5_CHECK(H5Dclose(dataset));
            continue;
        }
        size_t elements = (size_t)(shape[0] * shape[1] * shape[2]);
        if (elements > capacity) {
            values = xrealloc(values, elements * sizeof *values);
            capacity = elements;
        }
        h5_tensor_read_rows(dataset, 0, shape[0], values);
        double sum = 0;
        for (size_t e = 0; e < elements; e++)
            sum += (double)values[e] * values[e];
        info->norm = sqrt(sum);
        H5_CHECK(H5Dclose(dataset));
    }
    free(values);
    free(list.names);
    H5_CHECK(H5Pclose(access_plist));
    H5_CHECK(H5Gclose(group_id));
    H5_CHECK(H5Fclose(index));
    qsort(result, (size_t)list.count, sizeof *result, compare_infos);
    *infos = result;
    return list.count;
}

void checkpoint_tensor_infos_free(CheckpointTensorInfo *infos, int count)
{
    for (int i = 0; i < count; i++)
        free(infos[i].name);
    free(infos);
}

/* The CRC32C of one shard dataset, or a problem. HDF5 calls are checked here, not through
 * H5_CHECK: a corrupt file is a finding to report, not the end of the inspection. */
static bool dataset_check(const char *step_dir, const CheckpointDigest *digest, char *problem,
                          size_t capacity)
{
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(path, sizeof path, step_dir, digest->shard);
    if (!checkpoint_path_exists(path)) {
        snprintf(problem, capacity, "the shard file is missing");
        return false;
    }
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        snprintf(problem, capacity, "the shard file cannot be opened as HDF5");
        return false;
    }
    bool ok = false;
    /* H5Dopen2 itself, not h5_path_exists: a missing or damaged link is a finding here */
    hid_t dataset = H5Dopen2(file, digest->dataset, H5P_DEFAULT);
    hid_t space = dataset >= 0 ? H5Dget_space(dataset) : -1;
    hssize_t elements = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    hsize_t dims[H5S_MAX_RANK] = {0};
    if (dataset < 0) {
        snprintf(problem, capacity, "the shard holds no readable dataset of that name");
    } else if (elements < 0 || H5Sget_simple_extent_dims(space, dims, NULL) < 1 ||
               (int64_t)dims[0] != digest->row_end - digest->row_begin) {
        snprintf(problem, capacity, "the dataset does not hold the %lld rows the index records",
                 (long long)(digest->row_end - digest->row_begin));
    } else {
        float *values = xmalloc((size_t)(elements > 0 ? elements : 1) * sizeof *values);
        if (elements > 0 &&
            H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0) {
            snprintf(problem, capacity, "its data cannot be read");
        } else {
            uint32_t crc = crc32c(values, (size_t)elements * sizeof(float));
            ok = crc == digest->crc32c;
            if (!ok)
                snprintf(problem, capacity, "CRC32C recorded %08x, read %08x",
                         (unsigned)digest->crc32c, (unsigned)crc);
        }
        free(values);
    }
    if (space >= 0)
        H5Sclose(space);
    if (dataset >= 0)
        H5Dclose(dataset);
    H5Fclose(file);
    return ok;
}

int checkpoint_verify_all(const char *step_dir, CheckpointCorruption **bad, int *n_bad)
{
    char resolved[CHECKPOINT_PATH_MAX], index_path[CHECKPOINT_PATH_MAX];
    checkpoint_resolve_step_dir(step_dir, resolved, sizeof resolved);
    hid_t index = checkpoint_index_open(resolved, index_path, sizeof index_path);
    CheckpointDigest *digests;
    int count = checkpoint_digests_read(index, index_path, &digests);
    H5_CHECK(H5Fclose(index));
    h5_quiet();
    *bad = xcalloc((size_t)count + 1, sizeof **bad);
    *n_bad = 0;
    for (int d = 0; d < count; d++) {
        CheckpointCorruption *entry = &(*bad)[*n_bad];
        if (dataset_check(resolved, &digests[d], entry->problem, sizeof entry->problem))
            continue;
        entry->shard = xstrdup(digests[d].shard);
        entry->dataset = xstrdup(digests[d].dataset);
        (*n_bad)++;
    }
    checkpoint_digests_free(digests, count);
    return count;
}

void checkpoint_corruptions_free(CheckpointCorruption *bad, int n_bad)
{
    for (int i = 0; i < n_bad; i++) {
        free(bad[i].shard);
        free(bad[i].dataset);
    }
    free(bad);
}
