/* tests/test_cuda_route_conv.c — the CUDA stream route (MSAR's Route over convolved sources,
 * the convolution inside the read) against the cpu reference (DESIGN 2.2; DESIGN 7, "GPU").
 *
 * Every input is drawn fresh and rounded to bf16 first (what the GPU reads); the cpu
 * reference (kernels/cpu/route_conv_cpu.c) runs on the same values. Neither rounds E, so the
 * two differ by the fp32 sums and the bf16 outputs only. Tolerances, ||gpu - cpu|| / ||cpu||:
 * 1e-2 for bf16 outputs (out, dsources), 1e-3 for fp32 ones (weights, rstd, dtaps, dquery,
 * dkey_norm). Outputs and workspaces are poisoned with NaN first (gradients, which are added
 * into, start from zero here and from random values through the op tables). Shapes: T not a
 * multiple of the 8-token tile or of the token ranges, B = 1, 2, 3 (the convolution must stop
 * at each sequence start), T shorter than the kernel, one token; d 24 and 1000 (head widths
 * 3 and 125: 2-byte vectors), 40 (4-byte), 256, 512 (heads of 32: warps span heads), 4096
 * (the 8B width; H 1: a head spans chunks) and 8192; kernel sizes 1, 2, 3, 4, 8; N up to 9
 * with a null (unconvolved) first source. The backward is bitwise deterministic; identity
 * taps give the same bits at every kernel size (MSAR at init). Each GPU test SKIPs where no
 * GPU answers.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/route_cuda.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define FP32_TOLERANCE 1e-3
#define CONV_EPS 1e-5f
#define MAX_SOURCES 9

typedef struct {
    int B, T, d, heads, n_sources, kernel_size, null_first;
} ConvShape;

static const ConvShape conv_shapes[] = {
    {2, 33, 24, 8, 3, 3, 1},   {2, 17, 40, 4, 5, 8, 1},   {1, 100, 256, 2, 2, 1, 0},
    {2, 50, 256, 8, 9, 4, 1},  {2, 37, 4096, 8, 9, 8, 1}, {3, 7, 4096, 1, 4, 2, 0},
    {2, 5, 48, 4, 3, 8, 1},    {1, 1, 64, 2, 2, 8, 1},    {2, 300, 512, 16, 6, 4, 1},
    {2, 129, 1000, 8, 3, 2, 1}, {1, 9, 8192, 8, 2, 2, 1},
};
#define CONV_SHAPE_COUNT ((int)(sizeof conv_shapes / sizeof conv_shapes[0]))

/* ---- inputs ---- */

/* One problem on the host (rounded to bf16) and on the device. Sources of different scales;
 * taps near (1, 0, ..) plus noise; a query of scale 2/sqrt(head_dim) (scores O(1)); key_norm
 * near 1. */
typedef struct {
    ConvShape shape;
    int tokens;
    size_t size, tap_count, n_weights, n_rstd; /* tap_count: kernel_size * d */
    float *sources, *taps, *query, *key_norm, *dout;
    const float *source_rows[MAX_SOURCES], *tap_rows[MAX_SOURCES];
    const bf16 *device_sources[MAX_SOURCES], *device_taps[MAX_SOURCES];
    bf16 *device_query, *device_key_norm, *device_dout;
} ConvInputs;

