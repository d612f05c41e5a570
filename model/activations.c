/* model/activations.c — see activations.h.
 *
 * The buffers are laid out twice by the same code: a first pass with no base address only
 * adds up the sizes, the second hands out pointers into the one allocation. Each buffer
 * starts on a 256-byte boundary (what vectorised and device loads like).
 */
#include "model/activations.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

#define ACTIVATION_ALIGNMENT 256

typedef struct {
    char *base;   /* NULL in the sizing pass */
    size_t used;  /* bytes handed out so far */
} Carver;

static float *carve_floats(Carver *carver, size_t count)
{
    size_t start = carver->used;
    size_t bytes = count * sizeof(float);
    carver->used = start + (bytes + ACTIVATION_ALIGNMENT - 1) / ACTIVATION_ALIGNMENT *
                               ACTIVATION_ALIGNMENT;
    return carver->base ? (float *)(carver->base + start) : NULL;
}

static uint32_t *carve_tokens(Carver *carver, size_t count)
{
    return (uint32_t *)carve_floats(carver, count); /* uint32 and float are both 4 bytes */
}

static void activations_layout(Activations *act, Carver *carver, const ModelConfig *config)
{
    const size_t N = (size_t)act->max_batch * act->T;
    const size_t d = config->d_model, F = config->ffn_dim, V = config->vocab_size;
    const size_t q_dim = (size_t)config->n_heads * config->head_dim;
    const size_t kv_dim = (size_t)config->n_kv_heads * config->head_dim;
    const int L = config->n_layers;

    for (int j = 0; j <= 2 * L; j++)
        act->stream[j] = carve_floats(carver, N * d);
    for (int i = 0; i < L; i++) {
        LayerActivations *layer = &act->layers[i];
        layer->attention_normed = carve_floats(carver, N * d);
        layer->attention_rstd = carve_floats(carver, N);
        if (config->qk_norm) {
            layer->q_projected = carve_floats(carver, N * q_dim);
            layer->k_projected = carve_floats(carver, N * kv_dim);
            layer->q_norm_rstd = carve_floats(carver, N * config->n_heads);
            layer->k_norm_rstd = carve_floats(carver, N * config->n_kv_heads);
        }
        layer->q = carve_floats(carver, N * q_dim);
        layer->k = carve_floats(carver, N * kv_dim);
        layer->v = carve_floats(carver, N * kv_dim);
        layer->attention_output = carve_floats(carver, N * q_dim);
        layer->attention_lse = carve_floats(carver, N * config->n_heads);
        layer->mlp_normed = carve_floats(carver, N * d);
        layer->mlp_rstd = carve_floats(carver, N);
        layer->gate = carve_floats(carver, N * F);
        layer->up = carve_floats(carver, N * F);
        layer->hidden = carve_floats(carver, N * F);
    }
    act->final_normed = carve_floats(carver, N * d);
    act->final_rstd = carve_floats(carver, N);
    act->logits = carve_floats(carver, N * V);
    act->token_losses = carve_floats(carver, N);
    act->token_lse = carve_floats(carver, N);
    act->inputs = carve_tokens(carver, N);
    act->targets = carve_tokens(carver, N);

    ActivationScratch *scratch = &act->scratch;
    scratch->sublayer_output = carve_floats(carver, N * d);
    scratch->grad_stream = carve_floats(carver, N * d);
    scratch->grad_normed = carve_floats(carver, N * d);
    for (int k = 0; k < 2; k++) {
        scratch->grad_q[k] = carve_floats(carver, N * q_dim);
        scratch->grad_k[k] = carve_floats(carver, N * kv_dim);
    }
    scratch->grad_v = carve_floats(carver, N * kv_dim);
    scratch->grad_gate = carve_floats(carver, N * F);
    scratch->grad_up = carve_floats(carver, N * F);
    scratch->grad_hidden = carve_floats(carver, N * F);
    scratch->grad_logits = carve_floats(carver, N * V);
    scratch->grad_token_loss = carve_floats(carver, N);
}

void activations_create(Activations *act, const Backend *backend, const ModelConfig *config,
                        int max_batch, int T)
{
    if (max_batch < 1)
        fatal(EXIT_CONFIG, "train.microbatch_size = %d must be >= 1", max_batch);
    if (T < 1)
        fatal(EXIT_CONFIG, "train.seq_len = %d must be >= 1", T);
    memset(act, 0, sizeof *act);
    act->max_batch = max_batch;
    act->T = T;
    act->stream = xcalloc((size_t)2 * config->n_layers + 1, sizeof *act->stream);
    act->layers = xcalloc((size_t)config->n_layers, sizeof *act->layers);

    Carver sizing = {.base = NULL, .used = 0};
    activations_layout(act, &sizing, config);
    act->bytes = sizing.used;
    act->memory = backend->alloc(act->bytes);
    if (!act->memory)
        fatal(EXIT_CONFIG, "cannot allocate %.2f GiB of activations for %d x %d tokens on "
              "the %s backend (lower train.microbatch_size or train.seq_len)",
              (double)act->bytes / (1 << 30), max_batch, T, backend->name);
    Carver carving = {.base = act->memory, .used = 0};
    activations_layout(act, &carving, config);
}

void activations_destroy(Activations *act, const Backend *backend)
{
    if (act->memory)
        backend->release(act->memory);
    free(act->stream);
    free(act->layers);
    memset(act, 0, sizeof *act);
}
