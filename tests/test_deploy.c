/* test_deploy.c -- sessions that move between replicas, on real daemons:
 * state export/import round trips (identical predictions), refused blobs
 * (checksum, version, another model, truncation), replica-tagged ids
 * (session_not_here), pull from a peer on a miss, the `neurocache migrate`
 * CLI, and SIGTERM handing every session to the peers. No load balancer
 * here: tests/test_replicas.c runs HAProxy in front. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "daemon.h"
#include "harness.h"

static char model_dir[512], other_model_dir[512];

static const char *CACHE =
    "{\"cache\":{\"neural_size\":50,\"neural_theta\":0.5,\"neural_lambda\":0.2,"
    "\"unigram_size\":30,\"unigram_lambda\":0.1,\"open_vocab\":true}}";
static const char *TEXT =
    "the cat sat on the mat . zorblax the cat ate zorblax and the dog sat on zorblax .\n"
    "a dog and a cat sat . the mat was red and zorblax was blue .\n";

/* Creates a session, returns its id (static buffer per call slot). */
static int create(int port, const char *body, char *id, size_t cap)
{
    http_resp r;
    int ok = http_json(port, "POST", "/v1/sessions", body, &r) == 0 && r.status == 201 && r.json;
    if (ok)
        snprintf(id, cap, "%s", json_string_value(json_object_get(r.json, "id")));
    else
        fprintf(stderr, "create: %ld %s\n", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return ok ? 0 : -1;
}

static int feed(int port, const char *id, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    json_t *b = json_pack("{s:s}", "text", text);
    http_resp r;
    int rc = http_post_json(port, path, b, &r) == 0 && r.status == 200 ? 0 : -1;
    if (rc) fprintf(stderr, "feed: %ld %s\n", r.status, r.body ? r.body : "");
    json_decref(b);
    http_resp_free(&r);
    return rc;
}

/* The full next-word distribution as {word: prob} (new reference, NULL on
 * failure). By word, not id: open-vocabulary ids are per word table, and a
 * session without a namespace shares its replica's "default" one. */
static json_t *predict_full(int port, const char *id, long *status)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    http_resp r;
    json_t *d = NULL;
    if (http_json(port, "POST", path, "{\"full\":true}", &r) == 0 && r.status == 200 && r.json) {
        d = json_object();
        size_t i;
        json_t *it;
        json_array_foreach(json_object_get(r.json, "predictions"), i, it) {
            const char *w = json_string_value(json_object_get(it, "word"));
            double p = json_real_value(json_object_get(it, "prob"));
            if (w && p > 0) json_object_set_new(d, w, json_real(p));
        }
    }
    if (status) *status = r.status;
    http_resp_free(&r);
    return d;
}

/* Largest |pa(w) - pb(w)| over every word either gives mass. */
static double max_diff(const json_t *a, const json_t *b)
{
    double m = 0;
    const char *w;
    json_t *v;
    json_object_foreach((json_t *)a, w, v) {
        double d = fabs(json_real_value(v) - json_real_value(json_object_get(b, w)));
        if (d > m) m = d;
    }
    json_object_foreach((json_t *)b, w, v) {
        double d = fabs(json_real_value(v) - json_real_value(json_object_get(a, w)));
        if (d > m) m = d;
    }
    return m;
}

static int get_state(int port, const char *id, char **blob, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/state", id);
    http_resp r;
    *blob = NULL;
    *len = 0;
    if (http_call(port, "GET", path, NULL, NULL, 0, &r) != 0 || r.status != 200) {
        http_resp_free(&r);
        return -1;
    }
    *blob = malloc(r.len);
    memcpy(*blob, r.body, r.len);
    *len = r.len;
    int octet = strstr(r.content_type, "application/octet-stream") != NULL;
    http_resp_free(&r);
    return octet ? 0 : -1;
}

static long put_state(int port, const char *id, const void *blob, size_t len, char *code, size_t cap)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/state", id);
    http_resp r;
    long st = -1;
    if (http_call(port, "PUT", path, "application/octet-stream", blob, len, &r) == 0) {
        st = r.status;
        if (code) snprintf(code, cap, "%s", http_error_code(&r));
    }
    http_resp_free(&r);
    return st;
}

