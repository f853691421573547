/* bench_backup.c -- online backup of a 1M-pair namespace under load (issue
 * 38's acceptance; scripts/bench_backup.sh runs it, BENCHMARKS.md#backup
 * holds its figures):
 *
 *  fill     (once, when --seed DIR has no namespace yet) a daemon on DIR
 *           is given the corpora (--corpus F1,F2: documents of --doc-lines
 *           lines, 2 uploaders) until the namespace holds --pairs pairs;
 *           then it waits until the namespace's own index training is done
 *           and none is due, uploads one more pair and stops the daemon
 *           cleanly (so that its snapshot holds the trained index).
 *  measure  a copy of the seed (--run DIR) served by bin/neurocached
 *           (NEUROCACHE_BIN) with --snapshot-period 0 (no periodic
 *           snapshot lands in a window by chance): --readers sessions
 *           reading the namespace (unbounded cache, a new word in each
 *           predict's "text", keep-alive) and --uploaders clients
 *           uploading --upload-words-word documents into it (a pause of
 *           --upload-pause-ms between two), then --rounds rounds of a
 *           window without a backup (--window seconds) and one with (from
 *           POST /v1/admin/backup until its answer), alternated so that
 *           the machine's other load falls on both alike. The readers'
 *           p50/p99 of each window by the request's start, and pooled;
 *           and a monitor's GET /metrics and session creation every 2 s
 *           (requests that take the namespace registry's lock), slowest
 *           without and during a backup.
 *  compare  (--compare 1) the uploaders paused and their last upload
 *           answered, the original's predictions for --probes texts read
 *           (the readers go on), a backup taken; `neurocache restore` of
 *           it into a fresh data directory and a daemon started there:
 *           the same pairs and, probe by probe, the same predictions
 *           (JSON-equal: bit for bit). The uploaders are paused only for
 *           this backup: under writes the original moves past the
 *           backup's position, and at 1M pairs a reference daemon given
 *           the same documents (test_backup's method) costs an hour of
 *           LSTM work. Backups taken under load are checked by
 *           `neurocache restore --verify-only` (the manifest, every file's
 *           size and CRC) of the last one, and their pairs against the
 *           acknowledged uploads (every upload answered before the backup
 *           was asked for is in it).
 *
 * usage: bench_backup --model DIR --seed DIR --run DIR --corpus F1[,F2..] [--pairs 1000000]
 *        [--doc-lines 2000] [--readers 16] [--uploaders 2] [--rounds 6] [--window 10] [--warmup 10]
 *        [--upload-text FILE] [--upload-words 1000] [--upload-pause-ms 200] [--compare 0|1]
 *        [--probe-text FILE] [--probes 16] [--fill-only 1]
 * The namespace is "ns". Prints markdown for BENCHMARKS.md on stdout,
 * progress on stderr. */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "rng.h"

#define NS "ns"

/* ---- a keep-alive client (one per thread) ---------------------------------- */

typedef struct {
    CURL *c;
    http_buf b;
    int port;
} client;

