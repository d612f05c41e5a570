/* tests/test_kernel_resources.c — launch/bench/kernel_resources.py compiles each .cu file of a
 * build's compile_commands.json again with ptxas verbose and reports every kernel's
 * registers, stack frame and spills. A made-up build of one file holds it to what ptxas
 * says: a kernel that writes a local array at run-time indices keeps it on the stack and is
 * flagged; a plain one is not; --against names what moved. Needs nvcc (skips without it).
 */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* local_array_kernel writes its array at indices known only at run time: the array lives
 * in local memory (ptxas: a 256-byte stack frame) */
static const char kernels[] =
    "__global__ void plain_kernel(float *out) { out[threadIdx.x] = 1.0f; }\n"
    "__global__ void local_array_kernel(float *out, const int *index)\n"
    "{\n"
    "    float a[64];\n"
    "    for (int k = 0; k < 64; k++)\n"
    "        a[index[k] & 63] = out[k * blockDim.x + threadIdx.x];\n"
    "    float sum = 0.0f;\n"
    "    for (int k = 0; k < 64; k++)\n"
    "        sum += a[k] * k;\n"
    "    out[threadIdx.x] = sum;\n"
    "}\n";

static void read_text(const char *path, char *text, size_t capacity)
{
    FILE *file = fopen(path, "r");
    cr_assert_not_null(file, "%s", path);
    const size_t n = fread(text, 1, capacity - 1, file);
    text[n] = '\0';
    fclose(file);
}

/* The tab-separated row of `kernel` (its demangled name, a plain function's) in `table`, or
 * NULL */
static const char *row_of(const char *table, const char *kernel)
{
    char needle[128];
    snprintf(needle, sizeof needle, "\t%s(", kernel);
    const char *at = strstr(table, needle);
    if (!at)
        return NULL;
    while (at > table && at[-1] != '\n')
        at--;
    return at;
}

/* registers and stack bytes of a row: file, mangled name, registers, stack, ... */
static void row_numbers(const char *row, int *registers, int *stack)
{
    const char *field = strchr(strchr(row, '\t') + 1, '\t') + 1;
    cr_assert_eq(sscanf(field, "%d\t%d", registers, stack), 2, "row: %.200s", row);
}

/* Runs the tool over the made-up build in `dir` with `options`; it must exit 0 */
static void run_tool(const char *dir, const char *options, char *output, size_t capacity)
{
    char command[1024];
    snprintf(command, sizeof command,
             "python3 '%s/launch/bench/kernel_resources.py' --build '%s' --jobs 1 %s 2>&1",
             test_source_dir(), dir, options);
    const int code = test_run_command(command, output, capacity);
    cr_assert_eq(code, 0, "kernel_resources.py %s failed:\n%s", options, output);
}

Test(kernel_resources, flags_a_kernel_with_a_stack_frame_and_names_what_moved, .timeout = 120)
{
    if (system("command -v nvcc >/dev/null 2>&1") != 0)
        cr_skip_test("no nvcc on PATH");
    char dir[256], path[400], output[8192];
    test_make_temp_dir(dir, "kernel-resources");
    snprintf(path, sizeof path, "%s/kernels.cu", dir);
    test_write_file(path, kernels);
    char json[1024];
    snprintf(json, sizeof json,
             "[{\"directory\": \"%s\", \"file\": \"kernels.cu\", \"output\": \"kernels.cu.o\",\n"
             "  \"command\": \"nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o kernels.cu.o "
             "-c kernels.cu\"}]\n",
             dir);
    snprintf(path, sizeof path, "%s/compile_commands.json", dir);
    test_write_file(path, json);
    char options[512];
    snprintf(options, sizeof options, "--out '%s/table.tsv'", dir);
    run_tool(dir, options, output, sizeof output);
    cr_expect(strstr(output, "2 kernels; 1 with a stack frame or spills"), "%s", output);
    cr_expect(strstr(output, "local_array_kernel"), "%s", output);
    cr_expect_null(strstr(output, "plain_kernel"), "%s", output);

    snprintf(path, sizeof path, "%s/table.tsv", dir);
    char table[4096];
    read_text(path, table, sizeof table);
    const char *plain = row_of(table, "plain_kernel"), *local = row_of(table, "local_array_kernel");
    cr_assert(plain && local, "%s", table);
    int plain_registers, plain_stack, local_registers, local_stack;
    row_numbers(plain, &plain_registers, &plain_stack);
    row_numbers(local, &local_registers, &local_stack);
    cr_expect_eq(plain_stack, 0);
    cr_expect_geq(local_stack, 256, "64 floats on the stack: %d bytes", local_stack);
    cr_expect(plain_registers > 0 && local_registers > 0);

    /* another tree's table where the plain kernel took 7 registers more */
    char before[4096];
    const size_t head = (size_t)(plain - table);
    const char *tab = strchr(strchr(plain, '\t') + 1, '\t') + 1, *rest = strchr(tab, '\t');
    snprintf(before, sizeof before, "%.*s%.*s%d%s", (int)head, table, (int)(tab - plain), plain,
             plain_registers + 7, rest);
    snprintf(path, sizeof path, "%s/before.tsv", dir);
    test_write_file(path, before);
    snprintf(options, sizeof options, "--against '%s'", path);
    run_tool(dir, options, output, sizeof output);
    char expected[128];
    snprintf(expected, sizeof expected, "registers %d -> %d  kernels.cu  plain_kernel(",
             plain_registers + 7, plain_registers);
    cr_expect(strstr(output, "1 kernels differ"), "%s", output);
    cr_expect(strstr(output, expected), "want '%s' in:\n%s", expected, output);
    test_remove_tree(dir);
}
