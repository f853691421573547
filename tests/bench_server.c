/* bench_server.c -- load generator for neurocached on loopback: predict
 * latency (p50/p99) and predictions/s with 1, 16 and 64 concurrent sessions,
 * and scoring tokens/s through HTTP versus the CLI.
 *
 * The model is a randomly initialised 2-layer, 256-unit LSTM with a
 * 10,000-word vocabulary (the PTB shape; speed does not depend on the
 * weights), written to a scratch directory unless --model is given. Each
 * session has a 2,000-entry neural cache, filled before measuring.
 *
 * usage: bench_server [--model DIR] [--seconds S] [--clients 1,16,64] [--batch 0|1] [--f16 0|1] [--wrk 0|1]
 *                     [--threads N] [--score-tokens N] [--neural N] [--heavy N [--fair-clients N]]
 *                     [--data-dir DIR --namespace NS [--stream N] [--knn K] [--nprobe P]] [--guard 1]
 * --score-tokens N: words of the scored text (N + N/20 tokens with the line
 * ends); the default 45,000 (47,250 tokens) stays under the daemon's default
 * max_tokens_per_request (50,000), which refuses longer texts with 413.
 * --heavy N: then the predict load of --fair-clients sessions (16) without
 * and with N clients scoring 47,250-token texts back to back (fairness:
 * heavy work must not starve predicts); --clients "" skips the usual rows.
 * --namespace NS (with --data-dir DIR, the daemon's data_dir, holding
 * DIR/namespaces/NS, e.g. written by bench_ns_seed): the sessions read NS's
 * unbounded cache ("unbounded": true, knn and nprobe at their defaults or
 * --knn / --nprobe);
 * then, with --stream N, the predict load of --fair-clients sessions without
 * and with N clients streaming documents into NS (text/plain uploads of
 * 45,000 words, back to back). The streamed entries stay in NS (copy the
 * directory first to keep the seeded namespace). --feed-between 1: each
 * session feeds one random word (not timed) before each predict, so that
 * successive predicts search different queries; predictions/s then counts
 * the predicts only, the feeds' work (an LSTM step and a search each)
 * sharing the cores. --feed-between 2: the word goes in the predict's own
 * "text" instead (one request a new word, timed: what an autocompleting
 * client sends).
 * --guard 1: instead, test_server_guard's latencies: /health and /ready while
 * three workers run heavy requests, how soon the workers are free once
 * their clients hang up, and how fast an over-budget request is refused
 * 413 (issue 17: 100 ms, 1 s and 50 ms).
 * Bounded in time: about (3 + S per concurrency level) seconds plus scoring. */
#include <curl/curl.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "model.h"
#include "rawhttp.h"
#include "rng.h"
#include "vocab.h"

/* Random model of the PTB shape, saved into dir. */
static int make_model(const char *dir, int V, int H)
{
    nc_vocab *v = vocab_new();
    char w[32];
    vocab_add(v, "<unk>", 5);
    vocab_add(v, "<eos>", 5);
    for (int i = 2; i < V; i++) {
        int n = snprintf(w, sizeof w, "w%d", i);
        vocab_add(v, w, (size_t)n);
    }
    nc_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.model_type, sizeof cfg.model_type, "lstm");
    cfg.vocab_size = V;
    cfg.embedding_size = H;
    cfg.hidden_size = H;
    cfg.num_layers = 2;
    snprintf(cfg.unk_token, sizeof cfg.unk_token, "<unk>");
    snprintf(cfg.eos_token, sizeof cfg.eos_token, "<eos>");
    nc_model *m = NULL;
    char err[512];
    if (model_create(&cfg, v, &m, err, sizeof err) != NC_OK) {
        fprintf(stderr, "model_create: %s\n", err);
        return -1;
    }
    nc_rng rng;
    rng_seed(&rng, 7);
    float a = 0.1f;
    for (size_t i = 0; i < (size_t)V * H; i++) m->encoder[i] = a * (2 * rng_uniform(&rng) - 1);
    for (int l = 0; l < 2; l++) {
        nc_lstm_layer *L = &m->layers[l];
        for (size_t i = 0; i < (size_t)4 * H * L->input_size; i++) L->w_ih[i] = a * (2 * rng_uniform(&rng) - 1);
        for (size_t i = 0; i < (size_t)4 * H * H; i++) L->w_hh[i] = a * (2 * rng_uniform(&rng) - 1);
    }
    for (size_t i = 0; i < (size_t)V * H; i++) m->decoder_w[i] = a * (2 * rng_uniform(&rng) - 1);
    model_refresh_derived(m);
    int rc = model_save(m, dir, false, err, sizeof err);
    if (rc != NC_OK)
        fprintf(stderr, "model_save: %s\n", err);
    model_free(m);
    return rc == NC_OK ? 0 : -1;
}

/* ---- a keep-alive client per thread ---- */


typedef struct {
    CURL *c;
    struct curl_slist *h;
    http_buf b;
    int port;
} client;

