/* kernels/cuda/backend_cuda_routing.h — the attention-over-depth and MSAR entries of the cuda op
 * table (route, stream conv, stream mix, stream route), split from backend_cuda.cu. Plain C
 * header, for the CUDA module's own files.
 *
 * backend_cuda.cu owns the compute stream and the workspace (its opening comment says how
 * they are made and grown) and hands them out here; backend_cuda_routing.cu wraps the kernels
 * of route_cuda.h with them and fills the table's entries.
 */
#ifndef FATHOM_KERNELS_CUDA_BACKEND_CUDA_ROUTING_H
#define FATHOM_KERNELS_CUDA_BACKEND_CUDA_ROUTING_H

#include "runtime/backend.h"

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* backend_cuda.cu: the compute stream (made by the first call), and the workspace, grown on
 * the stream to at least `floats` floats; its contents are scratch. */
cudaStream_t backend_cuda_compute_stream(void);
float *backend_cuda_workspace_floats(size_t floats);

/* backend_cuda_routing.cu: sets route_*, stream_conv_*, stream_mix_* and route_conv_*.
 * table_bytes: sizeof(Backend) where the caller was compiled; another size than this file's
 * exits 2 (meson 1.0 gives nvcc no dependency files, so an edit of runtime/backend.h can
 * leave this object stale beside a rebuilt backend_cuda.cu, with the entries at old
 * offsets). */
void backend_cuda_fill_routing(Backend *table, size_t table_bytes);

#ifdef __cplusplus
}
#endif

#endif
