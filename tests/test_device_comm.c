/* tests/test_device_comm.c — runtime/device_comm.h on the cpu backend, and its choice of
 * method (DESIGN 3, "Communication").
 *
 * The "mpi" method runs under mpirun (tests/device_comm_probe.c): every result against
 * references the probe computes from every rank's inputs (the rank-order sums of
 * runtime/comm.h), and the byte counters against comm.h's rule, computed here. The choice
 * of method is a pure function of what the ranks report, tested in process.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/device_comm.h"
#include "tests/device_comm_support.h"
#include "tests/support.h"

/* ---- the mpi method under mpirun ---------------------------------------------------- */

/* comm.h's rule for the probe's group: (n-1) x count_per_rank x element size, summed. */
static unsigned long long gather_bytes(int n)
{
    return (unsigned long long)(n - 1) * (1000 * 4 + 333 * 2);
}

static unsigned long long scatter_bytes(int n)
{
    return (unsigned long long)(n - 1) * (500 * 4 + 250 * 2);
}

/* Every rank of a world of `ranks` (0: one, without mpirun) in groups of `group` ranks
 * reports the mpi method, results equal to the references and comm.h's byte counts. */
static void expect_mpi_collectives(int ranks, int group, const char *arguments)
{
    char *output = device_probe_output(), value[256], reason[64];
    const int status = device_probe_run(ranks, "", arguments, output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    const char *names[4] = {"allgather_f32", "allgather_bf16", "reduce_scatter_f32",
                            "reduce_scatter_bf16"};
    snprintf(reason, sizeof reason, "%d rank%s on host memory", group, group == 1 ? "" : "s");
    for (int rank = 0; rank < (ranks ? ranks : 1); rank++) {
        cr_assert_not_null(device_probe_line(output, rank, "method", value, sizeof value),
                           "%s", output);
        cr_expect_str_eq(value, "mpi", "rank %d", rank);
        cr_assert_not_null(device_probe_line(output, rank, "reason", value, sizeof value));
        cr_expect_str_eq(value, reason, "rank %d", rank);
        for (int k = 0; k < 4; k++) {
            cr_assert_not_null(device_probe_line(output, rank, names[k], value, sizeof value),
                               "%s", output);
            cr_expect_str_eq(value, "equal", "rank %d %s", rank, names[k]);
        }
        cr_assert_not_null(device_probe_line(output, rank, "counter fsdp_allgather_bytes",
                                             value, sizeof value));
        cr_expect_eq(strtoull(value, NULL, 10), gather_bytes(group), "rank %d gathered %s",
                     rank, value);
        cr_assert_not_null(device_probe_line(output, rank, "counter fsdp_reducescatter_bytes",
                                             value, sizeof value));
        cr_expect_eq(strtoull(value, NULL, 10), scatter_bytes(group), "rank %d scattered %s",
                     rank, value);
    }
    free(output);
}

Test(device_comm, mpi_method_on_two_ranks_equals_rank_order_references_and_books_the_rule)
{
    expect_mpi_collectives(2, 2, "collectives cpu");
}

Test(device_comm, mpi_method_on_four_ranks_equals_rank_order_references_and_books_the_rule)
{
    expect_mpi_collectives(4, 4, "collectives cpu");
}

Test(device_comm, mpi_method_over_the_dp_groups_of_a_2x2_grid_gathers_within_each_group)
{
    expect_mpi_collectives(4, 2, "collectives cpu 2 2");
}

Test(device_comm, a_group_of_one_copies_and_books_nothing)
{
    expect_mpi_collectives(0, 1, "collectives cpu");
}

/* ---- point to point: the pipeline's hops ------------------------------------------- */

/* Every rank of a world of `ranks` (0: one, without mpirun) gets every message of its
 * neighbour intact, in order, whatever the sender wrote after each send; bytes booked on
 * both sides. */
static void expect_hops(int ranks)
{
    char *output = device_probe_output(), value[256];
    const int status = device_probe_run(ranks, "", "hops cpu", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    const unsigned long long bytes = (1000 + 257 + (1 << 16) + 1000 + 3) * 4ull;
    for (int rank = 0; rank < (ranks ? ranks : 1); rank++) {
        cr_assert_not_null(device_probe_line(output, rank, "hops wrong", value, sizeof value),
                           "%s", output);
        cr_expect_str_eq(value, "0", "rank %d", rank);
        cr_assert_not_null(device_probe_line(output, rank, "counter pp_send_bytes", value,
                                             sizeof value));
        cr_expect_eq(strtoull(value, NULL, 10), bytes, "rank %d sent %s", rank, value);
        cr_assert_not_null(device_probe_line(output, rank, "counter pp_recv_bytes", value,
                                             sizeof value));
        cr_expect_eq(strtoull(value, NULL, 10), bytes, "rank %d received %s", rank, value);
    }
    free(output);
}

Test(device_comm, hops_to_itself_arrive_in_order_as_they_were_at_the_send)
{
    expect_hops(0);
}

Test(device_comm, hops_around_a_ring_of_three_arrive_in_order_as_they_were_at_the_send)
{
    expect_hops(3);
}

Test(device_comm, hops_both_ways_between_two_ranks_do_not_wait_on_each_other)
{
    expect_hops(2);
}

static void expect_short_receive_fails(int ranks)
{
    char *output = device_probe_output();
    const int status = device_probe_run(ranks, "", "hops-short cpu", output);
    cr_expect_eq(status, 5, "exit %d: %s", status, output);
    cr_expect(strstr(output, "got a 4000-byte message") || strstr(output, "truncated"), "%s",
              output);
    free(output);
}

Test(device_comm, a_receive_that_disagrees_with_its_message_is_exit_5)
{
    expect_short_receive_fails(0);
    expect_short_receive_fails(2);
}

/* ---- timing ------------------------------------------------------------------------ */

Test(device_comm, timing_on_mpi_finds_the_waits_for_a_late_rank_all_exposed, .timeout = 60)
{
    char *output = device_probe_output();
    const int status = device_probe_run(2, "", "timing cpu", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    device_probe_expect_synchronous_times(output, 300);
    /* each rank timed three operations (a gather, a reduce-scatter, its hop), read once */
    char value[64];
    for (int rank = 0; rank < 2; rank++) {
        cr_assert_not_null(device_probe_line(output, rank, "pending", value, sizeof value));
        cr_expect_str_eq(value, "3", "rank %d", rank);
        cr_assert_not_null(device_probe_line(output, rank, "pending after", value,
                                             sizeof value));
        cr_expect_str_eq(value, "0", "rank %d", rank);
    }
    /* the rank that came late waited for nobody in the gather */
    const DeviceProbeTime late = device_probe_time(output, 1, "late", "fsdp_allgather");
    cr_expect_lt(late.exposed_ms, 200, "the late rank waited %.3f ms", late.exposed_ms);
    free(output);
}

/* ---- the choice of method ----------------------------------------------------------- */

static DeviceCommRank gpu_rank(int world_rank, const char *host, const char *bus_id)
{
    DeviceCommRank rank;
    memset(&rank, 0, sizeof rank);
    rank.world_rank = world_rank;
    snprintf(rank.host, sizeof rank.host, "%s", host);
    snprintf(rank.bus_id, sizeof rank.bus_id, "%s", bus_id);
    return rank;
}

Test(device_comm, host_memory_takes_mpi_whatever_the_gpus)
{
    DeviceCommRank ranks[2] = {gpu_rank(0, "a", "0000:19:00.0"), gpu_rank(1, "a", "0000:19:00.0")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 2, false, NULL, "nccl", reason, sizeof reason),
                 DEVICE_COMM_MPI);
    cr_expect_str_eq(reason, "2 ranks on host memory");
}

Test(device_comm, every_rank_on_its_own_gpu_takes_nccl)
{
    DeviceCommRank ranks[4] = {gpu_rank(0, "a", "0000:19:00.0"), gpu_rank(1, "a", "0000:3b:00.0"),
                               gpu_rank(2, "a", "0000:4c:00.0"), gpu_rank(3, "a", "0000:5d:00.0")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 4, true, NULL, NULL, reason, sizeof reason),
                 DEVICE_COMM_NCCL);
    cr_expect_str_eq(reason, "4 ranks on 4 GPUs");
}

Test(device_comm, two_ranks_on_one_gpu_take_host_staged_naming_ranks_and_gpu)
{
    DeviceCommRank ranks[2] = {gpu_rank(0, "a", "0000:19:00.0"), gpu_rank(1, "a", "0000:19:00.0")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 2, true, NULL, "", reason, sizeof reason),
                 DEVICE_COMM_HOST_STAGED);
    cr_expect_str_eq(reason, "ranks 0 and 1 share GPU 0000:19:00.0");
}

