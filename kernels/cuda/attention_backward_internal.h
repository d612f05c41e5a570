/* kernels/cuda/attention_backward_internal.h — what the three attention backward files share
 * (attention_backward_cuda.cu: the entry and the two-pass kernels;
 * attention_backward_delta_cuda.cu: the delta pass; attention_backward_fused_cuda.cu: the
 * one-pass kernel). Not part of the module's interface.
 *
 * Workspace (one buffer, attention_backward_cuda_workspace_bytes()):
 *   delta      [B, n_heads, T] fp32        rowsum(dout * out), both kernels
 *   semaphores [B, n_heads, query blocks]  u32, fused only: key blocks added so far
 *   counter    u32                          fused only: tiles claimed so far
 *   dq_accum   [B, n_heads, query blocks, 64 * head_dim] fp32, fused only: the dq sums in the
 *              order the fused kernel's registers hold them (see its file)
 * The delta pass zeroes the semaphores and the counter before the fused kernel reads them.
 */
#ifndef FATHOM_KERNELS_CUDA_ATTENTION_BACKWARD_INTERNAL_H
#define FATHOM_KERNELS_CUDA_ATTENTION_BACKWARD_INTERNAL_H

#include "kernels/cuda/cuda_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ATTENTION_FUSED_QUERIES 64 /* query rows of a dq tile, and of one step of the walk */

typedef struct AttentionBackwardWorkspace {
    float *delta;
    uint32_t *semaphores; /* NULL for the two-pass kernels */
    uint32_t *counter;
    float *dq_accum;
    size_t zeroed_words; /* semaphores + counter, contiguous */
    size_t bytes;        /* the whole buffer */
} AttentionBackwardWorkspace;

/* The buffer's parts from `base` (NULL: sizes only); `fused` adds the fused kernel's parts. */
static inline AttentionBackwardWorkspace attention_backward_workspace(void *base, int B, int T,
                                                                      int n_heads, int head_dim,
                                                                      int fused)
{
    AttentionBackwardWorkspace w = {NULL, NULL, NULL, NULL, 0, 0};
    size_t rows = (size_t)B * n_heads;
    size_t query_blocks = ((size_t)T + ATTENTION_FUSED_QUERIES - 1) / ATTENTION_FUSED_QUERIES;
    size_t delta_bytes = (rows * T * sizeof(float) + 255) / 256 * 256;
    char *at = (char *)base;
    w.delta = (float *)at;
    w.bytes = delta_bytes;
    if (!fused)
        return w;
    w.zeroed_words = rows * query_blocks + 1;
    size_t semaphore_bytes = (w.zeroed_words * sizeof(uint32_t) + 255) / 256 * 256;
    w.semaphores = base ? (uint32_t *)(at + delta_bytes) : NULL;
    w.counter = base ? w.semaphores + rows * query_blocks : NULL;
    w.dq_accum = base ? (float *)(at + delta_bytes + semaphore_bytes) : NULL;
    w.bytes = delta_bytes + semaphore_bytes +
              rows * query_blocks * ATTENTION_FUSED_QUERIES * (size_t)head_dim * sizeof(float);
    if (!base)
        w.delta = NULL;
    return w;
}

#ifdef __cplusplus
extern "C" {
#endif

/* The delta pass (attention_backward_delta_cuda.cu): w->delta = rowsum(dout * out), and the
 * fused kernel's semaphores and counter zeroed. dout, out [B, T, n_heads, head_dim]. */
void attention_backward_delta_launch(const AttentionBackwardWorkspace *w, const bf16 *dout,
                                     const bf16 *out, int B, int T, int n_heads, int head_dim,
                                     cudaStream_t stream);

/* The one-pass backward after the delta pass: dk, dv (+)= their gradients, dq (+)= its
 * gradient through w->dq_accum; `tma`: q, dout arrive through TMA from a producer warp.
 * head_dim 64, 80 or 128; shapes already checked. */
void attention_backward_fused_launch(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                     const bf16 *q, const bf16 *k, const bf16 *v,
                                     const float *lse, const AttentionBackwardWorkspace *w, int B,
                                     int T, int n_heads, int n_kv_heads, int head_dim, bool tma,
                                     bool accumulate, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