static void client_init(client *cl, int port)
{
    memset(cl, 0, sizeof *cl);
    cl->c = curl_easy_init();
    cl->port = port;
    cl->h = curl_slist_append(NULL, "Content-Type: application/json");
    cl->h = curl_slist_append(cl->h, "Expect:");
    curl_easy_setopt(cl->c, CURLOPT_HTTPHEADER, cl->h);
    curl_easy_setopt(cl->c, CURLOPT_WRITEFUNCTION, http_buf_write);
    curl_easy_setopt(cl->c, CURLOPT_WRITEDATA, &cl->b);
    curl_easy_setopt(cl->c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(cl->c, CURLOPT_TCP_NODELAY, 1L);
}

static void client_free(client *cl)
{
    curl_slist_free_all(cl->h);
    curl_easy_cleanup(cl->c);
    free(cl->b.s);
}

/* POST; returns the status (0 on transport error); body in cl->b.s. */
static long client_post(client *cl, const char *path, const char *body, size_t len)
{
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", cl->port, path);
    cl->b.len = 0;
    if (cl->b.s) cl->b.s[0] = 0;
    curl_easy_setopt(cl->c, CURLOPT_URL, url);
    curl_easy_setopt(cl->c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(cl->c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    long st = 0;
    if (curl_easy_perform(cl->c) == CURLE_OK)
        curl_easy_getinfo(cl->c, CURLINFO_RESPONSE_CODE, &st);
    return st;
}

/* ---- predict load ---- */

typedef struct {
    int port, neural, id;
    double t_end, last_done;
    char sid[128];                /* its session */
    pthread_barrier_t *hold;      /* wrk mode: keep the session until wrk is done */
    double *lat;
    size_t n, cap;
    long errors;
    int ready;
    pthread_barrier_t *bar;
} worker;

/* Words of the text generators: the model's vocabulary (so a real model
 * sees real words), else w2..w9999 (the random model's). */
static char **words;
static int nwords;
static int f16;                   /* sessions' neural keys in float16 */
static const char *ns_name;       /* --namespace: sessions read its unbounded cache */
static int ub_knn, ub_nprobe;     /* --knn, --nprobe of those sessions (0: the defaults) */
static int feed_between;          /* 1: a one-word feed (untimed) before each predict; 2: the word in predict's "text" */

static void load_words(const char *model_dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/vocab.txt", model_dir);
    FILE *f = fopen(path, "r");
    char line[512];
    int cap = 0;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '<') continue;     /* <unk>, <eos> */
        if (nwords == cap) {
            cap = cap ? cap * 2 : 16384;
            words = realloc(words, (size_t)cap * sizeof *words);
        }
        words[nwords++] = strdup(line);
    }
    if (f) fclose(f);
}

/* n random words, a line break every 20. */
static char *random_text(nc_rng *r, int n)
{
    size_t cap = (size_t)n * 24 + 2, len = 0;
    char *t = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = (int)(rng_uniform(r) * (float)nwords);
        if (k >= nwords) k = nwords - 1;
        const char *w = words[k];
        size_t wl = strlen(w);
        if (len + wl + 2 >= cap) {
            cap = cap * 2 + wl;
            t = realloc(t, cap);
        }
        memcpy(t + len, w, wl);
        len += wl;
        t[len++] = (i % 20) == 19 ? '\n' : ' ';
    }
    t[len] = 0;
    return t;
}

