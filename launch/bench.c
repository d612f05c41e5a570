/* launch/bench.c — `fathom bench` (see bench.h). */
#include "launch/bench.h"
#include "launch/bench_internal.h"

#include "launch/backend_select.h"
#include "launch/run_state.h"
#include "model/model.h"
#include "model/params.h"
#include "pipeline/step.h"
#include "runtime/config.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/grid.h"
#include "runtime/optim.h"
#include "runtime/topo.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char bench_usage[] =
    "usage: fathom bench [--cases layers,attention,route,msar,step,step8b,graft] [--repeat N] "
    "[--device auto|cpu|cuda] [--small] [--json OUT.jsonl] [--matmul-algorithms FILE]\n"
    "       mpirun -np D fathom bench --cases comm [--repeat N] [--device ...] [--small] "
    "[--json OUT.jsonl]";

const int bench_kernels[BENCH_STREAMS] = {1, 2, 4, 8};

static ModelConfig llama_config(int vocab, int d, int layers, int heads, int kv_heads,
                                int head_dim, int ffn)
{
    Config defaults;
    config_defaults(&defaults);
    ModelConfig model = defaults.model;
    model.vocab_size = vocab;
    model.d_model = d;
    model.n_layers = layers;
    model.n_heads = heads;
    model.n_kv_heads = kv_heads;
    model.head_dim = head_dim;
    model.ffn_dim = ffn;
    model.rope_theta = 500000.0;
    model.norm_eps = 1e-5;
    model.tie_embeddings = false;
    model.qk_norm = false;
    return model;
}

static BenchShapes bench_shapes(bool small)
{
    BenchShapes shapes;
    if (small) {
        shapes.layers_model = llama_config(256, 128, 2, 2, 1, 64, 256);
        shapes.layers_T = 64;
        shapes.attention_B = 1, shapes.attention_T = 64, shapes.attention_heads = 2;
        shapes.attention_kv_heads = 1, shapes.attention_head_dim = 64;
        shapes.route_d = 64, shapes.route_heads = 2, shapes.route_tokens = 96;
        shapes.route_sublayers = 8, shapes.route_blocks = 2;
        shapes.step_route_sublayers = 8, shapes.step_route_blocks = 4;
        shapes.steps[BENCH_STEP_1B] = (BenchStepShape){
            "step", llama_config(256, 128, 4, 2, 1, 64, 256), 2, 2, 32, 2};
        shapes.steps[BENCH_STEP_WIDE] = (BenchStepShape){
            "step8b", llama_config(256, 128, 4, 2, 1, 64, 256), 1, 2, 32, 2};
        shapes.steps[BENCH_STEP_GRAFT] = (BenchStepShape){
            "graft", llama_config(256, 128, 8, 2, 1, 64, 32), 2, 1, 32, 2};
        return shapes;
    }
    shapes.layers_model = llama_config(256, 4096, 4, 32, 8, 128, 14336);
    shapes.layers_T = 4096;
    shapes.attention_B = 1, shapes.attention_T = 4096, shapes.attention_heads = 32;
    shapes.attention_kv_heads = 8, shapes.attention_head_dim = 128;
    shapes.route_d = 4096, shapes.route_heads = 8, shapes.route_tokens = 2 * 4096;
    shapes.route_sublayers = 64, shapes.route_blocks = 8;
    shapes.step_route_sublayers = 72, shapes.step_route_blocks = 9;
    shapes.steps[BENCH_STEP_1B] = (BenchStepShape){
        "step", llama_config(128256, 1280, 36, 16, 8, 80, 5120), 8, 4, 1024, 4};
    shapes.steps[BENCH_STEP_WIDE] = (BenchStepShape){
        "step8b", llama_config(128256, 4096, 4, 32, 8, 128, 14336), 1, 4, 4096, 2};
    /* the graft's routing through the model: the 8B width and depth (32 layers, 8 blocks of
     * 4: 64 sites over at most 9 sources, the (c) and (d) cases), one microbatch of 2 x 4096
     * tokens; MLPs 256 wide and a 4096 vocabulary keep the rest of the step small, so that
     * a routed step less the standard one is the routing */
    shapes.steps[BENCH_STEP_GRAFT] = (BenchStepShape){
        "graft", llama_config(4096, 4096, 32, 32, 8, 128, 256), 2, 1, 4096, 4};
    return shapes;
}

