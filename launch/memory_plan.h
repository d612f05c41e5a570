/* launch/memory_plan.h — what one rank of `fathom train` will hold, computed from the config
 * alone, and the check against the machine that runs before anything is allocated
 * (DESIGN 3, 6; docs/design-notes.md "The memory plan").
 *
 * memory_plan_build is a pure function of (config, backend, rank layout): it builds no
 * model and allocates no tensor. The host bookkeeping it does build (a residual plan, a
 * schedule's action list) is small next to what it describes, and is skipped when the
 * weights alone are past any machine. Bytes per rank, by category, with E the parameter
 * elements the rank holds (memory_plan_rank_elements):
 *
 *   parameters    fp32 master weights                                  4 E
 *   gradients     fp32 accumulators                                    4 E
 *   compute copy  the weights the ops read: bf16 on cuda               2 E   (cpu: none, the
 *                                                                            ops read the master)
 *   optimizer     AdamW's exp_avg and exp_avg_sq, and the EMA when     8 E or 12 E
 *                 optim.ema_decay > 0
 *   activations   the stashes and summary stores the schedule keeps in flight, the scratch,
 *                 the RoPE tables and, under pp, the gradient staging of a hop: the byte
 *                 functions of model/activations.h, counted as pipeline/executor.c allocates;
 *                 with several chunks, the hop tensors the links hold until their receiver
 *                 takes them (a bound from the stash bounds; in host memory where a link
 *                 stages through MPI, counted here all the same)
 *   host          host memory besides: the token corpus (the synthetic one is generated
 *                 whole), batch buffers, the staging of the largest tensor, and the
 *                 bookkeeping of the parameter table, residual plan and action list
 * On cpu every category is host memory; on cuda all but `host` are device memory.
 *
 * Sharding: every fp32 and compute-copy term is a multiple of E, and
 * memory_plan_rank_elements is the one place that says what E is for a rank.
 */
#ifndef FATHOM_LAUNCH_MEMORY_PLAN_H
#define FATHOM_LAUNCH_MEMORY_PLAN_H

#include <stdbool.h>
#include <stdio.h>

#include "launch/machine.h"
#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/grid.h"

/* The rank a plan is for, in the grid of DESIGN 3. */
typedef struct {
    int pp, dp;         /* parallel.pp x parallel.dp */
    int stage, dp_rank; /* rank = stage * dp + dp_rank */
} RankLayout;

/* The parameter table of model/params.h, counted without building it (doubles, so that no
 * config overflows; exact while below 2^53). */
typedef struct {
    double total;          /* flat elements, alignment padding included: ParamTable.total */
    double embedding_unit; /* unit 0's span: the embedding */
    double layer_unit;     /* one decoder layer's unit, padded to PARAM_ALIGNMENT */
    double last_unit;      /* final site, final norm, lm_head */
    double shared_unit;    /* route_null and the stream convolutions (0: none) */
    double routing_unit;   /* the sites of a block's layers, padded to PARAM_ALIGNMENT */
    double routing_tail;   /* the last routing unit (its block may be short) */
    double routing_units, layers_per_routing_unit; /* 0 units in mode standard */
    double largest;        /* elements of the largest tensor */
    double layer_matrix;   /* q, k, v, o, gate, up, down over every layer (DESIGN 6 MFU) */
    double tensors;        /* entries of the table */
} ParameterCount;

void memory_plan_count_parameters(ParameterCount *count, const Config *config);

/* The parameter elements (E) that rank `layout` holds master weights, gradients, optimizer
 * state and a compute copy of: its stage's units, sharded over its dp group (FSDP). The
 * units it gathers whole beside them count in the compute copy and the gradients. */
double memory_plan_rank_elements(const ParameterCount *count, const Config *config,
                                 RankLayout layout);

typedef struct {
    double elements;                                        /* E */
    double parameters, gradients, compute_copy, optimizer;  /* bytes */
    double activations, host;                               /* bytes */
    /* the activations' parts */
    double stash_bytes, store_bytes, scratch_bytes, rope_bytes, staging_bytes;
    double held_bytes;       /* hop tensors held by the links until received (a bound) */
    int stashes, stores;     /* kept at once, over the rank's chunks */
    bool activations_sized;  /* false: the weights alone are past any machine */
    bool activations_exact;  /* false: estimated per token (past 2^50 bytes) */
} MemoryPlan;

void memory_plan_build(MemoryPlan *plan, const Config *config, const Backend *backend,
                       RankLayout layout);

/* What `fathom eval` of a checkpoint of this config holds on its one
 * process's backend (launch/inference.c): every parameter's fp32 master and compute copy,
 * no gradients, and the whole network's checkpointed stash, its summary store and the
 * checkpointed scratch for train.microbatch_size sequences. */
double memory_plan_evaluation_bytes(const Config *config, const Backend *backend);

/* What the backend holds (every category but host). */
double memory_plan_backend_bytes(const MemoryPlan *plan);

/* The plan, one line a category, each line starting "fathom: ". */
void memory_plan_print(FILE *out, const MemoryPlan *plan, const Config *config,
                       const Backend *backend, RankLayout layout);

/* True when the plan fits in what the machine offers this rank (`device` is ignored on
 * cpu, where everything is host memory; a figure < 0 is unknown and always fits); else
 * writes the error message: what is needed, what there is, and the keys that shrink the
 * largest parts, with their values. */
bool memory_plan_fits(const MemoryPlan *plan, const Config *config, const Backend *backend,
                      MachineMemory device, MachineMemory host, char *message,
                      size_t capacity);

/* Builds this rank's plan and checks it against the machine: when it does not fit, prints
 * the plan to stderr and exits EXIT_CONFIG with memory_plan_fits's message. */
void memory_plan_check(const Config *config, const Backend *backend, const RankGrid *grid);

#endif
