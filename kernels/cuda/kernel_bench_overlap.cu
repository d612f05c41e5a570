/* kernels/cuda/kernel_bench_overlap.cu — `fathom-kernel-bench overlap`: whether the
 * optimizer's update can run beside the next step's first forward.
 *
 * The 8-layer slice of the 8B model updates 2.79 B parameters a step (AdamW with the EMA
 * and the bf16 copy: 38 bytes each, about 27 ms at the copy rate), then its first
 * microbatch's forward reads each unit in order: the embedding, layers 0..7, the head. A
 * unit's forward needs only its own update done. Here the units' updates run on a second
 * stream, each recording an event, and the forward's products (a layer's seven at 4096
 * tokens; the head's 128256-wide one) wait for their unit's event; against the same work on
 * one stream. The memory-bound update and the compute-bound products share the
 * multiprocessors: what the overlap saves is what this measures. The update buffers are one
 * set reused by every unit (each pass is larger than the L2), the products' weights one
 * layer's set.
 */
#include "kernels/cuda/kernel_bench.h"
#include "kernels/cuda/kernels_cuda.h"

#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>

enum {
    OVERLAP_TOKENS = 4096,
    OVERLAP_D = 4096,
    OVERLAP_KV = 1024,
    OVERLAP_FFN = 14336,
    OVERLAP_VOCAB = 128256,
    OVERLAP_LAYERS = 8,
    OVERLAP_UNITS = OVERLAP_LAYERS + 2, /* the embedding, the layers, the head */
};

typedef struct {
    cudaStream_t compute, update;
    cudaEvent_t updated[OVERLAP_UNITS], update_done;
    bool overlapped;  /* the updates on their own stream */
    size_t unit_params[OVERLAP_UNITS];
    OptimizerBuffers buffers; /* the largest unit's: every unit updates a prefix */
    AdamwScalars scalars;
    bf16 *x, *wide, *logits; /* [tokens, d], [tokens, ffn], [tokens, vocab] */
    bf16 *w_square, *w_kv, *w_up, *w_down, *w_head;
} OverlapCase;

static void layer_products(OverlapCase *c)
{
    const int T = OVERLAP_TOKENS, d = OVERLAP_D;
    cudaStream_t s = c->compute;
    cuda_matmul_forward(c->wide, c->x, c->w_square, T, d, d, s);            /* q */
    cuda_matmul_forward(c->wide, c->x, c->w_kv, T, d, OVERLAP_KV, s);       /* k */
    cuda_matmul_forward(c->wide, c->x, c->w_kv, T, d, OVERLAP_KV, s);       /* v */
    cuda_matmul_forward(c->x, c->wide, c->w_square, T, d, d, s);            /* o */
    cuda_matmul_forward(c->wide, c->x, c->w_up, T, d, OVERLAP_FFN, s);      /* gate */
    cuda_matmul_forward(c->wide, c->x, c->w_up, T, d, OVERLAP_FFN, s);      /* up */
    cuda_matmul_forward(c->x, c->wide, c->w_down, T, OVERLAP_FFN, d, s);    /* down */
}

static void unit_update(OverlapCase *c, int unit)
{
    cudaStream_t s = c->overlapped ? c->update : c->compute;
    optimizer_buffers_update(&c->buffers, c->unit_params[unit], true, &c->scalars, s);
    if (c->overlapped)
        CUDA_CHECK(cudaEventRecord(c->updated[unit], s));
}

/* Before unit `unit`'s forward: its update done. */
static void unit_wait(OverlapCase *c, int unit)
{
    if (c->overlapped)
        CUDA_CHECK(cudaStreamWaitEvent(c->compute, c->updated[unit], 0));
}

static void forward_products(OverlapCase *c)
{
    unit_wait(c, 0);
    for (int layer = 0; layer < OVERLAP_LAYERS; layer++) {
        unit_wait(c, 1 + layer);
        layer_products(c);
    }
    unit_wait(c, OVERLAP_UNITS - 1);
    cuda_matmul_forward(c->logits, c->x, c->w_head, OVERLAP_TOKENS, OVERLAP_D, OVERLAP_VOCAB,
                        c->compute);
}

/* The updates, then the forward (one stream), or beside it (two); the time runs until
 * both are done. */
