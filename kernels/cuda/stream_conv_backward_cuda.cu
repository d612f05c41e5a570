/* kernels/cuda/stream_conv_backward_cuda.cu — the backward of MSAR's stream convolutions,
 * every stream of a block's sources at once (DESIGN 2.2; contract in route_cuda.h; the math
 * is kernels/cpu/stream_cpu.c's). For row n and stream r (kernel size k_r):
 *   dx[n][b,t,c]        += sum_r sum_{tau < k_r, t + tau < T} taps[r][n][tau,c] g_r[b,t+tau,c]
 *   dtaps[r][n][tau,c]  += sum_{b, t + tau < T} x[n][b,t,c] g_r[b,t+tau,c]
 * with g_r = dout[r][n]. Both sums run over the same products g_r[t + tau] (the second is
 * the usual sum over t' = t + tau of dout[t'] x[t' - tau]), so one walk over each g_r row
 * gives both, and x[n] comes from memory once for all m streams: a source's backward moves
 * its m gradient rows, x, and dx read and written, m + 3 rows, where a stream at a time
 * moved 5m (dx from dout, then the taps' partials from dout and x: docs/performance.md).
 *
 * Layout. A thread owns VEC channels (2, or 1 where d or a pointer is odd) of a run of RUN
 * consecutive tokens of one sequence; a warp's 32 lanes are 32 consecutive vectors (one
 * coalesced piece of each row) and a block's 8 warps 8 consecutive runs. For each stream
 * in order the thread loads its RUN + k - 1 rows of g_r (the k - 1 past the run are the
 * next warp's, mostly from L2) and its run of x (from L1 after the first stream), and adds,
 * token by token, each tap's products into the run's dx sums (registers, fp32, across the
 * streams) and into the stream's tap sums; the block's 8 warps then add their tap sums in
 * warp order into one partial of the block's 128 tokens. At 128 registers (two blocks a
 * multiprocessor) the taps stay bf16 until used, so that the rows fit: every load of a
 * stream is in flight at once.
 * dx[t] = bf16(dx[t] + the run's sum), one rounding; with one stream, the bits of the
 * stream-at-a-time kernel this replaced (its sum tau ascending from a product).
 *
 * Partials [rows, sum of k_r, groups, d] (row n, stream r at tap offset o_r = sum of the
 * kernel sizes before it) go in the workspace; conv_sum_tap_partials_kernel adds each
 * (row, stream)'s groups in a fixed order into dtaps. Deterministic: the runs, groups and
 * orders depend on the shape only.
 */
#include "kernels/cuda/stream_conv.cuh"

enum {
    CONV_BACKWARD_RUN = 16,   /* tokens a thread walks */
    CONV_BACKWARD_WARPS = 8,  /* runs a block: the tokens of one partial are 8 runs' */
    CONV_SUM_SLICES = 8,      /* warps splitting the groups in the partials' sum */
};

#define RUN CONV_BACKWARD_RUN

/* One launch: rows n < count of a block's sources, streams r < streams */
struct ConvBackwardBatch {
    bf16 *dx[CONV_BATCH];
    const bf16 *x[CONV_BATCH];
    const bf16 *dout[CONV_STREAMS][CONV_BATCH];
    const bf16 *taps[CONV_STREAMS][CONV_BATCH];
    int kernel_size[CONV_STREAMS];
    int tap_offset[CONV_STREAMS]; /* the kernel sizes of the streams before r, summed */
    int streams, taps_total;
};

struct ConvTapSums {
    float *dtaps[CONV_STREAMS][CONV_BATCH];
    int kernel_size[CONV_STREAMS];
    int tap_offset[CONV_STREAMS];
    int streams, taps_total;
};

/* Stream r's share of a run: grad[i] += sum_tau tap[tau] g[i + tau] (tau ascending, after
 * the streams before it), tap_sums[tau] = sum_i x[i] g[i + tau]. g past the sequence and x
 * past the run are zero, so the bounds t + tau < T and the run's end need no test. */
