/* unbounded_cache.h -- the unbounded cache of a namespace (Grave, Cisse,
 * Joulin, NIPS 2017, §3.3): its memory, every pair (h_i, w_{i+1}) ever
 * streamed into it, in a FAISS index (C API) with the word ids in an array
 * indexed by FAISS id: the index store. Its term, the kernel density
 * estimate over the k nearest neighbours (eq. 5-6), is the component row of
 * unbounded_term.h. Design §4-§5.
 *
 * Index life: an exact IndexFlatL2 serves while the memory holds fewer than
 * switch_at pairs, or for ever when no trained index is available (no
 * trained_path, train_self false) or exact is set. At switch_at the trained
 * index (e.g. "IVF4096,PQ32" read from the model's unbounded.faiss) receives
 * every stored vector in id order, so no entry is lost and ids are kept.
 *
 * Concurrency: searches take a read lock and run in parallel, each with its
 * own nprobe (passed to FAISS with the search, core/index/faiss_shim.h, never set
 * in the shared index); adds and the switch take the write lock. All
 * functions are thread-safe. */
#ifndef NC_UNBOUNDED_CACHE_H
#define NC_UNBOUNDED_CACHE_H

#include "nc_common.h"
#include "cache_knobs.h"
#include "wordtable.h"

typedef struct nc_unbounded_cache nc_unbounded_cache;

/* The kernel K of eq. 5, nc_kernel, is a knob's type: cache_knobs.h. */

typedef struct {
    int dim;                      /* H, required */
    const char *factory;          /* FAISS factory string for the IVF index;
                                   * NULL = "IVF4096,PQ{dim/16}np" */
    const char *trained_path;     /* trained empty index (unbounded.faiss) or NULL */
    bool train_self;              /* no trained file: train the factory index
                                   * on the stored vectors at switch_at */
    bool own_training;            /* the namespace's own training (below): at
                                   * switch_at an IVFPQ index trained on a
                                   * sample of its own keys, re-trained in the
                                   * background as it grows; wins over
                                   * trained_path and train_self (the model's
                                   * index then serves compact storage only).
                                   * Not with exact or compact */
    bool train_sync;              /* the add that makes a training due runs it
                                   * (the CLI: the same numbers every run);
                                   * else its own thread does */
    int train_nice;               /* nice value of the training thread (0: the adder's) */
    double recall_target;         /* nprobe chosen at each training: the least
                                   * whose measured recall meets it; 0 = 0.9 */
    int train_delay_ms;           /* tests: a pause at each phase of a training */
    bool exact;                   /* never leave the flat index */
    long switch_at;               /* pairs at which to switch; 0 = 65536 */
    int nprobe;                   /* initial nprobe; 0 = 8 */
    int omp_threads;              /* FAISS OpenMP threads; 0 = leave as is */
    bool faiss_scan;              /* search IVFPQ with FAISS's own scan (a
                                   * heap of k + extra), not ours
                                   * (faiss_shim_ivfpq_search): benchmarks'
                                   * reference; same neighbours up to ties */
    bool key_f16;                 /* round keys to float16 precision before
                                   * storing them, so that a log holding f16
                                   * keys rebuilds exactly the same index */
    bool compact;                 /* compact storage: the trained IVFPQ index
                                   * (trained_path required, not exact) from
                                   * the first pair, no flat phase, and the
                                   * code hook (not the add hook) logs each
                                   * pair as its list and PQ code */
} nc_unbounded_cache_opts;

void unbounded_cache_opts_default(nc_unbounded_cache_opts *o, int dim);

/* words: the namespace's word table; the cache borrows it (it must outlive
 * the cache) and saves/loads it with the index. NULL = closed vocabulary. */
int unbounded_cache_new(const nc_unbounded_cache_opts *o, nc_wordtable *words, nc_unbounded_cache **out,
                char *err, size_t errlen);
