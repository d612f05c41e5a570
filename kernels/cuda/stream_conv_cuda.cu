/* kernels/cuda/stream_conv_cuda.cu — MSAR's causal depthwise convolution on the GPU (DESIGN
 * 2.2; contract in route_cuda.h; the math and its backward are kernels/cpu/stream_cpu.c's):
 *   out[b,t,c] = sum_{tau < k, tau <= t} taps[tau,c] x[b,t-tau,c]
 *   dx[b,t,c] += sum_{tau < k, t + tau < T} taps[tau,c] dout[b,t+tau,c]
 *   dtaps[tau,c] += sum_{b, t >= tau} dout[b,t,c] x[b,t-tau,c]
 * x, out, dout, dx [B, T, d] bf16; taps [k, d] bf16 (k <= CUDA_ROUTE_CONV_MAX_KERNEL); dtaps
 * fp32.
 *
 * One launch convolves up to CONV_BATCH rows (a block's sources, each with its own taps:
 * blockIdx.y picks the row), since one row of the 1B width fills 60% of the GPU's threads for
 * about 10 us of bytes: a launch a row paid its ramp and tail each time (17-23 us a launch,
 * 5184 launches a step; docs/performance.md, ninth run).
 *
 * A thread owns VEC channels (4, or fewer when d or the pointers say so) of a run of rows of
 * one sequence, and walks it in time with its taps and the last k - 1 rows it read in
 * registers (TAPS, the kernel size rounded up to 1, 2, 4 or 8): each row is read once and each
 * tap converted once a thread. A thread an item (a row's vector), reading its k rows and taps
 * again, spent its time on index arithmetic and conversions: 15-34 us a launch at the 1B step
 * for 10 us of bytes (ncu, docs/performance.md, ninth run).
 * - forward: runs of CONV_RUN rows, the window the rows before; sums in fp32 from tau = 0,
 *   rounded once (identity taps give x bit for bit).
 * - dx: the same runs walked backwards, the window the rows after.
 * - dtaps: fixed row ranges (taps_range_count), across sequences, one partial a range and
 *   tap [ranges, k, d] in the workspace; a second kernel adds the ranges in a fixed order
 *   (slices of ranges, then the slices). Deterministic: the ranges depend on the shape only.
 */
#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"

enum {
    CONV_THREADS = 256,
    CONV_RUN = 16,              /* rows a thread walks in the forward and dx */
    CONV_PARTIALS = 128,        /* row ranges of the dtaps partials, at least */
    CONV_RANGES_MAX = 512,      /* and at most */
    CONV_SUM_SLICES = 8,        /* warps splitting the ranges in the partials' sum */
    CONV_BATCH = 12,            /* rows a launch: a block's sources (CUDA_BLOCK_MAX_SOURCES) */
};

/* The rows of one launch, by value in the kernel's parameters: row n (blockIdx.y) writes
 * out[n] (the forward's out, or dx) from in[n] (x, or dout) and taps[n]. */
struct ConvBatch {
    bf16 *out[CONV_BATCH];
    const bf16 *in[CONV_BATCH];
    const bf16 *taps[CONV_BATCH];
};

static void conv_check(int kernel_size, int d)
{
    if (d < 1 || d > CUDA_ROUTE_MAX_WIDTH)
        fatal(EXIT_CONFIG, "model.d_model = %d: the cuda stream kernels take 1 to %d channels",
              d, CUDA_ROUTE_MAX_WIDTH);
    if (kernel_size < 1 || kernel_size > CUDA_ROUTE_CONV_MAX_KERNEL)
        fatal(EXIT_CONFIG, "residual.stream_kernels: a kernel size is %d; the cuda stream "
              "convolution takes 1 to %d", kernel_size, CUDA_ROUTE_CONV_MAX_KERNEL);
}

