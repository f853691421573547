/* cmd_backup.c -- `neurocache backup` and `neurocache restore`: they copy a
 * data directory's namespaces, which is the store's business (store/,
 * server/domain/backup.h), so the command runs the daemon's program in its
 * backup mode, `neurocached backup|restore` with the same arguments: the
 * neurocached next to this program, else the one on the PATH. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

static int run_daemon_tool(int argc, char **argv)
{
    char self[PATH_MAX], bin[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    char **args = calloc((size_t)argc + 2, sizeof *args);
    if (!args)
        return 1;
    args[0] = "neurocached";
    for (int i = 0; i < argc; i++)
        args[i + 1] = argv[i];
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(bin, sizeof bin, "%s/neurocached", self);
            if (access(bin, X_OK) == 0)
                execv(bin, args);
        }
    }
    execvp("neurocached", args);
    fprintf(stderr, "neurocache %s: cannot run neurocached (next to this program or on the PATH)\n", argv[0]);
    free(args);
    return 1;
}

int cmd_backup(int argc, char **argv)
{
    return run_daemon_tool(argc, argv);
}

int cmd_restore(int argc, char **argv)
{
    return run_daemon_tool(argc, argv);
}
