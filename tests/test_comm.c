/* tests/test_comm.c — runtime/comm.h under mpirun (DESIGN 3 "Communication", DESIGN 7).
 *
 * Each test runs fathom-comm-probe with one scenario, under `mpirun --oversubscribe -np N`
 * or alone (a world of one), and reads its "rank R ..." lines and exit status. Byte counts
 * and group memberships are computed here from DESIGN 3's grid and comm.h's stated rule,
 * not taken from the probe. The rank-order arithmetic is also tested in process.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm_reduce.h"
#include "tests/support.h"

enum { OUTPUT_CAPACITY = 1 << 16 };

static const char *comm_probe_binary(void)
{
    const char *moved = getenv("FATHOM_COMM_PROBE");
    return moved && *moved ? moved : FATHOM_COMM_PROBE;
}

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* ranks 0: the probe alone, with no launcher variables (a world of one); else under mpirun.
 * Returns the exit status; *seconds (if not NULL) is the wall time. */
static int run_probe(int ranks, const char *arguments, char *output, double *seconds)
{
    char command[2048];
    if (ranks == 0)
        snprintf(command, sizeof command,
                 "env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK '%s' %s </dev/null",
                 comm_probe_binary(), arguments);
    else
        snprintf(command, sizeof command,
                 "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                 "mpirun --oversubscribe -np %d '%s' %s </dev/null",
                 ranks, comm_probe_binary(), arguments);
    const double start = seconds_now();
    const int status = test_run_command(command, output, OUTPUT_CAPACITY);
    if (seconds)
        *seconds = seconds_now() - start;
    return status;
}

/* The text after "rank R <key> " on the line of that rank, up to the line's end (copied into
 * `value`), or NULL when no such line exists. */
static const char *rank_line(const char *output, int rank, const char *key, char *value,
                             size_t capacity)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "rank %d %s ", rank, key);
    for (const char *line = output; line && *line;) {
        const char *next = strchr(line, '\n');
        if (strncmp(line, prefix, strlen(prefix)) == 0) {
            const char *start = line + strlen(prefix);
            const char *end = strchr(start, '\n');
            size_t length = end ? (size_t)(end - start) : strlen(start);
            if (length >= capacity)
                length = capacity - 1;
            memcpy(value, start, length);
            value[length] = '\0';
            return value;
        }
        line = next ? next + 1 : NULL;
    }
    return NULL;
}

static char *fresh_output(void)
{
    char *output = malloc(OUTPUT_CAPACITY);
    cr_assert_not_null(output);
    output[0] = '\0';
    return output;
}

Test(comm, world_of_one_runs_without_mpi)
{
    char *output = fresh_output(), value[256];
    cr_assert_eq(run_probe(0, "world", output, NULL), 0, "%s", output);
    cr_assert_not_null(rank_line(output, 0, "world", value, sizeof value), "%s", output);
    cr_assert_str_eq(value, "size 1 mpi_initialized 0 comm_mpi_active 0");
    free(output);
}

Test(comm, mpirun_starts_mpi_on_every_rank)
{
    char *output = fresh_output(), value[256];
    cr_assert_eq(run_probe(3, "world", output, NULL), 0, "%s", output);
    for (int rank = 0; rank < 3; rank++) {
        cr_assert_not_null(rank_line(output, rank, "world", value, sizeof value), "%s", output);
        cr_assert_str_eq(value, "size 3 mpi_initialized 1 comm_mpi_active 1");
    }
    free(output);
}

Test(comm, world_of_one_operations_are_local_copies_and_messages_to_itself_match_by_tag)
{
    char *output = fresh_output(), value[256];
    cr_assert_eq(run_probe(0, "local", output, NULL), 0, "%s", output);
    cr_assert_not_null(rank_line(output, 0, "local", value, sizeof value), "%s", output);
    /* three 12-byte messages to itself; collectives on one rank move nothing */
    cr_assert_str_eq(value, "wrong 0 pp_send 36 pp_recv 36 collectives 0");
    free(output);
}

