/* kernels/cpu/route_conv_cpu.c — MSAR's stream route with the stream convolutions inside the
 * read (DESIGN 2.2): out = Route(E_0 .. E_{N-1}), E_k = taps[k] * s_k causally over the
 * sequence (E_k = s_k where taps[k] is NULL). Contract in runtime/backend.h
 * (route_conv_forward / route_conv_backward).
 *
 * This is the composition stream_conv_forward + route_forward (and route_backward into dE,
 * then stream_conv_backward) computed without a [N, tokens, d] buffer for E or dE: the
 * results are those of the composition bit for bit, because every sum is taken in the
 * composition's order (kernels/cpu/stream_cpu.c and route_cpu.c are the math):
 *   E[t,c]   = taps[0,c] s[t,c], then += taps[tau,c] s[t-tau,c] for tau = 1 .. (fp32)
 *   forward  per token t: E rows of the N sources, then cpu_route_forward on that one token
 *            (one token's Route depends on that token alone).
 *   backward in two passes, since ds[t] needs dE[t .. t+k-1] and dtaps sums over all tokens:
 *     A  one thread a token: E rows, da = <dout[h], E_n[h]>, the softmax backward into
 *        dz = scratch [N, tokens, H], and the key-norm term mean_dot[n,t] =
 *        mean_d(dxhat xhat) (a host array [N, tokens]); as route_cpu.c's per-token part;
 *     B  one thread a block of CONV_CHANNEL_BLOCK channels, walking the tokens in order
 *        (sequence by sequence) and the sources in order: E, then
 *          dE    = a dout + r (dz q g - E r mean_dot)            (route_cpu.c's ds_n term)
 *          S_c  += dz E r  (double)   -> dq += g S, dg += q S     (route_cpu.c's dq pass)
 *          dtaps[tau] += dE[t] s[t - tau]  (double)                 (stream_cpu.c's dtaps)
 *          ds[u] += sum_tau taps[tau] dE[u + tau]  once dE[u + k - 1] is known: the last
 *                   kernel_size rows of dE are kept in a ring           (stream_cpu.c's dx)
 *        The null source's ds is dE itself (added once, as route_backward adds it).
 * Work split: forward and pass A one thread a token, pass B one thread a channel block, each
 * output written by one thread in a fixed order: the same bits whatever the thread count.
 * Memory: per thread working rows (E rows [N, d] in the forward and pass A; the dE ring and
 * the double sums [N, kernel_size, CONV_CHANNEL_BLOCK] in pass B) and mean_dot [N, tokens],
 * all host malloc per call; nothing of the backend's.
 */
#include "kernels/cpu/kernels_cpu.h"

#include "runtime/error.h"

#include <math.h>
#include <stdlib.h>

enum {
    CONV_CHANNEL_BLOCK = 64, /* channels per thread task in pass B */
};

/* index of (n, t, h) in weights and scratch [N, tokens, H] */
static inline size_t conv_route_index(int n, int t, int h, int tokens, int heads)
{
    return ((size_t)n * tokens + t) * heads + h;
}

static void check_kernel_size(int kernel_size)
{
    if (kernel_size < 1)
        fatal(EXIT_CONFIG, "residual.stream_kernels: a kernel size is %d, it must be >= 1",
              kernel_size);
}

/* E[c - first] for channels [first, last) of token `row` (position row % T in its sequence),
 * summed as cpu_stream_conv_forward sums */
static void convolve_channels(float *E, const float *source, const float *taps,
                              int kernel_size, int row, int T, int d, int first, int last)
{
    const int t = row % T;
    const float *x = source + (size_t)row * d;
    for (int c = first; c < last; c++)
        E[c - first] = taps[c] * x[c];
    for (int tau = 1; tau < kernel_size && tau <= t; tau++) {
        const float *tap_row = taps + (size_t)tau * d, *x_back = x - (size_t)tau * d;
        for (int c = first; c < last; c++)
            E[c - first] += tap_row[c] * x_back[c];
    }
}

/* Points rows[n] at E_n of token `row`: the source row itself for a null source, else the
 * convolution written into work + n * d. */
static void expand_token(const float **rows, float *work, const float *const *sources,
                         const float *const *taps, int n_sources, int kernel_size, int row,
                         int T, int d)
{
    for (int n = 0; n < n_sources; n++) {
        if (!taps[n]) {
            rows[n] = sources[n] + (size_t)row * d;
            continue;
        }
        float *E = work + (size_t)n * d;
        convolve_channels(E, sources[n], taps[n], kernel_size, row, T, d, 0, d);
        rows[n] = E;
    }
}

static void *host_array(size_t count, size_t size)
{
    return xcalloc(count ? count : 1, size);
}

