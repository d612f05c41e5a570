/* model/model.c — see model.h: the model's lifetime, and the one-chunk case (the whole
 * network as one span of model/chunk.c). */
#include "model/model.h"

#include <stdlib.h>

#include "model/init.h"
#include "model/model_internal.h"
#include "model/rope_table.h"
#include "runtime/error.h"

static void model_check_config(const ModelConfig *config)
{
    if (config->n_kv_heads < 1 || config->n_heads < 1 ||
        config->n_heads % config->n_kv_heads != 0)
        fatal(EXIT_CONFIG, "model.n_kv_heads = %d must divide model.n_heads = %d",
              config->n_kv_heads, config->n_heads);
    if (!(config->norm_eps > 0))
        fatal(EXIT_CONFIG, "model.norm_eps = %g must be > 0", config->norm_eps);
}

Model *model_create(const Backend *backend, const ModelConfig *config,
                    const ResidualConfig *residual, int max_batch, int seq_len)
{
    return model_create_sharded(backend, config, residual, max_batch, seq_len, NULL);
}

Model *model_create_sharded(const Backend *backend, const ModelConfig *config,
                            const ResidualConfig *residual, int max_batch, int seq_len,
                            const ModelSharding *sharding)
{
    model_check_config(config);
    Model *model = xcalloc(1, sizeof *model);
    model->backend = backend;
    model->config = *config;
    if (residual)
        model->residual = *residual;
    else
        model->residual.mode = RESIDUAL_STANDARD;
    residual_plan_build(&model->plan, config, residual);
    param_table_build_with_residual(&model->table, config, residual);

    /* DESIGN 3: the ops read a compute copy in the activation dtype (fp32 needs none), of
     * this rank's shards, gathered unit by unit (runtime/fsdp.h) */
    model_units_create(model, sharding);

    const size_t table_count = (size_t)seq_len * (config->head_dim / 2);
    const size_t table_bytes = (table_count ? table_count : 1) * sizeof(float);
    float *cos_host = xmalloc(table_bytes), *sin_host = xmalloc(table_bytes);
    scratch_create(&model->scratch, backend, config, &model->plan, max_batch, seq_len, false);
    chunk_spans_build(&model->whole, 1, config, &model->plan, NULL, 0);
    if (model->plan.mode != RESIDUAL_STANDARD)
        model_routing_resolve(model);
    model_units_bind_fixed(model);
    rope_table_build(cos_host, sin_host, seq_len, config);
    model->rope_cos = backend->alloc(table_bytes);
    model->rope_sin = backend->alloc(table_bytes);
    backend->upload(model->rope_cos, cos_host, table_bytes);
    backend->upload(model->rope_sin, sin_host, table_bytes);
    free(cos_host);
    free(sin_host);
    return model;
}

void model_destroy(Model *model)
{
    if (!model)
        return;
    const Backend *backend = model->backend;
    if (model->whole_ready) {
        stash_destroy(&model->whole_stash, backend);
        store_destroy(&model->whole_store, backend);
    }
    scratch_destroy(&model->scratch, backend);
    backend->release(model->rope_cos);
    backend->release(model->rope_sin);
    model_routing_free(model);
    model_units_destroy(model);
    residual_plan_free(&model->plan);
    param_table_free(&model->table);
    free(model);
}

const ParamTable *model_param_table(const Model *model) { return &model->table; }
const ModelConfig *model_config(const Model *model) { return &model->config; }
const ResidualConfig *model_residual(const Model *model) { return &model->residual; }
const Backend *model_backend(const Model *model) { return model->backend; }
float *model_params(Model *model) { return fsdp_local_params(model->fsdp); }
float *model_grads(Model *model) { return fsdp_local_grads(model->fsdp); }
Activation *model_compute_copy(Model *model) { return fsdp_local_compute(model->fsdp); }
void model_refresh_compute_copy(Model *model) { fsdp_refresh_compute(model->fsdp); }
Fsdp *model_fsdp(Model *model) { return model->fsdp; }

void model_memory_bytes(const Model *model, size_t *parameter_bytes, size_t *activation_bytes)
{
    size_t shards, full;
    fsdp_memory_bytes(model->fsdp, &shards, &full);
    *parameter_bytes = shards + full;
    *activation_bytes = model->scratch.bytes;
    if (model->whole_ready)
        *activation_bytes += model->whole_stash.bytes + model->whole_store.bytes;
    else
        *activation_bytes += model_whole_stash_bytes(model, model->scratch.checkpointing);
}

size_t model_whole_stash_bytes(const Model *model, bool checkpointed)
{
    const int max_batch = model->scratch.max_batch, T = model->scratch.T;
    return stash_bytes(model->backend, &model->config, &model->plan, max_batch, T,
                       chunk_stash_shape(&model->whole, checkpointed)) +
           store_bytes(model->backend, &model->config, &model->plan, max_batch, T, NULL);
}

void model_set_activation_checkpointing(Model *model, bool enabled)
{
    if (model->scratch.checkpointing == enabled)
        return;
    if (model->whole_ready)
        fatal(EXIT_CONFIG, "activation checkpointing is chosen before the first forward");
    const int max_batch = model->scratch.max_batch, T = model->scratch.T;
    scratch_destroy(&model->scratch, model->backend);
    scratch_create(&model->scratch, model->backend, &model->config, &model->plan, max_batch,
                   T, enabled);
}

