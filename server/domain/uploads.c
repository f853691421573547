/* uploads.c -- documents streamed into a namespace (uploads.h): tokenised
 * and run through the LSTM on the request's thread as the body arrives,
 * each batch of pairs added (log record + index add) by a worker thread,
 * durable before the answer. */
#include "uploads.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "api_errors.h"
#include "lstm.h"

#define UPLOAD_BATCH 512          /* tokens per LSTM pass */
#define UPLOAD_ADD_CHUNK 32       /* tokens per add (log record): the write lock's hold; from
                                   * 20 keys FAISS's coarse search is one BLAS product */
#define UPLOAD_MAX_WORD (1 << 20) /* a "word" longer than this is refused */

/* What GET /v1/namespaces/{ns} shows of an upload in progress (an HTTP
 * answer cannot start before libmicrohttpd has read the whole body, so a
 * long upload's progress is read here). Counters are written by the
 * upload's threads, read by anyone; the list and document are under the
 * registry's lock. */
typedef struct upload_progress {
    struct upload_progress *prev, *next;
    const ns_handle *ns;          /* the namespace it adds to */
    char document[160];           /* id of the document being read (under the lock) */
    _Atomic uint64_t bytes, documents, tokens_added;
    double started;
} upload_progress;

/* The uploads in progress (srv->uploads). */
struct upload_registry {
    pthread_mutex_t lock;
    upload_progress *head;
};

enum { UP_PLAIN = 0, UP_NDJSON = 1 };

/* An upload runs on two threads: its HTTP thread tokenizes and runs the
 * LSTM (sequential within a document), a worker adds each batch of pairs
 * to the namespace (log record + index add: the IVF assignment and PQ
 * encoding cost as much as the LSTM). Batches go from one to the other
 * through a small ring, in order. */
#define UPLOAD_SLOTS 3

typedef struct {
    float *keys;                  /* [UPLOAD_BATCH, H] */
    int *wids;
    size_t n;
    uint32_t doc;
    uint64_t off;
} upload_batch;

typedef struct {
    pthread_t thread;
    bool started, stop;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    upload_batch slot[UPLOAD_SLOTS];
    unsigned head, count;         /* next batch to add; batches queued, the one
                                   * being added included until it is done */
    int rc;                       /* first failure of an add, NC_OK so far */
    char err[NC_ERRLEN];
    uint64_t last_seq;            /* of the batches added (their tokens: prog) */
} upload_worker;

struct upload {
    nc_server *srv;
    ns_handle *r;
    int mode;
    char *carry;                  /* bytes not processed yet (partial word or line) */
    size_t clen, ccap;
    nc_state *st;
    nc_lstm_work *work;
    float *h;                     /* [H] h before the next token (key of its pair) */
    float *hid;                   /* [UPLOAD_BATCH, H] */
    int *wids;
    upload_worker w;
    upload_progress prog;         /* listed in srv->uploads while registered */
    bool listed;
    bool doc_open;
    uint32_t doc;
    uint64_t off;                 /* token offset in the document */
    char plain_id[1100];          /* ?id= of a plain-text upload */
    bool raw;                     /* ?normalize=false: the text is already in the model's conventions */
    uint64_t lines;
    json_t *ids;                  /* document ids (first 1000) */
    bool failed;
    api_error code;
    char msg[600];
    pid_t niced_tid;              /* the connection thread upload_open reniced, or 0 */
    int saved_nice;               /* its nice value before */
};

static void *upload_worker_main(void *arg);

/* Waits until every queued batch is added; the first add failure (rc, err)
 * stays in the worker. */