Test(comm, sums_equal_rank_order_sums_bit_for_bit)
{
    char *output = fresh_output(), value[256], first_digest[256];
    cr_assert_eq(run_probe(3, "sums", output, NULL), 0, "%s", output);
    for (int rank = 0; rank < 3; rank++) {
        cr_assert_not_null(rank_line(output, rank, "sums", value, sizeof value), "%s", output);
        size_t wrong = 1, total = 0, order_sensitive = 0;
        cr_assert_eq(sscanf(value, "wrong %zu of %zu order_sensitive %zu", &wrong, &total,
                            &order_sensitive), 3, "%s", value);
        cr_assert_eq(wrong, 0, "rank %d: %zu of %zu elements differ from the rank-order sum",
                     rank, wrong, total);
        /* the data tells the rank-order sum from a float32 sum in another order */
        cr_assert_gt(order_sensitive, 0, "%s", value);
        cr_assert_not_null(rank_line(output, rank, "allreduce_digest", value, sizeof value));
        if (rank == 0)
            strcpy(first_digest, value);
        cr_assert_str_eq(value, first_digest, "rank %d's all-reduce differs from rank 0's", rank);
    }
    free(output);
}

Test(comm, sums_repeat_bitwise_across_runs)
{
    char *first = fresh_output(), *second = fresh_output(), a[256], b[256];
    cr_assert_eq(run_probe(3, "sums", first, NULL), 0, "%s", first);
    cr_assert_eq(run_probe(3, "sums", second, NULL), 0, "%s", second);
    const char *keys[2] = {"allreduce_digest", "reduce_scatter_digest"};
    for (int rank = 0; rank < 3; rank++)
        for (int k = 0; k < 2; k++) {
            cr_assert_not_null(rank_line(first, rank, keys[k], a, sizeof a), "%s", first);
            cr_assert_not_null(rank_line(second, rank, keys[k], b, sizeof b), "%s", second);
            cr_assert_str_eq(a, b, "rank %d %s differs between runs", rank, keys[k]);
        }
    free(first);
    free(second);
}

Test(comm, bfloat16_float64_int64_sums_and_max_with_nan_match_references)
{
    char *output = fresh_output(), value[256];
    cr_assert_eq(run_probe(3, "types", output, NULL), 0, "%s", output);
    for (int rank = 0; rank < 3; rank++) {
        cr_assert_not_null(rank_line(output, rank, "types", value, sizeof value), "%s", output);
        cr_assert_str_eq(value, "wrong 0 of 148");
    }
    free(output);
}

Test(comm, split_into_pp_by_dp_grid_gives_dp_groups_and_pipelines)
{
    const int pp = 2, dp = 3;
    char *output = fresh_output(), value[256], expected[256];
    cr_assert_eq(run_probe(pp * dp, "grid 2 3", output, NULL), 0, "%s", output);
    for (int rank = 0; rank < pp * dp; rank++) {
        const int stage = rank / dp, dp_rank = rank % dp;  /* DESIGN 3: rank = stage * D + dp */
        char dp_group[64] = "", pipeline[64] = "";
        for (int k = 0; k < dp; k++)
            sprintf(dp_group + strlen(dp_group), "%s%d", k ? "," : "", stage * dp + k);
        for (int s = 0; s < pp; s++)
            sprintf(pipeline + strlen(pipeline), "%s%d", s ? "," : "", s * dp + dp_rank);
        snprintf(expected, sizeof expected,
                 "%d dp_rank %d dp_group %s (rank %d) pipeline %s (rank %d)", stage, dp_rank,
                 dp_group, dp_rank, pipeline, stage);
        cr_assert_not_null(rank_line(output, rank, "stage", value, sizeof value), "%s", output);
        cr_assert_str_eq(value, expected, "rank %d", rank);
        cr_assert_not_null(rank_line(output, rank, "without_rank_0", value, sizeof value));
        cr_assert_eq(atoi(value), rank == 0 ? -1 : pp * dp - 1, "rank %d: %s", rank, value);
    }
    free(output);
}