static void client_init(client *cl, int port)
{
    memset(cl, 0, sizeof *cl);
    cl->c = curl_easy_init();
    cl->port = port;
    curl_easy_setopt(cl->c, CURLOPT_WRITEFUNCTION, http_buf_write);
    curl_easy_setopt(cl->c, CURLOPT_WRITEDATA, &cl->b);
    curl_easy_setopt(cl->c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(cl->c, CURLOPT_TCP_NODELAY, 1L);
}

static void client_free(client *cl)
{
    curl_easy_cleanup(cl->c);
    free(cl->b.s);
}

/* method path with body (NULL: none) of content type ctype; the status (0
 * on a transport error), the answer's JSON into *out when out. No timeout:
 * a backup of a 1M-pair namespace under load takes what it takes. */
static long client_call(client *cl, const char *method, const char *path, const char *ctype, const char *body,
                        json_t **out)
{
    char url[512], cth[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", cl->port, path);
    snprintf(cth, sizeof cth, "Content-Type: %s", ctype ? ctype : "application/json");
    struct curl_slist *h = curl_slist_append(NULL, cth);
    h = curl_slist_append(h, "Expect:");
    cl->b.len = 0;
    if (cl->b.s)
        cl->b.s[0] = 0;
    curl_easy_setopt(cl->c, CURLOPT_URL, url);
    curl_easy_setopt(cl->c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cl->c, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(cl->c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(cl->c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    } else {
        curl_easy_setopt(cl->c, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(cl->c, CURLOPT_CUSTOMREQUEST, method);
    }
    long st = 0;
    if (curl_easy_perform(cl->c) == CURLE_OK)
        curl_easy_getinfo(cl->c, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(h);
    if (out)
        *out = cl->b.len ? json_loadb(cl->b.s, cl->b.len, 0, NULL) : NULL;
    return st;
}

/* ---- texts ------------------------------------------------------------------- */

typedef struct {
    char **line;
    size_t n, alloc;   /* lines, and room for them */
} lines;

static bool read_lines(const char *path, lines *l)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    /* (the room is l's: a second file appends to the first's lines; kept
     * in a local, it restarted at 0 each file and a second file wrote
     * past the first's array once they passed 65,536 lines) */
    while ((len = getline(&buf, &cap, f)) > 0) {
        if (len <= 1)
            continue;
        if (l->n == l->alloc) {
            l->alloc = l->alloc ? l->alloc * 2 : 65536;
            l->line = realloc(l->line, l->alloc * sizeof *l->line);
        }
        l->line[l->n++] = strdup(buf);
    }
    free(buf);
    fclose(f);
    return l->n > 0;
}

/* Lines [from, from+n) of l joined (each keeps its newline). */
static char *join(const lines *l, size_t from, size_t n)
{
    size_t total = 1;
    for (size_t i = from; i < from + n && i < l->n; i++)
        total += strlen(l->line[i]);
    char *t = malloc(total), *p = t;
    for (size_t i = from; i < from + n && i < l->n; i++) {
        size_t k = strlen(l->line[i]);
        memcpy(p, l->line[i], k);
        p += k;
    }
    *p = 0;
    return t;
}

static char **vocab;
static int nvocab;

static void load_vocab(const char *model)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/vocab.txt", model);
    lines l = {0};
    if (!read_lines(path, &l))
        return;
    vocab = malloc(l.n * sizeof *vocab);
    for (size_t i = 0; i < l.n; i++) {
        l.line[i][strcspn(l.line[i], "\r\n")] = 0;
        if (l.line[i][0] && l.line[i][0] != '<')   /* not <unk>, <eos> */
            vocab[nvocab++] = l.line[i];
    }
    free(l.line);
}

/* ---- the namespace's state ----------------------------------------------------- */

/* GET /v1/namespaces/ns, or NULL. */
static json_t *ns_get(int port)
{
    client cl;
    client_init(&cl, port);
    json_t *j = NULL;
    if (client_call(&cl, "GET", "/v1/namespaces/" NS, NULL, NULL, &j) != 200) {
        json_decref(j);
        j = NULL;
    }
    client_free(&cl);
    return j;
}

static long long ns_entries(int port)
{
    json_t *j = ns_get(port);
    long long n = j ? (long long)json_integer_value(json_object_get(j, "entries")) : -1;
    json_decref(j);
    return n;
}

/* Waits until the index's own training is idle and none is due at the
 * namespace's size; prints its shape. */
static void wait_training_settled(int port)
{
    double t0 = now_s();
    for (;;) {
        json_t *j = ns_get(port), *t = json_object_get(json_object_get(j, "index"), "training");
        long long entries = (long long)json_integer_value(json_object_get(j, "entries"));
        bool idle = t && json_is_null(json_object_get(t, "in_progress"));
        bool due = t && json_integer_value(json_object_get(t, "next_at")) <= entries;
        if (idle && !due) {
            fprintf(stderr, "training settled after %.0f s: %lld pairs, nlist %lld, nprobe %lld, recall %.3f, "
                            "last training %.0f s\n", now_s() - t0, entries,
                    (long long)json_integer_value(json_object_get(t, "nlist")),
                    (long long)json_integer_value(json_object_get(json_object_get(j, "index"), "nprobe")),
                    json_real_value(json_object_get(t, "recall")),
                    json_real_value(json_object_get(t, "last_seconds")));
            json_decref(j);
            return;
        }
        json_t *p = json_object_get(t, "in_progress");
        if (p)
            fprintf(stderr, "  training: %s %.2f (target %lld)\n", json_string_value(json_object_get(p, "phase")),
                    json_real_value(json_object_get(p, "progress")),
                    (long long)json_integer_value(json_object_get(p, "target")));
        json_decref(j);
        sleep_ms(5000);
    }
}

/* ---- fill ---------------------------------------------------------------------- */

typedef struct {
    int port;
    const lines *docs;            /* all the corpora's lines */
    size_t doc_lines;
    long long want;               /* pairs */
    atomic_size_t next;           /* the next line to upload */
    atomic_llong entries;         /* the namespace's, from the last answer */
    atomic_int errors;
} fill_run;

static void *fill_uploader(void *arg)
{
    fill_run *f = arg;
    client cl;
    client_init(&cl, f->port);
    while (atomic_load(&f->entries) < f->want) {
        size_t from = atomic_fetch_add(&f->next, f->doc_lines);
        if (from >= f->docs->n)
            break;
        char path[128];
        snprintf(path, sizeof path, "/v1/namespaces/" NS "/documents?id=fill-%zu", from);
        char *t = join(f->docs, from, f->doc_lines);
        json_t *a = NULL;
        long st = client_call(&cl, "POST", path, "text/plain", t, &a);
        free(t);
        if (st == 200) {
            long long e = (long long)json_integer_value(json_object_get(a, "entries"));
            long long cur = atomic_load(&f->entries);
            while (e > cur && !atomic_compare_exchange_weak(&f->entries, &cur, e)) {
            }
        } else {
            atomic_fetch_add(&f->errors, 1);
            fprintf(stderr, "fill: upload of lines %zu.. answered %ld\n", from, st);
        }
        json_decref(a);
    }
    client_free(&cl);
    return NULL;
}

static int fill(const char *model, const char *seed, const char *corpora, long long pairs, size_t doc_lines)
{
    lines docs = {0};
    char list[4096];
    snprintf(list, sizeof list, "%s", corpora);
    for (char *save, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save))
        if (!read_lines(f, &docs)) {
            fprintf(stderr, "bench_backup: cannot read %s\n", f);
            return 1;
        }
    char ns_dir[1200];
    snprintf(ns_dir, sizeof ns_dir, "%s/namespaces", seed);
    if (system((snprintf(list, sizeof list, "mkdir -p '%s'", ns_dir), list)) != 0)
        return 1;
    nc_daemon d;
    /* the trainings (65,536, 262,144 and 1,048,576 pairs: minutes of
     * k-means) at nice 0: at the default worker_nice they starve on a
     * shared machine; the fill is not a measurement */
    const char *args[] = {"--model", model, "--data-dir", seed, "--request-timeout", "3600", "--worker-nice", "0",
                          NULL};
    if (daemon_start(&d, args) != 0)
        return 1;
    client cl;
    client_init(&cl, d.port);
    client_call(&cl, "PUT", "/v1/namespaces/" NS, NULL, "{}", NULL);
    long long entries = ns_entries(d.port);
    if (entries < pairs) {   /* a seed whose uploads are done but not sealed skips them */
        double t0 = now_s();
        fill_run f = {.port = d.port, .docs = &docs, .doc_lines = doc_lines, .want = pairs, .entries = entries};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&th[i], NULL, fill_uploader, &f);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        entries = ns_entries(d.port);
        fprintf(stderr, "fill: %lld pairs in %.0f s (%.0f pairs/s), %d failed uploads\n", entries, now_s() - t0,
                (double)entries / (now_s() - t0), atomic_load(&f.errors));
    }
    wait_training_settled(d.port);
    /* One more pair, so that the clean stop writes a snapshot: a snapshot
     * is skipped when the log has nothing new, and the one taken before
     * the training holds the index searched then (exact, or an older
     * training's): a daemon started on it would train for minutes again. */
    client_call(&cl, "POST", "/v1/namespaces/" NS "/documents?id=seal", "text/plain", "the end\n", NULL);
    entries = ns_entries(d.port);
    client_free(&cl);
    int rc = daemon_stop(&d);
    for (size_t i = 0; i < docs.n; i++)
        free(docs.line[i]);
    free(docs.line);
    if (entries < pairs) {
        fprintf(stderr, "bench_backup: the corpora gave %lld pairs, fewer than %lld\n", entries, pairs);
        return 1;
    }
    return rc == 0 ? 0 : 1;
}

/* ---- load ------------------------------------------------------------------------ */

typedef struct {
    double t0, dt;                /* a predict's start (monotonic) and latency, seconds */
} sample;

typedef struct {
    int port, id;
    atomic_bool *stop;
    sample *s;
    size_t n, cap;
    long errors;
} reader;

static void *reader_main(void *arg)
{
    reader *r = arg;
    client cl;
    client_init(&cl, r->port);
    json_t *a = NULL;
    char sid[128] = "", path[256];
    /* a 200-word neural window as bench_namespace's sessions; the
     * namespace's own nprobe */
    if (client_call(&cl, "POST", "/v1/sessions", NULL,
                    "{\"namespace\":\"" NS "\",\"cache\":{\"neural_size\":200,\"unbounded\":true}}", &a) == 201)
        snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(a, "id")));
    json_decref(a);
    if (!sid[0]) {
        fprintf(stderr, "reader %d: no session\n", r->id);
        r->errors++;
        client_free(&cl);
        return NULL;
    }
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
    nc_rng g;
    rng_seed(&g, 100 + (uint64_t)r->id);
    while (!atomic_load(r->stop)) {
        /* a new word each predict: each searches another query (other
         * inverted lists), as an autocompleting client's */
        json_t *b = json_pack("{s:i,s:s}", "top_k", 10, "text", vocab[rng_next(&g) % (uint64_t)nvocab]);
        char *body = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        double t0 = now_s();
        long st = client_call(&cl, "POST", path, NULL, body, NULL);
        double dt = now_s() - t0;
        free(body);
        if (st != 200) {
            if (!r->errors++)
                fprintf(stderr, "reader %d: predict answered %ld: %.200s\n", r->id, st, cl.b.s ? cl.b.s : "");
            continue;
        }
        if (r->n == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 65536;
            r->s = realloc(r->s, r->cap * sizeof *r->s);
        }
        r->s[r->n++] = (sample){t0, dt};
    }
    snprintf(path, sizeof path, "/v1/sessions/%s", sid);
    client_call(&cl, "DELETE", path, NULL, NULL, NULL);
    client_free(&cl);
    return NULL;
}

