/* test_replicas.c -- several neurocached replicas behind a real HAProxy
 * (Debian's package, the shipped deploy/haproxy/haproxy.cfg with loopback
 * ports substituted): session affinity, a killed replica (new sessions go to
 * the others, its sessions get session_not_here), a restarted replica taking
 * traffic again, and SIGTERM on a replica under load with no failed request
 * and no lost token. With Debian's redis-server as well, the replicas share
 * their namespaces through it: a document streamed through the balancer
 * reaches every replica's unbounded cache (lag printed), the same predict
 * request answers the same distribution on each (1e-4), and the killed
 * replica, restarted, catches up. Skipped, with a message, when haproxy is
 * not installed; the Redis part when redis-server is not (`make deps-test`
 * installs both). nginx (deploy/nginx) is checked the same way for
 * affinity when installed. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "daemon.h"
#include "harness.h"

#define NREP 3
static const char *TAGS[NREP] = {"a", "b", "c"};
static nc_daemon rep[NREP];
static int rep_port[NREP], lb_port, stats_port;
static char peers[512], model_dir[512], workdir[256], haproxy_bin[256];
static pid_t haproxy_pid, redis_pid, nginx_pid;
static int nginx_port;
static char redis_addr[64];

static int find_haproxy(void)
{
    const char *cands[] = {"/usr/sbin/haproxy", "/usr/local/sbin/haproxy", "/usr/bin/haproxy", NULL};
    for (int i = 0; cands[i]; i++)
        if (access(cands[i], X_OK) == 0) {
            snprintf(haproxy_bin, sizeof haproxy_bin, "%s", cands[i]);
            return 0;
        }
    return -1;
}

static int start_replica(int i)
{
    char port[16], data[400];
    snprintf(port, sizeof port, "%d", rep_port[i]);
    /* Its own data dir, kept across a restart (catch-up from its position). */
    snprintf(data, sizeof data, "%s/data-%s", workdir, TAGS[i]);
    const char *args[] = {"--model", model_dir, "--replica-tag", TAGS[i], "--port", port,
                          "--peers", peers, "--drain-grace", "2", "--threads", "4", "--data-dir", data,
                          redis_pid > 0 ? "--redis" : NULL, redis_addr, NULL};
    return daemon_start(&rep[i], args);
}

static int start_redis(void)
{
    const char *c[] = {"/usr/bin/redis-server", "/usr/local/bin/redis-server", NULL};
    const char *bin = NULL;
    for (int i = 0; c[i]; i++)
        if (access(c[i], X_OK) == 0) bin = c[i];
    if (!bin) return -1;
    int port = free_loopback_port();
    char sport[16], log[400];
    snprintf(sport, sizeof sport, "%d", port);
    snprintf(redis_addr, sizeof redis_addr, "127.0.0.1:%d", port);
    snprintf(log, sizeof log, "%s/redis.log", workdir);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stdout)) _exit(127);
        execl(bin, "redis-server", "--port", sport, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
              "--dir", workdir, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) { redis_pid = pid; return 0; }
        sleep_ms(25);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Status ("UP", "DOWN", ...) of server tag in HAProxy's CSV statistics. */
