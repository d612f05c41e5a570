/* tests/device_comm_probe.c — runs one scenario of runtime/device_comm.h and prints what it saw.
 *
 *     mpirun -np N fathom-device-comm-probe SCENARIO cpu|cuda [PP DP]    (or alone: one rank)
 *
 * Scenarios:
 *   collectives  over the data-parallel group of a PP x DP grid (default 1 x N): one group
 *                of two all-gathers (float32, bfloat16) and two reduce-scatters, the second
 *                of each inside a nested bracket; results against references computed here
 *                from every rank's inputs (rank order sums of runtime/comm_reduce.h), and
 *                the byte counters of the group;
 *   ordering     cuda: the compute stream is kept busy (large matmuls), the send buffer is
 *                written on it, then the group starts: the result must be the new values;
 *   deadline     cuda, parallel.timeout_s = 0.05 s after create: the same busy stream, one
 *                all-gather, then a synchronize; the work cannot end in time, so the job
 *                must end with exit 5 (reaching the end prints "deadline did not happen").
 *   hops         point to point as the pipeline uses it: rank r sends HOP_MESSAGES messages
 *                of different sizes to r+1 (mod N) over a DeviceComm of the pair, r
 *                receives as many from r-1 (one rank: itself, through its group of one).
 *                Each send buffer is overwritten right after its send (on cuda behind a
 *                busy compute stream): every message must hold the values at its send.
 *                Prints the wrong values, the pp byte counters and the held bytes.
 *   hops-short   the same, but the first receive asks for one element less than was sent:
 *                the job must end with exit 5.
 *   timing       device_comm.h's timing: the last rank comes LATE_MS late to a group of two
 *                all-gathers, then a reduce-scatter, then rank 0 comes LATE_MS late to send
 *                a hop to rank 1 (alone: to itself); the times of each kind are printed
 *                ("late"), collected again ("again": nothing), on cuda for an all-gather
 *                started before a long compute and waited for after it ("hidden"), and for
 *                a group with timing off ("off").
 * parallel.timeout_s is 30 s unless a scenario says otherwise. Every line starts with
 * "rank R " (world rank); tests/test_device_comm.c and tests/test_cuda_device_comm.c read
 * them. The CUDA module is found as fathom finds it (runtime/cuda_module.h; the tests set
 * FATHOM_CUDA_MODULE).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm.h"
#include "runtime/comm_reduce.h"
#include "runtime/cuda_module.h"
#include "runtime/device_comm.h"
#include "runtime/error.h"
#include "runtime/grid.h"

#define SAY(...)                                                                          \
    do {                                                                                  \
        char line_[1024];                                                                 \
        snprintf(line_, sizeof line_, __VA_ARGS__);                                       \
        printf("rank %d %s\n", comm_rank(comm_world()), line_);                           \
        fflush(stdout);                                                                   \
    } while (0)

enum { GATHER_F32 = 1000, GATHER_BF16 = 333, SCATTER_F32 = 500, SCATTER_BF16 = 250 };

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* World rank r's value i of stream s: magnitudes 2^-20 .. 2^20, so the order of a sum
 * shows in its bits. */
static float probe_value(int rank, size_t i, uint64_t stream)
{
    const uint64_t bits = mix64(((uint64_t)rank << 40) ^ (i << 8) ^ stream);
    const double unit = (double)(bits >> 11) / 9007199254740992.0 - 0.5;
    return (float)ldexp(unit, (int)(bits % 41) - 20);
}

/* n elements of world rank r's stream s, as float32 or bfloat16 bytes. */
static void *probe_values(int rank, size_t n, uint64_t stream, CommType type)
{
    void *values = xmalloc(n * comm_type_size(type));
    for (size_t i = 0; i < n; i++) {
        const float value = probe_value(rank, i, stream);
        if (type == COMM_FLOAT32)
            ((float *)values)[i] = value;
        else
            ((uint16_t *)values)[i] = comm_float_to_bfloat16(value);
    }
    return values;
}

