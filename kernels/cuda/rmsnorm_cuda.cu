/* kernels/cuda/rmsnorm_cuda.cu — RMSNorm over the rows of [rows, d] (DESIGN 2), bf16 in and
 * out, fp32 statistics.
 *
 * Forward: rstd = rsqrt(mean(x^2) + eps) in fp32, out = bf16(weight * bf16(x * rstd)), the
 * product order of Hugging Face's LlamaRMSNorm (cast to the activation dtype, then weight).
 * The gated forward (add_scaled_rmsnorm_forward) first forms x = bf16(base + alpha * route)
 * in the registers that hold the row, stores it, and norms it as above; where it is given
 * the sublayer before's output f, base = bf16(base + f) (stored) and the partial
 * bf16(partial_before + f) come first. The standard stream's add before its norm
 * (add_rmsnorm_forward) is that first add alone, its sum stored to a buffer of its own.
 * Backward, with xhat = x * rstd and dxhat = dout * weight (fp32):
 *   g        = rstd * (dxhat - xhat * mean(dxhat * xhat))
 *   dx      += g, or = +0.0 + g without reading dx (GRAD_WRITE: the bits of an add into
 *              zeros, runtime/backend.h), or, for an input that branches (runtime/backend.h
 *              rmsnorm_backward_branch): dx = bf16(g) and branch += that same bf16(g)
 *   dweight += sum over rows of dout * xhat
 *
 * Layout: a "row team" of ROW_THREADS threads handles one row at a time, each thread CHUNKS
 * groups of 8 columns held in registers, so a row is read from memory once. Narrow rows
 * (d <= 1024, e.g. per-head q/k norms) get a warp each, eight rows to a block; so do rows of
 * up to 1280 (the 1B model's width), five chunks a lane: as a block's row they left 96 of
 * 256 threads idle and a block barrier in every row sum, and the backward at 8192 x 1280
 * moved 1.6 TB/s (docs/performance.md, 2026-12-05). Wider rows (d <= 8192) get the whole
 * 256-thread block. The row sums use row_sum (fixed order).
 *
 * dweight without atomics: rows are cut into groups of consecutive rows, one team per group;
 * a team adds its rows' dout * xhat per column in row order in registers and writes the
 * group's partial row to the workspace [groups, d]; a second kernel adds the partials of
 * each column in group order (32 interleaved slices, then the slices in order) into dweight.
 * The group size depends only on rows and d: about 4096 warps of work in the first pass.
 */
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/ordered_sum.cuh"
#include "kernels/cuda/rmsnorm_row.cuh"
#include "runtime/error.h"

enum {
    RMSNORM_THREADS = 256,      /* every launch of the first pass */
    RMSNORM_MAX_D = 8192,       /* 256 threads x 4 chunks x 8 columns */
    RMSNORM_TARGET_WARPS = 4096, /* first-pass work, in warps, that sets the group size */
    RMSNORM_WARP_MAX_D = 1280,   /* the widest row a warp takes (5 chunks a lane) */
    /* groups of the backward at warp teams of more than 4 chunks: each group writes a
     * partial row of d floats, so fewer, longer groups (8 rows each at 8192 rows) */
    RMSNORM_WIDE_WARP_GROUPS = 1024,
    REDUCE_COLUMNS = 32,        /* second pass: columns of a block ... */
    REDUCE_SLICES = 32,         /* ... and interleaved slices of the partials */
};

/* The row-team shape for a width d. */
typedef struct RmsnormShape {
    int row_threads; /* 32 or RMSNORM_THREADS */
    int chunks;      /* 1, 2 or 4; 5 for a warp team over 1024 < d <= 1280 */
} RmsnormShape;

