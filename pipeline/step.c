/* pipeline/step.c — see step.h. */
#include "pipeline/step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/chunk.h"
#include "pipeline/evaluate.h"
#include "runtime/error.h"
#include "runtime/fault.h"

/* Every chunk's span (chunk c runs on stage c mod P). */
static ChunkSpan *all_spans(const Config *config, int *n_chunks)
{
    *n_chunks = config->parallel.pp * config->parallel.virtual_stages;
    ChunkSpan *spans = xcalloc((size_t)*n_chunks, sizeof *spans);
    ResidualPlan plan;
    residual_plan_build(&plan, &config->model, &config->residual);
    chunk_spans_build(spans, *n_chunks, &config->model, &plan, config->parallel.layer_split,
                      config->parallel.n_layer_split);
    residual_plan_free(&plan);
    return spans;
}

Model *step_create_model(const Config *config, const RankGrid *grid, const Backend *backend,
                         DeviceComm *data_parallel)
{
    int n_chunks;
    ChunkSpan *spans = all_spans(config, &n_chunks);
    ChunkSpan *mine = xcalloc((size_t)n_chunks, sizeof *mine);
    int n_mine = 0;
    for (int c = grid->stage; c < n_chunks; c += grid->pp)
        mine[n_mine++] = spans[c];
    const ModelSharding sharding = {
        .data_parallel = grid->dp > 1 ? data_parallel : NULL,
        .spans = mine,
        .n_spans = n_mine,
        .reshard_after_forward = config->fsdp.reshard_after_forward,
    };
    Model *model = model_create_sharded(backend, &config->model, &config->residual,
                                        config->train.microbatch_size, config->train.seq_len,
                                        &sharding);
    free(mine);
    free(spans);
    return model;
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
    /* the pipeline communicator even with one stage: with virtual_stages > 1 its chunks
     * hand their payloads to themselves */
    step->executor = executor_create(model, config, grid->pipeline, grid->stage);
    const ParamTable *table = model_param_table(model);
    const Fsdp *fsdp = model_fsdp(model);
    const int P = grid->pp, n_units = table->n_units;

    /* which stages hold each unit: the lowest counts it in the norm; several sum it */
    int n_chunks;
    const ChunkSpan *spans = executor_spans(step->executor, &n_chunks);
    int *first_stage = xmalloc((size_t)n_units * sizeof *first_stage);
    int *holders = xcalloc((size_t)n_units, sizeof *holders);
    bool *held = xcalloc((size_t)n_units, sizeof *held);
    for (int u = 0; u < n_units; u++)
        first_stage[u] = P;
    for (int s = 0; s < P; s++) {
        memset(held, 0, (size_t)n_units * sizeof *held);
        for (int c = s; c < n_chunks; c += P)
            chunk_units(model, &spans[c], held);
        for (int u = 0; u < n_units; u++)
            if (held[u]) {
                holders[u]++;
                if (s < first_stage[u])
                    first_stage[u] = s;
            }
    }
    step->shared_units = xcalloc((size_t)n_units, sizeof *step->shared_units);
    size_t largest = 1;
    for (int u = 0; u < n_units; u++) {
        size_t offset, count;
        fsdp_unit_range(fsdp, u, &offset, &count);
        if (holders[u] > 1) {
            step->shared_units[step->n_shared_units++] = u;
            largest = count > largest ? count : largest;
        }
    }
    step->writes_unit = xcalloc((size_t)n_units, sizeof *step->writes_unit);
    for (int u = 0; u < n_units; u++)
        step->writes_unit[u] = first_stage[u] == grid->stage;
    for (int p = 0; p < table->n_params; p++) {
        const ParamEntry *entry = &table->params[p];
        const FsdpTensorPlace *place = fsdp_place(fsdp, p);
        if (place->local_offset == SIZE_MAX || !step->writes_unit[entry->unit])
            continue;
        const size_t count = place->shard_rows * (entry->count / (size_t)entry->shape[0]);
        step->norm_ranges = ranges_push(step->norm_ranges, &step->n_norm_ranges,
                                        (OptimRange){place->local_offset, count, 1, 0});
    }
    /* one backward of each local chunk per microbatch: that many releases per unit */
    step->releases = xcalloc((size_t)n_units, sizeof *step->releases);
    const int M = config_microbatches_per_rank(config);
    for (int c = grid->stage; c < n_chunks; c += P)
        for (int mb = 0; mb < M; mb++)
            chunk_unit_releases(model, &spans[c], step->releases);
    step->host = xmalloc(largest * sizeof(float));
    if (grid->world_size > 1) {
        optimizer->norm_ranges = step->norm_ranges;
        optimizer->n_norm_ranges = step->n_norm_ranges;
    }
    free(first_stage);
    free(holders);
    free(held);
}