void model_route_sites_alone(Model *model, bool alone)
{
    if (model->plan.sites_alone == alone)
        return;
    /* the stashes are sized by the walk (residual_site_keeps_weights) */
    if (model->whole_ready)
        fatal(EXIT_CONFIG, "model_route_sites_alone is chosen before the first forward");
    model->plan.sites_alone = alone;
}

bool model_activation_checkpointing(const Model *model)
{
    return model->scratch.checkpointing;
}

void model_set_logit_rows(Model *model, int rows)
{
    if (rows < 1 || rows > model->scratch.logit_capacity)
        fatal(EXIT_CONFIG, "logit chunks of %d rows: the model was made for 1 to %d", rows,
              model->scratch.logit_capacity);
    model->scratch.logit_rows = rows;
    model->scratch.logits_owner = NULL;
    model->scratch.chunk_owner = NULL;
    model->scratch.spare_owner = NULL;
}

void model_keep_all_logits(Model *model)
{
    ModelScratch *scratch = &model->scratch;
    if (scratch->all_logits)
        return;
    const size_t count = (size_t)scratch->max_batch * scratch->T * model->config.vocab_size;
    scratch->all_logits = model->backend->alloc(count * model->backend->activation_bytes);
    if (!scratch->all_logits)
        fatal(EXIT_CONFIG, "cannot allocate %.2f GiB to keep the logits of %d x %d tokens",
              (double)(count * model->backend->activation_bytes) / (1 << 30),
              scratch->max_batch, scratch->T);
    scratch->logits_owner = NULL;
    scratch->chunk_owner = NULL;
    scratch->spare_owner = NULL;
}

int model_last_tokens(const Model *model)
{
    if (model->lent_stash)
        return model->lent_stash->batch * model->scratch.T;
    return model->whole_ready ? model->whole_stash.batch * model->scratch.T : 0;
}

void model_read_logits(const Model *model, float *host_out)
{
    const ModelScratch *scratch = &model->scratch;
    if (model_last_tokens(model) == 0)
        fatal(EXIT_CONFIG, "model_read_logits needs a model_forward first");
    const size_t rows = (size_t)model_last_tokens(model);
    const Stash *stash = model->lent_stash ? model->lent_stash : &model->whole_stash;
    if (scratch->logits_owner != &stash->head)
        fatal(EXIT_CONFIG, "the logits of %zu tokens were made in chunks of %d and not kept "
              "(model_keep_all_logits keeps them)", rows, scratch->logit_rows);
    if (!scratch->all_logits && scratch->chunk_gradient)
        fatal(EXIT_CONFIG, "the logits of the last forward were replaced by their gradient "
              "(model_forward_train); model_forward keeps them");
    model->backend->activations_download(host_out,
                                         scratch->all_logits ? scratch->all_logits
                                                             : scratch->logits,
                                         rows * model->config.vocab_size);
}

/* The whole network's stash and store, made at the first forward of the one-chunk case. */
static void model_whole_prepare(Model *model)
{
    if (model->whole_ready)
        return;
    const int max_batch = model->scratch.max_batch, T = model->scratch.T;
    stash_create(&model->whole_stash, model->backend, &model->config, &model->plan, max_batch,
                 T, chunk_stash_shape(&model->whole, model->scratch.checkpointing));
    store_create(&model->whole_store, model->backend, &model->config, &model->plan, max_batch,
                 T, NULL);
    model->whole_ready = true;
}

void model_lend_stash(Model *model, Stash *stash, SummaryStore *store)
{
    const StashShape whole = chunk_stash_shape(&model->whole, stash->checkpointed);
    if (model->whole_ready || stash->first_sublayer != whole.first_sublayer ||
        stash->end_sublayer != whole.end_sublayer || !stash->has_embedding ||
        !stash->has_head)
        fatal(EXIT_CONFIG, "a lent stash must span the whole network, before any forward");
    model->lent_stash = stash;
    model->lent_store = store;
}

static Stash *whole_stash(Model *model)
{
    return model->lent_stash ? model->lent_stash : &model->whole_stash;
}

static SummaryStore *whole_store(Model *model)
{
    return model->lent_store ? model->lent_store : &model->whole_store;
}

ModelLoss model_forward_train(Model *model, const uint32_t *inputs, const uint32_t *targets,
                              int B, float z_loss, float loss_scale)
{
    if (!model->lent_stash)
        model_whole_prepare(model);
    return chunk_forward(model, &model->whole, whole_stash(model), whole_store(model), inputs,
                         targets, B, z_loss, loss_scale);
}

ModelLoss model_forward(Model *model, const uint32_t *inputs, const uint32_t *targets, int B,
                        float z_loss)
{
    return model_forward_train(model, inputs, targets, B, z_loss, 0.0f);
}

void model_backward(Model *model, float loss_scale)
{
    if (model_last_tokens(model) == 0)
        fatal(EXIT_CONFIG, "model_backward needs a model_forward first");
    store_zero_grads(model, whole_store(model));
    chunk_backward(model, &model->whole, whole_stash(model), whole_store(model), loss_scale);
}

const ResidualPlan *model_plan(const Model *model) { return &model->plan; }

int model_max_batch(const Model *model) { return model->scratch.max_batch; }
