/* launch/backend_select.h — the backend for `device: auto | cpu | cuda` (DESIGN 6). */
#ifndef FATHOM_LAUNCH_BACKEND_SELECT_H
#define FATHOM_LAUNCH_BACKEND_SELECT_H

#include "runtime/backend.h"
#include "runtime/config.h"

/* auto: cuda when this build has the cuda backend and a GPU is present, else cpu.
 * cuda without a usable GPU or cuda backend: exit 2 with the reason. */
const Backend *backend_select(DeviceKind device);

#endif
