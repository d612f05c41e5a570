/* launch/cpu_threads.c — see cpu_threads.h. */
#include "launch/cpu_threads.h"

#include "launch/machine.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set (to "1") in the environment of the process that fathom executed again with passive
 * waiting, so that it says where the policy came from and never executes itself twice. */
#define CPU_THREADS_MARK "FATHOM_OMP_WAIT_POLICY_SET"

void cpu_threads_configure(char **argv)
{
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        if (setenv("OMP_WAIT_POLICY", "passive", 1) == 0 &&
            setenv(CPU_THREADS_MARK, "1", 1) == 0) {
            fflush(NULL);
            execv("/proc/self/exe", argv);
        }
        /* here only when the exec failed: the run goes on with libgomp's spinning */
        unsetenv("OMP_WAIT_POLICY");
        unsetenv(CPU_THREADS_MARK);
    }
    if (!getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(machine_cores_per_rank());
}

void cpu_threads_describe(char *text, size_t capacity)
{
    const char *policy = getenv("OMP_WAIT_POLICY");
    const char *spin = getenv("GOMP_SPINCOUNT");
    char waiting[96];
    if (policy && getenv(CPU_THREADS_MARK))
        snprintf(waiting, sizeof waiting, "%s waiting (fathom's default)", policy);
    else if (policy)
        snprintf(waiting, sizeof waiting, "%s waiting (OMP_WAIT_POLICY)", policy);
    else if (spin)
        snprintf(waiting, sizeof waiting, "spinning %s times before sleeping (GOMP_SPINCOUNT)",
                 spin);
    else
        snprintf(waiting, sizeof waiting, "libgomp's default waiting");
    const int threads = omp_get_max_threads();
    if (getenv("OMP_NUM_THREADS"))
        snprintf(text, capacity, "%d OpenMP thread%s (OMP_NUM_THREADS), %s", threads,
                 threads == 1 ? "" : "s", waiting);
    else
        snprintf(text, capacity, "%d OpenMP thread%s (the cores of this process over %d "
                 "rank%s on this node), %s", threads, threads == 1 ? "" : "s",
                 machine_ranks_on_node(), machine_ranks_on_node() == 1 ? "" : "s", waiting);
}