void unbounded_cache_free(nc_unbounded_cache *u);            /* NULL allowed */

/* Adds n pairs (keys[n, dim], word ids) with consecutive FAISS ids; if
 * first_id is non-NULL it receives the id of the first one. May trigger the
 * switch to the IVF index. */
int unbounded_cache_add(nc_unbounded_cache *u, const float *keys, const int *words, size_t n,
                int64_t *first_id, char *err, size_t errlen);

/* Who reads a search's word ids (design §4). A namespace stores every word
 * by its own id -- out-of-vocabulary words under dynamic ids >= V, whoever
 * wrote them -- so that open- and closed-vocabulary sessions can share it:
 * an open-vocabulary reader (NC_UB_OPEN) gets the ids as stored; a
 * closed-vocabulary reader passes the model's unk_token id and gets every
 * stored id outside the model vocabulary [0, V) as that id, which is how it
 * sees its own out-of-vocabulary tokens. A cache without a word table holds
 * model ids only (its writers are closed-vocabulary), so nothing maps. */
#define NC_UB_OPEN (-1)

/* k-NN search of nq queries [nq, dim]: out_d2[nq, k] squared L2 distances
 * ascending, out_words[nq, k] word ids as reader sees them (NC_UB_OPEN or a
 * closed reader's unk id, above; -1 = no neighbour; -1 ids that FAISS
 * returns are not neighbours). Causal filtering: if id_limit is non-NULL,
 * query q only accepts FAISS ids < id_limit[q]; the search then asks FAISS for
 * k + extra neighbours and keeps the first k accepted (pass extra >= the
 * number of ids that can be rejected). nprobe: IVF lists probed by this
 * search alone; <= 0 = the cache's own (its options'). */
int unbounded_cache_search(nc_unbounded_cache *u, const float *queries, size_t nq, int k, int nprobe,
                   const int64_t *id_limit, int extra, int reader, float *out_d2, int *out_words,
                   char *err, size_t errlen);

/* As unbounded_cache_search, also giving the FAISS id of each neighbour in
 * out_ids[nq, k] (-1 = none): the key to the pair's provenance. */
int unbounded_cache_search_ids(nc_unbounded_cache *u, const float *queries, size_t nq, int k, int nprobe,
                       const int64_t *id_limit, int extra, int reader, float *out_d2, int *out_words,
                       int64_t *out_ids, char *err, size_t errlen);
/* The coarse search of a block's keys (the nprobe lists each probes), made
 * by unbounded_cache_add_block before it adds them and reused by the search
 * of the same vectors (unbounded_cache_query): the coarse quantizer once a
 * token instead of twice (a third of the cache's time at 1M states, before).
 * Zero-initialise; ub_coarse_free frees its buffers. */
typedef struct {
    float *d;                     /* [n, stride] squared distances to the lists */
    int64_t *l;                   /* [n, stride] the lists */
    size_t n, cap;                /* rows filled, entries allocated */
    int np;                       /* the nprobe searched for (the cache's when <= 0 was asked) */
    int stride;                   /* lists a row: np, at most the index's nlist */
    const float *x;               /* the vectors it was made for */
    uint64_t gen;                 /* the cache's index it was made on */
} nc_ub_coarse;
void ub_coarse_free(nc_ub_coarse *c);
/* The coarse search of the n vectors x for nprobe (<= 0: the cache's) into
 * c, under the read lock, as unbounded_cache_add_block makes it (c->n = 0
 * when the index is flat, or on failure): a stream's predict makes it for
 * its h, and the next feed's add of that h as a key reuses it (stream.c). */
void unbounded_cache_coarse(nc_unbounded_cache *u, const float *x, size_t n, int nprobe, nc_ub_coarse *c);
/* dst = src with dst->x = x (the same vectors' values at another address);
 * NC_ENOMEM leaves dst empty (n = 0). */
int ub_coarse_copy(nc_ub_coarse *dst, const nc_ub_coarse *src, const float *x);

