/* kernels/cuda/kernel_bench.h — what the cases of `fathom-kernel-bench` share
 * (kernel_bench.cu: the program and the layer's cases; kernel_bench_stream.cu: MSAR's stream
 * mix, convolution and merges). CUDA C++, GPU machines only.
 *
 * A case runs 3 warm-ups then 20 timed calls between CUDA events; report prints the median
 * with the rate it implies against the floor on an H200 (790 TFLOP/s bf16 dense, 4.3 TB/s
 * copy). Inputs are random, never zeros (which run faster than real data).
 */
#ifndef FATHOM_KERNELS_CUDA_KERNEL_BENCH_H
#define FATHOM_KERNELS_CUDA_KERNEL_BENCH_H

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels_cuda.h"

#include <stddef.h>

/* n bf16 values uniform in [-0.25, 0.25) from `seed`, on the device (cudaFree them) */
void *device_random_bf16(size_t n, unsigned seed);
/* n floats of `value`, on the device (cudaFree them) */
float *device_floats(size_t n, float value);

/* AdamW's buffers over n parameters, on the device: weights 0.01, gradients 0.001, zero
 * moments, the EMA at the weights, the bf16 copy unset; optimizer_buffers_free frees them. */
typedef struct {
    size_t n;
    float *params, *grads, *exp_avg, *exp_avg_sq, *ema;
    bf16 *compute_copy;
} OptimizerBuffers;
OptimizerBuffers optimizer_buffers_make(size_t n);
void optimizer_buffers_free(OptimizerBuffers *buffers);
/* cuda_adamw_update of the buffers' first n parameters on `stream`, with or without the EMA */
void optimizer_buffers_update(const OptimizerBuffers *buffers, size_t n, bool ema,
                              const AdamwScalars *scalars, cudaStream_t stream);

typedef void (*Case)(void *context);
/* the median of 20 timed calls of run(context), in ms */
double median_ms(Case run, void *context);
/* one line: name, ms, and the rate of `flops` (if > 0) or of `bytes` against the floor */
void report(const char *name, double ms, double flops, double bytes);

/* MSAR's cases (kernel_bench_stream.cu): the stream mix of `rows` tokens of width d, m 4;
 * the convolution and the replace form's merges at B x T tokens */
void bench_mix(int rows, int d);
void bench_conv(int B, int T, int d);
void bench_merge(int B, int T, int d);
/* The optimizer's update of the 8-layer 8B slice beside one microbatch's forward products,
 * against one stream (kernel_bench_overlap.cu) */
void bench_overlap(void);

#endif