Test(comm, tagged_messages_of_megabytes_arrive_whatever_the_order_of_posting)
{
    /* the probe's messages: 3 MiB, 1 MiB + 7, 2 MiB, 5000 bytes */
    const unsigned long long total = (3u << 20) + (1u << 20) + 7 + (2u << 20) + 5000;
    char *output = fresh_output(), value[256], expected[256];
    cr_assert_eq(run_probe(2, "sendrecv", output, NULL), 0, "%s", output);
    cr_assert_not_null(rank_line(output, 1, "sendrecv", value, sizeof value), "%s", output);
    snprintf(expected, sizeof expected, "wrong 0 received %llu counted_send 0 counted_recv %llu",
             total, total);
    cr_assert_str_eq(value, expected);
    cr_assert_not_null(rank_line(output, 0, "sendrecv", value, sizeof value), "%s", output);
    snprintf(expected, sizeof expected, "wrong 0 received 0 counted_send %llu counted_recv 0",
             total);
    cr_assert_str_eq(value, expected);
    free(output);
}

/* comm.h's rule on n ranks for the probe's "counters" operations. */
static unsigned long long expected_counter(const char *name, int rank, int n)
{
    const unsigned long long segment = 1001 / n + (rank < 1001 % n), others = n - 1;
    if (!strcmp(name, "fsdp_allgather_bytes"))
        return others * 1000 * 4;
    if (!strcmp(name, "fsdp_reducescatter_bytes"))
        return others * 500 * 2;
    if (!strcmp(name, "allreduce_bytes"))
        return (1001 - segment) * 4 + others * segment * 4;
    if (!strcmp(name, "other_bytes"))
        return rank == n - 1 ? others * 300 : 0;  /* broadcast from the last rank */
    if (!strcmp(name, "pp_send_bytes"))
        return rank == 0 ? 12345 : 0;
    if (!strcmp(name, "pp_recv_bytes"))
        return rank == 1 ? 12345 : 0;
    if (!strcmp(name, "pp_summary_bytes_uncached"))
        return 777;
    return 0;
}

Test(comm, byte_counters_equal_the_stated_rule_exactly)
{
    const char *names[8] = {"pp_send_bytes", "pp_recv_bytes", "pp_summary_bytes",
                            "pp_summary_bytes_uncached", "fsdp_allgather_bytes",
                            "fsdp_reducescatter_bytes", "allreduce_bytes", "other_bytes"};
    const int n = 3;
    char *output = fresh_output(), value[256], key[128];
    cr_assert_eq(run_probe(n, "counters", output, NULL), 0, "%s", output);
    for (int rank = 0; rank < n; rank++)
        for (int k = 0; k < 8; k++) {
            snprintf(key, sizeof key, "counter %s", names[k]);
            cr_assert_not_null(rank_line(output, rank, key, value, sizeof value), "%s", output);
            cr_assert_eq(strtoull(value, NULL, 10), expected_counter(names[k], rank, n),
                         "rank %d %s = %s, expected %llu", rank, names[k], value,
                         expected_counter(names[k], rank, n));
        }
    free(output);
}

Test(comm, a_recv_that_never_gets_its_message_exits_5_within_the_timeout)
{
    char *output = fresh_output();
    double seconds = 0;
    const int status = run_probe(2, "timeout", output, &seconds);
    cr_assert_eq(status, 5, "exit %d: %s", status, output);
    cr_assert_not_null(strstr(output, "fathom: error: rank 1: recv of 4096 bytes from rank 0 "
                                      "(tag 7) did not complete within parallel.timeout_s = 1 s"),
                       "%s", output);
    /* the deadline is 1 s; rank 0 would sleep 20 s if the abort did not end it */
    cr_assert_lt(seconds, 8.0, "took %.1f s", seconds);
    cr_assert_null(strstr(output, "timeout did not happen"), "%s", output);
    free(output);
}