static void *predict_worker(void *arg)
{
    worker *w = arg;
    client cl;
    client_init(&cl, w->port);
    char body[256], path[256], id[128] = "";
    char ub[64] = "";   /* --knn / --nprobe: else the defaults */
    if (ub_knn > 0 || ub_nprobe > 0)
        snprintf(ub, sizeof ub, ",\"knn\":%d,\"nprobe\":%d", ub_knn > 0 ? ub_knn : 1024, ub_nprobe > 0 ? ub_nprobe : 8);
    int n = ns_name ? snprintf(body, sizeof body, "{\"namespace\":\"%s\",\"cache\":{\"neural_size\":%d%s,"
                                                  "\"unbounded\":true%s}}", ns_name, w->neural,
                               f16 ? ",\"neural_f16\":true" : "", ub)
                    : snprintf(body, sizeof body, "{\"cache\":{\"neural_size\":%d%s}}", w->neural,
                               f16 ? ",\"neural_f16\":true" : "");
    if (client_post(&cl, "/v1/sessions", body, (size_t)n) == 201) {
        json_t *j = json_loads(cl.b.s, 0, NULL);
        snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
        json_decref(j);
    }
    /* Fill the neural cache: as many tokens as its window. */
    nc_rng r;
    rng_seed(&r, (uint64_t)w->id + 1);
    char *text = random_text(&r, w->neural > 0 ? w->neural : 100);
    json_t *fb = json_pack("{s:s}", "text", text);
    char *fbs = json_dumps(fb, JSON_COMPACT);
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    /* 64 sessions filling at once overrun the worker pool's bounded queue
     * (max_queued): a 429 means "later", so wait and resend, as a client
     * should; an unfilled cache would make its predicts cheaper. Up to 15
     * minutes: with a 1M-pair namespace a fill reads it at every token
     * (about 2 s of a worker each), so 64 fills on 2 workers take minutes */
    long fst = id[0] ? client_post(&cl, path, fbs, strlen(fbs)) : 0;
    for (double give_up = now_s() + 900; fst == 429 && now_s() < give_up;) {
        usleep(50000);
        fst = client_post(&cl, path, fbs, strlen(fbs));
    }
    if (fst != 200) {
        fprintf(stderr, "session %d: filling its cache answered %ld\n", w->id, fst);
        w->errors++;
    }
    free(fbs);
    json_decref(fb);
    free(text);
    snprintf(w->sid, sizeof w->sid, "%s", id);
    pthread_barrier_wait(w->bar);     /* every session filled */
    pthread_barrier_wait(w->bar);     /* t_end set */
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    const char *pb = "{\"top_k\":10}";
    char feed_path[256];
    snprintf(feed_path, sizeof feed_path, "/v1/sessions/%s/feed", id);
    while (now_s() < w->t_end) {
        char *with_text = NULL;   /* --feed-between 2: this predict's body */
        if (feed_between == 2) {
            json_t *pj = json_pack("{s:i,s:s}", "top_k", 10, "text", words[rng_next(&r) % (uint64_t)nwords]);
            with_text = json_dumps(pj, JSON_COMPACT);
            json_decref(pj);
        } else if (feed_between) {
            /* the state moves on, so each predict searches another query
             * (other IVF lists) rather than the same one again */
            json_t *fj = json_pack("{s:s}", "text", words[rng_next(&r) % (uint64_t)nwords]);
            char *one = json_dumps(fj, JSON_COMPACT);
            long fs = one ? client_post(&cl, feed_path, one, strlen(one)) : 0;
            /* 429: the workers' queue is full (64 sessions, 2 threads):
             * later, as a client should */
            for (int tries = 0; fs == 429 && tries < 1000 && now_s() < w->t_end; tries++) {
                usleep(10000);
                fs = client_post(&cl, feed_path, one, strlen(one));
            }
            if (fs != 200 && fs != 429) w->errors++;
            free(one);
            json_decref(fj);
        }
        double t0 = now_s();
        long st = with_text ? client_post(&cl, path, with_text, strlen(with_text)) : client_post(&cl, path, pb, strlen(pb));
        double dt = now_s() - t0;
        free(with_text);
        if (st != 200) {
            if (!w->errors)   /* the first of each session, to say what the errors were */
                fprintf(stderr, "session %d: predict answered %ld: %.200s\n", w->id, st, cl.b.s ? cl.b.s : "");
            w->errors++;
            continue;
        }
        if (w->n == w->cap) {
            w->cap = w->cap ? w->cap * 2 : 4096;
            w->lat = realloc(w->lat, w->cap * sizeof *w->lat);
        }
        w->lat[w->n++] = dt;
        w->last_done = t0 + dt;
    }
    if (w->hold)
        pthread_barrier_wait(w->hold);
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    curl_easy_setopt(cl.c, CURLOPT_CUSTOMREQUEST, "DELETE");
    client_post(&cl, path, "", 0);
    client_free(&cl);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double self_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

/* ---- heavy scoring clients (fairness) ---- */

/* A client that scores a long text again and again (each request near
 * max_tokens_per_request: seconds of one worker) until told to stop. */
typedef struct {
    int port;
    atomic_int *stop;
    const char *body;
    size_t len;
    const char *path;             /* "/v1/score", or a namespace's documents (text/plain) */
    long done, errors;
} heavy_client;

static void *heavy_worker(void *arg)
{
    heavy_client *h = arg;
    client cl;
    client_init(&cl, h->port);
    if (strcmp(h->path, "/v1/score")) {
        curl_slist_free_all(cl.h);
        cl.h = curl_slist_append(NULL, "Content-Type: text/plain");
        cl.h = curl_slist_append(cl.h, "Expect:");
        curl_easy_setopt(cl.c, CURLOPT_HTTPHEADER, cl.h);
    }
    while (!atomic_load(h->stop)) {
        long st = client_post(&cl, h->path, h->body, h->len);
        if (st == 200) h->done++;
        else h->errors++;
    }
    client_free(&cl);
    return NULL;
}

/* Predict load of clients sessions for seconds, with heavy scoring clients
 * running meanwhile (0 = none); prints a row and returns p50 and p99. */
static void run_predict(int port, pid_t pid, int clients, double seconds, int neural, int heavy, double *p50o,
                        double *p99o)
{
    worker *ws = calloc((size_t)clients, sizeof *ws);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)clients + 1);
    for (int i = 0; i < clients; i++) {
        ws[i].port = port;
        ws[i].neural = neural;
        ws[i].id = i;
        ws[i].bar = &bar;
        ws[i].t_end = 1e18;
    }
    for (int i = 0; i < clients; i++) pthread_create(&th[i], NULL, predict_worker, &ws[i]);
    /* t_end is set once every session is filled; the second barrier
     * publishes it. */
    pthread_barrier_wait(&bar);
    /* on stderr, so a profiler can be attached to the measurement alone */
    fprintf(stderr, "bench_server: %d sessions filled, measuring %.0f s\n", clients, seconds);
    /* the heavy clients start once the sessions are filled, and the
     * measurement once they all run on the workers */
    atomic_int hstop = 0;
    heavy_client *hc = calloc((size_t)heavy + 1, sizeof *hc);
    pthread_t *hth = calloc((size_t)heavy + 1, sizeof *hth);
    char *hbody = NULL;
    if (heavy > 0) {
        nc_rng r;
        rng_seed(&r, 99);
        /* 45,000 words + a line end every 20: 47,250 tokens, under the
         * default max_tokens_per_request (50,000) */
        char *text = random_text(&r, 45000);
        static char docs_path[160];
        snprintf(docs_path, sizeof docs_path, "/v1/namespaces/%s/documents", ns_name ? ns_name : "");
        if (ns_name) {
            hbody = text;         /* streamed as one text/plain document */
        } else {
            json_t *j = json_pack("{s:s}", "text", text);
            hbody = json_dumps(j, JSON_COMPACT);
            json_decref(j);
            free(text);
        }
        for (int i = 0; i < heavy; i++) {
            hc[i] = (heavy_client){.port = port, .stop = &hstop, .body = hbody, .len = strlen(hbody),
                                   .path = ns_name ? docs_path : "/v1/score"};
            pthread_create(&hth[i], NULL, heavy_worker, &hc[i]);
        }
        for (int i = 0; i < 3000 && daemon_metric(port, "neurocache_work_running") < heavy; i++)
            sleep_ms(10);
    }
    double b0 = daemon_metric(port, "neurocache_predict_batches_total");
    double j0 = daemon_metric(port, "neurocache_predict_batched_total");
    double c0 = process_cpu(pid), s0 = self_cpu();
    double t0 = now_s();
    for (int i = 0; i < clients; i++) ws[i].t_end = t0 + seconds;
    pthread_barrier_wait(&bar);
    for (int i = 0; i < clients; i++) pthread_join(th[i], NULL);
    double running = heavy > 0 ? daemon_metric(port, "neurocache_work_running") : 0;
    atomic_store(&hstop, 1);
    long hdone = 0, herr = 0;
    for (int i = 0; i < heavy; i++) {
        pthread_join(hth[i], NULL);
        hdone += hc[i].done;
        herr += hc[i].errors;
    }
    free(hc);
    free(hth);
    free(hbody);
    double wall = 0;
    for (int i = 0; i < clients; i++)
        if (ws[i].last_done - t0 > wall) wall = ws[i].last_done - t0;
    double c1 = process_cpu(pid), s1 = self_cpu();
    double b1 = daemon_metric(port, "neurocache_predict_batches_total");
    double j1 = daemon_metric(port, "neurocache_predict_batched_total");
    size_t total = 0;
    long errors = 0;
    for (int i = 0; i < clients; i++) { total += ws[i].n; errors += ws[i].errors; }
    double *all = malloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < clients; i++) {
        memcpy(all + k, ws[i].lat, ws[i].n * sizeof *all);
        k += ws[i].n;
        free(ws[i].lat);
    }
    qsort(all, total, sizeof *all, cmp_double);
    double p50 = total ? all[total / 2] : NAN, p99 = total ? all[(size_t)(0.99 * (double)(total - 1))] : NAN;
    /* The daemon's CPU per prediction (its deletes at the end included,
     * a few ms in all) tells its capacity on two idle cores even when the
     * machine is shared: 2 / cpu_per_prediction. */
    double cpu = (c1 - c0) / (double)(total ? total : 1), ccpu = (s1 - s0) / (double)(total ? total : 1);
    double batch = b1 > b0 ? (j1 - j0) / (b1 - b0) : NAN;
    char label[128] = "predict top-10";
    if (ns_name)
        snprintf(label, sizeof label, "predict top-10%s, unbounded cache of namespace %s%s",
                 feed_between == 2 ? " after a new word in its text" : feed_between ? " after a one-word feed" : "",
                 ns_name, heavy > 0 ? ", documents streaming in" : "");
    else if (heavy > 0)
        snprintf(label, sizeof label, "predict top-10, %d heavy scoring clients running", heavy);
    printf("| %s | %d | %zu | %.0f | %.2f | %.2f | %.1f | %.0f | %.0f | %.0f | %ld |\n", label, clients, total,
           (double)total / wall, p50 * 1e3, p99 * 1e3, batch, cpu * 1e6, 2.0 / cpu, ccpu * 1e6, errors);
    if (heavy > 0)
        printf("(heavy clients: %ld %s of 47,250 tokens completed, %ld errors, %.0f running at the end)\n", hdone,
               ns_name ? "document uploads" : "scoring requests", herr, running);
    if (p50o) *p50o = p50;
    if (p99o) *p99o = p99;
    fflush(stdout);
    free(all);
    free(ws);
    free(th);
    pthread_barrier_destroy(&bar);
}

