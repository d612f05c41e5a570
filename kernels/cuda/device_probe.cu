/* kernels/cuda/device_probe.cu — cuda_probe() and the device of the rank (see cuda_module.h).
 */
#include "kernels/cuda/cuda_module.h"

#include "kernels/cuda/cuda_common.h"
#include "runtime/error.h"

#include <ctype.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The device of the backend and NCCL; fixed by the first cuda_device_ordinal(). */
static struct {
    int ordinal;
    bool fixed;
} device_choice;

extern "C" int cuda_device_ordinal(void)
{
    device_choice.fixed = true;
    return device_choice.ordinal;
}

extern "C" void cuda_device_use(int ordinal)
{
    if (device_choice.fixed && ordinal != device_choice.ordinal)
        fatal(EXIT_COMM, "CUDA device %d chosen after the backend started on device %d",
              ordinal, device_choice.ordinal);
    device_choice.ordinal = ordinal;
}

extern "C" int cuda_device_bus_id(int ordinal, char *bus_id, size_t capacity)
{
    const int device = ordinal < 0 ? device_choice.ordinal : ordinal;
    char text[64];
    cudaError_t status = cudaDeviceGetPCIBusId(text, (int)sizeof text, device);
    if (status != cudaSuccess) {
        snprintf(bus_id, capacity, "CUDA device %d has no PCI bus id (%s)", device,
                 cudaGetErrorString(status));
        cudaGetLastError(); /* not sticky: the caller decides */
        return -1;
    }
    /* CUDA writes "00000000:19:00.0" or "0000:19:00.0": keep a 4-digit domain, as
     * /sys/bus/pci and NCCL's messages write it */
    const char *start = text;
    while (start[0] == '0' && strlen(start) > 12)
        start++;
    snprintf(bus_id, capacity, "%s", start);
    for (char *c = bus_id; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    return 0;
}

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