static ConvInputs conv_inputs(ConvShape shape, uint64_t seed)
{
    ConvInputs in;
    memset(&in, 0, sizeof in);
    in.shape = shape;
    in.tokens = shape.B * shape.T;
    in.size = (size_t)in.tokens * shape.d;
    in.tap_count = (size_t)shape.kernel_size * shape.d;
    in.n_weights = (size_t)shape.n_sources * in.tokens * shape.heads;
    in.n_rstd = (size_t)shape.n_sources * in.tokens;
    in.sources = gpu_test_host_floats((size_t)shape.n_sources * in.size);
    in.taps = gpu_test_rounded_uniform((size_t)shape.n_sources * in.tap_count, 0.4f, 0.0f,
                                       seed + 5);
    for (int n = 0; n < shape.n_sources; n++) {
        float *rows = in.sources + (size_t)n * in.size;
        test_fill_uniform(rows, in.size, 0.5f + 0.4f * (n % 7), seed + 10 + (uint64_t)n);
        gpu_round_to_bf16(rows, in.size);
        in.source_rows[n] = rows;
        in.device_sources[n] = gpu_upload_bf16(rows, in.size);
        float *taps = in.taps + (size_t)n * in.tap_count;
        for (int c = 0; c < shape.d; c++)
            taps[c] = bf16_to_float(bf16_from_float(taps[c] + 0.8f));
        bool null = shape.null_first && n == 0;
        in.tap_rows[n] = null ? NULL : taps;
        in.device_taps[n] = null ? NULL : gpu_upload_bf16(taps, in.tap_count);
    }
    in.query = gpu_test_rounded_uniform(shape.d, 2.0f / sqrtf((float)(shape.d / shape.heads)), 0.0f,
                               seed + 1);
    in.key_norm = gpu_test_rounded_uniform(shape.d, 0.5f, 1.0f, seed + 2);
    in.dout = gpu_test_rounded_uniform(in.size, 1.0f, 0.0f, seed + 3);
    in.device_query = gpu_upload_bf16(in.query, shape.d);
    in.device_key_norm = gpu_upload_bf16(in.key_norm, shape.d);
    in.device_dout = gpu_upload_bf16(in.dout, in.size);
    return in;
}

static void conv_inputs_free(ConvInputs *in)
{
    free(in->sources);
    free(in->taps);
    free(in->query);
    free(in->key_norm);
    free(in->dout);
    gpu_free_all();
}

static void expect_close(const float *got, const float *expected, size_t n, double tolerance,
                         const char *what, ConvShape s)
{
    double error = test_relative_error(got, expected, n);
    cr_assert_leq(error, tolerance,
                  "%s (B %d, T %d, d %d, H %d, N %d, kernel %d): relative error %.3g", what, s.B,
                  s.T, s.d, s.heads, s.n_sources, s.kernel_size, error);
}

/* the cpu forward's outputs (the backward's saved statistics) */
typedef struct {
    float *out, *weights, *rstd;
} ForwardResult;

static ForwardResult cpu_forward(const ConvInputs *in)
{
    const ConvShape s = in->shape;
    ForwardResult r = {gpu_test_host_floats(in->size), gpu_test_host_floats(in->n_weights),
                       gpu_test_host_floats(in->n_rstd)};
    cpu_route_conv_forward(r.out, r.weights, r.rstd, in->source_rows, in->tap_rows, s.n_sources,
                           s.kernel_size, in->query, in->key_norm, s.B, s.T, s.d, s.heads,
                           CONV_EPS);
    return r;
}

static void forward_result_free(ForwardResult *r)
{
    free(r->out);
    free(r->weights);
    free(r->rstd);
}

/* the cuda forward into poisoned outputs (and a poisoned workspace), downloaded */
static ForwardResult gpu_forward(const ConvInputs *in)
{
    const ConvShape s = in->shape;
    bf16 *out = gpu_poisoned_bf16(in->size);
    float *weights = gpu_poisoned_floats(in->n_weights), *rstd = gpu_poisoned_floats(in->n_rstd);
    float *workspace = gpu_poisoned_floats(
        cuda_route_conv_forward_workspace_floats(s.n_sources, in->tokens, s.d, s.heads));
    cuda_route_conv_forward(out, weights, rstd, in->device_sources, in->device_taps, s.n_sources,
                            s.kernel_size, in->device_query, in->device_key_norm, s.B, s.T, s.d,
                            s.heads, CONV_EPS, workspace, 0);
    ForwardResult r = {gpu_download_bf16(out, in->size),
                       gpu_download_floats(weights, in->n_weights),
                       gpu_download_floats(rstd, in->n_rstd)};
    return r;
}

