/* tests/test_safetensors.c — checkpoints/safetensors: values read back exactly, and every
 * malformed file is exit 3 naming the file (and the tensor where there is one). */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoints/safetensors.h"
#include "runtime/error.h"
#include "support.h"

/* A .safetensors file: the 8-byte length of `header`, the header, then `data`. */
static void write_safetensors(const char *path, const char *header, const void *data,
                              size_t data_bytes)
{
    FILE *file = fopen(path, "wb");
    cr_assert_not_null(file, "cannot create %s", path);
    uint64_t length = strlen(header);
    fwrite(&length, 8, 1, file);
    fwrite(header, 1, length, file);
    if (data_bytes)
        fwrite(data, 1, data_bytes, file);
    fclose(file);
}

/* Opens a file and reads every tensor, in a child process (fatal() ends only the child). */
static void open_and_read_all(void *argument)
{
    SafetensorsModel model;
    safetensors_open_file(&model, argument);
    for (int i = 0; i < model.n_tensors; i++) {
        float *values = malloc((size_t)(model.tensors[i].elements + 1) * sizeof(float));
        safetensors_read(&model, &model.tensors[i], values);
        free(values);
    }
    safetensors_close(&model);
}

static void open_directory(void *argument)
{
    SafetensorsModel model;
    safetensors_open(&model, argument);
    safetensors_close(&model);
}

