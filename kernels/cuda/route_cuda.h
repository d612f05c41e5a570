/* kernels/cuda/route_cuda.h — attention over depth on the GPU: Route forward and backward,
 * the MSAR stream convolution and the MSAR mix (DESIGN 2.1, 2.2). Plain C header.
 *
 * Every function mirrors its op in runtime/backend.h (same arguments, same order, same math;
 * kernels/cpu/route_cpu.c and stream_cpu.c are the reference and derive the backward), with
 * the cuda dtypes of DESIGN 3 and a trailing cudaStream_t:
 * - activations and their gradients (sources, base, out, dout, dsources, streams, x) are bf16
 *   [tokens, d]; every "+=" into bf16 reads, adds in fp32 and rounds once;
 * - weights are read as bf16 compute copies: query, key_norm [d], stream taps [k, d],
 *   mix_proj [m, d]. mix_bias [m] is read in fp32 (it is tiny, and sigmoid(-ln(m-1)) is
 *   exactly 1/m only from the fp32 value: MSAR at init is Block AttnRes);
 * - saved statistics are fp32: weights [N, tokens, H], rstd [N, tokens], gates and mix rstd
 *   [tokens, m]; weight gradients are fp32 and accumulated ("+="), dalpha included (a device
 *   pointer to one float);
 * - pointer arrays (sources, dsources, streams, dstreams) are HOST arrays of device pointers;
 *   they travel to the GPU inside the kernel parameters, so the call returns at once.
 * Nothing here allocates or synchronises. Backward workspaces are device buffers of the
 * number of floats the *_workspace_floats function names; their contents are scratch.
 * Results are deterministic: each token is one block's, and every sum over tokens is made of
 * per-block partials (a fixed partition of the tokens) added in block order by a second
 * small kernel. No atomics.
 *
 * Route (route_cuda.cu, route_backward_cuda.cu). Rows of d <= 2048 with d % 256 == 0, heads
 * dividing 32 and 16-byte aligned pointers (the 1B model's d 1280) take the warp-a-token
 * kernels of route_narrow.cuh. The rest: one block a token at a time (a persistent
 * grid), each thread owning up to 16 channels of the row (16-byte loads where head_dim % 8
 * == 0 and the pointers are 16-byte aligned; narrower loads otherwise). The forward reads
 * each source row ONCE: a thread copies its vectors of all N rows of the token (up to 9 at
 * once; more come in passes) into shared memory with cp.async, then the sums of squares and
 * the per-head dots <q*g, s> of all sources are reduced together (three barriers a token,
 * none a source), the depth softmax is taken over all N scores at once (online across
 * passes), and the mix is summed from the rows still in shared memory. The backward reads
 * each source row twice (dots, then the gradients; the second read finds the row in L2).
 * Scores use the fused identity z = r * <q*g, s>: DESIGN 2.1 rounds khat = cast(s*r) to the
 * activation dtype before * g. The difference is that rounding of each term (relative
 * 2^-9, averaging out over the head) and the fused form is the one the fp32 cpu reference
 * computes up to fp32 rounding. The mix stays fp32 until out = base + alpha * mix is rounded
 * once, so alpha = 0 returns base bit for bit, and with equal sources and power-of-two
 * weights (a zero query and N a power of two) out is the source bit for bit.
 * Limits: N <= CUDA_ROUTE_MAX_SOURCES, heads <= CUDA_ROUTE_MAX_HEADS, d <= CUDA_ROUTE_MAX_WIDTH,
 * d % heads == 0; out must not alias a source (it may alias base). A violation is a config
 * error (fatal(EXIT_CONFIG, ...)).
 *
 * How fast should this be (H200: 4.3 TB/s copy, ~790 TFLOP/s bf16 dense). The benchmark
 * (route_bench.cu) is block-MHAR delta routing of the 8B graft: d 4096, H 8, 2 x 4096 tokens,
 * 64 sites, site j reading N = j/8 + 2 sources (null and b_0 .. b_{j/8}); sum of N = 352.
 * One [tokens, d] bf16 tensor is S = 8192 * 4096 * 2 B = 67.1 MB.
 *   forward, per site:  N sources + base read, out written           (N + 2) S
 *   backward, per site: sources twice, dout, dsources read + written (4N + 1) S
 *                       (3N + 1) S from DRAM when the second read hits L2, as designed)
 *   all 64 sites:       forward 480 S = 32.2 GB (7.5 ms); backward 1472 S = 98.8 GB
 *                       (23.0 ms), 1120 S = 75.2 GB (17.5 ms) from DRAM.
 * Floor: about 25 ms per microbatch (30.5 ms counting both backward reads), against the
 * 40 ms target and torch.compile's 243 ms. Arithmetic is ~20 fp32 flops per source element
 * over forward and backward (squares, dot, rescaled sum; two dots, the gradient terms and
 * the channel sums): ~0.25 TFLOP per microbatch, ~4 ms at the fp32 rate (67 TFLOP/s; the
 * bf16 tensor cores' 790 TFLOP/s do not apply): memory-bound. The weights, rstd and the
 * backward's partial sums (264 x d floats a site) add under 1%. (The null source is a [d]
 * row the model broadcasts to [tokens, d]; reading it as a broadcast row would save 64 S per
 * pass over the sites.)
 * Forward at d 4096: 256 threads, 76 registers (72 for N <= 5; no spills), 8 KB of shared
 * memory a row, so three blocks a multiprocessor (two at N = 9), each with a whole token's
 * rows in flight: 72 KB (N = 2) to 216 KB (N = 8) a multiprocessor, against the ~33 KB a
 * microsecond of latency that 4.3 TB/s asks of each of the 132. Per token and block about
 * 10k warp instructions at N = 9, against ~21k issue slots a multiprocessor in the 2.7 us
 * its 88 KB take at 4.3 TB/s: issue is not the limit either. Expected near the backward's
 * 3.9 TB/s: ~8.5 ms for the 64 forwards (from 15.9 ms).
 *
 * MSAR (stream_cuda.cu): the causal depthwise convolution over the sequence (out and dx one
 * thread a vector of channels; dtaps through per-block partials) and the gated mix (one
 * block a token, or a warp a token for narrow rows (stream_mix.cuh); one read of each
 * stream, forward and backward; parameter gradients through per-block partials). Limits:
 * m <= CUDA_STREAM_MAX_STREAMS, d <= CUDA_ROUTE_MAX_WIDTH.
 *
 * MSAR stream route (route_conv_cuda.cu, route_conv_backward_cuda.cu; backend.h route_conv_*,
 * kernels/cpu/route_conv_cpu.c is the reference): the Route of one stream over the convolved
 * sources E_k = taps[k] * s_k, the convolution done where E is read and never stored. E stays
 * fp32 between the convolution and the Route (the composition rounds it to bf16). The heavy
 * kernels are channel walkers: a thread owns VEC channels (4; 2 or 1 where head_dim or the
 * alignment of a pointer asks) of a block's chunk of ROUTE_CONV_CHUNK channels, keeps the
 * taps and the last rows of its source in registers and walks consecutive tokens, so that a
 * pass reads each source row once and the taps once. The Route's sums over a head and over
 * the row cut the work in passes:
 *   forward   1. dots, per (source, chunk, token range): <E, E> and <q*g, E> per token and
 *                (head, chunk) piece of the row, into the workspace;
 *             2. weights, a warp a token: the pieces added in order, r = rsqrt(<E,E>/d + eps),
 *                z = r <q*g, E>, the depth softmax -> weights and rstd;
 *             3. mix, per (chunk, 8-token tile): out = sum_n a_n E_n, E convolved again.
 *   backward  1. dots with dout: <dout, E> and <q*g, E> per piece;
 *             2. a warp a token: the softmax backward dz and the key-norm term
 *                e = r^2 (r sum_h dz <q*g, E>_h) / d (as route_backward_cuda.cu), kept as
 *                (a, r dz) and e;
 *             3. per (source, chunk, token range), walking the tokens backwards with a
 *                cp.async ring: dE = a dout + r dz q g - e E, ds[t] += sum_tau taps[tau]
 *                dE[t + tau] (the last k dE in registers), per-block sums of
 *                dtaps[tau] = sum_t dE[t] s[t - tau] and S = sum_t r dz E;
 *             4. those partials added in range order: dtaps +=, dq += g S, dg += q S.
 * Deterministic: fixed partitions and orders, no atomics. With identity taps (tap 0 = 1, the
 * rest 0) E is the source exactly and no sum depends on the kernel size: streams of kernel
 * sizes 1, 2, 4, 8 give the same bits (so MSAR's mix at init returns the stream), though not
 * cuda_route_forward's bits (other summation orders).
 * Limits: the Route's (out must not alias a source), 1 <= kernel_size <=
 * CUDA_ROUTE_CONV_MAX_KERNEL, and the dsources must not alias one another (blocks of
 * different sources write them at the same time).
 *
 * How fast should the stream route be. Benchmark (route_bench.cu): the 64 MSAR sites of the
 * 8B graft, d 4096, H 8, 2 x 4096 tokens, site j over N = j/8 + 2 sources (null and
 * b_0 .. b_{j/8}: sum N = 352, 288 of them convolved), m = 4 streams of kernel sizes
 * 1, 2, 4, 8, each site and stream forward and backward; S = 67.1 MB as above. DRAM bytes
 * per site and stream:
 *   composition  forward   conv (N-1)(read + write), Route N + 1               (3N - 1) S
 *                backward  conv again 2(N-1), dE zeroed N-1, Route backward 3N + 1,
 *                          conv backward 5(N-1) (dE, dx read and written; dE, x)  (11N - 7) S
 *   fused        forward   dots N, mix N + out 1                                (2N + 1) S
 *                backward  dots N + dout 1, walker N + dout 1 + ds 2N           (4N + 2) S
 *   floor        each input once, each output once                (N + 1) S + (3N + 1) S
 * All 64 sites x 4 streams: composition 17664 S = 1185 GB (276 ms at 4.3 TB/s); fused
 * 9216 S = 618 GB (144 ms: forward 48 ms, backward 96 ms); floor 6144 S = 412 GB (96 ms).
 * Besides DRAM: the mix re-reads k - 1 rows of halo per 8-token tile from L2, and the N
 * source blocks of a walker share each dout row through L2. Arithmetic: the convolution costs
 * 2k fp32 flops per element each time E is formed (forward twice, backward twice, plus 4k
 * for ds and dtaps): ~3 TFLOP for the microbatch, 46 ms at the fp32 rate (67 TFLOP/s), most
 * of it in the k = 8 stream (1.4 TFLOP, 20 ms against its 36 ms of DRAM time): memory-bound,
 * the k = 8 stream nearest the arithmetic limit. The next lever is the forward's second read
 * (a single pass with E kept on chip, as cuda_route_forward keeps its rows: 2N + 1 -> N + 1).
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_CUDA_H
#define FATHOM_KERNELS_CUDA_ROUTE_CUDA_H

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels_cuda.h" /* CudaGateAdd */
#include "runtime/backend.h"           /* GradMode */

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    CUDA_ROUTE_MAX_SOURCES = 65, /* 2L + 1 sites' worth for L = 32 at full granularity */
    CUDA_ROUTE_MAX_HEADS = 32,
    CUDA_ROUTE_MAX_WIDTH = 8192, /* 16 channels a thread, 512 threads a block */
    CUDA_STREAM_MAX_STREAMS = 16,
    CUDA_ROUTE_CONV_MAX_KERNEL = 8, /* residual.stream_kernels: DESIGN 2.2's 1, 2, 4, 8 */
};

