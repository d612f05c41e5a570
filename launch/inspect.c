/* launch/inspect.c — `fathom inspect --comm RUN_DIR` and the dispatch of `fathom inspect DIR`
 * (see inspect.h). */
#include "launch/inspect.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/inspect_checkpoint.h"
#include "launch/train_comm.h"
#include "pipeline/traffic.h"
#include "runtime/config.h"
#include "runtime/error.h"

enum { TIME_FIELDS = 8 };
static const char *const time_keys[TIME_FIELDS] = {
    "fsdp_allgather_ms", "fsdp_allgather_exposed_ms", "fsdp_reducescatter_ms",
    "fsdp_reducescatter_exposed_ms", "pp_send_ms", "pp_send_exposed_ms", "pp_recv_ms",
    "pp_recv_exposed_ms",
};

/* What one stage measured a step, from its object in metrics.jsonl's comm array: bytes, and
 * the times of runtime/metrics.h (NAN where a line has none: logs written before them). */
typedef struct {
    long long send, recv, summary, summary_uncached, allgather, reducescatter, allreduce;
    double times[TIME_FIELDS];
} StageBytes;

static const char usage[] = "usage: fathom inspect DIR [--json] | fathom inspect --comm RUN_DIR";

/* The number after "key": inside [object, end), or fatal naming the file. */
static long long field_in(const char *object, const char *end, const char *key,
                          const char *path)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(object, pattern);
    if (!at || at >= end)
        fatal(EXIT_DATA, "%s: a comm object has no %s", path, key);
    return atoll(at + strlen(pattern));
}

/* The number after "key": inside [object, end); NAN where it is absent or null. */
static double time_in(const char *object, const char *end, const char *key)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(object, pattern);
    if (!at || at >= end)
        return NAN;
    char *after;
    const double value = strtod(at + strlen(pattern), &after);
    return after == at + strlen(pattern) ? NAN : value;
}

/* The last step line of metrics.jsonl that carries `comm`: its step, its tokens_per_s
 * (NAN if null) and its stages. */