static const Backend *probe_backend(const char *device)
{
    if (!strcmp(device, "cpu"))
        return backend_cpu();
    const Backend *cuda = cuda_module_backend();
    if (!cuda)
        fatal(EXIT_CONFIG, "no cuda backend: %s", cuda_module_probe()->description);
    return cuda;
}

/* Backend memory holding `bytes` of host data. */
static void *backend_copy_of(const Backend *backend, const void *host, size_t bytes)
{
    void *memory = backend->alloc(bytes);
    backend->upload(memory, host, bytes);
    return memory;
}

typedef struct {
    CommType type;
    size_t count;
    uint64_t stream;
    bool gather;
    void *send, *recv;   /* backend memory */
    void *want;          /* host reference */
} ProbeOperation;

/* The operation's inputs on this rank, and the reference from every rank's inputs. */
static void probe_prepare(ProbeOperation *op, const Backend *backend, const int *members,
                          int n, int me)
{
    const size_t element = comm_type_size(op->type);
    const size_t send_count = op->gather ? op->count : (size_t)n * op->count;
    void *mine = probe_values(members[me], send_count, op->stream, op->type);
    op->send = backend_copy_of(backend, mine, send_count * element);
    free(mine);
    const size_t recv_count = op->gather ? (size_t)n * op->count : op->count;
    op->recv = backend->alloc(recv_count * element);
    char *blocks = xmalloc((size_t)n * op->count * element);
    for (int r = 0; r < n; r++) {
        void *theirs = probe_values(members[r], send_count, op->stream, op->type);
        /* gather: rank r's whole send; scatter: rank r's block number `me` */
        memcpy(blocks + (size_t)r * op->count * element,
               (char *)theirs + (op->gather ? 0 : (size_t)me * op->count * element),
               op->count * element);
        free(theirs);
    }
    if (op->gather) {
        op->want = blocks;
    } else {
        op->want = xmalloc(op->count * element);
        comm_reduce_blocks(blocks, n, op->count, op->type, COMM_REDUCE_SUM, op->want);
        free(blocks);
    }
}

/* Largest relative difference of got from want (0 when bitwise equal). */
static double probe_difference(const ProbeOperation *op, const void *got, size_t count)
{
    const size_t bytes = count * comm_type_size(op->type);
    if (!memcmp(got, op->want, bytes))
        return 0;
    double worst = INFINITY;
    for (size_t i = 0; i < count; i++) {
        double a, b;
        if (op->type == COMM_FLOAT32) {
            a = ((const float *)got)[i], b = ((const float *)op->want)[i];
        } else {
            a = comm_bfloat16_to_float(((const uint16_t *)got)[i]);
            b = comm_bfloat16_to_float(((const uint16_t *)op->want)[i]);
        }
        const double difference = fabs(a - b) / fmax(fabs(b), 1e-30);
        worst = i == 0 || difference > worst ? difference : worst;
    }
    return worst;
}

