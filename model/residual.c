/* model/residual.c — see residual.h. */
#include "model/residual.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

void residual_config_check(const ModelConfig *model, const ResidualConfig *residual)
{
    if (residual->mode == RESIDUAL_STANDARD)
        return;
    if (residual->heads < 1 || model->d_model % residual->heads != 0)
        fatal(EXIT_CONFIG, "residual.heads = %d must divide model.d_model = %d",
              residual->heads, model->d_model);
    if (residual->granularity == GRANULARITY_BLOCK && residual->layers_per_block < 1)
        fatal(EXIT_CONFIG, "residual.layers_per_block = %d must be >= 1",
              residual->layers_per_block);
    if (residual->mode != RESIDUAL_MSAR)
        return;
    if (residual->streams < 1 || residual->streams > CONFIG_LIST_MAX ||
        residual->n_stream_kernels != residual->streams)
        fatal(EXIT_CONFIG, "residual.stream_kernels has %d entries; residual.streams = %d "
              "needs one kernel size per stream (at most %d)", residual->n_stream_kernels,
              residual->streams, CONFIG_LIST_MAX);
    for (int r = 0; r < residual->streams; r++)
        if (residual->stream_kernels[r] < 1)
            fatal(EXIT_CONFIG, "residual.stream_kernels[%d] = %d must be >= 1", r,
                  residual->stream_kernels[r]);
}

int residual_sublayers_per_block(const ResidualConfig *residual)
{
    return residual->granularity == GRANULARITY_FULL ? 1 : 2 * residual->layers_per_block;
}

int residual_block_count(const ModelConfig *model, const ResidualConfig *residual)
{
    int S = residual_sublayers_per_block(residual);
    return (2 * model->n_layers + S - 1) / S;
}

void residual_site_name(char *name, size_t capacity, int site, int n_layers)
{
    if (site == 2 * n_layers)
        snprintf(name, capacity, "model.final_route");
    else
        snprintf(name, capacity, "model.layers.%d.%s_route", site / 2,
                 site % 2 == 0 ? "attn" : "mlp");
}

static SiteSource block_source(const ResidualPlan *plan, int block)
{
    return (SiteSource){.buffer = plan->block_buffer[block],
                        .slot = plan->mode == RESIDUAL_MSAR ? block : RESIDUAL_NO_SLOT,
                        .grad_block = block};
}

/* Site j (the final site when j = 2L): the sources of DESIGN 2.1 in Route order. */
static void plan_site(ResidualPlan *plan, int j, int n_layers)
{
    SitePlan *site = &plan->sites[j];
    const bool final = j == plan->n_sublayers, delta = plan->form == FORM_DELTA;
    site->block = final ? plan->n_blocks + 1 : plan->sublayer_block[j];
    site->position = final ? 0 : plan->sublayer_position[j];
    residual_site_name(site->name, sizeof site->name, j, n_layers);

    const int n = site->block; /* completed blocks b_0..b_{n-1} */
    const bool reads_partial = !delta && site->position > 0;
    site->n_sources = (delta ? 1 : 0) + n + (reads_partial ? 1 : 0);
    site->sources = xcalloc((size_t)site->n_sources, sizeof *site->sources);
    int k = 0;
    if (delta)
        site->sources[k++] = (SiteSource){.buffer = RESIDUAL_NULL_BUFFER,
                                          .slot = RESIDUAL_NO_SLOT, .grad_block = -1};
    for (int block = 0; block < n; block++)
        site->sources[k++] = block_source(plan, block);
    if (reads_partial) /* b_n^i: the partial after sublayer j - 1, in block n's slot */
        site->sources[k++] = (SiteSource){
            .buffer = plan->sublayer_buffer[j - 1],
            .slot = plan->mode == RESIDUAL_MSAR ? n : RESIDUAL_NO_SLOT,
            .grad_block = n};
    if (site->n_sources > plan->max_sources)
        plan->max_sources = site->n_sources;
}

/* FATHOM_ROUTE_REPLACE (residual_two_phase): whether attnres's replace form walks its blocks
 * in two phases (unset: it does). */
static bool replace_walk_two_phase(void)
{
    static const char *const names[] = {"two_phase", "per_site"};
    return env_choice("FATHOM_ROUTE_REPLACE", names, 2) == 0;
}

