/* test_backup.c -- online backup and restore, the real daemon over HTTP
 * (issue 38 point 1; docs/operations.md#backup):
 *  - under load (2 readers, 1 uploader into the namespace being backed
 *    up), POST /v1/admin/backup of a keys and a compact namespace
 *    completes; `neurocache restore` into a fresh data directory gives a
 *    daemon whose namespaces hold exactly the backup's pairs (the
 *    manifest's count), every document acknowledged before the backup was
 *    asked for and none acknowledged after it was answered beyond what the
 *    manifest counts; and it answers the same predictions, bit for bit, as
 *    a reference daemon given the same documents in the same order (the
 *    original's state at the backup's position);
 *  - `neurocache backup` of the files while the daemon serves gives a
 *    backup that restores the same way, and a daemon started on a backup
 *    directory serves it;
 *  - a backup of another model, a damaged file, a missing manifest (an
 *    interrupted backup) are refused, saying which;
 *  - kill -9 of the daemon at moments during backups: the data directory
 *    serves again with every acknowledged pair, and a backup directory is
 *    either complete (verifies) or has no manifest (refused).
 * The model is tests/fixtures/upgrade-ffac412/model (IVF16,PQ4np trained). */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"
#include "rng.h"

static char model[600], work[128];

static void shell(const char *fmt, const char *a, const char *b)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0)
        fprintf(stderr, "   failed: %s\n", cmd);
}

/* Runs cmd; its output (stdout and stderr) into out; exit status. */
static int run(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int start(nc_daemon *d, const char *data)
{
    const char *args[] = {"--model", model, "--data-dir", data, "--fsync", "group", "--snapshot-period", "0", NULL};
    return daemon_start(d, args);
}

static long call(const nc_daemon *d, const char *method, const char *path, const char *ctype, const char *body,
                 json_t **out)
{
    http_resp r;
    if (http_call(d->port, method, path, ctype, body, body ? strlen(body) : 0, &r) != 0)
        return -1;
    long st = r.status;
    if (out)
        *out = json_incref(r.json);
    http_resp_free(&r);
    return st;
}

/* Document id's text: words w0..w47 in a walk seeded by the id, and a word
 * outside the vocabulary. */
static char *doc_text(int id, int words)
{
    char *t = malloc((size_t)words * 6 + 16);
    nc_rng r;
    rng_seed(&r, 7000 + (uint64_t)id);
    size_t k = 0;
    unsigned w = (unsigned)id % 48;
    for (int i = 0; i < words; i++) {
        w = rng_uniform(&r) < 0.5 ? (w + 1) % 48 : (unsigned)(rng_uniform(&r) * 48) % 48;
        k += (size_t)(i % 29 == 17 ? sprintf(t + k, "oov%d ", id % 3) : sprintf(t + k, "w%u ", w));
    }
    t[k++] = '\n';
    t[k] = 0;
    return t;
}

static long upload(const nc_daemon *d, const char *ns, int id, int words)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/namespaces/%s/documents?id=d%d", ns, id);
    char *t = doc_text(id, words);
    long st = call(d, "POST", path, "text/plain", t, NULL);
    free(t);
    return st;
}

/* The top 20 of a session reading ns after a fixed text. */
static json_t *predictions(const nc_daemon *d, const char *ns, const char *sid)
{
    char body[256], path[128];
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"namespace\":\"%s\",\"cache\":{\"unbounded\":true,"
             "\"unbounded_lambda\":0.5,\"knn\":32,\"nprobe\":4}}", sid, ns);
    json_t *out = NULL, *p = NULL;
    if (call(d, "POST", "/v1/sessions", "application/json", body, NULL) == 201) {
        snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
        call(d, "POST", path, "application/json", "{\"text\":\"w3 w4 oov1 w5 w6 w7 w9\"}", NULL);
        snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
        if (call(d, "POST", path, "application/json", "{\"top_k\":20}", &p) == 200)
            out = json_incref(json_object_get(p, "predictions"));
        json_decref(p);
        snprintf(path, sizeof path, "/v1/sessions/%s", sid);
        call(d, "DELETE", path, NULL, NULL, NULL);
    }
    return out;
}

