/* model/chunk_internal.h — what the chunk's forward walk (model/chunk.c) and its backward
 * walk (model/chunk_backward.c) share: the walk's state, made once per chunk call, and the
 * pieces both take. Private to those two files; model/chunk.h is the contract.
 */
#ifndef FATHOM_MODEL_CHUNK_INTERNAL_H
#define FATHOM_MODEL_CHUNK_INTERNAL_H

#include "model/chunk.h"
#include "model/model_internal.h"
#include "model/route_block.h"

#include <stdbool.h>
#include <stddef.h>

/* Everything one walk needs, made once per chunk call. */
typedef struct {
    Model *model;
    const Backend *backend;
    const ResidualPlan *plan;
    LayerContext layer;
    RouteContext route;
    Stash *stash;
    SummaryStore *store;
    size_t count, bytes;          /* rows * d, and in bytes */
    bool routed, delta;
    int first_sublayer, end_sublayer; /* the chunk's */
    GateAdd pending;              /* the forward's f_j, added in sublayer j + 1's norm ... */
    bool has_pending;             /* ... where this is set (adds_in_next_norm) */
    const Activation *sum_base;   /* standard: x_j, whose sum with f_j sublayer j + 1's norm
                                   * forms, where not NULL (chunk.c layer_forward) */
    const Activation *stream_carries; /* the delta backward: the block gradient that the
                                       * stream gradient carries, or NULL (chunk_backward.c) */
    RouteWalk sites;              /* the routing sites, block by block (route_block.h) */
} Walk;

Walk chunk_walk_begin(Model *model, Stash *stash, SummaryStore *store, int B);
/* The two-phase walk's rows lie in the logits' gradient buffer: a walk that may write them
 * takes the head's spare chunk of logits (chunk.c). */
void chunk_walk_takes_spare_rows(Walk *walk);
/* The sites' walk (route_block.h), for a routed model; the walk must not move after. */
void chunk_walk_sites_begin(Walk *walk, bool backward);
void chunk_walk_end(Walk *walk);

/* Sublayer j's forward, x -> out, x formed first from the gate where one is given. */
void chunk_sublayer_forward(Model *model, const LayerContext *context, int j,
                            LayerActivations *saved, Activation *x, const InputGate *gate,
                            Activation *out);
/* Site j's forward into x, or into *gate, returned, where the site is a gate. */
const InputGate *chunk_site_forward(Walk *walk, int j, const Activation *base, Activation *x,
                                    InputGate *gate);

/* The units a walk reads (model/params.h): the shared routing unit or -1; the unit after
 * `unit` (forward) or before it (backward) to prefetch, or -1; whether layer i is the first
 * (side -1) or last (side +1) layer of the span that its routing unit covers. */
int chunk_walk_shared_unit(const Walk *walk);
int chunk_walk_next_unit(const ChunkSpan *span, const ParamTable *table, int unit,
                         bool forward);
bool chunk_routing_unit_edge(const ParamTable *table, const ChunkSpan *span, int i, int side);
/* The head's units: the final site, norm and head weight; tied, unit 0 too. */
void chunk_head_acquire(Model *model, bool for_backward);
void chunk_head_release(Model *model, bool gradients);
/* Exit 2 unless the stash was made for this chunk. */
void chunk_check_stash(const ChunkSpan *span, const Stash *stash);

#endif
