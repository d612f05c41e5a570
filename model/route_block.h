/* model/route_block.h — the routing sites of a chunk walk, block by block (DESIGN 2.1, 2.2;
 * docs/design-notes.md, "Two-phase routing"; route_block.c, MSAR's streams
 * route_block_streams.c, the walk's arrays route_walk.c).
 *
 * The sites of one block read the same completed sources (delta: null, b_0..b_{n-1};
 * replace: b_0..b_{n-1}, and each site after the first also the block's open partial).
 * The completed ones are known when the block starts, so the walk routes a block in two
 * phases (residual_two_phase):
 *   forward   when the walk reaches the block's first site (or, recomputing under
 *             checkpointing, the first of its sites it needs): route_block_forward reads each
 *             source once and gives every site of the block its Route; then each site in its
 *             turn: x = p + alpha * Route (add_scaled);
 *   backward  each site in its turn keeps its d x (route_walk_grad_x); when the walk leaves
 *             the block, at its first site, route_block_backward sends every site's d x into
 *             the sources, reading each once.
 * MSAR does the same for each stream: stream r of every site reads E_r of the same sources,
 * so opening a block convolves each source once for every stream into the scratch
 * (stream_conv_forward) and routes every site over them a stream at a time
 * (route_block_forward); each site mixes its m streams and applies its gate in its turn
 * (route_site_mix_forward). Its backward opens the block again, takes each site's d x back
 * through the gate and the mix to d o_r of every stream at once, then per stream sends every
 * site's d o_r into d E_r (route_block_backward), and last every stream's d E through the
 * convolutions into the sources and the taps, at once (stream_conv_backward).
 * MSAR's replace form routes the same way, and each site i > 0 also merges E_r of its
 * partial b_n^i into each stream in its turn (route_merge_forward, from phase one's lse) and
 * mixes them into x in the same op; its backward reopens the block (phase one again), merges
 * and mixes each site again in its turn before its sublayer's backward (once a reopening: the
 * merge is in place), takes its d x through its mix and its merge's backward (the partial's
 * gradient must reach the block's accumulator before the sublayer before it), and the
 * completed sources' share when the walk leaves the block. attnres's replace form walks in
 * two phases too (residual.h; FATHOM_ROUTE_REPLACE=per_site routes it a site at a time
 * through model/route_site.h): its sites merge their partials in their turns as MSAR's do,
 * into x, and the backward, with the depth weights in the stash and x from the caller, makes
 * no phase one again. MSAR's final site is a block of its own, n_blocks + 1, of one site: it
 * reads only completed blocks, as a block's first site does, and is walked the same way (its
 * d x is block_grads[0], which the head's backward writes once it is done with the logits'
 * gradient buffer the block rows share); attnres's final site routes alone, where its
 * per-site Route is the faster. Every site after model_route_sites_alone routes alone.
 * MSAR's sites walked in two phases keep their depth weights in the scratch for the open
 * block, not in the stash (residual_site_keeps_weights): both backwards make phase one again
 * for every stream anyway.
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
    bool streams;                  /* msar: phase one a stream at a time */
    bool replace;                  /* the replace form (msar: sites merge their partials) */
    bool backward;                 /* a backward walk */
    int open_block;                /* whose phase-one results the scratch holds; -1: none */
    bool *merged;                  /* [S] msar's replace form in the backward: site i of the
                                      open block has merged its partial since it reopened */
    /* host arrays of backend pointers for the ops, [max_sources + 1] or [S] */
    const Activation **sources;
    Activation **grad_sources;
    Activation **results;          /* [S] where phase one put each site's Route */
    float **weights, **rstd, **grad_queries, **grad_key_norms, **grad_alphas;
    const float **const_weights, **alphas;
    const Activation **queries, **key_norms, **douts;
    float **lse, **means;          /* [S] the replace form's lse and softmax centres */
    /* msar: E_r of the block's sources and their gradients [max_sources + 1]; a site's o_r
     * and d o_r [m] */
    const Activation **stream_sources, **site_streams;
    Activation **stream_grad_sources, **site_grad_streams;
    /* msar: the stream_conv ops' rows, the null source left out: sources and grad_sources
     * [max_sources + 1]; rows, taps, grad_rows and grad_taps [m][max_sources + 1] */
    struct {
        const Activation **sources, **taps, **grad_rows;
        Activation **rows, **grad_sources;
        float **grad_taps;
    } conv;
    /* msar's replace form: a site's merge in every stream at once (route_merge_conv_forward
     * and its backward), each [m] */
    struct {
        Activation **streams, **grad_partials;
        float **weights, **rstd, **means, **grad_queries, **grad_key_norms;
        const float **lse;
        const Activation **queries, **key_norms, **douts;
    } merge;
    RouteMerge merge_gate; /* attnres's replace form: the merge a site's norm forms */
    StreamMix mix_gate;    /* msar's delta form: the mix a site's norm makes */
} RouteWalk;

/* For one chunk call (forward, or backward) of `stash` and `store`; `route` outlives it. */
void route_walk_begin(RouteWalk *walk, Model *model, Stash *stash, SummaryStore *store,
                      const RouteContext *route, int rows, bool backward);
void route_walk_end(RouteWalk *walk);

/* x [rows, d] of site j (the input of sublayer j, or of the final norm for j = 2L); base:
 * the stream p in the delta form, NULL in the replace form. Writes the site's saved state. */
void route_walk_site_forward(RouteWalk *walk, int j, const Activation *base, Activation *x);

/* Site j's x as a gate the sublayer's norm can form (model/layer.h InputGate), where it is
 * one: the delta form of a block in two phases, x = p + alpha_j * (phase one's Route; MSAR
 * with several streams: their mix, which the norm makes, InputGate.mix), and attnres's
 * replace form at a block's sites after the first, x = the merge of the open partial into
 * phase one's Route; this opens the block's phase one when the walk enters it. Returns
 * false where the site's x needs route_walk_site_forward (a site routed alone, a
 * replace-form block's first site, MSAR's replace form). Either way the site's saved state
 * is the same. */
bool route_walk_site_gate(RouteWalk *walk, int j, const Activation *base, InputGate *gate);
/* Whether route_walk_site_gate gives site j a gate (the delta form's given the stream as
 * its base). */
bool route_walk_gates_site(const RouteWalk *walk, int j);

/* Site j's merge backward as its sublayer's norm backward can take it on (model/layer.h
 * GradBranch.merge, runtime/backend.h route_merge_rmsnorm_backward), where it is one:
 * attnres's replace form in two phases, at every site of a block (x_j the merge's output; a
 * block's first site merges no partial and gives its softmax centre alone). Returns false
 * elsewhere. Where it returns true, the caller runs that op with d x_j =
 * route_walk_grad_x(walk, j), and route_walk_site_backward leaves the merge to it. */
bool route_walk_site_merge_grad(RouteWalk *walk, int j, RouteMergeGrad *merge);

/* Where sublayer j's backward leaves d x_j (zeroed by the caller before it adds): the
 * block's buffer of that site, or the scratch's grad_input for a site routed alone. */
Activation *route_walk_grad_x(RouteWalk *walk, int j);

/* Site j's backward from d x = grad_x (route_walk_grad_x(walk, j)): adds into the
 * gradients of its sources (the store's block accumulators, the null rows) and of its
 * weights; a two-phase block's sources and weights receive theirs when the walk passes the
 * block's first site. Where route_walk_site_merge_grad gave the site's merge to its norm's
 * backward, that share is done already. In the delta form d p += d x is the caller's. */
void route_walk_site_backward(RouteWalk *walk, int j, const Activation *grad_x);

#endif
