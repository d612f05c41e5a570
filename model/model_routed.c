/* model/model_routed.c — the model's walk with attention over depth (DESIGN 2.1, 2.2):
 * forward and backward over the sites and sublayers, as model/residual.h lays out the
 * sources, and read access to the routing of the last forward (model.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model_internal.h"
#include "runtime/error.h"

/* The routing weights' views; the routed forward and backward read nothing else. */
void model_routing_resolve(Model *model)
{
    const ResidualPlan *plan = &model->plan;
    const ParamTable *table = &model->table;
    model->site_params = xcalloc((size_t)plan->n_sites, sizeof *model->site_params);
    model->site_grads = xcalloc((size_t)plan->n_sites, sizeof *model->site_grads);
    model->site_alpha = xcalloc((size_t)plan->n_sites, sizeof *model->site_alpha);
    for (int j = 0; j < plan->n_sites; j++) {
        site_weights_resolve(&model->site_params[j], model->backend, table, model->compute,
                             model->params, plan, j);
        site_grads_resolve(&model->site_grads[j], table, model->grads, plan, j);
    }
    model->conv_params = xcalloc((size_t)plan->n_slots + 1, sizeof *model->conv_params);
    model->conv_grads = xcalloc((size_t)plan->n_slots + 1, sizeof *model->conv_grads);
    for (int slot = 0; slot < plan->n_slots; slot++) {
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "model.route_streams.%d.conv", slot);
        const size_t offset = param_table_require(table, name)->offset;
        model->conv_params[slot] = activation_at(model->backend, model->compute, offset);
        model->conv_grads[slot] = model->grads + offset;
    }
    if (plan->form == FORM_DELTA) {
        const size_t offset = param_table_require(table, "model.route_null")->offset;
        model->route_null = activation_at(model->backend, model->compute, offset);
        model->grad_route_null = model->grads + offset;
    }
}

void model_routing_free(Model *model)
{
    free(model->site_params);
    free(model->site_grads);
    free(model->site_alpha);
    free(model->conv_params);
    free(model->conv_grads);
}

/* The sources site j reads, as backend pointers [n_sources] (model/residual.h). */
static void site_sources(const Model *model, int site, const Activation **sources)
{
    const SitePlan *plan = &model->plan.sites[site];
    const RoutedActivations *routed = &model->act.routed;
    for (int k = 0; k < plan->n_sources; k++) {
        const int buffer = plan->sources[k].buffer;
        sources[k] = buffer == RESIDUAL_NULL_BUFFER ? routed->null_rows
                                                    : routed->summaries[buffer];
    }
}

/* Where the gradients of site j's sources accumulate [n_sources]. */
static void site_grad_sources(const Model *model, int site, Activation **grads)
{
    const SitePlan *plan = &model->plan.sites[site];
    const RoutedActivations *routed = &model->act.routed;
    for (int k = 0; k < plan->n_sources; k++) {
        const int block = plan->sources[k].grad_block;
        grads[k] = block < 0 ? routed->grad_null_rows : routed->grad_blocks[block];
    }
}

static RouteContext model_route_context(Model *model, int B)
{
    return (RouteContext){
        .backend = model->backend,
        .plan = &model->plan,
        .B = B,
        .T = model->act.T,
        .d = model->config.d_model,
        .max_rows = model->act.max_batch * model->act.T,
        .eps = (float)model->config.norm_eps,
        .conv = model->conv_params,
        .grad_conv = model->conv_grads,
        .scratch = &model->act.routed.route,
    };
}

/* DESIGN 2.1: site j routes over its sources into x_j = stream[j]; f_j lands in its block's
 * buffer (written when it starts the block, else added to the previous partial); the delta
 * form also runs p <- p + f_j. Returns the final site's output, the final norm's input. */
const Activation *model_routed_forward(Model *model, const LayerContext *context,
                                      size_t rows)
{
    const Backend *backend = model->backend;
    Activations *act = &model->act;
    RoutedActivations *routed = &act->routed;
    const ResidualPlan *plan = &model->plan;
    const RouteContext route = model_route_context(model, context->B);
    const int d = model->config.d_model, L2 = plan->n_sublayers;
    const bool delta = plan->form == FORM_DELTA;
    const Activation **sources = xcalloc((size_t)plan->max_sources, sizeof *sources);
    const size_t bytes = rows * d * backend->activation_bytes;

    backend->embedding_forward(routed->summaries[0], act->inputs, model->embedding, (int)rows,
                               d);
    if (delta) {
        backend->copy(routed->stream, routed->summaries[0], bytes);
        /* the null source on every token: a lookup in a table of one row */
        backend->embedding_forward(routed->null_rows, routed->zero_tokens, model->route_null,
                                   (int)rows, d);
        for (int j = 0; j < plan->n_sites; j++) /* the Route op takes alpha by value */
            backend->download(&model->site_alpha[j], model->site_params[j].alpha,
                              sizeof(float));
    }
    for (int j = 0; j <= L2; j++) {
        site_sources(model, j, sources);
        route_site_forward(&route, &plan->sites[j], &model->site_params[j],
                           model->site_alpha[j], &routed->sites[j], sources,
                           delta ? routed->stream : NULL, act->stream[j]);
        if (j == L2)
            break;
        const bool starts_block = residual_sublayer_starts_block(plan, j);
        Activation *partial = routed->summaries[plan->sublayer_buffer[j]];
        Activation *out = starts_block ? partial : act->scratch.sublayer_output;
        model_sublayer_forward(model, context, j, act->stream[j], out);
        if (!starts_block)
            backend->add(partial, routed->summaries[plan->sublayer_buffer[j - 1]], out,
                         rows * d);
        if (delta)
            backend->add_inplace(routed->stream, out, rows * d);
    }
    free(sources);
    return act->stream[L2];
}