/* The uploaders: documents of upload_words words of text, one after the
 * other with a pause between; pairs_added counts the pairs of the uploads
 * answered. */
typedef struct {
    int port;
    const lines *text;
    size_t lines_per_doc;
    int pause_ms;
    atomic_bool stop, paused;
    atomic_int busy;              /* uploads in flight */
    atomic_size_t next;
    atomic_llong doc_ids;         /* unique ids of the uploaded documents */
    atomic_llong pairs_added, docs_done, errors;
} upload_run;

static void *uploader_main(void *arg)
{
    upload_run *u = arg;
    client cl;
    client_init(&cl, u->port);
    while (!atomic_load(&u->stop)) {
        if (atomic_load(&u->paused)) {
            sleep_ms(20);
            continue;
        }
        atomic_fetch_add(&u->busy, 1);
        if (atomic_load(&u->paused)) {   /* paused meanwhile: the pauser waits for busy == 0 */
            atomic_fetch_sub(&u->busy, 1);
            continue;
        }
        size_t from = atomic_fetch_add(&u->next, u->lines_per_doc) % (u->text->n - u->lines_per_doc);
        char path[128];
        snprintf(path, sizeof path, "/v1/namespaces/" NS "/documents?id=up-%lld",
                 (long long)atomic_fetch_add(&u->doc_ids, 1));
        char *t = join(u->text, from, u->lines_per_doc);
        json_t *a = NULL;
        long st = client_call(&cl, "POST", path, "text/plain", t, &a);
        free(t);
        if (st == 200) {
            atomic_fetch_add(&u->pairs_added, (long long)json_integer_value(json_object_get(a, "tokens_added")));
            atomic_fetch_add(&u->docs_done, 1);
        } else {
            atomic_fetch_add(&u->errors, 1);
            fprintf(stderr, "upload answered %ld: %.200s\n", st, cl.b.s ? cl.b.s : "");
        }
        json_decref(a);
        atomic_fetch_sub(&u->busy, 1);
        sleep_ms(u->pause_ms);
    }
    client_free(&cl);
    return NULL;
}

