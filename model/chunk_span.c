/* model/chunk_span.c — how the layers split into chunks, and what a chunk's memory holds
 * (chunk.h; DESIGN 3: layers split into P*v contiguous chunks, evenly or as
 * parallel.layer_split lists; in block granularity every edge is a block edge). */
#include "model/chunk.h"

#include <stdlib.h>

#include "model/model_internal.h"
#include "runtime/error.h"

/* The blocks a chunk over sublayers [first, end) completes (model/residual.h: sublayer j
 * is in block j / S + 1); chunk 0 also makes b_0 = e. */
static void span_blocks(ChunkSpan *span, const ResidualPlan *plan)
{
    if (plan->mode == RESIDUAL_STANDARD) {
        span->first_block = span->end_block = 0;
        return;
    }
    const int S = plan->sublayers_per_block;
    span->first_block = span->has_embedding ? 0 : span->first_sublayer / S + 1;
    span->end_block = (span->end_sublayer + S - 1) / S + 1;
}

void chunk_spans_build(ChunkSpan *spans, int n_chunks, const ModelConfig *config,
                       const ResidualPlan *plan, const int *layer_split, int n_split)
{
    const int L = config->n_layers;
    const char *key = n_split > 0 ? "parallel.layer_split"
                                  : "parallel.pp * parallel.virtual_stages (an even split)";
    if (n_chunks < 1 || n_chunks > L)
        fatal(EXIT_CONFIG, "%d chunks of model.n_layers = %d layers: set %s so that every "
              "chunk has a layer", n_chunks, L, key);
    if (n_split > 0 && n_split != n_chunks)
        fatal(EXIT_CONFIG, "parallel.layer_split has %d entries for %d chunks (parallel.pp * "
              "parallel.virtual_stages)", n_split, n_chunks);
    int first = 0;
    for (int c = 0; c < n_chunks; c++) {
        const int layers = n_split > 0 ? layer_split[c] : L / n_chunks + (c < L % n_chunks);
        if (layers < 1)
            fatal(EXIT_CONFIG, "parallel.layer_split gives chunk %d %d layers; every chunk "
                  "needs at least one", c, layers);
        ChunkSpan *span = &spans[c];
        span->index = c;
        span->first_layer = first;
        span->n_layers = layers;
        span->first_sublayer = 2 * first;
        span->end_sublayer = 2 * (first + layers);
        span->has_embedding = c == 0;
        span->has_head = c == n_chunks - 1;
        first += layers;
        if (first > L)
            break;
    }
    if (first != L)
        fatal(EXIT_CONFIG, "parallel.layer_split sums to %d layers, not model.n_layers = %d",
              first, L);
    const int S = plan->mode == RESIDUAL_STANDARD ? 0 : plan->sublayers_per_block;
    for (int c = 1; c < n_chunks && S > 0; c++)
        if (spans[c].first_sublayer % S != 0)
            fatal(EXIT_CONFIG, "%s puts a chunk edge after layer %d, inside a block of "
                  "residual.layers_per_block = %d layers: chunk edges must fall on block "
                  "edges", key, spans[c].first_layer - 1, S / 2);
    for (int c = 0; c < n_chunks; c++)
        span_blocks(&spans[c], plan);
}

StashShape chunk_stash_shape(const ChunkSpan *span, bool checkpointed)
{
    return (StashShape){
        .first_sublayer = span->first_sublayer,
        .end_sublayer = span->end_sublayer,
        .has_embedding = span->has_embedding,
        .has_head = span->has_head,
        .checkpointed = checkpointed,
    };
}

bool *store_needed_buffers(const Model *model, const ChunkSpan *spans, int n)
{
    const ResidualPlan *plan = &model->plan;
    if (plan->mode == RESIDUAL_STANDARD)
        return NULL;
    bool *needed = xcalloc((size_t)plan->n_buffers, sizeof *needed);
    int end_block = 0;
    for (int k = 0; k < n; k++) {
        if (spans[k].end_block > end_block)
            end_block = spans[k].end_block;
        for (int j = spans[k].first_sublayer; j < spans[k].end_sublayer; j++)
            needed[plan->sublayer_buffer[j]] = true; /* the chunk's own partials */
    }
    for (int block = 0; block < end_block && block <= plan->n_blocks; block++)
        needed[plan->block_buffer[block]] = true; /* read, made, or passed on */
    return needed;
}
