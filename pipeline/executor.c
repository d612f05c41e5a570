/* pipeline/executor.c — see executor.h. */
#include "pipeline/executor.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/device_comm.h"
#include "runtime/error.h"
#include "runtime/fault.h"

/* The hops of one direction between two stages: a group of the sending stage (group rank 0)
 * and the receiving one (group rank 1; the same rank with one stage). */
typedef struct {
    Comm *group;
    DeviceComm *comm;
} HopLink;

enum { DIRECTION_FORWARD = 0, DIRECTION_BACKWARD = 1 };

struct Executor {
    Model *model;
    const Config *config;
    const Backend *backend;
    Comm *pp;
    int P, v, M, stage, n_chunks;
    ChunkSpan *spans;         /* [n_chunks] */
    Action *actions;
    int n_actions;
    bool checkpointing;
    /* stashes of local chunk k (global chunk k P + stage): slots[k] of them */
    int *slots;
    Stash **stashes;          /* [v][slots[k]] */
    int **stash_microbatch;   /* [v][slots[k]]: the microbatch held, -1 free */
    int n_stores;
    SummaryStore *stores;
    int *store_microbatch;    /* [n_stores] */
    bool *needed;             /* the summary buffers this stage touches (NULL: standard) */
    Activation *grad_staging; /* [rows, d] where a received gradient lands before the add */
    uint32_t *inputs, *targets;
    uint32_t *window;         /* [T + 1] one evaluation window */
    size_t tensor_bytes;      /* one [rows, d] activation tensor of a full microbatch */
    /* links[direction][s]: the hops stage s sends in that direction (forward to s+1,
     * backward to s-1, mod P); only those this stage sends or receives are made */
    HopLink *links[2];
};

/* Whether stage s sends hops in `direction`: forward from every chunk but the last, backward
 * from every chunk but the first. */
static bool stage_sends(const Executor *executor, int direction, int s)
{
    return executor->v > 1 ||
           (direction == DIRECTION_FORWARD ? s < executor->P - 1 : s > 0);
}

static int hop_receiver(const Executor *executor, int direction, int s)
{
    const int P = executor->P;
    return direction == DIRECTION_FORWARD ? (s + 1) % P : (s - 1 + P) % P;
}

/* Collective over the pipeline: every stage walks the same (direction, sender) list, so the
 * pairwise creations happen in one global order and cannot wait on each other in a cycle. */
static void links_create(Executor *executor)
{
    const int P = executor->P, stage = executor->stage;
    for (int direction = 0; direction < 2; direction++) {
        executor->links[direction] = xcalloc((size_t)P, sizeof(HopLink));
        for (int s = 0; s < P; s++) {
            if (!stage_sends(executor, direction, s))
                continue;
            const bool sender = stage == s;
            const bool member = sender || stage == hop_receiver(executor, direction, s);
            HopLink *link = &executor->links[direction][s];
            link->group = comm_split(executor->pp, member ? 0 : COMM_NO_GROUP, sender ? 0 : 1);
            if (link->group)
                link->comm = device_comm_create(link->group, executor->backend);
        }
    }
}

static void links_destroy(Executor *executor)
{
    for (int direction = 0; direction < 2; direction++) {
        if (!executor->links[direction])
            continue;
        for (int s = 0; s < executor->P; s++) {
            device_comm_destroy(executor->links[direction][s].comm);
            comm_free(executor->links[direction][s].group);
        }
        free(executor->links[direction]);
    }
}

static void links_flush(Executor *executor)
{
    for (int direction = 0; direction < 2; direction++)
        if (executor->links[direction] && executor->links[direction][executor->stage].comm)
            device_comm_flush(executor->links[direction][executor->stage].comm);
}

