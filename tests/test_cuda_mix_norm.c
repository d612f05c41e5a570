/* tests/test_cuda_mix_norm.c — MSAR's delta-form gate with its streams' mix made inside the
 * sublayer's norm (runtime/backend.h stream_mix_rmsnorm_forward;
 * kernels/cuda/stream_mix_norm_cuda.cu; docs/design-notes.md, "MSAR's mix inside its
 * sublayer's norm"):
 * - the cuda op table against the cpu's (the mix, then the gate and the norm), without the
 *   adds of the sublayer before's output, with them into the stream alone, and with them into
 *   the block's partial too: rules of tests/cuda_backend_support.h (fresh random inputs
 *   rounded to bf16, outputs poisoned, bf16 tolerance for rows and 1e-3 for statistics, the
 *   cuda call twice the same bits);
 * - the promise of one pass: the bits of cuda_stream_mix_forward and
 *   cuda_add_scaled_rmsnorm_forward in turn, for x, the normed row, the norm's rstd, the
 *   gates, the mix's rstd, the stream and the partial.
 * Shapes (streams m, tokens, d): the one pass's (d % 256 == 0, d <= 1280: the 1B step's d
 * 1280 with 4 streams, 2 and 3 streams at d 512 and 768, where the norm's warp holds three
 * chunks, 8 streams at d 256, 2000 tokens, more warps than the multiprocessors hold at once)
 * and the two ops' (d 2048, past the norm's warp rows; d 96, past the warp-a-token mix).
 * Each test SKIPs where no GPU answers.
 */
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/route_cuda.h"
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BF16_OUT BACKEND_BF16_TOLERANCE
#define STATISTIC BACKEND_STATISTIC_TOLERANCE
#define MIX_EPS 1e-5f
#define NORM_EPS 1e-6f
#define MAX_STREAMS 8
#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

typedef struct {
    int streams, tokens, d;
} MixNormShape;

static const MixNormShape shapes[] = {
    {4, 300, 1280}, {2, 33, 512}, {3, 20, 768}, {8, 17, 256},
    {4, 2000, 1280}, {4, 9, 2048}, {2, 7, 96},
};

/* the adds before the gate: none, into the stream alone, into the stream and the partial */
typedef enum { NO_ADD, ADD_STREAM, ADD_PARTIAL } AddKind;

static const char *add_name(AddKind adds)
{
    return adds == NO_ADD ? "no add" : adds == ADD_STREAM ? "the stream's add" : "both adds";
}

/* ---- the op table: arrays in this order; shape: m, tokens, d, AddKind ---- */

enum { X, OUT, NORM_RSTD, GATES, MIX_RSTD, BASE, STREAMS, MIX_BIAS, MIX_PROJ, ALPHA,
       NORM_WEIGHT, SCRATCH, ADDED, PARTIAL_BEFORE, PARTIAL };

static void run_mix_norm(const Backend *b, void *const *p, const OpCase *c)
{
    const int m = c->shape[0], tokens = c->shape[1], d = c->shape[2];
    const AddKind adds = (AddKind)c->shape[3];
    const Activation *streams[MAX_STREAMS];
    split_rows_const(b, p[STREAMS], m, (size_t)tokens * d, streams);
    const StreamMix mix = {streams, m, p[GATES], p[MIX_RSTD], p[MIX_BIAS], p[MIX_PROJ],
                           MIX_EPS, p[SCRATCH]};
    const GateAdd add = {p[ADDED], p[BASE], adds == ADD_PARTIAL ? p[PARTIAL_BEFORE] : NULL,
                         adds == ADD_PARTIAL ? p[PARTIAL] : NULL};
    b->stream_mix_rmsnorm_forward(p[X], p[OUT], p[NORM_RSTD], &mix, p[BASE], p[ALPHA],
                                  p[NORM_WEIGHT], tokens, d, NORM_EPS,
                                  adds == NO_ADD ? NULL : &add);
}