static json_int_t ns_entries(const nc_daemon *d, const char *ns)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    json_t *j = NULL;
    json_int_t n = call(d, "GET", path, NULL, NULL, &j) == 200 ? json_integer_value(json_object_get(j, "entries"))
                                                                : -1;
    json_decref(j);
    return n;
}

/* ---- load -------------------------------------------------------------------- */

typedef struct {
    const nc_daemon *d;
    atomic_bool stop;
    atomic_int reads, read_errors;
    /* the uploader: documents into "busy" (and "cbusy", compact), in order */
    atomic_int next_doc;          /* ids from 1000 */
    atomic_int acked;             /* the highest id acknowledged in both */
    atomic_int upload_errors;
} load;

static void *reader(void *arg)
{
    load *l = arg;
    char sid[32];
    snprintf(sid, sizeof sid, "r%lu", (unsigned long)pthread_self() % 100000);
    for (int i = 0; !atomic_load(&l->stop); i++) {
        json_t *p = predictions(l->d, i % 2 ? "keys" : "compact", sid);
        atomic_fetch_add(p ? &l->reads : &l->read_errors, 1);
        json_decref(p);
    }
    return NULL;
}

static void *uploader(void *arg)
{
    load *l = arg;
    while (!atomic_load(&l->stop)) {
        int id = atomic_fetch_add(&l->next_doc, 1);
        if (upload(l->d, "busy", id, 40) != 200 || upload(l->d, "cbusy", id, 40) != 200)
            atomic_fetch_add(&l->upload_errors, 1);
        else
            atomic_store(&l->acked, id);
    }
    return NULL;
}

/* A namespace made (compact or not) and given documents ids [from, to). */
static void fill(const nc_daemon *d, const char *ns, bool compact, int from, int to)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    CHECK(call(d, "PUT", path, "application/json", compact ? "{\"storage\":\"compact\"}" : "{}", NULL) / 100 == 2);
    for (int i = from; i < to; i++)
        CHECK(upload(d, ns, i, 60) == 200);
}

/* The entry of namespace ns in a backup's answer or manifest. */
static json_t *manifest_ns(json_t *man, const char *ns)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(man, "namespaces"), i, e)
        if (!strcmp(json_string_value(json_object_get(e, "name")), ns))
            return e;
    return NULL;
}

/* A reference daemon given the documents the restored namespace ns of
 * daemon b holds, in its order (each to its pair count: a document the
 * backup caught in the middle is given as far as it got): it must hold the
 * same pairs and answer the same predictions, bit for bit. */
static void compare_with_reference(const nc_daemon *b, const char *ns, bool compact)
{
    char path[128], data[300];
    snprintf(path, sizeof path, "/v1/namespaces/%s/documents", ns);
    json_t *docs = NULL;
    CHECK(call(b, "GET", path, NULL, NULL, &docs) == 200);
    static int refs;
    snprintf(data, sizeof data, "%s/ref-%s-%d", work, ns, refs++);
    nc_daemon r;
    if (start(&r, data) != 0) {
        CHECK(!"reference daemon started");
        json_decref(docs);
        return;
    }
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    CHECK(call(&r, "PUT", path, "application/json", compact ? "{\"storage\":\"compact\"}" : "{}", NULL) / 100 == 2);
    size_t i;
    json_t *doc;
    json_array_foreach(json_object_get(docs, "documents"), i, doc) {
        const char *id = json_string_value(json_object_get(doc, "id"));
        json_int_t tokens = json_integer_value(json_object_get(doc, "tokens"));
        int num = atoi(id + 1), words = num >= 1000 ? 40 : 60;
        if (tokens == 0)
            continue;
        char *t = doc_text(num, words), *cut = t;
        for (json_int_t k = 0; k < tokens && cut; k++)   /* the first `tokens` words */
            cut = strchr(cut + 1, ' ');
        if (cut && tokens < words)
            strcpy(cut, "\n");
        char up[160];
        snprintf(up, sizeof up, "/v1/namespaces/%s/documents?id=%s", ns, id);
        CHECK(call(&r, "POST", up, "text/plain", t, NULL) == 200);
        free(t);
    }
    CHECKF(ns_entries(&r, ns) == ns_entries(b, ns), "%s: reference %lld pairs, restored %lld", ns,
           (long long)ns_entries(&r, ns), (long long)ns_entries(b, ns));
    json_t *pr = predictions(&r, ns, "ref"), *pb = predictions(b, ns, "ref");
    CHECKF(pr && pb && json_equal(pr, pb), "%s: the restored namespace predicts otherwise than the reference", ns);
    json_decref(pr);
    json_decref(pb);
    json_decref(docs);
    CHECK(daemon_stop(&r) == 0);
}

