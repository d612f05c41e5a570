/* tests/grad_mode_support.h — the two GradModes of a backward, held to each other on one
 * backend (runtime/backend.h; test_grad_mode.c on the cpu, test_cuda_grad_mode.c on cuda).
 *
 * A GradModeCase lists the arrays of one backward call in the order the op takes them, each
 * with a role, and says how to run the op on a backend with a mode. grad_mode_check makes
 * the arrays with the backend's own alloc and uploads, fills the inputs with random values,
 * lets `prepare` compute what the backward reads from its forward (rstd, out, lse) on the
 * same backend, and then runs the op three times from the same inputs:
 *   1. GRAD_ADD into zeroed input gradients: the reference;
 *   2. GRAD_WRITE into input gradients filled with NaN: the same bits as 1 (an old value
 *      read, or an element left unwritten, shows as NaN);
 *   3. GRAD_ADD onto random input gradients whose RMS is that of 1's: start + 1 within
 *      `add_tolerance` (relative, whole array), so the add still adds: an op that wrote
 *      instead misses by about 70%.
 * Weight gradients start from zeros in every run and must repeat their bits in 1 and 2;
 * matmul's dweight, which takes the mode, is checked as an input gradient.
 * An array of no elements is passed as NULL.
 */
#ifndef FATHOM_TESTS_GRAD_MODE_SUPPORT_H
#define FATHOM_TESTS_GRAD_MODE_SUPPORT_H

#include "runtime/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum GradModeRole {
    GRAD_MODE_INPUT,           /* random: offset + uniform(-scale, scale) */
    GRAD_MODE_PREPARED,        /* written by `prepare` (a forward's statistics) */
    GRAD_MODE_INPUT_GRADIENT,  /* an output under the mode (matmul's dweight too) */
    GRAD_MODE_WEIGHT_GRADIENT, /* fp32, always added */
} GradModeRole;

typedef struct GradModeArray {
    const char *name;
    GradModeRole role;
    bool activation; /* Activation array (the backend's dtype), else fp32 */
    size_t n;
    float scale, offset;
} GradModeArray;

enum { GRAD_MODE_MAX_ARRAYS = 12, GRAD_MODE_MAX_SHAPE = 5, GRAD_MODE_MAX_SOURCES = 16 };

typedef struct GradModeCase {
    const char *op; /* named in failure messages */
    int shape[GRAD_MODE_MAX_SHAPE];
    /* Calls the backward on `backend` with array i at arrays[i]. */
    void (*run)(const Backend *backend, GradMode mode, void *const *arrays, const int *shape);
    /* Optional: fills the PREPARED arrays from the inputs (a forward). */
    void (*prepare)(const Backend *backend, void *const *arrays, const int *shape);
    int count;
    GradModeArray arrays[GRAD_MODE_MAX_ARRAYS];
} GradModeCase;

/* The ops with a GradMode, at a shape:
 * matmul (rows, in_dim, out_dim), rmsnorm (rows, d), rope (B, T, n_heads, head_dim),
 * attention (B, T, n_heads, n_kv_heads, head_dim), swiglu (n), cross-entropy (rows, V),
 * route_merge (tokens, d, heads, n_sources: the last source is the partial, whose gradient
 * takes the mode). */
GradModeCase grad_mode_case_matmul(int rows, int in_dim, int out_dim);
GradModeCase grad_mode_case_rmsnorm(int rows, int d);
GradModeCase grad_mode_case_rope(int B, int T, int n_heads, int head_dim);
GradModeCase grad_mode_case_attention(int B, int T, int n_heads, int n_kv_heads, int head_dim);
GradModeCase grad_mode_case_swiglu(size_t n);
GradModeCase grad_mode_case_cross_entropy(int rows, int V);
GradModeCase grad_mode_case_route_merge(int tokens, int d, int heads, int n_sources);

/* Runs the three calls of the opening comment on `backend` and fails the calling test on a
 * mismatch. */
void grad_mode_check(const Backend *backend, const GradModeCase *c, uint64_t seed,
                     double add_tolerance);

#endif
