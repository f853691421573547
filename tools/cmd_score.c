/* cmd_score.c -- placeholder until the command lands (scaffolding). */
#include <stdio.h>
#include "commands.h"

int cmd_score(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "neurocache: '%s' is not implemented yet\n", argv[0]);
    return 1;
}
