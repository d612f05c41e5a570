/* runtime/error.h — the one way fathom fails (DESIGN 6).
 *
 * fatal() prints "fathom: error: <message>" to stderr and exits with one of the exit codes
 * below. A user's mistake (bad config, missing file) goes through fatal() with a message
 * that names the key or the file; a failed library call goes through one of the *_CHECK
 * macros, which add file:line and the library's own message.
 *
 * In a job of several ranks (runtime/comm.h) the communication layer installs two
 * process-wide settings: a rank prefix, so every message reads "fathom: error: rank 3: ...",
 * and an abort hook that fatal() calls instead of exit(), so that one rank's failure ends the
 * whole job with its exit code. Without them (one process, and the forked children of the
 * tests) fatal() prints and exits.
 */
#ifndef FATHOM_RUNTIME_ERROR_H
#define FATHOM_RUNTIME_ERROR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#define FATHOM_NORETURN [[noreturn]]
#else
#define FATHOM_NORETURN _Noreturn
#endif

enum ExitCode {
    EXIT_DONE = 0,
    EXIT_CONFIG = 2,     /* usage or config error */
    EXIT_DATA = 3,       /* data or checkpoint error */
    EXIT_NUMERICAL = 4,  /* non-finite steps past train.max_skipped */
    EXIT_COMM = 5,       /* communication failure or timeout */
};

FATHOM_NORETURN void fatal(int exit_code, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* After this, fatal() prints its message and calls abort_job(exit_code) instead of exit();
 * abort_job should not return (if it does, fatal() exits). NULL restores plain exit(). */
void error_set_abort(void (*abort_job)(int exit_code));
/* rank >= 0: fatal() and warn() put "rank N: " before the message; rank < 0: no prefix. */
void error_set_rank(int rank);
/* The hook and the rank set above, so that a separately loaded module with its own copy of
 * this file (the CUDA module, runtime/cuda_module.c) can be given the same. */
void (*error_abort_hook(void))(int exit_code);
int error_rank_prefix(void);

/* The index of environment variable `name`'s value among `choices` (count of them): 0, the
 * default, where it is unset or empty; any other value exits 2 naming the choices. For the
 * switches that pick among kernels or walks, for timing them against each other. */
int env_choice(const char *name, const char *const *choices, int count);

/* Prints "fathom: warning: ..." and carries on. */
void warn(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* Allocation that cannot fail silently: exits with a message naming the size. */
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *pointer, size_t bytes);
char *xstrdup(const char *text);

/* HDF5: every call returning herr_t or hid_t goes through H5_CHECK; a negative value is a
 * failure, reported with the expression, file:line and HDF5's innermost message, exit 3. */
#define H5_CHECK(call) h5_check((int64_t)(call), #call, __FILE__, __LINE__)
int64_t h5_check(int64_t result, const char *expression, const char *file, int line);
/* The innermost (root-cause) message of HDF5's current error stack, for a caller that names
 * the file itself rather than the call. */
void h5_error_message(char message[256]);
/* Turns HDF5's own stack printing off once; h5_check prints instead. */
void h5_quiet(void);

#ifdef __cplusplus
}
#endif

#endif
