/* tests/config_support.h — loading a config in a forked child, for the tests of bad input
 * (tests/test_config.c, tests/test_config_validation.c).
 *
 * A bad config ends the process through fatal(EXIT_CONFIG, ...), so each bad input is loaded
 * in a child whose stderr comes back through a pipe: the test checks the exit code and that
 * the message names the key or the file.
 */
#ifndef FATHOM_TESTS_CONFIG_SUPPORT_H
#define FATHOM_TESTS_CONFIG_SUPPORT_H

typedef struct {
    const char *yaml;                /* text to load as "test.yaml", or NULL ... */
    const char *path;                /* ... a file to load, or NULL: the defaults alone */
    const char *const *overrides;
    int n_overrides;
    int world_size;
} LoadRequest;

typedef struct {
    int exit_code;                   /* -1: killed by a signal */
    char message[8192];              /* everything the child wrote to stderr */
} ChildResult;

ChildResult load_in_child(LoadRequest request);
/* `yaml` on one rank */
ChildResult load_text_in_child(const char *yaml);
/* the defaults with one --set */
ChildResult set_in_child(const char *override);
/* Exit code 2 and a message holding each of the (one or two) fragments (`other` may be
 * NULL). */
void assert_config_error(ChildResult result, const char *fragment, const char *other);

#endif
