/* kernels/cuda/backend_cuda_layers.cu — the decoder layer's and the loss's entries of the cuda
 * op table (runtime/backend.h; DESIGN 1, 2; contract in backend_cuda_internal.h).
 *
 * Every entry wraps one kernel of kernels_cuda.h or attention_cuda.h with the same arguments
 * in the same order, casting the table's Activation arrays to bf16 and adding the compute
 * stream and, where a kernel needs scratch, the workspace of backend_cuda.cu. One choice is
 * made here rather than in the kernels: the cross-entropy backward is called with
 * dlogits != logits (the model keeps them apart), so it adds as the table says.
 *
 * How fast should this be: an entry adds one host call (and, for a backward with scratch,
 * one size comparison) to its kernel, whose floor its header gives.
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/kernels_cuda.h"

static bf16 *as_bf16(Activation *array)
{
    return (bf16 *)array;
}

static const bf16 *as_bf16_const(const Activation *array)
{
    return (const bf16 *)array;
}

static cudaStream_t compute_stream(void)
{
    return backend_cuda_compute_stream();
}

static float *workspace_floats(size_t floats)
{
    return backend_cuda_workspace_floats(floats);
}

/* ---- elementwise, embedding, rmsnorm, matmul, rope ---- */

static void op_add_inplace(Activation *y, const Activation *x, size_t n)
{
    cuda_add_inplace(as_bf16(y), as_bf16_const(x), n, compute_stream());
}

static void op_add(Activation *out, const Activation *a, const Activation *b, size_t n)
{
    cuda_add(as_bf16(out), as_bf16_const(a), as_bf16_const(b), n, compute_stream());
}

static void op_add_both(Activation *out, const Activation *a, Activation *y, const Activation *x,
                        size_t n)
{
    cuda_add_both(as_bf16(out), as_bf16_const(a), as_bf16(y), as_bf16_const(x), n,
                  compute_stream());
}

static void op_add_difference(Activation *y, const Activation *plus, const Activation *minus,
                              size_t n)
{
    cuda_add_difference(as_bf16(y), as_bf16_const(plus), as_bf16_const(minus), n,
                        compute_stream());
}

static void op_embedding_forward(Activation *out, const uint32_t *tokens,
                                 const Activation *table, int n, int d)
{
    cuda_embedding_forward(as_bf16(out), tokens, as_bf16_const(table), n, d, compute_stream());
}

static void op_embedding_backward(float *dtable, const Activation *dout, const uint32_t *tokens,
                                  int n, int d)
{
    cuda_embedding_backward(dtable, as_bf16_const(dout), tokens, n, d, compute_stream());
}

static void op_sum_rows(float *out, const Activation *x, int rows, int d)
{
    float *workspace = workspace_floats(cuda_sum_rows_workspace_floats(rows, d));
    cuda_sum_rows(out, as_bf16_const(x), rows, d, workspace, compute_stream());
}

static void op_rmsnorm_forward(Activation *out, float *rstd, const Activation *x,
                               const Activation *weight, int rows, int d, float eps)
{
    cuda_rmsnorm_forward(as_bf16(out), rstd, as_bf16_const(x), as_bf16_const(weight), rows, d,
                         eps, compute_stream());
}

static void op_add_rmsnorm_forward(Activation *sum, Activation *out, float *rstd,
                                  const Activation *a, const Activation *b,
                                  const Activation *weight, int rows, int d, float eps)
{
    cuda_add_rmsnorm_forward(as_bf16(sum), as_bf16(out), rstd, as_bf16_const(a),
                             as_bf16_const(b), as_bf16_const(weight), rows, d, eps,
                             compute_stream());
}

static void op_rmsnorm_backward(Activation *dx, GradMode dx_mode, float *dweight,
                                const Activation *dout, const Activation *x,
                                const Activation *weight, const float *rstd, int rows, int d)
{
    float *workspace = workspace_floats(cuda_rmsnorm_backward_workspace_floats(rows, d));
    cuda_rmsnorm_backward(as_bf16(dx), dx_mode, dweight, as_bf16_const(dout), as_bf16_const(x),
                          as_bf16_const(weight), rstd, rows, d, workspace, compute_stream());
}

static void op_rmsnorm_backward_branch(Activation *dx, Activation *branch, float *dweight,
                                       const Activation *dout, const Activation *x,
                                       const Activation *weight, const float *rstd, int rows,
                                       int d)
{
    float *workspace = workspace_floats(cuda_rmsnorm_backward_workspace_floats(rows, d));
    cuda_rmsnorm_backward_branch(as_bf16(dx), as_bf16(branch), dweight, as_bf16_const(dout),
                                 as_bf16_const(x), as_bf16_const(weight), rstd, rows, d,
                                 workspace, compute_stream());
}

static void op_matmul_forward(Activation *out, const Activation *in, const Activation *weight,
                              int rows, int in_dim, int out_dim)
{
    cuda_matmul_forward(as_bf16(out), as_bf16_const(in), as_bf16_const(weight), rows, in_dim,
                        out_dim, compute_stream());
}

