/* tests/test_eval.c — `fathom eval` on a checkpoint (DESIGN 6). */
#include "tests/support.h"
#include "tests/train_support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char output[1 << 16];
static char dir[256];

static void train_a_little(void)
{
    test_make_temp_dir(dir, "eval");
    tiny_config_write(dir, "checkpoint:\n  every: 4\n");
    int code = tiny_train(dir, "--set train.steps=4", output, sizeof output);
    cr_assert_eq(code, 0, "%s", output);
}

static void clean(void)
{
    test_remove_tree(dir);
}

static double parse_val_loss(const char *text)
{
    const char *at = strstr(text, "val_loss ");
    cr_assert_not_null(at, "no val_loss in:\n%s", text);
    return strtod(at + 9, NULL);
}

Test(eval, reports_the_loss_of_a_checkpoint_deterministically, .init = train_a_little,
     .fini = clean, .timeout = 60)
{
    char arguments[600];
    snprintf(arguments, sizeof arguments, "eval --checkpoint %s/run --samples 6", dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    double first = parse_val_loss(output);
    cr_assert(first > 0.5 && first < 6.0, "val_loss %g", first);
    cr_assert(strstr(output, "6 windows"), "%s", output);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    cr_assert(parse_val_loss(output) == first);
}

Test(eval, raw_and_ema_weights_differ, .init = train_a_little, .fini = clean, .timeout = 60)
{
    char arguments[600];
    snprintf(arguments, sizeof arguments, "eval --checkpoint %s/run --samples 4 --weights raw",
             dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    double raw = parse_val_loss(output);
    snprintf(arguments, sizeof arguments, "eval --checkpoint %s/run --samples 4 --weights ema",
             dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    cr_assert(parse_val_loss(output) != raw);
}

/* The dumped logits reproduce the reported cross-entropy (targets are the next tokens of
 * the same windows, which eval reads in file order). */
Test(eval, dump_logits_writes_tokens_and_logits_that_give_the_loss, .init = train_a_little,
     .fini = clean, .timeout = 60)
{
    char arguments[600], command[2048];
    snprintf(arguments, sizeof arguments,
             "eval --checkpoint %s/run --samples 3 --weights raw --dump-logits %s/logits.h5",
             dir, dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    snprintf(command, sizeof command,
             "python3 -c \"import h5py, numpy as np; f = h5py.File('%s/logits.h5', 'r'); "
             "t = f['tokens'][:]; l = f['logits'][:].astype(np.float64); "
             "assert t.shape == (3, 32) and t.dtype == np.uint32, t.shape; "
             "assert l.shape == (3, 32, 256) and f['logits'].dtype == np.float32; "
             "m = l.max(-1, keepdims=True); "
             "lse = np.log(np.exp(l - m).sum(-1)) + m[..., 0]; "
             "ce = lse[:, :-1] - "
             "np.take_along_axis(l[:, :-1], t[:, 1:, None].astype(np.int64), -1)[..., 0]; "
             "print(ce.mean())\"",
             dir);
    char result[4096];
    cr_assert_eq(test_run_command(command, result, sizeof result), 0, "%s", result);
    /* positions 0..T-2 only (the last target is not in the dump), so compare loosely */
    double dumped = strtod(result, NULL);
    const char *ce_text = strstr(output, "| ce ");
    cr_assert_not_null(ce_text, "%s", output);
    double reported = strtod(ce_text + 5, NULL);
    cr_assert(dumped > 0.8 * reported && dumped < 1.2 * reported, "dumped ce %g vs reported %g",
              dumped, reported);
}

Test(eval, missing_checkpoint_exits_3)
{
    int code = test_run_fathom("eval --checkpoint /nonexistent/run", output, sizeof output);
    cr_assert_eq(code, 3, "exit %d:\n%s", code, output);
    cr_assert(strstr(output, "/nonexistent/run"), "%s", output);
}

/* Several ranks would each load the whole model onto one GPU and evaluate it all: eval (and
 * probe, inspect, convert, plan) refuse mpirun, naming it. */
Test(eval, under_mpirun_is_a_usage_error_naming_the_ranks, .timeout = 60)
{
    char command[1024];
    snprintf(command, sizeof command,
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe "
             "-np 2 '%s' eval --checkpoint /nonexistent 2>&1", test_fathom_binary());
    const int code = test_run_command(command, output, sizeof output);
    cr_expect_eq(code, 2, "exit %d: %s", code, output);
    cr_expect(strstr(output, "fathom eval runs on one process, and mpirun started 2"), "%s",
              output);
}
