/* launch/train_comm.h — what a training run's communication did, per pipeline stage: the
 * bytes of runtime/comm.h's counters and the times of runtime/device_comm.h's timing, for
 * metrics.jsonl's comm array (DESIGN 6) and the table a run prints at its end.
 *
 * Times are a rank's: the busy and exposed milliseconds of its all-gathers, reduce-scatters,
 * pipeline sends and receives (device_comm.h, "timing"), a step's worth, the mean over the
 * stage's ranks. Bytes are summed over the stage's ranks. Timing runs only with more than
 * one rank (nothing communicates otherwise). The events are read at the end of the first
 * step and at each metrics line, not after every step: reading them is host work while the
 * device waits. An evaluation between steps is not timed (the caller turns timing off
 * around it, as it keeps its bytes out of the counters).
 *
 * Every rank calls every function, in the same order; train_comm_gather and
 * train_comm_report are collective over the world.
 */
#ifndef FATHOM_LAUNCH_TRAIN_COMM_H
#define FATHOM_LAUNCH_TRAIN_COMM_H

#include <stdbool.h>

#include "runtime/comm.h"
#include "runtime/device_comm.h"
#include "runtime/grid.h"
#include "runtime/metrics.h"

typedef struct {
    DeviceCommTime window[COMM_KIND_COUNT]; /* this rank, since the last metrics line */
    DeviceCommTime run[COMM_KIND_COUNT];    /* this rank, the logged steps but the first */
    double run_step_ms;                     /* those steps' wall time, summed */
    int run_steps;
    bool warmed_up;                         /* the run's first step is over */
} TrainComm;

/* Starts counting and, with more than one rank, timing. */
void train_comm_begin(TrainComm *train_comm, const RankGrid *grid);
/* After a step, once the backend has synchronized. The first step the run takes pays for
 * warm-up and is left out of the run's table (its times are read now, apart). */
void train_comm_step_end(TrainComm *train_comm, double step_seconds);
/* Collective: stages[pp] = each stage's bytes and times, a step's worth over the last
 * `steps` steps (the window since the previous call), on every rank; starts a new window. */
void train_comm_gather(TrainComm *train_comm, const RankGrid *grid, int steps,
                       MetricsComm *stages);
/* Collective: rank 0 prints the run's table (the mean step after the first, per stage). */
void train_comm_report(const TrainComm *train_comm, const RankGrid *grid);

/* The table's columns and one row a stage, to stdout (the run's table and `fathom inspect
 * --comm`'s): times[stage * 8 + k], a step of one rank in ms, in MetricsComm's order
 * (all-gather, reduce-scatter, pp send, pp recv; each ran, then exposed), and each stage's
 * exposed share of step_ms ("-" when step_ms is not > 0). */
void train_comm_print_table(const double *times, int stages, double step_ms);

#endif
