/* runtime/fsdp.c — see fsdp.h. Layout first, then the buffers, then gather and reduce; the
 * written-first gradients are in fsdp_gradients.c. */
#include "runtime/fsdp.h"
#include "runtime/fsdp_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

static size_t align_up(size_t elements, size_t alignment)
{
    return (elements + alignment - 1) / alignment * alignment;
}

static void *alloc_or_fail(const Backend *backend, size_t bytes, const char *what)
{
    void *pointer = backend->alloc(bytes ? bytes : 1);
    if (!pointer)
        fatal(EXIT_CONFIG, "cannot allocate %.2f GiB for %s on the %s backend",
              (double)bytes / (1 << 30), what, backend->name);
    return pointer;
}

/* Every tensor's shard geometry and offsets, every unit's ranges (fsdp.h, "Layouts"). */
static void fsdp_layout(Fsdp *fsdp, const FsdpSpec *spec)
{
    const size_t D = (size_t)fsdp->size, alignment = spec->alignment;
    size_t local = 0;
    int t = 0;
    for (int u = 0; u < fsdp->n_units; u++) {
        Unit *unit = &fsdp->units[u];
        unit->local = !spec->local_units || spec->local_units[u];
        unit->pooled = unit->local && fsdp->size > 1 && spec->pooled_units &&
                       spec->pooled_units[u];
        unit->slot = -1;
        unit->first_tensor = t;
        local = align_up(local, alignment);
        unit->local_offset = local;
        size_t full = 0, fp32 = 0, range = 0;
        for (; t < fsdp->n_tensors && spec->tensors[t].unit == u; t++) {
            const FsdpTensorSpec *tensor = &spec->tensors[t];
            FsdpTensorPlace *place = &fsdp->places[t];
            place->shard_rows = (tensor->rows + D - 1) / D;
            place->row_begin = (size_t)fsdp->rank * place->shard_rows;
            place->held_rows = place->row_begin >= tensor->rows ? 0
                               : tensor->rows - place->row_begin < place->shard_rows
                                   ? tensor->rows - place->row_begin
                                   : place->shard_rows;
            const size_t shard = place->shard_rows * tensor->row_elements;
            full = align_up(full, alignment);
            place->full_offset = full;
            full += D * shard;
            place->fp32_offset = place->full_offset;
            if (fsdp->separate_fp32 && tensor->fp32_view) {
                fp32 = align_up(fp32, alignment);
                place->fp32_offset = fp32;
                fp32 += D * shard;
            }
            range = align_up(range, alignment);
            if (unit->local) {
                local = align_up(local, alignment);
                place->local_offset = local;
                local += shard;
            } else {
                place->local_offset = SIZE_MAX;
            }
            range += shard;
        }
        unit->n_tensors = t - unit->first_tensor;
        unit->full_count = full;
        fsdp_unit_zero_spans(fsdp, spec, unit);
        unit->fp32_count = fp32;
        unit->local_count = unit->local ? local - unit->local_offset : 0;
        unit->range_count = range;
    }
    if (t != fsdp->n_tensors)
        fatal(EXIT_CONFIG, "fsdp: tensor %d names unit %d, out of order or past the %d units",
              t, spec->tensors[t].unit, fsdp->n_units);
    fsdp->local_count = local;
}

/* One rank: the full buffers are the local ones. Several: persistent units get their own;
 * pooled units share the slots, sized for the largest of them. */