/* ---- timing ---- */

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of `repeat` runs of work(context) after two warm-ups, in milliseconds between
 * events on the backend's stream. */
double bench_time_ms(const Backend *backend, BenchWork work, void *context, int repeat)
{
    BackendEvent *start = backend->event_create(), *end = backend->event_create();
    for (int i = 0; i < 2; i++)
        work(context);
    double *times = xcalloc((size_t)repeat, sizeof *times);
    for (int i = 0; i < repeat; i++) {
        backend->event_record(start);
        work(context);
        backend->event_record(end);
        times[i] = backend->event_elapsed_ms(start, end);
    }
    qsort(times, (size_t)repeat, sizeof *times, compare_doubles);
    double median = times[repeat / 2];
    free(times);
    backend->event_destroy(start);
    backend->event_destroy(end);
    return median;
}

double bench_peak_gib(const Backend *backend)
{
    size_t in_use = 0, peak = 0;
    backend->memory_usage(&in_use, &peak);
    return peak ? (double)peak / (1 << 30) : NAN;
}

void bench_add(Bench *bench, const char *case_name, const char *mode, double ms,
                      double rate, const char *unit, double peak)
{
    if (bench->n_rows == BENCH_MAX_ROWS)
        fatal(EXIT_CONFIG, "bench: more than %d results", BENCH_MAX_ROWS);
    BenchRow *row = &bench->rows[bench->n_rows++];
    snprintf(row->case_name, sizeof row->case_name, "%s", case_name);
    snprintf(row->mode, sizeof row->mode, "%s", mode);
    row->ms = ms, row->rate = rate, row->unit = unit, row->peak_gib = peak;
    if (bench->quiet)
        return;
    printf("bench: %-10s %-20s %9.3f ms  %8.1f %s\n", case_name, mode, ms, rate, unit);
    fflush(stdout);
    if (bench->json) {
        fprintf(bench->json, "{\"case\": \"%s\", \"mode\": \"%s\", \"ms\": %.4f, \"rate\": %.4f, "
                "\"unit\": \"%s\", \"peak_gib\": ", case_name, mode, ms, rate, unit);
        if (isfinite(peak))
            fprintf(bench->json, "%.3f}\n", peak);
        else
            fprintf(bench->json, "null}\n");
        fflush(bench->json);
    }
}

/* ---- random inputs ---- */

static uint64_t bench_random_state = 0x9e3779b97f4a7c15ull;

static double bench_uniform(void) /* [0, 1) */
{
    bench_random_state ^= bench_random_state << 13;
    bench_random_state ^= bench_random_state >> 7;
    bench_random_state ^= bench_random_state << 17;
    return (double)(bench_random_state >> 11) / (double)(1ull << 53);
}

Activation *bench_random_activations(const Backend *backend, size_t n, float scale)
{
    float *host = xmalloc(n * sizeof *host);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)((2.0 * bench_uniform() - 1.0) * scale);
    Activation *array = backend->alloc(n * backend->activation_bytes);
    backend->activations_upload(array, host, n);
    free(host);
    return array;
}

Activation *bench_zero_activations(const Backend *backend, size_t n)
{
    return backend->alloc(n * backend->activation_bytes);
}

void bench_random_tokens(uint32_t *tokens, size_t n, int vocab)
{
    for (size_t i = 0; i < n; i++)
        tokens[i] = (uint32_t)(bench_uniform() * vocab);
}

/* ---- layers: the model's forward + backward over 4 decoder layers ---- */

typedef struct {
    Model *model;
    const uint32_t *inputs, *targets;
} ModelPass;

/* A pass makes fresh gradients, as PyTorch's peer does (its grads set to None each step):
 * cleared, then written by the backward (runtime/fsdp.h, "written first"). */
static void model_pass(void *context)
{
    ModelPass *pass = context;
    model_zero_grads(pass->model);
    model_forward_train(pass->model, pass->inputs, pass->targets, 1, 0.0f, 1.0f);
    model_backward(pass->model, 1.0f);
}

