/* tests/cuda_backend_support.h — one entry of the cuda op table checked against the same
 * entry of the cpu op table (the tests in test_cuda_backend*.c).
 *
 * An OpCase lists the arrays of one call in the order the op takes them, each with a role:
 * - input: offset + uniform(-scale, scale), or token ids below `scale`; activations are
 *   rounded to bf16 first, so both backends read the same values;
 * - output: written by the op; NaN on both sides beforehand, so an element the op never
 *   writes fails the comparison;
 * - accumulated: a "+=" output (every backward in GRAD_ADD). It starts from random values
 *   whose RMS equals that of the op's own contribution (measured by a cpu run from zero), so
 *   a missing contribution and an overwritten start both miss the reference by about 70%;
 * - updated: read and written in place (optimizer state), from random values (or from what
 *   `prepare` writes there: the start is taken after it);
 * - cpu scratch: zeroed host memory for the cpu backend; the cuda backend gets NULL (it has
 *   its own workspace and must not touch the argument).
 * op_check runs the op through backend_cpu() on host arrays (Activation = float there) and
 * through backend_cuda() on device arrays made with the cuda table's own alloc and uploads,
 * so its one stream orders everything. Every written array must satisfy
 * ||cuda - cpu|| / ||cpu|| <= its tolerance; then the cuda op runs again from the same start
 * and must give the same bits (determinism).
 */
#ifndef FATHOM_TESTS_CUDA_BACKEND_SUPPORT_H
#define FATHOM_TESTS_CUDA_BACKEND_SUPPORT_H

#include "runtime/backend.h"

#include <stddef.h>
#include <stdint.h>

#define BACKEND_BF16_TOLERANCE 1e-2 /* bf16 outputs */
#define BACKEND_FP32_TOLERANCE 1e-5 /* fp32 paths: optimizer, conversions, simple sums */
/* fp32 results of bf16 attention, routing and MSAR kernels (their own tests' bound) */
#define BACKEND_STATISTIC_TOLERANCE 1e-3

typedef enum ArrayRole {
    ROLE_INPUT,
    ROLE_OUTPUT,
    ROLE_ACCUMULATED,
    ROLE_UPDATED,
    ROLE_CPU_SCRATCH,
} ArrayRole;

typedef enum ArrayKind {
    ARRAY_ACTIVATION, /* Activation: fp32 on cpu, bf16 on cuda */
    ARRAY_FLOAT,      /* fp32 on both */
    ARRAY_TOKENS,     /* uint32 token ids */
} ArrayKind;

typedef struct OpArray {
    const char *name;
    ArrayRole role;
    ArrayKind kind;
    size_t n;
    float scale, offset; /* random values: offset + uniform(-scale, scale); tokens: < scale */
    double tolerance;    /* written arrays */
    void *host;          /* the cpu backend's array: float[n] or uint32_t[n] */
    void *device;        /* the cuda backend's array (NULL for cpu scratch) */
    float *start;        /* accumulated and updated arrays: their starting values */
} OpArray;

enum { OP_MAX_ARRAYS = 16, OP_MAX_SHAPE = 8 };

typedef struct OpCase OpCase;

/* Calls the op on `backend` with array i at pointers[i]. */
typedef void (*OpRunner)(const Backend *backend, void *const *pointers, const OpCase *c);

struct OpCase {
    const char *op;             /* named in failure messages */
    int shape[OP_MAX_SHAPE];    /* the op's integer arguments, as its runner reads them */
    float parameter[3];         /* its float arguments (eps, z_loss, alpha, ...) */
    OpRunner run;
    /* Optional: writes inputs from the cpu backend (the statistics a backward reads, from
     * its forward) after the random inputs are made and rounded; rounded again after. */
    void (*prepare)(OpCase *c);
    int count;
    OpArray arrays[OP_MAX_ARRAYS];
};

OpCase op_case(const char *op, OpRunner run);
void op_input(OpCase *c, const char *name, ArrayKind kind, size_t n, float scale, float offset);
void op_tokens(OpCase *c, const char *name, size_t n, int bound);
void op_output(OpCase *c, const char *name, ArrayKind kind, size_t n, double tolerance);
void op_accumulated(OpCase *c, const char *name, ArrayKind kind, size_t n, double tolerance);
void op_updated(OpCase *c, const char *name, size_t n, float scale, float offset,
                double tolerance);
void op_cpu_scratch(OpCase *c, const char *name, size_t n);

/* `count` consecutive arrays of `size` elements of one allocation of `b`, as an op's
 * pointer array (a runner's sources, streams, ..) */
void split_rows(const Backend *b, void *base, int count, size_t size, Activation **out);
void split_rows_const(const Backend *b, const void *base, int count, size_t size,
                      const Activation **out);

/* The host (cpu) array at `index`, for prepare functions. */
float *op_host(OpCase *c, int index);

/* Runs and compares as the opening comment says; fails the calling test on a mismatch.
 * Frees every array of the case. */
void op_check(OpCase *c, uint64_t seed);

#endif