/* CPU seconds of terminated children (the CLI runs). */
static double children_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

/* wrk's latency "1.23ms" / "850.00us" / "1.02s" in seconds. */
static double wrk_time(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (!strncmp(end, "us", 2)) return v * 1e-6;
    if (!strncmp(end, "ms", 2)) return v * 1e-3;
    if (!strncmp(end, "s", 1)) return v;
    if (!strncmp(end, "m", 1)) return v * 60;
    return NAN;
}

/* The same predict load driven by wrk (an event-loop client: much less CPU
 * per request than a libcurl thread each) over `clients` connections, each
 * request on the next of the sessions, which bench_server's workers create
 * and fill first. */
static void run_predict_wrk(int port, pid_t pid, int clients, double seconds, int neural)
{
    worker *ws = calloc((size_t)clients, sizeof *ws);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    pthread_barrier_t bar, hold;
    pthread_barrier_init(&bar, NULL, (unsigned)clients + 1);
    pthread_barrier_init(&hold, NULL, (unsigned)clients + 1);
    for (int i = 0; i < clients; i++) {
        ws[i].port = port;
        ws[i].neural = neural;
        ws[i].id = i;
        ws[i].bar = &bar;
        ws[i].hold = &hold;
        ws[i].t_end = 0;           /* their own loop does nothing */
    }
    for (int i = 0; i < clients; i++) pthread_create(&th[i], NULL, predict_worker, &ws[i]);
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    char lua[] = "/tmp/nc-bench-wrk-XXXXXX";
    int fd = mkstemp(lua);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    long errors = 0;
    for (int i = 0; i < clients; i++) errors += ws[i].errors;
    if (f) {
        fprintf(f, "ids = {");
        for (int i = 0; i < clients; i++) fprintf(f, "%s\"%s\"", i ? "," : "", ws[i].sid);
        fprintf(f, "}\nlocal nthreads = 0\n"
                   "function setup(thread) thread:set(\"first\", nthreads); nthreads = nthreads + 1 end\n"
                   "function init(args) counter = first * math.floor(#ids / 2) end\n"
                   "function request()\n  counter = counter + 1\n"
                   "  return wrk.format(\"POST\", \"/v1/sessions/\" .. ids[(counter %% #ids) + 1] .. \"/predict\",\n"
                   "    {[\"Content-Type\"] = \"application/json\"}, '{\"top_k\":10}')\nend\n");
        fclose(f);
    }
    double b0 = daemon_metric(port, "neurocache_predict_batches_total");
    double j0 = daemon_metric(port, "neurocache_predict_batched_total");
    double c0 = process_cpu(pid), w0 = children_cpu();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "wrk -t%d -c%d -d%.0fs --latency -s %s http://127.0.0.1:%d/ 2>&1",
             clients < 2 ? 1 : 2, clients, seconds, lua, port);
    /* wrk's event loop indexes its sockets by fd number in a table sized
     * for its own connections: fds inherited from here (the workers' idle
     * connections) would push its sockets past it ("connect" errors). */
    for (int fdi = 3; fdi < 4096; fdi++) {
        int fl = fcntl(fdi, F_GETFD);
        if (fl >= 0) fcntl(fdi, F_SETFD, fl | FD_CLOEXEC);
    }
    FILE *p = popen(cmd, "r");
    double rps = NAN, p50 = NAN, p99 = NAN;
    long requests = 0, non2xx = 0, se[4] = {0, 0, 0, 0};
    char line[512];
    while (p && fgets(line, sizeof line, p)) {
        if (getenv("BENCH_VERBOSE")) fputs(line, stderr);
        char unit[32];
        double v;
        if (sscanf(line, " 50%% %31s", unit) == 1) p50 = wrk_time(unit);
        else if (sscanf(line, " 99%% %31s", unit) == 1) p99 = wrk_time(unit);
        else if (sscanf(line, " %ld requests in", &requests) == 1) {}
        else if (sscanf(line, " Non-2xx or 3xx responses: %ld", &non2xx) == 1) {}
        else if (sscanf(line, " Socket errors: connect %ld, read %ld, write %ld, timeout %ld", &se[0], &se[1],
                        &se[2], &se[3]) == 4) {}
        else if (sscanf(line, "Requests/sec: %lf", &v) == 1) rps = v;
    }
    int rc = p ? pclose(p) : -1;
    if (getenv("BENCH_VERBOSE")) { char c2[1200]; snprintf(c2, sizeof c2, "cat %s >&2", lua); if (system(c2)) {} }
    double c1 = process_cpu(pid), w1 = children_cpu();
    double b1 = daemon_metric(port, "neurocache_predict_batches_total");
    double j1 = daemon_metric(port, "neurocache_predict_batched_total");
    pthread_barrier_wait(&hold);
    for (int i = 0; i < clients; i++) pthread_join(th[i], NULL);
    unlink(lua);
    if (rc != 0 || isnan(rps)) {
        printf("| predict top-10 (wrk) | %d | wrk failed (exit %d) | | | | | | | | |\n", clients, rc);
    } else {
        double cpu = (c1 - c0) / (double)(requests ? requests : 1);
        double ccpu = (w1 - w0) / (double)(requests ? requests : 1);
        double batch = b1 > b0 ? (j1 - j0) / (b1 - b0) : NAN;
        printf("| predict top-10 (wrk) | %d | %ld | %.0f | %.2f | %.2f | %.1f | %.0f | %.0f | %.0f | %ld |\n", clients,
               requests, rps, p50 * 1e3, p99 * 1e3, batch, cpu * 1e6, 2.0 / cpu, ccpu * 1e6,
               errors + non2xx + se[0] + se[1] + se[2] + se[3]);
    }
    fflush(stdout);
    free(ws);
    free(th);
    pthread_barrier_destroy(&bar);
    pthread_barrier_destroy(&hold);
}

