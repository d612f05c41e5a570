/* launch/cli.c — the command dispatcher (DESIGN 6). */
#include "launch/cli.h"

#include "launch/bench.h"
#include "launch/convert.h"
#include "launch/eval.h"
#include "launch/help.h"
#include "launch/inspect.h"
#include "launch/plan.h"
#include "launch/probe.h"
#include "launch/train.h"
#include "launch/tune.h"
#include "runtime/comm.h"
#include "runtime/error.h"

#include <stdio.h>
#include <string.h>

/* train and bench run as one job of the ranks mpirun starts; every other command is one
 * process's work, which several ranks would each do whole (eval and probe each loading the
 * whole model onto one GPU, convert writing one run directory at once, tune timing one
 * GPU's products). */
static void require_one_process(const char *command)
{
    const int ranks = comm_size(comm_world());
    if (ranks > 1)
        fatal(EXIT_CONFIG, "fathom %s runs on one process, and mpirun started %d: run it "
              "without mpirun", command, ranks);
}

int cli_main(int argc, char **argv)
{
    if (argc < 2) {
        help_print_overview(stderr);
        return EXIT_CONFIG;
    }
    const char *command = argv[1];
    if (!strcmp(command, "--help") || !strcmp(command, "-h") || !strcmp(command, "help")) {
        if (argc >= 3 && help_print_command(stdout, argv[2]))
            return EXIT_DONE;
        help_print_overview(stdout);
        return EXIT_DONE;
    }
    if (!strcmp(command, "--version") || !strcmp(command, "version")) {
        help_print_version(stdout);
        return EXIT_DONE;
    }
    if (help_requested(argc, argv) && help_print_command(stdout, command))
        return EXIT_DONE;
    if (!strcmp(command, "train"))
        return train_main(argc, argv);
    if (!strcmp(command, "bench"))
        return bench_main(argc, argv);
    static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
    } one_process[] = {
        {"eval", eval_main},       {"probe", probe_main}, {"inspect", inspect_main},
        {"convert", convert_main}, {"plan", plan_main},   {"tune", tune_main},
    };
    for (size_t i = 0; i < sizeof one_process / sizeof one_process[0]; i++)
        if (!strcmp(command, one_process[i].name)) {
            require_one_process(command);
            return one_process[i].run(argc, argv);
        }
    help_print_overview(stderr);
    fatal(EXIT_CONFIG, "unknown command '%s' (fathom --help lists the commands)", command);
}
