/* kernels/cuda/cuda_common.h — what every CUDA kernel file shares (plain C header).
 *
 * Types: `bf16` is the 2-byte bfloat16 storage type seen from C (the same bits as CUDA's
 * __nv_bfloat16); activations and compute copies of weights are bf16 on the cuda backend,
 * statistics, master weights, weight gradients and optimizer state are fp32 (DESIGN 3).
 * Errors: every CUDA / cuBLASLt call goes through CUDA_CHECK / CUBLAS_CHECK, which report
 * file:line and the library's message through fatal() with exit code 5 (a device failure,
 * like a communication failure, is outside the user's input). Streams: every launch takes
 * the cudaStream_t it runs on; nothing here synchronises unless its contract says so.
 */
#ifndef FATHOM_KERNELS_CUDA_COMMON_H
#define FATHOM_KERNELS_CUDA_COMMON_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t bf16;

#define CUDA_CHECK(call) cuda_check((int)(call), #call, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH() cuda_check((int)cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((int)(call), #call, __FILE__, __LINE__)
void cuda_check(int status, const char *expression, const char *file, int line);
void cublas_check(int status, const char *expression, const char *file, int line);

/* Host-side conversions (round to nearest even; NaN stays NaN). */
bf16 bf16_from_float(float value);
float bf16_to_float(bf16 value);
void bf16_from_floats(bf16 *out, const float *in, size_t n);
void bf16_to_floats(float *out, const bf16 *in, size_t n);

/* Number of multiprocessors of the current device (cached). */
int cuda_multiprocessor_count(void);

/* Bytes of L2 cache of the current device (cached). */
size_t cuda_l2_bytes(void);

/* The device the backend and NCCL run on (device_probe.cu; cuda_device_use sets it, 0 by
 * default). The first call fixes it: a later cuda_device_use of another device is fatal. */
int cuda_device_ordinal(void);

#ifdef __cplusplus
}
#endif

#endif