static void executor_allocate(Executor *executor)
{
    Model *model = executor->model;
    const Backend *backend = executor->backend;
    const ModelConfig *config = model_config(model);
    const ResidualPlan *plan = model_plan(model);
    const int max_batch = model_max_batch(model), T = executor->config->train.seq_len;
    executor->stashes = xcalloc((size_t)executor->v, sizeof *executor->stashes);
    executor->stash_microbatch = xcalloc((size_t)executor->v, sizeof *executor->stash_microbatch);
    for (int k = 0; k < executor->v; k++) {
        const ChunkSpan *span = &executor->spans[k * executor->P + executor->stage];
        executor->stashes[k] = xcalloc((size_t)executor->slots[k], sizeof(Stash));
        executor->stash_microbatch[k] = xmalloc((size_t)executor->slots[k] * sizeof(int));
        for (int s = 0; s < executor->slots[k]; s++) {
            stash_create(&executor->stashes[k][s], backend, config, plan, max_batch, T,
                         chunk_stash_shape(span, executor->checkpointing));
            executor->stash_microbatch[k][s] = -1;
        }
    }
    executor->stores = xcalloc((size_t)executor->n_stores, sizeof *executor->stores);
    executor->store_microbatch = xmalloc((size_t)executor->n_stores * sizeof(int));
    for (int s = 0; s < executor->n_stores; s++) {
        store_create(&executor->stores[s], backend, config, plan, max_batch, T,
                     executor->needed);
        executor->store_microbatch[s] = -1;
    }
    executor->tensor_bytes = (size_t)max_batch * T * config->d_model * backend->activation_bytes;
    if (executor->P > 1)
        executor->grad_staging = backend->alloc(executor->tensor_bytes);
    const size_t tokens = (size_t)max_batch * T * sizeof(uint32_t);
    executor->inputs = xmalloc(tokens);
    executor->targets = xmalloc(tokens);
    executor->window = xmalloc(((size_t)T + 1) * sizeof(uint32_t));
}

Executor *executor_create(Model *model, const Config *config, Comm *pp, int stage)
{
    Executor *executor = xcalloc(1, sizeof *executor);
    executor->model = model;
    executor->config = config;
    executor->backend = model_backend(model);
    executor->pp = pp;
    executor->P = config->parallel.pp;
    executor->v = config->parallel.virtual_stages;
    executor->M = config_microbatches_per_rank(config);
    executor->stage = stage;
    executor->n_chunks = executor->P * executor->v;
    executor->checkpointing = config->train.activation_checkpointing == CHECKPOINTING_FULL;
    const PipelineSchedule schedule = config->parallel.schedule;
    const char *problem = schedule_check(schedule, executor->P, executor->v, executor->M);
    if (problem)
        fatal(EXIT_CONFIG, "%s", problem);

    executor->spans = xcalloc((size_t)executor->n_chunks, sizeof *executor->spans);
    chunk_spans_build(executor->spans, executor->n_chunks, model_config(model),
                      model_plan(model), config->parallel.layer_split,
                      config->parallel.n_layer_split);
    executor->n_actions = schedule_actions(schedule, executor->P, executor->v, executor->M,
                                           stage, NULL, 0);
    executor->actions = xcalloc((size_t)executor->n_actions, sizeof *executor->actions);
    schedule_actions(schedule, executor->P, executor->v, executor->M, stage,
                     executor->actions, executor->n_actions);
    executor->slots = xcalloc((size_t)executor->v, sizeof *executor->slots);
    schedule_count_in_flight(executor->actions, executor->n_actions, executor->P, executor->v,
                             executor->M, executor->slots, &executor->n_stores);

    ChunkSpan *mine = xcalloc((size_t)executor->v, sizeof *mine);
    for (int k = 0; k < executor->v; k++)
        mine[k] = executor->spans[k * executor->P + stage];
    executor->needed = store_needed_buffers(model, mine, executor->v);
    free(mine);
    model_set_activation_checkpointing(model, executor->checkpointing);
    executor_allocate(executor);
    if (executor->n_chunks > 1 && pp)
        links_create(executor);
    if (executor->n_chunks == 1) /* evaluation between steps reuses the one stash */
        model_lend_stash(model, &executor->stashes[0][0], &executor->stores[0]);
    return executor;
}

