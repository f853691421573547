/* pq_tables.c -- the shared precomputed residual tables (pq_tables.h). */
#include "pq_tables.h"
#include "faiss_shim.h"
#include "fault.h"

#include <pthread.h>
#include <stdlib.h>
#include <zlib.h>

typedef struct pq_table {
    uint64_t key;
    float *tab;                   /* owned: free() (FAISS's posix_memalign) */
    size_t floats;
    int refs;
    struct pq_table *next;
} pq_table;

static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;
static pq_table *tables;

static uLong crc_bytes(uLong c, const void *p, size_t n)
{
    const Bytef *b = p;
    while (n > 0) {   /* crc32 takes uInt lengths */
        uInt m = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, b, m);
        b += m;
        n -= m;
    }
    return c;
}

uint64_t pq_tables_fingerprint(const FaissIndex *idx)
{
    faiss_shim_trained t;
    if (!idx || faiss_shim_trained_arrays(idx, &t) != 0)
        return 0;
    int32_t shape[4] = {t.d, t.M, t.nbits, (int32_t)(t.ncoarse / (size_t)(t.d > 0 ? t.d : 1))};
    uLong a = crc_bytes(crc32(0L, Z_NULL, 0), shape, sizeof shape);
    a = crc_bytes(a, t.coarse, t.ncoarse * sizeof(float));
    uLong b = crc_bytes(crc32(0L, Z_NULL, 0), t.pq, t.npq * sizeof(float));
    b = crc_bytes(b, shape, sizeof shape);
    uint64_t fp = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    return fp ? fp : 1;   /* 0 means "none" */
}

static pq_table *find(uint64_t key)
{
    for (pq_table *t = tables; t; t = t->next)
        if (t->key == key)
            return t;
    return NULL;
}

/* One lock over look-up, computation and insertion: two first readers of a
 * training compute its table once. */
int pq_tables_attach(FaissIndex *idx, uint64_t *key, char *err, size_t errlen)
{
    *key = 0;
    size_t floats = faiss_shim_table_floats(idx);
    if (!floats)
        return NC_OK;
    uint64_t fp = pq_tables_fingerprint(idx);
    int rc = NC_OK;
    pthread_mutex_lock(&tables_lock);
    pq_table *t = find(fp);
    if (!t) {
        /* the first reader of this training: its table becomes the shared one */
        char ferr[256] = "";
        float *tab = faiss_shim_table_take(idx, ferr, sizeof ferr);
        t = tab ? nc_zalloc(1, sizeof *t) : NULL;
        if (!tab && !ferr[0]) {
            /* FAISS keeps no table for it (too large): it searches without */
            pthread_mutex_unlock(&tables_lock);
            return NC_OK;
        }
        if (!t) {
            free(tab);
            rc = nc_error(err, errlen, NC_ENOMEM, "precomputed table of %zu floats: %s", floats,
                          ferr[0] ? ferr : "out of memory");
        } else {
            *t = (pq_table){.key = fp, .tab = tab, .floats = floats, .next = tables};
            tables = t;
        }
    }
    if (!rc) {
        t->refs++;
        faiss_shim_table_lend(idx, t->tab);
        *key = fp;
    }
    pthread_mutex_unlock(&tables_lock);
    return rc;
}

void pq_tables_detach(FaissIndex *idx, uint64_t key)
{
    if (!key)
        return;
    faiss_shim_table_unlend(idx);
    pthread_mutex_lock(&tables_lock);
    pq_table **pp = &tables;
    while (*pp && (*pp)->key != key)
        pp = &(*pp)->next;
    pq_table *t = *pp;
    if (t && --t->refs == 0) {
        *pp = t->next;
        free(t->tab);
        free(t);
    }
    pthread_mutex_unlock(&tables_lock);
}

size_t pq_tables_bytes(int *count)
{
    size_t b = 0;
    int n = 0;
    pthread_mutex_lock(&tables_lock);
    for (pq_table *t = tables; t; t = t->next, n++)
        b += t->floats * sizeof(float);
    pthread_mutex_unlock(&tables_lock);
    if (count)
        *count = n;
    return b;
}

size_t pq_tables_shared_bytes(const FaissIndex *idx, uint64_t key)
{
    return key ? faiss_shim_table_floats(idx) * sizeof(float) : 0;
}