/* gradients of one backward from zero; dtaps of a null source stay 0 */
typedef struct {
    float *dsources, *dtaps, *dquery, *dkey_norm;
} Gradients;

static Gradients cpu_backward(const ConvInputs *in, const ForwardResult *saved)
{
    const ConvShape s = in->shape;
    Gradients g = {gpu_test_host_floats((size_t)s.n_sources * in->size),
                   gpu_test_host_floats((size_t)s.n_sources * in->tap_count),
                   gpu_test_host_floats(s.d), gpu_test_host_floats(s.d)};
    float *dsources[MAX_SOURCES], *dtaps[MAX_SOURCES],
        *scratch = gpu_test_host_floats(in->n_weights);
    for (int n = 0; n < s.n_sources; n++) {
        dsources[n] = g.dsources + (size_t)n * in->size;
        dtaps[n] = in->tap_rows[n] ? g.dtaps + (size_t)n * in->tap_count : NULL;
    }
    cpu_route_conv_backward(dsources, dtaps, g.dquery, g.dkey_norm, in->dout, in->source_rows,
                            in->tap_rows, s.n_sources, s.kernel_size, saved->weights,
                            saved->rstd, in->query, in->key_norm, scratch, s.B, s.T, s.d,
                            s.heads);
    free(scratch);
    return g;
}

static Gradients gpu_backward(const ConvInputs *in, const ForwardResult *saved)
{
    const ConvShape s = in->shape;
    const size_t n_dsources = (size_t)s.n_sources * in->size;
    const size_t n_dtaps = (size_t)s.n_sources * in->tap_count;
    float *zeros = gpu_test_host_floats(n_dsources > n_dtaps ? n_dsources : n_dtaps);
    bf16 *dsources_all = gpu_upload_bf16(zeros, n_dsources);
    float *dtaps_all = gpu_upload_floats(zeros, n_dtaps);
    float *dquery = gpu_upload_floats(zeros, s.d), *dkey_norm = gpu_upload_floats(zeros, s.d);
    bf16 *dsources[MAX_SOURCES];
    float *dtaps[MAX_SOURCES];
    for (int n = 0; n < s.n_sources; n++) {
        dsources[n] = dsources_all + (size_t)n * in->size;
        dtaps[n] = in->tap_rows[n] ? dtaps_all + (size_t)n * in->tap_count : NULL;
    }
    float *workspace = gpu_poisoned_floats(cuda_route_conv_backward_workspace_floats(
        s.n_sources, s.kernel_size, in->tokens, s.d, s.heads));
    cuda_route_conv_backward(dsources, dtaps, dquery, dkey_norm, in->device_dout,
                             in->device_sources, in->device_taps, s.n_sources, s.kernel_size,
                             gpu_upload_floats(saved->weights, in->n_weights),
                             gpu_upload_floats(saved->rstd, in->n_rstd), in->device_query,
                             in->device_key_norm, s.B, s.T, s.d, s.heads, workspace, 0);
    Gradients g = {gpu_download_bf16(dsources_all, n_dsources),
                   gpu_download_floats(dtaps_all, n_dtaps), gpu_download_floats(dquery, s.d),
                   gpu_download_floats(dkey_norm, s.d)};
    free(zeros);
    return g;
}

static void gradients_free(Gradients *g)
{
    free(g->dsources);
    free(g->dtaps);
    free(g->dquery);
    free(g->dkey_norm);
}

/* ---- the kernels against the cpu ---- */