void executor_destroy(Executor *executor)
{
    if (!executor)
        return;
    links_destroy(executor);
    const Backend *backend = executor->backend;
    for (int k = 0; k < executor->v; k++) {
        for (int s = 0; s < executor->slots[k]; s++)
            stash_destroy(&executor->stashes[k][s], backend);
        free(executor->stashes[k]);
        free(executor->stash_microbatch[k]);
    }
    for (int s = 0; s < executor->n_stores; s++)
        store_destroy(&executor->stores[s], backend);
    if (executor->grad_staging)
        backend->release(executor->grad_staging);
    free(executor->stashes);
    free(executor->stash_microbatch);
    free(executor->stores);
    free(executor->store_microbatch);
    free(executor->needed);
    free(executor->slots);
    free(executor->spans);
    free(executor->actions);
    free(executor->inputs);
    free(executor->targets);
    free(executor->window);
    free(executor);
}

const ChunkSpan *executor_spans(const Executor *executor, int *n_chunks)
{
    *n_chunks = executor->n_chunks;
    return executor->spans;
}

int executor_stage(const Executor *executor) { return executor->stage; }

int executor_stash_count(const Executor *executor)
{
    int count = 0;
    for (int k = 0; k < executor->v; k++)
        count += executor->slots[k];
    return count;
}

size_t executor_activation_bytes(const Executor *executor)
{
    size_t bytes = 0;
    for (int k = 0; k < executor->v; k++)
        for (int s = 0; s < executor->slots[k]; s++)
            bytes += executor->stashes[k][s].bytes;
    for (int s = 0; s < executor->n_stores; s++)
        bytes += executor->stores[s].bytes;
    return bytes;
}

size_t executor_plan_bytes(const Executor *executor, bool checkpointed)
{
    const Model *model = executor->model;
    const int max_batch = model_max_batch(model), T = executor->config->train.seq_len;
    size_t bytes = 0;
    for (int k = 0; k < executor->v; k++) {
        const ChunkSpan *span = &executor->spans[k * executor->P + executor->stage];
        bytes += (size_t)executor->slots[k] *
                 stash_bytes(executor->backend, model_config(model), model_plan(model),
                             max_batch, T, chunk_stash_shape(span, checkpointed));
    }
    bytes += (size_t)executor->n_stores * store_bytes(executor->backend, model_config(model),
                                                      model_plan(model), max_batch, T,
                                                      executor->needed);
    return bytes;
}

const char *executor_hop_method(const Executor *executor, const char **reason)
{
    const DeviceComm *link = executor->links[DIRECTION_FORWARD]
                                 ? executor->links[DIRECTION_FORWARD][executor->stage].comm
                                 : NULL;
    if (!link)
        return NULL;
    *reason = device_comm_reason(link);
    return device_comm_method(link);
}

size_t executor_held_bytes(const Executor *executor)
{
    size_t bytes = 0;
    for (int direction = 0; direction < 2; direction++)
        if (executor->links[direction] && executor->links[direction][executor->stage].comm)
            bytes += device_comm_held_bytes(executor->links[direction][executor->stage].comm,
                                            NULL);
    return bytes;
}

PayloadBytes executor_predicted_bytes(const Executor *executor)
{
    return payload_predict(model_plan(executor->model), executor->spans, executor->n_chunks,
                           executor->P, executor->stage, executor->M,
                           (uint64_t)executor->tensor_bytes);
}

/* ---- the pools ---- */

static Stash *stash_acquire(Executor *executor, int local, int microbatch)
{
    for (int s = 0; s < executor->slots[local]; s++)
        if (executor->stash_microbatch[local][s] < 0) {
            executor->stash_microbatch[local][s] = microbatch;
            return &executor->stashes[local][s];
        }
    fatal(EXIT_CONFIG, "stage %d ran out of stashes for chunk %d (a schedule bug)",
          executor->stage, local * executor->P + executor->stage);
}

static Stash *stash_find(Executor *executor, int local, int microbatch, bool release)
{
    for (int s = 0; s < executor->slots[local]; s++)
        if (executor->stash_microbatch[local][s] == microbatch) {
            if (release)
                executor->stash_microbatch[local][s] = -1;
            return &executor->stashes[local][s];
        }
    fatal(EXIT_CONFIG, "stage %d has no stash of microbatch %d for chunk %d", executor->stage,
          microbatch, local * executor->P + executor->stage);
}

