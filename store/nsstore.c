/* nsstore.c -- a durable namespace: unbounded cache + word table +
 * provenance, write-ahead log, snapshots, recovery. */
#include "nsstore.h"
#include "buf.h"
#include "fault.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define REC_DOC 1
#define REC_ADD 2
#define KEY_F16 1
#define DOC_ID_MAX 1024
#define PROV_MAGIC "NCPROV01"
#define DOCS_MAGIC "NCDOCS01"
#define MANIFEST_HEAD "neurocache-snapshot 1"

static const char *const snap_files[] = {"index.faiss", "values.bin", "words.txt", "prov.bin", "docs.bin"};
#define NSNAPFILES 5

struct nc_nsstore {
    char dir[1024], waldir[1100];
    const nc_model *m;
    int V, H;
    uint32_t tag;
    nc_unbounded_cache_opts ubo;
    nc_wal_sync sync;
    nc_wordtable *words;
    nc_unbounded_cache *ub;
    nc_wal *wal;
    /* provenance and documents, guarded by meta */
    pthread_rwlock_t meta;
    uint32_t *prov_doc, *prov_off;
    size_t nprov, provcap;
    char **doc_ids;
    uint64_t *doc_pairs;
    uint32_t ndocs, doccap;
    /* hook state: only touched under the cache's write lock */
    bool replaying;
    nsstore_observer obs;         /* replication (server/replication.c) */
    void *obs_ctx;
    nc_buf rec;                   /* the ADD record being built (grown, reused) */
    int *dyn;                     /* dynamic ids of the record being built */
    size_t dyn_cap;
    /* snapshots */
    pthread_mutex_t snap_lock;
    uint64_t snap_seq, prev_snap_seq;
    double snap_time, snap_secs;
    uint64_t retain;              /* nsstore_retain_log (atomic) */
};

static __thread struct {
    nc_nsstore *ns;
    uint32_t doc;
    uint64_t off;
    uint64_t seq;
} tl;

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint32_t nsstore_model_tag(const nc_model *m)
{
    uint32_t hdr[3] = {(uint32_t)m->cfg.vocab_size, (uint32_t)m->cfg.hidden_size,
                       (uint32_t)m->cfg.num_layers};
    uLong c = crc32(0L, (const Bytef *)hdr, sizeof hdr);
    for (int i = 0; i < m->cfg.vocab_size; i++) {
        const char *w = vocab_word(m->vocab, i);
        if (w)
            c = crc32(c, (const Bytef *)w, (uInt)strlen(w) + 1);
    }
    return (uint32_t)c;
}

void nsstore_set_context(nc_nsstore *ns, uint32_t doc, uint64_t off)
{
    tl.ns = ns;
    tl.doc = doc;
    tl.off = off;
    tl.seq = 0;
}

uint64_t nsstore_context_seq(void)
{
    return tl.seq;
}

void nsstore_clear_context(void)
{
    memset(&tl, 0, sizeof tl);
}

nc_unbounded_cache *nsstore_unbounded_cache(nc_nsstore *ns) { return ns->ub; }
nc_wordtable *nsstore_words(nc_nsstore *ns) { return ns->words; }

/* ---- provenance and documents (meta lock) --------------------------------- */

static int prov_append(nc_nsstore *ns, int64_t first_id, size_t n, uint32_t doc, uint64_t off,
                       char *err, size_t errlen)
{
    int rc = NC_OK;
    pthread_rwlock_wrlock(&ns->meta);
    if ((int64_t)ns->nprov != first_id) {
        rc = nc_error(err, errlen, NC_ESTATE, "provenance holds %zu pairs, the cache %lld", ns->nprov,
                      (long long)first_id);
        goto out;
    }
    if (doc != NSSTORE_NO_DOC && doc >= ns->ndocs) {
        rc = nc_error(err, errlen, NC_EFORMAT, "pairs of unknown document %u", doc);
        goto out;
    }
    if (ns->nprov + n > ns->provcap) {
        size_t c = ns->provcap ? ns->provcap : 4096;
        while (c < ns->nprov + n)
            c *= 2;
        uint32_t *a = realloc(ns->prov_doc, c * sizeof *a);
        if (a)
            ns->prov_doc = a;
        uint32_t *b = a ? realloc(ns->prov_off, c * sizeof *b) : NULL;
        if (b)
            ns->prov_off = b;
        if (!a || !b) {
            rc = nc_error(err, errlen, NC_ENOMEM, "provenance of %zu pairs", c);
            goto out;
        }
        ns->provcap = c;
    }
    for (size_t i = 0; i < n; i++) {
        ns->prov_doc[ns->nprov + i] = doc;
        ns->prov_off[ns->nprov + i] = (uint32_t)(off + i);
    }
    ns->nprov += n;
    if (doc != NSSTORE_NO_DOC)
        ns->doc_pairs[doc] += n;
out:
    pthread_rwlock_unlock(&ns->meta);
    return rc;
}

/* meta write lock held */
static int doc_push(nc_nsstore *ns, const char *id, size_t len, char *err, size_t errlen)
{
    if (ns->ndocs == ns->doccap) {
        uint32_t c = ns->doccap ? 2 * ns->doccap : 64;
        char **a = realloc(ns->doc_ids, c * sizeof *a);
        if (a)
            ns->doc_ids = a;
        uint64_t *b = a ? realloc(ns->doc_pairs, c * sizeof *b) : NULL;
        if (b)
            ns->doc_pairs = b;
        if (!a || !b)
            return nc_error(err, errlen, NC_ENOMEM, "document table");
        ns->doccap = c;
    }
    char *s = malloc(len + 1);
    if (!s)
        return nc_error(err, errlen, NC_ENOMEM, "document id");
    memcpy(s, id, len);
    s[len] = 0;
    ns->doc_ids[ns->ndocs] = s;
    ns->doc_pairs[ns->ndocs] = 0;
    ns->ndocs++;
    return NC_OK;
}

static bool valid_doc_id(const char *id, size_t len)
{
    if (len == 0 || len > DOC_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)id[i] < 0x20)
            return false;   /* no control characters (newlines, NUL) */
    return true;
}

