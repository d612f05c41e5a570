/* tests/test_readme.c — README.md's commands run as written, in order, on a fresh clone.
 *
 * The commands come from README.md itself, so the two cannot drift: every command of the
 * "## Two commands" block except the one that runs this suite (launch/test.sh), then every
 * command of the "## Using it" block, each line as one bash command (comments after `#`
 * are bash's). They run one after another in a fresh tree: a temporary directory with a link
 * to every top-level entry the repository tracks (git ls-files) and `build` linked to the
 * build under test; no runs/, no shards/. The environment holds the FATHOM_SET='...' that
 * README.md's "Using it" section names (read from there too), which shortens the sequences
 * and batches so that the walk takes about a minute on 2 cores.
 *
 * A line must exit 0 and print no "fathom: error"; a line whose comment says "resumes at N"
 * must print "resumed at step N".
 */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { README_MAX_COMMANDS = 64, README_LINE_MAX = 1024 };

typedef struct {
    char lines[README_MAX_COMMANDS][README_LINE_MAX];
    int count;
    char fathom_set[256]; /* what the walk puts in FATHOM_SET */
} Commands;

/* Appends the command lines of the first ```sh block after the line `heading`, skipping
 * blank lines, comment lines and lines that hold `skip`. */
static void read_block(const char *readme, const char *heading, const char *skip,
                       Commands *commands)
{
    const char *at = strstr(readme, heading);
    cr_assert(at, "README.md has no '%s'", heading);
    at = strstr(at, "\n```sh\n");
    cr_assert(at, "README.md has no ```sh block after '%s'", heading);
    at += strlen("\n```sh\n");
    const char *end = strstr(at, "\n```");
    cr_assert(end, "the block after '%s' does not end", heading);
    while (at < end) {
        const char *newline = memchr(at, '\n', (size_t)(end - at));
        const size_t length = (size_t)((newline ? newline : end) - at);
        char line[README_LINE_MAX];
        cr_assert_lt(length, sizeof line, "a README line longer than %zu", sizeof line);
        memcpy(line, at, length);
        line[length] = '\0';
        at += length + 1;
        const char *text = line + strspn(line, " \t");
        if (!*text || *text == '#' || (skip && strstr(text, skip)))
            continue;
        cr_assert_lt(commands->count, README_MAX_COMMANDS);
        snprintf(commands->lines[commands->count++], README_LINE_MAX, "%s", text);
    }
}

static void read_readme_commands(Commands *commands)
{
    char path[512];
    snprintf(path, sizeof path, "%s/README.md", test_source_dir());
    FILE *file = fopen(path, "r");
    cr_assert(file, "cannot open %s", path);
    static char readme[1 << 17];
    const size_t length = fread(readme, 1, sizeof readme - 1, file);
    readme[length] = '\0';
    fclose(file);
    commands->count = 0;
    read_block(readme, "\n## Two commands\n", "launch/test.sh", commands);
    read_block(readme, "\n## Using it\n", NULL, commands);
    cr_assert_gt(commands->count, 2, "README.md lists only %d commands", commands->count);
    const char *set = strstr(strstr(readme, "\n## Using it\n"), "FATHOM_SET='");
    cr_assert(set, "README.md's Using it section names no FATHOM_SET='...'");
    set += strlen("FATHOM_SET='");
    const size_t quoted = strcspn(set, "'");
    cr_assert(set[quoted] == '\'' && quoted < sizeof commands->fathom_set);
    snprintf(commands->fathom_set, sizeof commands->fathom_set, "%.*s", (int)quoted, set);
}

/* A fresh tree in `tree`: links to the repository's tracked top-level entries, and build. */
static void make_fresh_tree(char *tree)
{
    test_make_temp_dir(tree, "readme");
    char binary[512], command[2048], output[4096];
    snprintf(binary, sizeof binary, "%s", test_fathom_binary());
    snprintf(command, sizeof command,
             "cd '%s' && for entry in $(git ls-files | cut -d/ -f1 | sort -u); do "
             "ln -s \"$PWD/$entry\" '%s/'\"$entry\" || exit 1; done && ln -s '%s' '%s/build'",
             test_source_dir(), tree, dirname(binary), tree);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
}

