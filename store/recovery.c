/* recovery.c -- reading a namespace's log back: nsstore_open (the newest
 * snapshot that verifies, then the log after it replayed) and the log
 * follower (nsstore_log_*) that replication reads. */
#include "nsstore_internal.h"
#include "atomicfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

int nsstore_log_open(nc_nsstore *ns, uint64_t after, nc_nslog **out, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_log_open: no ns");
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

uint64_t nsstore_log_oldest(nc_nsstore *ns)
{
    NC_ASSERT(ns, "nsstore_log_oldest: no ns");
    return wal_oldest_seq(ns->waldir);
}

uint64_t nsstore_log_position(const nc_nslog *l)
{
    NC_ASSERT(l, "nsstore_log_position: no l");
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

/* A log record being read: its bytes, its seq (for messages), and k, the
 * offset read up to. */
typedef struct {
    const unsigned char *p;
    size_t len;
    uint64_t seq;
    size_t k;
} rec_cursor;

/* One open-vocabulary string of an ADD record's word list at c->k (u32
 * length, then the bytes): its offset and length, c->k moved past it. The
 * log follower and the replay read the list alike. */
static int add_record_word(rec_cursor *c, size_t *off, uint32_t *wl, char *err, size_t errlen)
{
    if (c->len - c->k < 4)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: truncated word list", (unsigned long long)c->seq);
    memcpy(wl, c->p + c->k, 4);
    c->k += 4;
    if (*wl == 0 || *wl > c->len - c->k)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: bad word length", (unsigned long long)c->seq);
    *off = c->k;
    c->k += *wl;
    return NC_OK;
}

/* An ADD record being decoded: its seq, bytes, word references (n int32,
 * after the nd surface strings). */
typedef struct {
    uint64_t seq;
    const unsigned char *p, *refs;
    uint32_t n, nd;
} add_view;

/* The n words of an ADD record joined by '\n' into l->words (*wlen bytes,
 * NUL-terminated): vocabulary words from the table, the others from the
 * record (the table may hold them under other ids by now). */
static int log_join_words(nc_nslog *l, const add_view *v, size_t *wlen, char *err, size_t errlen)
{
    nc_nsstore *ns = l->ns;
    const unsigned char *p = v->p, *refs = v->refs;
    uint32_t n = v->n, nd = v->nd;
    uint64_t seq = v->seq;
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
            *wlen = w;
            if (*wlen + 1 > l->wcap) {
                char *b = realloc(l->words, *wlen + 1);
                if (!b)
                    return nc_error(err, errlen, NC_ENOMEM, "log follower");
                l->words = b;
                l->wcap = *wlen + 1;
            }
        }
    }
    l->words[*wlen] = 0;
    return NC_OK;
}

/* One ADD record (the layout nsstore_add_hook writes) into a; NC_EFORMAT if it
 * does not hold together. */
static int log_decode_add(nc_nslog *l, const nc_wal_record *rec, nc_nslog_add *a, char *err, size_t errlen)
{
    nc_nsstore *ns = l->ns;
    const uint64_t seq = rec->seq;
    const unsigned char *p = rec->payload;
    const size_t len = rec->len;
    size_t tail = nsstore_rec_pair_bytes(ns);
    nsstore_rec_head h = {.want = (uint32_t)(ns->compact ? tail - 4 : (size_t)ns->H)};
    int hrc = nsstore_rec_head_read(p, len, seq, &h, err, errlen);
    if (hrc)
        return hrc;
    uint32_t n = h.n, doc = h.doc, nd = h.nd;
    uint64_t off = h.off;
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
    rec_cursor cur = {.p = p, .len = len, .seq = seq, .k = 36};
    for (uint32_t j = 0; j < nd; j++) {
        int rc = add_record_word(&cur, &l->dyn_off[j], &l->dyn_len[j], err, errlen);
        if (rc)
            return rc;
    }
    const size_t k = cur.k;
    size_t wl = 0;
    if (len - k != (size_t)n * (4 + tail))
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes for %u pairs", (unsigned long long)seq,
                        len - k, n);
    const unsigned char *refs = p + k;
    add_view v = {.seq = seq, .p = p, .refs = refs, .n = n, .nd = nd};
    int rc = log_join_words(l, &v, &wl, err, errlen);
    if (rc)
        return rc;
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
    a->keys_f16 = ns->compact ? NULL : refs + (size_t)n * 4;
    a->lists = ns->compact ? refs + (size_t)n * 4 : NULL;
    a->codes = ns->compact ? refs + (size_t)n * 8 : NULL;
    a->code_size = ns->compact ? tail - 4 : 0;
    a->fingerprint = ns->compact ? ns->fingerprint : 0;
    a->words = l->words;
    a->words_len = wl;
    return NC_OK;
}