int nsstore_doc_begin(nc_nsstore *ns, const char *id, size_t len, uint32_t *doc, char *id_out,
                      size_t id_len, char *err, size_t errlen)
{
    char gen[64];
    if (!id || len == 0) {
        /* generated below under the lock, from the document number */
        id = NULL;
    } else if (!valid_doc_id(id, len)) {
        return nc_error(err, errlen, NC_EINVAL, "document id must be 1-%d bytes without control characters",
                        DOC_ID_MAX);
    }
    /* The DOC record and the table entry are made under the meta lock so
     * that document numbers in the log follow the table's order. */
    pthread_rwlock_wrlock(&ns->meta);
    uint32_t d = ns->ndocs;
    if (!id) {
        snprintf(gen, sizeof gen, "doc-%u", d);
        id = gen;
        len = strlen(gen);
    }
    size_t plen = 12 + len;
    unsigned char *p = malloc(plen);
    int rc = p ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "log record");
    if (!rc) {
        uint32_t l32 = (uint32_t)len;
        memset(p, 0, 4);
        p[0] = REC_DOC;
        memcpy(p + 4, &d, 4);
        memcpy(p + 8, &l32, 4);
        memcpy(p + 12, id, len);
        rc = wal_append(ns->wal, p, plen, NULL, err, errlen);
    }
    free(p);
    if (!rc)
        rc = doc_push(ns, id, len, err, errlen);
    pthread_rwlock_unlock(&ns->meta);
    if (rc)
        return rc;
    *doc = d;
    if (id_out && id_len)
        snprintf(id_out, id_len, "%.*s", (int)len, id);
    return NC_OK;
}

uint32_t nsstore_doc_count(nc_nsstore *ns)
{
    pthread_rwlock_rdlock(&ns->meta);
    uint32_t n = ns->ndocs;
    pthread_rwlock_unlock(&ns->meta);
    return n;
}

int nsstore_doc_info(nc_nsstore *ns, uint32_t i, char *id, size_t idlen, uint64_t *pairs)
{
    int rc = NC_ENOTFOUND;
    pthread_rwlock_rdlock(&ns->meta);
    if (i < ns->ndocs) {
        if (id && idlen)
            snprintf(id, idlen, "%s", ns->doc_ids[i]);
        if (pairs)
            *pairs = ns->doc_pairs[i];
        rc = NC_OK;
    }
    pthread_rwlock_unlock(&ns->meta);
    return rc;
}

int nsstore_entry(nc_nsstore *ns, int64_t id, char *doc_id, size_t doc_len, uint64_t *off, int *word,
                  char *err, size_t errlen)
{
    int rc = NC_OK;
    pthread_rwlock_rdlock(&ns->meta);
    if (id < 0 || (size_t)id >= ns->nprov)
        rc = nc_error(err, errlen, NC_ENOTFOUND, "no pair %lld", (long long)id);
    else if (ns->prov_doc[id] == NSSTORE_NO_DOC)
        rc = nc_error(err, errlen, NC_ENOTFOUND, "pair %lld has no document", (long long)id);
    else {
        if (doc_id && doc_len)
            snprintf(doc_id, doc_len, "%s", ns->doc_ids[ns->prov_doc[id]]);
        if (off)
            *off = ns->prov_off[id];
    }
    pthread_rwlock_unlock(&ns->meta);
    if (!rc && word)
        *word = unbounded_cache_word_at(ns->ub, id);
    return rc;
}

void nsstore_snippet(nc_nsstore *ns, int64_t id, int before, int after, char *buf, size_t len)
{
    if (!len)
        return;
    buf[0] = 0;
    pthread_rwlock_rdlock(&ns->meta);
    if (id < 0 || (size_t)id >= ns->nprov) {
        pthread_rwlock_unlock(&ns->meta);
        return;
    }
    uint32_t doc = ns->prov_doc[id];
    uint32_t off = ns->prov_off[id];
    /* pairs of one document are stored consecutively within an add, and
     * adds of one document in order: walk while doc and offset line up */
    int64_t lo = id, hi = id;
    while (lo > 0 && id - lo < before && ns->prov_doc[lo - 1] == doc &&
           ns->prov_off[lo - 1] + (uint32_t)(id - lo + 1) == off)
        lo--;
    while ((size_t)(hi + 1) < ns->nprov && hi - id < after && ns->prov_doc[hi + 1] == doc &&
           ns->prov_off[hi + 1] == off + (uint32_t)(hi + 1 - id))
        hi++;
    pthread_rwlock_unlock(&ns->meta);
    size_t k = 0;
    for (int64_t i = lo; i <= hi && k + 1 < len; i++) {
        const char *w = wordtable_word(ns->words, unbounded_cache_word_at(ns->ub, i));
        int n = snprintf(buf + k, len - k, "%s%s%s%s", k ? " " : "", i == id ? "[" : "", w ? w : "?",
                         i == id ? "]" : "");
        if (n < 0 || (size_t)n >= len - k) {
            buf[k] = 0;
            break;
        }
        k += (size_t)n;
    }
}

/* ---- logging adds (the cache's add hook) ------------------------------------ */

/* Under the cache's write lock: one ADD record per add, in id order. */
static int add_hook(void *ctx, const float *keys, const int *words, size_t n, int64_t first_id,
                    char *err, size_t errlen)
{
    nc_nsstore *ns = ctx;
    bool mine = tl.ns == ns;
    uint32_t doc = mine ? tl.doc : NSSTORE_NO_DOC;
    uint64_t off = mine ? tl.off : 0;
    if (ns->replaying)
        return prov_append(ns, first_id, n, doc, off, err, errlen);
    const int H = ns->H, V = ns->V;
    /* open-vocabulary words of the record, by surface string */
    size_t ndyn = 0, slen = 0;
    if (n > ns->dyn_cap) {
        int *d = realloc(ns->dyn, n * sizeof *d);
        if (!d)
            return nc_error(err, errlen, NC_ENOMEM, "log record");
        ns->dyn = d;
        ns->dyn_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        if (words[i] < V)
            continue;
        size_t j = 0;
        while (j < ndyn && ns->dyn[j] != words[i])
            j++;
        if (j == ndyn) {
            const char *w = wordtable_word(ns->words, words[i]);
            if (!w)
                return nc_error(err, errlen, NC_EINVAL, "word id %d is not in the namespace's table", words[i]);
            ns->dyn[ndyn++] = words[i];
            slen += 4 + strlen(w);
        }
    }
    size_t plen = 36 + slen + n * 4 + n * (size_t)H * 2;
    buf_clear(&ns->rec);
    if (buf_reserve(&ns->rec, plen))
        return nc_error(err, errlen, NC_ENOMEM, "log record of %zu bytes", plen);
    unsigned char *p = (unsigned char *)ns->rec.data;
    uint32_t n32 = (uint32_t)n, h32 = (uint32_t)H, nd32 = (uint32_t)ndyn;
    memset(p, 0, 4);
    p[0] = REC_ADD;
    p[1] = KEY_F16;
    memcpy(p + 4, &n32, 4);
    memcpy(p + 8, &h32, 4);
    memcpy(p + 12, &doc, 4);
    memcpy(p + 16, &first_id, 8);
    memcpy(p + 24, &off, 8);
    /* the string count goes right after the fixed part */
    size_t k = 32;
    unsigned char *cnt = p + k;
    (void)cnt;
    memcpy(p + k, &nd32, 4);
    k += 4;
    for (size_t j = 0; j < ndyn; j++) {
        const char *w = wordtable_word(ns->words, ns->dyn[j]);
        uint32_t l = (uint32_t)strlen(w);
        memcpy(p + k, &l, 4);
        memcpy(p + k + 4, w, l);
        k += 4 + l;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t ref = words[i];
        if (ref >= V) {
            size_t j = 0;
            while (ns->dyn[j] != words[i])
                j++;
            ref = V + (int32_t)j;
        }
        memcpy(p + k, &ref, 4);
        k += 4;
    }
    uint16_t *kh = (uint16_t *)(p + k);
    for (size_t i = 0; i < n * (size_t)H; i++) {
        uint16_t h = nc_float_to_half(keys[i]);
        memcpy(kh + i, &h, 2);
    }
    k += n * (size_t)H * 2;
    uint64_t seq;
    int rc = wal_append(ns->wal, p, k, &seq, err, errlen);
    if (!rc)
        rc = prov_append(ns, first_id, n, doc, off, err, errlen);
    nsstore_observer obs = __atomic_load_n(&ns->obs, __ATOMIC_ACQUIRE);
    if (!rc && obs)
        obs(__atomic_load_n(&ns->obs_ctx, __ATOMIC_ACQUIRE), ns, doc, off, keys, words, n);
    if (!rc && mine) {
        tl.seq = seq;
        tl.off += n;
    }
    return rc;
}

