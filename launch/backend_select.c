/* launch/backend_select.c — see backend_select.h. */
#include "launch/backend_select.h"

#include "runtime/cuda_module.h"
#include "runtime/error.h"

#include <stdio.h>

const Backend *backend_select(DeviceKind device)
{
    const CudaModuleInfo *cuda;
    switch (device) {
    case DEVICE_CPU:
        return backend_cpu();
    case DEVICE_AUTO:
        cuda = cuda_module_probe();
        if (cuda->devices > 0)
            printf("fathom: found %s, but this version has no cuda op table yet; "
                   "training on the cpu\n", cuda->description);
        return backend_cpu();
    case DEVICE_CUDA:
        cuda = cuda_module_probe();
        if (cuda->devices == 0)
            fatal(EXIT_CONFIG, "device: cuda, but %s; use device: cpu or auto",
                  cuda->description);
        fatal(EXIT_CONFIG, "device: cuda — found %s, but this version has no cuda op table "
              "yet; use device: cpu or auto", cuda->description);
    }
    fatal(EXIT_CONFIG, "device: unknown value %d", (int)device);
}