static void scenario_collectives(const Backend *backend, int pp, int dp)
{
    RankGrid grid;
    grid_create(&grid, pp, dp);
    Comm *group = grid.data_parallel;
    const int n = comm_size(group), me = comm_rank(group);
    int members[64];
    for (int r = 0; r < n; r++)
        members[r] = grid.stage * dp + r;
    DeviceComm *comm = device_comm_create(group, backend);
    SAY("method %s", device_comm_method(comm));
    SAY("reason %s", device_comm_reason(comm));
    ProbeOperation ops[4] = {
        {.type = COMM_FLOAT32, .count = GATHER_F32, .stream = 11, .gather = true},
        {.type = COMM_BFLOAT16, .count = GATHER_BF16, .stream = 12, .gather = true},
        {.type = COMM_FLOAT32, .count = SCATTER_F32, .stream = 13, .gather = false},
        {.type = COMM_BFLOAT16, .count = SCATTER_BF16, .stream = 14, .gather = false},
    };
    for (int k = 0; k < 4; k++)
        probe_prepare(&ops[k], backend, members, n, me);
    backend->synchronize();
    comm_counters_reset();
    device_comm_group_begin(comm);
    device_comm_allgather(comm, ops[0].send, ops[0].recv, ops[0].count, ops[0].type,
                          COMM_KIND_FSDP_ALLGATHER);
    device_comm_group_begin(comm);
    device_comm_allgather(comm, ops[1].send, ops[1].recv, ops[1].count, ops[1].type,
                          COMM_KIND_FSDP_ALLGATHER);
    device_comm_work_wait(device_comm_group_end(comm)); /* inner: starts nothing */
    device_comm_reduce_scatter_sum(comm, ops[2].send, ops[2].recv, ops[2].count,
                                   ops[2].type, COMM_KIND_FSDP_REDUCESCATTER);
    device_comm_group_begin(comm);
    device_comm_reduce_scatter_sum(comm, ops[3].send, ops[3].recv, ops[3].count,
                                   ops[3].type, COMM_KIND_FSDP_REDUCESCATTER);
    device_comm_work_wait(device_comm_group_end(comm));
    device_comm_work_wait(device_comm_group_end(comm));
    const char *names[4] = {"allgather_f32", "allgather_bf16", "reduce_scatter_f32",
                            "reduce_scatter_bf16"};
    for (int k = 0; k < 4; k++) {
        const size_t count = ops[k].gather ? (size_t)n * ops[k].count : ops[k].count;
        void *got = xmalloc(count * comm_type_size(ops[k].type));
        backend->download(got, ops[k].recv, count * comm_type_size(ops[k].type));
        const double difference = probe_difference(&ops[k], got, count);
        if (difference == 0)
            SAY("%s equal", names[k]);
        else
            SAY("%s differs by %.3g", names[k], difference);
        free(got);
        backend->release(ops[k].send);
        backend->release(ops[k].recv);
        free(ops[k].want);
    }
    SAY("counter fsdp_allgather_bytes %llu",
        (unsigned long long)comm_counter(COMM_KIND_FSDP_ALLGATHER));
    SAY("counter fsdp_reducescatter_bytes %llu",
        (unsigned long long)comm_counter(COMM_KIND_FSDP_REDUCESCATTER));
    device_comm_destroy(comm);
    grid_destroy(&grid);
}

/* Queues `matmuls` [16384 x 8192] @ [8192 x 8192]^T on the compute stream (about 2 TFLOP
 * each: milliseconds on an H200), returns at once. */
static void keep_compute_busy(const Backend *backend, int matmuls)
{
    enum { ROWS = 16384, WIDTH = 8192 };
    static Activation *in, *weight, *out;
    if (!in) {
        in = backend->alloc((size_t)ROWS * WIDTH * backend->activation_bytes);
        weight = backend->alloc((size_t)WIDTH * WIDTH * backend->activation_bytes);
        out = backend->alloc((size_t)ROWS * WIDTH * backend->activation_bytes);
    }
    for (int i = 0; i < matmuls; i++)
        backend->matmul_forward(out, in, weight, ROWS, WIDTH, WIDTH);
}

