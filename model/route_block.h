/* model/route_block.h — the routing sites of a chunk walk, block by block (DESIGN 2.1, 2.2;
 * docs/design-notes.md, "Two-phase routing").
 *
 * The sites of one block read the same completed sources (delta: null, b_0..b_{n-1};
 * replace: b_0..b_{n-1}, and after the block's first sublayer the open partial b_n^i too).
 * Those sources are complete when the block starts, so attnres routes a block in two phases:
 *   forward   when the walk reaches the block's first site (or, recomputing under
 *             checkpointing, the first of its sites it needs): route_block_forward reads each
 *             source once and gives every site of the block its Route (and lse); then each
 *             site in its turn: x = p + alpha * Route (add_scaled, delta), x = Route (replace,
 *             the block's first site, written in place), or the merge with the partial
 *             (route_merge_forward, replace);
 *   backward  each site in its turn keeps its d x (route_walk_grad_x); a replace site's share
 *             through the partial, and its softmax centre, are taken at once
 *             (route_merge_backward: the partial's gradient flows into the block's own
 *             sublayers, which the walk reaches next); when the walk leaves the block, at
 *             its first site, route_block_backward sends every site's d x into the completed
 *             sources, reading each once.
 * MSAR sites and the final site (a block of its own) route one site at a time through
 * model/route_site.h.
 *
 * A chunk starts and ends on block edges (chunk.h), so a block is always walked whole, in one
 * chunk call. The phase-one results live in the scratch (activations.h) for the duration of
 * one block; the walk records which block they belong to and reopens a block whose results
 * it does not hold (a checkpointed backward recomputes the block's layers last to first).
 * Every op is deterministic, so a reopened block gives the same bits.
 */
#ifndef FATHOM_MODEL_ROUTE_BLOCK_H
#define FATHOM_MODEL_ROUTE_BLOCK_H

#include <stdbool.h>
#include <stddef.h>

#include "model/activations.h"
#include "model/model.h"
#include "model/route_site.h"
#include "runtime/backend.h"

typedef struct {
    Model *model;
    const Backend *backend;
    const ResidualPlan *plan;
    const RouteContext *route;
    Stash *stash;
    SummaryStore *store;
    int rows, d;
    bool two_phase;                /* attnres: route_block_* ops; msar: route_site.h */
    bool replace;
    int open_block;                /* whose phase-one results the scratch holds; -1: none */
    /* host arrays of backend pointers for the ops, [max_sources + 1] or [S] */
    const Activation **sources;
    Activation **grad_sources;
    Activation **results;          /* [S] where phase one put each site's Route */
    float **weights, **rstd, **lse, **means, **grad_queries, **grad_key_norms, **grad_alphas;
    const float **const_weights, **alphas, **const_means;
    const Activation **queries, **key_norms, **douts;
} RouteWalk;

/* For one chunk call (forward or backward) of `stash` and `store`; `route` outlives it. */
void route_walk_begin(RouteWalk *walk, Model *model, Stash *stash, SummaryStore *store,
                      const RouteContext *route, int rows);
void route_walk_end(RouteWalk *walk);

/* x [rows, d] of site j (the input of sublayer j, or of the final norm for j = 2L); base:
 * the stream p in the delta form, NULL in the replace form. Writes the site's saved state. */
void route_walk_site_forward(RouteWalk *walk, int j, const Activation *base, Activation *x);

/* Where sublayer j's backward leaves d x_j (zeroed by the caller before it adds): the
 * block's buffer of that site, or the scratch's grad_input for a site routed alone. */
Activation *route_walk_grad_x(RouteWalk *walk, int j);

/* Site j's backward from d x = grad_x (route_walk_grad_x(walk, j)), x its forward output:
 * adds into the gradients of its sources (the store's block accumulators, the null rows)
 * and of its weights; a two-phase block's completed sources receive theirs when the walk
 * passes the block's first site. In the delta form d p += d x is the caller's. */
void route_walk_site_backward(RouteWalk *walk, int j, const Activation *x,
                              const Activation *grad_x);

#endif