/* The routed walk in reverse (DESIGN 2.1). grad_blocks[n] collects d b_n from the sites
 * that read the completed block; while block n is walked it is also the accumulator of the
 * partials its own sites read, since every partial read at j' > j contains f_j. So
 *   replace  d f_j = grad_blocks[n]
 *   delta    d f_j = d p_{j+1} + grad_blocks[n],  d p_j = d p_{j+1} + d x_j
 * then d x_j = J_j^T d f_j, and site j's backward sends d x_j to its sources' gradients.
 * Finally d e = grad_blocks[0] (+ d p_0 in the delta form). */
void model_routed_backward(Model *model, const LayerContext *context, float loss_scale,
                           size_t rows)
{
    const Backend *backend = model->backend;
    Activations *act = &model->act;
    RoutedActivations *routed = &act->routed;
    const ResidualPlan *plan = &model->plan;
    const RouteContext route = model_route_context(model, context->B);
    const int d = model->config.d_model, L2 = plan->n_sublayers;
    const bool delta = plan->form == FORM_DELTA;
    const size_t count = rows * d, bytes = count * backend->activation_bytes;
    Activation *grad_x = routed->grad_input, *grad_stream = act->scratch.grad_stream;
    const Activation **sources = xcalloc((size_t)plan->max_sources, sizeof *sources);
    Activation **grad_sources = xcalloc((size_t)plan->max_sources, sizeof *grad_sources);

    for (int n = 0; n <= plan->n_blocks; n++)
        backend->zero(routed->grad_blocks[n], bytes);
    if (delta) {
        backend->zero(routed->grad_null_rows, bytes);
        backend->zero(grad_stream, bytes);
    }
    backend->zero(grad_x, bytes);
    loss_backward(context, &model->head_params, &model->head_grads, act, act->stream[L2],
                  model->last_z_loss, loss_scale, grad_x);
    for (int j = L2; j >= 0; j--) {
        if (j < L2) {
            const Activation *grad_f = routed->grad_blocks[plan->sublayer_block[j]];
            if (delta) {
                backend->add(routed->grad_output, grad_stream, grad_f, count);
                grad_f = routed->grad_output;
            }
            backend->zero(grad_x, bytes);
            model_sublayer_backward(model, context, j, act->stream[j], grad_f, grad_x);
        }
        site_sources(model, j, sources);
        site_grad_sources(model, j, grad_sources);
        route_site_backward(&route, &plan->sites[j], &model->site_params[j],
                            &model->site_grads[j], model->site_alpha[j], &routed->sites[j],
                            sources, grad_sources, grad_x);
        if (delta) /* x_j = p_j + alpha * mix: d p_j gets d x_j */
            backend->add_inplace(grad_stream, grad_x, count);
    }
    if (delta) {
        backend->add_inplace(grad_stream, routed->grad_blocks[0], count);
        backend->embedding_backward(model->grad_embedding, grad_stream, act->inputs, (int)rows,
                                    d);
        /* d null = sum over tokens of d null_rows: a column sum, not a scatter onto one row */
        backend->sum_rows(model->grad_route_null, routed->grad_null_rows, (int)rows, d);
    } else {
        backend->embedding_backward(model->grad_embedding, routed->grad_blocks[0], act->inputs,
                                    (int)rows, d);
    }
    free(sources);
    free(grad_sources);
}

/* ---- read access to the routing of the last forward ---- */

static const SitePlan *model_site(const Model *model, int site)
{
    if (site < 0 || site >= model->plan.n_sites)
        fatal(EXIT_CONFIG, "routing site %d does not exist (the model has %d; residual.mode "
              "standard has none)", site, model->plan.n_sites);
    return &model->plan.sites[site];
}

static void model_require_forward(const Model *model, const char *what)
{
    if (model->last_batch == 0)
        fatal(EXIT_CONFIG, "%s needs a model_forward first", what);
}

int model_site_count(const Model *model) { return model->plan.n_sites; }
const char *model_site_name(const Model *model, int site)
{
    return model_site(model, site)->name;
}
int model_site_sources(const Model *model, int site)
{
    return model_site(model, site)->n_sources;
}
int model_site_heads(const Model *model) { return model->plan.heads; }
int model_site_streams(const Model *model) { return model->plan.streams; }

void model_site_weights(const Model *model, int site, int stream, float *host_out)
{
    const SitePlan *plan = model_site(model, site);
    model_require_forward(model, "model_site_weights");
    if (stream < 0 || stream >= model->plan.streams)
        fatal(EXIT_CONFIG, "routing stream %d does not exist (residual.streams = %d)", stream,
              model->plan.streams);
    const size_t rows = (size_t)model->last_batch * model->act.T;
    const size_t max_rows = (size_t)model->act.max_batch * model->act.T;
    const size_t per_source = (size_t)model->plan.heads, N = (size_t)plan->n_sources;
    const float *weights = model->act.routed.sites[site].weights +
                           (size_t)stream * N * max_rows * per_source;
    model->backend->download(host_out, weights, N * rows * per_source * sizeof(float));
}

void model_site_inputs(const Model *model, int site, const Activation **sources)
{
    model_site(model, site);
    model_require_forward(model, "model_site_inputs");
    site_sources(model, site, sources);
}

void model_site_output(const Model *model, int site, float *host_out)
{
    model_site(model, site);
    model_require_forward(model, "model_site_output");
    const size_t rows = (size_t)model->last_batch * model->act.T;
    model->backend->activations_download(host_out, model->act.stream[site],
                                         rows * model->config.d_model);
}