static void fsdp_allocate(Fsdp *fsdp)
{
    const Backend *backend = fsdp->backend;
    const size_t count = fsdp->local_count ? fsdp->local_count : 1;
    const bool gradients = !fsdp->without_gradients;
    fsdp->params = alloc_or_fail(backend, count * sizeof(float), "the parameter shards");
    if (gradients)
        fsdp->grads = alloc_or_fail(backend, count * sizeof(float), "the gradient shards");
    if (backend->activation_bytes != sizeof(float))
        fsdp->compute = alloc_or_fail(backend, count * backend->activation_bytes,
                                      "the compute copy of the parameter shards");
    Activation *local_compute = fsdp->compute ? fsdp->compute : (Activation *)fsdp->params;
    size_t slot_full = 0, slot_fp32 = 0, slot_local = 0;
    for (int u = 0; u < fsdp->n_units; u++) {
        Unit *unit = &fsdp->units[u];
        if (!unit->local)
            continue;
        if (fsdp->size == 1) {
            unit->compute = activation_at(backend, local_compute, unit->local_offset);
            unit->grads = gradients ? fsdp->grads + unit->local_offset : NULL;
            unit->fp32 = fsdp->params + unit->local_offset;
            continue;
        }
        if (unit->pooled) {
            slot_full = unit->full_count > slot_full ? unit->full_count : slot_full;
            slot_fp32 = unit->fp32_count > slot_fp32 ? unit->fp32_count : slot_fp32;
            slot_local = unit->local_count > slot_local ? unit->local_count : slot_local;
            continue;
        }
        unit->compute = alloc_or_fail(backend, unit->full_count * backend->activation_bytes,
                                      "a gathered unit");
        fsdp->full_bytes += unit->full_count * backend->activation_bytes;
        if (gradients) {
            unit->grads = alloc_or_fail(backend, unit->full_count * sizeof(float),
                                        "a gathered unit's gradients");
            fsdp->full_bytes += unit->full_count * sizeof(float);
        }
        if (unit->fp32_count) {
            unit->fp32 = alloc_or_fail(backend, unit->fp32_count * sizeof(float),
                                       "a gathered unit's fp32 values");
            fsdp->full_bytes += unit->fp32_count * sizeof(float);
        }
        unit->stale = true;
    }
    if (slot_full == 0)
        return;
    fsdp->n_slots = POOL_SLOTS;
    for (int s = 0; s < POOL_SLOTS; s++) {
        Slot *slot = &fsdp->slots[s];
        slot->compute = alloc_or_fail(backend, slot_full * backend->activation_bytes,
                                      "a pool slot");
        if (gradients)
            slot->grads = alloc_or_fail(backend, slot_full * sizeof(float), "a pool slot");
        if (slot_fp32)
            slot->fp32 = alloc_or_fail(backend, slot_fp32 * sizeof(float), "a pool slot");
        slot->unit = -1;
        fsdp->full_bytes += slot_full * (backend->activation_bytes +
                                         (gradients ? sizeof(float) : 0)) +
                            slot_fp32 * sizeof(float);
    }
    if (!gradients)
        return;
    for (int k = 0; k < 2; k++)
        fsdp->reduce_scratch[k] = alloc_or_fail(backend, slot_local * sizeof(float),
                                                "the reduce-scatter scratch");
    fsdp->full_bytes += 2 * slot_local * sizeof(float);
}

Fsdp *fsdp_create(const FsdpSpec *spec)
{
    Fsdp *fsdp = xcalloc(1, sizeof *fsdp);
    fsdp->backend = spec->backend;
    fsdp->group = spec->group;
    fsdp->without_gradients = spec->without_gradients;
    fsdp->rank = 0;
    fsdp->size = 1;
    if (spec->group) {
        Comm *comm = device_comm_group(spec->group);
        fsdp->rank = comm_rank(comm);
        fsdp->size = comm_size(comm);
    }
    fsdp->compute_type = spec->backend->activation_bytes == sizeof(float) ? COMM_FLOAT32
                                                                           : COMM_BFLOAT16;
    fsdp->separate_fp32 = fsdp->size > 1 && spec->backend->activation_bytes != sizeof(float);
    fsdp->n_tensors = spec->n_tensors;
    fsdp->n_units = spec->n_units;
    fsdp->tensors = xcalloc((size_t)spec->n_tensors + 1, sizeof *fsdp->tensors);
    memcpy(fsdp->tensors, spec->tensors, (size_t)spec->n_tensors * sizeof *fsdp->tensors);
    fsdp->places = xcalloc((size_t)spec->n_tensors + 1, sizeof *fsdp->places);
    fsdp->units = xcalloc((size_t)spec->n_units, sizeof *fsdp->units);
    fsdp->persistent_works = xcalloc((size_t)spec->n_units, sizeof *fsdp->persistent_works);
    fsdp_layout(fsdp, spec);
    fsdp_allocate(fsdp);
    return fsdp;
}

