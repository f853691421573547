/* test_replication.c -- namespaces replicated through a real redis-server
 * (Debian's package) between two neurocached replicas: a document streamed
 * through A reaches B's unbounded cache within a bounded lag (printed), the
 * same predict request answers the same distribution on both (1e-4), adds
 * made on B reach A, a restarted replica catches up from its last applied
 * entry (no duplicate), entries of another model are refused. Skipped, with
 * a message, when redis-server is not installed (`make deps-test` installs it). */
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"

static char model_dir[512], work[256], redis_addr[64], redis_bin[256];
static char other_training_dir[600];   /* the same model, another unbounded.faiss */
static int redis_port;
static pid_t redis_pid;

/* Starts redis-server on a free port, or again on the same one after
 * stop_redis (empty: no persistence, as after losing its data). */
static int start_redis(void)
{
    const char *c[] = {"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server", NULL};
    for (int i = 0; c[i]; i++)
        if (access(c[i], X_OK) == 0) snprintf(redis_bin, sizeof redis_bin, "%s", c[i]);
    if (!redis_bin[0]) return 1;
    if (!redis_port) redis_port = free_loopback_port();
    snprintf(redis_addr, sizeof redis_addr, "127.0.0.1:%d", redis_port);
    char port[16], log[400];
    snprintf(port, sizeof port, "%d", redis_port);
    snprintf(log, sizeof log, "%s/redis.log", work);
    redis_pid = fork();
    if (redis_pid == 0) {
        if (!freopen(log, "w", stdout)) _exit(127);
        dup2(1, 2);   /* not the runner's pipe: an orphan would hold it open */
        execl(redis_bin, "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--dir", work, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)redis_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) return 0;
        sleep_ms(25);
    }
    return -1;
}

static void stop_redis(void)
{
    if (redis_pid > 0) {
        kill(redis_pid, SIGTERM);
        waitpid(redis_pid, NULL, 0);
    }
    redis_pid = 0;
}

/* Replica tag with its own persistent data dir (kept across restarts). */
static int start(nc_daemon *d, const char *tag, const char *model)
{
    static char dirs[4][400];
    int k = tag[0] - 'a';
    snprintf(dirs[k], sizeof dirs[k], "%s/data-%s", work, tag);
    const char *args[] = {"--model", model, "--replica-tag", tag, "--redis", redis_addr,
                          "--data-dir", dirs[k], "--snapshot-period", "0", NULL};
    return daemon_start(d, args);
}

static long ns_entries(int port, const char *ns)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    http_resp r;
    long n = -1;
    if (http_call(port, "GET", path, NULL, NULL, 0, &r) == 0 && r.status == 200 && r.json)
        n = (long)json_integer_value(json_object_get(r.json, "entries"));
    http_resp_free(&r);
    return n;
}

static long upload(int port, const char *ns, const char *text)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/namespaces/%s/documents", ns);
    http_resp r;
    long st = http_call(port, "POST", path, "text/plain", text, strlen(text), &r) == 0 ? r.status : -1;
    if (st != 200 && st != 201) fprintf(stderr, "upload: %ld %s\n", st, r.body ? r.body : "");
    http_resp_free(&r);
    return st;
}

/* Waits until replica port holds want entries in ns; seconds waited, or -1. */
static double wait_entries(int port, const char *ns, long want, double timeout)
{
    double t0 = now_s();
    while (now_s() - t0 < timeout) {
        if (ns_entries(port, ns) == want) return now_s() - t0;
        sleep_ms(5);
    }
    fprintf(stderr, "replica on %d: %ld entries in %s, expected %ld\n", port, ns_entries(port, ns), ns, want);
    return -1;
}

static nc_daemon A, B;

/* Whether replica B comes to hold as many entries of ns as A does (10 s). */
static int b_has_a(const char *ns)
{
    return wait_entries(B.port, ns, ns_entries(A.port, ns), 10) >= 0;
}

/* DELETE /v1/namespaces/ns (confirmed) on port; 1 when answered 200. */
static int del_ns(int port, const char *ns)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/namespaces/%s?confirm=%s", ns, ns);
    http_resp r;
    long st = http_call(port, "DELETE", path, NULL, NULL, 0, &r) == 0 ? r.status : -1;
    http_resp_free(&r);
    return st == 200;
}

