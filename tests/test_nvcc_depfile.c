/* tests/test_nvcc_depfile.c — launch/tools/nvcc-depfile, the CUDA compiler launch/setup.sh
 * configures: a compile (-c, -o OUTPUT) gets -MD -MF OUTPUT.d, the dependency file that
 * meson's ninja rule reads, and anything else reaches nvcc as it was given. FATHOM_NVCC
 * points the script at a stand-in that prints its arguments, so no nvcc is needed. */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The arguments nvcc-depfile hands to nvcc for `arguments`, one line. */
static void nvcc_arguments_for(const char *arguments, char *output, size_t capacity)
{
    char stand_in[] = "/tmp/fathom-nvcc-stand-in-XXXXXX";
    const int fd = mkstemp(stand_in);
    cr_assert_geq(fd, 0);
    const char script[] = "#!/bin/sh\nprintf '%s\\n' \"$*\"\n";
    cr_assert_eq(write(fd, script, strlen(script)), (ssize_t)strlen(script));
    close(fd);
    chmod(stand_in, 0700);
    char command[1024];
    snprintf(command, sizeof command, "FATHOM_NVCC=%s '%s/launch/tools/nvcc-depfile' %s",
             stand_in, test_source_dir(), arguments);
    const int status = test_run_command(command, output, capacity);
    unlink(stand_in);
    cr_assert_eq(status, 0, "%s", output);
}

Test(nvcc_depfile, a_compile_asks_for_the_dependency_file_ninja_reads)
{
    char output[1024];
    nvcc_arguments_for("-O3 -o kernels/x.cu.o -c ../kernels/cuda/x.cu", output, sizeof output);
    cr_expect_str_eq(output,
                     "-O3 -o kernels/x.cu.o -c ../kernels/cuda/x.cu -MD -MF kernels/x.cu.o.d\n");
}

Test(nvcc_depfile, a_link_or_a_version_query_passes_through_unchanged)
{
    char output[1024];
    nvcc_arguments_for("-shared -o libx.so a.o b.o", output, sizeof output);
    cr_expect_str_eq(output, "-shared -o libx.so a.o b.o\n");
    nvcc_arguments_for("--version", output, sizeof output);
    cr_expect_str_eq(output, "--version\n");
}