static long session_count(int port)
{
    http_resp r;
    long n = -1;
    if (http_call(port, "GET", "/v1/sessions", NULL, NULL, 0, &r) == 0 && r.json)
        n = (long)json_integer_value(json_object_get(r.json, "count"));
    http_resp_free(&r);
    return n;
}

/* ---- export / import ----------------------------------------------------- */

TEST(state_round_trip)
{
    nc_daemon d;
    const char *args[] = {"--model", model_dir, "--replica-tag", "a", NULL};
    if (daemon_start(&d, args)) { CHECK(0); return; }
    char id[80], id2[80] = "copy-1";
    CHECK(create(d.port, CACHE, id, sizeof id) == 0);
    CHECK(strncmp(id, "ses_a_", 6) == 0);
    CHECK(feed(d.port, id, TEXT) == 0);
    char *blob = NULL;
    size_t len = 0;
    CHECK(get_state(d.port, id, &blob, &len) == 0);
    CHECK(len > 100 && blob && memcmp(blob, "NCSESS\r\n", 8) == 0);
    char code[64] = "";
    CHECK(put_state(d.port, id2, blob, len, code, sizeof code) == 201);
    json_t *p1 = predict_full(d.port, id, NULL), *p2 = predict_full(d.port, id2, NULL);
    /* Open vocabulary: "zorblax" is a word of its own in both copies. */
    CHECK(p1 && p2 && json_object_size(p1) > 0);
    if (p1 && p2)
        CHECK_NEAR(max_diff(p1, p2), 0.0, 1e-7);
    json_decref(p1);
    json_decref(p2);
    /* The copies keep evolving identically (windows, LSTM state). */
    CHECK(feed(d.port, id, "zorblax sat on the dog .") == 0);
    CHECK(feed(d.port, id2, "zorblax sat on the dog .") == 0);
    p1 = predict_full(d.port, id, NULL);
    p2 = predict_full(d.port, id2, NULL);
    CHECK(p1 && p2);
    if (p1 && p2)
        CHECK_NEAR(max_diff(p1, p2), 0.0, 1e-7);
    json_decref(p1);
    json_decref(p2);
    /* PUT over an existing id replaces it. */
    CHECK(put_state(d.port, id2, blob, len, code, sizeof code) == 201);
    CHECK(session_count(d.port) == 2);
    free(blob);
    CHECK(daemon_stop(&d) == 0);
}

TEST(state_refused)
{
    nc_daemon d, o;
    const char *args[] = {"--model", model_dir, NULL};
    const char *oargs[] = {"--model", other_model_dir, NULL};
    if (daemon_start(&d, args)) { CHECK(0); return; }
    if (daemon_start(&o, oargs)) { CHECK(0); daemon_stop(&d); return; }
    char id[80], code[64];
    CHECK(create(d.port, CACHE, id, sizeof id) == 0);
    CHECK(feed(d.port, id, TEXT) == 0);
    char *blob = NULL;
    size_t len = 0;
    CHECK(get_state(d.port, id, &blob, &len) == 0);
    if (!blob) { daemon_stop(&d); daemon_stop(&o); return; }
    char *bad = malloc(len);

    /* One flipped bit in the LSTM state: checksum. */
    memcpy(bad, blob, len);
    bad[len / 2] ^= 0x10;
    CHECK(put_state(d.port, "x1", bad, len, code, sizeof code) == 400);
    CHECK(strcmp(code, "state_corrupt") == 0);
    /* Truncated. */
    CHECK(put_state(d.port, "x2", blob, len - 9, code, sizeof code) == 400);
    CHECK(strcmp(code, "state_corrupt") == 0);
    /* Not a blob at all. */
    CHECK(put_state(d.port, "x3", "{\"id\":1}", 8, code, sizeof code) == 400);
    CHECK(strcmp(code, "state_corrupt") == 0);
    CHECK(put_state(d.port, "x3", "", 0, code, sizeof code) == 400);
    /* A future version (checksum recomputed: only the version differs). */
    memcpy(bad, blob, len);
    uint32_t v = 2;
    memcpy(bad + 8, &v, 4);
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)bad, (uInt)(len - 4));
    memcpy(bad + len - 4, &crc, 4);
    CHECK(put_state(d.port, "x4", bad, len, code, sizeof code) == 400);
    CHECK(strcmp(code, "state_version") == 0);
    /* Another model. */
    CHECK(put_state(o.port, "x5", blob, len, code, sizeof code) == 409);
    CHECK(strcmp(code, "state_model_mismatch") == 0);
    /* A bad id in the path. */
    CHECK(put_state(d.port, "bad%20id", blob, len, code, sizeof code) == 400);
    CHECK(put_state(d.port, "a~b", blob, len, code, sizeof code) == 400);
    CHECK(put_state(d.port, "x0123456789012345678901234567890123456789012345678901234567890123", blob, len,
                    code, sizeof code) == 400);   /* 65 characters */
    /* Nothing was created by the refused ones; the good blob still works. */
    CHECK(session_count(d.port) == 1);
    CHECK(session_count(o.port) == 0);
    CHECK(put_state(d.port, "x6", blob, len, code, sizeof code) == 201);
    free(bad);
    free(blob);
    CHECK(daemon_stop(&o) == 0);
    CHECK(daemon_stop(&d) == 0);
}

