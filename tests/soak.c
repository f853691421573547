/* soak.c -- soak test of neurocached (`make soak`): starts the real daemon
 * on loopback and drives it for a bounded time from many concurrent clients
 * with the traffic of real use -- create a session, feed text (sometimes
 * adapting its namespace), predict, score documents, completions streamed
 * and whole, stream documents into a namespace, then delete the session or
 * leave it to expire (the daemon's --ttl) -- each client on a keep-alive
 * connection. Every interval it prints requests served, req/s, latency
 * p50/p99/max, 5xx and other errors, the daemon's RSS and what /metrics says
 * holds the memory (malloc's arenas in use and free, its mmapped blocks, the
 * namespaces' memory and entries, sessions); at the end a summary.
 *
 * Exits 1 on any 5xx or transport error, or when memory grew more than
 * --max-growth percent (default 2) after the warm-up: the median of the
 * second half of the measured time against the median of the first half,
 * of anonymous RSS less the namespaces' own memory and their trainings'
 * shared index tables (entries are data that must grow with use: reported
 * per entry and subtracted). A leak raises every sample, so the median;
 * the peaks of RSS, raw and less the namespaces (between trainings), are
 * printed beside it (main: why they are not the measure). It then prints each gauge at both peaks and its lowest value
 * in each half -- what grew -- and the daemon's malloc_info totals (SIGUSR1).
 * The warm-up (default 180 s = three rotations) lets the namespaces reach
 * their steady size. Namespaces rotate (see ns_gen), which also makes
 * namespace deletion part of the traffic. */
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon.h"

static struct {
    int seconds, clients, interval, warmup, ns_rotate, namespaces;
    int mixed;                    /* completions too, and sessions left to expire */
    int ttl;                      /* the daemon's idle session TTL (s) */
    double max_growth;
    const char *model, *csv, *from_csv;
    int port;                     /* an already running daemon (0 = start one) */
    pid_t pid;                    /* its pid for RSS (0 = unknown) */
} opt = {600, 16, 30, 180, 60, 1, 1, 30, 2.0, NULL, NULL, NULL, 0, 0};

static atomic_int stop;
/* Namespace generation: sessions and streams use "soak<gen>"; the main loop
 * moves to the next one every --ns-rotate seconds and deletes the one before
 * the previous (its sessions are gone by then), so the namespaces' data stay
 * bounded and RSS growth measures leaks, not the unbounded cache filling. */
static atomic_int ns_gen;

/* Latencies of the current window (seconds), under lock. */
static pthread_mutex_t lat_lock = PTHREAD_MUTEX_INITIALIZER;
static double *lat;
static size_t nlat, caplat;
static long win_5xx, win_4xx, win_429, win_transport;
static long tot_req, tot_5xx, tot_4xx, tot_429, tot_transport;
static double *all_lat;           /* every latency, for the overall percentiles */
static size_t nall, capall;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void record(double dt, long status, int transport_failed)
{
    pthread_mutex_lock(&lat_lock);
    if (nlat == caplat) {
        caplat = caplat ? 2 * caplat : 65536;
        lat = realloc(lat, caplat * sizeof *lat);
    }
    if (nall == capall) {
        capall = capall ? 2 * capall : 65536;
        all_lat = realloc(all_lat, capall * sizeof *all_lat);
    }
    if (!lat || !all_lat) {
        fprintf(stderr, "soak: out of memory\n");
        exit(2);
    }
    lat[nlat++] = dt;
    all_lat[nall++] = dt;
    tot_req++;
    if (transport_failed) {
        win_transport++;
        tot_transport++;
    } else if (status >= 500) {
        win_5xx++;
        tot_5xx++;
    } else if (status == 429) {
        win_429++;
        tot_429++;
    } else if (status >= 400) {
        win_4xx++;
        tot_4xx++;
    }
    pthread_mutex_unlock(&lat_lock);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)ceil(p * (double)n) - 1;
    return v[i < n ? i : n - 1];
}

