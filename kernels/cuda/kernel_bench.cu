/* kernels/cuda/kernel_bench.cu — `fathom-kernel-bench`: times the CUDA kernels at the shapes
 * of one Llama-3-8B layer at 4096 tokens (d 4096, ffn 14336, 32/8 heads, head_dim 128).
 *
 * Each case runs 3 warm-ups then 20 timed calls between CUDA events; the median is printed
 * with the rate it implies (TFLOP/s for matmul and attention, GB/s for the memory-bound
 * kernels, counting each input read once and each output written once, "+=" outputs read
 * and written) and the floor on an H200 (790 TFLOP/s bf16 dense, 4.3 TB/s copy, measured
 * here). Inputs are random (never zeros, which run faster than real data). GPU only.
 * `fathom-kernel-bench attention [VARIANT]` times the attention cases alone, at head_dim 128,
 * 80 (the 1B shape at B32, and at B8: its step's microbatch) and 64, with every kernel
 * variant (forwards grouped, specialised, single_consumer, persistent; backwards fused,
 * fused_tma, two_pass) or only the one named, so that a variant that faults takes no other
 * with it. `fathom-kernel-bench matmul` times the matmuls alone, `fathom-kernel-bench
 * optimizer` AdamW and the clipping norm alone, `fathom-kernel-bench mix` MSAR's stream mix,
 * convolution and merges (kernel_bench_stream.cu), `fathom-kernel-bench overlap` the
 * optimizer's update beside the next forward's products (kernel_bench_overlap.cu).
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/kernel_bench.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/route_block_cuda.h"
#include "kernels/cuda/route_cuda.h"

#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- cases ---- */

typedef struct {
    int rows, in_dim, out_dim;
    bf16 *in, *weight, *out, *dout, *din;
    float *dweight;
} MatmulCase;

static void matmul_forward_case(void *p)
{
    MatmulCase *c = (MatmulCase *)p;
    cuda_matmul_forward(c->out, c->in, c->weight, c->rows, c->in_dim, c->out_dim, 0);
}

static void matmul_backward_case(void *p)
{
    MatmulCase *c = (MatmulCase *)p;
    cuda_matmul_backward(c->din, GRAD_ADD, c->dweight, GRAD_ADD, c->dout, c->in, c->weight,
                         c->rows, c->in_dim, c->out_dim, 0);
}

/* the weight gradient alone: added into the fp32 accumulator (C read, beta 1) or written
 * (beta 0: a microbatch's first contribution) */
static void matmul_weight_add_case(void *p)
{
    MatmulCase *c = (MatmulCase *)p;
    cuda_matmul_backward(NULL, GRAD_ADD, c->dweight, GRAD_ADD, c->dout, c->in, c->weight,
                         c->rows, c->in_dim, c->out_dim, 0);
}

static void matmul_weight_write_case(void *p)
{
    MatmulCase *c = (MatmulCase *)p;
    cuda_matmul_backward(NULL, GRAD_ADD, c->dweight, GRAD_WRITE, c->dout, c->in, c->weight,
                         c->rows, c->in_dim, c->out_dim, 0);
}

static void bench_matmul(int rows, int in_dim, int out_dim)
{
    MatmulCase c = {};
    c.rows = rows, c.in_dim = in_dim, c.out_dim = out_dim;
    c.in = (bf16 *)device_random_bf16((size_t)rows * in_dim, 1);
    c.weight = (bf16 *)device_random_bf16((size_t)out_dim * in_dim, 2);
    c.out = (bf16 *)device_random_bf16((size_t)rows * out_dim, 3);
    c.dout = (bf16 *)device_random_bf16((size_t)rows * out_dim, 4);
    c.din = (bf16 *)device_random_bf16((size_t)rows * in_dim, 5);
    c.dweight = device_floats((size_t)out_dim * in_dim, 0.0f);
    double flops = 2.0 * rows * in_dim * out_dim;
    char name[64];
    snprintf(name, sizeof name, "matmul fwd %dx%dx%d", rows, in_dim, out_dim);
    report(name, median_ms(matmul_forward_case, &c), flops, 0);
    snprintf(name, sizeof name, "matmul bwd %dx%dx%d", rows, in_dim, out_dim);
    report(name, median_ms(matmul_backward_case, &c), 2 * flops, 0);
    snprintf(name, sizeof name, "matmul dweight add %dx%dx%d", rows, in_dim, out_dim);
    report(name, median_ms(matmul_weight_add_case, &c), flops, 0);
    snprintf(name, sizeof name, "matmul dweight write %dx%dx%d", rows, in_dim, out_dim);
    report(name, median_ms(matmul_weight_write_case, &c), flops, 0);
    cudaFree(c.in), cudaFree(c.weight), cudaFree(c.out), cudaFree(c.dout), cudaFree(c.din);
    cudaFree(c.dweight);
}

