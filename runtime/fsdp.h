/* runtime/fsdp.h — parameter shards and gathered units (DESIGN 3, "FSDP").
 *
 * What it does. The parameters are cut into units (a unit is a list of tensors that are
 * read together: a decoder layer, the embedding, the head...). Every tensor is sharded
 * along its first dimension over the D ranks of a data-parallel group: rows are padded to
 * a multiple of D, and dp rank r holds rows [r * s, (r + 1) * s), s = ceil(rows / D).
 * Each rank keeps, for the units its stage reads, only its shards: the fp32 master, the
 * fp32 gradient accumulators and the compute copy of the shard (the activation dtype;
 * on the cpu backend the compute copy IS the master). The optimizer state lives outside,
 * in buffers of the same local layout (fsdp_local_count elements).
 *
 * Before a unit is used its full tensors are gathered (one grouped all-gather of the
 * compute copies) into full per-tensor buffers; tensors marked fp32_view (values the
 * kernels take as fp32: the delta gate alpha, MSAR's mix_bias) are gathered in fp32 too.
 * The backward adds into full fp32 gradient buffers, which leave the unit with one grouped
 * reduce-scatter into the shards' accumulators. Two policies (fsdp.reshard_after_forward):
 *   persistent  (false) a unit's full buffers live for the whole run; it is gathered once
 *               per step (after the optimizer changed the shards) and its gradients are
 *               reduce-scattered once, after the unit's last backward of the step;
 *   pooled      (true)  a unit is gathered into one of a few pool slots at each use and
 *               given back at release; each backward's gradients are reduce-scattered into
 *               the accumulators at its release (least memory: ZeRO-3).
 * The caller says which units are pooled; fathom pools the decoder layers and keeps the
 * embedding, head and shared routing units persistent (docs/design-notes.md).
 *
 * With one rank (D = 1) nothing is gathered or reduced: a unit's full buffers ARE the
 * local shard buffers, so the one-process run is exactly what it was.
 *
 * Written first. A tensor marked written_first (the projections: every contribution to
 * their gradients comes from matmul_backward, which can write instead of add) is not zeroed
 * when its unit's gradient buffer is cleared (fsdp_step_begin; a pooled unit's acquire for
 * a backward). The first backward after a clear asks fsdp_gradient_mode, gets GRAD_WRITE,
 * and must then write every written_first tensor of the unit; later backwards get
 * GRAD_ADD. A unit whose written_first tensors were not written by the time its gradients
 * are read (its reduce-scatter, fsdp_step_finish, fsdp_local_grads) has them zeroed then.
 * At Llama-3-8B (all but the embedding and the norms: 93% of the parameters) this spares
 * zeroing those gradients and reading the zeros back in the first microbatch's products,
 * 8 bytes a parameter a step. Everything
 * else (the padding, the norms, the embedding, the routing weights) is zeroed as before.
 *
 * Layouts (elements). Local: units in order, each starting on a multiple of `alignment`,
 * its tensors' shards one after another, each on a multiple of `alignment` too; with D = 1
 * and every unit local this is the model's flat parameter layout. Full: per unit, each
 * tensor's D * s rows on a multiple of `alignment`.
 *
 * Ordering (runtime/device_comm.h). Gathers and reduce-scatters run after the compute ops
 * queued before them; fsdp_acquire returns when the compute stream is ordered after the
 * unit's gather. fsdp_prefetch starts the next unit's gather early, so that on NCCL it
 * runs beside the current unit's compute.
 *
 * Memory: fsdp owns every buffer it returns; pointers from fsdp_acquire are valid until
 * the unit's fsdp_release (pooled) or for the run (persistent, and D = 1).
 */
#ifndef FATHOM_RUNTIME_FSDP_H
#define FATHOM_RUNTIME_FSDP_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/backend.h"
#include "runtime/device_comm.h"

/* One tensor as FSDP sees it: `rows` rows of `row_elements` elements. */
typedef struct {
    size_t rows, row_elements;
    int unit;
    bool fp32_view;     /* the kernels read it as fp32: gathered in fp32 as well */
    bool written_first; /* its gradient is written by the first backward after a clear */
} FsdpTensorSpec;

typedef struct {
    const Backend *backend;
    DeviceComm *group;            /* the stage's data-parallel group; NULL: one rank */
    const FsdpTensorSpec *tensors; /* [n_tensors], grouped by unit in ascending order */
    int n_tensors;
    int n_units;
    const bool *local_units;      /* [n_units]: this rank's stage reads it; NULL: every unit */
    const bool *pooled_units;     /* [n_units]: the pooled policy; NULL: none */
    size_t alignment;             /* elements */
    bool without_gradients;       /* forward only (eval, probe): no gradient buffers at all;
                                     a step or an acquire for a backward is refused */
} FsdpSpec;