void nsstore_set_observer(nc_nsstore *ns, nsstore_observer fn, void *ctx)
{
    /* Set while adds may run: ctx first, then the function, published
     * atomically (the hook reads the function once). */
    __atomic_store_n(&ns->obs_ctx, ctx, __ATOMIC_RELEASE);
    __atomic_store_n(&ns->obs, fn, __ATOMIC_RELEASE);
}

int nsstore_add(nc_nsstore *ns, const float *keys, const int *words, size_t n, uint32_t doc,
                uint64_t off, uint64_t *seq, char *err, size_t errlen)
{
    if (n == 0) {
        if (seq)
            *seq = 0;
        return NC_OK;
    }
    for (size_t i = 0; i < n; i++)
        if (words[i] < 0 || words[i] >= wordtable_size(ns->words))
            return nc_error(err, errlen, NC_EINVAL, "word id %d outside the namespace's table", words[i]);
    __typeof__(tl) saved = tl;
    nsstore_set_context(ns, doc, off);
    int rc = unbounded_cache_add(ns->ub, keys, words, n, NULL, err, errlen);
    if (seq)
        *seq = tl.seq;
    tl = saved;
    return rc;
}

int nsstore_sync(nc_nsstore *ns, uint64_t seq, char *err, size_t errlen)
{
    if (seq == 0)
        return NC_OK;
    return wal_sync(ns->wal, seq, err, errlen);
}

/* ---- following the log ---------------------------------------------------------- */

struct nc_nslog {
    nc_nsstore *ns;
    nc_wal_reader *r;
    char doc[DOC_ID_MAX + 1];
    char *words;
    size_t wcap;
    size_t *dyn_off;              /* offsets of the record's open-vocabulary strings */
    uint32_t *dyn_len;
    size_t dcap;
};

const char *nsstore_dir(const nc_nsstore *ns) { return ns->dir; }

uint64_t nsstore_last_seq(nc_nsstore *ns)
{
    nc_wal_stats ws;
    wal_stats(ns->wal, &ws);
    return ws.last_seq;
}

uint64_t nsstore_durable_seq(nc_nsstore *ns)
{
    return wal_durable_seq(ns->wal);
}

void nsstore_retain_log(nc_nsstore *ns, uint64_t after)
{
    __atomic_store_n(&ns->retain, after, __ATOMIC_RELEASE);
}

int nsstore_log_open(nc_nsstore *ns, uint64_t after, nc_nslog **out, char *err, size_t errlen)
{
    *out = NULL;
    nc_nslog *l = calloc(1, sizeof *l);
    if (!l)
        return nc_error(err, errlen, NC_ENOMEM, "log follower");
    l->ns = ns;
    int rc = wal_reader_open(ns->waldir, ns->tag, after, &l->r, err, errlen);
    if (rc) {
        free(l);
        return rc;
    }
    *out = l;
    return NC_OK;
}

uint64_t nsstore_log_position(const nc_nslog *l)
{
    return wal_reader_position(l->r);
}

void nsstore_log_close(nc_nslog *l)
{
    if (!l)
        return;
    wal_reader_close(l->r);
    free(l->words);
    free(l->dyn_off);
    free(l->dyn_len);
    free(l);
}

/* One ADD record (the layout add_hook writes) into a; NC_EFORMAT if it
 * does not hold together. */
/* One open-vocabulary string of an ADD record's word list at *k (u32
 * length, then the bytes): its offset and length, *k moved past it. The
 * log follower and the replay read the list alike. */
static int add_record_word(const unsigned char *p, size_t len, uint64_t seq, size_t *k, size_t *off,
                           uint32_t *wl, char *err, size_t errlen)
{
    if (len - *k < 4)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: truncated word list", (unsigned long long)seq);
    memcpy(wl, p + *k, 4);
    *k += 4;
    if (*wl == 0 || *wl > len - *k)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: bad word length", (unsigned long long)seq);
    *off = *k;
    *k += *wl;
    return NC_OK;
}

