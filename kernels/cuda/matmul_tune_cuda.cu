/* kernels/cuda/matmul_tune_cuda.cu — `fathom tune`'s timing of cuBLASLt's candidates for
 * every matrix product a step made (runtime/matmul_table.h says why the choice is made
 * ahead of a run and kept in a file).
 *
 * For each plan (matmul_internal.h): the heuristic's first `candidates` answers, each run on
 * operands of the plan's shape and alignments (random bf16 in [-1, 1), fp32 for a weight
 * gradient's C), TUNE_WARMUPS untimed, then `repeats` timed one by one with events on a
 * stream of its own; the median of each. A weight gradient is timed adding into its C
 * (beta 1, what every microbatch after a step's first does), the others writing (beta 0).
 * The chosen algorithm is the fastest median, if it beats the heuristic's first by at least
 * TUNE_GAIN_MIN (a smaller lead is within what two timings of one algorithm differ by) and
 * gives the same bits twice on the same operands; else the heuristic's first stays. The
 * heuristic's first is timed first and again last, and counts with the better median (the
 * first timings meet colder clocks and caches). A plan whose heuristic algorithm does not run
 * gets no entry.
 * Everything it allocates it frees; the plans are left as they were.
 */
#include "kernels/cuda/cuda_module.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/matmul_internal.h"

#include "runtime/error.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    TUNE_WARMUPS = 3,
    TUNE_CANDIDATES_MAX = 64,
    TUNE_REPEATS_MAX = 200,
    TUNE_FILL_THREADS = 256,
};
#define TUNE_GAIN_MIN 0.01 /* a candidate must be 1% faster than the heuristic's first */

/* words[i] = uniform in [-1, 1) from a hash of (seed, i): bf16 bits (two bytes) or fp32 */
__global__ void tune_fill_kernel(void *words, size_t n, uint32_t seed, int fp32)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 0x7feb352du;
        h ^= h >> 15;
        const float value = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
        if (fp32)
            ((float *)words)[i] = value;
        else
            ((__nv_bfloat16 *)words)[i] = __float2bfloat16(value);
    }
}

/* *count += the 2-byte words where a and b differ (an output may be only 2-byte aligned) */
__global__ void tune_count_differences_kernel(const uint16_t *a, const uint16_t *b, size_t n,
                                              unsigned long long *count)
{
    unsigned long long mine = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        mine += a[i] != b[i];
    if (mine)
        atomicAdd(count, mine);
}

/* The operands of one plan, carved from buffers big enough for every plan, each offset so
 * that its address has exactly the plan's alignment (the buffers are 256-aligned). */
typedef struct {
    char *a, *b, *c, *c_again;
    size_t a_bytes, b_bytes, c_bytes; /* the largest of any plan, without the offsets */
    unsigned long long *differences;
} TuneBuffers;

static void plan_operand_bytes(const MatmulPlan *plan, size_t *a, size_t *b, size_t *c)
{
    const size_t rows = (size_t)plan->rows, in = (size_t)plan->in_dim,
                 out = (size_t)plan->out_dim, half = sizeof(bf16);
    *a = *b = *c = 0;
    switch (plan->product) {
    case MATMUL_FORWARD: /* weight, in -> out */
        *a = out * in * half, *b = rows * in * half, *c = rows * out * half;
        break;
    case MATMUL_INPUT_GRADIENT: /* weight, dout -> din */
        *a = out * in * half, *b = rows * out * half, *c = rows * in * half;
        break;
    case MATMUL_WEIGHT_GRADIENT: /* in, dout -> dweight (fp32) */
        *a = rows * in * half, *b = rows * out * half, *c = out * in * sizeof(float);
        break;
    }
}

/* on the products' stream: a fill on another stream could run under their timings */
static void fill_random(void *memory, size_t bytes, uint32_t seed, bool fp32,
                        cudaStream_t stream)
{
    const size_t n = bytes / (fp32 ? sizeof(float) : sizeof(bf16));
    tune_fill_kernel<<<1024, TUNE_FILL_THREADS, 0, stream>>>(memory, n, seed, fp32 ? 1 : 0);
    CUDA_CHECK_LAUNCH();
}

