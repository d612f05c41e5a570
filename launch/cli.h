/* launch/cli.h — parses `fathom <command> ...` and dispatches (DESIGN 6). */
#ifndef FATHOM_LAUNCH_CLI_H
#define FATHOM_LAUNCH_CLI_H

int cli_main(int argc, char **argv);

#endif