static int server_status(const char *tag, char *st, size_t cap)
{
    http_resp r;
    st[0] = 0;
    if (http_call(stats_port, "GET", "/stats;csv", NULL, NULL, 0, &r) != 0) {
        http_resp_free(&r);
        return -1;
    }
    char *save = NULL;
    for (char *l = strtok_r(r.body, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        /* pxname,svname,...; status is field 18 */
        char *f[20] = {0};
        int n = 0;
        for (char *p = l; n < 20;) {
            f[n++] = p;
            char *c = strchr(p, ',');
            if (!c) break;
            *c = 0;
            p = c + 1;
        }
        if (n >= 18 && !strcmp(f[0], "neurocached") && !strcmp(f[1], tag)) {
            snprintf(st, cap, "%s", f[17]);
            break;
        }
    }
    http_resp_free(&r);
    return 0;
}

static int wait_status(const char *tag, const char *want, double timeout_s)
{
    double t0 = now_s();
    char st[64];
    while (now_s() - t0 < timeout_s) {
        if (server_status(tag, st, sizeof st) == 0 && strncmp(st, want, strlen(want)) == 0)
            return 0;
        sleep_ms(50);
    }
    fprintf(stderr, "haproxy: server %s is '%s', expected %s\n", tag, st, want);
    return -1;
}

static int start_haproxy(void)
{
    if ((haproxy_pid = cluster_haproxy_start(haproxy_bin, workdir, lb_port, rep_port, stats_port)) < 0) return -1;
    for (int i = 0; i < NREP; i++)
        if (wait_status(TAGS[i], "UP", 20)) return -1;
    return 0;
}

/* One request through the balancer; sid != NULL adds X-Session-Id. */
static int lb_call(const char *method, const char *path, const char *json, const char *sid, http_resp *out)
{
    return cluster_lb_call(lb_port, method, path, NULL, json, sid, out);
}

static long count_on(int i)
{
    http_resp r;
    long n = -1;
    if (http_call(rep_port[i], "GET", "/v1/sessions", NULL, NULL, 0, &r) == 0 && r.json)
        n = (long)json_integer_value(json_object_get(r.json, "count"));
    http_resp_free(&r);
    return n;
}

/* Lines of replica i's log containing s. */
static int log_count(int i, const char *s)
{
    FILE *f = fopen(rep[i].log, "r");
    int n = 0;
    char line[4096];
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, s)) n++;
    if (f) fclose(f);
    return n;
}

static int create_lb(const char *body, const char *sid, char *id, size_t cap)
{
    http_resp r;
    int ok = lb_call("POST", "/v1/sessions", body, sid, &r) == 0 && r.status == 201 && r.json;
    if (ok) snprintf(id, cap, "%s", json_string_value(json_object_get(r.json, "id")));
    else fprintf(stderr, "create via haproxy: %ld %s\n", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return ok ? 0 : -1;
}

static long feed_lb(const char *id, const char *text, long *pos)
{
    char path[1100], body[512];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    snprintf(body, sizeof body, "{\"text\":\"%s\"}", text);
    http_resp r;
    long st = lb_call("POST", path, body, NULL, &r) == 0 ? r.status : -1;
    if (st == 200 && pos) *pos = (long)json_integer_value(json_object_get(r.json, "position"));
    http_resp_free(&r);
    return st;
}

/* ---- tests ----------------------------------------------------------------- */

#define NS 12
static char sids[NS][80];

TEST(affinity)
{
    int pulls0 = 0;
    for (int i = 0; i < NREP; i++) pulls0 += log_count(i, "session pulled");
    /* Server-minted ids: creates spread round-robin, later requests follow
     * the tag. Client-chosen ids: X-Session-Id on the create, the path later. */
    for (int k = 0; k < NS; k++) {
        if (k % 2 == 0) {
            CHECK(create_lb("{}", NULL, sids[k], sizeof sids[k]) == 0);
        } else {
            char body[128], want[64];
            snprintf(want, sizeof want, "client-%d-%d", k, (int)getpid());
            snprintf(body, sizeof body, "{\"id\":\"%s\"}", want);
            CHECK(create_lb(body, want, sids[k], sizeof sids[k]) == 0);
        }
    }
    long before[NREP], total = 0;
    for (int i = 0; i < NREP; i++) total += (before[i] = count_on(i));
    CHECK(total == NS);
    int spread = 0;
    for (int i = 0; i < NREP; i++) spread += before[i] > 0;
    CHECK(spread >= 2);
    for (int round = 0; round < 5; round++)
        for (int k = 0; k < NS; k++)
            CHECK(feed_lb(sids[k], "the cat sat on the mat .", NULL) == 200);
    /* Nothing moved: same counts, no pull in any log. */
    int pulls = -pulls0;
    for (int i = 0; i < NREP; i++) {
        CHECK(count_on(i) == before[i]);
        pulls += log_count(i, "session pulled");
    }
    CHECKF(pulls == 0, "%d sessions were pulled between replicas", pulls);
    for (int k = 0; k < NS; k += 2) {
        int i = sids[k][4] - 'a';
        CHECK(i >= 0 && i < NREP && count_on(i) > 0);
    }
}

static long ns_entries(int i, const char *ns)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    http_resp r;
    long n = -1;
    if (http_call(rep_port[i], "GET", path, NULL, NULL, 0, &r) == 0 && r.status == 200 && r.json)
        n = (long)json_integer_value(json_object_get(r.json, "entries"));
    http_resp_free(&r);
    return n;
}

