/* kernels/cpu/stream_cpu.c — MSAR streams: the causal depthwise convolution that expands a
 * source into a stream, and the gated mix of the routed streams (DESIGN 2.2).
 *
 * Convolution, x, out, dx, dout [B, T, d]; taps, dtaps [kernel_size, d]:
 *   out[b,t,c]  = sum_{tau < k, tau <= t} taps[tau,c] x[b,t-tau,c]     (fp32, tau ascending)
 *   dx[b,t,c]  += sum_{tau < k, t+tau < T} taps[tau,c] dout[b,t+tau,c]
 *   dtaps[tau,c] += sum_b sum_{t >= tau} dout[b,t,c] x[b,t-tau,c]        (double, rounded once)
 * Summing from tau = 0 makes identity taps (1, 0, 0, ..) return x bit for bit.
 *
 * Mix, m streams o_r [tokens, d]; beta (mix_bias) [m]; theta (mix_proj) [m, d]; gates w and
 * rstd rho [tokens, m]. Per token, with u_r = o_r * rho_r:
 *   rho_r = rsqrt(mean_d(o_r^2) + eps)                 (double, rounded once)
 *   g_r   = beta_r + < theta_r, u_r >,  w_r = sigmoid(g_r)   (double, w rounded once)
 *   out   = sum_r w_r o_r                               (double over r in order, rounded once)
 * Rounding w once makes sigmoid(-ln(m-1)) exactly 1/m for m = 2, 4 (and any power of two),
 * and the double sum then returns m equal streams bit for bit: MSAR at init is Block AttnRes.
 * Backward, with dw_r = < dout, o_r >, dg_r = dw_r w_r (1 - w_r), du_r = dg_r theta_r:
 *   do_r     += w_r dout + rho_r (du_r - u_r mean_d(du_r u_r))     (RMSNorm backward)
 *   dbeta_r  += sum_t dg_r,   dtheta_r += sum_t dg_r u_r
 * With the delta gate folded in (alpha), dout is d x and d out = alpha dout; d alpha gets
 * sum_t sum_r w_r < dout, o_r > (double, tokens in order, streams in order a token).
 *
 * Determinism (DESIGN 3): per-row outputs get one thread a row; sums over tokens get one
 * thread a block of channels walking tokens in order. The mix backward has no scratch buffer
 * for dg [tokens, m], so it walks the tokens in tiles of MIX_TILE_FLOATS / m (a stack buffer):
 * rows of a tile in parallel, then the tile's parameter sums per channel block, added into
 * the gradients tile by tile. Tile bounds depend on m only, never on the thread count.
 */
#include "kernels/cpu/kernels_cpu.h"

#include "runtime/error.h"

#include <math.h>

enum {
    STREAM_CHANNEL_BLOCK = 64, /* channels per thread task in the parameter-gradient passes */
    MIX_TILE_FLOATS = 4096,    /* dg values held per tile of the mix backward (16 KiB) */
};

/* ---- convolution ---- */

void cpu_stream_conv_forward(float *out, const float *x, const float *taps, int kernel_size,
                             int B, int T, int d)
{
    size_t work = (size_t)B * T * d * kernel_size;
#pragma omp parallel for schedule(static) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int row = 0; row < B * T; row++) {
        int t = row % T;
        float *out_row = out + (size_t)row * d;
        const float *x_row = x + (size_t)row * d;
        for (int c = 0; c < d; c++)
            out_row[c] = taps[c] * x_row[c];
        for (int tau = 1; tau < kernel_size && tau <= t; tau++) {
            const float *tap_row = taps + (size_t)tau * d, *x_back = x_row - (size_t)tau * d;
            for (int c = 0; c < d; c++)
                out_row[c] += tap_row[c] * x_back[c];
        }
    }
}

