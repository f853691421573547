/* rawhttp.c -- raw HTTP, /metrics and /proc figures, heavy request bodies
 * (rawhttp.h). */
#include "rawhttp.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon.h"

/* ---- raw HTTP, for requests whose client hangs up ---------------------- */

int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

int raw_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int raw_post_as(int port, const char *version, const char *path, const char *body)
{
    int fd = raw_connect(port);
    if (fd < 0) return -1;
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/%s\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n", path, version, strlen(body));
    if (raw_write_all(fd, head, (size_t)hl) || raw_write_all(fd, body, strlen(body))) {
        close(fd);
        return -1;
    }
    return fd;
}

int raw_post(int port, const char *path, const char *body)
{
    return raw_post_as(port, "1.1", path, body);
}

/* Reads what comes on fd until enough(bytes so far, arg) says so, the peer
 * closes or timeout_ms passes. Returns the bytes (malloc'd, NUL-terminated,
 * caller frees) and *closed = the peer closed (closed may be NULL). */
char *raw_read_until(int fd, int timeout_ms, raw_enough_fn enough, void *arg, int *closed)
{
    size_t cap = 65536, len = 0;
    char *b = malloc(cap);
    if (closed)
        *closed = 0;
    double end = now_s() + timeout_ms / 1000.0;
    for (;;) {
        b[len] = 0;
        if (enough && enough(b, len, arg))
            break;
        int left = (int)((end - now_s()) * 1000);
        if (left <= 0) break;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, left) <= 0) break;
        if (len + 4096 >= cap) b = realloc(b, cap *= 2);
        ssize_t k = recv(fd, b + len, cap - len - 1, 0);
        if (k <= 0) {
            if (closed)
                *closed = 1;
            break;
        }
        len += (size_t)k;
    }
    b[len] = 0;
    return b;
}

/* The whole answer is in: its head and Content-Length bytes of body. */
static bool answer_complete(const char *b, size_t len, void *arg)
{
    (void)arg;
    const char *hend = strstr(b, "\r\n\r\n");
    if (!hend)
        return false;
    const char *cl = strcasestr(b, "Content-Length:");
    return cl && cl < hend && len >= (size_t)(hend + 4 - b) + strtoul(cl + 15, NULL, 10);
}

/* Reads what comes on fd for up to timeout_ms (until the answer's
 * Content-Length is in, or the peer closes). Returns the bytes (malloc'd,
 * NUL-terminated, caller frees) and *closed = the peer closed. */
char *raw_read(int fd, int timeout_ms, int *closed)
{
    return raw_read_until(fd, timeout_ms, answer_complete, NULL, closed);
}

int raw_status(const char *answer)
{
    int st = 0;
    return sscanf(answer, "HTTP/1.%*d %d", &st) == 1 ? st : 0;
}

/* ---- metrics and the process ------------------------------------------- */

/* The value of an unlabelled metric, -1 if absent. */
double daemon_metric(int port, const char *name)
{
    http_resp r;
    double v = -1;
    if (http_call(port, "GET", "/metrics", NULL, NULL, 0, &r) == 0 && r.body) {
        char key[128];
        snprintf(key, sizeof key, "\n%s ", name);
        const char *p = strstr(r.body, key);
        if (p) v = strtod(p + strlen(key), NULL);
    }
    http_resp_free(&r);
    return v;
}

/* Waits (up to timeout_s) until metric name == want; returns the seconds
 * it took, or -1. */
double daemon_wait_metric(int port, const char *name, double want, double timeout_s)
{
    double t0 = now_s();
    while (now_s() - t0 < timeout_s) {
        if (daemon_metric(port, name) == want) return now_s() - t0;
        sleep_ms(10);
    }
    return -1;
}

double process_cpu(pid_t pid)
{
    char path[64], buf[2048];
    if (pid <= 0) return NAN;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* after the name: state ppid pgrp session tty tpgid flags minflt
     * cminflt majflt cmajflt utime stime */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return NAN;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- request bodies ----------------------------------------------------- */

/* {"prompt": ["the", ... n times], "max_tokens": m}: n x m generation steps. */
char *completions_body(int n, int m)
{
    char *b = malloc((size_t)n * 7 + 64);
    size_t len = (size_t)sprintf(b, "{\"prompt\":[");
    for (int i = 0; i < n; i++) len += (size_t)sprintf(b + len, "%s\"the\"", i ? "," : "");
    sprintf(b + len, "],\"max_tokens\":%d}", m);
    return b;
}

/* {"text": "the the ... (n words)"}. */
char *score_body(size_t n)
{
    char *b = malloc(n * 4 + 32);
    size_t len = (size_t)sprintf(b, "{\"text\":\"");
    for (size_t i = 0; i < n; i++) { memcpy(b + len, "the ", 4); len += 4; }
    sprintf(b + len, "\"}");
    return b;
}