int nsstore_log_next(nc_nslog *l, nc_nslog_add *a, char *err, size_t errlen)
{
    NC_ASSERT(l, "nsstore_log_next: no l");
    int live = nsstore_check_live(l->ns, err, errlen);
    if (live != NC_OK)
        return live;   /* its segments' names now belong to a new incarnation */
    uint64_t upto = wal_durable_seq(l->ns->wal);
    for (;;) {
        nc_wal_record rec;
        int rc = wal_reader_next(l->r, upto, &rec, err, errlen);
        if (rc <= 0)
            return rc;
        const uint64_t seq = rec.seq;
        const unsigned char *p = rec.payload;
        const size_t len = rec.len;
        if (len < 4)
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes", (unsigned long long)seq, len);
        if (p[0] == REC_DOC)
            continue;
        if (p[0] != (l->ns->compact ? REC_ADD_CODES : REC_ADD))
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: type %d in a store with %s", (unsigned long long)seq,
                            p[0], l->ns->compact ? "compact storage" : "keys");
        rc = log_decode_add(l, &rec, a, err, errlen);
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
    int64_t *lists;               /* compact: the record's lists */
} replay_ctx;

/* A DOC record: the document's id, appended unless the snapshot has it. */
static int replay_doc(nc_nsstore *ns, uint64_t seq, const unsigned char *p, size_t len, char *err, size_t errlen)
{
    uint32_t d, l;
    if (len < 12)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: short document record",
                        (unsigned long long)seq);
    memcpy(&d, p + 4, 4);
    memcpy(&l, p + 8, 4);
    if (l != len - 12 || !nsstore_valid_doc_id((const char *)p + 12, l))
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: bad document id", (unsigned long long)seq);
    int rc = NC_OK;
    pthread_rwlock_wrlock(&ns->meta);
    if (d > ns->ndocs)
        rc = nc_error(err, errlen, NC_EFORMAT, "log record %llu: document %u after %u documents",
                      (unsigned long long)seq, d, ns->ndocs);
    else if (d == ns->ndocs)
        rc = nsstore_doc_push(ns, (const char *)p + 12, l, err, errlen);
    /* d < ndocs: already in the snapshot */
    pthread_rwlock_unlock(&ns->meta);
    return rc;
}

/* c's id and key buffers grown to m pairs of dimension H. */
static int replay_reserve(replay_ctx *c, size_t m, size_t H, char *err, size_t errlen)
{
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
    return NC_OK;
}

/* An add record being replayed: its bytes, seq and fixed part, the offset
 * of its strings (then of its word references), and the pairs [skip,
 * skip + m) the snapshot lacks. */
typedef struct {
    const unsigned char *p;
    size_t len;
    uint64_t seq;
    nsstore_rec_head h;
    size_t k, skip, m;
} rec_view;

/* The word ids of v's pairs [skip, skip + m) into c->ids; v->k moved past
 * the strings to the word references. */
