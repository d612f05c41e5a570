/* pipeline/payload.c — see payload.h. */
#include "pipeline/payload.h"

HopPayload payload_hop(const ResidualPlan *plan, const ChunkSpan *spans, int n_chunks, int P,
                       int c, bool cached)
{
    (void)n_chunks;
    HopPayload hop = {0};
    if (plan->mode == RESIDUAL_STANDARD) {
        hop.stream = true;
        return hop;
    }
    hop.stream = plan->form == FORM_DELTA;
    const int lowest = cached && c + 2 - P > 0 ? c + 2 - P : 0;
    hop.first_block = spans[lowest].first_block;
    hop.end_block = spans[c].end_block;
    return hop;
}

int payload_tensors(HopPayload hop)
{
    return (hop.stream ? 1 : 0) + hop.end_block - hop.first_block;
}

PayloadBytes payload_predict(const ResidualPlan *plan, const ChunkSpan *spans, int n_chunks,
                             int P, int stage, int microbatches, uint64_t tensor_bytes)
{
    PayloadBytes bytes = {0};
    for (int c = stage; c < n_chunks; c += P) {
        /* forward out of c (to c+1) and backward out of c (to c-1, the gradients of the
         * tensors hop c-1 -> c carried) */
        for (int hop_from = c - 1; hop_from <= c; hop_from++) {
            if (hop_from < 0 || hop_from >= n_chunks - 1)
                continue;
            const HopPayload cached = payload_hop(plan, spans, n_chunks, P, hop_from, true);
            const HopPayload plain = payload_hop(plan, spans, n_chunks, P, hop_from, false);
            const uint64_t per_microbatch = tensor_bytes * (uint64_t)microbatches;
            bytes.send_bytes += per_microbatch * (uint64_t)payload_tensors(cached);
            bytes.summary_bytes +=
                per_microbatch * (uint64_t)(cached.end_block - cached.first_block);
            bytes.summary_bytes_uncached +=
                per_microbatch * (uint64_t)(plain.end_block - plain.first_block);
        }
    }
    return bytes;
}
