/* tests/comm_probe.c — runs one named scenario over runtime/comm.h and prints what it saw.
 *
 *     mpirun -np N fathom-comm-probe SCENARIO [ARGS]     (or without mpirun: a world of one)
 *
 * Every line starts with "rank R " so tests/test_comm.c can read the ranks' lines in any
 * interleaving. The probe checks what it can itself (contents against references computed
 * from the same seeds) and prints "ok" or what differed; the test checks the rest (exit
 * status, the lines of every rank, byte counts it computes on its own).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm.h"
#include "runtime/comm_reduce.h"
#include "runtime/error.h"

static int world_rank(void)
{
    return comm_rank(comm_world());
}

#define SAY(...)                                                                          \
    do {                                                                                  \
        char line_[1024];                                                                 \
        snprintf(line_, sizeof line_, __VA_ARGS__);                                       \
        printf("rank %d %s\n", world_rank(), line_);                                      \
        fflush(stdout);                                                                   \
    } while (0)

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Rank r's value i: magnitudes over 2^-20 .. 2^20, so the order of a sum shows in its bits. */
static float probe_value(int rank, size_t i, uint64_t stream)
{
    const uint64_t bits = mix64(((uint64_t)rank << 40) ^ (i << 8) ^ stream);
    const double unit = (double)(bits >> 11) / 9007199254740992.0 - 0.5;
    return (float)ldexp(unit, (int)(bits % 41) - 20);
}

static uint64_t digest_bytes(const void *data, size_t bytes)
{
    const unsigned char *p = data;
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++)
        hash = (hash ^ p[i]) * 1099511628211ull;
    return hash;
}

/* The rank-order reference: (double)x_0 + x_1 + ... rounded once. */
static float reference_sum(int n, size_t i, uint64_t stream)
{
    double sum = probe_value(0, i, stream);
    for (int r = 1; r < n; r++)
        sum += probe_value(r, i, stream);
    return (float)sum;
}

/* What a float32 reduction in reverse rank order gives (one order MPI_SUM may take): the
 * data must tell it from the reference, or the bitwise check proves nothing. */
static float float_sum_reversed(int n, size_t i, uint64_t stream)
{
    float sum = probe_value(n - 1, i, stream);
    for (int r = n - 2; r >= 0; r--)
        sum += probe_value(r, i, stream);
    return sum;
}

static void scenario_world(void)
{
    int initialised = 0;
    MPI_Initialized(&initialised);
    SAY("world size %d mpi_initialized %d comm_mpi_active %d", comm_size(comm_world()),
        initialised, (int)comm_mpi_active());
}

/* All-reduce, reduce-scatter and all-gather of float32 against rank-order references. */
static void scenario_sums(void)
{
    Comm *world = comm_world();
    const int n = comm_size(world), me = comm_rank(world);
    const size_t count = 1001, per_rank = 257;
    size_t wrong = 0, order_sensitive = 0;

    float *data = malloc(count * sizeof(float)); /* in place: send == recv */
    for (size_t i = 0; i < count; i++)
        data[i] = probe_value(me, i, 1);
    comm_allreduce_sum(world, data, data, count, COMM_FLOAT32, COMM_KIND_ALLREDUCE);
    for (size_t i = 0; i < count; i++) {
        const float expected = reference_sum(n, i, 1);
        wrong += memcmp(&data[i], &expected, sizeof expected) != 0;
        const float other_order = float_sum_reversed(n, i, 1);
        order_sensitive += memcmp(&other_order, &expected, sizeof expected) != 0;
    }
    SAY("allreduce_digest %016llx", (unsigned long long)digest_bytes(data, count * 4));

    float *blocks = malloc((size_t)n * per_rank * sizeof(float)), *mine = malloc(per_rank * 4);
    for (size_t i = 0; i < (size_t)n * per_rank; i++)
        blocks[i] = probe_value(me, i, 2);
    comm_reduce_scatter_sum(world, blocks, mine, per_rank, COMM_FLOAT32,
                            COMM_KIND_FSDP_REDUCESCATTER);
    for (size_t i = 0; i < per_rank; i++) {
        const float expected = reference_sum(n, (size_t)me * per_rank + i, 2);
        wrong += memcmp(&mine[i], &expected, sizeof expected) != 0;
    }
    SAY("reduce_scatter_digest %016llx", (unsigned long long)digest_bytes(mine, per_rank * 4));

    float *gathered = malloc((size_t)n * per_rank * sizeof(float));
    comm_allgather(world, mine, gathered, per_rank, COMM_FLOAT32, COMM_KIND_FSDP_ALLGATHER);
    for (size_t i = 0; i < (size_t)n * per_rank; i++) {
        const float expected = reference_sum(n, i, 2);
        wrong += memcmp(&gathered[i], &expected, sizeof expected) != 0;
    }
    SAY("sums wrong %zu of %zu order_sensitive %zu", wrong, count + per_rank * (size_t)(n + 1),
        order_sensitive);
    free(data);
    free(blocks);
    free(mine);
    free(gathered);
}