static void print_header(void)
{
    printf("| request | concurrent sessions | requests | predictions/s | p50 (ms) | p99 (ms) | mean batch "
           "| daemon CPU/prediction (us) | 2 cores / that (pred/s) | client CPU/prediction (us) | errors |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
}

/* ---- scoring: HTTP vs CLI ---- */

/* The same document scored through POST /v1/score and `neurocache score`:
 * wall time (best of 3; the CLI's includes process start and model load)
 * and CPU time (the daemon's during the request, the CLI process's), which
 * stays meaningful on a shared machine. */
static void run_score(int port, pid_t pid, const char *model_dir, int ntok)
{
    nc_rng r;
    rng_seed(&r, 99);
    char *text = random_text(&r, ntok);
    char path[] = "/tmp/nc-bench-doc-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        free(text);
        return;
    }
    close(fd);
    json_t *b = json_pack("{s:s}", "text", text);
    char *bs = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    client cl;
    client_init(&cl, port);
    double best_http = 1e9, best_cli = 1e9, cpu_http = 1e9, cpu_cli = 1e9;
    long tokens = 0;
    for (int rep = 0; rep < 3; rep++) {
        double c0 = process_cpu(pid), t0 = now_s();
        long st = client_post(&cl, "/v1/score", bs, strlen(bs));
        double dt = now_s() - t0, dc = process_cpu(pid) - c0;
        if (st == 200 && dt < best_http) {
            best_http = dt;
            json_t *j = json_loads(cl.b.s, 0, NULL);
            tokens = (long)json_integer_value(json_object_get(j, "count"));
            json_decref(j);
        }
        if (st == 200 && dc < cpu_http) cpu_http = dc;
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "%s score --model %s --format json %s > /dev/null 2>&1",
                 daemon_bin_path("neurocache"), model_dir, path);
        c0 = children_cpu();
        t0 = now_s();
        int rc = system(cmd);
        dt = now_s() - t0;
        dc = children_cpu() - c0;
        if (rc == 0 && dt < best_cli) best_cli = dt;
        if (rc == 0 && dc < cpu_cli) cpu_cli = dc;
    }
    if (tokens == 0 || best_cli >= 1e9) {
        /* e.g. a text over max_tokens_per_request (413): say so rather than
         * print a row of nonsense */
        printf("\nscoring: HTTP %s, CLI %s (no figures)\n", tokens ? "ok" : "failed", best_cli < 1e9 ? "ok" : "failed");
        client_free(&cl);
        free(bs);
        free(text);
        unlink(path);
        return;
    }
    printf("\n| scoring path | tokens | wall, best of 3 (s) | tokens/s (wall) | CPU, best of 3 (s) | tokens per CPU-second |\n"
           "|---|---|---|---|---|---|\n");
    printf("| HTTP POST /v1/score (incl. JSON both ways) | %ld | %.3f | %.0f | %.3f | %.0f |\n", tokens, best_http,
           tokens / best_http, cpu_http, tokens / cpu_http);
    printf("| CLI neurocache score (incl. process start, model load) | %ld | %.3f | %.0f | %.3f | %.0f |\n", tokens,
           best_cli, tokens / best_cli, cpu_cli, tokens / cpu_cli);
    printf("\nHTTP / CLI throughput: %.2f (wall), %.2f (CPU)\n", best_cli / best_http, cpu_cli / cpu_http);
    client_free(&cl);
    free(bs);
    free(text);
    unlink(path);
}