static int replay_words(replay_ctx *c, rec_view *v, char *err, size_t errlen)
{
    nc_nsstore *ns = c->ns;
    const unsigned char *p = v->p;
    const size_t len = v->len, skip = v->skip, m = v->m;
    const uint64_t seq = v->seq;
    const nsstore_rec_head *h = &v->h;
    size_t *k = &v->k;
    if (h->nd > c->mcap) {
        int *mp = realloc(c->map, h->nd * sizeof *mp);
        if (!mp)
            return nc_error(err, errlen, NC_ENOMEM, "replay");
        c->map = mp;
        c->mcap = h->nd;
    }
    rec_cursor cur = {.p = p, .len = len, .seq = seq, .k = *k};
    for (uint32_t j = 0; j < h->nd; j++) {
        size_t woff = 0;
        uint32_t l = 0;
        int rc = add_record_word(&cur, &woff, &l, err, errlen);
        *k = cur.k;
        if (rc)
            return rc;
        c->map[j] = wordtable_id(ns->words, (const char *)p + woff, l, true);
        if (c->map[j] < 0)
            return nc_error(err, errlen, NC_ENOMEM, "word table");
    }
    if ((len - *k) != (size_t)h->n * (4 + nsstore_rec_pair_bytes(ns)))
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes for %u pairs", (unsigned long long)seq,
                        len - *k, h->n);
    int wsize = wordtable_size(ns->words);
    for (size_t i = 0; i < m; i++) {
        int32_t r;
        memcpy(&r, p + *k + (skip + i) * 4, 4);
        int id = r >= 0 && r < ns->V ? r : (r >= ns->V && (uint32_t)(r - ns->V) < h->nd ? c->map[r - ns->V] : -1);
        if (id < 0 || id >= wsize)
            return nc_error(err, errlen, NC_EFORMAT, "log record %llu: bad word reference %d",
                            (unsigned long long)seq, r);
        c->ids[i] = id;
    }
    return NC_OK;
}

/* Pairs [skip, skip + m) of an ADD_CODES record whose lists and codes
 * start at q into the compact cache, as they were logged. */
static int replay_codes(replay_ctx *c, const rec_view *v, const unsigned char *q, char *err, size_t errlen)
{
    const nsstore_rec_head *h = &v->h;
    const size_t cs = h->dim, skip = v->skip, m = v->m;
    int64_t *lists = realloc(c->lists, (m ? m : 1) * sizeof *lists);
    if (!lists)
        return nc_error(err, errlen, NC_ENOMEM, "replay");
    c->lists = lists;
    for (size_t i = 0; i < m; i++) {
        uint32_t l;
        memcpy(&l, q + (skip + i) * 4, 4);
        lists[i] = l;
    }
    nc_ub_coded cd = {.lists = lists, .codes = q + (size_t)h->n * 4 + skip * cs, .code_size = cs, .words = c->ids,
                      .n = m, .first_id = h->first + (int64_t)skip};
    return unbounded_cache_add_codes(c->ns->ub, &cd, err, errlen);
}

/* An ADD (keys) or ADD_CODES (compact) record: the pairs the snapshot does
 * not have yet, added to the cache (the hooks record their provenance
 * while replaying). */
static int replay_add(replay_ctx *c, uint64_t seq, const unsigned char *p, size_t len, char *err, size_t errlen)
{
    nc_nsstore *ns = c->ns;
    if (p[0] != REC_ADD && p[0] != REC_ADD_CODES)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: unknown type %d", (unsigned long long)seq, p[0]);
    if ((p[0] == REC_ADD_CODES) != ns->compact)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %s in a store with %s", (unsigned long long)seq,
                        ns->compact ? "an add with keys" : "an add of codes", ns->compact ? "compact storage" : "keys");
    rec_view v = {.p = p, .len = len, .seq = seq, .k = REC_HEAD};
    size_t tail = nsstore_rec_pair_bytes(ns);
    nsstore_rec_head h = {.want = (uint32_t)(ns->compact ? tail - 4 : (size_t)ns->H)};
    int rc = nsstore_rec_head_read(p, len, seq, &h, err, errlen);
    if (rc)
        return rc;
    v.h = h;
    int64_t have = unbounded_cache_count(ns->ub);
    if (h.first > have)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: pairs from id %lld but only %lld are known "
                        "(a record is missing)", (unsigned long long)seq, (long long)h.first, (long long)have);
    if (h.first + (int64_t)h.n <= have)
        return NC_OK;   /* already in the snapshot */
    size_t skip = (size_t)(have - h.first), m = h.n - skip, H = (size_t)ns->H;
    v.skip = skip;
    v.m = m;
    if (h.doc != NSSTORE_NO_DOC && h.doc >= nsstore_doc_count(ns))
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: unknown document %u", (unsigned long long)seq,
                        h.doc);
    if ((rc = replay_reserve(c, m, ns->compact ? 0 : H, err, errlen)) ||
        (rc = replay_words(c, &v, err, errlen)))
        return rc;
    const unsigned char *q = p + v.k + (size_t)h.n * 4;   /* past the word references */
    nsstore_set_context(ns, h.doc, h.off + skip);
    if (ns->compact) {
        rc = replay_codes(c, &v, q, err, errlen);
    } else {
        for (size_t i = 0; i < m * H; i++) {
            uint16_t x;
            memcpy(&x, q + (skip * H + i) * 2, 2);
            c->keys[i] = nc_half_to_float(x);
        }
        rc = unbounded_cache_add(ns->ub, c->keys, c->ids, m, NULL, err, errlen);
    }
    nsstore_clear_context();
    return rc;
}