static const char *SESSION =
    "{\"namespace\":\"news\",\"cache\":{\"unbounded\":true,\"exact\":true,\"knn\":16,"
    "\"unbounded_lambda\":0.4,\"open_vocab\":true}}";

/* Full distribution of a fresh session in ns after feeding text (no adapt). */
static double *dist_after(int port, const char *text, size_t *n)
{
    http_resp r;
    *n = 0;
    double *p = NULL;
    char id[80] = "", path[200];
    if (http_json(port, "POST", "/v1/sessions", SESSION, &r) == 0 && r.status == 201 && r.json)
        snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    else fprintf(stderr, "session: %ld %s\n", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    if (!id[0]) return NULL;
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    json_t *b = json_pack("{s:s}", "text", text);
    http_post_json(port, path, b, &r);
    json_decref(b);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    if (http_json(port, "POST", path, "{\"full\":true}", &r) == 0 && r.status == 200 && r.json) {
        *n = (size_t)json_integer_value(json_object_get(r.json, "vocab_size"));
        p = calloc(*n + 1, sizeof *p);
        size_t i;
        json_t *it;
        json_array_foreach(json_object_get(r.json, "predictions"), i, it) {
            json_int_t w = json_integer_value(json_object_get(it, "id"));
            const char *word = json_string_value(json_object_get(it, "word"));
            (void)word;
            if (w >= 0 && (size_t)w < *n) p[w] = json_real_value(json_object_get(it, "prob"));
        }
    }
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    http_call(port, "DELETE", path, NULL, NULL, 0, &r);
    http_resp_free(&r);
    return p;
}

static double max_diff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(a[i] - b[i]) > m) m = fabs(a[i] - b[i]);
    return m;
}

static const char *DOC1 =
    "the zorblax sat on the mat . the zorblax ate the cat .\n"
    "a dog saw the zorblax and the zorblax ran .\n";
static const char *DOC2 =
    "the quibble and the zorblax sat on the dog . the quibble ran .\n";
static const char *PROBE = "the";

TEST(document_reaches_other_replica)
{
    CHECK(upload(A.port, "news", DOC1) == 200);
    long na = ns_entries(A.port, "news");
    CHECK(na > 10);
    double lag = wait_entries(B.port, "news", na, 10);
    CHECK(lag >= 0);
    fprintf(stderr, "  (document of %ld tokens visible on the other replica after %.1f ms)\n", na, lag * 1e3);
    /* Same request, same answer: the pairs are bit-identical (float16). */
    size_t n1 = 0, n2 = 0;
    double *pa = dist_after(A.port, PROBE, &n1), *pb = dist_after(B.port, PROBE, &n2);
    CHECK(pa && pb && n1 == n2 && n1 > 0);
    if (pa && pb && n1 == n2) {
        CHECK_NEAR(max_diff(pa, pb, n1), 0.0, 1e-4);
        /* And the cache matters: "zorblax" (open vocabulary) has mass. */
        double mass = 0;
        for (size_t i = 50; i < n1; i++) mass += pa[i];
        CHECK(mass > 1e-3);
    }
    free(pa);
    free(pb);
}

TEST(adds_on_b_reach_a)
{
    long nb = ns_entries(B.port, "news");
    CHECK(upload(B.port, "news", "the mat saw a dog .\n") == 200);
    long nb2 = ns_entries(B.port, "news");
    CHECK(nb2 > nb);
    CHECK(wait_entries(A.port, "news", nb2, 10) >= 0);
    /* A namespace created on B only. */
    CHECK(upload(B.port, "sports", "the dog ran on the mat .\n") == 200);
    CHECK(wait_entries(A.port, "sports", ns_entries(B.port, "sports"), 10) >= 0);
}

TEST(restarted_replica_catches_up)
{
    CHECK(daemon_stop(&B) == 0);
    CHECK(upload(A.port, "news", DOC2) == 200);
    CHECK(upload(A.port, "sports", "a cat sat .\n") == 200);
    long na = ns_entries(A.port, "news"), sa = ns_entries(A.port, "sports");
    double t0 = now_s();
    CHECK(start(&B, "b", model_dir) == 0);
    CHECK(wait_entries(B.port, "news", na, 10) >= 0);
    CHECK(wait_entries(B.port, "sports", sa, 10) >= 0);
    fprintf(stderr, "  (restarted replica caught up %.1f ms after start)\n", (now_s() - t0) * 1e3);
    /* No duplicate applied after a while. */
    sleep_ms(700);
    CHECK(ns_entries(B.port, "news") == na);
    size_t n1 = 0, n2 = 0;
    double *pa = dist_after(A.port, "the quibble", &n1), *pb = dist_after(B.port, "the quibble", &n2);
    CHECK(pa && pb && n1 == n2);
    if (pa && pb && n1 == n2)
        CHECK_NEAR(max_diff(pa, pb, n1), 0.0, 1e-4);
    free(pa);
    free(pb);
}