static RmsnormShape rmsnorm_shape(int d)
{
    if (d > RMSNORM_MAX_D)
        fatal(EXIT_CONFIG,
              "rmsnorm on the cuda backend takes rows of at most %d values, got d = %d",
              RMSNORM_MAX_D, d);
    RmsnormShape shape;
    shape.row_threads = d <= RMSNORM_WARP_MAX_D ? 32 : RMSNORM_THREADS;
    int needed = (d + shape.row_threads * 8 - 1) / (shape.row_threads * 8);
    shape.chunks = needed <= 1 ? 1 : needed <= 2 ? 2 : needed <= 4 ? 4 : 5;
    return shape;
}

/* Rows per group in the backward: enough groups for RMSNORM_TARGET_WARPS warps of work. */
static int rmsnorm_rows_per_group(int rows, RmsnormShape shape)
{
    int target_groups = shape.chunks == 5 ? RMSNORM_WIDE_WARP_GROUPS
                                          : RMSNORM_TARGET_WARPS / (shape.row_threads / 32);
    int per_group = (rows + target_groups - 1) / target_groups;
    return per_group < 1 ? 1 : per_group;
}

/* GATED: the instance that may form a gate (route) or add into a partial; the others keep
 * no registers for those rows, so more rows run at once (a plain norm, or one with the
 * standard stream's add). */
template <int ROW_THREADS, int CHUNKS, bool VECTOR, bool GATED>
__global__ void __launch_bounds__(RMSNORM_THREADS)
    rmsnorm_forward_kernel(bfloat *out, float *rstd, const NormInput input,
                           const bfloat *weight, int rows, int d, float eps)
{
    __shared__ float scratch[RMSNORM_THREADS / 32];
    int lane = threadIdx.x % ROW_THREADS;
    int row = blockIdx.x * (RMSNORM_THREADS / ROW_THREADS) + threadIdx.x / ROW_THREADS;
    if (row >= rows)
        return; /* a whole team leaves together (a whole block when ROW_THREADS = 256) */

    const bfloat *x_row = input.x + (size_t)row * d;
    uint4 raw[CHUNKS], route_raw[CHUNKS];
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++) {
        raw[chunk] = load8_raw<VECTOR>(x_row, (chunk * ROW_THREADS + lane) * 8, d);
        if (GATED && input.route)
            route_raw[chunk] = load8_raw<VECTOR>(input.route + (size_t)row * d,
                                                 (chunk * ROW_THREADS + lane) * 8, d);
    }
    rmsnorm_input_form<ROW_THREADS, CHUNKS, VECTOR, GATED>(raw, route_raw,
                                                           GATED && input.route, input, row, d);
    rmsnorm_row_forward<ROW_THREADS, CHUNKS, VECTOR>(out + (size_t)row * d, rstd + row, raw,
                                                     weight, d, eps, scratch);
}

/* What the backward reads of one row, in this thread's columns: x, dout, and the extra row
 * (dx when it is added into, the branch when there is one; else zeros), and the row's
 * rstd. */
template <int CHUNKS>
struct NormRowInputs {
    uint4 x[CHUNKS], dout[CHUNKS], extra[CHUNKS];
    float rstd;
};

/* One chunk of the extra row at `column` of the row starting at `at`: zeros where there is no
 * extra row. */
template <bool VECTOR>
__device__ __forceinline__ uint4 norm_extra_chunk(const bfloat *extra, size_t at, int column,
                                                  int d)
{
    return extra ? load8_raw<VECTOR>(extra + at, column, d) : make_uint4(0u, 0u, 0u, 0u);
}

template <int ROW_THREADS, int CHUNKS, bool VECTOR>
__device__ __forceinline__ void norm_row_load_extra(NormRowInputs<CHUNKS> &in,
                                                    const bfloat *extra, int row, int d,
                                                    int lane)
{
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++)
        in.extra[chunk] =
            norm_extra_chunk<VECTOR>(extra, (size_t)row * d, (chunk * ROW_THREADS + lane) * 8, d);
}

