/* launch/machine.h — what this rank gets of the machine it runs on: cores, host memory,
 * device memory, and how many ranks share them.
 *
 * Ranks on one node share its cores and its host memory equally: a rank's share is the
 * machine's figure divided by the ranks of the job on this node (Open MPI's
 * OMPI_COMM_WORLD_LOCAL_SIZE; 1 for a plain process). Ranks that share one GPU (more
 * ranks on the node than GPUs) share its memory likewise. The memory figures are read
 * when asked, so a caller asks before it allocates.
 */
#ifndef FATHOM_LAUNCH_MACHINE_H
#define FATHOM_LAUNCH_MACHINE_H

#include <stdbool.h>
#include <stddef.h>

/* Ranks of this job on this node: OMPI_COMM_WORLD_LOCAL_SIZE, else 1. */
int machine_ranks_on_node(void);

/* The cores this process may run on (its CPU affinity), divided by the ranks on the node,
 * at least 1. */
int machine_cores_per_rank(void);

typedef struct {
    double bytes;     /* this rank's share */
    char source[128]; /* where the figure came from, for messages */
} MachineMemory;

/* Host memory this rank may still take: the smaller of /proc/meminfo's MemAvailable and
 * the cgroup's limit less its usage (v2 memory.max, v1 memory.limit_in_bytes), divided by
 * the ranks on the node. bytes < 0 when nothing could be read. */
MachineMemory machine_host_memory(void);

/* Free memory of the GPU the cuda backend uses (the CUDA module's cudaMemGetInfo), divided
 * by the ranks that share it. bytes < 0 when the module cannot say. */
MachineMemory machine_device_memory(void);

#endif
