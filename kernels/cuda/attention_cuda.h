/* kernels/cuda/attention_cuda.h — causal attention with grouped KV heads on the GPU, forward
 * and backward (DESIGN 2 "Attention", DESIGN 3 precision and determinism).
 *
 * The op of runtime/backend.h attention_forward / attention_backward, in bf16:
 *   out[b,t,h] = sum_{s<=t} softmax_s(q[b,t,h] . k[b,s,h/g] / sqrt(hd)) v[b,s,h/g],
 *   g = n_heads / n_kv_heads
 * q, out, dq, dout [B, T, n_heads, head_dim] bf16; k, v, dk, dv [B, T, n_kv_heads, head_dim]
 * bf16; lse [B, n_heads, T] fp32 (natural log-sum-exp of the scaled scores, saved by the
 * forward for the backward). head_dim is 64, 80 or 128; T >= 1 is any length (tiles past
 * the end are masked); every pointer is 16-byte aligned. The caller owns every buffer; the
 * backward needs a fp32 workspace of attention_backward_cuda_workspace_bytes().
 *
 * Flash-attention manner: no T x T matrix exists. Scores, softmax, log-sum-exp and every
 * sum are fp32; the tensor cores see bf16 operands (q, k, v, dout, and the probabilities
 * and score gradients rounded once to bf16) with fp32 accumulators.
 * Forward: one CTA per (128 queries, head, batch) walks its key blocks of 64 with an online
 * softmax (running max and sum in fp32), keys double-buffered in shared memory.
 * Backward (FA2): a preprocess kernel writes delta[b,h,t] = sum_i dout[b,t,h,i] out[b,t,h,i]
 * into the workspace; one CTA per (64 keys, kv head, batch) accumulates dk, dv in registers
 * over every query head of its group and every query block at or after it; one CTA per
 * (64 queries, head, batch) accumulates dq over its key blocks. Each gradient element is
 * summed by one thread in a fixed order: no atomics, bitwise-identical run to run.
 *
 * Gradients: with accumulate = true the backward ADDS, as the op table says (read the bf16
 * gradient, add in fp32, round once); with accumulate = false it overwrites and skips that
 * read (for a gradient buffer that would only have been zeroed).
 *
 * How fast this should be (Llama-3-8B attention: B 1, T 4096, 32 query heads, 8 kv heads,
 * head_dim 128; causal FLOPs counted once):
 *   forward   4 B T^2 H hd / 2 = 137.4 GFLOP; bytes q, k, v, out, lse = 84 MB.
 *             Floor on an H200: 137.4e9 / 790e12 = 0.174 ms (the 84 MB take 20 us at
 *             4.3 TB/s): compute-bound.
 *   backward  2.5 x forward = 343.6 GFLOP for the five products of the fused form; bytes
 *             q, k, v, out, dout, lse read, dq, dk, dv written = 168 MB (+ 50 MB read when
 *             accumulating). Floor: 0.435 ms. This implementation computes S and dP twice
 *             (once for dk/dv, once for dq, the price of a deterministic dq without atomics):
 *             7 products, 481 GFLOP, so its own floor is 0.61 ms.
 * mma.sync m16n8k16 from ldmatrix'd shared memory with 16 rows a warp is limited by
 * shared-memory bandwidth on Hopper (two products per 512-byte ldmatrix); expect about
 * 35-50% of the bf16 dense rate: forward ~0.35-0.5 ms, backward ~1.2-1.7 ms. wgmma would be
 * the next step. Resources (ptxas, head_dim 128, no spills): forward 186 registers, 102 KiB
 * shared, 1 CTA of 8 warps an SM; dk/dv 255 registers and dq 204, 103 KiB shared each, 2
 * CTAs of 4 warps an SM. The dk/dv grid is uneven (key block 0 sees every query block of
 * every head of its group): it is launched heaviest first.
 *
 * Outputs must not alias inputs; `out` and `lse` of the forward are what the backward reads.
 */
#ifndef FATHOM_KERNELS_CUDA_ATTENTION_CUDA_H
#define FATHOM_KERNELS_CUDA_ATTENTION_CUDA_H

#include "kernels/cuda/cuda_common.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out, lse from q, k, v (shapes above). Asynchronous on `stream`. */
void attention_forward_cuda(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                            const bf16 *v, int B, int T, int n_heads, int n_kv_heads,
                            int head_dim, cudaStream_t stream);

/* Bytes of fp32 workspace attention_backward_cuda needs: delta [B, n_heads, T]. */
size_t attention_backward_cuda_workspace_bytes(int B, int T, int n_heads);

/* dq, dk, dv (+)= the gradients of out w.r.t. q, k, v given dout, the forward's out and
 * lse. `workspace` holds attention_backward_cuda_workspace_bytes() and is overwritten.
 * Asynchronous on `stream`. */
void attention_backward_cuda(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                             const bf16 *k, const bf16 *v, const bf16 *out, const float *lse,
                             int B, int T, int n_heads, int n_kv_heads, int head_dim,
                             float *workspace, bool accumulate, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