/* Loads x, dout and rstd of `row`, and the extra row too where WITH_EXTRA. */
template <int ROW_THREADS, int CHUNKS, bool VECTOR, bool WITH_EXTRA>
__device__ __forceinline__ void norm_row_load(NormRowInputs<CHUNKS> &in, const bfloat *x,
                                              const bfloat *dout, const bfloat *extra,
                                              const float *rstd, int row, int d, int lane)
{
    const size_t at = (size_t)row * d;
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++) {
        const int column = (chunk * ROW_THREADS + lane) * 8;
        in.x[chunk] = load8_raw<VECTOR>(x + at, column, d);
        in.dout[chunk] = load8_raw<VECTOR>(dout + at, column, d);
    }
    if (WITH_EXTRA)
        norm_row_load_extra<ROW_THREADS, CHUNKS, VECTOR>(in, extra, row, d, lane);
    in.rstd = rstd[row];
}

/* First pass of the backward: dx of every row, partial dweight of every group of rows.
 * branch NULL: dx += g (accumulate) or dx = +0.0 + g (dx not read); otherwise dx = bf16(g)
 * and branch += bf16(g).
 * Each team requests its next row (x, dout, the row added into, rstd) before it sums this
 * one: a row at a time, with the added-into row read only after the row sum, the 4096 x 4096
 * backward moved 2.2 TB/s (the loads of a row, then its barriers and stores, with nothing in
 * flight). The row's arithmetic and its order are unchanged. */
template <int ROW_THREADS, int CHUNKS, bool VECTOR>
__global__ void __launch_bounds__(RMSNORM_THREADS)
    rmsnorm_backward_kernel(bfloat *dx, bool accumulate, bfloat *branch, float *partials,
                            const bfloat *dout, const bfloat *x, const bfloat *weight,
                            const float *rstd, int rows, int d, int rows_per_group)
{
    __shared__ float scratch[RMSNORM_THREADS / 32];
    int lane = threadIdx.x % ROW_THREADS;
    int group = blockIdx.x * (RMSNORM_THREADS / ROW_THREADS) + threadIdx.x / ROW_THREADS;
    int first = group * rows_per_group;
    if (first >= rows)
        return; /* whole team, as in the forward */
    int last = min(first + rows_per_group, rows);
    const bfloat *extra = branch ? branch : accumulate ? dx : NULL;

    uint4 weight_raw[CHUNKS];
    float dweight_sum[CHUNKS][8];
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++) {
        weight_raw[chunk] = load8_raw<VECTOR>(weight, (chunk * ROW_THREADS + lane) * 8, d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            dweight_sum[chunk][k] = 0.0f;
    }

    /* a warp over 5 chunks requests the next row's x and dout only, and this row's extra row
     * as the row begins: the whole next row made more than 255 registers (spills) */
    constexpr bool WHOLE_NEXT_ROW = CHUNKS <= 4;
    NormRowInputs<CHUNKS> current, next;
    norm_row_load<ROW_THREADS, CHUNKS, VECTOR, WHOLE_NEXT_ROW>(current, x, dout, extra, rstd,
                                                               first, d, lane);
    for (int row = first; row < last; row++) {
        if (!WHOLE_NEXT_ROW)
            norm_row_load_extra<ROW_THREADS, CHUNKS, VECTOR>(current, extra, row, d, lane);
        if (row + 1 < last)
            norm_row_load<ROW_THREADS, CHUNKS, VECTOR, WHOLE_NEXT_ROW>(next, x, dout, extra,
                                                                       rstd, row + 1, d, lane);
        bfloat *dx_row = dx + (size_t)row * d;
        const float row_rstd = current.rstd;

        const float mean_dot = rmsnorm_row_backward_centre<ROW_THREADS, CHUNKS>(
            current.x, current.dout, weight_raw, row_rstd, d, scratch);

#pragma unroll
        for (int chunk = 0; chunk < CHUNKS; chunk++) {
            int column = (chunk * ROW_THREADS + lane) * 8;
            float g[8], dxs[8];
            rmsnorm_chunk_backward(g, dweight_sum[chunk], current.x[chunk], current.dout[chunk],
                                   weight_raw[chunk], row_rstd, mean_dot);
            if (branch) {
                float branches[8];
                unpack8(branches, current.extra[chunk]);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    dxs[k] = __bfloat162float(__float2bfloat16_rn(g[k]));
                    branches[k] = __bfloat162float(__float2bfloat16_rn(branches[k] + dxs[k]));
                }
                store8<VECTOR>(branch + (size_t)row * d, column, d, branches);
            } else {
                /* the extra row is dx when it is added into, zeros (+0.0) when written */
                unpack8(dxs, current.extra[chunk]);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    dxs[k] = __fadd_rn(dxs[k], g[k]);
            }
            store8<VECTOR>(dx_row, column, d, dxs);
        }
        current = next;
    }

    float *partial_row = partials + (size_t)group * d;
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; chunk++)
        store8_float<VECTOR>(partial_row, (chunk * ROW_THREADS + lane) * 8, d,
                             dweight_sum[chunk]);
}