/* bfloat16, float64, int64 sums and the max (with a NaN) agree with local references. */
static void scenario_types(void)
{
    Comm *world = comm_world();
    const int n = comm_size(world), me = comm_rank(world);
    enum { COUNT = 37 };
    size_t wrong = 0;
    uint16_t half[COUNT], half_expected[COUNT];
    double wide[COUNT];
    int64_t whole[COUNT];
    float top[COUNT];
    for (size_t i = 0; i < COUNT; i++) {
        half[i] = comm_float_to_bfloat16(probe_value(me, i, 3));
        wide[i] = (double)probe_value(me, i, 4) * 1e-3;
        whole[i] = (int64_t)(mix64(i + 100 * (uint64_t)me) % 1000000) - 500000;
        top[i] = probe_value(me, i, 5);
    }
    if (me == n - 1)
        top[5] = NAN;
    comm_allreduce_sum(world, half, half, COUNT, COMM_BFLOAT16, COMM_KIND_ALLREDUCE);
    comm_allreduce_sum(world, wide, wide, COUNT, COMM_FLOAT64, COMM_KIND_ALLREDUCE);
    comm_allreduce_sum(world, whole, whole, COUNT, COMM_INT64, COMM_KIND_ALLREDUCE);
    comm_allreduce_max(world, top, top, COUNT, COMM_FLOAT32, COMM_KIND_ALLREDUCE);
    for (size_t i = 0; i < COUNT; i++) {
        double half_sum = 0, wide_sum = 0;
        int64_t whole_sum = 0;
        float best = -INFINITY;
        for (int r = 0; r < n; r++) {
            half_sum += comm_bfloat16_to_float(comm_float_to_bfloat16(probe_value(r, i, 3)));
            wide_sum += (double)probe_value(r, i, 4) * 1e-3;
            whole_sum += (int64_t)(mix64(i + 100 * (uint64_t)r) % 1000000) - 500000;
            best = fmaxf(best, probe_value(r, i, 5));
        }
        half_expected[i] = comm_float_to_bfloat16((float)half_sum);
        wrong += half[i] != half_expected[i];
        wrong += memcmp(&wide[i], &wide_sum, sizeof wide_sum) != 0;
        wrong += whole[i] != whole_sum;
        wrong += i == 5 ? !isnan(top[i]) : top[i] != best;
    }
    SAY("types wrong %zu of %d", wrong, 4 * COUNT);
}

/* The rank grid of DESIGN 3 (rank = stage * dp + dp_rank): each rank prints its groups. */
static void scenario_grid(int pp, int dp)
{
    Comm *world = comm_world();
    const int me = comm_rank(world);
    if (comm_size(world) != pp * dp)
        fatal(EXIT_CONFIG, "grid %d x %d needs %d ranks, not %d", pp, dp, pp * dp,
              comm_size(world));
    const int stage = me / dp, dp_rank = me % dp;
    Comm *dp_group = comm_split(world, stage, dp_rank);
    Comm *pipeline = comm_split(world, dp_rank, stage);
    int64_t own = me, dp_members[64], pipeline_members[64];
    comm_allgather(dp_group, &own, dp_members, 1, COMM_INT64, COMM_KIND_OTHER);
    comm_allgather(pipeline, &own, pipeline_members, 1, COMM_INT64, COMM_KIND_OTHER);
    char dp_text[256] = "", pipeline_text[256] = "";
    for (int k = 0; k < comm_size(dp_group); k++)
        snprintf(dp_text + strlen(dp_text), sizeof dp_text - strlen(dp_text), "%s%lld",
                 k ? "," : "", (long long)dp_members[k]);
    for (int k = 0; k < comm_size(pipeline); k++)
        snprintf(pipeline_text + strlen(pipeline_text),
                 sizeof pipeline_text - strlen(pipeline_text), "%s%lld", k ? "," : "",
                 (long long)pipeline_members[k]);
    SAY("stage %d dp_rank %d dp_group %s (rank %d) pipeline %s (rank %d)", stage, dp_rank,
        dp_text, comm_rank(dp_group), pipeline_text, comm_rank(pipeline));
    Comm *without_first = comm_split(world, me == 0 ? COMM_NO_GROUP : 0, me);
    SAY("without_rank_0 %d", without_first ? comm_size(without_first) : -1);
    comm_free(without_first);
    comm_free(dp_group);
    comm_free(pipeline);
}

static unsigned char pattern_byte(int tag, size_t i)
{
    return (unsigned char)(mix64((uint64_t)tag * 1000003u + i) & 0xff);
}