Test(cuda_route_conv, forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < CONV_SHAPE_COUNT; i++) {
        ConvInputs in = conv_inputs(conv_shapes[i], 1000 + 100 * (uint64_t)i);
        ForwardResult want = cpu_forward(&in), got = gpu_forward(&in);
        expect_close(got.out, want.out, in.size, BF16_TOLERANCE, "out", in.shape);
        expect_close(got.weights, want.weights, in.n_weights, FP32_TOLERANCE, "weights",
                     in.shape);
        expect_close(got.rstd, want.rstd, in.n_rstd, FP32_TOLERANCE, "rstd", in.shape);
        forward_result_free(&want);
        forward_result_free(&got);
        conv_inputs_free(&in);
    }
}

Test(cuda_route_conv, backward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < CONV_SHAPE_COUNT; i++) {
        ConvInputs in = conv_inputs(conv_shapes[i], 3000 + 100 * (uint64_t)i);
        const ConvShape s = in.shape;
        ForwardResult saved = cpu_forward(&in);
        Gradients want = cpu_backward(&in, &saved), got = gpu_backward(&in, &saved);
        expect_close(got.dsources, want.dsources, (size_t)s.n_sources * in.size, BF16_TOLERANCE,
                     "dsources", s);
        expect_close(got.dtaps, want.dtaps, (size_t)s.n_sources * in.tap_count, FP32_TOLERANCE,
                     "dtaps", s);
        expect_close(got.dquery, want.dquery, s.d, FP32_TOLERANCE, "dquery", s);
        expect_close(got.dkey_norm, want.dkey_norm, s.d, FP32_TOLERANCE, "dkey_norm", s);
        gradients_free(&want);
        gradients_free(&got);
        forward_result_free(&saved);
        conv_inputs_free(&in);
    }
}

/* The backward's recompute of a stream: the mix by the weights the forward saved is the
 * forward's out bit for bit, into a poisoned output, at every shape. */
Test(cuda_route_conv, mix_by_the_saved_weights_is_the_forwards_out_bit_for_bit)
{
    gpu_require();
    for (int i = 0; i < CONV_SHAPE_COUNT; i++) {
        const ConvShape s = conv_shapes[i];
        ConvInputs in = conv_inputs(s, 90 + (uint64_t)i);
        ForwardResult forward = gpu_forward(&in);
        bf16 *out = gpu_poisoned_bf16(in.size);
        cuda_route_conv_mix(out, gpu_upload_floats(forward.weights, in.n_weights),
                            in.device_sources, in.device_taps, s.n_sources, s.kernel_size, s.B,
                            s.T, s.d, s.heads, 0);
        float *mixed = gpu_download_bf16(out, in.size);
        cr_expect_eq(memcmp(mixed, forward.out, in.size * sizeof(float)), 0,
                     "mix differs from the forward's out (B %d, T %d, d %d, H %d, N %d, "
                     "kernel %d)", s.B, s.T, s.d, s.heads, s.n_sources, s.kernel_size);
        free(mixed);
        forward_result_free(&forward);
        conv_inputs_free(&in);
    }
}

Test(cuda_route_conv, forward_and_backward_are_bitwise_deterministic)
{
    gpu_require();
    const ConvShape s = {2, 1000, 4096, 8, 5, 8, 1};
    ConvInputs in = conv_inputs(s, 77);
    ForwardResult saved = cpu_forward(&in);
    ForwardResult first = gpu_forward(&in), second = gpu_forward(&in);
    Gradients g1 = gpu_backward(&in, &saved), g2 = gpu_backward(&in, &saved);
    cr_expect_eq(memcmp(first.out, second.out, in.size * sizeof(float)), 0, "out differs");
    cr_expect_eq(memcmp(first.weights, second.weights, in.n_weights * sizeof(float)), 0,
                 "weights differ");
    cr_expect_eq(memcmp(g1.dsources, g2.dsources, s.n_sources * in.size * sizeof(float)), 0,
                 "dsources differ");
    cr_expect_eq(memcmp(g1.dtaps, g2.dtaps, s.n_sources * in.tap_count * sizeof(float)), 0,
                 "dtaps differ");
    cr_expect_eq(memcmp(g1.dquery, g2.dquery, s.d * sizeof(float)), 0, "dquery differs");
    cr_expect_eq(memcmp(g1.dkey_norm, g2.dkey_norm, s.d * sizeof(float)), 0,
                 "dkey_norm differs");
    forward_result_free(&saved);
    forward_result_free(&first);
    forward_result_free(&second);
    gradients_free(&g1);
    gradients_free(&g2);
    conv_inputs_free(&in);
}

