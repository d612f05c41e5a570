/* kernels/cuda/cuda_module.h — what the CUDA module (libfathom_cuda.so) exports.
 *
 * All CUDA code is built into a separate shared module when nvcc is present at build time
 * (kernels/meson.build). The `fathom` binary never links the CUDA runtime: runtime/cuda_module
 * loads this module with dlopen when a run asks for a GPU, so the same binary runs on a
 * machine without a GPU, a driver or the CUDA libraries. The module links the CUDA runtime
 * statically; the driver (libcuda) is loaded by it on first use.
 *
 * Every symbol is plain C. Strings are written into caller buffers. The module also exports
 * backend_cuda() (backend_cuda.h), the cuda op table, and, when built with NCCL,
 * nccl_cuda() (nccl_cuda.h), the NCCL table of runtime/nccl_table.h.
 */
#ifndef FATHOM_KERNELS_CUDA_CUDA_MODULE_H
#define FATHOM_KERNELS_CUDA_CUDA_MODULE_H

#include "runtime/matmul_table.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when there is none or no driver). `description` gets
 * device 0 ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB") or the reason there is none. */
int cuda_probe(char *description, size_t capacity);

/* 10 * major + minor of device 0 (90 for Hopper), 0 when there is none. */
int cuda_compute_capability(void);

/* The PCI bus id of device `ordinal` (a CUDA ordinal; < 0: the device the backend uses),
 * "0000:19:00.0" in lower case, into bus_id. Creates no context. 0 on success, -1 (with
 * CUDA's message in bus_id) when the device does not answer. */
int cuda_device_bus_id(int ordinal, char *bus_id, size_t capacity);

/* The device the backend and NCCL run on from now on (runtime/topo's choice for the rank).
 * Call it before the backend's first entry: once the backend has started on a device, a
 * call naming another one is fatal (exit 5). Without a call the device is 0. */
void cuda_device_use(int ordinal);

/* cudaMemGetInfo of the current device (device 0 unless the backend chose another): 1 with
 * the free and total bytes, 0 when there is no device or the call fails. */
int cuda_memory_info(size_t *free_bytes, size_t *total_bytes);

/* ---- the matrix products' algorithms (runtime/matmul_table.h; kernels/cuda/matmul_cuda.cu)
 * cuda_matmul_table_use: from now on a product whose key the table holds runs the table's
 * algorithm (plans made before are made again). 0, or -1 with the reason in `why` when the
 * table cannot be honoured here: another cuBLASLt version, or more workspace than this run
 * allows. The table is copied.
 * cuda_matmul_table_counts: of the plans made so far, how many took the table's algorithm
 * and how many the heuristic's.
 * cuda_matmul_tune: times up to `candidates` (1..64) of cuBLASLt's algorithms for every plan
 * made so far, `repeats` (1..200) timed runs each, and adds an entry a plan to `table`
 * (initialised, empty), with its header; prints a line a plan
 * (kernels/cuda/matmul_tune_cuda.cu). */
int cuda_matmul_table_use(const MatmulTable *table, char *why, size_t capacity);
void cuda_matmul_table_counts(int *from_table, int *from_heuristic);
void cuda_matmul_tune(MatmulTable *table, int candidates, int repeats);

#ifdef __cplusplus
}
#endif

#endif