template <int VEC, int TAPS>
__device__ __forceinline__ void conv_backward_stream(float (&grad)[RUN][VEC],
                                                     float (&tap_sums)[TAPS][VEC],
                                                     const bf16 *x, const bf16 *dout,
                                                     const bf16 *taps,
                                                     int kernel_size, long long first,
                                                     int remaining, int v, int vectors)
{
    BfVector<VEC> tap[TAPS]; /* as bf16, converted where used: registers for the rows */
#pragma unroll
    for (int tau = 0; tau < TAPS; tau++)
        tap[tau] = tau < kernel_size ? vector_load<VEC>(taps, (long long)tau * vectors + v)
                                     : vector_zero<VEC>();
    BfVector<VEC> g[RUN + TAPS - 1], x_run[RUN];
#pragma unroll
    for (int i = 0; i < RUN + TAPS - 1; i++)
        g[i] = i < remaining ? vector_load<VEC>(dout, first + (long long)i * vectors)
                             : vector_zero<VEC>();
#pragma unroll
    for (int i = 0; i < RUN; i++) /* from L1 after the first stream's loads */
        x_run[i] = i < remaining ? vector_load<VEC>(x, first + (long long)i * vectors)
                                 : vector_zero<VEC>();
#pragma unroll
    for (int tau = 0; tau < TAPS; tau++)
#pragma unroll
        for (int c = 0; c < VEC; c++)
            tap_sums[tau][c] = 0.0f;
#pragma unroll
    for (int i = 0; i < RUN; i++) {
        float x_row[VEC];
        vector_to_floats<VEC>(x_run[i], x_row);
#pragma unroll
        for (int tau = 0; tau < TAPS; tau++) {
            float g_row[VEC], tap_row[VEC];
            vector_to_floats<VEC>(g[i + tau], g_row);
            vector_to_floats<VEC>(tap[tau], tap_row);
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                grad[i][c] += tap_row[c] * g_row[c];
                tap_sums[tau][c] += x_row[c] * g_row[c];
            }
        }
    }
}

/* tap_sums of taus < kernel_size into the block's shared sums [warp][tau][lane][c] */
template <int VEC, int TAPS>
__device__ __forceinline__ void conv_share_tap_sums(float *shared,
                                                    const float (&tap_sums)[TAPS][VEC],
                                                    int kernel_size)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int tau = 0; tau < TAPS; tau++)
        if (tau < kernel_size)
#pragma unroll
            for (int c = 0; c < VEC; c++)
                shared[((warp * CUDA_ROUTE_CONV_MAX_KERNEL + tau) * 32 + lane) * VEC + c] =
                    tap_sums[tau][c];
}

/* grid (groups * slices, count): block (group, slice) takes runs group * 8 .. + 7 of every
 * sequence's runs in order, vectors slice * 32 .. + 31, row blockIdx.y */