/* Second pass: dweight[c] += sum over groups g, in order, of partials[g, c].
 * block (REDUCE_COLUMNS, REDUCE_SLICES); slice s adds groups s, s + SLICES, ... (16 loads in
 * flight a thread: at the 1B step's 1024 groups the compiler's own unrolling kept 4, eight
 * round trips to L2 a launch); then the slices are added in order by the first row of
 * threads. */
__global__ void __launch_bounds__(REDUCE_COLUMNS *REDUCE_SLICES)
    rmsnorm_dweight_reduce_kernel(float *dweight, const float *partials, int groups, int d)
{
    __shared__ float slice_sums[REDUCE_SLICES][REDUCE_COLUMNS + 1];
    int column = blockIdx.x * REDUCE_COLUMNS + threadIdx.x;
    float sum = 0.0f;
    if (column < d)
        sum = ordered_strided_sum<16>(partials + (size_t)threadIdx.y * d + column,
                                      strided_count(threadIdx.y, groups, REDUCE_SLICES),
                                      (long long)REDUCE_SLICES * d);
    slice_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && column < d) {
        float total = 0.0f;
        for (int slice = 0; slice < REDUCE_SLICES; slice++)
            total += slice_sums[slice][threadIdx.x];
        dweight[column] += total;
    }
}

/* The kernels are instantiated for each row-team shape; these tables pick the instance.
 * Index: [row_threads == 32 ? 0 : 1][chunks 1, 2, 4, 5 -> 0, 1, 2, 3]; a block team never
 * takes 5 chunks (rmsnorm_shape). */
typedef void (*ForwardLaunch)(bool vector, unsigned blocks, cudaStream_t stream, bfloat *out,
                              float *rstd, const NormInput &input, const bfloat *weight,
                              int rows, int d, float eps);
typedef void (*BackwardLaunch)(bool vector, unsigned blocks, cudaStream_t stream, bfloat *dx,
                               bool accumulate, bfloat *branch, float *partials,
                               const bfloat *dout, const bfloat *x, const bfloat *weight,
                               const float *rstd, int rows, int d, int rows_per_group);

template <int ROW_THREADS, int CHUNKS>
static void launch_forward(bool vector, unsigned blocks, cudaStream_t stream, bfloat *out,
                           float *rstd, const NormInput &input, const bfloat *weight, int rows,
                           int d, float eps)
{
    const bool gated = input.route || input.partial;
#define FORWARD(VECTOR_, GATED_)                                                               \
    rmsnorm_forward_kernel<ROW_THREADS, CHUNKS, VECTOR_, GATED_>                               \
        <<<blocks, RMSNORM_THREADS, 0, stream>>>(out, rstd, input, weight, rows, d, eps)
    if (gated)
        vector ? FORWARD(true, true) : FORWARD(false, true);
    else
        vector ? FORWARD(true, false) : FORWARD(false, false);
#undef FORWARD
    CUDA_CHECK_LAUNCH();
}