/* An add of n pairs (as unbounded_cache_add); with coarse non-NULL the
 * keys' coarse search for a search with this nprobe is made first (an IVF
 * index only; coarse->n = 0 otherwise) and also places the keys; with
 * coarse_made, coarse already holds it (unbounded_cache_coarse of the same
 * values, coarse->x = keys) and is not made again. */
typedef struct {
    const float *keys;
    const int *words;
    size_t n;
    int nprobe;
    nc_ub_coarse *coarse;
    bool coarse_made;
} nc_ub_add;
int unbounded_cache_add_block(nc_unbounded_cache *u, const nc_ub_add *a, int64_t *first_id, char *err,
                              size_t errlen);

/* A search (unbounded_cache_search_ids's arguments) with, in coarse, the
 * coarse search of these very queries made by unbounded_cache_add_block
 * (used when it matches: same vectors, nprobe and index) or NULL. */
typedef struct {
    const float *queries;
    size_t nq;
    int k, nprobe;
    const int64_t *id_limit;
    int extra, reader;
    const nc_ub_coarse *coarse;
    float *out_d2;
    int *out_words;
    int64_t *out_ids;             /* or NULL */
    int64_t *out_count;           /* or NULL: the pairs the index held (the answer's version, */
    uint64_t *out_gen;            /* with the index's generation; unbounded_cache_version) */
} nc_ub_query;
int unbounded_cache_query(nc_unbounded_cache *u, const nc_ub_query *q, char *err, size_t errlen);

/* Word id of the pair with FAISS id as stored (surface word, for
 * provenance), -1 if out of range. */
int unbounded_cache_word_at(nc_unbounded_cache *u, int64_t id);

/* Called by unbounded_cache_add under the cache's write lock, before the pairs enter
 * the index, with the keys as they will be stored (rounded when key_f16)
 * and the id of the first pair: a durable store logs the pairs here, so the
 * log's order is the id order. A nonzero return fails the add (nothing is
 * stored). NULL fn removes the hook. */
typedef int (*unbounded_cache_add_hook)(void *ctx, const float *keys, const int *words, size_t n,
                                int64_t first_id, char *err, size_t errlen);
void unbounded_cache_set_add_hook(nc_unbounded_cache *u, unbounded_cache_add_hook fn, void *ctx);

/* Compact storage (opts.compact): a pair as the index stores it -- its
 * inverted list and PQ code -- with its word, for a log that rebuilds the
 * very same lists without the keys (docs/namespaces.md). */
typedef struct {
    const int64_t *lists;         /* [n] */
    const uint8_t *codes;         /* [n, code_size] */
    size_t code_size;
    const int *words;             /* [n] */
    size_t n;
    int64_t first_id;             /* the id of the first (ids are consecutive) */
} nc_ub_coded;
/* Called by a compact cache's adds under its write lock, before the pairs
 * enter the index, as the add hook in a cache that keeps keys; a nonzero
 * return fails the add. NULL fn removes the hook. */
typedef int (*unbounded_cache_code_hook)(void *ctx, const nc_ub_coded *c, char *err, size_t errlen);
void unbounded_cache_set_code_hook(nc_unbounded_cache *u, unbounded_cache_code_hook fn, void *ctx);
/* Adds pairs given by their lists and codes (a compact store's replay, a
 * replica of a compact namespace) to a compact cache, through the code
 * hook. c->first_id must be the count stored (the next id), or < 0 for
 * whatever it is. NC_EINVAL for
 * a cache that is not compact, NC_EFORMAT for a code size, list or id that
 * does not fit: nothing added. */
int unbounded_cache_add_codes(nc_unbounded_cache *u, const nc_ub_coded *c, char *err, size_t errlen);
/* A compact cache's code size and lists (0 when not compact). */
size_t unbounded_cache_code_size(nc_unbounded_cache *u, int64_t *nlist);
bool unbounded_cache_is_compact(const nc_unbounded_cache *u);
/* The training fingerprint of the IVFPQ index the cache reads or will
 * switch to (pq_tables_fingerprint), 0 when none: two caches of the same
 * fingerprint give a key the same list and code. */
