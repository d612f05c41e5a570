/* launch/cpu_threads.h — the cpu backend's OpenMP threads on a machine that other work, or
 * other ranks, share (docs/reference.md "Threads"; docs/performance.md measures it).
 *
 * cpu_threads_configure runs first in main, before MPI starts or any parallel region:
 *   waiting   threads that wait at the end of a parallel region sleep at once
 *             (OMP_WAIT_POLICY=passive) instead of spinning, unless the environment sets
 *             OMP_WAIT_POLICY or GOMP_SPINCOUNT. libgomp reads its environment once, when
 *             it loads, before main: so the process sets the variable and executes itself
 *             again (same pid, same arguments), once.
 *   threads   one per core this rank gets (machine_cores_per_rank: the cores the process
 *             may use over the ranks on the node), unless OMP_NUM_THREADS is set.
 * cpu_threads_describe says what was chosen and why, for `fathom --version`.
 */
#ifndef FATHOM_LAUNCH_CPU_THREADS_H
#define FATHOM_LAUNCH_CPU_THREADS_H

#include <stddef.h>

void cpu_threads_configure(char **argv);

/* "2 OpenMP threads (2 cores for 1 rank on this node), passive waiting (fathom's default)" */
void cpu_threads_describe(char *text, size_t capacity);

#endif
