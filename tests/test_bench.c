/* tests/test_bench.c — `fathom bench` on the cpu at --small shapes: the command runs every
 * case through the op table and the model, and reports each result once. (The timings
 * themselves are measured on a GPU; docs/performance.md.) */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

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
        {"route", "block ops only"}, {"msar", "conv in the read"}, {"step", "standard"}, {"step", "mhar"},
        {"step", "msar"}, {"step", "mhar-delta"}, {"step", "msar-delta"},
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