static int replay_record(void *vctx, uint64_t seq, const void *payload, size_t len, char *err,
                         size_t errlen)
{
    replay_ctx *c = vctx;
    const unsigned char *p = payload;
    if (len < 4)
        return nc_error(err, errlen, NC_EFORMAT, "log record %llu: %zu bytes", (unsigned long long)seq, len);
    if (p[0] == REC_DOC)
        return replay_doc(c->ns, seq, p, len, err, errlen);
    return replay_add(c, seq, p, len, err, errlen);
}

/* ---- opening: the newest snapshot that verifies, then the log after it ----- */

/* What step 1 of nsstore_open found, for step 2: the loaded snapshot's
 * sequence (0: none), the newest one set aside as corrupt (0: none) and why
 * the first one failed ("" when none did). */
typedef struct {
    uint64_t base;
    uint64_t corrupt_seq;
    char first_err[NC_ERRLEN];
} snapshot_found;

/* Step 1 of nsstore_open: loads the newest snapshot that verifies into
 * ns; the corrupt ones are set aside (renamed .corrupt, named in
 * info->warning). An I/O error or a failed allocation returns at once,
 * nothing changed on disk. */
static int load_newest_snapshot(nc_nsstore *ns, nc_nsstore_recovery *info, snapshot_found *f, char *err,
                                size_t errlen)
{
    uint64_t *base = &f->base, *corrupt_seq = &f->corrupt_seq;
    char *first_err = f->first_err;
    uint64_t *snaps = NULL;
    int nsn = 0, rc = nsstore_snapshot_list(ns->dir, &snaps, &nsn, true);
    if (rc)
        rc = nc_error(err, errlen, rc, "%s: cannot list snapshots", ns->dir);
    for (int i = 0; !rc && i < nsn; i++) {
        char e2[NC_ERRLEN] = "";
        int lrc = nsstore_snapshot_load(ns, snaps[i], e2, sizeof e2);
        if (lrc == NC_OK) {
            *base = snaps[i];
            info->snapshot_seq = *base;
            info->snapshot_entries = unbounded_cache_count(ns->ub);
            break;
        }
        if (lrc != NC_EFORMAT && lrc != NC_ENOTFOUND) {
            /* An I/O error or a failed allocation says nothing about the
             * snapshot: refuse without touching the disk, so that the open
             * succeeds once the fault is gone (found by test_fault_injection: two
             * transient read errors used to set both snapshots aside and
             * leave a namespace the log could no longer rebuild). */
            rc = nc_error(err, errlen, lrc, "%s (nothing was changed on disk)", e2);
            break;
        }
        if (!first_err[0])
            snprintf(first_err, NC_ERRLEN, "%s", e2);
        if (snaps[i] > *corrupt_seq)
            *corrupt_seq = snaps[i];
        /* kept aside for inspection, never loaded again */
        char from[1200], to[1200];
        nsstore_snapshot_path(ns, snaps[i], "", from, sizeof from);
        nsstore_snapshot_path(ns, snaps[i], ".corrupt", to, sizeof to);
        nsstore_remove_dir(to, NULL, 0);
        rename(from, to);
        snprintf(info->warning + strlen(info->warning), sizeof info->warning - strlen(info->warning),
                 "%s%s (set aside as %s)", info->warning[0] ? "; " : "", e2, to);
    }
    free(snaps);
    return rc;
}

