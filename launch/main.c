/* launch/main.c — the `fathom` command (DESIGN 6). */
#include "launch/cli.h"
#include "launch/cpu_threads.h"
#include "runtime/comm.h"

int main(int argc, char **argv)
{
    cpu_threads_configure(argv); /* may execute fathom again, before MPI starts */
    comm_init(&argc, &argv);     /* MPI only under mpirun (runtime/comm.h) */
    const int code = cli_main(argc, argv);
    comm_finalize();
    return code;
}
