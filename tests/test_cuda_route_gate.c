/* tests/test_cuda_route_gate.c — the delta form's gate x = p + alpha * Route on the cuda op
 * table (DESIGN 2.1, the delta form; docs/design-notes.md, "Two-phase routing"): add_scaled,
 * its backward (alpha d x, and <d x, Route> added into d alpha), and its form inside the
 * sublayer's norm, add_scaled_rmsnorm_forward, which must give the bits of the two ops it
 * replaces, and with its adds first (GateAdd) the bits of add_both or add_inplace before.
 *
 * Rules of tests/cuda_backend_support.h: fresh random inputs rounded to bf16, outputs
 * poisoned with NaN on both backends, "+=" outputs from random starts, relative errors within
 * bf16 tolerance (1e-2) for activations and 1e-3 for fp32 statistics, and the cuda call run
 * twice from the same start must give the same bits. Each test SKIPs where no GPU answers.
 */
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/route_block_cuda.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE
#define STATISTIC BACKEND_STATISTIC_TOLERANCE
#define EPS 1e-5f
#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

/* ---- add_scaled: shape n, -, -, -, -, alpha x 4 ---- */

static void run_add_scaled(const Backend *b, void *const *p, const OpCase *c)
{
    b->add_scaled(p[0], p[1], p[2], p[3], (size_t)c->shape[0]);
}

static void check_add_scaled(int n, float alpha, double tolerance, uint64_t seed)
{
    OpCase c = op_case("add_scaled", run_add_scaled);
    c.shape[0] = n;
    op_output(&c, "out", ARRAY_ACTIVATION, (size_t)n, tolerance);
    op_input(&c, "base", ARRAY_ACTIVATION, (size_t)n, 1, 0);
    op_input(&c, "x", ARRAY_ACTIVATION, (size_t)n, 2, 0);
    op_input(&c, "alpha", ARRAY_FLOAT, 1, 0, alpha);
    op_check(&c, seed);
}

Test(cuda_route_gate, add_scaled_is_base_plus_alpha_x_and_alpha_zero_returns_base_bit_for_bit)
{
    gpu_require();
    check_add_scaled(4096 * 3 + 5, 0.75f, BF16_OUT, 1200);
    check_add_scaled(77, -1.5f, BF16_OUT, 1201);
    check_add_scaled(4096 * 3 + 5, 0.0f, 0.0, 1202); /* exactly the cpu's base */
}

/* ---- add_scaled_rmsnorm_forward: shape rows, d, -, -, -, alpha x 4; x, out, rstd, base,
 * route, alpha, weight ---- */

static void run_add_scaled_rmsnorm(const Backend *b, void *const *p, const OpCase *c)
{
    b->add_scaled_rmsnorm_forward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], c->shape[0],
                                  c->shape[1], EPS, NULL);
}

/* With the adds first: array 3 is the stream, the gate's base, added to (arrays 7-9: the
 * added output, the partial before, the partial; shape[2] 0: no partial) */
static void run_add_scaled_rmsnorm_after_adds(const Backend *b, void *const *p,
                                              const OpCase *c)
{
    const GateAdd add = {p[7], p[3], c->shape[2] ? p[8] : NULL, c->shape[2] ? p[9] : NULL};
    b->add_scaled_rmsnorm_forward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], c->shape[0],
                                  c->shape[1], EPS, &add);
}

static void check_add_scaled_rmsnorm(int rows, int d, float alpha, uint64_t seed)
{
    OpCase c = op_case("add_scaled_rmsnorm_forward", run_add_scaled_rmsnorm);
    c.shape[0] = rows, c.shape[1] = d;
    const size_t n = (size_t)rows * d;
    op_output(&c, "x", ARRAY_ACTIVATION, n, BF16_OUT);
    op_output(&c, "out", ARRAY_ACTIVATION, n, BF16_OUT);
    op_output(&c, "rstd", ARRAY_FLOAT, (size_t)rows, STATISTIC);
    op_input(&c, "base", ARRAY_ACTIVATION, n, 1, 0);
    op_input(&c, "route", ARRAY_ACTIVATION, n, 2, 0);
    op_input(&c, "alpha", ARRAY_FLOAT, 1, 0, alpha);
    op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
    op_check(&c, seed);
}

/* rows of a block of 256 threads (d 4096, two chunks), of a warp over five chunks (d 1280),
 * of a warp (d 24), and a width that is no multiple of 8 (the scalar path) */
static const int gate_norm_shapes[][2] = {{33, 4096}, {17, 1280}, {5, 24}, {9, 100}};

Test(cuda_route_gate, add_scaled_rmsnorm_forward_is_the_gate_then_the_norm)
{
    gpu_require();
    for (int i = 0; i < COUNT(gate_norm_shapes); i++)
        check_add_scaled_rmsnorm(gate_norm_shapes[i][0], gate_norm_shapes[i][1],
                                 i % 2 ? -0.75f : 0.5f, 1250 + (uint64_t)i);
}