/* ---- Route (backend.h route_forward / route_backward) ---- */

/* out [tokens, d] = Route(sources) (replace, base == NULL) or base + alpha * Route(sources)
 * (delta; alpha: fp32 [1] in device memory, read by the kernel, so no host copy and no
 * synchronisation); weights [N, tokens, heads] and rstd [N, tokens] saved in fp32. */
void cuda_route_forward(bf16 *out, float *weights, float *rstd, const bf16 *const *sources,
                        int n_sources, const bf16 *query, const bf16 *key_norm,
                        const bf16 *base, const float *alpha, int tokens, int d, int heads,
                        float eps, cudaStream_t stream);

/* cuda_route_forward, and lse [tokens, heads] = log sum_n e^(z[n,t,h]) (NULL: not written):
 * the softmax statistics a later merge needs (route_block_cuda.cu's fallback). */
void route_forward_lse(bf16 *out, float *weights, float *rstd, float *lse,
                       const bf16 *const *sources, int n_sources, const bf16 *query,
                       const bf16 *key_norm, const bf16 *base, const float *alpha, int tokens,
                       int d, int heads, float eps, cudaStream_t stream);

/* Floats of the workspace cuda_route_backward needs (it replaces the op's `scratch`). */
size_t cuda_route_backward_workspace_floats(int tokens, int d);