static void buffers_create(TuneBuffers *buffers, cudaStream_t stream)
{
    memset(buffers, 0, sizeof *buffers);
    for (int i = 0; i < matmul_plan_total(); i++) {
        size_t a, b, c;
        plan_operand_bytes(matmul_plan_at(i), &a, &b, &c);
        buffers->a_bytes = a > buffers->a_bytes ? a : buffers->a_bytes;
        buffers->b_bytes = b > buffers->b_bytes ? b : buffers->b_bytes;
        buffers->c_bytes = c > buffers->c_bytes ? c : buffers->c_bytes;
    }
    CUDA_CHECK(cudaMalloc(&buffers->a, buffers->a_bytes + 256));
    CUDA_CHECK(cudaMalloc(&buffers->b, buffers->b_bytes + 256));
    CUDA_CHECK(cudaMalloc(&buffers->c, buffers->c_bytes + 256));
    CUDA_CHECK(cudaMalloc(&buffers->c_again, buffers->c_bytes + 256));
    CUDA_CHECK(cudaMalloc(&buffers->differences, sizeof *buffers->differences));
    fill_random(buffers->a, buffers->a_bytes + 256, 1, false, stream);
    fill_random(buffers->b, buffers->b_bytes + 256, 2, false, stream);
}

static void buffers_destroy(TuneBuffers *buffers)
{
    void *all[] = {buffers->a, buffers->b, buffers->c, buffers->c_again, buffers->differences};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CUDA_CHECK(cudaFree(all[i]));
}

static char *aligned(char *base, uint32_t alignment)
{
    return base + (alignment == 256 ? 0 : alignment);
}

typedef struct {
    const MatmulPlan *plan;
    const void *a, *b;
    void *c;
    size_t c_bytes;
    cudaStream_t stream;
} TuneProduct;

static void product_run(const TuneProduct *product, const cublasLtMatmulAlgo_t *algorithm,
                        float beta)
{
    const MatmulPlan *plan = product->plan;
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(matmul_library(), plan->operation, &alpha, product->a,
                                plan->layout_a, product->b, plan->layout_b, &beta, product->c,
                                plan->layout_c, product->c, plan->layout_c, algorithm,
                                matmul_workspace_memory(), matmul_workspace_bytes(),
                                product->stream));
}

