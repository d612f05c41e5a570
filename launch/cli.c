/* launch/cli.c — the command dispatcher (DESIGN 6). */
#include "launch/cli.h"

#include "launch/bench.h"
#include "launch/eval.h"
#include "launch/inspect.h"
#include "launch/probe.h"
#include "launch/train.h"
#include "runtime/error.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: fathom <command> [arguments]\n"
    "  train CONFIG.yaml [--set key=value ...]   train, resuming from run_dir if it holds a "
    "checkpoint\n"
    "  eval  --checkpoint DIR [--weights ema|raw] [--data SPEC] [--samples N] "
    "[--dump-logits OUT.h5]\n"
    "  probe --checkpoint DIR [--weights ema|raw] [--data SPEC] [--samples N] [--slices S] "
    "[--json OUT.json]\n"
    "  bench [--cases layers,attention,route,msar,step] [--repeat N] [--device D] [--small] "
    "[--json OUT.jsonl]\n"
    "  inspect --comm RUN_DIR                    per-stage pp bytes beside their prediction\n";

int cli_main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return EXIT_CONFIG;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage, stdout);
        return EXIT_DONE;
    }
    if (!strcmp(argv[1], "train"))
        return train_main(argc, argv);
    if (!strcmp(argv[1], "eval"))
        return eval_main(argc, argv);
    if (!strcmp(argv[1], "probe"))
        return probe_main(argc, argv);
    if (!strcmp(argv[1], "bench"))
        return bench_main(argc, argv);
    if (!strcmp(argv[1], "inspect"))
        return inspect_main(argc, argv);
    fatal(EXIT_CONFIG, "unknown command '%s'\n%s", argv[1], usage);
}