static int log_decode_add(nc_nslog *l, uint64_t seq, const unsigned char *p, size_t len, nc_nslog_add *a,
                          char *err, size_t errlen)
{
    nc_nsstore *ns = l->ns;
    uint32_t n, H, doc, nd;
    uint64_t off;
    if (len < 36)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: short add record", (unsigned long long)seq);
    memcpy(&n, p + 4, 4);
    memcpy(&H, p + 8, 4);
    memcpy(&doc, p + 12, 4);
    memcpy(&off, p + 24, 8);
    memcpy(&nd, p + 32, 4);
    if (p[1] != KEY_F16 || H != (uint32_t)ns->H || n == 0 || nd > n)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: add of %u pairs of dimension %u",
                        (unsigned long long)seq, n, H);
    if (nd > l->dcap) {
        size_t *o = realloc(l->dyn_off, nd * sizeof *o);
        if (o)
            l->dyn_off = o;
        uint32_t *dl = o ? realloc(l->dyn_len, nd * sizeof *dl) : NULL;
        if (!dl)
            return nc_error(err, errlen, NC_ENOMEM, "log follower");
        l->dyn_len = dl;
        l->dcap = nd;
    }
    size_t k = 36, wl = 0;
    for (uint32_t j = 0; j < nd; j++) {
        int rc = add_record_word(p, len, seq, &k, &l->dyn_off[j], &l->dyn_len[j], err, errlen);
        if (rc)
            return rc;
    }
    if (len - k != (size_t)n * (4 + 2 * (size_t)H))
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes for %u pairs", (unsigned long long)seq,
                        len - k, n);
    const unsigned char *refs = p + k;
    /* surface strings: vocabulary words from the table, the others from
     * the record (the table may hold them under other ids by now) */
    for (int pass = 0; pass < 2; pass++) {
        size_t w = 0;
        for (uint32_t i = 0; i < n; i++) {
            int32_t r;
            memcpy(&r, refs + (size_t)i * 4, 4);
            const char *s;
            size_t sl;
            if (r >= 0 && r < ns->V) {
                s = wordtable_word(ns->words, r);
                sl = s ? strlen(s) : 0;
            } else if (r >= ns->V && (uint32_t)(r - ns->V) < nd) {
                s = (const char *)p + l->dyn_off[r - ns->V];
                sl = l->dyn_len[r - ns->V];
            } else {
                return nc_error(err, errlen, NC_EFORMAT, "log record %llu: bad word reference %d",
                                (unsigned long long)seq, r);
            }
            if (pass == 1) {
                memcpy(l->words + w, s, sl);
                if (i + 1 < n)
                    l->words[w + sl] = '\n';
            }
            w += sl + (i + 1 < n);
        }
        if (pass == 0) {
            wl = w;
            if (wl + 1 > l->wcap) {
                char *b = realloc(l->words, wl + 1);
                if (!b)
                    return nc_error(err, errlen, NC_ENOMEM, "log follower");
                l->words = b;
                l->wcap = wl + 1;
            }
        }
    }
    l->words[wl] = 0;
    l->doc[0] = 0;
    if (doc != NSSTORE_NO_DOC) {
        pthread_rwlock_rdlock(&ns->meta);
        if (doc < ns->ndocs)
            snprintf(l->doc, sizeof l->doc, "%s", ns->doc_ids[doc]);
        pthread_rwlock_unlock(&ns->meta);
        if (!l->doc[0])
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: unknown document %u", (unsigned long long)seq,
                            doc);
    }
    a->seq = seq;
    a->doc = l->doc;
    a->off = off;
    a->n = n;
    a->keys_f16 = refs + (size_t)n * 4;
    a->words = l->words;
    a->words_len = wl;
    return NC_OK;
}

int nsstore_log_next(nc_nslog *l, nc_nslog_add *a, char *err, size_t errlen)
{
    uint64_t upto = wal_durable_seq(l->ns->wal);
    for (;;) {
        uint64_t seq;
        const void *payload;
        size_t len;
        int rc = wal_reader_next(l->r, upto, &seq, &payload, &len, err, errlen);
        if (rc <= 0)
            return rc;
        const unsigned char *p = payload;
        if (len < 4)
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes", (unsigned long long)seq, len);
        if (p[0] == REC_DOC)
            continue;
        if (p[0] != REC_ADD)
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: unknown type %d", (unsigned long long)seq,
                            p[0]);
        rc = log_decode_add(l, seq, p, len, a, err, errlen);
        return rc ? rc : 1;
    }
}

/* ---- replay ------------------------------------------------------------------- */

typedef struct {
    nc_nsstore *ns;
    float *keys;
    size_t kcap;
    int *ids;
    size_t icap;
    int *map;
    size_t mcap;
} replay_ctx;

static int replay_record(void *vctx, uint64_t seq, const void *payload, size_t len, char *err,
                         size_t errlen)
{
    replay_ctx *c = vctx;
    nc_nsstore *ns = c->ns;
    const unsigned char *p = payload;
    if (len < 4)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes", (unsigned long long)seq, len);
    if (p[0] == REC_DOC) {
        uint32_t d, l;
        if (len < 12)
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: short document record",
                            (unsigned long long)seq);
        memcpy(&d, p + 4, 4);
        memcpy(&l, p + 8, 4);
        if (l != len - 12 || !valid_doc_id((const char *)p + 12, l))
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: bad document id", (unsigned long long)seq);
        int rc = NC_OK;
        pthread_rwlock_wrlock(&ns->meta);
        if (d > ns->ndocs)
            rc = nc_error(err, errlen, NC_EFORMAT, "log record %llu: document %u after %u documents",
                          (unsigned long long)seq, d, ns->ndocs);
        else if (d == ns->ndocs)
            rc = doc_push(ns, (const char *)p + 12, l, err, errlen);
        /* d < ndocs: already in the snapshot */
        pthread_rwlock_unlock(&ns->meta);
        return rc;
    }
    if (p[0] != REC_ADD)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: unknown type %d", (unsigned long long)seq, p[0]);
    if (len < 36)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: short add record", (unsigned long long)seq);
    uint32_t n, H, doc, nd;
    int64_t first;
    uint64_t off;
    memcpy(&n, p + 4, 4);
    memcpy(&H, p + 8, 4);
    memcpy(&doc, p + 12, 4);
    memcpy(&first, p + 16, 8);
    memcpy(&off, p + 24, 8);
    memcpy(&nd, p + 32, 4);
    if (p[1] != KEY_F16 || H != (uint32_t)ns->H || n == 0 || nd > n)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: add of %u pairs of dimension %u (model %d)",
                        (unsigned long long)seq, n, H, ns->H);
    size_t k = 36;
    if (nd > c->mcap) {
        int *m = realloc(c->map, nd * sizeof *m);
        if (!m)
            return nc_error(err, errlen, NC_ENOMEM, "replay");
        c->map = m;
        c->mcap = nd;
    }
    for (uint32_t j = 0; j < nd; j++) {
        size_t woff;
        uint32_t l;
        int rc = add_record_word(p, len, seq, &k, &woff, &l, err, errlen);
        if (rc)
            return rc;
        c->map[j] = wordtable_id(ns->words, (const char *)p + woff, l, true);
        if (c->map[j] < 0)
            return nc_error(err, errlen, NC_ENOMEM, "word table");
    }
    if ((len - k) != (size_t)n * (4 + 2 * (size_t)H))
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes for %u pairs", (unsigned long long)seq,
                        len - k, n);
    int64_t have = unbounded_cache_count(ns->ub);
    if (first > have)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: pairs from id %lld but only %lld are known "
                        "(a record is missing)", (unsigned long long)seq, (long long)first, (long long)have);
    if (first + (int64_t)n <= have)
        return NC_OK;   /* already in the snapshot */
    size_t skip = (size_t)(have - first), m = n - skip;
    if (doc != NSSTORE_NO_DOC && doc >= nsstore_doc_count(ns))
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: unknown document %u", (unsigned long long)seq, doc);
    if (m > c->icap) {
        int *ids = realloc(c->ids, m * sizeof *ids);
        if (!ids)
            return nc_error(err, errlen, NC_ENOMEM, "replay");
        c->ids = ids;
        c->icap = m;
    }
    if (m * H > c->kcap) {
        float *kk = realloc(c->keys, m * H * sizeof *kk);
        if (!kk)
            return nc_error(err, errlen, NC_ENOMEM, "replay");
        c->keys = kk;
        c->kcap = m * H;
    }
    const unsigned char *refs = p + k, *kh = p + k + (size_t)n * 4;
    int wsize = wordtable_size(ns->words);
    for (size_t i = 0; i < m; i++) {
        int32_t r;
        memcpy(&r, refs + (skip + i) * 4, 4);
        int id = r >= 0 && r < ns->V ? r : (r >= ns->V && (uint32_t)(r - ns->V) < nd ? c->map[r - ns->V] : -1);
        if (id < 0 || id >= wsize)
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: bad word reference %d",
                            (unsigned long long)seq, r);
        c->ids[i] = id;
    }
    for (size_t i = 0; i < m * H; i++) {
        uint16_t h;
        memcpy(&h, kh + (skip * H + i) * 2, 2);
        c->keys[i] = nc_half_to_float(h);
    }
    nsstore_set_context(ns, doc, off + skip);
    int rc = unbounded_cache_add(ns->ub, c->keys, c->ids, m, NULL, err, errlen);
    nsstore_clear_context();
    return rc;
}