/* SIGKILL the moment the pairs are visible (before or after their fsync,
 * whichever comes first): after the restart the replica has every pair
 * exactly once -- its position lives in the namespace's own log. */
TEST(killed_right_after_apply)
{
    for (int round = 0; round < 3; round++) {
        long before = ns_entries(B.port, "news");
        char doc[200];
        snprintf(doc, sizeof doc, "round %d the zorblax and the quibble sat on the mat .\n", round);
        CHECK(upload(A.port, "news", doc) == 200);
        long na = ns_entries(A.port, "news");
        double t0 = now_s();
        while (ns_entries(B.port, "news") == before && now_s() - t0 < 10) {}
        kill(B.pid, SIGKILL);
        waitpid(B.pid, NULL, 0);
        B.pid = 0;
        char cmd[400];   /* its scratch dir (the data dir is ours, kept) */
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", B.dir);
        if (strncmp(B.dir, "/tmp/nc-test-", 13) == 0 && system(cmd)) {}
        CHECK(start(&B, "b", model_dir) == 0);
        CHECK(wait_entries(B.port, "news", na, 10) >= 0);
        sleep_ms(300);
        CHECKF(ns_entries(B.port, "news") == na, "round %d: %ld entries, %ld expected", round,
               ns_entries(B.port, "news"), na);
    }
}

static long ns_status(int port, const char *ns)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    http_resp r;
    long st = http_call(port, "GET", path, NULL, NULL, 0, &r) == 0 ? r.status : -1;
    http_resp_free(&r);
    return st;
}

/* Deleting a namespace on one replica deletes it everywhere, for good: a
 * restart does not bring it back, and a namespace created later under the
 * name holds only what was streamed into it since. */
TEST(delete_replicated)
{
    CHECK(ns_status(B.port, "sports") == 200);
    CHECK(del_ns(A.port, "sports"));
    CHECK(ns_status(A.port, "sports") == 404);
    double t0 = now_s();
    while (ns_status(B.port, "sports") != 404 && now_s() - t0 < 10) sleep_ms(5);
    CHECK(ns_status(B.port, "sports") == 404);
    CHECK(daemon_stop(&B) == 0);
    CHECK(start(&B, "b", model_dir) == 0);
    sleep_ms(800);
    CHECK(ns_status(B.port, "sports") == 404);
    CHECK(ns_status(A.port, "sports") == 404);
    /* Created again on B: A gets exactly the new pairs. */
    CHECK(upload(B.port, "sports", "a dog ran .\n") == 200);
    long nb = ns_entries(B.port, "sports");
    CHECK(nb > 0 && nb < 10);
    CHECK(wait_entries(A.port, "sports", nb, 10) >= 0);
    sleep_ms(300);
    CHECK(ns_entries(A.port, "sports") == nb);
}

TEST(other_model_refused)
{
    /* A replica of another model (same shape, other weights) on the same
     * streams applies nothing and says so. */
    nc_daemon C;
    char other[600];
    snprintf(other, sizeof other, "%s/lstm-2layer-f16", harness_fixtures());
    if (start(&C, "c", other)) { CHECK(0); return; }
    /* until it has read the streams and refused something (1.5 s was not
     * always enough under TSan on a loaded machine), at most 30 s */
    http_resp r = {0};
    for (double t0 = now_s();; sleep_ms(100)) {
        http_resp_free(&r);
        if (http_call(C.port, "GET", "/v1/replication", NULL, NULL, 0, &r) != 0 || !r.json ||
            json_integer_value(json_object_get(r.json, "refused_entries")) > 0 || now_s() - t0 > 30)
            break;
    }
    CHECK(r.json != NULL);
    if (r.json) {
        if (json_integer_value(json_object_get(r.json, "applied_tokens")) != 0) fprintf(stderr, "%s\n", r.body);
        CHECK(json_integer_value(json_object_get(r.json, "applied_tokens")) == 0);
        CHECK(json_integer_value(json_object_get(r.json, "refused_entries")) > 0);
    }
    http_resp_free(&r);
    CHECK(daemon_stop(&C) == 0);
}