/* MSAR at init: every stream's taps are (1, 0, ..), so every stream must route to the same
 * bits whatever its kernel size (then the mix of the m streams returns the stream); and that
 * is the Route of the raw sources, up to summation order. */
Test(cuda_route_conv, identity_taps_give_the_same_bits_at_every_kernel_size)
{
    gpu_require();
    static const int kernel_sizes[] = {1, 2, 4, 8};
    ForwardResult reference = {NULL, NULL, NULL};
    for (int k = 0; k < 4; k++) {
        const ConvShape s = {2, 45, 256, 8, 4, kernel_sizes[k], 1};
        ConvInputs in = conv_inputs(s, 90); /* the same sources for every kernel size */
        for (int n = 1; n < s.n_sources; n++) {
            float *taps = in.taps + (size_t)n * in.tap_count;
            for (size_t i = 0; i < in.tap_count; i++)
                taps[i] = i < (size_t)s.d ? 1.0f : 0.0f;
            in.device_taps[n] = gpu_upload_bf16(taps, in.tap_count);
        }
        ForwardResult got = gpu_forward(&in);
        if (k == 0) {
            bf16 *out = gpu_poisoned_bf16(in.size);
            float *weights = gpu_poisoned_floats(in.n_weights);
            float *rstd = gpu_poisoned_floats(in.n_rstd);
            cuda_route_forward(out, weights, rstd, in.device_sources, s.n_sources,
                               in.device_query, in.device_key_norm, NULL, NULL, in.tokens, s.d,
                               s.heads, CONV_EPS, 0);
            float *plain_out = gpu_download_bf16(out, in.size);
            float *plain_weights = gpu_download_floats(weights, in.n_weights);
            expect_close(got.out, plain_out, in.size, BF16_TOLERANCE, "out against the Route",
                         s);
            expect_close(got.weights, plain_weights, in.n_weights, FP32_TOLERANCE,
                         "weights against the Route", s);
            free(plain_out);
            free(plain_weights);
            reference = got;
        } else {
            cr_expect_eq(memcmp(got.out, reference.out, in.size * sizeof(float)), 0,
                         "kernel size %d: out differs from kernel size 1", s.kernel_size);
            cr_expect_eq(memcmp(got.weights, reference.weights, in.n_weights * sizeof(float)),
                         0, "kernel size %d: weights differ", s.kernel_size);
            cr_expect_eq(memcmp(got.rstd, reference.rstd, in.n_rstd * sizeof(float)), 0,
                         "kernel size %d: rstd differs", s.kernel_size);
            forward_result_free(&got);
        }
        conv_inputs_free(&in);
    }
    forward_result_free(&reference);
}

/* A host-side check that needs no GPU: it fails before any device call. */
static void call_with_kernel_size_nine(void *unused)
{
    (void)unused;
    const bf16 *sources[1] = {NULL}, *taps[1] = {NULL};
    cuda_route_conv_forward(NULL, NULL, NULL, sources, taps, 1, CUDA_ROUTE_CONV_MAX_KERNEL + 1,
                            NULL, NULL, 1, 4, 8, 1, CONV_EPS, NULL, 0);
}

Test(cuda_route_conv, a_kernel_size_past_the_limit_is_a_config_error_naming_the_key)
{
    char errors[2048];
    int code = test_run_in_child(call_with_kernel_size_nine, NULL, errors, sizeof errors);
    cr_expect_eq(code, 2, "exit code %d (stderr: %s)", code, errors);
    cr_expect(strstr(errors, "residual.stream_kernels") != NULL, "stderr: %s", errors);
}

