/* model/residual.h — the source bookkeeping of attention over depth (DESIGN 2.1, 2.2).
 *
 * A ResidualPlan says, for one network, which buffers one forward keeps and what every
 * routing site reads. It is pure host bookkeeping: no tensors, no backend.
 *
 * Sublayer j = 0..2L-1 (layer j/2's attention when j is even, its MLP when odd) sits in
 * block n = j/S + 1 at position i = j % S, S = sublayers_per_block (2 * layers_per_block;
 * full granularity S = 1); there are n_blocks = ceil(2L / S) blocks after b_0 = e, the last
 * possibly short. Site j stands before sublayer j; site 2L is the final site, before the
 * final norm (docs/design-notes.md, "Attention over depth").
 *
 * Summary buffers, each [tokens, d], numbered 0..n_buffers-1; buffer 0 holds b_0 = e.
 * - replace: buffer j + 1 holds the partial b_n^{i+1} after sublayer j (sublayer j writes
 *   f_j there when i = 0, else the previous partial + f_j). Every partial with i + 1 < S is
 *   read by the next sublayer, so each keeps its own buffer; the last one of a block is b_n.
 * - delta: buffer n holds block n and sublayer j adds f_j into it in place (the open
 *   block's partial is never a source, so nothing reads it before it is complete).
 * sublayer_buffer[j] is where f_j lands; block_buffer[n] holds the completed b_n.
 *
 * Sources of site j, in the order the Route sees them (DESIGN 2.1; design-notes):
 *   replace   b_0..b_{n-1}, then the partial b_n^i when i > 0;  final: b_0..b_{n_blocks}
 *   delta     null, b_0..b_{n-1};                               final: null, b_0..b_{n_blocks}
 * Each source names its buffer (RESIDUAL_NULL_BUFFER for the learned null), its MSAR stream
 * slot (model.route_streams.{slot}.conv; the partial b_n^i uses slot n, the null source has
 * none) and the block gradient it feeds in the backward (the partial feeds its own block's:
 * every later partial and b_n contain f_j, so their gradients meet in one accumulator).
 *
 * Mode standard has no sites (n_sites = 0) and keeps the plain stream.
 */
#ifndef FATHOM_MODEL_RESIDUAL_H
#define FATHOM_MODEL_RESIDUAL_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/config.h"

#define RESIDUAL_NULL_BUFFER (-1) /* the learned null source, broadcast over the tokens */
#define RESIDUAL_NO_SLOT (-1)     /* a source that no MSAR stream convolution expands */
#define RESIDUAL_SITE_NAME_MAX 64

typedef struct {
    int buffer;     /* summary buffer, or RESIDUAL_NULL_BUFFER */
    int slot;       /* MSAR stream slot, or RESIDUAL_NO_SLOT */
    int grad_block; /* d_block index that receives its gradient; -1 for the null source */
} SiteSource;

typedef struct {
    char name[RESIDUAL_SITE_NAME_MAX]; /* model.layers.{i}.attn_route, ...mlp_route,
                                          model.final_route */
    int block;                         /* n (final site: n_blocks + 1) */
    int position;                      /* i (final site: 0) */
    int n_sources;
    SiteSource *sources;               /* [n_sources] */
} SitePlan;

typedef struct {
    ResidualMode mode;
    ResidualForm form;
    int heads;              /* H */
    int streams;            /* MSAR m; 1 for attnres */
    int kernel_sizes[CONFIG_LIST_MAX]; /* MSAR k_r, r < streams */
    int kernel_max;         /* max k_r: the middle dimension of each stream conv */
    int n_sublayers;        /* 2L */
    int sublayers_per_block;/* S */
    int n_blocks;           /* ceil(2L / S) */
    int n_slots;            /* MSAR stream slots: n_blocks + 1 (b_0 included); 0 otherwise */
    int n_buffers;          /* summary buffers, b_0 included */
    int *block_buffer;      /* [n_blocks + 1] */
    int *sublayer_buffer;   /* [2L] where f_j accumulates */
    int *sublayer_block;    /* [2L] n */
    int *sublayer_position; /* [2L] i */
    int n_sites;            /* 2L + 1; 0 for mode standard */
    SitePlan *sites;        /* [n_sites] */
    int max_sources;        /* over all sites */
    bool sites_alone;       /* model_route_sites_alone: no two-phase walk (false when built) */
    bool replace_two_phase; /* attnres's replace form in two phases (unless
                               FATHOM_ROUTE_REPLACE=per_site) */
} ResidualPlan;

