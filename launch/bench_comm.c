/* launch/bench_comm.c — `fathom bench --cases comm` (launch/bench.h): FSDP's all-gathers and
 * reduce-scatters at the sizes of its units, over the ranks of an mpirun.
 *
 * The world is one data-parallel group of D ranks, placed as `fathom train` places them
 * (runtime/topo.h) and communicating by the method fathom chooses (runtime/device_comm.h:
 * NCCL when every rank has a GPU of its own, host-staged when ranks share one, MPI on the
 * cpu). A unit moves as runtime/fsdp.c moves it: every tensor sharded along its first
 * dimension, padded to a multiple of D; one group of per-tensor all-gathers of the shards'
 * compute copy (bf16 on cuda, fp32 on the cpu) into full buffers, and one group of
 * per-tensor reduce-scatters of fp32 gradients. The units: a decoder layer of the 1B step
 * (24.6 M parameters), a decoder layer of Llama-3-8B (218 M) and its embedding (525 M);
 * --small shrinks them with every other case.
 *
 * A time is the median over --repeat (after two warm-ups) of the slowest rank's time for one
 * group, from a barrier that starts the ranks together to the point where the compute
 * stream may read the result, between backend events. Bus bandwidth, as nccl-tests counts it
 * for both collectives: (D - 1) / D x the full unit's bytes / time (for the reduce-scatter,
 * the fp32 bytes reduced).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/bench_internal.h"
#include "model/params.h"
#include "pipeline/fsdp_bytes.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "runtime/device_comm.h"
#include "runtime/error.h"

typedef struct {
    const Backend *backend;
    DeviceComm *comm;
    int ranks;
    bool gather;
    const ParamTable *table;
    int unit;
    size_t compute_bytes;          /* bytes of one compute element: 2 (bf16) or 4 (fp32) */
    void *shards, *full;           /* the gather's send and recv */
    float *gradients, *reduced;    /* the reduce-scatter's send and recv */
} UnitTransfer;

static size_t unit_shard_elements(const UnitTransfer *transfer)
{
    const ParamUnit *unit = &transfer->table->units[transfer->unit];
    size_t total = 0;
    for (int p = unit->first_param; p < unit->first_param + unit->n_params; p++)
        total += fsdp_shard_elements(&transfer->table->params[p], transfer->ranks);
    return total;
}

/* One group of the unit's per-tensor operations, waited for on the compute stream. */
static void transfer_run(UnitTransfer *transfer)
{
    const ParamUnit *unit = &transfer->table->units[transfer->unit];
    const size_t D = (size_t)transfer->ranks;
    const CommType compute_type = transfer->compute_bytes == 2 ? COMM_BFLOAT16 : COMM_FLOAT32;
    size_t offset = 0; /* of the tensor's shard in this rank's shards */
    device_comm_group_begin(transfer->comm);
    for (int p = unit->first_param; p < unit->first_param + unit->n_params; p++) {
        const size_t shard = fsdp_shard_elements(&transfer->table->params[p], transfer->ranks);
        if (transfer->gather)
            device_comm_allgather(transfer->comm,
                                  (char *)transfer->shards + offset * transfer->compute_bytes,
                                  (char *)transfer->full + D * offset * transfer->compute_bytes,
                                  shard, compute_type, COMM_KIND_FSDP_ALLGATHER);
        else
            device_comm_reduce_scatter_sum(transfer->comm, transfer->gradients + D * offset,
                                           transfer->reduced + offset, shard, COMM_FLOAT32,
                                           COMM_KIND_FSDP_REDUCESCATTER);
        offset += shard;
    }
    device_comm_work_wait(device_comm_group_end(transfer->comm));
}