void fsdp_destroy(Fsdp *fsdp)
{
    if (!fsdp)
        return;
    const Backend *backend = fsdp->backend;
    for (int u = 0; u < fsdp->n_units && fsdp->size > 1; u++) {
        Unit *unit = &fsdp->units[u];
        if (!unit->local || unit->pooled)
            continue;
        backend->release(unit->compute);
        backend->release(unit->grads);
        if (unit->fp32)
            backend->release(unit->fp32);
    }
    for (int s = 0; s < fsdp->n_slots; s++) {
        backend->release(fsdp->slots[s].compute);
        backend->release(fsdp->slots[s].grads);
        if (fsdp->slots[s].fp32)
            backend->release(fsdp->slots[s].fp32);
    }
    for (int k = 0; k < 2; k++)
        if (fsdp->reduce_scratch[k])
            backend->release(fsdp->reduce_scratch[k]);
    backend->release(fsdp->params);
    backend->release(fsdp->grads);
    if (fsdp->compute)
        backend->release(fsdp->compute);
    for (int u = 0; u < fsdp->n_units; u++)
        free(fsdp->units[u].zero_spans);
    free(fsdp->tensors);
    free(fsdp->places);
    free(fsdp->units);
    free(fsdp->persistent_works);
    free(fsdp);
}

int fsdp_dp_size(const Fsdp *fsdp) { return fsdp->size; }
int fsdp_dp_rank(const Fsdp *fsdp) { return fsdp->rank; }
const FsdpTensorPlace *fsdp_place(const Fsdp *fsdp, int tensor) { return &fsdp->places[tensor]; }
bool fsdp_unit_local(const Fsdp *fsdp, int unit) { return fsdp->units[unit].local; }
size_t fsdp_local_count(const Fsdp *fsdp) { return fsdp->local_count; }
float *fsdp_local_params(Fsdp *fsdp) { return fsdp->params; }
bool fsdp_has_gradients(const Fsdp *fsdp) { return !fsdp->without_gradients; }
float *fsdp_local_grads(Fsdp *fsdp)
{
    if (fsdp->without_gradients)
        return NULL;
    for (int u = 0; u < fsdp->n_units && fsdp->size == 1; u++)
        if (fsdp->units[u].local)
            fsdp_unit_settle(fsdp, u, fsdp->units[u].grads);
    return fsdp->grads;
}
Activation *fsdp_local_compute(Fsdp *fsdp) { return fsdp->compute; }

void fsdp_unit_range(const Fsdp *fsdp, int unit, size_t *offset, size_t *count)
{
    *offset = fsdp->units[unit].local_offset;
    *count = fsdp->units[unit].range_count;
}

void fsdp_memory_bytes(const Fsdp *fsdp, size_t *shard_bytes, size_t *full_bytes)
{
    *shard_bytes = fsdp->local_count * ((fsdp->without_gradients ? 1 : 2) * sizeof(float) +
                                        (fsdp->compute ? fsdp->backend->activation_bytes : 0));
    *full_bytes = fsdp->full_bytes;
}

static void mark_stale(Fsdp *fsdp)
{
    for (int u = 0; u < fsdp->n_units; u++)
        fsdp->units[u].stale = fsdp->size > 1;
}

void fsdp_refresh_compute(Fsdp *fsdp)
{
    if (fsdp->compute)
        fsdp->backend->activations_from_floats(fsdp->compute, fsdp->params,
                                               fsdp->local_count);
    mark_stale(fsdp);
}

void fsdp_params_changed(Fsdp *fsdp) { mark_stale(fsdp); }

/* ---- gathers ---- */

/* Starts the all-gather of unit u's shards into the given full buffers. */
static DeviceCommWork *gather_start(Fsdp *fsdp, int u, Activation *compute, float *fp32)
{
    const Backend *backend = fsdp->backend;
    const Unit *unit = &fsdp->units[u];
    const Activation *local = fsdp->compute ? fsdp->compute : (Activation *)fsdp->params;
    device_comm_group_begin(fsdp->group);
    for (int t = unit->first_tensor; t < unit->first_tensor + unit->n_tensors; t++) {
        const FsdpTensorPlace *place = &fsdp->places[t];
        const size_t shard = place->shard_rows * fsdp->tensors[t].row_elements;
        device_comm_allgather(fsdp->group, activation_at_const(backend, local,
                                                               place->local_offset),
                              activation_at(backend, compute, place->full_offset), shard,
                              fsdp->compute_type, COMM_KIND_FSDP_ALLGATHER);
        if (fsdp->separate_fp32 && fsdp->tensors[t].fp32_view)
            device_comm_allgather(fsdp->group, fsdp->params + place->local_offset,
                                  fp32 + place->fp32_offset, shard, COMM_FLOAT32,
                                  COMM_KIND_FSDP_ALLGATHER);
    }
    DeviceCommWork *work = device_comm_group_end(fsdp->group);
    return work;
}

