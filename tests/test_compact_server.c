/* test_compact_server.c -- a compact namespace in the real daemon, over
 * HTTP (issue 26 point 3): PUT /v1/namespaces/{ns} {"storage": "compact"}
 * makes it (201; 200 again; 409 for the other storage; 400 for a bad
 * value), GET shows its storage, fingerprint and bytes a pair; its log holds
 * codes (a few bytes a pair here, not keys); killed with SIGKILL in the
 * middle of an upload, it comes back from its log alone, then from a
 * snapshot, then from a snapshot and a log tail, each time giving the same
 * predictions, bit for bit, as before. The model is the lstm-2layer fixture
 * with a trained IVF16,PQ4np unbounded.faiss of its own. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"
#include "nswalk.h"

/* the probe session's knobs (nswalk_predictions): the unbounded cache at k 32, nprobe 4 */
static const char *const PROBE_KNOBS = ",\"knn\":32,\"nprobe\":4";

static char model_dir[256], data_dir[128];

static int start(nc_daemon *d)
{
    const char *args[] = {"--model", model_dir, "--data-dir", data_dir, "--fsync", "group", "--snapshot-period", "0",
                          NULL};
    return daemon_start(d, args);
}

static json_t *get_json(const nc_daemon *d, const char *path, long *status)
{
    http_resp r;
    if (http_call(d->port, "GET", path, NULL, NULL, 0, &r) != 0)
        return NULL;
    *status = r.status;
    json_t *j = json_incref(r.json);
    http_resp_free(&r);
    return j;
}

static long put_ns(const nc_daemon *d, const char *ns, const char *body, json_t **out)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    http_resp r;
    if (http_json(d->port, "PUT", path, body, &r) != 0)
        return -1;
    long st = r.status;
    if (out)
        *out = json_incref(r.json);
    http_resp_free(&r);
    return st;
}

static long upload(const nc_daemon *d, const char *ns, const char *id, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/namespaces/%s/documents?id=%s", ns, id);
    http_resp r;
    if (http_call(d->port, "POST", path, "text/plain", text, strlen(text), &r) != 0)
        return -1;
    long st = r.status;
    http_resp_free(&r);
    return st;
}

/* an endless text/plain body, a line of 64 words at a time */
typedef struct {
    uint64_t lines;
} endless;

static size_t endless_read(char *buf, size_t size, size_t nitems, void *data)
{
    endless *e = data;
    size_t cap = size * nitems;
    char *t = nswalk_text(64, 1000 + e->lines++);
    size_t n = strlen(t) < cap ? strlen(t) : cap;
    memcpy(buf, t, n);
    free(t);
    usleep(2000);
    return n;
}

static int port_of_upload;
static void *upload_forever(void *arg)
{
    (void)arg;
    endless e = {0};
    http_resp r = {0};
    /* cut by the kill: a transport failure, with what came so far in r */
    http_post_stream(port_of_upload, "/v1/namespaces/cz/documents?id=endless", "text/plain", endless_read, &e, 60, &r);
    http_resp_free(&r);
    return NULL;
}

static int64_t entries_of(const nc_daemon *d, json_t **ns)
{
    long st = 0;
    json_t *j = get_json(d, "/v1/namespaces/cz", &st);
    int64_t n = st == 200 ? (int64_t)json_integer_value(json_object_get(j, "entries")) : -1;
    if (ns)
        *ns = j;
    else
        json_decref(j);
    return n;
}