template <int VEC>
__global__ void __launch_bounds__(CONV_BACKWARD_WARPS * 32, 2)
    conv_backward_kernel(ConvBackwardBatch batch, float *partials, int B, int T, int vectors,
                         int groups)
{
    __shared__ float shared[CONV_BACKWARD_WARPS * CUDA_ROUTE_CONV_MAX_KERNEL * VEC * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slices = (vectors + 31) / 32;
    const int group = blockIdx.x / slices, slice = blockIdx.x - group * slices;
    const int n = blockIdx.y, v = slice * 32 + lane;
    const int runs_per_sequence = (T + RUN - 1) / RUN;
    const long long run = (long long)group * CONV_BACKWARD_WARPS + warp;
    const bool active = v < vectors && run < (long long)B * runs_per_sequence;
    const int b = active ? (int)(run / runs_per_sequence) : 0;
    const int t0 = active ? (int)(run - (long long)b * runs_per_sequence) * RUN : 0;
    /* tokens from t0 to the sequence's end (0: an idle thread, which reads nothing) */
    const int remaining = active ? T - t0 : 0;
    const long long first = ((long long)b * T + t0) * vectors + v;

    float grad[RUN][VEC] = {};
    const long long d = (long long)vectors * VEC;
    for (int r = 0; r < batch.streams; r++) {
        const int k = batch.kernel_size[r];
        const bf16 *dout = batch.dout[r][n], *taps = batch.taps[r][n];
        switch (conv_taps_bound(k)) {
#define CONV_BACKWARD_STREAM(TAPS)                                                             \
    case TAPS: {                                                                               \
        float tap_sums[TAPS][VEC];                                                             \
        conv_backward_stream<VEC, TAPS>(grad, tap_sums, batch.x[n], dout, taps, k, first,      \
                                        remaining, active ? v : 0, vectors);                   \
        conv_share_tap_sums<VEC, TAPS>(shared, tap_sums, k);                                   \
        break;                                                                                 \
    }
            CONV_BACKWARD_STREAM(1)
            CONV_BACKWARD_STREAM(2)
            CONV_BACKWARD_STREAM(4)
            CONV_BACKWARD_STREAM(8)
#undef CONV_BACKWARD_STREAM
        }
        __syncthreads();
        /* the block's partial of stream r: entries (tau, channel), warps added in order */
        float *partial = partials + (((long long)n * batch.taps_total + batch.tap_offset[r]) *
                                     groups + (long long)group * k) * d;
        for (int e = threadIdx.x; e < k * VEC * 32; e += blockDim.x) {
            const int tau = e / (VEC * 32), channel = e % (VEC * 32);
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < CONV_BACKWARD_WARPS; w++)
                sum += shared[(w * CUDA_ROUTE_CONV_MAX_KERNEL + tau) * VEC * 32 + channel];
            if (slice * 32 + channel / VEC < vectors)
                partial[(long long)tau * d + (long long)slice * 32 * VEC + channel] = sum;
        }
        __syncthreads(); /* the shared sums are read before the next stream writes them */
    }
    bf16 *dx = batch.dx[n];
    if (!dx || !active)
        return;
    BfVector<VEC> old[RUN]; /* every row read before any is written */
#pragma unroll
    for (int i = 0; i < RUN; i++)
        if (i < remaining)
            old[i] = vector_load_mutable<VEC>(dx, first + (long long)i * vectors);
#pragma unroll
    for (int i = 0; i < RUN; i++) {
        if (i >= remaining)
            break;
        float value[VEC];
        vector_to_floats<VEC>(old[i], value);
#pragma unroll
        for (int c = 0; c < VEC; c++)
            value[c] += grad[i][c];
        vector_store<VEC>(dx, first + (long long)i * vectors, vector_from_floats<VEC>(value));
    }
}

/* dtaps[r][n][tau, c] += sum over groups in order of the partials; grid (the blocks of 32
 * of the widest k_r * d, count * streams): block y = n * streams + r, warp w of
 * CONV_SUM_SLICES the groups w, w + slices, .. in order, then the slices in order. */
__global__ void __launch_bounds__(CONV_SUM_SLICES * 32)
    conv_sum_tap_partials_kernel(ConvTapSums sums, const float *partials, int groups, int d)
{
    __shared__ float slices[CONV_SUM_SLICES][32];
    const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
    const int n = blockIdx.y / sums.streams, r = blockIdx.y - n * sums.streams;
    const long long count = (long long)sums.kernel_size[r] * d;
    const long long i = (long long)blockIdx.x * 32 + lane;
    const float *partial =
        partials + ((long long)n * sums.taps_total + sums.tap_offset[r]) * groups * d;
    float sum = 0.0f;
    if (i < count)
        for (int g = slice; g < groups; g += CONV_SUM_SLICES)
            sum += partial[g * count + i];
    slices[slice][lane] = sum;
    __syncthreads();
    if (slice != 0 || i >= count)
        return;
    float total = 0.0f;
    for (int k = 0; k < CONV_SUM_SLICES; k++)
        total += slices[k][lane];
    sums.dtaps[r][n][i] += total;
}

/* ---- entries ---- */

static int conv_backward_groups(int B, int T)
{
    const long long runs = (long long)B * ((T + RUN - 1) / RUN);
    return (int)((runs + CONV_BACKWARD_WARPS - 1) / CONV_BACKWARD_WARPS);
}

/* The widest vector (2, 1) that d and every pointer of the launch allow */
static int conv_backward_vector(int d, const ConvBackwardBatch *batch, int count)
{
    const void *pointers[(2 + 2 * CONV_STREAMS) * CONV_BATCH];
    int n_pointers = 0;
    for (int n = 0; n < count; n++) {
        pointers[n_pointers++] = batch->dx[n];
        pointers[n_pointers++] = batch->x[n];
        for (int r = 0; r < batch->streams; r++) {
            pointers[n_pointers++] = batch->dout[r][n];
            pointers[n_pointers++] = batch->taps[r][n];
        }
    }
    return widest_vector(2, d, pointers, n_pointers);
}

