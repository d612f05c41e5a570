/* pipeline/traffic.h — what one rank of a job sends in a training step, predicted from the
 * config alone (DESIGN 3): its stage's pipeline hops (pipeline/payload.h) and its FSDP
 * gathers and reduce-scatters (pipeline/fsdp_bytes.h), counted as runtime/comm.h counts
 * them. `fathom inspect --comm` sets it beside what a run measured; `fathom plan` prints it
 * before the run.
 */
#ifndef FATHOM_PIPELINE_TRAFFIC_H
#define FATHOM_PIPELINE_TRAFFIC_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/config.h"

typedef struct {
    uint64_t pp_send;              /* hop payloads sent: stream and summaries */
    uint64_t pp_summary;           /* summaries sent, with the cross-stage cache */
    uint64_t pp_summary_uncached;  /* summaries the same hops would carry without it */
    uint64_t fsdp_allgather, fsdp_reducescatter;
} RankTraffic;

/* One rank of `stage`, one step; activation_bytes: 4 on the cpu backend, 2 on cuda (the
 * payloads and the compute copy are activations). */
RankTraffic traffic_predict_rank(const Config *config, int stage, size_t activation_bytes);

#endif
