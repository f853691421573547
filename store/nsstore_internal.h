/* nsstore_internal.h -- what the namespace store's files share (nsstore.c,
 * snapshot.c, recovery.c): the store's struct, the log record layout, and
 * the functions one file lends another. Not for use outside store/. */
#ifndef NC_NSSTORE_INTERNAL_H
#define NC_NSSTORE_INTERNAL_H

#include "nsstore.h"
#include "buf.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define REC_DOC 1
#define REC_ADD 2
#define REC_ADD_CODES 3           /* compact storage: lists and PQ codes, no keys */
#define KEY_F16 1
#define REC_HEAD 36               /* an add record's fixed part, before its words */
#define KEYS_FILE "keys.f16"      /* in the store's directory: every pair's f16 key, appended by snapshots (the index's own training) */
#define STORAGE_FILE "storage"    /* "compact <fingerprint, 16 hex>\n" in a compact store's directory */
#define DOC_ID_MAX NSSTORE_DOC_ID_MAX

struct nc_nsstore {
    char dir[1024], waldir[1100];
    const nc_model *m;
    int V, H;
    uint32_t tag;
    nc_unbounded_cache_opts ubo;
    bool compact;                 /* compact storage (ubo.compact), fixed at creation */
    bool training_new;            /* a new store with the own training: TRAINING_FILE to write (recovery.c) */
    uint64_t fingerprint;         /* a compact store's training fingerprint (its storage file) */
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
    size_t doc_id_bytes;          /* the ids' heap chunks (nsstore_doc_push), in the memory gauge */
    /* hook state: only touched under the cache's write lock */
    bool replaying;
    nsstore_observer obs;         /* replication (server/replication/replication.c) */
    void *obs_ctx;
    nc_buf rec;                   /* the ADD record being built (grown, reused) */
    int *dyn;                     /* dynamic ids of the record being built */
    size_t dyn_cap;
    /* snapshots */
    pthread_mutex_t snap_lock;
    uint64_t snap_seq, prev_snap_seq;   /* snap_seq: written under snap_lock, atomically */
    uint64_t snap_trainings;            /* the own index's trainings the newest snapshot holds (snap_lock) */
    double snap_time, snap_secs;        /* written under snap_lock, atomically: read by nsstore_stats without it */
    uint64_t retain;              /* nsstore_retain_log (atomic) */
    bool retired;                 /* nsstore_retire: set under snap_lock, read atomically */
};

/* Whether ns was retired (nsstore_retire); NC_ESTATE with a message if so. */
int nsstore_check_live(nc_nsstore *ns, char *err, size_t errlen);

/* nsstore.c: documents and provenance (meta lock) */
bool nsstore_valid_doc_id(const char *id, size_t len);
/* meta write lock held */
int nsstore_doc_push(nc_nsstore *ns, const char *id, size_t len, char *err, size_t errlen);
void nsstore_free_meta(nc_nsstore *ns);
/* the cache's add hook: logs one ADD record per add (unbounded_cache_add_hook) */
int nsstore_add_hook(void *ctx, const float *keys, const int *words, size_t n, int64_t first_id,
                     char *err, size_t errlen);

/* the compact cache's code hook: logs one ADD_CODES record per add */
int nsstore_code_hook(void *ctx, const nc_ub_coded *c, char *err, size_t errlen);

/* An add record's fixed part as nsstore_add_hook and nsstore_code_hook
 * write it and replay and the log follower read it: byte 0 the type, 1
 * flags, then u32 n, u32 dim (H, or a code's bytes), u32 doc, i64 first
 * id, u64 offset, u32 strings (nd), and the nd open-vocabulary strings. */
typedef struct {
    uint32_t want;                /* in: the dim expected (H, or the code size) */
    uint32_t n, dim, doc, nd;
    int64_t first;
    uint64_t off;
} nsstore_rec_head;
/* The fixed part's fields of p (at least REC_HEAD bytes) into h, unchecked
 * (h->want untouched) */
void nsstore_rec_head_fields(const unsigned char *p, nsstore_rec_head *h);
/* The fixed part of p (len bytes) into h; NC_EFORMAT naming record seq if
 * short. Checks dim against h->want and nd <= n. */
int nsstore_rec_head_read(const unsigned char *p, size_t len, uint64_t seq, nsstore_rec_head *h, char *err,
                          size_t errlen);
/* The per-pair bytes after the word references: 2H (f16 keys) or 4 + code
 * size (a u32 list and a code). */
size_t nsstore_rec_pair_bytes(const nc_nsstore *ns);

/* snapshot.c */
/* The seqs of the snapshots under dir (snap-<16 hex>), newest first;
 * cleanup_tmp removes interrupted ones (snap-<seq>.tmp). */
int nsstore_snapshot_list(const char *dir, uint64_t **out, int *n, bool cleanup_tmp);
/* dir/snap-<seq><suffix> */
void nsstore_snapshot_path(const nc_nsstore *ns, uint64_t seq, const char *suffix, char *buf, size_t len);
/* Loads snapshot seq into ns (fresh word table and cache). */
int nsstore_snapshot_load(nc_nsstore *ns, uint64_t seq, char *err, size_t errlen);
/* snap_lock held: writes a snapshot when the namespace's own index trained
 * since the newest one, even with nothing logged since (nsstore_backup:
 * the copy then carries the trained index, not the one before it). */
int nsstore_snapshot_trained_locked(nc_nsstore *ns, char *err, size_t errlen);

#endif
