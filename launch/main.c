/* launch/main.c — the `fathom` command (DESIGN 6). */
#include "launch/cli.h"

int main(int argc, char **argv)
{
    return cli_main(argc, argv);
}