typedef struct {
    int B, T, H, KV, hd;
    bf16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse, *workspace;
} AttentionCase;

static void attention_forward_case(void *p)
{
    AttentionCase *c = (AttentionCase *)p;
    attention_forward_cuda(c->out, c->lse, c->q, c->k, c->v, c->B, c->T, c->H, c->KV, c->hd, 0);
}

static void attention_backward_case(void *p)
{
    AttentionCase *c = (AttentionCase *)p;
    attention_backward_cuda(c->dq, c->dk, c->dv, GRAD_WRITE, c->dout, c->q, c->k, c->v, c->out,
                            c->lse, c->B, c->T, c->H, c->KV, c->hd, c->workspace, 0);
}

/* The attention variants by name; `only` NULL times them all. */
static const char *const forward_names[] = {"grouped", "specialised", "single_consumer",
                                            "persistent"};
static const AttentionForwardKernel forward_kernels[] = {
    ATTENTION_FORWARD_GROUPED, ATTENTION_FORWARD_SPECIALISED, ATTENTION_FORWARD_SINGLE_CONSUMER,
    ATTENTION_FORWARD_PERSISTENT};
enum { FORWARD_VARIANTS = 4 };
static const char *const backward_names[] = {"fused", "fused_tma", "two_pass"};
static const AttentionBackwardKernel backward_kernels[] = {
    ATTENTION_BACKWARD_FUSED, ATTENTION_BACKWARD_FUSED_TMA, ATTENTION_BACKWARD_TWO_PASS};

static bool attention_variant_known(const char *only)
{
    for (int i = 0; i < FORWARD_VARIANTS; i++)
        if (!strcmp(only, forward_names[i]))
            return true;
    for (int i = 0; i < 3; i++)
        if (!strcmp(only, backward_names[i]))
            return true;
    return false;
}

static void bench_attention(int B, int T, int H, int KV, int hd, const char *only)
{
    AttentionCase c = {};
    c.B = B, c.T = T, c.H = H, c.KV = KV, c.hd = hd;
    size_t q_n = (size_t)B * T * H * hd, kv_n = (size_t)B * T * KV * hd;
    c.q = (bf16 *)device_random_bf16(q_n, 11);
    c.k = (bf16 *)device_random_bf16(kv_n, 12);
    c.v = (bf16 *)device_random_bf16(kv_n, 13);
    c.out = (bf16 *)device_random_bf16(q_n, 14);
    c.dout = (bf16 *)device_random_bf16(q_n, 15);
    c.dq = (bf16 *)device_random_bf16(q_n, 16);
    c.dk = (bf16 *)device_random_bf16(kv_n, 17);
    c.dv = (bf16 *)device_random_bf16(kv_n, 18);
    c.lse = device_floats((size_t)B * H * T, 0.0f);
    attention_cuda_select_backward(ATTENTION_BACKWARD_FUSED); /* the larger workspace */
    CUDA_CHECK(cudaMalloc(&c.workspace, attention_backward_cuda_workspace_bytes(B, T, H, hd)));
    double forward_flops = 4.0 * B * (double)T * T * H * hd / 2; /* causal: half */
    char name[64];
    for (int i = 0; i < FORWARD_VARIANTS; i++) {
        if (only && strcmp(only, forward_names[i]))
            continue;
        attention_cuda_select_forward(forward_kernels[i]);
        snprintf(name, sizeof name, "attention fwd %s B%d T%d %d/%d hd%d", forward_names[i], B,
                 T, H, KV, hd);
        report(name, median_ms(attention_forward_case, &c), forward_flops, 0);
    }
    attention_cuda_select_forward(ATTENTION_FORWARD_GROUPED);
    attention_forward_case(&c); /* a real lse for the backward */
    for (int i = 0; i < 3; i++) {
        if (only && strcmp(only, backward_names[i]))
            continue;
        attention_cuda_select_backward(backward_kernels[i]);
        snprintf(name, sizeof name, "attention bwd %s B%d T%d %d/%d hd%d", backward_names[i], B,
                 T, H, KV, hd);
        report(name, median_ms(attention_backward_case, &c), 2.5 * forward_flops, 0);
    }
    cudaFree(c.q), cudaFree(c.k), cudaFree(c.v), cudaFree(c.out), cudaFree(c.dout);
    cudaFree(c.dq), cudaFree(c.dk), cudaFree(c.dv), cudaFree(c.lse), cudaFree(c.workspace);
}

