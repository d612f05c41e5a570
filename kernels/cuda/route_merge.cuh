/* kernels/cuda/route_merge.cuh — what the two layouts of the replace form's merges share
 * (route_merge_cuda.cu: a block a token, and the entries; route_merge_narrow_cuda.cu: a warp
 * a token): their arguments, and the narrow launches. CUDA C++ only; the math is in
 * route_merge_cuda.cu's header.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_MERGE_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_MERGE_CUH

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/route_device.cuh"

#include <cuda_runtime.h>

struct MergeArgs {
    /* forward */
    bf16 *out;
    float *weights; /* [N + 1, tokens, heads]; backward: read only */
    float *rstd;    /* [N + 1, tokens]; backward: read only */
    const bf16 *result;
    const float *lse;
    /* backward */
    bf16 *dpartial;
    bool dpartial_add; /* GRAD_ADD: dpartial +=; GRAD_WRITE: = +0.0 + g, dpartial not read */
    float *mean;
    const bf16 *dout, *merged;
    float *partials; /* [blocks, d] channel sums S */
    /* both */
    const bf16 *partial; /* NULL: no partial (backward only) */
    const bf16 *query, *key_norm;
    float eps, inverse_width;
    int n_completed, tokens, heads, vectors, head_vectors, slots, d;
    int warps; /* the narrow backward's warps */
};

/* The forward's arguments (runtime/backend.h route_merge_forward's), the row layout's shape
 * fields left 0: all the warp-a-token kernels read. */
MergeArgs merge_forward_args(bf16 *out, float *weights, float *rstd, const bf16 *result,
                             const float *lse, const bf16 *partial, int n_sources,
                             const bf16 *query, const bf16 *key_norm, int tokens, int d,
                             int heads, float eps);

/* The backward's arguments (runtime/backend.h route_merge_backward's; partials: the rows of
 * channel sums the kernel leaves for merge_channel_sums_reduce). shape: the block-a-token
 * layout's (RowShape{} for the warp-a-token kernels, which do not read it). */
MergeArgs merge_backward_args(bf16 *dpartial, GradMode dpartial_mode, float *mean,
                              const bf16 *dout, const bf16 *out, const bf16 *partial,
                              int n_sources, const float *weights, const float *rstd,
                              const bf16 *query, const bf16 *key_norm, float *partials,
                              int tokens, int d, int heads, const RowShape &shape);
/* dquery += and dkey_norm += the channel sums' rows partials [blocks, d] (NULL: none),
 * added in block order, and plain_sum += the rows plain_partials [blocks, d] (NULL: none),
 * in one launch (route_block_reduce). */
void merge_channel_sums_reduce(float *dquery, float *dkey_norm, const bf16 *query,
                               const bf16 *key_norm, float *partials, float *plain_sum,
                               const float *plain_partials, int blocks, int d,
                               cudaStream_t stream);
/* Whether the warp-a-token merges take rows of d channels in `heads` heads: d % 256 == 0,
 * d <= 2048, heads dividing 32, every pointer (NULL ones ignored) 16-byte aligned. */
bool merge_narrow_fits(int d, int heads, const void *const *pointers, int count);

/* The warp-a-token merges' blocks: four warps. The backward's channel sums are a row a
 * block (merge_narrow_backward_blocks), so a kernel that follows its token partition
 * (route_merge_norm_backward_cuda.cu) launches blocks of this size too. */
enum { MERGE_NARROW_THREADS = 128 };

/* The narrow backward's warps for `tokens`, a function of the shapes only: the rows of
 * channel sums it leaves in args.partials ([warps, d]) when it has a partial. */
int merge_narrow_backward_warps(int tokens);
/* The rows of channel sums the narrow backward leaves in args.partials ([blocks, d]) when it
 * has a partial: a row for each block of four of those warps, in block order. The merge
 * with the convolution inside its read leaves as many a stream. */
int merge_narrow_backward_blocks(int tokens);

/* launcher<LV>(...) for the narrow layout's LV = d / 256 (1 .. 8; route_merge_narrow.cuh),
 * the one switch the narrow and merge-conv launches share */
#define MERGE_NARROW_BY_WIDTH(d, launcher, ...)                                                 \
    do {                                                                                         \
        switch ((d) / 256) {                                                                     \
        case 1: launcher<1>(__VA_ARGS__); break;                                                 \
        case 2: launcher<2>(__VA_ARGS__); break;                                                 \
        case 3: launcher<3>(__VA_ARGS__); break;                                                 \
        case 4: launcher<4>(__VA_ARGS__); break;                                                 \
        case 5: launcher<5>(__VA_ARGS__); break;                                                 \
        case 6: launcher<6>(__VA_ARGS__); break;                                                 \
        case 7: launcher<7>(__VA_ARGS__); break;                                                 \
        default: launcher<8>(__VA_ARGS__); break;                                                \
        }                                                                                        \
    } while (0)

/* cuda_route_merge_forward / backward a warp a token (args.warps set by the backward) */
void merge_narrow_forward(const MergeArgs &args, int d, cudaStream_t stream);
void merge_narrow_backward(const MergeArgs &args, int d, cudaStream_t stream);

#endif