uint64_t unbounded_cache_fingerprint(nc_unbounded_cache *u);

/* Called by every search under the cache's read lock, just before FAISS
 * searches, with the nprobe that search uses (the cache's own when it is
 * flat: 0). For tests that hold one search inside while another runs.
 * NULL fn removes the hook. */
typedef void (*unbounded_cache_search_hook)(void *ctx, int nprobe);
void unbounded_cache_set_search_hook(nc_unbounded_cache *u, unbounded_cache_search_hook fn, void *ctx);

/* Queries our own IVFPQ scan answered and the codes it scanned, since the
 * cache was made (benchmarks: codes per query). */
void unbounded_cache_scan_stats(nc_unbounded_cache *u, uint64_t *queries, uint64_t *codes);
/* The coarse searches made by the pruned exact search (faiss_shim_cq_search)
 * and the exact centroid distances they computed (nlist a query unpruned);
 * 0, 0 while the index is flat or FAISS's quantizer searches. */
void unbounded_cache_coarse_stats(nc_unbounded_cache *u, uint64_t *queries, uint64_t *exact);

int64_t unbounded_cache_count(nc_unbounded_cache *u);        /* pairs stored */
/* The pairs stored and the generation of the index (+1 each time it is
 * replaced): a search's answer holds while both are as it saw them
 * (nc_ub_query.out_count / out_gen), the memory only growing by adds. */
void unbounded_cache_version(nc_unbounded_cache *u, int64_t *count, uint64_t *gen);
bool unbounded_cache_is_exact(nc_unbounded_cache *u);        /* still on the flat index */
int unbounded_cache_dim(const nc_unbounded_cache *u);
nc_wordtable *unbounded_cache_words(nc_unbounded_cache *u);  /* NULL in closed vocabulary */
size_t unbounded_cache_memory(nc_unbounded_cache *u);        /* bytes, approximate */
/* Forces the switch now (tests, build tools); no-op when already switched.
 * With train_self: trains the cache's own index on every pair stored, in
 * the calling thread, as a due training would. */
int unbounded_cache_switch(nc_unbounded_cache *u, char *err, size_t errlen);

/* ---- the namespace's own training (own_training; docs/caches.md) ----------
 * Trainings are due at T_j = switch_at * 4^j pairs (j = 0, 1, ...): each
 * trains a new IVF{nlist},PQ{M} index on a sample of the keys of ids < T_j
 * (nlist the power of two <= 4 sqrt(T_j); the sample 40 keys a list, at
 * regular id steps), measures recall against exact search on held-out
 * keys to choose nprobe, encodes every key of the stored f16 copy into it
 * off-lock, catches up the pairs added meanwhile, and swaps it in under
 * the write lock. The result depends on the keys of ids < T_j only, never
 * on timing: a replica fed the same pairs, or a restart, ends with the same
 * index. A due training that finds a later T_j due trains that one. */
typedef enum {
    NC_UB_TRAIN_IDLE = 0, NC_UB_TRAIN_SAMPLING, NC_UB_TRAIN_KMEANS, NC_UB_TRAIN_ENCODING,
    NC_UB_TRAIN_MEASURING, NC_UB_TRAIN_CATCHUP, NC_UB_TRAIN_SWAP
} nc_ub_train_phase;
const char *unbounded_cache_phase_name(nc_ub_train_phase p);