static int read_measured(const char *run_dir, StageBytes *stages, int capacity, int *step,
                         double *tokens_per_s)
{
    char path[CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *file = fopen(path, "r");
    if (!file)
        fatal(EXIT_DATA, "cannot open %s: is %s a run directory of fathom train?", path,
              run_dir);
    size_t capacity_line = 1 << 16;
    char *line = xmalloc(capacity_line), *last = xcalloc(capacity_line, 1);
    while (fgets(line, (int)capacity_line, file))
        if (strstr(line, "\"comm\":["))
            strcpy(last, line);
    fclose(file);
    const char *at = strstr(last, "\"comm\":[");
    if (!at)
        fatal(EXIT_DATA, "%s has no step line with comm bytes yet", path);
    *step = atoi(strstr(last, "\"step\":") + 7);
    *tokens_per_s = time_in(last, at, "tokens_per_s");
    int n = 0;
    for (const char *object = strchr(at, '{'); object && n < capacity;
         object = strchr(object + 1, '{')) {
        const char *end = strchr(object, '}');
        if (!end)
            fatal(EXIT_DATA, "%s: a truncated comm object", path);
        stages[n] = (StageBytes){
            .send = field_in(object, end, "pp_send_bytes", path),
            .recv = field_in(object, end, "pp_recv_bytes", path),
            .summary = field_in(object, end, "pp_summary_bytes", path),
            .summary_uncached = field_in(object, end, "pp_summary_bytes_uncached", path),
            .allgather = field_in(object, end, "fsdp_allgather_bytes", path),
            .reducescatter = field_in(object, end, "fsdp_reducescatter_bytes", path),
            .allreduce = field_in(object, end, "allreduce_bytes", path),
        };
        for (int k = 0; k < TIME_FIELDS; k++)
            stages[n].times[k] = time_in(object, end, time_keys[k]);
        n++;
        if (end[1] == ']')
            break;
    }
    free(line);
    free(last);
    return n;
}

static void print_bytes(long long bytes)
{
    if (bytes >= 1000000)
        printf(" %11.2f MB", bytes / 1e6);
    else
        printf(" %11lld  B", bytes);
}

/* The communication times of the last logged step, where the log has them, and each
 * stage's exposed share of the step (step_ms: from the line's tokens_per_s; NAN unknown). */
static void print_times(const StageBytes *measured, int stages, double step_ms)
{
    double *times = xcalloc((size_t)stages * TIME_FIELDS, sizeof *times);
    for (int stage = 0; stage < stages; stage++)
        for (int k = 0; k < TIME_FIELDS; k++) {
            if (isnan(measured[stage].times[k])) {
                free(times);
                return;
            }
            times[stage * TIME_FIELDS + k] = measured[stage].times[k];
        }
    printf("\ncommunication time per step, ms (a rank's, the mean over the stage's ranks; "
           "exposed: the compute stream waited for it)\n");
    train_comm_print_table(times, stages, step_ms);
    free(times);
}

int inspect_main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[2], "--comm")) {
        const char *dir = NULL;
        bool json = false;
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "--json"))
                json = true;
            else if (argv[i][0] == '-' || dir)
                fatal(EXIT_CONFIG, "inspect: unexpected argument '%s'\n%s", argv[i], usage);
            else
                dir = argv[i];
        }
        if (!dir)
            fatal(EXIT_CONFIG, "inspect: which directory?\n%s", usage);
        return inspect_checkpoint_main(dir, json);
    }
    if (argc != 4)
        fatal(EXIT_CONFIG, "%s", usage);
    const char *run_dir = argv[3];
    char path[CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.yaml", run_dir);
    Config config;
    config_load(&config, path, NULL, 0, CONFIG_ANY_WORLD);

    const int P = config.parallel.pp;
    StageBytes *measured = xcalloc((size_t)P, sizeof *measured);
    int step = 0;
    double tokens_per_s = NAN;
    const int n = read_measured(run_dir, measured, P, &step, &tokens_per_s);
    if (n != P)
        fatal(EXIT_DATA, "%s/metrics.jsonl has %d comm objects, parallel.pp = %d", run_dir, n,
              P);
    /* DESIGN 3 precision: payloads are activations, fp32 on the cpu and bf16 on cuda */
    const size_t element = config.device == DEVICE_CUDA ? 2 : 4;
    const int dp = config.parallel.dp, M = config_microbatches_per_rank(&config);
    RankTraffic *predicted = xcalloc((size_t)P, sizeof *predicted);
    for (int stage = 0; stage < P; stage++)
        predicted[stage] = traffic_predict_rank(&config, stage, element);

    printf("pp bytes per step at step %d of %s (parallel.pp %d, dp %d, virtual_stages %d, "
           "%d microbatches a rank)\n", step, run_dir, P, dp, config.parallel.virtual_stages, M);
    printf("%5s %14s %14s %14s %14s %14s %14s\n", "stage", "sent", "predicted", "summaries",
           "predicted", "uncached", "predicted");
    int mismatches = 0;
    for (int stage = 0; stage < P; stage++) {
        /* a stage's measured bytes are summed over its dp ranks */
        const long long expected[3] = {(long long)predicted[stage].pp_send * dp,
                                       (long long)predicted[stage].pp_summary * dp,
                                       (long long)predicted[stage].pp_summary_uncached * dp};
        const long long got[3] = {measured[stage].send, measured[stage].summary,
                                  measured[stage].summary_uncached};
        printf("%5d", stage);
        for (int k = 0; k < 3; k++) {
            print_bytes(got[k]);
            print_bytes(expected[k]);
            mismatches += got[k] != expected[k];
        }
        printf("\n");
    }
    printf("\nfsdp bytes per step (each stage's dp ranks together; allreduce: measured only)\n");
    printf("%5s %14s %14s %14s %14s %14s\n", "stage", "all-gather", "predicted",
           "reduce-scat.", "predicted", "allreduce");
    for (int stage = 0; stage < P; stage++) {
        const long long expected[2] = {(long long)predicted[stage].fsdp_allgather * dp,
                                       (long long)predicted[stage].fsdp_reducescatter * dp};
        const long long got[2] = {measured[stage].allgather, measured[stage].reducescatter};
        printf("%5d", stage);
        for (int k = 0; k < 2; k++) {
            print_bytes(got[k]);
            print_bytes(expected[k]);
            mismatches += got[k] != expected[k];
        }
        print_bytes(measured[stage].allreduce);
        printf("\n");
    }
    printf(mismatches ? "%d measured values differ from the prediction\n"
                      : "every measured value equals the prediction\n", mismatches);
    /* a step consumes global_batch_size sequences over all ranks (DESIGN 6) */
    const double step_tokens = (double)config.train.global_batch_size * config.train.seq_len;
    print_times(measured, P, tokens_per_s > 0 ? 1e3 * step_tokens / tokens_per_s : NAN);
    free(predicted);
    free(measured);
    return mismatches ? EXIT_DATA : EXIT_DONE;
}