/* ---- the tests ----------------------------------------------------------------- */

/* Backup under load, restore, compare; the CLI's backup of the files; a
 * daemon started on a backup directory. */
TEST(backup_under_load_restores_to_its_point)
{
    char data[300], restored[300], cmd[4096], out[1 << 16];
    snprintf(data, sizeof data, "%s/a", work);
    nc_daemon d;
    if (start(&d, data) != 0) {
        CHECK(!"daemon started");
        return;
    }
    fill(&d, "keys", false, 0, 6);
    fill(&d, "compact", true, 10, 16);
    fill(&d, "busy", false, 20, 23);
    fill(&d, "cbusy", true, 20, 23);
    /* a snapshot of each (at the stop), then more: backups hold both */
    CHECK(daemon_stop(&d) == 0);
    if (start(&d, data) != 0) {
        CHECK(!"daemon restarted");
        return;
    }
    CHECK(upload(&d, "keys", 6, 60) == 200 && upload(&d, "compact", 16, 60) == 200);
    load l = {.d = &d};
    atomic_store(&l.next_doc, 1000);
    atomic_store(&l.acked, 999);
    pthread_t th[3];
    pthread_create(&th[0], NULL, reader, &l);
    pthread_create(&th[1], NULL, reader, &l);
    pthread_create(&th[2], NULL, uploader, &l);
    sleep_ms(600);
    int acked_before = atomic_load(&l.acked);
    json_t *ans = NULL;
    CHECK(call(&d, "POST", "/v1/admin/backup", "application/json", "{\"name\":\"b1\"}", &ans) == 200);
    int next_after = atomic_load(&l.next_doc);
    sleep_ms(400);
    /* the CLI's backup of the files, the daemon serving */
    snprintf(cmd, sizeof cmd, "'%s' backup --model '%s' --data-dir '%s' --to '%s/files' 2>&1",
             daemon_bin_path("neurocache"), model, data, work);
    CHECKF(run(cmd, out, sizeof out) == 0, "%s", out);
    atomic_store(&l.stop, true);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    printf("load: %d reads, %d read errors, documents %d-%d, %d upload errors; the backup came between "
           "document %d (acknowledged) and %d\n", atomic_load(&l.reads), atomic_load(&l.read_errors), 1000,
           atomic_load(&l.acked), atomic_load(&l.upload_errors), acked_before, next_after);
    CHECK(atomic_load(&l.read_errors) == 0 && atomic_load(&l.upload_errors) == 0);
    CHECK(atomic_load(&l.acked) > next_after);   /* uploads went on after it */
    CHECK(daemon_stop(&d) == 0);

    /* restore into a fresh data directory */
    snprintf(restored, sizeof restored, "%s/restored", work);
    snprintf(cmd, sizeof cmd, "'%s' restore --model '%s' --from '%s/backups/b1' --data-dir '%s' 2>&1",
             daemon_bin_path("neurocache"), model, data, restored);
    CHECKF(run(cmd, out, sizeof out) == 0, "%s", out);
    nc_daemon b;
    if (start(&b, restored) != 0) {
        CHECK(!"restored daemon started");
        json_decref(ans);
        return;
    }
    const char *names[] = {"keys", "compact", "busy", "cbusy"};
    for (int i = 0; i < 4; i++) {
        json_t *e = manifest_ns(ans, names[i]);
        CHECKF(e && json_integer_value(json_object_get(e, "entries")) == ns_entries(&b, names[i]),
               "%s: the manifest's count", names[i]);
    }
    /* point in time: what was acknowledged before is there; what started
     * after the answer is not */
    json_t *docs = NULL;
    CHECK(call(&b, "GET", "/v1/namespaces/busy/documents", NULL, NULL, &docs) == 200);
    int have = 0, beyond = 0;
    size_t i;
    json_t *doc;
    json_array_foreach(json_object_get(docs, "documents"), i, doc) {
        int num = atoi(json_string_value(json_object_get(doc, "id")) + 1);
        have += num >= 1000 && num <= acked_before;
        beyond += num >= next_after;
    }
    json_decref(docs);
    CHECKF(have == acked_before - 999, "%d of the %d documents acknowledged before the backup", have,
           acked_before - 999);
    CHECK(beyond == 0);
    compare_with_reference(&b, "busy", false);
    compare_with_reference(&b, "cbusy", true);
    compare_with_reference(&b, "keys", false);
    compare_with_reference(&b, "compact", true);
    CHECK(daemon_stop(&b) == 0);
    json_decref(ans);

    /* the files' backup: a daemon started on it serves its namespaces */
    snprintf(cmd, sizeof cmd, "%s/files", work);
    nc_daemon f;
    if (start(&f, cmd) != 0) {
        CHECK(!"daemon started on a backup directory");
        return;
    }
    CHECK(ns_entries(&f, "keys") > 0 && ns_entries(&f, "cbusy") > 0);
    compare_with_reference(&f, "cbusy", true);
    CHECK(daemon_stop(&f) == 0);
    snprintf(out, sizeof out, "%s/files/backup.json.restored", work);
    CHECK(access(out, F_OK) == 0);
}

