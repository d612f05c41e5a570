/* runtime/metrics.c — see metrics.h for the keys, units and the console format. */
#include "runtime/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/resource.h>

#include "runtime/error.h"

struct MetricsLog {
    FILE *file;
    char path[4096];
};

/* A fresh run in a run_dir that already holds a metrics log: the log is kept, renamed to the
 * first free metrics.jsonl.N, and the run says so; nothing is wiped. */
static void keep_earlier_log(const char *path)
{
    struct stat status;
    if (stat(path, &status) != 0 || status.st_size == 0)
        return;
    char kept[sizeof ((MetricsLog *)0)->path + 16];
    for (int n = 1; n < 1000; n++) {
        snprintf(kept, sizeof kept, "%s.%d", path, n);
        if (access(kept, F_OK) != 0) {
            if (rename(path, kept) != 0)
                fatal(EXIT_DATA, "cannot keep the earlier %s as %s: %s", path, kept,
                      strerror(errno));
            printf("fathom: %s held an earlier run's metrics; kept as %s\n", path, kept);
            return;
        }
    }
    fatal(EXIT_DATA, "%s: 999 earlier metrics logs are kept already; move them away", path);
}

MetricsLog *metrics_open(const char *run_dir, bool fresh)
{
    MetricsLog *log = xcalloc(1, sizeof *log);
    int length = snprintf(log->path, sizeof log->path, "%s/metrics.jsonl", run_dir);
    if (length < 0 || (size_t)length >= sizeof log->path)
        fatal(EXIT_CONFIG, "run_dir '%s' is too long for a path", run_dir);
    if (fresh)
        keep_earlier_log(log->path);
    /* append by default: a resumed run keeps the lines of the run it continues */
    log->file = fopen(log->path, fresh ? "w" : "a");
    if (!log->file)
        fatal(EXIT_DATA, "cannot open %s for writing: %s", log->path, strerror(errno));
    return log;
}

/* The "step" of one metrics line; -1 when it has none. */
static long long metrics_line_step(const char *line)
{
    const char *at = strstr(line, "\"step\":");
    return at ? strtoll(at + 7, NULL, 10) : -1;
}

MetricsLog *metrics_open_resumed(const char *run_dir, long long last_step)
{
    MetricsLog *log = metrics_open(run_dir, false);
    /* Lines past the checkpoint belong to steps the resumed run takes again: rewrite the
     * file without them (through a temporary file, so a crash here loses nothing). */
    fclose(log->file);
    FILE *old = fopen(log->path, "r");
    if (!old)
        fatal(EXIT_DATA, "cannot read %s: %s", log->path, strerror(errno));
    char temporary[sizeof log->path + 8];
    snprintf(temporary, sizeof temporary, "%s.tmp", log->path);
    FILE *kept = fopen(temporary, "w");
    if (!kept)
        fatal(EXIT_DATA, "cannot write %s: %s", temporary, strerror(errno));
    char *line = NULL;
    size_t capacity = 0;
    while (getline(&line, &capacity, old) > 0)
        if (metrics_line_step(line) <= last_step)
            fputs(line, kept);
    free(line);
    fclose(old);
    if (fclose(kept) || rename(temporary, log->path))
        fatal(EXIT_DATA, "cannot replace %s: %s", log->path, strerror(errno));
    log->file = fopen(log->path, "a");
    if (!log->file)
        fatal(EXIT_DATA, "cannot open %s for writing: %s", log->path, strerror(errno));
    return log;
}

void metrics_close(MetricsLog *log)
{
    if (!log)
        return;
    if (fclose(log->file) != 0)
        fatal(EXIT_DATA, "cannot close %s: %s", log->path, strerror(errno));
    free(log);
}

/* JSON has no NaN or Infinity: a non-finite value becomes null. %.9g keeps every digit of
 * an fp32 value and prints valid JSON numbers (1e-05, 2.5, 1e+20). */
static void json_write_number(FILE *file, const char *key, double value, bool first)
{
    fprintf(file, "%s\"%s\":", first ? "" : ",", key);
    if (isfinite(value))
        fprintf(file, "%.9g", value);
    else
        fputs("null", file);
}

static void json_write_integer(FILE *file, const char *key, int64_t value, bool first)
{
    fprintf(file, "%s\"%s\":%" PRId64, first ? "" : ",", key, value);
}

static void json_write_comm(FILE *file, const MetricsComm *comm)
{
    fputc('{', file);
    json_write_integer(file, "pp_send_bytes", comm->pp_send_bytes, true);
    json_write_integer(file, "pp_recv_bytes", comm->pp_recv_bytes, false);
    json_write_integer(file, "pp_summary_bytes", comm->pp_summary_bytes, false);
    json_write_integer(file, "pp_summary_bytes_uncached", comm->pp_summary_bytes_uncached,
                       false);
    json_write_integer(file, "fsdp_allgather_bytes", comm->fsdp_allgather_bytes, false);
    json_write_integer(file, "fsdp_reducescatter_bytes", comm->fsdp_reducescatter_bytes,
                       false);
    json_write_integer(file, "allreduce_bytes", comm->allreduce_bytes, false);
    json_write_number(file, "fsdp_allgather_ms", comm->fsdp_allgather_ms, false);
    json_write_number(file, "fsdp_allgather_exposed_ms", comm->fsdp_allgather_exposed_ms,
                      false);
    json_write_number(file, "fsdp_reducescatter_ms", comm->fsdp_reducescatter_ms, false);
    json_write_number(file, "fsdp_reducescatter_exposed_ms",
                      comm->fsdp_reducescatter_exposed_ms, false);
    json_write_number(file, "pp_send_ms", comm->pp_send_ms, false);
    json_write_number(file, "pp_send_exposed_ms", comm->pp_send_exposed_ms, false);
    json_write_number(file, "pp_recv_ms", comm->pp_recv_ms, false);
    json_write_number(file, "pp_recv_exposed_ms", comm->pp_recv_exposed_ms, false);
    fputc('}', file);
}

