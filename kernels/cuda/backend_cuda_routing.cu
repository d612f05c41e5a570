/* kernels/cuda/backend_cuda_routing.cu — the attention-over-depth and MSAR entries of the cuda
 * op table (runtime/backend.h; DESIGN 2.1, 2.2; contract in backend_cuda_internal.h).
 *
 * Every entry wraps one kernel of route_cuda.h with the same arguments in the same order,
 * casting the table's Activation arrays to bf16 and adding the compute stream and, where a
 * kernel needs scratch, the workspace of backend_cuda.cu. The pointer arrays are host arrays
 * of device pointers; an Activation pointer and a bf16 pointer have one representation, so
 * the arrays pass as they are. The `scratch` arguments of the route backwards are not used
 * (the workspace replaces them).
 *
 * How fast should this be: an entry adds one host call and a workspace size comparison to
 * its kernels, whose floors route_cuda.h gives.
 */
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/kernels_cuda.h"

#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_cuda.h"

static bf16 *as_bf16(Activation *array)
{
    return (bf16 *)array;
}

static const bf16 *as_bf16_const(const Activation *array)
{
    return (const bf16 *)array;
}

static void op_route_forward(Activation *out, float *weights, float *rstd,
                             const Activation *const *sources, int n_sources,
                             const Activation *query, const Activation *key_norm,
                             const Activation *base, const float *alpha, int tokens, int d,
                             int heads, float eps)
{
    cuda_route_forward(as_bf16(out), weights, rstd, (const bf16 *const *)sources, n_sources,
                       as_bf16_const(query), as_bf16_const(key_norm), as_bf16_const(base),
                       alpha, tokens, d, heads, eps, backend_cuda_compute_stream());
}

static void op_route_backward(Activation *const *dsources, float *dquery, float *dkey_norm,
                              float *dalpha, const Activation *dout,
                              const Activation *const *sources, int n_sources,
                              const float *weights, const float *rstd, const Activation *query,
                              const Activation *key_norm, const float *alpha, float *scratch,
                              int tokens, int d, int heads)
{
    (void)scratch; /* the workspace replaces it */
    float *workspace =
        backend_cuda_workspace_floats(cuda_route_backward_workspace_floats(tokens, d));
    cuda_route_backward((bf16 *const *)dsources, dquery, dkey_norm, dalpha, as_bf16_const(dout),
                        (const bf16 *const *)sources, n_sources, weights, rstd,
                        as_bf16_const(query), as_bf16_const(key_norm), alpha, workspace,
                        tokens, d, heads, backend_cuda_compute_stream());
}

static void op_stream_conv_forward(Activation *const *out, const Activation *const *x,
                                   const Activation *const *taps, int count, int streams,
                                   const int *kernel_sizes, int B, int T, int d)
{
    cuda_stream_conv_forward((bf16 *const *)out, (const bf16 *const *)x,
                             (const bf16 *const *)taps, count, streams, kernel_sizes, B, T, d,
                             backend_cuda_compute_stream());
}

static void op_stream_conv_backward(Activation *const *dx, float *const *dtaps,
                                    const Activation *const *dout, const Activation *const *x,
                                    const Activation *const *taps, int count, int streams,
                                    const int *kernel_sizes, int B, int T, int d)
{
    float *workspace = backend_cuda_workspace_floats(
        cuda_stream_conv_backward_workspace_floats(count, streams, kernel_sizes, B, T, d));
    cuda_stream_conv_backward((bf16 *const *)dx, dtaps, (const bf16 *const *)dout,
                              (const bf16 *const *)x, (const bf16 *const *)taps, count,
                              streams, kernel_sizes, B, T, d, workspace,
                              backend_cuda_compute_stream());
}

static void op_stream_mix_forward(Activation *out, float *gates, float *rstd,
                                  const Activation *const *streams, int m,
                                  const float *mix_bias, const Activation *mix_proj, int tokens,
                                  int d, float eps)
{
    cuda_stream_mix_forward(as_bf16(out), gates, rstd, (const bf16 *const *)streams, m, mix_bias,
                            as_bf16_const(mix_proj), tokens, d, eps, backend_cuda_compute_stream());
}

