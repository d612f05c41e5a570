/* kernels/cuda/backend_cuda_event.h — what a BackendEvent (runtime/backend.h) is on the cuda
 * backend: one CUDA event. Shared by the module's files that record one on a stream of
 * their own: nccl_cuda.cu records the end of an NCCL work on its communication stream, and
 * the compute stream waits for it through the op table's event_wait (backend_cuda.cu).
 * For the CUDA module's own files only.
 */
#ifndef FATHOM_KERNELS_CUDA_BACKEND_CUDA_EVENT_H
#define FATHOM_KERNELS_CUDA_BACKEND_CUDA_EVENT_H

#include <cuda_runtime_api.h>

struct BackendEvent {
    cudaEvent_t event;
};

#endif
