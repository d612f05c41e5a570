/* runtime/fsdp_gradients.c — the written-first gradients of runtime/fsdp.h ("Written
 * first"): a clear zeroes every part of a unit's gradient buffer but its written_first
 * tensors' rows, the unit's next backward is told to write them, and what no backward wrote
 * is zeroed before anyone reads the gradients. */
#include "runtime/fsdp_internal.h"

#include <stdlib.h>

#include "runtime/error.h"

/* What clearing the unit's full gradient buffer zeroes: everything but the rows of its
 * written_first tensors, in as few spans as they leave (the padding between them too, so a
 * pool slot that held another unit's layout before is clean). */
void fsdp_unit_zero_spans(Fsdp *fsdp, const FsdpSpec *spec, Unit *unit)
{
    unit->zero_spans = xcalloc(2 * (size_t)unit->n_tensors + 2, sizeof *unit->zero_spans);
    size_t cursor = 0;
    for (int t = unit->first_tensor; t < unit->first_tensor + unit->n_tensors; t++) {
        const FsdpTensorSpec *tensor = &spec->tensors[t];
        if (!tensor->written_first)
            continue;
        const size_t begin = fsdp->places[t].full_offset;
        if (begin > cursor) {
            unit->zero_spans[2 * unit->n_zero_spans] = cursor;
            unit->zero_spans[2 * unit->n_zero_spans + 1] = begin;
            unit->n_zero_spans++;
        }
        cursor = begin + tensor->rows * tensor->row_elements;
        unit->has_written_first = true;
    }
    if (unit->full_count > cursor) {
        unit->zero_spans[2 * unit->n_zero_spans] = cursor;
        unit->zero_spans[2 * unit->n_zero_spans + 1] = unit->full_count;
        unit->n_zero_spans++;
    }
}

void fsdp_unit_clear(Fsdp *fsdp, Unit *unit, float *grads)
{
    for (int i = 0; i < unit->n_zero_spans; i++) {
        const size_t begin = unit->zero_spans[2 * i], end = unit->zero_spans[2 * i + 1];
        fsdp->backend->zero(grads + begin, (end - begin) * sizeof(float));
    }
    unit->gradients_fresh = unit->has_written_first;
}

void fsdp_unit_settle(Fsdp *fsdp, int u, float *grads)
{
    Unit *unit = &fsdp->units[u];
    if (!unit->gradients_fresh)
        return;
    for (int t = unit->first_tensor; t < unit->first_tensor + unit->n_tensors; t++)
        if (fsdp->tensors[t].written_first)
            fsdp->backend->zero(grads + fsdp->places[t].full_offset,
                                fsdp->tensors[t].rows * fsdp->tensors[t].row_elements *
                                    sizeof(float));
    unit->gradients_fresh = false;
}

GradMode fsdp_gradient_mode(Fsdp *fsdp, int u)
{
    Unit *unit = &fsdp->units[u];
    if (!unit->local || (unit->pooled && unit->slot < 0))
        fatal(EXIT_CONFIG, "fsdp: the gradient mode of unit %d, which is not acquired", u);
    if (!unit->gradients_fresh)
        return GRAD_ADD;
    unit->gradients_fresh = false;
    return GRAD_WRITE;
}