static void check_mix_norm(MixNormShape s, AddKind adds, uint64_t seed)
{
    OpCase c = op_case("stream_mix_rmsnorm_forward", run_mix_norm);
    c.shape[0] = s.streams, c.shape[1] = s.tokens, c.shape[2] = s.d, c.shape[3] = adds;
    const size_t rows = (size_t)s.tokens * s.d, gates = (size_t)s.tokens * s.streams;
    op_output(&c, "x", ARRAY_ACTIVATION, rows, BF16_OUT);
    op_output(&c, "out", ARRAY_ACTIVATION, rows, BF16_OUT);
    /* x rounded twice before its row sum here (the mix, then the gate), not on the cpu:
     * twice the statistics' bound, as the gated norm's test allows */
    op_output(&c, "norm rstd", ARRAY_FLOAT, (size_t)s.tokens, 2 * STATISTIC);
    op_output(&c, "gates", ARRAY_FLOAT, gates, STATISTIC);
    op_output(&c, "mix rstd", ARRAY_FLOAT, gates, STATISTIC);
    if (adds == NO_ADD)
        op_input(&c, "base", ARRAY_ACTIVATION, rows, 1, 0);
    else /* the stream, added to in place */
        op_accumulated(&c, "stream", ARRAY_ACTIVATION, rows, BF16_OUT);
    op_input(&c, "streams", ARRAY_ACTIVATION, (size_t)s.streams * rows, 1, 0);
    /* the init bias -ln(m - 1) and a small projection keep the gates away from 0 and 1 */
    op_input(&c, "mix_bias", ARRAY_FLOAT, (size_t)s.streams, 0.3f,
             -logf((float)(s.streams - 1)));
    op_input(&c, "mix_proj", ARRAY_ACTIVATION, (size_t)s.streams * s.d, 0.1f, 0);
    op_input(&c, "alpha", ARRAY_FLOAT, 1, 0, seed % 2 ? -0.75f : 0.625f);
    op_input(&c, "norm weight", ARRAY_ACTIVATION, (size_t)s.d, 0.5f, 1);
    /* the mix's scratch: left undefined by the op, so read by nothing here */
    op_input(&c, "mix scratch", ARRAY_ACTIVATION, rows, 1, 0);
    op_input(&c, "added", ARRAY_ACTIVATION, rows, 0.5f, 0);
    op_input(&c, "partial before", ARRAY_ACTIVATION, rows, 1, 0);
    if (adds == ADD_PARTIAL)
        op_output(&c, "partial", ARRAY_ACTIVATION, rows, BF16_OUT);
    op_check(&c, seed);
}

Test(cuda_mix_norm, stream_mix_rmsnorm_forward_is_the_mix_then_the_gated_norm)
{
    gpu_require();
    for (int i = 0; i < COUNT(shapes); i++)
        for (int adds = NO_ADD; adds <= ADD_PARTIAL; adds++)
            check_mix_norm(shapes[i], (AddKind)adds, 3000 + 3 * (uint64_t)i + adds);
}

/* ---- one pass against the ops in turn, bit for bit ---- */

/* The outputs of one way of making the site, on the device. */
typedef struct {
    bf16 *x, *out, *stream, *partial;
    float *norm_rstd, *gates, *mix_rstd;
} MixNormOutputs;

enum { OUTPUT_ROWS = 4, OUTPUT_FLOATS = 3 };

