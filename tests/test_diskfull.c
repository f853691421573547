/* test_diskfull.c -- a real full disk under the daemon: its data directory
 * on a tiny loop-mounted ext4 (8 MB), documents streamed into a namespace
 * until the write-ahead log finds no room. Every failed upload must answer
 * 507 insufficient_storage (never 500, never a crash), the daemon keeps
 * serving; restarted on the full disk it serves every acknowledged
 * document (writes 507) and takes writes again seconds after some space is
 * freed; once the file system is grown (resize2fs) a restart finds every
 * acknowledged document and takes new ones. Needs root and loop devices: skipped with the
 * reason otherwise (test_fault_injection and test_wal cover ENOSPC with the fault
 * hook and RLIMIT_FSIZE everywhere). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"

#define MAX_DOCS 20000

static char work[64] = "/tmp/nc-diskfull-XXXXXX";
static char img[128], mnt[128], data[160], ballast[160], model_dir[1024];
static int mounted;

/* Runs a shell command quietly; its exit status. */
static int sh(const char *fmt, const char *a, const char *b)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    int st = system(cmd);
    return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void unmount(void)
{
    if (mounted && sh("umount '%s' 2>/dev/null || umount -l '%s' 2>/dev/null", mnt, mnt) == 0)
        mounted = 0;
}

/* The acknowledged documents: id and pairs (from the namespace's document
 * list while the daemon still runs). */
static char (*acked_id)[32];
static long *acked_pairs;
static int nacked;

static int start(nc_daemon *d)
{
    const char *args[] = {"--model", model_dir, "--data-dir", data, "--fsync", "group", NULL};
    return daemon_start(d, args);
}

/* One NDJSON upload of n documents d-<first>..; returns the status. */
static long upload(int port, int first, int n, json_t **ids)
{
    size_t cap = (size_t)n * 700 + 1, len = 0;
    char *body = malloc(cap);
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(body + len, cap - len, "{\"id\":\"d-%d\",\"text\":\"", first + i);
        for (int j = 0; j < 100; j++)
            len += (size_t)snprintf(body + len, cap - len, "w%d ", (first * 7 + i * 13 + j * 31) % 48);
        len += (size_t)snprintf(body + len, cap - len, "\"}\n");
    }
    http_resp r;
    long st = http_call(port, "POST", "/v1/namespaces/full/documents", "application/x-ndjson", body, len, &r) == 0
                  ? r.status : -1;
    if (st == 200 && ids)
        *ids = json_incref(json_object_get(r.json, "ids"));
    if (st != 200 && st != -1)
        CHECKF(st == 507 && !strcmp(http_error_code(&r), "insufficient_storage"),
               "a failed upload answered %ld %s: %s", st, http_error_code(&r), r.body);
    http_resp_free(&r);
    free(body);
    return st;
}

/* pairs of document id in the namespace's list (-1 = absent) */
static long doc_pairs(const json_t *docs, const char *id)
{
    size_t i;
    json_t *d;
    json_array_foreach(docs, i, d)
        if (!strcmp(json_string_value(json_object_get(d, "id")), id))
            return (long)json_integer_value(json_object_get(d, "tokens"));
    return -1;
}

static json_t *doc_list(int port)
{
    http_resp r;
    json_t *docs = NULL;
    if (http_json(port, "GET", "/v1/namespaces/full/documents", NULL, &r) == 0 && r.status == 200)
        docs = json_incref(json_object_get(r.json, "documents"));
    http_resp_free(&r);
    return docs;
}

/* Acknowledged documents absent from the namespace or with another pair
 * count now (the first five are named). */
static int lost_documents(int port, const char *when)
{
    json_t *docs = doc_list(port);
    CHECK(docs != NULL);
    int lost = 0;
    for (int i = 0; docs && i < nacked; i++) {
        long p = doc_pairs(docs, acked_id[i]);
        if (p != acked_pairs[i] && lost++ < 5)
            CHECKF(0, "document %s: %ld pairs acknowledged, %ld %s", acked_id[i], acked_pairs[i], p, when);
    }
    json_decref(docs);
    return lost;
}