typedef struct {
    int rows, d;
    bf16 *x, *weight, *out, *dout, *dx, *base, *route;
    float *rstd, *dweight, *workspace, *alpha;
    /* the delta form's adds around the norms: f into the partial and p (base) before the
     * gated forward; the backward's branch (d p_j, or d p_j + d b_n inside a block), and
     * the block gradients it trades at a block's edge (addend in, taken out) */
    bf16 *f, *partial_before, *partial, *branch, *addend, *taken;
} NormCase;

static void rmsnorm_forward_case(void *p)
{
    NormCase *c = (NormCase *)p;
    cuda_rmsnorm_forward(c->out, c->rstd, c->x, c->weight, c->rows, c->d, 1e-5f, 0);
}

/* the delta form's gate, alone and inside the norm (runtime/backend.h
 * add_scaled_rmsnorm_forward) */
static void add_scaled_case(void *p)
{
    NormCase *c = (NormCase *)p;
    cuda_add_scaled(c->x, c->base, c->route, c->alpha, (size_t)c->rows * c->d, 0);
}

static void gated_rmsnorm_forward_case(void *p)
{
    NormCase *c = (NormCase *)p;
    cuda_add_scaled_rmsnorm_forward(c->x, c->out, c->rstd, c->base, c->route, c->alpha,
                                    c->weight, c->rows, c->d, 1e-5f, NULL, 0);
}

static void add_both_then_gated_forward_case(void *p)
{
    NormCase *c = (NormCase *)p;
    const size_t n = (size_t)c->rows * c->d;
    cuda_add_both(c->partial, c->partial_before, c->base, c->f, n, 0);
    cuda_add_scaled_rmsnorm_forward(c->x, c->out, c->rstd, c->base, c->route, c->alpha,
                                    c->weight, c->rows, c->d, 1e-5f, NULL, 0);
}

static void gated_forward_with_adds_case(void *p)
{
    NormCase *c = (NormCase *)p;
    const CudaGateAdd add = {c->f, c->base, c->partial_before, c->partial};
    cuda_add_scaled_rmsnorm_forward(c->x, c->out, c->rstd, c->base, c->route, c->alpha,
                                    c->weight, c->rows, c->d, 1e-5f, &add, 0);
}

static void branch_backward_case(void *p)
{
    NormCase *c = (NormCase *)p;
    cuda_rmsnorm_backward_branch(c->dx, c->branch, c->dweight, c->dout, c->x, c->weight,
                                 c->rstd, c->rows, c->d, c->workspace, 0);
}

static void branch_add_case(void *p)
{
    NormCase *c = (NormCase *)p;
    cuda_add(c->dout, c->branch, c->addend, (size_t)c->rows * c->d, 0);
}

static void add_difference_case(void *p)
{
    NormCase *c = (NormCase *)p;
    cuda_add_difference(c->branch, c->addend, c->taken, (size_t)c->rows * c->d, 0);
}

static void rmsnorm_backward_case(void *p)
{
    NormCase *c = (NormCase *)p;
    cuda_rmsnorm_backward(c->dx, GRAD_ADD, c->dweight, c->dout, c->x, c->weight, c->rstd,
                          c->rows, c->d, c->workspace, 0);
}

