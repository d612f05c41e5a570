/* tests/test_train.c — `fathom train` end to end on the synthetic corpus (DESIGN 3, 5, 6). */
#include "runtime/config.h"
#include "tests/support.h"
#include "tests/train_support.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char output[1 << 16];

/* The stated margin: 60 steps of the tiny model take the loss from about ln(256) = 5.5
 * (uniform over bytes) down by at least 2 nats. */
Test(train, synthetic_training_lowers_the_loss_by_two_nats_in_60_steps, .timeout = 120)
{
    char dir[256];
    test_make_temp_dir(dir, "train-loss");
    tiny_config_write(dir, "");
    int code = tiny_train(dir, "--set train.steps=60 --set optim.warmup_steps=5",
                          output, sizeof output);
    cr_assert_eq(code, 0, "fathom train failed (%d):\n%s", code, output);
    double losses[64];
    char run[300];
    snprintf(run, sizeof run, "%s/run", dir);
    int n = metrics_read_losses(run, losses, NULL, 64);
    cr_assert_eq(n, 60, "expected 60 metrics lines, got %d", n);
    cr_assert_gt(losses[0], 5.0, "initial loss %.3f should be near ln(256)", losses[0]);
    cr_assert_lt(losses[59], losses[0] - 2.0, "loss went from %.3f to %.3f", losses[0],
                 losses[59]);
    test_remove_tree(dir);
}

Test(train, two_runs_with_the_same_seed_are_bitwise_identical, .timeout = 120)
{
    char a[256], b[256];
    test_make_temp_dir(a, "train-same-a");
    test_make_temp_dir(b, "train-same-b");
    tiny_config_write(a, "checkpoint:\n  every: 6\n");
    tiny_config_write(b, "checkpoint:\n  every: 6\n");
    cr_assert_eq(tiny_train(a, "", output, sizeof output), 0, "%s", output);
    cr_assert_eq(tiny_train(b, "", output, sizeof output), 0, "%s", output);
    train_expect_six_equal_steps(a, b);
    test_remove_tree(a);
    test_remove_tree(b);
}

Test(train, a_different_seed_gives_different_weights, .timeout = 120)
{
    char a[256], b[256], step_a[400], step_b[400];
    test_make_temp_dir(a, "train-seed-a");
    test_make_temp_dir(b, "train-seed-b");
    tiny_config_write(a, "checkpoint:\n  every: 2\n");
    tiny_config_write(b, "checkpoint:\n  every: 2\n");
    cr_assert_eq(tiny_train(a, "--set train.steps=2", output, sizeof output), 0, "%s", output);
    cr_assert_eq(tiny_train(b, "--set train.steps=2 --set seed=8", output, sizeof output), 0,
                 "%s", output);
    snprintf(step_a, sizeof step_a, "%s/run/checkpoints/step_00000002", a);
    snprintf(step_b, sizeof step_b, "%s/run/checkpoints/step_00000002", b);
    cr_assert_not(checkpoints_bitwise_equal(step_a, step_b));
    test_remove_tree(a);
    test_remove_tree(b);
}

/* 6 steps straight, against 3 steps, a resume from the step-3 checkpoint, and 3 more. */
Test(train, three_steps_resume_three_steps_equals_six_straight, .timeout = 120)
{
    char straight[256], resumed[256];
    test_make_temp_dir(straight, "train-straight");
    test_make_temp_dir(resumed, "train-resumed");
    train_expect_resume_equals_straight(straight, resumed, "");
    test_remove_tree(straight);
    test_remove_tree(resumed);
}

/* The same through an MSAR model (DESIGN 2.2): two streams with kernels 1 and 3 make its
 * stream convolutions rank-3 [m, k_max, d] = [2, 3, 64] tensors (DESIGN 2.3), which the
 * step-3 checkpoint must hold as such for the resume to restore them. */
