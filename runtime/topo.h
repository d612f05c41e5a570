/* runtime/topo.h — where each rank runs (DESIGN 3, "Placement").
 *
 * topo_place, collective over the world, once, after the grid and before the backend is
 * chosen (nothing may have started CUDA yet):
 *   - local rank: the ranks of a host, numbered 0.. in world-rank order (host names gathered
 *     over the world, so any launcher does);
 *   - GPU: unless device: cpu, the CUDA module counts the node's devices G (those the process
 *     sees: CUDA_VISIBLE_DEVICES is honoured); the node's ranks use U =
 *     parallel.gpus_per_node of them, or all G when it is 0, and rank r takes GPU
 *     (local rank mod U), so ranks beyond U share GPUs (host-staged communication,
 *     runtime/device_comm.h). U > G is exit 2 naming the key, G = 0 included. The module is
 *     told the device (cuda_module_device_use) before the backend starts on it;
 *   - binding (hwloc): the cores nearest the GPU are the cpuset of the GPU's nearest non-I/O
 *     ancestor in hwloc's tree (its package or NUMA node). A process whose binding is the
 *     whole allowed set (the launcher bound nothing) is bound to those cores, and its memory
 *     preferred from that ancestor's NUMA nodes (not strict: an allocation that does not fit
 *     there spills). A launcher's binding (mpirun --bind-to core, ...) is kept, and noted as
 *     far when it is not within those cores. Without a GPU nothing is bound. A binding the
 *     system refuses is a warning, not an error;
 * topo_print_map, collective: rank 0 prints the rank map, one line per rank (rank, stage,
 * dp rank, host, GPU, cpus, who bound it), and one warning naming the ranks whose launcher
 * binding is far from their GPU.
 *
 * The pure functions below are the rules, tested alone.
 */
#ifndef FATHOM_RUNTIME_TOPO_H
#define FATHOM_RUNTIME_TOPO_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/config.h"
#include "runtime/grid.h"

typedef enum {
    TOPO_UNBOUND,           /* nobody bound the process */
    TOPO_BOUND_BY_FATHOM,   /* to the cores nearest its GPU */
    TOPO_BOUND_BY_LAUNCHER, /* kept as the launcher made it */
} TopoBinding;

enum { TOPO_HOST_BYTES = 64, TOPO_BUS_ID_BYTES = 32, TOPO_CPUS_BYTES = 96 };

typedef struct {
    char host[TOPO_HOST_BYTES];
    int local_rank, local_size;  /* among the ranks of this host */
    int node_gpus;               /* CUDA devices the process sees (0 with device: cpu) */
    int gpus_used;               /* U above; 0 without a GPU */
    int gpu;                     /* the CUDA device of this rank, -1 without */
    char bus_id[TOPO_BUS_ID_BYTES];     /* its PCI bus id, "" without */
    char gpu_cpus[TOPO_CPUS_BYTES];     /* the cpus nearest it ("0-15"), "" when unknown */
    char cpus[TOPO_CPUS_BYTES];         /* the process's binding after placement */
    TopoBinding binding;
    bool far;                    /* a launcher binding not within gpu_cpus */
} TopoPlacement;

void topo_place(const RankGrid *grid, const Config *config, TopoPlacement *placement);
void topo_print_map(const RankGrid *grid, const TopoPlacement *placement);

/* ---- the rules ---- */

/* The local rank of world rank `rank` among hosts[0..n) (TOPO_HOST_BYTES each), and the
 * number of ranks on its host. */
int topo_local_rank(const char *hosts, int n, int rank, int *local_size);
/* U: gpus_per_node, or node_gpus when it is 0; exit 2 naming parallel.gpus_per_node when it
 * asks for more than node_gpus (why_none: what the CUDA module said, for G = 0). */
int topo_gpus_used(int gpus_per_node, int node_gpus, const char *why_none);
/* The GPU of a local rank: local_rank mod gpus_used. */
int topo_gpu_of(int local_rank, int gpus_used);
/* Whether every cpu of the list `cpus` ("0-3,8") is in the list `near`; false when either
 * does not parse or near is empty. */
bool topo_cpus_within(const char *cpus, const char *near);

#endif