static void upload_drain(upload_worker *w)
{
    pthread_mutex_lock(&w->lock);
    while (w->count > 0)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

/* Off the namespace's list of uploads in progress: before the answer goes
 * out, so that a client reading the namespace after it no longer sees it. */
static void upload_unlist(upload *u)
{
    if (!u->listed)
        return;
    upload_registry *g = u->srv->uploads;
    pthread_mutex_lock(&g->lock);
    if (u->prog.prev)
        u->prog.prev->next = u->prog.next;
    else
        g->head = u->prog.next;
    if (u->prog.next)
        u->prog.next->prev = u->prog.prev;
    u->listed = false;
    pthread_mutex_unlock(&g->lock);
}

/* On the list of uploads in progress (GET /v1/namespaces/{ns} shows it). */
static void upload_list(upload *u)
{
    upload_registry *g = u->srv->uploads;
    u->prog.started = nc_now_s();
    u->prog.ns = u->r;
    pthread_mutex_lock(&g->lock);
    u->prog.next = g->head;
    if (g->head)
        g->head->prev = &u->prog;
    g->head = &u->prog;
    u->listed = true;
    pthread_mutex_unlock(&g->lock);
}

void upload_free(void *p)
{
    upload *u = p;
    if (!u)
        return;
    upload_worker *w = &u->w;
    if (w->started) {
        /* a failed or abandoned upload: what was queued is still added (it
         * is in the answer's counts), then the worker ends */
        upload_drain(w);
        pthread_mutex_lock(&w->lock);
        w->stop = true;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thread, NULL);
    }
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    for (int i = 0; i < UPLOAD_SLOTS; i++) {
        nc_free(w->slot[i].keys);
        free(w->slot[i].wids);
    }
    upload_unlist(u);
    /* The connection thread back to its nice value for its next request
     * (on the same thread: libmicrohttpd's thread per connection). Lowering
     * it needs CAP_SYS_NICE: refused, the thread stays nice until its
     * connection closes, which only slows that client's next requests. */
    if (u->niced_tid && u->niced_tid == (pid_t)syscall(SYS_gettid))
        (void)setpriority(PRIO_PROCESS, (id_t)u->niced_tid, u->saved_nice);
    if (u->r)
        namespaces_release(u->srv, u->r);
    free(u->carry);
    lstm_state_free(u->st);
    lstm_work_free(u->work);
    nc_free(u->h);
    nc_free(u->hid);
    free(u->wids);
    json_decref(u->ids);
    free(u);
}

