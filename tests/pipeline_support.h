/* tests/pipeline_support.h — running `fathom train` on several ranks for the tests. */
#ifndef FATHOM_TESTS_PIPELINE_SUPPORT_H
#define FATHOM_TESTS_PIPELINE_SUPPORT_H

#include <stddef.h>

/* `fathom train launch/configs/<config>.yaml <common> <extra> --set run_dir=<run_dir>` on
 * `ranks` ranks (1: without mpirun; else `mpirun --oversubscribe`, allowed as root), one
 * OpenMP thread a rank since the ranks share the cores. Returns the exit code; stdout and
 * stderr go to `output`. */
int pipeline_train(int ranks, const char *config, const char *common, const char *extra,
                   const char *run_dir, char *output, size_t capacity);

#endif