void cpu_stream_conv_backward(float *dx, float *dtaps, const float *dout, const float *x,
                              const float *taps, int kernel_size, int B, int T, int d)
{
    int parallel = (size_t)B * T * d * kernel_size >= CPU_PARALLEL_MIN_WORK;

    if (dx) {
#pragma omp parallel for schedule(static) if (parallel)
        for (int row = 0; row < B * T; row++) {
            int t = row % T;
            float *dx_row = dx + (size_t)row * d;
            const float *dout_row = dout + (size_t)row * d;
            for (int c = 0; c < d; c++) {
                float sum = taps[c] * dout_row[c];
                for (int tau = 1; tau < kernel_size && t + tau < T; tau++)
                    sum += taps[(size_t)tau * d + c] * dout_row[(size_t)tau * d + c];
                dx_row[c] += sum;
            }
        }
    }

    int n_blocks = (d + STREAM_CHANNEL_BLOCK - 1) / STREAM_CHANNEL_BLOCK;
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
    for (int tau = 0; tau < kernel_size; tau++)
        for (int block = 0; block < n_blocks; block++) {
            int first = block * STREAM_CHANNEL_BLOCK;
            int last = first + STREAM_CHANNEL_BLOCK < d ? first + STREAM_CHANNEL_BLOCK : d;
            double sums[STREAM_CHANNEL_BLOCK] = {0};
            for (int b = 0; b < B; b++)
                for (int t = tau; t < T; t++) {
                    const float *dout_row = dout + ((size_t)b * T + t) * d;
                    const float *x_row = x + ((size_t)b * T + t - tau) * d;
                    for (int c = first; c < last; c++)
                        sums[c - first] += (double)dout_row[c] * x_row[c];
                }
            for (int c = first; c < last; c++)
                dtaps[(size_t)tau * d + c] += (float)sums[c - first];
        }
}

/* ---- mix ---- */

void cpu_stream_mix_forward(float *out, float *gates, float *rstd, const float *const *streams,
                            int m, const float *mix_bias, const float *mix_proj, int tokens,
                            int d, float eps)
{
#pragma omp parallel for schedule(static) if ((size_t)m * tokens * d >= CPU_PARALLEL_MIN_WORK)
    for (int t = 0; t < tokens; t++) {
        for (int r = 0; r < m; r++) {
            const float *o = streams[r] + (size_t)t * d;
            const float *theta = mix_proj + (size_t)r * d;
            double sum_squares = 0;
            for (int c = 0; c < d; c++)
                sum_squares += (double)o[c] * o[c];
            float rho = (float)(1.0 / sqrt(sum_squares / d + (double)eps));
            double g = mix_bias[r];
            for (int c = 0; c < d; c++)
                g += (double)theta[c] * (o[c] * rho);
            rstd[(size_t)t * m + r] = rho;
            gates[(size_t)t * m + r] = (float)(1.0 / (1.0 + exp(-g)));
        }
        float *out_row = out + (size_t)t * d;
        const float *w = gates + (size_t)t * m;
        for (int c = 0; c < d; c++) {
            double sum = 0;
            for (int r = 0; r < m; r++)
                sum += (double)w[r] * streams[r][(size_t)t * d + c];
            out_row[c] = (float)sum;
        }
    }
}

/* The per-token part of the mix backward: dg for token t into dg_row [m] (0 for a stream
 * not given), d o_r, and the token's share of d alpha, sum_r w_r < dout, o_r >. scale: the
 * gate's alpha (1 without a gate: d out = dout bit for bit). */
static double mix_backward_token(float *const *dstreams, GradMode mode, float *dg_row,
                                 const float *dout, const float *const *streams, int m,
                                 const float *gates, const float *rstd, const float *mix_proj,
                                 float scale, int t, int d)
{
    const float *dout_row = dout + (size_t)t * d;
    double alpha_share = 0;
    for (int r = 0; r < m; r++) {
        dg_row[r] = 0.0f;
        if (!streams[r])
            continue;
        const float *o = streams[r] + (size_t)t * d;
        double dot = 0; /* < dout, o_r > */
        for (int c = 0; c < d; c++)
            dot += (double)dout_row[c] * o[c];
        float w = gates[(size_t)t * m + r];
        alpha_share += (double)w * dot;
        const double dw = (double)scale * dot; /* < d out, o_r > */
        dg_row[r] = (float)(dw * w * (1.0 - w));
    }
    for (int r = 0; r < m; r++) {
        if (!streams[r] || !dstreams[r])
            continue;
        const float *o = streams[r] + (size_t)t * d;
        const float *theta = mix_proj + (size_t)r * d;
        float *dstream = dstreams[r] + (size_t)t * d;
        float w = gates[(size_t)t * m + r], rho = rstd[(size_t)t * m + r], dg = dg_row[r];
        double dot = 0; /* sum of du * u */
        for (int c = 0; c < d; c++)
            dot += (double)(dg * theta[c]) * (double)(o[c] * rho);
        float mean_dot = (float)(dot / d);
        for (int c = 0; c < d; c++) {
            float u = o[c] * rho, du = dg * theta[c];
            float grad = w * (scale * dout_row[c]) + rho * (du - u * mean_dot);
            dstream[c] = mode == GRAD_WRITE ? grad : dstream[c] + grad;
        }
    }
    return alpha_share;
}

