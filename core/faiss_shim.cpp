/* faiss_shim.cpp -- FAISS C++ calls the 1.7.3 C API lacks (faiss_shim.h). */
#include "faiss_shim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include <faiss/Index.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFFastScan.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/invlists/InvertedLists.h>
#include <faiss/utils/utils.h>

static int shim_error(char *err, size_t errlen, const char *what)
{
    if (err && errlen)
        std::snprintf(err, errlen, "%s", what);
    return -1;
}

/* f() with FAISS's exceptions turned into -1 and their message: none may
 * cross into C */
template <class F> static int guarded(char *err, size_t errlen, F f)
{
    try {
        return f();
    } catch (const std::exception &e) {
        return shim_error(err, errlen, e.what());
    } catch (...) {
        return shim_error(err, errlen, "unknown FAISS exception");
    }
}

extern "C" int faiss_shim_search(const FaissIndex *idx, int64_t n, const float *x, int64_t k, int nprobe, float *d,
                                 int64_t *l, char *err, size_t errlen)
{
    return guarded(err, errlen, [&]() {
        const faiss::Index *ix = reinterpret_cast<const faiss::Index *>(idx);
        const faiss::IndexIVF *ivf = dynamic_cast<const faiss::IndexIVF *>(ix);
        faiss::Index::idx_t *li = reinterpret_cast<faiss::Index::idx_t *>(l);
        if (!ivf || nprobe <= 0 || (size_t)nprobe == ivf->nprobe) {
            ix->search(n, x, k, d, li);
            return 0;
        }
        /* FAISS 1.7.3's fast-scan IVF takes no search parameters */
        if (dynamic_cast<const faiss::IndexIVFFastScan *>(ivf))
            return shim_error(err, errlen, "a fast-scan IVF index searches with its own nprobe only (FAISS 1.7.3)");
        /* the parameters live on this call's stack: the index's nprobe
         * (set once, under the cache's write lock) is not written */
        faiss::SearchParametersIVF sp;
        sp.nprobe = (size_t)nprobe;
        sp.max_codes = ivf->max_codes;
        ix->search(n, x, k, d, li, &sp);
        return 0;
    });
}

extern "C" int faiss_shim_is_ivf(const FaissIndex *idx)
{
    return dynamic_cast<const faiss::IndexIVF *>(reinterpret_cast<const faiss::Index *>(idx)) != nullptr;
}

