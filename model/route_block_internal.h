/* model/route_block_internal.h — the functions the two files of the block walk share
 * (route_block.h): route_block.c walks the sources, the blocks, phase one, attnres's replace
 * form and the sites' entry points, and calls route_block_streams.c for MSAR's streams (the
 * convolutions, the replace form's merges, the block's backward); that file reads
 * the walk's sources and blocks and phase one back from route_block.c.
 * Private to model/route_block.c and model/route_block_streams.c; nothing else includes it.
 */
#ifndef FATHOM_MODEL_ROUTE_BLOCK_INTERNAL_H
#define FATHOM_MODEL_ROUTE_BLOCK_INTERNAL_H

#include <stdbool.h>

#include "model/activations.h"
#include "model/residual.h"
#include "model/route_block.h"

/* route_block.c: the walk's sources and blocks, and phase one. */

/* The sources site j reads, as backend pointers [n_sources] (model/residual.h). */
void walk_site_sources(const RouteWalk *walk, int site, const Activation **sources);
/* Where the gradients of site j's sources accumulate [n_sources]. */
void walk_site_grad_sources(const RouteWalk *walk, int site, Activation **grads);
/* The first site of block n; the final block's is the final site 2L. */
int walk_block_first_site(const RouteWalk *walk, int block);
/* sites of block n: S, or fewer in a short last block; the final block's one */
int walk_block_sites(const RouteWalk *walk, int block);
/* Site i's [rows, H] floats of stream r in a [m, S, max_rows, H] scratch array. */
float *walk_site_stream_floats(const RouteWalk *walk, float *base, int r, int i);
/* Opens block n: walk->sources its first site's, the sources convolved for every stream
 * (walk_block_convolve), phase one of every stream (each site's Route over the block's
 * sources, at once; attnres's first site's into first_result where it is not NULL, its x,
 * else the scratch), no site merged yet. */
void walk_block_open(RouteWalk *walk, int block, Activation *first_result);

/* route_block_streams.c: MSAR's streams. */

/* Slot k (0..S) of stream r: phase one leaves o_r of site i in slot i + 1. */
Activation *walk_stream_slot(const RouteWalk *walk, int r, int k);
/* E_r of the block's sources (those of its first site; walk->sources) for every stream at
 * once, into the scratch rows where they stay until the walk leaves the block (nothing for
 * attnres, whose sources are not convolved). */
void walk_block_convolve(RouteWalk *walk, const SitePlan *first);
/* walk->stream_sources = E_r of walk->sources where walk_block_convolve left them; the null
 * source, and attnres's sources, as they are. */
void walk_stream_sources(RouteWalk *walk, const SitePlan *first, int r);
/* Where site i's depth weights of stream r are: msar's in the scratch, attnres's stashed. */
float *walk_site_weights(const RouteWalk *walk, int block, int i, int r);
/* Where site i's key rstd of stream r is, as walk_site_weights. */
float *walk_site_rstd(const RouteWalk *walk, int block, int i, int r);
/* Site i > 0 of msar's replace form merges its partial in its turn; whether it merged now. */
bool walk_site_merge_in_turn(RouteWalk *walk, int block, int i, Activation *x);
/* Site i's backward in msar's replace form: its own share, from its merge and its mix. */
void walk_site_merge_backward(RouteWalk *walk, int block, int i);
/* When the walk leaves block n, open since its sites' backward (every stream's E_r kept where
 * walk_block_convolve put them): every site's d o_r of each stream into the completed
 * sources' d E_r, stream by stream in order (the replace form's about each site's softmax
 * centre), then every stream's d E through the convolutions at once; the block is no longer
 * open. MSAR's replace form calls it as it stands: nothing since its sites' turns wrote the
 * kept E_r (their merges take the partial's E_r in partial_rows and its d E_r in row N, past
 * the block's sources). */
void walk_block_sources_backward(RouteWalk *walk, int block);
/* The delta form's block backward with streams when the walk leaves it. */
void walk_block_backward_streams(RouteWalk *walk, int block);

#endif