/* ---- through the op tables: shape B, T, d, heads, N, kernel_size; parameter[0]: null ---- */

static const int table_shapes[][7] = {
    {2, 9, 48, 4, 3, 3, 1}, {2, 33, 4096, 8, 5, 8, 1}, {1, 17, 40, 4, 2, 2, 0},
};

enum { FORWARD_OUT, FORWARD_WEIGHTS, FORWARD_RSTD, FORWARD_SOURCES, FORWARD_TAPS,
       FORWARD_QUERY, FORWARD_KEY_NORM };
enum { BACKWARD_DSOURCES, BACKWARD_DTAPS, BACKWARD_DQUERY, BACKWARD_DKEY_NORM, BACKWARD_DOUT,
       BACKWARD_SOURCES, BACKWARD_TAPS, BACKWARD_WEIGHTS, BACKWARD_RSTD, BACKWARD_QUERY,
       BACKWARD_KEY_NORM, BACKWARD_SCRATCH };

/* the op's pointer arrays into one allocation each; a null first source has NULL taps */
static void table_pointers(const Backend *b, const OpCase *c, void *sources, void *taps,
                           const Activation **source_rows, const Activation **tap_rows)
{
    const int N = c->shape[4];
    const size_t size = (size_t)c->shape[0] * c->shape[1] * c->shape[2];
    const size_t tap_count = (size_t)c->shape[5] * c->shape[2];
    for (int n = 0; n < N; n++) {
        source_rows[n] = activation_at_const(b, sources, (size_t)n * size);
        tap_rows[n] = c->parameter[0] != 0 && n == 0
                          ? NULL
                          : activation_at_const(b, taps, (size_t)n * tap_count);
    }
}

static void run_table_forward(const Backend *b, void *const *p, const OpCase *c)
{
    const Activation *sources[MAX_SOURCES], *taps[MAX_SOURCES];
    table_pointers(b, c, p[FORWARD_SOURCES], p[FORWARD_TAPS], sources, taps);
    b->route_conv_forward(p[FORWARD_OUT], p[FORWARD_WEIGHTS], p[FORWARD_RSTD], sources, taps,
                          c->shape[4], c->shape[5], p[FORWARD_QUERY], p[FORWARD_KEY_NORM],
                          c->shape[0], c->shape[1], c->shape[2], c->shape[3], CONV_EPS);
}

static void run_table_backward(const Backend *b, void *const *p, const OpCase *c)
{
    const int N = c->shape[4];
    const size_t size = (size_t)c->shape[0] * c->shape[1] * c->shape[2];
    const size_t tap_count = (size_t)c->shape[5] * c->shape[2];
    const Activation *sources[MAX_SOURCES], *taps[MAX_SOURCES];
    Activation *dsources[MAX_SOURCES];
    float *dtaps[MAX_SOURCES];
    table_pointers(b, c, p[BACKWARD_SOURCES], p[BACKWARD_TAPS], sources, taps);
    for (int n = 0; n < N; n++) {
        dsources[n] = activation_at(b, p[BACKWARD_DSOURCES], (size_t)n * size);
        dtaps[n] = taps[n] ? (float *)p[BACKWARD_DTAPS] + (size_t)n * tap_count : NULL;
    }
    b->route_conv_backward(dsources, dtaps, p[BACKWARD_DQUERY], p[BACKWARD_DKEY_NORM],
                           p[BACKWARD_DOUT], sources, taps, N, c->shape[5], p[BACKWARD_WEIGHTS],
                           p[BACKWARD_RSTD], p[BACKWARD_QUERY], p[BACKWARD_KEY_NORM],
                           p[BACKWARD_SCRATCH], c->shape[0], c->shape[1], c->shape[2],
                           c->shape[3]);
}

