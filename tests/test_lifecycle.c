/* test_lifecycle.c -- namespace incarnations and honest status codes on the
 * real daemon (issue 24, findings 1 and 3):
 *  - a session bound to a namespace that is deleted answers 410
 *    namespace_deleted on feed with adapt and on reads of its unbounded
 *    cache (explain must not show deleted documents), and does not join the
 *    namespace created again under the name (a new incarnation);
 *  - an upload streaming while its namespace is deleted answers 410 and
 *    leaves nothing in the new incarnation;
 *  - adapting sessions and periodic snapshots racing with delete and
 *    re-create leave, after a restart, exactly what the last incarnation
 *    acknowledged (a snapshot or log segment of a deleted incarnation must
 *    not land in the new one's directory);
 *  - requests waiting on a session deleted on the same replica get 404
 *    session_not_found, never 503 session_moved. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "harness.h"

static char model_dir[512], data_dir[128];

static int start(nc_daemon *d, const char *snapshot_period)
{
    const char *args[] = {"--model", model_dir, "--data-dir", data_dir, "--log-format", "text",
                          "--snapshot-period", snapshot_period ? snapshot_period : "0", NULL};
    return daemon_start(d, args);
}

/* status of a JSON call; *out (optional) gets the answer's JSON */
static long call(nc_daemon *d, const char *method, const char *path, const char *body, json_t **out,
                 char *code, size_t codelen)
{
    http_resp r;
    long st = -1;
    if (out)
        *out = NULL;
    if (http_json(d->port, method, path, body, &r) == 0) {
        st = r.status;
        if (out && r.json)
            *out = json_incref(r.json);
        if (code)
            snprintf(code, codelen, "%s", http_error_code(&r));
    }
    http_resp_free(&r);
    return st;
}

static long upload(nc_daemon *d, const char *ns, const char *id, const char *text, json_t **out)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/namespaces/%s/documents?id=%s", ns, id);
    http_resp r;
    long st = -1;
    if (out)
        *out = NULL;
    if (http_call(d->port, "POST", path, "text/plain", text, strlen(text), &r) == 0) {
        st = r.status;
        if (out && r.json)
            *out = json_incref(r.json);
    }
    http_resp_free(&r);
    return st;
}

static json_int_t ns_field(nc_daemon *d, const char *ns, const char *field, long *status)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    json_t *j = NULL;
    *status = call(d, "GET", path, NULL, &j, NULL, 0);
    json_int_t v = json_integer_value(json_object_get(j, field));
    json_decref(j);
    return v;
}

static void new_session(nc_daemon *d, const char *id, const char *ns)
{
    char body[256];
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"namespace\":\"%s\",\"cache\":{\"unbounded\":true}}", id, ns);
    long st = call(d, "POST", "/v1/sessions", body, NULL, NULL, 0);
    CHECKF(st == 201, "session %s: %ld", id, st);
}

static long feed(nc_daemon *d, const char *sid, const char *text, bool adapt, char *code, size_t codelen)
{
    char path[160];
    size_t cap = strlen(text) + 64;
    char *body = malloc(cap);
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
    snprintf(body, cap, "{\"text\":\"%s\",\"adapt\":%s}", text, adapt ? "true" : "false");
    long st = call(d, "POST", path, body, NULL, code, codelen);
    free(body);
    return st;
}

/* Whether a predict with explain on sid names document doc; *status. */
static bool explain_names(nc_daemon *d, const char *sid, const char *doc, long *status, char *code, size_t codelen)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
    json_t *j = NULL;
    *status = call(d, "POST", path, "{\"top_k\":10,\"explain\":true}", &j, code, codelen);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    char needle[128];
    snprintf(needle, sizeof needle, "\"document\":\"%s\"", doc);
    bool found = s && strstr(s, needle);
    free(s);
    json_decref(j);
    return found;
}

static const char *DOC_OLD = "w3 w4 w5 w6 w7 w8 w3 w4 w5 w6";
static const char *DOC_NEW = "w9 w10 w11 w12";

/* Finding 1, as the issue tells it: today the old session's feed answers
 * 200 after the deletion, and again after the name is created anew, and
 * its explain still shows the deleted document. */
