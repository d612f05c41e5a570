/* tests/support.c — see support.h. */
#include "tests/support.h"

#include "model/model.h"
#include "runtime/error.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *state)
{
    return (double)(splitmix64(state) >> 11) * 0x1.0p-53;
}

void test_fill_uniform(float *x, size_t n, float scale, uint64_t seed)
{
    uint64_t state = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((2.0 * uniform01(&state) - 1.0) * scale);
}

void test_fill_normal(float *x, size_t n, float scale, uint64_t seed)
{
    uint64_t state = seed;
    for (size_t i = 0; i < n; i++) {
        double u1 = uniform01(&state), u2 = uniform01(&state);
        if (u1 < 1e-300)
            u1 = 1e-300;
        x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2) * scale);
    }
}

void test_fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

int test_random_int(int low, int high, uint64_t seed)
{
    uint64_t state = seed;
    return low + (int)(splitmix64(&state) % (uint64_t)(high - low + 1));
}

double test_relative_error(const float *a, const float *b, size_t n)
{
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = (double)a[i] - (double)b[i];
        diff += d * d;
        ref += (double)b[i] * (double)b[i];
    }
    if (ref == 0)
        return diff == 0 ? 0 : INFINITY;
    return sqrt(diff / ref);
}

double test_relative_error_double(const float *a, const double *b, size_t n)
{
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = (double)a[i] - b[i];
        diff += d * d;
        ref += b[i] * b[i];
    }
    if (ref == 0)
        return diff == 0 ? 0 : INFINITY;
    return sqrt(diff / ref);
}

int test_all_finite(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]))
            return 0;
    return 1;
}

void test_make_temp_dir(char *path, const char *tag)
{
    snprintf(path, 256, "/tmp/fathom-test-%s-XXXXXX", tag);
    cr_assert_not_null(mkdtemp(path), "mkdtemp failed for %s", path);
}

void test_remove_tree(const char *path)
{
    char command[512];
    snprintf(command, sizeof command, "rm -rf '%s'", path);
    if (system(command) != 0)
        fprintf(stderr, "could not remove %s\n", path);
}

void test_write_file(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    cr_assert_not_null(file, "cannot write %s", path);
    fputs(text, file);
    fclose(file);
}

int test_run_command(const char *command, char *output, size_t capacity)
{
    char *full = malloc(strlen(command) + 16);
    sprintf(full, "(%s) 2>&1", command);
    FILE *pipe = popen(full, "r");
    free(full);
    cr_assert_not_null(pipe, "popen failed for %s", command);
    size_t used = 0;
    char sink[4096];
    for (;;) {
        char *target = (output && used + 1 < capacity) ? output + used : sink;
        size_t room = (output && used + 1 < capacity) ? capacity - used - 1 : sizeof sink;
        size_t got = fread(target, 1, room, pipe);
        if (got == 0)
            break;
        if (target != sink)
            used += got;
    }
    if (output && capacity)
        output[used] = '\0';
    int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const char *test_source_dir(void)
{
    const char *moved = getenv("FATHOM_SOURCE_DIR");
    return moved && *moved ? moved : FATHOM_SOURCE_DIR;
}

const char *test_fathom_binary(void)
{
    const char *moved = getenv("FATHOM_BINARY");
    return moved && *moved ? moved : FATHOM_BINARY;
}

int test_run_fathom(const char *arguments, char *output, size_t capacity)
{
    char command[4096];
    snprintf(command, sizeof command, "'%s' %s", test_fathom_binary(), arguments);
    return test_run_command(command, output, capacity);
}

int test_run_in_child(void (*body)(void *), void *argument, char *errors, size_t capacity)
{
    char path[] = "/tmp/fathom-test-stderr-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp failed for %s", path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork failed");
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        body(argument);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    ssize_t got = pread(fd, errors, capacity - 1, 0);
    errors[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(path);
    if (WIFSIGNALED(status))
        fprintf(stderr, "child killed by signal %d\n", WTERMSIG(status));
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void test_capture_begin(TestCapture *capture, int fd)
{
    char path[] = "/tmp/fathom-test-capture-XXXXXX";
    fflush(stdout);
    fflush(stderr);
    capture->fd = fd;
    capture->file = mkstemp(path);
    cr_assert(capture->file >= 0, "mkstemp failed for %s", path);
    unlink(path);
    capture->saved = dup(fd);
    cr_assert(capture->saved >= 0 && dup2(capture->file, fd) == fd, "cannot redirect fd %d", fd);
}

const char *test_capture_end(TestCapture *capture, char *out, size_t capacity)
{
    fflush(stdout);
    fflush(stderr);
    cr_assert(dup2(capture->saved, capture->fd) == capture->fd, "cannot restore fd %d",
              capture->fd);
    close(capture->saved);
    ssize_t got = pread(capture->file, out, capacity - 1, 0);
    out[got > 0 ? got : 0] = '\0';
    close(capture->file);
    return out;
}

void test_expect_fatal(void (*body)(void *), void *argument, int exit_code,
                       const char *fragment)
{
    char errors[4096];
    const int code = test_run_in_child(body, argument, errors, sizeof errors);
    cr_assert_eq(code, exit_code, "exit code %d, expected %d; stderr: %s", code, exit_code,
                 errors);
    cr_assert(!strncmp(errors, "fathom: error: ", 15), "not an error line: %s", errors);
    cr_assert(strstr(errors, fragment), "the message does not hold '%s': %s", fragment,
              errors);
    const char *newline = strchr(errors, '\n');
    cr_assert(newline && newline[1] == '\0', "more than one line: %s", errors);
}

void test_fill_tokens(uint32_t *tokens, size_t n, int vocab, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        tokens[i] = (uint32_t)test_random_int(0, vocab - 1, seed * 1000 + i);
}

ModelConfig test_small_model_config(bool qk_norm, bool tie_embeddings)
{
    return (ModelConfig){
        .vocab_size = 11, .d_model = 8, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .head_dim = 4, .ffn_dim = 12, .rope_theta = 10000.0, .norm_eps = 1e-5,
        .qk_norm = qk_norm, .tie_embeddings = tie_embeddings, .init_std = 0.02,
    };
}

int test_logits_bitwise_equal(const Model *a, const Model *b)
{
    const size_t n = (size_t)model_last_tokens(a) * model_config(a)->vocab_size;
    if (n != (size_t)model_last_tokens(b) * model_config(b)->vocab_size)
        return 0;
    float *logits_a = xmalloc(n * sizeof(float)), *logits_b = xmalloc(n * sizeof(float));
    model_read_logits(a, logits_a);
    model_read_logits(b, logits_b);
    const int equal = memcmp(logits_a, logits_b, n * sizeof(float)) == 0;
    free(logits_a);
    free(logits_b);
    return equal;
}
