/* tests/test_cuda_matmul_tune.c — the matrix products' algorithms chosen ahead of a run
 * (kernels/cuda/matmul_tune_cuda.cu, matmul_cuda.cu; runtime/matmul_table.h): tuning times
 * every product run so far, and a table, once used, runs every product it holds with the
 * cpu's results and the same bits twice; `fathom train` takes what `fathom tune` wrote, and
 * refuses an algorithm that does not run. Each test SKIPs without a GPU; each runs in a
 * process of its own, so its plans start empty.
 */
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/cuda_module.h"
#include "kernels/cuda/kernels_cuda.h"
#include "runtime/error.h"
#include "runtime/matmul_table.h"
#include "tests/gpu_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BF16_TOLERANCE 1e-2
#define FP32_TOLERANCE 1e-5

/* rows x in x out: not tile multiples, and a larger one */
static const int shapes[][3] = {{333, 200, 96}, {256, 512, 384}};
enum { SHAPES = sizeof shapes / sizeof shapes[0], PRODUCTS = 3 * SHAPES };

/* Where each operand starts past a 256-byte aligned allocation: the alignment a plan's key
 * holds (kernels/cuda/matmul_internal.h), so the tuner's buffers must be carved to match. */
typedef struct {
    size_t in, weight, dout, out, din, dweight;
} Offsets;

static const Offsets aligned_operands = {0, 0, 0, 0, 0, 0};
static const Offsets offset_operands = {2, 16, 128, 2, 64, 16};

/* n values at `offset` bytes into a poisoned device allocation (freed by gpu_free_all) */
static void *device_at(size_t n, size_t element_bytes, size_t offset)
{
    const size_t extra = offset / element_bytes + 1;
    char *base = element_bytes == sizeof(float) ? (char *)gpu_poisoned_floats(n + extra)
                                                : (char *)gpu_poisoned_bf16(n + extra);
    return base + offset;
}

static bf16 *upload_bf16_at(const float *host, size_t n, size_t offset)
{
    bf16 *at = device_at(n, sizeof(bf16), offset);
    bf16 *staged = malloc(n * sizeof *staged);
    bf16_from_floats(staged, host, n);
    CUDA_CHECK(cudaMemcpy(at, staged, n * sizeof *staged, cudaMemcpyHostToDevice));
    free(staged);
    return at;
}

/* Every product of every shape on fresh operands at `offsets`: the forward, and the backward
 * writing din and dweight, each held to the cpu. */
static void products_run_and_check(uint64_t seed, const Offsets *offsets)
{
    for (int s = 0; s < SHAPES; s++) {
        const int rows = shapes[s][0], in_dim = shapes[s][1], out_dim = shapes[s][2];
        const size_t in_count = (size_t)rows * in_dim, out_count = (size_t)rows * out_dim,
                     weight_count = (size_t)out_dim * in_dim;
        float *in = gpu_test_bf16_values(in_count, 1, seed + 10 * s);
        float *weight = gpu_test_bf16_values(weight_count, 1, seed + 10 * s + 1);
        float *dout = gpu_test_bf16_values(out_count, 1, seed + 10 * s + 2);
        bf16 *device_in = upload_bf16_at(in, in_count, offsets->in);
        bf16 *device_weight = upload_bf16_at(weight, weight_count, offsets->weight);
        bf16 *device_dout = upload_bf16_at(dout, out_count, offsets->dout);

        float *want_out = gpu_test_host_floats(out_count);
        cpu_matmul_forward(want_out, in, weight, rows, in_dim, out_dim);
        bf16 *out = device_at(out_count, sizeof(bf16), offsets->out);
        cuda_matmul_forward(out, device_in, device_weight, rows, in_dim, out_dim, 0);
        float *got_out = gpu_download_bf16(out, out_count);
        gpu_expect_close(got_out, want_out, out_count, BF16_TOLERANCE, "forward");

        float *want_din = gpu_test_host_floats(in_count);
        float *want_dweight = gpu_test_host_floats(weight_count);
        cpu_matmul_backward(want_din, GRAD_WRITE, want_dweight, GRAD_WRITE, dout, in, weight,
                            rows, in_dim, out_dim);
        bf16 *din = device_at(in_count, sizeof(bf16), offsets->din);
        float *dweight = device_at(weight_count, sizeof(float), offsets->dweight);
        cuda_matmul_backward(din, GRAD_WRITE, dweight, GRAD_WRITE, device_dout, device_in,
                             device_weight, rows, in_dim, out_dim, 0);
        float *got_din = gpu_download_bf16(din, in_count);
        float *got_dweight = gpu_download_floats(dweight, weight_count);
        gpu_expect_close(got_din, want_din, in_count, BF16_TOLERANCE, "din");
        gpu_expect_close(got_dweight, want_dweight, weight_count, FP32_TOLERANCE, "dweight");

        free(in), free(weight), free(dout), free(want_out), free(got_out);
        free(want_din), free(want_dweight), free(got_din), free(got_dweight);
        gpu_free_all();
    }
}