static int wait_entries(int i, const char *ns, long want, double timeout)
{
    double t0 = now_s();
    while (now_s() - t0 < timeout) {
        if (ns_entries(i, ns) == want) return 0;
        sleep_ms(5);
    }
    fprintf(stderr, "replica %s: %ld entries in %s, expected %ld\n", TAGS[i], ns_entries(i, ns), ns, want);
    return -1;
}

/* {word: prob} of a fresh session of namespace "news" after "the", asked of
 * replica i directly. */
static json_t *dist_on(int i)
{
    http_resp r;
    char id[80] = "", path[1100];
    json_t *d = NULL;
    if (http_json(rep_port[i], "POST", "/v1/sessions",
                  "{\"namespace\":\"news\",\"cache\":{\"unbounded\":true,\"exact\":true,\"knn\":16,"
                  "\"unbounded_lambda\":0.4,\"open_vocab\":true}}", &r) == 0 && r.status == 201 && r.json)
        snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    if (!id[0]) return NULL;
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    http_json(rep_port[i], "POST", path, "{\"text\":\"the\"}", &r);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    if (http_json(rep_port[i], "POST", path, "{\"full\":true}", &r) == 0 && r.status == 200 && r.json) {
        d = json_object();
        size_t k;
        json_t *it;
        json_array_foreach(json_object_get(r.json, "predictions"), k, it) {
            double p = json_real_value(json_object_get(it, "prob"));
            if (p > 0) json_object_set_new(d, json_string_value(json_object_get(it, "word")), json_real(p));
        }
    }
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    http_call(rep_port[i], "DELETE", path, NULL, NULL, 0, &r);
    http_resp_free(&r);
    return d;
}

static double word_diff(const json_t *a, const json_t *b)
{
    double m = 0;
    const char *w;
    json_t *v;
    json_object_foreach((json_t *)a, w, v) m = fmax(m, fabs(json_real_value(v) - json_real_value(json_object_get(b, w))));
    json_object_foreach((json_t *)b, w, v) m = fmax(m, fabs(json_real_value(v) - json_real_value(json_object_get(a, w))));
    return m;
}

static long news_entries;

/* The shipped nginx configuration (deploy/nginx) with this test's ports,
 * nginx in the foreground under a private prefix. */
static int start_nginx(void)
{
    const char *bin = access("/usr/sbin/nginx", X_OK) == 0 ? "/usr/sbin/nginx" : NULL;
    if (!bin) return 1;
    char dir[400], cmd[2000];
    snprintf(dir, sizeof dir, "%s/nginx", workdir);
    nginx_port = free_loopback_port();
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/logs && cp deploy/nginx/nginx-test.conf %s/ && "
             "sed -e 's/127.0.0.1:8080/127.0.0.1:%d/' -e 's/127.0.0.1:8081/127.0.0.1:%d/' "
             "-e 's/127.0.0.1:8082/127.0.0.1:%d/' -e 's/127.0.0.1:8083/127.0.0.1:%d/' "
             "deploy/nginx/neurocache.conf > %s/neurocache.conf",
             dir, dir, nginx_port, rep_port[0], rep_port[1], rep_port[2], dir);
    if (system(cmd) != 0) return -1;
    char conf[500];
    snprintf(conf, sizeof conf, "%s/nginx-test.conf", dir);
    nginx_pid = fork();
    if (nginx_pid == 0) {
        execl(bin, "nginx", "-p", dir, "-c", conf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        http_resp r;
        int ok = http_call(nginx_port, "GET", "/lb-health", NULL, NULL, 0, &r) == 0 && r.status == 200;
        http_resp_free(&r);
        if (ok) return 0;
        sleep_ms(25);
    }
    return -1;
}

static int pulls_total(void)
{
    int n = 0;
    for (int i = 0; i < NREP; i++) n += log_count(i, "session pulled");
    return n;
}