/* dsources[n] += (bf16; NULL entries skipped), dquery += , dkey_norm += (fp32 [d]),
 * *dalpha += (fp32, delta form only: alpha != NULL, a device pointer to fp32 [1], the mix
 * scale; NULL: the replace form, scale 1). Two launches: the per-token kernel, then the
 * fixed-order reduction of its per-block partials. */
void cuda_route_backward(bf16 *const *dsources, float *dquery, float *dkey_norm, float *dalpha,
                         const bf16 *dout, const bf16 *const *sources, int n_sources,
                         const float *weights, const float *rstd, const bf16 *query,
                         const bf16 *key_norm, const float *alpha, float *workspace,
                         int tokens, int d, int heads, cudaStream_t stream);

/* cuda_route_backward with the softmax centres given: means [tokens, heads] replaces
 * sum_n a scale D over these sources (NULL: computed so), for a site that also read a source
 * not listed here (route_block_cuda.cu's fallback; weights may have more rows than N). */
void route_backward_centred(bf16 *const *dsources, float *dquery, float *dkey_norm,
                            float *dalpha, const bf16 *dout, const bf16 *const *sources,
                            int n_sources, const float *weights, const float *rstd,
                            const bf16 *query, const bf16 *key_norm, const float *alpha,
                            const float *means, float *workspace, int tokens, int d, int heads,
                            cudaStream_t stream);