static void check_bits(MixNormShape s, AddKind adds, uint64_t seed)
{
    const int m = s.streams;
    const size_t rows = (size_t)s.tokens * s.d, gates = (size_t)s.tokens * m;
    float *streams = gpu_test_bf16_values((size_t)m * rows, 1.0f, seed);
    float *stream = gpu_test_bf16_values(rows, 1.0f, seed + 1);
    float *added = gpu_test_bf16_values(rows, 0.5f, seed + 2);
    float *before = gpu_test_bf16_values(rows, 1.0f, seed + 3);
    float *bias = gpu_test_rounded_uniform((size_t)m, 0.3f, -logf((float)(m - 1)), seed + 4);
    float *proj = gpu_test_bf16_values((size_t)m * s.d, 0.1f, seed + 5);
    float *weight = gpu_test_rounded_uniform((size_t)s.d, 0.5f, 1.0f, seed + 6);
    const float alpha_value = seed % 2 ? -0.75f : 0.375f;
    const bf16 *streams_device = gpu_upload_bf16(streams, (size_t)m * rows);
    const bf16 *stream_rows[MAX_STREAMS];
    for (int r = 0; r < m; r++)
        stream_rows[r] = streams_device + (size_t)r * rows;
    const bf16 *added_device = gpu_upload_bf16(added, rows);
    const bf16 *before_device = gpu_upload_bf16(before, rows);
    const float *bias_device = gpu_upload_floats(bias, (size_t)m);
    const bf16 *proj_device = gpu_upload_bf16(proj, (size_t)m * s.d);
    const bf16 *weight_device = gpu_upload_bf16(weight, (size_t)s.d);
    const float *alpha = gpu_upload_floats(&alpha_value, 1);
    MixNormOutputs o[2]; /* 0: the ops in turn, 1: one pass */
    for (int k = 0; k < 2; k++) {
        o[k].x = gpu_poisoned_bf16(rows), o[k].out = gpu_poisoned_bf16(rows);
        o[k].stream = gpu_upload_bf16(stream, rows), o[k].partial = gpu_poisoned_bf16(rows);
        o[k].norm_rstd = gpu_poisoned_floats((size_t)s.tokens);
        o[k].gates = gpu_poisoned_floats(gates), o[k].mix_rstd = gpu_poisoned_floats(gates);
        const CudaGateAdd add = {added_device, o[k].stream,
                                 adds == ADD_PARTIAL ? before_device : NULL,
                                 adds == ADD_PARTIAL ? o[k].partial : NULL};
        bf16 *mixed = gpu_poisoned_bf16(rows);
        if (k == 0) {
            cuda_stream_mix_forward(mixed, o[k].gates, o[k].mix_rstd, stream_rows, m,
                                    bias_device, proj_device, s.tokens, s.d, MIX_EPS, 0);
            cuda_add_scaled_rmsnorm_forward(o[k].x, o[k].out, o[k].norm_rstd, o[k].stream,
                                            mixed, alpha, weight_device, s.tokens, s.d,
                                            NORM_EPS, adds == NO_ADD ? NULL : &add, 0);
        } else {
            cuda_stream_mix_rmsnorm_forward(o[k].x, o[k].out, o[k].norm_rstd, mixed,
                                            o[k].gates, o[k].mix_rstd, stream_rows, m,
                                            bias_device, proj_device, MIX_EPS, o[k].stream,
                                            alpha, weight_device, s.tokens, s.d, NORM_EPS,
                                            adds == NO_ADD ? NULL : &add, 0);
        }
    }
    const char *names[OUTPUT_ROWS + OUTPUT_FLOATS] = {"x",         "out",   "stream", "partial",
                                                      "norm rstd", "gates", "mix rstd"};
    for (int k = 0; k < OUTPUT_ROWS + OUTPUT_FLOATS; k++) {
        if (k == 3 && adds != ADD_PARTIAL)
            continue;
        float *got, *want;
        size_t n = rows;
        if (k < OUTPUT_ROWS) {
            bf16 *const a[2][OUTPUT_ROWS] = {{o[0].x, o[0].out, o[0].stream, o[0].partial},
                                             {o[1].x, o[1].out, o[1].stream, o[1].partial}};
            want = gpu_download_bf16(a[0][k], rows), got = gpu_download_bf16(a[1][k], rows);
        } else {
            float *const a[2][OUTPUT_FLOATS] = {{o[0].norm_rstd, o[0].gates, o[0].mix_rstd},
                                                {o[1].norm_rstd, o[1].gates, o[1].mix_rstd}};
            n = k == OUTPUT_ROWS ? (size_t)s.tokens : gates;
            want = gpu_download_floats(a[0][k - OUTPUT_ROWS], n);
            got = gpu_download_floats(a[1][k - OUTPUT_ROWS], n);
        }
        cr_expect_eq(memcmp(got, want, n * sizeof(float)), 0,
                     "%s differs from the ops in turn at m %d, tokens %d, d %d, %s", names[k],
                     m, s.tokens, s.d, add_name(adds));
        free(got), free(want);
    }
    free(streams), free(stream), free(added), free(before), free(bias), free(proj);
    free(weight);
    gpu_free_all();
}

Test(cuda_mix_norm, stream_mix_rmsnorm_forward_gives_the_bits_of_the_ops_in_turn)
{
    gpu_require();
    for (int i = 0; i < COUNT(shapes); i++)
        for (int adds = NO_ADD; adds <= ADD_PARTIAL; adds++)
            check_bits(shapes[i], (AddKind)adds, 3100 + 3 * (uint64_t)i + adds);
}
