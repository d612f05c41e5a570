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
 * and score gradients rounded once to bf16) with fp32 accumulators. Hopper warpgroup MMAs
 * (wgmma, sm_90a): the file is built for sm_90a only.
 * Forward (grouped, the default; the specialised kernel is described below its selector):
 * one CTA of four warpgroups per (256 query rows of one KV group, batch) walks its
 * key blocks of 64 with an online softmax in base 2 (running max and sum in fp32), so K, V
 * cross L2 once per group rather than once per query head: the rows are 64 queries of 4 heads
 * of the group (group size a multiple of 4), 128 queries of 2 heads (even) or 256 queries of
 * one head (odd). K, V move through a ring of three shared-memory stages; each warpgroup runs
 * S, softmax, P V of a block in order, the four warpgroups overlapping one another.
 * Backward (deterministic), kernels to choose from (attention_cuda_select_backward, or
 * FATHOM_ATTENTION_BACKWARD = fused | fused_tma | two_pass read once; fused_tma by default).
 * Both start with a pass writing delta[b,h,t] = sum_i dout[b,t,h,i] out[b,t,h,i] into the
 * workspace.
 *   fused: one CTA of two consumer warpgroups per (128 keys, kv head, batch) accumulates dk, dv
 *     in registers over every query head of its group and every query block at or after it,
 *     and computes each step's dq part from the same scores (5 products a tile, FA2's count);
 *     a writer warp adds the dq parts into a fp32 workspace tile per query block with bulk
 *     reductions in L2, key block after key block in a fixed order enforced by a semaphore per
 *     tile; a last kernel rounds them into dq (attention_backward_fused_cuda.cu).
 *   fused_tma: the same, with q, dout (swizzled tiles), lse, delta brought by a producer warp
 *     through TMA and mbarriers instead of cp.async from the consumers, ds double-buffered,
 *     and no 256-thread barrier at the start of each step.
 *   two_pass: the same dk, dv CTAs without dq, then one CTA of two warpgroups per (128 queries,
 *     head, batch) recomputes the scores and accumulates dq over its key blocks (7 products).
 * Each gradient element is the same sum in the same order on every run: no atomics,
 * bitwise-identical run to run.
 *
 * Gradients (runtime/backend.h GradMode): GRAD_ADD adds (read the bf16 gradient, add in
 * fp32, round once); GRAD_WRITE overwrites and skips that read, adding the new gradient to
 * +0.0 in the old value's place, so the bits are those of GRAD_ADD on zeroed buffers. The
 * kernels take the mode as `accumulate` (GRAD_ADD), one bool argument of each launch.
 *
 * How fast this should be (causal FLOPs counted once; H200: 790 TFLOP/s bf16 dense measured,
 * 4.3 TB/s copy):
 *   Llama-3-8B attention, B 1, T 4096, 32 query heads, 8 kv heads, head_dim 128:
 *     forward   4 B T^2 H hd / 2 = 137.4 GFLOP; q, k, v, out, lse = 84 MB (20 us).
 *               Floor 0.174 ms: compute-bound.
 *     backward  the five products of the fused form are 2.5 x forward = 343.6 GFLOP (floor
 *               0.435 ms); two_pass computes S and dP twice (once for dk, dv, once for dq),
 *               7 products, 481 GFLOP, so its own floor is 0.61 ms. Bytes: q, k, v, out, dout,
 *               lse read, dq, dk, dv written = 168 MB (39 us; + 50 MB read when
 *               accumulating). fused adds the dq parts in L2: one 64 x 128 fp32 tile (32 KiB)
 *               per (query block, head, key block) pair, 33792 pairs = 1.1 GB of bulk
 *               additions into a 64 MiB dq_accum that stays in L2, then 64 MiB read and
 *               32 MiB written by the conversion (~25 us).
 *   B 32, T 1024, 16 query heads, 8 kv heads, head_dim 80:
 *     forward   85.9 GFLOP, 254 MB: floor 0.109 ms (the bytes alone 59 us).
 *     backward  214.7 GFLOP fused (0.27 ms), 300.6 GFLOP here: floor 0.38 ms; 506 MB (118 us).
 *   Expected here: 55-65% of the measured dense rate in the main loops (the softmax and the
 *   p / ds elementwise work sit beside the products, not hidden behind them everywhere),
 *   less prologue and epilogue for short key walks: backward ~0.9 ms and ~0.65 ms. The
 *   mma.sync version measured 0.706 / 1.692 ms and 0.608 / 1.493 ms.
 *   Forward, K and V through L2 (the causal prefix of every CTA): 128-row CTAs of one head
 *   read 1.11 GB (head_dim 128) and 755 MB (80) and measured 0.606 ms and 0.369 ms (ncu on
 *   head_dim 128: 71% of L2 throughput, so about 2.6 TB/s). 256-row CTAs of one group read
 *   545 MB and 377 MB: an L2 floor of ~0.21 ms and ~0.15 ms. Expected ~0.38 ms (head_dim 128)
 *   and ~0.25 ms (80), now limited by issue and the in-order block of each warpgroup.
 * Resources (ptxas, sm_90a, no spills, no serialised wgmma), registers per thread for
 * head_dim 128 / 80 / 64:
 *   forward  CTAs of 512 threads: 128 / 121 / 105, shared 160 / 100 / 80 KiB: 1 CTA an SM;
 *   specialised forward  CTAs of 384 threads (producer 24, consumers 240), shared 161 / 101 /
 *            81 KiB: 1 CTA;
 *   dk, dv   CTAs of 256 threads: 246 / 212 / 190, dq 204 / 186 / 164, shared 161.5 / 101.5 /
 *            81.5 KiB: 1 CTA.
 *   fused    CTAs of 384 threads (a writer warpgroup at 24 registers, two consumer warpgroups
 *            at 240 through setmaxnreg), shared 177 / 117 / 97 KiB: 1 CTA.
 * The dk/dv grid is uneven (key block 0 sees every query block of every head of its group):
 * it is launched heaviest first, as are the query blocks of the other two kernels.
 *
 * Outputs must not alias inputs; `out` and `lse` of the forward are what the backward reads.
 */