void step_destroy(TrainingStep *step)
{
    executor_destroy(step->executor);
    free(step->norm_ranges);
    free(step->shared_units);
    free(step->releases);
    free(step->writes_unit);
    free(step->host);
    memset(step, 0, sizeof *step);
}

/* A unit several stages hold: its gradient shards summed over them (the pipeline of this dp
 * rank, rank order); a stage without it adds zeros and keeps nothing. */
static void sum_shared_units(TrainingStep *step)
{
    const Backend *backend = model_backend(step->model);
    Fsdp *fsdp = model_fsdp(step->model);
    float *grads = model_grads(step->model);
    for (int i = 0; i < step->n_shared_units; i++) {
        const int unit = step->shared_units[i];
        size_t offset, count;
        fsdp_unit_range(fsdp, unit, &offset, &count);
        const bool held = fsdp_unit_local(fsdp, unit);
        if (held)
            backend->download(step->host, grads + offset, count * sizeof(float));
        else
            memset(step->host, 0, count * sizeof(float));
        comm_allreduce_sum(step->grid->pipeline, step->host, step->host, count, COMM_FLOAT32,
                           COMM_KIND_ALLREDUCE);
        if (held)
            backend->upload(grads + offset, step->host, count * sizeof(float));
    }
}

/* The optimizer's norm: every rank's share (its shards), summed over the world. */
static double sum_over_world(double local, void *context)
{
    const RankGrid *grid = context;
    double total = 0;
    comm_allreduce_sum(grid->world, &local, &total, 1, COMM_FLOAT64, COMM_KIND_ALLREDUCE);
    return total;
}

/* The fault switch's nan (runtime/fault.h): this rank's gradients are poisoned. */
static void poison_gradients(TrainingStep *step)
{
    const float nan = NAN;
    model_backend(step->model)->upload(model_grads(step->model), &nan, sizeof nan);
}

StepResult step_run(TrainingStep *step, DataSet *data, uint64_t consumed_samples, double lr,
                    int step_number)
{
    const RankGrid *grid = step->grid;
    const Config *config = step->config;
    const int M = config_microbatches_per_rank(config);
    Fsdp *fsdp = model_fsdp(step->model);
    StepResult result = {0};

    fsdp_step_begin(fsdp, step->releases);
    fault_step_begin(step_number);
    const StepLoss loss = executor_run_step(step->executor, data, consumed_samples,
                                            grid->dp_rank, grid->dp,
                                            1.0f / (float)(M * grid->dp));
    fsdp_step_finish(fsdp);
    if (fault_at(step_number) == FAULT_NAN)
        poison_gradients(step);
    if (grid->pp > 1)
        sum_shared_units(step);

    /* the step's loss: the last stage's sums, over every rank, divided by M x D; decided
     * before the update, so that a non-finite loss skips the step on every rank */
    double sums[3] = {loss.loss, loss.ce, loss.zloss}, total[3];
    comm_allreduce_sum(grid->world, sums, total, 3, COMM_FLOAT64, COMM_KIND_OTHER);
    const double microbatches = (double)M * grid->dp;
    result.loss = total[0] / microbatches;
    result.ce = total[1] / microbatches;
    result.zloss = total[2] / microbatches;

    if (grid->world_size > 1) {
        step->optimizer->reduce_sum = sum_over_world;
        step->optimizer->reduce_context = (void *)grid;
    }
    result.applied = optim_step_checked(step->optimizer, lr, isfinite(result.loss),
                                        &result.grad_norm);
    if (result.applied)
        fsdp_params_changed(fsdp);
    return result;
}

double step_evaluate(TrainingStep *step, DataSet *data, int64_t windows)
{
    const Config *config = step->config;
    const RankGrid *grid = step->grid;
    const int B = config->train.microbatch_size;
    if (grid->pp == 1)
        return evaluate_loss(step->model, data, windows, B, config->train.seq_len,
                             (float)config->train.z_loss, NULL, NULL)
            .loss;
    const int64_t per_rank = (int64_t)B * grid->dp;
    if (windows <= 0 || windows % per_rank)
        fatal(EXIT_CONFIG, "an evaluation through the pipeline takes whole microbatches on "
              "every dp rank: %lld windows is not a multiple of train.microbatch_size * "
              "parallel.dp = %lld", (long long)windows, (long long)per_rank);
    const int64_t microbatches = windows / per_rank;
    const StepLoss loss =
        executor_run_evaluation(step->executor, data, microbatches, grid->dp_rank, grid->dp);
    /* every microbatch holds B T tokens, so the mean of their means is the token mean */
    double sum = loss.loss, total;
    comm_allreduce_sum(grid->world, &sum, &total, 1, COMM_FLOAT64, COMM_KIND_OTHER);
    return total / (double)(microbatches * grid->dp);
}
