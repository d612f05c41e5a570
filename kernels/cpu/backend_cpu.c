/* kernels/cpu/backend_cpu.c — the cpu op table (runtime/backend.h): host memory and the
 * fp32 kernels of kernels_cpu.h. "Backend memory" is ordinary host memory here, so moving
 * data is memcpy and synchronising is a no-op (every kernel returns when it is done).
 * Activations are fp32, so the op table's Activation arrays are float arrays and the
 * conversions are copies (none at all when source and destination are the same array).
 * The attention-over-depth and MSAR entries are backend_cpu_routing.c's.
 */
#include "runtime/backend.h"

#include "kernels/cpu/backend_cpu_routing.h"
#include "kernels/cpu/kernels_cpu.h"
#include "runtime/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Every allocation carries its size in a header of CPU_HEADER bytes (a multiple of 64, so
 * the memory handed out keeps malloc's alignment and more), so that memory_usage can count
 * what the backend holds: the same question a device backend answers, asked of the host. */
enum { CPU_HEADER = 64 };
static size_t cpu_in_use, cpu_peak;

static void *cpu_alloc(size_t bytes)
{
    char *block = xcalloc(1, bytes + CPU_HEADER);
    memcpy(block, &bytes, sizeof bytes);
    cpu_in_use += bytes;
    if (cpu_in_use > cpu_peak)
        cpu_peak = cpu_in_use;
    return block + CPU_HEADER;
}

