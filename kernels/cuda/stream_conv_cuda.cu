/* kernels/cuda/stream_conv_cuda.cu — MSAR's causal depthwise convolution on the GPU, the
 * forward (DESIGN 2.2; contract in route_cuda.h; the math is kernels/cpu/stream_cpu.c's):
 *   out[b,t,c] = sum_{tau < k, tau <= t} taps[tau,c] x[b,t-tau,c]
 * x, out [B, T, d] bf16; taps [k, d] bf16 (k <= CUDA_ROUTE_CONV_MAX_KERNEL). The backward is
 * stream_conv_backward_cuda.cu's.
 *
 * One launch convolves up to CONV_BATCH rows (a block's sources, each with its own taps:
 * blockIdx.y picks the row), since one row of the 1B width fills 60% of the GPU's threads for
 * about 10 us of bytes: a launch a row paid its ramp and tail each time (17-23 us a launch,
 * 5184 launches a step; docs/performance.md, ninth run). And up to CONV_STREAMS streams,
 * each with its own kernel size: a thread reads its run of x once and walks it once a
 * stream, so a row with m streams moves 1 + m rows where a stream a launch moved 2m (the
 * replace form's partial, convolved for every stream at each merge).
 *
 * A thread owns VEC channels (4, or fewer when d or the pointers say so) of a run of CONV_RUN
 * rows of one sequence, and walks it in time with its taps and the last k - 1 rows it read
 * in registers (TAPS, the kernel size rounded up to 1, 2, 4 or 8), the window the rows before
 * the run: each row is read once and each tap converted once a thread. The run's rows are
 * all requested before the first is summed (conv_load_rows). Sums in fp32 from
 * tau = 0, rounded once (identity taps give x bit for bit). A thread an item (a row's
 * vector), reading its k rows and taps again, spent its time on index arithmetic and
 * conversions: 15-34 us a launch at the 1B step for 10 us of bytes (ncu, docs/performance.md,
 * ninth run).
 */
#include "kernels/cuda/stream_conv.cuh"

enum {
    CONV_THREADS = 256,
    CONV_RUN = 16, /* rows a thread walks */
};

/* The rows and streams of one launch, by value in the kernel's parameters: row n
 * (blockIdx.y) of stream r writes out[r][n] from x[n] and taps[r][n]. */
struct ConvBatch {
    const bf16 *x[CONV_BATCH];
    bf16 *out[CONV_STREAMS][CONV_BATCH];
    const bf16 *taps[CONV_STREAMS][CONV_BATCH];
    int kernel_size[CONV_STREAMS];
    int streams;
};

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

/* A thread's rows of x: the TAPS - 1 before its run, oldest first (zero before t = 0: never
 * read, as tau <= t), and the CONV_RUN of its run (zero past T: never read). */
template <int VEC, int TAPS>
struct ConvRows {
    BfVector<VEC> before[TAPS > 1 ? TAPS - 1 : 1];
    BfVector<VEC> run[CONV_RUN];
};

/* Every row of the run requested at once, before the first is used: a thread that kept one
 * row in flight behind the one it summed moved 2.0-2.2 TB/s on an H100; with the run's 16
 * to 23 rows in flight, 2.5-2.9 TB/s (docs/performance.md, "2026-12-07 (noon)"). */
template <int VEC, int TAPS>
__device__ __forceinline__ void conv_load_rows(ConvRows<VEC, TAPS> &rows, const bf16 *x,
                                               const ConvRun &run, int T, int vectors)
{
    const long long sequence = (long long)run.b * T;
#pragma unroll
    for (int k = 0; k < TAPS - 1; k++) {
        const int t = run.t0 - (TAPS - 1) + k;
        rows.before[k] = t >= 0 ? vector_load<VEC>(x, (sequence + t) * vectors + run.v)
                                : vector_zero<VEC>();
    }
#pragma unroll
    for (int k = 0; k < CONV_RUN; k++) {
        const int t = run.t0 + k;
        rows.run[k] = t < T ? vector_load<VEC>(x, (sequence + t) * vectors + run.v)
                            : vector_zero<VEC>();
    }
}

/* One stream of the thread's run: out from its rows of x and taps (kernel_size <= TAPS) */
template <int VEC, int TAPS>
__device__ __forceinline__ void conv_forward_run(bf16 *out, const ConvRows<VEC, TAPS> &rows,
                                                 const bf16 *taps, int kernel_size,
                                                 const ConvRun &run, int T, int vectors)
{
    float tap[TAPS][VEC], window[TAPS][VEC] = {};
    conv_load_taps<VEC, TAPS>(tap, taps, kernel_size, run.v, vectors);
#pragma unroll
    for (int k = 0; k < TAPS - 1; k++) {
        float row[VEC];
        vector_to_floats<VEC>(rows.before[k], row);
        conv_window_push<VEC, TAPS>(window, row);
    }
    const long long sequence = (long long)run.b * T;
#pragma unroll
    for (int k = 0; k < CONV_RUN; k++) {
        const int t = run.t0 + k;
        if (t >= T)
            break;
        float row[VEC], sum[VEC];
        vector_to_floats<VEC>(rows.run[k], row);
        conv_window_push<VEC, TAPS>(window, row);
        conv_sum<VEC, TAPS>(sum, tap, window, kernel_size < t + 1 ? kernel_size : t + 1);
        vector_store<VEC>(out, (sequence + t) * vectors + run.v, vector_from_floats<VEC>(sum));
    }
}

