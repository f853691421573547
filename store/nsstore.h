/* nsstore.h -- a durable namespace: the unbounded cache of one namespace
 * (core/unbounded_cache: FAISS index + word ids), its open-vocabulary word table
 * (core/wordtable), the provenance of every pair (document, token offset),
 * a write-ahead log (store/wal) and snapshots. Design §5-§6.
 *
 * On disk, under dir:
 *   wal/wal-<seq>.log   the log: DOC records (a document id) and ADD records
 *                       (first pair id, document, offset, f16 keys, words;
 *                       open-vocabulary words by their surface string), or
 *                       in compact storage ADD_CODES records (the same with
 *                       each pair's u32 list and PQ code for its key)
 *   storage             compact storage only: "compact <fingerprint>"
 *   snap-<seq>/         a snapshot covering every record <= seq: index.faiss,
 *                       values.bin, words.txt (unbounded_cache_save), prov.bin,
 *                       docs.bin and MANIFEST (sizes and crc32 of each file,
 *                       itself checksummed; written last, so a snapshot
 *                       without a valid MANIFEST is incomplete)
 * Recovery: the newest snapshot is verified and loaded, then the log records
 * after it are replayed (pairs already in the snapshot are skipped by id). A
 * torn final log record is truncated with a warning. A corrupt snapshot is
 * refused with a message naming the file, unless the log still reaches back
 * far enough to rebuild without it (the previous snapshot and the log since
 * then are kept for that), which is done with a warning.
 *
 * Keys are stored rounded to float16 (unbounded_cache key_f16), so the log's f16 keys
 * rebuild exactly the index that served before: predictions after a restart
 * are identical.
 *
 * Compact storage (nsstore_opts.compact, for a new store; kept in its
 * directory's "storage" file with the training fingerprint of its index):
 * the store keeps no keys. Its cache is the trained IVFPQ index from the
 * first pair (unbounded_cache compact), and its log records what the index
 * stores -- each pair's list and PQ code (ADD_CODES records) -- which
 * replay adds back as they were: the same lists, codes and predictions.
 * Whatever needs keys (an exact index, another quantizer, another model)
 * is refused naming the compact storage; opening it with a trained index
 * of another fingerprint too.
 *
 * Adds can come from two places: nsstore_add (documents), or any
 * unbounded_cache_add on nsstore_unbounded_cache() -- a session's stream adapting through
 * doc_score -- which the store logs through the cache's add hook. The
 * provenance of the latter is taken from the calling thread's context
 * (nsstore_set_context). Thread-safe. */
#ifndef NC_NSSTORE_H
#define NC_NSSTORE_H

#include "unbounded_cache.h"
#include "model.h"
#include "wal.h"

typedef struct nc_nsstore nc_nsstore;

#define NSSTORE_NO_DOC 0xffffffffu

/* The snapshot format this build writes (its MANIFEST's first line,
 * "neurocache-snapshot 2"; version 1, without the keys count, still loads) and the newest it reads: a newer snapshot stops
 * recovery naming both versions, never set aside as corrupt. */
#define NSSTORE_SNAPSHOT_VERSION 2

/* An empty directory in the directory of a store created with the index's
 * own training, made before its log directory (a plain mkdir, as the log's:
 * durable with it, and no write for the fault layer to count). A store
 * with a log and without it was created by an earlier build and keeps the
 * lifecycle it had: the model's index at the switch, no training of its own
 * (docs/operations.md, upgrades). A backup keeps it. */
#define NSSTORE_TRAINING_MARK "training"

typedef struct {
    const char *dir;              /* namespace directory (created if absent) */
    const nc_model *model;        /* borrowed: vocabulary, hidden size */
    nc_unbounded_cache_opts ub;           /* index options; dim and key_f16 are set */
    nc_wal_sync sync;             /* fsync policy of the log */
    bool compact;                 /* a new store: compact storage (below);
                                   * an existing store keeps the storage it
                                   * was created with (nsstore_stats) */
} nc_nsstore_opts;

typedef struct {
    double seconds;               /* whole recovery */
    uint64_t snapshot_seq;        /* 0 = none loaded */
    int64_t snapshot_entries;
    uint64_t records_replayed;
    int64_t entries;              /* after recovery */
    char warning[2 * NC_ERRLEN];  /* torn tail truncated, snapshot skipped... */
} nc_nsstore_recovery;

/* Opens (recovering) or creates the namespace in o->dir. info may be NULL. */
int nsstore_open(const nc_nsstore_opts *o, nc_nsstore **out, nc_nsstore_recovery *info,
                 char *err, size_t errlen);
/* Closes without a snapshot (the log holds everything). NULL allowed. */
void nsstore_close(nc_nsstore *ns);

nc_unbounded_cache *nsstore_unbounded_cache(nc_nsstore *ns);
nc_wordtable *nsstore_words(nc_nsstore *ns);

