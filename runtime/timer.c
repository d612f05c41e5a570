/* runtime/timer.c — CLOCK_MONOTONIC in seconds. */
#include "runtime/timer.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "runtime/error.h"

double timer_seconds(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        fatal(EXIT_CONFIG, "clock_gettime(CLOCK_MONOTONIC) failed: %s", strerror(errno));
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}