static int compare_floats(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The median time of `repeats` runs, each between two events. */
static float product_median_ms(const TuneProduct *product,
                               const cublasLtMatmulAlgo_t *algorithm, float beta, int repeats,
                               cudaEvent_t *events)
{
    for (int i = 0; i < TUNE_WARMUPS; i++)
        product_run(product, algorithm, beta);
    for (int i = 0; i < repeats; i++) {
        CUDA_CHECK(cudaEventRecord(events[2 * i], product->stream));
        product_run(product, algorithm, beta);
        CUDA_CHECK(cudaEventRecord(events[2 * i + 1], product->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(product->stream));
    float times[TUNE_REPEATS_MAX];
    for (int i = 0; i < repeats; i++)
        CUDA_CHECK(cudaEventElapsedTime(&times[i], events[2 * i], events[2 * i + 1]));
    qsort(times, (size_t)repeats, sizeof times[0], compare_floats);
    return times[repeats / 2];
}

/* Whether two runs writing C (beta 0) give the same bits. */
static bool product_repeats_bits(const TuneProduct *product,
                                 const cublasLtMatmulAlgo_t *algorithm, TuneBuffers *buffers,
                                 char *c_again)
{
    product_run(product, algorithm, 0.0f);
    CUDA_CHECK(cudaMemcpyAsync(c_again, product->c, product->c_bytes, cudaMemcpyDeviceToDevice,
                               product->stream));
    product_run(product, algorithm, 0.0f);
    CUDA_CHECK(cudaMemsetAsync(buffers->differences, 0, sizeof *buffers->differences,
                               product->stream));
    tune_count_differences_kernel<<<1024, TUNE_FILL_THREADS, 0, product->stream>>>(
        (const uint16_t *)product->c, (const uint16_t *)c_again, product->c_bytes / 2,
        buffers->differences);
    CUDA_CHECK_LAUNCH();
    unsigned long long differences = 0;
    CUDA_CHECK(cudaMemcpyAsync(&differences, buffers->differences, sizeof differences,
                               cudaMemcpyDeviceToHost, product->stream));
    CUDA_CHECK(cudaStreamSynchronize(product->stream));
    return differences == 0;
}

/* Times the candidates of one plan and adds its entry to the table. */
static void plan_tune(const MatmulPlan *plan, int candidates, int repeats, TuneBuffers *buffers,
                      cudaStream_t stream, cudaEvent_t *events, MatmulTable *table)
{
    size_t a_bytes, b_bytes, c_bytes;
    plan_operand_bytes(plan, &a_bytes, &b_bytes, &c_bytes);
    const bool weight_gradient = plan->product == MATMUL_WEIGHT_GRADIENT;
    TuneProduct product = {plan, aligned(buffers->a, plan->alignment_a),
                           aligned(buffers->b, plan->alignment_b),
                           aligned(buffers->c, plan->alignment_c), c_bytes, stream};
    fill_random(buffers->c, c_bytes + 256, 3, weight_gradient, stream);
    const float beta = weight_gradient ? 1.0f : 0.0f;

    cublasLtMatmulHeuristicResult_t results[TUNE_CANDIDATES_MAX];
    const int found = matmul_heuristic(plan, results, candidates);
    if (!matmul_algorithm_runs(plan, &results[0].algo)) {
        printf("fathom tune: the heuristic's algorithm for the %s of rows %d, in %d, out %d "
               "does not run here: no entry (a run takes the heuristic's)\n",
               matmul_product_name(plan->product), plan->rows, plan->in_dim, plan->out_dim);
        return;
    }
    float times[TUNE_CANDIDATES_MAX];
    for (int k = 0; k < found; k++)
        times[k] = matmul_algorithm_runs(plan, &results[k].algo)
                       ? product_median_ms(&product, &results[k].algo, beta, repeats, events)
                       : INFINITY;
    /* the heuristic's again, last: the first timing met the colder clocks and caches, and a
     * candidate must lead the better of the two */
    const float again = product_median_ms(&product, &results[0].algo, beta, repeats, events);
    times[0] = again < times[0] ? again : times[0];
    /* the fastest that leads the first by TUNE_GAIN_MIN and repeats its bits */
    int chosen = 0;
    bool tried[TUNE_CANDIDATES_MAX] = {false};
    for (;;) {
        int best = -1;
        for (int k = 1; k < found; k++)
            if (!tried[k] && (best < 0 || times[k] < times[best]))
                best = k;
        if (best < 0 || !(times[best] < (1.0 - TUNE_GAIN_MIN) * times[0]))
            break;
        tried[best] = true;
        if (product_repeats_bits(&product, &results[best].algo, buffers,
                                 aligned(buffers->c_again, plan->alignment_c))) {
            chosen = best;
            break;
        }
        printf("fathom tune: candidate %d of the %s of rows %d, in %d, out %d gave other bits "
               "on a second run: not taken\n", best, matmul_product_name(plan->product),
               plan->rows, plan->in_dim, plan->out_dim);
    }

    MatmulTableEntry *entry = matmul_table_add(table);
    entry->product = plan->product;
    entry->rows = plan->rows;
    entry->in_dim = plan->in_dim;
    entry->out_dim = plan->out_dim;
    entry->alignment_a = plan->alignment_a;
    entry->alignment_b = plan->alignment_b;
    entry->alignment_c = plan->alignment_c;
    entry->calls = plan->calls < INT32_MAX ? (int)plan->calls : INT32_MAX;
    entry->heuristic_ms = times[0];
    entry->tuned_ms = times[chosen];
    memcpy(entry->algorithm, results[chosen].algo.data, sizeof entry->algorithm);
    printf("fathom tune: %2d %-15s rows %6d in %6d out %6d: heuristic %8.4f ms, %s %8.4f ms "
           "(%+5.1f%%) of %d candidates\n", table->count, matmul_product_name(plan->product),
           plan->rows, plan->in_dim, plan->out_dim, times[0],
           chosen ? "candidate" : "kept     ", times[chosen],
           100.0 * (times[chosen] - times[0]) / times[0], found);
    fflush(stdout);
}

extern "C" void cuda_matmul_tune(MatmulTable *table, int candidates, int repeats)
{
    if (candidates < 1 || candidates > TUNE_CANDIDATES_MAX || repeats < 1 ||
        repeats > TUNE_REPEATS_MAX)
        fatal(EXIT_CONFIG, "tune: candidates 1 to %d and repeats 1 to %d, not %d and %d",
              TUNE_CANDIDATES_MAX, TUNE_REPEATS_MAX, candidates, repeats);
    CUDA_CHECK(cudaDeviceSynchronize());
    int device;
    cudaDeviceProp properties;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    table->library_version = (uint64_t)cublasLtGetVersion();
    table->workspace_bytes = matmul_workspace_bytes();
    table->multiprocessors = properties.multiProcessorCount;
    snprintf(table->device, sizeof table->device, "%.*s", (int)sizeof table->device - 1,
             properties.name);

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TuneBuffers buffers;
    buffers_create(&buffers, stream);
    cudaEvent_t events[2 * TUNE_REPEATS_MAX];
    for (int i = 0; i < 2 * repeats; i++)
        CUDA_CHECK(cudaEventCreate(&events[i]));

    for (int i = 0; i < matmul_plan_total(); i++)
        plan_tune(matmul_plan_at(i), candidates, repeats, &buffers, stream, events, table);

    for (int i = 0; i < 2 * repeats; i++)
        CUDA_CHECK(cudaEventDestroy(events[i]));
    CUDA_CHECK(cudaStreamDestroy(stream));
    buffers_destroy(&buffers);
}
