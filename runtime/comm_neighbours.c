/* runtime/comm_neighbours.c — which ranks on this host are gone, asked of the kernel, not
 * of MPI.
 *
 * The roll call (comm_rollcall.c) names a silent rank from inside MPI's waits. A job whose
 * ranks wait for NCCL kernels cannot use it: their host threads sit in CUDA, not in a poll
 * loop, and the NCCL watchdog ends the job from a thread of its own. What a rank can still
 * tell without MPI is the state of the processes on its own host, which on one node of
 * eight GPUs is every rank. So comm_init gathers every rank's (host, pid) once, and when a
 * job ends with exit 5, fatal()'s hook (comm_mpi.c) names the ranks of this host whose
 * process has exited (no such pid, or a zombie) or is stopped (state T or t in
 * /proc/PID/stat). Nothing here calls MPI after the gather, so any thread may ask.
 */
#include <errno.h>
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
} Neighbour;

static Neighbour *neighbours; /* [world size], from comm_neighbours_init */
static int n_neighbours;

void comm_neighbours_init(MPI_Comm world, int size)
{
    Neighbour mine;
    memset(&mine, 0, sizeof mine);
    if (gethostname(mine.host, sizeof mine.host - 1) != 0)
        snprintf(mine.host, sizeof mine.host, "unknown");
    mine.pid = (int)getpid();
    neighbours = xcalloc((size_t)size, sizeof *neighbours);
    MPI_CHECK(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, neighbours, (int)sizeof mine,
                            MPI_BYTE, world));
    n_neighbours = size;
}

void comm_neighbours_free(void)
{
    free(neighbours);
    neighbours = NULL;
    n_neighbours = 0;
}

/* 'R', 'S', 'T', 'Z', ... of /proc/PID/stat; 0 when the process is not there. */
static char process_state(int pid)
{
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 0;
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *file = fopen(path, "r");
    if (!file)
        return 0;
    const size_t length = fread(line, 1, sizeof line - 1, file);
    fclose(file);
    line[length] = '\0';
    const char *name_end = strrchr(line, ')'); /* the name may hold spaces and parentheses */
    return name_end && name_end[1] == ' ' ? name_end[2] : '?';
}

int comm_neighbours_describe(char *text, size_t capacity)
{
    text[0] = '\0';
    char here[64] = "";
    if (gethostname(here, sizeof here - 1) != 0 || !neighbours)
        return 0;
    const int me = (int)getpid();
    int found = 0;
    size_t used = 0;
    for (int rank = 0; rank < n_neighbours; rank++) {
        const Neighbour *neighbour = &neighbours[rank];
        if (neighbour->pid == me || strcmp(neighbour->host, here))
            continue;
        const char state = process_state(neighbour->pid);
        const char *what = state == 0 || state == 'Z' || state == 'X' ? "has exited"
                           : state == 'T' || state == 't'            ? "is stopped"
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
