/* launch/config_arguments.h — `CONFIG.yaml [--set key=value ...]`: the arguments of the
 * commands that run a config (fathom train, fathom plan).
 *
 * The overrides are FATHOM_SET's (environment) first, then every --set key=value (or
 * --set=key=value) in order: later ones win (runtime/config.h). The strings are argv's and
 * the environment's, not copies.
 */
#ifndef FATHOM_LAUNCH_CONFIG_ARGUMENTS_H
#define FATHOM_LAUNCH_CONFIG_ARGUMENTS_H

enum { CONFIG_ARGUMENTS_MAX_OVERRIDES = 256 };

typedef struct {
    const char *path;
    const char *overrides[CONFIG_ARGUMENTS_MAX_OVERRIDES];
    int n_overrides;
} ConfigArguments;

/* A command's own option at argv[i]: returns how many arguments it took (0: not its
 * option, a usage error). */
typedef int (*ConfigArgumentsOption)(void *context, int argc, char **argv, int i);

/* Parses argv[2..] (argv[1] is the command). Exit 2 with `usage` on a missing or second
 * config path, a --set without key=value, or an option neither --set nor `option`'s. */
void config_arguments_parse(ConfigArguments *arguments, int argc, char **argv,
                            const char *usage, ConfigArgumentsOption option, void *context);

#endif