/* A thread's taps, tau < k, as floats (0 past k: never read) */
template <int VEC, int TAPS>
__device__ __forceinline__ void conv_load_taps(float (&tap)[TAPS][VEC], const bf16 *taps,
                                               int kernel_size, int v, int vectors)
{
#pragma unroll
    for (int tau = 0; tau < TAPS; tau++) {
        if (tau < kernel_size)
            vector_to_floats<VEC>(vector_load<VEC>(taps, (long long)tau * vectors + v), tap[tau]);
        else
#pragma unroll
            for (int i = 0; i < VEC; i++)
                tap[tau][i] = 0.0f;
    }
}

/* window[0] = the row just read, window[j] the one j before it */
template <int VEC, int TAPS>
__device__ __forceinline__ void conv_window_push(float (&window)[TAPS][VEC], const float *row)
{
#pragma unroll
    for (int j = TAPS - 1; j > 0; j--)
#pragma unroll
        for (int i = 0; i < VEC; i++)
            window[j][i] = window[j - 1][i];
#pragma unroll
    for (int i = 0; i < VEC; i++)
        window[0][i] = row[i];
}

/* sum = sum over tau < taps_here of tap[tau] window[tau], from tau = 0 (a product alone) */
template <int VEC, int TAPS>
__device__ __forceinline__ void conv_sum(float *sum, const float (&tap)[TAPS][VEC],
                                         const float (&window)[TAPS][VEC], int taps_here)
{
#pragma unroll
    for (int i = 0; i < VEC; i++)
        sum[i] = tap[0][i] * window[0][i];
#pragma unroll
    for (int tau = 1; tau < TAPS; tau++)
        if (tau < taps_here)
#pragma unroll
            for (int i = 0; i < VEC; i++)
                sum[i] += tap[tau][i] * window[tau][i];
}

/* thread -> (vector v, sequence b, first row t0 of its run) */
struct ConvRun {
    int v, b, t0;
};

__device__ __forceinline__ bool conv_run_of(ConvRun *run, int B, int T, int vectors)
{
    const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long runs_per_sequence = (T + CONV_RUN - 1) / CONV_RUN;
    if (thread >= (long long)B * runs_per_sequence * vectors)
        return false;
    const long long index = thread / vectors;
    run->v = (int)(thread - index * vectors);
    run->b = (int)(index / runs_per_sequence);
    run->t0 = (int)(index - run->b * runs_per_sequence) * CONV_RUN;
    return true;
}

template <int VEC, int TAPS>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_forward_kernel(ConvBatch batch, int kernel_size, int B, int T, int vectors)
{
    ConvRun run;
    if (!conv_run_of(&run, B, T, vectors))
        return;
    bf16 *out = batch.out[blockIdx.y];
    const bf16 *x = batch.in[blockIdx.y], *taps = batch.taps[blockIdx.y];
    float tap[TAPS][VEC], window[TAPS][VEC] = {};
    conv_load_taps<VEC, TAPS>(tap, taps, kernel_size, run.v, vectors);
    const long long sequence = (long long)run.b * T;
    /* the rows before the run, oldest first (a row before t = 0 is never read: tau <= t) */
    for (int t = run.t0 - (TAPS - 1); t < run.t0; t++) {
        float row[VEC] = {};
        if (t >= 0)
            vector_to_floats<VEC>(vector_load<VEC>(x, (sequence + t) * vectors + run.v), row);
        conv_window_push<VEC, TAPS>(window, row);
    }
    const int end = run.t0 + CONV_RUN < T ? run.t0 + CONV_RUN : T;
    BfVector<VEC> next = vector_load<VEC>(x, (sequence + run.t0) * vectors + run.v);
    for (int t = run.t0; t < end; t++) {
        float row[VEC], sum[VEC];
        vector_to_floats<VEC>(next, row);
        if (t + 1 < end) /* the next row in flight while this one is summed */
            next = vector_load<VEC>(x, (sequence + t + 1) * vectors + run.v);
        conv_window_push<VEC, TAPS>(window, row);
        conv_sum<VEC, TAPS>(sum, tap, window, kernel_size < t + 1 ? kernel_size : t + 1);
        vector_store<VEC>(out, (sequence + t) * vectors + run.v, vector_from_floats<VEC>(sum));
    }
}