typedef struct {
    bool own;                     /* own_training on */
    bool keys;                    /* every pair's key is kept (false: loaded from a
                                   * snapshot of an earlier build, after its switch) */
    int64_t nlist;                /* lists of the index searched; 0 while exact */
    size_t code_bytes;            /* bytes of its PQ codes; 0 while exact */
    int code_bits;                /* bits a sub-quantizer (4 or 8); 0 while exact */
    double imbalance;             /* its lists' nlist Σ n_i² / N² (1 = balanced) */
    int nprobe;                   /* the cache's own nprobe (chosen at the last training) */
    double recall;                /* measured then at that nprobe; -1 = never */
    double recall_target;
    uint64_t trainings;           /* completed since the namespace was made */
    int64_t trained_on;           /* T_j of the index searched (0: none of its own) */
    int64_t next_at;              /* pairs at which the next training is due (0: none) */
    nc_ub_train_phase phase;      /* of the training in progress (IDLE: none) */
    int64_t target;               /* its T_j */
    double progress;              /* its share done, 0..1 */
    double last_seconds;          /* duration of the last completed training */
    uint64_t failures;            /* trainings that failed (out of memory...) */
    int64_t held_bytes;           /* the training in progress's buffers (in unbounded_cache_memory) */
} nc_ub_train_stats;
void unbounded_cache_train_stats(nc_unbounded_cache *u, nc_ub_train_stats *st);
/* The IVF index's imbalance factor over the ids < limit (0 while exact):
 * what the drift measure reads (unbounded_cache.c, drift_due). */
double unbounded_cache_imbalance_below(nc_unbounded_cache *u, int64_t limit);
/* The recall the last own training measured its nprobe by (its held-out
 * keys of ids < T_j, the exact nearest UB_RECALL_TOP found among the k a
 * search returns), on the index searched now, at nprobe (<= 0: the
 * cache's): what a training chooses nprobe by, for tests and benchmarks.
 * Not meant beside a training (it reads the training's progress counters
 * and index). NC_ESTATE without an own training and its keys. */
int unbounded_cache_recall_at(nc_unbounded_cache *u, int nprobe, double *recall, char *err, size_t errlen);
/* Starts the training due, if any (after a recovery that replayed no add:
 * adds otherwise start it). */
int unbounded_cache_train_kick(nc_unbounded_cache *u, char *err, size_t errlen);
/* Waits until no training is running (tests, the CLI before it reports). */
void unbounded_cache_train_wait(nc_unbounded_cache *u);

/* The f16 keys kept for training, beside a snapshot (store/snapshot.c):
 * keys_sync appends to path the keys of the pairs not yet in it (path's
 * length says how many are) and fsyncs it; *count receives the pairs it
 * then holds. keys_read reads the first n pairs' keys from path into a
 * cache just loaded (unbounded_cache_load, n = its count) and cuts the file
 * to them; NC_ENOTFOUND (cache unchanged) when the file holds fewer. */
int unbounded_cache_keys_sync(nc_unbounded_cache *u, const char *path, int64_t *count, char *err, size_t errlen);
int unbounded_cache_keys_read(nc_unbounded_cache *u, const char *path, int64_t n, char *err, size_t errlen);

/* Snapshot into dir (created if needed): index.faiss (faiss_write_index),
 * values.bin (magic, count, int32 ids, crc32), words.txt (dynamic words),
 * train.txt (the own training's state: T_j, nprobe, recall, count; read
 * back when present, a snapshot of an earlier build has none).
 * Written to temp names and renamed, so a crash leaves the old snapshot.
 * unbounded_cache_load reads such a directory into a fresh cache with options o
 * (the loaded index type wins over o's factory); a corrupt or inconsistent
 * snapshot is NC_EFORMAT with the reason. */
int unbounded_cache_save(nc_unbounded_cache *u, const char *dir, char *err, size_t errlen);
int unbounded_cache_load(const nc_unbounded_cache_opts *o, nc_wordtable *words, const char *dir,
                 nc_unbounded_cache **out, char *err, size_t errlen);

/* Sets FAISS's OpenMP thread count for the process (omp_set_num_threads). */
void unbounded_cache_set_threads(int n);

#endif