Test(safetensors, bf16_f16_and_f32_tensors_read_back_as_their_fp32_values)
{
    char dir[256], path[300];
    test_make_temp_dir(dir, "safetensors-values");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    /* a [2, 3] fp32, a [4] bf16 and a [3] fp16, back to back */
    const float f32[6] = {1.5f, -2.25f, 0.0f, 3.0e-20f, 65504.0f, -0.1f};
    const uint16_t bf16[4] = {0x3FC0, 0xC010, 0x7F80, 0x0001}; /* 1.5, -2.25, inf, tiny */
    const uint16_t f16[3] = {0x3E00, 0xC080, 0x0001};           /* 1.5, -2.25, 2^-24 */
    unsigned char data[24 + 8 + 6];
    memcpy(data, f32, 24);
    memcpy(data + 24, bf16, 8);
    memcpy(data + 32, f16, 6);
    write_safetensors(path,
                      "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[32,38]}}",
                      data, sizeof data);
    SafetensorsModel model;
    safetensors_open(&model, dir);
    cr_assert_eq(model.n_tensors, 3);
    float values[6];
    const SafetensorsTensor *a = safetensors_find(&model, "a");
    cr_assert(a && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    safetensors_read(&model, a, values);
    cr_assert_eq(memcmp(values, f32, sizeof f32), 0);
    safetensors_read(&model, safetensors_find(&model, "b"), values);
    cr_assert(values[0] == 1.5f && values[1] == -2.25f && isinf(values[2]));
    cr_assert_eq(values[3], 0x1p-133f); /* bf16 0x0001: the smallest fp32 subnormal * 2^16 */
    safetensors_read(&model, safetensors_find(&model, "c"), values);
    cr_assert(values[0] == 1.5f && values[1] == -2.25f && values[2] == 0x1p-24f);
    cr_assert_null(safetensors_find(&model, "__metadata__"));
    safetensors_close(&model);
    test_remove_tree(dir);
}

/* IEEE binary16 by its definition, for every one of the 65536 patterns. */
Test(safetensors, every_half_precision_pattern_widens_to_its_exact_value)
{
    for (uint32_t bits = 0; bits < 65536; bits++) {
        int sign = bits >> 15, exponent = (bits >> 10) & 31, mantissa = bits & 1023;
        float got = safetensors_half_to_float((uint16_t)bits);
        if (exponent == 31) {
            cr_assert(mantissa ? isnan(got) : isinf(got), "pattern %04x", bits);
            cr_assert_eq(signbit(got) != 0, sign, "pattern %04x", bits);
            continue;
        }
        double magnitude = exponent ? ldexp(1024 + mantissa, exponent - 25)
                                    : ldexp(mantissa, -24);
        double expected = sign ? -magnitude : magnitude;
        cr_assert_eq((double)got, expected, "pattern %04x: %a, expected %a", bits, got, expected);
        cr_assert_eq(signbit(got) != 0, sign, "pattern %04x", bits);
    }
}

Test(safetensors, every_bf16_pattern_is_the_top_half_of_its_fp32)
{
    for (uint32_t bits = 0; bits < 65536; bits++) {
        float got = safetensors_bf16_to_float((uint16_t)bits);
        uint32_t got_bits;
        memcpy(&got_bits, &got, 4);
        cr_assert_eq(got_bits, bits << 16, "pattern %04x", bits);
    }
}

typedef struct {
    const char *what, *header, *message;
    size_t data_bytes;
} Malformed;

Test(safetensors, each_malformed_header_is_exit_3_naming_the_file_and_tensor)
{
    static const Malformed cases[] = {
        {"not JSON", "{\"w\":{\"dtype\":\"F32\",", "not valid JSON", 0},
        {"a JSON array", "[1,2]", "not an object", 0},
        {"an unknown dtype", "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         "tensor w has an unknown dtype", 4},
        {"offsets past the data",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "tensor w", 8},
        {"offsets that disagree with the shape",
         "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,4]}}", "tensor w", 8},
        {"a negative dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
         "tensor w", 4},
        {"begin after end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",
         "tensor w", 4},
        {"no data_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", "tensor w", 4},
        {"an entry that is no object", "{\"w\":7}", "tensor w", 0},
        {"a shape that is no array",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", "tensor w", 4},
        {"a fractional offset",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", "tensor w", 4},
        {"a dtype fathom does not convert",
         "{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
         "tensor w is I64", 8},
        {"a metadata that is no object", "{\"__metadata__\":[]}", "__metadata__", 0},
    };
    char dir[256], path[300], errors[2048];
    test_make_temp_dir(dir, "safetensors-malformed");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const unsigned char zeros[16] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_safetensors(path, cases[i].header, zeros, cases[i].data_bytes);
        int code = test_run_in_child(open_and_read_all, path, errors, sizeof errors);
        cr_expect_eq(code, EXIT_DATA, "%s: exit %d (%s)", cases[i].what, code, errors);
        cr_expect(strstr(errors, path) != NULL, "%s: the message does not name the file: %s",
                  cases[i].what, errors);
        cr_expect(strstr(errors, cases[i].message) != NULL, "%s: expected '%s' in: %s",
                  cases[i].what, cases[i].message, errors);
    }
    test_remove_tree(dir);
}

Test(safetensors, a_file_cut_short_is_exit_3_saying_truncated)
{
    char dir[256], path[300], errors[2048];
    test_make_temp_dir(dir, "safetensors-short");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    /* a header length that claims more than the file holds */
    FILE *file = fopen(path, "wb");
    uint64_t length = 4096;
    fwrite(&length, 8, 1, file);
    fputs("{}", file);
    fclose(file);
    int code = test_run_in_child(open_and_read_all, path, errors, sizeof errors);
    cr_assert_eq(code, EXIT_DATA, "%s", errors);
    cr_assert(strstr(errors, path) && strstr(errors, "truncated"), "%s", errors);
    /* fewer than the 8 bytes of the length */
    file = fopen(path, "wb");
    fputs("{}", file);
    fclose(file);
    code = test_run_in_child(open_and_read_all, path, errors, sizeof errors);
    cr_assert_eq(code, EXIT_DATA, "%s", errors);
    cr_assert(strstr(errors, path) && strstr(errors, "truncated"), "%s", errors);
    test_remove_tree(dir);
}

Test(safetensors, an_index_takes_each_tensor_from_the_file_its_weight_map_names)
{
    char dir[256], path[300], errors[2048];
    test_make_temp_dir(dir, "safetensors-index");
    /* a.safetensors holds x and a decoy y; the map takes y from b.safetensors */
    const float a_values[4] = {1, 2, 5, 6}, b_values[2] = {3, 4};
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    write_safetensors(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                      a_values, 16);
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    write_safetensors(path, "{\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                      b_values, 8);
    snprintf(path, sizeof path, "%s/%s", dir, SAFETENSORS_INDEX_FILE);
    test_write_file(path, "{\"metadata\":{},\"weight_map\":{\"x\":\"a.safetensors\","
                          "\"y\":\"b.safetensors\"}}");
    SafetensorsModel model;
    safetensors_open(&model, dir);
    cr_assert_eq(model.n_files, 2);
    cr_assert_eq(model.n_tensors, 2); /* a's own "y" is not the one the map names */
    float values[2];
    safetensors_read(&model, safetensors_find(&model, "x"), values);
    cr_assert(values[0] == 1 && values[1] == 2, "x came from the wrong file");
    safetensors_read(&model, safetensors_find(&model, "y"), values);
    cr_assert(values[0] == 3 && values[1] == 4, "y came from the wrong file");
    safetensors_close(&model);

    /* a map that names a file without the tensor, a path outside, a missing file */
    static const char *const maps[][2] = {
        {"{\"weight_map\":{\"x\":\"b.safetensors\"}}", "tensor x"},
        {"{\"weight_map\":{\"x\":\"../a.safetensors\"}}", "x"},
        {"{\"weight_map\":{\"x\":\"c.safetensors\"}}", "c.safetensors"},
        {"{\"weight_map\":[]}", "weight_map"},
    };
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
        test_write_file(path, maps[i][0]);
        int code = test_run_in_child(open_directory, dir, errors, sizeof errors);
        cr_expect_eq(code, EXIT_DATA, "map %zu: exit %d: %s", i, code, errors);
        cr_expect(strstr(errors, maps[i][1]) != NULL, "map %zu: %s", i, errors);
    }
    test_remove_tree(dir);
}

Test(safetensors, a_directory_without_safetensors_is_exit_3_naming_it)
{
    char dir[256], errors[2048];
    test_make_temp_dir(dir, "safetensors-empty");
    int code = test_run_in_child(open_directory, dir, errors, sizeof errors);
    cr_assert_eq(code, EXIT_DATA, "%s", errors);
    cr_assert(strstr(errors, dir) && strstr(errors, "model.safetensors"), "%s", errors);
    test_remove_tree(dir);
}

/* fatal() inside the fuzz loop comes back here instead of ending the test process (a fork
 * per trial costs more than the whole loop). */
static jmp_buf fuzz_return;
static int fuzz_exit_code;

static void fuzz_abort(int exit_code)
{
    fuzz_exit_code = exit_code;
    longjmp(fuzz_return, 1);
}

/* 0 when the file opens and every tensor reads, else fatal()'s exit code. The model is
 * static so that the descriptor of an open cut short by fatal() can still be closed. */
static int open_and_read_all_in_process(const char *path)
{
    static SafetensorsModel model;
    static float values[64];
    memset(&model, 0, sizeof model);
    fuzz_exit_code = 0;
    error_set_abort(fuzz_abort);
    if (setjmp(fuzz_return) == 0) {
        safetensors_open_file(&model, path);
        for (int i = 0; i < model.n_tensors; i++)
            if (model.tensors[i].elements <= 64)
                safetensors_read(&model, &model.tensors[i], values);
        safetensors_close(&model);
    } else if (model.descriptors && model.descriptors[0] >= 0) {
        close(model.descriptors[0]);
    }
    error_set_abort(NULL);
    return fuzz_exit_code;
}

/* Damage anywhere in the length or the header: the reader exits 0 or 3, never crashes. */
Test(safetensors, random_damage_to_the_header_is_exit_0_or_3_never_a_crash)
{
    char dir[256], path[300];
    test_make_temp_dir(dir, "safetensors-fuzz");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *header = "{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                         "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]}}";
    const size_t header_bytes = strlen(header), file_bytes = 8 + header_bytes + 24;
    unsigned char *valid = calloc(1, file_bytes), *damaged = malloc(file_bytes);
    uint64_t length = header_bytes;
    memcpy(valid, &length, 8);
    memcpy(valid + 8, header, header_bytes);
    int exits[256] = {0};
    int saved_stderr = dup(STDERR_FILENO), quiet = open("/dev/null", O_WRONLY);
    dup2(quiet, STDERR_FILENO); /* a few hundred expected messages */
    for (int trial = 0; trial < 600; trial++) {
        memcpy(damaged, valid, file_bytes);
        size_t keep = file_bytes;
        int kind = test_random_int(0, 2, 1000 + trial);
        size_t at = (size_t)test_random_int(0, (int)(8 + header_bytes - 1), 2000 + trial);
        if (kind == 0) /* one byte replaced */
            damaged[at] = (unsigned char)test_random_int(0, 255, 3000 + trial);
        else if (kind == 1) /* one bit flipped */
            damaged[at] ^= (unsigned char)(1u << test_random_int(0, 7, 4000 + trial));
        else /* cut short */
            keep = at;
        FILE *file = fopen(path, "wb");
        fwrite(damaged, 1, keep, file);
        fclose(file);
        int code = open_and_read_all_in_process(path);
        if (code != 0 && code != EXIT_DATA) {
            dup2(saved_stderr, STDERR_FILENO);
            cr_assert_fail("trial %d (kind %d at byte %zu): exit %d", trial, kind, at, code);
        }
        exits[code]++;
    }
    dup2(saved_stderr, STDERR_FILENO);
    close(quiet);
    close(saved_stderr);
    cr_assert_gt(exits[EXIT_DATA], 0);
    cr_assert_gt(exits[0], 0); /* some damage (a digit of a name) leaves a valid file */
    free(valid);
    free(damaged);
    test_remove_tree(dir);
}