/* Another model, a damaged file, no manifest: refused, saying which. */
TEST(bad_backups_refused)
{
    char cmd[4096], out[1 << 16], other[700];
    /* another model: the fixture lstm-1layer-tied */
    snprintf(other, sizeof other, "%s/lstm-1layer-tied", harness_fixtures());
    snprintf(cmd, sizeof cmd, "'%s' restore --model '%s' --from '%s/a/backups/b1' --verify-only 2>&1",
             daemon_bin_path("neurocache"), other, work);
    CHECK(run(cmd, out, sizeof out) == 1);
    CHECKF(strstr(out, "a backup of another model (fingerprint") != NULL, "lacks %s:\n%s", "a backup of another model (fingerprint", out);
    CHECKF(strstr(out, "restore it with the model it was taken with") != NULL, "lacks %s:\n%s", "restore it with the model it was taken with", out);
    /* a damaged file */
    shell("cp -a '%s/a/backups/b1' '%s/damaged'", work, work);
    snprintf(cmd, sizeof cmd, "printf X | dd of=\"$(ls -d %s/damaged/namespaces/keys/snap-*)/values.bin\" bs=1 "
             "seek=20 conv=notrunc 2>/dev/null", work);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "'%s' restore --model '%s' --from '%s/damaged' --data-dir '%s/nowhere' 2>&1",
             daemon_bin_path("neurocache"), model, work, work);
    CHECK(run(cmd, out, sizeof out) == 1);
    CHECKF(strstr(out, "values.bin: checksum mismatch (damaged backup)") != NULL, "lacks %s:\n%s", "values.bin: checksum mismatch (damaged backup)", out);
    snprintf(cmd, sizeof cmd, "%s/nowhere/namespaces/keys", work);
    CHECK(access(cmd, F_OK) != 0);   /* nothing copied */
    /* no manifest: an interrupted backup; also refused by a daemon */
    shell("cp -a '%s/a/backups/b1' '%s/partial'", work, work);
    shell("rm '%s/partial/%s'", work, "backup.json");
    snprintf(cmd, sizeof cmd, "'%s' restore --model '%s' --from '%s/partial' --data-dir '%s/nowhere' 2>&1",
             daemon_bin_path("neurocache"), model, work, work);
    CHECK(run(cmd, out, sizeof out) == 1);
    CHECKF(strstr(out, "no manifest: not a backup, or an incomplete one") != NULL, "lacks %s:\n%s", "no manifest: not a backup, or an incomplete one", out);
    /* a daemon on a damaged backup directory refuses to start */
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' --model '%s' --data-dir '%s/damaged' --port 0 --bind 127.0.0.1 %s "
             "2>&1", daemon_bin_path("neurocached"), model, work, geteuid() == 0 ? "--allow-root" : "");
    CHECK(run(cmd, out, sizeof out) != 0);
    CHECKF(strstr(out, "checksum mismatch (damaged backup)") != NULL, "lacks %s:\n%s", "checksum mismatch (damaged backup)", out);
    /* restoring over an existing namespace */
    snprintf(cmd, sizeof cmd, "'%s' restore --model '%s' --from '%s/a/backups/b1' --data-dir '%s/restored' 2>&1",
             daemon_bin_path("neurocache"), model, work, work);
    CHECK(run(cmd, out, sizeof out) == 1);
    CHECKF(strstr(out, "exists: a backup restores into a namespace of that name only when there is none") != NULL, "lacks %s:\n%s", "exists: a backup restores into a namespace of that name only when there is none", out);
}