/* Documents named "repl:..." are the entries applied from other replicas
 * (the publisher passes them over): uploads cannot use such ids. */
TEST(reserved_document_ids)
{
    long before = ns_entries(A.port, "news");
    http_resp r;
    const char *doc = "the cat sat .\n";
    CHECK(http_call(A.port, "POST", "/v1/namespaces/news/documents?id=repl:x", "text/plain", doc, strlen(doc), &r) == 0);
    CHECK(r.status == 400 && !strcmp(http_error_code(&r), "out_of_range"));
    CHECK(r.body && strstr(r.body, "reserved for replication"));
    http_resp_free(&r);
    CHECK(ns_entries(A.port, "news") == before);
}

static json_int_t repl_counter(int port, const char *name)
{
    http_resp r;
    json_int_t v = -1;
    if (http_call(port, "GET", "/v1/replication", NULL, NULL, 0, &r) == 0 && r.status == 200 && r.json)
        v = json_integer_value(json_object_get(r.json, name));
    http_resp_free(&r);
    return v;
}

/* Same distribution on both replicas for the same request (1e-4). */
static void check_same_dist(const char *probe)
{
    size_t n1 = 0, n2 = 0;
    double *pa = dist_after(A.port, probe, &n1), *pb = dist_after(B.port, probe, &n2);
    CHECK(pa && pb && n1 == n2 && n1 > 0);
    if (pa && pb && n1 == n2)
        CHECK_NEAR(max_diff(pa, pb, n1), 0.0, 1e-4);
    free(pa);
    free(pb);
}

/* A namespace deleted on A while B is down: B drops its copy when it comes
 * back (the tombstone in Redis), and of a namespace created again under the
 * name meanwhile it holds only the new incarnation's pairs. */
TEST(delete_while_replica_down)
{
    CHECK(upload(A.port, "weather", "the cat sat on the mat . the dog ran .\n") == 200);
    CHECK(upload(A.port, "tmp", "a dog saw the cat .\n") == 200);
    CHECK(b_has_a("weather"));
    CHECK(b_has_a("tmp"));
    CHECK(daemon_stop(&B) == 0);
    CHECK(del_ns(A.port, "weather"));
    CHECK(del_ns(A.port, "tmp"));
    CHECK(upload(A.port, "weather", "the zorblax ran .\n") == 200);
    long na = ns_entries(A.port, "weather");
    CHECK(na > 0 && na < 8);
    CHECK(start(&B, "b", model_dir) == 0);
    CHECK(wait_entries(B.port, "weather", na, 10) >= 0);
    double t0 = now_s();
    while (ns_status(B.port, "tmp") != 404 && now_s() - t0 < 10) sleep_ms(10);
    CHECK(ns_status(B.port, "tmp") == 404);
    sleep_ms(500);
    CHECKF(ns_entries(B.port, "weather") == na, "%ld entries on b, %ld on a", ns_entries(B.port, "weather"), na);
    CHECK(ns_status(A.port, "tmp") == 404);
    check_same_dist("the zorblax");
}

/* Durability of publishing: documents A acknowledged while Redis was down
 * -- across a clean restart of A (whose snapshots would prune the log) and
 * a SIGKILL -- reach B once Redis is back, exactly once; so does a deletion
 * made meanwhile. */