static void op_stream_mix_backward(Activation *const *dstreams, GradMode dstreams_mode,
                                   float *dmix_bias, float *dmix_proj, float *dalpha,
                                   const Activation *dout, const Activation *const *streams,
                                   int m, const float *gates, const float *rstd,
                                   const float *mix_bias, const Activation *mix_proj,
                                   const float *alpha, int tokens, int d)
{
    float *workspace =
        backend_cuda_workspace_floats(cuda_stream_mix_backward_workspace_floats(m, tokens, d));
    cuda_stream_mix_backward((bf16 *const *)dstreams, dstreams_mode, dmix_bias, dmix_proj,
                             dalpha, as_bf16_const(dout), (const bf16 *const *)streams, m, gates,
                             rstd, mix_bias, as_bf16_const(mix_proj), alpha, tokens, d,
                             workspace, backend_cuda_compute_stream());
}

static void op_route_conv_forward(Activation *out, float *weights, float *rstd,
                                  const Activation *const *sources,
                                  const Activation *const *taps, int n_sources, int kernel_size,
                                  const Activation *query, const Activation *key_norm, int B,
                                  int T, int d, int heads, float eps)
{
    float *workspace = backend_cuda_workspace_floats(
        cuda_route_conv_forward_workspace_floats(n_sources, B * T, d, heads));
    cuda_route_conv_forward(as_bf16(out), weights, rstd, (const bf16 *const *)sources,
                            (const bf16 *const *)taps, n_sources, kernel_size,
                            as_bf16_const(query), as_bf16_const(key_norm), B, T, d, heads, eps,
                            workspace, backend_cuda_compute_stream());
}

static void op_route_conv_mix(Activation *out, const float *weights,
                              const Activation *const *sources, const Activation *const *taps,
                              int n_sources, int kernel_size, int B, int T, int d, int heads)
{
    cuda_route_conv_mix(as_bf16(out), weights, (const bf16 *const *)sources,
                        (const bf16 *const *)taps, n_sources, kernel_size, B, T, d, heads,
                        backend_cuda_compute_stream());
}

static void op_route_conv_backward(Activation *const *dsources, float *const *dtaps,
                                   float *dquery, float *dkey_norm, const Activation *dout,
                                   const Activation *const *sources,
                                   const Activation *const *taps, int n_sources,
                                   int kernel_size, const float *weights, const float *rstd,
                                   const Activation *query, const Activation *key_norm,
                                   float *scratch, int B, int T, int d, int heads)
{
    (void)scratch; /* the workspace replaces it */
    float *workspace = backend_cuda_workspace_floats(
        cuda_route_conv_backward_workspace_floats(n_sources, kernel_size, B * T, d, heads));
    cuda_route_conv_backward((bf16 *const *)dsources, dtaps, dquery, dkey_norm,
                             as_bf16_const(dout), (const bf16 *const *)sources,
                             (const bf16 *const *)taps, n_sources, kernel_size, weights, rstd,
                             as_bf16_const(query), as_bf16_const(key_norm), B, T, d, heads,
                             workspace, backend_cuda_compute_stream());
}

/* ---- the two-phase Route (route_block_cuda.h) ---- */

static void op_route_block_forward(Activation *const *results, float *const *weights,
                                   float *const *rstd, float *const *lse,
                                   const Activation *const *sources, int n_sources,
                                   const Activation *const *queries,
                                   const Activation *const *key_norms, int n_sites, int tokens,
                                   int d, int heads, float eps)
{
    float *workspace = backend_cuda_workspace_floats(
        cuda_route_block_forward_workspace_floats(n_sources, n_sites, tokens, d, heads));
    cuda_route_block_forward((bf16 *const *)results, weights, rstd, lse,
                             (const bf16 *const *)sources, n_sources,
                             (const bf16 *const *)queries, (const bf16 *const *)key_norms,
                             n_sites, tokens, d, heads, eps, workspace,
                             backend_cuda_compute_stream());
}