/* ---- availability under heavy work (test_server_guard's latencies) ---- */

/* Median and maximum of x[0..n) (sorts x). */
static void median_max(double *x, int n, double *med, double *max)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    *med = n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
    *max = x[n - 1];
}

static void guard_row(const char *what, const char *during, double *x, int n)
{
    double med, max;
    median_max(x, n, &med, &max);
    printf("| %s | %s | %d | %.2f | %.2f |\n", what, during, n, med * 1e3, max * 1e3);
}

/* The seconds of one request (answered with want), or NAN. */
static double timed_call(int port, const char *method, const char *path, const char *body, int want)
{
    http_resp r;
    double t0 = now_s();
    int rc = body ? http_json(port, method, path, body, &r) : http_call(port, method, path, NULL, NULL, 0, &r);
    double dt = now_s() - t0;
    bool ok = rc == 0 && r.status == want;
    http_resp_free(&r);
    return ok ? dt : NAN;
}

/* test_server_guard's heavy daemon (three workers busy with two
 * 32,000-step completions and a 1,000,000-token score): /health and /ready
 * while they run, then how soon the workers are free once the three
 * clients hang up. */
static int guard_heavy(const char *model)
{
    nc_daemon h;
    const char *hargs[] = {"--model", model, "--threads", "3", "--max-tokens-per-request", "1000000",
                           "--max-generation-steps", "100000", "--request-timeout", "600", NULL};
    if (daemon_start(&h, hargs) != 0) return 1;
    char *c = completions_body(2000, 16), *sb = score_body(999999);
    int fd[3] = {raw_post(h.port, "/v1/completions", c), raw_post(h.port, "/v1/completions", c),
                 raw_post(h.port, "/v1/score", sb)};
    free(c);
    free(sb);
    int rc = 1;
    if (daemon_wait_metric(h.port, "neurocache_work_running", 3, 30) >= 0) {
        double x[20], y[5];
        for (int i = 0; i < 20; i++) {
            x[i] = timed_call(h.port, "GET", "/health", NULL, 200);
            sleep_ms(20);
        }
        for (int i = 0; i < 5; i++)
            y[i] = timed_call(h.port, "GET", "/ready", NULL, 200);
        bool busy = daemon_metric(h.port, "neurocache_work_running") == 3;
        guard_row("GET /health", busy ? "3 workers busy (heavy work)" : "heavy work ENDED early: not valid", x, 20);
        guard_row("GET /ready", busy ? "3 workers busy (heavy work)" : "heavy work ENDED early: not valid", y, 5);
        double t0 = now_s();
        for (int i = 0; i < 3; i++)
            if (fd[i] >= 0) close(fd[i]);
        fd[0] = fd[1] = fd[2] = -1;
        double t = daemon_wait_metric(h.port, "neurocache_work_running", 0, 30) >= 0 ? now_s() - t0 : NAN;
        guard_row("3 clients hang up -> workers free", "3 workers busy (heavy work)", &t, 1);
        rc = 0;
    }
    for (int i = 0; i < 3; i++)
        if (fd[i] >= 0) close(fd[i]);
    daemon_stop(&h);
    return rc;
}

