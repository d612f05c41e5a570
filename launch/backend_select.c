/* launch/backend_select.c — see backend_select.h. */
#include "launch/backend_select.h"

#include "runtime/error.h"

const Backend *backend_select(DeviceKind device)
{
    switch (device) {
    case DEVICE_CPU:
    case DEVICE_AUTO:
        /* the cuda op table is not part of this build yet, so auto means cpu */
        return backend_cpu();
    case DEVICE_CUDA:
        fatal(EXIT_CONFIG, "device: cuda — this build of fathom has no cuda backend; "
              "use device: cpu or auto");
    }
    fatal(EXIT_CONFIG, "device: unknown value %d", (int)device);
}