/* ---- files ------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int nsstore_remove_dir(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return errno == ENOENT ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", dir, strerror(errno));
    if (nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return nc_error(err, errlen, NC_EIO, "removing %s: %s", dir, strerror(errno));
    return NC_OK;
}

static uint64_t du_total;
static pthread_mutex_t du_lock = PTHREAD_MUTEX_INITIALIZER;
static int du_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)path, (void)ftw;
    if (flag == FTW_F)
        du_total += (uint64_t)sb->st_size;
    return 0;
}

static uint64_t dir_bytes(const char *dir)
{
    pthread_mutex_lock(&du_lock);
    du_total = 0;
    nftw(dir, du_entry, 16, FTW_PHYS);
    uint64_t b = du_total;
    pthread_mutex_unlock(&du_lock);
    return b;
}

static int fsync_path(const char *path, bool is_dir)
{
    int fd = open(path, is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0)
        return -1;
    int r = nc_fsync(fd);
    close(fd);
    return r;
}

/* size and crc32 of a whole file */
static int file_crc(const char *path, uint64_t *size, uint32_t *crc, char *err, size_t errlen)
{
    int fd = nc_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", path, strerror(errno));
    static __thread unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t n = 0;
    ssize_t r;
    while ((r = nc_read(fd, buf, sizeof buf)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(e));
        }
        c = crc32(c, buf, (uInt)r);
        n += (uint64_t)r;
    }
    close(fd);
    *size = n;
    *crc = (uint32_t)c;
    return NC_OK;
}

static int write_file(const char *path, const void *a, size_t alen, const void *b, size_t blen,
                      const void *c, size_t clen, char *err, size_t errlen)
{
    FILE *f = nc_fopen(path, "wb");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    bool ok = (!alen || nc_fwrite(a, 1, alen, f) == alen) && (!blen || nc_fwrite(b, 1, blen, f) == blen) &&
              (!clen || nc_fwrite(c, 1, clen, f) == clen) && fflush(f) == 0 && nc_fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    return ok ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(e));
}

/* ---- snapshots ------------------------------------------------------------------ */

static int write_prov(nc_nsstore *ns, const char *path, uint64_t count, char *err, size_t errlen)
{
    pthread_rwlock_rdlock(&ns->meta);
    int rc = NC_OK;
    if (count > ns->nprov)
        rc = nc_error(err, errlen, NC_ESTATE, "snapshot of %llu pairs, %zu with provenance",
                      (unsigned long long)count, ns->nprov);
    unsigned char hdr[16];
    memcpy(hdr, PROV_MAGIC, 8);
    memcpy(hdr + 8, &count, 8);
    if (!rc)
        rc = write_file(path, hdr, 16, ns->prov_doc, count * 4, ns->prov_off, count * 4, err, errlen);
    pthread_rwlock_unlock(&ns->meta);
    return rc;
}

static int write_docs(nc_nsstore *ns, const char *path, char *err, size_t errlen)
{
    pthread_rwlock_rdlock(&ns->meta);
    size_t len = 12;
    for (uint32_t i = 0; i < ns->ndocs; i++)
        len += 4 + strlen(ns->doc_ids[i]);
    unsigned char *b = malloc(len);
    int rc = b ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "documents");
    if (b) {
        memcpy(b, DOCS_MAGIC, 8);
        memcpy(b + 8, &ns->ndocs, 4);
        size_t k = 12;
        for (uint32_t i = 0; i < ns->ndocs; i++) {
            uint32_t l = (uint32_t)strlen(ns->doc_ids[i]);
            memcpy(b + k, &l, 4);
            memcpy(b + k + 4, ns->doc_ids[i], l);
            k += 4 + l;
        }
    }
    pthread_rwlock_unlock(&ns->meta);
    if (b)
        rc = write_file(path, b, len, NULL, 0, NULL, 0, err, errlen);
    free(b);
    return rc;
}

/* The whole file at path, NUL-terminated (free() it). */
static int read_whole(const char *path, unsigned char **out, size_t *len, char *err, size_t errlen)
{
    nc_buf b = NC_BUF_INIT;
    int rc = buf_read_file(&b, path, err, errlen);
    if (rc) {
        buf_free(&b);
        return rc;
    }
    *out = (unsigned char *)buf_detach(&b, len);
    return *out ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
}

static uint64_t values_count(const char *path)
{
    FILE *f = nc_fopen(path, "rb");
    uint64_t n = 0;
    char magic[8];
    if (f) {
        if (nc_fread(magic, 1, 8, f) != 8 || nc_fread(&n, 8, 1, f) != 1)
            n = 0;
        fclose(f);
    }
    return n;
}

/* Snapshot dirs "snap-<16 hex>" in descending seq order. */
static int list_snapshots(const char *dir, uint64_t **out, int *n, bool cleanup_tmp)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? NC_OK : NC_EIO;
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d))) {
        unsigned long long s;
        char rest[32] = "";
        if (strncmp(e->d_name, "snap-", 5) != 0)
            continue;
        int got = sscanf(e->d_name + 5, "%16llx%31s", &s, rest);
        if (got == 2 && strcmp(rest, ".tmp") == 0 && cleanup_tmp) {
            char p[1200];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            nsstore_remove_dir(p, NULL, 0);   /* an interrupted snapshot */
            continue;
        }
        if (got != 1 || strlen(e->d_name) != 21)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *p = realloc(*out, (size_t)cap * sizeof *p);
            if (!p) {
                closedir(d);
                return NC_ENOMEM;
            }
            *out = p;
        }
        (*out)[(*n)++] = s;
    }
    closedir(d);
    /* descending */
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && (*out)[j] > (*out)[j - 1]; j--) {
            uint64_t t = (*out)[j];
            (*out)[j] = (*out)[j - 1];
            (*out)[j - 1] = t;
        }
    return NC_OK;
}

