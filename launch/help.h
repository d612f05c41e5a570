/* launch/help.h — what `fathom --help`, `fathom COMMAND --help` and `fathom --version`
 * print (DESIGN 6).
 *
 * Every command has one help text here: its usage line, every option with what it does,
 * and one example. help_print_command returns false for a command it does not know.
 * help_print_version prints the version, the git commit the binary was built from, and the
 * backends this build has (the cpu always; cuda when the CUDA module is next to the binary
 * or named by FATHOM_CUDA_MODULE, and whether a GPU answers).
 */
#ifndef FATHOM_LAUNCH_HELP_H
#define FATHOM_LAUNCH_HELP_H

#include <stdbool.h>
#include <stdio.h>

void help_print_overview(FILE *out);
bool help_print_command(FILE *out, const char *command);
void help_print_version(FILE *out);
/* true when argv[2] asks for help: --help, -h */
bool help_requested(int argc, char **argv);

#endif