/* nginx: hash $key consistent on the session id. Ids chosen by the client
 * (X-Session-Id on the create) stay where they are created; ids minted by
 * a replica move at most once, to the replica their hash names. */
TEST(nginx_affinity)
{
    int rc = start_nginx();
    if (rc == 1) {
        fprintf(stderr, "  (nginx not installed: skipped)\n");
        return;
    }
    CHECK(rc == 0);
    if (rc) return;
    int save = lb_port;
    lb_port = nginx_port;   /* lb_call goes through nginx now */
    int p0 = pulls_total();
    char ids[12][80];
    for (int k = 0; k < 12; k++) {
        char body[128], want[64];
        snprintf(want, sizeof want, "ngx-%d-%d", k, (int)getpid());
        snprintf(body, sizeof body, "{\"id\":\"%s\"}", want);
        if (k < 6) CHECK(create_lb(body, want, ids[k], sizeof ids[k]) == 0);
        else CHECK(create_lb("{}", NULL, ids[k], sizeof ids[k]) == 0);
    }
    long pos[12] = {0};
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 12; k++) {
            CHECK(feed_lb(ids[k], "the cat sat .", &pos[k]) == 200);
            if (k < 6 && round == 0) CHECK(pulls_total() == p0);   /* client ids: never moved */
        }
    int moved = pulls_total() - p0;
    CHECKF(moved <= 6, "%d moves for 6 minted ids", moved);
    int p1 = pulls_total();
    for (int k = 0; k < 12; k++) {
        long before = pos[k];
        CHECK(feed_lb(ids[k], "the cat sat .", &pos[k]) == 200);
        CHECK(pos[k] > before);   /* every token kept across the moves */
    }
    CHECK(pulls_total() == p1);   /* settled */
    fprintf(stderr, "  (nginx: 6 client-chosen ids never moved, %d of 6 minted ids moved once)\n", moved);
    lb_port = save;
    kill(nginx_pid, SIGTERM);
    waitpid(nginx_pid, NULL, 0);
    nginx_pid = 0;
}

TEST(namespace_everywhere)
{
    const char *doc = "the zorblax sat on the mat . the zorblax ate the cat .\n"
                      "a dog saw the zorblax and the zorblax ran .\n";
    http_resp r;
    CHECK(http_call(lb_port, "POST", "/v1/namespaces/news/documents", "text/plain", doc, strlen(doc), &r) == 0 &&
          r.status == 200);
    http_resp_free(&r);
    double t0 = now_s();
    long n = -1;
    for (int i = 0; i < NREP; i++) n = ns_entries(i, "news") > n ? ns_entries(i, "news") : n;
    CHECK(n > 10);
    for (int i = 0; i < NREP; i++) CHECK(wait_entries(i, "news", n, 10) == 0);
    fprintf(stderr, "  (document of %ld tokens on all %d replicas %.1f ms after the upload answered)\n", n, NREP,
            (now_s() - t0) * 1e3);
    news_entries = n;
    json_t *d0 = dist_on(0);
    CHECK(d0 && json_real_value(json_object_get(d0, "zorblax")) > 1e-3);
    for (int i = 1; i < NREP; i++) {
        json_t *di = dist_on(i);
        CHECK(d0 && di);
        if (d0 && di) CHECK_NEAR(word_diff(d0, di), 0.0, 1e-4);
        json_decref(di);
    }
    json_decref(d0);
}