/* Ends the line and pushes it to the file, so a killed run leaves only whole lines. */
static void metrics_finish_line(MetricsLog *log)
{
    fputs("}\n", log->file);
    if (ferror(log->file) || fflush(log->file) != 0)
        fatal(EXIT_DATA, "cannot write %s: %s", log->path, strerror(errno));
}

void metrics_write_step(MetricsLog *log, const MetricsStep *m)
{
    FILE *file = log->file;
    fputc('{', file);
    json_write_integer(file, "step", m->step, true);
    json_write_number(file, "loss", m->loss, false);
    json_write_number(file, "ce", m->ce, false);
    json_write_number(file, "zloss", m->zloss, false);
    json_write_number(file, "grad_norm", m->grad_norm, false);
    json_write_number(file, "lr", m->lr, false);
    json_write_integer(file, "tokens", m->tokens, false);
    json_write_number(file, "tokens_per_s", m->tokens_per_s, false);
    json_write_number(file, "tokens_per_s_per_device", m->tokens_per_s_per_device, false);
    json_write_number(file, "tflops_per_device", m->tflops_per_device, false);
    json_write_number(file, "mfu", m->mfu, false);
    json_write_number(file, "mem_gib", m->mem_gib, false);
    json_write_integer(file, "skipped", m->skipped, false);
    fputs(",\"comm\":[", file);
    for (int stage = 0; stage < m->n_stages; stage++) {
        if (stage > 0)
            fputc(',', file);
        json_write_comm(file, &m->comm[stage]);
    }
    fputc(']', file);
    metrics_finish_line(log);
}

void metrics_write_eval(MetricsLog *log, int step, double val_loss)
{
    FILE *file = log->file;
    fputc('{', file);
    json_write_integer(file, "step", step, true);
    json_write_number(file, "val_loss", val_loss, false);
    json_write_number(file, "val_ppl", exp(val_loss), false);
    metrics_finish_line(log);
}

/* Writes `value` with the largest unit that keeps the printed number below 1000 (the
 * thresholds look at the value as it will be rounded, so 999.97 shows as 1.0k, not 1000.0).
 * units[0] is printed with no decimals, the others with one. */
static void format_scaled(char *out, size_t capacity, double value, const char *const *units,
                          int n_units, const char *separator)
{
    int unit = 0;
    double scaled = value;
    while (unit + 1 < n_units && fabs(scaled) >= (unit == 0 ? 999.5 : 999.95)) {
        scaled /= 1000.0;
        unit++;
    }
    snprintf(out, capacity, unit == 0 ? "%.0f%s%s" : "%.1f%s%s", scaled, separator,
             units[unit]);
}

int metrics_format_console(const MetricsStep *m, int total_steps, char *buffer,
                           size_t capacity)
{
    static const char *const rate_units[] = {"", "k", "M", "G"};
    static const char *const byte_units[] = {"B", "kB", "MB", "GB", "TB"};
    char rate[32], bytes[32];
    double pp_bytes = 0;
    for (int stage = 0; stage < m->n_stages; stage++)
        pp_bytes += (double)m->comm[stage].pp_send_bytes;
    format_scaled(rate, sizeof rate, m->tokens_per_s, rate_units, 4, "");
    format_scaled(bytes, sizeof bytes, pp_bytes, byte_units, 5, " ");
    /* MFU only where a peak is known: NaN (a cpu run) leaves it out */
    char mfu[32] = "";
    if (isfinite(m->mfu))
        snprintf(mfu, sizeof mfu, " | %.1f%% MFU", 100.0 * m->mfu);
    return snprintf(buffer, capacity,
                    "step %d/%d | loss %.3f | gnorm %.2f | lr %.1e | %s tok/s%s | "
                    "%.1f GiB | pp %s/step",
                    m->step, total_steps, m->loss, m->grad_norm, m->lr, rate, mfu,
                    m->mem_gib, bytes);
}

double metrics_flops_per_token(int64_t layer_matrix_params, int vocab, int d, int layers,
                               int seq_len, int n_heads, int head_dim)
{
    /* 6 = 2 (multiply-add) x 3 (forward, input gradient, weight gradient) per parameter;
     * attention: q.k and a.v are 2 * 2 * T * n_heads * head_dim per token forward, x3 for
     * the backward, halved because the mask is causal (DESIGN 6). */
    double matmul = 6.0 * ((double)layer_matrix_params + (double)vocab * (double)d);
    double attention = 6.0 * (double)layers * (double)seq_len * (double)n_heads *
                       (double)head_dim;
    return matmul + attention;
}

void metrics_fill_throughput(MetricsStep *m, double tokens, double seconds, int devices,
                             double flops_per_token)
{
    m->tokens_per_s = seconds > 0 ? tokens / seconds : NAN;
    m->tokens_per_s_per_device = m->tokens_per_s / (devices > 0 ? devices : 1);
    m->tflops_per_device = flops_per_token * m->tokens_per_s_per_device / 1e12;
    m->mfu = m->tflops_per_device / METRICS_PEAK_TFLOPS;
}

double metrics_peak_rss_gib(void)
{
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0)
        return NAN;
    return (double)usage.ru_maxrss / (1024.0 * 1024.0); /* Linux reports KiB */
}
