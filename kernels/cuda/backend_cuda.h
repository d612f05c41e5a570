/* kernels/cuda/backend_cuda.h — the cuda op table (runtime/backend.h), plain C header.
 *
 * backend_cuda() returns the table of the cuda backend: bf16 activations, fp32 statistics,
 * weight gradients and optimizer state (DESIGN 3), every op ordered on one compute stream of
 * the rank's device (cuda_device_use; device 0 by default). The CUDA module exports it under
 * this name; runtime/cuda_module finds it with dlsym, and the test binary, which links the
 * module, calls it directly. What the backend owns (its stream, its workspace, its allocation
 * table) is described in backend_cuda.cu.
 */
#ifndef FATHOM_KERNELS_CUDA_BACKEND_CUDA_H
#define FATHOM_KERNELS_CUDA_BACKEND_CUDA_H

#include "runtime/backend.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The table; the same pointer every call. Creates nothing until its first entry is used. */
const Backend *backend_cuda(void);

/* sizeof(Backend) where the module was compiled: runtime/cuda_module.c refuses a module
 * built against another op table than the binary's (exit 2, "rebuild"). */
size_t backend_cuda_table_bytes(void);

#ifdef __cplusplus
}
#endif

#endif
