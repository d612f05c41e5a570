/* launch/inference.c — see inference.h. */
#include "launch/inference.h"

#include "checkpoints/checkpoint.h"
#include "launch/backend_select.h"
#include "launch/run_state.h"
#include "runtime/error.h"

#include <stdlib.h>
#include <string.h>

void inference_open(Inference *inference, const char *checkpoint, const char *weights)
{
    memset(inference, 0, sizeof *inference);
    CheckpointMeta meta;
    char *config_yaml = NULL;
    checkpoint_read_meta(checkpoint, &meta, &config_yaml, inference->step_dir,
                         sizeof inference->step_dir);
    config_load_text(&inference->config, config_yaml, inference->step_dir, NULL, 0,
                     CONFIG_ANY_WORLD);
    free(config_yaml);
    inference->step = meta.step;

    const Config *config = &inference->config;
    /* the EMA by default where the checkpoint has one: a step-0 import holds /model only */
    const bool has_ema = config->optim.ema_decay > 0 &&
                         (checkpoint_saved_groups(inference->step_dir) & (1u << CKPT_GROUP_EMA));
    bool use_ema = weights ? !strcmp(weights, "ema") : has_ema;
    if (use_ema && !has_ema)
        fatal(EXIT_DATA, "%s holds no EMA weights (%s); use --weights raw",
              inference->step_dir, config->optim.ema_decay > 0
                                       ? "a step-0 import holds the model only"
                                       : "optim.ema_decay was 0");
    inference->weights = use_ema ? "ema" : "raw";

    /* forward only: no gradient buffers, and each layer's intermediates remade in one
     * layer's buffers (activation checkpointing keeps only the layers' inputs; the forward
     * computes the same bits): an 8B model's eval then holds about half of what its
     * training would on one GPU */
    const ModelSharding forward_only = {.forward_only = true};
    /* the training run's matmul_algorithms table was tuned for its products, not the
     * forward-only model's, and may not exist or fit here: eval and probe take cuBLASLt's
     * heuristic */
    inference->config.matmul_algorithms[0] = '\0';
    inference->model = model_create_sharded(backend_select(config->device, config),
                                            &config->model, &config->residual,
                                            config->train.microbatch_size,
                                            config->train.seq_len, &forward_only);
    model_set_activation_checkpointing(inference->model, true);
    run_state_load_weights(inference->model, inference->step_dir, use_ema);
}

void inference_close(Inference *inference)
{
    model_destroy(inference->model);
    inference->model = NULL;
}