/* The median over `repeat` of the slowest rank's milliseconds for one group. */
static double transfer_time_ms(UnitTransfer *transfer, int repeat)
{
    const Backend *backend = transfer->backend;
    Comm *world = comm_world();
    BackendEvent *start = backend->event_create(), *end = backend->event_create();
    double *times = xcalloc((size_t)repeat, sizeof *times);
    for (int r = -2; r < repeat; r++) {
        backend->synchronize();
        comm_barrier(world);
        backend->event_record(start);
        transfer_run(transfer);
        backend->event_record(end);
        const double mine = backend->event_elapsed_ms(start, end);
        double slowest = 0;
        comm_allreduce_max(world, &mine, &slowest, 1, COMM_FLOAT64, COMM_KIND_OTHER);
        if (r >= 0)
            times[r] = slowest;
    }
    for (int i = 1; i < repeat; i++) /* insertion sort: a handful of values */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            const double swap = times[j];
            times[j] = times[j - 1];
            times[j - 1] = swap;
        }
    const double median = repeat % 2 ? times[repeat / 2]
                                     : 0.5 * (times[repeat / 2 - 1] + times[repeat / 2]);
    free(times);
    backend->event_destroy(start);
    backend->event_destroy(end);
    return median;
}

/* Times the gather and the reduce-scatter of `unit` of the model `model`. */
static void bench_unit(Bench *bench, DeviceComm *comm, const ModelConfig *model, int unit,
                       const char *name)
{
    const Backend *backend = bench->backend;
    Config defaults; /* the standard residual: a base model's units */
    config_defaults(&defaults);
    ParamTable table;
    param_table_build_with_residual(&table, model, &defaults.residual);
    UnitTransfer transfer = {
        .backend = backend, .comm = comm, .ranks = comm_size(device_comm_group(comm)),
        .table = &table, .unit = unit, .compute_bytes = backend->activation_bytes,
    };
    const size_t shard = unit_shard_elements(&transfer), D = (size_t)transfer.ranks;
    transfer.shards = backend->alloc(shard * transfer.compute_bytes);
    transfer.full = backend->alloc(D * shard * transfer.compute_bytes);
    transfer.gradients = backend->alloc(D * shard * sizeof(float));
    transfer.reduced = backend->alloc(shard * sizeof(float));
    for (int gather = 1; gather >= 0; gather--) {
        transfer.gather = gather;
        const double ms = transfer_time_ms(&transfer, bench->repeat);
        const double full_bytes = (double)(D * shard) *
                                  (double)(gather ? transfer.compute_bytes : sizeof(float));
        const double bus_gbs = (double)(D - 1) / (double)D * full_bytes / (ms * 1e6);
        char mode[24];
        snprintf(mode, sizeof mode, "%s %s", gather ? "gather" : "scatter", name);
        bench_add(bench, "comm", mode, ms, bus_gbs, "GB/s bus", NAN);
    }
    backend->release(transfer.shards);
    backend->release(transfer.full);
    backend->release(transfer.gradients);
    backend->release(transfer.reduced);
    param_table_free(&table);
}

void bench_case_comm(Bench *bench)
{
    Comm *world = comm_world();
    if (comm_size(world) < 2)
        fatal(EXIT_CONFIG, "bench: the comm case moves data between ranks: run it under "
              "mpirun -np 2 (or more) fathom bench --cases comm");
    DeviceComm *comm = device_comm_create(world, bench->backend);
    if (comm_rank(world) == 0) {
        printf("bench: comm over %d ranks: %s (%s)\n", comm_size(world),
               device_comm_method(comm), device_comm_reason(comm));
        fflush(stdout);
    }
    const BenchShapes *shapes = &bench->shapes;
    bench_unit(bench, comm, &shapes->steps[BENCH_STEP_1B].model, 1, "1B layer");
    bench_unit(bench, comm, &shapes->steps[BENCH_STEP_WIDE].model, 1, "8B layer");
    bench_unit(bench, comm, &shapes->steps[BENCH_STEP_WIDE].model, 0, "8B embedding");
    device_comm_destroy(comm);
}