TEST(unpublished_survive_crash)
{
    long nb0 = ns_entries(B.port, "news");
    CHECK(nb0 > 0 && ns_entries(A.port, "news") == nb0);
    stop_redis();
    CHECK(upload(A.port, "news", "outage one the quibble sat on the zorblax .\n") == 200);
    /* a deletion made meanwhile waits on A's disk for Redis too */
    CHECK(ns_status(B.port, "weather") == 200);
    CHECK(del_ns(A.port, "weather"));
    /* Two clean restarts: two snapshots, the second would prune the
     * segments the first covers. */
    CHECK(daemon_stop(&A) == 0);
    CHECK(start(&A, "a", model_dir) == 0);
    CHECK(upload(A.port, "news", "outage two a dog and the quibble ran .\n") == 200);
    CHECK(daemon_stop(&A) == 0);
    CHECK(start(&A, "a", model_dir) == 0);
    CHECK(upload(A.port, "news", "outage three the cat saw the quibble .\n") == 200);
    long na = ns_entries(A.port, "news");
    CHECK(na > nb0);
    CHECK(repl_counter(A.port, "unpublished_records") > 0);
    CHECK(repl_counter(A.port, "pending_deletions") == 1);
    daemon_kill(&A);   /* the data dir kept */
    CHECK(ns_entries(B.port, "news") == nb0);
    CHECK(start_redis() == 0);
    CHECK(start(&A, "a", model_dir) == 0);
    CHECK(ns_entries(A.port, "news") == na);
    double lag = wait_entries(B.port, "news", na, 20);
    CHECK(lag >= 0);
    fprintf(stderr, "  (%ld pairs acknowledged during the outage reached the other replica %.1f ms after the restart)\n",
            na - nb0, lag * 1e3);
    sleep_ms(700);
    CHECKF(ns_entries(B.port, "news") == na, "%ld entries on b, %ld on a", ns_entries(B.port, "news"), na);
    check_same_dist("the quibble");
    double t0 = now_s();
    while (repl_counter(A.port, "unpublished_records") != 0 && now_s() - t0 < 5) sleep_ms(20);
    CHECK(repl_counter(A.port, "unpublished_records") == 0);
    CHECK(repl_counter(A.port, "pending_deletions") == 0);
    while (ns_status(B.port, "weather") != 404 && now_s() - t0 < 10) sleep_ms(20);
    CHECK(ns_status(B.port, "weather") == 404 && ns_status(A.port, "weather") == 404);
}

/* A crash between XADD and the marker publishes entries again (the test
 * hook keeps the marker from advancing: the whole run is republished at
 * the next start); the other replica skips them. */
TEST(republished_entries_skipped)
{
    CHECK(daemon_stop(&A) == 0);
    setenv("NEUROCACHE_TEST_REPLICATION_NO_MARKER", "1", 1);
    int up = start(&A, "a", model_dir) == 0;
    unsetenv("NEUROCACHE_TEST_REPLICATION_NO_MARKER");
    CHECK(up);
    if (!up) return;
    CHECK(upload(A.port, "news", "again the zorblax and the dog sat .\n") == 200);
    CHECK(upload(A.port, "news", "again a cat ran on the mat .\n") == 200);
    long na = ns_entries(A.port, "news");
    CHECK(wait_entries(B.port, "news", na, 10) >= 0);
    json_int_t dup0 = repl_counter(B.port, "duplicate_entries");
    daemon_kill(&A);   /* the data dir kept */
    CHECK(start(&A, "a", model_dir) == 0);
    double t0 = now_s();
    while (repl_counter(B.port, "duplicate_entries") < dup0 + 2 && now_s() - t0 < 10) sleep_ms(20);
    CHECKF(repl_counter(B.port, "duplicate_entries") >= dup0 + 2, "duplicates skipped: %lld, before %lld",
           (long long)repl_counter(B.port, "duplicate_entries"), (long long)dup0);
    sleep_ms(300);
    CHECKF(ns_entries(B.port, "news") == na, "%ld entries on b, %ld on a", ns_entries(B.port, "news"), na);
    check_same_dist("again the");
}


/* Waits until the replica on port has published everything (log records
 * and deletions); 1 when it has. */
static int wait_published(int port, double timeout)
{
    double t0 = now_s();
    while (now_s() - t0 < timeout) {
        if (repl_counter(port, "unpublished_records") == 0 && repl_counter(port, "pending_deletions") == 0)
            return 1;
        sleep_ms(20);
    }
    return 0;
}

/* A namespace deleted (here, or on another replica) and created again is
 * announced again: the deletion took it out of the namespace set, from
 * which a replica started later learns which streams to read. Run before
 * Redis restarts: a publisher finding its connection closed announces
 * everything again, which would hide the bug. */