/* A session reading a namespace's unbounded cache: the copy is bound to
 * the same namespace and predicts the same. */
TEST(state_with_namespace)
{
    nc_daemon d;
    const char *args[] = {"--model", model_dir, NULL};
    if (daemon_start(&d, args)) { CHECK(0); return; }
    http_resp r;
    const char *doc = "the zorblax sat on the mat . a dog saw the zorblax .\n";
    CHECK(http_call(d.port, "POST", "/v1/namespaces/n1/documents", "text/plain", doc, strlen(doc), &r) == 0 &&
          r.status == 200);
    http_resp_free(&r);
    char id[80], code[64];
    CHECK(create(d.port, "{\"namespace\":\"n1\",\"cache\":{\"unbounded\":true,\"exact\":true,"
                 "\"unbounded_lambda\":0.4,\"open_vocab\":true,\"neural_size\":20}}", id, sizeof id) == 0);
    CHECK(feed(d.port, id, "the") == 0);
    char *blob = NULL;
    size_t len = 0;
    CHECK(get_state(d.port, id, &blob, &len) == 0);
    CHECK(blob && put_state(d.port, "copy-ns", blob, len, code, sizeof code) == 201);
    CHECK(http_call(d.port, "GET", "/v1/sessions/copy-ns", NULL, NULL, 0, &r) == 0 && r.json);
    CHECK(r.json && json_is_string(json_object_get(r.json, "namespace")) &&
          !strcmp(json_string_value(json_object_get(r.json, "namespace")), "n1"));
    http_resp_free(&r);
    json_t *p1 = predict_full(d.port, id, NULL), *p2 = predict_full(d.port, "copy-ns", NULL);
    CHECK(p1 && p2);
    if (p1 && p2) {
        CHECK_NEAR(max_diff(p1, p2), 0.0, 1e-7);
        /* the namespace's open-vocabulary word has mass */
        CHECK(json_real_value(json_object_get(p2, "zorblax")) > 1e-3);
    }
    json_decref(p1);
    json_decref(p2);
    free(blob);
    CHECK(daemon_stop(&d) == 0);
}

/* ---- replica tags and peers ------------------------------------------------- */