Test(train, msar_run_checkpoints_and_resumes_bitwise, .timeout = 120)
{
    char straight[256], resumed[256], command[1024];
    test_make_temp_dir(straight, "train-msar-straight");
    test_make_temp_dir(resumed, "train-msar-resumed");
    train_expect_resume_equals_straight(straight, resumed,
                           "--set residual.mode=msar --set residual.streams=2 "
                           "--set 'residual.stream_kernels=[1,3]' --set residual.heads=2");
    snprintf(command, sizeof command,
             "python3 -c \"import h5py; f = h5py.File('%s/run/checkpoints/step_00000003/"
             "index.h5', 'r'); print(list(f['model/model.route_streams.0.conv'].shape))\"",
             straight);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    cr_assert_str_eq(output, "[2, 3, 64]\n");
    test_remove_tree(straight);
    test_remove_tree(resumed);
}

/* SIGTERM finishes the step in flight, saves, exits 0; training again finishes the run with
 * the weights of an uninterrupted one. */
/* `signal_number` during the run: it finishes the step, saves, exits 0, and the resumed run
 * ends bitwise where an uninterrupted one does. */
static void expect_signal_saves_and_resume_matches(int signal_number)
{
    char straight[256], stopped[256], config[300], step_a[400], step_b[400];
    test_make_temp_dir(straight, "train-term-a");
    test_make_temp_dir(stopped, "train-term-b");
    const char *extra = "checkpoint:\n  every: 0\n  keep_last: 5\n";
    tiny_config_write(straight, extra);
    tiny_config_write(stopped, extra);
    cr_assert_eq(tiny_train(straight, "--set train.steps=40 --set checkpoint.every=40",
                            output, sizeof output), 0, "%s", output);

    snprintf(config, sizeof config, "%s/config.yaml", stopped);
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        if (!freopen("/dev/null", "w", stdout))
            _exit(99);
        execl(test_fathom_binary(), test_fathom_binary(), "train", config, "--set",
              "train.steps=40", (char *)NULL);
        _exit(98);
    }
    /* wait for the first metrics line, then ask it to stop */
    char metrics[400];
    snprintf(metrics, sizeof metrics, "%s/run/metrics.jsonl", stopped);
    struct stat info;
    for (int tries = 0; tries < 600 && (stat(metrics, &info) || info.st_size == 0); tries++)
        usleep(10000);
    kill(child, signal_number);
    int status;
    waitpid(child, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "stopped run exit status %d",
              status);
    char latest[400];
    snprintf(latest, sizeof latest, "%s/run/checkpoints/latest", stopped);
    cr_assert_eq(stat(latest, &info), 0, "signal %d left no checkpoint", signal_number);

    cr_assert_eq(tiny_train(stopped, "--set train.steps=40 --set checkpoint.every=40",
                            output, sizeof output), 0, "%s", output);
    snprintf(step_a, sizeof step_a, "%s/run/checkpoints/step_00000040", straight);
    snprintf(step_b, sizeof step_b, "%s/run/checkpoints/step_00000040", stopped);
    cr_assert(checkpoints_bitwise_equal(step_a, step_b));
    test_remove_tree(straight);
    test_remove_tree(stopped);
}

Test(train, sigterm_saves_and_the_resumed_run_matches_an_uninterrupted_one, .timeout = 180)
{
    expect_signal_saves_and_resume_matches(SIGTERM);
}

Test(train, a_first_ctrl_c_saves_like_sigterm, .timeout = 180)
{
    expect_signal_saves_and_resume_matches(SIGINT);
}

