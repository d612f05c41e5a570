/* tests/test_bench.c — `fathom bench` on the cpu at --small shapes: the command runs every
 * case through the op table and the model, and reports each result once. (The timings
 * themselves are measured on a GPU; docs/performance.md.) */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "model/params.h"
#include "runtime/config.h"
#include "tests/support.h"

Test(bench, small_cpu_run_reports_every_case_in_the_table_and_the_json, .timeout = 120)
{
    char directory[256], json[320], arguments[512], output[16384];
    test_make_temp_dir(directory, "bench");
    snprintf(json, sizeof json, "%s/bench.jsonl", directory);
    snprintf(arguments, sizeof arguments, "bench --small --device cpu --repeat 1 --json %s",
             json);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);

    static const char *const expected[][2] = {
        {"layers", "forward+backward"}, {"attention", "forward"},
        {"attention", "forward+backward"}, {"route", "two-phase delta"},
        {"route", "block ops only"}, {"msar", "conv in the read"}, {"step", "standard"},
        {"step", "mhar"}, {"step", "msar"}, {"step", "mhar-delta"}, {"step", "msar-delta"},
        {"step8b", "standard"}, {"step8b", "mhar-delta"}, {"step8b", "msar-delta"},
        {"graft", "standard"}, {"graft", "mhar-delta"}, {"graft", "msar-delta"},
    };
    const int n_expected = sizeof expected / sizeof expected[0];
    FILE *file = fopen(json, "r");
    cr_assert_not_null(file);
    char line[512];
    int rows = 0;
    while (fgets(line, sizeof line, file)) {
        cr_assert_lt(rows, n_expected, "more result lines than cases: %s", line);
        char case_name[32], mode[32];
        double ms = 0;
        cr_assert_eq(sscanf(line, "{\"case\": \"%31[^\"]\", \"mode\": \"%31[^\"]\", \"ms\": %lf",
                            case_name, mode, &ms), 3, "%s", line);
        cr_expect_str_eq(case_name, expected[rows][0]);
        cr_expect_str_eq(mode, expected[rows][1]);
        cr_expect_gt(ms, 0.0, "%s %s took no time", case_name, mode);
        rows++;
    }
    fclose(file);
    cr_assert_eq(rows, n_expected);
    cr_assert_not_null(strstr(output, "peak GiB"), "no table at the end:\n%s", output);
    test_remove_tree(directory);
}

