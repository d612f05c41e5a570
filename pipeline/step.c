/* pipeline/step.c — see step.h. */
#include "pipeline/step.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

enum { SHARED_TENSOR = -1 };

/* The stage whose chunks read tensor `entry`, or SHARED_TENSOR (step.h). Its FSDP unit
 * says where it lives (model/params.h): unit 1 + i is decoder layer i with its sites, unit
 * L + 1 the final site, norm and head, unit 0 the embedding and the shared routing tensors. */
static int tensor_stage(const ParamEntry *entry, const ChunkSpan *spans, int n_chunks, int P,
                        int n_layers, bool tied)
{
    const int last = (n_chunks - 1) % P;
    if (entry->unit == n_layers + 1)
        return last;
    if (entry->unit > 0) {
        const int layer = entry->unit - 1;
        for (int c = 0; c < n_chunks; c++)
            if (layer >= spans[c].first_layer && layer < spans[c].first_layer + spans[c].n_layers)
                return c % P;
        fatal(EXIT_CONFIG, "tensor %s belongs to no chunk", entry->name);
    }
    if (!strcmp(entry->name, "model.embed_tokens.weight"))
        return tied && last != 0 ? SHARED_TENSOR : 0;
    return P == 1 ? 0 : SHARED_TENSOR; /* model.route_null, model.route_streams.{n}.conv */
}

static OptimRange *ranges_push(OptimRange *ranges, int *n, OptimRange range)
{
    ranges = xrealloc(ranges, (size_t)(*n + 1) * sizeof *ranges);
    ranges[(*n)++] = range;
    return ranges;
}

void step_create(TrainingStep *step, Model *model, const Config *config, const RankGrid *grid,
                 Optimizer *optimizer)
{
    memset(step, 0, sizeof *step);
    step->config = config;
    step->model = model;
    step->grid = grid;
    step->optimizer = optimizer;
    step->executor = executor_create(model, config, grid->pp > 1 ? grid->pipeline : NULL,
                                     grid->stage);
    int n_chunks;
    const ChunkSpan *spans = executor_spans(step->executor, &n_chunks);
    const ParamTable *table = model_param_table(model);
    step->owner = xcalloc((size_t)table->n_params, sizeof *step->owner);
    size_t largest = 1;
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        const int owner = tensor_stage(entry, spans, n_chunks, grid->pp,
                                       model_config(model)->n_layers,
                                       model_config(model)->tie_embeddings);
        step->owner[p] = owner;
        const OptimRange range = optimizer->ranges[p];
        if (entry->count > largest)
            largest = entry->count;
        if (owner == SHARED_TENSOR)
            step->shared = ranges_push(step->shared, &step->n_shared, range);
        if (owner != grid->stage && owner != SHARED_TENSOR)
            continue;
        step->ranges = ranges_push(step->ranges, &step->n_ranges, range);
        if (owner == grid->stage || grid->stage == 0)
            step->norm_ranges = ranges_push(step->norm_ranges, &step->n_norm_ranges, range);
    }
    step->host = xmalloc(largest * sizeof(float));
    optimizer->ranges = step->ranges;
    optimizer->n_ranges = step->n_ranges;
    if (grid->world_size > 1) {
        optimizer->norm_ranges = step->norm_ranges;
        optimizer->n_norm_ranges = step->n_norm_ranges;
    }
}

void step_destroy(TrainingStep *step)
{
    executor_destroy(step->executor);
    free(step->owner);
    free(step->norm_ranges);
    free(step->shared);
    free(step->host);
    /* step->ranges is the optimizer's now; the caller frees optimizer.ranges */
    memset(step, 0, sizeof *step);
}

/* grads[range] = the sum over `group` of every rank's grads[range], in rank order. */
static void sum_gradients(TrainingStep *step, Comm *group, const OptimRange *ranges, int n)
{
    const Backend *backend = model_backend(step->model);
    float *grads = model_grads(step->model);
    for (int r = 0; r < n; r++) {
        const size_t bytes = ranges[r].count * sizeof(float);
        float *range = grads + ranges[r].offset;
        backend->download(step->host, range, bytes);
        comm_allreduce_sum(group, step->host, step->host, ranges[r].count, COMM_FLOAT32,
                           COMM_KIND_ALLREDUCE);
        backend->upload(range, step->host, bytes);
    }
}

/* The optimizer's norm: each stage's share, summed over the pipeline (dp ranks hold the
 * same gradients after their sum, so they are counted once). */
static double sum_over_pipeline(double local, void *context)
{
    const RankGrid *grid = context;
    double total = 0;
    comm_allreduce_sum(grid->pipeline, &local, &total, 1, COMM_FLOAT64, COMM_KIND_ALLREDUCE);
    return total;
}

StepResult step_run(TrainingStep *step, DataSet *data, uint64_t consumed_samples, double lr)
{
    const RankGrid *grid = step->grid;
    const Config *config = step->config;
    const int M = config_microbatches_per_rank(config);
    StepResult result = {0};

    model_zero_grads(step->model);
    const StepLoss loss = executor_run_step(step->executor, data, consumed_samples,
                                            grid->dp_rank, grid->dp,
                                            1.0f / (float)(M * grid->dp));
    if (grid->dp > 1)
        sum_gradients(step, grid->data_parallel, step->ranges, step->n_ranges);
    if (grid->pp > 1)
        sum_gradients(step, grid->pipeline, step->shared, step->n_shared);
    if (grid->world_size > 1) {
        step->optimizer->reduce_sum = sum_over_pipeline;
        step->optimizer->reduce_context = (void *)grid;
    }
    result.applied = optim_step(step->optimizer, lr, &result.grad_norm);

    /* the step's loss: the last stage's sums, over every rank, divided by M x D */
    double sums[3] = {loss.loss, loss.ce, loss.zloss}, total[3];
    comm_allreduce_sum(grid->world, sums, total, 3, COMM_FLOAT64, COMM_KIND_OTHER);
    const double microbatches = (double)M * grid->dp;
    result.loss = total[0] / microbatches;
    result.ce = total[1] / microbatches;
    result.zloss = total[2] / microbatches;
    return result;
}

void pipeline_gather_state(TrainingStep *step, float *const arrays[4])
{
    const RankGrid *grid = step->grid;
    if (grid->pp == 1 || grid->dp_rank != 0)
        return;
    const Backend *backend = model_backend(step->model);
    const ParamTable *table = model_param_table(step->model);
    for (int p = 0; p < table->n_params; p++) {
        const int owner = step->owner[p];
        if (owner == SHARED_TENSOR || owner == 0)
            continue; /* rank 0 holds it already */
        if (grid->stage != 0 && grid->stage != owner)
            continue;
        const ParamEntry *entry = &table->params[p];
        const size_t bytes = entry->count * sizeof(float);
        for (int a = 0; a < 4; a++) {
            if (!arrays[a])
                continue;
            float *range = arrays[a] + entry->offset;
            const int tag = (4 * p + a) % (COMM_TAG_MAX + 1);
            if (grid->stage == owner) {
                backend->download(step->host, range, bytes);
                comm_wait(comm_send_start(grid->pipeline, step->host, bytes, 0, tag,
                                          COMM_KIND_OTHER));
            } else {
                comm_wait(comm_recv_start(grid->pipeline, step->host, bytes, owner, tag,
                                          COMM_KIND_OTHER));
                backend->upload(range, step->host, bytes);
            }
        }
    }
}
