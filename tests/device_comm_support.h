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

/* The timing scenario's line "rank R time WHEN KIND busy B exposed E operations N" (the
 * probe's say_times), read into its three numbers; fails the test when it is missing. */
typedef struct {
    double busy_ms, exposed_ms;
    int operations;
} DeviceProbeTime;
DeviceProbeTime device_probe_time(const char *output, int rank, const char *when,
                                  const char *kind);

/* The timing scenario on two ranks of a synchronous method (mpi, host-staged), whose
 * communication holds the compute stream up for all its time (busy equals exposed): each
 * kind timed once where it happened; the waits for the late rank (rank 0 in the all-gather,
 * rank 1 in the receive) at least late_ms * 0.8; nothing in "again" and "off". */
void device_probe_expect_synchronous_times(const char *output, double late_ms);

#endif