static void op_add_scaled(Activation *out, const Activation *base, const Activation *x,
                          const float *alpha, size_t n)
{
    cuda_add_scaled(as_bf16(out), as_bf16_const(base), as_bf16_const(x), alpha, n,
                    backend_cuda_compute_stream());
}

/* A GateAdd as the kernels take it, in *storage; NULL for none */
static const CudaGateAdd *device_gate_add(const GateAdd *add, CudaGateAdd *storage)
{
    if (!add)
        return NULL;
    *storage = (CudaGateAdd){as_bf16_const(add->added), as_bf16(add->stream),
                             as_bf16_const(add->partial_before), as_bf16(add->partial)};
    return storage;
}

static void op_add_scaled_rmsnorm_forward(Activation *x, Activation *out, float *rstd,
                                          const Activation *base, const Activation *route,
                                          const float *alpha, const Activation *weight, int rows,
                                          int d, float eps, const GateAdd *add)
{
    CudaGateAdd device_add;
    cuda_add_scaled_rmsnorm_forward(as_bf16(x), as_bf16(out), rstd, as_bf16_const(base),
                                    as_bf16_const(route), alpha, as_bf16_const(weight), rows, d,
                                    eps, device_gate_add(add, &device_add),
                                    backend_cuda_compute_stream());
}

static void op_stream_mix_rmsnorm_forward(Activation *x, Activation *out, float *rstd,
                                          const StreamMix *mix, const Activation *base,
                                          const float *alpha, const Activation *weight, int rows,
                                          int d, float eps, const GateAdd *add)
{
    CudaGateAdd device_add;
    cuda_stream_mix_rmsnorm_forward(
        as_bf16(x), as_bf16(out), rstd, as_bf16(mix->scratch), mix->gates, mix->rstd,
        (const bf16 *const *)mix->streams, mix->m, mix->mix_bias, as_bf16_const(mix->mix_proj),
        mix->eps, as_bf16_const(base), alpha, as_bf16_const(weight), rows, d, eps,
        device_gate_add(add, &device_add), backend_cuda_compute_stream());
}

static void op_add_scaled_backward(Activation *dx, float *dalpha, const Activation *dout,
                                   const Activation *x, const float *alpha, size_t n)
{
    float *workspace =
        backend_cuda_workspace_floats(cuda_add_scaled_backward_workspace_floats(n));
    cuda_add_scaled_backward(as_bf16(dx), dalpha, as_bf16_const(dout), as_bf16_const(x), alpha,
                             n, workspace, backend_cuda_compute_stream());
}

static void op_route_merge_forward(Activation *out, float *weights, float *rstd,
                                   const Activation *result, const float *lse,
                                   const Activation *partial, int n_sources,
                                   const Activation *query, const Activation *key_norm,
                                   int tokens, int d, int heads, float eps)
{
    cuda_route_merge_forward(as_bf16(out), weights, rstd, as_bf16_const(result), lse,
                             as_bf16_const(partial), n_sources, as_bf16_const(query),
                             as_bf16_const(key_norm), tokens, d, heads, eps,
                             backend_cuda_compute_stream());
}

static void op_route_merge_rmsnorm_forward(Activation *x, Activation *out, float *rstd,
                                           const RouteMerge *merge, const Activation *weight,
                                           int rows, int d, float eps, const GateAdd *add)
{
    CudaGateAdd device_add;
    cuda_route_merge_rmsnorm_forward(as_bf16(x), as_bf16(out), rstd, merge->weights,
                                     merge->rstd, as_bf16_const(merge->result), merge->lse,
                                     as_bf16_const(merge->partial), merge->n_sources,
                                     as_bf16_const(merge->query), as_bf16_const(merge->key_norm),
                                     as_bf16_const(weight), rows, d, merge->heads, merge->eps,
                                     eps, device_gate_add(add, &device_add),
                                     backend_cuda_compute_stream());
}

