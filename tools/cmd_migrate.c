/* cmd_migrate.c -- neurocache migrate: moves a live session from one
 * replica to another through the HTTP API (libcurl), without losing a token:
 * POST {from}/v1/sessions/{id}/handoff exports and removes the session in one
 * step under its lock, PUT {to}/v1/sessions/{id}/state recreates it; if the
 * target refuses, the state goes back to the source (and, failing that, to a
 * file the user can PUT later). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomicfile.h"
#include "buf.h"
#include "cacheopts.h"
#include "commands.h"
#include "httpclient.h"
#include "nc_common.h"

static const char *bearer;   /* --key or $NEUROCACHE_API_KEY, NULL = none */

/* One request; *out gets the body. Returns the HTTP status, or -1 with the
 * transport error printed. */
static long request(const char *method, const char *url, const void *body, size_t len, nc_buf *out)
{
    http_client_req r = {.method = method, .url = url, .body = body, .len = len, .bearer = bearer};
    long status = -1;
    char err[NC_ERRLEN];
    if (http_client_call(&r, out, &status, err, sizeof err) != 0) {
        fprintf(stderr, "neurocache migrate: %s\n", err);
        return -1;
    }
    return status;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: neurocache migrate --from URL --to URL --session ID [--as ID] [--copy] [--save FILE] [--key KEY]\n"
            "Moves a session between neurocached replicas (URL = http://host:port).\n"
            "  --from URL     replica holding the session\n"
            "  --to URL       replica to move it to\n"
            "  --session ID   the session id\n"
            "  --as ID        id on the target (default: the same)\n"
            "  --copy         copy (GET /state) instead of move; the source keeps it\n"
            "  --save FILE    where the state goes if neither replica takes it\n"
            "                 (default ./ID.state; restore with PUT /v1/sessions/ID/state)\n"
            "  --key KEY      API key (Bearer) for both replicas; default $NEUROCACHE_API_KEY.\n"
            "                 Hand-over is an admin operation on a replica with api_keys\n");
}

static void trim(char *url)
{
    size_t n = strlen(url);
    while (n && url[n - 1] == '/') url[--n] = 0;
}

/* The command line. */
typedef struct {
    const char *from, *to, *id, *as, *save, *key;
    int copy;
} migrate_args;

/* argv into a; -1 to go on, else the exit status. */
static int migrate_getopt(migrate_args *a, int argc, char **argv)
{
    *a = (migrate_args){.key = getenv("NEUROCACHE_API_KEY")};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char **dst = !strcmp(o, "--from") ? &a->from : !strcmp(o, "--to") ? &a->to
                         : !strcmp(o, "--session") ? &a->id : !strcmp(o, "--as") ? &a->as
                         : !strcmp(o, "--save") ? &a->save : !strcmp(o, "--key") ? &a->key : NULL;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--copy")) {
            a->copy = 1;
        } else if (dst && i + 1 < argc) {
            *dst = argv[++i];
        } else if (dst) {
            return co_usage_error("migrate", "option '%s' needs a value", o);
        } else {
            static const struct option known[] = {{"from", 1, NULL, 0}, {"to", 1, NULL, 0}, {"session", 1, NULL, 0},
                                                  {"as", 1, NULL, 0},   {"save", 1, NULL, 0}, {"key", 1, NULL, 0},
                                                  {"copy", 0, NULL, 0}, {"help", 0, NULL, 0}, {NULL, 0, NULL, 0}};
            const char *near = co_suggest_option(known, o);
            if (near)
                return co_usage_error("migrate", "unknown option '%s' (did you mean '--%s'?)", o, near);
            return co_usage_error("migrate", "unknown option '%s'", o);
        }
    }
    return -1;
}

/* The command line, checked (ids, key); sets bearer. -1 to go on, else
 * the exit status. */
