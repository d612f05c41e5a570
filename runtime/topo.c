/* runtime/topo.c — see topo.h. hwloc finds the GPU by its PCI bus id (which the CUDA module
 * reads without creating a context), so fathom itself never touches CUDA here. hwloc's GPU
 * plugins (cuda, nvml, opencl, gl) are left out: they would load GPU libraries, or talk to a
 * display, only to name what the PCI tree already shows.
 */
#include "runtime/topo.h"

#include <errno.h>
#include <hwloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm.h"
#include "runtime/cuda_module.h"
#include "runtime/error.h"

/* ---- the rules ---------------------------------------------------------------------- */

int topo_local_rank(const char *hosts, int n, int rank, int *local_size)
{
    const char *mine = hosts + (size_t)rank * TOPO_HOST_BYTES;
    int local = 0, size = 0;
    for (int r = 0; r < n; r++) {
        if (strncmp(hosts + (size_t)r * TOPO_HOST_BYTES, mine, TOPO_HOST_BYTES))
            continue;
        local += r < rank;
        size++;
    }
    if (local_size)
        *local_size = size;
    return local;
}

int topo_gpus_used(int gpus_per_node, int node_gpus, const char *why_none)
{
    if (gpus_per_node > node_gpus) {
        if (node_gpus == 0)
            fatal(EXIT_CONFIG, "parallel.gpus_per_node = %d, but this node has no GPU (%s); "
                  "set device: cpu, or parallel.gpus_per_node: 0", gpus_per_node, why_none);
        fatal(EXIT_CONFIG, "parallel.gpus_per_node = %d, but this node has %d GPU%s; set at "
              "most %d (0: all of them)", gpus_per_node, node_gpus, node_gpus == 1 ? "" : "s",
              node_gpus);
    }
    return gpus_per_node > 0 ? gpus_per_node : node_gpus;
}

int topo_gpu_of(int local_rank, int gpus_used)
{
    return gpus_used > 0 ? local_rank % gpus_used : -1;
}

bool topo_cpus_within(const char *cpus, const char *near)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc(), around = hwloc_bitmap_alloc();
    if (!set || !around)
        fatal(EXIT_DATA, "hwloc_bitmap_alloc: out of host memory");
    bool within = *near && hwloc_bitmap_list_sscanf(set, cpus) == 0 &&
                  hwloc_bitmap_list_sscanf(around, near) == 0 &&
                  !hwloc_bitmap_iszero(around) && hwloc_bitmap_isincluded(set, around);
    hwloc_bitmap_free(set);
    hwloc_bitmap_free(around);
    return within;
}

/* ---- hwloc -------------------------------------------------------------------------- */

static void cpus_text(hwloc_const_bitmap_t set, char *text, size_t capacity)
{
    if (hwloc_bitmap_list_snprintf(text, capacity, set) < 0)
        snprintf(text, capacity, "?");
}

/* The topology with the PCI devices hwloc sees through Linux itself; NULL (and a warning)
 * when hwloc cannot load it. */