static void op_route_merge_conv_forward(Activation *const *out, float *const *weights,
                                        float *const *rstd, const Activation *const *result,
                                        const float *const *lse, const Activation *partial,
                                        const Activation *const *taps, const int *kernel_sizes,
                                        int streams, int n_sources,
                                        const Activation *const *query,
                                        const Activation *const *key_norm,
                                        Activation *const *rows, int B, int T, int d,
                                        int heads, float eps)
{
    cuda_route_merge_conv_forward((bf16 *const *)out, weights, rstd, (const bf16 *const *)result,
                                  lse, as_bf16_const(partial), (const bf16 *const *)taps,
                                  kernel_sizes, streams, n_sources, (const bf16 *const *)query,
                                  (const bf16 *const *)key_norm, (bf16 *const *)rows, B, T, d,
                                  heads, eps, backend_cuda_compute_stream());
}

static void op_route_merge_conv_mix_forward(
    Activation *x, float *gates, float *mix_rstd, const float *mix_bias,
    const Activation *mix_proj, Activation *const *out, bool keep_streams,
    float *const *weights, float *const *rstd, const Activation *const *result,
    const float *const *lse, const Activation *partial, const Activation *const *taps,
    const int *kernel_sizes, int streams, int n_sources, const Activation *const *query,
    const Activation *const *key_norm, Activation *const *rows, int B, int T, int d, int heads,
    float eps)
{
    cuda_route_merge_conv_mix_forward(
        as_bf16(x), gates, mix_rstd, mix_bias, as_bf16_const(mix_proj), (bf16 *const *)out,
        keep_streams, weights, rstd, (const bf16 *const *)result, lse, as_bf16_const(partial),
        (const bf16 *const *)taps, kernel_sizes, streams, n_sources, (const bf16 *const *)query,
        (const bf16 *const *)key_norm, (bf16 *const *)rows, B, T, d, heads, eps,
        backend_cuda_compute_stream());
}

static void op_route_merge_backward(Activation *dpartial, GradMode dpartial_mode,
                                    float *dquery, float *dkey_norm, float *mean,
                                    const Activation *dout, const Activation *out,
                                    const Activation *partial, int n_sources,
                                    const float *weights, const float *rstd,
                                    const Activation *query, const Activation *key_norm,
                                    float *scratch, int tokens, int d, int heads)
{
    (void)scratch; /* the workspace replaces it */
    float *workspace = backend_cuda_workspace_floats(
        cuda_route_merge_backward_workspace_floats(tokens, d, heads));
    cuda_route_merge_backward(as_bf16(dpartial), dpartial_mode, dquery, dkey_norm, mean,
                              as_bf16_const(dout),
                              as_bf16_const(out), as_bf16_const(partial), n_sources, weights,
                              rstd, as_bf16_const(query), as_bf16_const(key_norm), workspace,
                              tokens, d, heads, backend_cuda_compute_stream());
}

static void op_route_merge_rmsnorm_backward(Activation *dx, float *dweight,
                                            const Activation *dout, const Activation *x,
                                            const Activation *weight, const float *rstd,
                                            int rows, int d, const RouteMergeGrad *merge)
{
    float *workspace = backend_cuda_workspace_floats(
        cuda_route_merge_rmsnorm_backward_workspace_floats(rows, d, merge->heads));
    cuda_route_merge_rmsnorm_backward(
        as_bf16(dx), dweight, as_bf16_const(dout), as_bf16_const(x), as_bf16_const(weight), rstd,
        as_bf16(merge->dpartial), merge->dpartial_mode, merge->dquery, merge->dkey_norm,
        merge->mean, as_bf16_const(merge->partial), merge->n_sources, merge->weights,
        merge->rstd, as_bf16_const(merge->query), as_bf16_const(merge->key_norm), workspace, rows,
        d, merge->heads, backend_cuda_compute_stream());
}

