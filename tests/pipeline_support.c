/* tests/pipeline_support.c — see pipeline_support.h. */
#include "tests/pipeline_support.h"

#include <stdio.h>

#include "tests/support.h"

int pipeline_train(int ranks, const char *config, const char *common, const char *extra,
                   const char *run_dir, char *output, size_t capacity)
{
    char launcher[256] = "OMP_NUM_THREADS=1 ";
    if (ranks > 1)
        snprintf(launcher, sizeof launcher,
                 "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                 "mpirun --oversubscribe -np %d ", ranks);
    char command[4096];
    snprintf(command, sizeof command,
             "%s'%s' train '%s/launch/configs/%s.yaml' %s %s --set run_dir='%s' </dev/null",
             launcher, test_fathom_binary(), test_source_dir(), config, common, extra, run_dir);
    return test_run_command(command, output, capacity);
}
