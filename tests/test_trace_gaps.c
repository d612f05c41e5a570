/* tests/test_trace_gaps.c — launch/bench/trace_gaps.py reads a timeline of
 * launch/tools/kernel_trace.c's format and says how long the GPU was busy and idle in one
 * period, what it spent its time on, and which host calls ran while it waited. A made-up
 * timeline with known gaps holds it to the numbers.
 */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* Two periods opened by "embedding_forward": each a 1 us embedding, two 100 us matmuls that
 * overlap by 10 us (their union counts once: 190 us), then a 50 us host copy call during
 * which the GPU waits 40 us and copies for 10 us (device to host, 4096 bytes). Times in ns. */
#define FIRST_PERIOD                                                   \
    "K,0,1000,void embedding_forward_kernel<1>(x)\n"                   \
    "K,1000,101000,matmul\n"                                           \
    "K,91000,191000,matmul\n"                                          \
    "R,191000,241000,cudaMemcpy\n"                                     \
    "C,231000,241000,4096,2\n"

static const char trace[] =
    FIRST_PERIOD
    "K,241000,242000,void embedding_forward_kernel<1>(x)\n"
    "K,242000,342000,matmul\n"
    "K,332000,432000,matmul\n"
    "R,432000,482000,cudaMemcpy\n"
    "C,472000,482000,4096,2\n"
    "K,482000,483000,void embedding_forward_kernel<1>(x)\n";

Test(trace_gaps, gives_the_busy_and_idle_time_of_a_period_and_the_host_calls_in_its_gaps)
{
    char dir[256], path[300], command[1024], output[8192];
    test_make_temp_dir(dir, "trace-gaps");
    snprintf(path, sizeof path, "%s/trace.csv", dir);
    test_write_file(path, trace);
    snprintf(command, sizeof command,
             "python3 '%s/launch/bench/trace_gaps.py' '%s' --marker embedding_forward "
             "--every 1 --gap-us 5",
             test_source_dir(), path);
    int code = test_run_command(command, output, sizeof output);
    cr_assert_eq(code, 0, "trace_gaps.py failed:\n%s", output);
    /* the last period, 241 us: busy 1 + 190 (the matmuls' union) + 10 = 201 us, idle 40 */
    cr_expect(strstr(output, "window 0.2 ms (4 GPU activities): busy 0.2 ms, idle 0.0 ms "
                             "(16.6%)"),
              "%s", output);
    cr_expect(strstr(output, "0.20 ms     2x  matmul"), "%s", output);
    cr_expect(strstr(output, "0.04 ms  cudaMemcpy"), "%s", output);
    test_remove_tree(dir);
}

/* The same timeline from another build whose matmuls took 150 us each in the last period
 * (300 us against 200) and whose copy is unchanged: --against lists the matmuls' change
 * and the totals, and leaves out what did not move. */
static const char slower_trace[] =
    FIRST_PERIOD
    "K,241000,242000,void embedding_forward_kernel<1>(x)\n"
    "K,242000,392000,matmul\n"
    "K,392000,542000,matmul\n"
    "R,542000,592000,cudaMemcpy\n"
    "C,582000,592000,4096,2\n"
    "K,592000,593000,void embedding_forward_kernel<1>(x)\n";

Test(trace_gaps, against_another_timeline_lists_each_kernel_that_moved)
{
    char dir[256], path[300], other[300], command[1400], output[8192];
    test_make_temp_dir(dir, "trace-gaps-against");
    snprintf(path, sizeof path, "%s/trace.csv", dir);
    snprintf(other, sizeof other, "%s/slower.csv", dir);
    test_write_file(path, trace);
    test_write_file(other, slower_trace);
    snprintf(command, sizeof command,
             "python3 '%s/launch/bench/trace_gaps.py' '%s' --marker embedding_forward "
             "--every 1 --against '%s' --moved-us 50",
             test_source_dir(), path, other);
    int code = test_run_command(command, output, sizeof output);
    cr_assert_eq(code, 0, "trace_gaps.py failed:\n%s", output);
    /* 200 us of matmul here against 300 us there; the copy (10 us both) is not listed */
    cr_expect(strstr(output, "   -0.10 ms       0.20 ms     2x   against     0.30 ms     2x   "
                             "matmul"),
              "%s", output);
    cr_expect(strstr(output, "   -0.10 ms       0.21 ms in all against     0.31 ms"), "%s",
              output);
    cr_expect_null(strstr(output, "against     0.01 ms"), "%s", output);
    test_remove_tree(dir);
}