static double step_start_ms(OverlapCase *c, bool updates, bool products)
{
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    float times[9];
    for (int round = -2; round < 9; round++) {
        CUDA_CHECK(cudaStreamSynchronize(c->compute));
        CUDA_CHECK(cudaEventRecord(start, c->compute));
        if (c->overlapped) /* the update stream starts where the compute stream is */
            CUDA_CHECK(cudaStreamWaitEvent(c->update, start, 0));
        for (int unit = 0; updates && unit < OVERLAP_UNITS; unit++)
            unit_update(c, unit);
        if (products)
            forward_products(c);
        if (c->overlapped) {
            CUDA_CHECK(cudaEventRecord(c->update_done, c->update));
            CUDA_CHECK(cudaStreamWaitEvent(c->compute, c->update_done, 0));
        }
        CUDA_CHECK(cudaEventRecord(stop, c->compute));
        CUDA_CHECK(cudaEventSynchronize(stop));
        if (round >= 0)
            CUDA_CHECK(cudaEventElapsedTime(&times[round], start, stop));
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(times, times + 9);
    return times[4];
}

void bench_overlap(void)
{
    OverlapCase c = {};
    const size_t embedding = (size_t)OVERLAP_VOCAB * OVERLAP_D;
    const size_t layer = 2 * (size_t)OVERLAP_D * OVERLAP_D + 2 * (size_t)OVERLAP_KV * OVERLAP_D +
                         3 * (size_t)OVERLAP_FFN * OVERLAP_D + 2 * OVERLAP_D;
    c.unit_params[0] = c.unit_params[OVERLAP_UNITS - 1] = embedding;
    for (int i = 0; i < OVERLAP_LAYERS; i++)
        c.unit_params[1 + i] = layer;
    size_t total = 0;
    for (int u = 0; u < OVERLAP_UNITS; u++)
        total += c.unit_params[u];
    c.buffers = optimizer_buffers_make(embedding);
    c.scalars = (AdamwScalars){3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0.999f, 10};
    const int T = OVERLAP_TOKENS, d = OVERLAP_D;
    c.x = (bf16 *)device_random_bf16((size_t)T * OVERLAP_FFN, 1);
    c.wide = (bf16 *)device_random_bf16((size_t)T * OVERLAP_FFN, 2);
    c.logits = (bf16 *)device_random_bf16((size_t)T * OVERLAP_VOCAB, 3);
    c.w_square = (bf16 *)device_random_bf16((size_t)d * d, 4);
    c.w_kv = (bf16 *)device_random_bf16((size_t)OVERLAP_KV * d, 5);
    c.w_up = (bf16 *)device_random_bf16((size_t)OVERLAP_FFN * d, 6);
    c.w_down = (bf16 *)device_random_bf16((size_t)OVERLAP_FFN * d, 7);
    c.w_head = (bf16 *)device_random_bf16(embedding, 8);
    for (int u = 0; u < OVERLAP_UNITS; u++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c.updated[u], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&c.update_done, cudaEventDisableTiming));
    int least, greatest;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.compute, cudaStreamNonBlocking));

    const double flops = 2.0 * T * d *
                         (OVERLAP_LAYERS * (2.0 * d + 2.0 * OVERLAP_KV + 3.0 * OVERLAP_FFN) +
                          OVERLAP_VOCAB);
    const double bytes = 38.0 * (double)total;
    printf("# the update of %.2f B parameters (38 bytes each) and one microbatch's forward "
           "products (%.1f TFLOP)\n", total / 1e9, flops / 1e12);
    const double products = step_start_ms(&c, false, true);
    report("forward products alone", products, flops, 0);
    const double updates = step_start_ms(&c, true, false);
    report("updates alone", updates, 0, bytes);
    const double serial = step_start_ms(&c, true, true);
    printf("%-48s %9.3f ms  (the two alone: %.3f)\n", "updates, then products (one stream)",
           serial, products + updates);
    const int priorities[2] = {least, greatest};
    const char *names[2] = {"beside (update stream at the least priority)",
                            "beside (update stream at the greatest priority)"};
    for (int p = 0; p < 2; p++) {
        CUDA_CHECK(cudaStreamCreateWithPriority(&c.update, cudaStreamNonBlocking, priorities[p]));
        c.overlapped = true;
        const double beside = step_start_ms(&c, true, true);
        printf("%-48s %9.3f ms  (%.3f ms less than one stream)\n", names[p], beside,
               serial - beside);
        c.overlapped = false;
        CUDA_CHECK(cudaStreamDestroy(c.update));
    }
    for (int u = 0; u < OVERLAP_UNITS; u++)
        CUDA_CHECK(cudaEventDestroy(c.updated[u]));
    CUDA_CHECK(cudaEventDestroy(c.update_done));
    CUDA_CHECK(cudaStreamDestroy(c.compute));
    optimizer_buffers_free(&c.buffers);
    cudaFree(c.x), cudaFree(c.wide);
    cudaFree(c.logits), cudaFree(c.w_square), cudaFree(c.w_kv), cudaFree(c.w_up);
    cudaFree(c.w_down), cudaFree(c.w_head);
}