/* The adds before the gate (runtime/backend.h GateAdd), with the partial at every other
 * shape, against the cpu's add_both or add_inplace then its gate and norm. rstd within twice
 * the statistics' bound: x is rounded twice before its row sum here (the stream, then the
 * gate), where the cpu rounds neither; at d 24 that took it to 1.04e-3 (H100,
 * 2026-12-06). The bits against the separate cuda ops are the next test's. */
Test(cuda_route_gate, add_scaled_rmsnorm_forward_adds_the_output_before_first)
{
    gpu_require();
    for (int i = 0; i < COUNT(gate_norm_shapes); i++) {
        const int rows = gate_norm_shapes[i][0], d = gate_norm_shapes[i][1];
        const size_t n = (size_t)rows * d;
        OpCase c = op_case("add_scaled_rmsnorm_forward after its adds",
                           run_add_scaled_rmsnorm_after_adds);
        c.shape[0] = rows, c.shape[1] = d, c.shape[2] = i % 2 == 0;
        op_output(&c, "x", ARRAY_ACTIVATION, n, BF16_OUT);
        op_output(&c, "out", ARRAY_ACTIVATION, n, BF16_OUT);
        op_output(&c, "rstd", ARRAY_FLOAT, (size_t)rows, 2 * STATISTIC);
        op_accumulated(&c, "stream", ARRAY_ACTIVATION, n, BF16_OUT);
        op_input(&c, "route", ARRAY_ACTIVATION, n, 2, 0);
        op_input(&c, "alpha", ARRAY_FLOAT, 1, 0, i % 2 ? -0.75f : 0.5f);
        op_input(&c, "weight", ARRAY_ACTIVATION, (size_t)d, 0.5f, 1);
        op_input(&c, "added", ARRAY_ACTIVATION, n, 1, 0);
        if (c.shape[2]) {
            op_input(&c, "partial before", ARRAY_ACTIVATION, n, 1, 0);
            op_output(&c, "partial", ARRAY_ACTIVATION, n, BF16_OUT);
        }
        op_check(&c, 1290 + (uint64_t)i);
    }
}

/* The promise of runtime/backend.h: the bits of add_scaled then rmsnorm_forward on the same
 * backend (here its kernels, on the default stream), for x, the normed row and rstd; and x
 * may be base itself. */
Test(cuda_route_gate, add_scaled_rmsnorm_forward_gives_the_bits_of_the_two_ops)
{
    gpu_require();
    for (int i = 0; i < COUNT(gate_norm_shapes); i++) {
        const int rows = gate_norm_shapes[i][0], d = gate_norm_shapes[i][1];
        const size_t n = (size_t)rows * d;
        float *base = gpu_test_rounded_uniform(n, 1.0f, 0.0f, 1260 + (uint64_t)i);
        float *route = gpu_test_rounded_uniform(n, 2.0f, 0.0f, 1270 + (uint64_t)i);
        float *weight = gpu_test_rounded_uniform((size_t)d, 0.5f, 1.0f, 1280 + (uint64_t)i);
        const float alpha_value = i % 2 ? -0.75f : 0.375f;
        const float *alpha = gpu_upload_floats(&alpha_value, 1);
        const bf16 *route_device = gpu_upload_bf16(route, n);
        const bf16 *weight_device = gpu_upload_bf16(weight, (size_t)d);
        /* the two ops */
        bf16 *x_two = gpu_poisoned_bf16(n), *out_two = gpu_poisoned_bf16(n);
        float *rstd_two = gpu_poisoned_floats((size_t)rows);
        cuda_add_scaled(x_two, gpu_upload_bf16(base, n), route_device, alpha, n, 0);
        cuda_rmsnorm_forward(out_two, rstd_two, x_two, weight_device, rows, d, EPS, 0);
        /* one pass, x in place of base */
        bf16 *x_one = gpu_upload_bf16(base, n), *out_one = gpu_poisoned_bf16(n);
        float *rstd_one = gpu_poisoned_floats((size_t)rows);
        cuda_add_scaled_rmsnorm_forward(x_one, out_one, rstd_one, x_one, route_device, alpha,
                                        weight_device, rows, d, EPS, NULL, 0);
        float *got[3] = {gpu_download_bf16(x_one, n), gpu_download_bf16(out_one, n),
                         gpu_download_floats(rstd_one, (size_t)rows)};
        float *want[3] = {gpu_download_bf16(x_two, n), gpu_download_bf16(out_two, n),
                          gpu_download_floats(rstd_two, (size_t)rows)};
        const size_t counts[3] = {n, n, (size_t)rows};
        const char *names[3] = {"x", "out", "rstd"};
        for (int k = 0; k < 3; k++) {
            cr_expect_eq(memcmp(got[k], want[k], counts[k] * sizeof(float)), 0,
                         "%s differs from add_scaled then rmsnorm_forward at rows %d, d %d",
                         names[k], rows, d);
            free(got[k]);
            free(want[k]);
        }
        free(base);
        free(route);
        free(weight);
        gpu_free_all();
    }
}

/* The adds inside the pass give the bits of add_both (with a partial) or add_inplace (none)
 * before it, for the stream, the partial, x, the normed row and rstd. */
