/* pipeline/fsdp_bytes.h — what FSDP moves in one training step, predicted from the config
 * alone (DESIGN 3; runtime/fsdp.h), to stand beside what the ranks measured
 * (`fathom inspect --comm`).
 *
 * One rank of a stage of D data-parallel ranks, per step, counted as runtime/comm.h counts
 * (each rank's share: (D - 1) x its shard):
 *   a gather of unit u      (D - 1) x sum over u's tensors of shard x activation bytes, plus,
 *                           on bf16 backends, (D - 1) x the fp32 views' shards x 4
 *   a reduce-scatter of u   (D - 1) x sum over u's tensors of shard x 4
 * with shard = ceil(rows / D) x row elements. How often, by policy: a persistent unit is
 * gathered once a step and reduce-scattered once; a pooled unit (a decoder layer under
 * fsdp.reshard_after_forward) is gathered at each use, forward and backward, and
 * reduce-scattered after each backward: 2 M and M times for the M microbatches of its chunk.
 * With D = 1 nothing moves.
 */
#ifndef FATHOM_PIPELINE_FSDP_BYTES_H
#define FATHOM_PIPELINE_FSDP_BYTES_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "runtime/config.h"

typedef struct {
    uint64_t allgather, reducescatter;
} FsdpBytes;

/* The elements of one rank's shard of a tensor: ceil(rows / D) of its first dimension's rows
 * (runtime/fsdp.c pads every tensor so). */
size_t fsdp_shard_elements(const ParamEntry *entry, int D);

/* One rank of `stage`, one step; activation_bytes: 4 on the cpu backend, 2 on cuda. */
FsdpBytes fsdp_predict_step_bytes(const Config *config, int stage, size_t activation_bytes);

#endif
