/* unbounded_cache.c -- the unbounded cache's index store: FAISS index (C
 * API) + word-id values, exact flat index first, switch to IVF(PQ) without
 * losing entries, the namespace's own training, snapshots. Its term, the
 * component row, is unbounded_term.c. */
#include "unbounded_cache.h"
#include "faiss_shim.h"
#include "fault.h"
#include "pq_tables.h"
#include "scratch.h"
#include "vmath.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <cblas.h>
#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/clone_index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/index_io_c.h>

/* libgomp's entry point; declared here so that compilers without omp.h work */
extern void omp_set_num_threads(int n);
extern int omp_get_max_threads(void);

#define UB_VALUES_MAGIC "NCUBVAL1"

/* The own training's state (unbounded_cache.h), under the cache's lock but
 * for what the training thread publishes as atomics */
typedef struct {
    pthread_t th;
    bool joinable;                /* th to join before the next one starts */
    bool running;                 /* a training is under way (write lock) */
    volatile int stop;            /* unbounded_cache_free: stop at the next step */
    _Atomic int phase;            /* nc_ub_train_phase */
    _Atomic int64_t done, total;  /* progress of the phase in progress */
    int64_t target;               /* T_j of the training under way */
    int64_t trained_on;           /* T_j of the index searched, 0 = none of its own */
    int64_t checked;              /* the last drift checkpoint found without drift (drift_due) */
    uint64_t trainings, failures;
    double recall, last_secs;
    /* bytes the training in progress holds (its sample, FAISS's working
     * copy, the new index until the swap, the recall measure's buffers):
     * counted in unbounded_cache_memory, so the namespace gauge holds them */
    _Atomic int64_t held;
} ub_trainer;

struct nc_unbounded_cache {
    pthread_rwlock_t lock;
    nc_unbounded_cache_opts o;
    char factory[128];
    char trained_path[1024];
    FaissIndex *idx;              /* IndexFlatL2 while flat, else the IVF index */
    faiss_shim_cq *cq;            /* idx's pruned exact coarse search, or NULL (FAISS's) */
    bool flat;
    FaissIndex *tmpl;             /* trained empty index waiting for the switch */
    bool switching;               /* an add is filling the IVF index (unlocked) */
    int *values;                  /* [nvalues] word id of FAISS id i */
    size_t nvalues, cap;
    nc_wordtable *words;
    int nprobe;                   /* current nprobe of the IVF index */
    unbounded_cache_add_hook hook;        /* durable store's logger, or NULL */
    void *hook_ctx;
    _Atomic uint64_t ndis;        /* codes scanned by our own IVFPQ scan */
    _Atomic uint64_t nsearched;   /* queries it answered */
    unbounded_cache_search_hook shook;    /* tests: inside a search */
    void *shook_ctx;
    float *kbuf;                  /* rounded keys scratch (key_f16) */
    size_t kbuf_n;
    uint64_t gen;                 /* +1 each time idx is replaced (nc_ub_coarse) */
    uint64_t table_key;           /* idx reads this shared table (pq_tables.h), 0 = its own */
    unbounded_cache_code_hook chook;      /* compact store's logger, or NULL */
    void *chook_ctx;
    int64_t *lbuf;                /* compact adds: lists [lbuf_n] and codes scratch */
    uint8_t *cbuf;
    size_t lbuf_n;
    /* the own training (own_training): every pair's key as f16, in chunks of
     * UB_KCHUNK pairs that never move once allocated, so that a training
     * reads the keys of ids < count without the lock */
    uint16_t **kch;
    size_t nkch, kch_cap;
    bool keys_ok;                 /* kch holds every pair's key from id 0 */
    int64_t kfile_n;              /* pairs whose keys the keys file holds (keys_sync) */
    ub_trainer tr;
};

#define UB_KCHUNK ((size_t)1 << 16)

static int faiss_err(char *err, size_t errlen, const char *what)
{
    const char *m = faiss_get_last_error();
    return nc_error(err, errlen, NC_EFORMAT, "%s: %s", what, m ? m : "FAISS error");
}

/* omp_set_num_threads sets the calling thread's value only: every thread
 * that enters FAISS (HTTP workers, snapshot thread) must set it, or FAISS's
 * parallel regions there spin a team of the default size on shared cores
 * (design §6: measured 80% of an upload's time in libgomp's barrier). */
static void omp_limit(const nc_unbounded_cache *u)
{
    if (u->o.omp_threads > 0)
        omp_set_num_threads(u->o.omp_threads);
}

void unbounded_cache_opts_default(nc_unbounded_cache_opts *o, int dim)
{
    memset(o, 0, sizeof *o);
    o->dim = dim;
    o->switch_at = 65536;
    o->nprobe = 8;
}

void unbounded_cache_set_threads(int n)
{
    if (n > 0)
        omp_set_num_threads(n);
}

static int set_nprobe(nc_unbounded_cache *u, FaissIndex *idx, int nprobe, char *err, size_t errlen)
{
    FaissParameterSpace *ps = NULL;
    if (faiss_ParameterSpace_new(&ps))
        return faiss_err(err, errlen, "parameter space");
    int rc = faiss_ParameterSpace_set_index_parameter(ps, idx, "nprobe", (double)nprobe);
    faiss_ParameterSpace_free(ps);
    if (rc)
        return faiss_err(err, errlen, "setting nprobe");
    u->nprobe = nprobe;
    return NC_OK;
}

/* FAISS's IO_FLAG_SKIP_PRECOMPUTE_TABLE (faiss/index_io.h; the C API passes
 * io_flags through): an IVFPQ index read without its precomputed distance
 * table. That table is nlist * M * 256 floats -- 134 MB for the default
 * IVF4096,PQ32 -- and FAISS computes it at every read: kept in the template
 * of every namespace, it was most of a daemon's memory (the soak's
 * namespaces held 138 MB each before their first pair). */
#define TEMPLATE_IO_SKIP_TABLE 16

/* Reads the trained template into *out and checks it fits. light: without
 * the precomputed table (what a cache keeps while it is exact: enough to
 * check the file at open); the switch reads the whole one (read_template's
 * caller then owns it). */
static int read_template(const nc_unbounded_cache *u, bool light, FaissIndex **out, uint64_t *key, char *err,
                         size_t errlen)
{
    *out = NULL;
    *key = 0;
    FaissIndex *t = NULL;
    /* the whole one reads the table its training shares (pq_tables.h)
     * instead of computing its own */
    if (faiss_read_index_fname(u->trained_path, TEMPLATE_IO_SKIP_TABLE, &t))
        return faiss_err(err, errlen, u->trained_path);
    int rc = NC_OK;
    if (faiss_Index_d(t) != u->o.dim)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: index dimension %d, model hidden size %d",
                      u->trained_path, faiss_Index_d(t), u->o.dim);
    else if (!faiss_Index_is_trained(t))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: index is not trained", u->trained_path);
    else if (faiss_Index_ntotal(t) != 0)
        faiss_Index_reset(t);   /* a template holds no data: ids must start at 0 */
    if (!rc && !light)
        rc = pq_tables_attach(t, key, err, errlen);
    if (rc) {
        faiss_Index_free(t);
        return rc;
    }
    *out = t;
    return NC_OK;
}

/* Reads the light template (if any) for a later switch. */
static int load_template(nc_unbounded_cache *u, char *err, size_t errlen)
{
    uint64_t none;
    if (!u->trained_path[0])
        return NC_OK;
    return read_template(u, true, &u->tmpl, &none, err, errlen);
}

/* A compact cache's index from its first pair: the whole trained template
 * (its precomputed table shared), in place of the flat one. Without keys
 * nothing could train an index, nor move pairs into one, later. */
static int compact_index(nc_unbounded_cache *u, char *err, size_t errlen)
{
    if (u->o.exact)
        return nc_error(err, errlen, NC_EINVAL, "compact storage keeps no keys: an exact (flat) index needs them");
    if (!u->trained_path[0])
        return nc_error(err, errlen, NC_EINVAL, "compact storage needs a trained index (the model's unbounded.faiss): "
                        "it keeps no keys to train one on");
    FaissIndex *ivf = NULL;
    uint64_t key = 0;
    int rc = read_template(u, false, &ivf, &key, err, errlen);
    if (!rc && faiss_shim_code_size(ivf, NULL) == 0)
        rc = nc_error(err, errlen, NC_EINVAL, "%s: compact storage needs an IVFPQ index with a flat quantizer",
                      u->trained_path);
    if (!rc)
        rc = set_nprobe(u, ivf, u->nprobe, err, errlen);
    if (rc) {
        if (ivf) {
            pq_tables_detach(ivf, key);
            faiss_Index_free(ivf);
        }
        return rc;
    }
    faiss_Index_free(u->idx);
    u->idx = ivf;
    u->table_key = key;
    u->flat = false;
    u->cq = faiss_shim_cq_new(u->idx, 0);   /* its coarse search (NULL: FAISS's) */
    return NC_OK;
}

/* The code of an index the cache trains itself when no index_factory
 * names one: dim / 4 sub-quantizers of 4 bits, 32 bytes at H = 256
 * (PQ64x4), where the scan's look-ups are register permutes over a 4 KB
 * table (faiss_shim.cpp, list_dists4) instead of loads from a 16-32 KB
 * one (8 bits). Measured on the growth curve (BENCHMARKS.md) against the
 * 8-bit PQ16 of 16 bytes and the 4-bit PQ32x4 of 16 bytes: the same lists
 * and recall (the recall nprobe is chosen by is set by the lists probed,
 * scripts/oracle_fastscan.sh), less CPU a token than PQ16 at 1M and
 * 1.7M pairs, and perplexity within the fixed index's +0.5% where PQ32x4
 * read +0.87% (WikiText-2 at 1M). FAISS's PQ splits dim evenly and the
 * 4-bit packing wants pairs: the largest even M <= dim / 4 dividing dim,
 * else (no such M) 8-bit dim / 16. The model's own unbounded.faiss,
 * built by build-index, keeps the paper's dim / 8 bytes of 8 bits. */
static void ub_default_code(int dim, int *m_out, int *nbits_out)
{
    for (int m = dim / 4; m >= 2; m--)
        if (m % 2 == 0 && dim % m == 0) {
            *m_out = m, *nbits_out = 4;
            return;
        }
    int m = dim / 16 > 0 ? dim / 16 : 1;
    while (dim % m != 0)
        m--;
    *m_out = m, *nbits_out = 8;
}

static int cache_create(const nc_unbounded_cache_opts *o, nc_wordtable *words, nc_unbounded_cache **out,
                        char *err, size_t errlen)
{
    *out = NULL;
    if (o->dim <= 0)
        return nc_error(err, errlen, NC_EINVAL, "unbounded cache dimension %d", o->dim);
    nc_unbounded_cache *u = nc_zalloc(1, sizeof *u);
    if (!u)
        return nc_error(err, errlen, NC_ENOMEM, "unbounded cache");
    u->o = *o;
    if (u->o.switch_at <= 0)
        u->o.switch_at = 65536;
    if (u->o.nprobe <= 0)
        u->o.nprobe = 8;
    if (o->factory && o->factory[0])
        snprintf(u->factory, sizeof u->factory, "%s", o->factory);
    else {
        /* "np": no polysemous training -- the same IVFPQ index, but FAISS's
         * factory otherwise spends minutes on a Hamming reordering of the PQ
         * codes that only polysemous search (never used here) reads */
        int m, nbits;
        ub_default_code(o->dim, &m, &nbits);
        snprintf(u->factory, sizeof u->factory, "IVF4096,PQ%d%snp", m, nbits == 4 ? "x4" : "");
    }
    if (o->trained_path)
        snprintf(u->trained_path, sizeof u->trained_path, "%s", o->trained_path);
    u->o.factory = u->factory;
    u->o.trained_path = u->trained_path[0] ? u->trained_path : NULL;
    u->words = words;
    u->nprobe = u->o.nprobe;
    if (u->o.recall_target <= 0.0 || u->o.recall_target > 1.0)
        u->o.recall_target = 0.9;
    u->o.own_training = o->own_training && !o->exact && !o->compact;
    u->keys_ok = u->o.own_training;
    u->tr.recall = -1.0;
    pthread_rwlock_init(&u->lock, NULL);
    if (o->omp_threads > 0)
        unbounded_cache_set_threads(o->omp_threads);
    *out = u;
    return NC_OK;
}

