/* kernels/cuda/device_probe.cu — cuda_probe() (see cuda_module.h). */
#include "kernels/cuda/cuda_module.h"

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" int cuda_compute_capability(void)
{
    int count = 0;
    cudaDeviceProp properties;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 ||
        cudaGetDeviceProperties(&properties, 0) != cudaSuccess)
        return 0;
    return 10 * properties.major + properties.minor;
}

extern "C" int cuda_memory_info(size_t *free_bytes, size_t *total_bytes)
{
    size_t free_memory = 0, total_memory = 0;
    if (cudaMemGetInfo(&free_memory, &total_memory) != cudaSuccess)
        return 0;
    *free_bytes = free_memory;
    *total_bytes = total_memory;
    return 1;
}

extern "C" int cuda_probe(char *description, size_t capacity)
{
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        snprintf(description, capacity, "no usable CUDA device (%s)",
                 cudaGetErrorString(status));
        return 0;
    }
    if (count == 0) {
        snprintf(description, capacity, "no CUDA device");
        return 0;
    }
    cudaDeviceProp properties;
    status = cudaGetDeviceProperties(&properties, 0);
    if (status != cudaSuccess) {
        snprintf(description, capacity, "CUDA device 0 unreadable (%s)",
                 cudaGetErrorString(status));
        return 0;
    }
    snprintf(description, capacity, "%s, sm_%d%d, %d SMs, %.1f GiB", properties.name,
             properties.major, properties.minor, properties.multiProcessorCount,
             (double)properties.totalGlobalMem / (1 << 30));
    return count;
}
