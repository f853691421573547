/* test_training_replicas.c -- a namespace's own index training on two
 * neurocached replicas sharing it through a real redis-server (issue 35):
 * the pairs streamed into replica A reach B, each replica trains its own
 * index from its copy of them (replication ships pairs, not indexes), and
 * since a training depends on the keys below its T_j only, B ends with A's
 * index: the same nlist, nprobe and recall, and the same predictions bit
 * for bit, after the first training and after the re-training at 4x.
 * Skipped, with a message, when redis-server is not installed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"
#include "nswalk.h"

static char model_dir[512], work[256], redis_addr[64];
static int redis_port;
static pid_t redis_pid;

static int start_redis(void)
{
    const char *c[] = {"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server", NULL};
    const char *bin = NULL;
    for (int i = 0; c[i]; i++)
        if (access(c[i], X_OK) == 0)
            bin = c[i];
    if (!bin)
        return 1;
    redis_port = free_loopback_port();
    snprintf(redis_addr, sizeof redis_addr, "127.0.0.1:%d", redis_port);
    char port[16], log[400];
    snprintf(port, sizeof port, "%d", redis_port);
    snprintf(log, sizeof log, "%s/redis.log", work);
    redis_pid = fork();
    if (redis_pid == 0) {
        if (!freopen(log, "w", stdout))
            _exit(127);
        dup2(1, 2);
        execl(bin, "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
              work, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)redis_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return 0;
        sleep_ms(25);
    }
    return -1;
}

static int start(nc_daemon *d, const char *tag)
{
    static char dirs[2][400];
    int k = tag[0] - 'a';
    snprintf(dirs[k], sizeof dirs[k], "%s/data-%s", work, tag);
    const char *args[] = {"--model", model_dir, "--replica-tag", tag, "--redis", redis_addr, "--data-dir", dirs[k],
                          "--snapshot-period", "0", "--index-switch-at", "2048", NULL};
    return daemon_start(d, args);
}

static long upload(const nc_daemon *d, int n, uint64_t seed)
{
    char *t = nswalk_text(n, seed);
    http_resp r;
    long st = http_call(d->port, "POST", "/v1/namespaces/grow/documents", "text/plain", t, strlen(t), &r) == 0
                  ? r.status : -1;
    http_resp_free(&r);
    free(t);
    return st;
}

/* Waits (120 s) until d holds `entries` pairs and has done `trainings` with none running */
static int wait_state(const nc_daemon *d, int64_t entries, int trainings)
{
    for (double t0 = now_s(); now_s() - t0 < 120; sleep_ms(50)) {
        int64_t n;
        json_t *t = nswalk_training(d, "grow", &n);
        bool ok = t && n == entries && json_integer_value(json_object_get(t, "trainings")) >= trainings &&
                  json_is_null(json_object_get(t, "in_progress"));
        json_decref(t);
        if (ok)
            return 0;
    }
    return -1;
}

static nc_daemon A, B;

/* After each training, B's index state and predictions are A's. */
static void check_same(int trainings, long want_trained_on)
{
    int64_t na, nb;
    json_t *ta = nswalk_training(&A, "grow", &na);
    CHECK(wait_state(&A, na, trainings) == 0 && wait_state(&B, na, trainings) == 0);
    json_decref(ta);
    ta = nswalk_training(&A, "grow", &na);
    json_t *tb = nswalk_training(&B, "grow", &nb);
    CHECK(na == nb && json_integer_value(json_object_get(ta, "trained_on")) == want_trained_on);
    const char *same[] = {"nlist", "trained_on", "recall", "imbalance", "trainings", NULL};
    for (int i = 0; same[i]; i++)
        CHECKF(json_equal(json_object_get(ta, same[i]), json_object_get(tb, same[i])), "%s differs", same[i]);
    json_t *pa = nswalk_predictions(&A, "grow", ""), *pb = nswalk_predictions(&B, "grow", "");
    CHECKF(pa && pb && json_equal(pa, pb), "after training %d: the replicas predict differently", trainings);
    fprintf(stderr, "    training %d: %lld lists, recall %.3f, %lld pairs, the same on both replicas\n", trainings,
            (long long)json_integer_value(json_object_get(ta, "nlist")), json_real_value(json_object_get(ta, "recall")),
            (long long)na);
    json_decref(pa);
    json_decref(pb);
    json_decref(ta);
    json_decref(tb);
}

TEST(replicas_train_the_same_index)
{
    CHECK(upload(&A, 3000, 21) == 200);
    check_same(1, 2048);
    CHECK(upload(&A, 3000, 22) == 200 && upload(&A, 3000, 23) == 200);   /* past 8,192 */
    check_same(2, 8192);
}

int main(void)
{
    snprintf(work, sizeof work, "/tmp/nc-test-trrep-XXXXXX");
    if (!mkdtemp(work))
        return 1;
    int rs = start_redis();
    if (rs == 1) {
        printf("SKIP test_training_replicas: redis-server is not installed\n0 passed, 0 failed\n");
        rmdir(work);
        return 0;
    }
    httpc_init();
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    CHECK(rs == 0);
    int up = rs == 0 && start(&A, "a") == 0;
    if (up && start(&B, "b") != 0) {
        daemon_stop(&A);
        up = 0;
    }
    CHECK(up);
    if (up) {
        RUN(replicas_train_the_same_index);
        if (harness_failed) {
            daemon_dump_log(&A);
            daemon_dump_log(&B);
        }
        CHECK(daemon_stop(&B) == 0);
        CHECK(daemon_stop(&A) == 0);
    }
    if (redis_pid > 0) {
        kill(redis_pid, SIGTERM);
        waitpid(redis_pid, NULL, 0);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", work);
    httpc_cleanup();
    return harness_summary();
}
