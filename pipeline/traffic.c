/* pipeline/traffic.c — see traffic.h. */
#include "pipeline/traffic.h"

#include <stdlib.h>

#include "model/chunk.h"
#include "model/residual.h"
#include "pipeline/fsdp_bytes.h"
#include "pipeline/payload.h"
#include "runtime/error.h"

RankTraffic traffic_predict_rank(const Config *config, int stage, size_t activation_bytes)
{
    const int P = config->parallel.pp, chunks = P * config->parallel.virtual_stages;
    ResidualPlan plan;
    residual_plan_build(&plan, &config->model, &config->residual);
    ChunkSpan *spans = xcalloc((size_t)chunks, sizeof *spans);
    chunk_spans_build(spans, chunks, &config->model, &plan, config->parallel.layer_split,
                      config->parallel.n_layer_split);
    const uint64_t tensor = (uint64_t)config->train.microbatch_size *
                            (uint64_t)config->train.seq_len *
                            (uint64_t)config->model.d_model * activation_bytes;
    const PayloadBytes hops = payload_predict(&plan, spans, chunks, P, stage,
                                              config_microbatches_per_rank(config), tensor);
    const FsdpBytes fsdp = fsdp_predict_step_bytes(config, stage, activation_bytes);
    free(spans);
    residual_plan_free(&plan);
    return (RankTraffic){
        .pp_send = hops.send_bytes,
        .pp_summary = hops.summary_bytes,
        .pp_summary_uncached = hops.summary_bytes_uncached,
        .fsdp_allgather = fsdp.allgather,
        .fsdp_reducescatter = fsdp.reducescatter,
    };
}