void residual_plan_build(ResidualPlan *plan, const ModelConfig *model,
                         const ResidualConfig *residual)
{
    memset(plan, 0, sizeof *plan);
    plan->n_sublayers = 2 * model->n_layers;
    if (!residual || residual->mode == RESIDUAL_STANDARD) {
        plan->mode = RESIDUAL_STANDARD;
        return;
    }
    residual_config_check(model, residual);
    plan->mode = residual->mode;
    plan->form = residual->form;
    plan->heads = residual->heads;
    plan->replace_two_phase = residual->mode == RESIDUAL_ATTNRES &&
                              residual->form == FORM_REPLACE && replace_walk_two_phase();
    plan->streams = residual->mode == RESIDUAL_MSAR ? residual->streams : 1;
    plan->kernel_max = 1;
    for (int r = 0; r < plan->streams; r++) {
        plan->kernel_sizes[r] = residual->mode == RESIDUAL_MSAR ? residual->stream_kernels[r] : 1;
        if (plan->kernel_sizes[r] > plan->kernel_max)
            plan->kernel_max = plan->kernel_sizes[r];
    }
    const int S = residual_sublayers_per_block(residual), L2 = plan->n_sublayers;
    plan->sublayers_per_block = S;
    plan->n_blocks = residual_block_count(model, residual);
    plan->n_slots = residual->mode == RESIDUAL_MSAR ? plan->n_blocks + 1 : 0;

    plan->block_buffer = xcalloc((size_t)plan->n_blocks + 1, sizeof *plan->block_buffer);
    plan->sublayer_buffer = xcalloc((size_t)L2, sizeof *plan->sublayer_buffer);
    plan->sublayer_block = xcalloc((size_t)L2, sizeof *plan->sublayer_block);
    plan->sublayer_position = xcalloc((size_t)L2, sizeof *plan->sublayer_position);
    plan->block_buffer[0] = 0; /* b_0 = e */
    for (int j = 0; j < L2; j++) {
        const int n = j / S + 1;
        plan->sublayer_block[j] = n;
        plan->sublayer_position[j] = j % S;
        /* replace: one buffer per partial, since each is read; delta: one per block */
        plan->sublayer_buffer[j] = plan->form == FORM_REPLACE ? j + 1 : n;
        plan->block_buffer[n] = plan->sublayer_buffer[j]; /* the last sublayer of n wins */
    }
    plan->n_buffers = plan->form == FORM_REPLACE ? L2 + 1 : plan->n_blocks + 1;

    plan->n_sites = L2 + 1;
    plan->sites = xcalloc((size_t)plan->n_sites, sizeof *plan->sites);
    for (int j = 0; j <= L2; j++)
        plan_site(plan, j, model->n_layers);
}

void residual_plan_free(ResidualPlan *plan)
{
    for (int j = 0; j < plan->n_sites; j++)
        free(plan->sites[j].sources);
    free(plan->sites);
    free(plan->block_buffer);
    free(plan->sublayer_buffer);
    free(plan->sublayer_block);
    free(plan->sublayer_position);
    memset(plan, 0, sizeof *plan);
}

bool residual_sublayer_starts_block(const ResidualPlan *plan, int j)
{
    return plan->sublayer_position[j] == 0;
}

bool residual_two_phase(const ResidualPlan *plan)
{
    return plan->mode == RESIDUAL_MSAR ||
           (plan->mode != RESIDUAL_STANDARD &&
            (plan->form == FORM_DELTA || plan->replace_two_phase));
}

bool residual_site_keeps_weights(const ResidualPlan *plan)
{
    return !(plan->mode == RESIDUAL_MSAR && residual_two_phase(plan) && !plan->sites_alone);
}

int residual_block_sites(const ResidualPlan *plan, int block)
{
    if (block > plan->n_blocks)
        return 1;
    const int left = plan->n_sublayers - (block - 1) * plan->sublayers_per_block;
    return left < plan->sublayers_per_block ? left : plan->sublayers_per_block;
}

bool residual_site_in_walk(const ResidualPlan *plan, int j)
{
    const bool final = j == plan->n_sublayers;
    return residual_two_phase(plan) && !plan->sites_alone &&
           (!final || plan->mode == RESIDUAL_MSAR);
}

int residual_site_rstd_rows(const ResidualPlan *plan, int j)
{
    const SitePlan *site = &plan->sites[j];
    if (plan->mode != RESIDUAL_ATTNRES || !residual_site_in_walk(plan, j))
        return plan->streams * site->n_sources;
    if (site->position > 0)
        return 0;
    const int later_sites = residual_block_sites(plan, site->block) - 1;
    return site->n_sources + (plan->form == FORM_REPLACE ? later_sites : 0);
}

bool residual_site_keeps_input(const ResidualPlan *plan, int j)
{
    const bool final = j == plan->n_sublayers; /* the head's backward reads it first */
    return final || plan->form != FORM_REPLACE || residual_site_keeps_weights(plan);
}
