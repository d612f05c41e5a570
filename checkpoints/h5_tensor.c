/* checkpoints/h5_tensor.c — HDF5 tensors, bf16 and attributes. See h5_tensor.h. */
#include "checkpoints/h5_tensor.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/error.h"

hid_t h5_bf16_type_create(void)
{
    /* DESIGN 5: derived from IEEE fp32 by moving the fields, never a size-2 opaque blob, so
     * every HDF5 reader can convert it. The fields must fit the precision before the size
     * shrinks, hence the order: fields, offset, precision, size, bias. */
    hid_t type = H5_CHECK(H5Tcopy(H5T_IEEE_F32LE));
    /* sign at bit 15, exponent bits 7..14, mantissa bits 0..6 */
    H5_CHECK(H5Tset_fields(type, 15, 7, 8, 0, 7));
    H5_CHECK(H5Tset_offset(type, 0));
    H5_CHECK(H5Tset_precision(type, 16));
    H5_CHECK(H5Tset_size(type, 2));
    H5_CHECK(H5Tset_ebias(type, 127)); /* fp32's bias already; stated, not inherited */
    return type;
}

hid_t h5_file_create(const char *path)
{
    h5_quiet();
    /* the HDF5 1.8 file format and later: its superblock, object headers and indexes carry
     * checksums, so damaged metadata fails a read instead of being believed */
    hid_t access_plist = H5_CHECK(H5Pcreate(H5P_FILE_ACCESS));
    H5_CHECK(H5Pset_libver_bounds(access_plist, H5F_LIBVER_V18, H5F_LIBVER_LATEST));
    hid_t file = H5_CHECK(H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, access_plist));
    H5_CHECK(H5Pclose(access_plist));
    return file;
}

hid_t h5_file_open_readonly(const char *path)
{
    h5_quiet();
    if (access(path, R_OK) != 0)
        fatal(EXIT_DATA, "cannot read %s: %s", path, strerror(errno));
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        /* a truncated shard, an empty file or one that is not HDF5 at all: name the file,
         * since the user has many and the HDF5 call alone does not say which */
        char message[256];
        h5_error_message(message);
        fatal(EXIT_DATA, "checkpoint file %s is damaged, truncated or not HDF5: %s", path,
              message);
    }
    return file;
}

int h5_path_exists(hid_t location, const char *path)
{
    char *prefix = xstrdup(path);
    int exists = 1;
    for (char *slash = prefix + 1; exists; slash++) {
        bool end = *slash == '\0';
        if (*slash != '/' && !end)
            continue;
        *slash = '\0';
        exists = H5_CHECK(H5Lexists(location, prefix, H5P_DEFAULT)) > 0;
        if (end)
            break;
        *slash = '/';
    }
    free(prefix);
    return exists;
}

void h5_tensor_write(hid_t location, const char *path, int ndim, const int64_t *shape,
                     hid_t file_type, const float *values)
{
    if (ndim < 1 || ndim > H5_TENSOR_RANK_MAX)
        fatal(EXIT_DATA, "cannot write %s: rank %d; tensors have rank 1 to %d", path, ndim,
              H5_TENSOR_RANK_MAX);
    hsize_t dims[H5_TENSOR_RANK_MAX];
    for (int axis = 0; axis < ndim; axis++)
        dims[axis] = (hsize_t)shape[axis];
    hid_t space = H5_CHECK(H5Screate_simple(ndim, dims, NULL));
    hid_t link_plist = H5_CHECK(H5Pcreate(H5P_LINK_CREATE));
    H5_CHECK(H5Pset_create_intermediate_group(link_plist, 1));
    hid_t dataset = H5_CHECK(H5Dcreate2(location, path, file_type, space, link_plist,
                                        H5P_DEFAULT, H5P_DEFAULT));
    H5_CHECK(H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values));
    H5_CHECK(H5Dclose(dataset));
    H5_CHECK(H5Pclose(link_plist));
    H5_CHECK(H5Sclose(space));
}

