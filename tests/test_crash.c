/* test_crash.c -- durability under kill -9: clients stream NDJSON documents
 * into a namespace and record which uploads were acknowledged; the daemon is
 * killed with SIGKILL at random moments (CRASH_ROUNDS times, default 20;
 * the delays drawn from a seed printed at the start, CRASH_SEED sets it),
 * with snapshots running every second, and restarted on the same data
 * directory each time. After every restart: start-up is clean (/ready 200),
 * every acknowledged document is there with all its tokens, and nothing else
 * is: each stored document is one a client sent, with at most its tokens (an
 * upload cut by the kill may leave a prefix; never garbage), and the entry
 * count is the sum of the documents'. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"

#define MAX_DOCS 200000

static char model_dir[512], data_dir[128], bin_dir[128];
static volatile int port, stop, cur_round;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* every document ever sent: id -> expected tokens, acknowledged */
typedef struct {
    char id[32];
    int tokens;
    int acked;
} doc_t;
static doc_t *docs;
static int ndocs;

static int doc_tokens(unsigned h)
{
    return 20 + (int)(h % 300);
}

static unsigned hash(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void *client(void *arg)
{
    int t = (int)(long)arg, k = 0;
    char *body = malloc(1 << 20);
    while (!stop) {
        /* one upload of 1-4 documents */
        int first, n = 1 + (k % 4);
        size_t len = 0;
        pthread_mutex_lock(&lock);
        first = ndocs;
        for (int i = 0; i < n && ndocs < MAX_DOCS; i++) {
            doc_t *d = &docs[ndocs++];
            snprintf(d->id, sizeof d->id, "r%d-t%d-%d", cur_round, t, k * 4 + i);
            d->tokens = doc_tokens(hash(d->id)) + 1;   /* + eos */
            d->acked = 0;
        }
        int last = ndocs;
        pthread_mutex_unlock(&lock);
        for (int i = first; i < last; i++) {
            len += (size_t)sprintf(body + len, "{\"id\":\"%s\",\"text\":\"", docs[i].id);
            unsigned h = hash(docs[i].id);
            for (int j = 0; j < docs[i].tokens - 1; j++) {
                h = h * 1103515245u + 12345u;
                len += (size_t)sprintf(body + len, "%sw%u", j ? " " : "", (h >> 16) % 48);
            }
            len += (size_t)sprintf(body + len, "\"}\n");
        }
        k++;
        http_resp r;
        int p = port;
        if (p > 0 && http_call(p, "POST", "/v1/namespaces/crash/documents", "application/x-ndjson", body, len, &r) == 0 &&
            r.status == 200) {
            pthread_mutex_lock(&lock);
            for (int i = first; i < last; i++)
                docs[i].acked = 1;
            pthread_mutex_unlock(&lock);
        }
        http_resp_free(&r);
    }
    free(body);
    return NULL;
}

static int find_doc(const char *id)
{
    for (int i = ndocs - 1; i >= 0; i--)
        if (strcmp(docs[i].id, id) == 0)
            return i;
    return -1;
}

/* Checks the namespace against what the clients sent; returns acked docs. */
static int verify(nc_daemon *d, int round)
{
    http_resp r;
    if (http_call(d->port, "GET", "/v1/namespaces/crash/documents", NULL, NULL, 0, &r) != 0) {
        CHECK(0);
        return 0;
    }
    int acked = 0, missing = 0, bad = 0;
    long long sum = 0;
    char *seen = calloc((size_t)ndocs + 1, 1);
    if (r.status == 200) {
        json_t *a = json_object_get(r.json, "documents"), *it;
        size_t i;
        json_array_foreach(a, i, it) {
            const char *id = json_string_value(json_object_get(it, "id"));
            long long tok = json_integer_value(json_object_get(it, "tokens"));
            int k = id ? find_doc(id) : -1;
            sum += tok;
            if (k < 0 || seen[k] || tok > docs[k].tokens || (docs[k].acked && tok != docs[k].tokens)) {
                if (bad++ < 5)
                    fprintf(stderr, "round %d: document '%s' with %lld tokens (sent %d, acked %d, seen %d)\n", round,
                            id ? id : "?", tok, k >= 0 ? docs[k].tokens : -1, k >= 0 ? docs[k].acked : -1,
                            k >= 0 ? seen[k] : -1);
                continue;
            }
            seen[k] = 1;
        }
    } else {
        CHECKF(r.status == 404 && ndocs == 0, "round %d: namespace answers %ld", round, r.status);
    }
    for (int k = 0; k < ndocs; k++)
        if (docs[k].acked) {
            acked++;
            if (!seen[k] && missing++ < 5)
                fprintf(stderr, "round %d: acknowledged document '%s' is missing\n", round, docs[k].id);
        }
    http_resp_free(&r);
    CHECKF(bad == 0, "round %d: %d unexpected documents", round, bad);
    CHECKF(missing == 0, "round %d: %d acknowledged documents missing", round, missing);
    json_t *j = NULL;
    if (http_call(d->port, "GET", "/v1/namespaces/crash", NULL, NULL, 0, &r) == 0 && r.status == 200) {
        j = r.json;
        CHECKF(json_integer_value(json_object_get(j, "entries")) == sum, "round %d: %lld entries, documents hold %lld",
               round, (long long)json_integer_value(json_object_get(j, "entries")), sum);
    }
    http_resp_free(&r);
    free(seen);
    return acked;
}

static int start(nc_daemon *d)
{
    const char *args[] = {"--model", model_dir, "--data-dir", data_dir, "--snapshot-period", "1",
                          "--fsync", "group", "--log-format", "text", NULL};
    return daemon_start(d, args);
}

TEST(kill_9_while_streaming)
{
    const char *env = getenv("CRASH_ROUNDS");
    int rounds = env ? atoi(env) : 20, warnings = 0, snapshots = 0, kills = 0;
    /* new delays each run; CRASH_SEED draws a run's again (the moments
     * they land on still move with the machine) */
    const char *seed_env = getenv("CRASH_SEED");
    unsigned seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    fprintf(stderr, "    seed %u (CRASH_SEED=%u draws these delays again), %d rounds\n", seed, seed, rounds);
    srand(seed);
    nc_daemon d;
    int acked = 0;
    for (int round = 0; round <= rounds; round++) {
        int rc = start(&d);
        CHECKF(rc == 0, "round %d: start-up failed", round);
        if (rc != 0)
            break;
        /* the log of a restart after kill -9 may carry a torn-tail warning;
         * anything at error level is a failed start */
        char cmd[512];
        snprintf(cmd, sizeof cmd, "grep -c ' error ' '%s' > /dev/null", d.log);
        CHECKF(system(cmd) != 0, "round %d: errors in the start-up log", round);
        snprintf(cmd, sizeof cmd, "grep -q 'torn final record' '%s'", d.log);
        warnings += system(cmd) == 0;
        acked = verify(&d, round);
        if (round == rounds)
            break;
        port = d.port;
        stop = 0;
        cur_round = round;
        pthread_t th[2];
        for (long t = 0; t < 2; t++)
            pthread_create(&th[t], NULL, client, (void *)t);
        usleep(200000 + (useconds_t)(rand() % 1600000));   /* some rounds outlive a snapshot period */
        daemon_kill(&d);   /* uploads in flight are cut */
        kills++;
        stop = 1;
        port = 0;
        for (int t = 0; t < 2; t++)
            pthread_join(th[t], NULL);
        snprintf(cmd, sizeof cmd, "grep -q ' snapshot ' '%s'", d.log);
        snapshots += system(cmd) == 0;
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d.dir);
        if (system(cmd) != 0) { /* best effort */ }
    }
    fprintf(stderr, "    %d documents sent, %d acknowledged and verified after %d kills; %d torn-tail warnings; "
            "%d rounds killed after a snapshot\n", ndocs, acked, kills, warnings, snapshots);
    CHECK(acked > rounds);   /* the clients did get work through between kills */
    if (d.pid > 0)   /* a failed start-up is reported once, above */
        CHECK(daemon_stop(&d) == 0);
}

