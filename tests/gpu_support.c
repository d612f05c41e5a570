/* tests/gpu_support.c — see gpu_support.h. */
#include "tests/gpu_support.h"

#include "tests/support.h"

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

float *gpu_test_fp32_values(size_t n, float scale, uint64_t seed)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(x);
    test_fill_uniform(x, n, scale, seed);
    return x;
}

float *gpu_test_bf16_values(size_t n, float scale, uint64_t seed)
{
    float *x = gpu_test_fp32_values(n, scale, seed);
    gpu_round_to_bf16(x, n);
    return x;
}

uint32_t *gpu_test_random_tokens(int n, int V, uint64_t seed)
{
    uint32_t *tokens = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    cr_assert_not_null(tokens);
    for (int t = 0; t < n; t++)
        tokens[t] = (uint32_t)test_random_int(0, V - 1, seed * 100003 + (uint64_t)t);
    return tokens;
}

/* uint32 tokens travel as 4-byte words through the fp32 upload (a plain byte copy). */
uint32_t *gpu_upload_tokens(const uint32_t *tokens, int n)
{
    return (uint32_t *)gpu_upload_floats((const float *)tokens, (size_t)n);
}

void gpu_expect_close(const float *got, const float *want, size_t n, double tolerance,
                      const char *what)
{
    double error = test_relative_error(got, want, n);
    cr_assert_leq(error, tolerance, "%s: relative error %g > %g", what, error, tolerance);
}

void gpu_expect_close_at(const float *got, const float *want, size_t n, double tolerance,
                         const char *what, const int shape[4])
{
    double error = test_relative_error(got, want, n);
    cr_assert_leq(error, tolerance, "%s (shape %d, %d, %d, %d): relative error %.3g", what,
                  shape[0], shape[1], shape[2], shape[3], error);
}

float *gpu_test_host_floats(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(x);
    return x;
}

float *gpu_test_rounded_uniform(size_t n, float scale, float offset, uint64_t seed)
{
    float *x = gpu_test_host_floats(n);
    test_fill_uniform(x, n, scale, seed);
    for (size_t i = 0; i < n; i++)
        x[i] += offset;
    gpu_round_to_bf16(x, n);
    return x;
}