void h5_tensor_shape(hid_t dataset, const char *where, const char *path, int *ndim,
                     int64_t shape[H5_TENSOR_RANK_MAX])
{
    hid_t space = H5_CHECK(H5Dget_space(dataset));
    int rank = (int)H5_CHECK(H5Sget_simple_extent_ndims(space));
    if (rank < 1 || rank > H5_TENSOR_RANK_MAX)
        fatal(EXIT_DATA, "%s: dataset %s has rank %d; tensors have rank 1 to %d", where, path,
              rank, H5_TENSOR_RANK_MAX);
    hsize_t dims[H5_TENSOR_RANK_MAX] = {0, 1, 1};
    H5_CHECK(H5Sget_simple_extent_dims(space, dims, NULL));
    H5_CHECK(H5Sclose(space));
    *ndim = rank;
    for (int axis = 0; axis < H5_TENSOR_RANK_MAX; axis++)
        shape[axis] = (int64_t)dims[axis];
}

void h5_tensor_read_rows(hid_t dataset, int64_t row_begin, int64_t row_end, float *values)
{
    hid_t file_space = H5_CHECK(H5Dget_space(dataset));
    int rank = (int)H5_CHECK(H5Sget_simple_extent_ndims(file_space));
    if (rank < 1 || rank > H5_TENSOR_RANK_MAX)
        fatal(EXIT_DATA, "cannot read rows of a dataset of rank %d; tensors have rank 1 to %d",
              rank, H5_TENSOR_RANK_MAX);
    hsize_t dims[H5_TENSOR_RANK_MAX] = {0, 1, 1};
    H5_CHECK(H5Sget_simple_extent_dims(file_space, dims, NULL));
    /* whole rows: the first dim is cut, every other dim is taken entire */
    hsize_t start[H5_TENSOR_RANK_MAX] = {(hsize_t)row_begin, 0, 0};
    hsize_t count[H5_TENSOR_RANK_MAX] = {(hsize_t)(row_end - row_begin), dims[1], dims[2]};
    H5_CHECK(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, count, NULL));
    hid_t memory_space = H5_CHECK(H5Screate_simple(rank, count, NULL));
    H5_CHECK(H5Dread(dataset, H5T_NATIVE_FLOAT, memory_space, file_space, H5P_DEFAULT,
                     values));
    H5_CHECK(H5Sclose(memory_space));
    H5_CHECK(H5Sclose(file_space));
}

/* Creates attribute `name` of `type` over `space`, first deleting one of that name. */
static hid_t attribute_create(hid_t object, const char *name, hid_t type, hid_t space)
{
    if (H5_CHECK(H5Aexists(object, name)) > 0)
        H5_CHECK(H5Adelete(object, name));
    return H5_CHECK(H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT));
}

void h5_attribute_write_text(hid_t object, const char *name, const char *text)
{
    hid_t type = H5_CHECK(H5Tcopy(H5T_C_S1));
    H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
    hid_t space = H5_CHECK(H5Screate(H5S_SCALAR));
    hid_t attribute = attribute_create(object, name, type, space);
    H5_CHECK(H5Awrite(attribute, type, &text));
    H5_CHECK(H5Aclose(attribute));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Tclose(type));
}

static void attribute_write_scalar(hid_t object, const char *name, hid_t file_type,
                                   hid_t memory_type, const void *value)
{
    hid_t space = H5_CHECK(H5Screate(H5S_SCALAR));
    hid_t attribute = attribute_create(object, name, file_type, space);
    H5_CHECK(H5Awrite(attribute, memory_type, value));
    H5_CHECK(H5Aclose(attribute));
    H5_CHECK(H5Sclose(space));
}

