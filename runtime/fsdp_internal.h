/* runtime/fsdp_internal.h — the insides of an Fsdp (runtime/fsdp.h), shared by fsdp.c (the
 * layout, the buffers, gathers and reduce-scatters) and fsdp_gradients.c (the written-first
 * gradients: what a clear zeroes, what is zeroed before the gradients are read). Not for
 * use outside runtime/fsdp*.c.
 */
#ifndef FATHOM_RUNTIME_FSDP_INTERNAL_H
#define FATHOM_RUNTIME_FSDP_INTERNAL_H

#include "runtime/fsdp.h"

/* Pool slots for pooled units: the unit in use and the one prefetched behind it. */
enum { POOL_SLOTS = 2 };

typedef struct {
    bool local, pooled;
    int first_tensor, n_tensors;
    size_t local_offset, local_count; /* its range of the local buffers */
    size_t range_count;               /* that range's length, held or not: the same on
                                         every stage of one dp rank */
    size_t full_count, fp32_count;    /* its full buffers (fp32_count 0: no separate views) */
    Activation *compute;              /* persistent full buffers (aliases of the local ones */
    float *grads;                     /*  with one rank); NULL for pooled units */
    float *fp32;
    bool stale;                       /* the gathered copy predates the shards */
    int slot;                         /* pooled: the slot holding it, -1 none */
    DeviceCommWork *gather;           /* started, not yet waited */
    int releases_expected, releases_seen;
    bool reduced;                     /* persistent: this step's reduce-scatter started */
    /* "Written first" (fsdp.h): what a clear zeroes, [begin, end) pairs in the full layout
     * (all but the written_first tensors' rows), and whether those tensors are unwritten
     * since the last clear */
    size_t *zero_spans;
    int n_zero_spans;
    bool has_written_first, gradients_fresh;
} Unit;

typedef struct {
    Activation *compute;
    float *grads, *fp32;
    int unit;                         /* the unit it holds, -1 free */
    bool acquired;
} Slot;

struct Fsdp {
    const Backend *backend;
    DeviceComm *group;
    int rank, size;
    CommType compute_type;            /* what a gather of the compute copy moves */
    bool separate_fp32;               /* fp32 views need their own gather (bf16 backends) */
    FsdpTensorSpec *tensors;
    FsdpTensorPlace *places;
    int n_tensors, n_units;
    Unit *units;
    size_t local_count;
    float *params, *grads;            /* grads NULL: without gradients (forward only) */
    Activation *compute;              /* NULL: the master is the compute copy */
    Slot slots[POOL_SLOTS];
    int n_slots;
    float *reduce_scratch[2];         /* pooled reduce-scatter targets, used in turn */
    int next_scratch;
    /* the pooled reduce-scatter still to be added into the accumulators */
    DeviceCommWork *pending_work;
    int pending_unit, pending_scratch, pending_slot;
    DeviceCommWork **persistent_works; /* [n_units] persistent reduce-scatters this step */
    int n_persistent_works;
    size_t full_bytes;
    bool without_gradients;           /* FsdpSpec.without_gradients */
};

/* Fills the unit's zero spans from its tensors' places (its layout made). */
void fsdp_unit_zero_spans(Fsdp *fsdp, const FsdpSpec *spec, Unit *unit);
/* Zeroes all of the unit's full gradient buffer `grads` but its written_first tensors' rows,
 * which the next backward writes. */
void fsdp_unit_clear(Fsdp *fsdp, Unit *unit, float *grads);
/* Before unit u's gradients `grads` are read: written_first tensors no backward wrote since
 * the clear are zeroed. */
void fsdp_unit_settle(Fsdp *fsdp, int u, float *grads);

#endif