/* the backward's weights and rstd: the cpu forward's */
static void prepare_table_backward(OpCase *c)
{
    const Activation *sources[MAX_SOURCES], *taps[MAX_SOURCES];
    const size_t size = (size_t)c->shape[0] * c->shape[1] * c->shape[2];
    table_pointers(backend_cpu(), c, op_host(c, BACKWARD_SOURCES), op_host(c, BACKWARD_TAPS),
                   sources, taps);
    float *out = gpu_test_host_floats(size);
    backend_cpu()->route_conv_forward((Activation *)out, op_host(c, BACKWARD_WEIGHTS),
                                      op_host(c, BACKWARD_RSTD), sources, taps, c->shape[4],
                                      c->shape[5], (Activation *)op_host(c, BACKWARD_QUERY),
                                      (Activation *)op_host(c, BACKWARD_KEY_NORM), c->shape[0],
                                      c->shape[1], c->shape[2], c->shape[3], CONV_EPS);
    free(out);
}

static void check_table(bool backward, int i)
{
    const int *s = table_shapes[i];
    const size_t size = (size_t)s[0] * s[1] * s[2], N = (size_t)s[4];
    const size_t rows = N * s[0] * s[1], taps = N * s[5] * s[2];
    OpCase c = op_case(backward ? "route_conv_backward" : "route_conv_forward",
                       backward ? run_table_backward : run_table_forward);
    for (int k = 0; k < 6; k++)
        c.shape[k] = s[k];
    c.parameter[0] = (float)s[6];
    if (backward) {
        c.prepare = prepare_table_backward;
        op_accumulated(&c, "dsources", ARRAY_ACTIVATION, N * size, BACKEND_BF16_TOLERANCE);
        op_accumulated(&c, "dtaps", ARRAY_FLOAT, taps, BACKEND_STATISTIC_TOLERANCE);
        op_accumulated(&c, "dquery", ARRAY_FLOAT, (size_t)s[2], BACKEND_STATISTIC_TOLERANCE);
        op_accumulated(&c, "dkey_norm", ARRAY_FLOAT, (size_t)s[2], BACKEND_STATISTIC_TOLERANCE);
        op_input(&c, "dout", ARRAY_ACTIVATION, size, 1, 0);
    } else {
        op_output(&c, "out", ARRAY_ACTIVATION, size, BACKEND_BF16_TOLERANCE);
        op_output(&c, "weights", ARRAY_FLOAT, rows * s[3], BACKEND_STATISTIC_TOLERANCE);
        op_output(&c, "rstd", ARRAY_FLOAT, rows, BACKEND_STATISTIC_TOLERANCE);
    }
    op_input(&c, "sources", ARRAY_ACTIVATION, N * size, 1, 0);
    op_input(&c, "taps", ARRAY_ACTIVATION, taps, 0.5f, 0.3f);
    if (backward) {
        op_input(&c, "weights", ARRAY_FLOAT, rows * s[3], 0, 0);
        op_input(&c, "rstd", ARRAY_FLOAT, rows, 0, 0);
    }
    op_input(&c, "query", ARRAY_ACTIVATION, (size_t)s[2], 2.0f / sqrtf((float)(s[2] / s[3])), 0);
    op_input(&c, "key_norm", ARRAY_ACTIVATION, (size_t)s[2], 0.5f, 1);
    if (backward)
        op_cpu_scratch(&c, "scratch", rows * s[3]);
    op_check(&c, (backward ? 610 : 600) + (uint64_t)i);
}

Test(cuda_route_conv, table_entries_are_filled)
{
    gpu_require();
    cr_expect_not_null(backend_cuda()->route_conv_forward);
    cr_expect_not_null(backend_cuda()->route_conv_mix);
    cr_expect_not_null(backend_cuda()->route_conv_backward);
}

Test(cuda_route_conv, table_forward_matches_the_cpu_table)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_table(false, i);
}

/* the backward adds into random starts: a missing or overwriting "+=" misses the cpu's */
Test(cuda_route_conv, table_backward_adds_the_cpu_tables_gradients)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_table(true, i);
}