template <int VEC, int TAPS>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_input_grad_kernel(ConvBatch batch, int kernel_size, int B, int T, int vectors)
{
    ConvRun run;
    if (!conv_run_of(&run, B, T, vectors))
        return;
    bf16 *dx = batch.out[blockIdx.y];
    const bf16 *dout = batch.in[blockIdx.y], *taps = batch.taps[blockIdx.y];
    float tap[TAPS][VEC], window[TAPS][VEC] = {};
    conv_load_taps<VEC, TAPS>(tap, taps, kernel_size, run.v, vectors);
    const long long sequence = (long long)run.b * T;
    const int end = run.t0 + CONV_RUN < T ? run.t0 + CONV_RUN : T;
    /* the rows after the run, latest first (a row at T or past it is never read) */
    for (int t = end + TAPS - 2; t >= end; t--) {
        float row[VEC] = {};
        if (t < T)
            vector_to_floats<VEC>(vector_load<VEC>(dout, (sequence + t) * vectors + run.v), row);
        conv_window_push<VEC, TAPS>(window, row);
    }
    BfVector<VEC> next = vector_load<VEC>(dout, (sequence + end - 1) * vectors + run.v);
    for (int t = end - 1; t >= run.t0; t--) {
        const long long at = (sequence + t) * vectors + run.v;
        const BfVector<VEC> grad_raw = vector_load_mutable<VEC>(dx, at);
        float row[VEC], sum[VEC], grad[VEC];
        vector_to_floats<VEC>(next, row);
        if (t > run.t0)
            next = vector_load<VEC>(dout, (sequence + t - 1) * vectors + run.v);
        conv_window_push<VEC, TAPS>(window, row);
        conv_sum<VEC, TAPS>(sum, tap, window, kernel_size < T - t ? kernel_size : T - t);
        vector_to_floats<VEC>(grad_raw, grad);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            grad[i] += sum[i];
        vector_store<VEC>(dx, at, vector_from_floats<VEC>(grad));
    }
}

/* Row ranges of the dtaps partials: about CONV_PARTIALS * 512 threads whatever the width
 * (fewer vectors a row, more ranges), within [CONV_PARTIALS, CONV_RANGES_MAX] and `rows`. */
static int taps_range_count(long long rows, int vectors)
{
    long long ranges = (long long)CONV_PARTIALS * 512 / (vectors > 0 ? vectors : 1);
    if (ranges < CONV_PARTIALS)
        ranges = CONV_PARTIALS;
    if (ranges > CONV_RANGES_MAX)
        ranges = CONV_RANGES_MAX;
    return (int)(rows < ranges ? rows : ranges);
}

/* partials[range, tau, c] = sum over the range's rows (b, t) in order, t >= tau, of
 * dout[b,t,c] x[b,t-tau,c]; a thread a (vector, range) */
template <int VEC, int TAPS>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_taps_partial_kernel(float *partials, const bf16 *dout, const bf16 *x, int kernel_size,
                             long long rows, int T, int vectors, int ranges)
{
    const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (thread >= (long long)ranges * vectors)
        return;
    const int range = (int)(thread / vectors), v = (int)(thread - (long long)range * vectors);
    const long long first = rows * range / ranges, last = rows * (range + 1) / ranges;
    float sums[TAPS][VEC] = {}, window[TAPS][VEC] = {};
    int t = (int)(first % T);
    /* the rows before the first of this sequence's part of the range (t - j >= 0) */
    for (int j = TAPS - 1; j >= 1; j--) {
        float row[VEC] = {};
        if (t - j >= 0)
            vector_to_floats<VEC>(vector_load<VEC>(x, (first - j) * vectors + v), row);
        conv_window_push<VEC, TAPS>(window, row);
    }
    BfVector<VEC> next_x = vector_load<VEC>(x, first * vectors + v);
    BfVector<VEC> next_dout = vector_load<VEC>(dout, first * vectors + v);
    for (long long row = first; row < last; row++, t = t + 1 == T ? 0 : t + 1) {
        float x_row[VEC], dy[VEC];
        vector_to_floats<VEC>(next_x, x_row);
        vector_to_floats<VEC>(next_dout, dy);
        if (row + 1 < last) {
            next_x = vector_load<VEC>(x, (row + 1) * vectors + v);
            next_dout = vector_load<VEC>(dout, (row + 1) * vectors + v);
        }
        conv_window_push<VEC, TAPS>(window, x_row);
#pragma unroll
        for (int tau = 0; tau < TAPS; tau++)
            if (tau < kernel_size && tau <= t) /* a new sequence's t restarts at 0 */
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    sums[tau][i] += dy[i] * window[tau][i];
    }
    const long long d = (long long)vectors * VEC;
#pragma unroll
    for (int tau = 0; tau < TAPS; tau++) {
        if (tau >= kernel_size)
            continue;
        float *partial = partials + ((long long)range * kernel_size + tau) * d + (long long)v * VEC;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            partial[i] = sums[tau][i];
    }
}