int unbounded_cache_new(const nc_unbounded_cache_opts *o, nc_wordtable *words, nc_unbounded_cache **out, char *err,
                size_t errlen)
{
    NC_ASSERT(o && out && o->dim > 0, "unbounded_cache_new: options and out required, dim %d", o ? o->dim : 0);
    nc_unbounded_cache *u;
    int rc = cache_create(o, words, &u, err, errlen);
    if (rc)
        return rc;
    FaissIndexFlatL2 *f = NULL;
    if (faiss_IndexFlatL2_new_with(&f, o->dim)) {
        rc = faiss_err(err, errlen, "flat index");
        unbounded_cache_free(u);
        return rc;
    }
    u->idx = (FaissIndex *)f;
    u->flat = true;
    if (u->o.compact)
        rc = compact_index(u, err, errlen);
    else if (!u->o.exact)
        rc = load_template(u, err, errlen);
    if (rc) {
        unbounded_cache_free(u);
        return rc;
    }
    *out = u;
    return NC_OK;
}

static void train_stop_join(nc_unbounded_cache *u);
static void keys_free(nc_unbounded_cache *u);

void unbounded_cache_free(nc_unbounded_cache *u)
{
    if (!u)
        return;
    train_stop_join(u);
    keys_free(u);
    faiss_shim_cq_free(u->cq);
    if (u->idx) {
        pq_tables_detach(u->idx, u->table_key);
        faiss_Index_free(u->idx);
    }
    if (u->tmpl)
        faiss_Index_free(u->tmpl);
    free(u->values);
    free(u->kbuf);
    free(u->lbuf);
    free(u->cbuf);
    pthread_rwlock_destroy(&u->lock);
    free(u);
}

/* The switch from the exact index to IVF(PQ) moves every stored vector, in
 * id order, into the IVF index, so that FAISS ids (sequential from 0) and
 * values stay aligned. Filling the IVF index (coarse assignment and PQ
 * encoding of every vector: seconds at 65k pairs) happens without the lock,
 * from a copy, while searches and adds go on in the exact index; only the
 * copy and the pairs added meanwhile are done under the write lock. */
typedef struct {
    FaissIndex *ivf;
    faiss_shim_cq *cq;            /* ivf's coarse search (NULL: FAISS's) */
    float *xb;                    /* copy of the first n stored vectors */
    idx_t n;
    bool light;                   /* ivf is the light template: read the whole one */
    uint64_t key;                 /* the shared table ivf reads (pq_tables.h) */
} ub_switch_job;

/* Under the write lock: takes the template (or trains one) and copies the
 * vectors. *started false: nothing to switch to, stay exact. */
static int switch_begin(nc_unbounded_cache *u, ub_switch_job *job, bool *started, char *err, size_t errlen)
{
    *started = false;
    if (!u->flat || u->o.exact || u->switching)
        return NC_OK;
    float *xb = NULL;
    size_t xsize = 0;
    faiss_IndexFlat_xb((FaissIndexFlat *)u->idx, &xb, &xsize);
    idx_t n = faiss_Index_ntotal(u->idx);
    FaissIndex *ivf = NULL;
    if (u->tmpl) {
        ivf = u->tmpl;
        u->tmpl = NULL;
        job->light = u->trained_path[0] != 0;
    } else if (u->o.train_self) {
        if (faiss_index_factory(&ivf, u->o.dim, u->factory, METRIC_L2))
            return faiss_err(err, errlen, u->factory);
        if (faiss_Index_train(ivf, n, xb)) {
            int rc = faiss_err(err, errlen, "training the unbounded index");
            faiss_Index_free(ivf);
            return rc;
        }
    } else {
        return NC_OK;
    }
    size_t bytes = (size_t)n * (size_t)u->o.dim * sizeof(float);
    job->xb = nc_malloc(bytes ? bytes : 1);
    if (!job->xb) {
        u->tmpl = ivf;   /* kept for the next attempt */
        return nc_error(err, errlen, NC_ENOMEM, "switching the unbounded cache to IVF: %zu bytes", bytes);
    }
    memcpy(job->xb, xb, bytes);
    job->ivf = ivf;
    job->n = n;
    u->switching = true;
    *started = true;
    return NC_OK;
}

/* faiss_shim's add of n keys, with the hint's coarse search (of hint->x,
 * the keys before rounding) where given and the index's searcher cq (its
 * PQ encoder: every add to one index encodes the same way, the switch's
 * fill included) */
static faiss_shim_add_in add_in(size_t n, const float *keys, const nc_ub_coarse *hint, const faiss_shim_cq *cq)
{
    faiss_shim_add_in a = {.n = (int64_t)n, .keys = keys, .cq = cq};
    if (hint) {
        a.hint_x = hint->x;
        a.hint_d = hint->d;
        a.hint_l = hint->l;
        a.hint_np = hint->stride;
    }
    return a;
}

/* a's keys into idx: an IVFPQ index places each in the list of its exact
 * nearest centroid (faiss_shim_add: the same list whoever adds it, in
 * whatever batch), from the hint's coarse search where it holds it; any
 * other index adds as FAISS does. */
static int index_add(FaissIndex *idx, const faiss_shim_add_in *a, char *err, size_t errlen)
{
    char ferr[256];
    int how = faiss_shim_add(idx, a, ferr, sizeof ferr);
    if (how < 0)
        return nc_error(err, errlen, NC_EFORMAT, "adding to the unbounded index: %s", ferr);
    if (how == 1 && faiss_Index_add(idx, (idx_t)a->n, a->keys))
        return faiss_err(err, errlen, "adding to the unbounded index");
    return NC_OK;
}

/* Without the lock: fills the IVF index from the copy. */
static int switch_fill(const nc_unbounded_cache *u, ub_switch_job *job, char *err, size_t errlen)
{
    const idx_t chunk = 65536;
    if (job->light) {
        /* the searches of the IVF index want the precomputed table */
        FaissIndex *whole = NULL;
        int rc = read_template(u, false, &whole, &job->key, err, errlen);
        if (rc)
            return rc;
        faiss_Index_free(job->ivf);
        job->ivf = whole;
        job->light = false;
    }
    /* the centroids' principal axes (tens of ms at IVF4096), without the
     * lock, before the fill: it encodes with them */
    job->cq = faiss_shim_cq_new(job->ivf, 0);
    for (idx_t i = 0; i < job->n; i += chunk) {
        idx_t m = job->n - i < chunk ? job->n - i : chunk;
        faiss_shim_add_in a = add_in((size_t)m, job->xb + (size_t)i * u->o.dim, NULL, job->cq);
        int rc = index_add(job->ivf, &a, err, errlen);
        if (rc)
            return rc;
    }
    return NC_OK;
}

/* Under the write lock: adds what came meanwhile and swaps the indexes; after
 * a failure the cache stays exact and the half-filled IVF index is dropped. */
static int switch_finish(nc_unbounded_cache *u, ub_switch_job *job, int rc, char *err, size_t errlen)
{
    free(job->xb);
    job->xb = NULL;
    u->switching = false;
    if (!rc) {
        float *xb = NULL;
        size_t xsize = 0;
        faiss_IndexFlat_xb((FaissIndexFlat *)u->idx, &xb, &xsize);
        idx_t n = faiss_Index_ntotal(u->idx);
        faiss_shim_add_in a = add_in((size_t)(n - job->n), xb + (size_t)job->n * u->o.dim, NULL, job->cq);
        if (n > job->n)
            rc = index_add(job->ivf, &a, err, errlen);
    }
    if (!rc)
        rc = set_nprobe(u, job->ivf, u->nprobe, err, errlen);
    if (rc) {
        faiss_shim_cq_free(job->cq);
        pq_tables_detach(job->ivf, job->key);
        faiss_Index_free(job->ivf);
        job->ivf = NULL;
        job->cq = NULL;
        return rc;
    }
    faiss_shim_cq_free(u->cq);
    u->cq = job->cq;
    job->cq = NULL;
    faiss_Index_free(u->idx);   /* the flat index: no shared table */
    u->idx = job->ivf;
    u->table_key = job->key;
    u->flat = false;
    u->gen++;
    job->ivf = NULL;
    return NC_OK;
}

/* Called with the write lock held; returns with it released. */
static int switch_and_unlock(nc_unbounded_cache *u, char *err, size_t errlen)
{
    ub_switch_job job = {0};
    bool started = false;
    int rc = switch_begin(u, &job, &started, err, errlen);
    pthread_rwlock_unlock(&u->lock);
    if (rc || !started)
        return rc;
    rc = switch_fill(u, &job, err, errlen);
    pthread_rwlock_wrlock(&u->lock);
    rc = switch_finish(u, &job, rc, err, errlen);
    pthread_rwlock_unlock(&u->lock);
    return rc;
}

static int train_one(nc_unbounded_cache *u, int64_t T, char *err, size_t errlen);

int unbounded_cache_switch(nc_unbounded_cache *u, char *err, size_t errlen)
{
    NC_ASSERT(u, "unbounded_cache_switch: no cache");
    omp_limit(u);
    if (u->o.own_training) {
        /* a training of every pair stored, in this thread, once no other runs */
        unbounded_cache_train_wait(u);
        pthread_rwlock_wrlock(&u->lock);
        int64_t T = (int64_t)u->nvalues;
        bool go = !u->tr.running && u->keys_ok && u->flat && T > 0;
        if (go)
            u->tr.running = true, u->tr.target = T;
        pthread_rwlock_unlock(&u->lock);
        int rc = go ? train_one(u, T, err, errlen) : NC_OK;
        pthread_rwlock_wrlock(&u->lock);
        if (go)
            u->tr.running = false;
        atomic_store(&u->tr.phase, NC_UB_TRAIN_IDLE);
        pthread_rwlock_unlock(&u->lock);
        return rc;
    }
    pthread_rwlock_wrlock(&u->lock);
    return switch_and_unlock(u, err, errlen);
}

/* ---- the own training (unbounded_cache.h; docs/caches.md) ------------------
 * FAISS's guidance for an IVF index (its wiki, "Guidelines to choose an
 * index"): nlist about 4-16 sqrt(N), trained on at least 39 points a
 * list, nprobe chosen by measuring recall against exact search. */

#define UB_TRAIN_PER_LIST 40      /* sample keys a list: FAISS warns below 39 */
#define UB_TRAIN_NITER 10         /* k-means iterations (FAISS's IVF default) */
#define UB_TRAIN_MIN 256          /* keys a training needs: the PQ's 256 codewords a sub-quantizer */
#define UB_TRAIN_SEED 1234        /* k-means and PQ initialisation: replicas agree */
#define UB_RECALL_QUERIES 256     /* held-out keys whose neighbours are measured */
#define UB_RECALL_TOP 32          /* exact nearest ones a search should find... */
#define UB_RECALL_K 1024          /* ...among its k (the default knn) */
#define UB_CATCHUP_LOCKED 4096    /* pairs the catch-up leaves for the write lock */
#define UB_ENCODE_BATCH 4096      /* keys an encoding step: its buffer 4 MB at H = 256 */
#define UB_EXACT_BLOCK 4096       /* keys a block of the exact search */

const char *unbounded_cache_phase_name(nc_ub_train_phase p)
{
    static const char *const n[] = {"idle", "sampling", "k-means", "encoding", "measuring", "catching up", "swapping"};
    return (unsigned)p < sizeof n / sizeof *n ? n[p] : "?";
}

