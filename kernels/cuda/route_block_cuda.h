/* kernels/cuda/route_block_cuda.h — the two-phase Route on the GPU (runtime/backend.h
 * route_block_forward / backward, route_merge_forward / backward, add_scaled and its
 * backward; DESIGN 2.1; docs/design-notes.md, "Two-phase routing"). Plain C header.
 *
 * Same arguments, order and math as the op table (kernels/cpu/route_block_cpu.c and
 * route_cpu.c are the reference), with route_cuda.h's dtypes: activations bf16, weights
 * bf16 compute copies, statistics and weight gradients fp32, alpha an fp32 [1] in device
 * memory read by the kernels; pointer arrays are HOST arrays of device pointers. Nothing here
 * allocates or synchronises; workspaces are device buffers of the floats the *_workspace_floats
 * functions name. Deterministic: fixed partitions and orders, no atomics.
 *
 * Kernels (route_block_forward_cuda.cu, route_block_dots_cuda.cu,
 * route_block_backward_cuda.cu):
 *   phase one, forward   a block a token (persistent grid), a thread a 16-byte vector of the
 *                        row: the token's N source rows come into shared memory by cp.async
 *                        (the next token's while this one is worked on), then into registers
 *                        once; for each site in turn its q*g (staged in shared memory where
 *                        it fits) against every row, the per-head sums into parts; one
 *                        barrier; then each warp the
 *                        softmax of the (site, head) pairs its vectors touch, and each
 *                        site's mix from the rows in registers. Each source is read from
 *                        memory once for all G sites.
 *   phase one, backward  three kernels. (1) a block a token, the same layout, no barrier:
 *                        the dots D = < d x_i, s_n > and P = < q_i g_i, s_n > per (site,
 *                        source, head), each warp's share written out; (2) a warp a token:
 *                        the softmax backward and the key-norm terms, written as per-token
 *                        coefficients (value a scale_i, key r dz, self e summed over sites);
 *                        where a warp of (1) is a whole head, (1) makes them itself and e
 *                        comes a head's share at a time, summed by (3);
 *                        (3) a channel walker: a block owns a slice of channels and a range
 *                        of tokens, keeps every site's q*g and the sums S_i of its channels
 *                        in registers, and per token adds into each source's gradient
 *                        ds_n += sum_i (a scale_i d x_i + r dz q_i g_i) - e_n s_n. A block of
 *                        the token layout cannot hold G x d values of q*g and S (G 8, d 4096:
 *                        256 KB): the walker's blocks split the channels instead, at the cost
 *                        of reading the sources and d x a second time.
 *                        Where a warp's dots are one whole head (the split layout, at most 8
 *                        heads) and N >= 5, one kernel does all three
 *                        (route_block_one_pass_cuda.cu): the warp that made a head's dots
 *                        and coefficients makes its channels' ds_n and S on tensor cores,
 *                        S in its accumulators, so each row is read once.
 *   merges               a block a token, a thread per vector (route_block_cuda.cu).
 * The fast kernels take N <= CUDA_BLOCK_MAX_SOURCES, G <= CUDA_BLOCK_MAX_SITES, d <= 4096 with
 * d / H a multiple of 8 and 16-byte aligned pointers; anything else runs the per-site kernels
 * of route_cuda.h once a site (the same results, G reads of each source).
 *
 * How fast should this be: route_block_forward_cuda.cu and route_block_backward_cuda.cu
 * count the bytes; docs/performance.md has the predictions and the measurements.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_BLOCK_CUDA_H
#define FATHOM_KERNELS_CUDA_ROUTE_BLOCK_CUDA_H

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels_cuda.h" /* CudaGateAdd */
#include "runtime/backend.h"           /* GradMode */

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    /* a 32-layer graft in blocks of 4 layers reads 9 (null, b_0..b_7); the 1B model's 36
     * layers in blocks of 4 read 10 in their last block (delta form) */
    CUDA_BLOCK_MAX_SOURCES = 12,
    CUDA_BLOCK_MAX_SITES = 8,   /* blocks of 4 layers */
};

/* Which backward runs where a warp's dots are a whole head (the split layout), from
 * FATHOM_ROUTE_BLOCK_BACKWARD, read once (any other value exits 2): one_pass (or unset) or
 * two_pass (the dots kernel, then the channel walker, as at every other shape). */

/* Which block kernels run, from FATHOM_ROUTE_BLOCK, read once (any other value exits 2):
 *   mma_all (or unset)  tensor cores (route_block_mma.cuh) where a head is whole warps
 *                   (head_dim a multiple of 256) and where it splits evenly into warps of
 *                   16, 20 or 24 vectors (route_block_device.cuh's split layout: d 1280 with
 *                   H 8); the per-thread kernels elsewhere;
 *   mma             tensor cores only where a head is whole warps;
 *   simt            the per-thread kernels everywhere.
 * cuda_route_block_tensor_cores: mma or mma_all; cuda_route_block_split_heads: mma_all. */
bool cuda_route_block_tensor_cores(void);
bool cuda_route_block_split_heads(void);

