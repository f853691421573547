/* faiss_shim.cpp -- FAISS C++ calls the 1.7.3 C API lacks (faiss_shim.h). */
#include "faiss_shim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include <faiss/Index.h>
#include <faiss/IndexFlat.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFFastScan.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/invlists/InvertedLists.h>
#include <faiss/utils/distances.h>
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

/* The PQ distances of a list's ls codes (code_size cs, M bytes used) from
 * its table t [M * ksub]: out[m] = sum_s t[s * ksub + code_m[s]]. Four
 * codes at a time: four independent sums (each in FAISS's order, s = 0..M-1)
 * for the CPU's parallel adds. Eight at a time, with each code's bytes eight
 * to a load, measured slower: 3,121 against 4,237 queries/CPU-s at 1M states
 * (k 1,024, nprobe 8). */
void list_dists(const float *t, size_t M, size_t ksub, const uint8_t *cp, size_t cs, size_t ls, float *out)
{
    size_t m = 0;
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
        out[m] = a0, out[m + 1] = a1, out[m + 2] = a2, out[m + 3] = a3;
    }
    for (; m < ls; m++) {
        const uint8_t *c0 = cp + m * cs;
        float a0 = 0;
        for (size_t s = 0; s < M; s++)
            a0 += t[s * ksub + c0[s]];
        out[m] = a0;
    }
}

/* One query: the candidates of its probed lists into c, then the k best
 * into d/l. tab2 [M * ksub]: <x_m, centroid> per sub-quantizer; tab: the
 * list's table, scratch. */
uint64_t scan_query(const faiss::IndexIVFPQ *ix, const float *x, const float *cdis, const faiss::Index::idx_t *cids,
                    int np, int64_t limit, int64_t k, std::vector<float> &tab2, std::vector<float> &tab,
                    std::vector<float> &dist, std::vector<uint64_t> &c, float *d, int64_t *l)
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
        if (ls > dist.size())
            dist.resize(ls);
        list_dists(t, M, ksub, cp, cs, ls, dist.data());
        for (size_t m = 0; m < ls; m++)
            if (ip[m] < limit)
                c.push_back(cand_key(dis0 + dist[m], ip[m]));
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

/* nprobe as our scan and its coarse search take it: <= 0 the index's, at
 * most nlist */
static int probes(const faiss::IndexIVF *ix, int nprobe)
{
    int np = nprobe > 0 ? nprobe : (int)ix->nprobe;
    return (size_t)np > ix->nlist ? (int)ix->nlist : np;
}

extern "C" int faiss_shim_ivfpq_search(const FaissIndex *idx, const faiss_shim_scan *s, char *err, size_t errlen)
{
    const faiss::IndexIVFPQ *ix = scannable(idx);
    if (!ix)
        return 1;
    return guarded(err, errlen, [&]() {
        const int64_t n = s->n, k = s->k;
        const int np = probes(ix, s->nprobe);
        const size_t d_ = (size_t)ix->d, tsz = ix->pq.M * ix->pq.ksub;
        std::vector<float> cd;
        std::vector<faiss::Index::idx_t> ci;
        const float *cdis = s->cdis;
        const faiss::Index::idx_t *cids = reinterpret_cast<const faiss::Index::idx_t *>(s->cids);
        if (!cdis || !cids) {
            /* the coarse quantizer: one batched search for all n (BLAS from 20 on) */
            cd.resize((size_t)n * np);
            ci.resize((size_t)n * np);
            ix->quantizer->search(n, s->x, np, cd.data(), ci.data());
            cdis = cd.data();
            cids = ci.data();
        }
        uint64_t nd = 0;
        std::vector<float> tab2(tsz), tab(tsz), dist;
        std::vector<uint64_t> c;
        c.reserve(4096);
        for (int64_t q = 0; q < n; q++)
            nd += scan_query(ix, s->x + (size_t)q * d_, cdis + (size_t)q * np, cids + (size_t)q * np, np,
                             s->id_limit ? s->id_limit[q] : INT64_MAX, k, tab2, tab, dist, c, s->d + (size_t)q * k,
                             s->l + (size_t)q * k);
        if (s->ndis)
            *s->ndis += nd;
        return 0;
    });
}