static int copy_file(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0755), rc = -1;
    char buf[65536];
    ssize_t n;
    if (in >= 0 && out >= 0) {
        while ((n = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, (size_t)n) != n)
                break;
        rc = n == 0 ? 0 : -1;
    }
    if (in >= 0)
        close(in);
    if (out >= 0 && close(out) != 0)
        rc = -1;
    return rc;
}

/* The daemon runs from a private copy of bin/neurocached, so that the 21
 * starts run one and the same binary. In a shared build tree another make
 * relinks bin/neurocached while this test runs: an exec during the link
 * failed ("exec .../neurocached: Permission denied": the linker writes the
 * file without its x bits until it is done) and so did that round's
 * start-up, no fault of the daemon; a link finished between rounds would
 * also mix two daemons in one run. Only a finished binary is copied: one
 * that is executable and the same file (inode, size, mtime) before and after
 * the copy; while a link is under way, the copy waits for it. */
static int private_daemon(void)
{
    char src[1100], dst[300];
    snprintf(src, sizeof src, "%s", daemon_bin_path("neurocached"));
    snprintf(dst, sizeof dst, "%s/neurocached", bin_dir);
    for (int attempt = 0; attempt < 120; attempt++) {
        struct stat a, b;
        if (stat(src, &a) == 0 && (a.st_mode & S_IXUSR) && copy_file(src, dst) == 0 && stat(src, &b) == 0 &&
            a.st_ino == b.st_ino && a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
            a.st_mtim.tv_nsec == b.st_mtim.tv_nsec)
            return setenv("NEUROCACHE_BIN", bin_dir, 1);
        usleep(500000);
    }
    fprintf(stderr, "%s: no finished binary to copy\n", src);
    return -1;
}

int main(void)
{
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    snprintf(data_dir, sizeof data_dir, "/tmp/nc-test-crash-XXXXXX");
    snprintf(bin_dir, sizeof bin_dir, "/tmp/nc-test-crash-bin-XXXXXX");
    if (!mkdtemp(data_dir) || !mkdtemp(bin_dir) || private_daemon() != 0)
        return 1;
    docs = calloc(MAX_DOCS, sizeof *docs);
    httpc_init();
    RUN(kill_9_while_streaming);
    httpc_cleanup();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", data_dir, bin_dir);
    if (system(cmd) != 0) { /* best effort */ }
    free(docs);
    return harness_summary();
}
