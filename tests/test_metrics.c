/* tests/test_metrics.c — metrics.jsonl, the console line and the MFU arithmetic (DESIGN 6).
 *
 * The JSON is read back by Python's json module with NaN/Infinity literals refused, so a line
 * passes only if a strict JSON reader accepts it.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/metrics.h"
#include "runtime/timer.h"
#include "tests/support.h"

static const char *const strict_json_checker =
    "import json, sys\n"
    "def refuse(constant):\n"
    "    raise ValueError('non-JSON constant ' + constant)\n"
    "STEP = {'step', 'loss', 'ce', 'zloss', 'grad_norm', 'lr', 'tokens', 'tokens_per_s',\n"
    "        'tokens_per_s_per_device', 'tflops_per_device', 'mfu', 'mem_gib', 'skipped',\n"
    "        'comm'}\n"
    "COMM = {'pp_send_bytes', 'pp_recv_bytes', 'pp_summary_bytes',\n"
    "        'pp_summary_bytes_uncached', 'fsdp_allgather_bytes',\n"
    "        'fsdp_reducescatter_bytes', 'allreduce_bytes', 'fsdp_allgather_ms',\n"
    "        'fsdp_allgather_exposed_ms', 'fsdp_reducescatter_ms',\n"
    "        'fsdp_reducescatter_exposed_ms', 'pp_send_ms', 'pp_send_exposed_ms',\n"
    "        'pp_recv_ms', 'pp_recv_exposed_ms'}\n"
    "EVAL = {'step', 'val_loss', 'val_ppl'}\n"
    "path, stages, check = sys.argv[1], int(sys.argv[2]), sys.argv[3]\n"
    "lines = [json.loads(l, parse_constant=refuse) for l in open(path)]\n"
    "for line in lines:\n"
    "    if 'val_loss' in line:\n"
    "        assert set(line) == EVAL, sorted(line)\n"
    "        continue\n"
    "    assert set(line) == STEP, sorted(set(line) ^ STEP)\n"
    "    assert len(line['comm']) == stages, line['comm']\n"
    "    for comm in line['comm']:\n"
    "        assert set(comm) == COMM, sorted(set(comm) ^ COMM)\n"
    "exec(check)\n"
    "print('ok', len(lines))\n";

/* Runs the checker on <dir>/metrics.jsonl with a Python expression `check` that may read
 * `lines`; returns the exit code and leaves the output in `output`. */
static int check_metrics_file(const char *dir, int stages, const char *check, char *output,
                              size_t capacity)
{
    char script[512], command[2048];
    snprintf(script, sizeof script, "%s/check.py", dir);
    test_write_file(script, strict_json_checker);
    snprintf(command, sizeof command, "python3 '%s' '%s/metrics.jsonl' %d \"%s\"", script,
             dir, stages, check);
    return test_run_command(command, output, capacity);
}

static MetricsComm comm_of_stage(int stage)
{
    MetricsComm comm = {
        .pp_send_bytes = 1000 * (stage + 1), .pp_recv_bytes = 900 * (stage + 1),
        .pp_summary_bytes = 500, .pp_summary_bytes_uncached = 800,
        .fsdp_allgather_bytes = 1 << 20, .fsdp_reducescatter_bytes = 1 << 19,
        .allreduce_bytes = 8,
        .fsdp_allgather_ms = 12.5, .fsdp_allgather_exposed_ms = 1.25,
        .fsdp_reducescatter_ms = 20, .fsdp_reducescatter_exposed_ms = 0,
        .pp_send_ms = 3, .pp_send_exposed_ms = 0, .pp_recv_ms = 7.5 * (stage + 1),
        .pp_recv_exposed_ms = 7.5,
    };
    return comm;
}

static MetricsStep step_example(const MetricsComm *comm, int n_stages)
{
    MetricsStep step = {
        .step = 120, .loss = 2.914, .ce = 2.9, .zloss = 0.014, .grad_norm = 0.41, .lr = 3e-4,
        .tokens = 120 * 524288LL, .tokens_per_s = 48200, .tokens_per_s_per_device = 6025,
        .tflops_per_device = 507.4, .mfu = 0.513, .mem_gib = 71.2, .skipped = 0,
        .comm = comm, .n_stages = n_stages,
    };
    return step;
}

Test(metrics, jsonl_lines_parse_as_json_with_exactly_the_design_keys)
{
    char dir[256], output[4096];
    test_make_temp_dir(dir, "metrics");
    MetricsComm comm[3] = {comm_of_stage(0), comm_of_stage(1), comm_of_stage(2)};
    MetricsStep step = step_example(comm, 3);
    MetricsLog *log = metrics_open(dir, true);
    metrics_write_step(log, &step);
    step.step = 121;
    metrics_write_step(log, &step);
    metrics_write_eval(log, 121, 2.5);
    metrics_close(log);
    int code = check_metrics_file(dir, 3,
        "assert len(lines) == 3; assert lines[1]['step'] == 121; "
        "assert lines[0]['comm'][2]['pp_send_bytes'] == 3000; "
        "assert lines[0]['comm'][2]['pp_recv_ms'] == 22.5; "
        "assert lines[0]['comm'][0]['fsdp_allgather_exposed_ms'] == 1.25; "
        "assert lines[0]['tokens'] == 120 * 524288", output, sizeof output);
    cr_assert_eq(code, 0, "%s", output);
    test_remove_tree(dir);
}

