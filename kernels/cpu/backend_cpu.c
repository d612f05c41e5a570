/* kernels/cpu/backend_cpu.c — the cpu op table (runtime/backend.h): host memory and the
 * fp32 kernels of kernels_cpu.h. "Backend memory" is ordinary host memory here, so moving
 * data is memcpy and synchronising is a no-op (every kernel returns when it is done).
 */
#include "runtime/backend.h"

#include "kernels/cpu/kernels_cpu.h"
#include "runtime/error.h"

#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(size_t bytes)
{
    return xcalloc(1, bytes);
}

static void cpu_release(void *pointer)
{
    free(pointer);
}

static void cpu_zero(void *pointer, size_t bytes)
{
    if (bytes)
        memset(pointer, 0, bytes);
}

/* copy, upload and download are the same move on the host */
static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

static void cpu_synchronize(void)
{
}

static const Backend cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_synchronize,
    .add_inplace = cpu_add_inplace,
    .add = cpu_add,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .route_forward = cpu_route_forward,
    .route_backward = cpu_route_backward,
    .stream_conv_forward = cpu_stream_conv_forward,
    .stream_conv_backward = cpu_stream_conv_backward,
    .stream_mix_forward = cpu_stream_mix_forward,
    .stream_mix_backward = cpu_stream_mix_backward,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .adamw_update = cpu_adamw_update,
    .ema_update = cpu_ema_update,
};

const Backend *backend_cpu(void)
{
    return &cpu_backend;
}
