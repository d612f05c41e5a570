/* tests/gpu_support.h — helpers for the tests of kernels/cuda (built only where nvcc is).
 *
 * gpu_require() makes a test SKIP, never pass, where no GPU answers. Device buffers made here
 * are freed by gpu_free_all() at the end of a test. Comparisons go through the cpu reference
 * (kernels/cpu) on the same random inputs, rounded to bf16 first where the GPU reads bf16.
 */
#ifndef FATHOM_TESTS_GPU_SUPPORT_H
#define FATHOM_TESTS_GPU_SUPPORT_H

#include "kernels/cuda/cuda_common.h"

#include <stddef.h>
#include <stdint.h>

/* Skips the calling test unless a CUDA device is usable. */
void gpu_require(void);

/* Device allocation filled from host data (fp32 as is, or rounded to bf16). */
float *gpu_upload_floats(const float *host, size_t n);
bf16 *gpu_upload_bf16(const float *host, size_t n);
/* Device allocation filled with NaN (0xFFFF bf16 / 0xFFFFFFFF fp32): unwritten elements fail. */
float *gpu_poisoned_floats(size_t n);
bf16 *gpu_poisoned_bf16(size_t n);
/* Copies back to a fresh host fp32 array (caller frees). */
float *gpu_download_floats(const float *device, size_t n);
float *gpu_download_bf16(const bf16 *device, size_t n);
/* Rounds a host fp32 array through bf16 in place (what the GPU sees of it). */
void gpu_round_to_bf16(float *host, size_t n);
/* Host arrays for the inputs of a GPU test, uniform in [-scale, scale) from `seed` (caller
 * frees): fp32 as is, or rounded to bf16 (what the GPU reads of them). */
float *gpu_test_fp32_values(size_t n, float scale, uint64_t seed);
float *gpu_test_bf16_values(size_t n, float scale, uint64_t seed);
/* A zeroed host array of n floats (at least one; caller frees). */
float *gpu_test_host_floats(size_t n);
/* offset + uniform(-scale, scale) from `seed`, rounded to bf16 (caller frees). */
float *gpu_test_rounded_uniform(size_t n, float scale, float offset, uint64_t seed);
/* n random token ids below V (caller frees), and a device copy of them. */
uint32_t *gpu_test_random_tokens(int n, int V, uint64_t seed);
uint32_t *gpu_upload_tokens(const uint32_t *tokens, int n);
/* ||got - want|| / ||want|| <= tolerance, or the test fails naming `what`. */
void gpu_expect_close(const float *got, const float *want, size_t n, double tolerance,
                      const char *what);
/* The same, the failure naming the case's four shape numbers too. */
void gpu_expect_close_at(const float *got, const float *want, size_t n, double tolerance,
                         const char *what, const int shape[4]);
/* Frees every device pointer handed out by this file since the last call. */
void gpu_free_all(void);

#endif
