/* runtime/cuda_module.h — finds and loads the CUDA module (kernels/cuda/cuda_module.h).
 *
 * The module is looked for at $FATHOM_CUDA_MODULE, then next to the running executable
 * (<dir>/libfathom_cuda.so, <dir>/kernels/libfathom_cuda.so). A build without nvcc has no
 * module; a machine without a GPU has the module but no device. Both are ordinary answers,
 * not errors: the caller decides (device: auto falls back to cpu, device: cuda exits 2).
 * With a device, the module's op table (kernels/cuda/backend_cuda.h) is the cuda backend and
 * its NCCL table (kernels/cuda/nccl_cuda.h) moves device memory between ranks.
 */
#ifndef FATHOM_RUNTIME_CUDA_MODULE_H
#define FATHOM_RUNTIME_CUDA_MODULE_H

#include "runtime/backend.h"
#include "runtime/matmul_table.h"
#include "runtime/nccl_table.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool loaded;          /* the module was found and opened */
    int devices;          /* usable CUDA devices (0 when not loaded) */
    int compute_capability; /* of device 0: 10 * major + minor (0: none) */
    char path[1024];      /* where it was found */
    char description[256]; /* device 0, or why there is none / why the module is missing */
} CudaModuleInfo;

/* Loads the module once per process (later calls return the same answer). */
const CudaModuleInfo *cuda_module_probe(void);

/* The cuda op table: NULL when the module is not loaded or sees no device (the reason is
 * cuda_module_probe()->description); otherwise the module's backend_cuda(). A module
 * without that symbol is an install error: fatal, EXIT_CONFIG, naming its path. */
const Backend *cuda_module_backend(void);

/* The module's NCCL table (runtime/nccl_table.h): NULL when the module is not loaded, sees
 * no device, or was built without NCCL (the reason in `why`, when not NULL). */
const NcclTable *cuda_module_nccl(char *why, size_t capacity);

/* The rank's device (runtime/topo): the PCI bus id of CUDA device `ordinal` (< 0: the device
 * in use) into bus_id, false (with the reason in bus_id) when there is none; and the device
 * the backend and NCCL are to use, before the backend starts (kernels/cuda/cuda_module.h).
 * Both need a loaded module with a device. */
bool cuda_module_device_bus_id(int ordinal, char *bus_id, size_t capacity);
void cuda_module_device_use(int ordinal);

/* Free and total bytes of the GPU the cuda backend uses; false when the module is not
 * loaded, sees no device, or cannot say. */
bool cuda_module_memory(size_t *free_bytes, size_t *total_bytes);

/* The cuda backend's matrix products' algorithms (runtime/matmul_table.h; the module's
 * cuda_matmul_* of kernels/cuda/cuda_module.h): use a table from now on (false with the
 * reason in `why` when it cannot be honoured here), count which plans took it, and time the
 * candidates of every product run so far into a table. Each needs a loaded module with a
 * device (fatal, exit 2, without). */
bool cuda_module_matmul_table_use(const MatmulTable *table, char *why, size_t capacity);
void cuda_module_matmul_table_counts(int *from_table, int *from_heuristic);
void cuda_module_matmul_tune(MatmulTable *table, int candidates, int repeats);

#endif
