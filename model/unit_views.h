/* model/unit_views.h — the model's pointers into one FSDP unit, re-aimed when the unit's
 * full buffers move (runtime/fsdp.h).
 *
 * The model reads its weights through views (LayerWeights, SiteWeights, HeadWeights, ...):
 * pointers to each tensor's compute copy, fp32 value or gradient. Under FSDP a unit's full
 * buffers are wherever runtime/fsdp gathered it: fixed for a persistent unit, a pool slot
 * for a pooled one. So each unit keeps the list of view pointers that point into it, with
 * the tensor and the kind of each, and unit_views_bind aims them all at new buffers.
 * Resolution by name happens once, at model creation; binding is a loop over the list.
 */
#ifndef FATHOM_MODEL_UNIT_VIEWS_H
#define FATHOM_MODEL_UNIT_VIEWS_H

#include "model/params.h"
#include "runtime/backend.h"
#include "runtime/fsdp.h"

typedef enum {
    VIEW_COMPUTE, /* Activation *: the compute copy (what the ops read) */
    VIEW_FP32,    /* const float *: the fp32 value (alpha, mix_bias: taken as fp32) */
    VIEW_GRADS,   /* float *: the fp32 gradient */
} ViewKind;

typedef struct {
    void **slot;  /* the view pointer to aim */
    int tensor;   /* index in the parameter table */
    ViewKind kind;
} ViewSlot;

typedef struct {
    ViewSlot *slots;
    int n, capacity;
} UnitViews;

/* Registers view pointer *slot as tensor `name`'s kind; a missing name with required is
 * fatal (a bug), otherwise *slot stays NULL. */
void unit_views_add(UnitViews *views, const ParamTable *table, void *slot, const char *name,
                    ViewKind kind, bool required);
/* Aims every registered view at the unit's buffers (fsdp_place gives the offsets); grads
 * NULL in `buffers` aims the gradient views at NULL. */
void unit_views_bind(const UnitViews *views, const Backend *backend, const Fsdp *fsdp,
                     FsdpUnitBuffers buffers);
void unit_views_free(UnitViews *views);

#endif