/* out[i] += sum over ranges of partials[range * count + i], i < count, in a fixed order:
 * block (32 consecutive i), warp w of CONV_SUM_SLICES the ranges w, w + slices, .. in
 * order, then the slices in order. */
__global__ void __launch_bounds__(CONV_SUM_SLICES * 32)
    conv_sum_partials_kernel(float *out, const float *partials, int ranges, long long count)
{
    __shared__ float slices[CONV_SUM_SLICES][32];
    const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
    const long long i = (long long)blockIdx.x * 32 + lane;
    float sum = 0.0f;
    if (i < count)
        for (int range = slice; range < ranges; range += CONV_SUM_SLICES)
            sum += partials[range * count + i];
    slices[slice][lane] = sum;
    __syncthreads();
    if (slice != 0 || i >= count)
        return;
    float total = 0.0f;
    for (int k = 0; k < CONV_SUM_SLICES; k++)
        total += slices[k][lane];
    out[i] += total;
}

/* ---- entries ---- */

static unsigned conv_blocks(long long threads)
{
    return (unsigned)((threads + CONV_THREADS - 1) / CONV_THREADS);
}

/* kernel<VEC, TAPS> for VEC 4, 2 or 1 and kernel sizes 1, 2, 3-4, 5-8 (TAPS 1, 2, 4, 8), on
 * a grid of (the blocks of `threads`, rows) */
#define CONV_LAUNCH(kernel, vec, kernel_size, threads, rows, ...)                               \
    do {                                                                                        \
        const int taps_ = (kernel_size) <= 1 ? 1 : (kernel_size) <= 2 ? 2                       \
                        : (kernel_size) <= 4 ? 4 : 8;                                           \
        const dim3 grid_(conv_blocks(threads), (unsigned)(rows));                               \
        switch ((vec) * 16 + taps_) {                                                           \
        case 4 * 16 + 1: kernel<4, 1><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 4 * 16 + 2: kernel<4, 2><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 4 * 16 + 4: kernel<4, 4><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 4 * 16 + 8: kernel<4, 8><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 2 * 16 + 1: kernel<2, 1><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 2 * 16 + 2: kernel<2, 2><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 2 * 16 + 4: kernel<2, 4><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 2 * 16 + 8: kernel<2, 8><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 1 * 16 + 1: kernel<1, 1><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 1 * 16 + 2: kernel<1, 2><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        case 1 * 16 + 4: kernel<1, 4><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;  \
        default: kernel<1, 8><<<grid_, CONV_THREADS, 0, stream>>>(__VA_ARGS__); break;          \
        }                                                                                       \
        CUDA_CHECK_LAUNCH();                                                                    \
    } while (0)

/* threads of the forward and dx: a run of CONV_RUN rows of one sequence and a vector each */
static long long conv_run_threads(int B, int T, int vectors)
{
    return (long long)B * ((T + CONV_RUN - 1) / CONV_RUN) * vectors;
}

