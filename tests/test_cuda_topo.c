/* tests/test_cuda_topo.c — rank placement on a GPU machine (runtime/topo.h, DESIGN 3
 * "Placement"), through `fathom train` on the cuda backend under mpirun: a rank the launcher
 * left unbound is bound near its GPU, ranks beyond the GPUs share them, a launcher's binding
 * is kept. SKIP where no GPU answers.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu_support.h"
#include "tests/support.h"

enum { OUTPUT_CAPACITY = 1 << 16 };

/* the demo config at head_dim 64, which the cuda attention takes, for one step */
static const char *const CUDA_DEMO =
    "--set device=cuda --set model.d_model=128 --set model.n_heads=2 "
    "--set model.n_kv_heads=1 --set model.head_dim=64 --set model.ffn_dim=256 "
    "--set train.seq_len=64 --set train.microbatch_size=2 --set train.global_batch_size=8 "
    "--set train.steps=1 --set eval.every=0 --set checkpoint.save_final=false";

static int train_demo(int ranks, const char *binding, const char *overrides, char *output,
                      char *directory)
{
    test_make_temp_dir(directory, "cuda-topo");
    char command[4096];
    snprintf(command, sizeof command,
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "
             "--oversubscribe --bind-to %s -np %d%s%s '%s' train "
             "'%s/launch/configs/demo.yaml' %s %s --set run_dir='%s/run' </dev/null",
             binding, ranks, getenv("LD_LIBRARY_PATH") ? " -x LD_LIBRARY_PATH" : "",
             getenv("NCCL_NVLS_ENABLE") ? " -x NCCL_NVLS_ENABLE" : "", test_fathom_binary(),
             test_source_dir(), CUDA_DEMO, overrides, directory);
    return test_run_command(command, output, OUTPUT_CAPACITY);
}

typedef struct {
    int stage, dp, gpu;
    char host[64], bus_id[32], cpus[96], bound_by[16];
} MapRow;

/* The map's row of world rank `rank`: "rank stage dp host gpu bus_id cpus bound_by". */
static int map_row(const char *output, int rank, MapRow *row)
{
    const char *map = strstr(output, "fathom: rank map\n");
    if (!map)
        return 0;
    const char *line = strchr(strchr(map, '\n') + 1, '\n'); /* past the column names */
    for (; line && line[1] == ' '; line = strchr(line + 1, '\n')) {
        int row_rank;
        if (sscanf(line + 1, "%d %d %d %63s %d %31s %95s %15s", &row_rank, &row->stage,
                   &row->dp, row->host, &row->gpu, row->bus_id, row->cpus,
                   row->bound_by) == 8 &&
            row_rank == rank)
            return 1;
    }
    return 0;
}

Test(cuda_topo, a_rank_the_launcher_left_unbound_is_bound_near_its_gpu, .timeout = 120)
{
    gpu_require();
    char *output = malloc(OUTPUT_CAPACITY), directory[256];
    const int status = train_demo(1, "none", "", output, directory);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    MapRow row;
    cr_assert(map_row(output, 0, &row), "no row with a GPU for rank 0:\n%s", output);
    cr_expect_eq(row.gpu, 0);
    cr_expect_eq(strlen(row.bus_id), 12, "bus id %s", row.bus_id);
    cr_expect_str_eq(row.bound_by, "fathom", "%s", output);
    cr_expect_null(strstr(output, "the rank is not bound"), "%s", output);
    printf("cuda_topo: rank 0 on GPU %d %s bound to cpus %s\n", row.gpu, row.bus_id, row.cpus);
    test_remove_tree(directory);
    free(output);
}

Test(cuda_topo, ranks_beyond_the_gpus_share_them_and_their_cpus, .timeout = 120)
{
    gpu_require();
    char *output = malloc(OUTPUT_CAPACITY), directory[256];
    const int status = train_demo(2, "none", "--set parallel.pp=2", output, directory);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    MapRow first, second;
    cr_assert(map_row(output, 0, &first) && map_row(output, 1, &second), "%s", output);
    cr_expect_eq(first.gpu, 0);
    cr_expect_eq(second.gpu, 0, "one GPU: the second rank shares it");
    cr_expect_str_eq(first.bus_id, second.bus_id);
    cr_expect_str_eq(first.cpus, second.cpus, "both near the one GPU");
    cr_expect_str_eq(second.bound_by, "fathom");
    test_remove_tree(directory);
    free(output);
}

Test(cuda_topo, a_launcher_binding_is_kept, .timeout = 120)
{
    gpu_require();
    char *output = malloc(OUTPUT_CAPACITY), directory[256];
    const int status = train_demo(1, "core", "", output, directory);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    MapRow row;
    cr_assert(map_row(output, 0, &row), "%s", output);
    cr_expect_str_eq(row.bound_by, "launcher", "%s", output);
    printf("cuda_topo: --bind-to core kept: cpus %s, %s\n", row.cpus,
           strstr(output, "is not within the cpus nearest") ? "far from the GPU (warned)"
                                                             : "near the GPU");
    test_remove_tree(directory);
    free(output);
}