TEST(fill_the_disk)
{
    nc_daemon d;
    CHECK(start(&d) == 0);
    if (!d.pid)
        return;
    int next = 0, full = 0, uploads = 0;
    json_t *acked = json_array();
    /* 20 documents (2020 pairs of 16-dim f16 keys, ~75 KB of log) per
     * upload: the 8 MB file system fills after some 90 uploads */
    for (int i = 0; i < 400 && full < 5; i++) {
        json_t *ids = NULL;
        long st = upload(d.port, next, 20, &ids);
        next += 20;
        uploads++;
        if (st == 200) {
            json_array_extend(acked, ids);
        } else {
            CHECKF(st == 507, "upload %d answered %ld", uploads, st);
            full++;
        }
        json_decref(ids);
        if (st != 200 && st != 507)
            break;
    }
    fprintf(stderr, "        %d uploads, %zu documents acknowledged, %d answered 507\n", uploads,
            json_array_size(acked), full);
    CHECKF(full > 0, "the disk never filled (%d uploads)", uploads);
    CHECK(json_array_size(acked) >= 100);
    /* Still serving: health, scoring, reading the namespace. */
    http_resp r;
    CHECK(http_json(d.port, "GET", "/health", NULL, &r) == 0 && r.status == 200);
    http_resp_free(&r);
    CHECK(http_json(d.port, "POST", "/v1/score", "{\"text\":\"w1 w2 w3\\n\"}", &r) == 0 && r.status == 200);
    http_resp_free(&r);
    json_t *docs = doc_list(d.port);
    CHECK(docs != NULL);
    nacked = (int)json_array_size(acked);
    if (nacked > MAX_DOCS) nacked = MAX_DOCS;
    /* (room for the documents restart_while_full adds) */
    acked_id = calloc((size_t)nacked + 8, sizeof *acked_id);
    acked_pairs = calloc((size_t)nacked + 8, sizeof *acked_pairs);
    for (int i = 0; i < nacked; i++) {
        snprintf(acked_id[i], sizeof acked_id[i], "%s", json_string_value(json_array_get(acked, (size_t)i)));
        acked_pairs[i] = docs ? doc_pairs(docs, acked_id[i]) : -1;
        CHECKF(acked_pairs[i] == 101, "acknowledged document %s has %ld pairs (100 words and the eos)",
               acked_id[i], acked_pairs[i]);
    }
    json_decref(docs);
    json_decref(acked);
    /* SIGTERM on a full disk: the shutdown snapshot fails, the daemon
     * still exits cleanly (the log holds everything). */
    int st = daemon_stop(&d);
    CHECKF(st == 0, "exit status %d on a full disk", st);
}

/* A restart on the disk that is still full: recovery needs no room (the
 * log opens stopped when not even a segment header fits), so the daemon
 * comes up and serves every acknowledged document; writes answer 507 until
 * there is room. */
