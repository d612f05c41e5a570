/* tests/gpu_support.c — see gpu_support.h. */
#include "tests/gpu_support.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#define GPU_POINTERS_MAX 256
static void *device_pointers[GPU_POINTERS_MAX];
static int device_pointer_count;

void gpu_require(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        cr_skip_test("no CUDA device");
    }
}

static void *device_alloc(size_t bytes)
{
    void *pointer = NULL;
    CUDA_CHECK(cudaMalloc(&pointer, bytes ? bytes : 1));
    cr_assert_lt(device_pointer_count, GPU_POINTERS_MAX, "too many device buffers in a test");
    device_pointers[device_pointer_count++] = pointer;
    return pointer;
}

float *gpu_upload_floats(const float *host, size_t n)
{
    float *device = device_alloc(n * sizeof(float));
    CUDA_CHECK(cudaMemcpy(device, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return device;
}

bf16 *gpu_upload_bf16(const float *host, size_t n)
{
    bf16 *staging = malloc(n * sizeof(bf16) + 1);
    bf16_from_floats(staging, host, n);
    bf16 *device = device_alloc(n * sizeof(bf16));
    CUDA_CHECK(cudaMemcpy(device, staging, n * sizeof(bf16), cudaMemcpyHostToDevice));
    free(staging);
    return device;
}

float *gpu_poisoned_floats(size_t n)
{
    float *device = device_alloc(n * sizeof(float));
    CUDA_CHECK(cudaMemset(device, 0xFF, n * sizeof(float)));
    return device;
}

bf16 *gpu_poisoned_bf16(size_t n)
{
    bf16 *device = device_alloc(n * sizeof(bf16));
    CUDA_CHECK(cudaMemset(device, 0xFF, n * sizeof(bf16)));
    return device;
}

float *gpu_download_floats(const float *device, size_t n)
{
    float *host = malloc(n * sizeof(float) + 1);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host, device, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

float *gpu_download_bf16(const bf16 *device, size_t n)
{
    bf16 *staging = malloc(n * sizeof(bf16) + 1);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(staging, device, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    float *host = malloc(n * sizeof(float) + 1);
    bf16_to_floats(host, staging, n);
    free(staging);
    return host;
}

void gpu_round_to_bf16(float *host, size_t n)
{
    for (size_t i = 0; i < n; i++)
        host[i] = bf16_to_float(bf16_from_float(host[i]));
}

void gpu_free_all(void)
{
    for (int i = 0; i < device_pointer_count; i++)
        cudaFree(device_pointers[i]);
    device_pointer_count = 0;
}
