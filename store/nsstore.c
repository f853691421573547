/* nsstore.c -- a namespace in memory and its adds: the word table,
 * provenance and documents, the add hook that logs every add, close and
 * stats. Snapshots are in snapshot.c, recovery and the log follower in
 * recovery.c. */
#include "nsstore_internal.h"

#include <ftw.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static __thread struct {
    nc_nsstore *ns;
    uint32_t doc;
    uint64_t off;
    uint64_t seq;
} tl;
uint32_t nsstore_model_tag(const nc_model *m)
{
    NC_ASSERT(m, "nsstore_model_tag: no m");
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

/* An add record being made (under the cache's write lock): its type, the
 * pairs' words, the first id, the dimension field (H or a code's bytes)
 * and the bytes per pair after the word references. */
typedef struct {
    uint8_t type, flags;
    const int *words;
    size_t n;
    int64_t first_id;
    uint32_t dim;
    size_t tail;                  /* bytes a pair after its word reference */
    uint32_t doc;                 /* its provenance (rec_context) */
    uint64_t off;
    size_t plen;                  /* out: the record's length (rec_begin) */
} rec_spec;

/* The provenance of r's pairs (ids first_id.., from doc at off). */
static int prov_append(nc_nsstore *ns, const rec_spec *r, char *err, size_t errlen)
{
    const int64_t first_id = r->first_id;
    const size_t n = r->n;
    const uint32_t doc = r->doc;
    const uint64_t off = r->off;
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
int nsstore_doc_push(nc_nsstore *ns, const char *id, size_t len, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_doc_push: no ns");
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
    /* each id is its own heap chunk: its usable bytes and the chunk's size
     * word. Replication makes a document of every entry it applies, with an
     * id of ~60 bytes (replication_applier.c), so a replica's ids come to
     * ~10 bytes a pair: the endurance's replica a held 0.9 MB a 100k pairs
     * more than its gauge before they were counted. */
    ns->doc_id_bytes += malloc_usable_size(s) + sizeof(size_t);
    ns->doc_ids[ns->ndocs] = s;
    ns->doc_pairs[ns->ndocs] = 0;
    ns->ndocs++;
    return NC_OK;
}

bool nsstore_valid_doc_id(const char *id, size_t len)
{
    if (len == 0 || len > DOC_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)id[i] < 0x20)
            return false;   /* no control characters (newlines, NUL) */
    return true;
}

int nsstore_check_live(nc_nsstore *ns, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_check_live: no ns");
    if (!__atomic_load_n(&ns->retired, __ATOMIC_ACQUIRE))
        return NC_OK;
    return nc_error(err, errlen, NC_ESTATE, "the namespace was deleted");
}

bool nsstore_retired(nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_retired: no ns");
    return __atomic_load_n(&ns->retired, __ATOMIC_ACQUIRE);
}

void nsstore_retire(nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_retire: no ns");
    pthread_mutex_lock(&ns->snap_lock);
    __atomic_store_n(&ns->retired, true, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ns->snap_lock);
}

int nsstore_run_live(nc_nsstore *ns, int (*fn)(void *ctx, const char *dir), void *ctx)
{
    pthread_mutex_lock(&ns->snap_lock);
    int rc = nsstore_check_live(ns, NULL, 0) == NC_OK ? fn(ctx, ns->dir) : NC_ESTATE;
    pthread_mutex_unlock(&ns->snap_lock);
    return rc;
}

int nsstore_doc_begin(nc_nsstore *ns, const char *id, size_t len, uint32_t *doc, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_doc_begin: no ns");
    char gen[64];
    int live = nsstore_check_live(ns, err, errlen);
    if (live != NC_OK)
        return live;
    if (!id || len == 0) {
        /* generated below under the lock, from the document number */
        id = NULL;
    } else if (!nsstore_valid_doc_id(id, len)) {
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
        rc = nsstore_doc_push(ns, id, len, err, errlen);
    pthread_rwlock_unlock(&ns->meta);
    if (rc)
        return rc;
    *doc = d;
    return NC_OK;
}

uint32_t nsstore_doc_count(nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_doc_count: no ns");
    pthread_rwlock_rdlock(&ns->meta);
    uint32_t n = ns->ndocs;
    pthread_rwlock_unlock(&ns->meta);
    return n;
}

int nsstore_doc_info(nc_nsstore *ns, uint32_t i, char *id, size_t idlen, uint64_t *pairs)
{
    NC_ASSERT(ns, "nsstore_doc_info: no ns");
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

int nsstore_entry(nc_nsstore *ns, int64_t id, nsstore_provenance *p, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_entry: no ns");
    int rc = NC_OK;
    pthread_rwlock_rdlock(&ns->meta);
    if (id < 0 || (size_t)id >= ns->nprov)
        rc = nc_error(err, errlen, NC_ENOTFOUND, "no pair %lld", (long long)id);
    else if (ns->prov_doc[id] == NSSTORE_NO_DOC)
        rc = nc_error(err, errlen, NC_ENOTFOUND, "pair %lld has no document", (long long)id);
    else {
        snprintf(p->doc_id, sizeof p->doc_id, "%s", ns->doc_ids[ns->prov_doc[id]]);
        p->off = ns->prov_off[id];
    }
    pthread_rwlock_unlock(&ns->meta);
    if (!rc)
        p->word = unbounded_cache_word_at(ns->ub, id);
    return rc;
}

void nsstore_snippet(nc_nsstore *ns, int64_t id, int before, int after, char *buf, size_t len)
{
    NC_ASSERT(ns, "nsstore_snippet: no ns");
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

/* The distinct open-vocabulary words (ids >= V) of an add, in order of
 * first use, into ns->dyn (*ndyn of them); *slen: the bytes their surface
 * strings take in the record (4-byte length + the string each). */
static int collect_dyn_words(nc_nsstore *ns, const rec_spec *r, size_t *ndyn, size_t *slen, char *err,
                             size_t errlen)
{
    const int *words = r->words;
    const size_t n = r->n;
    if (n > ns->dyn_cap) {
        int *d = realloc(ns->dyn, n * sizeof *d);
        if (!d)
            return nc_error(err, errlen, NC_ENOMEM, "log record");
        ns->dyn = d;
        ns->dyn_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        if (words[i] < ns->V)
            continue;
        size_t j = 0;
        while (j < *ndyn && ns->dyn[j] != words[i])
            j++;
        if (j == *ndyn) {
            const char *w = wordtable_word(ns->words, words[i]);
            if (!w)
                return nc_error(err, errlen, NC_EINVAL, "word id %d is not in the namespace's table", words[i]);
            ns->dyn[(*ndyn)++] = words[i];
            *slen += 4 + strlen(w);
        }
    }
    return NC_OK;
}


/* The fixed part, the open-vocabulary strings and the word references of
 * an add record into ns->rec, with room for the pairs' tail bytes after
 * them: *k the bytes written, r->plen the record's length. */
static int rec_begin(nc_nsstore *ns, rec_spec *r, size_t *k, char *err, size_t errlen)
{
    size_t ndyn = 0, slen = 0, n = r->n, *plen = &r->plen;
    const uint32_t doc = r->doc;
    const uint64_t off = r->off;
    int rc = collect_dyn_words(ns, r, &ndyn, &slen, err, errlen);
    if (rc)
        return rc;
    *plen = REC_HEAD + slen + n * 4 + n * r->tail;
    buf_clear(&ns->rec);
    if (buf_reserve(&ns->rec, *plen))
        return nc_error(err, errlen, NC_ENOMEM, "log record of %zu bytes", *plen);
    unsigned char *p = (unsigned char *)ns->rec.data;
    uint32_t n32 = (uint32_t)n, nd32 = (uint32_t)ndyn;
    memset(p, 0, 4);
    p[0] = r->type;
    p[1] = r->flags;
    memcpy(p + 4, &n32, 4);
    memcpy(p + 8, &r->dim, 4);
    memcpy(p + 12, &doc, 4);
    memcpy(p + 16, &r->first_id, 8);
    memcpy(p + 24, &off, 8);
    memcpy(p + 32, &nd32, 4);
    size_t w = REC_HEAD;
    for (size_t j = 0; j < ndyn; j++) {
        const char *s = wordtable_word(ns->words, ns->dyn[j]);
        uint32_t l = (uint32_t)strlen(s);
        memcpy(p + w, &l, 4);
        memcpy(p + w + 4, s, l);
        w += 4 + l;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t ref = r->words[i];
        if (ref >= ns->V) {
            size_t j = 0;
            while (ns->dyn[j] != r->words[i])
                j++;
            ref = ns->V + (int32_t)j;
        }
        memcpy(p + w, &ref, 4);
        w += 4;
    }
    *k = w;
    return NC_OK;
}

/* The provenance of an add being logged: the calling thread's context
 * (nsstore_set_context) when it is this store's, else none. */
static void rec_context(const nc_nsstore *ns, bool *mine, uint32_t *doc, uint64_t *off)
{
    *mine = tl.ns == ns;
    *doc = *mine ? tl.doc : NSSTORE_NO_DOC;
    *off = *mine ? tl.off : 0;
}

/* Appends the record made in ns->rec (k bytes), records the provenance,
 * tells the observer (keys NULL in compact storage) and advances the
 * thread's context. */
static int rec_commit(nc_nsstore *ns, size_t k, const rec_spec *r, const float *keys, char *err, size_t errlen)
{
    const bool mine = tl.ns == ns;   /* the thread's context is ns's: r's doc and off came from it (rec_pre) */
    uint64_t seq;
    int rc = wal_append(ns->wal, ns->rec.data, k, &seq, err, errlen);
    if (!rc)
        rc = prov_append(ns, r, err, errlen);
    nsstore_observer obs = __atomic_load_n(&ns->obs, __ATOMIC_ACQUIRE);
    if (!rc && obs)
        obs(__atomic_load_n(&ns->obs_ctx, __ATOMIC_ACQUIRE), ns, r->doc, r->off, keys, r->words, r->n);
    if (!rc && mine) {
        tl.seq = seq;
        tl.off += r->n;
    }
    return rc;
}

/* Before logging an add: its provenance into r (the thread's context);
 * while replaying, only that provenance is kept (*done set); a deleted
 * incarnation takes no more adds (the cache refuses the add whole when its
 * hook fails). */
static int rec_pre(nc_nsstore *ns, rec_spec *r, bool *done, char *err, size_t errlen)
{
    bool mine;
    rec_context(ns, &mine, &r->doc, &r->off);
    *done = ns->replaying;
    if (ns->replaying)
        return prov_append(ns, r, err, errlen);
    return nsstore_check_live(ns, err, errlen);
}

/* rec_pre, then (unless *done) rec_begin. */
static int rec_open(nc_nsstore *ns, rec_spec *r, size_t *k, bool *done, char *err, size_t errlen)
{
    int rc = rec_pre(ns, r, done, err, errlen);
    if (rc || *done)
        return rc;
    return rec_begin(ns, r, k, err, errlen);
}

/* Under the cache's write lock: one ADD record per add, in id order. */
int nsstore_add_hook(void *ctx, const float *keys, const int *words, size_t n, int64_t first_id,
                     char *err, size_t errlen)
{
    nc_nsstore *ns = ctx;
    rec_spec r = {.type = REC_ADD, .flags = KEY_F16, .words = words, .n = n, .first_id = first_id,
                  .dim = (uint32_t)ns->H, .tail = 2 * (size_t)ns->H};
    bool done;
    size_t k;
    int rc = rec_open(ns, &r, &k, &done, err, errlen);
    if (rc || done)
        return rc;
    unsigned char *p = (unsigned char *)ns->rec.data;
    for (size_t i = 0; i < n * (size_t)ns->H; i++) {
        uint16_t h = nc_float_to_half(keys[i]);
        memcpy(p + k + i * 2, &h, 2);
    }
    k += n * (size_t)ns->H * 2;
    /* replay (recovery.c) decodes by the same sizes: an encoder that wrote
     * other than it reserved would make a log that cannot be read back */
    NC_ASSERT(k == r.plen, "add record of %zu bytes, %zu reserved", k, r.plen);
    return rec_commit(ns, k, &r, keys, err, errlen);
}

/* Under a compact cache's write lock: one ADD_CODES record per add -- the
 * word references, then each pair's list (u32) and code, what the index
 * stores (40 bytes a pair for IVF4096,PQ32 against 516 with f16 keys). */
int nsstore_code_hook(void *ctx, const nc_ub_coded *c, char *err, size_t errlen)
{
    NC_ASSERT(c, "nsstore_code_hook: no c");
    nc_nsstore *ns = ctx;
    rec_spec r = {.type = REC_ADD_CODES, .words = c->words, .n = c->n, .first_id = c->first_id,
                  .dim = (uint32_t)c->code_size, .tail = 4 + c->code_size};
    bool done;
    size_t k;
    int rc = rec_open(ns, &r, &k, &done, err, errlen);
    if (rc || done)
        return rc;
    unsigned char *p = (unsigned char *)ns->rec.data;
    for (size_t i = 0; i < c->n; i++) {
        uint32_t l = (uint32_t)c->lists[i];
        memcpy(p + k + i * 4, &l, 4);
    }
    k += c->n * 4;
    memcpy(p + k, c->codes, c->n * c->code_size);
    k += c->n * c->code_size;
    NC_ASSERT(k == r.plen, "add record of %zu bytes, %zu reserved", k, r.plen);
    return rec_commit(ns, k, &r, NULL, err, errlen);
}

size_t nsstore_rec_pair_bytes(const nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_rec_pair_bytes: no ns");
    return ns->compact ? 4 + unbounded_cache_code_size(ns->ub, NULL) : 2 * (size_t)ns->H;
}

void nsstore_rec_head_fields(const unsigned char *p, nsstore_rec_head *h)
{
    NC_ASSERT(p && h, "nsstore_rec_head_fields: no p or h");
    memcpy(&h->n, p + 4, 4);
    memcpy(&h->dim, p + 8, 4);
    memcpy(&h->doc, p + 12, 4);
    memcpy(&h->first, p + 16, 8);
    memcpy(&h->off, p + 24, 8);
    memcpy(&h->nd, p + 32, 4);
}

int nsstore_rec_head_read(const unsigned char *p, size_t len, uint64_t seq, nsstore_rec_head *h, char *err,
                          size_t errlen)
{
    NC_ASSERT(h, "nsstore_rec_head_read: no h");
    const uint32_t want = h->want;
    if (len < REC_HEAD)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: short add record", (unsigned long long)seq);
    nsstore_rec_head_fields(p, h);
    bool keys = p[0] == REC_ADD;
    if ((keys && p[1] != KEY_F16) || h->dim != want || h->n == 0 || h->nd > h->n)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: add of %u pairs of %s %u (expected %u)",
                        (unsigned long long)seq, h->n, keys ? "dimension" : "code size", h->dim, want);
    return NC_OK;
}

void nsstore_set_observer(nc_nsstore *ns, nsstore_observer fn, void *ctx)
{
    NC_ASSERT(ns, "nsstore_set_observer: no ns");
    /* Set while adds may run: ctx first, then the function, published
     * atomically (the hook reads the function once). */
    __atomic_store_n(&ns->obs_ctx, ctx, __ATOMIC_RELEASE);
    __atomic_store_n(&ns->obs, fn, __ATOMIC_RELEASE);
}

int nsstore_add(nc_nsstore *ns, const nsstore_pairs *pairs, uint64_t *seq, char *err, size_t errlen)
{
    NC_ASSERT(pairs, "nsstore_add: no pairs");
    NC_ASSERT(ns, "nsstore_add: no ns");
    const float *keys = pairs->keys;
    const int *words = pairs->words;
    const size_t n = pairs->n;
    if (n == 0) {
        if (seq)
            *seq = 0;
        return NC_OK;
    }
    for (size_t i = 0; i < n; i++)
        if (words[i] < 0 || words[i] >= wordtable_size(ns->words))
            return nc_error(err, errlen, NC_EINVAL, "word id %d outside the namespace's table", words[i]);
    __typeof__(tl) saved = tl;
    nsstore_set_context(ns, pairs->doc, pairs->off);
    /* the keys' coarse search under the read lock, before the write lock
     * (readers go on meanwhile): it places the keys in the same lists as
     * the add's own search would (faiss_shim_add), so the index, the log
     * and what replicas rebuild are as without it */
    nc_ub_coarse coarse = {0};
    nc_ub_add a = {.keys = keys, .words = words, .n = n, .coarse = &coarse};
    int rc = unbounded_cache_add_block(ns->ub, &a, NULL, err, errlen);
    ub_coarse_free(&coarse);
    if (seq)
        *seq = tl.seq;
    tl = saved;
    return rc;
}

bool nsstore_is_compact(const nc_nsstore *ns) { return ns->compact; }
uint64_t nsstore_fingerprint(const nc_nsstore *ns) { return ns->compact ? ns->fingerprint : 0; }

int nsstore_add_codes(nc_nsstore *ns, const nsstore_codes *a, uint64_t *seq, char *err, size_t errlen)
{
    NC_ASSERT(a, "nsstore_add_codes: no a");
    if (seq)
        *seq = 0;
    if (!ns->compact)
        return nc_error(err, errlen, NC_EINVAL, "codes are added to a namespace with compact storage only");
    if (a->n == 0)
        return NC_OK;
    for (size_t i = 0; i < a->n; i++)
        if (a->words[i] < 0 || a->words[i] >= wordtable_size(ns->words))
            return nc_error(err, errlen, NC_EINVAL, "word id %d outside the namespace's table", a->words[i]);
    __typeof__(tl) saved = tl;
    nsstore_set_context(ns, a->doc, a->off);
    nc_ub_coded c = {.lists = a->lists, .codes = a->codes, .code_size = a->code_size, .words = a->words, .n = a->n,
                     .first_id = -1};
    int rc = unbounded_cache_add_codes(ns->ub, &c, err, errlen);
    if (seq)
        *seq = tl.seq;
    tl = saved;
    return rc;
}

int nsstore_sync(nc_nsstore *ns, uint64_t seq, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_sync: no ns");
    if (seq == 0)
        return NC_OK;
    return wal_sync(ns->wal, seq, err, errlen);
}
const char *nsstore_dir(const nc_nsstore *ns) { return ns->dir; }

uint64_t nsstore_last_seq(nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_last_seq: no ns");
    nc_wal_stats ws;
    wal_stats(ns->wal, &ws);
    return ws.last_seq;
}

uint64_t nsstore_durable_seq(nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_durable_seq: no ns");
    return wal_durable_seq(ns->wal);
}

void nsstore_retain_log(nc_nsstore *ns, uint64_t after)
{
    NC_ASSERT(ns, "nsstore_retain_log: no ns");
    __atomic_store_n(&ns->retain, after, __ATOMIC_RELEASE);
}

/* ---- close and stats ----------------------------------------------------------- */

/* bytes of the files under dir (nsstore_stats' disk_bytes) */
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
void nsstore_free_meta(nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_free_meta: no ns");
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
    ns->doc_id_bytes = 0;
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
    nsstore_free_meta(ns);
    buf_free(&ns->rec);
    free(ns->dyn);
    pthread_rwlock_destroy(&ns->meta);
    pthread_mutex_destroy(&ns->snap_lock);
    free(ns);
}

void nsstore_stats(nc_nsstore *ns, nc_nsstore_stats *st)
{
    NC_ASSERT(ns, "nsstore_stats: no ns");
    memset(st, 0, sizeof *st);
    st->entries = unbounded_cache_count(ns->ub);
    st->words = wordtable_size(ns->words) - ns->V;
    st->docs = nsstore_doc_count(ns);
    st->exact = unbounded_cache_is_exact(ns->ub);
    unbounded_cache_train_stats(ns->ub, &st->train);
    st->nprobe = st->train.nprobe;   /* the cache's own: a session's nprobe 0 searches with it */
    st->factory = ns->ubo.factory;
    st->compact = ns->compact;
    st->fingerprint = ns->compact ? ns->fingerprint : unbounded_cache_fingerprint(ns->ub);
    st->wal_bytes = wal_disk_bytes(ns->waldir);
    st->disk_bytes = dir_bytes(ns->dir);
    /* lock order is cache -> meta (the add hook): never the reverse */
    size_t mem = unbounded_cache_memory(ns->ub) + wordtable_memory(ns->words);
    pthread_rwlock_rdlock(&ns->meta);
    st->memory_bytes = mem + ns->provcap * 8 + ns->doccap * 16 + ns->doc_id_bytes;
    pthread_rwlock_unlock(&ns->meta);
    nc_wal_stats ws;
    wal_stats(ns->wal, &ws);
    st->fsyncs = ws.fsyncs;
    st->last_seq = ws.last_seq;
    st->synced_seq = ws.synced_seq;
    /* read atomically, not under snap_lock: a backup holds that lock for
     * the whole copy (a minute at 1M pairs), and GET /metrics reads these
     * stats under the registry's lock, which every upload and session
     * creation takes: a scrape during a backup stalled them all */
    double snap_time, snap_secs;
    __atomic_load(&ns->snap_time, &snap_time, __ATOMIC_ACQUIRE);
    __atomic_load(&ns->snap_secs, &snap_secs, __ATOMIC_ACQUIRE);
    st->snapshot_age = nc_now_s() - snap_time;
    st->snapshot_seconds = snap_secs;
    st->snapshot_seq = __atomic_load_n(&ns->snap_seq, __ATOMIC_ACQUIRE);
}