TEST(session_not_here)
{
    nc_daemon a, b;
    const char *aa[] = {"--model", model_dir, "--replica-tag", "a", NULL};
    const char *ba[] = {"--model", model_dir, "--replica-tag", "b", NULL};
    if (daemon_start(&a, aa)) { CHECK(0); return; }
    if (daemon_start(&b, ba)) { CHECK(0); daemon_stop(&a); return; }
    char id[80], path[256];
    CHECK(create(a.port, "{}", id, sizeof id) == 0);
    http_resp r;
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    CHECK(http_json(b.port, "POST", path, "{}", &r) == 0 && r.status == 404);
    CHECK(strcmp(http_error_code(&r), "session_not_here") == 0);
    CHECK_STR_CONTAINS(r.body, "replica 'a'");
    http_resp_free(&r);
    /* Its own tag, or a client-chosen id: plain not found. */
    CHECK(http_json(b.port, "POST", "/v1/sessions/ses_b_0123456789abcdef0123456789abcdef/predict", "{}", &r) == 0);
    CHECK(r.status == 404 && strcmp(http_error_code(&r), "session_not_found") == 0);
    http_resp_free(&r);
    CHECK(http_json(b.port, "POST", "/v1/sessions/my-own-id/feed", "{\"text\":\"a\"}", &r) == 0);
    CHECK(r.status == 404 && strcmp(http_error_code(&r), "session_not_found") == 0);
    http_resp_free(&r);
    CHECK(daemon_stop(&b) == 0);
    CHECK(daemon_stop(&a) == 0);
}

static int start_pair(nc_daemon *a, nc_daemon *b, const char *grace)
{
    int pa = free_loopback_port(), pb = free_loopback_port();
    char spa[16], spb[16], peers[256];
    snprintf(spa, sizeof spa, "%d", pa);
    snprintf(spb, sizeof spb, "%d", pb);
    snprintf(peers, sizeof peers, "a=http://127.0.0.1:%d,b=http://127.0.0.1:%d", pa, pb);
    const char *aa[] = {"--model", model_dir, "--replica-tag", "a", "--port", spa, "--peers", peers,
                        "--drain-grace", grace, NULL};
    const char *ba[] = {"--model", model_dir, "--replica-tag", "b", "--port", spb, "--peers", peers,
                        "--drain-grace", grace, NULL};
    if (daemon_start(a, aa)) return -1;
    if (daemon_start(b, ba)) { daemon_stop(a); return -1; }
    return 0;
}

TEST(pull_on_miss)
{
    nc_daemon a, b;
    if (start_pair(&a, &b, "0")) { CHECK(0); return; }
    char id[80];
    CHECK(create(a.port, CACHE, id, sizeof id) == 0);
    CHECK(feed(a.port, id, TEXT) == 0);
    json_t *pa = predict_full(a.port, id, NULL);
    /* The request lands on b: b takes the session over from a. */
    long st = 0;
    json_t *pb = predict_full(b.port, id, &st);
    CHECK(st == 200);
    CHECK(pa && pb);
    if (pa && pb)
        CHECK_NEAR(max_diff(pa, pb), 0.0, 1e-7);
    CHECK(session_count(a.port) == 0);
    CHECK(session_count(b.port) == 1);
    /* Tokens fed on b after the move are not lost when it moves back. */
    CHECK(feed(b.port, id, "the dog sat .") == 0);
    json_decref(pb);
    pb = predict_full(b.port, id, NULL);
    json_decref(pa);
    pa = predict_full(a.port, id, &st);
    CHECK(st == 200 && pa && pb);
    if (pa && pb)
        CHECK_NEAR(max_diff(pa, pb), 0.0, 1e-7);
    CHECK(session_count(a.port) == 1 && session_count(b.port) == 0);
    json_decref(pa);
    json_decref(pb);
    /* A session nobody holds: not here / not found, after asking. */
    http_resp r;
    CHECK(http_json(a.port, "POST", "/v1/sessions/ses_b_00000000000000000000000000000000/predict", "{}", &r) == 0);
    CHECK(r.status == 404 && strcmp(http_error_code(&r), "session_not_here") == 0);
    http_resp_free(&r);
    CHECK(daemon_stop(&b) == 0);
    CHECK(daemon_stop(&a) == 0);
}

