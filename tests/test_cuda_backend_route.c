/* tests/test_cuda_backend_route.c — the attention-over-depth and MSAR entries of the cuda op
 * table (route, stream conv, stream mix; DESIGN 2.1, 2.2) against the cpu table's, on small
 * random shapes with head widths and model widths that are not multiples of 8 or 16.
 *
 * As in test_cuda_backend_ops.c the point is the wiring: the pointer arrays of sources and
 * streams, the replace and delta forms, the fp32 mix bias, the "+=" of every backward, and
 * the route backward's `scratch`, which the cuda table must ignore (it is given NULL), and the
 * gate alpha, which both tables read from backend memory.
 * Rules and tolerances: cuda_backend_support.h. Each test SKIPs where no GPU answers.
 */
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE
#define STATISTIC BACKEND_STATISTIC_TOLERANCE
#define EPS 1e-5f
#define ALPHA 1.5f

enum { MAX_SOURCES = 8 };

static float *scratch_floats(size_t n)
{
    float *x = calloc(n, sizeof(float));
    cr_assert_not_null(x);
    return x;
}

/* ---- Route: shape N, tokens, d, heads, delta ---- */

static const int route_shapes[][4] = {{3, 9, 48, 4}, {2, 5, 24, 1}, {5, 17, 256, 8}};

enum { FORWARD_OUT, FORWARD_WEIGHTS, FORWARD_RSTD, FORWARD_SOURCES, FORWARD_QUERY,
       FORWARD_KEY_NORM, FORWARD_BASE, FORWARD_ALPHA };

static void run_route_forward(const Backend *b, void *const *p, const OpCase *c)
{
    const int N = c->shape[0], tokens = c->shape[1], d = c->shape[2];
    const Activation *sources[MAX_SOURCES];
    split_rows_const(b, p[FORWARD_SOURCES], N, (size_t)tokens * d, sources);
    const Activation *base = c->shape[4] ? p[FORWARD_BASE] : NULL;
    b->route_forward(p[FORWARD_OUT], p[FORWARD_WEIGHTS], p[FORWARD_RSTD], sources, N,
                     p[FORWARD_QUERY], p[FORWARD_KEY_NORM], base,
                     c->shape[4] ? p[FORWARD_ALPHA] : NULL, tokens, d, c->shape[3], EPS);
}

enum { BACKWARD_DSOURCES, BACKWARD_DQUERY, BACKWARD_DKEY_NORM, BACKWARD_DALPHA, BACKWARD_DOUT,
       BACKWARD_SOURCES, BACKWARD_WEIGHTS, BACKWARD_RSTD, BACKWARD_QUERY, BACKWARD_KEY_NORM,
       BACKWARD_SCRATCH, BACKWARD_ALPHA };

static void run_route_backward(const Backend *b, void *const *p, const OpCase *c)
{
    const int N = c->shape[0], tokens = c->shape[1], d = c->shape[2];
    Activation *dsources[MAX_SOURCES];
    const Activation *sources[MAX_SOURCES];
    split_rows(b, p[BACKWARD_DSOURCES], N, (size_t)tokens * d, dsources);
    split_rows_const(b, p[BACKWARD_SOURCES], N, (size_t)tokens * d, sources);
    b->route_backward(dsources, p[BACKWARD_DQUERY], p[BACKWARD_DKEY_NORM], p[BACKWARD_DALPHA],
                      p[BACKWARD_DOUT], sources, N, p[BACKWARD_WEIGHTS], p[BACKWARD_RSTD],
                      p[BACKWARD_QUERY], p[BACKWARD_KEY_NORM],
                      c->shape[4] ? p[BACKWARD_ALPHA] : NULL, p[BACKWARD_SCRATCH], tokens, d,
                      c->shape[3]);
}

/* weights and rstd of the cpu forward (they do not depend on base or alpha) */
static void prepare_route_backward(OpCase *c)
{
    const int N = c->shape[0], tokens = c->shape[1], d = c->shape[2];
    const float *rows = op_host(c, BACKWARD_SOURCES);
    const Activation *sources[MAX_SOURCES];
    for (int n = 0; n < N; n++)
        sources[n] = (const Activation *)(rows + (size_t)n * tokens * d);
    float *out = scratch_floats((size_t)tokens * d);
    backend_cpu()->route_forward((Activation *)out, op_host(c, BACKWARD_WEIGHTS),
                                 op_host(c, BACKWARD_RSTD), sources, N,
                                 (Activation *)op_host(c, BACKWARD_QUERY),
                                 (Activation *)op_host(c, BACKWARD_KEY_NORM), NULL, NULL, tokens,
                                 d, c->shape[3], EPS);
    free(out);
}