static FsdpUnitBuffers unit_buffers(const Fsdp *fsdp, Activation *compute, float *grads,
                                    float *fp32)
{
    return (FsdpUnitBuffers){compute, grads, fsdp->separate_fp32 ? fp32 : (const float *)compute};
}

/* A free slot, or the slot of a prefetched unit nobody acquired (its gather waited out). */
static int slot_take(Fsdp *fsdp, int u)
{
    for (int s = 0; s < fsdp->n_slots; s++)
        if (fsdp->slots[s].unit < 0) {
            fsdp->slots[s].unit = u;
            return s;
        }
    for (int s = 0; s < fsdp->n_slots; s++) {
        Slot *slot = &fsdp->slots[s];
        if (slot->acquired)
            continue;
        Unit *evicted = &fsdp->units[slot->unit];
        if (evicted->gather)
            device_comm_work_wait(evicted->gather);
        evicted->gather = NULL;
        evicted->slot = -1;
        slot->unit = u;
        return s;
    }
    return -1;
}

static void pending_finish(Fsdp *fsdp);

void fsdp_prefetch(Fsdp *fsdp, int u)
{
    if (fsdp->size == 1 || u < 0 || u >= fsdp->n_units)
        return;
    Unit *unit = &fsdp->units[u];
    if (!unit->local || unit->gather)
        return;
    if (!unit->pooled) {
        if (unit->stale) {
            unit->gather = gather_start(fsdp, u, unit->compute, unit->fp32);
            unit->stale = false;
        }
        return;
    }
    if (unit->slot >= 0)
        return;
    for (int s = 0; s < fsdp->n_slots; s++) {
        Slot *slot = &fsdp->slots[s];
        if (slot->unit >= 0)
            continue;
        if (fsdp->pending_work && fsdp->pending_slot == s)
            pending_finish(fsdp);
        slot->unit = u;
        unit->slot = s;
        unit->gather = gather_start(fsdp, u, slot->compute, slot->fp32);
        return;
    }
}

FsdpUnitBuffers fsdp_acquire(Fsdp *fsdp, int u, bool for_backward)
{
    if (u < 0 || u >= fsdp->n_units || !fsdp->units[u].local)
        fatal(EXIT_CONFIG, "fsdp: unit %d is not held by this rank", u);
    if (for_backward && fsdp->without_gradients)
        fatal(EXIT_CONFIG, "fsdp: unit %d acquired for a backward, but the model was made "
              "for the forward only (no gradients)", u);
    Unit *unit = &fsdp->units[u];
    if (fsdp->size == 1) /* the local buffers themselves; the fp32 views are the master */
        return (FsdpUnitBuffers){unit->compute, for_backward ? unit->grads : NULL, unit->fp32};
    if (!unit->pooled) {
        fsdp_prefetch(fsdp, u); /* starts the gather when stale */
        if (unit->gather)
            device_comm_work_wait(unit->gather);
        unit->gather = NULL;
        return unit_buffers(fsdp, unit->compute, for_backward ? unit->grads : NULL,
                            unit->fp32);
    }
    if (unit->slot < 0) {
        const int s = slot_take(fsdp, u);
        if (s < 0)
            fatal(EXIT_CONFIG, "fsdp: no pool slot free for unit %d (units acquired at once "
                  "exceed the pool of %d)", u, fsdp->n_slots);
        if (fsdp->pending_work && fsdp->pending_slot == s)
            pending_finish(fsdp);
        unit->slot = s;
        unit->gather = gather_start(fsdp, u, fsdp->slots[s].compute, fsdp->slots[s].fp32);
    }
    Slot *slot = &fsdp->slots[unit->slot];
    if (unit->gather)
        device_comm_work_wait(unit->gather);
    unit->gather = NULL;
    slot->acquired = true;
    if (for_backward) {
        if (fsdp->pending_work && fsdp->pending_slot == unit->slot)
            pending_finish(fsdp);
        fsdp_unit_clear(fsdp, unit, slot->grads);
    }
    return unit_buffers(fsdp, slot->compute, for_backward ? slot->grads : NULL, slot->fp32);
}

/* ---- reduce-scatters ---- */

/* Starts the reduce-scatter of unit u's full gradients into `target`, a buffer laid out
 * like the unit's range of the local buffers. */