/* The kernels a call of N sources and G sites at (d, heads) takes under that choice (no GPU
 * needed; for the tests and the benches): "mma" (heads of whole warps), "mma_split" (the
 * split layout, route_block_device.cuh), "simt", or "per_site" (past the block kernels'
 * limits: the per-site kernels once a site, every other field 0); the threads of a block,
 * the vectors each warp owns and its k-steps of 16 channels (0 for simt); the backward:
 * "one_pass" (route_block_one_pass_cuda.cu: a warp a whole head, the dots and the source
 * gradients in one pass) or "two_pass" (the dots, then the channel walker); the walker's
 * threads a block (4 channels each), its blocks a multiprocessor and its grid where the
 * tokens are many (a function of the shapes alone, so that every GPU sums in the same
 * order: one wave on 132 multiprocessors of 228 KB). The pointers' alignment, also asked
 * for, is not known here. */
typedef struct {
    const char *kernels, *backward;
    int threads, warp_vectors, k_steps;
    int walk_threads, walk_resident, walk_blocks;
} CudaRouteBlockLayout;

CudaRouteBlockLayout cuda_route_block_layout(int n_sources, int n_sites, int d, int heads);

/* ---- phase one ---- */

size_t cuda_route_block_forward_workspace_floats(int n_sources, int n_sites, int tokens,
                                                 int d, int heads);

void cuda_route_block_forward(bf16 *const *results, float *const *weights, float *const *rstd,
                              float *const *lse, const bf16 *const *sources, int n_sources,
                              const bf16 *const *queries, const bf16 *const *key_norms,
                              int n_sites, int tokens, int d, int heads, float eps,
                              float *workspace, cudaStream_t stream);

size_t cuda_route_block_backward_workspace_floats(int n_sources, int n_sites, int tokens,
                                                  int d, int heads);

void cuda_route_block_backward(bf16 *const *dsources, unsigned dsources_written,
                               float *const *dqueries,
                               float *const *dkey_norms, float *const *dalphas,
                               const bf16 *const *douts, const bf16 *const *sources,
                               int n_sources, const float *const *weights, const float *rstd,
                               const bf16 *const *queries, const bf16 *const *key_norms,
                               const float *const *alphas, const float *const *means,
                               int n_sites, float *workspace, int tokens, int d, int heads,
                               cudaStream_t stream);

/* ---- phase two ---- */

/* route_gate_cuda.cu: out[i] = base[i] + *alpha * x[i] (fp32, rounded once); out may
 * alias base. */
void cuda_add_scaled(bf16 *out, const bf16 *base, const bf16 *x, const float *alpha, size_t n,
                     cudaStream_t stream);
/* route_gate_cuda.cu: dx = *alpha * dout (rounded once), *dalpha += sum dout x. */
size_t cuda_add_scaled_backward_workspace_floats(size_t n);
void cuda_add_scaled_backward(bf16 *dx, float *dalpha, const bf16 *dout, const bf16 *x,
                              const float *alpha, size_t n, float *workspace,
                              cudaStream_t stream);

/* The partial is the site's source n_sources - 1; out may alias result. */
void cuda_route_merge_forward(bf16 *out, float *weights, float *rstd, const bf16 *result,
                              const float *lse, const bf16 *partial, int n_sources,
                              const bf16 *query, const bf16 *key_norm, int tokens, int d,
                              int heads, float eps, cudaStream_t stream);

/* A replace-form site merged and normed in one pass (runtime/backend.h
 * route_merge_rmsnorm_forward): where add is not NULL, add->partial = bf16(add->partial_before
 * + add->added) first (cuda_add's bits; add->partial is `partial`, add->stream NULL); then
 * cuda_route_merge_forward of the partial into x (which may alias result), then
 * cuda_rmsnorm_forward of x into out and norm_rstd (norm_weight, norm_eps). The bits of
 * those ops in turn: one kernel where the rows are the warp-a-token merges' and a warp's for
 * the norm (d % 256 == 0, d <= 1280, heads dividing 32, every pointer 16-byte aligned), the
 * ops in turn otherwise. */
void cuda_route_merge_rmsnorm_forward(bf16 *x, bf16 *out, float *norm_rstd, float *weights,
                                      float *rstd, const bf16 *result, const float *lse,
                                      const bf16 *partial, int n_sources, const bf16 *query,
                                      const bf16 *key_norm, const bf16 *norm_weight,
                                      int tokens, int d, int heads, float eps, float norm_eps,
                                      const CudaGateAdd *add, cudaStream_t stream);

/* A replace-form site's norm backward and merge backward in one pass (runtime/backend.h
 * route_merge_rmsnorm_backward): cuda_rmsnorm_backward(dx, GRAD_WRITE, dweight, dnormed, x,
 * norm_weight, norm_rstd), then cuda_route_merge_backward(dpartial, dpartial_mode, dquery,
 * dkey_norm, mean, dout = dx, out = x, partial, ...). dx, mean and dpartial have those ops'
 * bits, dquery and dkey_norm too; dweight is the same sum in another fixed order. One kernel
 * where the rows are the warp-a-token merges' and a warp's for the norm (d % 256 == 0,
 * d <= 1280, heads dividing 32, every pointer 16-byte aligned), the ops in turn otherwise.
 * workspace: cuda_route_merge_rmsnorm_backward_workspace_floats(tokens, d, heads) floats. */
