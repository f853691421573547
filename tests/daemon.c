/* daemon.c -- test helper: runs the real bin/neurocached as a child on an
 * ephemeral loopback port, and a small libcurl client to talk to it. */
#include "daemon.h"

#include <curl/curl.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <netinet/in.h>
#include <unistd.h>

const char *daemon_bin_path(const char *name)
{
    static char path[1024];
    const char *dir = getenv("NEUROCACHE_BIN");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "bin", name);
    return path;
}

void daemon_dump_log(const nc_daemon *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    fprintf(stderr, "---- neurocached log (%s) ----\n", d->log);
    char line[2048];
    while (fgets(line, sizeof line, f))
        fprintf(stderr, "   | %s", line);
    fclose(f);
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int free_loopback_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int daemon_start(nc_daemon *d, const char *const *args)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/nc-test-XXXXXX");
    if (!mkdtemp(d->dir))
        return -1;
    snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
    char portfile[300];
    snprintf(portfile, sizeof portfile, "%s/port", d->dir);

    const char *argv[64];
    int n = 0;
    argv[n++] = daemon_bin_path("neurocached");
    argv[n++] = "--bind"; argv[n++] = "127.0.0.1";
    argv[n++] = "--port"; argv[n++] = "0";
    argv[n++] = "--port-file"; argv[n++] = portfile;
    argv[n++] = "--threads"; argv[n++] = "2";
    argv[n++] = "--data-dir"; argv[n++] = d->dir;
    if (geteuid() == 0)
        argv[n++] = "--allow-root";   /* tests may run as root (containers) */
    for (int i = 0; args && args[i] && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char bin[1024];
    snprintf(bin, sizeof bin, "%s", argv[0]);

    d->pid = fork();
    if (d->pid < 0)
        return -1;
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            /* stdout too: a daemon left behind by a test that crashed must
             * not hold the test runner's pipe open (run_tests.sh would wait
             * for it forever) */
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    /* Port file, then /ready. */
    for (int i = 0; i < 6000; i++) {
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            fprintf(stderr, "neurocached exited during start-up (status %d)\n", st);
            daemon_dump_log(d);
            d->pid = 0;
            return -1;
        }
        if (d->port == 0) {
            FILE *f = fopen(portfile, "r");
            if (f) {
                if (fscanf(f, "%d", &d->port) != 1) d->port = 0;
                fclose(f);
            }
        }
        if (d->port > 0) {
            http_resp r;
            if (http_call(d->port, "GET", "/ready", NULL, NULL, 0, &r) == 0 && r.status == 200) {
                http_resp_free(&r);
                return 0;
            }
            http_resp_free(&r);
        }
        sleep_ms(10);
    }
    fprintf(stderr, "neurocached did not become ready\n");
    daemon_dump_log(d);
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = 0;
    return -1;
}

void daemon_signal_term(nc_daemon *d)
{
    if (d->pid > 0)
        kill(d->pid, SIGTERM);
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    if (!dir[0] || strncmp(dir, "/tmp/nc-test-", 13) != 0)
        return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */ }
}

void daemon_kill(nc_daemon *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = 0;
    remove_dir(d->dir);
}

