/* tests/config_support.c — see config_support.h. */
#include "tests/config_support.h"

#include "runtime/config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

ChildResult load_in_child(LoadRequest request)
{
    ChildResult result = {0};
    int fds[2];
    cr_assert_eq(pipe(fds), 0, "pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork failed");
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        Config config;
        if (!request.yaml)
            config_load(&config, request.path, request.overrides, request.n_overrides,
                        request.world_size);
        else
            config_load_text(&config, request.yaml, "test.yaml", request.overrides,
                             request.n_overrides, request.world_size);
        _exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t got;
    while ((got = read(fds[0], result.message + used, sizeof result.message - 1 - used)) > 0)
        used += (size_t)got;
    result.message[used] = '\0';
    close(fds[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid, "waitpid failed");
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

ChildResult load_text_in_child(const char *yaml)
{
    return load_in_child((LoadRequest){.yaml = yaml, .world_size = 1});
}

ChildResult set_in_child(const char *override)
{
    const char *overrides[] = {override};
    return load_in_child(
        (LoadRequest){.yaml = "", .overrides = overrides, .n_overrides = 1, .world_size = 1});
}

void assert_config_error(ChildResult result, const char *fragment, const char *other)
{
    cr_assert_eq(result.exit_code, 2, "exit code %d, expected 2; stderr: %s", result.exit_code,
                 result.message);
    cr_assert(strstr(result.message, fragment), "message does not name '%s': %s", fragment,
              result.message);
    if (other)
        cr_assert(strstr(result.message, other), "message does not name '%s': %s", other,
                  result.message);
}