/* Step 2 of nsstore_open: replays the log after the snapshot f->base into
 * the cache and opens the log for appending. A corrupt snapshot
 * (f->first_err, f->corrupt_seq) the log cannot stand in for fails the
 * open. */
static int replay_log(nc_nsstore *ns, nc_nsstore_recovery *info, const snapshot_found *f, char *err,
                      size_t errlen)
{
    const uint64_t base = f->base, corrupt_seq = f->corrupt_seq;
    const char *first_err = f->first_err;
    int rc;
    unbounded_cache_set_add_hook(ns->ub, nsstore_add_hook, ns);
    unbounded_cache_set_code_hook(ns->ub, nsstore_code_hook, ns);
    ns->replaying = true;
    replay_ctx c = {.ns = ns};
    nc_wal_replay_info wi;
    const nc_wal_replay_spec spec = {
        .dir = ns->waldir, .tag = ns->tag, .after = base, .fn = replay_record, .ctx = &c};
    rc = wal_replay(&spec, &wi, err, errlen);
    ns->replaying = false;
    free(c.keys);
    free(c.ids);
    free(c.map);
    free(c.lists);
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
        const nc_wal_open_spec open = {.dir = ns->waldir,
                                       .tag = ns->tag,
                                       .next_seq = (wi.last_seq > base ? wi.last_seq : base) + 1,
                                       .mode = ns->sync,
                                       .stopped = &stopped};
        rc = wal_open(&open, &ns->wal, err, errlen);
        if (stopped)
            /* a full disk: everything is recovered and can be read;
             * writes fail (507) until nsstore_heal finds room */
            snprintf(info->warning + strlen(info->warning), sizeof info->warning - strlen(info->warning),
                     "%sno room on the disk for a new log segment: read-only until there is room (%s)",
                     info->warning[0] ? "; " : "", err);
    }
    return rc;
}

/* Part of step 0: whether the store runs the index's own training. A store
 * with a log and no NSSTORE_TRAINING_MARK was written by a build before it:
 * its answers stay what they were (the model's index at the switch it may
 * have crossed), so it keeps that lifecycle (own_training off). A new store
 * asked for it makes the mark in storage_commit, before its log. */
static int training_read(nc_nsstore *ns, char *err, size_t errlen)
{
    if (!ns->ubo.own_training || ns->compact)
        return NC_OK;
    char path[1200];
    struct stat st;
    snprintf(path, sizeof path, "%s/" NSSTORE_TRAINING_MARK, ns->dir);
    if (stat(path, &st) == 0)
        return NC_OK;
    if (errno != ENOENT)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    if (stat(ns->waldir, &st) == 0)
        ns->ubo.own_training = false;   /* an earlier build's store */
    else
        ns->training_new = true;
    return NC_OK;
}

/* Step 0 of nsstore_open: the storage the store was created with, from its
 * storage file (none: keys), into ns->compact and ns->fingerprint; a new
 * store (no log directory yet) asked for compact storage is compact, its
 * fingerprint 0 until storage_commit writes the file. An existing store
 * with keys cannot become compact: NC_ESTATE. */
