/* pipeline/payload.h — what a pipeline hop carries (DESIGN 3), as a pure function of the
 * chunk spans, the stage count and the cross-stage cache, and what it costs.
 *
 * The forward hop of a microbatch from chunk c to chunk c+1 carries, each [B*T, d]:
 *   - the stream (h in the standard residual, p in the delta form; none in replace);
 *   - the completed block summaries the receiver does not hold. Without the cache that is
 *     every block made in chunks 0..c; with it (always on: it changes nothing when v = 1)
 *     only those made in chunks max(0, c+2-P)..c, because the receiving stage ran chunk
 *     c+1-P of the same microbatch and kept every summary it had then (model/chunk.h).
 * Blocks made in a run of chunks are one contiguous range [first_block, end_block), so a
 * hop's summaries are that range. The backward hop from c+1 to c carries the gradients of
 * exactly the same tensors.
 *
 * Bytes are counted per stage, sent in both directions, for M microbatches of `rows`
 * tokens: a tensor is rows * d activation elements. Summed over a microbatch's forward
 * hops in units of rows * d, with C = P*v chunks of N_p blocks each (b_0 counted in chunk
 * 0, so chunk 0 makes N_p + 1):
 *   uncached  N_p C(C-1)/2 + (C-1)
 *   cached    N_p P(P-1)/2 + P(v-1)(P-1) N_p + (P-1)
 * plus, with a stream, C-1 (one per hop). payload_predict computes it hop by hop from the
 * real spans, so uneven splits are exact too; tests hold it to the closed form.
 */
#ifndef FATHOM_PIPELINE_PAYLOAD_H
#define FATHOM_PIPELINE_PAYLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "model/chunk.h"

typedef struct {
    bool stream;               /* h or p travels */
    int first_block, end_block; /* the summaries b_n, n in [first_block, end_block) */
} HopPayload;

/* The forward hop from chunk c to c+1 (0 <= c < n_chunks - 1) with P stages. */
HopPayload payload_hop(const ResidualPlan *plan, const ChunkSpan *spans, int n_chunks, int P,
                       int c, bool cached);

/* Tensors of [rows, d] a hop carries. */
int payload_tensors(HopPayload hop);

/* What one stage sends per step, in bytes: every hop out of its chunks, both directions. */
typedef struct {
    uint64_t send_bytes;              /* stream and summaries */
    uint64_t summary_bytes;           /* summaries, with the cache */
    uint64_t summary_bytes_uncached;  /* summaries the same hops carry without it */
} PayloadBytes;

PayloadBytes payload_predict(const ResidualPlan *plan, const ChunkSpan *spans, int n_chunks,
                             int P, int stage, int microbatches, uint64_t tensor_bytes);

#endif
