/* tests/device_comm_support.c — see device_comm_support.h. */
#include "tests/device_comm_support.h"

#include "tests/support.h"

#include <criterion/criterion.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The directory of this test binary. */
static void test_binary_directory(char *directory, size_t capacity)
{
    char executable[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", executable, sizeof executable - 1);
    cr_assert_gt(length, 0, "cannot read /proc/self/exe");
    executable[length] = '\0';
    const char *name = dirname(executable);
    if (strlen(name) >= capacity)
        cr_assert_fail("%s: too long a path", name);
    memcpy(directory, name, strlen(name) + 1);
}

static void located(const char *variable, const char *relative, char *path, size_t capacity)
{
    const char *moved = getenv(variable);
    if (moved && *moved) {
        snprintf(path, capacity, "%s", moved);
        return;
    }
    char directory[PATH_MAX];
    test_binary_directory(directory, sizeof directory);
    if (strlen(directory) + strlen(relative) + 2 > capacity)
        cr_assert_fail("%s/%s: too long a path", directory, relative);
    sprintf(path, "%s/%s", directory, relative);
}

int device_probe_run(int ranks, const char *environment, const char *arguments, char *output)
{
    enum { PATH_BYTES = 2 * PATH_MAX };
    char probe[PATH_BYTES], module[PATH_BYTES], variables[PATH_BYTES + 1024] = "";
    char exports[1024] = "";
    located("FATHOM_DEVICE_COMM_PROBE", "fathom-device-comm-probe", probe, sizeof probe);
    located("FATHOM_CUDA_MODULE", "../kernels/libfathom_cuda.so", module, sizeof module);
    snprintf(variables, sizeof variables, "FATHOM_CUDA_MODULE='%s' %s", module, environment);
    /* -x NAME for every variable set here, and for the library path of a moved build and
     * NCCL's settings where the caller has them */
    char names[sizeof variables];
    snprintf(names, sizeof names, "%s", variables);
    for (char *word = strtok(names, " "); word; word = strtok(NULL, " ")) {
        char *equals = strchr(word, '=');
        if (!equals)
            continue;
        *equals = '\0';
        snprintf(exports + strlen(exports), sizeof exports - strlen(exports), " -x %s", word);
    }
    static const char *const passed[] = {"LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE", "NCCL_DEBUG"};
    for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++)
        if (getenv(passed[i]))
            snprintf(exports + strlen(exports), sizeof exports - strlen(exports), " -x %s",
                     passed[i]);
    char command[sizeof variables + sizeof exports + PATH_BYTES + 1024];
    if (ranks == 0)
        snprintf(command, sizeof command,
                 "env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK %s '%s' %s </dev/null",
                 variables, probe, arguments);
    else
        snprintf(command, sizeof command,
                 "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 %s "
                 "mpirun --oversubscribe -np %d%s '%s' %s </dev/null",
                 variables, ranks, exports, probe, arguments);
    return test_run_command(command, output, DEVICE_PROBE_OUTPUT);
}

const char *device_probe_line(const char *output, int rank, const char *key, char *value,
                              size_t capacity)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "rank %d %s ", rank, key);
    for (const char *line = output; line && *line;) {
        const char *next = strchr(line, '\n');
        if (strncmp(line, prefix, strlen(prefix)) == 0) {
            const char *start = line + strlen(prefix);
            size_t length = next ? (size_t)(next - start) : strlen(start);
            if (length >= capacity)
                length = capacity - 1;
            memcpy(value, start, length);
            value[length] = '\0';
            return value;
        }
        line = next ? next + 1 : NULL;
    }
    return NULL;
}

char *device_probe_output(void)
{
    char *output = malloc(DEVICE_PROBE_OUTPUT);
    cr_assert_not_null(output);
    output[0] = '\0';
    return output;
}

DeviceProbeTime device_probe_time(const char *output, int rank, const char *when,
                                  const char *kind)
{
    char key[96], value[256];
    snprintf(key, sizeof key, "time %s %s", when, kind);
    cr_assert_not_null(device_probe_line(output, rank, key, value, sizeof value),
                       "rank %d has no '%s' line: %s", rank, key, output);
    DeviceProbeTime time;
    cr_assert_eq(sscanf(value, "busy %lf exposed %lf operations %d", &time.busy_ms,
                        &time.exposed_ms, &time.operations), 3,
                 "rank %d %s: '%s'", rank, key, value);
    return time;
}

void device_probe_expect_synchronous_times(const char *output, double late_ms)
{
    static const char *const kinds[4] = {"fsdp_allgather", "fsdp_reducescatter", "pp_send",
                                         "pp_recv"};
    for (int rank = 0; rank < 2; rank++) {
        /* each rank gathers and reduce-scatters once; rank 0 sends, rank 1 receives */
        const int operations[4] = {1, 1, rank == 0, rank == 1};
        for (int k = 0; k < 4; k++) {
            const DeviceProbeTime late = device_probe_time(output, rank, "late", kinds[k]);
            cr_expect_eq(late.operations, operations[k], "rank %d %s: %d operations", rank,
                         kinds[k], late.operations);
            cr_expect_eq(late.busy_ms, late.exposed_ms, "rank %d %s: busy %.3f, exposed %.3f",
                         rank, kinds[k], late.busy_ms, late.exposed_ms);
            cr_expect_geq(late.exposed_ms, 0, "rank %d %s", rank, kinds[k]);
            for (int w = 0; w < 2; w++) {
                const DeviceProbeTime none =
                    device_probe_time(output, rank, w ? "off" : "again", kinds[k]);
                cr_expect_eq(none.operations, 0, "rank %d %s %s", rank, w ? "off" : "again",
                             kinds[k]);
                cr_expect_eq(none.busy_ms, 0, "rank %d %s", rank, kinds[k]);
            }
        }
    }
    const DeviceProbeTime gathered = device_probe_time(output, 0, "late", "fsdp_allgather");
    cr_expect_geq(gathered.exposed_ms, 0.8 * late_ms,
                  "rank 0 waited %.3f ms for a rank %.0f ms late", gathered.exposed_ms, late_ms);
    const DeviceProbeTime received = device_probe_time(output, 1, "late", "pp_recv");
    cr_expect_geq(received.exposed_ms, 0.8 * late_ms,
                  "rank 1 waited %.3f ms for a sender %.0f ms late", received.exposed_ms,
                  late_ms);
}
