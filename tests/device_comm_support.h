/* tests/device_comm_support.h — running tests/device_comm_probe.c and reading its lines, for
 * tests/test_device_comm.c (cpu) and tests/test_cuda_device_comm.c (GPU).
 *
 * The probe is found at $FATHOM_DEVICE_COMM_PROBE, else next to this test binary; the CUDA
 * module at $FATHOM_CUDA_MODULE, else in ../kernels from this test binary (where the build
 * puts both, so a build tree moved to a GPU machine still finds them).
 */
#ifndef FATHOM_TESTS_DEVICE_COMM_SUPPORT_H
#define FATHOM_TESTS_DEVICE_COMM_SUPPORT_H

#include <stddef.h>

enum { DEVICE_PROBE_OUTPUT = 1 << 16 };

/* Runs the probe with `arguments`: alone when ranks is 0 (a world of one, no launcher
 * variables), else under `mpirun --oversubscribe -np ranks`. `environment` ("NAME=value ...",
 * or "") is set for the probe (and passed by mpirun with -x). Captures stdout and stderr into
 * output[DEVICE_PROBE_OUTPUT]; returns the exit status. */
int device_probe_run(int ranks, const char *environment, const char *arguments, char *output);

/* The text after "rank R <key> " on that rank's line, copied into value[capacity], or NULL. */
const char *device_probe_line(const char *output, int rank, const char *key, char *value,
                              size_t capacity);

/* A fresh empty output buffer (caller frees). */
char *device_probe_output(void);

#endif
