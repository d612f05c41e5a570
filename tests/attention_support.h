/* tests/attention_support.h — what the cuda attention tests share (test_cuda_attention.c,
 * test_cuda_attention_variants.c; kernels/cuda/attention_cuda.h).
 *
 * Every case draws fresh random q, k, v, dout, rounds them to bf16 (what the GPU reads) and
 * runs kernels/cpu on the rounded values; the backward reference gets the forward's out
 * rounded to bf16, as the GPU backward does. Outputs are poisoned (NaN) before each call, so
 * an element the kernels never write fails. Tolerances (relative, whole tensor): 1e-2 for
 * the bf16 tensors out, dq, dk, dv; 1e-3 for the fp32 lse. Gradients are compared with an
 * RMS floor of 1e-3 under the reference norm: at T = 1 the exact dq and dk are zero and the
 * GPU's (dout . v - dout . out) is a rounding residue, not an error.
 * Shapes (B, T, n_heads, n_kv_heads, head_dim) cover one token, ragged tails (T not a
 * multiple of the 64 / 128 tiles, including blocks where a whole warpgroup's rows lie past T),
 * grouped and ungrouped heads, head_dim 64, 80 (no power of two) and 128, and a sequence long
 * enough that every shared-memory ring of the kernels wraps several times. Each check selects
 * the kernel it runs. At the Llama-3-8B and 1B shapes (more tiles than multiprocessors, so
 * the fused kernels' ordered dq additions wait on CTAs that start later) kernels are held to
 * each other and to their own bits, on the GPU forward's out and lse (the cpu reference would
 * take minutes there).
 */
#ifndef FATHOM_TESTS_ATTENTION_SUPPORT_H
#define FATHOM_TESTS_ATTENTION_SUPPORT_H

#include "kernels/cuda/attention_cuda.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BF16_TOLERANCE 1e-2
#define LSE_TOLERANCE 1e-3
#define GRADIENT_RMS_FLOOR 1e-3

typedef struct Shape {
    int B, T, n_heads, n_kv_heads, head_dim;
} Shape;

/* Host inputs (already rounded to bf16) and the cpu results on them. */
typedef struct Case {
    Shape shape;
    size_t q_count, kv_count, lse_count;
    float *q, *k, *v, *dout;
    float *out, *lse;    /* cpu forward */
    float *out_rounded;  /* out as the GPU forward would store it */
    float *dq, *dk, *dv; /* cpu backward from zero, given out_rounded (with_backward only) */
} Case;

/* Device copies of a case's inputs. */
typedef struct DeviceInputs {
    bf16 *q, *k, *v, *dout, *out;
    float *lse, *workspace;
} DeviceInputs;

static const Shape single_token = {1, 1, 1, 1, 64};
static const Shape grouped_ragged_64 = {2, 77, 4, 2, 64};
static const Shape grouped_ragged_128 = {1, 300, 8, 2, 128};
static const Shape grouped_ragged_80 = {1, 129, 6, 3, 80};
static const Shape wide_128 = {2, 256, 32, 8, 128};
static const Shape ungrouped_64 = {2, 200, 3, 3, 64};
static const Shape long_64 = {1, 1000, 2, 1, 64};
static const Shape groups_of_8_128 = {1, 333, 16, 2, 128}; /* a group spans two blocks */
static const Shape groups_of_3_80 = {1, 190, 6, 2, 80};    /* odd group: one head a block */
/* 256 tiles (32 key blocks x 8 kv heads) on a GPU of about 132 multiprocessors; T is not a
 * multiple of 64 */
static const Shape llama_8b_ragged = {1, 4000, 32, 8, 128};
static const Shape model_1b_ragged = {8, 1000, 16, 8, 80};

/* Host arrays rounded to bf16, uniform normal from `seed` (caller frees). */
float *attention_random_bf16(size_t n, uint64_t seed);
/* A case with its cpu forward (and backward from zero when with_backward). */
Case attention_case_make(Shape shape, uint64_t seed, int with_backward);
/* Frees the host arrays and every device buffer of the test. */
void attention_case_free(Case *c);
/* ||a - ref|| / max(||ref||, floor * sqrt(n)); NaN anywhere gives +inf. */
double attention_gradient_error(const float *a, const float *ref, size_t n);
double attention_root_mean_square(const float *x, size_t n);
DeviceInputs attention_device_inputs(const Case *c);
/* The selected backward on the case, synchronised. */
void attention_run_backward(const Case *c, const DeviceInputs *d, bf16 *dq, bf16 *dk,
                            bf16 *dv, GradMode mode);

/* `kernel` against the cpu: the forward's out and lse; the backward's dq, dk, dv in
 * overwrite mode into poisoned buffers. */
void attention_check_forward(Shape shape, uint64_t seed, AttentionForwardKernel kernel);
void attention_check_backward(Shape shape, uint64_t seed, AttentionBackwardKernel kernel);
/* Accumulate mode: start + gradient, not the gradient alone nor twice it. */
void attention_check_accumulate(AttentionBackwardKernel kernel);
/* Two runs into freshly poisoned buffers give the same finite bits. */
int attention_backward_repeats_its_bits(const Case *c, const DeviceInputs *d,
                                        const char **differs);
void attention_check_deterministic(AttentionBackwardKernel kernel);
/* A case whose out and lse come from the GPU forward; host arrays q .. dout only. */
Case attention_large_case_make(Shape shape, uint64_t seed, DeviceInputs *d);
/* At large shapes: `kernel` against two_pass; a forward `kernel` against grouped. */
void attention_check_backward_against(Shape shape, uint64_t seed, AttentionBackwardKernel kernel);
void attention_check_forward_against(Shape shape, uint64_t seed, AttentionForwardKernel kernel);
/* `kernel` and `reference` give out and lse of the same bits, every element written. */
void attention_check_forward_bits(Shape shape, uint64_t seed, AttentionForwardKernel kernel,
                                  AttentionForwardKernel reference);

#endif