namespace {

/* A candidate as one 64-bit key: the distance's bits made monotonic as an
 * unsigned integer (flip all bits of a negative float, the sign bit of a
 * positive one) above the id (< 2^32, checked), so that integer order is
 * (distance, id) order and selecting and sorting compare integers. */
inline uint64_t cand_key(float d, int64_t id)
{
    uint32_t b;
    std::memcpy(&b, &d, sizeof b);
    b ^= (b >> 31) ? 0xffffffffu : 0x80000000u;
    return (uint64_t)b << 32 | (uint64_t)(uint32_t)id;
}

inline float cand_dist(uint64_t key)
{
    uint32_t b = (uint32_t)(key >> 32);
    b ^= (b >> 31) ? 0x80000000u : 0xffffffffu;
    float d;
    std::memcpy(&d, &b, sizeof d);
    return d;
}

/* The index kinds faiss_shim_ivfpq_search reads; any other goes to FAISS. */
const faiss::IndexIVFPQ *scannable(const FaissIndex *idx)
{
    const faiss::IndexIVFPQ *pq = dynamic_cast<const faiss::IndexIVFPQ *>(reinterpret_cast<const faiss::Index *>(idx));
    if (!pq || !pq->by_residual || pq->metric_type != faiss::METRIC_L2 || pq->use_precomputed_table != 1 ||
        pq->pq.nbits != 8 || pq->polysemous_ht != 0 || !pq->invlists ||
        pq->precomputed_table.size() != pq->nlist * pq->pq.M * pq->pq.ksub || pq->ntotal >= ((faiss::Index::idx_t)1 << 32))
        return nullptr;
    return pq;
}

/* One query: the candidates of its probed lists into c, then the k best
 * into d/l. tab2 [M * ksub]: <x_m, centroid> per sub-quantizer; tab: the
 * list's table, scratch. */
uint64_t scan_query(const faiss::IndexIVFPQ *ix, const float *x, const float *cdis, const faiss::Index::idx_t *cids,
                    int np, int64_t limit, int64_t k, std::vector<float> &tab2, std::vector<float> &tab,
                    std::vector<uint64_t> &c, float *d, int64_t *l)
{
    const size_t M = ix->pq.M, ksub = ix->pq.ksub, cs = ix->code_size;
    ix->pq.compute_inner_prod_table(x, tab2.data());
    c.clear();
    uint64_t nd = 0;
    for (int j = 0; j < np; j++) {
        faiss::Index::idx_t key = cids[j];
        if (key < 0)
            continue;   /* fewer lists than nprobe */
        size_t ls = ix->invlists->list_size((size_t)key);
        if (ls == 0)
            continue;
        /* FAISS's precompute_list_tables_L2, use_precomputed_table == 1 */
        faiss::fvec_madd(M * ksub, ix->precomputed_table.data() + (size_t)key * M * ksub, -2.0f, tab2.data(),
                         tab.data());
        const float dis0 = cdis[j];
        faiss::InvertedLists::ScopedCodes codes(ix->invlists, (size_t)key);
        faiss::InvertedLists::ScopedIds ids(ix->invlists, (size_t)key);
        const uint8_t *cp = codes.get();
        const faiss::Index::idx_t *ip = ids.get();
        const float *t = tab.data();
        nd += ls;
        size_t m = 0;
        /* four codes at a time: four independent sums (each in FAISS's
         * order, s = 0..M-1) for the CPU's parallel adds. Eight at a time,
         * with each code's bytes eight to a load, measured slower: 3,121
         * against 4,237 queries/CPU-s at 1M states (k 1,024, nprobe 8) */
        for (; m + 4 <= ls; m += 4) {
            const uint8_t *c0 = cp + m * cs, *c1 = c0 + cs, *c2 = c1 + cs, *c3 = c2 + cs;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (size_t s = 0; s < M; s++) {
                const float *ts = t + s * ksub;
                a0 += ts[c0[s]];
                a1 += ts[c1[s]];
                a2 += ts[c2[s]];
                a3 += ts[c3[s]];
            }
            const float a[4] = {a0, a1, a2, a3};
            for (int r = 0; r < 4; r++)
                if (ip[m + r] < limit)
                    c.push_back(cand_key(dis0 + a[r], ip[m + r]));
        }
        for (; m < ls; m++) {
            const uint8_t *c0 = cp + m * cs;
            float a0 = 0;
            for (size_t s = 0; s < M; s++)
                a0 += t[s * ksub + c0[s]];
            if (ip[m] < limit)
                c.push_back(cand_key(dis0 + a0, ip[m]));
        }
    }
    int64_t got = (int64_t)c.size() < k ? (int64_t)c.size() : k;
    if ((int64_t)c.size() > k)
        std::nth_element(c.begin(), c.begin() + k, c.end());
    std::sort(c.begin(), c.begin() + got);
    for (int64_t i = 0; i < k; i++) {
        d[i] = i < got ? cand_dist(c[(size_t)i]) : INFINITY;
        l[i] = i < got ? (int64_t)(uint32_t)c[(size_t)i] : -1;
    }
    return nd;
}

} // namespace

extern "C" int faiss_shim_ivfpq_search(const FaissIndex *idx, int64_t n, const float *x, int64_t k, int nprobe,
                                       const int64_t *id_limit, float *d, int64_t *l, uint64_t *ndis, char *err,
                                       size_t errlen)
{
    const faiss::IndexIVFPQ *ix = scannable(idx);
    if (!ix)
        return 1;
    return guarded(err, errlen, [&]() {
        int np = nprobe > 0 ? nprobe : (int)ix->nprobe;
        if ((size_t)np > ix->nlist)
            np = (int)ix->nlist;
        const size_t d_ = (size_t)ix->d, tsz = ix->pq.M * ix->pq.ksub;
        std::vector<float> cdis((size_t)n * np);
        std::vector<faiss::Index::idx_t> cids((size_t)n * np);
        /* the coarse quantizer: one batched search for all n (BLAS from 20 on) */
        ix->quantizer->search(n, x, np, cdis.data(), cids.data());
        uint64_t nd = 0;
        std::vector<float> tab2(tsz), tab(tsz);
        std::vector<uint64_t> c;
        c.reserve(4096);
        for (int64_t q = 0; q < n; q++)
            nd += scan_query(ix, x + (size_t)q * d_, cdis.data() + (size_t)q * np, cids.data() + (size_t)q * np, np,
                             id_limit ? id_limit[q] : INT64_MAX, k, tab2, tab, c, d + (size_t)q * k,
                             l + (size_t)q * k);
        if (ndis)
            *ndis += nd;
        return 0;
    });
}

extern "C" size_t faiss_shim_fixed_bytes(const FaissIndex *idx)
{
    const faiss::IndexIVF *ivf = dynamic_cast<const faiss::IndexIVF *>(reinterpret_cast<const faiss::Index *>(idx));
    if (!ivf)
        return 0;
    size_t b = ivf->nlist * (size_t)ivf->d * sizeof(float);   /* the coarse centroids (a flat quantizer) */
    if (const faiss::IndexIVFPQ *pq = dynamic_cast<const faiss::IndexIVFPQ *>(ivf))
        b += pq->pq.centroids.size() * sizeof(float) + pq->precomputed_table.size() * sizeof(float);
    return b;
}