TEST(killed_replica)
{
    /* SIGKILL c: no drain, its sessions are gone. */
    kill(rep[2].pid, SIGKILL);
    waitpid(rep[2].pid, NULL, 0);
    rep[2].pid = 0;
    char cmd[400];   /* its scratch dir (the data dir is kept for the restart) */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rep[2].dir);
    if (strncmp(rep[2].dir, "/tmp/nc-test-", 13) == 0 && system(cmd)) {}
    CHECK(wait_status("c", "DOWN", 10) == 0);
    if (redis_pid > 0 && news_entries > 0) {
        /* Streamed while c is down: c must catch up after its restart. */
        const char *doc = "the quibble and the zorblax sat on the dog .\n";
        http_resp r;
        CHECK(http_call(lb_port, "POST", "/v1/namespaces/news/documents", "text/plain", doc, strlen(doc), &r) == 0 &&
              r.status == 200);
        http_resp_free(&r);
    }
    int lost = 0;
    for (int k = 0; k < NS; k += 2) {
        if (sids[k][4] != 'c') continue;
        char path[1100];
        snprintf(path, sizeof path, "/v1/sessions/%s/predict", sids[k]);
        http_resp r;
        CHECK(lb_call("POST", path, "{}", NULL, &r) == 0);
        CHECKF(r.status == 404 && !strcmp(http_error_code(&r), "session_not_here"), "%ld %s", r.status, r.body);
        http_resp_free(&r);
        lost++;
    }
    fprintf(stderr, "  (%d sessions of the killed replica answered session_not_here)\n", lost);
    /* New sessions land on the living replicas. */
    long before = count_on(0) + count_on(1);
    char id[80];
    for (int k = 0; k < 6; k++) {
        CHECK(create_lb("{}", NULL, id, sizeof id) == 0);
        CHECK(strncmp(id, "ses_c_", 6) != 0);
    }
    CHECK(count_on(0) + count_on(1) == before + 6);
    /* Restarted (same port and tag): back in the ring, takes new sessions. */
    CHECK(start_replica(2) == 0);
    CHECK(wait_status("c", "UP", 10) == 0);
    int on_c = 0;
    for (int k = 0; k < 9; k++) {
        CHECK(create_lb("{}", NULL, id, sizeof id) == 0);
        on_c += strncmp(id, "ses_c_", 6) == 0;
    }
    CHECK(on_c > 0);
    if (redis_pid > 0 && news_entries > 0) {
        /* c lost nothing of the namespace (its data dir survived) and
         * caught up with what was streamed while it was down. */
        long n = ns_entries(0, "news");
        CHECK(n > news_entries);
        for (int i = 0; i < NREP; i++) CHECK(wait_entries(i, "news", n, 10) == 0);
        json_t *d0 = dist_on(0), *d2 = dist_on(2);
        CHECK(d0 && d2);
        if (d0 && d2) CHECK_NEAR(word_diff(d0, d2), 0.0, 1e-4);
        json_decref(d0);
        json_decref(d2);
    }
}

/* Load: every thread works its own sessions (feed + predict) and scores
 * statelessly, through the balancer, until told to stop. */
#define NT 3
#define SPT 4
typedef struct {
    int t;
    char ids[SPT][80];
    long pos[SPT];
    long ok, failed;
    char first_error[512];
} worker;
static atomic_int stop_load;

static void *load(void *arg)
{
    worker *w = arg;
    for (int n = 0; !atomic_load(&stop_load); n++) {
        int k = n % SPT;
        char path[1100];
        http_resp r;
        long st;
        if (n % 3 == 2) {
            st = lb_call("POST", "/v1/score", "{\"text\":\"the cat sat on the mat .\"}", NULL, &r) == 0 ? r.status : -1;
        } else if (n % 3 == 1) {
            snprintf(path, sizeof path, "/v1/sessions/%s/predict", w->ids[k]);
            st = lb_call("POST", path, "{\"top_k\":5}", NULL, &r) == 0 ? r.status : -1;
        } else {
            snprintf(path, sizeof path, "/v1/sessions/%s/feed", w->ids[k]);
            st = lb_call("POST", path, "{\"text\":\"a dog sat on the cat .\"}", NULL, &r) == 0 ? r.status : -1;
            if (st == 200) w->pos[k] = (long)json_integer_value(json_object_get(r.json, "position"));
        }
        if (st == 200) {
            w->ok++;
        } else {
            if (!w->failed++)
                snprintf(w->first_error, sizeof w->first_error, "%ld %s", st, r.body ? r.body : "(no answer)");
        }
        http_resp_free(&r);
    }
    return NULL;
}

