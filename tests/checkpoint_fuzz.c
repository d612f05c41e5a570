/* tests/checkpoint_fuzz.c — the driver of the checkpoint fuzz test (test_checkpoint_fuzz.c),
 * a small binary of its own so that forking a child per damaged load is cheap:
 *
 *     fathom-checkpoint-fuzz RUN_DIR ROUNDS
 *
 * RUN_DIR holds one committed two-shard checkpoint of the three tensors below (the test
 * writes it). Each round damages index.h5 or the second shard (a bit flipped, or one round
 * in six the file cut short, at a place drawn from a fixed seed), loads the checkpoint in a
 * forked child, and puts the file back. A child must end in exit 0 or exit 3; anything else
 * (a signal above all) is printed with the damage that caused it and ends the driver with
 * exit 1. Otherwise it prints "rounds R exit0 A exit3 B" and exits 0.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoints/checkpoint.h"

enum { N_TENSORS = 3, ELEMENTS = 600 };

static const CheckpointTensor fuzz_tensors[N_TENSORS] = {
    {"model.embed_tokens.weight", 2, {20, 10}, 0},
    {"model.layers.0.mlp.down_proj.weight", 2, {10, 30}, 256},
    {"model.norm.weight", 1, {10, 0}, 576},
};

static char *read_file(const char *path, size_t *size)
{
    FILE *file = fopen(path, "rb");
    if (!file) {
        fprintf(stderr, "checkpoint fuzz: cannot open %s\n", path);
        exit(2);
    }
    fseek(file, 0, SEEK_END);
    *size = (size_t)ftell(file);
    fseek(file, 0, SEEK_SET);
    char *bytes = malloc(*size + 1);
    if (fread(bytes, 1, *size, file) != *size)
        exit(2);
    fclose(file);
    return bytes;
}

static void write_file(const char *path, const char *bytes, size_t size)
{
    FILE *file = fopen(path, "wb");
    if (!file || fwrite(bytes, 1, size, file) != size || fclose(file) != 0) {
        fprintf(stderr, "checkpoint fuzz: cannot write %s\n", path);
        exit(2);
    }
}

/* Loads the checkpoint in a child; its exit code, or 128 + the signal that ended it. */
static int load_in_child(const char *run_dir)
{
    const pid_t child = fork();
    if (child < 0)
        exit(2);
    if (child == 0) {
        const int null = open("/dev/null", O_WRONLY);
        dup2(null, STDERR_FILENO);
        dup2(null, STDOUT_FILENO);
        float *data[CKPT_GROUPS] = {0};
        data[CKPT_GROUP_MODEL] = calloc(ELEMENTS, sizeof(float));
        checkpoint_load(run_dir, fuzz_tensors, N_TENSORS, data);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: fathom-checkpoint-fuzz RUN_DIR ROUNDS\n");
        return 2;
    }
    const char *run_dir = argv[1];
    const int rounds = atoi(argv[2]);
    const char *names[2] = {"index.h5", "shard_p0_d1.h5"};
    char paths[2][4096];
    char *pristine[2];
    size_t sizes[2];
    for (int f = 0; f < 2; f++) {
        snprintf(paths[f], sizeof paths[f], "%s/checkpoints/step_00000001/%s", run_dir,
                 names[f]);
        pristine[f] = read_file(paths[f], &sizes[f]);
    }
    if (load_in_child(run_dir) != 0) {
        fprintf(stderr, "checkpoint fuzz: the undamaged checkpoint does not load\n");
        return 1;
    }
    uint64_t state = 0x9E3779B97F4A7C15ull; /* the seed: a run repeats itself */
    int outcomes[2] = {0};
    for (int round = 0; round < rounds; round++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const int f = (int)(state >> 63);
        const size_t position = (size_t)((state >> 20) % sizes[f]);
        const bool truncate = round % 6 == 5;
        char *bytes = malloc(sizes[f]);
        memcpy(bytes, pristine[f], sizes[f]);
        if (!truncate)
            bytes[position] ^= (char)(1u << ((state >> 8) & 7));
        write_file(paths[f], bytes, truncate ? position : sizes[f]);
        free(bytes);
        const int code = load_in_child(run_dir);
        write_file(paths[f], pristine[f], sizes[f]);
        if (code != 0 && code != 3) {
            printf("round %d: %s %s at byte %zu of %zu ended the load with %s %d\n", round,
                   names[f], truncate ? "cut" : "flipped", position, sizes[f],
                   code > 128 ? "signal" : "exit", code > 128 ? code - 128 : code);
            return 1;
        }
        outcomes[code == 3]++;
    }
    printf("rounds %d exit0 %d exit3 %d\n", rounds, outcomes[0], outcomes[1]);
    return 0;
}