TEST(deleted_namespace_refuses_old_session)
{
    nc_daemon d;
    CHECK(start(&d, NULL) == 0);
    json_t *up = NULL;
    CHECK(upload(&d, "zz", "old", DOC_OLD, &up) == 200);
    json_int_t inc1 = json_integer_value(json_object_get(up, "incarnation"));
    json_decref(up);
    CHECKF(inc1 > 0, "upload answer has no incarnation");
    new_session(&d, "s_old", "zz");
    long st;
    char code[64] = "";
    CHECK(explain_names(&d, "s_old", "old", &st, code, sizeof code) && st == 200);

    CHECK(call(&d, "DELETE", "/v1/namespaces/zz?confirm=zz", NULL, NULL, NULL, 0) == 200);
    st = feed(&d, "s_old", "the company said", true, code, sizeof code);
    CHECKF(st == 410 && !strcmp(code, "namespace_deleted"), "feed adapt after delete: %ld %s", st, code);
    ns_field(&d, "zz", "entries", &st);
    CHECKF(st == 404, "GET deleted namespace: %ld", st);

    /* a new incarnation under the name */
    CHECK(upload(&d, "zz", "new", DOC_NEW, &up) == 200);
    json_int_t inc2 = json_integer_value(json_object_get(up, "incarnation"));
    /* the pairs of DOC_NEW (its words and the final eos) */
    json_int_t n_new = json_integer_value(json_object_get(up, "tokens_added"));
    json_decref(up);
    CHECKF(inc2 > inc1, "re-created namespace: incarnation %lld after %lld", (long long)inc2, (long long)inc1);
    json_int_t entries = ns_field(&d, "zz", "entries", &st);
    CHECKF(st == 200 && n_new > 0 && entries == n_new, "new incarnation holds %lld entries, its upload %lld",
           (long long)entries, (long long)n_new);

    st = feed(&d, "s_old", "the company said again", true, code, sizeof code);
    CHECKF(st == 410 && !strcmp(code, "namespace_deleted"), "feed adapt into the new incarnation: %ld %s", st, code);
    entries = ns_field(&d, "zz", "entries", &st);
    CHECKF(entries == n_new, "the old session's write joined the new incarnation: %lld entries, not %lld",
           (long long)entries, (long long)n_new);
    /* reads of the deleted incarnation's cache are refused too */
    bool shows = explain_names(&d, "s_old", "old", &st, code, sizeof code);
    CHECKF(!shows && st == 410 && !strcmp(code, "namespace_deleted"), "predict explain after delete: %ld %s%s", st,
           code, shows ? " (shows the deleted document)" : "");
    st = feed(&d, "s_old", "w3 w4", false, code, sizeof code);
    CHECKF(st == 410, "feed (reads the deleted cache) after delete: %ld %s", st, code);
    /* the session says so */
    json_t *j = NULL;
    CHECK(call(&d, "GET", "/v1/sessions/s_old", NULL, &j, NULL, 0) == 200);
    CHECK(json_is_true(json_object_get(j, "namespace_deleted")));
    CHECK(json_integer_value(json_object_get(j, "namespace_incarnation")) == inc1);
    json_decref(j);

    /* a new session joins the new incarnation and adapts into it */
    new_session(&d, "s_new", "zz");
    CHECK(explain_names(&d, "s_new", "new", &st, code, sizeof code) && st == 200);
    CHECK(!explain_names(&d, "s_new", "old", &st, code, sizeof code));
    st = feed(&d, "s_new", "w3 w4 w5", true, code, sizeof code);
    CHECKF(st == 200, "feed adapt on the new incarnation: %ld %s", st, code);
    entries = ns_field(&d, "zz", "entries", &st);
    CHECKF(entries == n_new + 3, "new incarnation after adapt: %lld entries", (long long)entries);
    json_int_t inc_get = ns_field(&d, "zz", "incarnation", &st);
    CHECK(inc_get == inc2);
    /* only what the last incarnation holds survives a restart (without
     * replication, the number names the incarnation for a run: it grows) */
    CHECK(daemon_stop(&d) == 0);
    CHECK(start(&d, NULL) == 0);
    CHECK(ns_field(&d, "zz", "incarnation", &st) > inc2);
    entries = ns_field(&d, "zz", "entries", &st);
    CHECKF(entries == n_new + 3, "after restart: %lld entries", (long long)entries);
    CHECK(call(&d, "DELETE", "/v1/namespaces/zz?confirm=zz", NULL, NULL, NULL, 0) == 200);
    CHECK(daemon_stop(&d) == 0);
}

/* ---- an upload streaming while its namespace is deleted ----------------- */

typedef struct {
    int port;
    atomic_int release;           /* the test lets the rest of the body go */
    atomic_int held;              /* the first half went */
    size_t sent, total;
    long status;
    char code[64];
} held_upload;