Test(train, index_h5_names_the_model_tensors_by_their_design_names, .timeout = 60)
{
    char dir[256], command[1024];
    test_make_temp_dir(dir, "train-index");
    tiny_config_write(dir, "checkpoint:\n  every: 1\n");
    cr_assert_eq(tiny_train(dir, "--set train.steps=1", output, sizeof output), 0, "%s",
                 output);
    snprintf(command, sizeof command,
             "python3 -c \"import h5py; f = h5py.File('%s/run/checkpoints/step_00000001/"
             "index.h5', 'r'); m = f['model']; "
             "assert m['model.layers.1.self_attn.q_proj.weight'].shape == (64, 64); "
             "assert m['model.layers.0.self_attn.k_proj.weight'].shape == (32, 64); "
             "assert m['model.layers.0.mlp.down_proj.weight'].shape == (64, 160); "
             "assert m['model.embed_tokens.weight'].shape == (256, 64); "
             "assert m['lm_head.weight'].shape == (256, 64); "
             "assert m['model.norm.weight'].shape == (64,); "
             "assert abs(m['model.norm.weight'][:].mean() - 1) < 0.1; "
             "assert 'optim' in f and 'ema' in f; "
             "assert f.attrs['step'] == 1; print(len(m))\"",
             dir);
    int code = test_run_command(command, output, sizeof output);
    cr_assert_eq(code, 0, "h5py check failed:\n%s", output);
    cr_assert_eq(atoi(output), 3 + 2 * 9, "tensor count: %s", output); /* embed, norm, head */
    test_remove_tree(dir);
}

Test(train, non_finite_steps_past_max_skipped_exit_4, .timeout = 60)
{
    char dir[256];
    test_make_temp_dir(dir, "train-nan");
    tiny_config_write(dir, "");
    int code = tiny_train(dir,
                          "--set optim.lr=1e30 --set optim.warmup_steps=0 "
                          "--set optim.grad_clip=0 --set train.max_skipped=2 "
                          "--set train.steps=20",
                          output, sizeof output);
    cr_assert_eq(code, 4, "exit %d:\n%s", code, output);
    cr_assert(strstr(output, "train.max_skipped"), "message:\n%s", output);
    test_remove_tree(dir);
}

/* The first update blows the weights up (lr 1e30, no clipping): every later step is
 * non-finite and skipped. The checkpoint records both counts, so a resumed run continues the
 * AdamW bias correction where the updates stopped, not at the step number. */
Test(train, checkpoints_record_applied_and_skipped_updates, .timeout = 60)
{
    char dir[256], command[1024];
    test_make_temp_dir(dir, "train-skipped");
    tiny_config_write(dir, "checkpoint:\n  every: 4\n");
    int code = tiny_train(dir,
                          "--set optim.lr=1e30 --set optim.warmup_steps=0 "
                          "--set optim.grad_clip=0 --set train.max_skipped=10 "
                          "--set train.steps=4",
                          output, sizeof output);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, output);
    snprintf(command, sizeof command,
             "python3 -c \"import h5py; a = h5py.File('%s/run/checkpoints/step_00000004/"
             "index.h5', 'r').attrs; print(a['step'], a['optimizer_steps'], "
             "a['skipped_steps'])\"",
             dir);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    cr_assert(strstr(output, "4 1 3"), "step, optimizer_steps, skipped_steps: %s", output);
    test_remove_tree(dir);
}

/* checkpoint.save_final (default true): a run that saves nothing periodically still leaves
 * its last step, which eval, probe and a resume then find; false leaves none. */
Test(train, the_last_step_is_saved_unless_save_final_is_false, .timeout = 60)
{
    char dir[256], step_dir[400];
    struct stat status;
    test_make_temp_dir(dir, "train-final");
    tiny_config_write(dir, "checkpoint:\n  every: 0\n");
    cr_assert_eq(tiny_train(dir, "--set train.steps=3", output, sizeof output), 0, "%s",
                 output);
    snprintf(step_dir, sizeof step_dir, "%s/run/checkpoints/step_00000003/COMMITTED", dir);
    cr_expect_eq(stat(step_dir, &status), 0, "no committed step 3:\n%s", output);
    char arguments[512];
    snprintf(arguments, sizeof arguments, "eval --checkpoint %s/run --samples 2", dir);
    cr_expect_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    /* asking for more steps resumes from the saved last step */
    cr_assert_eq(tiny_train(dir, "--set train.steps=4", output, sizeof output), 0, "%s",
                 output);
    cr_expect(strstr(output, "resumed at step 3"), "%s", output);
    cr_expect(strstr(output, "changed key: train.steps 3 -> 4"), "a resume with more steps "
              "did not list the changed key:\n%s", output);
    cr_assert_eq(tiny_train(dir, "--set train.steps=4", output, sizeof output), 0, "%s",
                 output);
    cr_expect(strstr(output, "nothing to train"), "a finished run said nothing:\n%s", output);
    test_remove_tree(dir);

    test_make_temp_dir(dir, "train-no-final");
    tiny_config_write(dir, "checkpoint:\n  every: 0\n  save_final: false\n");
    cr_assert_eq(tiny_train(dir, "--set train.steps=3", output, sizeof output), 0, "%s",
                 output);
    snprintf(step_dir, sizeof step_dir, "%s/run/checkpoints/latest", dir);
    cr_expect_neq(access(step_dir, F_OK), 0, "save_final: false saved a checkpoint");
    test_remove_tree(dir);
}