/* ---- MSAR stream convolution (backend.h stream_conv_*) ---- */

/* For each of `count` rows n and `streams` streams r (kernel size kernel_sizes[r]), at =
 * r * count + n: out[at][b,t,c] = sum_{tau < k_r, tau <= t} taps[at][tau,c] x[n][b,t-tau,c];
 * x[n], out[at] [B, T, d] bf16, taps[at] [k_r, d] bf16; fp32 sum from tau = 0 (identity taps
 * return x bit for bit). The arrays are HOST arrays of device pointers; no out aliases any
 * x. Up to 12 rows and 8 streams a launch, each x[n] read once for the launch's streams. */
void cuda_stream_conv_forward(bf16 *const *out, const bf16 *const *x, const bf16 *const *taps,
                              int count, int streams, const int *kernel_sizes, int B, int T,
                              int d, cudaStream_t stream);

size_t cuda_stream_conv_backward_workspace_floats(int count, int streams,
                                                  const int *kernel_sizes, int B, int T, int d);

/* The backward of `streams` convolutions of the same `count` rows (a block's sources, each
 * stream r with its own taps and kernel size kernel_sizes[r]), each x[n] read once for all:
 *   dx[n] += sum_r conv_r^T dout[r * count + n]     (bf16, one rounding; dx NULL skips it)
 *   dtaps[r * count + n] += ...                      (fp32 [kernel_sizes[r], d])
 * dout, taps and dtaps are [streams][count]; no dx[n] aliases another row's dx or any dout.
 * Up to 12 rows and 8 streams a launch (more: launches in turn). The workspace serves one
 * launch at a time (stream_conv_backward_cuda.cu). */
void cuda_stream_conv_backward(bf16 *const *dx, float *const *dtaps, const bf16 *const *dout,
                               const bf16 *const *x, const bf16 *const *taps, int count,
                               int streams, const int *kernel_sizes, int B, int T, int d,
                               float *workspace, cudaStream_t stream);

/* ---- MSAR mix (backend.h stream_mix_*) ---- */

/* out [tokens, d] bf16 = sum_r w_r o_r; gates w and rstd [tokens, m] fp32 saved. The gate
 * is sigmoid computed in double and rounded once, as on the cpu. */