static void keys_free(nc_unbounded_cache *u)
{
    for (size_t i = 0; i < u->nkch; i++)
        free(u->kch[i]);
    free(u->kch);
    u->kch = NULL;
    u->nkch = u->kch_cap = 0;
}

/* Write lock held: room for the keys of ids < n (chunks allocated). */
static int keys_reserve(nc_unbounded_cache *u, size_t n, char *err, size_t errlen)
{
    const size_t need = (n + UB_KCHUNK - 1) / UB_KCHUNK;
    if (need > u->kch_cap) {
        size_t c = u->kch_cap ? 2 * u->kch_cap : 16;
        while (c < need)
            c *= 2;
        uint16_t **k = nc_realloc(u->kch, c * sizeof *k);
        if (!k)
            return nc_error(err, errlen, NC_ENOMEM, "unbounded cache: the keys' chunk table (%zu)", c);
        u->kch = k;
        u->kch_cap = c;
    }
    while (u->nkch < need) {
        uint16_t *c = nc_malloc(UB_KCHUNK * (size_t)u->o.dim * sizeof(uint16_t));
        if (!c)
            return nc_error(err, errlen, NC_ENOMEM, "unbounded cache: keys kept for training (%zu chunks)", need);
        u->kch[u->nkch++] = c;
    }
    return NC_OK;
}

/* Write lock held: keeps the f16 keys [n, dim] of ids first.. (already
 * f16-rounded when key_f16: the conversion is then exact). */
static int keys_push(nc_unbounded_cache *u, const float *keys, size_t n, size_t first, char *err, size_t errlen)
{
    const size_t d = (size_t)u->o.dim;
    int rc = keys_reserve(u, first + n, err, errlen);
    for (size_t i = 0; !rc && i < n;) {
        size_t id = first + i, off = id % UB_KCHUNK, m = UB_KCHUNK - off;
        if (m > n - i)
            m = n - i;
        vm_float_to_half(keys + i * d, u->kch[id / UB_KCHUNK] + off * d, m * d);
        i += m;
    }
    return rc;
}

/* The keys of ids [id, id + n) into out [n, dim], every id below a count
 * seen under the lock: their chunks never move, their contents never
 * change, so only the chunk table is read under the lock (held already
 * when locked). */
static void keys_copy(nc_unbounded_cache *u, size_t id, size_t n, float *out, bool locked)
{
    const size_t d = (size_t)u->o.dim;
    for (size_t i = 0; i < n;) {
        size_t at = id + i, off = at % UB_KCHUNK, m = UB_KCHUNK - off;
        if (m > n - i)
            m = n - i;
        if (!locked)
            pthread_rwlock_rdlock(&u->lock);
        const uint16_t *c = u->kch[at / UB_KCHUNK];
        if (!locked)
            pthread_rwlock_unlock(&u->lock);
        vm_half_to_float(c + off * d, out + i * d, m * d);
        i += m;
    }
}

static void keys_get(nc_unbounded_cache *u, size_t id, size_t n, float *out)
{
    keys_copy(u, id, n, out, false);
}

/* Lock held: the training due now, T_j = switch_at 4^j the largest <= the
 * pairs stored and above the index's own; 0 when none. */
/* The first T_j: switch_at, or for a switch_at below what a PQ trains on
 * the first switch_at 4^j above it. */
static int64_t first_point(const nc_unbounded_cache *u)
{
    int64_t t = u->o.switch_at;
    while (t < UB_TRAIN_MIN)
        t *= 4;
    return t;
}

static int64_t train_due(const nc_unbounded_cache *u)
{
    if (!u->o.own_training || !u->keys_ok)
        return 0;
    int64_t n = (int64_t)u->nvalues, best = 0;
    for (int64_t t = first_point(u); t <= n; t *= 4) {
        if (t > u->tr.trained_on)
            best = t;
        if (t > INT64_MAX / 4)
            break;
    }
    return best;
}

/* ---- drift: training again between the 4x points ------------------------
 * A namespace whose new pairs are another kind of text crowds a few of its
 * lists (and its product quantizer, fitted to the old text, measures them
 * badly): War and Peace then PTB, its 262,144-pair index held 2.32 x the
 * balanced scan at 1M pairs (BENCHMARKS.md, the growth curve). At the
 * checkpoints T_j 3/2, 2 T_j and 3 T_j between two 4x points, the index's
 * imbalance over the ids below the checkpoint (faiss_shim_imbalance_below:
 * what it was when it held that many pairs, whatever came since) is
 * measured against its imbalance over the ids it was trained on, and
 * above UB_DRIFT_RATIO times that the checkpoint is trained like a 4x
 * point. There: 1.45 at 262,144 pairs, 1.44-1.45 while War and Peace
 * went on to 655,360, 1.72 at 786,432 with 184k PTB pairs, 2.11 at
 * 917,504. The decision depends on the index trained below the checkpoint
 * and the ids below it only: the same at every replica and after a
 * restart. */
#define UB_DRIFT_RATIO 1.15

static int64_t first_point(const nc_unbounded_cache *u);

/* Lock held: the least checkpoint c with after < c <= n, 0 if none. */
static int64_t drift_point(const nc_unbounded_cache *u, int64_t after, int64_t n)
{
    for (int64_t t = first_point(u); t <= n && t <= INT64_MAX / 8; t *= 4) {
        const int64_t c[3] = {t + t / 2, 2 * t, 3 * t};
        for (int i = 0; i < 3; i++)
            if (c[i] > after && c[i] <= n)
                return c[i];
    }
    return 0;
}

/* Lock held: the checkpoint waiting to be measured, 0 if none (cheap: no
 * index read) */
static int64_t drift_next(const nc_unbounded_cache *u)
{
    if (!u->o.own_training || !u->keys_ok || u->flat || u->tr.trained_on <= 0)
        return 0;
    int64_t after = u->tr.trained_on > u->tr.checked ? u->tr.trained_on : u->tr.checked;
    return drift_point(u, after, (int64_t)u->nvalues);
}

/* Write lock held: the checkpoint to train for drift, 0 when none; each
 * checkpoint measured without drift is recorded (tr.checked) and not
 * measured again while the index stays. */
static int64_t drift_due(nc_unbounded_cache *u)
{
    int64_t c = drift_next(u);
    const double base = c ? faiss_shim_imbalance_below(u->idx, u->tr.trained_on) : 0.0;
    for (; c; c = drift_next(u)) {
        if (faiss_shim_imbalance_below(u->idx, c) > UB_DRIFT_RATIO * base)
            return c;
        u->tr.checked = c;
    }
    return 0;
}

/* Lock held: the pairs at which the next training is due (0: never). */
static int64_t train_next_at(const nc_unbounded_cache *u)
{
    if (!u->o.own_training || !u->keys_ok)
        return 0;
    int64_t t = first_point(u), past = u->tr.running ? u->tr.target : u->tr.trained_on;
    while (t <= past && t <= INT64_MAX / 4)
        t *= 4;
    return t;
}

/* nlist for T pairs: the power of two <= 4 sqrt(T) (FAISS's 4-16 sqrt(N),
 * its low end: the k-means costs nlist^2 UB_TRAIN_PER_LIST d a step),
 * with UB_TRAIN_PER_LIST keys a list in the sample. */
static int64_t train_nlist(int64_t T)
{
    int64_t p = 1;
    while ((double)(2 * p) <= 4.0 * sqrt((double)T) && 2 * p * UB_TRAIN_PER_LIST <= T)
        p *= 2;
    return p;
}

/* The code: the factory's PQ<M>[x<bits>] (index_factory's, else the
 * default's, ub_default_code), else the default's. */
static void train_code(const nc_unbounded_cache *u, int *m_out, int *nbits_out)
{
    const char *pq = strstr(u->factory, "PQ");
    char *end = NULL;
    long m = pq ? strtol(pq + 2, &end, 10) : 0;
    int nbits = end && *end == 'x' ? atoi(end + 1) : 8;
    if (m <= 0 || u->o.dim % m != 0 || (nbits != 4 && nbits != 8) || (nbits == 4 && m % 2 != 0)) {
        ub_default_code(u->o.dim, m_out, nbits_out);
        return;
    }
    *m_out = (int)m, *nbits_out = nbits;
}

typedef struct {
    int64_t T, nlist, done;       /* trained on ids < T; pairs encoded so far */
    FaissIndex *ivf;
    faiss_shim_cq *cq;
    uint64_t key;                 /* its shared table (pq_tables.h) */
    int nprobe;
    double recall, t0;
    float *buf;                   /* [UB_ENCODE_BATCH, dim] keys being encoded */
    int64_t index_held;           /* of u->tr.held: the new index's bytes */
} ub_train_job;

/* The training's buffers in the namespace's memory (tr.held): + bytes when
 * it takes them, - when it frees them. */
static void train_holds(nc_unbounded_cache *u, int64_t bytes)
{
    atomic_fetch_add(&u->tr.held, bytes);
}

/* unbounded_cache_free asks the trainer to stop (an atomic flag, which
 * FAISS's k-means also reads: faiss_shim_train_ivfpq) */
static bool train_stopped(const nc_unbounded_cache *u)
{
    return __atomic_load_n(&u->tr.stop, __ATOMIC_RELAXED) != 0;
}