static int storage_read(nc_nsstore *ns, bool want_compact, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/" STORAGE_FILE, ns->dir);
    FILE *f = fopen(path, "r");
    if (f) {
        unsigned long long fp = 0;
        char kind[32] = "";
        int got = fscanf(f, "%31s %16llx", kind, &fp);
        fclose(f);
        if (got >= 1 && strcmp(kind, "compact") != 0 && strspn(kind, "abcdefghijklmnopqrstuvwxyz0123456789-") ==
                                                            strlen(kind))
            return nc_error(err, errlen, NC_ESTATE, "%s: storage '%s' is unknown to this build (it reads "
                            "'compact'): written by a later neurocache? serve this data directory with it", path,
                            kind);
        if (got != 2 || fp == 0)
            return nc_error(err, errlen, NC_EFORMAT, "%s: not a storage file (\"compact <fingerprint>\")", path);
        ns->compact = true;
        ns->fingerprint = fp;
    } else if (errno != ENOENT) {
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    } else if (want_compact) {
        struct stat st;
        if (stat(ns->waldir, &st) == 0)
            return nc_error(err, errlen, NC_ESTATE, "%s holds a namespace with keys storage: it cannot become "
                            "compact (delete it and create it again)", ns->dir);
        ns->compact = true;
    }
    ns->ubo.compact = ns->compact;
    return training_read(ns, err, errlen);
}

/* After the cache is made (loaded or new): a new compact store's storage
 * file is written (before its log: a store with a log and no storage file
 * has keys); an existing one's fingerprint must be its index's. */
static int storage_commit(nc_nsstore *ns, char *err, size_t errlen)
{
    if (ns->training_new) {
        char path[1200];
        snprintf(path, sizeof path, "%s/" NSSTORE_TRAINING_MARK, ns->dir);
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
        ns->training_new = false;
    }
    if (!ns->compact)
        return NC_OK;
    uint64_t fp = unbounded_cache_fingerprint(ns->ub);
    if (ns->fingerprint == 0) {
        char path[1200], line[64];
        snprintf(path, sizeof path, "%s/" STORAGE_FILE, ns->dir);
        int n = snprintf(line, sizeof line, "compact %016llx\n", (unsigned long long)fp);
        int rc = atomicfile_write(path, line, (size_t)n, err, errlen);
        if (!rc)
            ns->fingerprint = fp;
        return rc;
    }
    if (fp != ns->fingerprint)
        return nc_error(err, errlen, NC_EFORMAT, "%s: compact storage holds the PQ codes of trained index %016llx, "
                        "and the index here is %016llx: its codes cannot be read with another quantizer, nor "
                        "encoded again (compact storage keeps no keys); open it with the model's unbounded.faiss "
                        "it was made with, or upload its documents again", ns->dir,
                        (unsigned long long)ns->fingerprint, (unsigned long long)fp);
    return NC_OK;
}

int nsstore_open(const nc_nsstore_opts *o, nc_nsstore **out, nc_nsstore_recovery *info, char *err,
                 size_t errlen)
{
    NC_ASSERT(o, "nsstore_open: no o");
    nc_nsstore_recovery dummy;
    if (!info)
        info = &dummy;
    memset(info, 0, sizeof *info);
    *out = NULL;
    double t0 = nc_now_s();
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

    /* 0. its storage; 1. the newest snapshot that verifies */
    snapshot_found found = {.base = 0, .corrupt_seq = 0, .first_err = ""};
    int rc = storage_read(ns, o->compact, err, errlen);
    if (!rc)
        rc = load_newest_snapshot(ns, info, &found, err, errlen);
    if (!rc && !ns->ub) {
        rc = wordtable_new(ns->m->vocab, &ns->words, err, errlen);
        if (!rc)
            rc = unbounded_cache_new(&ns->ubo, ns->words, &ns->ub, err, errlen);
    }
    if (!rc)
        rc = storage_commit(ns, err, errlen);
    /* 2. the log after it */
    if (!rc)
        rc = replay_log(ns, info, &found, err, errlen);
    /* 3. a training due and not done (one a crash interrupted, or one a
     * snapshot of an earlier build never had): started again, in the
     * background, on the same keys (unbounded_cache.h) */
    if (!rc)
        rc = unbounded_cache_train_kick(ns->ub, err, errlen);
    if (rc) {
        nsstore_close(ns);
        return rc;
    }
    ns->snap_seq = found.base;
    ns->snap_time = nc_now_s();
    info->entries = unbounded_cache_count(ns->ub);
    info->seconds = nc_now_s() - t0;
    *out = ns;
    return NC_OK;
}
