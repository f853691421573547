/* test_upgrade.c -- yesterday's data, today's build (issue 38 point 2;
 * docs/operations.md#compatibility): tests/fixtures/upgrade-ffac412 is a
 * model directory (trained unbounded.faiss, gate, dynamic evaluation's
 * statistics), a data directory (a keys and a compact namespace, each a
 * snapshot plus log records after it, the keys log ending in a torn record)
 * and session blobs of every stream version (NCSTRM01-04), all written by
 * the build of commit ffac412 (scripts/make_upgrade_fixtures.py), with the
 * predictions that build answered from them. The daemon of this build, a
 * real process over HTTP, opens a copy of it and must answer the same
 * predictions -- then again after a restart (its own snapshot of the old
 * data). A planted format newer than the build (log segment, snapshot,
 * storage file, stream blob, session envelope, gate) is refused with a
 * message naming both versions, and nothing on disk is touched.
 *
 * Tolerance: the recorded probabilities are printed to 12 significant
 * digits; the same arithmetic gives them again exactly (counted, printed as
 * "bit-equal"). A later build may order float32 sums differently (SIMD
 * widths, blocking): each probability is a softmax and a mixture of at most
 * four components over sums of at most 64 terms (H = 16, V = 50, knn = 32),
 * a relative rounding error of at most about 64 * 2^-24 = 4e-6 each step;
 * dynamic evaluation's 12 weight steps compound it a little. TOL = 2e-5
 * absolute on probabilities of about 0.03-0.07 covers that with room and
 * is far below any real change (a lost pair moves them by 1e-3 or more). A
 * word of the recorded top 20 may be missing only when its probability is
 * within TOL of the new 20th. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "daemon.h"
#include "harness.h"

#define FIXTURE "upgrade-ffac412"
#define TOL 2e-5

static json_t *expected;
static int bit_equal, compared;

/* A copy of the fixture in a fresh directory (the daemon truncates the torn
 * tail and snapshots: the committed files must stay as written). */
