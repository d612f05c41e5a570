/* launch/train_comm.c — a run's communication per stage (see train_comm.h). */
#include "launch/train_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

enum { BYTE_FIELDS = 7, TIMED_KINDS = 4, TIME_FIELDS = 2 * TIMED_KINDS };
/* Timed operations kept between reads at most (about 4 events each): a long log window of
 * a large job is read early, at a step's end, rather than holding millions of events. */
enum { PENDING_MAX = 8192 };

/* metrics.jsonl's byte counters, in MetricsComm's order */
static const CommKind byte_kinds[BYTE_FIELDS] = {
    COMM_KIND_PP_SEND,          COMM_KIND_PP_RECV,
    COMM_KIND_PP_SUMMARY,       COMM_KIND_PP_SUMMARY_UNCACHED,
    COMM_KIND_FSDP_ALLGATHER,   COMM_KIND_FSDP_REDUCESCATTER,
    COMM_KIND_ALLREDUCE,
};
/* the kinds that are timed (what goes through a DeviceComm), in MetricsComm's order */
static const CommKind timed_kinds[TIMED_KINDS] = {
    COMM_KIND_FSDP_ALLGATHER, COMM_KIND_FSDP_REDUCESCATTER, COMM_KIND_PP_SEND,
    COMM_KIND_PP_RECV,
};

void train_comm_begin(TrainComm *train_comm, const RankGrid *grid)
{
    memset(train_comm, 0, sizeof *train_comm);
    device_comm_timing_enable(grid->world_size > 1);
    comm_counters_reset();
}

static void add_times(DeviceCommTime *sum, const DeviceCommTime *times)
{
    for (int k = 0; k < COMM_KIND_COUNT; k++) {
        sum[k].busy_ms += times[k].busy_ms;
        sum[k].exposed_ms += times[k].exposed_ms;
        sum[k].operations += times[k].operations;
    }
}

/* Reads what was timed since the last read into the window, and into the run's table
 * unless it is the first step's. */
static void read_times(TrainComm *train_comm, bool for_the_run)
{
    DeviceCommTime times[COMM_KIND_COUNT];
    device_comm_timing_collect(times);
    add_times(train_comm->window, times);
    if (for_the_run)
        add_times(train_comm->run, times);
}

void train_comm_step_end(TrainComm *train_comm, double step_seconds)
{
    if (!train_comm->warmed_up) {
        /* warm-up: plans, pools and communicators are made during the first step; its
         * times go to the first metrics line, not to the run's table */
        train_comm->warmed_up = true;
        read_times(train_comm, false);
        return;
    }
    train_comm->run_step_ms += 1e3 * step_seconds;
    train_comm->run_steps++;
    if (device_comm_timing_pending() > PENDING_MAX)
        read_times(train_comm, true);
}

/* A stage's times, summed over the world into totals[pp][TIME_FIELDS]: busy then exposed
 * of each timed kind. */
static void sum_times(const RankGrid *grid, const DeviceCommTime *times, double *totals)
{
    double *mine = xcalloc((size_t)grid->pp * TIME_FIELDS, sizeof *mine);
    for (int k = 0; k < TIMED_KINDS; k++) {
        mine[grid->stage * TIME_FIELDS + 2 * k] = times[timed_kinds[k]].busy_ms;
        mine[grid->stage * TIME_FIELDS + 2 * k + 1] = times[timed_kinds[k]].exposed_ms;
    }
    comm_allreduce_sum(grid->world, mine, totals, (size_t)grid->pp * TIME_FIELDS,
                       COMM_FLOAT64, COMM_KIND_OTHER);
    free(mine);
}