template <int ROW_THREADS, int CHUNKS>
static void launch_backward(bool vector, unsigned blocks, cudaStream_t stream, bfloat *dx,
                            bool accumulate, bfloat *branch, float *partials,
                            const bfloat *dout, const bfloat *x, const bfloat *weight,
                            const float *rstd, int rows, int d, int rows_per_group)
{
#define BACKWARD(VECTOR_)                                                                      \
    rmsnorm_backward_kernel<ROW_THREADS, CHUNKS, VECTOR_><<<blocks, RMSNORM_THREADS, 0, stream>>>( \
        dx, accumulate, branch, partials, dout, x, weight, rstd, rows, d, rows_per_group)
    vector ? BACKWARD(true) : BACKWARD(false);
#undef BACKWARD
    CUDA_CHECK_LAUNCH();
}

static const ForwardLaunch forward_launches[2][4] = {
    {launch_forward<32, 1>, launch_forward<32, 2>, launch_forward<32, 4>, launch_forward<32, 5>},
    {launch_forward<RMSNORM_THREADS, 1>, launch_forward<RMSNORM_THREADS, 2>,
     launch_forward<RMSNORM_THREADS, 4>, NULL},
};
static const BackwardLaunch backward_launches[2][4] = {
    {launch_backward<32, 1>, launch_backward<32, 2>, launch_backward<32, 4>,
     launch_backward<32, 5>},
    {launch_backward<RMSNORM_THREADS, 1>, launch_backward<RMSNORM_THREADS, 2>,
     launch_backward<RMSNORM_THREADS, 4>, NULL},
};

static int team_index(RmsnormShape shape)
{
    return shape.row_threads == 32 ? 0 : 1;
}

static int chunk_index(RmsnormShape shape)
{
    return shape.chunks == 1 ? 0 : shape.chunks == 2 ? 1 : shape.chunks == 4 ? 2 : 3;
}

static void rmsnorm_forward_launch(bf16 *out, float *rstd, const NormInput &input,
                                   const bf16 *weight, int rows, int d, float eps,
                                   cudaStream_t stream)
{
    if (rows <= 0 || d <= 0)
        return;
    RmsnormShape shape = rmsnorm_shape(d);
    int rows_per_block = RMSNORM_THREADS / shape.row_threads;
    unsigned blocks = (unsigned)((rows + rows_per_block - 1) / rows_per_block);
    bool vector = d % 8 == 0 && is_aligned_16(out) && is_aligned_16(input.x) &&
                  is_aligned_16(weight) && is_aligned_16(input.route) &&
                  is_aligned_16(input.gated) && is_aligned_16(input.added) &&
                  is_aligned_16(input.partial_before) && is_aligned_16(input.stream) &&
                  is_aligned_16(input.partial);
    forward_launches[team_index(shape)][chunk_index(shape)](
        vector, blocks, stream, (bfloat *)out, rstd, input, (const bfloat *)weight, rows, d, eps);
}

