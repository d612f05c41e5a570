/* launch/machine.c — see machine.h. */
#include "launch/machine.h"

#include "runtime/cuda_module.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

int machine_ranks_on_node(void)
{
    const char *local_size = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranks = local_size ? atoi(local_size) : 1;
    return ranks > 0 ? ranks : 1;
}

int machine_cores_per_rank(void)
{
    cpu_set_t cores;
    int count = 0;
    if (sched_getaffinity(0, sizeof cores, &cores) == 0)
        count = CPU_COUNT(&cores);
    if (count < 1)
        count = get_nprocs();
    count /= machine_ranks_on_node();
    return count > 0 ? count : 1;
}

/* The value in kB of `field` ("MemAvailable:") of /proc/meminfo, in bytes; < 0 if absent. */
static double meminfo_bytes(const char *field)
{
    FILE *file = fopen("/proc/meminfo", "r");
    if (!file)
        return -1;
    char line[256];
    double bytes = -1;
    const size_t length = strlen(field);
    while (fgets(line, sizeof line, file))
        if (!strncmp(line, field, length)) {
            bytes = strtod(line + length, NULL) * 1024.0;
            break;
        }
    fclose(file);
    return bytes;
}

/* One number from a cgroup file; < 0 when absent or "max" (no limit). */
static double cgroup_number(const char *path)
{
    FILE *file = fopen(path, "r");
    if (!file)
        return -1;
    char text[64] = "";
    const bool read = fgets(text, sizeof text, file) != NULL;
    fclose(file);
    if (!read || !strncmp(text, "max", 3))
        return -1;
    char *end;
    const double value = strtod(text, &end);
    return end == text ? -1 : value;
}

/* What the cgroup still lets this process take; < 0 when it sets no limit. A v1 "no
 * limit" is a huge number (about 2^63), which the caller's minimum discards. */
static double cgroup_headroom(void)
{
    static const char *const files[][2] = {
        {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        const double limit = cgroup_number(files[i][0]), usage = cgroup_number(files[i][1]);
        if (limit >= 0 && usage >= 0)
            return limit > usage ? limit - usage : 0;
    }
    return -1;
}

MachineMemory machine_host_memory(void)
{
    MachineMemory memory = {.bytes = meminfo_bytes("MemAvailable:")};
    snprintf(memory.source, sizeof memory.source, "MemAvailable in /proc/meminfo");
    if (memory.bytes < 0) {
        struct sysinfo info;
        if (sysinfo(&info) == 0) {
            memory.bytes = ((double)info.freeram + (double)info.bufferram) * info.mem_unit;
            snprintf(memory.source, sizeof memory.source, "free memory (sysinfo)");
        }
    }
    const double headroom = cgroup_headroom();
    if (headroom >= 0 && (memory.bytes < 0 || headroom < memory.bytes)) {
        memory.bytes = headroom;
        snprintf(memory.source, sizeof memory.source, "the cgroup's memory limit less its usage");
    }
    const int ranks = machine_ranks_on_node();
    if (memory.bytes >= 0 && ranks > 1) {
        memory.bytes /= ranks;
        const size_t used = strlen(memory.source);
        snprintf(memory.source + used, sizeof memory.source - used,
                 ", shared by %d ranks on this node", ranks);
    }
    return memory;
}

MachineMemory machine_device_memory(void)
{
    MachineMemory memory = {.bytes = -1};
    size_t free_bytes, total_bytes;
    if (!cuda_module_memory(&free_bytes, &total_bytes)) {
        snprintf(memory.source, sizeof memory.source, "the CUDA module cannot say");
        return memory;
    }
    const int devices = cuda_module_probe()->devices;
    const int ranks = machine_ranks_on_node();
    const int sharing = devices > 0 ? (ranks + devices - 1) / devices : 1;
    memory.bytes = (double)free_bytes / sharing;
    snprintf(memory.source, sizeof memory.source, "free memory of the GPU (%.1f GiB total)%s",
             (double)total_bytes / (1 << 30), sharing > 1 ? ", shared by the ranks on it" : "");
    return memory;
}
