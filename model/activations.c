/* model/activations.c — see activations.h.
 *
 * The buffers are laid out twice by the same code: a first pass with no base address only
 * adds up the sizes, the second hands out pointers into the one allocation. Each buffer
 * starts on a 256-byte boundary (what vectorised and device loads like).
 */
#include "model/activations.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

#define ACTIVATION_ALIGNMENT 256

typedef struct {
    char *base;              /* NULL in the sizing pass */
    size_t used;             /* bytes handed out so far */
    size_t activation_bytes; /* the backend's activation element */
} Carver;

static void *carve_bytes(Carver *carver, size_t bytes)
{
    size_t start = carver->used;
    carver->used = start + (bytes + ACTIVATION_ALIGNMENT - 1) / ACTIVATION_ALIGNMENT *
                               ACTIVATION_ALIGNMENT;
    return carver->base ? carver->base + start : NULL;
}

static float *carve_floats(Carver *carver, size_t count)
{
    return carve_bytes(carver, count * sizeof(float));
}

static Activation *carve_activations(Carver *carver, size_t count)
{
    return carve_bytes(carver, count * carver->activation_bytes);
}

static uint32_t *carve_tokens(Carver *carver, size_t count)
{
    return carve_bytes(carver, count * sizeof(uint32_t));
}

/* The sources, saved routing state and routing scratch of attention over depth. */
static void routed_layout(RoutedActivations *routed, Carver *carver, const ResidualPlan *plan,
                          size_t N, size_t d)
{
    const size_t H = (size_t)plan->heads, m = (size_t)plan->streams;
    const size_t M = (size_t)plan->max_sources;
    const bool msar = plan->mode == RESIDUAL_MSAR, delta = plan->form == FORM_DELTA;

    for (int b = 0; b < plan->n_buffers; b++)
        routed->summaries[b] = carve_activations(carver, N * d);
    if (delta) {
        routed->stream = carve_activations(carver, N * d);
        routed->null_rows = carve_activations(carver, N * d);
        routed->zero_tokens = carve_tokens(carver, N);
    }
    for (int j = 0; j < plan->n_sites; j++) {
        SiteActivations *site = &routed->sites[j];
        const size_t sources = (size_t)plan->sites[j].n_sources;
        site->weights = carve_floats(carver, m * sources * N * H);
        site->rstd = carve_floats(carver, m * sources * N);
        if (msar && m > 1) {
            site->mix_gates = carve_floats(carver, N * m);
            site->mix_rstd = carve_floats(carver, N * m);
        }
        if (msar && delta) {
            site->gate_weights = carve_floats(carver, N * H);
            site->gate_rstd = carve_floats(carver, N);
        }
    }

    routed->grad_input = carve_activations(carver, N * d);
    for (int b = 0; b <= plan->n_blocks; b++)
        routed->grad_blocks[b] = carve_activations(carver, N * d);
    if (delta) {
        routed->grad_output = carve_activations(carver, N * d);
        routed->grad_null_rows = carve_activations(carver, N * d);
    }
    RouteScratch *route = &routed->route;
    route->route_backward = carve_floats(carver, M * N * H);
    if (!msar)
        return;
    for (size_t r = 0; r < m; r++) {
        route->streams[r] = carve_activations(carver, N * d);
        route->grad_streams[r] = carve_activations(carver, N * d);
    }
    route->mixed = carve_activations(carver, N * d);
    route->grad_mixed = carve_activations(carver, N * d);
    route->weights = carve_floats(carver, M * N * H);
    route->rstd = carve_floats(carver, M * N);
    route->mix_gates = carve_floats(carver, N * m);
    route->mix_rstd = carve_floats(carver, N * m);
    route->gate_query = carve_activations(carver, d); /* zero from alloc(), never written */
    route->gate_grad_query = carve_floats(carver, d);
    route->gate_grad_key_norm = carve_floats(carver, d);
}

