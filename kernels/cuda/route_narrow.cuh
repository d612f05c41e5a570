/* kernels/cuda/route_narrow.cuh — the Route for narrow rows, a warp a token (CUDA C++ only;
 * the contract is cuda_route_forward / cuda_route_backward's in route_cuda.h, which call
 * these when the shape fits and the block-a-token kernels otherwise).
 *
 * Why. At d 1280 (the MHAR paper's 1B model) a block a token spends its instructions on
 * per-token work that does not shrink with the row: barriers, per-segment shuffles, the
 * softmax by a few threads while the rest wait. ncu counted 5.6k warp instructions a token
 * in the forward and 9.9k in the backward at N = 5, about 28 and 49 thread instructions per
 * source element, against about 5 and 10 that the arithmetic needs (docs/performance.md).
 * A warp a token needs no barrier, and its sums over a head are a few shuffles.
 *
 * Layout. Lane l owns the channels [l d/32, (l+1) d/32): LV = d/256 vectors of 8 bf16, so a
 * head of d/H channels is 32/H whole lanes and every per-head sum is a shuffle over the
 * lanes of one head. Rows reach shared memory through cp.async in the coalesced order
 * (vector j*32 + lane), each lane's vectors kept together with a pad of one vector when LV
 * is even (a stride of LV or LV + 1 vectors: conflict-free 16-byte reads), and are read back
 * by their owners after __syncwarp.
 *
 * The forward streams its rows through a small ring in shared memory, a few in flight
 * across token boundaries (route_narrow_cuda.cu); the backward holds a token's rows, reads
 * each source row once and shares a token among up to four warps
 * (route_narrow_backward_cuda.cu); route_narrow_device.cuh has what both use.
 *
 * Fits when: every pointer is 16-byte aligned, d % 256 == 0, d <= 2048 (LV <= 8), heads
 * divides 32, and the backward's N + 2 + 3 min(N, 4) rows a block fit in 99 KB.
 * Deterministic: each token is one block's; the backward's sums over tokens go per warp in
 * token order, then per block in warp order, into per-block partials that
 * route_backward_cuda.cu reduces in block order, and the block count depends on the shapes
 * and the binary only.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_NARROW_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_NARROW_CUH

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/route_cuda.h"

#include <stdbool.h>
#include <stddef.h>

enum {
    ROUTE_NARROW_MAX_SOURCES = CUDA_ROUTE_MAX_SOURCES,
    ROUTE_NARROW_MAX_LANE_VECTORS = 8, /* d <= 2048 */
};

/* Whether the narrow kernels take this Route; `pointers` are every array the call touches
 * (NULL entries are ignored). */
bool route_narrow_fits(int n_sources, int d, int heads, const void *const *pointers,
                       int count);

/* cuda_route_forward's contract, for a shape route_narrow_fits accepts; lse [tokens, heads]
 * (NULL: not wanted) gets log sum_n e^z per head (route_cuda.h, route_forward_lse). */
void route_narrow_forward(bf16 *out, float *weights, float *rstd, float *lse,
                          const bf16 *const *sources, int n_sources, const bf16 *query,
                          const bf16 *key_norm, const bf16 *base, const float *alpha,
                          int tokens, int d, int heads, float eps, cudaStream_t stream);

/* Blocks the narrow backward uses for `tokens` (a function of the shapes only): its
 * partials are [blocks, d] channel sums, then [blocks] dalpha sums. */
int route_narrow_backward_blocks(int tokens);

/* The per-token part of cuda_route_backward (dsources +=) and the per-block partials of
 * S_c and dalpha into `partials`; the caller reduces them. Returns the block count.
 * alpha: the mix scale (device fp32 [1], NULL: 1); means: the softmax centres [tokens, heads]
 * (NULL: sum_n a scale D over these sources; route_cuda.h, route_backward_centred). */
int route_narrow_backward(bf16 *const *dsources, float *partials, const bf16 *dout,
                          const bf16 *const *sources, int n_sources, const float *weights,
                          const float *rstd, const bf16 *query, const bf16 *key_norm,
                          const float *alpha, const float *means, int tokens, int d,
                          int heads, cudaStream_t stream);

#endif