TEST(drain_under_load)
{
    worker w[NT];
    memset(w, 0, sizeof w);
    int on_a = 0;
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < SPT; k++) {
            CHECK(create_lb("{}", NULL, w[t].ids[k], sizeof w[t].ids[k]) == 0);
            on_a += w[t].ids[k][4] == 'a';
        }
    CHECK(on_a > 0);
    int pulled0 = log_count(1, "session pulled") + log_count(2, "session pulled");
    pthread_t th[NT];
    atomic_store(&stop_load, 0);
    for (int t = 0; t < NT; t++) pthread_create(&th[t], NULL, load, &w[t]);
    sleep_ms(1000);
    double t0 = now_s();
    daemon_signal_term(&rep[0]);
    int st = daemon_wait(&rep[0], 60);
    double drain_s = now_s() - t0;
    sleep_ms(1000);
    atomic_store(&stop_load, 1);
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    CHECK(st == 0);
    long ok = 0, failed = 0;
    for (int t = 0; t < NT; t++) {
        ok += w[t].ok;
        failed += w[t].failed;
        if (w[t].failed) fprintf(stderr, "  first failure of thread %d: %s\n", t, w[t].first_error);
    }
    int pulled = log_count(1, "session pulled") + log_count(2, "session pulled") - pulled0;
    fprintf(stderr, "  (drain of a replica holding %d sessions: %.2f s; %ld requests ok, %ld failed; "
            "%d sessions pulled by the peers, the rest handed over)\n", on_a, drain_s, ok, failed, pulled);
    CHECK(ok > 50);
    CHECK(failed == 0);
    /* No token lost: every session is somewhere, at the position its last
     * feed reported. */
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < SPT; k++) {
            char path[1100];
            snprintf(path, sizeof path, "/v1/sessions/%s", w[t].ids[k]);
            http_resp r;
            CHECK(lb_call("GET", path, NULL, NULL, &r) == 0 && r.status == 200);
            long tokens = r.json ? (long)json_integer_value(json_object_get(r.json, "tokens")) : -1;
            CHECKF(tokens == w[t].pos[k], "session %s: %ld tokens, last feed said %ld", w[t].ids[k],
                   tokens, w[t].pos[k]);
            http_resp_free(&r);
        }
    CHECK(count_on(0) == -1);   /* a is gone */
}

int main(void)
{
    if (find_haproxy()) {
        printf("SKIP test_replicas: haproxy is not installed (`make deps-test` installs Debian's haproxy)\n");
        printf("0 passed, 0 failed\n");
        return 0;
    }
    httpc_init();
    signal(SIGPIPE, SIG_IGN);
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    snprintf(workdir, sizeof workdir, "/tmp/nc-test-XXXXXX");
    if (!mkdtemp(workdir)) return 1;
    lb_port = free_loopback_port();
    stats_port = free_loopback_port();
    int n = 0;
    for (int i = 0; i < NREP; i++) {
        rep_port[i] = free_loopback_port();
        n += snprintf(peers + n, sizeof peers - (size_t)n, "%s%s=http://127.0.0.1:%d", i ? "," : "",
                      TAGS[i], rep_port[i]);
    }
    if (start_redis() != 0)
        printf("note test_replicas: redis-server is not installed: replication checks skipped (`make deps-test`)\n");
    int up = 1;
    for (int i = 0; i < NREP; i++)
        if (start_replica(i)) up = 0;
    if (up && start_haproxy()) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "cat %s/haproxy.log >&2", workdir);
        if (system(cmd)) {}
        up = 0;
    }
    CHECK(up);
    if (up) {
        RUN(affinity);
        RUN(nginx_affinity);
        if (redis_pid > 0) RUN(namespace_everywhere);
        RUN(killed_replica);
        RUN(drain_under_load);
    }
    if (harness_failed)
        for (int i = 0; i < NREP; i++) if (rep[i].pid > 0) daemon_dump_log(&rep[i]);
    for (int i = 0; i < NREP; i++)
        if (rep[i].pid > 0) CHECKF(daemon_stop(&rep[i]) == 0, "replica %s did not exit cleanly", TAGS[i]);
    if (nginx_pid > 0) {
        kill(nginx_pid, SIGTERM);
        waitpid(nginx_pid, NULL, 0);
    }
    if (haproxy_pid > 0) {
        kill(haproxy_pid, SIGTERM);
        waitpid(haproxy_pid, NULL, 0);
    }
    if (redis_pid > 0) {
        kill(redis_pid, SIGTERM);
        waitpid(redis_pid, NULL, 0);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    if (system(cmd)) {}
    httpc_cleanup();
    return harness_summary();
}