static void tune_every_product(MatmulTable *table, const Offsets *offsets)
{
    products_run_and_check(100, offsets);
    matmul_table_init(table);
    cuda_matmul_tune(table, 4, 3);
}

Test(cuda_matmul_tune, every_product_run_gets_an_entry)
{
    gpu_require();
    MatmulTable table;
    tune_every_product(&table, &aligned_operands);
    cr_assert_eq(table.count, PRODUCTS, "%d entries for %d products", table.count, PRODUCTS);
    cr_assert_gt(table.library_version, 0);
    cr_assert_gt(table.multiprocessors, 0);
    cr_assert_neq(table.device[0], '\0');
    for (int s = 0; s < SHAPES; s++)
        for (int p = 0; p < 3; p++) {
            /* cudaMalloc's buffers: every operand 256-byte aligned */
            MatmulTableEntry key;
            memset(&key, 0, sizeof key);
            key.product = (MatmulProduct)p;
            key.rows = shapes[s][0], key.in_dim = shapes[s][1], key.out_dim = shapes[s][2];
            key.alignment_a = key.alignment_b = key.alignment_c = 256;
            const MatmulTableEntry *entry = matmul_table_find(&table, &key);
            cr_assert_not_null(entry, "no entry for the %s of %dx%dx%d",
                               matmul_product_name(key.product), key.rows, key.in_dim,
                               key.out_dim);
            cr_assert_eq(entry->calls, 1);
            cr_assert(entry->heuristic_ms > 0 && isfinite(entry->heuristic_ms) &&
                          entry->tuned_ms > 0 && isfinite(entry->tuned_ms),
                      "times %g and %g ms", entry->heuristic_ms, entry->tuned_ms);
        }
    matmul_table_free(&table);
}

Test(cuda_matmul_tune, a_table_read_back_runs_every_product_it_holds)
{
    gpu_require();
    MatmulTable tuned, read;
    tune_every_product(&tuned, &aligned_operands);
    char *text = matmul_table_format(&tuned);
    matmul_table_init(&read);
    char error[512];
    cr_assert(matmul_table_parse(&read, text, error, sizeof error), "%s", error);
    char why[512];
    cr_assert_eq(cuda_matmul_table_use(&read, why, sizeof why), 0, "%s", why);
    int from_table, from_heuristic;
    cuda_matmul_table_counts(&from_table, &from_heuristic);
    cr_assert_eq(from_table + from_heuristic, 0, "the plans of the heuristic were kept");
    products_run_and_check(200, &aligned_operands);
    cuda_matmul_table_counts(&from_table, &from_heuristic);
    cr_assert_eq(from_table, PRODUCTS);
    cr_assert_eq(from_heuristic, 0);
    free(text);
    matmul_table_free(&tuned);
    matmul_table_free(&read);
}

/* Operands 2 to 128 bytes past an alignment of 256: the tuner times each plan at its own
 * alignments, and a table made so holds and runs them. */
Test(cuda_matmul_tune, operands_of_any_alignment_are_tuned_and_run_from_the_table)
{
    gpu_require();
    MatmulTable table;
    tune_every_product(&table, &offset_operands);
    cr_assert_eq(table.count, PRODUCTS);
    MatmulTableEntry key;
    memset(&key, 0, sizeof key);
    key.product = MATMUL_WEIGHT_GRADIENT; /* in, dout -> dweight */
    key.rows = shapes[1][0], key.in_dim = shapes[1][1], key.out_dim = shapes[1][2];
    key.alignment_a = 2, key.alignment_b = 128, key.alignment_c = 16;
    cr_assert_not_null(matmul_table_find(&table, &key), "no entry at alignments 2, 128, 16");
    char why[512];
    cr_assert_eq(cuda_matmul_table_use(&table, why, sizeof why), 0, "%s", why);
    products_run_and_check(400, &offset_operands);
    int from_table, from_heuristic;
    cuda_matmul_table_counts(&from_table, &from_heuristic);
    cr_assert_eq(from_table, PRODUCTS);
    cr_assert_eq(from_heuristic, 0);
    matmul_table_free(&table);
}

/* The table's algorithm gives the same bits on a second run (the tune checked the one it
 * chose; this checks what a run reads back). */
