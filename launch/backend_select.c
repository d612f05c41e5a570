/* launch/backend_select.c — see backend_select.h. */
#include "launch/backend_select.h"

#include "runtime/cuda_module.h"
#include "runtime/error.h"

#include <stdio.h>

static const Backend *announce_cuda(const Backend *backend)
{
    printf("fathom: device cuda (%s)\n", cuda_module_probe()->description);
    return backend;
}

const Backend *backend_select(DeviceKind device)
{
    const Backend *cuda;
    switch (device) {
    case DEVICE_CPU:
        return backend_cpu();
    case DEVICE_AUTO:
        cuda = cuda_module_backend();
        return cuda ? announce_cuda(cuda) : backend_cpu();
    case DEVICE_CUDA:
        cuda = cuda_module_backend();
        if (!cuda)
            fatal(EXIT_CONFIG, "device: cuda, but %s; use device: cpu or auto",
                  cuda_module_probe()->description);
        return announce_cuda(cuda);
    }
    fatal(EXIT_CONFIG, "device: unknown value %d", (int)device);
}