/* What an operator's monitoring does meanwhile: GET /metrics (a
 * Prometheus scrape) and a session created on the namespace and deleted,
 * every 2 s; their latencies by start time. The readers' own sessions are
 * made before the windows, so these show what a backup does to requests
 * that take the namespace registry's lock. */
typedef struct {
    int port;
    atomic_bool *stop;
    sample *scrape, *create;
    size_t n, cap;
} monitor;

static void *monitor_main(void *arg)
{
    monitor *m = arg;
    client cl;
    client_init(&cl, m->port);
    while (!atomic_load(m->stop)) {
        if (m->n == m->cap) {
            m->cap = m->cap ? m->cap * 2 : 1024;
            m->scrape = realloc(m->scrape, m->cap * sizeof *m->scrape);
            m->create = realloc(m->create, m->cap * sizeof *m->create);
        }
        double t0 = now_s();
        client_call(&cl, "GET", "/metrics", NULL, NULL, NULL);
        m->scrape[m->n] = (sample){t0, now_s() - t0};
        json_t *a = NULL;
        t0 = now_s();
        long st = client_call(&cl, "POST", "/v1/sessions", NULL,
                              "{\"namespace\":\"" NS "\",\"cache\":{\"unbounded\":true}}", &a);
        m->create[m->n++] = (sample){t0, now_s() - t0};
        if (st == 201) {
            char path[256];
            snprintf(path, sizeof path, "/v1/sessions/%s", json_string_value(json_object_get(a, "id")));
            client_call(&cl, "DELETE", path, NULL, NULL, NULL);
        }
        json_decref(a);
        for (int i = 0; i < 20 && !atomic_load(m->stop); i++)
            sleep_ms(100);
    }
    client_free(&cl);
    return NULL;
}

/* ---- windows ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double from, to;              /* monotonic seconds */
    bool backup;
} window;

/* p50 and p99 (ms) and count of the readers' predicts started inside any
 * of the windows w[0..n) whose backup flag is `backup` (or only w[only]
 * when only >= 0). */
