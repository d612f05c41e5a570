/* tests/test_topo.c — rank placement (runtime/topo.h, DESIGN 3 "Placement") on this machine:
 * the rules alone (local rank, GPUs used, the GPU of a rank, cpus within cpus), the config
 * errors of parallel.gpus_per_node through `fathom train`, and the rank map of a job under
 * mpirun, printed once. The binding near a GPU is tested on a GPU (test_cuda_topo.c).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/topo.h"
#include "tests/support.h"
#include "tests/train_support.h"

enum { OUTPUT_CAPACITY = 1 << 16 };

/* ---- the rules ---------------------------------------------------------------------- */

Test(topo, local_ranks_count_the_earlier_ranks_of_the_same_host)
{
    char hosts[5][TOPO_HOST_BYTES] = {"a", "b", "a", "b", "a"};
    const int want_local[5] = {0, 0, 1, 1, 2}, want_size[5] = {3, 2, 3, 2, 3};
    for (int rank = 0; rank < 5; rank++) {
        int size = 0;
        cr_expect_eq(topo_local_rank(&hosts[0][0], 5, rank, &size), want_local[rank],
                     "rank %d", rank);
        cr_expect_eq(size, want_size[rank], "rank %d", rank);
    }
}

Test(topo, ranks_take_gpus_round_robin_by_local_rank)
{
    const int want[6] = {0, 1, 2, 3, 0, 1};
    for (int local = 0; local < 6; local++)
        cr_expect_eq(topo_gpu_of(local, 4), want[local], "local rank %d", local);
    cr_expect_eq(topo_gpu_of(3, 1), 0, "one GPU: every rank shares it");
    cr_expect_eq(topo_gpu_of(0, 0), -1, "no GPU");
}

Test(topo, gpus_per_node_zero_means_all_the_node_has)
{
    cr_expect_eq(topo_gpus_used(0, 8, ""), 8);
    cr_expect_eq(topo_gpus_used(0, 0, "none"), 0);
    cr_expect_eq(topo_gpus_used(3, 8, ""), 3);
    cr_expect_eq(topo_gpus_used(8, 8, ""), 8);
}

static void ask_for_five_of_four(void *unused)
{
    (void)unused;
    topo_gpus_used(5, 4, "");
}

static void ask_for_one_of_none(void *unused)
{
    (void)unused;
    topo_gpus_used(1, 0, "no CUDA device");
}

Test(topo, more_gpus_per_node_than_the_node_has_is_exit_2_naming_the_key)
{
    char errors[1024];
    cr_expect_eq(test_run_in_child(ask_for_five_of_four, NULL, errors, sizeof errors), 2);
    cr_expect_not_null(strstr(errors, "parallel.gpus_per_node = 5, but this node has 4 GPUs"),
                       "%s", errors);
    cr_expect_eq(test_run_in_child(ask_for_one_of_none, NULL, errors, sizeof errors), 2);
    cr_expect_not_null(strstr(errors, "parallel.gpus_per_node = 1, but this node has no GPU "
                                      "(no CUDA device)"), "%s", errors);
}

Test(topo, a_binding_is_near_when_all_its_cpus_are_the_gpus)
{
    cr_expect(topo_cpus_within("0-3", "0-15"));
    cr_expect(topo_cpus_within("2,5", "0-7"));
    cr_expect(!topo_cpus_within("14-17", "0-15"), "partly outside");
    cr_expect(!topo_cpus_within("16", "0-15"), "outside");
    cr_expect(!topo_cpus_within("0", ""), "nothing known about the GPU");
}

/* ---- through fathom train ------------------------------------------------------------ */

/* `fathom train` of the tiny config with `overrides`, under mpirun with `ranks` (0: alone). */
static int train_tiny(int ranks, const char *overrides, char *output, char *directory)
{
    test_make_temp_dir(directory, "topo");
    tiny_config_write(directory, "");
    char command[4096];
    snprintf(command, sizeof command,
             "cd '%s' && OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 "
             "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 %s%.0d '%s' train '%s/config.yaml' "
             "--set train.steps=1 %s </dev/null",
             directory, ranks ? "mpirun --oversubscribe -np " : "", ranks,
             test_fathom_binary(), directory, overrides);
    return test_run_command(command, output, OUTPUT_CAPACITY);
}

Test(topo, gpus_per_node_beyond_the_node_is_exit_2_naming_the_key, .timeout = 60)
{
    char *output = malloc(OUTPUT_CAPACITY), directory[256];
    /* no machine here has 9 GPUs: whatever this one has, 9 is too many */
    const int status = train_tiny(0, "--set device=auto --set parallel.gpus_per_node=9",
                                  output, directory);
    cr_expect_eq(status, 2, "exit %d: %s", status, output);
    cr_expect_not_null(strstr(output, "fathom: error: parallel.gpus_per_node = 9, but this "
                                      "node has "), "%s", output);
    test_remove_tree(directory);
    free(output);
}

Test(topo, gpus_per_node_is_not_read_on_the_cpu, .timeout = 60)
{
    char *output = malloc(OUTPUT_CAPACITY), directory[256];
    const int status = train_tiny(0, "--set device=cpu --set parallel.gpus_per_node=2",
                                  output, directory);
    cr_expect_eq(status, 0, "exit %d: %s", status, output);
    cr_expect_not_null(strstr(output, "fathom: warning: parallel.gpus_per_node = 2 is not read "
                                      "with device: cpu"), "%s", output);
    test_remove_tree(directory);
    free(output);
}

/* The row of world rank `rank` in the map: "rank stage dp host gpu ..." split in fields. */
static int map_row(const char *output, int rank, int *stage, int *dp, char *host, char *gpu)
{
    const char *map = strstr(output, "fathom: rank map\n");
    if (!map)
        return 0;
    const char *line = strchr(map, '\n') + 1;  /* the column names */
    for (line = strchr(line, '\n'); line && line[1] == ' '; line = strchr(line + 1, '\n')) {
        int row_rank;
        if (sscanf(line + 1, "%d %d %d %63s %63s", &row_rank, stage, dp, host, gpu) == 5 &&
            row_rank == rank)
            return 1;
    }
    return 0;
}

static int occurrences(const char *text, const char *what)
{
    int count = 0;
    for (const char *at = strstr(text, what); at; at = strstr(at + 1, what))
        count++;
    return count;
}

Test(topo, a_job_prints_one_rank_map_with_every_ranks_stage_and_dp_rank, .timeout = 120)
{
    char *output = malloc(OUTPUT_CAPACITY), directory[256];
    const int status = train_tiny(4, "--set parallel.pp=2 --set parallel.dp=2 "
                                     "--set train.microbatch_size=2", output, directory);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    cr_expect_eq(occurrences(output, "fathom: rank map"), 1, "%s", output);
    char first_host[64] = "";
    for (int rank = 0; rank < 4; rank++) {
        int stage = -1, dp = -1;
        char host[64], gpu[64];
        cr_assert(map_row(output, rank, &stage, &dp, host, gpu), "no row for rank %d:\n%s",
                  rank, output);
        cr_expect_eq(stage, rank / 2, "rank %d", rank);
        cr_expect_eq(dp, rank % 2, "rank %d", rank);
        cr_expect_str_eq(gpu, "-", "device: cpu has no GPU");
        if (rank == 0)
            snprintf(first_host, sizeof first_host, "%s", host);
        cr_expect_str_eq(host, first_host, "one host");
    }
    test_remove_tree(directory);
    free(output);
}
