/* rawhttp.h -- test helper: raw HTTP on loopback for requests whose client
 * hangs up or sends bytes libcurl would not, the daemon's /metrics and
 * /proc figures, and the heavy request bodies of the availability test
 * (test_server_guard) and its latency benchmark (bench_server --guard). */
#ifndef NC_TEST_RAWHTTP_H
#define NC_TEST_RAWHTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* A TCP connection to 127.0.0.1:port, or -1. */
int raw_connect(int port);

/* Writes p[0..n) to fd; 0, or -1 when the peer is gone. */
int raw_write_all(int fd, const char *p, size_t n);

/* Sends a JSON POST and returns the socket (the answer is read later, or
 * never: the client hangs up); -1 on failure. */
int raw_post(int port, const char *path, const char *body);

/* raw_post in HTTP/version ("1.0": the daemon sends an event stream
 * unchunked and closes at its end). */
int raw_post_as(int port, const char *version, const char *path, const char *body);

/* Reads what comes on fd for up to timeout_ms (until the answer's
 * Content-Length is in, or the peer closes). Returns the bytes (malloc'd,
 * NUL-terminated, caller frees) and *closed = the peer closed. */
char *raw_read(int fd, int timeout_ms, int *closed);
/* The loop under raw_read: reads until enough(bytes so far, their length,
 * arg) is true, the peer closes (*closed = 1; closed may be NULL) or
 * timeout_ms passes. */
typedef bool (*raw_enough_fn)(const char *bytes, size_t len, void *arg);
char *raw_read_until(int fd, int timeout_ms, raw_enough_fn enough, void *arg, int *closed);

/* The status of a raw answer ("HTTP/1.1 413 ..."), 0 if none. */
int raw_status(const char *answer);

/* The value of an unlabelled metric of the daemon's /metrics, -1 if absent. */
double daemon_metric(int port, const char *name);

/* Waits (up to timeout_s) until metric name == want; returns the seconds
 * it took, or -1. */
double daemon_wait_metric(int port, const char *name, double want, double timeout_s);

/* CPU seconds (user + system) process pid has used, NAN if unknown
 * (pid <= 0, or no /proc entry). */
double process_cpu(pid_t pid);

/* {"prompt": ["the", ... n times], "max_tokens": m}: n x m generation
 * steps (malloc'd). */
char *completions_body(int n, int m);

/* {"text": "the the ... (n words)"} (malloc'd). */
char *score_body(size_t n);

#endif
