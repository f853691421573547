/* neurocache.c -- the command line: a thin dispatcher over core/. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "compute.h"
#include "nc_common.h"
#include "suggest.h"
#include "vmath.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"score", cmd_score, "score a text file: per-token log-probabilities and perplexity"},
    {"eval", cmd_eval, "perplexity table: static model and every cache combination"},
    {"tune", cmd_tune, "grid-search cache hyper-parameters on a validation file"},
    {"fit-gate", cmd_fit_gate, "fit the adaptive mixture's per-token gate on a validation file"},
    {"dyn-stats", cmd_dyn_stats, "measure dynamic evaluation's gradient statistics on training text"},
    {"train", cmd_train, "train an LSTM language model on a corpus"},
    {"build-index", cmd_build_index, "train the unbounded cache's IVFPQ quantizer"},
    {"migrate", cmd_migrate, "move a live session from one neurocached replica to another"},
    {"backup", cmd_backup, "copy a data directory's namespaces to a backup, the daemon running or not"},
    {"restore", cmd_restore, "verify a backup and restore its namespaces into a data directory"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: neurocache COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'neurocache COMMAND --help' describes a command's options;\n"
                 "'neurocache --version' names the release and the kernels in use\n"
                 "(NEUROCACHE_SIMD=scalar|avx2|avx512 forces a kernel level).\n");
}

int main(int argc, char **argv)
{
    char err[NC_ERRLEN];
    if (vm_simd_init(err, sizeof err) != NC_OK) {
        fprintf(stderr, "neurocache: %s\n", err);
        return 2;
    }
    if (argc < 2) {
        char names[256] = "";
        for (size_t i = 0, o = 0; i < sizeof commands / sizeof commands[0]; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", commands[i].name);
        fprintf(stderr, "neurocache: a command is needed (%s); see 'neurocache --help'\n", names);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        char line[256];
        nc_compute_describe(line, sizeof line);
        printf("%s\n", line);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    nc_suggest sg;
    suggest_init(&sg, argv[1]);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        suggest_offer(&sg, commands[i].name);
    if (suggest_best(&sg))
        fprintf(stderr, "neurocache: unknown command '%s' (did you mean '%s'?); see 'neurocache --help'\n", argv[1],
                suggest_best(&sg));
    else
        fprintf(stderr, "neurocache: unknown command '%s'; see 'neurocache --help'\n", argv[1]);
    return 2;
}