/* The README walk's set-up (launch/setup.sh) runs ninja in the build under test, linked into
 * the fresh tree: where that build is older than its sources, it would be rebuilt while the
 * suite's other tests run from it, which fail to start ("Could not spawn test instance",
 * "file too short"). So a build whose commit (fathom --version, from `git describe --always
 * --dirty`, launch/meson.build) is not the tree's stops the test here, saying so: the other
 * tests would be testing that older build too. */
static void expect_the_build_is_the_trees(void)
{
    char command[1024], built[512], tree_commit[128];
    snprintf(command, sizeof command, "'%s' --version | head -1", test_fathom_binary());
    cr_assert_eq(test_run_command(command, built, sizeof built), 0, "%s", built);
    snprintf(command, sizeof command, "git -C '%s' describe --always --dirty",
             test_source_dir());
    cr_assert_eq(test_run_command(command, tree_commit, sizeof tree_commit), 0, "%s",
                 tree_commit);
    built[strcspn(built, "\n")] = '\0';
    tree_commit[strcspn(tree_commit, "\n")] = '\0';
    char expected[160];
    snprintf(expected, sizeof expected, "(commit %s)", tree_commit);
    cr_assert(strstr(built, expected),
              "the build under test is not the tree's (%s against commit %s): run "
              "ninja -C build first, as launch/test.sh does; this walk's set-up would "
              "rebuild it while the suite's other tests run from it", built, tree_commit);
}

/* "... # resumes at 400": the step the line says it resumes at; 0 when it says none. */
static long resumes_at(const char *line)
{
    const char *comment = strchr(line, '#');
    const char *claim = comment ? strstr(comment, "resumes at ") : NULL;
    return claim ? strtol(claim + strlen("resumes at "), NULL, 10) : 0;
}

Test(readme, every_command_runs_as_written_on_a_fresh_clone, .timeout = 900)
{
    if (getenv("FATHOM_BINARY"))
        cr_skip_test("the build has moved from its sources (FATHOM_BINARY): launch/setup.sh "
                     "cannot rebuild it there");
    expect_the_build_is_the_trees();
    Commands commands;
    read_readme_commands(&commands);
    char tree[256];
    make_fresh_tree(tree);
    static char output[1 << 16];
    for (int i = 0; i < commands.count; i++) {
        const char *line = commands.lines[i];
        char script[400], command[1024];
        snprintf(script, sizeof script, "%s/.readme_command_%02d.sh", tree, i);
        char text[README_LINE_MAX + 2];
        snprintf(text, sizeof text, "%s\n", line);
        test_write_file(script, text);
        snprintf(command, sizeof command,
                 "cd '%s' && FATHOM_SET='%s' OMPI_ALLOW_RUN_AS_ROOT=1 "
                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 10 600 bash '%s'", tree,
                 commands.fathom_set, script);
        const int code = test_run_command(command, output, sizeof output);
        const size_t length = strlen(output);
        const char *tail = output + (length > 3000 ? length - 3000 : 0);
        cr_assert_eq(code, 0, "README command %d exited %d: %s\n...%s", i + 1, code, line,
                     tail);
        cr_assert_not(strstr(output, "fathom: error"), "README command %d: %s\n...%s", i + 1,
                      line, tail);
        const long step = resumes_at(line);
        if (step > 0) {
            char resumed[64];
            snprintf(resumed, sizeof resumed, "resumed at step %ld", step);
            cr_assert(strstr(output, resumed), "README command %d says it resumes at %ld: "
                      "%s\n...%s", i + 1, step, line, tail);
        }
    }
    test_remove_tree(tree);
}
