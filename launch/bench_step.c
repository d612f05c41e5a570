/* launch/bench_step.c — the step cases of `fathom bench` (launch/bench.h): one training
 * step through pipeline/step.h on synthetic data, with AdamW and no EMA, for each residual
 * the users run:
 *   step    the MHAR paper's 1B model (d 1280, L 36, 16/8 heads, FFN 5120, V 128256, 32 x 1024
 *           tokens in 4 microbatches of 8): standard, mhar and msar (replace form, blocks of
 *           4 layers, H 8, MSAR m 4 with kernels 1 2 4 8), mhar-delta and msar-delta (the
 *           same routing as a graft: the delta form)
 *   step8b  the 8B width (d 4096, 32/8 heads, hd 128, FFN 14336, V 128256, 4 layers, 4 x 4096
 *           tokens in 4 microbatches of 1, blocks of 2 layers as launch/bench/train_8b_width.sh
 *           runs `fathom train`): standard, mhar-delta (H 8), msar-delta (m 4, H 8)
 *   graft   the routing of the 8B graft through the model: the 8B width and depth (32 layers
 *           in 8 blocks of 4, 64 sites over at most 9 sources) with MLPs 256 wide and a 4096
 *           vocabulary, one microbatch of 2 x 4096 tokens: standard, mhar-delta, msar-delta.
 *           A routed step less the standard one is the routing of a microbatch: the (c) and
 *           (d) cases of docs/performance.md as the model runs them, sites, walk and all
 * NAME-mhar-delta-sites and NAME-msar-delta-sites run the delta form with every site routed
 * alone, the per-site walk the two-phase one replaced.
 * Tokens a second and the most device memory held are reported per mode; the ratios of the
 * performance table are taken between modes of one run.
 */
#include "launch/bench_internal.h"

#include "launch/solo_step.h"
#include "model/model.h"
#include "pipeline/step.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/grid.h"
#include "runtime/optim.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    TrainingStep *step;
    DataSet *data;
    uint64_t consumed;
    int global_batch;
} StepPass;

static void step_pass(void *context)
{
    StepPass *p = context;
    step_run(p->step, p->data, p->consumed, 1e-4, 1);
    p->consumed += (uint64_t)p->global_batch;
}

static const char *const step_modes[] = {"standard", "mhar", "msar", "mhar-delta",
                                         "msar-delta"};
/* the delta form with every site routed alone (model_route_sites_alone): the per-site walk
 * the two-phase one replaced; only when named */
static const char *const site_modes[] = {"mhar-delta-sites", "msar-delta-sites"};

static bool step_mode_known(const char *mode)
{
    for (size_t i = 0; i < sizeof step_modes / sizeof step_modes[0]; i++)
        if (!strcmp(mode, step_modes[i]))
            return true;
    for (size_t i = 0; i < sizeof site_modes / sizeof site_modes[0]; i++)
        if (!strcmp(mode, site_modes[i]))
            return true;
    return false;
}

bool bench_step_case(Bench *bench, const char *name)
{
    /* the modes a shape runs: the 1B step every one, the 8B shapes the graft's */
    static const char *const graft_modes[] = {"standard", "mhar-delta", "msar-delta"};
    for (int shape = 0; shape < BENCH_STEP_SHAPES; shape++) {
        const char *shape_name = bench->shapes.steps[shape].name;
        const size_t length = strlen(shape_name);
        if (!strcmp(name, shape_name)) {
            const bool all = shape == BENCH_STEP_1B;
            const size_t count = all ? sizeof step_modes / sizeof step_modes[0]
                                     : sizeof graft_modes / sizeof graft_modes[0];
            for (size_t i = 0; i < count; i++)
                bench_case_step(bench, shape, all ? step_modes[i] : graft_modes[i]);
            return true;
        }
        if (!strncmp(name, shape_name, length) && name[length] == '-' &&
            step_mode_known(name + length + 1)) {
            bench_case_step(bench, shape, name + length + 1);
            return true;
        }
    }
    return false;
}

/* The residual of `mode` at blocks of `layers_per_block` layers, H 8 (2 where d < 128). */
static void step_residual(ResidualConfig *residual, const char *mode, const ModelConfig *model,
                          int layers_per_block)
{
    residual->mode = RESIDUAL_STANDARD;
    if (!strcmp(mode, "standard"))
        return;
    const bool msar = !strncmp(mode, "msar", 4);
    residual->mode = msar ? RESIDUAL_MSAR : RESIDUAL_ATTNRES;
    residual->heads = 8 < model->d_model / 16 ? 8 : 2;
    residual->granularity = GRANULARITY_BLOCK;
    residual->layers_per_block = layers_per_block;
    residual->form = strstr(mode, "-delta") ? FORM_DELTA : FORM_REPLACE;
    residual->streams = msar ? BENCH_STREAMS : 1;
    residual->n_stream_kernels = msar ? BENCH_STREAMS : 0;
    for (int i = 0; i < residual->n_stream_kernels; i++)
        residual->stream_kernels[i] = bench_kernels[i];
}

void bench_case_step(Bench *bench, int shape_index, const char *mode)
{
    const Backend *backend = bench->backend;
    const BenchStepShape *shape = &bench->shapes.steps[shape_index];
    Config config;
    config_defaults(&config);
    config.model = shape->model;
    config.train.microbatch_size = shape->microbatch;
    config.train.global_batch_size = shape->microbatch * shape->microbatches;
    config.train.seq_len = shape->T;
    config.train.z_loss = 1e-4;
    config.data.source = DATA_SYNTHETIC;
    step_residual(&config.residual, mode, &config.model, shape->layers_per_block);
    config.seed = 1;
    config.model.init_std = 0.02;
    const int T = shape->T;
    backend->memory_peak_reset();
    SoloStep solo;
    solo_step_create(&solo, backend, &config, strstr(mode, "-sites") != NULL);
    StepPass pass = {&solo.step, solo.data, 0, config.train.global_batch_size};
    const size_t tokens = (size_t)config.train.global_batch_size * T;
    const int repeat = bench->repeat / 3 > 3 ? bench->repeat / 3 : 3;
    double ms = bench_time_ms(backend, step_pass, &pass, repeat);
    bench_add(bench, shape->name, mode, ms, (double)tokens / ms * 1e3, "tok/s",
              bench_peak_gib(backend));
    solo_step_destroy(&solo);
}
