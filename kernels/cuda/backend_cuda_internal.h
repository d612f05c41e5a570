/* kernels/cuda/backend_cuda_internal.h — how the cuda op table's files share its state. Plain
 * C header, for the CUDA module's own files.
 *
 * backend_cuda.cu owns the compute stream and the workspace (its opening comment says how
 * they are made and grown), the memory, event, conversion and optimizer entries, and the
 * table. It hands the stream and the workspace to the files that wrap the other kernels:
 * backend_cuda_layers.cu (the decoder layer's and the loss's entries: elementwise,
 * embedding, rmsnorm, matmul, rope, attention, swiglu, cross-entropy) and
 * backend_cuda_routing.cu (attention over depth and MSAR: route, stream conv, stream mix,
 * stream route). nccl_cuda.cu orders its work against the same stream.
 */
#ifndef FATHOM_KERNELS_CUDA_BACKEND_CUDA_INTERNAL_H
#define FATHOM_KERNELS_CUDA_BACKEND_CUDA_INTERNAL_H

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

/* Each sets its entries of the table. table_bytes: sizeof(Backend) where the caller was
 * compiled; another size than the callee's exits 2 (backend_cuda_check_table: meson 1.0
 * gives nvcc no dependency files, so an edit of runtime/backend.h can leave one object
 * stale beside a rebuilt backend_cuda.cu, with the entries at old offsets).
 * backend_cuda_layers.cu: add*, embedding_*, sum_rows, rmsnorm_*, add_rmsnorm_forward,
 * matmul_*, rope_*, attention_*, swiglu_*, cross_entropy_*. */
void backend_cuda_fill_layers(Backend *table, size_t table_bytes);
/* backend_cuda_routing.cu: route_*, stream_conv_*, stream_mix_* and route_conv_*. */
void backend_cuda_fill_routing(Backend *table, size_t table_bytes);
/* backend_cuda.cu: exits 2 naming `file` where its table (callee_bytes) and the caller's
 * (caller_bytes) differ in size. */
void backend_cuda_check_table(const char *file, size_t callee_bytes, size_t caller_bytes);

#ifdef __cplusplus
}
#endif

#endif
