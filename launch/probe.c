/* launch/probe.c — `fathom probe` (see probe.h). */
#include "launch/probe.h"

#include "launch/inference.h"
#include "model/model.h"
#include "model/params.h"
#include "runtime/data.h"
#include "runtime/error.h"
#include "runtime/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *checkpoint, *weights, *data, *json_path;
    long long samples; /* -1: one microbatch */
    int slices;
} ProbeArguments;

static const char probe_usage[] =
    "usage: fathom probe --checkpoint DIR [--weights ema|raw] [--data SPEC] [--samples N] "
    "[--slices S] [--json OUT.json]";

static long long parse_count(const char *option, const char *value)
{
    char *end;
    long long count = strtoll(value, &end, 10);
    if (*end || count < 1)
        fatal(EXIT_CONFIG, "probe: %s must be a whole number >= 1, not '%s'", option, value);
    return count;
}

static ProbeArguments parse_arguments(int argc, char **argv)
{
    ProbeArguments arguments = {.samples = -1, .slices = 8};
    for (int i = 2; i < argc; i++) {
        const char *option = argv[i];
        if (i + 1 >= argc)
            fatal(EXIT_CONFIG, "probe: %s needs a value\n%s", option, probe_usage);
        const char *value = argv[++i];
        if (!strcmp(option, "--checkpoint"))
            arguments.checkpoint = value;
        else if (!strcmp(option, "--weights")) {
            if (strcmp(value, "ema") && strcmp(value, "raw"))
                fatal(EXIT_CONFIG, "probe: --weights must be ema or raw, not '%s'", value);
            arguments.weights = value;
        } else if (!strcmp(option, "--data"))
            arguments.data = value;
        else if (!strcmp(option, "--samples"))
            arguments.samples = parse_count(option, value);
        else if (!strcmp(option, "--slices"))
            arguments.slices = (int)parse_count(option, value);
        else if (!strcmp(option, "--json"))
            arguments.json_path = value;
        else
            fatal(EXIT_CONFIG, "probe: unknown option '%s'\n%s", option, probe_usage);
    }
    if (!arguments.checkpoint)
        fatal(EXIT_CONFIG, "probe: --checkpoint is required\n%s", probe_usage);
    return arguments;
}

/* ---- the width-disagreement probe (MHAR paper) ---- */

/* softmax over n of scores[n * stride], into probabilities[n] (double) */
static void softmax_strided(double *probabilities, const double *scores, int n, int stride)
{
    double largest = -INFINITY, total = 0;
    for (int i = 0; i < n; i++)
        largest = fmax(largest, scores[i * stride]);
    for (int i = 0; i < n; i++)
        total += probabilities[i] = exp(scores[i * stride] - largest);
    for (int i = 0; i < n; i++)
        probabilities[i] /= total;
}

/* Mean over tokens and slices of KL(softmax of one slice's scores || softmax of the whole
 * query's scores), keys khat_n = key_norm * s_n * rsqrt(mean(s_n^2) + eps) (DESIGN 2.1).
 * sources: N host arrays [tokens, d]. */
static double width_disagreement(const float *const *sources, int n_sources, int tokens, int d,
                                 const float *query, const float *key_norm, int slices,
                                 float eps)
{
    int width = d / slices;
    double *slice_scores = xmalloc((size_t)n_sources * slices * sizeof(double));
    double *full_scores = xmalloc((size_t)n_sources * sizeof(double));
    double *shared = xmalloc((size_t)n_sources * sizeof(double));
    double *alone = xmalloc((size_t)n_sources * sizeof(double));
    double kl_sum = 0;
    for (int t = 0; t < tokens; t++) {
        for (int n = 0; n < n_sources; n++) {
            const float *row = sources[n] + (size_t)t * d;
            double squares = 0;
            for (int c = 0; c < d; c++)
                squares += (double)row[c] * row[c];
            double rstd = 1.0 / sqrt(squares / d + eps);
            full_scores[n] = 0;
            for (int s = 0; s < slices; s++) {
                double score = 0;
                for (int c = s * width; c < (s + 1) * width; c++)
                    score += (double)query[c] * key_norm[c] * row[c] * rstd;
                slice_scores[n * slices + s] = score;
                full_scores[n] += score;
            }
        }
        softmax_strided(shared, full_scores, n_sources, 1);
        for (int s = 0; s < slices; s++) {
            softmax_strided(alone, slice_scores + s, n_sources, slices);
            for (int n = 0; n < n_sources; n++)
                if (alone[n] > 0)
                    kl_sum += alone[n] * log(alone[n] / shared[n]);
        }
    }
    free(slice_scores);
    free(full_scores);
    free(shared);
    free(alone);
    return kl_sum / ((double)tokens * slices);
}