TEST(migrate_cli)
{
    nc_daemon a, b;
    const char *aa[] = {"--model", model_dir, "--replica-tag", "a", NULL};
    const char *ba[] = {"--model", model_dir, "--replica-tag", "b", NULL};
    if (daemon_start(&a, aa)) { CHECK(0); return; }
    if (daemon_start(&b, ba)) { CHECK(0); daemon_stop(&a); return; }
    char id[80], cmd[1024];
    CHECK(create(a.port, CACHE, id, sizeof id) == 0);
    CHECK(feed(a.port, id, TEXT) == 0);
    json_t *pa = predict_full(a.port, id, NULL);
    snprintf(cmd, sizeof cmd, "%s migrate --from http://127.0.0.1:%d --to http://127.0.0.1:%d --session %s 2>&1",
             daemon_bin_path("neurocache"), a.port, b.port, id);
    CHECK(system(cmd) == 0);
    CHECK(session_count(a.port) == 0 && session_count(b.port) == 1);
    json_t *pb = predict_full(b.port, id, NULL);
    CHECK(pa && pb);
    if (pa && pb)
        CHECK_NEAR(max_diff(pa, pb), 0.0, 1e-7);
    /* Errors: an unknown session, an unreachable target (the session stays). */
    snprintf(cmd, sizeof cmd, "%s migrate --from http://127.0.0.1:%d --to http://127.0.0.1:%d --session nope >/dev/null 2>&1",
             daemon_bin_path("neurocache"), a.port, b.port);
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, "%s migrate --from http://127.0.0.1:%d --to http://127.0.0.1:%d --session %s >/dev/null 2>&1",
             daemon_bin_path("neurocache"), b.port, free_loopback_port(), id);
    CHECK(system(cmd) != 0);
    CHECK(session_count(b.port) == 1);
    json_decref(pa);
    json_decref(pb);
    CHECK(daemon_stop(&b) == 0);
    CHECK(daemon_stop(&a) == 0);
}

TEST(drain_hands_over)
{
    nc_daemon a, b;
    if (start_pair(&a, &b, "0")) { CHECK(0); return; }
    enum { N = 6 };
    char ids[N][80];
    json_t *before[N] = {0};
    for (int i = 0; i < N; i++) {
        CHECK(create(a.port, CACHE, ids[i], sizeof ids[i]) == 0);
        CHECK(feed(a.port, ids[i], i % 2 ? TEXT : "the dog sat on zorblax .") == 0);
        before[i] = predict_full(a.port, ids[i], NULL);
    }
    daemon_signal_term(&a);
    CHECK(daemon_wait(&a, 60) == 0);
    CHECK(session_count(b.port) == N);
    for (int i = 0; i < N; i++) {
        json_t *after = predict_full(b.port, ids[i], NULL);
        CHECK(after && before[i]);
        if (after && before[i])
            CHECK_NEAR(max_diff(after, before[i]), 0.0, 1e-7);
        json_decref(after);
        json_decref(before[i]);
    }
    CHECK(daemon_stop(&b) == 0);
}

/* With API keys: a key may import a session only into a namespace it may
 * write (the namespace is inside the blob); peers pull with peer_key; the
 * CLI migrates with --key. */
