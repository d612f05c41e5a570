/* tests/test_matmul_table.c — the matmul algorithms table's file (runtime/matmul_table.h):
 * what `fathom tune` writes a run reads back as it was, and a malformed file is refused with
 * the line that is wrong. */
#include "runtime/matmul_table.h"
#include "runtime/error.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char header[] = "fathom-matmul-algorithms 1\n"
                             "cublaslt 130100\n"
                             "workspace 33554432\n"
                             "device 132 NVIDIA H200\n";

static const char words[] = "0000000000000015 ffffffffffffffff 0000000100000002 "
                            "0000000000000000 0000000000000000 0000000000000000 "
                            "0000000000000000 0000000000000000";

/* A table of two products, the second with every word's high bits set. */
static void two_products(MatmulTable *table)
{
    matmul_table_init(table);
    table->library_version = 130100;
    table->workspace_bytes = 33554432;
    table->multiprocessors = 132;
    snprintf(table->device, sizeof table->device, "NVIDIA H200 NVL");
    MatmulTableEntry *forward = matmul_table_add(table);
    *forward = (MatmulTableEntry){MATMUL_FORWARD, 4096, 4096, 4096, 256, 256, 256, 36,
                                  0.184, 0.178, {21, 7, 0, 0, 0, 0, 0, 1}};
    MatmulTableEntry *weights = matmul_table_add(table);
    *weights = (MatmulTableEntry){MATMUL_WEIGHT_GRADIENT, 8192, 1280, 128256, 256, 128, 16, 4,
                                  6.7, 6.125,
                                  {~0ull, 0x8000000000000000ull, 3, 4, 5, 6, 7, 8}};
}

static void expect_parse_error(const char *text, const char *named)
{
    MatmulTable table;
    matmul_table_init(&table);
    char error[512];
    cr_assert_not(matmul_table_parse(&table, text, error, sizeof error), "accepted:\n%s", text);
    cr_assert(strstr(error, named), "'%s' does not say '%s'", error, named);
    matmul_table_free(&table);
}

/* header + one product line */
static void expect_product_error(const char *product_line, const char *named)
{
    char text[1024];
    snprintf(text, sizeof text, "%s%s\n", header, product_line);
    expect_parse_error(text, named);
}

Test(matmul_table, what_is_written_reads_back_the_same)
{
    MatmulTable written, read;
    two_products(&written);
    char *text = matmul_table_format(&written);
    matmul_table_init(&read);
    char error[512];
    cr_assert(matmul_table_parse(&read, text, error, sizeof error), "%s\n%s", error, text);
    cr_assert_eq(read.library_version, written.library_version);
    cr_assert_eq(read.workspace_bytes, written.workspace_bytes);
    cr_assert_eq(read.multiprocessors, written.multiprocessors);
    cr_assert_str_eq(read.device, written.device);
    cr_assert_eq(read.count, 2);
    for (int i = 0; i < 2; i++) {
        const MatmulTableEntry *a = &written.entries[i], *b = &read.entries[i];
        cr_assert_eq(b->product, a->product);
        cr_assert(b->rows == a->rows && b->in_dim == a->in_dim && b->out_dim == a->out_dim);
        cr_assert(b->alignment_a == a->alignment_a && b->alignment_b == a->alignment_b &&
                  b->alignment_c == a->alignment_c);
        cr_assert_eq(b->calls, a->calls);
        cr_assert_float_eq(b->heuristic_ms, a->heuristic_ms, 1e-9);
        cr_assert_float_eq(b->tuned_ms, a->tuned_ms, 1e-9);
        cr_assert_arr_eq(b->algorithm, a->algorithm, sizeof a->algorithm, "entry %d", i);
    }
    free(text);
    matmul_table_free(&written);
    matmul_table_free(&read);
}

Test(matmul_table, a_product_is_found_by_its_shape_and_alignments_only)
{
    MatmulTable table;
    two_products(&table);
    MatmulTableEntry key = table.entries[1];
    key.calls = 99, key.tuned_ms = 1, key.algorithm[0] = 0; /* not part of the key */
    cr_assert_eq(matmul_table_find(&table, &key), &table.entries[1]);
    key.alignment_c = 32;
    cr_assert_null(matmul_table_find(&table, &key));
    key = table.entries[0];
    key.product = MATMUL_INPUT_GRADIENT;
    cr_assert_null(matmul_table_find(&table, &key));
    key = table.entries[0];
    key.rows = 4095;
    cr_assert_null(matmul_table_find(&table, &key));
    matmul_table_free(&table);
}

Test(matmul_table, comments_and_blank_lines_are_skipped)
{
    char text[1024];
    snprintf(text, sizeof text, "# tuned by hand\n\n%s# a comment\n   \nforward 64 64 64 256 256 "
             "256 1 0.01 0.01 %s\r\n", header, words);
    MatmulTable table;
    matmul_table_init(&table);
    char error[512];
    cr_assert(matmul_table_parse(&table, text, error, sizeof error), "%s", error);
    cr_assert_eq(table.count, 1);
    cr_assert_str_eq(table.device, "NVIDIA H200");
    cr_assert_eq(table.entries[0].algorithm[1], ~0ull);
    matmul_table_free(&table);
}