Test(device_comm, every_shared_gpu_is_named_with_its_world_ranks)
{
    DeviceCommRank ranks[5] = {gpu_rank(4, "a", "0000:19:00.0"), gpu_rank(5, "a", "0000:3b:00.0"),
                               gpu_rank(6, "a", "0000:19:00.0"), gpu_rank(7, "a", "0000:3b:00.0"),
                               gpu_rank(8, "a", "0000:19:00.0")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 5, true, NULL, NULL, reason, sizeof reason),
                 DEVICE_COMM_HOST_STAGED);
    cr_expect_str_eq(reason, "ranks 4, 6 and 8 share GPU 0000:19:00.0; ranks 5 and 7 share "
                             "GPU 0000:3b:00.0");
}

Test(device_comm, the_same_bus_id_on_two_hosts_is_two_gpus)
{
    DeviceCommRank ranks[2] = {gpu_rank(0, "a", "0000:19:00.0"), gpu_rank(1, "b", "0000:19:00.0")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 2, true, NULL, NULL, reason, sizeof reason),
                 DEVICE_COMM_NCCL);
    ranks[1] = gpu_rank(1, "a", "0000:19:00.0");
    DeviceCommRank more[3] = {ranks[0], ranks[1], gpu_rank(2, "b", "0000:19:00.0")};
    cr_expect_eq(device_comm_choose(more, 3, true, NULL, NULL, reason, sizeof reason),
                 DEVICE_COMM_HOST_STAGED);
    cr_expect_str_eq(reason, "ranks 0 and 1 share GPU 0000:19:00.0 of a");
}

