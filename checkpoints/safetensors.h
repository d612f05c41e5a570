/* checkpoints/safetensors.h — reading Hugging Face safetensors, tensor by tensor (DESIGN 5).
 *
 * A .safetensors file is: an 8-byte little-endian header length N, N bytes of JSON (one
 * object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" object of strings), then the byte buffer; a tensor's bytes are
 * buffer[begin, end), row-major, little-endian. A model directory holds either one
 * `model.safetensors` or `model.safetensors.index.json`, whose "weight_map" names the file of
 * every tensor (files named relative to the directory, without '/').
 *
 * safetensors_open reads every header (never the data) and checks it: the header length
 * fits the file, the JSON parses, each entry has a known dtype, a shape of non-negative
 * integers, and data_offsets inside the byte buffer whose length is exactly the shape's
 * elements times the dtype's size; each tensor of the weight_map is in its file. Any
 * violation exits 3 through fatal() naming the file and the tensor. The files stay open;
 * safetensors_read reads one tensor with pread in blocks and converts bf16 / fp16 / fp32 to
 * fp32 (other dtypes exit 3 naming the tensor), so host memory is the caller's one tensor
 * plus SAFETENSORS_BLOCK_BYTES.
 */
#ifndef FATHOM_CHECKPOINTS_SAFETENSORS_H
#define FATHOM_CHECKPOINTS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_RANK_MAX 8
#define SAFETENSORS_HEADER_MAX ((uint64_t)100 << 20) /* the format's own limit, 100 MB */
#define SAFETENSORS_BLOCK_BYTES ((size_t)16 << 20)
#define SAFETENSORS_SINGLE_FILE "model.safetensors"
#define SAFETENSORS_INDEX_FILE "model.safetensors.index.json"

typedef enum {
    SAFETENSORS_F32, SAFETENSORS_F16, SAFETENSORS_BF16, /* the dtypes fathom converts */
    SAFETENSORS_OTHER                                   /* valid in the format, not read here */
} SafetensorsDtype;

typedef struct {
    char *name;
    char dtype_name[16];       /* as the header spells it: "BF16", "F32", "I64", ... */
    SafetensorsDtype dtype;
    int ndim;                  /* 0 (a scalar) .. SAFETENSORS_RANK_MAX */
    int64_t shape[SAFETENSORS_RANK_MAX];
    int64_t elements;
    uint64_t offset, bytes;    /* absolute position of its bytes in its file, and their count */
    int file;                  /* index into SafetensorsModel.paths */
} SafetensorsTensor;

typedef struct {
    int n_files;
    char **paths;              /* each file's path */
    int *descriptors;
    int n_tensors;
    SafetensorsTensor *tensors; /* sorted by name */
    uint64_t total_bytes;      /* the tensors' bytes over all files */
} SafetensorsModel;

/* Opens DIR/model.safetensors.index.json if it exists, else DIR/model.safetensors. */
void safetensors_open(SafetensorsModel *model, const char *dir);
/* Opens one .safetensors file (the tests drive headers through this). */
void safetensors_open_file(SafetensorsModel *model, const char *path);
void safetensors_close(SafetensorsModel *model);

/* The tensor called `name`, or NULL. */
const SafetensorsTensor *safetensors_find(const SafetensorsModel *model, const char *name);
/* Reads `tensor` as fp32 into values[tensor->elements]. */
void safetensors_read(const SafetensorsModel *model, const SafetensorsTensor *tensor,
                      float *values);

/* IEEE half and bfloat16 to fp32, exactly (subnormals, infinities and NaN included). */
float safetensors_half_to_float(uint16_t half);
float safetensors_bf16_to_float(uint16_t bf16);

#endif