static void scenario_ordering(const Backend *backend)
{
    Comm *world = comm_world();
    const int n = comm_size(world), me = comm_rank(world);
    DeviceComm *comm = device_comm_create(world, backend);
    SAY("method %s", device_comm_method(comm));
    const size_t count = 1 << 20;
    float *old_values = probe_values(me, count, 21, COMM_FLOAT32);
    float *new_values = probe_values(me, count, 22, COMM_FLOAT32);
    float *send = backend_copy_of(backend, old_values, count * sizeof(float));
    float *recv = backend->alloc((size_t)n * count * sizeof(float));
    backend->synchronize();
    keep_compute_busy(backend, 40);
    backend->upload(send, new_values, count * sizeof(float)); /* behind the matmuls */
    device_comm_group_begin(comm);
    device_comm_allgather(comm, send, recv, count, COMM_FLOAT32, COMM_KIND_FSDP_ALLGATHER);
    device_comm_work_wait(device_comm_group_end(comm));
    float *got = xmalloc((size_t)n * count * sizeof(float));
    backend->download(got, recv, (size_t)n * count * sizeof(float));
    size_t stale = 0, wrong = 0;
    for (int r = 0; r < n; r++) {
        float *want = probe_values(r, count, 22, COMM_FLOAT32);
        float *before = probe_values(r, count, 21, COMM_FLOAT32);
        for (size_t i = 0; i < count; i++) {
            const float value = got[(size_t)r * count + i];
            stale += value == before[i] && value != want[i];
            wrong += value != want[i];
        }
        free(want);
        free(before);
    }
    SAY("ordering wrong %zu stale %zu", wrong, stale);
    backend->release(send);
    backend->release(recv);
    free(old_values);
    free(new_values);
    free(got);
    device_comm_destroy(comm);
}

enum { HOP_MESSAGES = 5 };
static const size_t hop_counts[HOP_MESSAGES] = {1000, 257, 1 << 16, 1000, 3};

/* The DeviceComm over which `sender` sends to sender + 1 (mod n): made by every rank in the
 * same order, as the executor makes its hop links; NULL where this rank is not in it. */
static DeviceComm *hop_link(const Backend *backend, int sender, Comm **group)
{
    Comm *world = comm_world();
    const int n = comm_size(world), me = comm_rank(world);
    const bool member = me == sender || me == (sender + 1) % n;
    *group = comm_split(world, member ? 0 : COMM_NO_GROUP, me == sender ? 0 : 1);
    return *group ? device_comm_create(*group, backend) : NULL;
}

static void scenario_hops(const Backend *backend, bool short_receive)
{
    Comm *world = comm_world();
    const int n = comm_size(world), me = comm_rank(world), previous = (me - 1 + n) % n;
    Comm **groups = xcalloc((size_t)n, sizeof *groups);
    DeviceComm **links = xcalloc((size_t)n, sizeof *links);
    for (int sender = 0; sender < n; sender++)
        links[sender] = hop_link(backend, sender, &groups[sender]);
    DeviceComm *out = links[me], *in = links[previous];
    SAY("method %s", device_comm_method(out));
    size_t largest = 0;
    for (int k = 0; k < HOP_MESSAGES; k++)
        largest = hop_counts[k] > largest ? hop_counts[k] : largest;
    void *send = backend->alloc(largest * sizeof(float));
    void *recv = backend->alloc(largest * sizeof(float));
    comm_counters_reset();
    uint64_t sent_bytes = 0;
    for (int k = 0; k < HOP_MESSAGES; k++) {
        const size_t bytes = hop_counts[k] * sizeof(float);
        float *values = probe_values(me, hop_counts[k], 40 + (uint64_t)k, COMM_FLOAT32);
        float *later = probe_values(me, hop_counts[k], 90 + (uint64_t)k, COMM_FLOAT32);
        if (backend != backend_cpu())
            keep_compute_busy(backend, 2);
        backend->upload(send, values, bytes);
        device_comm_send(out, send, bytes, comm_size(device_comm_group(out)) - 1,
                         COMM_KIND_PP_SEND);
        backend->upload(send, later, bytes); /* the message must not see this */
        sent_bytes += bytes;
        free(values);
        free(later);
    }
    size_t wrong = 0;
    float *got = xmalloc(largest * sizeof(float));
    for (int k = 0; k < HOP_MESSAGES; k++) {
        const size_t count = hop_counts[k] - (short_receive && k == 0);
        device_comm_recv(in, recv, count * sizeof(float), 0, COMM_KIND_PP_RECV);
        backend->download(got, recv, count * sizeof(float));
        float *want = probe_values(previous, hop_counts[k], 40 + (uint64_t)k, COMM_FLOAT32);
        for (size_t i = 0; i < count; i++)
            wrong += memcmp(&got[i], &want[i], sizeof(float)) != 0;
        free(want);
    }
    for (int sender = 0; sender < n; sender++)
        if (links[sender])
            device_comm_flush(links[sender]);
    bool device_memory = false;
    const size_t held = device_comm_held_bytes(out, &device_memory);
    SAY("hops wrong %zu", wrong);
    SAY("counter pp_send_bytes %llu", (unsigned long long)comm_counter(COMM_KIND_PP_SEND));
    SAY("counter pp_recv_bytes %llu", (unsigned long long)comm_counter(COMM_KIND_PP_RECV));
    SAY("sent bytes %llu", (unsigned long long)sent_bytes);
    SAY("held %zu in %s memory", held, device_memory ? "backend" : "host");
    for (int sender = 0; sender < n; sender++) {
        device_comm_destroy(links[sender]);
        comm_free(groups[sender]);
    }
    free(links);
    free(groups);
    free(got);
    backend->release(send);
    backend->release(recv);
}