TEST(recreated_namespace_announced)
{
    CHECK(upload(A.port, "cycle", "the cat sat .\n") == 200);
    CHECK(b_has_a("cycle"));
    CHECK(del_ns(A.port, "cycle"));
    CHECK(wait_published(A.port, 10));
    CHECK(upload(A.port, "cycle", "a dog ran on the mat .\n") == 200);
    long nc = ns_entries(A.port, "cycle");
    CHECK(wait_entries(B.port, "cycle", nc, 10) >= 0);
    /* deleted on B this time */
    CHECK(upload(A.port, "relay", "the dog sat .\n") == 200);
    CHECK(b_has_a("relay"));
    CHECK(del_ns(B.port, "relay"));
    double t0 = now_s();
    while (ns_status(A.port, "relay") != 404 && now_s() - t0 < 10) sleep_ms(10);
    CHECK(ns_status(A.port, "relay") == 404);
    CHECK(upload(A.port, "relay", "the zorblax ran on the mat .\n") == 200);
    long nr = ns_entries(A.port, "relay");
    CHECK(wait_entries(B.port, "relay", nr, 10) >= 0);
    CHECK(wait_published(A.port, 10) && wait_published(B.port, 10));
    nc_daemon D;   /* a new replica: it learns the names from Redis */
    if (start(&D, "d", model_dir)) { CHECK(0); return; }
    CHECK(wait_entries(D.port, "cycle", nc, 10) >= 0);
    CHECK(wait_entries(D.port, "relay", nr, 10) >= 0);
    CHECK(daemon_stop(&D) == 0);
}

/* Entries of namespace ns in Redis (its stream's length), -1 on error. */
static long long stream_len(const char *ns)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    long long n = -1;
    redisReply *r = c && !c->err ? redisCommand(c, "XLEN neurocache:ns:%s", ns) : NULL;
    if (r && r->type == REDIS_REPLY_INTEGER) n = r->integer;
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    return n;
}

/* Namespaces deleted and created again while a batch is in flight (the
 * test hook holds the publisher after the XADDs of a batch): the store
 * whose batch was held is published from its own first record, and one
 * published after it in the same pass waits for its tombstone, whose DEL
 * of the stream would otherwise take the new entries away. Each of pa and
 * pb holds the publisher once, so one is published after the other's
 * batch whatever their order. B is down meanwhile: it must find
 * everything in Redis. */
TEST(recreated_while_publishing)
{
    CHECK(upload(A.port, "pa", "the cat sat on the mat . the dog ran .\n") == 200);
    CHECK(upload(A.port, "pb", "the dog sat on the mat .\n") == 200);
    CHECK(b_has_a("pa"));
    CHECK(b_has_a("pb"));
    CHECK(daemon_stop(&B) == 0);
    CHECK(daemon_stop(&A) == 0);
    setenv("NEUROCACHE_TEST_REPLICATION_PUBLISH_DELAY_MS", "800", 1);
    int up = start(&A, "a", model_dir) == 0;
    unsetenv("NEUROCACHE_TEST_REPLICATION_PUBLISH_DELAY_MS");
    CHECK(up);
    if (!up) return;
    for (int round = 0; round < 2; round++) {
        CHECK(upload(A.port, round ? "pb" : "pa", "a cat and a dog sat on the mat . the cat ran .\n") == 200);
        sleep_ms(150);   /* the publisher holds that batch */
        CHECK(del_ns(A.port, "pa") && del_ns(A.port, "pb"));
        CHECK(upload(A.port, "pa", "the zorblax .\n") == 200);
        CHECK(upload(A.port, "pb", "the quibble .\n") == 200);
        CHECK(wait_published(A.port, 15));
        CHECKF(stream_len("pa") > 0 && stream_len("pb") > 0, "round %d: %lld entries of pa, %lld of pb in Redis",
               round, stream_len("pa"), stream_len("pb"));
    }
    long na = ns_entries(A.port, "pa"), nb = ns_entries(A.port, "pb");
    CHECK(na > 0 && nb > 0);
    CHECK(start(&B, "b", model_dir) == 0);
    CHECK(wait_entries(B.port, "pa", na, 10) >= 0);
    CHECK(wait_entries(B.port, "pb", nb, 10) >= 0);
    CHECK(daemon_stop(&A) == 0);
    CHECK(start(&A, "a", model_dir) == 0);
}

/* An entry whose pair count times the key size wraps around 2^64 to its
 * keys' length (n = 2^62 + 1: n * H * 2 = 2H) is refused, not applied into
 * buffers sized by the wrapped products (a heap overflow). */