static size_t held_read(char *buf, size_t size, size_t nitems, void *data)
{
    held_upload *u = data;
    size_t cap = size * nitems;
    if (u->sent >= u->total)
        return 0;
    if (u->sent >= u->total / 2) {
        atomic_store(&u->held, 1);
        while (!atomic_load(&u->release))
            sleep_ms(5);
    }
    size_t n = 0;
    static const char *words[] = {"w3 ", "w4 ", "w5 ", "w6 ", "w7 "};
    while (n + 4 <= cap && u->sent < u->total) {
        const char *w = words[(u->sent / 3) % 5];
        memcpy(buf + n, w, 3);
        n += 3;
        u->sent += 3;
    }
    return n;
}

static void *held_upload_main(void *arg)
{
    held_upload *u = arg;
    http_resp r;
    u->status = -1;
    if (http_post_stream(u->port, "/v1/namespaces/up/documents?id=streamed", "text/plain", held_read, u, 120, &r) ==
        0) {
        u->status = r.status;
        snprintf(u->code, sizeof u->code, "%s", http_error_code(&r));
    }
    http_resp_free(&r);
    return NULL;
}

TEST(upload_during_delete)
{
    nc_daemon d;
    CHECK(start(&d, NULL) == 0);
    CHECK(upload(&d, "up", "first", DOC_OLD, NULL) == 200);
    held_upload u = {.port = d.port, .total = 600000};
    pthread_t th;
    pthread_create(&th, NULL, held_upload_main, &u);
    for (int i = 0; i < 2000 && !atomic_load(&u.held); i++)
        sleep_ms(5);
    sleep_ms(200);   /* the first half reaches the store */
    CHECK(call(&d, "DELETE", "/v1/namespaces/up?confirm=up", NULL, NULL, NULL, 0) == 200);
    json_t *up = NULL;
    CHECK(upload(&d, "up", "again", DOC_NEW, &up) == 200);
    json_int_t n_new = json_integer_value(json_object_get(up, "tokens_added"));
    json_decref(up);
    atomic_store(&u.release, 1);
    pthread_join(th, NULL);
    CHECKF(u.status == 410 && !strcmp(u.code, "namespace_deleted"), "upload across the delete: %ld %s", u.status,
           u.code);
    long st;
    json_int_t entries = ns_field(&d, "up", "entries", &st);
    CHECKF(entries == n_new, "new incarnation holds %lld entries (%lld expected)", (long long)entries,
           (long long)n_new);
    CHECK(daemon_stop(&d) == 0);
    CHECK(start(&d, NULL) == 0);
    entries = ns_field(&d, "up", "entries", &st);
    CHECKF(entries == n_new, "after restart: %lld entries (%lld expected)", (long long)entries, (long long)n_new);
    CHECK(call(&d, "DELETE", "/v1/namespaces/up?confirm=up", NULL, NULL, NULL, 0) == 200);
    CHECK(daemon_stop(&d) == 0);
}

/* ---- adapting sessions and snapshots racing with delete and re-create --- */

typedef struct {
    nc_daemon *d;
    int idx;
    atomic_int *stop;
    long ok, gone, other;
} adapter;

static void *adapter_main(void *arg)
{
    adapter *a = arg;
    char sid[32];
    int gen = 0;
    while (!atomic_load(a->stop)) {
        snprintf(sid, sizeof sid, "race%d_%d", a->idx, gen++);
        char body[256];
        snprintf(body, sizeof body, "{\"id\":\"%s\",\"namespace\":\"rz\",\"cache\":{\"unbounded\":true}}", sid);
        if (call(a->d, "POST", "/v1/sessions", body, NULL, NULL, 0) != 201) {
            a->other++;
            continue;
        }
        for (int k = 0; k < 50 && !atomic_load(a->stop); k++) {
            char code[64] = "";
            long st = feed(a->d, sid, "w3 w4 w5 w6 w7 w8 w9 w10", true, code, sizeof code);
            if (st == 200) a->ok++;
            else if (st == 410) { a->gone++; break; }
            else a->other++;
        }
        char path[96];
        snprintf(path, sizeof path, "/v1/sessions/%s", sid);
        call(a->d, "DELETE", path, NULL, NULL, NULL, 0);
    }
    return NULL;
}