static int migrate_parse_args(migrate_args *a, int argc, char **argv)
{
    int rc = migrate_getopt(a, argc, argv);
    if (rc >= 0)
        return rc;
    if (!a->from || !a->to || !a->id)
        return co_usage_error("migrate", "--from, --to and --session are required");
    if (!a->as) a->as = a->id;
    bearer = NULL;
    if (a->key && *a->key) {
        if (strlen(a->key) > 127 || strpbrk(a->key, " \t\r\n")) {
            fprintf(stderr, "neurocache migrate: --key: an API key is 1-127 characters without white space\n");
            return 2;
        }
        bearer = a->key;
    }
    static const char idchars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
    if (strlen(a->id) > 63 || strlen(a->as) > 63 || strspn(a->id, idchars) != strlen(a->id) ||
        strspn(a->as, idchars) != strlen(a->as)) {
        fprintf(stderr, "neurocache migrate: session ids are 1-63 characters of [A-Za-z0-9_.-]\n");
        return 2;
    }
    return -1;
}

/* The target refused a moved session, which the source gave up: put it
 * back on the source (f), or keep it in a file. */
static void migrate_give_back(const migrate_args *a, const char *f, const nc_buf *blob)
{
    char url[1200];
    nc_buf ans = NC_BUF_INIT;
    snprintf(url, sizeof url, "%s/v1/sessions/%s/state", f, a->id);
    long st = request("PUT", url, blob->data, blob->len, &ans);
    buf_free(&ans);
    if (st == 201) {
        fprintf(stderr, "neurocache migrate: the session is back on %s\n", f);
        return;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s", a->save ? a->save : "");
    if (!a->save) snprintf(path, sizeof path, "%s.state", a->id);
    char err[NC_ERRLEN];
    /* the only copy of the session left: on disk whole, or not at all */
    if (atomicfile_write(path, blob->data, blob->len, err, sizeof err) == NC_OK)
        fprintf(stderr, "neurocache migrate: neither replica took the session; its state is in %s "
                "(curl -X PUT --data-binary @%s URL/v1/sessions/%s/state)\n", path, path, a->id);
    else
        fprintf(stderr, "neurocache migrate: cannot write %s (%s): the session is lost\n", path, err);
}

/* Takes the session from the source (f: handoff, or a copy), gives it to
 * the target (t); 0 when the target has it. */
static int migrate_session(const migrate_args *a, const char *f, const char *t)
{
    char url[1200];
    nc_buf blob = NC_BUF_INIT, ans = NC_BUF_INIT;
    int rc = 1;
    if (a->copy)
        snprintf(url, sizeof url, "%s/v1/sessions/%s/state", f, a->id);
    else
        snprintf(url, sizeof url, "%s/v1/sessions/%s/handoff", f, a->id);
    long st = request(a->copy ? "GET" : "POST", url, NULL, 0, &blob);
    if (st != 200) {
        if (st > 0)
            fprintf(stderr, "neurocache migrate: %s answered %ld: %s\n", url, st, blob.data ? blob.data : "");
        goto done;
    }
    snprintf(url, sizeof url, "%s/v1/sessions/%s/state", t, a->as);
    st = request("PUT", url, blob.data, blob.len, &ans);
    if (st == 201) {
        printf("%s\n", ans.data ? ans.data : "{}");
        fprintf(stderr, "neurocache migrate: session %s moved %s -> %s as %s (%zu bytes of state)\n", a->id, f,
                t, a->as, blob.len);
        rc = 0;
        goto done;
    }
    if (st > 0)
        fprintf(stderr, "neurocache migrate: %s answered %ld: %s\n", url, st, ans.data ? ans.data : "");
    if (!a->copy)
        migrate_give_back(a, f, &blob);
done:
    buf_free(&blob);
    buf_free(&ans);
    return rc;
}

int cmd_migrate(int argc, char **argv)
{
    migrate_args a;
    int st = migrate_parse_args(&a, argc, argv);
    if (st >= 0)
        return st;
    char f[1024], t[1024];
    snprintf(f, sizeof f, "%s", a.from);
    snprintf(t, sizeof t, "%s", a.to);
    trim(f);
    trim(t);
    if (http_client_init() != 0) {
        fprintf(stderr, "neurocache migrate: libcurl initialisation failed\n");
        return 1;
    }
    int rc = migrate_session(&a, f, t);
    http_client_cleanup();
    return rc;
}