static void up_fail(upload *u, api_error code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void up_fail(upload *u, api_error code, const char *fmt, ...)
{
    if (u->failed)
        return;
    u->failed = true;
    u->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(u->msg, sizeof u->msg, fmt, ap);
    va_end(ap);
}

/* The buffers of an upload on srv's model; NULL when out of memory. */
static upload *upload_alloc(nc_server *srv)
{
    upload *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    u->srv = srv;
    const int H = srv->model->cfg.hidden_size;
    u->st = lstm_state_new(srv->model);
    u->work = lstm_work_new(srv->model);
    u->h = nc_alloc((size_t)H * sizeof(float));
    u->hid = nc_alloc((size_t)UPLOAD_BATCH * H * sizeof(float));
    u->wids = malloc(UPLOAD_BATCH * sizeof(int));
    u->ids = json_array();
    pthread_mutex_init(&u->w.lock, NULL);
    pthread_cond_init(&u->w.cond, NULL);
    bool slots = true;
    for (int i = 0; i < UPLOAD_SLOTS; i++) {
        u->w.slot[i].keys = nc_alloc((size_t)UPLOAD_BATCH * H * sizeof(float));
        u->w.slot[i].wids = malloc(UPLOAD_BATCH * sizeof(int));
        slots = slots && u->w.slot[i].keys && u->w.slot[i].wids;
    }
    if (!u->st || !u->work || !u->h || !u->hid || !u->wids || !u->ids || !slots) {
        upload_free(u);
        return NULL;
    }
    return u;
}

upload *upload_open(nc_server *srv, const char *ns, const char *content_type, const char *plain_id,
                    const char *normalize)
{
    upload *u = upload_alloc(srv);
    if (!u)
        return NULL;
    if (normalize && strcmp(normalize, "true") && strcmp(normalize, "false"))
        up_fail(u, API_OUT_OF_RANGE, "?normalize= must be true or false, not '%s'", normalize);
    u->raw = normalize && !strcmp(normalize, "false");
    const char *ct = content_type;
    if (ct && (strncasecmp(ct, "application/x-ndjson", 20) == 0 || strncasecmp(ct, "application/jsonl", 17) == 0 ||
               strncasecmp(ct, "application/ndjson", 18) == 0 || strncasecmp(ct, "application/json-seq", 20) == 0))
        u->mode = UP_NDJSON;
    else if (ct && strncasecmp(ct, "text/plain", 10) != 0)
        up_fail(u, API_UNSUPPORTED_MEDIA, "Content-Type must be text/plain (one document) or application/x-ndjson "
                "(lines {\"id\": ..., \"text\": ...}), not %s", ct);
    if (plain_id) {
        if (u->mode == UP_NDJSON)
            up_fail(u, API_OUT_OF_RANGE, "?id= names the document of a plain-text upload; NDJSON lines carry their own");
        snprintf(u->plain_id, sizeof u->plain_id, "%s", plain_id);
    }
    char err[NC_ERRLEN] = "";
    int rc = NC_OK;
    if (!u->failed && !(u->r = namespaces_acquire_rc(srv, ns, true, &rc, err, sizeof err)))
        up_fail(u, api_error_from_namespace(rc), "%s", err);
    if (!u->failed) {
        /* an upload's two threads run at worker_nice: the LSTM over a
         * document (a core for seconds) and the adds must not take the
         * cores from predicts, which at nice 0 preempt them */
        u->niced_tid = workguard_nice_thread(srv->cfg.worker_nice, &u->saved_nice);
        if (pthread_create(&u->w.thread, NULL, upload_worker_main, u) != 0) {
            upload_free(u);
            return NULL;
        }
        u->w.started = true;
        upload_list(u);
    }
    return u;
}

/* The worker: adds the queued batches in order; after a failure it only
 * drops what is queued (the HTTP thread reports the failure). */
static void *upload_worker_main(void *arg)
{
    upload *u = arg;
    upload_worker *w = &u->w;
    char err[NC_ERRLEN];
    int before;
    (void)workguard_nice_thread(u->srv->cfg.worker_nice, &before);
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (w->count == 0 && !w->stop)
            pthread_cond_wait(&w->cond, &w->lock);
        if (w->count == 0)
            break;
        upload_batch *b = &w->slot[w->head];
        int failed = w->rc;
        pthread_mutex_unlock(&w->lock);
        /* An add holds the namespace's write lock for its whole batch (f16
         * rounding, the log record, the PQ encoding; the coarse search that
         * places the keys runs before, under the read lock: nsstore_add),
         * and every session reading the namespace waits for it: added
         * UPLOAD_ADD_CHUNK tokens at a time (BENCHMARKS.md "The daemon with
         * a 1M-entry namespace"). A failure keeps the chunks before it. */
        int rc = failed;
        for (size_t c0 = 0; !rc && c0 < b->n; c0 += UPLOAD_ADD_CHUNK) {
            size_t cn = b->n - c0 < UPLOAD_ADD_CHUNK ? b->n - c0 : UPLOAD_ADD_CHUNK;
            uint64_t seq = 0;
            const nsstore_pairs pairs = {.keys = b->keys + c0 * (size_t)u->srv->model->cfg.hidden_size,
                                         .words = b->wids + c0,
                                         .n = cn,
                                         .doc = b->doc,
                                         .off = b->off + c0};
            rc = nsstore_add(namespaces_store(u->r), &pairs, &seq, err, sizeof err);
            if (!rc) {
                pthread_mutex_lock(&w->lock);
                w->last_seq = seq;
                u->prog.tokens_added += cn;
                pthread_mutex_unlock(&w->lock);
                namespaces_count_added(u->srv, cn);
            }
        }
        pthread_mutex_lock(&w->lock);
        if (rc && !w->rc) {
            w->rc = rc;
            snprintf(w->err, sizeof w->err, "%s", err);
        }
        w->head = (w->head + 1) % UPLOAD_SLOTS;
        w->count--;
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* The failure of an add made by the worker, as the upload's error. */
static int upload_worker_failed(upload *u)
{
    pthread_mutex_lock(&u->w.lock);
    int rc = u->w.rc;
    pthread_mutex_unlock(&u->w.lock);
    if (rc)
        up_fail(u, api_error_from_storage(rc, API_INTERNAL),
                "adding to namespace '%s': %s", namespaces_name(u->r), u->w.err);
    return rc;
}

/* Starts a document: state = zero advanced by eos (design §3), as a session. */
static int doc_start(upload *u, const char *id, size_t len)
{
    char err[NC_ERRLEN] = "", used[1100] = "";
    if (len >= 5 && !memcmp(id, "repl:", 5)) {
        /* the documents of entries applied from other replicas: the
         * publisher does not publish them again (replication.h) */
        up_fail(u, API_OUT_OF_RANGE, "document %llu: ids starting with 'repl:' are reserved for replication",
                (unsigned long long)u->prog.documents + 1);
        return -1;
    }
    int rc = nsstore_doc_begin(namespaces_store(u->r), id, len, &u->doc, err, sizeof err);
    if (rc == NC_OK)
        rc = nsstore_doc_info(namespaces_store(u->r), u->doc, used, sizeof used, NULL);
    if (rc != NC_OK) {
        /* a bad id (400), or the log under the DOC record (503/507) */
        up_fail(u, api_error_from_core(rc), "document %llu: %s", (unsigned long long)u->prog.documents + 1, err);
        return -1;
    }
    const nc_model *m = u->srv->model;
    lstm_state_reset(u->st);
    lstm_step(m, u->st, m->eos_id, u->work);
    memcpy(u->h, lstm_state_top(u->st), (size_t)m->cfg.hidden_size * sizeof(float));
    u->doc_open = true;
    u->off = 0;
    u->prog.documents++;
    pthread_mutex_lock(&u->srv->uploads->lock);
    snprintf(u->prog.document, sizeof u->prog.document, "%s", used);
    pthread_mutex_unlock(&u->srv->uploads->lock);
    namespaces_count_document(u->srv);
    if (json_array_size(u->ids) < 1000)
        json_array_append_new(u->ids, json_string(used));
    return 0;
}

/* Runs tokens through the model in batches and adds every pair (h before
 * token j, token j) with its provenance. */
static int add_tokens(upload *u, const nc_tokens *t)
{
    const nc_model *m = u->srv->model;
    const int H = m->cfg.hidden_size;
    nc_wordtable *words = nsstore_words(namespaces_store(u->r));
    char err[NC_ERRLEN] = "";
    for (size_t j0 = 0; j0 < t->n; j0 += UPLOAD_BATCH) {
        size_t nb = t->n - j0 < UPLOAD_BATCH ? t->n - j0 : UPLOAD_BATCH;
        for (size_t j = 0; j < nb; j++) {
            int id = t->ids[j0 + j];
            if (id == m->unk_id && t->words[j0 + j]) {
                /* open vocabulary: the namespace remembers the word itself */
                id = wordtable_id(words, t->words[j0 + j], strlen(t->words[j0 + j]), true);
                if (id < 0) {
                    up_fail(u, API_INTERNAL, "word table: out of memory");
                    return -1;
                }
            }
            u->wids[j] = id;
        }
        if (lstm_forward_seq(m, u->st, t->ids + j0, nb, u->hid, err, sizeof err) != NC_OK) {
            up_fail(u, API_INTERNAL, "model: %s", err);
            return -1;
        }
        /* hand the batch to the worker: wait for a free slot */
        upload_worker *w = &u->w;
        pthread_mutex_lock(&w->lock);
        while (w->count == UPLOAD_SLOTS && !w->rc)
            pthread_cond_wait(&w->cond, &w->lock);
        int failed = w->rc;
        /* head + count is where the next batch goes; the worker moves
         * head and count together, and reads only slot[head] */
        upload_batch *b = &w->slot[(w->head + w->count) % UPLOAD_SLOTS];
        pthread_mutex_unlock(&w->lock);
        if (failed) {
            upload_worker_failed(u);
            return -1;
        }
        memcpy(b->keys, u->h, (size_t)H * sizeof(float));
        memcpy(b->keys + H, u->hid, (nb - 1) * (size_t)H * sizeof(float));
        memcpy(b->wids, u->wids, nb * sizeof(int));
        b->n = nb;
        b->doc = u->doc;
        b->off = u->off;
        memcpy(u->h, u->hid + (nb - 1) * (size_t)H, (size_t)H * sizeof(float));
        pthread_mutex_lock(&w->lock);
        w->count++;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
        u->off += nb;
    }
    return 0;
}

static int add_text(upload *u, const char *text, size_t len, bool final_eos)
{
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN] = "";
    int rc = tokenize_ex(u->srv->model, text, len, final_eos, !u->raw, &t, err, sizeof err);
    if (rc != NC_OK)
        up_fail(u, rc == NC_EFORMAT ? API_INVALID_TEXT : API_INTERNAL, "document %llu: %s",
                (unsigned long long)u->prog.documents, err);
    else
        rc = add_tokens(u, &t);
    tokens_clear(&t);
    return rc;
}

static int ndjson_line(upload *u, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
        len--;
    if (len == 0)
        return 0;   /* blank lines are allowed */
    u->lines++;
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        up_fail(u, o ? API_INVALID_TYPE : API_INVALID_JSON, "line %llu: %s", (unsigned long long)u->lines,
                o ? "each line must be an object {\"id\": ..., \"text\": ...}" : je.text);
        json_decref(o);
        return -1;
    }
    json_t *text = json_object_get(o, "text"), *id = json_object_get(o, "id");
    static const char *const keys[] = {"id", "text", NULL};
    api_status st;
    if (proto_check_keys(o, keys, &st)) {
        up_fail(u, st.code, "line %llu: %s", (unsigned long long)u->lines, st.message);
        json_decref(o);
        return -1;
    }
    if (!json_is_string(text) || (id && !json_is_string(id) && !json_is_null(id))) {
        up_fail(u, text ? API_INVALID_TYPE : API_MISSING_FIELD, "line %llu: %s", (unsigned long long)u->lines,
                !text ? "field 'text' is required" : !json_is_string(text) ? "field 'text' must be a string"
                                                                           : "field 'id' must be a string");
        json_decref(o);
        return -1;
    }
    int rc = doc_start(u, json_is_string(id) ? json_string_value(id) : NULL,
                       json_is_string(id) ? json_string_length(id) : 0);
    if (rc == 0)
        rc = add_text(u, json_string_value(text), json_string_length(text), true);
    u->doc_open = false;
    json_decref(o);
    return rc;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

void upload_chunk(upload *u, const char *data, size_t len)
{
    u->prog.bytes += len;
    if (u->failed)
        return;   /* the rest of the body is read and dropped */
    long max_line = u->srv->cfg.max_body_bytes;
    /* the unprocessed tail plus this chunk */
    if (u->clen + len + 1 > u->ccap) {
        size_t cap = u->ccap ? u->ccap : 65536;
        while (cap < u->clen + len + 1)
            cap *= 2;
        char *c = realloc(u->carry, cap);
        if (!c) {
            up_fail(u, API_INTERNAL, "out of memory");
            return;
        }
        u->carry = c;
        u->ccap = cap;
    }
    memcpy(u->carry + u->clen, data, len);
    u->clen += len;
    size_t done = 0;
    if (u->mode == UP_NDJSON) {
        char *nl;
        while ((nl = memchr(u->carry + done, '\n', u->clen - done))) {
            size_t l = (size_t)(nl - (u->carry + done));
            if (ndjson_line(u, u->carry + done, l) != 0)
                return;
            done += l + 1;
        }
        if (u->clen - done > (size_t)max_line) {
            up_fail(u, API_BODY_TOO_LARGE, "NDJSON line %llu is longer than max_body_bytes (%ld); stream long "
                    "documents as text/plain", (unsigned long long)u->lines + 1, max_line);
            return;
        }
    } else {
        /* plain text: everything up to the last white space is complete
         * words (and newlines, which become eos); the rest waits */
        size_t cut = u->clen;
        while (cut > 0 && !is_space(u->carry[cut - 1]))
            cut--;
        if (cut > 0) {
            if (!u->doc_open && doc_start(u, u->plain_id[0] ? u->plain_id : NULL, strlen(u->plain_id)) != 0)
                return;
            if (add_text(u, u->carry, cut, false) != 0)
                return;
            done = cut;
        } else if (u->clen > UPLOAD_MAX_WORD) {
            up_fail(u, API_INVALID_TEXT, "a word of more than %d bytes", UPLOAD_MAX_WORD);
            return;
        }
    }
    memmove(u->carry, u->carry + done, u->clen - done);
    u->clen -= done;
}

int upload_finish(upload *u, upload_result *res)
{
    if (!u->failed && u->clen > 0) {
        if (u->mode == UP_NDJSON)
            ndjson_line(u, u->carry, u->clen);
        else {
            if (!u->doc_open)
                doc_start(u, u->plain_id[0] ? u->plain_id : NULL, strlen(u->plain_id));
            if (!u->failed)
                add_text(u, u->carry, u->clen, true);
        }
        u->clen = 0;
    }
    /* every batch added, then durable before the answer -- also what was
     * added before a failure, which the error message reports */
    if (u->w.started) {
        upload_drain(&u->w);
        upload_worker_failed(u);
    }
    char err[NC_ERRLEN] = "";
    int rc = u->r ? nsstore_sync(namespaces_store(u->r), u->w.last_seq, err, sizeof err) : NC_OK;
    upload_unlist(u);
    if (u->r && !namespaces_live(u->r)) {
        /* deleted while it streamed: whatever it added went with the
         * deleted incarnation (its store refused the rest) -- never a 200,
         * and this error rather than the refused add's */
        u->failed = false;
        up_fail(u, API_NAMESPACE_DELETED, "namespace '%s' (incarnation %llu) was deleted during the upload; "
                "nothing of it is kept", namespaces_name(u->r), (unsigned long long)namespaces_incarnation(u->r));
    }
    if (rc != NC_OK && !u->failed)
        up_fail(u, api_error_from_core(rc), "making the upload durable: %s", err);
    res->documents = u->prog.documents;
    res->tokens_added = u->prog.tokens_added;
    if (u->failed) {
        res->code = u->code;
        snprintf(res->msg, sizeof res->msg, "%s", u->msg);
        return -1;
    }
    res->code = API_OK;
    res->msg[0] = 0;
    res->ns = namespaces_name(u->r);
    res->ids = u->ids;
    res->entries = (int64_t)unbounded_cache_count(nsstore_unbounded_cache(namespaces_store(u->r)));
    res->incarnation = namespaces_incarnation(u->r);
    return 0;
}

/* ---- uploads in progress ------------------------------------------------------ */

int uploads_init(nc_server *srv, char *err, size_t errlen)
{
    upload_registry *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&g->lock, NULL);
    srv->uploads = g;
    return 0;
}

void uploads_shutdown(nc_server *srv)
{
    upload_registry *g = srv->uploads;
    if (!g)
        return;
    pthread_mutex_destroy(&g->lock);
    free(g);
    srv->uploads = NULL;
}

size_t uploads_in_progress(nc_server *srv, const ns_handle *ns, upload_status **out)
{
    upload_registry *g = srv->uploads;
    *out = NULL;
    if (!g)
        return 0;
    double t = nc_now_s();
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&g->lock);
    for (upload_progress *p = g->head; p; p = p->next)
        cap += p->ns == ns;
    upload_status *a = cap ? calloc(cap, sizeof *a) : NULL;
    for (upload_progress *p = g->head; a && p; p = p->next) {
        if (p->ns != ns)
            continue;
        snprintf(a[n].document, sizeof a[n].document, "%s", p->document);
        a[n].bytes = p->bytes;
        a[n].documents = p->documents;
        a[n].tokens_added = p->tokens_added;
        a[n].seconds = t - p->started;
        n++;
    }
    pthread_mutex_unlock(&g->lock);
    *out = a;
    return n;
}