static void train_phase(nc_unbounded_cache *u, nc_ub_train_phase ph, int64_t total)
{
    atomic_store(&u->tr.done, 0);
    atomic_store(&u->tr.total, total);
    atomic_store(&u->tr.phase, (int)ph);
    if (u->o.train_delay_ms > 0) {
        struct timespec ts = {u->o.train_delay_ms / 1000, (long)(u->o.train_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Sampling and k-means: job->ivf trained on UB_TRAIN_PER_LIST keys a list
 * of ids < T at regular steps (id i T / S), its table attached, its
 * coarse searcher made. Memory: the sample, S dim floats (40 MB at 1,024
 * lists, H = 256), and FAISS's copy of it. */
static int train_fit(nc_unbounded_cache *u, ub_train_job *j, char *err, size_t errlen)
{
    const size_t d = (size_t)u->o.dim;
    int64_t S = j->nlist * UB_TRAIN_PER_LIST;
    if (S < UB_TRAIN_MIN)
        S = UB_TRAIN_MIN;   /* the PQ's k-means: at least as many keys as codewords */
    if (S > j->T)
        S = j->T;
    train_phase(u, NC_UB_TRAIN_SAMPLING, S);
    float *x = nc_malloc((size_t)S * d * sizeof(float));
    if (!x)
        return nc_error(err, errlen, NC_ENOMEM, "training sample (%lld keys)", (long long)S);
    /* the sample, and FAISS's working set while it trains: the residuals
     * (S dim floats) and the k-means' assignment (an id and a distance a key) */
    const int64_t sample = S * (int64_t)(d * sizeof(float)), faiss_work = sample + S * 12;
    train_holds(u, sample);
    for (int64_t i = 0; i < S; i++)
        keys_get(u, (size_t)(i * (j->T / S) + (i * (j->T % S)) / S), 1, x + (size_t)i * d);
    train_holds(u, faiss_work);
    train_phase(u, NC_UB_TRAIN_KMEANS, UB_TRAIN_NITER);
    int pq_m, pq_bits;
    train_code(u, &pq_m, &pq_bits);
    faiss_shim_train_in in = {.d = u->o.dim, .M = pq_m, .nbits = pq_bits, .niter = UB_TRAIN_NITER,
                              .seed = UB_TRAIN_SEED, .nlist = j->nlist, .n = S, .x = x, .stop = &u->tr.stop};
    char ferr[256];
    int how = faiss_shim_train_ivfpq(&in, &j->ivf, ferr, sizeof ferr);
    free(x);
    train_holds(u, -(sample + faiss_work));
    if (how != 0)
        return nc_error(err, errlen, how == -2 ? NC_ESTATE : NC_EFORMAT, "training the unbounded index: %s", ferr);
    int rc = pq_tables_attach(j->ivf, &j->key, err, errlen);
    if (!rc) {
        j->cq = faiss_shim_cq_new(j->ivf, 0);
        /* the new index, empty (its shared table counted with the tables) */
        j->index_held = (int64_t)(faiss_shim_fixed_bytes(j->ivf) - pq_tables_shared_bytes(j->ivf, j->key) +
                                  faiss_shim_cq_bytes(j->cq));
        train_holds(u, j->index_held);
    }
    return rc;
}

/* Encodes the keys of ids [job->done, upto) into job->ivf, a chunk at a
 * time, as every add encodes them (faiss_shim_add with its searcher);
 * locked: the caller holds the cache's lock. */
static int train_encode(nc_unbounded_cache *u, ub_train_job *j, int64_t upto, bool locked, char *err,
                        size_t errlen)
{
    /* a pair in the new index: its code and its id (as unbounded_cache_memory) */
    const int64_t per = (int64_t)faiss_shim_code_size(j->ivf, NULL) + 8;
    while (j->done < upto && !train_stopped(u)) {
        int64_t m = upto - j->done < UB_ENCODE_BATCH ? upto - j->done : UB_ENCODE_BATCH;
        keys_copy(u, (size_t)j->done, (size_t)m, j->buf, locked);
        faiss_shim_add_in a = add_in((size_t)m, j->buf, NULL, j->cq);
        int rc = index_add(j->ivf, &a, err, errlen);
        if (rc)
            return rc;
        train_holds(u, m * per);
        j->index_held += m * per;
        j->done += m;
        atomic_fetch_add(&u->tr.done, m);
    }
    return train_stopped(u) ? nc_error(err, errlen, NC_ESTATE, "training stopped") : NC_OK;
}

/* The exact UB_RECALL_TOP nearest keys of ids < lim[q] to each of the nq
 * queries x [nq, dim] into top [nq, R] (ids, ascending distance): blocks
 * of keys against all queries in one GEMM, ||x||^2 + ||k||^2 - 2 <x, k>
 * (rounding reorders only near-ties: a reference for a recall). */
typedef struct {
    const float *x;
    const int64_t *lim;
    size_t nq;
    float *td;                    /* [nq, R] distances of the best so far */
    int64_t *tl;                  /* [nq, R] their ids */
} ub_exact_top;

static void exact_insert(ub_exact_top *e, size_t q, float dist, int64_t id)
{
    float *d = e->td + q * UB_RECALL_TOP;
    int64_t *l = e->tl + q * UB_RECALL_TOP;
    int i = UB_RECALL_TOP - 1;
    if (!(dist < d[i]))
        return;
    for (; i > 0 && d[i - 1] > dist; i--) {
        d[i] = d[i - 1];
        l[i] = l[i - 1];
    }
    d[i] = dist;
    l[i] = id;
}

static int exact_top(nc_unbounded_cache *u, ub_exact_top *e, int64_t upto, char *err, size_t errlen)
{
    const size_t d = (size_t)u->o.dim, B = UB_EXACT_BLOCK;
    float *kb = nc_malloc(B * d * sizeof(float)), *g = nc_malloc(B * e->nq * sizeof(float));
    float *kn = nc_malloc(B * sizeof(float)), *xn = nc_malloc(e->nq * sizeof(float));
    int rc = kb && g && kn && xn ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "recall measure");
    const int64_t held = (int64_t)((B * d + B * e->nq + B + e->nq) * sizeof(float));
    train_holds(u, held);
    for (size_t q = 0; !rc && q < e->nq; q++) {
        xn[q] = cblas_sdot((int)d, e->x + q * d, 1, e->x + q * d, 1);
        for (int r = 0; r < UB_RECALL_TOP; r++)
            e->td[q * UB_RECALL_TOP + r] = INFINITY, e->tl[q * UB_RECALL_TOP + r] = -1;
    }
    for (int64_t b0 = 0; !rc && b0 < upto && !train_stopped(u); b0 += (int64_t)B) {
        size_t m = (size_t)(upto - b0) < B ? (size_t)(upto - b0) : B;
        keys_get(u, (size_t)b0, m, kb);
        for (size_t i = 0; i < m; i++)
            kn[i] = cblas_sdot((int)d, kb + i * d, 1, kb + i * d, 1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)e->nq, (int)m, (int)d, 1.0f, e->x, (int)d, kb,
                    (int)d, 0.0f, g, (int)m);
        for (size_t q = 0; q < e->nq; q++)
            for (size_t i = 0; i < m && b0 + (int64_t)i < e->lim[q]; i++)
                exact_insert(e, q, xn[q] + kn[i] - 2.0f * g[q * m + i], b0 + (int64_t)i);
        atomic_fetch_add(&u->tr.done, (int64_t)m);
    }
    free(kb), free(g), free(kn), free(xn);
    train_holds(u, -held);
    return rc;
}

/* The share of the exact UB_RECALL_TOP nearest found among the k the IVF
 * search of job->ivf returns with nprobe np. */
static int ivf_recall(const ub_train_job *j, const ub_exact_top *e, int np, double *recall, char *err, size_t errlen)
{
    const int64_t k = UB_RECALL_K < j->T ? UB_RECALL_K : j->T;
    float *d = nc_malloc(e->nq * (size_t)k * sizeof(float));
    int64_t *l = nc_malloc(e->nq * (size_t)k * sizeof(int64_t));
    int rc = d && l ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "recall measure");
    char ferr[256];
    faiss_shim_scan sc = {.n = (int64_t)e->nq, .x = e->x, .k = k, .nprobe = np, .id_limit = e->lim, .cq = j->cq,
                          .d = d, .l = l};
    int how = rc ? 0 : faiss_shim_ivfpq_search(j->ivf, &sc, ferr, sizeof ferr);
    if (!rc && how == 1)   /* not our scan's kind: FAISS's, ids >= lim dropped below */
        how = faiss_shim_search(j->ivf, (int64_t)e->nq, e->x, k, np, d, l, ferr, sizeof ferr);
    if (!rc && how != 0)
        rc = nc_error(err, errlen, NC_EFORMAT, "recall measure: %s", ferr);
    size_t hit = 0, all = 0;
    for (size_t q = 0; !rc && q < e->nq; q++)
        for (int r = 0; r < UB_RECALL_TOP; r++) {
            int64_t want = e->tl[q * UB_RECALL_TOP + r];
            if (want < 0)
                continue;
            all++;
            for (int64_t i = 0; i < k; i++)
                if (l[q * (size_t)k + (size_t)i] == want) {
                    hit++;
                    break;
                }
        }
    *recall = all ? (double)hit / (double)all : 1.0;
    free(d), free(l);
    return rc;
}

static int64_t recall_sample_bytes(const nc_unbounded_cache *u, const ub_exact_top *e)
{
    return (int64_t)(e->nq * ((size_t)u->o.dim * sizeof(float) + UB_RECALL_TOP * 12 + sizeof(int64_t)) +
                     e->nq * (size_t)UB_RECALL_K * 12);
}

/* The recall measure's held-out keys of a training at T: UB_RECALL_QUERIES
 * keys -- ids spread over [T/2, T), each searching the ids before it, as a
 * reader searches M_t -- and their exact nearest (e.x, e.lim, e.td, e.tl;
 * e.nq = 0 when T is too small to hold any). Its buffers are counted in
 * the training's held bytes until recall_sample_free. */
static int recall_sample(nc_unbounded_cache *u, int64_t T, ub_exact_top *e, char *err, size_t errlen)
{
    const size_t d = (size_t)u->o.dim;
    const size_t nq = UB_RECALL_QUERIES < T / 4 ? UB_RECALL_QUERIES : (size_t)(T / 4);
    *e = (ub_exact_top){.nq = nq};
    if (nq == 0)
        return NC_OK;
    float *x = nc_malloc(nq * d * sizeof(float));
    int64_t *lim = nc_malloc(nq * sizeof(int64_t));
    e->x = x, e->lim = lim;
    e->td = nc_malloc(nq * UB_RECALL_TOP * sizeof(float)), e->tl = nc_malloc(nq * UB_RECALL_TOP * sizeof(int64_t));
    /* these, and a search's answers (a distance and an id of its k a query) */
    train_holds(u, recall_sample_bytes(u, e));
    if (!x || !lim || !e->td || !e->tl)
        return nc_error(err, errlen, NC_ENOMEM, "recall measure");
    for (size_t q = 0; q < nq; q++) {
        lim[q] = T / 2 + (int64_t)q * (T - T / 2) / (int64_t)nq;
        keys_get(u, (size_t)lim[q], 1, x + q * d);
    }
    return exact_top(u, e, T, err, errlen);
}

static void recall_sample_free(nc_unbounded_cache *u, ub_exact_top *e)
{
    train_holds(u, -recall_sample_bytes(u, e));
    free((void *)e->x), free((void *)e->lim), free(e->td), free(e->tl);
    *e = (ub_exact_top){0};
}

/* Measuring: job->nprobe, the least whose recall (above) on the held-out
 * keys (recall_sample) meets the target; the largest tried when none
 * does. A ladder of rungs finds the first that meets it, then halving the
 * gap down to the rung below finds the least between them (recall only
 * grows with the lists probed, up to the PQ's reordering of near
 * neighbours). The rungs alone overshoot: at 1.7M pairs of the growth
 * curve 16 where 14 meets the target, at the same perplexity, and a read
 * scans codes in proportion to nprobe. */
static int train_measure(nc_unbounded_cache *u, ub_train_job *j, char *err, size_t errlen)
{
    static const int ladder[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128};
    j->nprobe = u->o.nprobe;
    j->recall = -1.0;
    train_phase(u, NC_UB_TRAIN_MEASURING, j->T);
    ub_exact_top e;
    int rc = recall_sample(u, j->T, &e, err, errlen);
    int below = 0;   /* the rung below the one that meets the target */
    bool met = false;
    for (size_t i = 0; !rc && e.nq && !met && i < sizeof ladder / sizeof *ladder && ladder[i] <= j->nlist; i++) {
        double r = 0.0;
        rc = ivf_recall(j, &e, ladder[i], &r, err, errlen);
        if (!rc) {
            met = r >= u->o.recall_target;
            below = met ? below : ladder[i];
            j->nprobe = ladder[i];
            j->recall = r;
        }
    }
    while (!rc && met && j->nprobe - below > 1) {
        const int mid = below + (j->nprobe - below) / 2;
        double r = 0.0;
        rc = ivf_recall(j, &e, mid, &r, err, errlen);
        if (!rc && r >= u->o.recall_target)
            j->nprobe = mid, j->recall = r;
        else if (!rc)
            below = mid;
    }
    recall_sample_free(u, &e);
    return rc;
}

int unbounded_cache_recall_at(nc_unbounded_cache *u, int nprobe, double *recall, char *err, size_t errlen)
{
    pthread_rwlock_rdlock(&u->lock);
    const int64_t T = u->tr.trained_on;
    const bool ok = T > 0 && u->keys_ok && !u->flat;
    pthread_rwlock_unlock(&u->lock);
    if (!ok)
        return nc_error(err, errlen, NC_ESTATE, "recall: no own training with its keys");
    ub_exact_top e;
    int rc = recall_sample(u, T, &e, err, errlen);
    *recall = -1.0;
    if (!rc && e.nq) {
        pthread_rwlock_rdlock(&u->lock);
        ub_train_job j = {.T = T, .ivf = u->idx, .cq = u->cq};
        rc = ivf_recall(&j, &e, nprobe > 0 ? nprobe : u->nprobe, recall, err, errlen);
        pthread_rwlock_unlock(&u->lock);
    }
    recall_sample_free(u, &e);
    return rc;
}

/* Catching up and the swap: the pairs added since T encoded off-lock in
 * rounds until fewer than UB_CATCHUP_LOCKED are left, then those under the
 * write lock, and the new index swapped in (its nprobe the one chosen). */
static int train_swap(nc_unbounded_cache *u, ub_train_job *j, char *err, size_t errlen)
{
    int rc = NC_OK;
    for (;;) {
        int64_t n = unbounded_cache_count(u);
        if (n - j->done <= (int64_t)UB_CATCHUP_LOCKED)
            break;
        train_phase(u, NC_UB_TRAIN_CATCHUP, n - j->done);
        if ((rc = train_encode(u, j, n, false, err, errlen)))
            return rc;
    }
    train_phase(u, NC_UB_TRAIN_SWAP, UB_CATCHUP_LOCKED);   /* (its test pause before the lock) */
    pthread_rwlock_wrlock(&u->lock);
    rc = train_encode(u, j, (int64_t)u->nvalues, true, err, errlen);
    if (!rc)
        rc = set_nprobe(u, j->ivf, j->nprobe, err, errlen);
    if (!rc) {
        faiss_shim_cq_free(u->cq);
        pq_tables_detach(u->idx, u->table_key);
        faiss_Index_free(u->idx);
        u->idx = j->ivf;
        u->cq = j->cq;
        u->table_key = j->key;
        j->ivf = NULL;
        j->cq = NULL;
        u->flat = false;
        u->gen++;
        if (u->tmpl) {   /* the model's training is not needed any more */
            faiss_Index_free(u->tmpl);
            u->tmpl = NULL;
        }
        u->tr.trained_on = j->T;
        u->tr.trainings++;
        u->tr.recall = j->recall;
        u->tr.last_secs = nc_now_s() - j->t0;
        train_holds(u, -j->index_held);   /* counted as the index searched now */
        j->index_held = 0;
    }
    pthread_rwlock_unlock(&u->lock);
    return rc;
}

/* One training on the keys of ids < T (unbounded_cache.h): fit, encode,
 * measure, catch up and swap. On failure the cache keeps its index. */
static int train_one(nc_unbounded_cache *u, int64_t T, char *err, size_t errlen)
{
    ub_train_job j = {.T = T, .nlist = train_nlist(T), .t0 = nc_now_s()};
    const int64_t buf = UB_ENCODE_BATCH * u->o.dim * (int64_t)sizeof(float);
    j.buf = nc_malloc((size_t)buf);
    int rc = j.buf ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "training buffer");
    train_holds(u, buf);
    if (!rc)
        rc = train_fit(u, &j, err, errlen);
    if (!rc) {
        train_phase(u, NC_UB_TRAIN_ENCODING, T);
        rc = train_encode(u, &j, T, false, err, errlen);
    }
    if (!rc)
        rc = train_measure(u, &j, err, errlen);
    if (!rc)
        rc = train_swap(u, &j, err, errlen);
    free(j.buf);
    faiss_shim_cq_free(j.cq);
    if (j.ivf) {
        pq_tables_detach(j.ivf, j.key);
        faiss_Index_free(j.ivf);
    }
    train_holds(u, -(buf + j.index_held));
    NC_ASSERT(atomic_load(&u->tr.held) == 0, "train_one: a training's buffers left counted");
    return rc;
}

