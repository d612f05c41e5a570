/* kernels/cuda/nccl_cuda.h — NCCL in the CUDA module, plain C header.
 *
 * nccl_cuda() returns the table of runtime/nccl_table.h (its contract is there): non-blocking
 * communicators on a communication stream of their own, grouped all-gather and
 * reduce-scatter ordered after the compute stream of backend_cuda.cu, and a watchdog thread
 * that aborts a communicator whose work passes its deadline or fails. The module exports it
 * only when it was built with libnccl (kernels/meson.build); runtime/cuda_module finds it
 * with dlsym. How the watchdog works is in nccl_cuda.cu.
 */
#ifndef FATHOM_KERNELS_CUDA_NCCL_CUDA_H
#define FATHOM_KERNELS_CUDA_NCCL_CUDA_H

#include "runtime/nccl_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table; the same pointer every call. Starts nothing until a communicator is made. */
const NcclTable *nccl_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