/* a query of scale 2/sqrt(head_dim): scores O(1), a softmax neither flat nor one-hot */
static float query_scale(int d, int heads)
{
    return 2.0f / sqrtf((float)(d / heads));
}

static void check_route(bool backward, bool delta, int i)
{
    const int N = route_shapes[i][0], tokens = route_shapes[i][1], d = route_shapes[i][2];
    const int heads = route_shapes[i][3];
    const size_t size = (size_t)tokens * d, n_weights = (size_t)N * tokens * heads;
    OpCase c = op_case(backward ? "route_backward" : "route_forward",
                       backward ? run_route_backward : run_route_forward);
    c.shape[0] = N, c.shape[1] = tokens, c.shape[2] = d, c.shape[3] = heads, c.shape[4] = delta;
    if (backward) {
        c.prepare = prepare_route_backward;
        op_accumulated(&c, "dsources", ARRAY_ACTIVATION, N * size, BF16_OUT);
        op_accumulated(&c, "dquery", ARRAY_FLOAT, (size_t)d, STATISTIC);
        op_accumulated(&c, "dkey_norm", ARRAY_FLOAT, (size_t)d, STATISTIC);
        op_accumulated(&c, "dalpha", ARRAY_FLOAT, 1, STATISTIC);
        op_input(&c, "dout", ARRAY_ACTIVATION, size, 1, 0);
        op_input(&c, "sources", ARRAY_ACTIVATION, N * size, 1, 0);
        op_input(&c, "weights", ARRAY_FLOAT, n_weights, 0, 0);
        op_input(&c, "rstd", ARRAY_FLOAT, (size_t)N * tokens, 0, 0);
    } else {
        op_output(&c, "out", ARRAY_ACTIVATION, size, BF16_OUT);
        op_output(&c, "weights", ARRAY_FLOAT, n_weights, STATISTIC);
        op_output(&c, "rstd", ARRAY_FLOAT, (size_t)N * tokens, STATISTIC);
        op_input(&c, "sources", ARRAY_ACTIVATION, N * size, 1, 0);
    }
    op_input(&c, "query", ARRAY_ACTIVATION, (size_t)d, query_scale(d, heads), 0);
    op_input(&c, "key_norm", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
    if (backward)
        op_cpu_scratch(&c, "scratch", n_weights);
    else
        op_input(&c, "base", ARRAY_ACTIVATION, size, 0.3f, 0); /* read in the delta form only */
    op_input(&c, "alpha", ARRAY_FLOAT, 1, 0.0f, ALPHA); /* the gate, in backend memory */
    op_check(&c, (backward ? 300 : 200) + (delta ? 50 : 0) + (uint64_t)i);
}

Test(cuda_backend_route, route_forward_matches_cpu_in_the_replace_form)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_route(false, false, i);
}

Test(cuda_backend_route, route_forward_matches_cpu_in_the_delta_form)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_route(false, true, i);
}

/* dalpha is given in both forms: the replace form must leave it as it was */
Test(cuda_backend_route, route_backward_adds_the_cpu_gradients_in_the_replace_form)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_route(true, false, i);
}

Test(cuda_backend_route, route_backward_adds_the_cpu_gradients_in_the_delta_form)
{
    gpu_require();
    for (int i = 0; i < 3; i++)
        check_route(true, true, i);
}

/* ---- MSAR stream convolution: shape B, T, d, rows, streams, and the streams' kernel
 * sizes; each (stream, row)'s arrays one after the other in one allocation, stream-major
 * ---- */

static const int conv_shapes[][8] = {{2, 11, 20, 3, 1, 3}, {1, 33, 64, 2, 3, 8, 1, 4}};

static size_t conv_stream_taps(const int *shape)
{
    size_t taps = 0;
    for (int r = 0; r < shape[4]; r++)
        taps += (size_t)shape[5 + r];
    return taps;
}