Test(comm, a_config_error_on_every_rank_ends_the_job_with_exit_2)
{
    char *output = fresh_output();
    const int status = run_probe(3, "fatal_all", output, NULL);
    cr_assert_eq(status, 2, "exit %d: %s", status, output);
    cr_assert_not_null(strstr(output, ": model.n_heads = 3 must be a multiple"), "%s", output);
    cr_assert_not_null(strstr(output, "fathom: error: rank "), "%s", output);
    free(output);
}

Test(comm, a_config_error_on_one_rank_ends_the_waiting_job_with_exit_2_at_once)
{
    char *output = fresh_output();
    double seconds = 0;
    const int status = run_probe(3, "fatal_one", output, &seconds);
    cr_assert_eq(status, 2, "exit %d: %s", status, output);
    cr_assert_not_null(strstr(output, "fathom: error: rank 2: model.n_heads = 3"), "%s", output);
    cr_assert_null(strstr(output, "fatal did not end the job"), "%s", output);
    /* the other ranks wait in a barrier with a 60 s deadline: only the abort ends them */
    cr_assert_lt(seconds, 8.0, "took %.1f s", seconds);
    free(output);
}

Test(comm, one_process_messages_carry_no_rank_prefix)
{
    char *output = fresh_output();
    cr_assert_eq(run_probe(0, "no-such-scenario", output, NULL), 2, "%s", output);
    cr_assert_not_null(strstr(output, "fathom: error: usage: fathom-comm-probe"), "%s", output);
    free(output);
}

Test(comm, waiting_inside_a_group_bracket_is_refused)
{
    char *output = fresh_output();
    cr_assert_eq(run_probe(0, "wait_in_group", output, NULL), 5, "%s", output);
    cr_assert_not_null(strstr(output, "comm_wait on the send of 4 bytes to rank 0 (tag 1) "
                                      "inside comm_group_begin/end"), "%s", output);
    free(output);
}

/* ---- the arithmetic, in process -------------------------------------------------------- */

Test(comm, reduce_adds_in_rank_order_in_double_and_rounds_once)
{
    /* 1 + 2^-30 - 1 in float32 loses 2^-30; added in double and rounded once it stays */
    const float blocks[3] = {1.0f, 0x1p-30f, -1.0f};
    float out;
    comm_reduce_blocks(blocks, 3, 1, COMM_FLOAT32, COMM_REDUCE_SUM, &out);
    cr_assert_eq(out, 0x1p-30f, "got %a", out);
    const int64_t whole[2] = {INT64_MAX - 5, 5};
    int64_t whole_out;
    comm_reduce_blocks(whole, 2, 1, COMM_INT64, COMM_REDUCE_SUM, &whole_out);
    cr_assert_eq(whole_out, INT64_MAX);
}

Test(comm, bfloat16_rounds_to_nearest_even)
{
    /* ties go to the even mantissa: 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7;
     * 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (even) */
    cr_assert_eq(comm_float_to_bfloat16(1.0f + 0x1p-8f), 0x3f80);
    cr_assert_eq(comm_float_to_bfloat16(1.0f + 3 * 0x1p-8f), 0x3f82);
    cr_assert_eq(comm_bfloat16_to_float(0x3f82), 1.0f + 0x1p-6f);
    cr_assert(isnan(comm_bfloat16_to_float(comm_float_to_bfloat16(NAN))));
}

Test(comm, max_keeps_a_nan_from_any_rank)
{
    const float blocks[6] = {1.0f, NAN, -3.0f, 2.0f, 5.0f, -4.0f}; /* 3 ranks x 2 elements */
    float out[2];
    comm_reduce_blocks(blocks, 3, 2, COMM_FLOAT32, COMM_REDUCE_MAX, out);
    cr_assert_eq(out[0], 5.0f);
    cr_assert(isnan(out[1]));
}