/* Trains while one is due (a training that ends with a later T_j due
 * trains that one), then marks the trainer idle. */
static void training_run(nc_unbounded_cache *u)
{
    const int omp_was = omp_get_max_threads();
    omp_set_num_threads(1);   /* one order of sums: the same index every run */
    char err[NC_ERRLEN];
    for (;;) {
        pthread_rwlock_wrlock(&u->lock);
        int64_t T = train_stopped(u) ? 0 : train_due(u);
        if (!T && !train_stopped(u))
            T = drift_due(u);
        u->tr.target = T;
        if (!T) {
            u->tr.running = false;
            atomic_store(&u->tr.phase, NC_UB_TRAIN_IDLE);
            pthread_rwlock_unlock(&u->lock);
            omp_set_num_threads(omp_was);   /* (train_sync: the caller's thread) */
            return;
        }
        pthread_rwlock_unlock(&u->lock);
        if (train_one(u, T, err, sizeof err) != NC_OK) {
            pthread_rwlock_wrlock(&u->lock);
            u->tr.failures++;
            /* not again before the next T_j: counted as done, the index kept */
            if (!train_stopped(u))
                u->tr.trained_on = T;
            pthread_rwlock_unlock(&u->lock);
        }
    }
}

static void *train_main(void *arg)
{
    nc_unbounded_cache *u = arg;
    if (u->o.train_nice > 0)
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), u->o.train_nice);
    training_run(u);
    return NULL;
}

/* Called with the write lock held (after an add); returns with it released.
 * Starts the training due, if any and none is running: in this thread
 * (train_sync) or in the trainer's. */
static int train_check_and_unlock(nc_unbounded_cache *u, char *err, size_t errlen)
{
    if (u->tr.running || !(train_due(u) || drift_next(u))) {
        pthread_rwlock_unlock(&u->lock);
        return NC_OK;
    }
    u->tr.running = true;
    if (u->o.train_sync) {
        pthread_rwlock_unlock(&u->lock);
        training_run(u);
        return NC_OK;
    }
    if (u->tr.joinable)   /* it has ended: running was cleared last */
        pthread_join(u->tr.th, NULL);
    u->tr.joinable = pthread_create(&u->tr.th, NULL, train_main, u) == 0;
    int rc = NC_OK;
    if (!u->tr.joinable) {
        u->tr.running = false;
        rc = nc_error(err, errlen, NC_ENOMEM, "starting the unbounded index's training thread");
    }
    pthread_rwlock_unlock(&u->lock);
    return rc;
}

int unbounded_cache_train_kick(nc_unbounded_cache *u, char *err, size_t errlen)
{
    NC_ASSERT(u, "unbounded_cache_train_kick: no cache");
    pthread_rwlock_wrlock(&u->lock);
    return train_check_and_unlock(u, err, errlen);
}

static void train_stop_join(nc_unbounded_cache *u)
{
    __atomic_store_n(&u->tr.stop, 1, __ATOMIC_RELAXED);
    if (u->tr.joinable)
        pthread_join(u->tr.th, NULL);
    u->tr.joinable = false;
}

void unbounded_cache_train_wait(nc_unbounded_cache *u)
{
    NC_ASSERT(u, "unbounded_cache_train_wait: no cache");
    for (;;) {
        pthread_rwlock_rdlock(&u->lock);
        bool running = u->tr.running;
        pthread_rwlock_unlock(&u->lock);
        if (!running)
            return;
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
    }
}

void unbounded_cache_train_stats(nc_unbounded_cache *u, nc_ub_train_stats *st)
{
    NC_ASSERT(u && st, "unbounded_cache_train_stats: cache and out required");
    pthread_rwlock_rdlock(&u->lock);
    *st = (nc_ub_train_stats){.own = u->o.own_training, .keys = u->keys_ok, .nprobe = u->nprobe,
                              .recall = u->tr.recall, .recall_target = u->o.recall_target,
                              .trainings = u->tr.trainings, .trained_on = u->tr.trained_on,
                              .next_at = train_next_at(u), .last_seconds = u->tr.last_secs,
                              .failures = u->tr.failures, .held_bytes = atomic_load(&u->tr.held)};
    st->nlist = u->flat ? 0 : faiss_shim_nlist(u->idx);
    st->code_bytes = u->flat ? 0 : faiss_shim_code_size(u->idx, NULL);
    faiss_shim_trained tr;
    st->code_bits = !u->flat && faiss_shim_trained_arrays(u->idx, &tr) == 0 ? tr.nbits : 0;
    st->imbalance = u->flat ? 0.0 : faiss_shim_imbalance(u->idx);
    if (u->tr.running) {
        st->phase = (nc_ub_train_phase)atomic_load(&u->tr.phase);
        st->target = u->tr.target;
        int64_t tot = atomic_load(&u->tr.total), done = atomic_load(&u->tr.done);
        st->progress = tot > 0 ? (double)done / (double)tot : 0.0;
        if (st->progress > 1.0)
            st->progress = 1.0;
    }
    pthread_rwlock_unlock(&u->lock);
}

double unbounded_cache_imbalance_below(nc_unbounded_cache *u, int64_t limit)
{
    NC_ASSERT(u, "unbounded_cache_imbalance_below: no cache");
    pthread_rwlock_rdlock(&u->lock);
    double imb = u->flat ? 0.0 : faiss_shim_imbalance_below(u->idx, limit);
    pthread_rwlock_unlock(&u->lock);
    return imb;
}

void ub_coarse_free(nc_ub_coarse *c)
{
    free(c->d);
    free(c->l);
    *c = (nc_ub_coarse){0};
}

/* Room for rows entries in c's buffers: 0, or NC_ENOMEM (c as it was). */
static int coarse_reserve(nc_ub_coarse *c, size_t rows)
{
    if (rows <= c->cap)
        return NC_OK;
    float *d = nc_realloc(c->d, rows * sizeof(float));
    if (d)
        c->d = d;
    int64_t *l = d ? nc_realloc(c->l, rows * sizeof(int64_t)) : NULL;
    if (l)
        c->l = l;
    if (!d || !l)
        return NC_ENOMEM;
    c->cap = rows;
    return NC_OK;
}

/* Under the read lock: the coarse search of the n vectors x for nprobe
 * into c (rows 0 when the index is flat or not ours to scan). Errors leave
 * it empty: the add and the search then make their own. */
static void coarse_search(nc_unbounded_cache *u, const float *x, size_t n, int nprobe, nc_ub_coarse *c)
{
    c->n = 0;
    const int np = nprobe > 0 ? nprobe : u->nprobe;
    if (u->flat || n == 0)
        return;
    size_t rows = n * (size_t)np;
    if (coarse_reserve(c, rows))
        return;
    int got = u->cq ? faiss_shim_cq_search(u->cq, (int64_t)n, x, np, c->d, c->l)
                    : faiss_shim_coarse(u->idx, (int64_t)n, x, np, c->d, c->l);
    if (got <= 0)
        return;
    c->n = n;
    c->np = np;
    c->stride = got;
    c->x = x;
    c->gen = u->gen;
}

void unbounded_cache_coarse(nc_unbounded_cache *u, const float *x, size_t n, int nprobe, nc_ub_coarse *c)
{
    NC_ASSERT(u && c && (x || n == 0), "unbounded_cache_coarse: cache, queries and out required");
    omp_limit(u);
    pthread_rwlock_rdlock(&u->lock);
    coarse_search(u, x, n, nprobe, c);
    pthread_rwlock_unlock(&u->lock);
}

int ub_coarse_copy(nc_ub_coarse *dst, const nc_ub_coarse *src, const float *x)
{
    size_t rows = src->n * (size_t)src->stride;
    dst->n = 0;
    if (coarse_reserve(dst, rows))
        return NC_ENOMEM;
    memcpy(dst->d, src->d, rows * sizeof(float));
    memcpy(dst->l, src->l, rows * sizeof(int64_t));
    dst->n = src->n;
    dst->np = src->np;
    dst->stride = src->stride;
    dst->x = x;
    dst->gen = src->gen;
    return NC_OK;
}

/* Keys as stored: rounded to float16 into u->kbuf when key_f16 */
static int stored_keys(nc_unbounded_cache *u, const float **keys, size_t n, char *err, size_t errlen)
{
    if (!u->o.key_f16)
        return NC_OK;
    size_t m = n * (size_t)u->o.dim;
    if (m > u->kbuf_n) {
        float *kb = nc_realloc(u->kbuf, m * sizeof(float));
        if (!kb)
            return nc_error(err, errlen, NC_ENOMEM, "unbounded cache keys (%zu)", n);
        u->kbuf = kb;
        u->kbuf_n = m;
    }
    memcpy(u->kbuf, *keys, m * sizeof(float));
    vm_round_to_half(u->kbuf, m);
    *keys = u->kbuf;
    return NC_OK;
}