static void snap_path(const nc_nsstore *ns, uint64_t seq, const char *suffix, char *buf, size_t len)
{
    snprintf(buf, len, "%s/snap-%016llx%s", ns->dir, (unsigned long long)seq, suffix);
}

/* Writes snapshot S of the current state (snap_lock held) and, once it is
 * durable, drops what it makes unnecessary. */
static int write_snapshot(nc_nsstore *ns, uint64_t S, double t0, char *err, size_t errlen)
{
    int rc = NC_OK;
    char tmp[1200], fin[1200], p[1300];
    snap_path(ns, S, ".tmp", tmp, sizeof tmp);
    snap_path(ns, S, "", fin, sizeof fin);
    if (!rc)
        nsstore_remove_dir(tmp, NULL, 0);
    /* index + values (+ words) under the cache's read lock: consistent with
     * each other; pairs added meanwhile are in the log after S and are
     * skipped by id on replay */
    if (!rc)
        rc = unbounded_cache_save(ns->ub, tmp, err, errlen);
    uint64_t C = 0;
    if (!rc) {
        snprintf(p, sizeof p, "%s/values.bin", tmp);
        C = values_count(p);
        snprintf(p, sizeof p, "%s/words.txt", tmp);
        /* closed-vocabulary caches write no words file: make an empty one */
        if (access(p, F_OK) != 0)
            rc = write_file(p, NULL, 0, NULL, 0, NULL, 0, err, errlen);
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/prov.bin", tmp);
        rc = write_prov(ns, p, C, err, errlen);
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/docs.bin", tmp);
        rc = write_docs(ns, p, err, errlen);
    }
    /* MANIFEST: sizes and checksums of every file, then its own checksum */
    char man[2048];
    size_t k = 0;
    if (!rc)
        k = (size_t)snprintf(man, sizeof man, "%s\nseq %llu\nentries %llu\n", MANIFEST_HEAD,
                             (unsigned long long)S, (unsigned long long)C);
    for (int i = 0; !rc && i < NSNAPFILES; i++) {
        uint64_t size;
        uint32_t crc;
        snprintf(p, sizeof p, "%s/%s", tmp, snap_files[i]);
        if (fsync_path(p, false) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: fsync: %s", p, strerror(errno));
        if (!rc)
            rc = file_crc(p, &size, &crc, err, errlen);
        if (!rc)
            k += (size_t)snprintf(man + k, sizeof man - k, "file %s %llu %08x\n", snap_files[i],
                                  (unsigned long long)size, crc);
    }
    if (!rc) {
        k += (size_t)snprintf(man + k, sizeof man - k, "crc %08x\n", (uint32_t)crc32(0L, (const Bytef *)man, (uInt)k));
        snprintf(p, sizeof p, "%s/MANIFEST", tmp);
        rc = write_file(p, man, k, NULL, 0, NULL, 0, err, errlen);
    }
    if (!rc && fsync_path(tmp, true) != 0)
        rc = nc_error(err, errlen, NC_EIO, "%s: fsync: %s", tmp, strerror(errno));
    if (!rc) {
        nsstore_remove_dir(fin, NULL, 0);
        if (rename(tmp, fin) != 0 || fsync_path(ns->dir, true) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: %s", fin, strerror(errno));
    }
    if (rc) {
        nsstore_remove_dir(tmp, NULL, 0);
    } else {
        /* keep this snapshot and the previous one (with the log since the
         * previous one), so a snapshot found corrupt later can be rebuilt */
        uint64_t keep_from = ns->snap_seq;   /* previous snapshot, 0 = none */
        uint64_t *snaps;
        int nsn;
        if (list_snapshots(ns->dir, &snaps, &nsn, false) == NC_OK) {
            for (int i = 0; i < nsn; i++)
                if (snaps[i] < keep_from || (keep_from == 0 && snaps[i] < S)) {
                    snap_path(ns, snaps[i], "", p, sizeof p);
                    nsstore_remove_dir(p, NULL, 0);
                }
            free(snaps);
        }
        /* ...and every segment a follower (replication) still has to
         * read: its records may exist nowhere else yet */
        uint64_t upto = keep_from, ret = __atomic_load_n(&ns->retain, __ATOMIC_ACQUIRE);
        if (ret < upto)
            upto = ret;
        if (upto > 0)
            wal_prune(ns->waldir, upto, NULL, 0);
        ns->prev_snap_seq = ns->snap_seq;
        ns->snap_seq = S;
        ns->snap_time = mono_now();
        ns->snap_secs = ns->snap_time - t0;
    }
    return rc;
}

int nsstore_snapshot(nc_nsstore *ns, double *seconds, char *err, size_t errlen)
{
    pthread_mutex_lock(&ns->snap_lock);
    double t0 = mono_now();
    uint64_t S;
    int rc = wal_rotate(ns->wal, &S, err, errlen);
    if (!rc && S == ns->snap_seq)
        ns->snap_time = mono_now();   /* nothing logged since the last snapshot */
    else if (!rc)
        rc = write_snapshot(ns, S, t0, err, errlen);
    pthread_mutex_unlock(&ns->snap_lock);
    if (seconds)
        *seconds = mono_now() - t0;
    return rc;
}

bool nsstore_log_broken(nc_nsstore *ns)
{
    return wal_broken(ns->wal, NULL, NULL);
}

int nsstore_heal(nc_nsstore *ns, double *seconds, char *err, size_t errlen)
{
    pthread_mutex_lock(&ns->snap_lock);
    double t0 = mono_now();
    uint64_t S;
    int rc = NC_OK;
    /* While the log is broken no add gets in (the add hook's append fails
     * first), so memory holds exactly the records up to S: a snapshot of
     * it covers them, whatever the failed fsync lost of the segment. */
    bool tail_unknown = true;
    if (wal_broken(ns->wal, &S, &tail_unknown)) {
        /* a log opened stopped on a full disk has every record whole on
         * disk: it needs only its new segment, not room for a snapshot */
        if (tail_unknown && S != ns->snap_seq)
            rc = write_snapshot(ns, S, t0, err, errlen);
        if (!rc)
            rc = wal_restart(ns->wal, S, err, errlen);
    }
    pthread_mutex_unlock(&ns->snap_lock);
    if (seconds)
        *seconds = mono_now() - t0;
    return rc;
}

/* Verifies a snapshot's MANIFEST and files; *entries from it. */
static int verify_snapshot(const char *sdir, uint64_t seq, uint64_t *entries, char *err, size_t errlen)
{
    char p[1300];
    snprintf(p, sizeof p, "%s/MANIFEST", sdir);
    unsigned char *b;
    size_t len;
    int rc = read_whole(p, &b, &len, err, errlen);
    if (rc)   /* missing = incomplete snapshot; an I/O error is not corruption */
        return rc == NC_EIO || rc == NC_ENOMEM ? rc : NC_EFORMAT;
    char *man = (char *)b;   /* NUL-terminated */
    char *crcline = strstr(man, "crc ");
    unsigned crc = 0;
    unsigned long long s = 0, e = 0;
    if (!crcline || sscanf(crcline, "crc %8x", &crc) != 1 ||
        crc != (uint32_t)crc32(0L, (const Bytef *)man, (uInt)(crcline - man)) ||
        strncmp(man, MANIFEST_HEAD "\n", strlen(MANIFEST_HEAD) + 1) != 0 ||
        sscanf(man + strlen(MANIFEST_HEAD) + 1, "seq %llu\nentries %llu", &s, &e) != 2 || s != seq) {
        free(man);
        return nc_error(err, errlen, NC_EFORMAT, "%s: corrupt snapshot manifest (checksum mismatch)", p);
    }
    for (int i = 0; !rc && i < NSNAPFILES; i++) {
        char key[64];
        snprintf(key, sizeof key, "file %s ", snap_files[i]);
        char *line = strstr(man, key);
        unsigned long long size;
        unsigned fcrc;
        if (!line || sscanf(line + strlen(key), "%llu %8x", &size, &fcrc) != 2) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: no entry for %s", p, snap_files[i]);
            break;
        }
        char fp[1400];
        uint64_t asize;
        uint32_t acrc;
        snprintf(fp, sizeof fp, "%s/%s", sdir, snap_files[i]);
        if ((rc = file_crc(fp, &asize, &acrc, err, errlen)))
            rc = rc == NC_EIO ? rc : NC_EFORMAT;
        else if (asize != size)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: %llu bytes, the snapshot manifest says %llu (corrupt snapshot)",
                          fp, (unsigned long long)asize, size);
        else if (acrc != fcrc)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: checksum mismatch (corrupt snapshot file)", fp);
    }
    free(man);
    *entries = e;
    return rc;
}

