/* runtime/metrics.h — metrics.jsonl, the console line and MFU (DESIGN 6).
 *
 * metrics_open() opens `<run_dir>/metrics.jsonl` for appending (a resumed run continues the
 * same file) or, with fresh = true, starts a new one: an earlier run's non-empty log is kept
 * as metrics.jsonl.N (the first free N) and the run prints where, so no log is wiped. Each
 * metrics_write_step / metrics_write_eval appends one JSON object on one line and flushes it,
 * so a killed run leaves whole lines. Only rank 0 writes (the caller's choice). A step line
 * has exactly the keys
 *   step loss ce zloss grad_norm lr tokens tokens_per_s tokens_per_s_per_device
 *   tflops_per_device mfu mem_gib skipped comm
 * where comm is an array with one object per pipeline stage:
 *   {pp_send_bytes, pp_recv_bytes, pp_summary_bytes, pp_summary_bytes_uncached,
 *    fsdp_allgather_bytes, fsdp_reducescatter_bytes, allreduce_bytes,
 *    fsdp_allgather_ms, fsdp_allgather_exposed_ms, fsdp_reducescatter_ms,
 *    fsdp_reducescatter_exposed_ms, pp_send_ms, pp_send_exposed_ms, pp_recv_ms,
 *    pp_recv_exposed_ms}
 * An eval line has exactly step, val_loss, val_ppl (= exp(val_loss)). A number that is not
 * finite (NaN loss, infinite norm) is written as null, so every line stays valid JSON.
 *
 * Units: tokens = tokens consumed by the run so far (all ranks); tokens_per_s over the
 * interval since the previous line; mfu is a fraction (0.513, shown as 51.3% on the console;
 * NaN, written null and left off the console, where no peak is known: a cpu run);
 * mem_gib in GiB (2^30 bytes); comm counters are bytes per training step, per stage, summed
 * over its ranks; comm times are milliseconds per training step of one of the stage's ranks
 * (their mean): *_ms the time the communication ran, *_exposed_ms the part of it the compute
 * stream waited for (the rest overlapped compute; runtime/device_comm.h, "timing").
 *
 * MFU: flops per token = 6 * (layer_matrix_params + vocab * d) + 6 * layers * seq_len *
 * n_heads * head_dim (causal attention counted once); tflops_per_device = flops per token *
 * tokens_per_s_per_device / 1e12; mfu = tflops_per_device / METRICS_PEAK_TFLOPS.
 *
 * The console line (metrics_format_console), for example:
 *   step 120/1000 | loss 2.914 | gnorm 0.41 | lr 3.0e-04 | 48.2k tok/s | 51.3% MFU | 71.2 GiB |
 *     pp 12.4 MB/step
 * tok/s plain below 1000, then k, M, G (one decimal); pp = the sum over stages of
 * pp_send_bytes (each byte sent is received once), in B, kB, MB, GB, TB (powers of 1000).
 */
#ifndef FATHOM_RUNTIME_METRICS_H
#define FATHOM_RUNTIME_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Dense bf16 peak of one H100 / H200 SXM, TFLOP/s: the denominator of MFU (DESIGN 6). */
#define METRICS_PEAK_TFLOPS 989.0

/* What one pipeline stage's communication did during one training step. */
typedef struct {
    /* bytes, summed over the stage's ranks */
    int64_t pp_send_bytes, pp_recv_bytes;
    int64_t pp_summary_bytes;           /* block summaries sent, with the cross-stage cache */
    int64_t pp_summary_bytes_uncached;  /* what the same hops would carry without it */
    int64_t fsdp_allgather_bytes, fsdp_reducescatter_bytes, allreduce_bytes;
    /* milliseconds, a rank's (the mean over the stage's ranks; runtime/device_comm.h,
     * "timing"): how long each kind ran, and how long the compute stream waited for it */
    double fsdp_allgather_ms, fsdp_allgather_exposed_ms;
    double fsdp_reducescatter_ms, fsdp_reducescatter_exposed_ms;
    double pp_send_ms, pp_send_exposed_ms, pp_recv_ms, pp_recv_exposed_ms;
} MetricsComm;

typedef struct {
    int step;
    double loss, ce, zloss, grad_norm, lr;
    int64_t tokens;
    double tokens_per_s, tokens_per_s_per_device, tflops_per_device, mfu;
    double mem_gib;            /* peak memory; cpu: metrics_peak_rss_gib(), cuda: device */
    int skipped;
    const MetricsComm *comm;   /* [n_stages], borrowed; may be NULL when n_stages == 0 */
    int n_stages;
} MetricsStep;

typedef struct MetricsLog MetricsLog;

/* Opens <run_dir>/metrics.jsonl (the directory must exist); fatal(EXIT_DATA, ...) naming the
 * file when it cannot be opened. */
MetricsLog *metrics_open(const char *run_dir, bool fresh);
/* Opens it for a run resumed at `last_step`: lines of later steps (written after that
 * checkpoint by the run that stopped) are dropped first, so every step appears once. */
MetricsLog *metrics_open_resumed(const char *run_dir, long long last_step);
void metrics_write_step(MetricsLog *log, const MetricsStep *metrics);
void metrics_write_eval(MetricsLog *log, int step, double val_loss);
void metrics_close(MetricsLog *log);

/* Writes the console line (no newline) into buffer; returns what snprintf returns. */
int metrics_format_console(const MetricsStep *metrics, int total_steps, char *buffer,
                           size_t capacity);

double metrics_flops_per_token(int64_t layer_matrix_params, int vocab, int d, int layers,
                               int seq_len, int n_heads, int head_dim);

/* Fills tokens_per_s, tokens_per_s_per_device, tflops_per_device and mfu from `tokens`
 * processed by all `devices` in `seconds`. seconds <= 0 gives NaN (written as null). */
void metrics_fill_throughput(MetricsStep *metrics, double tokens, double seconds, int devices,
                             double flops_per_token);

/* Peak resident set of this process in GiB (getrusage ru_maxrss); NaN if unavailable. */
double metrics_peak_rss_gib(void);

#endif
