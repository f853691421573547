/* main.c -- neurocached: configuration, start-up, signals, drain, exit. */
#include <cblas.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "batcher.h"
#include "atomicfile.h"
#include "auth.h"
#include "backup.h"
#include "compute.h"
#include "fault.h"
#include "config.h"
#include "routes.h"
#include "http.h"
#include "memstats.h"
#include "metrics.h"
#include "namespaces.h"
#include "migrate.h"
#include "replication.h"
#include "server.h"
#include "sessions.h"
#include "vmath.h"
#include "slog.h"
#include "uploads.h"
#include "workguard.h"

/* The [cache] options: each was checked against the knob table when set;
 * here their combination. */
static int cache_defaults_from_config(const nc_server_config *c, nc_cache_params *p, char *err,
                                      size_t errlen)
{
    *p = c->cache;
    char msg[NC_ERRLEN] = "";
    if (cache_params_validate(p, msg, sizeof msg) != NC_OK) {
        snprintf(err, errlen, "section [cache]: %s", msg);
        return -1;
    }
    return 0;
}

/* Written whole through a temporary file and rename (atomicfile.h), so a
 * reader never sees a partial number. */
static int write_port_file(const char *path, int port, char *err, size_t errlen)
{
    char text[32], msg[NC_ERRLEN];
    int n = snprintf(text, sizeof text, "%d\n", port);
    if (atomicfile_write(path, text, (size_t)n, msg, sizeof msg) != NC_OK) {
        snprintf(err, errlen, "option 'port_file': %s", msg);
        return -1;
    }
    return 0;
}

/* OpenBLAS starts its worker threads when the library is loaded, before
 * main blocks SIGTERM/SIGINT: a signal the kernel hands to one of them took
 * the default action and killed the daemon with no drain and no snapshot
 * (whenever the main thread was not inside sigtimedwait; found by
 * test_fault_injection). A handler makes that delivery harmless; the main loop picks
 * the signal up from got_signal within its one-second tick. */
static volatile sig_atomic_t got_signal, signal_count, memory_report_count;

static void on_stop_signal(int s)
{
    got_signal = s;
    signal_count++;
}

static void on_memory_signal(int s)
{
    (void)s;
    memory_report_count++;
}

/* The main thread's wait for SIGTERM/SIGINT (or SIGUSR1, a memory report),
 * for at most ms milliseconds: the signal, or 0. */
static int wait_signal(const sigset_t *sigs, long ms)
{
    static int seen;              /* signals the handler took, already returned */
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    static int reports;           /* SIGUSR1s the handler took, already returned */
    int sig = sigtimedwait(sigs, NULL, &t);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGUSR1)
        return sig;
    if (memory_report_count != reports) {
        reports = memory_report_count;
        return SIGUSR1;
    }
    if (signal_count != seen) {
        seen = signal_count;
        return got_signal;
    }
    return 0;
}

/* During the drain: a second SIGTERM/SIGINT exits at once. Nothing is lost
 * that was acknowledged (every adaptation is in its fsynced log before its
 * answer); the next start replays the logs instead of reading a fresh
 * snapshot. Waits ms milliseconds otherwise. */
static void drain_wait(const sigset_t *sigs, long ms)
{
    int sig = wait_signal(sigs, ms);
    if (sig == SIGTERM || sig == SIGINT) {
        slog(SLOG_WARN, "second signal: exiting at once",
             json_pack("{s:s}", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"));
        _exit(1);
    }
}

/* The last resort of the drain: whatever still runs after the drain
 * timeout, its cancellation and the stop's grace, the process exits (from
 * this thread, as main may be the one waiting); acknowledged work is in the
 * logs, as for a second signal. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    bool done;
    double at;                    /* CLOCK_MONOTONIC seconds */
} watchdog = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, 0};

static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&watchdog.lock);
    while (!watchdog.done) {
        double left = watchdog.at - nc_now_s();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double when = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + left;
        ts.tv_sec = (time_t)when;
        ts.tv_nsec = (long)((when - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&watchdog.cv, &watchdog.lock, &ts);
    }
    bool done = watchdog.done;
    pthread_mutex_unlock(&watchdog.lock);
    if (!done) {
        slog(SLOG_WARN, "stop took too long: exiting without the final snapshot", json_pack("{}"));
        _exit(0);
    }
    return NULL;
}

