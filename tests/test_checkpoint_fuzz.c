/* tests/test_checkpoint_fuzz.c — damaged checkpoints end in a message, never in a signal
 * (DESIGN 5, 7): thousands of seeded random bit flips and truncations of index.h5 and of a
 * shard of a two-shard checkpoint, each loaded in a forked child (tests/checkpoint_fuzz.c).
 * Every load must end in exit 0 (the damage hit no byte that matters) or exit 3 with a
 * message. And a full disk during a save: exit 3, the previous checkpoint
 * intact, and the next start after space is freed goes on from it.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoints/checkpoint.h"
#include "tests/checkpoint_support.h"
#include "tests/layout_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

#define N_TENSORS 3
#define ELEMENTS 600

static const CheckpointTensor fuzz_tensors[N_TENSORS] = {
    {"model.embed_tokens.weight", 2, {20, 10}, 0},
    {"model.layers.0.mlp.down_proj.weight", 2, {10, 30}, 256},
    {"model.norm.weight", 1, {10, 0}, 576},
};

static const char *fuzz_binary(void)
{
    const char *moved = getenv("FATHOM_CHECKPOINT_FUZZ");
    return moved && *moved ? moved : FATHOM_CHECKPOINT_FUZZ;
}

Test(checkpoint_fuzz, flipped_bits_and_truncations_end_in_exit_0_or_3_never_a_signal,
     .timeout = 300)
{
    char run_dir[256], command[1024], output[4096];
    test_make_temp_dir(run_dir, "fuzz");
    float *full = malloc(ELEMENTS * sizeof(float));
    for (int i = 0; i < ELEMENTS; i++)
        full[i] = (float)i * 0.25f - 7.0f;
    /* two shards of one stage, split unevenly, as two dp ranks write them */
    const CheckpointRows rows[2][N_TENSORS] = {{{0, 11}, {0, 5}, {0, 10}},
                                               {{11, 20}, {5, 10}, {10, 10}}};
    checkpoint_test_write_two_shards(run_dir, 1, N_TENSORS, fuzz_tensors, rows, full, 2);
    snprintf(command, sizeof command, "'%s' '%s' 2000", fuzz_binary(), run_dir);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    int rounds = 0, clean = 0, caught = 0;
    cr_assert_eq(sscanf(output, "rounds %d exit0 %d exit3 %d", &rounds, &clean, &caught), 3,
                 "%s", output);
    printf("checkpoint fuzz: %d damaged loads, %d ended in exit 0 and %d in exit 3\n", rounds,
           clean, caught);
    cr_expect_eq(rounds, 2000);
    cr_expect(caught > rounds / 4, "most damage should be caught (%d of %d)", caught, rounds);
    free(full);
    test_remove_tree(run_dir);
}

/* ---- a full disk ---- */

Test(checkpoint_fuzz, a_full_disk_during_a_save_is_exit_3_and_the_previous_checkpoint_survives,
     .timeout = 180)
{
    char root[256], mount_point[300], run_dir[400], output[LAYOUT_OUTPUT_CAPACITY];
    test_make_temp_dir(root, "diskfull");
    snprintf(mount_point, sizeof mount_point, "%s/small", root);
    snprintf(run_dir, sizeof run_dir, "%s/run", mount_point);
    mkdir(mount_point, 0755);
    /* a file system of 1.5 MiB: one checkpoint of the d 32 demo (1.04 MB) and the log fit, a
     * second beside it does not */
    if (mount("tmpfs", mount_point, "tmpfs", 0, "size=1536k") != 0) {
        test_remove_tree(root);
        cr_skip_test("cannot mount a small tmpfs here (needs root): %s", strerror(errno));
    }
    const char *save_every_2 = "--set train.steps=4 --set checkpoint.every=2 "
                               "--set checkpoint.keep_last=2";
    const int code = layout_train(1, "demo", save_every_2, run_dir, output);
    cr_expect_eq(code, 3, "exit %d\n%s", code, output);
    char latest[600], expected[64] = "step_00000002\n", text[64] = "";
    snprintf(latest, sizeof latest, "%s/checkpoints/latest", run_dir);
    FILE *file = fopen(latest, "r");
    cr_assert(file, "no checkpoint survived\n%s", output);
    cr_assert(fgets(text, sizeof text, file));
    fclose(file);
    cr_expect_str_eq(text, expected);
    /* space freed: the next start goes on from step 2 and finishes */
    cr_assert_eq(mount("tmpfs", mount_point, "tmpfs", MS_REMOUNT, "size=32m"), 0);
    cr_expect_eq(layout_train(1, "demo", save_every_2, run_dir, output), 0, "%s", output);
    cr_expect(strstr(output, "resumed at step 2"), "%s", output);
    umount(mount_point);
    test_remove_tree(root);
}