/* The console gets a summary; run_dir/config.yaml gets every key, and reads back. */
Test(train, the_resolved_config_goes_to_run_dir_not_the_console, .timeout = 60)
{
    char dir[256], path[400];
    test_make_temp_dir(dir, "train-summary");
    tiny_config_write(dir, "");
    cr_assert_eq(tiny_train(dir, "--set train.steps=1", output, sizeof output), 0, "%s",
                 output);
    cr_expect(!strstr(output, "vocab_size:"), "the console still lists every key:\n%s",
              output);
    cr_expect(strstr(output, "config.yaml"), "%s", output);
    snprintf(path, sizeof path, "%s/run/config.yaml", dir);
    Config config;
    config_load(&config, path, NULL, 0, 1);
    cr_expect_eq(config.train.steps, 1);
    test_remove_tree(dir);
}

/* model.vocab_size: auto is a number wherever the run writes its config: run_dir/config.yaml
 * and the checkpoint (which fathom eval reads back), and a resume with auto matches it. */
Test(train, vocab_size_auto_is_saved_as_the_number_it_resolved_to, .timeout = 90)
{
    char dir[256], path[400], arguments[600];
    test_make_temp_dir(dir, "train-vocab-auto");
    tiny_config_write(dir, "");
    cr_assert_eq(tiny_train(dir, "--set train.steps=2 --set model.vocab_size=auto", output,
                            sizeof output), 0, "%s", output);
    snprintf(path, sizeof path, "%s/run/config.yaml", dir);
    Config config;
    config_load(&config, path, NULL, 0, 1);
    cr_expect_eq(config.model.vocab_size, 256);
    snprintf(arguments, sizeof arguments, "eval --checkpoint %s/run --samples 2", dir);
    cr_assert_eq(test_run_fathom(arguments, output, sizeof output), 0, "%s", output);
    cr_assert_eq(tiny_train(dir, "--set train.steps=3 --set model.vocab_size=auto", output,
                            sizeof output), 0, "%s", output);
    cr_expect(strstr(output, "resumed at step 2"), "%s", output);
    cr_expect_not(strstr(output, "vocab_size"), "the resume saw a changed vocab: %s", output);
    test_remove_tree(dir);
}

/* FATHOM_SET overrides the config file, the command line's --set overrides both, and the
 * run says which overrides came from the environment. */
Test(train, fathom_set_applies_before_the_command_line, .timeout = 90)
{
    char dir[256], command[1024], path[400];
    test_make_temp_dir(dir, "train-fathom-set");
    tiny_config_write(dir, "");
    snprintf(command, sizeof command, "FATHOM_SET='train.steps=2  log.every=2' '%s' train "
             "%s/config.yaml --set log.every=1", test_fathom_binary(), dir);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    cr_expect(strstr(output, "FATHOM_SET adds 2 overrides before the command line's: "
                             "train.steps=2 log.every=2"), "%s", output);
    snprintf(path, sizeof path, "%s/run/config.yaml", dir);
    Config config;
    config_load(&config, path, NULL, 0, 1);
    cr_expect_eq(config.train.steps, 2, "the file's 6 steps stayed");
    cr_expect_eq(config.log.every, 1, "FATHOM_SET overrode the command line");
    test_remove_tree(dir);
}