/* Write lock held: room for n more values. */
static int grow_values(nc_unbounded_cache *u, size_t n, char *err, size_t errlen)
{
    if (u->nvalues + n <= u->cap)
        return NC_OK;
    size_t c = u->cap ? u->cap : 4096;
    while (c < u->nvalues + n)
        c *= 2;
    int *v = nc_realloc(u->values, c * sizeof(int));
    if (!v)
        return nc_error(err, errlen, NC_ENOMEM, "unbounded cache values (%zu)", c);
    u->values = v;
    u->cap = c;
    return NC_OK;
}

/* Write lock held, values grown: logs (code hook) and stores c's pairs.
 * Everything is checked before the hook, so that a log never holds a pair
 * the index refused. */
static int add_coded(nc_unbounded_cache *u, const nc_ub_coded *c, char *err, size_t errlen)
{
    int64_t nlist = 0;
    size_t cs = faiss_shim_code_size(u->idx, &nlist);
    if (!u->o.compact || cs == 0)
        return nc_error(err, errlen, NC_EINVAL, "codes are only added to a compact store");
    if (c->code_size != cs)
        return nc_error(err, errlen, NC_EFORMAT, "codes of %zu bytes, the index's are %zu", c->code_size, cs);
    if (c->first_id >= 0 && c->first_id != (int64_t)u->nvalues)
        return nc_error(err, errlen, NC_EFORMAT, "codes from id %lld, the cache holds %zu pairs",
                        (long long)c->first_id, u->nvalues);
    for (size_t i = 0; i < c->n; i++)
        if (c->lists[i] < 0 || c->lists[i] >= nlist)
            return nc_error(err, errlen, NC_EFORMAT, "pair %zu: list %lld outside the index's %lld", i,
                            (long long)c->lists[i], (long long)nlist);
    nc_ub_coded at = *c;
    at.first_id = (int64_t)u->nvalues;
    int rc = u->chook ? u->chook(u->chook_ctx, &at, err, errlen) : NC_OK;
    char ferr[256];
    if (!rc && faiss_shim_add_codes(u->idx, (int64_t)c->n, c->lists, c->codes, ferr, sizeof ferr) != 0)
        rc = nc_error(err, errlen, NC_EFORMAT, "adding codes to the unbounded index: %s", ferr);
    if (!rc) {
        memcpy(u->values + u->nvalues, c->words, c->n * sizeof(int));
        u->nvalues += c->n;
    }
    return rc;
}

/* Write lock held: a compact cache's add of a's pairs, keys as stored --
 * their lists and codes made (as faiss_shim_add would store them), then
 * add_coded. */
static int add_compact(nc_unbounded_cache *u, const nc_ub_add *a, const float *keys, const nc_ub_coarse *hint,
                       char *err, size_t errlen)
{
    const int *words = a->words;
    const size_t n = a->n;
    size_t cs = faiss_shim_code_size(u->idx, NULL);
    if (n > u->lbuf_n) {
        int64_t *l = nc_realloc(u->lbuf, n * sizeof *l);
        if (l)
            u->lbuf = l;
        uint8_t *c = l ? nc_realloc(u->cbuf, n * (cs ? cs : 1)) : NULL;
        if (!c)
            return nc_error(err, errlen, NC_ENOMEM, "unbounded cache codes (%zu)", n);
        u->cbuf = c;
        u->lbuf_n = n;
    }
    faiss_shim_add_in in = add_in(n, keys, hint, NULL);   /* (faiss_shim_encode: FAISS's encoder, the codes logged) */
    char ferr[256];
    if (faiss_shim_encode(u->idx, &in, u->lbuf, u->cbuf, ferr, sizeof ferr) != 0)
        return nc_error(err, errlen, NC_EFORMAT, "encoding for the unbounded index: %s", ferr);
    nc_ub_coded c = {.lists = u->lbuf, .codes = u->cbuf, .code_size = cs, .words = words, .n = n,
                     .first_id = (int64_t)u->nvalues};
    return add_coded(u, &c, err, errlen);
}

int unbounded_cache_add_codes(nc_unbounded_cache *u, const nc_ub_coded *c, char *err, size_t errlen)
{
    NC_ASSERT(u && c && (c->n == 0 || (c->lists && c->codes && c->words)), "unbounded_cache_add_codes: %zu codes without their lists, bytes or words", c ? (size_t)c->n : 0);
    pthread_rwlock_wrlock(&u->lock);
    int rc = grow_values(u, c->n, err, errlen);
    if (!rc && c->n)
        rc = add_coded(u, c, err, errlen);
    pthread_rwlock_unlock(&u->lock);
    return rc;
}

void unbounded_cache_set_code_hook(nc_unbounded_cache *u, unbounded_cache_code_hook fn, void *ctx)
{
    pthread_rwlock_wrlock(&u->lock);
    u->chook = fn;
    u->chook_ctx = ctx;
    pthread_rwlock_unlock(&u->lock);
}

size_t unbounded_cache_code_size(nc_unbounded_cache *u, int64_t *nlist)
{
    pthread_rwlock_rdlock(&u->lock);
    size_t cs = u->o.compact ? faiss_shim_code_size(u->idx, nlist) : 0;
    if (!u->o.compact && nlist)
        *nlist = 0;
    pthread_rwlock_unlock(&u->lock);
    return cs;
}

bool unbounded_cache_is_compact(const nc_unbounded_cache *u)
{
    return u->o.compact;   /* fixed at creation */
}

uint64_t unbounded_cache_fingerprint(nc_unbounded_cache *u)
{
    pthread_rwlock_rdlock(&u->lock);
    uint64_t fp = pq_tables_fingerprint(u->flat ? u->tmpl : u->idx);
    pthread_rwlock_unlock(&u->lock);
    return fp;
}

int unbounded_cache_add_block(nc_unbounded_cache *u, const nc_ub_add *a, int64_t *first_id, char *err,
                              size_t errlen)
{
    NC_ASSERT(u && a && (a->n == 0 || (a->keys && a->words)), "unbounded_cache_add_block: %zu pairs without keys or words", a ? a->n : 0);
    int rc = NC_OK;
    const size_t n = a->n;
    omp_limit(u);
    if (a->coarse && !a->coarse_made) {
        /* outside the write lock: readers go on meanwhile */
        pthread_rwlock_rdlock(&u->lock);
        coarse_search(u, a->keys, a->n, a->nprobe, a->coarse);
        pthread_rwlock_unlock(&u->lock);
    }
    pthread_rwlock_wrlock(&u->lock);
    if (first_id)
        *first_id = (int64_t)u->nvalues;
    if (n == 0)
        goto out;
    if ((rc = grow_values(u, n, err, errlen)))
        goto out;
    const float *keys = a->keys;
    if ((rc = stored_keys(u, &keys, n, err, errlen)))
        goto out;
    const nc_ub_coarse *hint = a->coarse && a->coarse->n == n && a->coarse->gen == u->gen ? a->coarse : NULL;
    if (u->o.compact) {
        rc = add_compact(u, a, keys, hint, err, errlen);
        goto out;
    }
    /* room for the keys kept for training before the hook logs the pairs */
    if (u->o.own_training && u->keys_ok && (rc = keys_reserve(u, u->nvalues + n, err, errlen)))
        goto out;
    if (u->hook && (rc = u->hook(u->hook_ctx, keys, a->words, n, (int64_t)u->nvalues, err, errlen)))
        goto out;
    faiss_shim_add_in ai = add_in(n, keys, hint, u->cq);
    if ((rc = index_add(u->idx, &ai, err, errlen)))
        goto out;
    if (u->o.own_training && u->keys_ok)
        keys_push(u, keys, n, u->nvalues, err, errlen);   /* (reserved: cannot fail) */
    memcpy(u->values + u->nvalues, a->words, n * sizeof(int));
    u->nvalues += n;
    if (u->o.own_training)
        return train_check_and_unlock(u, err, errlen);
    if (u->flat && (long)u->nvalues >= u->o.switch_at)
        return switch_and_unlock(u, err, errlen);   /* it says whether a switch is due */
out:
    pthread_rwlock_unlock(&u->lock);
    return rc;
}

int unbounded_cache_add(nc_unbounded_cache *u, const float *keys, const int *words, size_t n, int64_t *first_id,
                char *err, size_t errlen)
{
    nc_ub_add a = {.keys = keys, .words = words, .n = n};
    return unbounded_cache_add_block(u, &a, first_id, err, errlen);
}

void unbounded_cache_set_add_hook(nc_unbounded_cache *u, unbounded_cache_add_hook fn, void *ctx)
{
    pthread_rwlock_wrlock(&u->lock);
    u->hook = fn;
    u->hook_ctx = ctx;
    pthread_rwlock_unlock(&u->lock);
}

void unbounded_cache_set_search_hook(nc_unbounded_cache *u, unbounded_cache_search_hook fn, void *ctx)
{
    pthread_rwlock_wrlock(&u->lock);
    u->shook = fn;
    u->shook_ctx = ctx;
    pthread_rwlock_unlock(&u->lock);
}

int unbounded_cache_word_at(nc_unbounded_cache *u, int64_t id)
{
    NC_ASSERT(u, "unbounded_cache_word_at: no cache (id %lld)", (long long)id);
    pthread_rwlock_rdlock(&u->lock);
    int w = id >= 0 && (size_t)id < u->nvalues ? u->values[id] : -1;
    pthread_rwlock_unlock(&u->lock);
    return w;
}

int unbounded_cache_search(nc_unbounded_cache *u, const float *queries, size_t nq, int k, int nprobe,
                   const int64_t *id_limit, int extra, int reader, float *out_d2, int *out_words,
                   char *err, size_t errlen)
{
    return unbounded_cache_search_ids(u, queries, nq, k, nprobe, id_limit, extra, reader, out_d2, out_words,
                              NULL, err, errlen);
}

/* The answer of a search before it is made: no neighbour (word -1, id -1)
 * in each of the n slots, which stay so where a query has fewer than k. */
static void clear_neighbours(size_t n, float *d2, int *words, int64_t *ids)
{
    for (size_t i = 0; i < n; i++) {
        d2[i] = 0.0f;
        words[i] = -1;
        if (ids)
            ids[i] = -1;
    }
}

int unbounded_cache_search_ids(nc_unbounded_cache *u, const float *queries, size_t nq, int k, int nprobe,
                       const int64_t *id_limit, int extra, int reader, float *out_d2, int *out_words,
                       int64_t *out_ids, char *err, size_t errlen)
{
    nc_ub_query q = {.queries = queries, .nq = nq, .k = k, .nprobe = nprobe, .id_limit = id_limit, .extra = extra,
                     .reader = reader, .out_d2 = out_d2, .out_words = out_words, .out_ids = out_ids};
    return unbounded_cache_query(u, &q, err, errlen);
}

/* What a thread keeps between searches: a larger one (a big block of
 * queries, FAISS's k + extra) is allocated for its call only */
#define UB_SCRATCH_KEEP ((size_t)4 << 20)

/* The calling thread's room for n ids (idx_t) followed by n distances
 * (float), contents undefined, or NULL (out of memory); *owned: the caller
 * frees it (over UB_SCRATCH_KEEP bytes). Kept per thread (scratch.h)
 * between its searches: 64 queries x 512 neighbours of ids and distances
 * are 384 KB, over malloc's mmap threshold, and each search mapped them
 * afresh and faulted every page in (the kernel's page clearing was 4.9% of
 * the 1M scoring pass). */
static idx_t *search_scratch(size_t n, bool *owned)
{
    const size_t bytes = n * (sizeof(idx_t) + sizeof(float));
    *owned = bytes > UB_SCRATCH_KEEP;
    if (*owned)
        return nc_malloc(bytes);
    return scratch_get(NC_SCRATCH_UB_SEARCH, bytes);
}

/* The search's kk candidates a query (d, l) into the reader's k: empty
 * slots and pairs not yet in M_t skipped, stored values read as the
 * reader's word ids (model_v: ids from it on are the reader's unk). */