/* Row blockIdx.y of one stream (phase one's block sources, a stream a launch) */
template <int VEC, int TAPS>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_forward_kernel(ConvBatch batch, int B, int T, int vectors)
{
    ConvRun run;
    if (!conv_run_of(&run, B, T, vectors))
        return;
    const int n = blockIdx.y;
    ConvRows<VEC, TAPS> rows;
    conv_load_rows<VEC, TAPS>(rows, batch.x[n], run, T, vectors);
    conv_forward_run<VEC, TAPS>(batch.out[0][n], rows, batch.taps[0][n], batch.kernel_size[0],
                                run, T, vectors);
}

/* Every stream of row blockIdx.y in turn, each through the window of the launch's widest
 * kernel (TAPS): a stream of a smaller kernel sums its own k taps of it. The rows are read
 * once, held in registers for every stream. Its own kernel, as the loop holds more
 * registers (ptxas: 180 at VEC 4 TAPS 8, where one stream takes 128) and a launch of one
 * stream should keep the occupancy of its own. */
template <int VEC, int TAPS>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_forward_streams_kernel(ConvBatch batch, int B, int T, int vectors)
{
    ConvRun run;
    if (!conv_run_of(&run, B, T, vectors))
        return;
    const int n = blockIdx.y;
    ConvRows<VEC, TAPS> rows;
    conv_load_rows<VEC, TAPS>(rows, batch.x[n], run, T, vectors);
    for (int r = 0; r < batch.streams; r++)
        conv_forward_run<VEC, TAPS>(batch.out[r][n], rows, batch.taps[r][n],
                                    batch.kernel_size[r], run, T, vectors);
}

/* ---- entries ---- */

static unsigned conv_blocks(long long threads)
{
    return (unsigned)((threads + CONV_THREADS - 1) / CONV_THREADS);
}

/* kernel<VEC, TAPS> for VEC 4, 2 or 1 and the largest kernel size 1, 2, 3-4, 5-8 (TAPS 1, 2,
 * 4, 8), on a grid of (the blocks of `threads`, rows) */
#define CONV_LAUNCH(kernel, vec, kernel_size, threads, rows, ...)                               \
    do {                                                                                        \
        const int taps_ = conv_taps_bound(kernel_size);                                         \
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

/* threads of the forward: a run of CONV_RUN rows of one sequence and a vector each */
static long long conv_run_threads(int B, int T, int vectors)
{
    return (long long)B * ((T + CONV_RUN - 1) / CONV_RUN) * vectors;
}

/* One launch: rows [first, first + count) of streams [stream0, stream0 + streams) */
static void conv_forward_launch(bf16 *const *out, const bf16 *const *x, const bf16 *const *taps,
                                int rows, int first, int count, int stream0, int streams,
                                const int *kernel_sizes, int B, int T, int d,
                                cudaStream_t stream)
{
    ConvBatch batch = {};
    const void *pointers[(1 + 2 * CONV_STREAMS) * CONV_BATCH];
    int n_pointers = 0, widest = 0;
    for (int n = 0; n < count; n++)
        pointers[n_pointers++] = batch.x[n] = x[first + n];
    for (int s = 0; s < streams; s++) {
        const int r = stream0 + s;
        batch.kernel_size[s] = kernel_sizes[r];
        widest = kernel_sizes[r] > widest ? kernel_sizes[r] : widest;
        for (int n = 0; n < count; n++) {
            pointers[n_pointers++] = batch.out[s][n] = out[(size_t)r * rows + first + n];
            pointers[n_pointers++] = batch.taps[s][n] = taps[(size_t)r * rows + first + n];
        }
    }
    batch.streams = streams;
    const int vec = widest_vector(4, d, pointers, n_pointers), vectors = d / vec;
    const long long threads = conv_run_threads(B, T, vectors);
    if (streams == 1)
        CONV_LAUNCH(conv_forward_kernel, vec, widest, threads, count, batch, B, T, vectors);
    else
        CONV_LAUNCH(conv_forward_streams_kernel, vec, widest, threads, count, batch, B, T,
                    vectors);
}

extern "C" void cuda_stream_conv_forward(bf16 *const *out, const bf16 *const *x,
                                         const bf16 *const *taps, int count, int streams,
                                         const int *kernel_sizes, int B, int T, int d,
                                         cudaStream_t stream)
{
    if (!conv_check_streams(kernel_sizes, streams, d, B, T))
        return;
    for (int first = 0; first < count; first += CONV_BATCH)
        for (int stream0 = 0; stream0 < streams; stream0 += CONV_STREAMS)
            conv_forward_launch(out, x, taps, count, first,
                                conv_launch_span(count, first, CONV_BATCH), stream0,
                                conv_launch_span(streams, stream0, CONV_STREAMS), kernel_sizes,
                                B, T, d, stream);
}