extern "C" void cuda_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *x, const bf16 *weight,
                                     int rows, int d, float eps, cudaStream_t stream)
{
    const NormInput input = {(const bfloat *)x, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    rmsnorm_forward_launch(out, rstd, input, weight, rows, d, eps, stream);
}

/* One pass where add then rmsnorm_forward took two: 4 rows moved instead of 5 (a and b read,
 * sum and out written): the kernel's adds with the sum stored to its own buffer. */
extern "C" void cuda_add_rmsnorm_forward(bf16 *sum, bf16 *out, float *rstd, const bf16 *a,
                                         const bf16 *b, const bf16 *weight, int rows, int d,
                                         float eps, cudaStream_t stream)
{
    const NormInput input = {(const bfloat *)a, NULL, NULL, NULL, (const bfloat *)b,
                             NULL, (bfloat *)sum, NULL};
    rmsnorm_forward_launch(out, rstd, input, weight, rows, d, eps, stream);
}

/* One pass where add_scaled then rmsnorm_forward took two: 4 rows moved instead of 5 (base
 * and route read, x and out written). With the adds, 8 rows instead of add_both's 5 and
 * these 4 (the stream is read once), 6 instead of add_inplace's 3 and 4. */
extern "C" void cuda_add_scaled_rmsnorm_forward(bf16 *x, bf16 *out, float *rstd,
                                                const bf16 *base, const bf16 *route,
                                                const float *alpha, const bf16 *weight, int rows,
                                                int d, float eps, const CudaGateAdd *add,
                                                cudaStream_t stream)
{
    rmsnorm_forward_launch(out, rstd, norm_input_of_gate(base, route, alpha, x, add), weight,
                           rows, d, eps, stream);
}

extern "C" size_t cuda_rmsnorm_backward_workspace_floats(int rows, int d)
{
    if (rows <= 0 || d <= 0)
        return 0;
    RmsnormShape shape = rmsnorm_shape(d);
    int per_group = rmsnorm_rows_per_group(rows, shape);
    size_t groups = (size_t)((rows + per_group - 1) / per_group);
    return groups * (size_t)d;
}

/* Both backwards: branch NULL, dx += g (accumulate) or dx = +0.0 + g; otherwise dx = bf16(g)
 * and branch += it. dweight += the groups' partials, summed. */
static void rmsnorm_backward_launch(bf16 *dx, bool accumulate, bf16 *branch, float *dweight,
                                    const bf16 *dout, const bf16 *x, const bf16 *weight,
                                    const float *rstd, int rows, int d, float *workspace,
                                    cudaStream_t stream)
{
    if (rows <= 0 || d <= 0)
        return;
    RmsnormShape shape = rmsnorm_shape(d);
    int per_group = rmsnorm_rows_per_group(rows, shape);
    int groups = (rows + per_group - 1) / per_group;
    int groups_per_block = RMSNORM_THREADS / shape.row_threads;
    unsigned blocks = (unsigned)((groups + groups_per_block - 1) / groups_per_block);
    bool vector = d % 8 == 0 && is_aligned_16(dx) && is_aligned_16(workspace) &&
                  is_aligned_16(dout) && is_aligned_16(x) && is_aligned_16(weight) &&
                  is_aligned_16(branch);
    backward_launches[team_index(shape)][chunk_index(shape)](
        vector, blocks, stream, (bfloat *)dx, accumulate, (bfloat *)branch, workspace,
        (const bfloat *)dout, (const bfloat *)x, (const bfloat *)weight, rstd, rows, d,
        per_group);

    cuda_rmsnorm_dweight_reduce(dweight, workspace, groups, d, stream);
}

extern "C" void cuda_rmsnorm_dweight_reduce(float *dweight, const float *partials, int groups,
                                            int d, cudaStream_t stream)
{
    if (groups <= 0 || d <= 0)
        return;
    dim3 reduce_block(REDUCE_COLUMNS, REDUCE_SLICES);
    unsigned reduce_blocks = (unsigned)((d + REDUCE_COLUMNS - 1) / REDUCE_COLUMNS);
    rmsnorm_dweight_reduce_kernel<<<reduce_blocks, reduce_block, 0, stream>>>(dweight, partials,
                                                                            groups, d);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rmsnorm_backward_branch(bf16 *dx, bf16 *branch, float *dweight,
                                             const bf16 *dout, const bf16 *x, const bf16 *weight,
                                             const float *rstd, int rows, int d,
                                             float *workspace, cudaStream_t stream)
{
    rmsnorm_backward_launch(dx, true, branch, dweight, dout, x, weight, rstd, rows, d,
                            workspace, stream);
}

extern "C" void cuda_rmsnorm_backward(bf16 *dx, GradMode dx_mode, float *dweight,
                                      const bf16 *dout, const bf16 *x, const bf16 *weight,
                                      const float *rstd, int rows, int d, float *workspace,
                                      cudaStream_t stream)
{
    rmsnorm_backward_launch(dx, dx_mode == GRAD_ADD, NULL, dweight, dout, x, weight, rstd, rows,
                            d, workspace, stream);
}