static void gather_neighbours(const nc_unbounded_cache *u, const nc_ub_query *qr, const float *d, const idx_t *l,
                              idx_t kk, int model_v)
{
    const int k = qr->k;
    /* each id's word is a random read of values (4 MB at 1M states): asked
     * for 64 ids ahead, across queries (16 ahead, within a query, measured
     * 4.8% of the scoring pass against 3.9%) */
    const size_t ahead = 64, total = qr->nq * (size_t)kk;
    for (size_t i = 0; i < total && i < ahead; i++)
        if ((size_t)l[i] < u->nvalues)   /* (-1 too) */
            __builtin_prefetch(u->values + l[i]);
    for (size_t q = 0; q < qr->nq; q++) {
        int got = 0;
        for (idx_t j = 0; j < kk && got < k; j++) {
            const size_t i = q * (size_t)kk + (size_t)j + ahead;
            if (i < total && (size_t)l[i] < u->nvalues)
                __builtin_prefetch(u->values + l[i]);
            idx_t id = l[q * kk + j];
            if (id < 0 || (size_t)id >= u->nvalues)
                continue;   /* -1: empty probed lists, not a neighbour */
            if (qr->id_limit && id >= qr->id_limit[q])
                continue;   /* causal filter: not yet in M_t */
            qr->out_d2[q * k + got] = d[q * kk + j];
            int w = u->values[id];
            qr->out_words[q * k + got] = w < model_v ? w : qr->reader;
            if (qr->out_ids)
                qr->out_ids[q * k + got] = id;
            got++;
        }
    }
}

int unbounded_cache_query(nc_unbounded_cache *u, const nc_ub_query *qr, char *err, size_t errlen)
{
    NC_ASSERT(u && qr && qr->k > 0 && (qr->nq == 0 || qr->queries), "unbounded_cache_query: k %d", qr ? qr->k : 0);
    const float *queries = qr->queries;
    const size_t nq = qr->nq;
    const int k = qr->k, nprobe = qr->nprobe, extra = qr->extra, reader = qr->reader;
    const int64_t *id_limit = qr->id_limit;
    float *out_d2 = qr->out_d2;
    int *out_words = qr->out_words;
    int64_t *out_ids = qr->out_ids;
    if (k <= 0 || extra < 0)
        return nc_error(err, errlen, NC_EINVAL, "knn %d / extra %d", k, extra);
    /* the one place where stored values become a reader's word ids: a
     * closed-vocabulary reader sees every open-vocabulary word as unk
     * (design §4), in the kernel sum, explain and the components alike */
    const int model_v = reader != NC_UB_OPEN && u->words ? wordtable_model_size(u->words) : INT_MAX;
    clear_neighbours(nq * (size_t)k, out_d2, out_words, out_ids);
    if (nq == 0)
        return NC_OK;
    omp_limit(u);
    int rc = NC_OK;
    /* nprobe travels with the search (faiss_shim.h), not in the shared
     * index: readers with different nprobe search side by side under the
     * read lock, and only adds and the switch write */
    pthread_rwlock_rdlock(&u->lock);
    if (qr->out_count)
        *qr->out_count = (int64_t)u->nvalues;
    if (qr->out_gen)
        *qr->out_gen = u->gen;
    const int np = nprobe > 0 ? nprobe : u->nprobe;
    idx_t ntotal = faiss_Index_ntotal(u->idx);
    if (ntotal == 0)
        goto out;
    idx_t kk = (idx_t)k + extra;
    if (kk > ntotal)
        kk = ntotal;   /* FAISS pads with -1 anyway; no point asking for more */
    if (kk < k)
        kk = k;        /* our own scan returns k a query, padded */
    bool owned;
    idx_t *l = search_scratch(nq * (size_t)kk, &owned);
    float *d = l ? (float *)(l + nq * (size_t)kk) : NULL;
    if (!l) {
        rc = nc_error(err, errlen, NC_ENOMEM, "search buffers (%zu x %ld)", nq, (long)kk);
        goto out;
    }
    char ferr[256];
    if (u->shook)
        u->shook(u->shook_ctx, u->flat ? 0 : np);
    /* our own scan of the IVFPQ lists (faiss_shim_ivfpq_search) filters
     * causally before it selects, so k a query is enough; it answers 1 for
     * an index it does not read, which FAISS then searches for k + extra */
    int how = 1;
    if (!u->flat && !u->o.faiss_scan) {
        uint64_t nd = 0;
        /* the coarse search the add of these vectors made, if it is theirs */
        const nc_ub_coarse *c = qr->coarse;
        bool shared = c && c->x == queries && c->n == nq && c->np == np && c->gen == u->gen;
        faiss_shim_scan sc = {.n = (int64_t)nq, .x = queries, .k = k, .nprobe = np, .id_limit = id_limit,
                              .cdis = shared ? c->d : NULL, .cids = shared ? c->l : NULL, .cq = u->cq, .d = d, .l = l,
                              .ndis = &nd};
        how = faiss_shim_ivfpq_search(u->idx, &sc, ferr, sizeof ferr);
        if (how == 0) {
            kk = k;
            atomic_fetch_add_explicit(&u->ndis, nd, memory_order_relaxed);
            atomic_fetch_add_explicit(&u->nsearched, nq, memory_order_relaxed);
        }
    }
    if (how == 1)
        how = faiss_shim_search(u->idx, (int64_t)nq, queries, (int64_t)kk, u->flat ? 0 : np, d, l, ferr, sizeof ferr);
    if (how != 0) {
        rc = nc_error(err, errlen, NC_EFORMAT, "unbounded cache search: %s", ferr);
    } else {
        gather_neighbours(u, qr, d, l, kk, model_v);
    }
    if (owned)
        free(l);
out:
    pthread_rwlock_unlock(&u->lock);
    return rc;
}

void unbounded_cache_scan_stats(nc_unbounded_cache *u, uint64_t *queries, uint64_t *codes)
{
    *queries = atomic_load(&u->nsearched);
    *codes = atomic_load(&u->ndis);
}

void unbounded_cache_coarse_stats(nc_unbounded_cache *u, uint64_t *queries, uint64_t *exact)
{
    pthread_rwlock_rdlock(&u->lock);
    faiss_shim_cq_stats(u->cq, queries, exact);
    pthread_rwlock_unlock(&u->lock);
}

void unbounded_cache_version(nc_unbounded_cache *u, int64_t *count, uint64_t *gen)
{
    pthread_rwlock_rdlock(&u->lock);
    *count = (int64_t)u->nvalues;
    *gen = u->gen;
    pthread_rwlock_unlock(&u->lock);
}

int64_t unbounded_cache_count(nc_unbounded_cache *u)
{
    NC_ASSERT(u, "unbounded_cache_count: no cache");
    pthread_rwlock_rdlock(&u->lock);
    int64_t n = (int64_t)u->nvalues;
    pthread_rwlock_unlock(&u->lock);
    return n;
}

bool unbounded_cache_is_exact(nc_unbounded_cache *u)
{
    pthread_rwlock_rdlock(&u->lock);
    bool f = u->flat;
    pthread_rwlock_unlock(&u->lock);
    return f;
}

int unbounded_cache_dim(const nc_unbounded_cache *u)
{
    return u->o.dim;
}

nc_wordtable *unbounded_cache_words(nc_unbounded_cache *u)
{
    return u->words;
}

size_t unbounded_cache_memory(nc_unbounded_cache *u)
{
    NC_ASSERT(u, "unbounded_cache_memory: no cache");
    pthread_rwlock_rdlock(&u->lock);
    /* per pair: its key (flat: dim floats; IVFPQ: its code and its int64
     * id in the inverted list) and its word id; plus what the trained index
     * holds whatever its size (centroids, precomputed tables), and while
     * exact the template it will switch to (4.65 MB for IVF4096,PQ32 at
     * H = 256: a namespace's, held from its first request). Exact, the
     * pairs count, not FAISS's capacity (up to twice as many: resize
     * doubles): the one array's capacity beyond them is mapped but never
     * written, so not resident (tests/test_cache.c
     * memory_gauge_is_resident_not_capacity). IVF, the lists' capacity:
     * thousands of small heap blocks, each up to twice its pairs, their
     * slack resident with their neighbours (ivf_gauge_counts_list_slack) */
    size_t lists = u->flat ? 0 : faiss_shim_lists_bytes(u->idx);
    size_t per = u->flat ? (size_t)u->o.dim * sizeof(float) : faiss_shim_code_size(u->idx, NULL) + 8;
    size_t m = sizeof *u + u->cap * sizeof(int) + (lists ? lists : u->nvalues * per) + faiss_shim_fixed_bytes(u->idx) -
               pq_tables_shared_bytes(u->idx, u->table_key) +   /* counted once: pq_tables_bytes */
               faiss_shim_cq_bytes(u->cq) + faiss_shim_fixed_bytes(u->tmpl) +
               /* the keys kept for training: 2 dim bytes a pair, in chunks
                * written in order (a chunk's pages not yet written are mapped,
                * not resident: the pairs count, as for FAISS's capacity) */
               (u->nvalues < u->nkch * UB_KCHUNK ? u->nvalues : u->nkch * UB_KCHUNK) * (size_t)u->o.dim *
                   sizeof(uint16_t) +
               u->kch_cap * sizeof(uint16_t *) +
               (size_t)atomic_load(&u->tr.held);   /* a training's buffers, while it runs */
    pthread_rwlock_unlock(&u->lock);
    return m;
}

/* ---- snapshot ---- */

static int path_join(char *out, size_t n, const char *dir, const char *name, char *err,
                     size_t errlen)
{
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n)
        return nc_error(err, errlen, NC_EINVAL, "path too long: %s/%s", dir, name);
    return NC_OK;
}

static int write_values(const nc_unbounded_cache *u, const char *path, char *err, size_t errlen)
{
    FILE *f = nc_fopen(path, "wb");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    uint64_t n = u->nvalues;
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)u->values, (uInt)(n * sizeof(int)));
    bool ok = nc_fwrite(UB_VALUES_MAGIC, 1, 8, f) == 8 && nc_fwrite(&n, sizeof n, 1, f) == 1 &&
              (n == 0 || nc_fwrite(u->values, sizeof(int), n, f) == n) &&
              nc_fwrite(&crc, sizeof crc, 1, f) == 1 && fflush(f) == 0 && nc_fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    return ok ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(e));
}

#define UB_TRAIN_HEAD "neurocache-train 1"

/* train.txt: the own training's state of the index saved beside it (lock
 * held): its T_j, the nprobe chosen, the recall measured, trainings done */
static int write_train(const nc_unbounded_cache *u, const char *path, char *err, size_t errlen)
{
    char b[512];
    int n = snprintf(b, sizeof b, UB_TRAIN_HEAD "\ntrained_on %lld\nnprobe %d\nrecall %.17g\ntrainings %llu\n"
                     "seconds %.17g\nfailures %llu\n", (long long)u->tr.trained_on, u->nprobe, u->tr.recall,
                     (unsigned long long)u->tr.trainings, u->tr.last_secs, (unsigned long long)u->tr.failures);
    FILE *f = nc_fopen(path, "wb");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    bool ok = nc_fwrite(b, 1, (size_t)n, f) == (size_t)n && fflush(f) == 0 && nc_fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    return ok ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(e));
}

/* Reads train.txt (ENOTFOUND: a snapshot of an earlier build, which has
 * none: the index is then nobody's own training, trained_on 0). */
static int read_train(nc_unbounded_cache *u, const char *path, char *err, size_t errlen)
{
    FILE *f = nc_fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? NC_ENOTFOUND : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    char b[512];
    size_t n = nc_fread(b, 1, sizeof b - 1, f);
    fclose(f);
    b[n] = 0;
    long long on = 0;
    unsigned long long tn = 0, fl = 0;
    int np = 0;
    double rec = 0, secs = 0;
    if (strncmp(b, UB_TRAIN_HEAD "\n", strlen(UB_TRAIN_HEAD) + 1) != 0 ||
        sscanf(b + strlen(UB_TRAIN_HEAD) + 1, "trained_on %lld\nnprobe %d\nrecall %lg\ntrainings %llu\nseconds %lg\n"
               "failures %llu", &on, &np, &rec, &tn, &secs, &fl) != 6 || on < 0 || np <= 0 || np > 65536)
        return nc_error(err, errlen, NC_EFORMAT, "%s: not a training state", path);
    u->tr.trained_on = on;
    u->tr.recall = rec;
    u->tr.trainings = tn;
    u->tr.last_secs = secs;
    u->tr.failures = fl;
    u->nprobe = np;
    return NC_OK;
}