/* The widest vector (4, 2, 1) that d and every pointer of rows [first, first + count) allow */
static int conv_vector(int d, const void *const *const *arrays, int n_arrays, int first,
                       int count)
{
    int vec = 4;
    for (int a = 0; a < n_arrays; a++)
        if (arrays[a])
            for (int n = first; n < first + count; n++)
                vec = widest_vector(vec, d, &arrays[a][n], 1);
    return vec;
}

/* Rows [first, first + count) of the arrays, count <= CONV_BATCH, as a launch's batch */
static ConvBatch conv_batch(bf16 *const *out, const bf16 *const *in, const bf16 *const *taps,
                            int first, int count)
{
    ConvBatch batch = {};
    for (int n = 0; n < count; n++) {
        batch.out[n] = out[first + n];
        batch.in[n] = in[first + n];
        batch.taps[n] = taps[first + n];
    }
    return batch;
}

extern "C" void cuda_stream_conv_forward(bf16 *const *out, const bf16 *const *x,
                                         const bf16 *const *taps, int count, int kernel_size,
                                         int B, int T, int d, cudaStream_t stream)
{
    conv_check(kernel_size, d);
    if ((long long)B * T <= 0)
        return;
    const void *const *arrays[] = {(const void *const *)out, (const void *const *)x,
                                   (const void *const *)taps};
    for (int first = 0; first < count; first += CONV_BATCH) {
        const int rows = count - first < CONV_BATCH ? count - first : CONV_BATCH;
        const int vec = conv_vector(d, arrays, 3, first, rows), vectors = d / vec;
        CONV_LAUNCH(conv_forward_kernel, vec, kernel_size, conv_run_threads(B, T, vectors), rows,
                    conv_batch(out, x, taps, first, rows), kernel_size, B, T, vectors);
    }
}

extern "C" size_t cuda_stream_conv_backward_workspace_floats(int kernel_size, int B, int T, int d)
{
    const long long rows = (long long)B * T;
    /* the most ranges any vector width gives: the widest vector (4) has the fewest vectors */
    return rows > 0 ? (size_t)taps_range_count(rows, (d + 3) / 4) * kernel_size * d : 1;
}

extern "C" void cuda_stream_conv_backward(bf16 *const *dx, float *const *dtaps,
                                          const bf16 *const *dout, const bf16 *const *x,
                                          const bf16 *const *taps, int count, int kernel_size,
                                          int B, int T, int d, float *workspace,
                                          cudaStream_t stream)
{
    conv_check(kernel_size, d);
    const long long rows = (long long)B * T;
    if (rows <= 0)
        return;
    const void *const *arrays[] = {(const void *const *)dx, (const void *const *)dout,
                                   (const void *const *)x, (const void *const *)taps};
    for (int first = 0; first < count; first += CONV_BATCH) {
        const int batch = count - first < CONV_BATCH ? count - first : CONV_BATCH;
        const int vec = conv_vector(d, arrays, 4, first, batch), vectors = d / vec;
        if (dx)
            CONV_LAUNCH(conv_input_grad_kernel, vec, kernel_size,
                        conv_run_threads(B, T, vectors), batch,
                        conv_batch(dx, dout, taps, first, batch), kernel_size, B, T, vectors);
        /* dtaps a row at a time: the partials of every row at once would need `batch` times
         * the workspace, which sits inside the step's peak memory */
        const int ranges = taps_range_count(rows, vectors);
        const long long count_floats = (long long)kernel_size * d;
        for (int n = first; n < first + batch; n++) {
            CONV_LAUNCH(conv_taps_partial_kernel, vec, kernel_size, (long long)ranges * vectors,
                        1, workspace, dout[n], x[n], kernel_size, rows, T, vectors, ranges);
            conv_sum_partials_kernel<<<(unsigned)((count_floats + 31) / 32),
                                       CONV_SUM_SLICES * 32, 0, stream>>>(dtaps[n], workspace,
                                                                          ranges, count_floats);
            CUDA_CHECK_LAUNCH();
        }
    }
}
