/* kernels/cuda/cuda_common.cu — checks and bf16 conversions (see cuda_common.h). */
#include "kernels/cuda/cuda_common.h"

#include "runtime/error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <string.h>

extern "C" void cuda_check(int status, const char *expression, const char *file, int line)
{
    if (status != (int)cudaSuccess)
        fatal(EXIT_COMM, "%s:%d: CUDA call %s failed: %s", file, line, expression,
              cudaGetErrorString((cudaError_t)status));
}

extern "C" void cublas_check(int status, const char *expression, const char *file, int line)
{
    if (status != (int)CUBLAS_STATUS_SUCCESS)
        fatal(EXIT_COMM, "%s:%d: cuBLAS call %s failed: %s", file, line, expression,
              cublasLtGetStatusString((cublasStatus_t)status));
}

extern "C" bf16 bf16_from_float(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu))
        return (bf16)((bits >> 16) | 0x0040u); /* quiet NaN */
    uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
    return (bf16)((bits + rounding) >> 16);
}

extern "C" float bf16_to_float(bf16 value)
{
    uint32_t bits = (uint32_t)value << 16;
    float result;
    memcpy(&result, &bits, sizeof result);
    return result;
}

extern "C" void bf16_from_floats(bf16 *out, const float *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bf16_from_float(in[i]);
}

extern "C" void bf16_to_floats(float *out, const bf16 *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bf16_to_float(in[i]);
}

extern "C" size_t cuda_l2_bytes(void)
{
    static int bytes;
    if (!bytes) {
        int device;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
    }
    return (size_t)bytes;
}

extern "C" int cuda_multiprocessor_count(void)
{
    static int count;
    if (!count) {
        int device;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    }
    return count;
}