/* stream r's taps of row n at [r * count + n]: rows of k_r * d each, stream-major */
static void split_stream_taps(const Backend *b, void *array, const int *shape, bool is_float,
                              void **rows)
{
    const int d = shape[2], count = shape[3], streams = shape[4];
    size_t offset = 0;
    for (int r = 0; r < streams; r++) {
        const size_t size = (size_t)shape[5 + r] * d;
        for (int n = 0; n < count; n++, offset += size)
            rows[r * count + n] = is_float ? (void *)((float *)array + offset)
                                           : (void *)activation_at_const(b, array, offset);
    }
}

static void run_stream_conv_forward(const Backend *b, void *const *p, const OpCase *c)
{
    const int B = c->shape[0], T = c->shape[1], d = c->shape[2], count = c->shape[3];
    const int streams = c->shape[4], *kernel_sizes = &c->shape[5];
    Activation *out[3 * MAX_SOURCES];
    const Activation *x[MAX_SOURCES], *taps[3 * MAX_SOURCES];
    split_rows(b, p[0], streams * count, (size_t)B * T * d, out);
    split_rows_const(b, p[1], count, (size_t)B * T * d, x);
    split_stream_taps(b, p[2], c->shape, false, (void **)taps);
    b->stream_conv_forward(out, x, taps, count, streams, kernel_sizes, B, T, d);
}

static void run_stream_conv_backward(const Backend *b, void *const *p, const OpCase *c)
{
    const int B = c->shape[0], T = c->shape[1], d = c->shape[2], count = c->shape[3];
    const int streams = c->shape[4], *kernel_sizes = &c->shape[5];
    Activation *dx[MAX_SOURCES];
    float *dtaps[3 * MAX_SOURCES];
    const Activation *dout[3 * MAX_SOURCES], *x[MAX_SOURCES], *taps[3 * MAX_SOURCES];
    split_rows(b, p[0], count, (size_t)B * T * d, dx);
    split_rows_const(b, p[2], streams * count, (size_t)B * T * d, dout);
    split_rows_const(b, p[3], count, (size_t)B * T * d, x);
    split_stream_taps(b, p[1], c->shape, true, (void **)dtaps);
    split_stream_taps(b, p[4], c->shape, false, (void **)taps);
    b->stream_conv_backward(dx, dtaps, dout, x, taps, count, streams, kernel_sizes, B, T, d);
}

static void check_stream_conv(bool backward, int i)
{
    const int *s = conv_shapes[i];
    const size_t rows = (size_t)s[3], row = (size_t)s[0] * s[1] * s[2];
    const size_t taps = rows * conv_stream_taps(s) * s[2];
    OpCase c = op_case(backward ? "stream_conv_backward" : "stream_conv_forward",
                       backward ? run_stream_conv_backward : run_stream_conv_forward);
    for (int k = 0; k < 8; k++)
        c.shape[k] = s[k];
    if (backward) {
        op_accumulated(&c, "dx", ARRAY_ACTIVATION, rows * row, BF16_OUT);
        op_accumulated(&c, "dtaps", ARRAY_FLOAT, taps, STATISTIC);
        op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)s[4] * rows * row, 1, 0);
    } else {
        op_output(&c, "out", ARRAY_ACTIVATION, (size_t)s[4] * rows * row, BF16_OUT);
    }
    op_input(&c, "x", ARRAY_ACTIVATION, rows * row, 1, 0);
    op_input(&c, "taps", ARRAY_ACTIVATION, taps, 0.5f, 0);
    op_check(&c, (backward ? 410 : 400) + (uint64_t)i);
}

Test(cuda_backend_route, stream_conv_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++)
        check_stream_conv(false, i);
}

Test(cuda_backend_route, stream_conv_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (int i = 0; i < 2; i++)
        check_stream_conv(true, i);
}

/* ---- MSAR mix: shape m, tokens, d. mix_bias near -ln(m-1) and a small mix_proj keep the
 * gates away from 0 and 1 ---- */

static const int mix_shapes[][3] = {{3, 9, 40}, {2, 33, 24}};

static void run_stream_mix_forward(const Backend *b, void *const *p, const OpCase *c)
{
    const int m = c->shape[0], tokens = c->shape[1], d = c->shape[2];
    const Activation *streams[MAX_SOURCES];
    split_rows_const(b, p[3], m, (size_t)tokens * d, streams);
    b->stream_mix_forward(p[0], p[1], p[2], streams, m, p[4], p[5], tokens, d, EPS);
}

enum { MIX_DSTREAMS, MIX_DBIAS, MIX_DPROJ, MIX_DOUT, MIX_STREAMS, MIX_GATES, MIX_RSTD,
       MIX_BIAS, MIX_PROJ, MIX_DALPHA, MIX_ALPHA };