static void bench_rmsnorm(int rows, int d)
{
    NormCase c = {};
    c.rows = rows, c.d = d;
    size_t n = (size_t)rows * d;
    c.x = (bf16 *)device_random_bf16(n, 21);
    c.weight = (bf16 *)device_random_bf16(d, 22);
    c.out = (bf16 *)device_random_bf16(n, 23);
    c.dout = (bf16 *)device_random_bf16(n, 24);
    c.dx = (bf16 *)device_random_bf16(n, 25);
    c.rstd = device_floats(rows, 1.0f);
    c.dweight = device_floats(d, 0.0f);
    c.workspace = device_floats(cuda_rmsnorm_backward_workspace_floats(rows, d), 0.0f);
    c.base = (bf16 *)device_random_bf16(n, 26);
    c.route = (bf16 *)device_random_bf16(n, 27);
    c.alpha = device_floats(1, 0.5f);
    bf16 **rows_of[] = {&c.f, &c.partial_before, &c.partial, &c.branch, &c.addend, &c.taken};
    for (int k = 0; k < 6; k++)
        *rows_of[k] = (bf16 *)device_random_bf16(n, 30 + (uint64_t)k);
    /* each case's name and the rows of [rows, d] it moves; the backwards read the forward's
     * rstd. The delta form's adds: apart (9 rows) and inside the norm (8); backward, a
     * site's branch (5) and, where the stream's gradient did not carry its block's, the add
     * of d p_j and d b_n (3), or the trade at a block's edge (4). */
    const struct {
        const char *name;
        void (*run)(void *);
        int rows_moved;
    } cases[] = {
        {"rmsnorm fwd", rmsnorm_forward_case, 2},
        {"add_scaled", add_scaled_case, 3},
        {"add_scaled in rmsnorm fwd", gated_rmsnorm_forward_case, 4},
        {"rmsnorm bwd", rmsnorm_backward_case, 4},
        {"add_both, gated fwd", add_both_then_gated_forward_case, 9},
        {"gated fwd with adds", gated_forward_with_adds_case, 8},
        {"branch bwd", branch_backward_case, 5},
        {"add, d p + d b", branch_add_case, 3},
        {"add_difference", add_difference_case, 4},
    };
    rmsnorm_forward_case(&c);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s %dx%d", cases[i].name, rows, d);
        report(name, median_ms(cases[i].run, &c), 0, 2.0 * cases[i].rows_moved * n);
    }
    for (int k = 0; k < 6; k++)
        cudaFree(*rows_of[k]);
    cudaFree(c.x), cudaFree(c.weight), cudaFree(c.out), cudaFree(c.dout), cudaFree(c.dx);
    cudaFree(c.rstd), cudaFree(c.dweight), cudaFree(c.workspace), cudaFree(c.base);
    cudaFree(c.route), cudaFree(c.alpha);
}

typedef struct {
    size_t n;
    bf16 *gate, *up, *out, *dout, *dgate, *dup;
} SwigluCase;

static void swiglu_forward_case(void *p)
{
    SwigluCase *c = (SwigluCase *)p;
    cuda_swiglu_forward(c->out, c->gate, c->up, c->n, 0);
}

static void swiglu_backward_case(void *p)
{
    SwigluCase *c = (SwigluCase *)p;
    cuda_swiglu_backward(c->dgate, c->dup, GRAD_ADD, c->dout, c->gate, c->up, c->n, 0);
}

static void bench_swiglu(int rows, int ffn)
{
    SwigluCase c = {};
    c.n = (size_t)rows * ffn;
    c.gate = (bf16 *)device_random_bf16(c.n, 31);
    c.up = (bf16 *)device_random_bf16(c.n, 32);
    c.out = (bf16 *)device_random_bf16(c.n, 33);
    c.dout = (bf16 *)device_random_bf16(c.n, 34);
    c.dgate = (bf16 *)device_random_bf16(c.n, 35);
    c.dup = (bf16 *)device_random_bf16(c.n, 36);
    char name[64];
    snprintf(name, sizeof name, "swiglu fwd %dx%d", rows, ffn);
    report(name, median_ms(swiglu_forward_case, &c), 0, 3.0 * c.n * 2);
    snprintf(name, sizeof name, "swiglu bwd %dx%d", rows, ffn);
    report(name, median_ms(swiglu_backward_case, &c), 0, 7.0 * c.n * 2);
    cudaFree(c.gate), cudaFree(c.up), cudaFree(c.out), cudaFree(c.dout), cudaFree(c.dgate);
    cudaFree(c.dup);
}

typedef struct {
    OptimizerBuffers buffers;
    bool ema;
    float *copy_from;
    double *sum, *workspace;
    AdamwScalars scalars;
} OptimizerCase;

static void adamw_case(void *p)
{
    OptimizerCase *c = (OptimizerCase *)p;
    optimizer_buffers_update(&c->buffers, c->buffers.n, c->ema, &c->scalars, 0);
}

static void sum_squares_case(void *p)
{
    OptimizerCase *c = (OptimizerCase *)p;
    cuda_sum_squares(c->sum, c->buffers.grads, c->buffers.n, c->workspace, 0);
}

