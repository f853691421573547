/* daemon.h -- test helper: runs the real bin/neurocached as a child on an
 * ephemeral loopback port, and a small libcurl client to talk to it. */
#ifndef NC_TEST_DAEMON_H
#define NC_TEST_DAEMON_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    int port;
    char dir[256];                /* scratch directory (port file, log) */
    char log[300];                /* the daemon's stderr */
} nc_daemon;

/* Path of a binary in $NEUROCACHE_BIN (default "bin"): static buffer. */
const char *daemon_bin_path(const char *name);

/* Small helpers the daemon tests share. */
void sleep_ms(int ms);
double now_s(void);               /* CLOCK_MONOTONIC, seconds */
/* A free loopback port (bound then released: replicas need each other's
 * ports before they start). */
int free_loopback_port(void);

/* Starts neurocached with --port 0 --port-file ... --bind 127.0.0.1 plus
 * args (NULL-terminated; should include --model), waits until /ready
 * answers 200 (up to 60 s: sanitizer builds are slow). Returns 0, or -1
 * with the daemon's log printed to stderr. */
int daemon_start(nc_daemon *d, const char *const *args);

/* SIGTERM, waits; returns the exit status (0 = clean), or -1 if it had to be
 * killed or died of a signal. Removes the scratch directory. */
int daemon_stop(nc_daemon *d);

/* Sends SIGTERM without waiting. */
void daemon_signal_term(nc_daemon *d);
/* Waits for exit (up to timeout_s), returns as daemon_stop. */
int daemon_wait(nc_daemon *d, int timeout_s);
/* kill -9 (a crash test's): SIGKILL, reaped, the scratch directory removed
 * (its log and port file; the data_dir is the test's). */
void daemon_kill(nc_daemon *d);

/* Prints the daemon's log to stderr (on failures). */
void daemon_dump_log(const nc_daemon *d);

/* One HTTP answer. body is NUL-terminated; json is the parsed body or NULL. */
typedef struct {
    long status;
    char *body;
    size_t len;
    json_t *json;
    char content_type[128];
    char allow[128];
    char www_authenticate[128];   /* these headers' values, "" when absent */
    char retry_after[128];
} http_resp;

void httpc_init(void);            /* once, before threads */
/* API key sent as "Authorization: Bearer KEY" by this thread's calls from
 * now on (NULL or "" = none). */
void httpc_set_bearer(const char *key);
void httpc_cleanup(void);
/* Any request. ctype NULL = no Content-Type header; body may be NULL. Returns
 * 0 when an answer came (whatever its status), -1 on transport failure. */
/* A response body as libcurl delivers it: http_buf_write, a
 * CURLOPT_WRITEFUNCTION, appends to the http_buf given as CURLOPT_WRITEDATA
 * (s malloc'd, NUL-terminated). */
typedef struct { char *s; size_t len, cap; } http_buf;
size_t http_buf_write(char *p, size_t size, size_t nmemb, void *user);

int http_call(int port, const char *method, const char *path, const char *ctype,
              const char *body, size_t len, http_resp *out);
/* A POST whose body curl pulls from read_fn (curl's read callback) as it
 * goes, in chunked transfer encoding: uploads that are never held whole. */
typedef size_t (*http_read_fn)(char *buf, size_t size, size_t nitems, void *data);
int http_post_stream(int port, const char *path, const char *ctype, http_read_fn read_fn, void *read_data,
                     long timeout_s, http_resp *out);
/* JSON shorthands: body is sent as application/json (NULL = no body). */
int http_json(int port, const char *method, const char *path, const char *body, http_resp *out);
/* body built from a json_t (not stolen). */
int http_post_json(int port, const char *path, const json_t *body, http_resp *out);
void http_resp_free(http_resp *r);

/* The error code string of an error answer, or "" */
const char *http_error_code(const http_resp *r);

#endif