static long rss_kb(pid_t pid)
{
    if (pid <= 0)
        return -1;
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* ---- one client ---------------------------------------------------------- */

typedef struct {
    CURL *c;
    char *buf;
    size_t len, cap;
    unsigned seed;
    int idx;
    char last_error[512];
} client;

static size_t on_body(char *p, size_t size, size_t nmemb, void *user)
{
    client *cl = user;
    size_t n = size * nmemb;
    if (cl->len + n + 1 > cl->cap) {
        size_t cap = cl->cap ? cl->cap : 4096;
        while (cap < cl->len + n + 1) cap *= 2;
        char *nb = realloc(cl->buf, cap);
        if (!nb)
            return 0;
        cl->buf = nb;
        cl->cap = cap;
    }
    memcpy(cl->buf + cl->len, p, n);
    cl->len += n;
    cl->buf[cl->len] = 0;
    return n;
}

/* One request on the client's keep-alive connection; returns the status
 * (-1 = transport failure) and records it. */
static long request(client *cl, const char *method, const char *path, const char *ctype,
                    const char *body)
{
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", opt.port, path);
    struct curl_slist *h = NULL;
    char cth[128];
    snprintf(cth, sizeof cth, "Content-Type: %s", ctype ? ctype : "application/json");
    h = curl_slist_append(h, cth);
    h = curl_slist_append(h, "Expect:");
    cl->len = 0;
    if (cl->buf) cl->buf[0] = 0;
    curl_easy_setopt(cl->c, CURLOPT_URL, url);
    curl_easy_setopt(cl->c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cl->c, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(cl->c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(cl->c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    } else {
        curl_easy_setopt(cl->c, CURLOPT_POSTFIELDS, NULL);
        curl_easy_setopt(cl->c, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(cl->c, CURLOPT_CUSTOMREQUEST, method);
    }
    double t0 = now();
    CURLcode rc = curl_easy_perform(cl->c);
    double dt = now() - t0;
    long status = -1;
    if (rc == CURLE_OK)
        curl_easy_getinfo(cl->c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    record(dt, status, rc != CURLE_OK);
    if (rc != CURLE_OK)
        snprintf(cl->last_error, sizeof cl->last_error, "%s %s: %s", method, path, curl_easy_strerror(rc));
    else if (status >= 500)
        snprintf(cl->last_error, sizeof cl->last_error, "%s %s: %ld %.300s", method, path, status,
                 cl->buf ? cl->buf : "");
    return rc == CURLE_OK ? status : -1;
}

/* Penn Treebank's most frequent words (all in the demo model's vocabulary;
 * a smaller model maps the rest to <unk>). */
static const char *const words[] = {
    "the", "N", "of", "to", "a", "in", "and", "'s", "that", "for", "$", "is", "it", "said", "on",
    "by", "at", "as", "from", "with", "million", "mr.", "was", "be", "are", "its", "he", "but",
    "has", "an", "n't", "will", "have", "new", "or", "company", "they", "this", "year", "which",
    "would", "about", "says", "more", "were", "market", "billion", "his", "stock", "had", "up",
    "one", "than", "who", "been", "also", "other", "share", "i", "not", "we", "corp.", "some",
    "new", "years", "could", "after", "shares", "there", "all", "trading", "last", "president"};

static void sentence(client *cl, char *out, size_t cap, int n, bool newline)
{
    size_t o = 0;
    for (int i = 0; i < n && o + 32 < cap; i++) {
        const char *w = words[rand_r(&cl->seed) % (sizeof words / sizeof words[0])];
        o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? " " : "", w);
    }
    if (newline && o + 2 < cap) {
        out[o++] = '\n';
        out[o] = 0;
    }
}

/* JSON string of text (escapes '\n' and '"' -- the only ones it holds). */
static void json_text(const char *text, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = text; *p && o + 3 < cap; p++) {
        if (*p == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if (*p == '"' || *p == '\\') { out[o++] = '\\'; out[o++] = *p; }
        else out[o++] = *p;
    }
    out[o] = 0;
}

/* A completion of a short prompt, streamed (server-sent events, read to the
 * end like any body) or whole. */
static void completion(client *cl, bool stream)
{
    char text[256], jt[512], body[1024];
    sentence(cl, text, sizeof text, 6, false);
    json_text(text, jt, sizeof jt);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":8,\"temperature\":0.8,\"seed\":%u%s}", jt,
             (unsigned)rand_r(&cl->seed) % 1000u, stream ? ",\"stream\":true" : "");
    request(cl, "POST", "/v1/completions", NULL, body);
}

static void *client_main(void *arg)
{
    client *cl = arg;
    cl->c = curl_easy_init();
    curl_easy_setopt(cl->c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(cl->c, CURLOPT_WRITEDATA, cl);
    curl_easy_setopt(cl->c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(cl->c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(cl->c, CURLOPT_TCP_KEEPALIVE, 1L);
    /* Half the clients work in namespace "soak" with the unbounded cache. */
    bool ns = opt.namespaces && cl->idx % 2 == 0;
    char text[1024], jt[2048], body[4096], path[256], id[128];
    double last_abandon = -1e9;   /* when this client last left a session to expire */
    for (unsigned life = 0; !atomic_load(&stop); life++) {
        int gen = atomic_load(&ns_gen);
        if (ns)
            snprintf(body, sizeof body,
                     "{\"namespace\":\"soak%d\",\"cache\":{\"neural_size\":500,\"unigram_size\":500,\"unbounded\":true}}",
                     gen);
        else
            snprintf(body, sizeof body, "{\"cache\":{\"neural_size\":500,\"unigram_size\":500}}");
        if (request(cl, "POST", "/v1/sessions", NULL, body) != 201) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        json_t *j = json_loads(cl->buf, 0, NULL);
        snprintf(id, sizeof id, "%s", j ? json_string_value(json_object_get(j, "id")) : "");
        json_decref(j);
        for (int round = 0; round < 10 && !atomic_load(&stop); round++) {
            sentence(cl, text, sizeof text, 5 + rand_r(&cl->seed) % 20, rand_r(&cl->seed) % 3 == 0);
            json_text(text, jt, sizeof jt);
            bool adapt = ns && round % 5 == 4;
            snprintf(body, sizeof body, "{\"text\":\"%s\",\"scores\":%s%s}", jt, round % 2 ? "true" : "false",
                     adapt ? ",\"adapt\":true" : "");
            snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
            request(cl, "POST", path, NULL, body);
            snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
            request(cl, "POST", path, NULL, round % 4 == 3 ? "{\"top_k\":100,\"components\":true}" : "{\"top_k\":10}");
            if (round % 5 == 0) {
                sentence(cl, text, sizeof text, 40, true);
                json_text(text, jt, sizeof jt);
                snprintf(body, sizeof body, "{\"text\":\"%s\",\"cache\":{\"neural_size\":100}}", jt);
                request(cl, "POST", "/v1/score", NULL, body);
            }
            if (opt.mixed && round % 5 == 2)
                completion(cl, (cl->idx + round / 5) % 2 == 0);
            if (ns && cl->idx % 4 == 0 && round == 9) {
                /* Stream a small document into the namespace. */
                size_t o = 0;
                for (int l = 0; l < 20; l++) {
                    sentence(cl, text, sizeof text, 12, true);
                    o += (size_t)snprintf(body + o, sizeof body - o, "%s", text);
                    if (o + 200 > sizeof body) break;
                }
                snprintf(path, sizeof path, "/v1/namespaces/soak%d/documents", gen);
                request(cl, "POST", path, "text/plain", body);
            }
        }
        /* Every fourth session of a mixed soak is left to expire (the
         * daemon's --ttl), the others are deleted -- one at a time per
         * client (the last has expired), so that the sessions alive depend
         * on the clients, not on how fast a loaded machine serves them (the
         * first 30-minute run left 20 to 69 alive as its rate rose). */
        if (opt.mixed && (life + (unsigned)cl->idx) % 4 == 0 && now() - last_abandon > opt.ttl + 5) {
            last_abandon = now();
            continue;
        }
        snprintf(path, sizeof path, "/v1/sessions/%s", id);
        request(cl, "DELETE", path, NULL, NULL);
    }
    curl_easy_cleanup(cl->c);
    free(cl->buf);
    return NULL;
}

/* ---- what the daemon says its memory holds ----------------------------------- */

/* Gauges of the daemon's /metrics sampled every window, so that a failed soak
 * says what grew. label: the series' exact label set, or NULL = the sum of
 * every series of the name (one per namespace). */
enum { G_ANON, G_FILE, G_ARENA_USED, G_ARENA_FREE, G_MMAPPED, G_ARENAS, G_THREADS, G_SERIES, G_SESSIONS,
       G_SESSION_BYTES, G_NAMESPACES, G_NS_ENTRIES, G_NS_BYTES, G_TABLES, G_TRAINING, NGAUGE };
static const struct {
    const char *name, *label, *title;
    double unit;                  /* divisor for printing (bytes as MB) */
} gauges[NGAUGE] = {
    {"neurocache_process_resident_bytes", "kind=\"anon\"", "RSS anonymous (MB)", 1e6},
    {"neurocache_process_resident_bytes", "kind=\"file\"", "RSS file-backed (MB)", 1e6},
    {"neurocache_malloc_bytes", "state=\"arena_in_use\"", "malloc arenas in use (MB)", 1e6},
    {"neurocache_malloc_bytes", "state=\"arena_free\"", "malloc arenas free (MB)", 1e6},
    {"neurocache_malloc_bytes", "state=\"mmapped\"", "malloc mmapped blocks (MB)", 1e6},
    {"neurocache_malloc_arenas", NULL, "malloc arenas", 1},
    {"neurocache_process_threads", NULL, "threads", 1},
    {"neurocache_metrics_series", NULL, "metrics series", 1},
    {"neurocache_sessions_active", NULL, "sessions", 1},
    {"neurocache_session_memory_bytes", NULL, "session memory (MB)", 1e6},
    {"neurocache_namespaces", NULL, "namespaces", 1},
    {"neurocache_namespace_entries", NULL, "namespace entries", 1},
    {"neurocache_namespace_memory_bytes", NULL, "namespace memory (MB)", 1e6},
    /* the trainings' shared IVF-PQ tables: namespace memory that is not in
     * the namespaces' own bytes (one table a training, however many namespaces) */
    {"neurocache_index_tables_bytes", NULL, "index tables (MB)", 1e6},
    /* namespaces whose index is training: their buffers are in the namespace
     * memory, but malloc's own share of them is not (below, between trainings) */
    {"neurocache_namespace_index_training_in_progress", NULL, "trainings in progress", 1},
};

/* The sum of the series of name (with exactly {label} when label is set) in
 * an exposition; NAN when none. */
static double metric_value(const char *text, const char *name, const char *label)
{
    double sum = NAN;
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) != 0)
            continue;
        const char *q = p + n;
        if (label) {
            size_t l = strlen(label);
            if (q[0] != '{' || strncmp(q + 1, label, l) != 0 || q[1 + l] != '}')
                continue;
            q += l + 2;
        } else if (*q == '{') {
            q = strchr(q, '}');
            if (!q) break;
            q++;
        }
        if (*q != ' ')
            continue;
        double v = strtod(q + 1, NULL);
        sum = isnan(sum) ? v : sum + v;
    }
    return sum;
}

/* Samples every gauge (NAN each when /metrics does not answer). */
static void sample_gauges(client *admin, double *g)
{
    long st = request(admin, "GET", "/metrics", NULL, NULL);
    for (int i = 0; i < NGAUGE; i++)
        g[i] = st == 200 && admin->buf ? metric_value(admin->buf, gauges[i].name, gauges[i].label) : NAN;
    if (st == 200 && admin->buf && isnan(g[G_NS_ENTRIES]))
        g[G_NS_ENTRIES] = g[G_NS_BYTES] = 0;   /* no namespace open */
    if (st == 200 && admin->buf && isnan(g[G_TABLES]))
        g[G_TABLES] = 0;
    if (st == 200 && admin->buf && isnan(g[G_TRAINING]))
        g[G_TRAINING] = 0;
}

/* On a failure: asks the daemon for its memory report (SIGUSR1: malloc_info
 * in its log) and prints the report's totals, after the last arena's. */
static void print_malloc_report(const nc_daemon *d)
{
    if (opt.pid <= 0 || kill(opt.pid, SIGUSR1) != 0)
        return;
    sleep(2);                     /* the main thread takes it within a second */
    FILE *f = d->log[0] ? fopen(d->log, "r") : NULL;
    if (!f)
        return;
    char *line = NULL, *last = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0)
        if (strstr(line, "memory report (SIGUSR1)")) {
            free(last);
            last = strdup(line);
        }
    free(line);
    fclose(f);
    json_t *j = last ? json_loads(last, 0, NULL) : NULL;
    const char *xml = json_string_value(json_object_get(j, "malloc_info"));
    const char *tail = xml ? strstr(xml, "</heap>") : NULL;
    for (const char *p = tail; p && (p = strstr(p + 1, "</heap>"));)
        tail = p;
    if (tail)
        printf("daemon's malloc_info totals (all arenas):\n%s", tail + strlen("</heap>\n"));
    json_decref(j);
    free(last);
}

/* ---- main ------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: soak [--seconds N] [--clients N] [--interval S] [--warmup S] [--model DIR]\n"
                    "            [--port P --pid PID] [--max-growth PCT] [--csv FILE] [--ns-rotate S]\n"
                    "            [--namespaces 0|1] [--mixed 0|1] [--ttl S]\n"
                    "       soak --from-csv FILE [--warmup S] [--max-growth PCT]   (a run's memory verdict)\n");
}

/* Median of the first and of the second half of the windows after warm-up
 * (NAN samples skipped; NAN when a half has none). */
static void half_medians(const double *t, const double *v, size_t n, double warmup, double *m1, double *m2)
{
    double *a = malloc((n ? n : 1) * sizeof *a), *b = malloc((n ? n : 1) * sizeof *b);
    size_t na = 0, nb = 0;
    for (size_t i = 0; a && b && i < n; i++)
        if (!isnan(v[i])) {
            if (t[i] < (warmup + t[n - 1]) / 2) a[na++] = v[i];
            else b[nb++] = v[i];
        }
    if (a && b) {
        qsort(a, na, sizeof *a, cmp_double);
        qsort(b, nb, sizeof *b, cmp_double);
    }
    *m1 = na ? (na % 2 ? a[na / 2] : (a[na / 2 - 1] + a[na / 2]) / 2) : NAN;
    *m2 = nb ? (nb % 2 ? b[nb / 2] : (b[nb / 2 - 1] + b[nb / 2]) / 2) : NAN;
    free(a);
    free(b);
}

/* Least squares v ~ c0 + c1 t + c2 e over n samples (t and e centred, so
 * the 3 x 3 normal equations stay well conditioned): *bt the slope in t,
 * *be in e. Returns -1 when they are singular (t or e constant, or t and
 * e in proportion). A diagnostic beside the medians: how much v moves
 * with time at constant namespace size, which the halves' medians mix
 * with the halves' different namespaces. */
static int trend_fit(const double *t, const double *e, const double *v, size_t n, double *bt, double *be)
{
    double mt = 0, me = 0, mv = 0;
    for (size_t i = 0; i < n; i++)
        mt += t[i] / (double)n, me += e[i] / (double)n, mv += v[i] / (double)n;
    double stt = 0, see = 0, ste = 0, stv = 0, sev = 0;
    for (size_t i = 0; i < n; i++) {
        double a = t[i] - mt, b = e[i] - me, c = v[i] - mv;
        stt += a * a, see += b * b, ste += a * b, stv += a * c, sev += b * c;
    }
    double det = stt * see - ste * ste;
    if (n < 3 || stt <= 0 || see <= 0 || det <= 1e-12 * stt * see)
        return -1;
    *bt = (stv * see - sev * ste) / det;
    *be = (sev * stt - stv * ste) / det;
    return 0;
}

/* --from-csv FILE: the memory verdict of a run from its CSV (--csv; an
 * endurance run keeps its own), after --warmup seconds: the median of
 * each half of anon RSS less the namespaces' memory and tables, as main
 * judges a live run. */
static int verdict_from_csv(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[8192];
    if (!f || !fgets(line, sizeof line, f)) {
        fprintf(stderr, "soak: %s: cannot read\n", path);
        if (f) fclose(f);
        return 2;
    }
    int ct = -1, ca = -1, cn = -1, cb = -1, ce = -1, ctr = -1, col = 0;
    for (char *save = NULL, *h = strtok_r(line, ",\n", &save); h; h = strtok_r(NULL, ",\n", &save), col++) {
        if (!strcmp(h, "t_s")) ct = col;
        else if (!strcmp(h, "process_resident_bytes:anon")) ca = col;
        else if (!strcmp(h, "namespace_memory_bytes")) cn = col;
        else if (!strcmp(h, "index_tables_bytes")) cb = col;
        else if (!strcmp(h, "namespace_entries")) ce = col;
        else if (!strcmp(h, "namespace_index_training_in_progress")) ctr = col;
    }
    double *t = NULL, *v = NULL, *e = NULL;
    bool *training = NULL;
    size_t n = 0;
    while (ct >= 0 && ca >= 0 && cn >= 0 && fgets(line, sizeof line, f)) {
        double x[6] = {NAN, NAN, 0, 0, 0, 0};
        col = 0;
        for (char *p = line; p; p = strchr(p, ','), p = p ? p + 1 : NULL, col++) {
            double d = strtod(p, NULL);
            if (col == ct) x[0] = d;
            else if (col == ca) x[1] = d;
            else if (col == cn) x[2] = isnan(d) ? 0 : d;
            else if (col == cb) x[3] = isnan(d) ? 0 : d;
            else if (col == ce) x[4] = isnan(d) ? 0 : d;
            else if (col == ctr) x[5] = isnan(d) ? 0 : d;
        }
        if (isnan(x[0]) || x[0] < opt.warmup)
            continue;
        t = realloc(t, (n + 1) * sizeof *t), v = realloc(v, (n + 1) * sizeof *v);
        e = realloc(e, (n + 1) * sizeof *e), training = realloc(training, (n + 1) * sizeof *training);
        training[n] = x[5] > 0;
        t[n] = x[0], e[n] = x[4], v[n++] = (x[1] - x[2] - x[3]) / 1024;
    }
    fclose(f);
    double m1, m2;
    half_medians(t, v, n, opt.warmup, &m1, &m2);
    double g = 100.0 * (m2 - m1) / m1;
    printf("%s: %zu samples after %d s: rss anon less the namespaces' memory: median %.0f kB in the first half, "
           "%.0f kB in the second: growth %.2f%% (limit %.1f%%)\n", path, n, opt.warmup, m1, m2, g, opt.max_growth);
    /* the fit, on the samples without a training (its buffers come and go) */
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        if (!training[i])
            t[nf] = t[i], e[nf] = e[i], v[nf++] = v[i];
    double bt, be;
    if (trend_fit(t, e, v, nf, &bt, &be) == 0) {
        double half = (t[nf - 1] - opt.warmup) / 2;
        printf("%s: fitted on time and namespace entries (%zu samples without a training; not the verdict): "
               "%+.0f kB per 1000 s at constant entries, %+.0f kB per 100,000 entries; over a half's span "
               "(%.0f s) %+.2f%% of the first half's median\n",
               path, nf, bt * 1000, be * 1e5, half, 100.0 * bt * half / m1);
    }
    free(t);
    free(v);
    free(e);
    free(training);
    return isfinite(g) && g <= opt.max_growth ? 0 : 1;
}

/* Peak of the first and of the second half of the windows after warm-up:
 * the index of each in *i1, *i2 (-1 = none). */
static void half_peaks(const double *t, const double *v, size_t n, double warmup, long *i1, long *i2)
{
    *i1 = *i2 = -1;
    for (size_t i = 0; i < n; i++) {
        long *pk = t[i] < (warmup + t[n - 1]) / 2 ? i1 : i2;
        if (*pk < 0 || v[i] > v[*pk]) *pk = (long)i;
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "--seconds")) opt.seconds = atoi(v);
        else if (!strcmp(a, "--clients")) opt.clients = atoi(v);
        else if (!strcmp(a, "--interval")) opt.interval = atoi(v);
        else if (!strcmp(a, "--warmup")) opt.warmup = atoi(v);
        else if (!strcmp(a, "--ns-rotate")) opt.ns_rotate = atoi(v);
        else if (!strcmp(a, "--namespaces")) opt.namespaces = atoi(v);
        else if (!strcmp(a, "--mixed")) opt.mixed = atoi(v);
        else if (!strcmp(a, "--ttl")) opt.ttl = atoi(v);
        else if (!strcmp(a, "--model")) opt.model = v;
        else if (!strcmp(a, "--port")) opt.port = atoi(v);
        else if (!strcmp(a, "--pid")) opt.pid = (pid_t)atoi(v);
        else if (!strcmp(a, "--max-growth")) opt.max_growth = atof(v);
        else if (!strcmp(a, "--csv")) opt.csv = v;
        else if (!strcmp(a, "--from-csv")) opt.from_csv = v;
        else { usage(); return 2; }
    }
    if (opt.from_csv)
        return verdict_from_csv(opt.from_csv);
    if (opt.seconds <= 0 || opt.clients <= 0 || opt.interval <= 0 || opt.ttl <= 0 || (!opt.model && !opt.port)) {
        usage();
        return 2;
    }
    if (opt.warmup >= opt.seconds)
        opt.warmup = opt.seconds / 10;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    nc_daemon d;
    memset(&d, 0, sizeof d);
    if (!opt.port) {
        char ttl[16];
        snprintf(ttl, sizeof ttl, "%d", opt.ttl);
        const char *args[] = {"--model", opt.model, "--max-sessions", "100000", "--log-level", "warn", "--ttl", ttl,
                              NULL};
        if (daemon_start(&d, args) != 0) {
            fprintf(stderr, "soak: the daemon did not start\n");
            return 2;
        }
        opt.port = d.port;
        opt.pid = d.pid;
    }
    FILE *csv = opt.csv ? fopen(opt.csv, "w") : NULL;
    if (csv) {
        fprintf(csv, "t_s,requests,req_per_s,p50_ms,p99_ms,max_ms,status_5xx,status_4xx,status_429,transport,rss_kb");
        for (int i = 0; i < NGAUGE; i++) {
            /* name:value of the label, e.g. malloc_bytes:arena_free */
            const char *v = gauges[i].label ? strchr(gauges[i].label, '"') + 1 : "";
            fprintf(csv, ",%s%s%.*s", gauges[i].name + strlen("neurocache_"), gauges[i].label ? ":" : "",
                    (int)strcspn(v, "\""), v);
        }
        fprintf(csv, "\n");
    }
    printf("soak: %d clients, %d s, model %s, port %d (loopback), %s traffic\n", opt.clients, opt.seconds,
           opt.model ? opt.model : "(running daemon)", opt.port, opt.mixed ? "mixed" : "basic");
    printf("%7s %9s %8s %8s %8s %8s %5s %5s %5s %5s %9s %7s %7s %7s %7s %8s %7s\n", "t_s", "requests", "req/s",
           "p50_ms", "p99_ms", "max_ms", "5xx", "4xx", "429", "xport", "rss_kb", "use_MB", "free_MB", "mmap_MB",
           "ns_MB", "entries", "sess");
    fflush(stdout);
    long rss0 = rss_kb(opt.pid), rss_warm = -1, rss_end = -1;
    /* every window after the warm-up: time, RSS (kB), gauges */
    double *rss_t = NULL, *rss_v = NULL, *net_v = NULL, *anet_v = NULL, (*gv)[NGAUGE] = NULL;
    size_t nrss = 0;

    client *cls = calloc((size_t)opt.clients, sizeof *cls);
    pthread_t *th = calloc((size_t)opt.clients, sizeof *th);
    for (int i = 0; i < opt.clients; i++) {
        cls[i].idx = i;
        cls[i].seed = 12345u + (unsigned)i * 7919u;
        pthread_create(&th[i], NULL, client_main, &cls[i]);
    }
    double t0 = now(), next = t0 + opt.interval, next_rotate = t0 + opt.ns_rotate;
    double *snap = NULL;
    client admin = {.idx = -1};
    admin.c = curl_easy_init();
    curl_easy_setopt(admin.c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(admin.c, CURLOPT_WRITEDATA, &admin);
    curl_easy_setopt(admin.c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(admin.c, CURLOPT_NOSIGNAL, 1L);
    for (;;) {
        double t = now();
        if (opt.ns_rotate > 0 && t >= next_rotate) {
            int g = atomic_fetch_add(&ns_gen, 1) + 1;
            if (g >= 2) {
                char path[128];
                snprintf(path, sizeof path, "/v1/namespaces/soak%d?confirm=soak%d", g - 2, g - 2);
                long st = request(&admin, "DELETE", path, NULL, NULL);
                if (st != 200 && st != 404)
                    fprintf(stderr, "soak: deleting namespace soak%d: %ld %s\n", g - 2, st, admin.buf ? admin.buf : "");
            }
            next_rotate += opt.ns_rotate;
        }
        if (t < next) {
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        pthread_mutex_lock(&lat_lock);
        size_t n = nlat;
        snap = realloc(snap, (n ? n : 1) * sizeof *snap);
        memcpy(snap, lat, n * sizeof *snap);
        long e5 = win_5xx, e4 = win_4xx, e429 = win_429, ex = win_transport;
        nlat = 0;
        win_5xx = win_4xx = win_429 = win_transport = 0;
        pthread_mutex_unlock(&lat_lock);
        qsort(snap, n, sizeof *snap, cmp_double);
        long rss = rss_kb(opt.pid);
        double g[NGAUGE];
        sample_gauges(&admin, g);
        double el = t - t0;
        if (rss_warm < 0 && el >= opt.warmup)
            rss_warm = rss;
        rss_end = rss;
        if (el >= opt.warmup && rss > 0) {
            rss_t = realloc(rss_t, (nrss + 1) * sizeof *rss_t);
            rss_v = realloc(rss_v, (nrss + 1) * sizeof *rss_v);
            net_v = realloc(net_v, (nrss + 1) * sizeof *net_v);
            anet_v = realloc(anet_v, (nrss + 1) * sizeof *anet_v);
            gv = realloc(gv, (nrss + 1) * sizeof *gv);
            if (!rss_t || !rss_v || !net_v || !anet_v || !gv) {
                fprintf(stderr, "soak: out of memory\n");
                return 2;
            }
            rss_t[nrss] = el;
            rss_v[nrss] = (double)rss;
            /* namespace entries and their trainings' tables are data, not
             * growth: their bytes come off */
            net_v[nrss] = (double)rss - (isnan(g[G_NS_BYTES]) ? 0 : g[G_NS_BYTES] / 1024) -
                          (isnan(g[G_TABLES]) ? 0 : g[G_TABLES] / 1024);
            /* the measure (below): anonymous memory less the same */
            anet_v[nrss] = g[G_ANON] / 1024 - (isnan(g[G_NS_BYTES]) ? 0 : g[G_NS_BYTES] / 1024) -
                           (isnan(g[G_TABLES]) ? 0 : g[G_TABLES] / 1024);
            memcpy(gv[nrss++], g, sizeof g);
        }
        printf("%7.0f %9zu %8.1f %8.2f %8.2f %8.2f %5ld %5ld %5ld %5ld %9ld %7.1f %7.1f %7.1f %7.1f %8.0f %7.0f\n", el,
               n, (double)n / opt.interval, 1e3 * pct(snap, n, 0.5), 1e3 * pct(snap, n, 0.99),
               1e3 * (n ? snap[n - 1] : NAN), e5, e4, e429, ex, rss, g[G_ARENA_USED] / 1e6, g[G_ARENA_FREE] / 1e6,
               g[G_MMAPPED] / 1e6, g[G_NS_BYTES] / 1e6, g[G_NS_ENTRIES], g[G_SESSIONS]);
        fflush(stdout);
        if (csv) {
            fprintf(csv, "%.0f,%zu,%.1f,%.3f,%.3f,%.3f,%ld,%ld,%ld,%ld,%ld", el, n, (double)n / opt.interval,
                    1e3 * pct(snap, n, 0.5), 1e3 * pct(snap, n, 0.99), 1e3 * (n ? snap[n - 1] : NAN), e5, e4,
                    e429, ex, rss);
            for (int i = 0; i < NGAUGE; i++)
                fprintf(csv, ",%.17g", g[i]);
            fprintf(csv, "\n");
            fflush(csv);
        }
        next += opt.interval;
        if (el >= opt.seconds - 0.5)
            break;
    }
    atomic_store(&stop, 1);
    curl_easy_cleanup(admin.c);
    free(admin.buf);
    for (int i = 0; i < opt.clients; i++)
        pthread_join(th[i], NULL);
    double el = now() - t0;
    qsort(all_lat, nall, sizeof *all_lat, cmp_double);
    long p1, p2, n1, n2;
    half_peaks(rss_t, rss_v, nrss, opt.warmup, &p1, &p2);
    half_peaks(rss_t, net_v, nrss, opt.warmup, &n1, &n2);
    double growth = p1 >= 0 && p2 >= 0 ? 100.0 * (rss_v[p2] - rss_v[p1]) / rss_v[p1] : NAN;
    double all_growth = n1 >= 0 && n2 >= 0 ? 100.0 * (net_v[n2] - net_v[n1]) / net_v[n1] : NAN;
    /* The measure: the samples between trainings. A training's buffers are
     * in the namespace gauge (unbounded_cache_memory), but not malloc's
     * share of them (its arenas' fragments of the new index's growing lists,
     * a few MB at 300k pairs: docs/memory.md), which would grow each peak as
     * the namespaces grow; a leak, in a training or elsewhere, raises the
     * samples between them as well. All samples' growth is printed too. */
    long i1 = -1, i2 = -1;
    for (size_t i = 0; i < nrss; i++) {
        long *pk = rss_t[i] < (opt.warmup + rss_t[nrss - 1]) / 2 ? &i1 : &i2;
        if (!(gv[i][G_TRAINING] > 0) && (*pk < 0 || net_v[i] > net_v[*pk])) *pk = (long)i;
    }
    if (i1 >= 0 && i2 >= 0)
        n1 = i1, n2 = i2;
    else
        printf("(no sample between trainings in a half: the measure is over all samples)\n");
    double peak_growth = n1 >= 0 && n2 >= 0 ? 100.0 * (net_v[n2] - net_v[n1]) / net_v[n1] : NAN;
    /* The verdict: the median of each half of the anonymous memory less the
     * namespaces' (and their tables'). A leak raises every sample, so the
     * median; what it leaves out: file-backed pages (the binary's and the
     * libraries' code as paths are first taken: 15.6 -> 17.3 MB over an
     * endurance run's first 1,500 s, a fixed bound, not growth) and the
     * transients a sample happens to catch (an upload's buffers, a
     * training's fragments: +-2 MB on the endurance's 40 MB replica), which
     * decide the peaks above. */
    double am1, am2;
    half_medians(rss_t, anet_v, nrss, opt.warmup, &am1, &am2);
    double net_growth = 100.0 * (am2 - am1) / am1;
    printf("\nsummary: %ld requests in %.0f s (%.1f req/s), p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", tot_req, el,
           (double)tot_req / el, 1e3 * pct(all_lat, nall, 0.5), 1e3 * pct(all_lat, nall, 0.99),
           1e3 * (nall ? all_lat[nall - 1] : NAN));
    printf("errors: %ld 5xx, %ld transport, %ld 429, %ld other 4xx\n", tot_5xx, tot_transport, tot_429, tot_4xx);
    if (p1 >= 0 && p2 >= 0 && n1 >= 0 && n2 >= 0) {
        printf("rss: start %ld kB, after %d s warm-up %ld kB, end %ld kB; peak %.0f kB in the first half after "
               "warm-up, %.0f kB in the second: growth %.2f%%\n",
               rss0, opt.warmup, rss_warm, rss_end, rss_v[p1], rss_v[p2], growth);
        printf("rss less the namespaces' memory, all samples: growth %.2f%%\n", all_growth);
        printf("rss anon less the namespaces' memory: median %.0f kB in the first half, %.0f kB in the second: "
               "growth %.2f%% (limit %.1f%%)\n", am1, am2, net_growth, opt.max_growth);
        printf("rss less the namespaces' memory, between trainings (%.0f and %.0f entries at %.0f and %.0f bytes "
               "each): peak %.0f kB in the first half, %.0f kB in the second: growth %.2f%%\n",
               gv[n1][G_NS_ENTRIES], gv[n2][G_NS_ENTRIES],
               gv[n1][G_NS_ENTRIES] > 0 ? gv[n1][G_NS_BYTES] / gv[n1][G_NS_ENTRIES] : 0,
               gv[n2][G_NS_ENTRIES] > 0 ? gv[n2][G_NS_BYTES] / gv[n2][G_NS_ENTRIES] : 0, net_v[n1], net_v[n2],
               peak_growth);
        /* what grew: each gauge at the two peaks, and its lowest value in each
         * half (a saw-tooth's low points rise when something accumulates) */
        printf("%-28s %14s %14s %14s %14s\n", "at the peaks / lows", "first peak", "second peak", "first low",
               "second low");
        for (int k = 0; k < NGAUGE; k++) {
            double lo1 = NAN, lo2 = NAN;
            for (size_t i = 0; i < nrss; i++) {
                double *lo = rss_t[i] < (opt.warmup + rss_t[nrss - 1]) / 2 ? &lo1 : &lo2;
                if (!isnan(gv[i][k]) && (isnan(*lo) || gv[i][k] < *lo)) *lo = gv[i][k];
            }
            printf("%-28s %14.2f %14.2f %14.2f %14.2f\n", gauges[k].title, gv[n1][k] / gauges[k].unit,
                   gv[n2][k] / gauges[k].unit, lo1 / gauges[k].unit, lo2 / gauges[k].unit);
        }
    }
    for (int i = 0; i < opt.clients; i++)
        if (cls[i].last_error[0])
            printf("client %d last error: %s\n", i, cls[i].last_error);
    int fail = tot_5xx > 0 || tot_transport > 0 || (isfinite(net_growth) && net_growth > opt.max_growth);
    if (isfinite(net_growth) && net_growth > opt.max_growth)
        print_malloc_report(&d);
    if (d.pid > 0) {
        int st = daemon_stop(&d);
        printf("daemon exit status %d\n", st);
        if (st != 0) fail = 1;
    }
    if (csv) fclose(csv);
    printf("%s\n", fail ? "SOAK FAILED" : "SOAK OK");
    free(cls);
    free(th);
    free(snap);
    free(rss_t);
    free(rss_v);
    free(net_v);
    free(anet_v);
    free(gv);
    free(lat);
    free(all_lat);
    curl_global_cleanup();
    return fail;
}