#ifndef FATHOM_KERNELS_CUDA_ATTENTION_CUDA_H
#define FATHOM_KERNELS_CUDA_ATTENTION_CUDA_H

#include "kernels/cuda/cuda_common.h"
#include "runtime/backend.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The forward kernels: grouped (attention_cuda.cu, four warpgroups of 64 rows sharing K, V
 * through a cp.async ring), specialised (attention_forward_specialised_cuda.cu, the
 * FlashAttention-3 manner: a TMA producer warp, two consumer warpgroups taking turns, each
 * overlapping its softmax with its products) and single_consumer (the same kernel with one
 * consumer warpgroup of 64 queries a CTA and two CTAs a multiprocessor, so that one CTA's
 * start and end run under the other's products: for short sequences, where a CTA has few
 * key blocks) and persistent (the specialised kernel with one CTA a multiprocessor walking
 * several tiles: the next tile's loads run under this one's last products and stores; the
 * same bits as specialised). */
typedef enum AttentionForwardKernel {
    ATTENTION_FORWARD_GROUPED = 0,
    ATTENTION_FORWARD_SPECIALISED = 1,
    ATTENTION_FORWARD_SINGLE_CONSUMER = 2,
    ATTENTION_FORWARD_PERSISTENT = 3,
} AttentionForwardKernel;

/* Chooses the forward for the rest of the process (tests, benchmarks); without a call the
 * first forward reads FATHOM_ATTENTION_FORWARD (persistent when unset; specialised,
 * single_consumer, grouped; another value exits 2). */
void attention_cuda_select_forward(AttentionForwardKernel kernel);
AttentionForwardKernel attention_cuda_forward_kernel(void);

/* The specialised forward alone, with 1 or 2 consumer warpgroups a CTA, one CTA a tile or
 * persistent (shapes already checked by attention_forward_cuda). */
void attention_forward_specialised_launch(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                          const bf16 *v, int B, int T, int n_heads,
                                          int n_kv_heads, int head_dim, int consumers,
                                          bool persistent, cudaStream_t stream);
/* For tests: a persistent launch takes at most `ctas` CTAs (0: as many as the
 * multiprocessors hold), so that small shapes give each CTA several tiles. */
void attention_forward_specialised_limit_ctas(int ctas);

/* out, lse from q, k, v (shapes above). Asynchronous on `stream`. */
void attention_forward_cuda(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                            const bf16 *v, int B, int T, int n_heads, int n_kv_heads,
                            int head_dim, cudaStream_t stream);

/* The backward kernels (see above). */
typedef enum AttentionBackwardKernel {
    ATTENTION_BACKWARD_FUSED = 0,
    ATTENTION_BACKWARD_TWO_PASS = 1,
    ATTENTION_BACKWARD_FUSED_TMA = 2, /* fused, q and dout through TMA from a producer warp */
} AttentionBackwardKernel;

/* Chooses the backward for the rest of the process (tests, benchmarks); without a call the
 * first backward reads FATHOM_ATTENTION_BACKWARD (fused_tma when unset; another value exits
 * 2). */
void attention_cuda_select_backward(AttentionBackwardKernel kernel);
AttentionBackwardKernel attention_cuda_backward_kernel(void);

/* Bytes of workspace attention_backward_cuda needs with the chosen kernel: delta
 * [B, n_heads, T] fp32; the fused kernel adds a semaphore per (batch, head, 64-query block)
 * and the fp32 dq sums [B, n_heads, T rounded up to 64, head_dim]. */
size_t attention_backward_cuda_workspace_bytes(int B, int T, int n_heads, int head_dim);

/* dq, dk, dv += or = (mode) the gradients of out w.r.t. q, k, v given dout, the forward's
 * out and lse. `workspace` holds attention_backward_cuda_workspace_bytes() and is
 * overwritten. Asynchronous on `stream`. */
void attention_backward_cuda(bf16 *dq, bf16 *dk, bf16 *dv, GradMode mode, const bf16 *dout,
                             const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                             const float *lse, int B, int T, int n_heads, int n_kv_heads,
                             int head_dim, float *workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
