/* pq_tables.h -- one copy of an IVFPQ index's precomputed residual table
 * for every index of the same training (issue 26 point 3).
 *
 * FAISS's IndexIVFPQ with use_precomputed_table == 1 keeps a table of
 * ||c_l + q_m(j)||^2 - ||q_m(j)||^2 terms (Jegou et al. 2011, eq. 13-14:
 * nlist x M x 256 floats, 128 MB for IVF4096,PQ32) that depends on the
 * coarse and PQ centroids only. Every namespace made from the model's
 * unbounded.faiss held its own; here they share one, reference-counted and
 * read-only, keyed by the training fingerprint. FAISS reads it in place of
 * its own (faiss_shim_table_lend), so its search and ours are unchanged.
 *
 * Thread-safe (the table registry's lock, a leaf). */
#ifndef NC_PQ_TABLES_H
#define NC_PQ_TABLES_H

#include <faiss/c_api/Index_c.h>

#include "nc_common.h"

/* The training fingerprint of an IVFPQ index with a flat quantizer: a
 * 64-bit hash (two crc32) of its coarse and PQ centroids and shape; 0 for
 * any other index. Indexes of equal fingerprints file the same key under
 * the same list and code. */
uint64_t pq_tables_fingerprint(const FaissIndex *idx);

/* Makes idx read the shared table of its training, computing it (once a
 * training) if no live index has it. *key receives what to pass to
 * pq_tables_detach (0: idx has no such table, nothing shared). NC_OK, or
 * an error (idx unchanged). */
int pq_tables_attach(FaissIndex *idx, uint64_t *key, char *err, size_t errlen);
/* Before faiss_Index_free(idx): idx stops reading the shared table (freed
 * with its last reader). key 0: nothing. */
void pq_tables_detach(FaissIndex *idx, uint64_t key);

/* Tables alive and their bytes (memory reports: counted once, not per
 * namespace). */
size_t pq_tables_bytes(int *count);
/* Bytes of the table idx reads if it is shared (0 otherwise). */
size_t pq_tables_shared_bytes(const FaissIndex *idx, uint64_t key);

#endif