/* The microbatch's store; the first forward on this stage takes a free one, zeroed. */
static SummaryStore *store_for(Executor *executor, int microbatch, bool first_use)
{
    for (int s = 0; s < executor->n_stores; s++)
        if (executor->store_microbatch[s] == microbatch)
            return &executor->stores[s];
    if (!first_use)
        fatal(EXIT_CONFIG, "stage %d has no summary store of microbatch %d", executor->stage,
              microbatch);
    for (int s = 0; s < executor->n_stores; s++)
        if (executor->store_microbatch[s] < 0) {
            executor->store_microbatch[s] = microbatch;
            store_zero_grads(executor->model, &executor->stores[s]);
            return &executor->stores[s];
        }
    fatal(EXIT_CONFIG, "stage %d ran out of summary stores (a schedule bug)", executor->stage);
}

static void store_release(Executor *executor, int microbatch)
{
    for (int s = 0; s < executor->n_stores; s++)
        if (executor->store_microbatch[s] == microbatch)
            executor->store_microbatch[s] = -1;
}

/* ---- hops ---- */

/* The [rows, d] tensors of a hop, in message order: the stream, then the summaries. */
static int hop_tensors(Executor *executor, HopPayload hop, Stash *stash, SummaryStore *store,
                       const ChunkSpan *span, bool output, bool gradients, Activation **out)
{
    Model *model = executor->model;
    int n = 0;
    if (hop.stream) {
        if (gradients)
            out[n++] = chunk_grad_stream(model);
        else
            out[n++] = output ? chunk_output_stream(model, span, stash, store)
                              : chunk_input_stream(model, span, stash, store);
    }
    for (int block = hop.first_block; block < hop.end_block; block++)
        out[n++] = gradients ? store_summary_grad(store, block)
                             : store_summary(model, store, block);
    return n;
}

/* Sends n tensors to the next stage in `direction`, one message each. */
static void send_tensors(Executor *executor, int direction, Activation **tensors, int n,
                         size_t bytes, uint64_t summary_bytes, uint64_t uncached_bytes)
{
    DeviceComm *comm = executor->links[direction][executor->stage].comm;
    const int receiver = comm_size(device_comm_group(comm)) - 1; /* itself with one stage */
    fault_hop_send(); /* the tests' switch, runtime/fault.h */
    for (int t = 0; t < n; t++)
        device_comm_send(comm, tensors[t], bytes, receiver, COMM_KIND_PP_SEND);
    comm_count(COMM_KIND_PP_SUMMARY, summary_bytes);
    comm_count(COMM_KIND_PP_SUMMARY_UNCACHED, uncached_bytes);
}

/* Receives n tensors from the stage before in `direction`; each goes to its place, or from
 * first_added on is added into it (through the staging tensor). */
static void recv_tensors(Executor *executor, int direction, Activation **tensors, int n,
                         size_t bytes, int first_added)
{
    const Backend *backend = executor->backend;
    const int P = executor->P;
    const int sender = direction == DIRECTION_FORWARD ? (executor->stage - 1 + P) % P
                                                      : (executor->stage + 1) % P;
    DeviceComm *comm = executor->links[direction][sender].comm;
    for (int t = 0; t < n; t++) {
        if (t < first_added) {
            device_comm_recv(comm, tensors[t], bytes, 0, COMM_KIND_PP_RECV);
        } else {
            device_comm_recv(comm, executor->grad_staging, bytes, 0, COMM_KIND_PP_RECV);
            backend->add_inplace(tensors[t], executor->grad_staging,
                                 bytes / backend->activation_bytes);
        }
    }
}

static uint64_t hop_summary_bytes(HopPayload hop, size_t bytes)
{
    return (uint64_t)(hop.end_block - hop.first_block) * bytes;
}

/* Where a forward's tokens come from: the step's share of the training samples, or an
 * evaluation's windows in file order. */
typedef struct {
    DataSet *data;
    bool evaluation;
    uint64_t consumed_samples; /* training: the step's first global sample */
    int64_t first_microbatch;  /* evaluation: this rank's microbatches before this group */
    int dp_rank, dp_size;
} ForwardInput;

