/* tests/test_docs.c — the repository's documentation stands alone.
 *
 * The code cites the design by section ("DESIGN 2.1", "DESIGN 3"): every such citation in
 * a tracked file must name a section that docs/design.md has ("## 2." or "### 2.1"), so a
 * reader can follow it. And every relative link of README.md and the docs/ pages must reach a
 * file of the repository.
 */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { DOCS_LIST_BYTES = 1 << 20, DOCS_PATH_MAX = 1024 };

/* The whole of a file of the source tree, NUL-terminated (the caller frees), or NULL. */
static char *docs_read(const char *relative)
{
    char path[DOCS_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", test_source_dir(), relative);
    FILE *file = fopen(path, "rb");
    if (!file)
        return NULL;
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    cr_assert_not_null(text);
    size_t got = fread(text, 1, (size_t)size, file);
    fclose(file);
    text[got] = '\0';
    return text;
}

/* 1 when docs/design.md has the section "## major." (minor < 0) or "### major.minor". */
static int design_has_section(const char *design, int major, int minor)
{
    char heading[32];
    if (minor < 0)
        snprintf(heading, sizeof heading, "\n## %d. ", major);
    else
        snprintf(heading, sizeof heading, "\n### %d.%d ", major, minor);
    return strstr(design, heading) != NULL;
}

/* The repository's tracked files, one a line, into `list` (DOCS_LIST_BYTES). */
static void docs_list_tracked(char *list)
{
    char command[DOCS_PATH_MAX + 64];
    snprintf(command, sizeof command, "git -C '%s' ls-files", test_source_dir());
    int code = test_run_command(command, list, DOCS_LIST_BYTES);
    cr_assert_eq(code, 0, "git ls-files failed in %s: %s", test_source_dir(), list);
}

/* Counts the citations "DESIGN n" / "DESIGN n.m" of `text`; each one docs/design.md lacks
 * is appended to `missing` as "file: DESIGN n.m". */
static int check_citations(const char *file, const char *text, const char *design,
                           char *missing, size_t capacity)
{
    int count = 0;
    for (const char *at = strstr(text, "DESIGN "); at; at = strstr(at + 1, "DESIGN ")) {
        const char *number = at + strlen("DESIGN ");
        if (!isdigit((unsigned char)*number))
            continue;
        char *end;
        int major = (int)strtol(number, &end, 10), minor = -1;
        if (*end == '.' && isdigit((unsigned char)end[1]))
            minor = (int)strtol(end + 1, NULL, 10);
        count++;
        if (!design_has_section(design, major, minor)) {
            char label[32];
            if (minor < 0)
                snprintf(label, sizeof label, "%d", major);
            else
                snprintf(label, sizeof label, "%d.%d", major, minor);
            size_t used = strlen(missing);
            snprintf(missing + used, capacity - used, "  %s: DESIGN %s\n", file, label);
        }
    }
    return count;
}

Test(docs, every_design_citation_names_a_section_of_docs_design_md)
{
    char *design = docs_read("docs/design.md");
    cr_assert_not_null(design, "docs/design.md is missing");
    char *list = malloc(DOCS_LIST_BYTES);
    cr_assert_not_null(list);
    docs_list_tracked(list);
    static char missing[1 << 16];
    missing[0] = '\0';
    int citations = 0, files = 0;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        char *text = docs_read(line);
        if (!text)
            continue; /* a tracked file removed from this work tree */
        int found = check_citations(line, text, design, missing, sizeof missing);
        citations += found;
        files += found > 0;
        free(text);
    }
    /* The tree cites the design hundreds of times; a count near zero means the scan broke. */
    cr_assert_gt(citations, 100, "only %d citations of the design found: the scan is wrong",
                 citations);
    cr_assert_str_empty(missing, "citations of sections docs/design.md does not have:\n%s",
                        missing);
    cr_log_info("%d citations in %d files, all found", citations, files);
    free(list);
    free(design);
}

/* The relative link targets "](target)" of a Markdown file that must exist, checked against
 * the file's own directory; the failures are appended to `missing`. Returns the count. */
static int check_links(const char *file, char *missing, size_t capacity)
{
    char *text = docs_read(file);
    cr_assert_not_null(text, "%s is missing", file);
    char directory[DOCS_PATH_MAX];
    snprintf(directory, sizeof directory, "%s", file);
    char *slash = strrchr(directory, '/');
    if (slash)
        slash[1] = '\0';
    else
        directory[0] = '\0';
    int count = 0;
    for (const char *at = strstr(text, "]("); at; at = strstr(at + 2, "](")) {
        const char *target = at + 2;
        size_t length = strcspn(target, ")# \n");
        if (length == 0 || strncmp(target, "http://", 7) == 0 ||
            strncmp(target, "https://", 8) == 0 || strncmp(target, "mailto:", 7) == 0)
            continue;
        char path[3 * DOCS_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s%.*s", test_source_dir(), directory, (int)length,
                 target);
        struct stat status;
        count++;
        if (stat(path, &status) != 0) {
            size_t used = strlen(missing);
            snprintf(missing + used, capacity - used, "  %s: %.*s\n", file, (int)length,
                     target);
        }
    }
    free(text);
    return count;
}

Test(docs, every_relative_link_of_the_documentation_reaches_a_file)
{
    const char *files[] = {
        "README.md",         "docs/design.md",      "docs/design-notes.md",
        "docs/reference.md", "docs/config.md",      "docs/performance.md",
        "docs/residual-comparison.md",
    };
    static char missing[1 << 14];
    missing[0] = '\0';
    int links = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        links += check_links(files[i], missing, sizeof missing);
    cr_assert_gt(links, 10, "only %d relative links found: the scan is wrong", links);
    cr_assert_str_empty(missing, "links to files that do not exist:\n%s", missing);
}