void cpu_stream_mix_backward(float *const *dstreams, GradMode dstreams_mode, float *dmix_bias,
                             float *dmix_proj, float *dalpha, const float *dout,
                             const float *const *streams, int m, const float *gates,
                             const float *rstd, const float *mix_bias, const float *mix_proj,
                             const float *alpha, int tokens, int d)
{
    (void)mix_bias; /* the saved gates already hold beta's effect */
    if (m > MIX_TILE_FLOATS)
        fatal(EXIT_CONFIG, "residual.streams = %d: the stream mix supports at most %d streams", m,
              MIX_TILE_FLOATS);
    int tile_tokens = MIX_TILE_FLOATS / m;
    int n_blocks = (d + STREAM_CHANNEL_BLOCK - 1) / STREAM_CHANNEL_BLOCK;
    float dg_tile[MIX_TILE_FLOATS];      /* dg [tile_tokens, m] of the current tile */
    double alpha_tile[MIX_TILE_FLOATS];  /* the tile's tokens' shares of d alpha */
    const float scale = alpha ? *alpha : 1.0f;
    double alpha_sum = 0;

#pragma omp parallel if ((size_t)m * tokens * d >= CPU_PARALLEL_MIN_WORK)
    for (int first = 0; first < tokens; first += tile_tokens) {
        int last = first + tile_tokens < tokens ? first + tile_tokens : tokens;

#pragma omp for schedule(static)
        for (int t = first; t < last; t++)
            alpha_tile[t - first] = mix_backward_token(
                dstreams, dstreams_mode, dg_tile + (size_t)(t - first) * m, dout, streams, m,
                gates, rstd, mix_proj, scale, t, d);

        /* dtheta_r += sum over the tile of dg_r u_r, one thread a (stream, channel block) */
#pragma omp for collapse(2) schedule(static) nowait
        for (int r = 0; r < m; r++)
            for (int block = 0; block < n_blocks; block++) {
                if (!streams[r])
                    continue;
                int c_first = block * STREAM_CHANNEL_BLOCK;
                int c_last = c_first + STREAM_CHANNEL_BLOCK;
                c_last = c_last < d ? c_last : d;
                double sums[STREAM_CHANNEL_BLOCK] = {0};
                for (int t = first; t < last; t++) {
                    const float *o = streams[r] + (size_t)t * d;
                    float rho = rstd[(size_t)t * m + r], dg = dg_tile[(size_t)(t - first) * m + r];
                    for (int c = c_first; c < c_last; c++)
                        sums[c - c_first] += (double)dg * (o[c] * rho);
                }
                for (int c = c_first; c < c_last; c++)
                    dmix_proj[(size_t)r * d + c] += (float)sums[c - c_first];
            }

#pragma omp single
        {
            for (int r = 0; r < m; r++) {
                if (!streams[r])
                    continue;
                double sum = 0;
                for (int t = first; t < last; t++)
                    sum += dg_tile[(size_t)(t - first) * m + r];
                dmix_bias[r] += (float)sum;
            }
            for (int t = first; t < last; t++)
                alpha_sum += alpha_tile[t - first];
        }
        /* the barrier closing `single` keeps dg_tile until every thread is done with it */
    }
    if (alpha)
        *dalpha += (float)alpha_sum;
}