int unbounded_cache_save(nc_unbounded_cache *u, const char *dir, char *err, size_t errlen)
{
    NC_ASSERT(u && dir, "unbounded_cache_save: cache and directory required");
    char p1[1200], p2[1200];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return nc_error(err, errlen, NC_EIO, "%s: %s", dir, strerror(errno));
    int rc = NC_OK;
    /* a read lock suffices: adds wait, searches go on */
    pthread_rwlock_rdlock(&u->lock);
    if (!(rc = path_join(p1, sizeof p1, dir, "index.faiss.tmp", err, errlen)) &&
        faiss_write_index_fname(u->idx, p1))
        rc = faiss_err(err, errlen, p1);
    if (!rc && !(rc = path_join(p2, sizeof p2, dir, "values.bin.tmp", err, errlen)))
        rc = write_values(u, p2, err, errlen);
    char p4[1200];
    if (!rc && !(rc = path_join(p4, sizeof p4, dir, "train.txt", err, errlen)))
        rc = write_train(u, p4, err, errlen);
    pthread_rwlock_unlock(&u->lock);
    if (!rc && u->words) {
        char p3[1200];
        if (!(rc = path_join(p3, sizeof p3, dir, "words.txt.tmp", err, errlen)))
            rc = wordtable_save(u->words, p3, err, errlen);
        char f3[1200];
        if (!rc && !(rc = path_join(f3, sizeof f3, dir, "words.txt", err, errlen)) && rename(p3, f3))
            rc = nc_error(err, errlen, NC_EIO, "rename %s: %s", p3, strerror(errno));
    }
    char f1[1200], f2[1200];
    if (!rc && !(rc = path_join(f1, sizeof f1, dir, "index.faiss", err, errlen)) && rename(p1, f1))
        rc = nc_error(err, errlen, NC_EIO, "rename %s: %s", p1, strerror(errno));
    if (!rc && !(rc = path_join(f2, sizeof f2, dir, "values.bin", err, errlen)) && rename(p2, f2))
        rc = nc_error(err, errlen, NC_EIO, "rename %s: %s", p2, strerror(errno));
    return rc;
}

/* n bytes at off of fd (fault.h's wrappers): 0, or -1 with errno (a short
 * read is EIO) */
static int pread_all(int fd, void *buf, size_t n, off_t off)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = nc_pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = EIO;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* appends n bytes to fd, positioned at off (lseek, then fault.h's write) */
static int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    if (lseek(fd, off, SEEK_SET) != off)
        return -1;
    for (size_t put = 0; put < n;) {
        ssize_t r = nc_write(fd, (const char *)buf + put, n - put);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        put += (size_t)r;
    }
    return 0;
}

int unbounded_cache_keys_sync(nc_unbounded_cache *u, const char *path, int64_t *count, char *err, size_t errlen)
{
    NC_ASSERT(u && path && count, "unbounded_cache_keys_sync: cache, path and out required");
    const size_t row = (size_t)u->o.dim * sizeof(uint16_t);
    *count = 0;
    pthread_rwlock_rdlock(&u->lock);
    const bool ok = u->o.own_training && u->keys_ok;
    const int64_t n = (int64_t)u->nvalues;
    pthread_rwlock_unlock(&u->lock);
    if (!ok)
        return NC_OK;
    int fd = nc_open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    int64_t have = rc ? 0 : (int64_t)((size_t)st.st_size / row);
    if (!rc && (size_t)st.st_size != (size_t)have * row && ftruncate(fd, (off_t)((size_t)have * row)) != 0)
        rc = nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));   /* a torn append */
    for (int64_t id = have; !rc && id < n;) {
        size_t off = (size_t)id % UB_KCHUNK, m = UB_KCHUNK - off;
        if ((int64_t)m > n - id)
            m = (size_t)(n - id);
        pthread_rwlock_rdlock(&u->lock);
        const uint16_t *c = u->kch[(size_t)id / UB_KCHUNK] + off * (size_t)u->o.dim;
        pthread_rwlock_unlock(&u->lock);
        if (pwrite_all(fd, c, m * row, (off_t)((size_t)id * row)) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
        id += (int64_t)m;
    }
    if (!rc && nc_fsync(fd) != 0)
        rc = nc_error(err, errlen, NC_EIO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
    if (!rc)
        *count = n > have ? n : have;
    return rc;
}

int unbounded_cache_keys_read(nc_unbounded_cache *u, const char *path, int64_t n, char *err, size_t errlen)
{
    NC_ASSERT(u && path && n >= 0, "unbounded_cache_keys_read: %lld keys", (long long)n);
    const size_t row = (size_t)u->o.dim * sizeof(uint16_t);
    if (!u->o.own_training)
        return NC_OK;
    int fd = nc_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return errno == ENOENT ? NC_ENOTFOUND : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    if (!rc && (uint64_t)st.st_size < (uint64_t)n * row)
        rc = NC_ENOTFOUND;
    pthread_rwlock_wrlock(&u->lock);
    if (!rc)
        rc = keys_reserve(u, (size_t)n, err, errlen);
    for (int64_t id = 0; !rc && id < n;) {
        size_t m = (size_t)(n - id) < UB_KCHUNK ? (size_t)(n - id) : UB_KCHUNK;
        if (pread_all(fd, u->kch[(size_t)id / UB_KCHUNK], m * row, (off_t)((size_t)id * row)) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(errno));
        id += (int64_t)m;
    }
    if (!rc && (uint64_t)st.st_size > (uint64_t)n * row && ftruncate(fd, (off_t)((size_t)n * row)) != 0)
        rc = nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    if (!rc)
        u->keys_ok = true;
    pthread_rwlock_unlock(&u->lock);
    close(fd);
    return rc;
}

static int read_values(nc_unbounded_cache *u, const char *path, char *err, size_t errlen)
{
    FILE *f = nc_fopen(path, "rb");
    if (!f)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", path,
                        strerror(errno));
    char magic[8];
    uint64_t n = 0;
    uint32_t crc = 0;
    struct stat st = {0};
    int rc = NC_OK;
    bool head = nc_fread(magic, 1, 8, f) == 8 && nc_fread(&n, sizeof n, 1, f) == 1;
    if (!head && !feof(f)) {
        /* a read error, not a short file: the snapshot is not corrupt */
        rc = nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(errno));
    } else if (!head || memcmp(magic, UB_VALUES_MAGIC, 8) != 0) {
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: not a neurocache values file", path);
    } else if (n > ((uint64_t)1 << 36)) {
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: implausible count %llu", path,
                      (unsigned long long)n);
    } else if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size != 16 + n * sizeof(int) + 4) {
        /* the count is checked against the file before it sizes an
         * allocation: a corrupt count asked for up to 256 GB before the
         * short read was noticed (seed sealed_big_count_5 of fuzz_snapshot) */
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: %lld bytes, a values file of %llu entries has %llu", path,
                      (long long)st.st_size, (unsigned long long)n, (unsigned long long)(16 + n * sizeof(int) + 4));
    } else {
        u->values = nc_malloc((n ? n : 1) * sizeof(int));
        u->cap = n ? n : 1;
        if (!u->values)
            rc = nc_error(err, errlen, NC_ENOMEM, "%s: %llu values", path, (unsigned long long)n);
        else if ((n && nc_fread(u->values, sizeof(int), n, f) != n) || nc_fread(&crc, sizeof crc, 1, f) != 1)
            rc = feof(f) ? nc_error(err, errlen, NC_EFORMAT, "%s: truncated", path)
                         : nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(errno));
        else if (crc != (uint32_t)crc32(0L, (const Bytef *)u->values, (uInt)(n * sizeof(int))))
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: checksum mismatch", path);
        else
            u->nvalues = n;
    }
    fclose(f);
    return rc;
}

/* A loaded cache's own training: its state (train.txt, when the snapshot
 * has one) and its keys -- a flat index holds them; an IVF index's come
 * from the store's keys file (unbounded_cache_keys_read), until then none. */
static int load_own_training(nc_unbounded_cache *u, const char *dir, char *err, size_t errlen)
{
    char p[1200];
    int rc = path_join(p, sizeof p, dir, "train.txt", err, errlen);
    if (!rc && (rc = read_train(u, p, err, errlen)) == NC_ENOTFOUND)
        rc = NC_OK;
    if (!rc && !u->flat)
        rc = set_nprobe(u, u->idx, u->nprobe, err, errlen);
    if (rc || !u->o.own_training)
        return rc;
    u->keys_ok = u->flat;
    if (!u->flat || u->nvalues == 0)
        return NC_OK;
    float *xb = NULL;
    size_t xsize = 0;
    faiss_IndexFlat_xb((FaissIndexFlat *)u->idx, &xb, &xsize);
    return keys_push(u, xb, u->nvalues, 0, err, errlen);
}

int unbounded_cache_load(const nc_unbounded_cache_opts *o, nc_wordtable *words, const char *dir,
                         nc_unbounded_cache **out, char *err, size_t errlen)
{
    nc_unbounded_cache *u;
    *out = NULL;
    int rc = cache_create(o, words, &u, err, errlen);
    if (rc)
        return rc;
    char p[1200];
    if (!(rc = path_join(p, sizeof p, dir, "index.faiss", err, errlen)) &&
        faiss_read_index_fname(p, TEMPLATE_IO_SKIP_TABLE, &u->idx))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: corrupt or unreadable FAISS index: %s", p,
                      faiss_get_last_error() ? faiss_get_last_error() : "?");
    if (!rc && faiss_Index_d(u->idx) != o->dim)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: dimension %d, expected %d", p,
                      faiss_Index_d(u->idx), o->dim);
    if (!rc) {
        u->flat = faiss_IndexFlat_cast(u->idx) != NULL;
        if (!u->flat)
            rc = set_nprobe(u, u->idx, u->nprobe, err, errlen);
        if (!rc && u->flat && o->compact)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: a flat index in a compact store (which holds codes only)", p);
    }
    /* read without its precomputed table: the one its training shares */
    if (!rc && !u->flat)
        rc = pq_tables_attach(u->idx, &u->table_key, err, errlen);
    if (!rc && !u->flat)
        u->cq = faiss_shim_cq_new(u->idx, 0);   /* (wants the attached table: scannable) */
    if (!rc && !(rc = path_join(p, sizeof p, dir, "values.bin", err, errlen)))
        rc = read_values(u, p, err, errlen);
    if (!rc && (idx_t)u->nvalues != faiss_Index_ntotal(u->idx))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: %zu values for %ld vectors in the index", dir,
                      u->nvalues, (long)faiss_Index_ntotal(u->idx));
    if (!rc && words) {
        if (!(rc = path_join(p, sizeof p, dir, "words.txt", err, errlen))) {
            rc = wordtable_load(words, p, err, errlen);
            if (rc == NC_ENOTFOUND)
                rc = NC_OK;   /* closed-vocabulary snapshot */
        }
        for (size_t i = 0; !rc && i < u->nvalues; i++)
            if (u->values[i] < 0 || u->values[i] >= wordtable_size(words))
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: value %d at id %zu outside the word table",
                              dir, u->values[i], i);
    }
    if (!rc && u->flat && !u->o.exact)
        rc = load_template(u, err, errlen);
    if (!rc)
        rc = load_own_training(u, dir, err, errlen);
    if (rc) {
        unbounded_cache_free(u);
        return rc;
    }
    *out = u;
    return NC_OK;
}