Test(device_comm, a_module_without_nccl_stages_and_says_why)
{
    DeviceCommRank ranks[2] = {gpu_rank(0, "a", "0000:19:00.0"), gpu_rank(1, "a", "0000:3b:00.0")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 2, true, "the CUDA module was built without NCCL",
                                    NULL, reason, sizeof reason),
                 DEVICE_COMM_HOST_STAGED);
    cr_expect_str_eq(reason, "2 ranks on 2 GPUs, but the CUDA module was built without NCCL");
}

Test(device_comm, a_rank_without_a_bus_id_stages_naming_it)
{
    DeviceCommRank ranks[2] = {gpu_rank(0, "a", "0000:19:00.0"), gpu_rank(3, "a", "")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 2, true, NULL, NULL, reason, sizeof reason),
                 DEVICE_COMM_HOST_STAGED);
    cr_expect_str_eq(reason, "rank 3 cannot tell its GPU's PCI bus id");
}

Test(device_comm, one_rank_needs_no_communication)
{
    DeviceCommRank ranks[1] = {gpu_rank(0, "a", "")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 1, true, NULL, NULL, reason, sizeof reason),
                 DEVICE_COMM_NCCL);
    cr_expect_str_eq(reason, "1 rank: operations are copies");
}

Test(device_comm, the_environment_forces_host_staged_or_nccl)
{
    DeviceCommRank ranks[2] = {gpu_rank(0, "a", "0000:19:00.0"), gpu_rank(1, "a", "0000:3b:00.0")};
    char reason[256];
    cr_expect_eq(device_comm_choose(ranks, 2, true, NULL, "host-staged", reason, sizeof reason),
                 DEVICE_COMM_HOST_STAGED);
    cr_expect_str_eq(reason, "2 ranks, forced by FATHOM_DEVICE_COMM=host-staged");
    ranks[1] = gpu_rank(1, "a", "0000:19:00.0");
    cr_expect_eq(device_comm_choose(ranks, 2, true, NULL, "nccl", reason, sizeof reason),
                 DEVICE_COMM_NCCL);
    cr_expect_str_eq(reason, "2 ranks, forced by FATHOM_DEVICE_COMM=nccl");
}

static void choose_forced(void *forced)
{
    DeviceCommRank ranks[1] = {gpu_rank(0, "a", "0000:19:00.0")};
    char reason[256];
    device_comm_choose(ranks, 1, true, "no NCCL here", forced, reason, sizeof reason);
}

Test(device_comm, an_unknown_forced_method_is_exit_2_naming_the_variable)
{
    char errors[1024];
    cr_expect_eq(test_run_in_child(choose_forced, "mpi", errors, sizeof errors), 2, "%s",
                 errors);
    cr_expect_not_null(strstr(errors, "FATHOM_DEVICE_COMM = \"mpi\": expected host-staged or "
                                      "nccl"), "%s", errors);
}

Test(device_comm, forcing_nccl_without_nccl_is_exit_2)
{
    char errors[1024];
    cr_expect_eq(test_run_in_child(choose_forced, "nccl", errors, sizeof errors), 2, "%s",
                 errors);
    cr_expect_not_null(strstr(errors, "FATHOM_DEVICE_COMM = nccl, but no NCCL here"), "%s",
                       errors);
}

Test(device_comm, groups_are_named_by_world_rank_ranges)
{
    DeviceCommRank ranks[6];
    const int world[6] = {0, 2, 4, 5, 6, 9};
    for (int i = 0; i < 6; i++)
        ranks[i] = gpu_rank(world[i], "a", "");
    char text[128];
    device_comm_describe_group(ranks, 6, text, sizeof text);
    cr_expect_str_eq(text, "the group of world ranks 0, 2, 4-6, 9");
    device_comm_describe_group(ranks + 2, 2, text, sizeof text);
    cr_expect_str_eq(text, "the group of world ranks 4, 5");
    device_comm_describe_group(ranks + 5, 1, text, sizeof text);
    cr_expect_str_eq(text, "the group of world rank 9");
}