static void op_route_merge_conv_backward(
    Activation *const *dpartial, float *const *dquery, float *const *dkey_norm,
    float *const *mean, const Activation *const *dout, const Activation *const *out,
    const Activation *partial, const Activation *const *taps, const int *kernel_sizes,
    int streams, int n_sources, const float *const *weights, const float *const *rstd,
    const Activation *const *query, const Activation *const *key_norm, Activation *const *rows,
    float *scratch, int B, int T, int d, int heads)
{
    (void)scratch; /* the workspace replaces it */
    float *workspace = backend_cuda_workspace_floats(
        cuda_route_merge_conv_backward_workspace_floats(streams, B * T, d, heads));
    cuda_route_merge_conv_backward(
        (bf16 *const *)dpartial, dquery, dkey_norm, mean, (const bf16 *const *)dout,
        (const bf16 *const *)out, as_bf16_const(partial), (const bf16 *const *)taps,
        kernel_sizes, streams, n_sources, weights, rstd, (const bf16 *const *)query,
        (const bf16 *const *)key_norm, (bf16 *const *)rows, workspace, B, T, d, heads,
        backend_cuda_compute_stream());
}

static void op_route_block_backward(Activation *const *dsources, unsigned dsources_written,
                                    float *const *dqueries,
                                    float *const *dkey_norms, float *const *dalphas,
                                    const Activation *const *douts,
                                    const Activation *const *sources, int n_sources,
                                    const float *const *weights, const float *rstd,
                                    const Activation *const *queries,
                                    const Activation *const *key_norms,
                                    const float *const *alphas, const float *const *means,
                                    int n_sites, float *scratch, int tokens, int d, int heads)
{
    (void)scratch; /* the workspace replaces it */
    float *workspace = backend_cuda_workspace_floats(
        cuda_route_block_backward_workspace_floats(n_sources, n_sites, tokens, d, heads));
    cuda_route_block_backward((bf16 *const *)dsources, dsources_written, dqueries, dkey_norms,
                              dalphas,
                              (const bf16 *const *)douts, (const bf16 *const *)sources,
                              n_sources, weights, rstd, (const bf16 *const *)queries,
                              (const bf16 *const *)key_norms, alphas, means, n_sites,
                              workspace, tokens, d, heads, backend_cuda_compute_stream());
}

extern "C" void backend_cuda_fill_routing(Backend *table, size_t table_bytes)
{
    backend_cuda_check_table("backend_cuda_routing.cu", sizeof *table, table_bytes);
    table->route_block_forward = op_route_block_forward;
    table->add_scaled = op_add_scaled;
    table->add_scaled_rmsnorm_forward = op_add_scaled_rmsnorm_forward;
    table->stream_mix_rmsnorm_forward = op_stream_mix_rmsnorm_forward;
    table->add_scaled_backward = op_add_scaled_backward;
    table->route_merge_forward = op_route_merge_forward;
    table->route_merge_rmsnorm_forward = op_route_merge_rmsnorm_forward;
    table->route_merge_backward = op_route_merge_backward;
    table->route_merge_rmsnorm_backward = op_route_merge_rmsnorm_backward;
    table->route_merge_conv_forward = op_route_merge_conv_forward;
    table->route_merge_conv_mix_forward = op_route_merge_conv_mix_forward;
    table->route_merge_conv_backward = op_route_merge_conv_backward;
    table->route_block_backward = op_route_block_backward;
    table->route_forward = op_route_forward;
    table->route_backward = op_route_backward;
    table->stream_conv_forward = op_stream_conv_forward;
    table->stream_conv_backward = op_stream_conv_backward;
    table->route_conv_forward = op_route_conv_forward;
    table->route_conv_mix = op_route_conv_mix;
    table->route_conv_backward = op_route_conv_backward;
    table->stream_mix_forward = op_stream_mix_forward;
    table->stream_mix_backward = op_stream_mix_backward;
}