static hwloc_topology_t topology_load(bool with_pci)
{
    static const char *const skipped[] = {"cuda", "nvml", "opencl", "gl", "rsmi", "levelzero"};
    hwloc_topology_t topology;
    if (hwloc_topology_init(&topology) != 0) {
        warn("hwloc_topology_init failed (%s): the rank is not bound", strerror(errno));
        return NULL;
    }
    for (size_t i = 0; i < sizeof skipped / sizeof skipped[0]; i++)
        hwloc_topology_set_components(topology, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                      skipped[i]); /* an unknown name is not an error */
    if ((with_pci && hwloc_topology_set_io_types_filter(topology,
                                                        HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) ||
        hwloc_topology_load(topology) != 0) {
        warn("hwloc cannot read this machine's topology (%s): the rank is not bound",
             strerror(errno));
        hwloc_topology_destroy(topology);
        return NULL;
    }
    return topology;
}

/* The GPU's nearest non-I/O ancestor, or NULL (with a warning) when hwloc does not see it. */
static hwloc_obj_t gpu_ancestor(hwloc_topology_t topology, const char *bus_id)
{
    hwloc_obj_t device = hwloc_get_pcidev_by_busidstring(topology, bus_id);
    hwloc_obj_t ancestor = device ? hwloc_get_non_io_ancestor_obj(topology, device) : NULL;
    if (!ancestor || !ancestor->cpuset)
        warn("hwloc does not see the PCI device %s of this rank's GPU: the rank is not bound",
             bus_id);
    return ancestor && ancestor->cpuset ? ancestor : NULL;
}

/* Binds the process near `ancestor`, or keeps the launcher's binding; fills the cpus and the
 * binding of the placement. */
static void bind_process(hwloc_topology_t topology, hwloc_obj_t ancestor,
                         TopoPlacement *placement)
{
    hwloc_bitmap_t current = hwloc_bitmap_alloc(), near = hwloc_bitmap_alloc();
    if (!current || !near)
        fatal(EXIT_DATA, "hwloc_bitmap_alloc: out of host memory");
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topology);
    if (hwloc_get_cpubind(topology, current, HWLOC_CPUBIND_PROCESS) != 0)
        hwloc_bitmap_copy(current, allowed); /* unknown: take it as unbound */
    const bool launcher_bound = !hwloc_bitmap_isequal(current, allowed);
    if (ancestor) {
        hwloc_bitmap_and(near, ancestor->cpuset, allowed);
        cpus_text(near, placement->gpu_cpus, sizeof placement->gpu_cpus);
    }
    if (launcher_bound) {
        placement->binding = TOPO_BOUND_BY_LAUNCHER;
        cpus_text(current, placement->cpus, sizeof placement->cpus);
        placement->far = ancestor && !topo_cpus_within(placement->cpus, placement->gpu_cpus);
    } else if (ancestor && !hwloc_bitmap_iszero(near)) {
        if (hwloc_set_cpubind(topology, near, HWLOC_CPUBIND_PROCESS) != 0) {
            warn("binding to cpus %s near GPU %s was refused (%s): the rank is not bound",
                 placement->gpu_cpus, placement->bus_id, strerror(errno));
        } else {
            placement->binding = TOPO_BOUND_BY_FATHOM;
            /* preferred, not strict (no HWLOC_MEMBIND_STRICT): Linux's MPOL_PREFERRED */
            if (hwloc_set_membind(topology, ancestor->nodeset, HWLOC_MEMBIND_BIND,
                                  HWLOC_MEMBIND_BYNODESET) != 0)
                warn("preferring the memory near GPU %s was refused (%s); the cpus are "
                     "bound", placement->bus_id, strerror(errno));
            hwloc_get_cpubind(topology, current, HWLOC_CPUBIND_PROCESS);
        }
    }
    cpus_text(current, placement->cpus, sizeof placement->cpus);
    hwloc_bitmap_free(current);
    hwloc_bitmap_free(near);
}

/* ---- placement ---------------------------------------------------------------------- */

/* The GPU of this rank (unless device: cpu), told to the CUDA module. */
static void choose_gpu(const RankGrid *grid, const Config *config, TopoPlacement *placement)
{
    if (config->device == DEVICE_CPU) {
        if (config->parallel.gpus_per_node != 0 && grid->rank == 0)
            warn("parallel.gpus_per_node = %d is not read with device: cpu",
                 config->parallel.gpus_per_node);
        return;
    }
    const CudaModuleInfo *info = cuda_module_probe();
    placement->node_gpus = info->devices;
    placement->gpus_used =
        topo_gpus_used(config->parallel.gpus_per_node, info->devices, info->description);
    placement->gpu = topo_gpu_of(placement->local_rank, placement->gpus_used);
    if (placement->gpu < 0)
        return;
    char bus_id[256];
    if (cuda_module_device_bus_id(placement->gpu, bus_id, sizeof bus_id) &&
        strlen(bus_id) < sizeof placement->bus_id)
        memcpy(placement->bus_id, bus_id, strlen(bus_id) + 1);
    else
        warn("CUDA device %d: %s", placement->gpu, bus_id);
    cuda_module_device_use(placement->gpu);
}

