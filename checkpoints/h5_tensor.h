/* checkpoints/h5_tensor.h — HDF5 building blocks: float tensors, the bf16 type, attributes.
 *
 * A tensor is a row-major fp32 array of rank 1..3 in memory ([rows], [rows, cols] or
 * [rows, a, b]; its rows are shape[0], the rest is one row). On disk it is a contiguous
 * dataset of the same rank and dims, without filters (so its bytes sit at one file offset,
 * DESIGN 5), of H5T_IEEE_F32LE or the bf16 type below; HDF5 converts between memory and
 * file types.
 * Integers are stored little-endian (I64LE, U64LE, I32LE), text as variable-length UTF-8
 * strings (h5py reads them as `str`).
 *
 * Every HDF5 call is checked (H5_CHECK: exit 3 with file:line). `where` names the file in
 * the messages of the readers, which exit 3 when an attribute is missing or has the wrong
 * class. Returned hid_t are the caller's to close; returned strings are malloc'd (free()).
 */
#ifndef FATHOM_CHECKPOINTS_H5_TENSOR_H
#define FATHOM_CHECKPOINTS_H5_TENSOR_H

#include <hdf5.h>
#include <stdint.h>

/* The highest tensor rank: [m, k_max, d], the MSAR stream convolutions (DESIGN 2.3). */
#define H5_TENSOR_RANK_MAX 3

/* bfloat16 as an HDF5 float type: 1 sign, 8 exponent (bias 127), 7 mantissa bits, 2 bytes
 * little-endian: the top half of an IEEE fp32. h5py and h5dump read it; HDF5 converts it to
 * and from fp32 (rounding on the way down). Close with H5Tclose. */
hid_t h5_bf16_type_create(void);

/* Creates (truncating) or opens read-only an HDF5 file; a missing file exits 3 naming it. */
hid_t h5_file_create(const char *path);
hid_t h5_file_open_readonly(const char *path);

/* Whether every link along `path` ("/a/b/c") exists; H5Lexists alone fails on a missing
 * intermediate group. */
int h5_path_exists(hid_t location, const char *path);

/* Creates dataset `path` (intermediate groups too) of `file_type` and shape[0..ndim-1]
 * (ndim 1..3; only those entries are read) and writes `values`, which hold the whole
 * [shape] array in fp32. */
void h5_tensor_write(hid_t location, const char *path, int ndim, const int64_t *shape,
                     hid_t file_type, const float *values);
/* The dataset's rank (1..3) and dims; another rank exits 3 naming `where` and `path`.
 * shape[ndim..2] = 1, so shape[0] * shape[1] * shape[2] is always the element count. */
void h5_tensor_shape(hid_t dataset, const char *where, const char *path, int *ndim,
                     int64_t shape[H5_TENSOR_RANK_MAX]);
/* Reads rows [row_begin, row_end) (along the first dim) of a dataset of rank 1..3 as fp32
 * into `values`: (row_end - row_begin) * (elements of one row) floats. */
void h5_tensor_read_rows(hid_t dataset, int64_t row_begin, int64_t row_end, float *values);

/* Attributes on a file, group or dataset (replaced if present). */
void h5_attribute_write_text(hid_t object, const char *name, const char *text);
void h5_attribute_write_int64(hid_t object, const char *name, int64_t value);
void h5_attribute_write_uint64(hid_t object, const char *name, uint64_t value);
void h5_attribute_write_ints(hid_t object, const char *name, const int *values, int count);

int h5_attribute_exists(hid_t object, const char *name);
/* Variable- or fixed-length string attribute, malloc'd and NUL-terminated. */
char *h5_attribute_read_text(hid_t object, const char *name, const char *where);
int64_t h5_attribute_read_int64(hid_t object, const char *name, const char *where);
uint64_t h5_attribute_read_uint64(hid_t object, const char *name, const char *where);
/* A 1-D (or scalar) integer attribute into values[0..capacity-1]; returns the count; more
 * than `capacity` elements exits 3. */
int h5_attribute_read_ints(hid_t object, const char *name, int *values, int capacity,
                           const char *where);

#endif