TEST(oversized_pair_count_refused)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    CHECK(c && !c->err);
    if (!c || c->err) { if (c) redisFree(c); return; }
    char fp[32] = "";
    redisReply *r = redisCommand(c, "XREVRANGE neurocache:ns:news + - COUNT 1");
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 1) {
        redisReply *kv = r->element[0]->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2)
            if (!strcmp(kv->element[i]->str, "m")) snprintf(fp, sizeof fp, "%s", kv->element[i + 1]->str);
    }
    if (r) freeReplyObject(r);
    CHECK(fp[0]);
    const int H = 16;   /* lstm-2layer */
    size_t nwords = (size_t)4 << 20;
    char *words = malloc(2 * nwords), keys[2 * 16];
    for (size_t i = 0; i < nwords; i++) memcpy(words + 2 * i, "a\n", 2);
    memset(keys, 0x3c, sizeof keys);
    json_int_t refused_a = repl_counter(A.port, "refused_entries");
    json_int_t refused_b = repl_counter(B.port, "refused_entries");
    long na = ns_entries(A.port, "news");
    const char *argv[] = {"XADD", "neurocache:ns:news", "*", "o", "z", "b", "1", "s", "1", "d", "x", "f", "0",
                          "n", "4611686018427387905", "m", fp, "w", words, "k", keys};
    size_t argl[21];
    for (int i = 0; i < 21; i++)   /* words and keys are binary, not strings */
        argl[i] = i == 18 ? 2 * nwords : i == 20 ? (size_t)H * 2 : strlen(argv[i]);
    r = redisCommandArgv(c, 21, argv, argl);
    CHECK(r && r->type == REDIS_REPLY_STRING);
    if (r) freeReplyObject(r);
    redisFree(c);
    free(words);
    double t0 = now_s();
    while ((repl_counter(A.port, "refused_entries") <= refused_a ||
            repl_counter(B.port, "refused_entries") <= refused_b) && now_s() - t0 < 5)
        sleep_ms(20);
    CHECK(repl_counter(A.port, "refused_entries") > refused_a);
    CHECK(repl_counter(B.port, "refused_entries") > refused_b);
    CHECK(ns_entries(A.port, "news") == na && ns_entries(B.port, "news") == na);
}

/* ---- compact storage (issue 26 point 3) ---------------------------------- */

static const char *COMPACT_SESSION =
    "{\"namespace\":\"cpt\",\"cache\":{\"unbounded\":true,\"knn\":16,\"nprobe\":4,\"unbounded_lambda\":0.5}}";

/* The full distribution (as JSON text) of a fresh session reading cpt
 * after "w3 w4 w5" */
static char *compact_dist(int port)
{
    http_resp r;
    char id[80] = "", path[200];
    char *out = NULL;
    if (http_json(port, "POST", "/v1/sessions", COMPACT_SESSION, &r) == 0 && r.status == 201 && r.json)
        snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    if (!id[0]) return NULL;
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    http_json(port, "POST", path, "{\"text\":\"w3 w4 w5\"}", &r);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    if (http_json(port, "POST", path, "{\"full\":true}", &r) == 0 && r.status == 200 && r.json)
        out = json_dumps(json_object_get(r.json, "predictions"), JSON_COMPACT);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    http_call(port, "DELETE", path, NULL, NULL, 0, &r);
    http_resp_free(&r);
    return out;
}

static json_t *ns_get(int port, const char *ns)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    http_resp r;
    json_t *j = NULL;
    if (http_call(port, "GET", path, NULL, NULL, 0, &r) == 0 && r.status == 200)
        j = json_incref(r.json);
    http_resp_free(&r);
    return j;
}

/* A compact namespace made on A reaches B as a compact namespace of the
 * same training, holding the same codes: the same distribution, bit for
 * bit; B's adds reach A alike. */
TEST(compact_namespace_replicated)
{
    http_resp r;
    CHECK(http_json(A.port, "PUT", "/v1/namespaces/cpt", "{\"storage\":\"compact\"}", &r) == 0 && r.status == 201);
    http_resp_free(&r);
    CHECK(upload(A.port, "cpt", "w3 w4 w5 w9 w3 w4 w5 w9 w1 w2 w3 w4 w5 w9 w7\n") == 200);
    CHECK(b_has_a("cpt"));
    json_t *a = ns_get(A.port, "cpt"), *b = ns_get(B.port, "cpt");
    CHECK(a && b);
    if (a && b) {
        CHECK(!strcmp(json_string_value(json_object_get(b, "storage")), "compact"));
        const char *fa = json_string_value(json_object_get(json_object_get(a, "index"), "fingerprint")),
                   *fb = json_string_value(json_object_get(json_object_get(b, "index"), "fingerprint"));
        CHECK(fa && fb && !strcmp(fa, fb));
    }
    json_decref(a);
    json_decref(b);
    char *da = compact_dist(A.port), *db = compact_dist(B.port);
    CHECK(da && db && !strcmp(da, db));
    free(da);
    free(db);
    CHECK(upload(B.port, "cpt", "w9 w8 w7 w3 w4 w5 w11\n") == 200);
    CHECK(wait_entries(A.port, "cpt", ns_entries(B.port, "cpt"), 10) >= 0);
    da = compact_dist(A.port);
    db = compact_dist(B.port);
    CHECK(da && db && !strcmp(da, db));
    free(da);
    free(db);
}

