/* model/model_sites.c — the routing weights of attention over depth (DESIGN 2.1, 2.2) as
 * views into the parameters, and read access to the routing of the one-chunk case's last
 * forward (model.h). The walk itself is model/chunk.c. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model_internal.h"
#include "runtime/error.h"

/* The routing weights' views, registered in their units; the routed forward and backward
 * read nothing else. */
void model_routing_resolve(Model *model)
{
    const ResidualPlan *plan = &model->plan;
    const ParamTable *table = &model->table;
    model->site_params = xcalloc((size_t)plan->n_sites, sizeof *model->site_params);
    model->site_grads = xcalloc((size_t)plan->n_sites, sizeof *model->site_grads);
    /* sites 2i and 2i + 1 stand in layer i's routing unit, site 2L in the head's (params.h) */
    for (int j = 0; j < plan->n_sites; j++) {
        const int unit = j < 2 * model->config.n_layers ? param_unit_of_layer_routing(table, j / 2)
                                                        : table->unit_head;
        site_views_add(&model->unit_views[unit], &model->site_params[j], &model->site_grads[j],
                       table, plan, j);
    }
    UnitViews *shared = &model->unit_views[table->unit_shared];
    model->conv_params = xcalloc((size_t)plan->n_slots + 1, sizeof *model->conv_params);
    model->conv_grads = xcalloc((size_t)plan->n_slots + 1, sizeof *model->conv_grads);
    for (int slot = 0; slot < plan->n_slots; slot++) {
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "model.route_streams.%d.conv", slot);
        unit_views_add(shared, table, &model->conv_params[slot], name, VIEW_COMPUTE, true);
        unit_views_add(shared, table, &model->conv_grads[slot], name, VIEW_GRADS, true);
    }
    if (plan->form == FORM_DELTA) {
        unit_views_add(shared, table, &model->route_null, "model.route_null", VIEW_COMPUTE,
                       true);
        unit_views_add(shared, table, &model->grad_route_null, "model.route_null", VIEW_GRADS,
                       true);
    }
}

void model_routing_free(Model *model)
{
    free(model->site_params);
    free(model->site_grads);
    free(model->conv_params);
    free(model->conv_grads);
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
    if (!model->whole_ready || model->whole_stash.batch == 0)
        fatal(EXIT_CONFIG, "%s needs a model_forward first", what);
}

static size_t model_last_rows(const Model *model)
{
    return (size_t)model->whole_stash.batch * model->scratch.T;
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
    if (!residual_site_keeps_weights(&model->plan))
        fatal(EXIT_CONFIG, "model_site_weights: msar's two-phase walk keeps no depth weights "
              "of site %d; choose model_route_sites_alone before the forward", site);
    const size_t rows = model_last_rows(model);
    const size_t max_rows = (size_t)model->scratch.max_batch * model->scratch.T;
    const size_t per_source = (size_t)model->plan.heads, N = (size_t)plan->n_sources;
    const float *weights = model->whole_stash.sites[site].weights +
                           (size_t)stream * N * max_rows * per_source;
    model->backend->download(host_out, weights, N * rows * per_source * sizeof(float));
}

void model_site_inputs(const Model *model, int site, const Activation **sources)
{
    const SitePlan *plan = model_site(model, site);
    model_require_forward(model, "model_site_inputs");
    for (int k = 0; k < plan->n_sources; k++) {
        const int buffer = plan->sources[k].buffer;
        sources[k] = buffer == RESIDUAL_NULL_BUFFER ? model->scratch.null_rows
                                                    : model->whole_store.summaries[buffer];
    }
}

void model_site_output(const Model *model, int site, float *host_out)
{
    model_site(model, site);
    model_require_forward(model, "model_site_output");
    if (!residual_site_keeps_input(&model->plan, site))
        fatal(EXIT_CONFIG, "model_site_output: msar's replace form walked in two phases keeps "
              "no x_j of site %d; choose model_route_sites_alone before the forward", site);
    const size_t rows = model_last_rows(model);
    model->backend->activations_download(host_out, model->whole_stash.stream[site],
                                         rows * model->config.d_model);
}