/* Even rank 2k sends three tagged messages of a few MB to 2k+1, which posts its recvs in
 * another order and waits in a third; two messages with one tag keep their order. */
static void scenario_sendrecv(void)
{
    Comm *world = comm_world();
    const int me = comm_rank(world);
    const int tags[4] = {11, 12, 13, 12};
    const size_t sizes[4] = {3u << 20, (1u << 20) + 7, 2u << 20, 5000};
    if ((me ^ 1) >= comm_size(world)) {
        SAY("sendrecv idle");
        return;
    }
    unsigned char *buffers[4];
    for (int k = 0; k < 4; k++)
        buffers[k] = malloc(sizes[k]);
    size_t wrong = 0, received = 0;
    if (me % 2 == 0) {
        CommRequest *sends[4];
        for (int k = 0; k < 4; k++) {
            for (size_t i = 0; i < sizes[k]; i++)
                buffers[k][i] = pattern_byte(tags[k] + 100 * k, i);
            sends[k] = comm_send_start(world, buffers[k], sizes[k], me + 1, tags[k],
                                       COMM_KIND_PP_SEND);
        }
        for (int k = 3; k >= 0; k--)
            comm_wait(sends[k]);
    } else {
        const int post_order[4] = {2, 0, 1, 3}, wait_order[4] = {1, 3, 2, 0};
        CommRequest *recvs[4];
        for (int j = 0; j < 4; j++) {
            const int k = post_order[j];
            recvs[k] = comm_recv_start(world, buffers[k], sizes[k], me - 1, tags[k],
                                       COMM_KIND_PP_RECV);
        }
        for (int j = 0; j < 4; j++) {
            const int k = wait_order[j];
            if (j == 0)
                while (!comm_test(recvs[k]))
                    usleep(100);
            else
                comm_wait(recvs[k]);
            for (size_t i = 0; i < sizes[k]; i++)
                wrong += buffers[k][i] != pattern_byte(tags[k] + 100 * k, i);
            received += sizes[k];
        }
    }
    SAY("sendrecv wrong %zu received %zu counted_send %llu counted_recv %llu", wrong, received,
        (unsigned long long)comm_counter(COMM_KIND_PP_SEND),
        (unsigned long long)comm_counter(COMM_KIND_PP_RECV));
    for (int k = 0; k < 4; k++)
        free(buffers[k]);
}

/* A fixed list of operations; each rank prints every counter, the test knows the rule. */
static void scenario_counters(void)
{
    Comm *world = comm_world();
    const int n = comm_size(world), me = comm_rank(world);
    comm_counters_reset();
    float *floats = calloc((size_t)n * 1001, sizeof(float)), *out = calloc(1001, sizeof(float));
    float *gathered = calloc((size_t)n * 1000, sizeof(float));
    comm_allgather(world, floats, gathered, 1000, COMM_FLOAT32, COMM_KIND_FSDP_ALLGATHER);
    comm_reduce_scatter_sum(world, floats, out, 500, COMM_BFLOAT16,
                            COMM_KIND_FSDP_REDUCESCATTER);
    comm_allreduce_sum(world, floats, floats, 1001, COMM_FLOAT32, COMM_KIND_ALLREDUCE);
    comm_broadcast(world, floats, 300, COMM_BYTE, n - 1, COMM_KIND_OTHER);
    comm_barrier(world);
    static unsigned char message[12345];
    if (n > 1 && me == 0)
        comm_wait(comm_send_start(world, message, sizeof message, 1, 3, COMM_KIND_PP_SEND));
    if (n > 1 && me == 1)
        comm_wait(comm_recv_start(world, message, sizeof message, 0, 3, COMM_KIND_PP_RECV));
    comm_count(COMM_KIND_PP_SUMMARY_UNCACHED, 777);
    for (int kind = 0; kind < COMM_KIND_COUNT; kind++)
        SAY("counter %s %llu", comm_kind_name(kind),
            (unsigned long long)comm_counter(kind));
    free(floats);
    free(out);
    free(gathered);
}

/* Rank 1 waits for a message rank 0 never sends; rank 0 outlives the deadline by far. */
static void scenario_timeout(void)
{
    comm_set_timeout(1.0);
    static unsigned char buffer[4096];
    if (world_rank() == 1)
        comm_wait(comm_recv_start(comm_world(), buffer, sizeof buffer, 0, 7, COMM_KIND_PP_RECV));
    else
        sleep(20);
    SAY("timeout did not happen");
}

/* A config-style error on every rank, or on the last rank only while the others wait. */
static void scenario_fatal(int all_ranks)
{
    comm_set_timeout(60.0);
    const int last = comm_size(comm_world()) - 1;
    if (all_ranks || world_rank() == last)
        fatal(EXIT_CONFIG, "model.n_heads = 3 must be a multiple of model.n_kv_heads = 2");
    comm_barrier(comm_world());
    SAY("fatal did not end the job");
}