TEST(create_compact_over_http)
{
    nc_daemon d;
    CHECK(start(&d) == 0);
    json_t *j = NULL;
    CHECK(put_ns(&d, "cz", "{\"storage\":\"compact\"}", &j) == 201);
    CHECK(!strcmp(json_string_value(json_object_get(j, "storage")), "compact"));
    CHECK(!json_is_true(json_object_get(json_object_get(j, "index"), "exact")));   /* IVF-PQ from the start */
    CHECK(json_string_value(json_object_get(json_object_get(j, "index"), "fingerprint")) != NULL);
    json_decref(j);
    CHECK(put_ns(&d, "cz", "{\"storage\":\"compact\"}", NULL) == 200);
    CHECK(put_ns(&d, "cz", "{\"storage\":\"keys\"}", &j) == 409);
    CHECK(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "compact storage") != NULL);
    json_decref(j);
    /* exact search needs keys */
    http_resp r;
    CHECK(http_json(d.port, "POST", "/v1/sessions",
                    "{\"namespace\":\"cz\",\"cache\":{\"unbounded\":true,\"exact\":true}}", &r) == 0 &&
          r.status == 400 && strstr(r.body, "compact storage"));
    http_resp_free(&r);
    CHECK(put_ns(&d, "ck", "{\"storage\":\"tiny\"}", NULL) == 400);
    CHECK(put_ns(&d, "ck", "{\"size\":1}", NULL) == 400);
    CHECK(put_ns(&d, "ck", NULL, &j) == 201);   /* no body: keys, as a first upload makes it */
    CHECK(!strcmp(json_string_value(json_object_get(j, "storage")), "keys"));
    json_decref(j);
    /* a namespace made by an upload has keys and cannot become compact */
    CHECK(upload(&d, "up", "a", "w1 w2 w3\n") == 200);
    CHECK(put_ns(&d, "up", "{\"storage\":\"compact\"}", NULL) == 409);
    /* bytes: the log holds 4 + 4 + 4 bytes a pair (+ record headers), a
     * namespace with keys 4 + 2 x 16 */
    char *t = nswalk_text(3000, 5);
    CHECK(upload(&d, "cz", "big", t) == 200 && upload(&d, "ck", "big", t) == 200);
    free(t);
    long st;
    json_t *c = get_json(&d, "/v1/namespaces/cz", &st), *k = get_json(&d, "/v1/namespaces/ck", &st);
    double cw = (double)json_integer_value(json_object_get(c, "wal_bytes")) /
                (double)json_integer_value(json_object_get(c, "entries"));
    double kw = (double)json_integer_value(json_object_get(k, "wal_bytes")) /
                (double)json_integer_value(json_object_get(k, "entries"));
    CHECKF(cw >= 12 && cw < 16 && kw >= 36 && kw < 40, "log bytes a pair: compact %.2f, keys %.2f", cw, kw);
    CHECK(json_real_value(json_object_get(json_object_get(c, "bytes_per_entry"), "disk")) > 0);
    fprintf(stderr, "    log bytes a pair: compact %.2f, keys %.2f (H = 16, PQ4)\n", cw, kw);
    json_decref(c);
    json_decref(k);
    CHECK(daemon_stop(&d) == 0);
}

TEST(kill_9_mid_upload_then_same_predictions)
{
    nc_daemon d;
    CHECK(start(&d) == 0);
    char *t = nswalk_text(2000, 7);
    CHECK(upload(&d, "cz", "first", t) == 200);
    free(t);
    /* an upload in flight, killed once some of it is in */
    port_of_upload = d.port;
    pthread_t th;
    pthread_create(&th, NULL, upload_forever, NULL);
    int64_t before = entries_of(&d, NULL), n = before;
    for (int i = 0; i < 400 && n < before + 1000; i++) {
        usleep(20000);
        n = entries_of(&d, NULL);
    }
    CHECKF(n >= before + 1000, "the upload added %lld pairs", (long long)(n - before));
    daemon_kill(&d);
    pthread_join(th, NULL);
    /* 1. the log alone (no snapshot was written: period 0, killed) */
    CHECK(start(&d) == 0);
    json_t *ns = NULL;
    int64_t e1 = entries_of(&d, &ns);
    CHECK(e1 >= 2001 && !strcmp(json_string_value(json_object_get(ns, "storage")), "compact"));
    json_decref(ns);
    json_t *p1 = nswalk_predictions(&d, "cz", PROBE_KNOBS);
    CHECK(p1 && json_array_size(p1) == 20);
    CHECK(daemon_stop(&d) == 0);   /* a snapshot at shutdown */
    /* 2. the snapshot */
    CHECK(start(&d) == 0);
    CHECK(entries_of(&d, NULL) == e1);
    json_t *p2 = nswalk_predictions(&d, "cz", PROBE_KNOBS);
    CHECKF(json_equal(p1, p2), "predictions differ after the snapshot");
    /* the probe's own context, 71 times, each followed by w40: the new
     * pairs are the probe's nearest neighbours */
    t = malloc(71 * 32 + 2);
    size_t k = 0;
    for (int i = 0; i < 71; i++)
        k += (size_t)sprintf(t + k, "w3 w4 w5 w6 w7 w9 w40 ");
    sprintf(t + k, "\n");
    CHECK(upload(&d, "cz", "second", t) == 200);
    free(t);
    json_t *p3 = nswalk_predictions(&d, "cz", PROBE_KNOBS);
    CHECK(!json_equal(p2, p3));   /* the upload did change them */
    daemon_kill(&d);
    /* 3. the snapshot and the log after it */
    CHECK(start(&d) == 0);
    CHECK(entries_of(&d, NULL) == e1 + 71 * 7 + 1);
    json_t *p4 = nswalk_predictions(&d, "cz", PROBE_KNOBS);
    CHECKF(json_equal(p3, p4), "predictions differ after snapshot + log");
    json_decref(p1);
    json_decref(p2);
    json_decref(p3);
    json_decref(p4);
    CHECK(daemon_stop(&d) == 0);
}

