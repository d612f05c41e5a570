/* tests/test_help.c — `fathom --help`, `fathom COMMAND --help` and `fathom --version`
 * (launch/help.h): every command's help has its usage, its options and an example, and
 * exits 0. */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static char output[1 << 16];

Test(help, every_command_answers_help_with_usage_options_and_an_example)
{
    static const char *const commands[][2] = {
        {"train", "--set"},      {"eval", "--checkpoint"}, {"probe", "--slices"},
        {"bench", "--cases"},    {"inspect", "--comm"},     {"inspect", "--json"},
        {"convert", "--from-hf"},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        for (int form = 0; form < 2; form++) {
            char arguments[64], usage[64];
            snprintf(arguments, sizeof arguments, "%s %s", commands[i][0],
                     form ? "-h" : "--help");
            snprintf(usage, sizeof usage, "usage: fathom %s", commands[i][0]);
            cr_expect_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s: %s",
                         arguments, output);
            cr_expect(strstr(output, usage), "%s: %s", arguments, output);
            cr_expect(strstr(output, commands[i][1]), "%s lacks %s: %s", arguments,
                      commands[i][1], output);
            cr_expect(strstr(output, "example: fathom"), "%s: %s", arguments, output);
        }
    }
}

Test(help, fathom_help_lists_every_command)
{
    cr_assert_eq(test_run_fathom("--help", output, sizeof output), 0, "%s", output);
    static const char *const commands[] = {"train", "eval", "probe", "bench", "inspect",
                                           "convert", "--version"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        cr_expect(strstr(output, commands[i]), "no %s in: %s", commands[i], output);
}

Test(help, version_names_the_version_the_commit_and_the_backends)
{
    cr_assert_eq(test_run_fathom("--version", output, sizeof output), 0, "%s", output);
    cr_expect(strstr(output, "fathom 0."), "%s", output);
    cr_expect(strstr(output, "(commit "), "%s", output);
    cr_expect(!strstr(output, "commit unknown"), "%s", output);
    cr_expect(strstr(output, "backends: cpu"), "%s", output);
    cr_expect(strstr(output, "cuda"), "%s", output);
}

Test(help, convert_without_its_options_is_a_usage_error)
{
    cr_expect_eq(test_run_fathom("convert --from-hf x", output, sizeof output), 2);
    cr_expect(strstr(output, "usage: fathom convert"), "%s", output);
}