static size_t window_stats(reader *rs, int nr, const window *w, int n, bool backup, int only, double *p50,
                           double *p99)
{
    size_t cap = 0, k = 0;
    for (int i = 0; i < nr; i++)
        cap += rs[i].n;
    double *x = malloc((cap ? cap : 1) * sizeof *x);
    for (int i = 0; i < nr; i++)
        for (size_t j = 0; j < rs[i].n; j++)
            for (int v = 0; v < n; v++) {
                if ((only >= 0 && v != only) || w[v].backup != backup)
                    continue;
                if (rs[i].s[j].t0 >= w[v].from && rs[i].s[j].t0 < w[v].to) {
                    x[k++] = rs[i].s[j].dt;
                    break;
                }
            }
    qsort(x, k, sizeof *x, cmp_double);
    *p50 = k ? x[k / 2] * 1e3 : NAN;
    *p99 = k ? x[(size_t)(0.99 * (double)(k - 1))] * 1e3 : NAN;
    free(x);
    return k;
}

/* POST /v1/admin/backup {"name": name}: the answer's summary, or NULL. */
static json_t *take_backup(int port, const char *name, double *wall)
{
    client cl;
    client_init(&cl, port);
    char body[160];
    snprintf(body, sizeof body, "{\"name\":\"%s\"}", name);
    json_t *a = NULL;
    double t0 = now_s();
    long st = client_call(&cl, "POST", "/v1/admin/backup", NULL, body, &a);
    *wall = now_s() - t0;
    if (st != 200) {
        fprintf(stderr, "backup %s answered %ld: %.300s\n", name, st, cl.b.s ? cl.b.s : "");
        json_decref(a);
        a = NULL;
    }
    client_free(&cl);
    return a;
}

static json_t *summary_ns(json_t *summary)
{
    return json_array_get(json_object_get(summary, "namespaces"), 0);
}

/* ---- compare ---------------------------------------------------------------------- */

/* The top 20 of a fresh session reading the namespace after probe text. */
static json_t *probe(int port, const char *text, int i)
{
    client cl;
    client_init(&cl, port);
    char sid[64], body[256], path[256];
    snprintf(sid, sizeof sid, "probe-%d", i);
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"namespace\":\"" NS "\",\"cache\":{\"neural_size\":200,"
             "\"unbounded\":true}}", sid);
    json_t *out = NULL, *a = NULL;
    if (client_call(&cl, "POST", "/v1/sessions", NULL, body, NULL) == 201) {
        json_t *f = json_pack("{s:s}", "text", text);
        char *fb = json_dumps(f, JSON_COMPACT);
        json_decref(f);
        snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
        long fs = client_call(&cl, "POST", path, NULL, fb, NULL);
        free(fb);
        snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
        if (fs == 200 && client_call(&cl, "POST", path, NULL, "{\"top_k\":20}", &a) == 200)
            out = json_incref(json_object_get(a, "predictions"));
        json_decref(a);
        snprintf(path, sizeof path, "/v1/sessions/%s", sid);
        client_call(&cl, "DELETE", path, NULL, NULL, NULL);
    }
    client_free(&cl);
    return out;
}

static int run_cmd(const char *cmd)
{
    fprintf(stderr, "$ %s\n", cmd);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- main ----------------------------------------------------------------------------- */

typedef struct {
    const char *model, *seed, *run, *corpora, *upload_text, *probe_text;
    long long pairs;
    int doc_lines, readers, uploaders, rounds, upload_words, upload_pause_ms, compare, probes, fill_only;
    double window, warmup;
} opts;

static void usage(void)
{
    fprintf(stderr, "usage: bench_backup --model DIR --seed DIR --run DIR --corpus F1[,F2..] [--pairs N] "
                    "[--readers 16] [--uploaders 2] [--rounds 6] [--window S] [--compare 0|1] ...\n");
}

static bool parse(int argc, char **argv, opts *o)
{
    *o = (opts){.pairs = 1000000, .doc_lines = 2000, .readers = 16, .uploaders = 2, .rounds = 6,
                .upload_words = 1000, .upload_pause_ms = 200, .compare = 1, .probes = 16, .window = 10,
                .warmup = 10};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) o->model = v;
        else if (!strcmp(k, "--seed")) o->seed = v;
        else if (!strcmp(k, "--run")) o->run = v;
        else if (!strcmp(k, "--corpus")) o->corpora = v;
        else if (!strcmp(k, "--upload-text")) o->upload_text = v;
        else if (!strcmp(k, "--probe-text")) o->probe_text = v;
        else if (!strcmp(k, "--pairs")) o->pairs = atoll(v);
        else if (!strcmp(k, "--doc-lines")) o->doc_lines = atoi(v);
        else if (!strcmp(k, "--readers")) o->readers = atoi(v);
        else if (!strcmp(k, "--uploaders")) o->uploaders = atoi(v);
        else if (!strcmp(k, "--rounds")) o->rounds = atoi(v);
        else if (!strcmp(k, "--window")) o->window = atof(v);
        else if (!strcmp(k, "--warmup")) o->warmup = atof(v);
        else if (!strcmp(k, "--upload-words")) o->upload_words = atoi(v);
        else if (!strcmp(k, "--upload-pause-ms")) o->upload_pause_ms = atoi(v);
        else if (!strcmp(k, "--compare")) o->compare = atoi(v);
        else if (!strcmp(k, "--probes")) o->probes = atoi(v);
        else if (!strcmp(k, "--fill-only")) o->fill_only = atoi(v);
        else {
            fprintf(stderr, "unknown option %s\n", k);
            return false;
        }
    }
    return o->model && o->seed && o->run && o->corpora;
}