/* Without a trained index compact storage is refused, and the refused
 * namespace is not there after a restart */
TEST(compact_needs_a_trained_index)
{
    char plain[256], data[128];
    snprintf(plain, sizeof plain, "%s/lstm-2layer", harness_fixtures());
    snprintf(data, sizeof data, "/tmp/nc_test_compact_plain_XXXXXX");
    CHECK(mkdtemp(data) != NULL);
    const char *args[] = {"--model", plain, "--data-dir", data, NULL};
    nc_daemon d;
    CHECK(daemon_start(&d, args) == 0);
    json_t *j = NULL;
    CHECK(put_ns(&d, "cz", "{\"storage\":\"compact\"}", &j) == 400);
    const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECK(m && strstr(m, "compact storage needs a trained index"));
    json_decref(j);
    CHECK(daemon_stop(&d) == 0);
    CHECK(daemon_start(&d, args) == 0);
    long st = 0;
    json_decref(get_json(&d, "/v1/namespaces/cz", &st));
    CHECK(st == 404);
    CHECK(daemon_stop(&d) == 0);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", data);
    if (system(cmd) != 0) { /* best effort */ }
}

/* The fixture model with an unbounded.faiss of its own: IVF16,PQ4np
 * trained by build-index on its hidden states of 8,000 words */
static int model_setup(void)
{
    snprintf(model_dir, sizeof model_dir, "/tmp/nc_test_compact_model_XXXXXX");
    if (!mkdtemp(model_dir))
        return -1;
    char cmd[2048], corpus[300];
    snprintf(cmd, sizeof cmd, "cp '%s'/lstm-2layer/* '%s'/", harness_fixtures(), model_dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", model_dir);
    FILE *f = fopen(corpus, "w");
    for (int i = 0; f && i < 200; i++) {
        char *t = nswalk_text(40, 50 + (uint64_t)i);
        fputs(t, f);
        free(t);
    }
    if (!f || fclose(f) != 0)
        return -1;
    snprintf(cmd, sizeof cmd, "'%s' build-index --model '%s' --corpus '%s' --factory IVF16,PQ4np --sample 8000 "
             "> /dev/null 2>&1", daemon_bin_path("neurocache"), model_dir, corpus);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    httpc_init();
    snprintf(data_dir, sizeof data_dir, "/tmp/nc_test_compact_data_XXXXXX");
    if (model_setup() != 0 || !mkdtemp(data_dir)) {
        fprintf(stderr, "cannot set up the model or the data directory\n");
        return 1;
    }
    RUN(create_compact_over_http);
    RUN(kill_9_mid_upload_then_same_predictions);
    RUN(compact_needs_a_trained_index);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", model_dir, data_dir);
    if (system(cmd) != 0) { /* best effort */ }
    httpc_cleanup();
    return harness_summary();
}
