/* runtime/device_comm_choose.c — device_comm_choose and device_comm_describe_group (see
 * device_comm.h): which method a group takes, from what its ranks reported, and how messages
 * name the group. Pure functions: no communication, no device.
 */
#include "runtime/device_comm.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/error.h"

/* Appends to text[capacity] at *used (truncating quietly). */
static void append(char *text, size_t capacity, size_t *used, const char *format, ...)
{
    if (*used >= capacity)
        return;
    va_list args;
    va_start(args, format);
    int written = vsnprintf(text + *used, capacity - *used, format, args);
    va_end(args);
    if (written > 0)
        *used += (size_t)written < capacity - *used ? (size_t)written : capacity - *used;
}

static bool same_gpu(const DeviceCommRank *a, const DeviceCommRank *b)
{
    return a->bus_id[0] && !strcmp(a->bus_id, b->bus_id) && !strcmp(a->host, b->host);
}

static bool hosts_differ(const DeviceCommRank *ranks, int n)
{
    for (int i = 1; i < n; i++)
        if (strcmp(ranks[i].host, ranks[0].host))
            return true;
    return false;
}

/* "ranks 0 and 1 share GPU 0000:19:00.0; ranks 2, 3 and 4 share GPU ..." for every GPU with
 * more than one rank (world ranks, in group order). false when every GPU has one rank. */
static bool describe_sharing(const DeviceCommRank *ranks, int n, char *reason,
                             size_t capacity)
{
    size_t used = 0;
    bool any = false;
    const bool name_hosts = hosts_differ(ranks, n);
    for (int i = 0; i < n; i++) {
        bool first = true;
        int sharers = 0;
        for (int j = 0; j < n; j++) {
            if (!same_gpu(&ranks[i], &ranks[j]))
                continue;
            first &= j >= i;
            sharers++;
        }
        if (!first || sharers < 2)
            continue; /* reported with the GPU's first rank, or not shared */
        append(reason, capacity, &used, "%sranks ", any ? "; " : "");
        for (int j = i, listed = 0; j < n; j++) {
            if (!same_gpu(&ranks[i], &ranks[j]))
                continue;
            const char *separator = listed == 0 ? "" : listed == sharers - 1 ? " and " : ", ";
            append(reason, capacity, &used, "%s%d", separator, ranks[j].world_rank);
            listed++;
        }
        append(reason, capacity, &used, " share GPU %s", ranks[i].bus_id);
        if (name_hosts)
            append(reason, capacity, &used, " of %s", ranks[i].host);
        any = true;
    }
    return any;
}

DeviceCommMethod device_comm_choose(const DeviceCommRank *ranks, int n, bool device_memory,
                                    const char *nccl_missing, const char *forced,
                                    char *reason, size_t capacity)
{
    const char *plural = n == 1 ? "" : "s";
    if (!device_memory) {
        snprintf(reason, capacity, "%d rank%s on host memory", n, plural);
        return DEVICE_COMM_MPI;
    }
    if (forced && *forced) {
        if (!strcmp(forced, "host-staged")) {
            snprintf(reason, capacity, "%d rank%s, forced by FATHOM_DEVICE_COMM=host-staged",
                     n, plural);
            return DEVICE_COMM_HOST_STAGED;
        }
        if (strcmp(forced, "nccl"))
            fatal(EXIT_CONFIG, "FATHOM_DEVICE_COMM = \"%s\": expected host-staged or nccl (or "
                  "unset: chosen by the GPUs of the ranks)", forced);
        if (nccl_missing)
            fatal(EXIT_CONFIG, "FATHOM_DEVICE_COMM = nccl, but %s", nccl_missing);
        snprintf(reason, capacity, "%d rank%s, forced by FATHOM_DEVICE_COMM=nccl", n, plural);
        return DEVICE_COMM_NCCL;
    }
    if (n == 1) {
        snprintf(reason, capacity, "1 rank: operations are copies");
        return nccl_missing ? DEVICE_COMM_HOST_STAGED : DEVICE_COMM_NCCL;
    }
    for (int i = 0; i < n; i++)
        if (!ranks[i].bus_id[0]) {
            snprintf(reason, capacity, "rank %d cannot tell its GPU's PCI bus id",
                     ranks[i].world_rank);
            return DEVICE_COMM_HOST_STAGED;
        }
    if (describe_sharing(ranks, n, reason, capacity))
        return DEVICE_COMM_HOST_STAGED;
    if (nccl_missing) {
        snprintf(reason, capacity, "%d ranks on %d GPUs, but %s", n, n, nccl_missing);
        return DEVICE_COMM_HOST_STAGED;
    }
    snprintf(reason, capacity, "%d ranks on %d GPUs", n, n);
    return DEVICE_COMM_NCCL;
}

void device_comm_describe_group(const DeviceCommRank *ranks, int n, char *text,
                                size_t capacity)
{
    size_t used = 0;
    append(text, capacity, &used, "the group of world rank%s ", n == 1 ? "" : "s");
    for (int i = 0; i < n;) {
        int last = i; /* the run i..last of consecutive world ranks */
        while (last + 1 < n && ranks[last + 1].world_rank == ranks[last].world_rank + 1)
            last++;
        append(text, capacity, &used, "%s%d", i ? ", " : "", ranks[i].world_rank);
        if (last > i)
            append(text, capacity, &used, "%s%d", last == i + 1 ? ", " : "-",
                   ranks[last].world_rank);
        i = last + 1;
    }
}
