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
#include "runtime/error.h"

#include <stdio.h>
#include <string.h>

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
    if (!strcmp(command, "eval"))
        return eval_main(argc, argv);
    if (!strcmp(command, "probe"))
        return probe_main(argc, argv);
    if (!strcmp(command, "bench"))
        return bench_main(argc, argv);
    if (!strcmp(command, "inspect"))
        return inspect_main(argc, argv);
    if (!strcmp(command, "convert"))
        return convert_main(argc, argv);
    if (!strcmp(command, "plan"))
        return plan_main(argc, argv);
    help_print_overview(stderr);
    fatal(EXIT_CONFIG, "unknown command '%s' (fathom --help lists the commands)", command);
}