TEST(restart_while_full)
{
    if (nacked == 0)
        return;
    nc_daemon d;
    CHECK(start(&d) == 0);
    if (!d.pid)
        return;
    int lost = lost_documents(d.port, "on the full disk");
    CHECKF(lost == 0, "%d of %d acknowledged documents missing on the full disk", lost, nacked);
    http_resp r;
    CHECK(http_json(d.port, "POST", "/v1/score", "{\"text\":\"w1 w2 w3\\n\"}", &r) == 0 && r.status == 200);
    http_resp_free(&r);
    json_t *ids = NULL;
    long st = upload(d.port, 800000, 20, &ids);
    CHECKF(st == 507, "an upload on the full disk answered %ld", st);
    json_decref(ids);
    ids = NULL;
    /* Room again (the ballast goes): within seconds the snapshot thread
     * starts the log (nsstore_heal) and uploads are taken, by the same
     * process. */
    CHECK(unlink(ballast) == 0);
    double t0 = now_s();
    for (int i = 0; i < 100 && st != 200; i++) {
        sleep_ms(100);
        json_decref(ids);
        ids = NULL;
        st = upload(d.port, 810000, 3, &ids);
    }
    CHECKF(st == 200 && json_array_size(ids) == 3, "no upload taken within 10 s of freeing space (%ld)", st);
    fprintf(stderr, "        restart on the full disk: serving, %d acknowledged documents, uploads 507; "
            "taken again %.1f s after space was freed\n", nacked, now_s() - t0);
    json_t *after = doc_list(d.port);
    for (size_t i = 0; st == 200 && i < json_array_size(ids); i++) {
        snprintf(acked_id[nacked], sizeof acked_id[nacked], "%s", json_string_value(json_array_get(ids, i)));
        acked_pairs[nacked] = doc_pairs(after, acked_id[nacked]);
        CHECK(acked_pairs[nacked] == 101);
        nacked++;
    }
    json_decref(after);
    json_decref(ids);
    CHECK(daemon_stop(&d) == 0);
}

TEST(restart_after_growing)
{
    if (nacked == 0)
        return;
    /* more room: unmount, grow the image and the file system, mount */
    unmount();
    CHECK(!mounted);
    CHECK(sh("truncate -s 64M '%s' && e2fsck -fp '%s' >/dev/null 2>&1; true", img, img) == 0);
    CHECK(sh("resize2fs -f '%s' >/dev/null 2>&1", img, NULL) == 0);
    CHECK(sh("mount -o loop '%s' '%s'", img, mnt) == 0);
    mounted = 1;
    nc_daemon d;
    CHECK(start(&d) == 0);
    if (!d.pid)
        return;
    int lost = lost_documents(d.port, "after growing the file system");
    CHECKF(lost == 0, "%d of %d acknowledged documents lost or changed", lost, nacked);
    fprintf(stderr, "        after growing the file system: %d acknowledged documents, %d lost\n", nacked, lost);
    /* and the namespace takes documents again */
    json_t *ids = NULL;
    CHECK(upload(d.port, 900000, 5, &ids) == 200 && json_array_size(ids) == 5);
    json_decref(ids);
    CHECK(daemon_stop(&d) == 0);
}

int main(void)
{
    if (!mkdtemp(work))
        return 1;
    snprintf(img, sizeof img, "%s/fs.img", work);
    snprintf(mnt, sizeof mnt, "%s/mnt", work);
    snprintf(data, sizeof data, "%s/data", mnt);
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    const char *why = NULL;
    if (geteuid() != 0)
        why = "not root (mounting a loop file system needs root)";
    else if (mkdir(mnt, 0755) != 0 || sh("truncate -s 8M '%s' && mkfs.ext4 -q -F '%s' >/dev/null 2>&1", img, img) != 0)
        why = "mkfs.ext4 failed or is not installed (e2fsprogs)";
    else if (sh("mount -o loop '%s' '%s' 2>/dev/null", img, mnt) != 0)
        why = "mount -o loop is not permitted here (no loop devices or no CAP_SYS_ADMIN)";
    else
        mounted = 1;
    if (why) {
        printf("SKIP test_diskfull: %s\n", why);
        printf("0 passed, 0 failed\n");
        sh("rm -rf '%s'", work, NULL);
        return 0;
    }
    mkdir(data, 0755);
    /* 256 KB set aside, freed later to give the full disk some room */
    snprintf(ballast, sizeof ballast, "%s/ballast", mnt);
    CHECK(sh("head -c 262144 /dev/zero > '%s'", ballast, NULL) == 0);
    httpc_init();
    RUN(fill_the_disk);
    RUN(restart_while_full);
    RUN(restart_after_growing);
    httpc_cleanup();
    unmount();
    if (!mounted)
        sh("rm -rf '%s'", work, NULL);
    else
        fprintf(stderr, "could not unmount %s: left in place\n", mnt);
    free(acked_id);
    free(acked_pairs);
    return harness_summary();
}