void h5_attribute_write_int64(hid_t object, const char *name, int64_t value)
{
    attribute_write_scalar(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void h5_attribute_write_uint64(hid_t object, const char *name, uint64_t value)
{
    attribute_write_scalar(object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

void h5_attribute_write_ints(hid_t object, const char *name, const int *values, int count)
{
    hsize_t dims[1] = {(hsize_t)count};
    /* an empty list is a null dataspace: h5py shows it as Empty, readers count 0 */
    hid_t space = count > 0 ? H5_CHECK(H5Screate_simple(1, dims, NULL))
                            : H5_CHECK(H5Screate(H5S_NULL));
    hid_t attribute = attribute_create(object, name, H5T_STD_I32LE, space);
    if (count > 0)
        H5_CHECK(H5Awrite(attribute, H5T_NATIVE_INT, values));
    H5_CHECK(H5Aclose(attribute));
    H5_CHECK(H5Sclose(space));
}

int h5_attribute_exists(hid_t object, const char *name)
{
    return H5_CHECK(H5Aexists(object, name)) > 0;
}

/* Opens attribute `name`, checking it exists and its type class is `expected`. */
static hid_t attribute_open(hid_t object, const char *name, H5T_class_t expected,
                            const char *where)
{
    if (!h5_attribute_exists(object, name))
        fatal(EXIT_DATA, "%s: attribute `%s` is missing", where, name);
    hid_t attribute = H5_CHECK(H5Aopen(object, name, H5P_DEFAULT));
    hid_t type = H5_CHECK(H5Aget_type(attribute));
    H5T_class_t found = H5Tget_class(type);
    H5_CHECK(H5Tclose(type));
    if (found != expected)
        fatal(EXIT_DATA, "%s: attribute `%s` is a %s, expected a %s", where, name,
              found == H5T_STRING ? "string" : "number",
              expected == H5T_STRING ? "string" : "number");
    return attribute;
}

char *h5_attribute_read_text(hid_t object, const char *name, const char *where)
{
    hid_t attribute = attribute_open(object, name, H5T_STRING, where);
    hid_t file_type = H5_CHECK(H5Aget_type(attribute));
    char *text;
    if (H5_CHECK(H5Tis_variable_str(file_type)) > 0) {
        hid_t type = H5_CHECK(H5Tcopy(H5T_C_S1));
        H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
        H5_CHECK(H5Tset_cset(type, H5Tget_cset(file_type)));
        char *library_text = NULL;
        H5_CHECK(H5Aread(attribute, type, &library_text));
        text = xstrdup(library_text ? library_text : "");
        H5_CHECK(H5free_memory(library_text));
        H5_CHECK(H5Tclose(type));
    } else {
        size_t size = H5Tget_size(file_type);
        text = xcalloc(size + 1, 1); /* fixed-length strings need not be NUL-terminated */
        H5_CHECK(H5Aread(attribute, file_type, text));
    }
    H5_CHECK(H5Tclose(file_type));
    H5_CHECK(H5Aclose(attribute));
    return text;
}

int64_t h5_attribute_read_int64(hid_t object, const char *name, const char *where)
{
    hid_t attribute = attribute_open(object, name, H5T_INTEGER, where);
    int64_t value = 0;
    H5_CHECK(H5Aread(attribute, H5T_NATIVE_INT64, &value));
    H5_CHECK(H5Aclose(attribute));
    return value;
}

uint64_t h5_attribute_read_uint64(hid_t object, const char *name, const char *where)
{
    hid_t attribute = attribute_open(object, name, H5T_INTEGER, where);
    uint64_t value = 0;
    H5_CHECK(H5Aread(attribute, H5T_NATIVE_UINT64, &value));
    H5_CHECK(H5Aclose(attribute));
    return value;
}

int h5_attribute_read_ints(hid_t object, const char *name, int *values, int capacity,
                           const char *where)
{
    hid_t attribute = attribute_open(object, name, H5T_INTEGER, where);
    hid_t space = H5_CHECK(H5Aget_space(attribute));
    hssize_t count = H5_CHECK(H5Sget_simple_extent_npoints(space));
    if (count > capacity)
        fatal(EXIT_DATA, "%s: attribute `%s` has %lld values, at most %d are supported", where,
              name, (long long)count, capacity);
    if (count > 0)
        H5_CHECK(H5Aread(attribute, H5T_NATIVE_INT, values));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Aclose(attribute));
    return (int)count;
}