static void case_layers(Bench *bench)
{
    const Backend *backend = bench->backend;
    const ModelConfig *config = &bench->shapes.layers_model;
    const int T = bench->shapes.layers_T;
    backend->memory_peak_reset();
    Model *model = model_create(backend, config, NULL, 1, T);
    model_init_params(model, 1, 0.02);
    uint32_t *inputs = xmalloc((size_t)T * sizeof *inputs);
    uint32_t *targets = xmalloc((size_t)T * sizeof *targets);
    bench_random_tokens(inputs, (size_t)T, config->vocab_size);
    bench_random_tokens(targets, (size_t)T, config->vocab_size);
    ModelPass pass = {model, inputs, targets};
    double ms = bench_time_ms(backend, model_pass, &pass, bench->repeat);
    /* DESIGN 6: 6 FLOPs per matrix weight per token, causal attention counted once */
    const double matrix = (double)model_param_table(model)->layer_matrix_count;
    const double flops = 6.0 * matrix * T +
                         6.0 * config->n_layers * (double)T * config->n_heads *
                             config->head_dim * T;
    bench_add(bench, "layers", "forward+backward", ms, flops / ms / 1e9, "TFLOP/s",
              bench_peak_gib(backend));
    free(inputs);
    free(targets);
    model_destroy(model);
}

/* ---- attention alone ---- */

typedef struct {
    const Backend *backend;
    Activation *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
    int B, T, heads, kv_heads, head_dim;
    bool backward;
} AttentionPass;

static void attention_pass(void *context)
{
    AttentionPass *a = context;
    a->backend->attention_forward(a->out, a->lse, a->q, a->k, a->v, a->B, a->T, a->heads,
                                  a->kv_heads, a->head_dim);
    if (a->backward) /* written, as the layer backward asks for it */
        a->backend->attention_backward(a->dq, a->dk, a->dv, GRAD_WRITE, a->dout, a->q, a->k,
                                       a->v, a->out, a->lse, a->B, a->T, a->heads,
                                       a->kv_heads, a->head_dim);
}

static void case_attention(Bench *bench)
{
    const Backend *backend = bench->backend;
    const BenchShapes *s = &bench->shapes;
    const size_t rows = (size_t)s->attention_B * s->attention_T;
    const size_t q_count = rows * s->attention_heads * s->attention_head_dim;
    const size_t kv_count = rows * s->attention_kv_heads * s->attention_head_dim;
    AttentionPass a = {
        .backend = backend,
        .q = bench_random_activations(backend, q_count, 1.0f),
        .k = bench_random_activations(backend, kv_count, 1.0f),
        .v = bench_random_activations(backend, kv_count, 1.0f),
        .out = bench_zero_activations(backend, q_count),
        .dout = bench_random_activations(backend, q_count, 1.0f),
        .dq = bench_zero_activations(backend, q_count),
        .dk = bench_zero_activations(backend, kv_count),
        .dv = bench_zero_activations(backend, kv_count),
        .lse = backend->alloc(rows * s->attention_heads * sizeof(float)),
        .B = s->attention_B, .T = s->attention_T, .heads = s->attention_heads,
        .kv_heads = s->attention_kv_heads, .head_dim = s->attention_head_dim,
    };
    /* causal: half of the 4 B T^2 H hd of the full square; the backward is 2.5x that */
    const double forward_flops = 2.0 * s->attention_B * (double)s->attention_T *
                                 s->attention_T * s->attention_heads * s->attention_head_dim;
    double ms = bench_time_ms(backend, attention_pass, &a, bench->repeat);
    bench_add(bench, "attention", "forward", ms, forward_flops / ms / 1e9, "TFLOP/s", NAN);
    a.backward = true;
    ms = bench_time_ms(backend, attention_pass, &a, bench->repeat);
    bench_add(bench, "attention", "forward+backward", ms, 3.5 * forward_flops / ms / 1e9,
              "TFLOP/s", NAN);
    Activation *arrays[] = {a.q, a.k, a.v, a.out, a.dout, a.dq, a.dk, a.dv};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        backend->release(arrays[i]);
    backend->release(a.lse);
}

/* ---- the command ---- */

static void print_table(const Bench *bench)
{
    printf("\n%-10s %-20s %10s %18s %9s\n", "case", "mode", "ms", "rate", "peak GiB");
    for (int i = 0; i < bench->n_rows; i++) {
        const BenchRow *row = &bench->rows[i];
        char rate[32], peak[16] = "-";
        snprintf(rate, sizeof rate, "%.1f %s", row->rate, row->unit);
        if (isfinite(row->peak_gib))
            snprintf(peak, sizeof peak, "%.2f", row->peak_gib);
        printf("%-10s %-20s %10.3f %18s %9s\n", row->case_name, row->mode, row->ms, rate, peak);
    }
}