static void scenario_deadline(const Backend *backend)
{
    Comm *world = comm_world();
    DeviceComm *comm = device_comm_create(world, backend);
    SAY("method %s", device_comm_method(comm));
    const size_t count = 1 << 20;
    void *send = backend->alloc(count * sizeof(float));
    void *recv = backend->alloc((size_t)comm_size(world) * count * sizeof(float));
    backend->synchronize();
    comm_set_timeout(0.05);
    keep_compute_busy(backend, 150);
    device_comm_group_begin(comm);
    device_comm_allgather(comm, send, recv, count, COMM_FLOAT32, COMM_KIND_FSDP_ALLGATHER);
    device_comm_work_wait(device_comm_group_end(comm));
    backend->synchronize(); /* waits behind a work that cannot end in time */
    SAY("deadline did not happen");
}

/* ---- timing ---- */

enum { LATE_MS = 300, TIMING_COUNT = 1 << 18 };

static const struct {
    CommKind kind;
    const char *name;
} probe_timed[] = {
    {COMM_KIND_FSDP_ALLGATHER, "fsdp_allgather"},
    {COMM_KIND_FSDP_REDUCESCATTER, "fsdp_reducescatter"},
    {COMM_KIND_PP_SEND, "pp_send"},
    {COMM_KIND_PP_RECV, "pp_recv"},
};

/* Collects what was timed and prints it, one line a kind: "time WHEN KIND busy B exposed E
 * operations N". */
static void say_times(const char *when)
{
    DeviceCommTime times[COMM_KIND_COUNT];
    device_comm_timing_collect(times);
    for (size_t k = 0; k < sizeof probe_timed / sizeof probe_timed[0]; k++) {
        const DeviceCommTime *time = &times[probe_timed[k].kind];
        SAY("time %s %s busy %.3f exposed %.3f operations %d", when, probe_timed[k].name,
            time->busy_ms, time->exposed_ms, time->operations);
    }
}

static void gather_and_wait(DeviceComm *comm, const void *send, void *recv)
{
    device_comm_group_begin(comm);
    device_comm_allgather(comm, send, recv, TIMING_COUNT / 2, COMM_FLOAT32,
                          COMM_KIND_FSDP_ALLGATHER);
    device_comm_allgather(comm, send, recv, TIMING_COUNT / 2, COMM_FLOAT32,
                          COMM_KIND_FSDP_ALLGATHER);
    device_comm_work_wait(device_comm_group_end(comm));
}