/* The words of a text's lines: about how many lines make n words. */
static size_t lines_for_words(const lines *l, int words)
{
    size_t total = 0;
    size_t sample = l->n < 1000 ? l->n : 1000;
    for (size_t i = 0; i < sample; i++)
        for (const char *p = l->line[i]; *p; p++)
            total += *p == ' ';
    double per_line = sample ? (double)total / (double)sample + 1 : 20;
    size_t n = (size_t)((double)words / per_line + 0.5);
    return n ? n : 1;
}

typedef struct {
    double seconds, wall;
    long long bytes, entries, position, acked_before;
} backup_row;

/* The slowest of samples x[0..n) started in the windows of kind backup, ms. */
static double slowest(const sample *x, size_t n, const window *w, int nw, bool backup)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        for (int v = 0; v < nw; v++)
            if (w[v].backup == backup && x[i].t0 >= w[v].from && x[i].t0 < w[v].to && x[i].dt > m)
                m = x[i].dt;
    return m * 1e3;
}

static void print_rounds(reader *rs, int nr, const window *w, int nw, const backup_row *b)
{
    printf("| round | without: predicts | p50 (ms) | p99 (ms) | with: predicts | p50 (ms) | p99 (ms) | p99 ratio "
           "| backup (s) | backup size (MB) | pairs in it |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int r = 0; 2 * r + 1 < nw; r++) {
        double a50, a99, b50, b99;
        size_t na = window_stats(rs, nr, w, nw, false, 2 * r, &a50, &a99);
        size_t nb = window_stats(rs, nr, w, nw, true, 2 * r + 1, &b50, &b99);
        printf("| %d | %zu | %.2f | %.2f | %zu | %.2f | %.2f | %.2f | %.1f | %.0f | %lld |\n", r + 1, na, a50, a99, nb,
               b50, b99, b99 / a99, b[r].seconds, (double)b[r].bytes / 1e6, b[r].entries);
    }
    double a50, a99, b50, b99;
    size_t na = window_stats(rs, nr, w, nw, false, -1, &a50, &a99);
    size_t nb = window_stats(rs, nr, w, nw, true, -1, &b50, &b99);
    printf("| all | %zu | %.2f | %.2f | %zu | %.2f | %.2f | **%.2f** | | | |\n", na, a50, a99, nb, b50, b99, b99 / a99);
    printf("\nreaders' p99 during a backup / without: %.2f (target <= 1.5); p50 %.2f\n", b99 / a99, b50 / a50);
}

/* Probes read on the original (uploads paused), a backup taken, restored
 * into a fresh daemon, probes read again. 0 when equal. */