static void free_meta(nc_nsstore *ns)
{
    free(ns->prov_doc);
    free(ns->prov_off);
    ns->prov_doc = ns->prov_off = NULL;
    ns->nprov = ns->provcap = 0;
    for (uint32_t i = 0; i < ns->ndocs; i++)
        free(ns->doc_ids[i]);
    free(ns->doc_ids);
    free(ns->doc_pairs);
    ns->doc_ids = NULL;
    ns->doc_pairs = NULL;
    ns->ndocs = ns->doccap = 0;
}

/* Loads snapshot seq into ns (fresh word table and cache). */
static int load_snapshot(nc_nsstore *ns, uint64_t seq, char *err, size_t errlen)
{
    char sdir[1200], p[1300];
    snap_path(ns, seq, "", sdir, sizeof sdir);
    uint64_t entries = 0;
    int rc = verify_snapshot(sdir, seq, &entries, err, errlen);
    if (!rc)
        rc = wordtable_new(ns->m->vocab, &ns->words, err, errlen);
    if (!rc)
        rc = unbounded_cache_load(&ns->ubo, ns->words, sdir, &ns->ub, err, errlen);
    if (!rc && (uint64_t)unbounded_cache_count(ns->ub) != entries)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: %lld pairs, the manifest says %llu", sdir,
                      (long long)unbounded_cache_count(ns->ub), (unsigned long long)entries);
    unsigned char *b = NULL;
    size_t len = 0;
    if (!rc) {
        snprintf(p, sizeof p, "%s/docs.bin", sdir);
        rc = read_whole(p, &b, &len, err, errlen);
    }
    if (!rc) {
        uint32_t nd = 0;
        if (len < 12 || memcmp(b, DOCS_MAGIC, 8) != 0)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: not a documents file", p);
        else
            memcpy(&nd, b + 8, 4);
        size_t k = 12;
        for (uint32_t i = 0; !rc && i < nd; i++) {
            uint32_t l = 0;
            if (len - k < 4 || (memcpy(&l, b + k, 4), l > len - k - 4) || !valid_doc_id((const char *)b + k + 4, l))
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: bad document %u", p, i);
            else
                rc = doc_push(ns, (const char *)b + k + 4, l, err, errlen);
            k += 4 + (rc ? 0 : l);
        }
    }
    free(b);
    b = NULL;
    if (!rc) {
        snprintf(p, sizeof p, "%s/prov.bin", sdir);
        rc = read_whole(p, &b, &len, err, errlen);
    }
    if (!rc) {
        uint64_t n = 0;
        if (len < 16 || memcmp(b, PROV_MAGIC, 8) != 0 || (memcpy(&n, b + 8, 8), n != entries) ||
            len != 16 + 8 * n)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: not the provenance of %llu pairs", p,
                          (unsigned long long)entries);
        else {
            ns->prov_doc = malloc((n ? n : 1) * 4);
            ns->prov_off = malloc((n ? n : 1) * 4);
            if (!ns->prov_doc || !ns->prov_off)
                rc = nc_error(err, errlen, NC_ENOMEM, "provenance");
            else {
                memcpy(ns->prov_doc, b + 16, n * 4);
                memcpy(ns->prov_off, b + 16 + n * 4, n * 4);
                ns->nprov = ns->provcap = n;
                for (uint64_t i = 0; !rc && i < n; i++) {
                    uint32_t d = ns->prov_doc[i];
                    if (d == NSSTORE_NO_DOC)
                        continue;
                    if (d >= ns->ndocs)
                        rc = nc_error(err, errlen, NC_EFORMAT, "%s: pair %llu of unknown document %u", p,
                                      (unsigned long long)i, d);
                    else
                        ns->doc_pairs[d]++;
                }
            }
        }
    }
    free(b);
    if (rc) {
        unbounded_cache_free(ns->ub);
        wordtable_free(ns->words);
        ns->ub = NULL;
        ns->words = NULL;
        free_meta(ns);
    }
    return rc;
}