TEST(delete_recreate_under_adapt_and_snapshots)
{
    nc_daemon d;
    CHECK(start(&d, "1") == 0);   /* a snapshot every second */
    atomic_int stop = 0;
    adapter a[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (adapter){.d = &d, .idx = i, .stop = &stop};
        pthread_create(&th[i], NULL, adapter_main, &a[i]);
    }
    int deletes = 0;
    for (int round = 0; round < 8; round++) {
        sleep_ms(400);
        if (call(&d, "DELETE", "/v1/namespaces/rz?confirm=rz", NULL, NULL, NULL, 0) == 200)
            deletes++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    long ok = 0, gone = 0, other = 0;
    for (int i = 0; i < 3; i++) {
        ok += a[i].ok;
        gone += a[i].gone;
        other += a[i].other;
    }
    fprintf(stderr, "  adapt race: %d deletes, %ld x 200, %ld x 410, %ld other\n", deletes, ok, gone, other);
    CHECK(deletes >= 6);
    CHECK(gone > 0);
    CHECKF(other == 0, "%ld answers neither 200 nor 410", other);
    /* the last incarnation: delete it and create it with a known content;
     * what a restart recovers is exactly that */
    call(&d, "DELETE", "/v1/namespaces/rz?confirm=rz", NULL, NULL, NULL, 0);
    json_t *up = NULL;
    CHECK(upload(&d, "rz", "last", DOC_NEW, &up) == 200);
    json_int_t n_new = json_integer_value(json_object_get(up, "tokens_added"));
    json_decref(up);
    long st;
    json_int_t inc = ns_field(&d, "rz", "incarnation", &st);
    sleep_ms(1500);   /* a periodic snapshot of it */
    CHECK(daemon_stop(&d) == 0);
    CHECK(start(&d, NULL) == 0);
    json_int_t entries = ns_field(&d, "rz", "entries", &st);
    CHECKF(st == 200 && entries == n_new, "after restart the last incarnation holds %lld entries (%lld expected)",
           (long long)entries, (long long)n_new);
    CHECK(ns_field(&d, "rz", "incarnation", &st) > inc);
    CHECK(daemon_stop(&d) == 0);
}

/* ---- finding 3: deleted while waiting ---------------------------------- */

typedef struct {
    nc_daemon *d;
    const char *sid;
    const char *text;
    long n200, n404, n503, nother;
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    for (;;) {
        char code[64] = "";
        long st = feed(w->d, w->sid, w->text, false, code, sizeof code);
        if (st == 200) w->n200++;
        else if (st == 404) { w->n404++; return NULL; }
        else if (st == 503) { w->n503++; return NULL; }
        else { w->nother++; return NULL; }
    }
}

TEST(deleted_while_waiting_is_404)
{
    nc_daemon d;
    CHECK(start(&d, NULL) == 0);
    /* feeds of 30000 tokens hold the session's lock for a while, so the
     * other clients are waiting for it when the delete lands */
    static char text[200000];
    size_t k = 0;
    for (int i = 0; i < 30000; i++)
        k += (size_t)snprintf(text + k, sizeof text - k, "w%d ", 3 + i % 7);
    long n200 = 0, n404 = 0, n503 = 0, nother = 0;
    for (int round = 0; round < 6; round++) {
        char sid[32], body[128];
        snprintf(sid, sizeof sid, "wait%d", round);
        snprintf(body, sizeof body, "{\"id\":\"%s\"}", sid);
        CHECK(call(&d, "POST", "/v1/sessions", body, NULL, NULL, 0) == 201);
        waiter w[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            w[i] = (waiter){.d = &d, .sid = sid, .text = text};
            pthread_create(&th[i], NULL, waiter_main, &w[i]);
        }
        sleep_ms(300);
        char path[96];
        snprintf(path, sizeof path, "/v1/sessions/%s", sid);
        CHECK(call(&d, "DELETE", path, NULL, NULL, NULL, 0) == 204);
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            n200 += w[i].n200;
            n404 += w[i].n404;
            n503 += w[i].n503;
            nother += w[i].nother;
        }
    }
    fprintf(stderr, "  deleted while waiting: %ld x 200, %ld x 404, %ld x 503, %ld other\n", n200, n404, n503,
            nother);
    CHECKF(n503 == 0, "%ld requests on a session deleted here were answered 503 session_moved", n503);
    CHECK(n404 == 24 && nother == 0);
    CHECK(daemon_stop(&d) == 0);
}

int main(void)
{
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    snprintf(data_dir, sizeof data_dir, "/tmp/nc-test-lifecycle-XXXXXX");
    if (!mkdtemp(data_dir))
        return 1;
    httpc_init();
    RUN(deleted_namespace_refuses_old_session);
    RUN(upload_during_delete);
    RUN(delete_recreate_under_adapt_and_snapshots);
    RUN(deleted_while_waiting_is_404);
    httpc_cleanup();
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
    if (system(cmd) != 0) { /* best effort */ }
    return harness_summary();
}