int daemon_wait(nc_daemon *d, int timeout_s)
{
    if (d->pid <= 0)
        return -1;
    int st = 0, rc = -1;
    for (int i = 0; i < timeout_s * 100; i++) {
        pid_t w = waitpid(d->pid, &st, WNOHANG);
        if (w == d->pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            if (rc != 0) {
                fprintf(stderr, "neurocached exit status %d (raw %d)\n", rc, st);
                daemon_dump_log(d);
            }
            d->pid = 0;
            remove_dir(d->dir);
            return rc;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "neurocached did not exit in %d s: killed\n", timeout_s);
    daemon_dump_log(d);
    daemon_kill(d);
    return -1;
}

int daemon_stop(nc_daemon *d)
{
    daemon_signal_term(d);
    return daemon_wait(d, 60);
}

/* ---- HTTP client ---- */

size_t http_buf_write(char *p, size_t size, size_t nmemb, void *user)
{
    http_buf *b = user;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return 0;
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
    return n;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *user)
{
    http_resp *r = user;
    size_t n = size * nmemb;
    const char *keys[4] = {"content-type:", "allow:", "www-authenticate:", "retry-after:"};
    char *dst[4] = {r->content_type, r->allow, r->www_authenticate, r->retry_after};
    for (int k = 0; k < 4; k++) {
        size_t kl = strlen(keys[k]);
        if (n > kl && strncasecmp(p, keys[k], kl) == 0) {
            size_t i = kl;
            while (i < n && p[i] == ' ') i++;
            size_t e = n;
            while (e > i && (p[e - 1] == '\r' || p[e - 1] == '\n')) e--;
            size_t l = e - i < 127 ? e - i : 127;
            memcpy(dst[k], p + i, l);
            dst[k][l] = 0;
        }
    }
    return n;
}

static _Thread_local char bearer[300];

void httpc_set_bearer(const char *key)
{
    snprintf(bearer, sizeof bearer, "%s", key ? key : "");
}

void httpc_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }
void httpc_cleanup(void) { curl_global_cleanup(); }

/* http_call, or with read_fn a POST whose body curl pulls from read_fn in
 * chunked transfer encoding. */
static int http_do(int port, const char *method, const char *path, const char *ctype, const char *body,
                   size_t len, http_read_fn read_fn, void *read_data, long timeout_s, http_resp *out)
{
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    if (!c)
        return -1;
    char url[2048];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    http_buf b = {0};
    struct curl_slist *h = NULL;
    char cth[256];
    if (ctype) {
        snprintf(cth, sizeof cth, "Content-Type: %s", ctype);
        h = curl_slist_append(h, cth);
    } else {
        h = curl_slist_append(h, "Content-Type:");   /* suppress curl's default */
    }
    h = curl_slist_append(h, "Expect:");
    if (read_fn)
        h = curl_slist_append(h, "Transfer-Encoding: chunked");
    if (bearer[0]) {
        char ah[340];
        snprintf(ah, sizeof ah, "Authorization: Bearer %s", bearer);
        h = curl_slist_append(h, ah);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (read_fn) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, read_fn);
        curl_easy_setopt(c, CURLOPT_READDATA, read_data);
    } else if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    } else if (strcmp(method, "GET") == 0) {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, NULL);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_buf_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    out->body = b.s ? b.s : calloc(1, 1);
    out->len = b.len;
    if (rc != CURLE_OK)
        return -1;
    if (out->len > 0)
        out->json = json_loadb(out->body, out->len, 0, NULL);
    return 0;
}

int http_call(int port, const char *method, const char *path, const char *ctype,
              const char *body, size_t len, http_resp *out)
{
    return http_do(port, method, path, ctype, body, len, NULL, NULL, 120, out);
}

int http_post_stream(int port, const char *path, const char *ctype, http_read_fn read_fn, void *read_data,
                     long timeout_s, http_resp *out)
{
    return http_do(port, "POST", path, ctype, NULL, 0, read_fn, read_data, timeout_s, out);
}

int http_json(int port, const char *method, const char *path, const char *body, http_resp *out)
{
    return http_call(port, method, path, body ? "application/json" : NULL, body,
                     body ? strlen(body) : 0, out);
}

int http_post_json(int port, const char *path, const json_t *body, http_resp *out)
{
    char *s = json_dumps(body, JSON_COMPACT);
    if (!s) {
        memset(out, 0, sizeof *out);
        return -1;
    }
    int rc = http_json(port, "POST", path, s, out);
    free(s);
    return rc;
}

void http_resp_free(http_resp *r)
{
    free(r->body);
    json_decref(r->json);
    memset(r, 0, sizeof *r);
}

const char *http_error_code(const http_resp *r)
{
    json_t *e = r->json ? json_object_get(r->json, "error") : NULL;
    const char *c = e ? json_string_value(json_object_get(e, "code")) : NULL;
    return c ? c : "";
}