void train_comm_gather(TrainComm *train_comm, const RankGrid *grid, int steps,
                       MetricsComm *stages)
{
    read_times(train_comm, true);
    int64_t *mine = xcalloc((size_t)grid->pp * BYTE_FIELDS, sizeof *mine);
    int64_t *total = xcalloc((size_t)grid->pp * BYTE_FIELDS, sizeof *total);
    double *times = xcalloc((size_t)grid->pp * TIME_FIELDS, sizeof *times);
    for (int k = 0; k < BYTE_FIELDS; k++)
        mine[grid->stage * BYTE_FIELDS + k] = (int64_t)comm_counter(byte_kinds[k]);
    comm_counters_reset();
    comm_allreduce_sum(grid->world, mine, total, (size_t)grid->pp * BYTE_FIELDS, COMM_INT64,
                       COMM_KIND_OTHER);
    sum_times(grid, train_comm->window, times);
    comm_counters_reset(); /* the metrics' own sums are not the run's traffic */
    memset(train_comm->window, 0, sizeof train_comm->window);

    const double per_rank_step = 1.0 / ((double)grid->dp * (steps > 0 ? steps : 1));
    for (int s = 0; s < grid->pp; s++) {
        const int64_t *b = total + s * BYTE_FIELDS;
        const double *t = times + s * TIME_FIELDS;
        const int64_t n = steps > 0 ? steps : 1;
        stages[s] = (MetricsComm){
            .pp_send_bytes = b[0] / n, .pp_recv_bytes = b[1] / n,
            .pp_summary_bytes = b[2] / n, .pp_summary_bytes_uncached = b[3] / n,
            .fsdp_allgather_bytes = b[4] / n, .fsdp_reducescatter_bytes = b[5] / n,
            .allreduce_bytes = b[6] / n,
            .fsdp_allgather_ms = t[0] * per_rank_step,
            .fsdp_allgather_exposed_ms = t[1] * per_rank_step,
            .fsdp_reducescatter_ms = t[2] * per_rank_step,
            .fsdp_reducescatter_exposed_ms = t[3] * per_rank_step,
            .pp_send_ms = t[4] * per_rank_step,
            .pp_send_exposed_ms = t[5] * per_rank_step,
            .pp_recv_ms = t[6] * per_rank_step,
            .pp_recv_exposed_ms = t[7] * per_rank_step,
        };
    }
    free(mine);
    free(total);
    free(times);
}

void train_comm_report(const TrainComm *train_comm, const RankGrid *grid)
{
    if (grid->world_size == 1)
        return;
    /* every rank takes the same steps */
    const int64_t fewest = train_comm->run_steps;
    if (fewest == 0)
        return; /* no step after the first: nothing measured */
    double *times = xcalloc((size_t)grid->pp * TIME_FIELDS, sizeof *times);
    double step_ms = 0;
    sum_times(grid, train_comm->run, times);
    comm_allreduce_sum(grid->world, &train_comm->run_step_ms, &step_ms, 1, COMM_FLOAT64,
                       COMM_KIND_OTHER);
    if (grid->rank == 0) {
        const double per_rank_step = 1.0 / ((double)grid->dp * (double)fewest);
        step_ms /= (double)grid->world_size * (double)fewest;
        for (int f = 0; f < grid->pp * TIME_FIELDS; f++)
            times[f] *= per_rank_step;
        printf("fathom: communication a step, ms (the mean over %lld steps after the first "
               "and over each stage's ranks; exposed: the compute stream waited for it)\n",
               (long long)fewest);
        train_comm_print_table(times, grid->pp, step_ms);
        fflush(stdout);
    }
    free(times);
}

void train_comm_print_table(const double *times, int stages, double step_ms)
{
    printf("%5s %11s %8s %12s %8s %9s %8s %9s %8s %10s %8s\n", "stage", "all-gather",
           "exposed", "reduce-scat.", "exposed", "pp send", "exposed", "pp recv", "exposed",
           "step", "exposed");
    for (int stage = 0; stage < stages; stage++) {
        const double *t = times + stage * TIME_FIELDS;
        double exposed = 0;
        printf("%5d", stage);
        for (int f = 0; f < TIME_FIELDS; f++) {
            printf(" %*.2f", f == 0 ? 11 : f == 2 ? 12 : f % 2 ? 8 : 9, t[f]);
            if (f % 2)
                exposed += t[f];
        }
        if (step_ms > 0)
            printf(" %10.2f %7.1f%%\n", step_ms, 100 * exposed / step_ms);
        else
            printf(" %10s %8s\n", "-", "-");
    }
}