/* The copy rate on the same buffers, for the floor of the two above. */
static void copy_case(void *p)
{
    OptimizerCase *c = (OptimizerCase *)p;
    CUDA_CHECK(cudaMemcpyAsync(c->buffers.params, c->copy_from, c->buffers.n * sizeof(float),
                               cudaMemcpyDeviceToDevice, 0));
}

/* The optimizer's passes over n parameters (a decoder layer of the 8B model holds 218 M):
 * AdamW with the EMA and the bf16 copy moves 38 bytes a parameter, without the EMA 30. */
static void bench_optimizer(size_t n)
{
    OptimizerCase c = {};
    c.buffers = optimizer_buffers_make(n);
    c.ema = true;
    c.copy_from = device_floats(n, 0.02f);
    CUDA_CHECK(cudaMalloc(&c.sum, sizeof(double)));
    CUDA_CHECK(cudaMalloc(&c.workspace, CUDA_SUM_SQUARES_PARTIALS * sizeof(double)));
    c.scalars = (AdamwScalars){3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0.999f, 10};
    char name[64];
    snprintf(name, sizeof name, "adamw + ema + bf16 copy, %zu M", n >> 20);
    report(name, median_ms(adamw_case, &c), 0, 38.0 * n);
    c.ema = false;
    snprintf(name, sizeof name, "adamw + bf16 copy, %zu M", n >> 20);
    report(name, median_ms(adamw_case, &c), 0, 30.0 * n);
    snprintf(name, sizeof name, "sum_squares, %zu M", n >> 20);
    report(name, median_ms(sum_squares_case, &c), 0, 4.0 * n);
    snprintf(name, sizeof name, "copy (cudaMemcpyAsync), %zu M floats", n >> 20);
    report(name, median_ms(copy_case, &c), 0, 8.0 * n);
    optimizer_buffers_free(&c.buffers);
    cudaFree(c.copy_from), cudaFree(c.sum), cudaFree(c.workspace);
}

typedef struct {
    int rows, V;
    bf16 *logits;
    float *losses, *lse, *dloss;
    uint32_t *targets;
} LossCase;

static void loss_forward_case(void *p)
{
    LossCase *c = (LossCase *)p;
    cuda_cross_entropy_forward(c->losses, c->lse, c->logits, c->targets, c->rows, c->V, 1e-4f,
                               0);
}

static void loss_backward_case(void *p)
{
    LossCase *c = (LossCase *)p;
    cuda_cross_entropy_backward(c->logits, GRAD_WRITE, c->dloss, c->logits, c->lse, c->targets,
                                c->rows, c->V, 1e-4f, 0);
}

static void loss_forward_then_backward_case(void *p)
{
    loss_forward_case(p);
    loss_backward_case(p);
}

static void loss_forward_backward_case(void *p)
{
    LossCase *c = (LossCase *)p;
    cuda_cross_entropy_forward_backward(c->losses, c->lse, c->logits, c->dloss, c->targets,
                                        c->rows, c->V, 1e-4f, 0);
}

/* The loss over a chunk of logits [rows, V] (its gradient replaces them: each call runs on
 * the last one's output, which times the same): the forward reads the logits once, the
 * backward reads and writes them, the two in one launch ideally as the backward alone. */