static void scenario_timing(const Backend *backend)
{
    Comm *world = comm_world();
    const int n = comm_size(world), me = comm_rank(world);
    DeviceComm *comm = device_comm_create(world, backend);
    Comm *pair_group;
    DeviceComm *pair = hop_link(backend, 0, &pair_group);
    SAY("method %s", device_comm_method(comm));
    void *send = backend->alloc((size_t)n * TIMING_COUNT * sizeof(float));
    void *recv = backend->alloc((size_t)n * TIMING_COUNT * sizeof(float));
    backend->synchronize();
    /* the ranks start the timed part together: on a GPU shared with other processes one
     * rank's set-up can take a good part of LATE_MS longer than the other's, and the wait
     * for the late rank would be that much shorter */
    comm_barrier(world);
    device_comm_timing_enable(true);

    /* the last rank is late to a group of two all-gathers; then a reduce-scatter */
    if (n > 1 && me == n - 1)
        usleep(1000 * LATE_MS);
    gather_and_wait(comm, send, recv);
    device_comm_group_begin(comm);
    device_comm_reduce_scatter_sum(comm, send, recv, TIMING_COUNT / n, COMM_FLOAT32,
                                   COMM_KIND_FSDP_REDUCESCATTER);
    device_comm_work_wait(device_comm_group_end(comm));
    /* rank 0 is late to send a hop to rank 1 (alone: to itself) */
    if (pair) {
        const int peer = comm_size(pair_group) - 1;
        if (me == 0) {
            if (n > 1)
                usleep(1000 * LATE_MS);
            device_comm_send(pair, send, TIMING_COUNT * sizeof(float), peer, COMM_KIND_PP_SEND);
        }
        if (comm_rank(pair_group) == peer)
            device_comm_recv(pair, recv, TIMING_COUNT * sizeof(float), 0, COMM_KIND_PP_RECV);
        device_comm_flush(pair);
    }
    backend->synchronize();
    SAY("pending %d", device_comm_timing_pending());
    say_times("late");
    SAY("pending after %d", device_comm_timing_pending());
    say_times("again"); /* nothing since */

    if (backend != backend_cpu()) { /* started, then compute queued, then waited for */
        device_comm_group_begin(comm);
        device_comm_allgather(comm, send, recv, TIMING_COUNT, COMM_FLOAT32,
                              COMM_KIND_FSDP_ALLGATHER);
        DeviceCommWork *work = device_comm_group_end(comm);
        keep_compute_busy(backend, 4);
        device_comm_work_wait(work);
        backend->synchronize();
        say_times("hidden");
    }

    device_comm_timing_enable(false);
    gather_and_wait(comm, send, recv);
    backend->synchronize();
    say_times("off");

    device_comm_destroy(pair);
    comm_free(pair_group);
    device_comm_destroy(comm);
    backend->release(send);
    backend->release(recv);
}

int main(int argc, char **argv)
{
    comm_init(&argc, &argv);
    comm_set_timeout(30); /* a hung NCCL init ends well within the tests' own limits */
    const char *scenario = argc > 2 ? argv[1] : "";
    const Backend *backend = argc > 2 ? probe_backend(argv[2]) : NULL;
    if (!strcmp(scenario, "collectives"))
        scenario_collectives(backend, argc > 4 ? atoi(argv[3]) : 1,
                             argc > 4 ? atoi(argv[4]) : comm_size(comm_world()));
    else if (!strcmp(scenario, "ordering"))
        scenario_ordering(backend);
    else if (!strcmp(scenario, "deadline"))
        scenario_deadline(backend);
    else if (!strcmp(scenario, "hops") || !strcmp(scenario, "hops-short"))
        scenario_hops(backend, !strcmp(scenario, "hops-short"));
    else if (!strcmp(scenario, "timing"))
        scenario_timing(backend);
    else
        fatal(EXIT_CONFIG, "usage: fathom-device-comm-probe "
              "collectives|ordering|deadline|hops|hops-short|timing cpu|cuda [PP DP]");
    comm_finalize();
    return 0;
}