static int copy_fixture(char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/nc_test_upgrade_XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp -a '%s/" FIXTURE "/.' '%s/'", harness_fixtures(), dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

/* The daemon on the copy at dir, with the settings the fixture was written
 * with (expected.json "daemon_args"). */
static int start(nc_daemon *d, const char *dir)
{
    static char model[600], data[600];
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    const char *args[24] = {"--model", model, "--data-dir", data};
    int n = 4;
    json_t *a = json_object_get(expected, "daemon_args");
    for (size_t i = 0; i < json_array_size(a) && n < 22; i++)
        args[n++] = json_string_value(json_array_get(a, i));
    args[n] = NULL;
    return daemon_start(d, args);
}

static int call(const nc_daemon *d, const char *method, const char *path, const char *ctype, const void *body,
                size_t len, json_t **out)
{
    http_resp r;
    if (http_call(d->port, method, path, ctype, body, len, &r) != 0)
        return -1;
    int st = (int)r.status;
    if (out)
        *out = json_incref(r.json);
    if (st >= 400)
        fprintf(stderr, "   %s %s: %d %s\n", method, path, st, r.body ? r.body : "");
    http_resp_free(&r);
    return st;
}

/* The recorded predictions rec against got (both arrays of {word, id,
 * prob}), as the header says. */
static void compare_predictions(const char *what, json_t *rec, json_t *got)
{
    CHECKF(json_is_array(got) && json_array_size(got) == json_array_size(rec), "%s: %zu predictions", what,
           json_array_size(got));
    if (!json_is_array(got) || json_array_size(got) == 0)
        return;
    double last = json_real_value(json_object_get(json_array_get(got, json_array_size(got) - 1), "prob"));
    bool same = true;
    for (size_t i = 0; i < json_array_size(rec); i++) {
        json_t *r = json_array_get(rec, i);
        json_int_t id = json_integer_value(json_object_get(r, "id"));
        double p = json_real_value(json_object_get(r, "prob"));
        json_t *g = NULL;
        size_t at = 0;
        for (size_t k = 0; k < json_array_size(got) && !g; k++)
            if (json_integer_value(json_object_get(json_array_get(got, k), "id")) == id)
                g = json_array_get(got, at = k);
        if (!g) {
            CHECKF(p <= last + TOL, "%s: word %s (p %.12g) no longer in the top %zu (last %.12g)", what,
                   json_string_value(json_object_get(r, "word")), p, json_array_size(got), last);
            same = false;
            continue;
        }
        double q = json_real_value(json_object_get(g, "prob"));
        CHECKF(fabs(p - q) <= TOL, "%s: word %s: recorded %.12g, now %.12g", what,
               json_string_value(json_object_get(r, "word")), p, q);
        CHECKF(json_equal(json_object_get(r, "word"), json_object_get(g, "word")), "%s: id %lld is another word",
               what, (long long)id);
        same = same && p == q && at == i;
    }
    if (!same)
        fprintf(stderr, "   %s: within the tolerance, not bit-equal\n", what);
    bit_equal += same;
    compared++;
}

/* One probe of expected.json asked again: a session reading a namespace,
 * or a session imported from a blob; then the feed and predict. */
static void run_probe(const nc_daemon *d, json_t *probe, int k)
{
    const char *kind = json_string_value(json_object_get(probe, "kind"));
    char sid[32], path[256], what[128];
    snprintf(sid, sizeof sid, "u%d", k);
    long st = -1;
    if (!strcmp(kind, "namespace")) {
        const char *ns = json_string_value(json_object_get(probe, "namespace"));
        snprintf(what, sizeof what, "namespace %s", ns);
        json_t *body = json_pack("{s:s,s:s,s:O}", "id", sid, "namespace", ns, "cache",
                                 json_object_get(probe, "cache"));
        char *b = json_dumps(body, 0);
        st = call(d, "POST", "/v1/sessions", "application/json", b, strlen(b), NULL);
        free(b);
        json_decref(body);
    } else {
        const char *blob = json_string_value(json_object_get(probe, "blob"));
        snprintf(what, sizeof what, "blob %s", blob);
        char file[1200];
        snprintf(file, sizeof file, "%s/" FIXTURE "/blobs/%s", harness_fixtures(), blob);
        FILE *f = fopen(file, "rb");
        static unsigned char buf[1 << 16];
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f)
            fclose(f);
        snprintf(path, sizeof path, "/v1/sessions/%s/state", sid);
        st = n ? call(d, "PUT", path, "application/octet-stream", buf, n, NULL) : -1;
    }
    CHECKF(st == 201, "%s: session %ld", what, st);
    char feed[256];
    snprintf(feed, sizeof feed, "{\"text\":\"%s\"}", json_string_value(json_object_get(probe, "text")));
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
    CHECK(call(d, "POST", path, "application/json", feed, strlen(feed), NULL) == 200);
    json_t *out = NULL;
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
    CHECK(call(d, "POST", path, "application/json", "{\"top_k\":20}", 12, &out) == 200);
    compare_predictions(what, json_object_get(probe, "predictions"), json_object_get(out, "predictions"));
    json_decref(out);
    snprintf(path, sizeof path, "/v1/sessions/%s", sid);
    call(d, "DELETE", path, NULL, NULL, 0, NULL);
}

/* The namespaces as recorded (entries, words, documents, storage, index)
 * and every probe. */
static void check_all(const nc_daemon *d)
{
    const char *ns;
    json_t *want;
    json_object_foreach(json_object_get(expected, "namespaces"), ns, want) {
        char path[128];
        snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
        json_t *got = NULL;
        CHECK(call(d, "GET", path, NULL, NULL, 0, &got) == 200);
        const char *key;
        json_t *v;
        json_object_foreach(want, key, v) {
            json_t *g = !strcmp(key, "index") ? json_object_get(json_object_get(got, "index"), "type")
                                              : json_object_get(got, key);
            CHECKF(json_equal(v, g), "namespace %s: %s differs from the recorded one", ns, key);
        }
        json_decref(got);
    }
    json_t *probes = json_object_get(expected, "probes");
    for (size_t i = 0; i < json_array_size(probes); i++)
        run_probe(d, json_array_get(probes, i), (int)i);
}