Test(metrics, non_finite_numbers_are_written_as_null)
{
    char dir[256], output[4096];
    test_make_temp_dir(dir, "metrics");
    MetricsComm comm = comm_of_stage(0);
    MetricsStep step = step_example(&comm, 1);
    step.loss = NAN;
    step.grad_norm = INFINITY;
    step.tokens_per_s = -INFINITY;
    MetricsLog *log = metrics_open(dir, true);
    metrics_write_step(log, &step);
    metrics_close(log);
    int code = check_metrics_file(dir, 1,
        "assert lines[0]['loss'] is None; assert lines[0]['grad_norm'] is None; "
        "assert lines[0]['tokens_per_s'] is None; assert lines[0]['lr'] == 3e-4",
        output, sizeof output);
    cr_assert_eq(code, 0, "%s", output);
    test_remove_tree(dir);
}

Test(metrics, eval_line_carries_step_val_loss_and_val_ppl)
{
    char dir[256], output[4096];
    test_make_temp_dir(dir, "metrics");
    MetricsLog *log = metrics_open(dir, true);
    metrics_write_eval(log, 500, log1p(1.0)); /* ppl 2 */
    metrics_close(log);
    int code = check_metrics_file(dir, 0,
        "assert lines[0]['step'] == 500; assert abs(lines[0]['val_ppl'] - 2) < 1e-7",
        output, sizeof output);
    cr_assert_eq(code, 0, "%s", output);
    test_remove_tree(dir);
}

Test(metrics, opening_appends_unless_asked_to_start_fresh)
{
    char dir[256], output[4096];
    test_make_temp_dir(dir, "metrics");
    MetricsStep step = step_example(NULL, 0);
    MetricsLog *log = metrics_open(dir, true);
    metrics_write_step(log, &step);
    metrics_close(log);
    log = metrics_open(dir, false); /* a resumed run */
    metrics_write_step(log, &step);
    metrics_close(log);
    cr_assert_eq(check_metrics_file(dir, 0, "assert len(lines) == 2", output, sizeof output),
                 0, "%s", output);
    TestCapture capture;
    test_capture_begin(&capture, STDOUT_FILENO);
    log = metrics_open(dir, true);
    char notice[1024];
    test_capture_end(&capture, notice, sizeof notice);
    cr_assert(strstr(notice, "held an earlier run's metrics; kept as"), "%s", notice);
    metrics_write_step(log, &step);
    metrics_close(log);
    cr_assert_eq(check_metrics_file(dir, 0, "assert len(lines) == 1", output, sizeof output),
                 0, "%s", output);
    test_remove_tree(dir);
}

Test(metrics, a_fresh_run_keeps_an_earlier_log_instead_of_wiping_it)
{
    char dir[256], kept[300];
    test_make_temp_dir(dir, "metrics-kept");
    MetricsStep step = step_example(NULL, 0);
    for (int run = 0; run < 3; run++) { /* three fresh starts in one run_dir */
        TestCapture capture;
        char notice[1024], expected[700];
        test_capture_begin(&capture, STDOUT_FILENO);
        MetricsLog *log = metrics_open(dir, true);
        test_capture_end(&capture, notice, sizeof notice);
        snprintf(expected, sizeof expected, "fathom: %s/metrics.jsonl held an earlier run's "
                 "metrics; kept as %s/metrics.jsonl.%d\n", dir, dir, run);
        if (run == 0)
            cr_assert_str_empty(notice, "the first run keeps nothing");
        else
            cr_assert_str_eq(notice, expected);
        for (int line = 0; line <= run; line++)
            metrics_write_step(log, &step);
        metrics_close(log);
    }
    for (int n = 1; n <= 2; n++) { /* the first run's log is .1 (1 line), the second's .2 */
        snprintf(kept, sizeof kept, "%s/metrics.jsonl.%d", dir, n);
        FILE *file = fopen(kept, "r");
        cr_assert(file, "%s was not kept", kept);
        int lines = 0;
        for (int c; (c = fgetc(file)) != EOF;)
            lines += c == '\n';
        fclose(file);
        cr_expect_eq(lines, n, "%s has %d lines", kept, lines);
    }
    test_remove_tree(dir);
}

/* A run that logged steps 1..5 but last committed step 3: resuming drops 4 and 5 (and the
 * eval line of step 4) so the steps taken again appear once. */
