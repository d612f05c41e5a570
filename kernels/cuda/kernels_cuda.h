/* kernels/cuda/kernels_cuda.h — the cuda backend's basic kernels and its matmul (plain C).
 *
 * Each function is the cuda version of the runtime/backend.h op of the same name: same
 * shapes, same formulas, same argument order, and the same GradMode for input gradients
 * (GRAD_ADD adds, GRAD_WRITE writes without reading the old values: +0.0 takes their place
 * in the same fp32 sum, so the bits are those of an add into zeros); weight gradients are
 * always added. What differs is spelled out here:
 * - Dtypes (DESIGN 3): activations and their gradients are bf16; weights are read as their
 *   bf16 compute copy; statistics saved for a backward (rstd, lse) are fp32; weight
 *   gradients (dweight, dtable) accumulate in fp32; optimizer ranges are fp32. Every sum,
 *   norm, softmax and loss computes in fp32 (sum_squares in double). A bf16 "+=" reads the
 *   old value, adds in fp32 and rounds once (nearest even).
 * - Every function takes a trailing cudaStream_t, launches on it and returns without
 *   synchronising (only cuda_sum_squares_read waits). Some take a caller-owned workspace.
 * - Determinism: no atomics anywhere; every reduction has a fixed order that depends only on
 *   the shapes, so the same inputs give the same bits run to run (and on any GPU for the
 *   kernels here; cuBLASLt matmuls on the same GPU model and library version).
 * - Pointers are device memory. Any alignment works; 16-byte aligned arrays with row lengths
 *   that are multiples of 8 take the 16-byte load/store paths. Tokens and targets are
 *   uint32 device arrays. Nothing here allocates except cuda_matmul_init.
 *
 * How fast should this be (H200: 4.3 TB/s copy, ~790 TFLOP/s bf16 dense; shapes of one
 * Llama-3-8B layer at 4096 tokens, d 4096, ffn 14336; bytes = each input read once, each
 * output written once, a "+=" output read and written):
 *   matmul forward, rows x in x out, 2*rows*in*out FLOPs:
 *     4096 x 4096 x 4096  (q, o)           137 GFLOP, 101 MB -> 174 us (compute bound)
 *     4096 x 4096 x 14336 (gate, up)       481 GFLOP, 268 MB -> 609 us
 *     4096 x 14336 x 4096 (down)           481 GFLOP, 268 MB -> 609 us
 *   matmul backward: twice the forward FLOPs (din and dweight) -> 348 / 1218 / 1218 us; the
 *     fp32 dweight read + write adds 134 / 470 / 470 MB, still under the compute time.
 *   rmsnorm forward 4096 x 4096: read 33.6 MB, write 33.6 MB -> 67 MB, 15.6 us.
 *   rmsnorm backward: read x, dout, dx, write dx -> 134 MB (+ 8 MB workspace), 33 us;
 *     GRAD_WRITE does not read dx: 109 MB, 25 us.
 *   rope forward, q of 4096 tokens x 4096: 67 MB (+ 2 MB cos/sin) -> 16 us; backward
 *     (dx +=) 134 MB -> 32 us; GRAD_WRITE (dx =) moves what the forward moves.
 *   swiglu forward 4096 x 14336: read 2, write 1 bf16 tensor of 117 MB -> 352 MB, 82 us;
 *     backward: read dout, gate, up, dgate, dup, write dgate, dup -> 822 MB, 191 us;
 *     GRAD_WRITE does not read dgate, dup: 587 MB, 137 us.
 *   cross-entropy, 4096 rows x V 128256: forward reads 1.05 GB -> 245 us (and 0.5 G exp,
 *     near the special-function unit's rate); backward in place 2.1 GB -> 490 us.
 *   adamw over n fp32: read p, g, m, v, write p, m, v, bf16 copy -> 30 n bytes.
 */
#ifndef FATHOM_KERNELS_CUDA_KERNELS_CUDA_H
#define FATHOM_KERNELS_CUDA_KERNELS_CUDA_H