Test(bench, the_routing_comparison_cases_run_two_phase_and_a_site_at_a_time, .timeout = 60)
{
    char output[16384];
    int code = test_run_fathom("bench --small --device cpu --repeat 1 --cases "
                               "route-1b,route-sites,route-1b-sites", output, sizeof output);
    cr_assert_eq(code, 0, "%s", output);
    static const char *const rows[] = {
        "route-1b   two-phase forward", "route-1b   two-phase replace",
        "route      per site delta", "route-1b   per site forward",
        "route-1b   per site replace"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        cr_expect_not_null(strstr(output, rows[i]), "no '%s' row:\n%s", rows[i], output);
}

Test(bench, an_unknown_case_is_a_usage_error)
{
    char output[4096];
    int code = test_run_fathom("bench --small --device cpu --cases nothing", output,
                               sizeof output);
    cr_assert_eq(code, 2, "%s", output);
    cr_assert_not_null(strstr(output, "unknown case 'nothing'"), "%s", output);
}

Test(bench, full_shapes_on_the_cpu_are_refused_with_the_way_out)
{
    char output[4096];
    int code = test_run_fathom("bench --device cpu --cases attention", output, sizeof output);
    cr_assert_eq(code, 2, "%s", output);
    cr_assert_not_null(strstr(output, "--small"), "%s", output);
}

/* ---- comm: FSDP's collectives over the ranks of an mpirun ---- */

static int run_bench_ranks(int ranks, const char *arguments, char *output, size_t capacity)
{
    char command[1024];
    snprintf(command, sizeof command,
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe "
             "-np %d '%s' bench %s </dev/null", ranks, test_fathom_binary(), arguments);
    return test_run_command(command, output, capacity);
}

Test(bench, comm_times_each_units_gather_and_reduce_scatter_once_from_rank_0, .timeout = 120)
{
    char directory[256], json[320], arguments[512], output[16384];
    test_make_temp_dir(directory, "bench-comm");
    snprintf(json, sizeof json, "%s/bench.jsonl", directory);
    snprintf(arguments, sizeof arguments,
             "--cases comm --small --device cpu --repeat 3 --json %s", json);
    cr_assert_eq(run_bench_ranks(2, arguments, output, sizeof output), 0, "%s", output);
    cr_expect_not_null(strstr(output, "bench: comm over 2 ranks: mpi (2 ranks on host memory)"),
                       "%s", output);
    static const char *const modes[] = {"gather 1B layer", "scatter 1B layer",
                                        "gather 8B layer", "scatter 8B layer",
                                        "gather 8B embedding", "scatter 8B embedding"};
    FILE *file = fopen(json, "r");
    cr_assert_not_null(file);
    char line[512];
    int rows = 0;
    while (fgets(line, sizeof line, file)) {
        cr_assert_lt(rows, 6, "more result lines than the units' two collectives: %s", line);
        char case_name[32], mode[32], unit[32];
        double ms = 0, rate = 0;
        cr_assert_eq(sscanf(line, "{\"case\": \"%31[^\"]\", \"mode\": \"%31[^\"]\", \"ms\": %lf, "
                            "\"rate\": %lf, \"unit\": \"%31[^\"]\"", case_name, mode, &ms,
                            &rate, unit), 5, "%s", line);
        cr_expect_str_eq(case_name, "comm");
        cr_expect_str_eq(mode, modes[rows]);
        cr_expect_str_eq(unit, "GB/s bus");
        cr_expect_gt(ms, 0.0, "%s took no time", mode);
        cr_expect_gt(rate, 0.0, "%s", mode);
        rows++;
    }
    fclose(file);
    cr_expect_eq(rows, 6, "rank 0 alone writes the results, once each");
    /* each result is printed once, by rank 0, and the table once */
    const char *first = strstr(output, "bench: comm       gather 1B layer");
    cr_assert_not_null(first, "%s", output);
    cr_expect_null(strstr(first + 1, "bench: comm       gather 1B layer"), "%s", output);
    test_remove_tree(directory);
}

Test(bench, comm_on_one_rank_and_other_cases_under_mpirun_are_usage_errors, .timeout = 60)
{
    char output[8192];
    cr_expect_eq(test_run_fathom("bench --small --device cpu --cases comm", output,
                                 sizeof output), 2, "%s", output);
    cr_expect_not_null(strstr(output, "run it under mpirun -np 2"), "%s", output);
    cr_expect_eq(run_bench_ranks(2, "--small --device cpu --cases layers", output,
                                 sizeof output), 2, "%s", output);
    cr_expect_not_null(strstr(output, "only --cases comm runs"), "%s", output);
}

/* launch/bench/peer_comm.py gives PyTorch the units fathom moves: its parameters and shard
 * sizes are model/params.c's, for the 1B and 8B shapes and D = 2, 4, 8. */
static void expect_peer_unit(const char *sizes, const char *name, const ModelConfig *model,
                             int unit)
{
    Config defaults;
    config_defaults(&defaults);
    ParamTable table;
    param_table_build_with_residual(&table, model, &defaults.residual);
    const ParamUnit *entries = &table.units[unit];
    unsigned long long parameters = 0, shards[3] = {0, 0, 0};
    for (int p = entries->first_param; p < entries->first_param + entries->n_params; p++) {
        const ParamEntry *entry = &table.params[p];
        const unsigned long long rows = (unsigned long long)entry->shape[0];
        parameters += entry->count;
        for (int k = 0; k < 3; k++) {
            const unsigned long long D = 2ull << k;
            shards[k] += (rows + D - 1) / D * (entry->count / rows);
        }
    }
    param_table_free(&table);
    char want[256];
    snprintf(want, sizeof want, "%s: %llu parameters; shard elements D 2: %llu, D 4: %llu, "
             "D 8: %llu\n", name, parameters, shards[0], shards[1], shards[2]);
    cr_expect_not_null(strstr(sizes, want), "fathom's unit '%s' is not the peer's:\n%s", want,
                       sizes);
}

Test(bench, the_comm_peer_moves_the_units_fathom_moves)
{
    char command[1024], sizes[4096];
    snprintf(command, sizeof command, "python3 '%s/launch/bench/peer_comm.py' --sizes",
             test_source_dir());
    cr_assert_eq(test_run_command(command, sizes, sizeof sizes), 0, "%s", sizes);
    Config config;
    config_defaults(&config);
    ModelConfig one_b = config.model, eight_b = config.model;
    one_b.vocab_size = eight_b.vocab_size = 128256;
    one_b.n_layers = eight_b.n_layers = 2;
    one_b.d_model = 1280, one_b.n_heads = 16, one_b.n_kv_heads = 8, one_b.head_dim = 80;
    one_b.ffn_dim = 5120;
    eight_b.d_model = 4096, eight_b.n_heads = 32, eight_b.n_kv_heads = 8;
    eight_b.head_dim = 128, eight_b.ffn_dim = 14336;
    expect_peer_unit(sizes, "1B layer", &one_b, 1);
    expect_peer_unit(sizes, "8B layer", &eight_b, 1);
    expect_peer_unit(sizes, "8B embedding", &eight_b, 0);
}