static void bench_loss(int rows, int V)
{
    LossCase c = {};
    c.rows = rows, c.V = V;
    const size_t n = (size_t)rows * V;
    c.logits = (bf16 *)device_random_bf16(n, 41);
    c.losses = device_floats(rows, 0.0f);
    c.lse = device_floats(rows, 0.0f);
    c.dloss = device_floats(rows, 1.0f / rows);
    CUDA_CHECK(cudaMalloc(&c.targets, rows * sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(c.targets, 0, rows * sizeof(uint32_t)));
    const struct {
        const char *name;
        void (*run)(void *);
        int passes; /* of the logits' bytes through memory */
    } cases[] = {
        {"cross-entropy fwd", loss_forward_case, 1},
        {"cross-entropy bwd in place", loss_backward_case, 2},
        {"cross-entropy fwd, then bwd", loss_forward_then_backward_case, 3},
        {"cross-entropy fwd+bwd in one", loss_forward_backward_case, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s %dx%d", cases[i].name, rows, V);
        report(name, median_ms(cases[i].run, &c), 0, 2.0 * cases[i].passes * n);
    }
    cudaFree(c.logits), cudaFree(c.losses), cudaFree(c.lse), cudaFree(c.dloss);
    cudaFree(c.targets);
}

int main(int argc, char **argv)
{
    /* `fathom-kernel-bench attention [VARIANT]`: the attention cases alone, every kernel
     * variant or the one named */
    bool attention_only = argc > 1 && !strcmp(argv[1], "attention");
    /* `fathom-kernel-bench matmul`: the matmul cases alone (FATHOM_MATMUL_RANK picks among
     * cuBLASLt's candidates) */
    bool matmul_only = argc > 1 && !strcmp(argv[1], "matmul");
    /* `fathom-kernel-bench optimizer`: AdamW and the clipping norm alone */
    bool optimizer_only = argc > 1 && !strcmp(argv[1], "optimizer");
    /* `fathom-kernel-bench norm`: RMSNorm alone, at the 8B width and the 1B microbatch */
    bool norm_only = argc > 1 && !strcmp(argv[1], "norm");
    /* `fathom-kernel-bench mix`: MSAR's stream mix and its convolution at the 1B and the
     * graft's microbatch */
    bool mix_only = argc > 1 && !strcmp(argv[1], "mix");
    /* `fathom-kernel-bench merge`: MSAR's replace-form merges alone, at the 1B microbatch */
    bool merge_only = argc > 1 && !strcmp(argv[1], "merge");
    /* `fathom-kernel-bench loss`: the cross-entropy passes over a chunk of logits alone */
    bool loss_only = argc > 1 && !strcmp(argv[1], "loss");
    /* `fathom-kernel-bench overlap`: the update beside the next forward */
    bool overlap_only = argc > 1 && !strcmp(argv[1], "overlap");
    const char *variant = attention_only && argc > 2 ? argv[2] : NULL;
    if (variant && !attention_variant_known(variant)) {
        fprintf(stderr, "fathom-kernel-bench: unknown attention variant %s (grouped, specialised, "
                        "single_consumer, persistent, fused, fused_tma, two_pass)\n", variant);
        return 2;
    }
    char description[320];
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        fprintf(stderr, "fathom-kernel-bench: no CUDA device\n");
        return 2;
    }
    cudaDeviceProp properties;
    CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
    snprintf(description, sizeof description, "%s, %d SMs", properties.name,
             properties.multiProcessorCount);
    printf("# fathom-kernel-bench on %s (Llama-3-8B layer shapes, 4096 tokens)\n", description);
    if (attention_only) {
        bench_attention(1, 4096, 32, 8, 128, variant);
        bench_attention(32, 1024, 16, 8, 80, variant);
        bench_attention(8, 1024, 16, 8, 80, variant); /* the 1B step's microbatch */
        bench_attention(2, 4096, 32, 8, 64, variant);
        return 0;
    }
    if (norm_only) {
        bench_rmsnorm(4096, 4096);
        bench_rmsnorm(8192, 1280);
        return 0;
    }
    if (merge_only) {
        bench_merge(8, 1024, 1280);
        return 0;
    }
    if (loss_only) {
        bench_loss(4096, 128256); /* the 8B width's microbatch: one chunk */
        bench_loss(4186, 128256); /* the 1B microbatch's larger chunk */
        return 0;
    }
    if (mix_only) {
        bench_mix(8192, 1280);
        bench_mix(8192, 4096);
        bench_conv(8, 1024, 1280);
        bench_conv(2, 4096, 4096);
        bench_merge(8, 1024, 1280);
        return 0;
    }
    if (optimizer_only) {
        bench_optimizer((size_t)218 << 20);
        return 0;
    }
    cuda_matmul_init();
    if (overlap_only) {
        bench_overlap();
        cuda_matmul_destroy();
        return 0;
    }
    bench_matmul(4096, 4096, 4096);
    bench_matmul(4096, 4096, 14336);
    bench_matmul(4096, 14336, 4096);
    bench_matmul(4096, 4096, 1024);
    bench_matmul(4096, 4096, 128256);
    if (matmul_only) {
        cuda_matmul_destroy();
        return 0;
    }
    bench_attention(1, 4096, 32, 8, 128, NULL);
    bench_attention(32, 1024, 16, 8, 80, NULL);
    bench_rmsnorm(4096, 4096);
    bench_rmsnorm(8192, 4096); /* the graft's microbatch */
    bench_rmsnorm(8192, 1280); /* the 1B step's microbatch */
    bench_swiglu(4096, 14336);
    bench_loss(4096, 128256);
    bench_optimizer((size_t)218 << 20);
    cuda_matmul_destroy();
    return 0;
}