/* test_server_guard's small daemon: each over-budget request, refused 413
 * before any work (its 360 kB JSON body parsed). */
static int guard_refusals(const char *model)
{
    nc_daemon d;
    const char *sargs[] = {"--model", model, "--threads", "1", "--max-queued", "1", NULL};
    if (daemon_start(&d, sargs) != 0) return 1;
    char *c = completions_body(2000, 16), *s60 = score_body(60000), *s20 = score_body(20000);
    http_resp r;
    char path[256] = "";
    if (http_json(d.port, "POST", "/v1/sessions", "{\"namespace\":\"nb\",\"cache\":{\"unbounded\":true}}", &r) == 0 &&
        r.status == 201)
        snprintf(path, sizeof path, "/v1/sessions/%s/feed", json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    double x[3][10];
    for (int i = 0; i < 10; i++) {
        x[0][i] = timed_call(d.port, "POST", "/v1/completions", c, 413);
        x[1][i] = timed_call(d.port, "POST", "/v1/score", s60, 413);
        x[2][i] = path[0] ? timed_call(d.port, "POST", path, s20, 413) : NAN;
    }
    guard_row("413 over_budget: completions 2,000 prompts x 16", "idle, 1 worker", x[0], 10);
    guard_row("413 too_many_tokens: score 60,000 tokens", "idle, 1 worker", x[1], 10);
    guard_row("413 over_budget: feed 20,000 tokens x knn 1024", "idle, 1 worker", x[2], 10);
    free(c);
    free(s60);
    free(s20);
    return daemon_stop(&d) == 0 ? 0 : 1;
}

static int run_guard(const char *model)
{
    printf("| request | while | n | median (ms) | slowest (ms) |\n|---|---|---|---|---|\n");
    int rc = guard_heavy(model);
    return guard_refusals(model) || rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *clients_s = "1,16,64", *threads = "2";
    double seconds = 3;
    int score_tokens = 45000, neural = 2000, port = 0, batch = 1, use_wrk = 0, heavy = 0, fair_clients = 16, guard = 0;
    const char *keep_model = NULL, *data_dir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients")) clients_s = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = argv[i + 1];
        else if (!strcmp(argv[i], "--score-tokens")) score_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--neural")) neural = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--write-model")) keep_model = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--f16")) f16 = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--wrk")) use_wrk = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heavy")) heavy = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--fair-clients")) fair_clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--data-dir")) data_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--namespace")) ns_name = argv[i + 1];
        else if (!strcmp(argv[i], "--knn")) ub_knn = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--nprobe")) ub_nprobe = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--stream")) heavy = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--feed-between")) feed_between = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--guard")) guard = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    char dir[] = "/tmp/nc-bench-model-XXXXXX";
    if (keep_model) {
        /* Only write the random model (for profiling a daemon by hand). */
        if (make_model(keep_model, 10000, 256) != 0) return 1;
        printf("random 2 x 256 model written to %s\n", keep_model);
        return 0;
    }
    if (port > 0) {
        /* A daemon started by hand (e.g. under perf): predict load only. */
        load_words(model ? model : "/nonexistent");
        if (nwords < 2) {
            fprintf(stderr, "bench_server: --port needs --model DIR for its vocabulary\n");
            return 2;
        }
        httpc_init();
        print_header();
        char cs[64];
        snprintf(cs, sizeof cs, "%s", clients_s);
        for (char *tok = strtok(cs, ","); tok; tok = strtok(NULL, ","))
            run_predict(port, 0, atoi(tok), seconds, neural, 0, NULL, NULL);
        httpc_cleanup();
        return 0;
    }
    if (!model) {
        if (!mkdtemp(dir) || make_model(dir, 10000, 256) != 0) return 1;
        model = dir;
    }
    httpc_init();
    if (guard) {
        int grc = run_guard(model);
        httpc_cleanup();
        return grc;
    }
    nc_daemon d;
    /* --request-timeout: on a loaded machine 64 sessions' 2,000-token fills
     * queued behind 2 workers outlived the default 30 s (503), and the
     * sessions then predicted from a near-empty window */
    const char *args[] = {"--model", model, "--threads", threads, "--max-sessions", "1000", "--batch-predict",
                          batch ? "true" : "false", "--request-timeout", "600", data_dir ? "--data-dir" : NULL,
                          data_dir, NULL};
    /* daemon_start passes --threads 2 itself; ours comes later and wins. */
    if (daemon_start(&d, args) != 0) return 1;
    load_words(model);
    if (nwords < 2) {
        fprintf(stderr, "bench_server: no words in %s/vocab.txt\n", model);
        daemon_stop(&d);
        return 1;
    }
    {
        http_resp mr;
        json_t *mj = NULL;
        if (http_json(d.port, "GET", "/v1/model", NULL, &mr) == 0 && mr.status == 200)
            mj = json_incref(mr.json);
        http_resp_free(&mr);
        printf("model %s (%lld x %lld LSTM, V = %lld), neural cache %d entries (%s keys), server threads %s, "
               "predict batching %s, %.0f s per row\n\n",
               model == dir ? "random" : model, (long long)json_integer_value(json_object_get(mj, "num_layers")),
               (long long)json_integer_value(json_object_get(mj, "hidden_size")),
               (long long)json_integer_value(json_object_get(mj, "vocab_size")), neural, f16 ? "float16" : "float32",
               threads, batch ? "on" : "off", seconds);
        json_decref(mj);
        if (ns_name) {
            char path[160];
            snprintf(path, sizeof path, "/v1/namespaces/%s", ns_name);
            if (http_json(d.port, "GET", path, NULL, &mr) != 0 || mr.status != 200) {
                fprintf(stderr, "bench_server: namespace %s not found under the data_dir\n", ns_name);
                http_resp_free(&mr);
                daemon_stop(&d);
                return 1;
            }
            char *desc = json_dumps(mr.json, JSON_COMPACT);
            printf("namespace %s: %s\n\n", ns_name, desc);
            free(desc);
            http_resp_free(&mr);
        }
    }
    print_header();
    char cs[64];
    snprintf(cs, sizeof cs, "%s", clients_s);
    for (char *tok = strtok(cs, ","); tok; tok = strtok(NULL, ","))
        if (use_wrk)
            run_predict_wrk(d.port, d.pid, atoi(tok), seconds, neural);
        else
            run_predict(d.port, d.pid, atoi(tok), seconds, neural, 0, NULL, NULL);
    if (heavy > 0) {
        /* fairness: the same predict load without and with heavy scoring
         * clients, one after the other in this run */
        double a50, a99, b50, b99;
        run_predict(d.port, d.pid, fair_clients, seconds, neural, 0, &a50, &a99);
        run_predict(d.port, d.pid, fair_clients, seconds, neural, heavy, &b50, &b99);
        printf("\nfairness: %d sessions' predict p50 %.2f -> %.2f ms (x%.2f), p99 %.2f -> %.2f ms (x%.2f) with %d %s\n",
               fair_clients, a50 * 1e3, b50 * 1e3, b50 / a50, a99 * 1e3, b99 * 1e3, b99 / a99, heavy,
               ns_name ? "clients streaming documents into the namespace" : "heavy scoring clients");
    }
    if (score_tokens > 0)
        run_score(d.port, d.pid, model, score_tokens);
    int rc = daemon_stop(&d);
    httpc_cleanup();
    if (model == dir) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) { /* best effort */ }
    }
    return rc == 0 ? 0 : 1;
}