void cpu_route_conv_forward(float *out, float *weights, float *rstd,
                            const float *const *sources, const float *const *taps,
                            int n_sources, int kernel_size, const float *query,
                            const float *key_norm, int B, int T, int d, int heads, float eps)
{
    check_kernel_size(kernel_size);
    const int tokens = B * T, N = n_sources;
    const size_t work = (size_t)N * tokens * d * kernel_size;

#pragma omp parallel if (work >= CPU_PARALLEL_MIN_WORK)
    {
        /* one token's E rows, its Route statistics, and the row pointers */
        float *E = host_array((size_t)N * d, sizeof(float));
        float *token_weights = host_array((size_t)N * heads, sizeof(float));
        float *token_rstd = host_array((size_t)N, sizeof(float));
        const float **rows = host_array((size_t)N, sizeof(float *));

#pragma omp for schedule(static)
        for (int t = 0; t < tokens; t++) {
            expand_token(rows, E, sources, taps, N, kernel_size, t, T, d);
            /* the Route of this one token; weights come out [N, 1, H] */
            cpu_route_forward(out + (size_t)t * d, token_weights, token_rstd, rows, N, query,
                              key_norm, NULL, 0.0f, 1, d, heads, eps);
            for (int n = 0; n < N; n++) {
                rstd[(size_t)n * tokens + t] = token_rstd[n];
                for (int h = 0; h < heads; h++)
                    weights[conv_route_index(n, t, h, tokens, heads)] =
                        token_weights[(size_t)n * heads + h];
            }
        }
        free(E);
        free(token_weights);
        free(token_rstd);
        free((void *)rows);
    }
}

void cpu_route_conv_mix(float *out, const float *weights, const float *const *sources,
                        const float *const *taps, int n_sources, int kernel_size, int B, int T,
                        int d, int heads)
{
    check_kernel_size(kernel_size);
    const int tokens = B * T, N = n_sources, head_dim = d / heads;
    const size_t work = (size_t)N * tokens * d * kernel_size;

#pragma omp parallel if (work >= CPU_PARALLEL_MIN_WORK)
    {
        float *E = host_array((size_t)N * d, sizeof(float));
        const float **rows = host_array((size_t)N, sizeof(float *));
#pragma omp for schedule(static)
        for (int t = 0; t < tokens; t++) {
            expand_token(rows, E, sources, taps, N, kernel_size, t, T, d);
            /* cpu_route_forward's mix, term by term */
            float *out_row = out + (size_t)t * d;
            for (int h = 0; h < heads; h++)
                for (int c = h * head_dim; c < (h + 1) * head_dim; c++) {
                    double mix = 0;
                    for (int n = 0; n < N; n++)
                        mix += (double)weights[conv_route_index(n, t, h, tokens, heads)] *
                               rows[n][c];
                    out_row[c] = (float)mix;
                }
        }
        free(E);
        free((void *)rows);
    }
}

/* whether pass B must form dE of source n (a source or tap gradient is wanted) */
static int wants_expanded_gradient(float *const *dsources, float *const *dtaps,
                                   const float *const *taps, int n)
{
    return dsources[n] != NULL || (taps[n] != NULL && dtaps[n] != NULL);
}

/* Pass A for token t: dz into scratch, mean_dot[n, t] for the sources that need dE. */
static void conv_backward_token(float *scratch, float *mean_dot, float *const *dsources,
                                float *const *dtaps, const float *dout,
                                const float *const *rows, const float *const *taps,
                                int n_sources, const float *weights, const float *rstd,
                                const float *query, const float *key_norm, int t, int tokens,
                                int d, int heads)
{
    const int head_dim = d / heads;
    const float *dout_row = dout + (size_t)t * d;

    /* da = < dout[h], E_n[h] >, kept in scratch until the softmax backward replaces it */
    for (int n = 0; n < n_sources; n++)
        for (int h = 0; h < heads; h++) {
            double dot = 0;
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                dot += (double)dout_row[c] * rows[n][c];
            scratch[conv_route_index(n, t, h, tokens, heads)] = (float)dot;
        }
    /* dz = a (da - sum_m a_m da_m) */
    for (int h = 0; h < heads; h++) {
        double mean_da = 0;
        for (int n = 0; n < n_sources; n++) {
            size_t index = conv_route_index(n, t, h, tokens, heads);
            mean_da += (double)weights[index] * scratch[index];
        }
        for (int n = 0; n < n_sources; n++) {
            size_t index = conv_route_index(n, t, h, tokens, heads);
            scratch[index] = (float)(weights[index] * (scratch[index] - mean_da));
        }
    }
    /* mean_dot = mean_d(dxhat xhat), dxhat = dz q g, xhat = E r */
    for (int n = 0; n < n_sources; n++) {
        if (!wants_expanded_gradient(dsources, dtaps, taps, n))
            continue;
        const float r = rstd[(size_t)n * tokens + t];
        const float *dz = scratch + conv_route_index(n, t, 0, tokens, heads);
        double dot = 0;
        for (int h = 0; h < heads; h++)
            for (int c = h * head_dim; c < (h + 1) * head_dim; c++)
                dot += (double)(dz[h] * query[c] * key_norm[c]) * (double)(rows[n][c] * r);
        mean_dot[(size_t)n * tokens + t] = (float)(dot / d);
    }
}