#include "kernels/cuda/cuda_common.h"
#include "runtime/backend.h" /* AdamwScalars, GradMode */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise_cuda.cu: y += x; out = a + b (out may alias a or b); fp32 -> bf16 ---- */
void cuda_add_inplace(bf16 *y, const bf16 *x, size_t n, cudaStream_t stream);
void cuda_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n, cudaStream_t stream);
/* y = bf16((y - minus) + plus), plus NULL: bf16(y - minus) (runtime/backend.h
 * add_difference) */
void cuda_add_difference(bf16 *y, const bf16 *plus, const bf16 *minus, size_t n,
                         cudaStream_t stream);
void cuda_add_both(bf16 *out, const bf16 *a, bf16 *y, const bf16 *x, size_t n,
                   cudaStream_t stream);
/* dst[i] = bf16(src[i]), round to nearest even (fp32 master weights -> their bf16 compute
 * copy); reads 4 and writes 2 bytes an element. dst must not overlap src. */
void cuda_bf16_from_floats(bf16 *dst, const float *src, size_t n, cudaStream_t stream);

/* ---- embedding_cuda.cu: table [V, d] bf16, out / dout [n, d] bf16, tokens [n] (< V: the
 * caller validates its data, as on the cpu backend).
 * The backward is deterministic without atomics and without a sort: the block of the
 * FIRST position holding a token owns that token's row of dtable; it finds the token's
 * later positions by scanning the tokens in order (warp ballots) and adds their dout rows
 * to the row in increasing position order, in fp32. That is the cpu backend's order, so the
 * result equals cpu_embedding_backward on the same (bf16-valued) dout bit for bit. Cost:
 * O(n^2) token comparisons, from cache (microseconds at n = 8192), plus one read of dout
 * and one read + write of each touched row. ---- */
void cuda_embedding_forward(bf16 *out, const uint32_t *tokens, const bf16 *table, int n, int d,
                            cudaStream_t stream);
void cuda_embedding_backward(float *dtable, const bf16 *dout, const uint32_t *tokens, int n,
                             int d, cudaStream_t stream);
/* out [d] fp32 += sum over t of x[t, :], x [rows, d] bf16 (backend.h sum_rows). Two
 * launches: fixed slices of rows summed in row order into `workspace` (of
 * cuda_sum_rows_workspace_floats floats), then the slices added in order. */
size_t cuda_sum_rows_workspace_floats(int rows, int d);
void cuda_sum_rows(float *out, const bf16 *x, int rows, int d, float *workspace,
                   cudaStream_t stream);

/* ---- rmsnorm_cuda.cu: x, out, dx, dout [rows, d] bf16; weight [d] bf16 (compute copy);
 * rstd [rows] fp32; dweight [d] fp32; d <= 8192 (more: fatal, EXIT_CONFIG).
 * Forward as DESIGN 2: out = weight * cast_bf16(x * rstd), rounded once more at the end.
 * The backward treats that cast as the identity (xhat = x * rstd in fp32), as autograd does.
 * dweight: each group of consecutive rows writes its fp32 partial column sums to
 * `workspace` (cuda_rmsnorm_backward_workspace_floats(rows, d) floats, at most 4096 * d),
 * and a second kernel adds the partials of each column in a fixed order into dweight. The
 * grouping depends only on rows and d. */
void cuda_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *x, const bf16 *weight, int rows,
                          int d, float eps, cudaStream_t stream);
/* sum = bf16(a + b) (cuda_add's bits), then cuda_rmsnorm_forward of that sum, in one pass
 * (runtime/backend.h add_rmsnorm_forward); sum aliases neither a nor b. */
void cuda_add_rmsnorm_forward(bf16 *sum, bf16 *out, float *rstd, const bf16 *a, const bf16 *b,
                              const bf16 *weight, int rows, int d, float eps,
                              cudaStream_t stream);
/* runtime/backend.h GateAdd on the device: stream += added and, where partial is not NULL,
 * partial = partial_before + added, each rounded once. */