extern "C" int faiss_shim_coarse(const FaissIndex *idx, int64_t n, const float *x, int nprobe, float *cdis,
                                 int64_t *cids)
{
    const faiss::IndexIVFPQ *ix = scannable(idx);
    if (!ix)
        return 0;
    return guarded(nullptr, 0, [&]() {
        int np = probes(ix, nprobe);
        ix->quantizer->search(n, x, np, cdis, reinterpret_cast<faiss::Index::idx_t *>(cids));
        return np;
    });
}

namespace {

/* The nearest of the cand[0..nc) centroids to y in exact fvec_L2sqr
 * distances (ties to the lower list), and its distance */
faiss::Index::idx_t nearest_of(const float *cent, size_t d, const float *y, const faiss::Index::idx_t *cand, int nc,
                               float *best)
{
    faiss::Index::idx_t b = -1;
    float bd = INFINITY;
    for (int j = 0; j < nc; j++) {
        faiss::Index::idx_t c = cand[j];
        if (c < 0)
            continue;
        float dj = faiss::fvec_L2sqr(y, cent + (size_t)c * d, d);
        if (dj < bd || (dj == bd && c < b))
            b = c, bd = dj;
    }
    *best = bd;
    return b;
}

/* Whether the nearest centroid to y among a candidate set is y's nearest of
 * all. The set is the np nearest to x by FAISS's computed distances (x = y:
 * a search of y itself), dnp the largest of them, xn = ||x||^2, eps >=
 * ||y - x||. FAISS computes ||x||^2 + ||c||^2 - 2<x, c> in float, with an
 * error below eta (||x||^2 + ||c||^2), eta = 1e-4 (d = 256 products summed:
 * at most ~d 2^-24 = 1.5e-5 of ||x|| ||c||, and three roundings of the
 * sum). With ||c||^2 <= 2||x||^2 + 2D for the true distance D, a centroid
 * outside the set (computed distance >= dnp) has D >= lo = (dnp - 3 eta
 * ||x||^2) / (1 + 2 eta), so ||y - c|| >= sqrt(lo) - eps: if the best of the
 * set is below that, it is y's nearest (and the exact order decides among
 * the set). */
bool holds_nearest(float best, float dnp, float xn, float eps)
{
    const float eta = 1e-4f;
    float lo = (dnp - 3 * eta * xn) / (1 + 2 * eta);
    return lo > 0 && std::sqrt(best) < std::sqrt(lo) - eps;
}

/* Per key, its list: the nearest centroid in exact distances (nearest_of).
 * From the hint where it provably holds it, else from a search of the key
 * for 4 lists, else (never seen in practice) from all centroids. */
void assign_exact(const faiss::IndexIVF *ix, const float *cent, const faiss_shim_add_in *a,
                  std::vector<faiss::Index::idx_t> &lists)
{
    const size_t d = (size_t)ix->d, nlist = ix->nlist;
    const int64_t n = a->n;
    lists.assign((size_t)n, -1);
    std::vector<faiss::Index::idx_t> todo;
    for (int64_t i = 0; i < n; i++) {
        const float *y = a->keys + (size_t)i * d;
        if (!a->hint_x || a->hint_np <= 0) {
            todo.push_back(i);
            continue;
        }
        const float *x = a->hint_x + (size_t)i * d;
        const float *hd = a->hint_d + (size_t)i * a->hint_np;
        const faiss::Index::idx_t *hl = reinterpret_cast<const faiss::Index::idx_t *>(a->hint_l) + (size_t)i * a->hint_np;
        float best, dnp = -1;
        for (int j = 0; j < a->hint_np; j++)
            if (hl[j] >= 0)
                dnp = std::max(dnp, hd[j]);
        faiss::Index::idx_t b = nearest_of(cent, d, y, hl, a->hint_np, &best);
        float eps = std::sqrt(faiss::fvec_L2sqr(x, y, d)) * 1.001f;   /* rounded up past its own rounding */
        if (b >= 0 && ((size_t)a->hint_np >= nlist || holds_nearest(best, dnp, faiss::fvec_norm_L2sqr(x, d), eps)))
            lists[(size_t)i] = b;
        else
            todo.push_back(i);
    }
    if (todo.empty())
        return;
    const int w = (int)std::min<size_t>(4, nlist);
    std::vector<float> ys(todo.size() * d), dd(todo.size() * w);
    std::vector<faiss::Index::idx_t> ll(todo.size() * w), all(nlist);
    for (size_t t = 0; t < todo.size(); t++)
        std::memcpy(ys.data() + t * d, a->keys + (size_t)todo[t] * d, d * sizeof(float));
    ix->quantizer->search((faiss::Index::idx_t)todo.size(), ys.data(), w, dd.data(), ll.data());
    for (size_t c = 0; c < nlist; c++)
        all[c] = (faiss::Index::idx_t)c;
    for (size_t t = 0; t < todo.size(); t++) {
        const float *y = ys.data() + t * d;
        float best, dnp = -1;
        for (int j = 0; j < w; j++)
            if (ll[t * w + j] >= 0)
                dnp = std::max(dnp, dd[t * w + j]);
        faiss::Index::idx_t b = nearest_of(cent, d, y, ll.data() + t * w, w, &best);
        if (b < 0 || ((size_t)w < nlist && !holds_nearest(best, dnp, faiss::fvec_norm_L2sqr(y, d), 0.0f)))
            b = nearest_of(cent, d, y, all.data(), (int)nlist, &best);
        lists[(size_t)todo[t]] = b;
    }
}

} // namespace

