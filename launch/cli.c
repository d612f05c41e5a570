/* launch/cli.c — the command dispatcher. */
#include "launch/cli.h"

#include "runtime/error.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: fathom <command> [arguments]\n"
    "  train CONFIG.yaml [--set key=value ...]\n"
    "  eval  --checkpoint DIR [--weights ema|raw] [--data SPEC] [--samples N]"
    " [--dump-logits OUT.h5]\n";

int cli_main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_CONFIG : EXIT_DONE;
    }
    fatal(EXIT_CONFIG, "unknown command '%s'\n%s", argv[1], usage);
}
