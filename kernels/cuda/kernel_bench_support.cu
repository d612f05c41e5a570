/* kernels/cuda/kernel_bench_support.cu — see kernel_bench.h. */
#include "kernels/cuda/kernel_bench.h"

#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

static const double PEAK_TFLOPS = 790.0, PEAK_GBS = 4300.0;

void *device_random_bf16(size_t n, unsigned seed)
{
    bf16 *host = (bf16 *)malloc(n * sizeof(bf16));
    unsigned state = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        host[i] = bf16_from_float(((float)(state >> 8) / 16777216.0f - 0.5f) * 0.5f);
    }
    void *device;
    CUDA_CHECK(cudaMalloc(&device, n * sizeof(bf16)));
    CUDA_CHECK(cudaMemcpy(device, host, n * sizeof(bf16), cudaMemcpyHostToDevice));
    free(host);
    return device;
}

float *device_floats(size_t n, float value)
{
    float *host = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        host[i] = value;
    float *device;
    CUDA_CHECK(cudaMalloc(&device, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(device, host, n * sizeof(float), cudaMemcpyHostToDevice));
    free(host);
    return device;
}

double median_ms(Case run, void *context)
{
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; i++)
        run(context);
    float times[20];
    for (int i = 0; i < 20; i++) {
        CUDA_CHECK(cudaEventRecord(start, 0));
        run(context);
        CUDA_CHECK(cudaEventRecord(stop, 0));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&times[i], start, stop));
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(times, times + 20);
    return times[10];
}

void report(const char *name, double ms, double flops, double bytes)
{
    double floor_ms = std::max(flops / (PEAK_TFLOPS * 1e9), bytes / (PEAK_GBS * 1e6));
    if (flops > 0)
        printf("%-48s %9.3f ms %9.1f TFLOP/s   floor %8.3f ms  (%.2fx floor)\n", name, ms,
               flops / ms / 1e9, floor_ms, ms / floor_ms);
    else
        printf("%-48s %9.3f ms %9.1f GB/s      floor %8.3f ms  (%.2fx floor)\n", name, ms,
               bytes / ms / 1e6, floor_ms, ms / floor_ms);
    fflush(stdout);
}

OptimizerBuffers optimizer_buffers_make(size_t n)
{
    OptimizerBuffers buffers;
    buffers.n = n;
    buffers.params = device_floats(n, 0.01f);
    buffers.grads = device_floats(n, 0.001f);
    buffers.exp_avg = device_floats(n, 0.0f);
    buffers.exp_avg_sq = device_floats(n, 0.0f);
    buffers.ema = device_floats(n, 0.01f);
    CUDA_CHECK(cudaMalloc(&buffers.compute_copy, n * sizeof(bf16)));
    return buffers;
}

void optimizer_buffers_free(OptimizerBuffers *buffers)
{
    cudaFree(buffers->params), cudaFree(buffers->grads), cudaFree(buffers->exp_avg);
    cudaFree(buffers->exp_avg_sq), cudaFree(buffers->ema), cudaFree(buffers->compute_copy);
}

void optimizer_buffers_update(const OptimizerBuffers *buffers, size_t n, bool ema,
                              const AdamwScalars *scalars, cudaStream_t stream)
{
    cuda_adamw_update(buffers->params, buffers->grads, buffers->exp_avg, buffers->exp_avg_sq,
                      ema ? buffers->ema : NULL, n, scalars, buffers->compute_copy, stream);
}