int bench_main(int argc, char **argv)
{
    const char *cases = "layers,attention,route,msar,step,step8b,graft", *json_path = NULL;
    const char *matmul_algorithms = NULL;
    DeviceKind device = DEVICE_AUTO;
    bool small = false;
    int repeat = 10;
    for (int i = 2; i < argc; i++) {
        const char *option = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(option, "--small")) {
            small = true;
            continue;
        }
        if (!value)
            fatal(EXIT_CONFIG, "bench: %s needs a value\n%s", option, bench_usage);
        i++;
        if (!strcmp(option, "--cases")) {
            cases = value;
        } else if (!strcmp(option, "--json")) {
            json_path = value;
        } else if (!strcmp(option, "--matmul-algorithms")) {
            matmul_algorithms = value;
        } else if (!strcmp(option, "--repeat")) {
            repeat = atoi(value);
            if (repeat < 1)
                fatal(EXIT_CONFIG, "bench: --repeat %s must be a positive count", value);
        } else if (!strcmp(option, "--device")) {
            if (!strcmp(value, "auto"))
                device = DEVICE_AUTO;
            else if (!strcmp(value, "cpu"))
                device = DEVICE_CPU;
            else if (!strcmp(value, "cuda"))
                device = DEVICE_CUDA;
            else
                fatal(EXIT_CONFIG, "bench: --device %s is not auto, cpu or cuda", value);
        } else {
            fatal(EXIT_CONFIG, "bench: unknown option '%s'\n%s", option, bench_usage);
        }
    }
    /* under mpirun: the comm case alone, its ranks placed as fathom train places them */
    const int ranks = comm_size(comm_world());
    RankGrid grid;
    if (ranks > 1) {
        if (strcmp(cases, "comm"))
            fatal(EXIT_CONFIG, "bench: under mpirun (%d ranks) only --cases comm runs; the "
                  "other cases time one process", ranks);
        Config placing;
        config_defaults(&placing);
        placing.device = device;
        placing.parallel.dp = ranks;
        grid_create(&grid, 1, ranks);
        TopoPlacement placement;
        topo_place(&grid, &placing, &placement);
        topo_print_map(&grid, &placement);
    }
    Bench bench = {.backend = backend_select(device, NULL), .shapes = bench_shapes(small),
                   .repeat = repeat, .quiet = comm_rank(comm_world()) != 0};
    if (matmul_algorithms)
        backend_use_matmul_algorithms(bench.backend, matmul_algorithms);
    if (!small && bench.backend->activation_bytes == sizeof(float))
        fatal(EXIT_CONFIG, "bench: the full shapes (8B layers, a 1B model) are for a GPU; "
              "the %s backend runs them with --small", bench.backend->name);
    if (json_path && !bench.quiet && !(bench.json = fopen(json_path, "w")))
        fatal(EXIT_DATA, "bench: cannot open %s for writing", json_path);
    if (!bench.quiet)
        printf("bench: %s backend, %s shapes, median of %d\n", bench.backend->name,
               small ? "small" : "full", repeat);

    char list[256];
    snprintf(list, sizeof list, "%s", cases);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        if (!strcmp(name, "layers"))
            case_layers(&bench);
        else if (!strcmp(name, "attention"))
            case_attention(&bench);
        else if (!strcmp(name, "route"))
            bench_case_route_blocks(&bench, false);
        else if (!strcmp(name, "route-1b"))
            bench_case_route_blocks(&bench, true);
        else if (!strcmp(name, "route-sites"))
            bench_case_route(&bench, false, false);
        else if (!strcmp(name, "route-1b-sites"))
            bench_case_route(&bench, false, true);
        else if (!strcmp(name, "msar"))
            bench_case_route(&bench, true, false);
        else if (!strcmp(name, "comm"))
            bench_case_comm(&bench);
        else if (!bench_step_case(&bench, name))
            fatal(EXIT_CONFIG, "bench: unknown case '%s' (layers, attention, route, msar, step, "
                  "step8b, graft, or one of route-1b, route-sites, route-1b-sites, step-MODE, "
                  "step8b-MODE, graft-MODE with MODE standard, mhar, msar, mhar-delta, "
                  "msar-delta, or comm under mpirun)", name);
    }
    if (!bench.quiet)
        print_table(&bench);
    if (bench.json)
        fclose(bench.json);
    if (ranks > 1)
        grid_destroy(&grid);
    return EXIT_DONE;
}