Test(cuda_route_gate, add_scaled_rmsnorm_forward_adds_with_the_bits_of_the_adds_before)
{
    gpu_require();
    for (int i = 0; i < COUNT(gate_norm_shapes); i++) {
        const int rows = gate_norm_shapes[i][0], d = gate_norm_shapes[i][1];
        const size_t n = (size_t)rows * d;
        const bool with_partial = i % 2 == 0;
        float *host[5];
        for (int k = 0; k < 5; k++) /* stream, route, added, partial before, weight */
            host[k] = gpu_test_rounded_uniform(k == 4 ? (size_t)d : n, k == 1 ? 2.0f : 1.0f,
                                               k == 4 ? 1.0f : 0.0f, 1300 + 10 * i + k);
        const float alpha_value = i % 2 ? -0.75f : 0.375f;
        const float *alpha = gpu_upload_floats(&alpha_value, 1);
        const bf16 *route = gpu_upload_bf16(host[1], n), *added = gpu_upload_bf16(host[2], n);
        const bf16 *before = gpu_upload_bf16(host[3], n);
        const bf16 *weight = gpu_upload_bf16(host[4], (size_t)d);
        bf16 *stream[2], *partial[2], *x[2], *out[2];
        float *rstd[2];
        for (int k = 0; k < 2; k++) { /* 0: the ops one after the other, 1: one pass */
            stream[k] = gpu_upload_bf16(host[0], n);
            partial[k] = gpu_poisoned_bf16(n), x[k] = gpu_poisoned_bf16(n);
            out[k] = gpu_poisoned_bf16(n), rstd[k] = gpu_poisoned_floats((size_t)rows);
        }
        if (with_partial)
            cuda_add_both(partial[0], before, stream[0], added, n, 0);
        else
            cuda_add_inplace(stream[0], added, n, 0);
        cuda_add_scaled_rmsnorm_forward(x[0], out[0], rstd[0], stream[0], route, alpha, weight,
                                        rows, d, EPS, NULL, 0);
        const CudaGateAdd add = {added, stream[1], with_partial ? before : NULL,
                                 with_partial ? partial[1] : NULL};
        cuda_add_scaled_rmsnorm_forward(x[1], out[1], rstd[1], stream[1], route, alpha, weight,
                                        rows, d, EPS, &add, 0);
        const bf16 *rows_of[4][2] = {{stream[0], stream[1]}, {partial[0], partial[1]},
                                     {x[0], x[1]}, {out[0], out[1]}};
        const char *names[4] = {"stream", "partial", "x", "out"};
        for (int k = 0; k < 4; k++) {
            if (k == 1 && !with_partial)
                continue;
            float *want = gpu_download_bf16(rows_of[k][0], n);
            float *got = gpu_download_bf16(rows_of[k][1], n);
            cr_expect_eq(memcmp(got, want, n * sizeof(float)), 0,
                         "%s differs from the adds before at rows %d, d %d", names[k], rows, d);
            free(want), free(got);
        }
        float *want = gpu_download_floats(rstd[0], (size_t)rows);
        float *got = gpu_download_floats(rstd[1], (size_t)rows);
        cr_expect_eq(memcmp(got, want, (size_t)rows * sizeof(float)), 0, "rstd differs");
        free(want), free(got);
        for (int k = 0; k < 5; k++)
            free(host[k]);
        gpu_free_all();
    }
}

/* ---- add_scaled_backward: shape n; dx, dalpha (added to), dout, x, alpha ---- */

static void run_add_scaled_backward(const Backend *b, void *const *p, const OpCase *c)
{
    b->add_scaled_backward(p[0], p[1], p[2], p[3], p[4], (size_t)c->shape[0]);
}

static void check_add_scaled_backward(int n, float alpha, uint64_t seed)
{
    OpCase c = op_case("add_scaled_backward", run_add_scaled_backward);
    c.shape[0] = n;
    op_output(&c, "dx", ARRAY_ACTIVATION, (size_t)n, BF16_OUT);
    op_accumulated(&c, "dalpha", ARRAY_FLOAT, 1, BACKEND_STATISTIC_TOLERANCE);
    op_input(&c, "dout", ARRAY_ACTIVATION, (size_t)n, 1, 0);
    op_input(&c, "x", ARRAY_ACTIVATION, (size_t)n, 2, 0.25f);
    op_input(&c, "alpha", ARRAY_FLOAT, 1, 0, alpha);
    op_check(&c, seed);
}

/* n past the partial sums' fixed grid (1024 blocks of 256 threads of 8 values), and tails
 * that are not a multiple of the 8-value vector */
Test(cuda_route_gate, add_scaled_backward_is_alpha_dout_and_adds_the_dot_to_dalpha)
{
    gpu_require();
    check_add_scaled_backward(8192 * 1280 + 3, 0.75f, 1210);
    check_add_scaled_backward(4096 * 3 + 5, -1.5f, 1211);
    check_add_scaled_backward(77, 0.0f, 1212);
}