#define NSSTORE_DOC_ID_MAX 1024   /* bytes of a document id */

/* Registers a document (id of 1..NSSTORE_DOC_ID_MAX bytes; "" = generated
 * "doc-<n>") and logs it. *doc receives its reference (nsstore_doc_info
 * gives the id used). */
int nsstore_doc_begin(nc_nsstore *ns, const char *id, size_t len, uint32_t *doc, char *err, size_t errlen);

/* Pairs to add: n keys [n, H] with their namespace word ids, from
 * document doc, the first pair being the token at offset off. */
typedef struct {
    const float *keys;
    const int *words;
    size_t n;
    uint32_t doc;
    uint64_t off;
} nsstore_pairs;

/* Adds a's pairs. *seq (optional) receives the last log record written;
 * durable after nsstore_sync. */
int nsstore_add(nc_nsstore *ns, const nsstore_pairs *a, uint64_t *seq, char *err, size_t errlen);

/* A compact store's add of pairs given as its index stores them (a replica
 * of a compact namespace): lists and codes of the store's training
 * (nsstore_stats.fingerprint), as nsstore_add otherwise. NC_EINVAL for a
 * store with keys; NC_EFORMAT for a code size or list that does not fit. */
typedef struct {
    const int64_t *lists;         /* [n] */
    const uint8_t *codes;         /* [n, code_size] */
    size_t code_size;
    const int *words;             /* [n] namespace word ids */
    size_t n;
    uint32_t doc;
    uint64_t off;
} nsstore_codes;
int nsstore_add_codes(nc_nsstore *ns, const nsstore_codes *a, uint64_t *seq, char *err, size_t errlen);
/* Whether ns has compact storage, and its training fingerprint (0 with
 * keys): fixed at creation, read without locks. */
bool nsstore_is_compact(const nc_nsstore *ns);
uint64_t nsstore_fingerprint(const nc_nsstore *ns);

/* Provenance for adds made through unbounded_cache_add in this thread: doc and the
 * offset of the next pair (advanced by each add). clear ends it; last_seq
 * is the last record this thread logged since set_context (0 = none). */
void nsstore_set_context(nc_nsstore *ns, uint32_t doc, uint64_t off);
uint64_t nsstore_context_seq(void);
void nsstore_clear_context(void);

/* Observer of logged adds (replication): called after each add's record is
 * written (not during recovery), under the cache's write lock -- it must be
 * quick and must not call into the cache. doc/off: the provenance (doc may
 * be NSSTORE_NO_DOC), keys [n, H] as stored (NULL in compact storage),
 * words namespace word ids. NULL fn removes it. */
typedef void (*nsstore_observer)(void *ctx, nc_nsstore *ns, uint32_t doc, uint64_t off,
                                 const float *keys, const int *words, size_t n);
void nsstore_set_observer(nc_nsstore *ns, nsstore_observer fn, void *ctx);

/* ---- following the log (replication's publisher) ----
 * The adds logged after a given record, read back from the log itself once
 * durable, so that whatever was acknowledged can be published even after a
 * crash or a long Redis outage (nothing is held only in memory). */
typedef struct nc_nslog nc_nslog;
typedef struct {
    uint64_t seq;                 /* its log record */
    const char *doc;              /* document id, "" = none */
    uint64_t off;                 /* offset of the first pair in the document */
    size_t n;                     /* pairs */
    const void *keys_f16;         /* [n, H] float16 little-endian, as logged;
                                   * NULL in compact storage, which has: */
    const void *lists;            /* [n] u32 little-endian inverted lists */
    const void *codes;            /* [n, code_size] PQ codes */
    size_t code_size;
    uint64_t fingerprint;         /* compact: the training they belong to */
    const char *words;            /* the n surface strings, '\n'-joined */
    size_t words_len;
} nc_nslog_add;
/* A follower of ns's log from the record after `after`. NC_ENOTFOUND when
 * the log no longer reaches back that far. Close before the store. */
int nsstore_log_open(nc_nsstore *ns, uint64_t after, nc_nslog **out, char *err, size_t errlen);
/* The next durable ADD record (DOC records are passed over): 1 with *a
 * (valid until the next call), 0 when none is durable yet, or a negative
 * NC_ code. */
int nsstore_log_next(nc_nslog *l, nc_nslog_add *a, char *err, size_t errlen);
/* The oldest record ns's log still holds (first of its oldest segment;
 * snapshots prune older ones), 0 = none. */
uint64_t nsstore_log_oldest(nc_nsstore *ns);
/* The last record consumed (ADD or DOC). */
uint64_t nsstore_log_position(const nc_nslog *l);
/* NULL allowed. */
void nsstore_log_close(nc_nslog *l);
/* Snapshots keep every log segment holding a record > after (what a
 * follower has not consumed yet), however old. UINT64_MAX (the default)
 * = no constraint. */