/* Microbatch mb's tokens into executor->inputs and targets. The evaluation's microbatch i of
 * dp rank r is the (i D + r)-th run of B windows: the windows a one-rank evaluation reads
 * as its (i D + r)-th batch. */
static void read_microbatch(Executor *executor, const ForwardInput *input, int mb)
{
    const Config *config = executor->config;
    const int B = config->train.microbatch_size, T = config->train.seq_len;
    if (!input->evaluation) {
        data_read_microbatch(input->data, input->consumed_samples,
                             config->train.global_batch_size, input->dp_rank, input->dp_size,
                             mb, B, executor->inputs, executor->targets);
        return;
    }
    const int64_t batch = (input->first_microbatch + mb) * input->dp_size + input->dp_rank;
    for (int row = 0; row < B; row++) {
        data_read_window(input->data, (uint64_t)(batch * B + row), executor->window);
        memcpy(executor->inputs + (size_t)row * T, executor->window, T * sizeof(uint32_t));
        memcpy(executor->targets + (size_t)row * T, executor->window + 1, T * sizeof(uint32_t));
    }
}

/* loss_scale: the step's (its backward follows), or 0 in an evaluation */
static void run_forward(Executor *executor, const Action *action, const ForwardInput *input,
                        StepLoss *loss, float loss_scale)
{
    Model *model = executor->model;
    const Config *config = executor->config;
    const ResidualPlan *plan = model_plan(model);
    const int c = action->chunk, mb = action->microbatch, P = executor->P;
    const ChunkSpan *span = &executor->spans[c];
    const int B = config->train.microbatch_size;
    const size_t bytes = executor->tensor_bytes;
    SummaryStore *store = store_for(executor, mb, true);
    Stash *stash = stash_acquire(executor, c / P, mb);
    Activation **tensors = xcalloc((size_t)plan->n_blocks + 3, sizeof *tensors);
    if (c > 0) {
        const HopPayload hop = payload_hop(plan, executor->spans, executor->n_chunks, P, c - 1,
                                           true);
        const int n = hop_tensors(executor, hop, stash, store, span, false, false, tensors);
        recv_tensors(executor, DIRECTION_FORWARD, tensors, n, bytes, n);
    }
    if (span->has_embedding || span->has_head)
        read_microbatch(executor, input, mb);
    ModelLoss result = chunk_forward(model, span, stash, store, executor->inputs,
                                     executor->targets, B, (float)config->train.z_loss,
                                     loss_scale);
    if (span->has_head) {
        loss->loss += result.loss;
        loss->ce += result.ce;
        loss->zloss += result.zloss;
    }
    if (c < executor->n_chunks - 1) {
        const HopPayload hop = payload_hop(plan, executor->spans, executor->n_chunks, P, c, true);
        const HopPayload plain = payload_hop(plan, executor->spans, executor->n_chunks, P, c,
                                             false);
        const int n = hop_tensors(executor, hop, stash, store, span, true, false, tensors);
        send_tensors(executor, DIRECTION_FORWARD, tensors, n, bytes,
                     hop_summary_bytes(hop, bytes), hop_summary_bytes(plain, bytes));
    }
    free(tensors);
}

static void run_backward(Executor *executor, const Action *action, float loss_scale)
{
    Model *model = executor->model;
    const ResidualPlan *plan = model_plan(model);
    const int c = action->chunk, mb = action->microbatch, P = executor->P;
    const ChunkSpan *span = &executor->spans[c];
    const size_t bytes = executor->tensor_bytes;
    SummaryStore *store = store_for(executor, mb, false);
    Stash *stash = stash_find(executor, c / P, mb, false);
    Activation **tensors = xcalloc((size_t)plan->n_blocks + 3, sizeof *tensors);
    if (c < executor->n_chunks - 1) {
        /* d(output stream) replaces the gradient stream; the summaries' gradients add */
        const HopPayload hop = payload_hop(plan, executor->spans, executor->n_chunks, P, c, true);
        const int n = hop_tensors(executor, hop, stash, store, span, true, true, tensors);
        recv_tensors(executor, DIRECTION_BACKWARD, tensors, n, bytes, hop.stream ? 1 : 0);
    }
    chunk_backward(model, span, stash, store, loss_scale);
    if (c > 0) {
        const HopPayload hop = payload_hop(plan, executor->spans, executor->n_chunks, P, c - 1,
                                           true);
        const HopPayload plain = payload_hop(plan, executor->spans, executor->n_chunks, P,
                                             c - 1, false);
        const int n = hop_tensors(executor, hop, stash, store, span, false, true, tensors);
        send_tensors(executor, DIRECTION_BACKWARD, tensors, n, bytes,
                     hop_summary_bytes(hop, bytes), hop_summary_bytes(plain, bytes));
    }
    free(tensors);
    stash_find(executor, c / P, mb, true);
    if (c / P == 0)
        store_release(executor, mb);
}