/* A replica whose unbounded.faiss is another training cannot read the
 * codes: it refuses them, saying why, and holds none. */
TEST(compact_other_training_refused)
{
    nc_daemon D;
    if (start(&D, "d", other_training_dir)) { CHECK(0); return; }
    double t0 = now_s();
    while (repl_counter(D.port, "refused_entries") < 2 && now_s() - t0 < 10)
        sleep_ms(50);
    CHECK(repl_counter(D.port, "refused_entries") >= 2);
    CHECK(ns_entries(D.port, "cpt") == 0);   /* made compact with its own training, nothing applied */
    CHECK(ns_entries(D.port, "news") == ns_entries(A.port, "news"));   /* namespaces with keys: as usual */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "grep -q 'replicas of a compact namespace need the same' '%s'", D.log);
    CHECK(system(cmd) == 0);
    CHECK(daemon_stop(&D) == 0);
}

/* dir: a copy of the lstm-2layer fixture with an unbounded.faiss that
 * build-index trains (IVF16,PQ4np) on a text of the seed */
static int model_with_index(char *dir, size_t len, const char *name, int seed)
{
    snprintf(dir, len, "%s/%s", work, name);
    char cmd[2048], corpus[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/lstm-2layer/* '%s'/", dir, harness_fixtures(), dir);
    if (system(cmd) != 0) return -1;
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    unsigned x = (unsigned)seed;
    for (int i = 0; f && i < 8000; i++) {
        x = x * 1103515245u + 12345u;
        fprintf(f, "w%u%s", (x >> 16) % 48, i % 40 == 39 ? "\n" : " ");
    }
    if (!f || fclose(f) != 0) return -1;
    snprintf(cmd, sizeof cmd, "'%s' build-index --model '%s' --corpus '%s' --factory IVF16,PQ4np --sample 8000 "
             "--seed %d > /dev/null 2>&1", daemon_bin_path("neurocache"), dir, corpus, seed);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    snprintf(work, sizeof work, "/tmp/nc-test-XXXXXX");
    if (!mkdtemp(work)) return 1;
    int rs = start_redis();
    if (rs == 1) {
        printf("SKIP test_replication: redis-server is not installed (`make deps-test` installs Debian's redis-server)\n");
        printf("0 passed, 0 failed\n");
        rmdir(work);
        return 0;
    }
    httpc_init();
    /* the fixture model with a trained unbounded.faiss (compact storage
     * needs one; a namespace with keys stays exact below 65,536 pairs) */
    CHECK(model_with_index(model_dir, sizeof model_dir, "model", 1) == 0);
    CHECK(model_with_index(other_training_dir, sizeof other_training_dir, "model2", 2) == 0);
    CHECK(rs == 0);
    int up = rs == 0 && start(&A, "a", model_dir) == 0;
    if (up && start(&B, "b", model_dir) != 0) {
        daemon_stop(&A);
        up = 0;
    }
    CHECK(up);
    if (up) {
        RUN(document_reaches_other_replica);
        RUN(adds_on_b_reach_a);
        RUN(restarted_replica_catches_up);
        RUN(killed_right_after_apply);
        RUN(delete_replicated);
        RUN(reserved_document_ids);
        RUN(recreated_namespace_announced);
        RUN(delete_while_replica_down);
        RUN(unpublished_survive_crash);
        RUN(republished_entries_skipped);
        RUN(recreated_while_publishing);
        RUN(oversized_pair_count_refused);
        RUN(compact_namespace_replicated);
        RUN(compact_other_training_refused);
        RUN(other_model_refused);
        if (harness_failed) { daemon_dump_log(&A); daemon_dump_log(&B); }
        CHECK(daemon_stop(&B) == 0);
        CHECK(daemon_stop(&A) == 0);
    }
    stop_redis();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd)) {}
    httpc_cleanup();
    return harness_summary();
}