static void run_stream_mix_backward(const Backend *b, void *const *p, const OpCase *c)
{
    const int m = c->shape[0], tokens = c->shape[1], d = c->shape[2];
    Activation *dstreams[MAX_SOURCES];
    const Activation *streams[MAX_SOURCES];
    split_rows(b, p[MIX_DSTREAMS], m, (size_t)tokens * d, dstreams);
    split_rows_const(b, p[MIX_STREAMS], m, (size_t)tokens * d, streams);
    b->stream_mix_backward(dstreams, GRAD_ADD, p[MIX_DBIAS], p[MIX_DPROJ], p[MIX_DALPHA],
                           p[MIX_DOUT], streams, m, p[MIX_GATES], p[MIX_RSTD], p[MIX_BIAS],
                           p[MIX_PROJ], p[MIX_ALPHA], tokens, d);
}

static void prepare_stream_mix_backward(OpCase *c)
{
    const int m = c->shape[0], tokens = c->shape[1], d = c->shape[2];
    const float *rows = op_host(c, MIX_STREAMS);
    const Activation *streams[MAX_SOURCES];
    for (int r = 0; r < m; r++)
        streams[r] = (const Activation *)(rows + (size_t)r * tokens * d);
    float *out = scratch_floats((size_t)tokens * d);
    backend_cpu()->stream_mix_forward((Activation *)out, op_host(c, MIX_GATES),
                                      op_host(c, MIX_RSTD), streams, m, op_host(c, MIX_BIAS),
                                      (Activation *)op_host(c, MIX_PROJ), tokens, d, EPS);
    free(out);
}

static void check_stream_mix(bool backward, int i)
{
    const int m = mix_shapes[i][0], tokens = mix_shapes[i][1], d = mix_shapes[i][2];
    const size_t size = (size_t)tokens * d, n_gates = (size_t)tokens * m;
    const float bias = -logf((float)(m - 1)); /* the init value: gates 1/m */
    OpCase c = op_case(backward ? "stream_mix_backward" : "stream_mix_forward",
                       backward ? run_stream_mix_backward : run_stream_mix_forward);
    c.shape[0] = m, c.shape[1] = tokens, c.shape[2] = d;
    if (backward) {
        c.prepare = prepare_stream_mix_backward;
        op_accumulated(&c, "dstreams", ARRAY_ACTIVATION, m * size, BF16_OUT);
        op_accumulated(&c, "dmix_bias", ARRAY_FLOAT, (size_t)m, STATISTIC);
        op_accumulated(&c, "dmix_proj", ARRAY_FLOAT, (size_t)m * d, STATISTIC);
        op_input(&c, "dout", ARRAY_ACTIVATION, size, 1, 0);
        op_input(&c, "streams", ARRAY_ACTIVATION, m * size, 1, 0);
        op_input(&c, "gates", ARRAY_FLOAT, n_gates, 0, 0);
        op_input(&c, "rstd", ARRAY_FLOAT, n_gates, 0, 0);
    } else {
        op_output(&c, "out", ARRAY_ACTIVATION, size, BF16_OUT);
        op_output(&c, "gates", ARRAY_FLOAT, n_gates, STATISTIC);
        op_output(&c, "rstd", ARRAY_FLOAT, n_gates, STATISTIC);
        op_input(&c, "streams", ARRAY_ACTIVATION, m * size, 1, 0);
    }
    op_input(&c, "mix_bias", ARRAY_FLOAT, (size_t)m, 0.3f, bias);
    op_input(&c, "mix_proj", ARRAY_ACTIVATION, (size_t)m * d, 0.1f, 0);
    if (backward) { /* the delta form's gate folded in */
        op_accumulated(&c, "dalpha", ARRAY_FLOAT, 1, STATISTIC);
        op_input(&c, "alpha", ARRAY_FLOAT, 1, 0, 0.625f);
    }
    op_check(&c, (backward ? 510 : 500) + (uint64_t)i);
}

Test(cuda_backend_route, stream_mix_forward_matches_cpu)
{
    gpu_require();
    for (int i = 0; i < 2; i++)
        check_stream_mix(false, i);
}

Test(cuda_backend_route, stream_mix_backward_adds_the_cpu_gradients)
{
    gpu_require();
    for (int i = 0; i < 2; i++)
        check_stream_mix(true, i);
}