static bool log_has(const nc_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log, "r");
    static char buf[1 << 20];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

/* The fixture opens: the torn record is cut with a warning, every count and
 * prediction is the recorded one; after a clean stop (this build's own
 * snapshots of the old data) and a start, again. */
TEST(fixture_opens_and_predicts_as_recorded)
{
    char dir[128];
    CHECK(copy_fixture(dir, sizeof dir) == 0);
    for (int round = 0; round < 2; round++) {
        nc_daemon d;
        if (start(&d, dir) != 0) {
            CHECK(!"daemon started on the fixture");
            break;
        }
        if (round == 0)
            CHECKF(log_has(&d, "torn final record"), "the torn record of %s was reported",
                   json_string_value(json_object_get(expected, "torn_tail")));
        check_all(&d);
        CHECK(daemon_stop(&d) == 0);
    }
    printf("%d of %d probes bit-equal to the recorded answers\n", bit_equal, compared);
    remove_dir(dir);
}

/* Runs neurocached on dir (model/, data/), which must refuse to start:
 * its output into out. Exit status, or -1. */
static int run_refused(const char *dir, char *out, size_t len)
{
    char cmd[2000];
    snprintf(cmd, sizeof cmd,
             "timeout 60 '%s' --model '%s/model' --data-dir '%s/data' --port 0 --bind 127.0.0.1 %s "
             "--snapshot-period 0 --index-switch-at 200 2>&1",
             daemon_bin_path("neurocached"), dir, dir, geteuid() == 0 ? "--allow-root" : "");
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Replaces the first `from` in file by `to` (as long). */
static int patch(const char *file, const char *from, const char *to)
{
    static char buf[1 << 20];
    FILE *f = fopen(file, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    char *at = memmem(buf, n, from, strlen(from));
    if (!at || strlen(from) != strlen(to))
        return -1;
    memcpy(at, to, strlen(to));
    f = fopen(file, "wb");
    int ok = f && fwrite(buf, 1, n, f) == n;
    return f && fclose(f) == 0 && ok ? 0 : -1;
}

/* A log segment, a snapshot, a storage file and a gate of a version newer
 * than this build's: start-up stops naming both versions; the files stay
 * as they were (nothing truncated, nothing set aside as corrupt). */
TEST(newer_files_refused_naming_both_versions)
{
    static char out[1 << 16];
    struct {
        const char *file, *from, *to, *message;
    } cases[] = {
        {"data/namespaces/keys/wal/wal-0000000000000009.log", "NCWAL001", "NCWAL002",
         "log format version 2 is newer than this build reads (version 1)"},
        {"data/namespaces/compact/snap-0000000000000008/MANIFEST", "neurocache-snapshot 1", "neurocache-snapshot 3",
         "snapshot format version 3 is newer than this build reads (version 2)"},
        {"data/namespaces/compact/storage", "compact ", "zipped  ", "storage 'zipped' is unknown to this build"},
        {"model/gate.json", "\"version\": 1,", "\"version\": 2,",
         "gate format version 2 is newer than this build reads (version 1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[128], file[600], aside[700];
        CHECK(copy_fixture(dir, sizeof dir) == 0);
        snprintf(file, sizeof file, "%s/%s", dir, cases[i].file);
        long size = file_size(file);
        CHECKF(patch(file, cases[i].from, cases[i].to) == 0, "%s: no '%s' to replace", cases[i].file, cases[i].from);
        int st = run_refused(dir, out, sizeof out);
        CHECKF(st != 0 && st != 124, "%s: exit status %d", cases[i].file, st);
        CHECKF(strstr(out, cases[i].message) != NULL, "%s: output lacks \"%s\":\n%s", cases[i].file,
               cases[i].message, out);
        CHECKF(file_size(file) == size, "%s was changed", cases[i].file);
        snprintf(aside, sizeof aside, "%s/data/namespaces/compact/snap-0000000000000008.corrupt", dir);
        CHECK(access(aside, F_OK) != 0);
        remove_dir(dir);
    }
}

/* The stream blob inside a session envelope (server/domain/migrate.c) made
 * version v, both checksums redone. */
static size_t blob_with_version(const unsigned char *env, size_t len, int v, unsigned char *out)
{
    memcpy(out, env, len);
    size_t o = 8 + 4 + 8 + 12;
    uint16_t l;
    memcpy(&l, out + o, 2), o += 2 + l;
    memcpy(&l, out + o, 2), o += 2 + l;
    o += 8;
    uint64_t sl;
    memcpy(&sl, out + o, 8), o += 8;
    out[o + 6] = (unsigned char)('0' + v / 10);
    out[o + 7] = (unsigned char)('0' + v % 10);
    uint32_t c = (uint32_t)crc32(0L, out + o, (uInt)(sl - 4));
    memcpy(out + o + sl - 4, &c, 4);
    c = (uint32_t)crc32(0L, out, (uInt)(len - 4));
    memcpy(out + len - 4, &c, 4);
    return len;
}

/* A session blob whose stream is NCSTRM05, or whose envelope is version 2,
 * is refused (4xx) naming both versions; no session is made. */
TEST(newer_blobs_refused_naming_both_versions)
{
    char dir[128], file[1200];
    CHECK(copy_fixture(dir, sizeof dir) == 0);
    nc_daemon d;
    if (start(&d, dir) != 0) {
        CHECK(!"daemon started");
        remove_dir(dir);
        return;
    }
    snprintf(file, sizeof file, "%s/" FIXTURE "/blobs/plain-v4.blob", harness_fixtures());
    static unsigned char env[1 << 16], b[1 << 16];
    FILE *f = fopen(file, "rb");
    size_t n = f ? fread(env, 1, sizeof env, f) : 0;
    if (f)
        fclose(f);
    CHECK(n > 100);
    blob_with_version(env, n, 5, b);
    http_resp r;
    CHECK(http_call(d.port, "PUT", "/v1/sessions/new5/state", "application/octet-stream", (const char *)b, n, &r) ==
          0);
    CHECKF(r.status >= 400 && r.status < 500, "status %ld", r.status);
    CHECK_STR_CONTAINS(r.body, "stream blob format version 5 is newer than this build reads (versions 1 to 4)");
    http_resp_free(&r);
    memcpy(b, env, n);
    uint32_t two = 2, c;
    memcpy(b + 8, &two, 4);
    c = (uint32_t)crc32(0L, b, (uInt)(n - 4));
    memcpy(b + n - 4, &c, 4);
    CHECK(http_call(d.port, "PUT", "/v1/sessions/new2/state", "application/octet-stream", (const char *)b, n, &r) ==
          0);
    CHECKF(r.status >= 400 && r.status < 500, "status %ld", r.status);
    CHECK_STR_CONTAINS(r.body, "session state version 2, this server reads version 1");
    http_resp_free(&r);
    CHECK(call(&d, "GET", "/v1/sessions/new5", NULL, NULL, 0, NULL) == 404);
    CHECK(daemon_stop(&d) == 0);
    remove_dir(dir);
}

int main(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/" FIXTURE "/expected.json", harness_fixtures());
    json_error_t je;
    expected = json_load_file(path, 0, &je);
    if (!expected) {
        fprintf(stderr, "%s: %s\n", path, je.text);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    httpc_init();
    RUN(fixture_opens_and_predicts_as_recorded);
    RUN(newer_files_refused_naming_both_versions);
    RUN(newer_blobs_refused_naming_both_versions);
    httpc_cleanup();
    json_decref(expected);
    return harness_summary();
}