extern "C" int faiss_shim_add(FaissIndex *idx, const faiss_shim_add_in *a, char *err, size_t errlen)
{
    faiss::IndexIVFPQ *ix = dynamic_cast<faiss::IndexIVFPQ *>(reinterpret_cast<faiss::Index *>(idx));
    const faiss::IndexFlat *fq = ix ? dynamic_cast<const faiss::IndexFlat *>(ix->quantizer) : nullptr;
    if (!ix || !fq || fq->metric_type != faiss::METRIC_L2 || !ix->is_trained || (size_t)fq->ntotal != ix->nlist)
        return 1;
    return guarded(err, errlen, [&]() {
        if (a->n <= 0)
            return 0;
        std::vector<faiss::Index::idx_t> lists;
        assign_exact(ix, fq->get_xb(), a, lists);
        ix->add_core(a->n, a->keys, nullptr, lists.data());
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


/* ---- compact storage: codes in, codes out ---------------------------------- */

namespace {

/* The IVFPQ index with a flat L2 quantizer whose codes faiss_shim_add
 * places, or null */
faiss::IndexIVFPQ *coded(const FaissIndex *idx)
{
    faiss::IndexIVFPQ *ix = dynamic_cast<faiss::IndexIVFPQ *>(reinterpret_cast<faiss::Index *>(const_cast<FaissIndex *>(idx)));
    const faiss::IndexFlat *fq = ix ? dynamic_cast<const faiss::IndexFlat *>(ix->quantizer) : nullptr;
    if (!ix || !fq || fq->metric_type != faiss::METRIC_L2 || !ix->is_trained || (size_t)fq->ntotal != ix->nlist)
        return nullptr;
    return ix;
}

} // namespace

extern "C" int faiss_shim_encode(const FaissIndex *idx, const faiss_shim_add_in *a, int64_t *lists, uint8_t *codes,
                                 char *err, size_t errlen)
{
    const faiss::IndexIVFPQ *ix = coded(idx);
    if (!ix)
        return 1;
    return guarded(err, errlen, [&]() {
        if (a->n <= 0)
            return 0;
        std::vector<faiss::Index::idx_t> l;
        assign_exact(ix, dynamic_cast<const faiss::IndexFlat *>(ix->quantizer)->get_xb(), a, l);
        /* the residual to the list's centroid, PQ-encoded: add_core_o's
         * arithmetic (compute_residual_n, then pq.compute_codes) */
        ix->encode_vectors(a->n, a->keys, l.data(), codes, false);
        for (int64_t i = 0; i < a->n; i++)
            lists[i] = l[(size_t)i];
        return 0;
    });
}

extern "C" int faiss_shim_add_codes(FaissIndex *idx, int64_t n, const int64_t *lists, const uint8_t *codes,
                                    char *err, size_t errlen)
{
    faiss::IndexIVFPQ *ix = coded(idx);
    if (!ix)
        return shim_error(err, errlen, "codes can only be added to a trained IVFPQ index with a flat quantizer");
    for (int64_t i = 0; i < n; i++)
        if (lists[i] < 0 || (size_t)lists[i] >= ix->nlist) {
            char m[128];
            std::snprintf(m, sizeof m, "pair %lld: list %lld outside the index's %zu", (long long)i,
                          (long long)lists[i], ix->nlist);
            return shim_error(err, errlen, m);
        }
    return guarded(err, errlen, [&]() {
        /* the ids FAISS's own add gives (ntotal on), in order */
        for (int64_t i = 0; i < n; i++)
            ix->invlists->add_entry((size_t)lists[i], ix->ntotal + i, codes + (size_t)i * ix->code_size);
        ix->ntotal += n;
        return 0;
    });
}

extern "C" size_t faiss_shim_code_size(const FaissIndex *idx, int64_t *nlist)
{
    const faiss::IndexIVFPQ *ix = coded(idx);
    if (nlist)
        *nlist = ix ? (int64_t)ix->nlist : 0;
    return ix ? ix->code_size : 0;
}

extern "C" int faiss_shim_trained_arrays(const FaissIndex *idx, faiss_shim_trained *t)
{
    const faiss::IndexIVFPQ *ix = coded(idx);
    if (!ix)
        return 1;
    t->coarse = dynamic_cast<const faiss::IndexFlat *>(ix->quantizer)->get_xb();
    t->ncoarse = ix->nlist * (size_t)ix->d;
    t->pq = ix->pq.centroids.data();
    t->npq = ix->pq.centroids.size();
    t->d = ix->d;
    t->M = (int)ix->pq.M;
    t->nbits = (int)ix->pq.nbits;
    return 0;
}

/* ---- sharing the precomputed residual table --------------------------------- */

extern "C" size_t faiss_shim_table_floats(const FaissIndex *idx)
{
    const faiss::IndexIVFPQ *ix = coded(idx);
    if (!ix || !ix->by_residual || ix->metric_type != faiss::METRIC_L2)
        return 0;
    return ix->nlist * ix->pq.M * ix->pq.ksub;
}

extern "C" float *faiss_shim_table_take(FaissIndex *idx, char *err, size_t errlen)
{
    faiss::IndexIVFPQ *ix = coded(idx);
    size_t want = faiss_shim_table_floats(idx);
    if (!ix || !want)
        return nullptr;
    float *p = nullptr;
    guarded(err, errlen, [&]() {
        if (ix->precomputed_table.size() != want || ix->use_precomputed_table != 1)
            ix->precompute_table();
        if (ix->precomputed_table.size() != want || ix->use_precomputed_table != 1)
            return 0;   /* FAISS keeps none (over precomputed_table_max_bytes): nothing to share */
        p = ix->precomputed_table.tab.ptr;   /* posix_memalign'ed: free() releases it */
        ix->precomputed_table.tab.ptr = nullptr;
        ix->precomputed_table.tab.numel = 0;
        ix->precomputed_table.numel = 0;
        ix->use_precomputed_table = 0;
        return 0;
    });
    return p;
}

extern "C" void faiss_shim_table_lend(FaissIndex *idx, float *table)
{
    faiss::IndexIVFPQ *ix = coded(idx);
    if (!ix)
        return;
    ix->precomputed_table.resize(0);   /* its own, if it made one */
    /* the table's two sizes: its allocation's (a multiple of ksub = 256
     * floats, so FAISS's rounding to 8 leaves it) and its elements' */
    ix->precomputed_table.tab.ptr = table;
    ix->precomputed_table.tab.numel = faiss_shim_table_floats(idx);
    ix->precomputed_table.numel = faiss_shim_table_floats(idx);
    ix->use_precomputed_table = 1;
}

extern "C" void faiss_shim_table_unlend(FaissIndex *idx)
{
    faiss::IndexIVFPQ *ix = coded(idx);
    if (!ix)
        return;
    ix->precomputed_table.tab.ptr = nullptr;
    ix->precomputed_table.tab.numel = 0;
    ix->precomputed_table.numel = 0;
    ix->use_precomputed_table = 0;
}