typedef struct {
    int port;
    long status;
    char name[32];
} backup_call;

static void *ask_backup(void *arg)
{
    backup_call *c = arg;
    char body[64];
    snprintf(body, sizeof body, "{\"name\":\"%s\"}", c->name);
    http_resp r = {0};
    c->status = http_call(c->port, "POST", "/v1/admin/backup", "application/json", body, strlen(body), &r) == 0
                    ? r.status : -1;
    http_resp_free(&r);   /* a failed call (the daemon killed) still owns an empty body */
    return NULL;
}

/* kill -9 while backups run: the daemon serves again with every pair, and
 * each backup directory is complete (verifies) or refused (no manifest). */
TEST(kill_during_backup)
{
    char data[300], cmd[4096], out[1 << 16];
    snprintf(data, sizeof data, "%s/k", work);
    nc_daemon d;
    if (start(&d, data) != 0) {
        CHECK(!"daemon started");
        return;
    }
    fill(&d, "big", false, 0, 40);
    fill(&d, "cbig", true, 0, 40);
    json_int_t want = ns_entries(&d, "big"), cwant = ns_entries(&d, "cbig");
    int interrupted = 0, complete = 0;
    for (int round = 0; round < 6; round++) {
        backup_call c = {.port = d.port};
        snprintf(c.name, sizeof c.name, "k%d", round);
        pthread_t t;
        pthread_create(&t, NULL, ask_backup, &c);
        sleep_ms(round * 15);
        kill(d.pid, SIGKILL);
        pthread_join(t, NULL);
        daemon_wait(&d, 10);
        snprintf(cmd, sizeof cmd, "%s/backups/%s", data, c.name);
        if (access(cmd, F_OK) == 0) {
            snprintf(cmd, sizeof cmd, "'%s' restore --model '%s' --from '%s/backups/%s' --verify-only 2>&1",
                     daemon_bin_path("neurocache"), model, data, c.name);
            int st = run(cmd, out, sizeof out);
            CHECKF(st == 0 || strstr(out, "no manifest: not a backup, or an incomplete one"), "%s", out);
            interrupted += st != 0;
            complete += st == 0;
        }
        if (start(&d, data) != 0) {
            CHECK(!"daemon restarted after kill -9");
            return;
        }
        CHECK(ns_entries(&d, "big") == want && ns_entries(&d, "cbig") == cwant);
    }
    printf("kill -9 during backups: %d interrupted (refused), %d complete (verified)\n", interrupted, complete);
    CHECK(daemon_stop(&d) == 0);
}

/* The model: the upgrade fixture's (a trained IVF16,PQ4np index). */
int main(void)
{
    snprintf(work, sizeof work, "/tmp/nc_test_backup_XXXXXX");
    if (!mkdtemp(work))
        return 1;
    snprintf(model, sizeof model, "%s/model", work);
    shell("cp -a '%s/upgrade-ffac412/model' '%s'", harness_fixtures(), model);
    httpc_init();
    RUN(backup_under_load_restores_to_its_point);
    RUN(bad_backups_refused);
    RUN(kill_during_backup);
    httpc_cleanup();
    shell("rm -rf '%s'%s", work, "");
    return harness_summary();
}
