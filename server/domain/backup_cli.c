/* backup_cli.c -- `neurocached backup|restore` (and the CLI's `neurocache
 * backup|restore`, which runs it): a backup of a data directory's files,
 * its daemon running or not, and its restore (backup.h). */
#include "backup.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: neurocache backup --model DIR --data-dir DIR --to DEST [--namespace NS]\n"
            "       neurocache restore --model DIR --from BACKUP --data-dir DIR [--verify-only]\n"
            "\n"
            "backup copies each namespace of the data directory (or NS) -- its newest\n"
            "snapshot and its log up to the last whole record -- into the new directory\n"
            "DEST, with a manifest (backup.json) written last: the daemon may be running.\n"
            "restore verifies a backup's files and model against DIR's model, then copies\n"
            "its namespaces into the data directory (none of the same name may exist).\n"
            "A daemon can also start on a backup directory as its data_dir (verified first).\n"
            "See docs/operations.md.\n"
            "\n"
            "exit status: 0 success, 1 runtime error (message on stderr), 2 usage error\n");
}

typedef struct {
    const char *model, *data_dir, *to, *from, *ns;
    bool verify_only;
} cli_args;

static int parse(int argc, char **argv, cli_args *a)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"data-dir", 1, 0, 'd'}, {"to", 1, 0, 't'},
                                         {"from", 1, 0, 'f'},  {"namespace", 1, 0, 'n'}, {"verify-only", 0, 0, 'v'},
                                         {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'd': a->data_dir = optarg; break;
        case 't': a->to = optarg; break;
        case 'f': a->from = optarg; break;
        case 'n': a->ns = optarg; break;
        case 'v': a->verify_only = true; break;
        case 'h': usage(stdout); return 1;
        default: return 2;
        }
    }
    bool backup = !strcmp(argv[0], "backup");
    const char *missing = !a->model ? "--model DIR" : backup && !a->data_dir ? "--data-dir DIR"
                        : backup && !a->to ? "--to DEST" : !backup && !a->from ? "--from BACKUP"
                        : !backup && !a->data_dir && !a->verify_only ? "--data-dir DIR" : NULL;
    if (optind < argc || missing) {
        fprintf(stderr, "neurocache %s: %s; see 'neurocache %s --help'\n", argv[0],
                missing ? missing : "unexpected argument", argv[0]);
        return 2;
    }
    return 0;
}

int backup_cli_main(int argc, char **argv)
{
    cli_args a = {0};
    int p = parse(argc, argv, &a);
    if (p)
        return p == 1 ? 0 : 2;
    char err[2048] = "";
    nc_model *m = NULL;
    int rc = model_load(a.model, &m, err, sizeof err);
    json_t *summary = NULL;
    if (!rc && !strcmp(argv[0], "backup")) {
        backup_spec s = {.dst = a.to, .ns = a.ns};
        rc = backup_take_files(a.data_dir, m, &s, &summary, err, sizeof err);
    } else if (!rc && a.verify_only) {
        rc = backup_verify(a.from, m, &summary, err, sizeof err);
    } else if (!rc) {
        rc = backup_restore(a.from, a.data_dir, m, &summary, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "neurocache %s: %s\n", argv[0], err);
    } else {
        char *text = json_dumps(summary, JSON_INDENT(1) | JSON_SORT_KEYS);
        if (text)
            puts(text);
        free(text);
    }
    json_decref(summary);
    model_free(m);
    return rc ? 1 : 0;
}
