/* runtime/error.c — fatal(), warn(), checked allocation, the HDF5 check. */
#include "runtime/error.h"

#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Process-wide, set once by comm_init in a job of several ranks (error.h). */
static void (*error_abort_job)(int exit_code);
static int error_rank = -1;

void (*error_abort_hook(void))(int exit_code)
{
    return error_abort_job;
}

int error_rank_prefix(void)
{
    return error_rank;
}

void error_set_abort(void (*abort_job)(int exit_code))
{
    error_abort_job = abort_job;
}

void error_set_rank(int rank)
{
    error_rank = rank;
}

/* "fathom: <severity>: [rank N: ]<message>\n" in ONE write: stderr is unbuffered, and under
 * mpirun the pieces of a line written apart interleave with other ranks' and mpirun's own. */
static void error_emit(const char *severity, const char *format, va_list args)
{
    char line[4096];
    int length = snprintf(line, sizeof line, "fathom: %s: ", severity);
    if (error_rank >= 0)
        length += snprintf(line + length, sizeof line - (size_t)length, "rank %d: ", error_rank);
    length += vsnprintf(line + length, sizeof line - (size_t)length, format, args);
    if (length > (int)sizeof line - 2)
        length = (int)sizeof line - 2; /* a longer message is cut, never lost entirely */
    line[length++] = '\n';
    fwrite(line, 1, (size_t)length, stderr);
    fflush(stderr);
}

void fatal(int exit_code, const char *format, ...)
{
    va_list args;
    fflush(stdout);
    va_start(args, format);
    error_emit("error", format, args);
    va_end(args);
    /* a failure inside the hook (a second fatal from MPI_Abort's path) must not recurse */
    void (*abort_job)(int) = error_abort_job;
    error_abort_job = NULL;
    if (abort_job)
        abort_job(exit_code);
    exit(exit_code);
}

void warn(const char *format, ...)
{
    va_list args;
    fflush(stdout);
    va_start(args, format);
    error_emit("warning", format, args);
    va_end(args);
}

int env_choice(const char *name, const char *const *choices, int count)
{
    const char *value = getenv(name);
    if (!value || !*value)
        return 0;
    char listed[512] = "";
    for (int i = 0; i < count; i++) {
        if (!strcmp(value, choices[i]))
            return i;
        snprintf(listed + strlen(listed), sizeof listed - strlen(listed), "%s%s",
                 i == 0 ? "" : i == count - 1 ? " or " : ", ", choices[i]);
    }
    fatal(EXIT_CONFIG, "%s = '%s' (%s)", name, value, listed);
}

void *xmalloc(size_t bytes)
{
    void *pointer = malloc(bytes ? bytes : 1);
    if (!pointer)
        fatal(EXIT_DATA, "out of host memory allocating %zu bytes", bytes);
    return pointer;
}

void *xcalloc(size_t count, size_t size)
{
    void *pointer = calloc(count ? count : 1, size ? size : 1);
    if (!pointer)
        fatal(EXIT_DATA, "out of host memory allocating %zu x %zu bytes", count, size);
    return pointer;
}

void *xrealloc(void *pointer, size_t bytes)
{
    void *grown = realloc(pointer, bytes ? bytes : 1);
    if (!grown)
        fatal(EXIT_DATA, "out of host memory growing a buffer to %zu bytes", bytes);
    return grown;
}

char *xstrdup(const char *text)
{
    size_t length = strlen(text) + 1;
    char *copy = xmalloc(length);
    memcpy(copy, text, length);
    return copy;
}

static herr_t h5_innermost_message(unsigned n, const H5E_error2_t *entry, void *out)
{
    (void)n;
    /* the walk goes inward; keep overwriting so the innermost (root cause) stays */
    snprintf((char *)out, 256, "%s", entry->desc ? entry->desc : "");
    return 0;
}

/* HDF5 1.10 registers an atexit handler that closes every open file. After a failed write
 * (a full disk) that handler dereferences freed state and the process dies of SIGSEGV
 * instead of exiting 3 from fatal(). Files are closed explicitly on every success path and
 * abandoned with their .tmp directory on failure, so the handler has nothing to do: switch
 * it off before anything initialises the library. */
__attribute__((constructor)) static void h5_atexit_disable(void)
{
    H5dont_atexit();
}

void h5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void h5_error_message(char message[256])
{
    snprintf(message, 256, "unknown HDF5 error");
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, h5_innermost_message, message);
}

int64_t h5_check(int64_t result, const char *expression, const char *file, int line)
{
    if (result >= 0)
        return result;
    char message[256];
    h5_error_message(message);
    fatal(EXIT_DATA, "%s:%d: HDF5 call %s failed: %s", file, line, expression, message);
}