/* A query of the same norm as `query` in a random direction (fixed seed: reproducible). */
static void matched_random_query(float *random, const float *query, int d, uint64_t stream)
{
    double norm = 0, random_norm = 0;
    rng_fill_normal(random, (size_t)d, 0, 0.0, 1.0, 20240601, stream);
    for (int c = 0; c < d; c++) {
        norm += (double)query[c] * query[c];
        random_norm += (double)random[c] * random[c];
    }
    double scale = random_norm > 0 ? sqrt(norm / random_norm) : 0;
    for (int c = 0; c < d; c++)
        random[c] = (float)(random[c] * scale);
}

/* ---- one site ---- */

typedef struct {
    char name[PARAM_NAME_MAX];
    int sources, streams, heads;
    double *mean_weights; /* [streams, heads, sources] */
    double kl_query, kl_random; /* NaN where the probe does not apply (msar) */
} SiteReport;

static const float *param_on_host(Model *model, const char *site, const char *field,
                                  float *host)
{
    char name[PARAM_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s.%s", site, field);
    const ParamEntry *entry = param_table_require(model_param_table(model), name);
    model_backend(model)->download(host, model_params(model) + entry->offset,
                                   entry->count * sizeof(float));
    return host;
}

static void probe_site(Model *model, const Config *config, int site, int tokens, int slices,
                       SiteReport *report)
{
    const Backend *backend = model_backend(model);
    int d = config->model.d_model, heads = config->residual.heads;
    bool msar = config->residual.mode == RESIDUAL_MSAR;
    snprintf(report->name, sizeof report->name, "%s", model_site_name(model, site));
    report->sources = model_site_sources(model, site);
    report->streams = msar ? config->residual.streams : 1;
    report->heads = heads;
    int n = report->sources;

    float *weights = xmalloc((size_t)n * tokens * heads * sizeof(float));
    report->mean_weights = xcalloc((size_t)report->streams * heads * n, sizeof(double));
    for (int stream = 0; stream < report->streams; stream++) {
        model_site_weights(model, site, stream, weights);
        for (int source = 0; source < n; source++)
            for (int t = 0; t < tokens; t++)
                for (int h = 0; h < heads; h++)
                    report->mean_weights[((size_t)stream * heads + h) * n + source] +=
                        weights[((size_t)source * tokens + t) * heads + h] / tokens;
    }
    free(weights);

    report->kl_query = report->kl_random = NAN;
    if (msar)
        return; /* MSAR keys read convolved streams; the probe is defined on plain sites */
    const Activation **device_sources = xcalloc((size_t)n, sizeof *device_sources);
    float **host_sources = xcalloc((size_t)n, sizeof *host_sources);
    model_site_inputs(model, site, device_sources);
    for (int source = 0; source < n; source++) {
        host_sources[source] = xmalloc((size_t)tokens * d * sizeof(float));
        backend->activations_download(host_sources[source], device_sources[source],
                                      (size_t)tokens * d);
    }
    float *query = xmalloc((size_t)d * sizeof(float));
    float *key_norm = xmalloc((size_t)d * sizeof(float));
    float *random = xmalloc((size_t)d * sizeof(float));
    param_on_host(model, report->name, "query", query);
    param_on_host(model, report->name, "key_norm", key_norm);
    matched_random_query(random, query, d, (uint64_t)site);
    float eps = (float)config->model.norm_eps;
    const float *const *inputs = (const float *const *)host_sources;
    report->kl_query = width_disagreement(inputs, n, tokens, d, query, key_norm, slices, eps);
    report->kl_random = width_disagreement(inputs, n, tokens, d, random, key_norm, slices, eps);
    for (int source = 0; source < n; source++)
        free(host_sources[source]);
    free(host_sources);
    free(device_sources);
    free(query);
    free(key_norm);
    free(random);
}

/* ---- output ---- */

static void print_table(const SiteReport *reports, int n_sites)
{
    printf("%-30s %3s %6s %9s %9s  mean depth weights (source 0 .. N-1)\n", "site", "N",
           "s/h", "KL query", "KL rand");
    for (int i = 0; i < n_sites; i++) {
        const SiteReport *report = &reports[i];
        for (int stream = 0; stream < report->streams; stream++)
            for (int h = 0; h < report->heads; h++) {
                bool first = stream == 0 && h == 0;
                printf("%-30s %3d %3d/%-2d ", first ? report->name : "", report->sources,
                       stream, h);
                if (first && !isnan(report->kl_query))
                    printf("%9.4f %9.4f ", report->kl_query, report->kl_random);
                else
                    printf("%9s %9s ", "", "");
                const double *row =
                    report->mean_weights + ((size_t)stream * report->heads + h) * report->sources;
                for (int n = 0; n < report->sources; n++)
                    printf(" %.3f", row[n]);
                putchar('\n');
            }
    }
}

static void json_number(FILE *file, double value)
{
    if (isfinite(value))
        fprintf(file, "%.9g", value);
    else
        fputs("null", file);
}

static void write_json(const char *path, const Inference *inference, int tokens, int slices,
                       const SiteReport *reports, int n_sites)
{
    FILE *file = fopen(path, "w");
    if (!file)
        fatal(EXIT_DATA, "probe: cannot write %s", path);
    fprintf(file, "{\"checkpoint\": \"%s\", \"step\": %lld, \"weights\": \"%s\", "
            "\"tokens\": %d, \"slices\": %d, \"sites\": [", inference->step_dir,
            (long long)inference->step, inference->weights, tokens, slices);
    for (int i = 0; i < n_sites; i++) {
        const SiteReport *report = &reports[i];
        fprintf(file, "%s\n  {\"name\": \"%s\", \"sources\": %d, \"streams\": %d, "
                "\"heads\": %d, \"kl_query\": ", i ? "," : "", report->name, report->sources,
                report->streams, report->heads);
        json_number(file, report->kl_query);
        fputs(", \"kl_random\": ", file);
        json_number(file, report->kl_random);
        fputs(", \"mean_weights\": [", file);
        for (int stream = 0; stream < report->streams; stream++) {
            fprintf(file, "%s[", stream ? ", " : "");
            for (int h = 0; h < report->heads; h++) {
                fprintf(file, "%s[", h ? ", " : "");
                const double *row = report->mean_weights +
                                    ((size_t)stream * report->heads + h) * report->sources;
                for (int n = 0; n < report->sources; n++) {
                    if (n)
                        fputs(", ", file);
                    json_number(file, row[n]);
                }
                fputc(']', file);
            }
            fputc(']', file);
        }
        fputs("]}", file);
    }
    fputs("\n]}\n", file);
    if (fclose(file))
        fatal(EXIT_DATA, "probe: cannot write %s", path);
}

int probe_main(int argc, char **argv)
{
    ProbeArguments arguments = parse_arguments(argc, argv);
    Inference inference;
    inference_open(&inference, arguments.checkpoint, arguments.weights);
    const Config *config = &inference.config;
    if (config->residual.mode == RESIDUAL_STANDARD)
        fatal(EXIT_CONFIG, "probe: %s is a standard-residual model (residual.mode standard): "
              "it has no routing sites", inference.step_dir);
    if (config->model.d_model % arguments.slices)
        fatal(EXIT_CONFIG, "probe: --slices %d must divide model.d_model = %d",
              arguments.slices, config->model.d_model);

    /* one forward over the batch: the sites keep their weights and inputs (each site routed
     * alone: msar's two-phase walk keeps no per-site depth weights) */
    model_route_sites_alone(inference.model, true);
    DataSet *data = data_open_eval(config, arguments.data);
    int T = config->train.seq_len;
    long long batch = arguments.samples > 0 ? arguments.samples : config->train.microbatch_size;
    if (batch > config->train.microbatch_size)
        fatal(EXIT_CONFIG, "probe: --samples %lld exceeds train.microbatch_size = %d (one "
              "forward pass)", batch, config->train.microbatch_size);
    if ((uint64_t)batch > data_window_count(data))
        batch = (long long)data_window_count(data);
    uint32_t *window = xmalloc((size_t)(T + 1) * sizeof(uint32_t));
    uint32_t *inputs = xmalloc((size_t)batch * T * sizeof(uint32_t));
    uint32_t *targets = xmalloc((size_t)batch * T * sizeof(uint32_t));
    for (long long row = 0; row < batch; row++) {
        data_read_window(data, (uint64_t)row, window);
        memcpy(inputs + row * T, window, T * sizeof(uint32_t));
        memcpy(targets + row * T, window + 1, T * sizeof(uint32_t));
    }
    model_forward(inference.model, inputs, targets, (int)batch, (float)config->train.z_loss);

    int tokens = (int)batch * T, n_sites = model_site_count(inference.model);
    SiteReport *reports = xcalloc((size_t)n_sites, sizeof *reports);
    for (int site = 0; site < n_sites; site++)
        probe_site(inference.model, config, site, tokens, arguments.slices, &reports[site]);

    printf("probe %s step %lld (%s weights) | %d tokens | %d slices\n", inference.step_dir,
           (long long)inference.step, inference.weights, tokens, arguments.slices);
    print_table(reports, n_sites);
    if (arguments.json_path)
        write_json(arguments.json_path, &inference, tokens, arguments.slices, reports, n_sites);

    for (int site = 0; site < n_sites; site++)
        free(reports[site].mean_weights);
    free(reports);
    free(window);
    free(inputs);
    free(targets);
    data_close(data);
    inference_close(&inference);
    return EXIT_DONE;
}