typedef struct {
    const bf16 *added;
    bf16 *stream;
    const bf16 *partial_before;
    bf16 *partial;
} CudaGateAdd;
/* x = bf16(base + *alpha * route) (route_block_cuda.h cuda_add_scaled's bits; x may alias
 * base), then cuda_rmsnorm_forward of that x, in one pass (runtime/backend.h
 * add_scaled_rmsnorm_forward); alpha fp32 [1], device. Where add is not NULL, its adds
 * first, base being add->stream. */
void cuda_add_scaled_rmsnorm_forward(bf16 *x, bf16 *out, float *rstd, const bf16 *base,
                                     const bf16 *route, const float *alpha, const bf16 *weight,
                                     int rows, int d, float eps, const CudaGateAdd *add,
                                     cudaStream_t stream);
size_t cuda_rmsnorm_backward_workspace_floats(int rows, int d);
void cuda_rmsnorm_backward(bf16 *dx, GradMode dx_mode, float *dweight, const bf16 *dout,
                           const bf16 *x, const bf16 *weight, const float *rstd, int rows,
                           int d, float *workspace, cudaStream_t stream);
/* dx = bf16(g), written, and branch += that bf16(g), g what cuda_rmsnorm_backward gives dx
 * (runtime/backend.h rmsnorm_backward_branch); branch NULL is cuda_rmsnorm_backward with
 * GRAD_ADD. */
void cuda_rmsnorm_backward_branch(bf16 *dx, bf16 *branch, float *dweight, const bf16 *dout,
                                  const bf16 *x, const bf16 *weight, const float *rstd, int rows,
                                  int d, float *workspace, cudaStream_t stream);
/* dweight[c] += the sum over groups of partials[g, c] ([groups, d] fp32), in group order
 * (32 interleaved slices, each in group order, then the slices in order): the backward's
 * second pass, the rows of partial sums its first pass leaves. */
void cuda_rmsnorm_dweight_reduce(float *dweight, const float *partials, int groups, int d,
                                 cudaStream_t stream);

/* ---- rope_cuda.cu: x, out, dx, dout [B, T, n_heads, head_dim] bf16; cos, sin
 * [T, head_dim / 2] fp32; head_dim even; out may alias x. ---- */
void cuda_rope_forward(bf16 *out, const bf16 *x, const float *cos, const float *sin, int B,
                       int T, int n_heads, int head_dim, cudaStream_t stream);
void cuda_rope_backward(bf16 *dx, GradMode dx_mode, const bf16 *dout, const float *cos,
                        const float *sin, int B, int T, int n_heads, int head_dim,
                        cudaStream_t stream);

/* ---- swiglu_cuda.cu: out = silu(gate) * up, all [n] bf16 ---- */
void cuda_swiglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, size_t n,
                         cudaStream_t stream);
void cuda_swiglu_backward(bf16 *dgate, bf16 *dup, GradMode mode, const bf16 *dout,
                          const bf16 *gate, const bf16 *up, size_t n, cudaStream_t stream);

/* ---- cross_entropy_cuda.cu: logits [rows, V] bf16 (any row chunk of the batch: the model
 * calls these on chunks so that no fp32 copy of all logits exists); targets [rows];
 * losses, lse, dloss [rows] fp32. The log-sum-exp is one online pass (running max and
 * rescaled sum, fp32) per row, combined across threads in a fixed order.
 * A target >= V cannot stop the process from the device: its row's loss is NaN (which the
 * step's non-finite check catches) and the backward subtracts no one-hot for it.
 * Backward: dlogits[r, :] += (GRAD_ADD) or = (GRAD_WRITE) dloss[r] * (softmax * (1 + 2
 * z_loss lse_r) - onehot), bf16. IN PLACE: dlogits == logits is allowed and then the gradient
 * REPLACES the logits whatever the mode (the buffer holds logits, not a gradient to add to);
 * each element is read before it is written by the same thread. Any other overlap is
 * undefined. ---- */
void cuda_cross_entropy_forward(float *losses, float *lse, const bf16 *logits,
                                const uint32_t *targets, int rows, int V, float z_loss,
                                cudaStream_t stream);
