/* kernels/cuda/route_bench.cu — fathom-route-bench: the routing of one microbatch of the 8B
 * graft on the GPU at hand (GPU machines only).
 *
 * Block-MHAR delta routing: d 4096, H 8, a microbatch of 2 x 4096 tokens, 64 sites; site j
 * (a 32-layer, 8-block model) routes over null, b_0 .. b_{n-1} with n = j/8 + 1 (N = 2..9),
 * out = p + alpha * Route(...). The null source is a [tokens, d] buffer, as the model hands
 * it to the op. One "microbatch" is the 64 forwards in order, then the 64 backwards in
 * reverse order, adding into the sources' gradients. Timed with CUDA events after warm-up;
 * the median of the repetitions (default 10; `fathom-route-bench REPETITIONS`) is printed,
 * for forward, backward and both, in ms and in GB/s against the bytes each site must move
 * (see route_cuda.h: (N + 2) S forward, (4N + 1) S backward, S = tokens * d * 2 bytes).
 * Inputs are random (never zeros) and fill 1.5 GB, far beyond L2.
 *
 * Then MSAR's stream routes at the same shape: every site routes m = 4 streams of kernel
 * sizes 1, 2, 4, 8 over the same sources (the null source unconvolved), each site and
 * stream forward, then backward in reverse order; once as the composition (stream conv of
 * each convolved source into a buffer, cuda_route_forward; backward: the conv again, dE
 * zeroed, cuda_route_backward into dE, the conv backward) and once fused
 * (cuda_route_conv_forward / _backward). Printed: ms per phase against the DRAM bytes each
 * must move (route_cuda.h: composition (3N - 1) S + (11N - 7) S, fused (2N + 1) S +
 * (4N + 2) S, floor (N + 1) S + (3N + 1) S per site and stream).
 */
#include "kernels/cuda/route_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    BENCH_WIDTH = 4096,
    BENCH_HEADS = 8,
    BENCH_TOKENS = 2 * 4096,
    BENCH_SITES = 64,
    BENCH_BLOCKS = 8,              /* b_0 .. b_7 */
    BENCH_SOURCES_MAX = BENCH_BLOCKS + 1,
    BENCH_WARMUP = 2,
    BENCH_REPETITIONS_MAX = 1000,
    MSAR_STREAMS = 4,
};

static const int msar_kernels[MSAR_STREAMS] = {1, 2, 4, 8}; /* DESIGN 2.2's defaults */