void nsstore_retain_log(nc_nsstore *ns, uint64_t after);
/* The last record appended to the log (durable or not), and the last one
 * a follower may read (wal_durable_seq). */
uint64_t nsstore_last_seq(nc_nsstore *ns);
uint64_t nsstore_durable_seq(nc_nsstore *ns);
/* The namespace's directory (nsstore_opts.dir). */
const char *nsstore_dir(const nc_nsstore *ns);

/* Returns once every record up to seq is durable (group commit). */
int nsstore_sync(nc_nsstore *ns, uint64_t seq, char *err, size_t errlen);

/* Writes a snapshot and prunes what older snapshots and log segments are no
 * longer needed. seconds (optional) receives the duration. */
int nsstore_snapshot(nc_nsstore *ns, double *seconds, char *err, size_t errlen);
/* After a write or fsync error the log takes no more appends (wal_broken:
 * adds fail with NC_EIO, the server answers 503), and so does a log
 * opened on a disk without room for a new segment (NC_ENOSPACE, 507).
 * nsstore_heal writes a snapshot of what memory holds -- every record
 * appended before the error, acknowledged or not; not needed for a log
 * opened stopped -- and starts a new log segment after it, so adds work
 * again once the storage does. NC_OK when the log was not broken; an
 * error (the log stays broken, try again later) when the snapshot or the
 * new segment cannot be written. */
bool nsstore_log_broken(nc_nsstore *ns);
int nsstore_heal(nc_nsstore *ns, double *seconds, char *err, size_t errlen);

/* Where a stored pair came from: its document's id, the token's offset
 * in it, and the pair's word id. */
typedef struct {
    char doc_id[NSSTORE_DOC_ID_MAX + 1];
    uint64_t off;
    int word;
} nsstore_provenance;

/* The provenance of pair id into *p. NC_ENOTFOUND for an unknown id or a
 * pair without a document. */
int nsstore_entry(nc_nsstore *ns, int64_t id, nsstore_provenance *p, char *err, size_t errlen);
/* The words of the pairs of id's document at offsets [off-before, off+after]
 * as text ("a b [c] d", the entry's own word in brackets) into buf. */
void nsstore_snippet(nc_nsstore *ns, int64_t id, int before, int after, char *buf, size_t len);

/* Documents: count, and the i-th (id copied, pairs stored from it). */
uint32_t nsstore_doc_count(nc_nsstore *ns);
int nsstore_doc_info(nc_nsstore *ns, uint32_t i, char *id, size_t idlen, uint64_t *pairs);

typedef struct {
    int64_t entries;
    int words;                    /* open-vocabulary words (ids >= V) */
    uint32_t docs;
    bool exact;                   /* flat index, not yet IVF */
    int nprobe;
    const char *factory;          /* IVF factory string (borrowed) */
    bool compact;                 /* compact storage */
    uint64_t fingerprint;         /* training fingerprint of its IVFPQ index, 0 = none */
    uint64_t wal_bytes;           /* on disk */
    uint64_t disk_bytes;          /* log + snapshots */
    size_t memory_bytes;
    uint64_t fsyncs;
    uint64_t last_seq, synced_seq;
    double snapshot_age;          /* seconds since the last snapshot (or open); */
    double snapshot_seconds;      /* duration of the last snapshot, 0 = none */
    uint64_t snapshot_seq;
    nc_ub_train_stats train;      /* the index's own training (unbounded_cache.h) */
} nc_nsstore_stats;
void nsstore_stats(nc_nsstore *ns, nc_nsstore_stats *st);

/* Retires the store of a deleted namespace, before its directory is moved
 * or removed: waits for a snapshot, heal or nsstore_run_live in progress
 * (they write under the directory's path), then refuses with NC_ESTATE
 * every later write (documents, adds, snapshots, heals, log followers),
 * so nothing of a deleted incarnation lands in a directory a namespace
 * created again under the same name now owns. Reads of memory go on
 * (the caller decides who may still read). Idempotent. */
void nsstore_retire(nc_nsstore *ns);
bool nsstore_retired(nc_nsstore *ns);
/* Calls fn(ctx, dir) with the store's directory unless the store is
 * retired, excluding nsstore_retire meanwhile (a file written next to the
 * store, e.g. replication's marker, lands in this incarnation's directory
 * or not at all). fn's return, or NC_ESTATE when retired. */
int nsstore_run_live(nc_nsstore *ns, int (*fn)(void *ctx, const char *dir), void *ctx);

/* Removes a namespace directory and everything in it (the store must be
 * closed). */
int nsstore_remove_dir(const char *dir, char *err, size_t errlen);

/* Model tag of the log (crc of V, H and the vocabulary): a log of another
 * model is refused. */
uint32_t nsstore_model_tag(const nc_model *m);

#endif
