/* runtime/matmul_table.h — the matrix products' algorithms, chosen ahead of a run.
 *
 * cuBLASLt's heuristic picks one algorithm for each product shape; for some of the shapes a
 * training step runs, another of its candidates is faster (docs/performance.md, "cuBLASLt's
 * other candidates"). Timing the candidates when a run starts would let the machine's mood
 * pick, and the bits of a run would change from one launch to the next (a resumed run would
 * not continue bit for bit). So the choice is made once, by `fathom tune`, and written to a
 * file that a run names (`matmul_algorithms`): the same file gives the same algorithms, and
 * so the same bits, in every run and resume that names it.
 *
 * The file is text, one product a line, keyed as kernels/cuda/matmul_cuda.cu keys its plans:
 *
 *   fathom-matmul-algorithms 1
 *   cublaslt 130100                 cublasLtGetVersion() of the tuning run
 *   workspace 33554432              the workspace its algorithms were allowed
 *   device 132 NVIDIA H200          multiprocessors, then the device's name
 *   # product rows in out align_a align_b align_c calls heuristic_ms tuned_ms algorithm
 *   weight_gradient 4096 4096 14336 256 256 256 8 0.72500 0.62800 0000000000000015 ...
 *
 * product: forward | input_gradient | weight_gradient (matmul_cuda.cu's three products);
 * align_*: the largest power of two (<= 256) dividing each operand's address; calls: how
 * often the tuned step ran the product; the two times are the medians `fathom tune`
 * measured; algorithm: the 8 words of cublasLtMatmulAlgo_t in hex, which its header calls
 * trivially serialisable for the same library version (and only for it: a table of another
 * cuBLASLt is refused). Lines starting with '#' and blank lines are ignored.
 *
 * Everything here is host code without CUDA: the cpu tests hold the format, and the CUDA
 * module (kernels/cuda/matmul_cuda.cu) takes a parsed table.
 */
#ifndef FATHOM_RUNTIME_MATMUL_TABLE_H
#define FATHOM_RUNTIME_MATMUL_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MATMUL_TABLE_VERSION = 1,
    MATMUL_ALGORITHM_WORDS = 8, /* sizeof(cublasLtMatmulAlgo_t) / 8 */
    MATMUL_DEVICE_NAME_MAX = 128,
};

/* The three products of a linear layer (kernels/cuda/kernels_cuda.h). */
typedef enum MatmulProduct {
    MATMUL_FORWARD,
    MATMUL_INPUT_GRADIENT,
    MATMUL_WEIGHT_GRADIENT,
} MatmulProduct;

typedef struct {
    MatmulProduct product;
    int rows, in_dim, out_dim;
    uint32_t alignment_a, alignment_b, alignment_c;
    int calls;                      /* in the step `fathom tune` ran */
    double heuristic_ms, tuned_ms;  /* medians: the heuristic's first, the chosen one */
    uint64_t algorithm[MATMUL_ALGORITHM_WORDS];
} MatmulTableEntry;

typedef struct {
    uint64_t library_version; /* cublasLtGetVersion() */
    uint64_t workspace_bytes;
    int multiprocessors;
    char device[MATMUL_DEVICE_NAME_MAX];
    int count, capacity;
    MatmulTableEntry *entries; /* owned */
} MatmulTable;

void matmul_table_init(MatmulTable *table);
void matmul_table_free(MatmulTable *table);

/* A new zeroed entry at the end (the table grows). */
MatmulTableEntry *matmul_table_add(MatmulTable *table);

/* The entry of key's product, shape and alignments (the other fields are not compared), or
 * NULL. */
const MatmulTableEntry *matmul_table_find(const MatmulTable *table,
                                          const MatmulTableEntry *key);

/* "forward", "input_gradient", "weight_gradient". */
const char *matmul_product_name(MatmulProduct product);

/* Parses `text` into an initialised, empty table. false with "line N: why" in `error` on
 * anything malformed: a wrong first line or version, a missing header line, an unknown
 * product, a missing or non-numeric field, a shape <= 0, an alignment not a power of two
 * up to 256, an algorithm not 8 words of hex, a key given twice. */
bool matmul_table_parse(MatmulTable *table, const char *text, char *error, size_t capacity);

/* The file's text (caller frees). */
char *matmul_table_format(const MatmulTable *table);

/* The file at `path` parsed into an initialised, empty table; fatal (exit 2) naming the
 * path, and the line, when it cannot be read or parsed. */
void matmul_table_read(MatmulTable *table, const char *path);

/* Writes the table to `path` through a temporary file renamed into place, so a failed
 * write leaves any earlier file whole; fatal (exit 2) naming the path on failure. */
void matmul_table_write(const MatmulTable *table, const char *path);

#ifdef __cplusplus
}
#endif

#endif