static void activations_layout(Activations *act, Carver *carver, const ModelConfig *config,
                               const ResidualPlan *plan)
{
    const size_t N = (size_t)act->max_batch * act->T;
    const size_t d = config->d_model, F = config->ffn_dim, V = config->vocab_size;
    const size_t q_dim = (size_t)config->n_heads * config->head_dim;
    const size_t kv_dim = (size_t)config->n_kv_heads * config->head_dim;
    const int L = config->n_layers;

    for (int j = 0; j <= 2 * L; j++)
        act->stream[j] = carve_activations(carver, N * d);
    for (int i = 0; i < L; i++) {
        LayerActivations *layer = &act->layers[i];
        layer->attention_normed = carve_activations(carver, N * d);
        layer->attention_rstd = carve_floats(carver, N);
        if (config->qk_norm) {
            layer->q_projected = carve_activations(carver, N * q_dim);
            layer->k_projected = carve_activations(carver, N * kv_dim);
            layer->q_norm_rstd = carve_floats(carver, N * config->n_heads);
            layer->k_norm_rstd = carve_floats(carver, N * config->n_kv_heads);
        }
        layer->q = carve_activations(carver, N * q_dim);
        layer->k = carve_activations(carver, N * kv_dim);
        layer->v = carve_activations(carver, N * kv_dim);
        layer->attention_output = carve_activations(carver, N * q_dim);
        layer->attention_lse = carve_floats(carver, N * config->n_heads);
        layer->mlp_normed = carve_activations(carver, N * d);
        layer->mlp_rstd = carve_floats(carver, N);
        layer->gate = carve_activations(carver, N * F);
        layer->up = carve_activations(carver, N * F);
        layer->hidden = carve_activations(carver, N * F);
    }
    act->final_normed = carve_activations(carver, N * d);
    act->final_rstd = carve_floats(carver, N);
    act->logits = carve_activations(carver, (size_t)act->logit_capacity * V);
    act->token_losses = carve_floats(carver, N);
    act->token_lse = carve_floats(carver, N);
    act->inputs = carve_tokens(carver, N);
    act->targets = carve_tokens(carver, N);

    ActivationScratch *scratch = &act->scratch;
    scratch->sublayer_output = carve_activations(carver, N * d);
    scratch->grad_stream = carve_activations(carver, N * d);
    scratch->grad_normed = carve_activations(carver, N * d);
    for (int k = 0; k < 2; k++) {
        scratch->grad_q[k] = carve_activations(carver, N * q_dim);
        scratch->grad_k[k] = carve_activations(carver, N * kv_dim);
    }
    scratch->grad_v = carve_activations(carver, N * kv_dim);
    scratch->grad_gate = carve_activations(carver, N * F);
    scratch->grad_up = carve_activations(carver, N * F);
    scratch->grad_hidden = carve_activations(carver, N * F);
    scratch->grad_logits = carve_activations(carver, (size_t)act->logit_capacity * V);
    scratch->grad_token_loss = carve_floats(carver, N);

    if (plan->mode != RESIDUAL_STANDARD)
        routed_layout(&act->routed, carver, plan, N, d);
}

/* The host arrays of pointers that the layout fills. */
static void routed_arrays_create(RoutedActivations *routed, const ResidualPlan *plan)
{
    if (plan->mode == RESIDUAL_STANDARD)
        return;
    routed->summaries = xcalloc((size_t)plan->n_buffers, sizeof *routed->summaries);
    routed->sites = xcalloc((size_t)plan->n_sites, sizeof *routed->sites);
    routed->grad_blocks = xcalloc((size_t)plan->n_blocks + 1, sizeof *routed->grad_blocks);
    RouteScratch *route = &routed->route;
    route->taps = xcalloc((size_t)plan->max_sources, sizeof *route->taps);
    route->grad_taps = xcalloc((size_t)plan->max_sources, sizeof *route->grad_taps);
    route->streams = xcalloc((size_t)plan->streams, sizeof *route->streams);
    route->grad_streams = xcalloc((size_t)plan->streams, sizeof *route->grad_streams);
}

static void routed_arrays_destroy(RoutedActivations *routed)
{
    free(routed->summaries);
    free(routed->sites);
    free(routed->grad_blocks);
    free((void *)routed->route.taps);
    free(routed->route.grad_taps);
    free(routed->route.streams);
    free(routed->route.grad_streams);
}

void activations_create(Activations *act, const Backend *backend, const ModelConfig *config,
                        const ResidualPlan *plan, int max_batch, int T)
{
    if (max_batch < 1)
        fatal(EXIT_CONFIG, "train.microbatch_size = %d must be >= 1", max_batch);
    if (T < 1)
        fatal(EXIT_CONFIG, "train.seq_len = %d must be >= 1", T);
    memset(act, 0, sizeof *act);
    act->max_batch = max_batch;
    act->T = T;
    const size_t N = (size_t)max_batch * T;
    const size_t row_bytes = (size_t)config->vocab_size * backend->activation_bytes;
    const size_t chunk = row_bytes ? ACTIVATION_LOGIT_BYTES / row_bytes : N;
    act->logit_rows = (int)(chunk < 1 ? 1 : chunk > N ? N : chunk);
    act->logit_capacity = act->logit_rows;
    act->stream = xcalloc((size_t)2 * config->n_layers + 1, sizeof *act->stream);
    act->layers = xcalloc((size_t)config->n_layers, sizeof *act->layers);
    routed_arrays_create(&act->routed, plan);

    Carver sizing = {.base = NULL, .used = 0, .activation_bytes = backend->activation_bytes};
    activations_layout(act, &sizing, config, plan);
    act->bytes = sizing.used;
    act->memory = backend->alloc(act->bytes);
    if (!act->memory)
        fatal(EXIT_CONFIG, "cannot allocate %.2f GiB of activations for %d x %d tokens on "
              "the %s backend (lower train.microbatch_size or train.seq_len)",
              (double)act->bytes / (1 << 30), max_batch, T, backend->name);
    Carver carving = {.base = act->memory, .used = 0,
                      .activation_bytes = backend->activation_bytes};
    activations_layout(act, &carving, config, plan);
}

void activations_destroy(Activations *act, const Backend *backend)
{
    if (act->memory)
        backend->release(act->memory);
    free(act->stream);
    free(act->layers);
    routed_arrays_destroy(&act->routed);
    memset(act, 0, sizeof *act);
}
