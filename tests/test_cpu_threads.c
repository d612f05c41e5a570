/* tests/test_cpu_threads.c — the cpu backend's OpenMP threads (launch/cpu_threads.h), as
 * `fathom --version` reports them: passive waiting unless the environment chooses, and one
 * thread per core of the process over the ranks on its node unless OMP_NUM_THREADS says. */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The "cpu: ..." line of `fathom --version` run through `prefix` (environment, taskset). */
static void version_cpu_line(const char *prefix, char *line, size_t capacity)
{
    char command[1024], output[4096];
    snprintf(command, sizeof command, "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "
             "-u OMP_NUM_THREADS -u OMPI_COMM_WORLD_LOCAL_SIZE %s '%s' --version", prefix,
             test_fathom_binary());
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    const char *cpu = strstr(output, "\ncpu: ");
    cr_assert(cpu, "no cpu line: %s", output);
    snprintf(line, capacity, "%.*s", (int)strcspn(cpu + 1, "\n"), cpu + 1);
}

Test(cpu_threads, waiting_is_passive_unless_the_environment_chooses)
{
    char line[512];
    version_cpu_line("", line, sizeof line);
    cr_expect(strstr(line, "passive waiting (fathom's default)"), "%s", line);
    version_cpu_line("OMP_WAIT_POLICY=active", line, sizeof line);
    cr_expect(strstr(line, "active waiting (OMP_WAIT_POLICY)"), "%s", line);
    version_cpu_line("GOMP_SPINCOUNT=300000", line, sizeof line);
    cr_expect(strstr(line, "spinning 300000 times before sleeping (GOMP_SPINCOUNT)"), "%s",
              line);
}

Test(cpu_threads, threads_are_the_cores_over_the_ranks_on_the_node)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
        cr_skip_test("needs two cores");
    char line[512];
    version_cpu_line("taskset -c 0,1", line, sizeof line);
    cr_expect(strstr(line, "2 OpenMP threads (the cores of this process over 1 rank"), "%s",
              line);
    version_cpu_line("OMPI_COMM_WORLD_LOCAL_SIZE=2 taskset -c 0,1", line, sizeof line);
    cr_expect(strstr(line, "1 OpenMP thread (the cores of this process over 2 ranks"), "%s",
              line);
    version_cpu_line("OMP_NUM_THREADS=3 OMPI_COMM_WORLD_LOCAL_SIZE=2 taskset -c 0,1", line,
                     sizeof line);
    cr_expect(strstr(line, "3 OpenMP threads (OMP_NUM_THREADS)"), "%s", line);
}