static int compare(const opts *o, int port, upload_run *u, lines *probes)
{
    atomic_store(&u->paused, true);
    while (atomic_load(&u->busy) > 0)
        sleep_ms(20);
    long long entries = ns_entries(port);
    int np = (int)probes->n < o->probes ? (int)probes->n : o->probes;
    json_t **want = calloc((size_t)np, sizeof *want);
    for (int i = 0; i < np; i++)
        want[i] = probe(port, probes->line[i], i);
    double wall;
    json_t *s = take_backup(port, "compare", &wall);
    long long in_backup = s ? (long long)json_integer_value(json_object_get(summary_ns(s), "entries")) : -1;
    printf("\ncomparison backup (uploads paused, %d readers on): %lld pairs in the original, %lld in the backup, "
           "%.1f s\n", o->readers, entries, in_backup, wall);
    json_decref(s);
    atomic_store(&u->paused, false);
    char restored[1200], cmd[4096];
    snprintf(restored, sizeof restored, "%s-restored", o->run);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' restore --model '%s' --from '%s/backups/compare' --data-dir '%s' "
             ">&2", restored, daemon_bin_path("neurocache"), o->model, o->run, restored);
    double t0 = now_s();
    int rc = run_cmd(cmd);
    double restore_s = now_s() - t0;
    int equal = 0, asked = 0;
    long long got = -1;
    double start_s = 0;
    if (rc == 0) {
        nc_daemon r;
        const char *args[] = {"--model", o->model, "--data-dir", restored, "--snapshot-period", "0", NULL};
        t0 = now_s();
        if (daemon_start(&r, args) == 0) {
            start_s = now_s() - t0;
            got = ns_entries(r.port);
            for (int i = 0; i < np; i++, asked++) {
                json_t *p = probe(r.port, probes->line[i], i);
                if (p && want[i] && json_equal(p, want[i]))
                    equal++;
                else if (getenv("BENCH_VERBOSE")) {
                    char *x = want[i] ? json_dumps(want[i], JSON_COMPACT) : NULL,
                         *y = p ? json_dumps(p, JSON_COMPACT) : NULL;
                    fprintf(stderr, "probe %d differs:\n  original %.400s\n  restored %.400s\n", i, x ? x : "-",
                            y ? y : "-");
                    free(x);
                    free(y);
                }
                json_decref(p);
            }
            daemon_stop(&r);
        }
    }
    printf("restore: `neurocache restore` %.1f s (checksums verified, files copied), daemon start on it %.1f s; "
           "pairs %lld (backup %lld); predictions equal to the original's: %d of %d probes (top 20, JSON-equal)\n",
           restore_s, start_s, got, in_backup, equal, np);
    for (int i = 0; i < np; i++)
        json_decref(want[i]);
    free(want);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", restored);
    run_cmd(cmd);
    return rc == 0 && got == in_backup && in_backup == entries && equal == np && np > 0 ? 0 : 1;
}