void cuda_stream_mix_forward(bf16 *out, float *gates, float *rstd, const bf16 *const *streams,
                             int m, const float *mix_bias, const bf16 *mix_proj, int tokens,
                             int d, float eps, cudaStream_t stream);
/* cuda_stream_mix_forward into `mixed`, then cuda_add_scaled_rmsnorm_forward (x, out, rstd,
 * base, the mix, alpha, weight, eps, add) of it, in one pass where a warp takes a token's row
 * (d % 256 == 0, d <= 1280, 16-byte aligned; stream_mix_norm_cuda.cu): runtime/backend.h
 * stream_mix_rmsnorm_forward. The bits of the two ops; `mixed` [tokens, d] is scratch, written
 * only where the two ops run apart. */
void cuda_stream_mix_rmsnorm_forward(bf16 *x, bf16 *out, float *rstd, bf16 *mixed,
                                     float *gates, float *mix_rstd, const bf16 *const *streams,
                                     int m, const float *mix_bias, const bf16 *mix_proj,
                                     float mix_eps, const bf16 *base, const float *alpha,
                                     const bf16 *weight, int tokens, int d, float eps,
                                     const CudaGateAdd *add, cudaStream_t stream);

size_t cuda_stream_mix_backward_workspace_floats(int m, int tokens, int d);

/* For each stream given (streams[r] not NULL): dstreams[r] = or += (bf16; a NULL dstreams[r]
 * is not written), dmix_bias[r] +=, dmix_proj[r] += (fp32); with alpha (device [1]) dout is
 * d x of x = p + alpha * out and *dalpha += the streams' share of sum < dout, out >. */
void cuda_stream_mix_backward(bf16 *const *dstreams, GradMode dstreams_mode, float *dmix_bias,
                              float *dmix_proj, float *dalpha, const bf16 *dout,
                              const bf16 *const *streams, int m, const float *gates,
                              const float *rstd, const float *mix_bias, const bf16 *mix_proj,
                              const float *alpha, int tokens, int d, float *workspace,
                              cudaStream_t stream);

/* ---- MSAR stream route (backend.h route_conv_*) ---- */

/* Floats of the workspace cuda_route_conv_forward needs (the per-piece sums). */
size_t cuda_route_conv_forward_workspace_floats(int n_sources, int tokens, int d, int heads);

/* out [B*T, d] bf16 = Route(E_0 .. E_{N-1}), E_k = taps[k] * s_k (taps[k] [kernel_size, d]
 * bf16, NULL: E_k = s_k); weights [N, B*T, heads] and rstd [N, B*T] fp32, of E. Three
 * launches (dots, weights, mix). */
void cuda_route_conv_forward(bf16 *out, float *weights, float *rstd,
                             const bf16 *const *sources, const bf16 *const *taps, int n_sources,
                             int kernel_size, const bf16 *query, const bf16 *key_norm, int B,
                             int T, int d, int heads, float eps, float *workspace,
                             cudaStream_t stream);

/* out = sum_k weights[k] E_k from the weights cuda_route_conv_forward saved: its mix launch
 * alone, so bit for bit its out. */
void cuda_route_conv_mix(bf16 *out, const float *weights, const bf16 *const *sources,
                         const bf16 *const *taps, int n_sources, int kernel_size, int B, int T,
                         int d, int heads, cudaStream_t stream);

/* Floats of the workspace cuda_route_conv_backward needs (it replaces the op's `scratch`). */
size_t cuda_route_conv_backward_workspace_floats(int n_sources, int kernel_size, int tokens,
                                                 int d, int heads);

/* dsources[k] += (bf16; NULL entries skipped), dtaps[k] += (fp32 [kernel_size, d]; NULL
 * entries, and those of NULL taps, skipped), dquery += , dkey_norm += (fp32 [d]). Four
 * launches (dots, score gradients, walker, reduction). */
void cuda_route_conv_backward(bf16 *const *dsources, float *const *dtaps, float *dquery,
                              float *dkey_norm, const bf16 *dout, const bf16 *const *sources,
                              const bf16 *const *taps, int n_sources, int kernel_size,
                              const float *weights, const float *rstd, const bf16 *query,
                              const bf16 *key_norm, int B, int T, int d, int heads,
                              float *workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