extern "C" size_t cuda_stream_conv_backward_workspace_floats(int count, int streams,
                                                             const int *kernel_sizes, int B,
                                                             int T, int d)
{
    if ((long long)B * T <= 0 || count <= 0 || streams <= 0)
        return 1;
    /* the most taps of any launch's streams, for the most rows a launch takes */
    size_t taps = 0;
    for (int first = 0; first < streams; first += CONV_STREAMS) {
        size_t launch = 0;
        for (int r = first; r < streams && r < first + CONV_STREAMS; r++)
            launch += (size_t)kernel_sizes[r];
        taps = launch > taps ? launch : taps;
    }
    const size_t rows = (size_t)conv_launch_span(count, 0, CONV_BATCH);
    return rows * taps * (size_t)conv_backward_groups(B, T) * (size_t)d;
}

/* One launch: rows [first, first + count) of streams [stream0, stream0 + streams) */
static void conv_backward_launch(bf16 *const *dx, float *const *dtaps, const bf16 *const *dout,
                                 const bf16 *const *x, const bf16 *const *taps, int rows,
                                 int first, int count, int stream0, int streams,
                                 const int *kernel_sizes, int B, int T, int d,
                                 float *workspace, cudaStream_t stream)
{
    ConvBackwardBatch batch = {};
    ConvTapSums sums = {};
    int offset = 0, widest = 0;
    for (int s = 0; s < streams; s++) {
        const int r = stream0 + s, k = kernel_sizes[r];
        batch.kernel_size[s] = sums.kernel_size[s] = k;
        batch.tap_offset[s] = sums.tap_offset[s] = offset;
        offset += k;
        widest = k > widest ? k : widest;
        for (int n = 0; n < count; n++) {
            batch.dout[s][n] = dout[(size_t)r * rows + first + n];
            batch.taps[s][n] = taps[(size_t)r * rows + first + n];
            sums.dtaps[s][n] = dtaps[(size_t)r * rows + first + n];
        }
    }
    for (int n = 0; n < count; n++) {
        batch.dx[n] = dx ? dx[first + n] : NULL;
        batch.x[n] = x[first + n];
    }
    batch.streams = sums.streams = streams;
    batch.taps_total = sums.taps_total = offset;
    const int vec = conv_backward_vector(d, &batch, count), vectors = d / vec;
    const int groups = conv_backward_groups(B, T), slices = (vectors + 31) / 32;
    const dim3 grid((unsigned)groups * (unsigned)slices, (unsigned)count);
    if (vec == 2)
        conv_backward_kernel<2><<<grid, CONV_BACKWARD_WARPS * 32, 0, stream>>>(
            batch, workspace, B, T, vectors, groups);
    else
        conv_backward_kernel<1><<<grid, CONV_BACKWARD_WARPS * 32, 0, stream>>>(
            batch, workspace, B, T, vectors, groups);
    CUDA_CHECK_LAUNCH();
    const dim3 sum_grid((unsigned)(((long long)widest * d + 31) / 32),
                        (unsigned)(count * streams));
    conv_sum_tap_partials_kernel<<<sum_grid, CONV_SUM_SLICES * 32, 0, stream>>>(
        sums, workspace, groups, d);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_stream_conv_backward(bf16 *const *dx, float *const *dtaps,
                                          const bf16 *const *dout, const bf16 *const *x,
                                          const bf16 *const *taps, int count, int streams,
                                          const int *kernel_sizes, int B, int T, int d,
                                          float *workspace, cudaStream_t stream)
{
    if (!conv_check_streams(kernel_sizes, streams, d, B, T))
        return;
    for (int first = 0; first < count; first += CONV_BATCH)
        for (int stream0 = 0; stream0 < streams; stream0 += CONV_STREAMS)
            conv_backward_launch(dx, dtaps, dout, x, taps, count, first,
                                 conv_launch_span(count, first, CONV_BATCH), stream0,
                                 conv_launch_span(streams, stream0, CONV_STREAMS),
                                 kernel_sizes, B, T, d, workspace, stream);
}