void cuda_cross_entropy_backward(bf16 *dlogits, GradMode mode, const float *dloss,
                                 const bf16 *logits, const float *lse, const uint32_t *targets,
                                 int rows, int V, float z_loss, cudaStream_t stream);
/* The forward, then the gradient written over the logits (the backward, GRAD_WRITE, in
 * place): the bits of the two launches in turn, each row read from memory once and written
 * once (the forward's kernel keeps the row in its registers). V <= 262144 (else
 * EXIT_CONFIG), as for the forward. */
void cuda_cross_entropy_forward_backward(float *losses, float *lse, bf16 *logits,
                                         const float *dloss, const uint32_t *targets, int rows,
                                         int V, float z_loss, cudaStream_t stream);

/* ---- matmul_cuda.cu (cuBLASLt): out[rows, out_dim] = in[rows, in_dim] @ weight[out_dim,
 * in_dim]^T, bf16 in / weight / out, fp32 accumulation (CUBLAS_COMPUTE_32F).
 * Backward: din (bf16, may be NULL) += dout @ weight with beta = 1 (GRAD_ADD: one rounding of
 * the fp32 sum), or = with beta = 0 (GRAD_WRITE: din is not read); dweight (fp32) +=
 * dout^T @ in (beta = 1) or = (beta = 0), by dweight_mode.
 * One cuBLASLt handle and one 32 MiB workspace per process: cuda_matmul_init makes them
 * (the first matmul calls it if nobody did), cuda_matmul_destroy frees them. The algorithm
 * is chosen once per shape (and operand alignment) by cuBLASLt's heuristic and cached, so
 * a shape always runs the same algorithm; split-K variants that reduce in bf16 are
 * excluded. The workspace is shared: matmuls of a process must be stream-ordered (one
 * compute stream), never run concurrently. ---- */
void cuda_matmul_init(void);
void cuda_matmul_destroy(void);
void cuda_matmul_forward(bf16 *out, const bf16 *in, const bf16 *weight, int rows, int in_dim,
                         int out_dim, cudaStream_t stream);
void cuda_matmul_backward(bf16 *din, GradMode din_mode, float *dweight, GradMode dweight_mode,
                          const bf16 *dout, const bf16 *in, const bf16 *weight, int rows,
                          int in_dim, int out_dim, cudaStream_t stream);

/* ---- optimizer_cuda.cu, over flat fp32 ranges (DESIGN 3) ---- */
/* AdamW of runtime/backend.h with the scalars s (g = grads[i] * s->grad_scale), and in the
 * same pass the weight EMA (ema may be NULL) and compute_copy[i] = bf16(params[i]) (the
 * weights the next forward reads; may be NULL). s->step counts from 1. */
void cuda_adamw_update(float *params, const float *grads, float *exp_avg, float *exp_avg_sq,
                       float *ema, size_t n, const AdamwScalars *s, bf16 *compute_copy,
                       cudaStream_t stream);
/* cuda_adamw_update of each range (runtime/backend.h adamw_update_ranges): ranges over 256 K
 * elements a launch each, the others up to 64 to a launch. */
void cuda_adamw_update_ranges(float *params, const float *grads, float *exp_avg,
                              float *exp_avg_sq, float *ema, const AdamwRange *ranges,
                              int n_ranges, const AdamwScalars *s, bf16 *compute_copy,
                              cudaStream_t stream);
/* y += x */
void cuda_add_floats(float *y, const float *x, size_t n, cudaStream_t stream);
/* *result += sum of x[i]^2, in double, on the device (so the squared norms of many ranges
 * add up without a host round trip; zero *result first). Two passes: a fixed grid of
 * CUDA_SUM_SQUARES_PARTIALS blocks writes one double each into `workspace`, one block adds
 * them in a fixed tree. cuda_sum_squares_read waits for the stream and returns *result. */
enum { CUDA_SUM_SQUARES_PARTIALS = 1024 }; /* doubles of workspace */
void cuda_sum_squares(double *result, const float *x, size_t n, double *workspace,
                      cudaStream_t stream);
double cuda_sum_squares_read(const double *result, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