static int measure(const opts *o)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -a '%s' '%s'", o->run, o->seed, o->run);
    if (run_cmd(cmd) != 0)
        return 1;
    lines text = {0}, probes = {0};
    if (!read_lines(o->upload_text, &text) || (o->compare && !read_lines(o->probe_text, &probes))) {
        fprintf(stderr, "bench_backup: cannot read %s or %s\n", o->upload_text, o->probe_text);
        return 1;
    }
    nc_daemon d;
    const char *args[] = {"--model", o->model, "--data-dir", o->run, "--snapshot-period", "0",
                          "--request-timeout", "600", NULL};
    if (daemon_start(&d, args) != 0)
        return 1;
    json_t *j = ns_get(d.port);
    long long entries0 = (long long)json_integer_value(json_object_get(j, "entries"));   /* before any upload */
    char *desc = j ? json_dumps(json_object_get(j, "index"), JSON_COMPACT) : NULL;
    printf("namespace %s: %lld pairs, disk %.0f MB, index %s\n", NS,
           (long long)json_integer_value(json_object_get(j, "entries")),
           (double)json_integer_value(json_object_get(j, "disk_bytes")) / 1e6, desc ? desc : "?");
    free(desc);
    json_decref(j);
    atomic_bool stop = false;
    reader *rs = calloc((size_t)o->readers, sizeof *rs);
    pthread_t *rth = calloc((size_t)o->readers, sizeof *rth), *uth = calloc((size_t)o->uploaders + 1, sizeof *uth);
    for (int i = 0; i < o->readers; i++) {
        rs[i] = (reader){.port = d.port, .id = i, .stop = &stop};
        pthread_create(&rth[i], NULL, reader_main, &rs[i]);
    }
    upload_run u = {.port = d.port, .text = &text, .lines_per_doc = lines_for_words(&text, o->upload_words),
                    .pause_ms = o->upload_pause_ms};
    for (int i = 0; i < o->uploaders; i++)
        pthread_create(&uth[i], NULL, uploader_main, &u);
    atomic_bool mon_stop = false;
    monitor mon = {.port = d.port, .stop = &mon_stop};
    pthread_t mth;
    pthread_create(&mth, NULL, monitor_main, &mon);
    sleep_ms((int)(o->warmup * 1000));
    int nw = 2 * o->rounds;
    window *w = calloc((size_t)nw, sizeof *w);
    backup_row *b = calloc((size_t)o->rounds, sizeof *b);
    int failures = 0;
    long long pairs0 = atomic_load(&u.pairs_added);
    double tload = now_s();
    for (int r = 0; r < o->rounds; r++) {
        w[2 * r] = (window){now_s(), 0, false};
        sleep_ms((int)(o->window * 1000));
        w[2 * r].to = now_s();
        char name[64];
        snprintf(name, sizeof name, "load-%d", r + 1);
        /* every pair of an upload answered before the backup is asked
         * for is durable, so in it (an answer's "entries" is no bound: it
         * counts the other uploader's pairs added so far, not yet durable) */
        b[r].acked_before = entries0 + atomic_load(&u.pairs_added);
        w[2 * r + 1] = (window){now_s(), 0, true};
        json_t *s = take_backup(d.port, name, &b[r].wall);
        w[2 * r + 1].to = now_s();
        json_t *e = summary_ns(s);
        b[r].seconds = json_real_value(json_object_get(s, "seconds"));
        b[r].bytes = (long long)json_integer_value(json_object_get(e, "bytes"));
        b[r].entries = (long long)json_integer_value(json_object_get(e, "entries"));
        b[r].position = (long long)json_integer_value(json_object_get(e, "position"));
        if (!s || b[r].entries < b[r].acked_before) {
            fprintf(stderr, "backup %s: %lld pairs, fewer than the %lld acknowledged before it was asked for\n",
                    name, b[r].entries, b[r].acked_before);
            failures++;
        }
        fprintf(stderr, "round %d: backup %.1f s, %lld pairs (>= %lld acknowledged before), %.0f MB\n", r + 1,
                b[r].seconds, b[r].entries, b[r].acked_before, (double)b[r].bytes / 1e6);
        json_decref(s);
        if (r + 1 < o->rounds) {
            /* the previous backup's files go (disk), not inside a window */
            snprintf(cmd, sizeof cmd, "rm -rf '%s/backups/%s'", o->run, name);
            run_cmd(cmd);
            sleep_ms(1000);
        }
    }
    double load_s = now_s() - tload;
    long long added = atomic_load(&u.pairs_added) - pairs0;
    printf("\n%d readers (a session each, predict top-10 with a new word in its text, keep-alive), %d uploaders "
           "(%zu-line documents of the upload text, %d ms apart: %.0f pairs/s added in all), %d rounds of "
           "%.0f s without a backup, then one backup\n\n", o->readers, o->uploaders, u.lines_per_doc,
           o->upload_pause_ms, (double)added / load_s, o->rounds, o->window);
    print_rounds(rs, o->readers, w, nw, b);
    long rerr = 0;
    for (int i = 0; i < o->readers; i++)
        rerr += rs[i].errors;
    printf("reader errors %ld, upload errors %lld, documents uploaded %lld\n", rerr, (long long)atomic_load(&u.errors),
           (long long)atomic_load(&u.docs_done));
    atomic_store(&mon_stop, true);   /* its figures are read now */
    pthread_join(mth, NULL);
    printf("monitoring every 2 s, slowest without / during a backup: GET /metrics %.1f / %.1f ms, a session created "
           "on the namespace %.1f / %.1f ms\n", slowest(mon.scrape, mon.n, w, nw, false),
           slowest(mon.scrape, mon.n, w, nw, true), slowest(mon.create, mon.n, w, nw, false),
           slowest(mon.create, mon.n, w, nw, true));
    free(mon.scrape);
    free(mon.create);
    snprintf(cmd, sizeof cmd, "'%s' restore --model '%s' --from '%s/backups/load-%d' --verify-only >&2",
             daemon_bin_path("neurocache"), o->model, o->run, o->rounds);
    int vrc = run_cmd(cmd);
    printf("last backup under load: `neurocache restore --verify-only` %s\n", vrc == 0 ? "verified" : "FAILED");
    failures += vrc != 0;
    if (o->compare)
        failures += compare(o, d.port, &u, &probes);
    atomic_store(&stop, true);
    atomic_store(&u.stop, true);
    for (int i = 0; i < o->readers; i++)
        pthread_join(rth[i], NULL);
    for (int i = 0; i < o->uploaders; i++)
        pthread_join(uth[i], NULL);
    failures += daemon_stop(&d) != 0;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", o->run);
    run_cmd(cmd);
    for (int i = 0; i < o->readers; i++)
        free(rs[i].s);
    free(rs);
    free(rth);
    free(uth);
    free(w);
    free(b);
    fflush(stdout);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (!parse(argc, argv, &o)) {
        usage();
        return 2;
    }
    load_vocab(o.model);
    if (nvocab < 2) {
        fprintf(stderr, "bench_backup: no words in %s/vocab.txt\n", o.model);
        return 1;
    }
    httpc_init();
    /* the mark of a complete fill: a seed interrupted is filled again */
    char done[1200], cmd[1300];
    snprintf(done, sizeof done, "%s/.bench-seed-complete", o.seed);
    int rc = 0;
    if (access(done, F_OK) != 0) {
        /* a seed filled but not sealed (its training lost by the stop) is
         * only sealed; one without a namespace is filled afresh */
        snprintf(cmd, sizeof cmd, "test -d '%s/namespaces/" NS "/wal' || rm -rf '%s'", o.seed, o.seed);
        rc = run_cmd(cmd);
        if (!rc)
            rc = fill(o.model, o.seed, o.corpora, o.pairs, (size_t)o.doc_lines);
        FILE *f = rc ? NULL : fopen(done, "w");
        if (f)
            fclose(f);
    }
    if (!rc && !o.fill_only)
        rc = measure(&o);
    httpc_cleanup();
    return rc;
}