/* The world of one: every operation is local, including send/recv to oneself. */
static void scenario_local(void)
{
    Comm *world = comm_world();
    const float values[3] = {1.5f, -2.0f, 3.25f};
    float out[3], gathered[3];
    size_t wrong = 0;
    comm_counters_reset();
    comm_allreduce_sum(world, values, out, 3, COMM_FLOAT32, COMM_KIND_ALLREDUCE);
    wrong += memcmp(out, values, sizeof values) != 0;
    comm_allgather(world, values, gathered, 3, COMM_FLOAT32, COMM_KIND_FSDP_ALLGATHER);
    wrong += memcmp(gathered, values, sizeof values) != 0;
    comm_reduce_scatter_sum(world, values, out, 3, COMM_FLOAT32, COMM_KIND_FSDP_REDUCESCATTER);
    wrong += memcmp(out, values, sizeof values) != 0;
    comm_broadcast(world, out, 3, COMM_FLOAT32, 0, COMM_KIND_OTHER);
    comm_barrier(world);
    Comm *group = comm_split(world, 4, 0);
    wrong += comm_size(group) != 1;
    /* a recv posted before its send, and two sends buffered before their recvs */
    float first[3] = {0}, second[3] = {0}, third[3] = {0};
    CommRequest *early = comm_recv_start(group, first, sizeof first, 0, 9, COMM_KIND_PP_RECV);
    wrong += comm_test(early) ? 1 : 0;
    comm_wait(comm_send_start(group, values, sizeof values, 0, 5, COMM_KIND_PP_SEND));
    comm_wait(comm_send_start(group, out, sizeof out, 0, 9, COMM_KIND_PP_SEND));
    comm_wait(early);
    comm_wait(comm_send_start(group, values, sizeof values, 0, 9, COMM_KIND_PP_SEND));
    comm_wait(comm_recv_start(group, second, sizeof second, 0, 9, COMM_KIND_PP_RECV));
    comm_wait(comm_recv_start(group, third, sizeof third, 0, 5, COMM_KIND_PP_RECV));
    wrong += memcmp(first, values, sizeof values) != 0;
    wrong += memcmp(second, values, sizeof values) != 0;
    wrong += memcmp(third, values, sizeof values) != 0;
    comm_free(group);
    SAY("local wrong %zu pp_send %llu pp_recv %llu collectives %llu", wrong,
        (unsigned long long)comm_counter(COMM_KIND_PP_SEND),
        (unsigned long long)comm_counter(COMM_KIND_PP_RECV),
        (unsigned long long)(comm_counter(COMM_KIND_ALLREDUCE) +
                             comm_counter(COMM_KIND_FSDP_ALLGATHER) +
                             comm_counter(COMM_KIND_FSDP_REDUCESCATTER) +
                             comm_counter(COMM_KIND_OTHER)));
}

/* Waiting inside a group bracket is refused (it could never complete on NCCL). */
static void scenario_wait_in_group(void)
{
    static float value = 1.0f, back;
    Comm *world = comm_world();
    CommRequest *recv = comm_recv_start(world, &back, sizeof back, 0, 1, COMM_KIND_PP_RECV);
    comm_group_begin(world);
    comm_wait(comm_send_start(world, &value, sizeof value, 0, 1, COMM_KIND_PP_SEND));
    comm_group_end(world);
    comm_wait(recv);
    SAY("wait in group was accepted");
}

int main(int argc, char **argv)
{
    comm_init(&argc, &argv);
    const char *scenario = argc > 1 ? argv[1] : "";
    if (!strcmp(scenario, "world"))
        scenario_world();
    else if (!strcmp(scenario, "sums"))
        scenario_sums();
    else if (!strcmp(scenario, "types"))
        scenario_types();
    else if (!strcmp(scenario, "grid") && argc > 3)
        scenario_grid(atoi(argv[2]), atoi(argv[3]));
    else if (!strcmp(scenario, "sendrecv"))
        scenario_sendrecv();
    else if (!strcmp(scenario, "counters"))
        scenario_counters();
    else if (!strcmp(scenario, "timeout"))
        scenario_timeout();
    else if (!strcmp(scenario, "fatal_all"))
        scenario_fatal(1);
    else if (!strcmp(scenario, "fatal_one"))
        scenario_fatal(0);
    else if (!strcmp(scenario, "local"))
        scenario_local();
    else if (!strcmp(scenario, "wait_in_group"))
        scenario_wait_in_group();
    else
        fatal(EXIT_CONFIG, "usage: fathom-comm-probe world|sums|types|grid PP DP|sendrecv|"
                           "counters|timeout|fatal_all|fatal_one|local|wait_in_group");
    comm_finalize();
    return 0;
}