/* The working memory of one pass-B thread. */
typedef struct {
    float *E;          /* [CONV_CHANNEL_BLOCK] */
    float *ring;       /* [N, kernel_size, CONV_CHANNEL_BLOCK]: dE of the last k tokens */
    double *tap_sums;  /* [N, kernel_size, CONV_CHANNEL_BLOCK] */
    double *key_sums;  /* [CONV_CHANNEL_BLOCK]: S_c */
} ChannelWork;

/* Everything pass B reads, in one place. */
typedef struct {
    float *const *dsources;
    float *const *dtaps;
    const float *dout;
    const float *const *sources;
    const float *const *taps;
    const float *weights, *rstd, *query, *key_norm, *dz, *mean_dot;
    int n_sources, kernel_size, T, tokens, d, heads;
} ChannelPass;

/* ds[u] += sum_{tau < k, u + tau < T} taps[tau] dE[u + tau] for channels [first, last) of
 * source n, u the row in its sequence `b`; dE comes from the ring (slot = position % k) */
static void finish_source_gradient(const ChannelPass *p, const ChannelWork *w, int n, int b,
                                   int u, int first, int last)
{
    const int k = p->kernel_size;
    const float *ring = w->ring + (size_t)n * k * CONV_CHANNEL_BLOCK;
    const float *taps = p->taps[n];
    float *ds = p->dsources[n] + ((size_t)b * p->T + u) * p->d;
    for (int c = first; c < last; c++) {
        float sum = taps[c] * ring[(size_t)(u % k) * CONV_CHANNEL_BLOCK + c - first];
        for (int tau = 1; tau < k && u + tau < p->T; tau++)
            sum += taps[(size_t)tau * p->d + c] *
                   ring[(size_t)((u + tau) % k) * CONV_CHANNEL_BLOCK + c - first];
        ds[c] += sum;
    }
}

/* Pass B for source n at row = b * T + t, channels [first, last). */
static void channel_step(const ChannelPass *p, ChannelWork *w, int n, int b, int t, int first,
                         int last)
{
    const int k = p->kernel_size, head_dim = p->d / p->heads, row = b * p->T + t;
    const int tokens = p->tokens, heads = p->heads;
    const float r = p->rstd[(size_t)n * tokens + row];
    const float *dz = p->dz + conv_route_index(n, row, 0, tokens, heads);
    const float *a = p->weights + conv_route_index(n, row, 0, tokens, heads);
    const float *dout_row = p->dout + (size_t)row * p->d;
    const float *x = p->sources[n] + (size_t)row * p->d;
    float *E = w->E;

    if (p->taps[n])
        convolve_channels(E, p->sources[n], p->taps[n], k, row, p->T, p->d, first, last);
    else
        for (int c = first; c < last; c++)
            E[c - first] = x[c];

    /* S_c = sum over tokens and sources of dz E r, tokens outer, sources inner */
    for (int c = first; c < last; c++)
        w->key_sums[c - first] += (double)dz[c / head_dim] * (E[c - first] * r);

    if (!wants_expanded_gradient(p->dsources, p->dtaps, p->taps, n))
        return;
    const float mean_dot = p->mean_dot[(size_t)n * tokens + row];
    float *ring_row = w->ring + ((size_t)n * k + (size_t)(t % k)) * CONV_CHANNEL_BLOCK;
    float *ds = p->dsources[n] ? p->dsources[n] + (size_t)row * p->d : NULL;
    for (int c = first; c < last; c++) {
        const int h = c / head_dim;
        const float xhat = E[c - first] * r;
        const float dxhat = dz[h] * p->query[c] * p->key_norm[c];
        const float dmix = 1.0f * dout_row[c];
        const float dE = a[h] * dmix + r * (dxhat - xhat * mean_dot);
        if (!p->taps[n])
            ds[c] += dE; /* the null source: route_backward adds into it directly */
        else
            ring_row[c - first] = dE;
    }
    if (!p->taps[n])
        return;

    if (p->dtaps[n]) {
        double *sums = w->tap_sums + (size_t)n * k * CONV_CHANNEL_BLOCK;
        for (int tau = 0; tau < k && tau <= t; tau++) {
            const float *x_back = x - (size_t)tau * p->d;
            for (int c = first; c < last; c++)
                sums[(size_t)tau * CONV_CHANNEL_BLOCK + c - first] +=
                    (double)ring_row[c - first] * x_back[c];
        }
    }
    if (ds) {
        if (t >= k - 1)
            finish_source_gradient(p, w, n, b, t - (k - 1), first, last);
        if (t == p->T - 1) /* the sequence's last rows have all their dE now */
            for (int u = (p->T - k + 1 > 0 ? p->T - k + 1 : 0); u < p->T; u++)
                finish_source_gradient(p, w, n, b, u, first, last);
    }
}