Test(matmul_table, another_file_or_version_is_refused)
{
    expect_parse_error("", "empty");
    expect_parse_error("\n# nothing\n", "line 2: empty");
    expect_parse_error("step 1000\n", "line 1: not a matmul algorithms table");
    expect_parse_error("fathom-matmul-algorithms 2\n", "version 2");
}

Test(matmul_table, a_missing_or_repeated_header_line_is_named)
{
    expect_parse_error("fathom-matmul-algorithms 1\ncublaslt 1\nworkspace 2\n", "ends without");
    expect_parse_error("fathom-matmul-algorithms 1\ncublaslt 1\nforward 1 1 1 256 256 256 1 "
                       "0 0 0 0 0 0 0 0 0 0\n", "line 3: a product before");
    expect_parse_error("fathom-matmul-algorithms 1\ncublaslt 1\ncublaslt 2\n",
                       "line 3: a second 'cublaslt'");
    expect_parse_error("fathom-matmul-algorithms 1\ngpu 7\n", "line 2: unknown line 'gpu'");
    expect_parse_error("fathom-matmul-algorithms 1\ndevice H200\n", "'device' takes");
    expect_parse_error("fathom-matmul-algorithms 1\nworkspace -1\n", "'workspace' takes");
}

Test(matmul_table, a_malformed_product_names_its_line_and_field)
{
    char line[512];
    snprintf(line, sizeof line, "backward 64 64 64 256 256 256 1 0.1 0.1 %s", words);
    expect_product_error(line, "line 5: unknown product 'backward'");
    expect_product_error("forward 64 64 64 256 256 256 1 0.1 0.1 15", "fields");
    snprintf(line, sizeof line, "forward 0 64 64 256 256 256 1 0.1 0.1 %s", words);
    expect_product_error(line, "rows '0' is not a positive integer");
    snprintf(line, sizeof line, "input_gradient 64 x 64 256 256 256 1 0.1 0.1 %s", words);
    expect_product_error(line, "in 'x'");
    snprintf(line, sizeof line, "forward 64 64 64 256 24 256 1 0.1 0.1 %s", words);
    expect_product_error(line, "align_b '24' is not a power of two");
    snprintf(line, sizeof line, "forward 64 64 64 256 256 512 1 0.1 0.1 %s", words);
    expect_product_error(line, "align_c '512'");
    snprintf(line, sizeof line, "forward 64 64 64 256 256 256 1 fast 0.1 %s", words);
    expect_product_error(line, "not milliseconds");
    expect_product_error("forward 64 64 64 256 256 256 1 0.1 0.1 0000000000000015 "
                         "fffffffffffffffg 0 0 0 0 0 0", "algorithm word 2");
    expect_product_error("forward 64 64 64 256 256 256 1 0.1 0.1 0000000000000015 "
                         "0000000000000000 15 0 0 0 0 0", "algorithm word 3 '15' is not 16");
    expect_product_error("forward 64 64 64 256 256 256 1 0.1 0.1 0x00000000000015 "
                         "0 0 0 0 0 0 0", "algorithm word 1 '0x00000000000015'");
    snprintf(line, sizeof line, "forward 64 64 64 256 256 256 1 0.1 0.1 %s 0 0 0 0", words);
    expect_product_error(line, "22 fields where a product has 18");
}

Test(matmul_table, a_product_given_twice_is_refused)
{
    char text[1024];
    snprintf(text, sizeof text, "%sweight_gradient 8 16 32 256 256 256 1 0.1 0.1 %s\n"
             "weight_gradient 8 16 32 256 256 256 2 0.2 0.2 %s\n", header, words, words);
    expect_parse_error(text, "line 6: a second line for the weight_gradient of rows 8, in 16, "
                       "out 32");
}

Test(matmul_table, a_written_file_is_read_back)
{
    char dir[256], path[512];
    test_make_temp_dir(dir, "matmul_table");
    snprintf(path, sizeof path, "%s/table.txt", dir);
    MatmulTable written, read;
    two_products(&written);
    matmul_table_write(&written, path);
    matmul_table_init(&read);
    matmul_table_read(&read, path);
    cr_assert_eq(read.count, written.count);
    cr_assert_arr_eq(read.entries[1].algorithm, written.entries[1].algorithm,
                     sizeof written.entries[1].algorithm);
    char temporary[600];
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    cr_assert_null(fopen(temporary, "r"), "the temporary file was left behind");
    matmul_table_free(&written);
    matmul_table_free(&read);
    test_remove_tree(dir);
}

static void read_missing_file(void *unused)
{
    (void)unused;
    MatmulTable table;
    matmul_table_init(&table);
    matmul_table_read(&table, "/nonexistent/matmul_algorithms.txt");
}

Test(matmul_table, a_missing_file_exits_2_naming_it)
{
    test_expect_fatal(read_missing_file, NULL, EXIT_CONFIG,
                      "cannot open /nonexistent/matmul_algorithms.txt (the matmul_algorithms "
                      "table, which fathom tune writes)");
}

static void write_into_missing_directory(void *unused)
{
    (void)unused;
    MatmulTable table;
    two_products(&table);
    matmul_table_write(&table, "/nonexistent/directory/table.txt");
}

Test(matmul_table, a_file_that_cannot_be_written_exits_2_naming_it)
{
    test_expect_fatal(write_into_missing_directory, NULL, EXIT_CONFIG,
                      "cannot write /nonexistent/directory/table.txt");
}
