/* model/unit_views.c — see unit_views.h. */
#include "model/unit_views.h"

#include <stdlib.h>

#include "runtime/error.h"

void unit_views_add(UnitViews *views, const ParamTable *table, void *slot, const char *name,
                    ViewKind kind, bool required)
{
    const ParamEntry *entry = required ? param_table_require(table, name)
                                       : param_table_find(table, name);
    *(void **)slot = NULL;
    if (!entry)
        return;
    if (views->n == views->capacity) {
        views->capacity = views->capacity ? 2 * views->capacity : 16;
        views->slots = xrealloc(views->slots, (size_t)views->capacity * sizeof *views->slots);
    }
    views->slots[views->n++] = (ViewSlot){slot, (int)(entry - table->params), kind};
}

void unit_views_bind(const UnitViews *views, const Backend *backend, const Fsdp *fsdp,
                     FsdpUnitBuffers buffers)
{
    for (int i = 0; i < views->n; i++) {
        const ViewSlot *view = &views->slots[i];
        const FsdpTensorPlace *place = fsdp_place(fsdp, view->tensor);
        switch (view->kind) {
        case VIEW_COMPUTE:
            *view->slot = activation_at(backend, buffers.compute, place->full_offset);
            break;
        case VIEW_FP32:
            *view->slot = (void *)(buffers.fp32 + place->fp32_offset);
            break;
        case VIEW_GRADS:
            *view->slot = buffers.grads ? buffers.grads + place->full_offset : NULL;
            break;
        }
    }
}

void unit_views_free(UnitViews *views)
{
    free(views->slots);
    views->slots = NULL;
    views->n = views->capacity = 0;
}