/* Pass B over channels [first, last): every row of every sequence, in order. */
static void channel_pass(const ChannelPass *p, ChannelWork *w, float *dquery, float *dkey_norm,
                         int first, int last)
{
    const int N = p->n_sources, k = p->kernel_size, B = p->tokens / p->T;
    const size_t sums = (size_t)N * k * CONV_CHANNEL_BLOCK;
    for (size_t i = 0; i < sums; i++)
        w->tap_sums[i] = 0;
    for (int i = 0; i < CONV_CHANNEL_BLOCK; i++)
        w->key_sums[i] = 0;

    for (int b = 0; b < B; b++)
        for (int t = 0; t < p->T; t++)
            for (int n = 0; n < N; n++)
                channel_step(p, w, n, b, t, first, last);

    for (int c = first; c < last; c++) {
        dquery[c] += (float)(p->key_norm[c] * w->key_sums[c - first]);
        dkey_norm[c] += (float)(p->query[c] * w->key_sums[c - first]);
    }
    for (int n = 0; n < N; n++) {
        if (!p->taps[n] || !p->dtaps[n])
            continue;
        const double *tap_sums = w->tap_sums + (size_t)n * k * CONV_CHANNEL_BLOCK;
        for (int tau = 0; tau < k; tau++)
            for (int c = first; c < last; c++)
                p->dtaps[n][(size_t)tau * p->d + c] +=
                    (float)tap_sums[(size_t)tau * CONV_CHANNEL_BLOCK + c - first];
    }
}

void cpu_route_conv_backward(float *const *dsources, float *const *dtaps, float *dquery,
                             float *dkey_norm, const float *dout, const float *const *sources,
                             const float *const *taps, int n_sources, int kernel_size,
                             const float *weights, const float *rstd, const float *query,
                             const float *key_norm, float *scratch, int B, int T, int d,
                             int heads)
{
    check_kernel_size(kernel_size);
    const int tokens = B * T, N = n_sources;
    const int parallel = (size_t)N * tokens * d * kernel_size >= CPU_PARALLEL_MIN_WORK;
    float *mean_dot = host_array((size_t)N * tokens, sizeof(float));

    /* pass A: one thread a token */
#pragma omp parallel if (parallel)
    {
        float *E = host_array((size_t)N * d, sizeof(float));
        const float **rows = host_array((size_t)N, sizeof(float *));
#pragma omp for schedule(static)
        for (int t = 0; t < tokens; t++) {
            expand_token(rows, E, sources, taps, N, kernel_size, t, T, d);
            conv_backward_token(scratch, mean_dot, dsources, dtaps, dout, rows, taps, N,
                                weights, rstd, query, key_norm, t, tokens, d, heads);
        }
        free(E);
        free((void *)rows);
    }

    /* pass B: one thread a channel block */
    const ChannelPass pass = {
        .dsources = dsources, .dtaps = dtaps, .dout = dout, .sources = sources, .taps = taps,
        .weights = weights, .rstd = rstd, .query = query, .key_norm = key_norm, .dz = scratch,
        .mean_dot = mean_dot, .n_sources = N, .kernel_size = kernel_size, .T = T,
        .tokens = tokens, .d = d, .heads = heads,
    };
    const int n_blocks = (d + CONV_CHANNEL_BLOCK - 1) / CONV_CHANNEL_BLOCK;
#pragma omp parallel if (parallel)
    {
        const size_t sums = (size_t)N * kernel_size * CONV_CHANNEL_BLOCK;
        ChannelWork work = {
            .E = host_array(CONV_CHANNEL_BLOCK, sizeof(float)),
            .ring = host_array(sums, sizeof(float)),
            .tap_sums = host_array(sums, sizeof(double)),
            .key_sums = host_array(CONV_CHANNEL_BLOCK, sizeof(double)),
        };
#pragma omp for schedule(static)
        for (int block = 0; block < n_blocks; block++) {
            const int first = block * CONV_CHANNEL_BLOCK;
            const int last = first + CONV_CHANNEL_BLOCK < d ? first + CONV_CHANNEL_BLOCK : d;
            channel_pass(&pass, &work, dquery, dkey_norm, first, last);
        }
        free(work.E);
        free(work.ring);
        free(work.tap_sums);
        free(work.key_sums);
    }
    free(mean_dot);
}