Test(cuda_matmul_tune, a_table_product_repeats_its_bits)
{
    gpu_require();
    MatmulTable table;
    tune_every_product(&table, &aligned_operands);
    char why[512];
    cr_assert_eq(cuda_matmul_table_use(&table, why, sizeof why), 0, "%s", why);
    const int rows = shapes[1][0], in_dim = shapes[1][1], out_dim = shapes[1][2];
    float *in = gpu_test_bf16_values((size_t)rows * in_dim, 1, 7);
    float *dout = gpu_test_bf16_values((size_t)rows * out_dim, 1, 8);
    float *weight = gpu_test_bf16_values((size_t)out_dim * in_dim, 1, 9);
    bf16 *device_in = gpu_upload_bf16(in, (size_t)rows * in_dim);
    bf16 *device_dout = gpu_upload_bf16(dout, (size_t)rows * out_dim);
    bf16 *device_weight = gpu_upload_bf16(weight, (size_t)out_dim * in_dim);
    float *dweight[2];
    for (int run = 0; run < 2; run++) {
        float *device_dweight = gpu_poisoned_floats((size_t)out_dim * in_dim);
        cuda_matmul_backward(NULL, GRAD_WRITE, device_dweight, GRAD_WRITE, device_dout,
                             device_in, device_weight, rows, in_dim, out_dim, 0);
        dweight[run] = gpu_download_floats(device_dweight, (size_t)out_dim * in_dim);
    }
    cr_assert_arr_eq(dweight[0], dweight[1], (size_t)out_dim * in_dim * sizeof(float));
    free(in), free(dout), free(weight), free(dweight[0]), free(dweight[1]);
    gpu_free_all();
    matmul_table_free(&table);
}

Test(cuda_matmul_tune, a_table_of_another_library_is_refused)
{
    gpu_require();
    MatmulTable table;
    tune_every_product(&table, &aligned_operands);
    table.library_version += 1;
    char why[512];
    cr_assert_eq(cuda_matmul_table_use(&table, why, sizeof why), -1);
    cr_assert(strstr(why, "tuned with cuBLASLt"), "%s", why);
    matmul_table_free(&table);
}

/* ---- through the binary: fathom tune writes a table, fathom train takes it ---- */

static char output[1 << 16];

/* the tiny config at head_dim 64, which the cuda attention takes */
static const char *const CUDA_TINY =
    "--set device=cuda --set model.d_model=128 --set model.n_heads=2 "
    "--set model.n_kv_heads=1 --set model.head_dim=64 --set model.ffn_dim=256 "
    "--set train.seq_len=64 --set train.microbatch_size=2 --set train.global_batch_size=4 "
    "--set train.steps=2 --set eval.every=0";

/* `fathom tune` of the tiny config into dir/table.txt */
static void tune_tiny(const char *dir)
{
    char command[1024];
    tiny_config_write(dir, "");
    snprintf(command, sizeof command, "tune %s/config.yaml %s --out %s/table.txt "
             "--candidates 4 --repeats 3", dir, CUDA_TINY, dir);
    cr_assert_eq(test_run_fathom(command, output, sizeof output), 0, "%s", output);
    cr_assert(strstr(output, "fathom tune: wrote"), "%s", output);
}

Test(cuda_matmul_tune, fathom_train_takes_every_product_from_the_table_fathom_tune_wrote,
     .timeout = 180)
{
    gpu_require();
    char dir[256], arguments[1024];
    test_make_temp_dir(dir, "cuda_tune");
    tune_tiny(dir);
    snprintf(arguments, sizeof arguments, "%s --set matmul_algorithms=%s/table.txt", CUDA_TINY,
             dir);
    cr_assert_eq(tiny_train(dir, arguments, output, sizeof output), 0, "%s", output);
    cr_assert(strstr(output, "matmul products: ") && strstr(output, ", 0 by cuBLASLt's"),
              "a product of the step was not in the table:\n%s", output);
    /* the checkpoint's config names the table; eval takes the heuristic's, table or not */
    char path[512], command[1024];
    snprintf(path, sizeof path, "%s/table.txt", dir);
    cr_assert_eq(remove(path), 0);
    snprintf(command, sizeof command, "eval --checkpoint %s/run --weights raw --samples 4", dir);
    cr_assert_eq(test_run_fathom(command, output, sizeof output), 0, "%s", output);
    test_remove_tree(dir);
}

/* An entry whose algorithm cuBLASLt does not take: a config error when its product runs, not
 * a silent fallback to the heuristic. */
Test(cuda_matmul_tune, an_algorithm_that_does_not_run_exits_2_naming_the_product,
     .timeout = 120)
{
    gpu_require();
    char dir[256], path[512], arguments[1024];
    test_make_temp_dir(dir, "cuda_tune");
    tune_tiny(dir);
    snprintf(path, sizeof path, "%s/table.txt", dir);
    MatmulTable table;
    matmul_table_init(&table);
    matmul_table_read(&table, path);
    /* every bit of the opaque algorithm set: no id, tile or stage count has all its bits set.
     * The first word alone was not enough: with it set, cuBLASLt 13.1 on an H200 still took
     * the algorithm and ran it. */
    for (int i = 0; i < table.count; i++)
        for (int word = 0; word < MATMUL_ALGORITHM_WORDS; word++)
            table.entries[i].algorithm[word] = ~0ull;
    matmul_table_write(&table, path);
    matmul_table_free(&table);
    snprintf(arguments, sizeof arguments, "%s --set matmul_algorithms=%s", CUDA_TINY, path);
    cr_assert_eq(tiny_train(dir, arguments, output, sizeof output), 2, "%s", output);
    cr_assert(strstr(output, "does not run on this device and library: run fathom tune again"),
              "%s", output);
    test_remove_tree(dir);
}
