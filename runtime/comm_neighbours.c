/* runtime/comm_neighbours.c — which ranks on this host are gone, asked of the kernel, not
 * of MPI.
 *
 * The roll call (comm_rollcall.c) names a silent rank from inside MPI's waits. A job whose
 * ranks wait for NCCL kernels cannot use it: their host threads sit in CUDA, not in a poll
 * loop, and the NCCL watchdog ends the job from a thread of its own. What a rank can still
 * tell without MPI is the state of the processes on its own host, which on one node of
 * eight GPUs is every rank. So comm_init gathers every rank's (host, pid) once, and when a
 * job ends with exit 5, fatal()'s hook (comm_mpi.c) names the ranks of this host whose
 * process has exited (no such pid, a zombie, or the pid of a newer process) or is stopped
 * (state T or t in /proc/PID/stat). A peer is watched only if this rank could see it at the
 * gather, with the start time it reported: ranks in PID namespaces of their own (some
 * container launchers) are not named at all rather than named wrongly. Nothing here calls
 * MPI after the gather, so any thread may ask.
 */
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "runtime/comm_internal.h"
#include "runtime/error.h"

typedef struct {
    char host[64];
    int pid;
    unsigned long long started; /* /proc/PID/stat's starttime, clock ticks after boot */
} Neighbour;

static Neighbour *neighbours; /* [world size], from comm_neighbours_init */
static bool *watched;         /* [world size]: on this host and seen as reported */
static int n_neighbours;

/* The state ('R', 'S', 'T', 'Z', ...) and start time of a process; false when there is no
 * such process to read. */
static bool read_process(int pid, char *state, unsigned long long *started)
{
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return false;
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *file = fopen(path, "r");
    if (!file)
        return false;
    const size_t length = fread(line, 1, sizeof line - 1, file);
    fclose(file);
    line[length] = '\0';
    const char *name_end = strrchr(line, ')'); /* the name may hold spaces and parentheses */
    if (!name_end || name_end[1] != ' ')
        return false;
    /* after the name: state (field 3) ... starttime (field 22), the 20th token */
    const char *field = name_end + 2;
    *state = field[0];
    for (int token = 1; token < 20 && field; token++) {
        field = strchr(field, ' ');
        if (field)
            field++;
    }
    return field && sscanf(field, "%llu", started) == 1;
}

void comm_neighbours_init(MPI_Comm world, int size)
{
    Neighbour mine;
    memset(&mine, 0, sizeof mine);
    if (gethostname(mine.host, sizeof mine.host - 1) != 0)
        snprintf(mine.host, sizeof mine.host, "unknown");
    mine.pid = (int)getpid();
    char state;
    if (!read_process(mine.pid, &state, &mine.started))
        mine.started = 0;
    neighbours = xcalloc((size_t)size, sizeof *neighbours);
    watched = xcalloc((size_t)size, sizeof *watched);
    MPI_CHECK(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, neighbours, (int)sizeof mine,
                            MPI_BYTE, world));
    n_neighbours = size;
    for (int rank = 0; rank < size; rank++) {
        const Neighbour *neighbour = &neighbours[rank];
        unsigned long long started;
        watched[rank] = neighbour->pid != mine.pid && !strcmp(neighbour->host, mine.host) &&
                        neighbour->started != 0 &&
                        read_process(neighbour->pid, &state, &started) &&
                        started == neighbour->started;
    }
}

void comm_neighbours_free(void)
{
    free(neighbours);
    free(watched);
    neighbours = NULL;
    watched = NULL;
    n_neighbours = 0;
}

int comm_neighbours_describe(char *text, size_t capacity)
{
    text[0] = '\0';
    int found = 0;
    size_t used = 0;
    for (int rank = 0; rank < n_neighbours; rank++) {
        const Neighbour *neighbour = &neighbours[rank];
        if (!watched[rank])
            continue;
        char state = 0;
        unsigned long long started = 0;
        const bool there = read_process(neighbour->pid, &state, &started) &&
                           started == neighbour->started;
        const char *what = !there || state == 'Z' || state == 'X' ? "has exited"
                           : state == 'T' || state == 't'        ? "is stopped"
                                                                  : NULL;
        if (!what)
            continue;
        const int written = snprintf(text + used, capacity - used, "%srank %d (pid %d) %s",
                                     found ? "; " : "", rank, neighbour->pid, what);
        if (written < 0 || (size_t)written >= capacity - used)
            break;
        used += (size_t)written;
        found++;
    }
    return found;
}