StepLoss executor_run_step(Executor *executor, DataSet *data, uint64_t consumed_samples,
                           int dp_rank, int dp_size, float loss_scale)
{
    if (executor->n_chunks > 1 && !executor->links[0])
        fatal(EXIT_CONFIG, "executor of %d chunks without a pipeline communicator runs no step",
              executor->n_chunks);
    const ForwardInput input = {data, false, consumed_samples, 0, dp_rank, dp_size};
    StepLoss loss = {0};
    for (int a = 0; a < executor->n_actions; a++) {
        const Action *action = &executor->actions[a];
        if (action->kind == ACTION_FORWARD)
            run_forward(executor, action, &input, &loss, loss_scale);
        else
            run_backward(executor, action, loss_scale);
    }
    links_flush(executor); /* the step's messages have all left, its counts are complete */
    return loss;
}

/* Microbatches an evaluation takes through the pipeline at once: a group's forward-only
 * list holds a store for each on every stage (schedule_evaluation_actions), so as many as
 * the stage with the fewest stores has. Every stage must walk the same groups: its hops to
 * a neighbour are matched in order, and one link carries all of them (two chunks' hops, with
 * virtual stages), so stages that grouped differently would exchange wrong tensors. Each
 * stage's count is the schedule's (pure), so no stage needs to ask another. */
static int evaluation_group(const Executor *executor)
{
    const PipelineSchedule schedule = executor->config->parallel.schedule;
    const int P = executor->P, v = executor->v, M = executor->M;
    const int n = schedule_actions(schedule, P, v, M, 0, NULL, 0);
    Action *actions = xcalloc((size_t)n, sizeof *actions);
    int *slots = xcalloc((size_t)v, sizeof *slots), group = executor->n_stores;
    for (int s = 0; s < P; s++) {
        int open;
        schedule_actions(schedule, P, v, M, s, actions, n);
        schedule_count_in_flight(actions, n, P, v, M, slots, &open);
        group = open < group ? open : group;
    }
    free(actions);
    free(slots);
    return group;
}

StepLoss executor_run_evaluation(Executor *executor, DataSet *data, int64_t microbatches,
                                 int dp_rank, int dp_size)
{
    if (executor->n_chunks > 1 && !executor->links[0])
        fatal(EXIT_CONFIG, "executor of %d chunks without a pipeline communicator evaluates "
              "nothing", executor->n_chunks);
    const int group = evaluation_group(executor);
    Action *actions = xcalloc((size_t)group * executor->v, sizeof *actions);
    StepLoss loss = {0};
    for (int64_t first = 0; first < microbatches; first += group) {
        const int count = (int)(microbatches - first < group ? microbatches - first : group);
        const int n = schedule_evaluation_actions(executor->P, executor->v, count,
                                                  executor->stage, actions, group * executor->v);
        const ForwardInput input = {data, true, 0, first, dp_rank, dp_size};
        for (int a = 0; a < n; a++) {
            const int local = actions[a].chunk / executor->P, mb = actions[a].microbatch;
            run_forward(executor, &actions[a], &input, &loss, 0.0f);
            stash_find(executor, local, mb, true); /* nothing of a forward is kept */
            if (local == executor->v - 1)
                store_release(executor, mb);
        }
    }
    free(actions);
    links_flush(executor);
    return loss;
}