#define BENCH_CHECK(call)                                                                        \
    do {                                                                                         \
        cudaError_t status_ = (call);                                                            \
        if (status_ != cudaSuccess) {                                                            \
            fprintf(stderr, "fathom-route-bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,    \
                    cudaGetErrorString(status_));                                                \
            exit(5);                                                                             \
        }                                                                                        \
    } while (0)

/* x[i] = scale * uniform(-1, 1) from a hash of (seed, i), as bf16 bits */
__global__ void bench_fill_kernel(bf16 *x, size_t n, float scale, unsigned long long seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = seed * 0x9E3779B97F4A7C15ull + i;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        unsigned int bits = __float_as_uint(scale * u);
        x[i] = (bf16)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    }
}

static bf16 *bench_random_bf16(size_t n, float scale, unsigned long long seed)
{
    bf16 *x;
    BENCH_CHECK(cudaMalloc(&x, n * sizeof(bf16)));
    bench_fill_kernel<<<1024, 256>>>(x, n, scale, seed);
    BENCH_CHECK(cudaGetLastError());
    return x;
}

static float *bench_zero_floats(size_t n)
{
    float *x;
    BENCH_CHECK(cudaMalloc(&x, n * sizeof(float)));
    BENCH_CHECK(cudaMemset(x, 0, n * sizeof(float)));
    return x;
}

static int compare_floats(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median(float *values, int count)
{
    qsort(values, (size_t)count, sizeof(float), compare_floats);
    return count % 2 ? values[count / 2] : 0.5f * (values[count / 2 - 1] + values[count / 2]);
}

typedef struct {
    bf16 *rows[BENCH_SOURCES_MAX];      /* null, b_0 .. b_7 */
    bf16 *grads[BENCH_SOURCES_MAX];
    bf16 *query[BENCH_SITES], *key_norm[BENCH_SITES];
    float *weights[BENCH_SITES], *rstd[BENCH_SITES];
    float *dquery[BENCH_SITES], *dkey_norm[BENCH_SITES], *dalpha;
    float *alpha; /* [1] 0.5 in device memory, as the model's master weight */
    bf16 *stream_p, *out, *dout;
    float *workspace;
} Bench;

static int site_sources(int site)
{
    return site / 8 + 2; /* null and b_0 .. b_{site/8} */
}

static void bench_forward(Bench *bench)
{
    for (int site = 0; site < BENCH_SITES; site++) {
        const bf16 *sources[BENCH_SOURCES_MAX];
        for (int n = 0; n < site_sources(site); n++)
            sources[n] = bench->rows[n];
        cuda_route_forward(bench->out, bench->weights[site], bench->rstd[site], sources,
                           site_sources(site), bench->query[site], bench->key_norm[site],
                           bench->stream_p, bench->alpha, BENCH_TOKENS, BENCH_WIDTH, BENCH_HEADS,
                           1e-5f, 0);
    }
}

static void bench_backward(Bench *bench)
{
    for (int site = BENCH_SITES - 1; site >= 0; site--) {
        const bf16 *sources[BENCH_SOURCES_MAX];
        bf16 *grads[BENCH_SOURCES_MAX];
        for (int n = 0; n < site_sources(site); n++) {
            sources[n] = bench->rows[n];
            grads[n] = bench->grads[n];
        }
        cuda_route_backward(grads, bench->dquery[site], bench->dkey_norm[site],
                            bench->dalpha + site, bench->dout, sources, site_sources(site),
                            bench->weights[site], bench->rstd[site], bench->query[site],
                            bench->key_norm[site], bench->alpha, bench->workspace,
                            BENCH_TOKENS, BENCH_WIDTH, BENCH_HEADS, 0);
    }
}

/* MSAR's per-stream state: taps and their gradients per (stream, source; NULL for the null
 * source 0), the saved statistics per (site, stream), the composition's E and dE buffers. */
typedef struct {
    bf16 *taps[MSAR_STREAMS][BENCH_SOURCES_MAX];
    float *dtaps[MSAR_STREAMS][BENCH_SOURCES_MAX];
    float *weights[BENCH_SITES][MSAR_STREAMS], *rstd[BENCH_SITES][MSAR_STREAMS];
    bf16 *expanded[BENCH_SOURCES_MAX], *expanded_grads[BENCH_SOURCES_MAX];
    float *workspace;
    bool fused;
} Msar;

/* the composition's E_k of every convolved source into msar->expanded; sources[k] the
 * arrays the Route reads */
static void msar_expand(Bench *bench, Msar *msar, int site, int stream, const bf16 **sources)
{
    sources[0] = bench->rows[0];
    for (int n = 1; n < site_sources(site); n++)
        sources[n] = msar->expanded[n];
    cuda_stream_conv_forward(&msar->expanded[1], &bench->rows[1], &msar->taps[stream][1],
                             site_sources(site) - 1, 1, &msar_kernels[stream], 2,
                             BENCH_TOKENS / 2, BENCH_WIDTH, 0);
}

static void msar_forward(Bench *bench, Msar *msar)
{
    for (int site = 0; site < BENCH_SITES; site++)
        for (int r = 0; r < MSAR_STREAMS; r++) {
            const bf16 *sources[BENCH_SOURCES_MAX];
            if (msar->fused) {
                cuda_route_conv_forward(bench->out, msar->weights[site][r], msar->rstd[site][r],
                                        (const bf16 *const *)bench->rows,
                                        (const bf16 *const *)msar->taps[r], site_sources(site),
                                        msar_kernels[r], bench->query[site],
                                        bench->key_norm[site], 2, BENCH_TOKENS / 2, BENCH_WIDTH,
                                        BENCH_HEADS, 1e-5f, msar->workspace, 0);
                continue;
            }
            msar_expand(bench, msar, site, r, sources);
            cuda_route_forward(bench->out, msar->weights[site][r], msar->rstd[site][r], sources,
                               site_sources(site), bench->query[site], bench->key_norm[site],
                               NULL, NULL, BENCH_TOKENS, BENCH_WIDTH, BENCH_HEADS, 1e-5f, 0);
        }
}

static void msar_backward(Bench *bench, Msar *msar)
{
    const size_t bytes = (size_t)BENCH_TOKENS * BENCH_WIDTH * sizeof(bf16);
    for (int site = BENCH_SITES - 1; site >= 0; site--)
        for (int r = MSAR_STREAMS - 1; r >= 0; r--) {
            const int N = site_sources(site);
            if (msar->fused) {
                cuda_route_conv_backward(bench->grads, msar->dtaps[r], bench->dquery[site],
                                         bench->dkey_norm[site], bench->dout,
                                         (const bf16 *const *)bench->rows,
                                         (const bf16 *const *)msar->taps[r], N, msar_kernels[r],
                                         msar->weights[site][r], msar->rstd[site][r],
                                         bench->query[site], bench->key_norm[site], 2,
                                         BENCH_TOKENS / 2, BENCH_WIDTH, BENCH_HEADS,
                                         msar->workspace, 0);
                continue;
            }
            const bf16 *sources[BENCH_SOURCES_MAX];
            bf16 *route_grads[BENCH_SOURCES_MAX];
            msar_expand(bench, msar, site, r, sources);
            route_grads[0] = bench->grads[0];
            for (int n = 1; n < N; n++) {
                BENCH_CHECK(cudaMemsetAsync(msar->expanded_grads[n], 0, bytes, 0));
                route_grads[n] = msar->expanded_grads[n];
            }
            cuda_route_backward(route_grads, bench->dquery[site], bench->dkey_norm[site], NULL,
                                bench->dout, sources, N, msar->weights[site][r],
                                msar->rstd[site][r], bench->query[site], bench->key_norm[site],
                                NULL, msar->workspace, BENCH_TOKENS, BENCH_WIDTH,
                                BENCH_HEADS, 0);
            cuda_stream_conv_backward(&bench->grads[1], &msar->dtaps[r][1],
                                      (const bf16 *const *)&msar->expanded_grads[1],
                                      (const bf16 *const *)&bench->rows[1],
                                      (const bf16 *const *)&msar->taps[r][1], N - 1, 1,
                                      &msar_kernels[r], 2, BENCH_TOKENS / 2, BENCH_WIDTH,
                                      msar->workspace, 0);
        }
}

/* median milliseconds of `repetitions` runs of `phase` (1 forward, 2 backward, 0 both) */
static float msar_time(Bench *bench, Msar *msar, int phase, int repetitions)
{
    cudaEvent_t start, stop;
    BENCH_CHECK(cudaEventCreate(&start));
    BENCH_CHECK(cudaEventCreate(&stop));
    float times[BENCH_REPETITIONS_MAX];
    for (int rep = -BENCH_WARMUP; rep < repetitions; rep++) {
        BENCH_CHECK(cudaEventRecord(start, 0));
        if (phase != 2)
            msar_forward(bench, msar);
        if (phase != 1)
            msar_backward(bench, msar);
        BENCH_CHECK(cudaEventRecord(stop, 0));
        BENCH_CHECK(cudaEventSynchronize(stop));
        BENCH_CHECK(cudaGetLastError());
        if (rep >= 0)
            BENCH_CHECK(cudaEventElapsedTime(&times[rep], start, stop));
    }
    BENCH_CHECK(cudaEventDestroy(start));
    BENCH_CHECK(cudaEventDestroy(stop));
    return median(times, repetitions);
}

static size_t size_max(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* MSAR's buffers; the workspace serves the largest call of either variant */
static void msar_init(Msar *msar)
{
    const size_t td = (size_t)BENCH_TOKENS * BENCH_WIDTH;
    for (int r = 0; r < MSAR_STREAMS; r++)
        for (int n = 0; n < BENCH_SOURCES_MAX; n++) {
            const size_t taps = (size_t)msar_kernels[r] * BENCH_WIDTH;
            msar->taps[r][n] = n ? bench_random_bf16(taps, 0.5f, 600 + 10 * r + n) : NULL;
            msar->dtaps[r][n] = n ? bench_zero_floats(taps) : NULL;
        }
    for (int site = 0; site < BENCH_SITES; site++)
        for (int r = 0; r < MSAR_STREAMS; r++) {
            const size_t rows = (size_t)site_sources(site) * BENCH_TOKENS;
            BENCH_CHECK(cudaMalloc(&msar->weights[site][r], rows * BENCH_HEADS * sizeof(float)));
            BENCH_CHECK(cudaMalloc(&msar->rstd[site][r], rows * sizeof(float)));
        }
    for (int n = 0; n < BENCH_SOURCES_MAX; n++) {
        msar->expanded[n] = bench_random_bf16(td, 1.0f, 700 + n);
        msar->expanded_grads[n] = bench_random_bf16(td, 0.01f, 800 + n);
    }
    size_t floats = cuda_route_backward_workspace_floats(BENCH_TOKENS, BENCH_WIDTH);
    floats = size_max(floats, cuda_stream_conv_backward_workspace_floats(
                                  BENCH_SOURCES_MAX, 1, &msar_kernels[MSAR_STREAMS - 1], 2,
                                  BENCH_TOKENS / 2, BENCH_WIDTH));
    floats = size_max(floats, cuda_route_conv_forward_workspace_floats(
                                  BENCH_SOURCES_MAX, BENCH_TOKENS, BENCH_WIDTH, BENCH_HEADS));
    floats = size_max(floats, cuda_route_conv_backward_workspace_floats(
                                  BENCH_SOURCES_MAX, msar_kernels[MSAR_STREAMS - 1],
                                  BENCH_TOKENS, BENCH_WIDTH, BENCH_HEADS));
    msar->workspace = bench_zero_floats(floats);
}

/* DRAM bytes per phase, in [tokens, d] tensors (route_cuda.h) */
static void msar_tensors(double *composition, double *fused, double *floor_tensors)
{
    for (int phase = 0; phase < 2; phase++)
        composition[phase] = fused[phase] = floor_tensors[phase] = 0;
    for (int site = 0; site < BENCH_SITES; site++) {
        const double N = site_sources(site);
        composition[0] += MSAR_STREAMS * (3 * N - 1);
        composition[1] += MSAR_STREAMS * (11 * N - 7);
        fused[0] += MSAR_STREAMS * (2 * N + 1);
        fused[1] += MSAR_STREAMS * (4 * N + 2);
        floor_tensors[0] += MSAR_STREAMS * (N + 1);
        floor_tensors[1] += MSAR_STREAMS * (3 * N + 1);
    }
}

static void msar_report(Bench *bench, int repetitions, double tensor_bytes, double copy_rate)
{
    Msar msar;
    msar_init(&msar);
    BENCH_CHECK(cudaDeviceSynchronize());
    double composition[2], fused[2], floor_tensors[2];
    msar_tensors(composition, fused, floor_tensors);
    printf("\nMSAR stream routes: m %d (kernel sizes 1 2 4 8), %d sites x %d streams, "
           "median of %d\n", MSAR_STREAMS, BENCH_SITES, MSAR_STREAMS, repetitions);
    printf("%-12s %-10s %10s %10s %10s %12s\n", "variant", "phase", "ms", "GB moved", "GB/s",
           "floor ms");
    static const char *const phases[3] = {"microbatch", "forward", "backward"};
    for (int variant = 0; variant < 2; variant++) {
        msar.fused = variant == 1;
        const double *tensors = msar.fused ? fused : composition;
        for (int phase = 1; phase <= 3; phase++) {
            const int which = phase % 3; /* forward, backward, then both */
            const float ms = msar_time(bench, &msar, which, repetitions);
            const double moved = (which == 1   ? tensors[0]
                                  : which == 2 ? tensors[1]
                                               : tensors[0] + tensors[1]) * tensor_bytes;
            const double least = (which == 1   ? floor_tensors[0]
                                  : which == 2 ? floor_tensors[1]
                                               : floor_tensors[0] + floor_tensors[1]) *
                                 tensor_bytes;
            printf("%-12s %-10s %10.2f %10.1f %10.0f %12.2f\n",
                   msar.fused ? "fused" : "composition", phases[which], ms, moved / 1e9,
                   moved / (ms * 1e-3) / 1e9, least / copy_rate * 1e3);
        }
    }
}

/* median milliseconds of `repetitions` runs of `phase` (forward, backward, or both) */
static float bench_time(Bench *bench, int phase, int repetitions)
{
    cudaEvent_t start, stop;
    BENCH_CHECK(cudaEventCreate(&start));
    BENCH_CHECK(cudaEventCreate(&stop));
    float times[BENCH_REPETITIONS_MAX];
    for (int rep = -BENCH_WARMUP; rep < repetitions; rep++) {
        BENCH_CHECK(cudaEventRecord(start, 0));
        if (phase != 2)
            bench_forward(bench);
        if (phase != 1)
            bench_backward(bench);
        BENCH_CHECK(cudaEventRecord(stop, 0));
        BENCH_CHECK(cudaEventSynchronize(stop));
        BENCH_CHECK(cudaGetLastError());
        if (rep >= 0)
            BENCH_CHECK(cudaEventElapsedTime(&times[rep], start, stop));
    }
    BENCH_CHECK(cudaEventDestroy(start));
    BENCH_CHECK(cudaEventDestroy(stop));
    return median(times, repetitions);
}

int main(int argc, char **argv)
{
    int repetitions = argc > 1 ? atoi(argv[1]) : 10;
    if (repetitions < 1 || repetitions > BENCH_REPETITIONS_MAX) {
        fprintf(stderr, "usage: fathom-route-bench [REPETITIONS, 1..%d]\n",
                BENCH_REPETITIONS_MAX);
        return 2;
    }
    cudaDeviceProp properties;
    BENCH_CHECK(cudaGetDeviceProperties(&properties, 0));

    const size_t td = (size_t)BENCH_TOKENS * BENCH_WIDTH;
    Bench bench;
    for (int n = 0; n < BENCH_SOURCES_MAX; n++) {
        bench.rows[n] = bench_random_bf16(td, 1.0f + 0.25f * n, 100 + n);
        bench.grads[n] = bench_random_bf16(td, 0.01f, 200 + n);
    }
    for (int site = 0; site < BENCH_SITES; site++) {
        int n_sources = site_sources(site);
        bench.query[site] = bench_random_bf16(BENCH_WIDTH, 0.05f, 300 + site);
        bench.key_norm[site] = bench_random_bf16(BENCH_WIDTH, 1.0f, 400 + site);
        BENCH_CHECK(cudaMalloc(&bench.weights[site],
                               (size_t)n_sources * BENCH_TOKENS * BENCH_HEADS * sizeof(float)));
        BENCH_CHECK(cudaMalloc(&bench.rstd[site],
                               (size_t)n_sources * BENCH_TOKENS * sizeof(float)));
        bench.dquery[site] = bench_zero_floats(BENCH_WIDTH);
        bench.dkey_norm[site] = bench_zero_floats(BENCH_WIDTH);
    }
    bench.dalpha = bench_zero_floats(BENCH_SITES);
    const float alpha = 0.5f;
    bench.alpha = bench_zero_floats(1);
    BENCH_CHECK(cudaMemcpy(bench.alpha, &alpha, sizeof alpha, cudaMemcpyHostToDevice));
    bench.stream_p = bench_random_bf16(td, 1.0f, 500);
    bench.out = bench_random_bf16(td, 1.0f, 501);
    bench.dout = bench_random_bf16(td, 1e-3f, 502);
    bench.workspace = bench_zero_floats(cuda_route_backward_workspace_floats(BENCH_TOKENS,
                                                                             BENCH_WIDTH));
    BENCH_CHECK(cudaDeviceSynchronize());

    /* bytes each phase must move, in units of one [tokens, d] bf16 tensor */
    double forward_tensors = 0, backward_tensors = 0, backward_dram_tensors = 0;
    for (int site = 0; site < BENCH_SITES; site++) {
        int n_sources = site_sources(site);
        forward_tensors += n_sources + 2;
        backward_tensors += 4 * n_sources + 1;
        backward_dram_tensors += 3 * n_sources + 1;
    }
    const double tensor_bytes = (double)td * sizeof(bf16);
    const double copy_rate = 4.3e12; /* H200 device copy, bytes/s (DESIGN 8) */

    float forward_ms = bench_time(&bench, 1, repetitions);
    float backward_ms = bench_time(&bench, 2, repetitions);
    float both_ms = bench_time(&bench, 0, repetitions);

    double forward_bytes = forward_tensors * tensor_bytes;
    double backward_bytes = backward_tensors * tensor_bytes;
    printf("fathom-route-bench: %s, %d SMs; d %d, H %d, %d tokens, %d sites (N = 2..9), "
           "median of %d\n", properties.name, properties.multiProcessorCount, BENCH_WIDTH,
           BENCH_HEADS, BENCH_TOKENS, BENCH_SITES, repetitions);
    printf("%-10s %10s %10s %10s %12s\n", "phase", "ms", "GB moved", "GB/s", "floor ms");
    printf("%-10s %10.2f %10.1f %10.0f %12.2f\n", "forward", forward_ms, forward_bytes / 1e9,
           forward_bytes / (forward_ms * 1e-3) / 1e9, forward_bytes / copy_rate * 1e3);
    printf("%-10s %10.2f %10.1f %10.0f %12.2f  (%.2f ms if the second read hits L2)\n",
           "backward", backward_ms, backward_bytes / 1e9,
           backward_bytes / (backward_ms * 1e-3) / 1e9, backward_bytes / copy_rate * 1e3,
           backward_dram_tensors * tensor_bytes / copy_rate * 1e3);
    printf("%-10s %10.2f %10.1f %10.0f %12.2f  (target <= 40 ms; torch.compile 243 ms)\n",
           "microbatch", both_ms, (forward_bytes + backward_bytes) / 1e9,
           (forward_bytes + backward_bytes) / (both_ms * 1e-3) / 1e9,
           (forward_bytes + backward_bytes) / copy_rate * 1e3);

    msar_report(&bench, repetitions, tensor_bytes, copy_rate);
    return 0;
}
