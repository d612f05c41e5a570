/* model/chunk.h — a chunk: a contiguous span of decoder layers with a payload in and a
 * payload out (DESIGN 1, 3). The whole network is the one-chunk case (model.h's
 * model_forward / model_backward run exactly this code over one span).
 *
 * The network's L layers split into C chunks; chunk 0 also holds the embedding, chunk C-1
 * the final routing site, the final norm, the head and the loss. In block granularity a
 * chunk edge falls on a block edge (DESIGN 3), so a chunk completes every block it opens:
 * chunk c makes the summaries b_n for n in [first_block, end_block) (chunk 0 also b_0 = e).
 *
 * What crosses an edge, per microbatch [B*T, d] each (DESIGN 3; pipeline/payload.h says
 * which summaries a hop carries):
 *   standard   h, the residual stream
 *   replace    the completed block summaries (attnres and msar alike; no partial)
 *   delta      p, the running stream, and the completed block summaries
 * and in the backward the gradients of the same tensors.
 *
 * One microbatch's forward of a chunk keeps what its backward needs in a Stash
 * (model/activations.h) that the caller owns, and the summaries in the microbatch's
 * SummaryStore, shared by the rank's chunks of that microbatch; so any number of
 * microbatches can be in flight, each with its own stash. Before the forward of a chunk
 * other than 0 the caller writes the payload in place: the stream to chunk_input_stream,
 * each received summary to store_summary. Before the backward of a chunk other than the
 * last it writes d(output stream) to chunk_grad_stream and ADDS each sent summary's
 * gradient into store_summary_grad; after the backward, chunk_grad_stream holds d(input
 * stream) and store_summary_grad the gradients of the summaries the chunk received.
 *
 * With the stash's checkpointed flag (train.activation_checkpointing: full) the forward
 * keeps only each layer's input and the backward recomputes the layer first, routing
 * included (DESIGN 3); the results are bit for bit those of the plain walk.
 */
#ifndef FATHOM_MODEL_CHUNK_H
#define FATHOM_MODEL_CHUNK_H

#include <stdbool.h>
#include <stdint.h>

#include "model/activations.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/residual.h"

struct ChunkSpan {
    int index;                        /* c, of n_chunks */
    int first_layer, n_layers;
    int first_sublayer, end_sublayer; /* 2 * first_layer, 2 * (first_layer + n_layers) */
    bool has_embedding;               /* c == 0 */
    bool has_head;                    /* c == n_chunks - 1 */
    int first_block, end_block;       /* blocks completed here; 0, 0 for mode standard */
};

/* Splits model.n_layers into n_chunks spans: `layer_split` layers each when n_split > 0
 * (parallel.layer_split), else evenly (the first n_layers % n_chunks chunks get one more).
 * EXIT_CONFIG naming parallel.layer_split (or parallel.pp and parallel.virtual_stages for
 * the even split) when a chunk is empty, the split does not add up, or an edge cuts a block
 * (residual.layers_per_block). */
void chunk_spans_build(ChunkSpan *spans, int n_chunks, const ModelConfig *config,
                       const ResidualPlan *plan, const int *layer_split, int n_split);

/* The shape of a stash for `span`. */
StashShape chunk_stash_shape(const ChunkSpan *span, bool checkpointed);

/* The chunk's forward of one microbatch: inputs (chunk 0) and targets (last chunk) are host
 * tokens [B, T] (a token >= vocab_size is EXIT_DATA); returns the loss on the last chunk and
 * zeros elsewhere. loss_scale: that of the chunk_backward to follow, or 0 (none follows, or
 * the logits are wanted: model/loss.h). */
ModelLoss chunk_forward(Model *model, const ChunkSpan *span, Stash *stash,
                        SummaryStore *store, const uint32_t *inputs, const uint32_t *targets,
                        int B, float z_loss, float loss_scale);

/* The chunk's backward of the microbatch its stash holds: adds d(loss_scale * loss) into
 * the parameter gradients and the store's summary gradients (see above). May run twice on
 * one forward; each adds again. */
void chunk_backward(Model *model, const ChunkSpan *span, Stash *stash, SummaryStore *store,
                    float loss_scale);

/* Sets units[u] (n_units of model_param_table) for every unit the chunk reads (never
 * clears): its layers, the embedding (chunk 0, and the last chunk when tied), the head unit
 * (last chunk), the shared routing unit (when the model has one). */
void chunk_units(const Model *model, const ChunkSpan *span, bool *units);
/* The same from a parameter table alone (no model: byte predictions). */
void chunk_units_of_table(const ParamTable *table, bool tie_embeddings, const ChunkSpan *span,
                          bool *units);

/* Adds to releases[u] (n_units of model_param_table) how many times one backward of the
 * chunk hands unit u's gradients to FSDP (fsdp_step_begin's counts): once for each unit it
 * reads, twice for a tied embedding read by both ends of a one-chunk network. */
void chunk_unit_releases(const Model *model, const ChunkSpan *span, int *releases);

/* The stream a hop carries into / out of the chunk (h or p), NULL in the replace form. */
Activation *chunk_input_stream(const Model *model, const ChunkSpan *span, Stash *stash,
                               SummaryStore *store);
Activation *chunk_output_stream(const Model *model, const ChunkSpan *span, Stash *stash,
                                SummaryStore *store);
/* d(stream) at the chunk's edge: the rank's one gradient stream (in the scratch). */
Activation *chunk_grad_stream(Model *model);

/* Block n's summary b_n and its gradient accumulator in a store. */
Activation *store_summary(const Model *model, SummaryStore *store, int block);
Activation *store_summary_grad(SummaryStore *store, int block);
/* Zeroes every summary gradient: a microbatch's store before its first backward. */
void store_zero_grads(const Model *model, SummaryStore *store);
/* Which summary buffers the chunks `spans[0..n)` of one rank read or write (bool [n_buffers]),
 * so the rank's stores hold only those. malloc'd; NULL for mode standard. */
bool *store_needed_buffers(const Model *model, const ChunkSpan *spans, int n);

#endif
