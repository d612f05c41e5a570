/* runtime/device_comm_timing.c — the busy and exposed times of device_comm.h ("timing").
 *
 * A timed operation is a slot of one process-wide pool: the events it records (made once
 * with the backend's event_create and kept with the slot), its kind, and how far it got.
 * Slots keep their index from open to collect, so a DeviceCommWork or a held send can name
 * its slot while the operation is in flight; collect frees the slots it read. The pool
 * grows to the most operations timed between two collects (a few hundred a step), then
 * stays.
 */
#include <stdbool.h>
#include <string.h>

#include "runtime/device_comm_internal.h"
#include "runtime/error.h"

typedef struct {
    const Backend *backend;             /* of the events below */
    BackendEvent *before, *after;       /* the compute stream, around its wait */
    BackendEvent *begin, *end;          /* nccl: the communication stream, around the group */
    CommKind kind;
    int compute_marks;                  /* 0, 1 (before) or 2 (before and after) */
    bool stream_marked, closed, in_use;
    int next_free;
} TimedOperation;

static struct {
    bool enabled;
    TimedOperation *slots;
    int n_slots, first_free; /* first_free: -1 when every slot is in use */
    int in_use;
} timing = {.first_free = -1};

void device_comm_timing_enable(bool enabled) { timing.enabled = enabled; }

bool device_comm_timing_enabled(void) { return timing.enabled; }

int device_comm_timing_pending(void) { return timing.in_use; }

/* The slot's events belong to `backend` (made now, or again if another backend made them). */
static void slot_events(TimedOperation *slot, const Backend *backend)
{
    if (slot->backend == backend)
        return;
    BackendEvent **events[4] = {&slot->before, &slot->after, &slot->begin, &slot->end};
    for (int i = 0; i < 4; i++) {
        if (*events[i])
            slot->backend->event_destroy(*events[i]);
        *events[i] = backend->event_create();
    }
    slot->backend = backend;
}

int device_comm_timing_open(const Backend *backend, CommKind kind)
{
    if (!timing.enabled)
        return DEVICE_COMM_UNTIMED;
    if (timing.first_free < 0) {
        const int grown = timing.n_slots ? 2 * timing.n_slots : 64;
        timing.slots = xrealloc(timing.slots, (size_t)grown * sizeof *timing.slots);
        memset(timing.slots + timing.n_slots, 0,
               (size_t)(grown - timing.n_slots) * sizeof *timing.slots);
        for (int i = timing.n_slots; i < grown; i++)
            timing.slots[i].next_free = i + 1 < grown ? i + 1 : -1;
        timing.first_free = timing.n_slots;
        timing.n_slots = grown;
    }
    const int index = timing.first_free;
    TimedOperation *slot = &timing.slots[index];
    timing.first_free = slot->next_free;
    slot_events(slot, backend);
    slot->kind = kind;
    slot->compute_marks = 0;
    slot->stream_marked = slot->closed = false;
    slot->in_use = true;
    timing.in_use++;
    return index;
}

static TimedOperation *slot_of(int timed)
{
    if (timed < 0 || timed >= timing.n_slots || !timing.slots[timed].in_use)
        fatal(EXIT_COMM, "device_comm timing: slot %d is not open", timed);
    return &timing.slots[timed];
}

void device_comm_timing_mark_compute(int timed)
{
    if (timed == DEVICE_COMM_UNTIMED)
        return;
    TimedOperation *slot = slot_of(timed);
    if (slot->compute_marks >= 2)
        fatal(EXIT_COMM, "device_comm timing: slot %d marked a third time", timed);
    slot->backend->event_record(slot->compute_marks == 0 ? slot->before : slot->after);
    slot->compute_marks++;
}

void device_comm_timing_stream_marks(int timed, BackendEvent **begin, BackendEvent **end)
{
    *begin = *end = NULL;
    if (timed == DEVICE_COMM_UNTIMED)
        return;
    TimedOperation *slot = slot_of(timed);
    slot->stream_marked = true;
    *begin = slot->begin;
    *end = slot->end;
}

void device_comm_timing_close(int timed)
{
    if (timed == DEVICE_COMM_UNTIMED)
        return;
    TimedOperation *slot = slot_of(timed);
    if (slot->compute_marks == 1)
        fatal(EXIT_COMM, "device_comm timing: slot %d closed between its two marks", timed);
    slot->closed = true;
}

void device_comm_timing_collect(DeviceCommTime *times)
{
    memset(times, 0, COMM_KIND_COUNT * sizeof *times);
    for (int i = 0; i < timing.n_slots; i++) {
        TimedOperation *slot = &timing.slots[i];
        if (!slot->in_use || !slot->closed)
            continue; /* not yet waited for: a later collect reads it */
        const Backend *backend = slot->backend;
        const double exposed =
            slot->compute_marks == 2 ? backend->event_elapsed_ms(slot->before, slot->after) : 0;
        const double busy = slot->stream_marked
                                ? backend->event_elapsed_ms(slot->begin, slot->end)
                                : exposed;
        times[slot->kind].busy_ms += busy;
        times[slot->kind].exposed_ms += exposed;
        times[slot->kind].operations++;
        slot->in_use = false;
        timing.in_use--;
        slot->next_free = timing.first_free;
        timing.first_free = i;
    }
}