static DeviceCommWork *reduce_start(Fsdp *fsdp, int u, float *grads, float *target)
{
    const Unit *unit = &fsdp->units[u];
    fsdp_unit_settle(fsdp, u, grads);
    device_comm_group_begin(fsdp->group);
    for (int t = unit->first_tensor; t < unit->first_tensor + unit->n_tensors; t++) {
        const FsdpTensorPlace *place = &fsdp->places[t];
        const size_t shard = place->shard_rows * fsdp->tensors[t].row_elements;
        device_comm_reduce_scatter_sum(fsdp->group, grads + place->full_offset,
                                       target + (place->local_offset - unit->local_offset),
                                       shard, COMM_FLOAT32, COMM_KIND_FSDP_REDUCESCATTER);
    }
    DeviceCommWork *work = device_comm_group_end(fsdp->group);
    return work;
}

/* The pooled reduce-scatter in flight: wait for it and add it into the accumulators. */
static void pending_finish(Fsdp *fsdp)
{
    if (!fsdp->pending_work)
        return;
    const Unit *unit = &fsdp->units[fsdp->pending_unit];
    device_comm_work_wait(fsdp->pending_work);
    fsdp->backend->add_floats(fsdp->grads + unit->local_offset,
                              fsdp->reduce_scratch[fsdp->pending_scratch], unit->local_count);
    fsdp->pending_work = NULL;
}

void fsdp_release(Fsdp *fsdp, int u, bool gradients)
{
    Unit *unit = &fsdp->units[u];
    if (gradients)
        unit->releases_seen++;
    if (fsdp->size == 1)
        return;
    if (!unit->pooled) {
        if (gradients && unit->releases_seen == unit->releases_expected) {
            fsdp->persistent_works[fsdp->n_persistent_works++] =
                reduce_start(fsdp, u, unit->grads, fsdp->grads + unit->local_offset);
            unit->reduced = true;
        }
        return;
    }
    Slot *slot = &fsdp->slots[unit->slot];
    if (gradients) {
        pending_finish(fsdp);
        const int k = fsdp->next_scratch;
        fsdp->next_scratch ^= 1;
        fsdp->pending_work = reduce_start(fsdp, u, slot->grads, fsdp->reduce_scratch[k]);
        fsdp->pending_unit = u;
        fsdp->pending_scratch = k;
        fsdp->pending_slot = unit->slot;
    }
    slot->acquired = false;
    slot->unit = -1;
    unit->slot = -1;
}

void fsdp_step_begin(Fsdp *fsdp, const int *releases)
{
    const Backend *backend = fsdp->backend;
    if (fsdp->without_gradients)
        fatal(EXIT_CONFIG, "fsdp: a training step on a model made for the forward only (no "
              "gradients)");
    /* several ranks: the accumulators are the reduce-scatters' targets, zeroed whole */
    if (fsdp->size > 1)
        backend->zero(fsdp->grads, fsdp->local_count * sizeof(float));
    for (int u = 0; u < fsdp->n_units; u++) {
        Unit *unit = &fsdp->units[u];
        unit->releases_expected = releases ? releases[u] : -1;
        unit->releases_seen = 0;
        unit->reduced = false;
        if (unit->local && !unit->pooled)
            fsdp_unit_clear(fsdp, unit, unit->grads);
    }
}

void fsdp_step_finish(Fsdp *fsdp)
{
    for (int u = 0; u < fsdp->n_units; u++) {
        Unit *unit = &fsdp->units[u];
        if (unit->releases_expected >= 0 && unit->releases_seen != unit->releases_expected)
            fatal(EXIT_CONFIG, "fsdp: unit %d saw %d backward releases this step, %d were "
                  "announced", u, unit->releases_seen, unit->releases_expected);
        if (fsdp->size > 1 && unit->local && !unit->pooled && !unit->reduced &&
            unit->releases_seen > 0)
            fsdp->persistent_works[fsdp->n_persistent_works++] =
                reduce_start(fsdp, u, unit->grads, fsdp->grads + unit->local_offset);
    }
    pending_finish(fsdp);
    for (int w = 0; w < fsdp->n_persistent_works; w++)
        device_comm_work_wait(fsdp->persistent_works[w]);
    fsdp->n_persistent_works = 0;
    for (int u = 0; u < fsdp->n_units && fsdp->size == 1; u++)
        if (fsdp->units[u].local) /* one rank: the accumulators are the units' buffers */
            fsdp_unit_settle(fsdp, u, fsdp->units[u].grads);
}
