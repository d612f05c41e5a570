/* launch/config_arguments.c — see config_arguments.h. */
#include "launch/config_arguments.h"

#include <string.h>

#include "runtime/config.h"
#include "runtime/error.h"

static void add_override(ConfigArguments *arguments, const char *text)
{
    if (arguments->n_overrides == CONFIG_ARGUMENTS_MAX_OVERRIDES)
        fatal(EXIT_CONFIG, "more than %d --set overrides", CONFIG_ARGUMENTS_MAX_OVERRIDES);
    arguments->overrides[arguments->n_overrides++] = text;
}

void config_arguments_parse(ConfigArguments *arguments, int argc, char **argv,
                            const char *usage, ConfigArgumentsOption option, void *context)
{
    const char *command = argc > 1 ? argv[1] : "?";
    arguments->path = NULL;
    arguments->n_overrides = config_environment_overrides(arguments->overrides,
                                                          CONFIG_ARGUMENTS_MAX_OVERRIDES);
    for (int i = 2; i < argc; i++) {
        int taken = 0;
        if (!strcmp(argv[i], "--set")) {
            if (i + 1 >= argc)
                fatal(EXIT_CONFIG, "--set needs key=value");
            add_override(arguments, argv[++i]);
        } else if (!strncmp(argv[i], "--set=", 6)) {
            add_override(arguments, argv[i] + 6);
        } else if (argv[i][0] == '-') {
            taken = option ? option(context, argc, argv, i) : 0;
            if (taken == 0)
                fatal(EXIT_CONFIG, "%s: unknown option '%s' (%s)", command, argv[i], usage);
            i += taken - 1;
        } else if (!arguments->path) {
            arguments->path = argv[i];
        } else {
            fatal(EXIT_CONFIG, "%s: more than one config file ('%s' and '%s')", command,
                  arguments->path, argv[i]);
        }
    }
    if (!arguments->path)
        fatal(EXIT_CONFIG, "%s", usage);
}