int nsstore_open(const nc_nsstore_opts *o, nc_nsstore **out, nc_nsstore_recovery *info, char *err,
                 size_t errlen)
{
    nc_nsstore_recovery dummy;
    if (!info)
        info = &dummy;
    memset(info, 0, sizeof *info);
    *out = NULL;
    double t0 = mono_now();
    if (mkdir(o->dir, 0755) != 0 && errno != EEXIST)
        return nc_error(err, errlen, NC_EIO, "%s: %s", o->dir, strerror(errno));
    nc_nsstore *ns = calloc(1, sizeof *ns);
    if (!ns)
        return nc_error(err, errlen, NC_ENOMEM, "namespace");
    snprintf(ns->dir, sizeof ns->dir, "%s", o->dir);
    snprintf(ns->waldir, sizeof ns->waldir, "%s/wal", o->dir);
    ns->m = o->model;
    ns->V = o->model->cfg.vocab_size;
    ns->H = o->model->cfg.hidden_size;
    ns->tag = nsstore_model_tag(o->model);
    ns->ubo = o->ub;
    ns->ubo.dim = ns->H;
    ns->ubo.key_f16 = true;
    ns->sync = o->sync;
    ns->retain = UINT64_MAX;
    pthread_rwlock_init(&ns->meta, NULL);
    pthread_mutex_init(&ns->snap_lock, NULL);

    /* 1. the newest snapshot that verifies */
    uint64_t *snaps = NULL;
    int nsn = 0, rc = list_snapshots(ns->dir, &snaps, &nsn, true);
    if (rc)
        rc = nc_error(err, errlen, rc, "%s: cannot list snapshots", ns->dir);
    char first_err[NC_ERRLEN] = "";
    uint64_t base = 0, corrupt_seq = 0;
    for (int i = 0; !rc && i < nsn; i++) {
        char e2[NC_ERRLEN] = "";
        int lrc = load_snapshot(ns, snaps[i], e2, sizeof e2);
        if (lrc == NC_OK) {
            base = snaps[i];
            info->snapshot_seq = base;
            info->snapshot_entries = unbounded_cache_count(ns->ub);
            break;
        }
        if (lrc != NC_EFORMAT && lrc != NC_ENOTFOUND) {
            /* An I/O error or a failed allocation says nothing about the
             * snapshot: refuse without touching the disk, so that the open
             * succeeds once the fault is gone (found by test_fault: two
             * transient read errors used to set both snapshots aside and
             * leave a namespace the log could no longer rebuild). */
            rc = nc_error(err, errlen, lrc, "%s (nothing was changed on disk)", e2);
            break;
        }
        if (!first_err[0])
            snprintf(first_err, sizeof first_err, "%s", e2);
        if (snaps[i] > corrupt_seq)
            corrupt_seq = snaps[i];
        /* kept aside for inspection, never loaded again */
        char from[1200], to[1200];
        snap_path(ns, snaps[i], "", from, sizeof from);
        snap_path(ns, snaps[i], ".corrupt", to, sizeof to);
        nsstore_remove_dir(to, NULL, 0);
        rename(from, to);
        snprintf(info->warning + strlen(info->warning), sizeof info->warning - strlen(info->warning),
                 "%s%s (set aside as %s)", info->warning[0] ? "; " : "", e2, to);
    }
    free(snaps);
    if (!rc && !ns->ub) {
        rc = wordtable_new(ns->m->vocab, &ns->words, err, errlen);
        if (!rc)
            rc = unbounded_cache_new(&ns->ubo, ns->words, &ns->ub, err, errlen);
    }
    /* 2. the log after it */
    if (!rc) {
        unbounded_cache_set_add_hook(ns->ub, add_hook, ns);
        ns->replaying = true;
        replay_ctx c = {.ns = ns};
        nc_wal_replay_info wi;
        rc = wal_replay(ns->waldir, ns->tag, base, replay_record, &c, &wi, err, errlen);
        ns->replaying = false;
        free(c.keys);
        free(c.ids);
        free(c.map);
        if (rc == NC_ENOTFOUND && first_err[0])
            /* a corrupt snapshot the log cannot stand in for */
            rc = nc_error(err, errlen, NC_EFORMAT, "%s; the log does not reach back far enough to rebuild "
                          "it: restore the snapshot or remove the namespace", first_err);
        if (!rc && corrupt_seq > (wi.last_seq > base ? wi.last_seq : base))
            rc = nc_error(err, errlen, NC_EFORMAT, "%s; the log ends at record %llu and cannot rebuild it: "
                          "restore the snapshot or remove the namespace", first_err,
                          (unsigned long long)wi.last_seq);
        if (!rc) {
            info->records_replayed = wi.records;
            if (wi.truncated)
                snprintf(info->warning + strlen(info->warning), sizeof info->warning - strlen(info->warning),
                         "%s%s", info->warning[0] ? "; " : "", wi.warning);
            bool stopped = false;
            rc = wal_open_or_stopped(ns->waldir, ns->tag, (wi.last_seq > base ? wi.last_seq : base) + 1, ns->sync,
                                     &ns->wal, &stopped, err, errlen);
            if (stopped)
                /* a full disk: everything is recovered and can be read;
                 * writes fail (507) until nsstore_heal finds room */
                snprintf(info->warning + strlen(info->warning), sizeof info->warning - strlen(info->warning),
                         "%sno room on the disk for a new log segment: read-only until there is room (%s)",
                         info->warning[0] ? "; " : "", err);
        }
    }
    if (rc) {
        nsstore_close(ns);
        return rc;
    }
    ns->snap_seq = base;
    ns->snap_time = mono_now();
    info->entries = unbounded_cache_count(ns->ub);
    info->seconds = mono_now() - t0;
    *out = ns;
    return NC_OK;
}

void nsstore_close(nc_nsstore *ns)
{
    if (!ns)
        return;
    if (ns->ub)
        unbounded_cache_set_add_hook(ns->ub, NULL, NULL);
    wal_close(ns->wal);
    unbounded_cache_free(ns->ub);
    wordtable_free(ns->words);
    free_meta(ns);
    buf_free(&ns->rec);
    free(ns->dyn);
    pthread_rwlock_destroy(&ns->meta);
    pthread_mutex_destroy(&ns->snap_lock);
    free(ns);
}

void nsstore_stats(nc_nsstore *ns, nc_nsstore_stats *st)
{
    memset(st, 0, sizeof *st);
    st->entries = unbounded_cache_count(ns->ub);
    st->words = wordtable_size(ns->words) - ns->V;
    st->docs = nsstore_doc_count(ns);
    st->exact = unbounded_cache_is_exact(ns->ub);
    st->nprobe = ns->ubo.nprobe > 0 ? ns->ubo.nprobe : 8;
    st->factory = ns->ubo.factory;
    st->wal_bytes = wal_disk_bytes(ns->waldir);
    st->disk_bytes = dir_bytes(ns->dir);
    /* lock order is cache -> meta (the add hook): never the reverse */
    size_t mem = unbounded_cache_memory(ns->ub) + wordtable_memory(ns->words);
    pthread_rwlock_rdlock(&ns->meta);
    st->memory_bytes = mem + ns->provcap * 8 + ns->doccap * 16;
    pthread_rwlock_unlock(&ns->meta);
    nc_wal_stats ws;
    wal_stats(ns->wal, &ws);
    st->fsyncs = ws.fsyncs;
    st->last_seq = ws.last_seq;
    st->synced_seq = ws.synced_seq;
    pthread_mutex_lock(&ns->snap_lock);
    st->snapshot_age = mono_now() - ns->snap_time;
    st->snapshot_seconds = ns->snap_secs;
    st->snapshot_seq = ns->snap_seq;
    pthread_mutex_unlock(&ns->snap_lock);
}