void topo_place(const RankGrid *grid, const Config *config, TopoPlacement *placement)
{
    memset(placement, 0, sizeof *placement);
    placement->gpu = -1;
    if (gethostname(placement->host, sizeof placement->host - 1) != 0)
        snprintf(placement->host, sizeof placement->host, "unknown");
    char *hosts = xmalloc((size_t)grid->world_size * TOPO_HOST_BYTES);
    comm_allgather(grid->world, placement->host, hosts, TOPO_HOST_BYTES, COMM_BYTE,
                   COMM_KIND_OTHER);
    placement->local_rank =
        topo_local_rank(hosts, grid->world_size, grid->rank, &placement->local_size);
    free(hosts);
    choose_gpu(grid, config, placement);
    hwloc_topology_t topology = topology_load(placement->bus_id[0] != '\0');
    if (!topology) {
        snprintf(placement->cpus, sizeof placement->cpus, "?");
        return;
    }
    hwloc_obj_t ancestor = placement->bus_id[0] ? gpu_ancestor(topology, placement->bus_id)
                                                : NULL;
    bind_process(topology, ancestor, placement);
    hwloc_topology_destroy(topology);
}

/* ---- the rank map ------------------------------------------------------------------- */

typedef struct {
    int32_t rank, stage, dp_rank, gpu, binding, far;
    char host[TOPO_HOST_BYTES];
    char bus_id[TOPO_BUS_ID_BYTES];
    char cpus[TOPO_CPUS_BYTES];
} MapRow;

static const char *binding_name(int binding)
{
    return binding == TOPO_BOUND_BY_FATHOM ? "fathom"
           : binding == TOPO_BOUND_BY_LAUNCHER ? "launcher"
                                               : "-";
}

void topo_print_map(const RankGrid *grid, const TopoPlacement *placement)
{
    MapRow mine;
    memset(&mine, 0, sizeof mine);
    mine.rank = grid->rank;
    mine.stage = grid->stage;
    mine.dp_rank = grid->dp_rank;
    mine.gpu = placement->gpu;
    mine.binding = (int32_t)placement->binding;
    mine.far = placement->far;
    memcpy(mine.host, placement->host, sizeof mine.host);
    memcpy(mine.bus_id, placement->bus_id, sizeof mine.bus_id);
    memcpy(mine.cpus, placement->cpus, sizeof mine.cpus);
    MapRow *rows = xmalloc((size_t)grid->world_size * sizeof *rows);
    comm_allgather(grid->world, &mine, rows, sizeof mine, COMM_BYTE, COMM_KIND_OTHER);
    if (grid->rank == 0) {
        printf("fathom: rank map\n  %4s %5s %4s  %-20s %-17s %-16s %s\n", "rank", "stage",
               "dp", "host", "gpu", "cpus", "bound by");
        char far[256] = "";
        for (int r = 0; r < grid->world_size; r++) {
            const MapRow *row = &rows[r];
            char gpu[64] = "-";
            if (row->gpu >= 0)
                snprintf(gpu, sizeof gpu, "%d %s", row->gpu, row->bus_id);
            printf("  %4d %5d %4d  %-20.20s %-17s %-16s %s\n", row->rank, row->stage,
                   row->dp_rank, row->host, gpu, row->cpus, binding_name(row->binding));
            if (row->far && strlen(far) + 16 < sizeof far)
                snprintf(far + strlen(far), sizeof far - strlen(far), "%s%d",
                         far[0] ? ", " : "", row->rank);
        }
        fflush(stdout);
        if (far[0])
            warn("rank%s %s: the launcher's binding is not within the cpus nearest the GPU "
                 "(hwloc); mpirun --bind-to none lets fathom bind each rank near its GPU",
                 strchr(far, ',') ? "s" : "", far);
    }
    free(rows);
}