TEST(keys)
{
    char dir[] = "/tmp/nc-test-keys-XXXXXX", keyfile[300];
    if (!mkdtemp(dir)) { CHECK(0); return; }
    snprintf(keyfile, sizeof keyfile, "%s/keys", dir);
    const char *ADM = "nc_admin_0123456789abcdef", *ALICE = "nc_alice_0123456789abcdef",
               *OPS = "nc_ops_0123456789abcdef01";
    FILE *f = fopen(keyfile, "w");
    if (!f) { CHECK(0); return; }
    fprintf(f, "adm %s read,write,admin *\nalice %s read,write docs,default\n"
            "ops %s read,write,admin docs,default\n", ADM, ALICE, OPS);
    fclose(f);
    chmod(keyfile, 0600);
    int pa = free_loopback_port(), pb = free_loopback_port();
    char spa[16], spb[16], peers[256];
    snprintf(spa, sizeof spa, "%d", pa);
    snprintf(spb, sizeof spb, "%d", pb);
    snprintf(peers, sizeof peers, "a=http://127.0.0.1:%d,b=http://127.0.0.1:%d", pa, pb);
    nc_daemon a, b;
    const char *aa[] = {"--model", model_dir, "--replica-tag", "a", "--port", spa, "--peers", peers,
                        "--api-keys", keyfile, "--peer-key", ADM, NULL};
    const char *ba[] = {"--model", model_dir, "--replica-tag", "b", "--port", spb, "--peers", peers,
                        "--api-keys", keyfile, "--peer-key", ADM, NULL};
    if (daemon_start(&a, aa)) { CHECK(0); return; }
    if (daemon_start(&b, ba)) { CHECK(0); daemon_stop(&a); return; }
    httpc_set_bearer(ADM);
    http_resp r;
    const char *doc = "the zorblax sat on the mat .\n";
    CHECK(http_call(a.port, "POST", "/v1/namespaces/news/documents", "text/plain", doc, strlen(doc), &r) == 0 &&
          r.status == 200);
    http_resp_free(&r);
    char id[80], code[64];
    CHECK(create(a.port, "{\"namespace\":\"news\",\"cache\":{\"unbounded\":true,\"exact\":true}}", id,
                 sizeof id) == 0);
    CHECK(feed(a.port, id, "the") == 0);
    char *blob = NULL;
    size_t len = 0;
    CHECK(get_state(a.port, id, &blob, &len) == 0);
    /* Import is an admin operation (auth.c): alice (read, write) may not.
     * ops, admin of "docs" and "default" only, may not import a "news"
     * session (its namespace is inside the blob, where the check before the
     * handler cannot see it), but may import one of "default". */
    char id2[80], *blob2 = NULL;
    size_t len2 = 0;
    CHECK(create(a.port, "{}", id2, sizeof id2) == 0);
    CHECK(get_state(a.port, id2, &blob2, &len2) == 0);
    httpc_set_bearer(ALICE);
    CHECK(blob2 && put_state(a.port, "mine", blob2, len2, code, sizeof code) == 403);
    httpc_set_bearer(OPS);
    CHECK(blob && http_call(a.port, "PUT", "/v1/sessions/stolen/state", "application/octet-stream", blob, len,
                            &r) == 0 && r.status == 403);
    CHECK(strcmp(http_error_code(&r), "forbidden") == 0);
    CHECK_STR_CONTAINS(r.body, "namespace 'news'");
    http_resp_free(&r);
    CHECK(blob2 && put_state(a.port, "mine", blob2, len2, code, sizeof code) == 201);
    httpc_set_bearer(ADM);
    CHECK(session_count(a.port) == 3);   /* id, id2, mine -- no "stolen" */
    free(blob2);
    /* The request lands on b: b pulls it from a with its peer key. */
    long st = 0;
    json_t *dist = predict_full(b.port, id, &st);
    CHECK(st == 200 && dist);
    json_decref(dist);
    CHECK(session_count(a.port) == 2 && session_count(b.port) == 1);
    /* The CLI: refused without a key, moves it back with one. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "NEUROCACHE_API_KEY= %s migrate --from http://127.0.0.1:%d --to http://127.0.0.1:%d "
             "--session %s >/dev/null 2>&1", daemon_bin_path("neurocache"), b.port, a.port, id);
    CHECK(system(cmd) != 0);
    CHECK(session_count(b.port) == 1);
    snprintf(cmd, sizeof cmd, "%s migrate --key %s --from http://127.0.0.1:%d --to http://127.0.0.1:%d "
             "--session %s >/dev/null 2>&1", daemon_bin_path("neurocache"), ADM, b.port, a.port, id);
    CHECK(system(cmd) == 0);
    CHECK(session_count(a.port) == 3 && session_count(b.port) == 0);
    free(blob);
    CHECK(daemon_stop(&b) == 0);
    CHECK(daemon_stop(&a) == 0);
    httpc_set_bearer(NULL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

int main(void)
{
    httpc_init();
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    snprintf(other_model_dir, sizeof other_model_dir, "%s/lstm-2layer-f16", harness_fixtures());
    RUN(state_round_trip);
    RUN(state_refused);
    RUN(state_with_namespace);
    RUN(session_not_here);
    RUN(pull_on_miss);
    RUN(migrate_cli);
    RUN(drain_hands_over);
    RUN(keys);
    httpc_cleanup();
    return harness_summary();
}