/* Where a tensor lives. */
typedef struct {
    size_t shard_rows;     /* s = ceil(rows / D) */
    size_t row_begin;      /* this rank's first row: dp_rank * s */
    size_t held_rows;      /* rows of the tensor this rank holds (padding excluded) */
    size_t local_offset;   /* its shard in the local buffers; SIZE_MAX: unit not local */
    size_t full_offset;    /* in its unit's full buffers */
    size_t fp32_offset;    /* in its unit's fp32 view buffer (fp32_view tensors) */
} FsdpTensorPlace;

/* A unit's full buffers while acquired. grads is NULL unless acquired for a backward. */
typedef struct {
    Activation *compute;   /* [full count] the activation dtype */
    float *grads;          /* [full count] fp32 */
    const float *fp32;     /* the fp32 views: [fp32 count], or on fp32 backends `compute` */
} FsdpUnitBuffers;

typedef struct Fsdp Fsdp;

/* Allocates the local shards (zeroed) and, for persistent units, the full buffers; the
 * pool slots for pooled units. Collective over the group only through later calls. */
Fsdp *fsdp_create(const FsdpSpec *spec);
void fsdp_destroy(Fsdp *fsdp);

int fsdp_dp_size(const Fsdp *fsdp);
int fsdp_dp_rank(const Fsdp *fsdp);
const FsdpTensorPlace *fsdp_place(const Fsdp *fsdp, int tensor);
bool fsdp_unit_local(const Fsdp *fsdp, int unit);
/* Elements of the local buffers (padding included), and the local buffers themselves. */
size_t fsdp_local_count(const Fsdp *fsdp);
float *fsdp_local_params(Fsdp *fsdp);
/* The gradient accumulators, holding every contribution so far (with one rank, the
 * written_first tensors no backward wrote since the last clear are zeroed first). */
float *fsdp_local_grads(Fsdp *fsdp);
/* The local compute copy, or NULL when it is the master itself (fp32 backends). */
Activation *fsdp_local_compute(Fsdp *fsdp);
/* The unit's range of the local buffers: its offset (meaningful where held) and its
 * length, which every stage of one dp rank computes alike, held or not (the shared
 * tensors' gradients are summed over stages range by range). */
void fsdp_unit_range(const Fsdp *fsdp, int unit, size_t *offset, size_t *count);
/* False for a forward-only instance (FsdpSpec.without_gradients). */
bool fsdp_has_gradients(const Fsdp *fsdp);
/* Backend bytes: local shards (master, gradients, compute copy), and full buffers (the
 * persistent units' and the pool's). */
void fsdp_memory_bytes(const Fsdp *fsdp, size_t *shard_bytes, size_t *full_bytes);

/* Makes the local compute copy equal the master again and marks every gathered unit
 * stale (call after anything but the optimizer wrote the master). */
void fsdp_refresh_compute(Fsdp *fsdp);
/* The optimizer wrote the shards (and their compute copy): every gathered unit is stale. */
void fsdp_params_changed(Fsdp *fsdp);

/* The start of a training step: clears every gradient accumulator and full gradient
 * buffer (zeroes all but the written_first tensors, "Written first" above). `releases`
 * [n_units]: how many fsdp_release(..., gradients = true) each unit
 * will see this step (NULL: not counted; persistent units then reduce at
 * fsdp_step_finish only). */
void fsdp_step_begin(Fsdp *fsdp, const int *releases);
/* The end of a step's backwards: every outstanding reduce-scatter done and added; the
 * accumulators hold this rank's shard of the step's gradients. A unit released more or
 * fewer times than announced is a bug (fatal, naming it). */
void fsdp_step_finish(Fsdp *fsdp);

/* The unit's full buffers, gathered if stale or pooled; for_backward also hands out a
 * cleared full gradient buffer (pooled) or the step's (persistent). */
FsdpUnitBuffers fsdp_acquire(Fsdp *fsdp, int unit, bool for_backward);
/* For the backward about to run on the unit, acquired for one: GRAD_WRITE the first time
 * after its gradients were cleared, if it has written_first tensors (the caller then
 * writes every one of them), else GRAD_ADD. */
GradMode fsdp_gradient_mode(Fsdp *fsdp, int unit);
/* Starts the unit's gather if it will need one and a pool slot is free; never waits. */
void fsdp_prefetch(Fsdp *fsdp, int unit);
/* The caller is done with the unit. gradients: its full gradient buffer holds a backward's
 * contributions (reduce-scattered now if pooled, after the last announced release if
 * persistent). */
void fsdp_release(Fsdp *fsdp, int unit, bool gradients);

#endif