static void op_matmul_backward(Activation *din, GradMode din_mode, float *dweight,
                               GradMode dweight_mode, const Activation *dout,
                               const Activation *in, const Activation *weight, int rows,
                               int in_dim, int out_dim)
{
    cuda_matmul_backward(as_bf16(din), din_mode, dweight, dweight_mode, as_bf16_const(dout),
                         as_bf16_const(in), as_bf16_const(weight), rows, in_dim, out_dim,
                         compute_stream());
}

static void op_rope_forward(Activation *out, const Activation *x, const float *cos,
                            const float *sin, int B, int T, int n_heads, int head_dim)
{
    cuda_rope_forward(as_bf16(out), as_bf16_const(x), cos, sin, B, T, n_heads, head_dim,
                      compute_stream());
}

static void op_rope_backward(Activation *dx, GradMode dx_mode, const Activation *dout,
                             const float *cos, const float *sin, int B, int T, int n_heads,
                             int head_dim)
{
    cuda_rope_backward(as_bf16(dx), dx_mode, as_bf16_const(dout), cos, sin, B, T, n_heads,
                       head_dim, compute_stream());
}

/* ---- attention, swiglu, cross-entropy ---- */

static void op_attention_forward(Activation *out, float *lse, const Activation *q,
                                 const Activation *k, const Activation *v, int B, int T,
                                 int n_heads, int n_kv_heads, int head_dim)
{
    attention_forward_cuda(as_bf16(out), lse, as_bf16_const(q), as_bf16_const(k),
                           as_bf16_const(v), B, T, n_heads, n_kv_heads, head_dim,
                           compute_stream());
}

static void op_attention_backward(Activation *dq, Activation *dk, Activation *dv,
                                  GradMode mode, const Activation *dout, const Activation *q,
                                  const Activation *k, const Activation *v,
                                  const Activation *out, const float *lse, int B, int T,
                                  int n_heads, int n_kv_heads, int head_dim)
{
    const size_t bytes = attention_backward_cuda_workspace_bytes(B, T, n_heads, head_dim);
    float *workspace = workspace_floats((bytes + sizeof(float) - 1) / sizeof(float));
    attention_backward_cuda(as_bf16(dq), as_bf16(dk), as_bf16(dv), mode, as_bf16_const(dout),
                            as_bf16_const(q), as_bf16_const(k), as_bf16_const(v),
                            as_bf16_const(out), lse, B, T, n_heads, n_kv_heads, head_dim,
                            workspace, compute_stream());
}

static void op_swiglu_forward(Activation *out, const Activation *gate, const Activation *up,
                              size_t n)
{
    cuda_swiglu_forward(as_bf16(out), as_bf16_const(gate), as_bf16_const(up), n,
                        compute_stream());
}

static void op_swiglu_backward(Activation *dgate, Activation *dup, GradMode mode,
                               const Activation *dout, const Activation *gate,
                               const Activation *up, size_t n)
{
    cuda_swiglu_backward(as_bf16(dgate), as_bf16(dup), mode, as_bf16_const(dout),
                         as_bf16_const(gate), as_bf16_const(up), n, compute_stream());
}

static void op_cross_entropy_forward(float *losses, float *lse, const Activation *logits,
                                     const uint32_t *targets, int rows, int V, float z_loss)
{
    cuda_cross_entropy_forward(losses, lse, as_bf16_const(logits), targets, rows, V, z_loss,
                               compute_stream());
}

static void op_cross_entropy_backward(Activation *dlogits, GradMode mode, const float *dloss,
                                      const Activation *logits, const float *lse,
                                      const uint32_t *targets, int rows, int V, float z_loss)
{
    cuda_cross_entropy_backward(as_bf16(dlogits), mode, dloss, as_bf16_const(logits), lse,
                                targets, rows, V, z_loss, compute_stream());
}

static void op_cross_entropy_forward_backward(float *losses, float *lse, Activation *logits,
                                              const float *dloss, const uint32_t *targets,
                                              int rows, int V, float z_loss)
{
    cuda_cross_entropy_forward_backward(losses, lse, as_bf16(logits), dloss, targets, rows, V,
                                        z_loss, compute_stream());
}

extern "C" void backend_cuda_fill_layers(Backend *table, size_t table_bytes)
{
    backend_cuda_check_table("backend_cuda_layers.cu", sizeof *table, table_bytes);
    table->add_inplace = op_add_inplace;
    table->add_both = op_add_both;
    table->add_difference = op_add_difference;
    table->add = op_add;
    table->embedding_forward = op_embedding_forward;
    table->embedding_backward = op_embedding_backward;
    table->sum_rows = op_sum_rows;
    table->rmsnorm_forward = op_rmsnorm_forward;
    table->add_rmsnorm_forward = op_add_rmsnorm_forward;
    table->rmsnorm_backward = op_rmsnorm_backward;
    table->rmsnorm_backward_branch = op_rmsnorm_backward_branch;
    table->matmul_forward = op_matmul_forward;
    table->matmul_backward = op_matmul_backward;
    table->rope_forward = op_rope_forward;
    table->rope_backward = op_rope_backward;
    table->attention_forward = op_attention_forward;
    table->attention_backward = op_attention_backward;
    table->swiglu_forward = op_swiglu_forward;
    table->swiglu_backward = op_swiglu_backward;
    table->cross_entropy_forward = op_cross_entropy_forward;
    table->cross_entropy_backward = op_cross_entropy_backward;
    table->cross_entropy_forward_backward = op_cross_entropy_forward_backward;
}
