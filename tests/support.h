/* tests/support.h — small helpers shared by the Criterion tests.
 *
 * Random data comes from a fixed-seed generator local to the tests (independent of
 * runtime/rng), so a failing case can be replayed. Paths: FATHOM_SOURCE_DIR is the source
 * tree, FATHOM_BINARY the built `fathom` executable (both set by tests/meson.build).
 */
#ifndef FATHOM_TESTS_SUPPORT_H
#define FATHOM_TESTS_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/backend.h"
#include "runtime/config.h"

/* On the cpu backend an Activation array is a float array (runtime/backend.h): tests that
 * drive cpu ops and model internals directly pass their float arrays through these. */
#define AS_ACTIVATIONS(pointer) ((Activation *)(pointer))
#define AS_FLOATS(pointer) ((float *)(pointer))

/* Uniform in [-scale, scale), from a per-call seed. */
void test_fill_uniform(float *x, size_t n, float scale, uint64_t seed);
/* Standard normal times `scale`. */
void test_fill_normal(float *x, size_t n, float scale, uint64_t seed);
/* Poison: fills with NaN so an element the code under test never writes is caught. */
void test_fill_nan(float *x, size_t n);
/* A random integer in [low, high], from `seed`. */
int test_random_int(int low, int high, uint64_t seed);
/* n tokens in [0, vocab), token i from seed 1000 seed + i */
void test_fill_tokens(uint32_t *tokens, size_t n, int vocab, uint64_t seed);
/* The model tests' network: V 11, d 8, 2 layers, 4 query heads of 4 (q_dim 16 != d), 2 KV
 * heads, ffn 12 */
ModelConfig test_small_model_config(bool qk_norm, bool tie_embeddings);

/* ||a - b|| / ||b|| in double; NaN anywhere gives +inf. */
double test_relative_error(const float *a, const float *b, size_t n);
double test_relative_error_double(const float *a, const double *b, size_t n);
/* 1 when every element of a is finite. */
int test_all_finite(const float *a, size_t n);

/* 1 when the last forwards of two models (same batch shape) gave bitwise equal logits. */
typedef struct Model Model;
int test_logits_bitwise_equal(const Model *a, const Model *b);

/* Makes a fresh empty directory under /tmp and writes its path into `path` (>= 256 bytes). */
void test_make_temp_dir(char *path, const char *tag);
/* Removes a directory tree (rm -rf). */
void test_remove_tree(const char *path);
/* Writes `text` to `path`. */
void test_write_file(const char *path, const char *text);

/* The repository the tests read (fixtures): $FATHOM_SOURCE_DIR when set, else the source
 * tree this test binary was built from. */
const char *test_source_dir(void);
/* The fathom binary the tests run: $FATHOM_BINARY when set (a build tree moved to another
 * machine), else the one this test binary was built with. */
const char *test_fathom_binary(void);
/* Runs `test_fathom_binary() <arguments>` through the shell, captures stdout+stderr into `output`
 * (NUL-terminated, truncated to `capacity`), returns the exit code (-1 if it did not exit). */
int test_run_fathom(const char *arguments, char *output, size_t capacity);
/* Same, for any shell command. */
int test_run_command(const char *command, char *output, size_t capacity);
/* Everything this process writes to `fd` (STDOUT_FILENO or STDERR_FILENO) between
 * test_capture_begin and test_capture_end goes to a temporary file instead; _end restores
 * the descriptor and returns what was written (NUL-terminated, truncated to `capacity`).
 * For calls that print expected messages, so that the test asserts on them and a passing
 * suite prints nothing. */
typedef struct {
    int fd, saved, file;
} TestCapture;
void test_capture_begin(TestCapture *capture, int fd);
const char *test_capture_end(TestCapture *capture, char *out, size_t capacity);

/* Runs body(argument) in a forked child and asserts that it exits with `exit_code` after
 * writing to stderr one "fathom: error: " line that holds `fragment`. */
void test_expect_fatal(void (*body)(void *), void *argument, int exit_code,
                       const char *fragment);

/* Runs body(argument) in a forked child (fatal() there exits the child only); returns its
 * exit code (0 when body returns; -1 if it did not exit) and captures its stderr into
 * `errors` (NUL-terminated, truncated to `capacity`). */
int test_run_in_child(void (*body)(void *), void *argument, char *errors, size_t capacity);

#endif