/* Refuses, with EXIT_CONFIG and a message naming the keys, what the model cannot build:
 * residual.heads not dividing model.d_model, residual.layers_per_block < 1, and for msar
 * streams < 1, stream_kernels not one per stream or a kernel size < 1. Mode standard reads
 * none of the other residual keys. */
void residual_config_check(const ModelConfig *model, const ResidualConfig *residual);

/* S: 1 for full granularity, else 2 * layers_per_block. */
int residual_sublayers_per_block(const ResidualConfig *residual);
/* n_blocks = ceil(2 * n_layers / S). */
int residual_block_count(const ModelConfig *model, const ResidualConfig *residual);
/* The DESIGN 2.3 prefix of site `site` (0..2L): "model.layers.{site/2}.attn_route" or
 * ".mlp_route", "model.final_route" for site 2L. */
void residual_site_name(char *name, size_t capacity, int site, int n_layers);

/* Checks (residual_config_check) and lays out the plan; residual == NULL means standard. */
void residual_plan_build(ResidualPlan *plan, const ModelConfig *model,
                         const ResidualConfig *residual);
void residual_plan_free(ResidualPlan *plan);

/* True when the walk routes a block's sites in two phases (model/route_block.h): msar and
 * attnres in both forms. FATHOM_ROUTE_REPLACE=per_site, read when a plan is built, routes
 * attnres's replace form a site at a time instead (two_phase or unset: in two phases; any
 * other value exits 2): the faster walk since its merges store whole sectors (1B MHAR step
 * 513.5 -> 502.3 ms on an H100, docs/performance.md, 2026-12-06 morning; the per-site walk
 * was the faster until then). msar's per-site route convolves every source inside each
 * site's read, which costs more than the merges. */
bool residual_two_phase(const ResidualPlan *plan);

/* True when the sites' depth weights and key statistics are kept in the stash from their
 * forward to their backward (activations.h SiteActivations). False for msar walked in two
 * phases (the final site too, a block of its own): the walk's backward makes phase one again
 * (the streams are not kept), so those statistics live in the scratch for the one block being
 * walked (model/route_block.h). */
bool residual_site_keeps_weights(const ResidualPlan *plan);

/* The sites of block n (1 <= n <= n_blocks): S, fewer in a short last block; the final site's
 * block n_blocks + 1 has one. */
int residual_block_sites(const ResidualPlan *plan, int block);

/* True when site j is routed inside the two-phase walk (model/route_block.h): every site of
 * a plan walked in two phases (residual_two_phase, not sites_alone) but attnres's final site,
 * which routes alone (a block of one site shares no read). */
bool residual_site_in_walk(const ResidualPlan *plan, int j);

/* The rows of key statistics (rstd, [rows, tokens] each) site j keeps in the stash where
 * residual_site_keeps_weights holds. attnres's sites inside the two-phase walk (all but the
 * final site) read the same completed sources, whose rstd phase one writes once for the
 * block: the block's first site keeps the block's region, the completed sources' rows and
 * then, in the replace form, one row for each later site's partial; the block's other sites
 * keep none (model/route_block_streams.c, walk_site_rstd, gives each site its view). Every
 * other site keeps a row for each of its sources and streams. At the 1B MHAR step the sites
 * kept 14.2 MB of rows, 10.3 MB of them copies (docs/performance.md, 2026-12-07 afternoon). */
int residual_site_rstd_rows(const ResidualPlan *plan, int j);

/* True when site j's output x_j, its sublayer's input, is kept in the stash from the forward
 * to the sublayer's backward. False for msar's replace form walked in two phases: its
 * backward reopens each block (phase one and every merge again), so when sublayer j's
 * backward comes the walk holds the site's streams o_r, and their mix makes x_j again to the
 * bit (model/chunk.c; docs/design-notes.md, "MSAR's replace form makes x_j again"). The
 * final site's x, the final norm's input, is always kept: the head's backward reads it
 * before the site's. */
bool residual_site_keeps_input(const ResidualPlan *plan, int j);

/* True when sublayer j starts its block (i = 0): it writes f_j instead of adding it. */
bool residual_sublayer_starts_block(const ResidualPlan *plan, int j);

#endif