Test(metrics, resuming_drops_the_lines_logged_after_the_checkpoint)
{
    char dir[256], output[4096];
    test_make_temp_dir(dir, "metrics-resume");
    MetricsStep step = step_example(NULL, 0);
    MetricsLog *log = metrics_open(dir, true);
    for (int i = 1; i <= 5; i++) {
        step.step = i;
        metrics_write_step(log, &step);
        if (i == 2 || i == 4)
            metrics_write_eval(log, i, 1.5);
    }
    metrics_close(log);
    log = metrics_open_resumed(dir, 3);
    step.step = 4;
    metrics_write_step(log, &step);
    metrics_close(log);
    cr_assert_eq(check_metrics_file(dir, 0,
                                    "assert [l['step'] for l in lines] == [1, 2, 2, 3, 4], "
                                    "[l['step'] for l in lines]",
                                    output, sizeof output),
                 0, "%s", output);
    test_remove_tree(dir);
}

static void open_in_a_missing_directory(void *unused)
{
    (void)unused;
    metrics_open("/nonexistent-fathom-run-dir/sub", false);
}

Test(metrics, opening_in_a_missing_directory_exits_with_code_3)
{
    test_expect_fatal(open_in_a_missing_directory, NULL, 3,
                      "cannot open /nonexistent-fathom-run-dir/sub/metrics.jsonl for writing");
}

Test(metrics, console_line_matches_the_design_example)
{
    MetricsComm comm[2] = {{.pp_send_bytes = 6200000}, {.pp_send_bytes = 6200000}};
    MetricsStep step = step_example(comm, 2);
    char line[256];
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert_str_eq(line, "step 120/1000 | loss 2.914 | gnorm 0.41 | lr 3.0e-04 | "
                           "48.2k tok/s | 51.3% MFU | 71.2 GiB | pp 12.4 MB/step");
}

Test(metrics, console_scales_tokens_per_second_to_plain_k_and_M)
{
    MetricsStep step = step_example(NULL, 0);
    char line[256];
    step.tokens_per_s = 950;
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert(strstr(line, "| 950 tok/s |"), "%s", line);
    step.tokens_per_s = 999970;
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert(strstr(line, "| 1.0M tok/s |"), "%s", line);
    step.tokens_per_s = 2.34e6;
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert(strstr(line, "| 2.3M tok/s |"), "%s", line);
}

Test(metrics, console_scales_pipeline_bytes_in_powers_of_1000)
{
    MetricsComm comm = {0};
    MetricsStep step = step_example(&comm, 1);
    char line[256];
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert(strstr(line, "| pp 0 B/step"), "%s", line);
    comm.pp_send_bytes = 512;
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert(strstr(line, "| pp 512 B/step"), "%s", line);
    comm.pp_send_bytes = 12400;
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert(strstr(line, "| pp 12.4 kB/step"), "%s", line);
    comm.pp_send_bytes = 3100000000LL;
    metrics_format_console(&step, 1000, line, sizeof line);
    cr_assert(strstr(line, "| pp 3.1 GB/step"), "%s", line);
}

Test(metrics, flops_per_token_of_a_small_config_matches_the_hand_count)
{
    /* 2 layers, d 64, 4 heads of 16, ffn 256, V 256, T 128:
     * per layer q,k,v,o 4 * 64 * 64 = 16384, gate,up,down 3 * 64 * 256 = 49152 -> 65536;
     * 6 * (131072 + 256 * 64) + 6 * 2 * 128 * 4 * 16 = 884736 + 98304 */
    double flops = metrics_flops_per_token(131072, 256, 64, 2, 128, 4, 16);
    cr_assert_float_eq(flops, 983040.0, 1e-6);
}

Test(metrics, mfu_is_tflops_per_device_over_the_989_tflops_peak)
{
    MetricsStep step = {0};
    /* 8 devices, 8e5 tokens in 2 s -> 5e4 tok/s per device; x 6e9 flops = 300 TFLOP/s */
    metrics_fill_throughput(&step, 8e5, 2.0, 8, 6e9);
    cr_assert_float_eq(step.tokens_per_s, 4e5, 1e-6);
    cr_assert_float_eq(step.tokens_per_s_per_device, 5e4, 1e-9);
    cr_assert_float_eq(step.tflops_per_device, 300.0, 1e-9);
    cr_assert_float_eq(step.mfu, 300.0 / 989.0, 1e-12);
}

Test(metrics, peak_resident_memory_is_reported_in_gib)
{
    double gib = metrics_peak_rss_gib();
    /* a running test process holds at least a MiB and far less than a TiB */
    cr_assert(gib > 1.0 / 1024 && gib < 1024, "%g GiB", gib);
}

Test(metrics, timer_counts_wall_seconds_forward)
{
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 20 * 1000 * 1000};
    double start = timer_seconds();
    nanosleep(&pause, NULL);
    double elapsed = timer_seconds() - start;
    cr_assert(elapsed >= 0.02 && elapsed < 1.0, "%g s", elapsed);
}

Test(metrics, the_console_leaves_mfu_out_where_no_peak_is_known)
{
    MetricsStep step = step_example(NULL, 0);
    char line[512];
    step.mfu = 0.513;
    metrics_format_console(&step, 10, line, sizeof line);
    cr_expect(strstr(line, "51.3% MFU"), "%s", line);
    step.mfu = NAN;
    metrics_format_console(&step, 10, line, sizeof line);
    cr_expect(!strstr(line, "MFU"), "%s", line);
    cr_expect(strstr(line, "tok/s | "), "%s", line);
}