/* ---- start-up, in order ----------------------------------------------------- */

/* Logs why start-up failed and gives main's exit status 1. */
static int startup_failed(const char *err, const char *option)
{
    slog(SLOG_ERROR, "startup failed",
         option ? json_pack("{s:s,s:s}", "error", err, "option", option) : json_pack("{s:s}", "error", err));
    return 1;
}

/* Signals are taken synchronously by the main thread only: every thread
 * created from here on inherits the mask. */
static void take_signals(sigset_t *sigs)
{
    sigemptyset(sigs);
    sigaddset(sigs, SIGTERM);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_memory_signal;
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static int cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The workers, then the listening socket: /health answers (and /ready says
 * 503) while the model loads. */
/* The net tier's ways into the domain (server.h run_heavy,
 * session_namespace), wired here, the one place that knows both. */
static int run_heavy(nc_server *srv, workguard *g, int fd, bool admitted, void (*fn)(void *), void *arg)
{
    return (int)workpool_run(srv->pool, g, fd, admitted, fn, arg);
}

static bool session_namespace(nc_server *srv, const char *id, char *ns, size_t nslen)
{
    nc_session *s = srv->sessions ? sessions_acquire(srv->sessions, id) : NULL;
    if (!s)
        return false;
    snprintf(ns, nslen, "%s", s->ns);
    sessions_release(srv->sessions, s);
    return true;
}

static int start_listening(nc_server *srv, char *err, size_t errlen)
{
    /* Each request thread runs its own BLAS calls: one BLAS thread per
     * request thread avoids oversubscribing the cores (design §6). */
    openblas_set_num_threads(1);
    /* The heavy requests' workers (workguard.h); threads = 0: one per core. */
    if (srv->cfg.threads <= 0)
        srv->cfg.threads = cores();
    srv->pool = workpool_new(srv->cfg.threads, srv->cfg.max_queued, srv->cfg.worker_nice);
    if (!srv->pool)
        return startup_failed("cannot start the worker threads", NULL);
    srv->run_heavy = run_heavy;
    srv->session_namespace = session_namespace;
    int n;
    const http_route *routes = routes_table(&n);
    if (http_start(srv, routes, n, err, errlen) != 0)
        return startup_failed(err, NULL);
    slog(SLOG_INFO, "listening",
         json_pack("{s:s,s:i,s:i,s:s,s:s,s:s}", "bind", srv->cfg.bind, "port", srv->port, "threads",
                   srv->cfg.threads, "version", NC_VERSION, "simd", vm_isa(), "blas", nc_blas_core()));
    if (srv->cfg.port_file[0] && write_port_file(srv->cfg.port_file, srv->port, err, errlen) != 0)
        return startup_failed(err, NULL);
    return 0;
}

/* The model, the sessions and the predict batcher, the peers, replication,
 * then the namespaces (snapshot + log replay of each: /ready stays 503 until
 * every one is back; a corrupt one stops start-up, naming the file). */
static int load_and_recover(nc_server *srv, char *err, size_t errlen)
{
    if (model_load(srv->cfg.model, &srv->model, err, errlen) != NC_OK)
        return startup_failed(err, "model");
    srv->sessions = sessions_new(srv->model, srv->cfg.max_sessions, srv->cfg.session_ttl_s,
                                 (size_t)srv->cfg.session_memory_mb << 20, srv->cfg.replica_tag);
    if (!srv->sessions)
        return startup_failed("out of memory", NULL);
    if (srv->cfg.batch_predict) {
        int threads = srv->cfg.batch_threads > 0 ? srv->cfg.batch_threads : cores();
        srv->batcher = batcher_new(srv->model, threads, srv->cfg.max_batch);
        if (!srv->batcher)
            return startup_failed("cannot start the predict batcher", NULL);
    }
    if (migrate_init(srv, err, errlen) != 0)
        return startup_failed(err, "peers");
    /* a data_dir that is a backup is verified before anything opens it */
    if (srv->cfg.data_dir[0] && backup_startup_check(srv->cfg.data_dir, srv->model, err, errlen) != NC_OK)
        return startup_failed(err, "data_dir");
    /* before the namespaces are recovered: each is attached as it opens */
    if (replication_start(srv, err, errlen) != 0)
        return startup_failed(err, "redis");
    if (namespaces_init(srv, err, errlen) != 0)
        return startup_failed(err, "data_dir");
    if (uploads_init(srv, err, errlen) != 0)
        return startup_failed(err, NULL);
    sessions_set_binder(srv->sessions, namespaces_bind_session, namespaces_unbind_session, srv);
    return 0;
}

/* ---- serving and stopping ---------------------------------------------------- */

/* SIGUSR1: what malloc holds, arena by arena (malloc_info's XML), in the log
 * at warn level so that it shows whatever the log level: an operator asked. */
static void memory_report(void)
{
    char *xml = memstats_malloc_info();
    slog(SLOG_WARN, "memory report (SIGUSR1)", json_pack("{s:s}", "malloc_info", xml ? xml : "unavailable"));
    free(xml);
}

/* The main thread waits for a signal, evicting idle sessions once a second
 * and giving malloc's free pages back every malloc_trim seconds meanwhile.
 * Returns the signal that stops it. */
static int serve_until_signal(nc_server *srv, const sigset_t *sigs)
{
    double next_trim = nc_now_s() + srv->cfg.malloc_trim_s;
    for (;;) {
        int sig = wait_signal(sigs, 1000);
        if (sig == SIGTERM || sig == SIGINT)
            return sig;
        if (sig == SIGUSR1)
            memory_report();
        if (srv->cfg.malloc_trim_s > 0 && nc_now_s() >= next_trim) {
            double took = memstats_trim();
            if (took > 0.05)
                slog(SLOG_INFO, "malloc_trim was slow", json_pack("{s:f}", "seconds", took));
            next_trim = nc_now_s() + srv->cfg.malloc_trim_s;
        }
        int ev = sessions_evict_idle(srv->sessions);
        if (ev > 0) {
            metrics_add_evictions((uint64_t)ev);
            slog(SLOG_INFO, "sessions evicted", json_pack("{s:i}", "count", ev));
        }
    }
}

/* /ready answers 503 from now on; in-flight requests finish until
 * drain_timeout, then are cancelled (answered 503). */
static void drain(nc_server *srv, const sigset_t *sigs, int sig)
{
    atomic_store(&srv->draining, 1);
    sd_notify(0, "STOPPING=1");
    slog(SLOG_INFO, "draining", json_pack("{s:s,s:I}", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                                          "inflight", (json_int_t)atomic_load(&srv->inflight)));
    /* Scale-out: keep serving while the balancer notices /ready (drain_grace),
     * then hand the sessions to the peers (migrate.h); requests for them
     * arriving later are answered session_moved and retried elsewhere. */
    for (double until = nc_now_s() + srv->cfg.drain_grace_s; nc_now_s() < until;)
        drain_wait(sigs, 50);
    int kept = 0, handed = migrate_drain(srv, &kept);
    if (handed || kept)
        slog(kept ? SLOG_WARN : SLOG_INFO, "sessions handed over",
             json_pack("{s:i,s:i}", "handed", handed, "kept", kept));
    double drain_end = nc_now_s() + srv->cfg.drain_timeout_s;
    while (atomic_load(&srv->inflight) > 0 && nc_now_s() < drain_end)
        drain_wait(sigs, 10);
    if (atomic_load(&srv->inflight) > 0) {
        /* What still runs is stopped within one slice and answered 503;
         * queued heavy requests are answered at once. */
        slog(SLOG_WARN, "drain timeout: cancelling",
             json_pack("{s:I}", "inflight", (json_int_t)atomic_load(&srv->inflight)));
        workguard_cancel_all();
        for (double until = nc_now_s() + 1.0; atomic_load(&srv->inflight) > 0 && nc_now_s() < until;)
            drain_wait(sigs, 10);
    }
    /* The workers are idle (or their requests' answers are on the way):
     * anything arriving from now on is refused at once. */
    workguard_cancel_all();
}

/* Stops the threads and closes everything, namespaces last but the model:
 * their final snapshots. Returns the number of sessions dropped. */
static long shut_down(nc_server *srv)
{
    /* Batches still queued finish and resume their connections before the
     * HTTP daemon stops (it must not stop with suspended connections); a
     * predict arriving meanwhile runs inline. */
    batcher_stop(srv->batcher);
    http_stop(srv);
    batcher_free(srv->batcher);
    srv->batcher = NULL;
    workpool_free(srv->pool);
    srv->pool = NULL;
    replication_stop(srv);   /* publishes what is queued; before the namespaces close */
    long count = 0;
    sessions_stats(srv->sessions, &count, NULL);
    sessions_free(srv->sessions);
    uploads_shutdown(srv);   /* no upload runs: the HTTP daemon stopped */
    namespaces_shutdown(srv);   /* after the sessions: they hold namespaces */
    replication_shutdown(srv);
    migrate_shutdown(srv);
    model_free(srv->model);
    auth_shutdown(srv);
    return count;
}

int main(int argc, char **argv)
{
    static nc_server srv;
    char err[2048] = "";
    /* neurocached backup|restore: the files of a data directory, no server */
    if (argc > 1 && (!strcmp(argv[1], "backup") || !strcmp(argv[1], "restore")))
        return backup_cli_main(argc - 1, argv + 1);
    memstats_tune_malloc();   /* before the daemon's threads allocate */
    config_defaults(&srv.cfg);
    int rc = config_from_args(&srv.cfg, argc, argv, err, sizeof err);
    if (rc == 1) {
        config_usage(stdout);
        return 0;
    }
    if (rc != 0 || cache_defaults_from_config(&srv.cfg, &srv.cache_defaults, err, sizeof err) != 0 ||
        vm_simd_init(err, sizeof err) != NC_OK) {
        fprintf(stderr, "neurocached: %s\n", err);
        return 2;
    }
    slog_init(srv.cfg.log_format, srv.cfg.log_level);
    /* Hardening (auth.h): no root unless allowed, API keys. Fault simulation
     * (core/base/fault.h) is armed only by tests, through the environment. */
    if (nc_fault_from_spec(getenv("NEUROCACHE_FAULT")) != 0)
        return startup_failed("bad NEUROCACHE_FAULT", NULL);
    if (auth_startup(&srv, err, sizeof err) != 0)
        return startup_failed(err, NULL);
    sigset_t sigs;
    take_signals(&sigs);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* a model directory that is plainly wrong stops start-up before the
     * port is announced ("listening" then "startup failed" read as a
     * daemon that started); the model itself loads while /health answers */
    if (model_probe(srv.cfg.model, err, sizeof err) != NC_OK)
        return startup_failed(err, "model");
    /* a failed start-up closes the socket and exits: nothing was acknowledged */
    if (start_listening(&srv, err, sizeof err) != 0 || load_and_recover(&srv, err, sizeof err) != 0) {
        http_stop(&srv);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    atomic_store(&srv.ready, 1);
    char desc[256];
    slog(SLOG_INFO, "ready",
         json_pack("{s:s,s:i,s:i,s:i,s:f,s:s}", "model", srv.cfg.model, "vocab_size",
                   srv.model->cfg.vocab_size, "hidden_size", srv.model->cfg.hidden_size, "num_layers",
                   srv.model->cfg.num_layers,
                   "load_seconds", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9,
                   "cache", cache_params_describe(&srv.cache_defaults, desc, sizeof desc)));
    sd_notify(0, "READY=1");

    int sig = serve_until_signal(&srv, &sigs);
    /* SIGTERM exits within drain_grace + drain_timeout + 2 s whatever runs:
     * the watchdog sees to the last part. */
    watchdog.at = nc_now_s() + srv.cfg.drain_grace_s + srv.cfg.drain_timeout_s + 1.8;
    pthread_t wd;
    bool wd_started = pthread_create(&wd, NULL, watchdog_main, NULL) == 0;
    drain(&srv, &sigs, sig);
    long dropped = shut_down(&srv);
    if (wd_started) {
        pthread_mutex_lock(&watchdog.lock);
        watchdog.done = true;
        pthread_cond_signal(&watchdog.cv);
        pthread_mutex_unlock(&watchdog.lock);
        pthread_join(wd, NULL);
    }
    slog(SLOG_INFO, "stopped", json_pack("{s:i}", "sessions_dropped", (int)dropped));
    return 0;
}