static void cpu_release(void *pointer)
{
    if (!pointer)
        return;
    char *block = (char *)pointer - CPU_HEADER;
    size_t bytes;
    memcpy(&bytes, block, sizeof bytes);
    cpu_in_use -= bytes;
    free(block);
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

/* what alloc() handed out and release() has not taken back (single-threaded callers) */
static void cpu_memory_usage(size_t *in_use, size_t *peak)
{
    *in_use = cpu_in_use;
    *peak = cpu_peak;
}

static void cpu_memory_peak_reset(void)
{
    cpu_peak = cpu_in_use;
}

/* ---- events: a monotonic clock reading (every op has finished when it returns) ---- */
struct BackendEvent {
    struct timespec time;
};

static BackendEvent *cpu_event_create(void)
{
    return xcalloc(1, sizeof(BackendEvent));
}

static void cpu_event_destroy(BackendEvent *event)
{
    free(event);
}

static void cpu_event_record(BackendEvent *event)
{
    clock_gettime(CLOCK_MONOTONIC, &event->time);
}

static float cpu_event_elapsed_ms(const BackendEvent *start, const BackendEvent *end)
{
    return (float)((double)(end->time.tv_sec - start->time.tv_sec) * 1e3 +
                   (double)(end->time.tv_nsec - start->time.tv_nsec) * 1e-6);
}

/* every op has finished when it returns: nothing to wait for */
static void cpu_event_wait(const BackendEvent *event)
{
    (void)event;
}

/* ---- the op table's Activation arrays are fp32 here: the wrappers only cast ---- */
#define F(pointer) ((float *)(pointer))
#define CF(pointer) ((const float *)(pointer))

static void cpu_activations_from_floats(Activation *dst, const float *src, size_t n)
{
    if ((const void *)dst != (const void *)src)
        cpu_copy(dst, src, n * sizeof(float));
}

static void cpu_activations_download(float *host_dst, const Activation *src, size_t n)
{
    cpu_copy(host_dst, src, n * sizeof(float));
}

static void table_add_inplace(Activation *y, const Activation *x, size_t n)
{
    cpu_add_inplace(F(y), CF(x), n);
}

static void table_add(Activation *out, const Activation *a, const Activation *b, size_t n)
{
    cpu_add(F(out), CF(a), CF(b), n);
}

static void table_add_both(Activation *out, const Activation *a, Activation *y,
                           const Activation *x, size_t n)
{
    cpu_add_both(F(out), CF(a), F(y), CF(x), n);
}

static void table_add_difference(Activation *y, const Activation *plus, const Activation *minus,
                                 size_t n)
{
    cpu_add_difference(F(y), CF(plus), CF(minus), n);
}

static void table_embedding_forward(Activation *out, const uint32_t *tokens,
                                    const Activation *table, int n, int d)
{
    cpu_embedding_forward(F(out), tokens, CF(table), n, d);
}

static void table_embedding_backward(float *dtable, const Activation *dout,
                                     const uint32_t *tokens, int n, int d)
{
    cpu_embedding_backward(dtable, CF(dout), tokens, n, d);
}

static void table_sum_rows(float *out, const Activation *x, int rows, int d)
{
    cpu_sum_rows(out, CF(x), rows, d);
}

static void table_rmsnorm_forward(Activation *out, float *rstd, const Activation *x,
                                  const Activation *weight, int rows, int d, float eps)
{
    cpu_rmsnorm_forward(F(out), rstd, CF(x), CF(weight), rows, d, eps);
}

static void table_add_rmsnorm_forward(Activation *sum, Activation *out, float *rstd,
                                     const Activation *a, const Activation *b,
                                     const Activation *weight, int rows, int d, float eps)
{
    table_add(sum, a, b, (size_t)rows * d);
    cpu_rmsnorm_forward(F(out), rstd, CF(sum), CF(weight), rows, d, eps);
}

static void table_rmsnorm_backward(Activation *dx, GradMode dx_mode, float *dweight,
                                   const Activation *dout, const Activation *x,
                                   const Activation *weight, const float *rstd, int rows, int d)
{
    cpu_rmsnorm_backward(F(dx), dx_mode, dweight, CF(dout), CF(x), CF(weight), rstd, rows, d);
}

static void table_rmsnorm_backward_branch(Activation *dx, Activation *branch, float *dweight,
                                          const Activation *dout, const Activation *x,
                                          const Activation *weight, const float *rstd, int rows,
                                          int d)
{
    cpu_rmsnorm_backward_branch(F(dx), F(branch), dweight, CF(dout), CF(x), CF(weight), rstd,
                                rows, d);
}

static void table_matmul_forward(Activation *out, const Activation *in,
                                 const Activation *weight, int rows, int in_dim, int out_dim)
{
    cpu_matmul_forward(F(out), CF(in), CF(weight), rows, in_dim, out_dim);
}

static void table_matmul_backward(Activation *din, GradMode din_mode, float *dweight,
                                  GradMode dweight_mode, const Activation *dout,
                                  const Activation *in, const Activation *weight, int rows,
                                  int in_dim, int out_dim)
{
    cpu_matmul_backward(F(din), din_mode, dweight, dweight_mode, CF(dout), CF(in), CF(weight),
                        rows, in_dim, out_dim);
}

static void table_rope_forward(Activation *out, const Activation *x, const float *cos,
                               const float *sin, int B, int T, int n_heads, int head_dim)
{
    cpu_rope_forward(F(out), CF(x), cos, sin, B, T, n_heads, head_dim);
}

static void table_rope_backward(Activation *dx, GradMode dx_mode, const Activation *dout,
                                const float *cos, const float *sin, int B, int T, int n_heads,
                                int head_dim)
{
    cpu_rope_backward(F(dx), dx_mode, CF(dout), cos, sin, B, T, n_heads, head_dim);
}

static void table_attention_forward(Activation *out, float *lse, const Activation *q,
                                    const Activation *k, const Activation *v, int B, int T,
                                    int n_heads, int n_kv_heads, int head_dim)
{
    cpu_attention_forward(F(out), lse, CF(q), CF(k), CF(v), B, T, n_heads, n_kv_heads,
                          head_dim);
}

static void table_attention_backward(Activation *dq, Activation *dk, Activation *dv,
                                     GradMode mode, const Activation *dout, const Activation *q,
                                     const Activation *k, const Activation *v,
                                     const Activation *out, const float *lse, int B, int T,
                                     int n_heads, int n_kv_heads, int head_dim)
{
    cpu_attention_backward(F(dq), F(dk), F(dv), mode, CF(dout), CF(q), CF(k), CF(v), CF(out),
                           lse, B, T, n_heads, n_kv_heads, head_dim);
}

static void table_swiglu_forward(Activation *out, const Activation *gate,
                                 const Activation *up, size_t n)
{
    cpu_swiglu_forward(F(out), CF(gate), CF(up), n);
}

static void table_swiglu_backward(Activation *dgate, Activation *dup, GradMode mode,
                                  const Activation *dout, const Activation *gate,
                                  const Activation *up, size_t n)
{
    cpu_swiglu_backward(F(dgate), F(dup), mode, CF(dout), CF(gate), CF(up), n);
}

static void table_cross_entropy_forward(float *losses, float *lse, const Activation *logits,
                                        const uint32_t *targets, int rows, int V, float z_loss)
{
    cpu_cross_entropy_forward(losses, lse, CF(logits), targets, rows, V, z_loss);
}

static void table_cross_entropy_backward(Activation *dlogits, GradMode mode,
                                         const float *dloss, const Activation *logits,
                                         const float *lse, const uint32_t *targets, int rows,
                                         int V, float z_loss)
{
    cpu_cross_entropy_backward(F(dlogits), mode, dloss, CF(logits), lse, targets, rows, V,
                               z_loss);
}

/* the reference: the two ops in turn */
static void table_cross_entropy_forward_backward(float *losses, float *lse, Activation *logits,
                                                 const float *dloss, const uint32_t *targets,
                                                 int rows, int V, float z_loss)
{
    cpu_cross_entropy_forward(losses, lse, CF(logits), targets, rows, V, z_loss);
    cpu_cross_entropy_backward(F(logits), GRAD_WRITE, dloss, CF(logits), lse, targets, rows, V,
                               z_loss);
}

/* the compute copy of the weights IS the fp32 master here: nothing to refresh */
static void table_adamw_update(float *params, const float *grads, float *exp_avg,
                               float *exp_avg_sq, float *ema, size_t n, const AdamwScalars *s,
                               Activation *compute_copy)
{
    cpu_adamw_update(params, grads, exp_avg, exp_avg_sq, ema, n, s);
    if (compute_copy)
        cpu_activations_from_floats(compute_copy, params, n);
}

static void table_adamw_update_ranges(float *params, const float *grads, float *exp_avg,
                                      float *exp_avg_sq, float *ema, const AdamwRange *ranges,
                                      int n_ranges, const AdamwScalars *s,
                                      Activation *compute_copy)
{
    for (int r = 0; r < n_ranges; r++) {
        const size_t at = ranges[r].offset;
        AdamwScalars scalars = *s;
        scalars.lr = ranges[r].lr;
        scalars.weight_decay = ranges[r].weight_decay;
        table_adamw_update(params + at, grads + at, exp_avg + at, exp_avg_sq + at,
                           ema ? ema + at : NULL, ranges[r].count, &scalars,
                           compute_copy ? (Activation *)(F(compute_copy) + at) : NULL);
    }
}

#undef F
#undef CF

/* The routing entries come from backend_cpu_routing.c, set once on the first call. */
static Backend cpu_backend = {
    .name = "cpu",
    .activation_bytes = sizeof(float),
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_synchronize,
    .memory_usage = cpu_memory_usage,
    .memory_peak_reset = cpu_memory_peak_reset,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .event_wait = cpu_event_wait,
    .activations_from_floats = cpu_activations_from_floats,
    .activations_upload = cpu_activations_from_floats,
    .activations_download = cpu_activations_download,
    .add_inplace = table_add_inplace,
    .add_difference = table_add_difference,
    .add = table_add,
    .add_both = table_add_both,
    .embedding_forward = table_embedding_forward,
    .embedding_backward = table_embedding_backward,
    .sum_rows = table_sum_rows,
    .rmsnorm_forward = table_rmsnorm_forward,
    .add_rmsnorm_forward = table_add_rmsnorm_forward,
    .rmsnorm_backward = table_rmsnorm_backward,
    .rmsnorm_backward_branch = table_rmsnorm_backward_branch,
    .matmul_forward = table_matmul_forward,
    .matmul_backward = table_matmul_backward,
    .rope_forward = table_rope_forward,
    .rope_backward = table_rope_backward,
    .attention_forward = table_attention_forward,
    .attention_backward = table_attention_backward,
    .swiglu_forward = table_swiglu_forward,
    .swiglu_backward = table_swiglu_backward,
    .cross_entropy_forward = table_cross_entropy_forward,
    .cross_entropy_backward = table_cross_entropy_backward,
    .cross_entropy_forward_backward = table_cross_entropy_forward_backward,
    .sum_squares = cpu_sum_squares,
    .add_floats = cpu_add_floats,
    .adamw_update = table_adamw_update,
    .adamw_update_ranges = table_adamw_update_ranges,
};

static pthread_once_t cpu_backend_filled = PTHREAD_ONCE_INIT;

static void cpu_backend_fill(void)
{
    backend_cpu_fill_routing(&cpu_backend);
}

const Backend *backend_cpu(void)
{
    pthread_once(&cpu_backend_filled, cpu_backend_fill);
    return &cpu_backend;
}