size_t cuda_route_merge_rmsnorm_backward_workspace_floats(int tokens, int d, int heads);
void cuda_route_merge_rmsnorm_backward(bf16 *dx, float *dweight, const bf16 *dnormed,
                                       const bf16 *x, const bf16 *norm_weight,
                                       const float *norm_rstd, bf16 *dpartial,
                                       GradMode dpartial_mode, float *dquery, float *dkey_norm,
                                       float *mean, const bf16 *partial, int n_sources,
                                       const float *weights, const float *rstd,
                                       const bf16 *query, const bf16 *key_norm,
                                       float *workspace, int tokens, int d, int heads,
                                       cudaStream_t stream);

/* MSAR's replace form, site i > 0 of an open block: its partial b [B T, d] convolved for
 * each of `streams` streams (taps[r] [kernel_sizes[r], d], as cuda_stream_conv_forward
 * convolves and rounds it) and merged into that stream (cuda_route_merge_forward's out[r],
 * weights[r], rstd[r] from result[r], lse[r], query[r], key_norm[r]); out[r] may alias
 * result[r]. The bits of the two ops in turn; E_r is written only where the rows are not
 * the warp-a-token merges' (d % 256 != 0, d > 2048, heads not dividing 32, pointers not
 * 16-byte aligned): into rows[r], [B T, d] each, whose contents are otherwise left alone. */
void cuda_route_merge_conv_forward(bf16 *const *out, float *const *weights, float *const *rstd,
                                   const bf16 *const *result, const float *const *lse,
                                   const bf16 *partial, const bf16 *const *taps,
                                   const int *kernel_sizes, int streams, int n_sources,
                                   const bf16 *const *query, const bf16 *const *key_norm,
                                   bf16 *const *rows, int B, int T, int d, int heads, float eps,
                                   cudaStream_t stream);

/* cuda_route_merge_conv_forward, then cuda_stream_mix_forward(x, gates, mix_rstd, out,
 * streams, mix_bias, mix_proj): the merged streams out[r] (out[r] may alias result[r]), the
 * mix of them into x [B T, d] and its gates and rstd [B T, streams], the bits of the two in
 * turn. Where the rows take the warp-a-token layout (as cuda_route_merge_conv_forward's; up
 * to 8 streams) the streams are mixed as they are merged, from shared memory, and stored
 * only with keep_streams (out[r] is scratch otherwise). FATHOM_MERGE_MIX=composed always
 * calls the two. */
void cuda_route_merge_conv_mix_forward(bf16 *x, float *gates, float *mix_rstd,
                                       const float *mix_bias, const bf16 *mix_proj,
                                       bf16 *const *out, bool keep_streams,
                                       float *const *weights, float *const *rstd,
                                       const bf16 *const *result, const float *const *lse,
                                       const bf16 *partial, const bf16 *const *taps,
                                       const int *kernel_sizes, int streams, int n_sources,
                                       const bf16 *const *query, const bf16 *const *key_norm,
                                       bf16 *const *rows, int B, int T, int d, int heads,
                                       float eps, cudaStream_t stream);

size_t cuda_route_merge_conv_backward_workspace_floats(int streams, int tokens, int d,
                                                       int heads);

/* The backward of cuda_route_merge_conv_forward: for each stream r, E_r made again as the
 * forward made it, then cuda_route_merge_backward(dpartial[r], GRAD_WRITE, dquery[r],
 * dkey_norm[r], mean[r], dout[r], out[r], E_r, n_sources, weights[r], rstd[r], query[r],
 * key_norm[r]): the bits of the two ops in turn. E_r goes into rows[r] only where the
 * forward would write it there too. */
void cuda_route_merge_conv_backward(bf16 *const *dpartial, float *const *dquery,
                                    float *const *dkey_norm, float *const *mean,
                                    const bf16 *const *dout, const bf16 *const *out,
                                    const bf16 *partial, const bf16 *const *taps,
                                    const int *kernel_sizes, int streams, int n_sources,
                                    const float *const *weights, const float *const *rstd,
                                    const bf16 *const *query, const bf16 *const *key_norm,
                                    bf16 *const *rows, float *workspace, int B, int T, int d,
                                    int heads, cudaStream_t stream);

size_t cuda_route_merge_backward_workspace_floats(int tokens, int d, int heads);

/* mean = < dout, out > per head; with a partial (not NULL: the site's source n_sources - 1),
 * its share: dpartial added into (GRAD_ADD) or written (GRAD_WRITE: the bits of an add into
 * zeros, dpartial not read). */
void cuda_route_merge_backward(bf16 *dpartial, GradMode dpartial_mode, float *dquery,
                               float *dkey_norm, float *mean, const bf16 *dout,
                               const bf16 *out, const bf16 *partial,
                               int n_sources, const float *weights, const float *rstd,
                               const bf16 *query, const bf16 *key_norm, float *workspace,
                               int tokens, int d, int heads, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
