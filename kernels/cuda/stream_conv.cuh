/* kernels/cuda/stream_conv.cuh — what MSAR's stream convolution kernels share (CUDA C++
 * only; the contract is cuda_stream_conv_forward / cuda_stream_conv_backward's in
 * route_cuda.h, the math kernels/cpu/stream_cpu.c's):
 *   out[b,t,c] = sum_{tau < k, tau <= t} taps[tau,c] x[b,t-tau,c]
 * - stream_conv_cuda.cu: the forward of a block's sources, or of a site's partial in every
 *   stream at once;
 * - stream_conv_backward_cuda.cu: the backward of every stream of a block's sources at once.
 * Taps are bf16 [k, d]; a kernel's register windows are bounded by TAPS, the kernel size
 * rounded up to 1, 2, 4 or 8 (conv_taps_bound).
 */
#ifndef FATHOM_KERNELS_CUDA_STREAM_CONV_CUH
#define FATHOM_KERNELS_CUDA_STREAM_CONV_CUH

#include "kernels/cuda/route_cuda.h"
#include "kernels/cuda/route_device.cuh"

enum {
    CONV_BATCH = 12,  /* rows a launch: a block's sources (CUDA_BLOCK_MAX_SOURCES) */
    CONV_STREAMS = 8, /* streams a launch (more: launches in turn) */
};

static inline void conv_check(int kernel_size, int d)
{
    if (d < 1 || d > CUDA_ROUTE_MAX_WIDTH)
        fatal(EXIT_CONFIG, "model.d_model = %d: the cuda stream kernels take 1 to %d channels",
              d, CUDA_ROUTE_MAX_WIDTH);
    if (kernel_size < 1 || kernel_size > CUDA_ROUTE_CONV_MAX_KERNEL)
        fatal(EXIT_CONFIG, "residual.stream_kernels: a kernel size is %d; the cuda stream "
              "convolution takes 1 to %d", kernel_size, CUDA_ROUTE_CONV_MAX_KERNEL);
}

/* Every stream's kernel size and d checked (conv_check); false when there are no tokens,
 * so nothing to launch */
static inline bool conv_check_streams(const int *kernel_sizes, int streams, int d, int B, int T)
{
    for (int r = 0; r < streams; r++)
        conv_check(kernel_sizes[r], d);
    return (long long)B * T > 0;
}

/* Of `total` rows (or streams), what the launch from `first` takes: at most `most` */
static inline int conv_launch_span(int total, int first, int most)
{
    return total - first < most ? total - first : most;
}

/* the kernel size's register bound: 1, 2, 4 or 8 */
__host__ __device__ static inline int conv_taps_bound(int kernel_size)
{
    return kernel_size <= 1 ? 1 : kernel_size <= 2 ? 2 : kernel_size <= 4 ? 4 : 8;
}

#endif
