/* faiss_shim.cpp -- FAISS C++ calls the 1.7.3 C API lacks (faiss_shim.h). */
#include "faiss_shim.h"

extern "C" {
#include "vmath.h"
}

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include <cblas.h>
#include <immintrin.h>

#include <faiss/Index.h>
#include <faiss/IndexFlat.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFFastScan.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/VectorTransform.h>
#include <faiss/invlists/InvertedLists.h>
#include <faiss/utils/distances.h>
#include <faiss/utils/utils.h>

/* FAISS's exhaustive L2 search (an IndexFlat's search of 20 queries or
 * more: the k-means' assignment, the coarse search of a training's encoding
 * or a large upload) allocates one block of bs_x x bs_y inner products a
 * call, 4,096 x 1,024 floats = 16 MB by default, mapped and unmapped each
 * time: the largest transient of a training (heaptrack, docs/memory.md).
 * 256 query rows a block make it 1 MB; a block's GEMM (256 x 1,024 x H) still
 * runs at the kernel's rate. (A key's list stays the exact nearest
 * whatever the block: assign_exact checks FAISS's candidates with its own
 * distances; test_coarse.) */
static const struct blas_blocks {
    blas_blocks() { faiss::distance_compute_blas_query_bs = 256; }
} blas_blocks_set;

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

/* The SIMD level the kernels run at (vm_isa's): 2 AVX-512, 1 AVX2, 0 plain */
inline int shim_level()
{
    const char *isa = vm_isa();
    return std::strcmp(isa, "avx512") == 0 ? 2 : std::strcmp(isa, "avx2") == 0;
}

/* The index kinds faiss_shim_ivfpq_search reads; any other goes to FAISS. */
const faiss::IndexIVFPQ *scannable(const FaissIndex *idx)
{
    const faiss::IndexIVFPQ *pq = dynamic_cast<const faiss::IndexIVFPQ *>(reinterpret_cast<const faiss::Index *>(idx));
    if (!pq || !pq->by_residual || pq->metric_type != faiss::METRIC_L2 || pq->use_precomputed_table != 1 ||
        (pq->pq.nbits != 8 && pq->pq.nbits != 4) || pq->polysemous_ht != 0 || !pq->invlists ||
        pq->precomputed_table.size() != pq->nlist * pq->pq.M * pq->pq.ksub || pq->ntotal >= ((faiss::Index::idx_t)1 << 32))
        return nullptr;
    return pq;
}

/* The PQ distances of a list's n codes (code_size bytes, M used) from its
 * table t [M * ksub]: out[m] = sum_s t[s * ksub + code_m[s]], each sum
 * in FAISS's order, s = 0..M-1, in float: the same bits as FAISS's scanner.
 * Eight codes at a time (pq8_block) where M is a multiple of 8 and ksub is
 * 256, the rest one by one. */
inline float pq_one(const float *t, size_t M, size_t ksub, const uint8_t *c)
{
    float a = 0;
    for (size_t s = 0; s < M; s++)
        a += t[s * ksub + c[s]];
    return a;
}

/* Eight codes c, c + cs, ... (M a multiple of 8, ksub 256): eight
 * independent sums, so that the adds' latency (3-4 cycles) overlaps, and
 * each code's bytes read eight to a load. The empty asm keeps each sum in a
 * register of its own: without it GCC packed the sums into vectors with a
 * scalar insert a look-up and stack spills (the scoring pass's hottest loop
 * at main's 98044d6). Measured alone (1,339 codes a query of random 32-byte
 * codes, 32 KB table): 5.6 ns a code against 7.6 for the four-sum loop GCC
 * vectorised. */
inline void pq8_block(const float *t, size_t M, const uint8_t *c, size_t cs, float *out)
{
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t s = 0; s < M; s += 8) {
        uint64_t w0, w1, w2, w3, w4, w5, w6, w7;
        std::memcpy(&w0, c + s, 8), std::memcpy(&w1, c + cs + s, 8);
        std::memcpy(&w2, c + 2 * cs + s, 8), std::memcpy(&w3, c + 3 * cs + s, 8);
        std::memcpy(&w4, c + 4 * cs + s, 8), std::memcpy(&w5, c + 5 * cs + s, 8);
        std::memcpy(&w6, c + 6 * cs + s, 8), std::memcpy(&w7, c + 7 * cs + s, 8);
        __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7));
        const float *ts = t + s * 256;
        for (int b = 0; b < 8; b++) {   /* little-endian: byte b of w is code byte s + b */
            const float *tb = ts + b * 256;
            const int sh = 8 * b;
            a0 += tb[(w0 >> sh) & 255], a1 += tb[(w1 >> sh) & 255];
            a2 += tb[(w2 >> sh) & 255], a3 += tb[(w3 >> sh) & 255];
            a4 += tb[(w4 >> sh) & 255], a5 += tb[(w5 >> sh) & 255];
            a6 += tb[(w6 >> sh) & 255], a7 += tb[(w7 >> sh) & 255];
        }
    }
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3, out[4] = a4, out[5] = a5, out[6] = a6, out[7] = a7;
}

/* ---- 4-bit codes (PQ<M>x4: ksub 16, two sub-quantizers a byte, FAISS's
 * packing: sub-quantizer 2b in byte b's low nibble, 2b + 1 in its high) ----
 * A list's table is then M x 16 floats (2 KB at PQ32x4), in L1 for the whole
 * list, and 16 entries fit one or two vector registers: the look-ups become
 * register permutes, lanes = codes, each lane adding its code's entries in
 * the order s = 0..M-1 -- the same float sums, to the bit, as the plain
 * loop and FAISS's scanner (tests/test_scan.c compares them bitwise at
 * every level). Where the 8-bit scan's look-ups are loads from a 16-32 KB
 * table (12-13 ns a code in the growth curve's 1.7M read), these are a
 * permute or two a sub-quantizer for 8 or 16 codes at once. */
inline float pq4_one(const float *t, size_t M, const uint8_t *c)
{
    float a = 0;
    for (size_t s = 0; s < M; s++)
        a += t[s * 16 + ((c[s >> 1] >> ((s & 1) * 4)) & 15)];
    return a;
}

/* Eight codes c, c + cs, ... in plain code: eight independent sums (the
 * adds' latency overlapped, as pq8_block's; one sum a code took 74 ns a
 * code of PQ64x4, each add waiting on the one before), the empty asm
 * keeping each in a register of its own */
inline void pq4_block8_plain(const float *t, size_t M, const uint8_t *c, size_t cs, float *out)
{
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t s = 0; s < M; s++) {
        const float *ts = t + s * 16;
        const size_t b = s >> 1;
        const int sh = (int)(s & 1) * 4;
        __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7));
        a0 += ts[(c[b] >> sh) & 15], a1 += ts[(c[cs + b] >> sh) & 15];
        a2 += ts[(c[2 * cs + b] >> sh) & 15], a3 += ts[(c[3 * cs + b] >> sh) & 15];
        a4 += ts[(c[4 * cs + b] >> sh) & 15], a5 += ts[(c[5 * cs + b] >> sh) & 15];
        a6 += ts[(c[6 * cs + b] >> sh) & 15], a7 += ts[(c[7 * cs + b] >> sh) & 15];
    }
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3, out[4] = a4, out[5] = a5, out[6] = a6, out[7] = a7;
}

/* Eight codes of cs bytes (cs a multiple of 16: chunks of 32
 * sub-quantizers) as eight lanes: the codes' 4-byte words transposed
 * (word w of each code, lanes in the order 0, 2, 4, 6, 1, 3, 5, 7: the
 * 256-bit unpacks work within 128-bit halves); nibble k of word w of chunk
 * ch is sub-quantizer 32 ch + 8 w + k, its 16 entries read by two 8-lane
 * permutes chosen between by the nibble's bit 3 (moved to the sign bit for
 * blendv). */
struct pq4_words8 {
    __m256i w0, w1, w2, w3;
};

__attribute__((target("avx2"), always_inline)) inline pq4_words8 pq4_load8(const uint8_t *c, size_t cs)
{
    __m256i a0 = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)c), _mm_loadu_si128((const __m128i *)(c + cs)));
    __m256i a1 = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(c + 2 * cs)),
                                   _mm_loadu_si128((const __m128i *)(c + 3 * cs)));
    __m256i a2 = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(c + 4 * cs)),
                                   _mm_loadu_si128((const __m128i *)(c + 5 * cs)));
    __m256i a3 = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(c + 6 * cs)),
                                   _mm_loadu_si128((const __m128i *)(c + 7 * cs)));
    const __m256i t0 = _mm256_unpacklo_epi32(a0, a1), t1 = _mm256_unpackhi_epi32(a0, a1);
    const __m256i t2 = _mm256_unpacklo_epi32(a2, a3), t3 = _mm256_unpackhi_epi32(a2, a3);
    return {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3)};
}

/* entry (nibble k of each lane of wv) of the 16 floats lo8, hi8 */
__attribute__((target("avx2"), always_inline)) inline __m256 pq4_look8(__m256i wv, int k, __m256 lo8, __m256 hi8)
{
    const __m256i idx = _mm256_srli_epi32(wv, 4 * k);       /* the permutes read bits 0-2 */
    const __m256i hi = _mm256_slli_epi32(wv, 28 - 4 * k);   /* bit 3 to the sign */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo8, idx), _mm256_permutevar8x32_ps(hi8, idx),
                            _mm256_castsi256_ps(hi));
}

__attribute__((target("avx2"), always_inline)) inline __m256i pq4_w(const pq4_words8 &a, int w)
{
    return w == 0 ? a.w0 : w == 1 ? a.w1 : w == 2 ? a.w2 : a.w3;
}

__attribute__((target("avx2"))) void pq4_one8_avx2(const float *t, size_t cs, const uint8_t *c, float *out)
{
    __m256 s0 = _mm256_setzero_ps();
    for (size_t ch = 0; ch < cs; ch += 16) {
        const pq4_words8 a = pq4_load8(c + ch, cs);
        const float *tc = t + ch * 2 * 16;   /* sub-quantizer 2 ch on */
        for (int w = 0; w < 4; w++)
            for (int k = 0; k < 8; k++) {
                const float *ts = tc + (size_t)(8 * w + k) * 16;
                s0 = _mm256_add_ps(s0, pq4_look8(pq4_w(a, w), k, _mm256_loadu_ps(ts), _mm256_loadu_ps(ts + 8)));
            }
    }
    /* lanes held codes 0, 2, 4, 6, 1, 3, 5, 7 */
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(s0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* Two blocks of eight (c, c + 8 cs), their sums interleaved (as the
 * AVX-512 kernel's, below) */
__attribute__((target("avx2"))) void pq4_two8_avx2(const float *t, size_t cs, const uint8_t *c, float *out)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (size_t ch = 0; ch < cs; ch += 16) {
        const pq4_words8 a = pq4_load8(c + ch, cs), b = pq4_load8(c + 8 * cs + ch, cs);
        const float *tc = t + ch * 2 * 16;
        for (int w = 0; w < 4; w++) {
            const __m256i u = pq4_w(a, w), v = pq4_w(b, w);
            for (int k = 0; k < 8; k++) {
                const float *ts = tc + (size_t)(8 * w + k) * 16;
                const __m256 lo8 = _mm256_loadu_ps(ts), hi8 = _mm256_loadu_ps(ts + 8);
                s0 = _mm256_add_ps(s0, pq4_look8(u, k, lo8, hi8));
                s1 = _mm256_add_ps(s1, pq4_look8(v, k, lo8, hi8));
            }
        }
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(s0, order));
    _mm256_storeu_ps(out + 8, _mm256_permutevar8x32_ps(s1, order));
}

/* (GCC 12 warns of the undefined pass-through operand its headers give
 * _mm512_shuffle_i64x2, _mm512_srli_epi32 and the casts: unread, all lanes
 * are written) */
#if defined(__GNUC__) && !defined(__clang__)   /* (clang has no such warning, and -Werror's its name) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* The 16 bytes at c, c + cs, c + 2 cs, c + 3 cs (a chunk of four codes) */
__attribute__((target("avx512f"), always_inline)) inline __m512i pq4_load4(const uint8_t *c, size_t cs)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)c));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + cs)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + 2 * cs)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + 3 * cs)), 3);
}

/* Word sel's w (0-3) of sixteen codes' chunks, as sixteen lanes, from
 * pq4_load4's a0 (codes 0-3) .. a3 (12-15): two two-source permutes
 * (codes 0-7, 8-15) joined */
__attribute__((target("avx512f"), always_inline)) inline __m512i pq4_word(__m512i a0, __m512i a1, __m512i a2,
                                                                         __m512i a3, __m512i sel)
{
    return _mm512_shuffle_i64x2(_mm512_permutex2var_epi32(a0, sel, a1), _mm512_permutex2var_epi32(a2, sel, a3), 0x44);
}

/* Four blocks of sixteen codes (c + 16 b cs, b = 0..3) as sixteen lanes
 * each, their four sums interleaved (as above; named registers: as arrays
 * GCC kept the sums on the stack, a store and a load in every add's chain:
 * 4.3 ns a code of PQ64x4 in cache against 2.0 so) */
__attribute__((target("avx512f"))) void pq4_four16_avx512(const float *t, size_t cs, const uint8_t *c, float *out)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    const __m512i lane4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    const uint8_t *c1 = c + 16 * cs, *c2 = c + 32 * cs, *c3 = c + 48 * cs;
    for (size_t ch = 0; ch < cs; ch += 16) {
        const __m512i a0 = pq4_load4(c + ch, cs), a1 = pq4_load4(c + 4 * cs + ch, cs);
        const __m512i a2 = pq4_load4(c + 8 * cs + ch, cs), a3 = pq4_load4(c + 12 * cs + ch, cs);
        const __m512i b0 = pq4_load4(c1 + ch, cs), b1 = pq4_load4(c1 + 4 * cs + ch, cs);
        const __m512i b2 = pq4_load4(c1 + 8 * cs + ch, cs), b3 = pq4_load4(c1 + 12 * cs + ch, cs);
        const __m512i d0 = pq4_load4(c2 + ch, cs), d1 = pq4_load4(c2 + 4 * cs + ch, cs);
        const __m512i d2 = pq4_load4(c2 + 8 * cs + ch, cs), d3 = pq4_load4(c2 + 12 * cs + ch, cs);
        const __m512i e0 = pq4_load4(c3 + ch, cs), e1 = pq4_load4(c3 + 4 * cs + ch, cs);
        const __m512i e2 = pq4_load4(c3 + 8 * cs + ch, cs), e3 = pq4_load4(c3 + 12 * cs + ch, cs);
        const float *tc = t + ch * 2 * 16;
        for (int w = 0; w < 4; w++) {
            const __m512i sel = _mm512_add_epi32(lane4, _mm512_set1_epi32(w));
            const __m512i u0 = pq4_word(a0, a1, a2, a3, sel), u1 = pq4_word(b0, b1, b2, b3, sel);
            const __m512i u2 = pq4_word(d0, d1, d2, d3, sel), u3 = pq4_word(e0, e1, e2, e3, sel);
            for (int k = 0; k < 8; k++) {
                const __m512 ts = _mm512_loadu_ps(tc + (size_t)(8 * w + k) * 16);
                s0 = _mm512_add_ps(s0, _mm512_permutexvar_ps(_mm512_srli_epi32(u0, 4 * k), ts));
                s1 = _mm512_add_ps(s1, _mm512_permutexvar_ps(_mm512_srli_epi32(u1, 4 * k), ts));
                s2 = _mm512_add_ps(s2, _mm512_permutexvar_ps(_mm512_srli_epi32(u2, 4 * k), ts));
                s3 = _mm512_add_ps(s3, _mm512_permutexvar_ps(_mm512_srli_epi32(u3, 4 * k), ts));
            }
        }
    }
    _mm512_storeu_ps(out, s0), _mm512_storeu_ps(out + 16, s1), _mm512_storeu_ps(out + 32, s2);
    _mm512_storeu_ps(out + 48, s3);
}

/* One block of sixteen codes */
__attribute__((target("avx512f"))) void pq4_one16_avx512(const float *t, size_t cs, const uint8_t *c, float *out)
{
    __m512 s0 = _mm512_setzero_ps();
    const __m512i lane4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    for (size_t ch = 0; ch < cs; ch += 16) {
        const __m512i a0 = pq4_load4(c + ch, cs), a1 = pq4_load4(c + 4 * cs + ch, cs);
        const __m512i a2 = pq4_load4(c + 8 * cs + ch, cs), a3 = pq4_load4(c + 12 * cs + ch, cs);
        const float *tc = t + ch * 2 * 16;
        for (int w = 0; w < 4; w++) {
            const __m512i u = pq4_word(a0, a1, a2, a3, _mm512_add_epi32(lane4, _mm512_set1_epi32(w)));
            for (int k = 0; k < 8; k++)
                s0 = _mm512_add_ps(s0, _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4 * k),
                                                             _mm512_loadu_ps(tc + (size_t)(8 * w + k) * 16)));
        }
    }
    _mm512_storeu_ps(out, s0);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

const size_t PQ4_PAD = 4096;   /* bytes of pq4_lists's padded block */

/* The kernels of a level: blocks() does NB blocks of L codes, one() one
 * block (static members: direct calls; UBSan's check of calls through
 * pointers needs its C++ runtime, which the C link lacks) */
struct pq4_avx512 {
    static const int L = 16, NB = 4;
    static void blocks(const float *t, size_t cs, const uint8_t *c, float *o) { pq4_four16_avx512(t, cs, c, o); }
    static void one(const float *t, size_t cs, const uint8_t *c, float *o) { pq4_one16_avx512(t, cs, c, o); }
};
struct pq4_avx2 {
    static const int L = 8, NB = 2;
    static void blocks(const float *t, size_t cs, const uint8_t *c, float *o) { pq4_two8_avx2(t, cs, c, o); }
    static void one(const float *t, size_t cs, const uint8_t *c, float *o) { pq4_one8_avx2(t, cs, c, o); }
};

/* A level's kernels over n codes: blocks of NB x L codes, then single
 * blocks, then the last < L codes copied into a zeroed block on the stack
 * (the padding's lanes computed and dropped; codes of over PQ4_PAD / L
 * bytes, 256 at L = 16, one by one) */
template <class K>
void pq4_lists(const faiss_shim_pq_list &l, float *out)
{
    const size_t cs = l.code_size, L = K::L, NB = K::NB;
    size_t m = 0;
    for (; m + NB * L <= l.n; m += NB * L)
        K::blocks(l.table, cs, l.codes + m * cs, out + m);
    for (; m + L <= l.n; m += L)
        K::one(l.table, cs, l.codes + m * cs, out + m);
    if (m < l.n && L * cs <= PQ4_PAD) {
        alignas(64) uint8_t pad[PQ4_PAD];
        float o[K::L];
        std::memset(pad, 0, L * cs);
        std::memcpy(pad, l.codes + m * cs, (l.n - m) * cs);
        K::one(l.table, cs, pad, o);
        std::memcpy(out + m, o, (l.n - m) * sizeof(float));
        m = l.n;
    }
    for (; m < l.n; m++)
        out[m] = pq4_one(l.table, l.M, l.codes + m * cs);
}

void list_dists4(const faiss_shim_pq_list &l, float *out)
{
    const size_t M = l.M, cs = l.code_size;
    if (cs % 16 == 0 && M == 2 * cs) {
        const int lv = shim_level();
        if (lv == 2)
            return pq4_lists<pq4_avx512>(l, out);
        if (lv == 1)
            return pq4_lists<pq4_avx2>(l, out);
    }
    size_t m = 0;
    for (; m + 8 <= l.n; m += 8)
        pq4_block8_plain(l.table, M, l.codes + m * cs, cs, out + m);
    for (; m < l.n; m++)
        out[m] = pq4_one(l.table, M, l.codes + m * cs);
}

void list_dists(const faiss_shim_pq_list &l, float *out)
{
    if (l.nbits == 4) {
        list_dists4(l, out);
        return;
    }
    const size_t M = l.M, ksub = l.ksub, cs = l.code_size;
    size_t m = 0;
    if (M % 8 == 0 && ksub == 256 && cs >= M)
        for (; m + 8 <= l.n; m += 8)
            pq8_block(l.table, M, l.codes + m * cs, cs, out + m);
    for (; m < l.n; m++)
        out[m] = pq_one(l.table, M, ksub, l.codes + m * cs);
}

/* The distance bits of a candidate's key (cand_key): unsigned order is the
 * distance's order */
inline uint32_t key_dist(uint64_t key)
{
    return (uint32_t)(key >> 32);
}

/* v [0, n) sorted ascending as 64-bit keys (distance, then id): a stable
 * LSD radix sort by the distance's four bytes (the histograms of all four in
 * one pass; a byte all keys share skipped: the sign and most of the
 * exponent), then each run of equal distances put in id order (insertion:
 * ties are rare). tmp [n] its scratch. Three passes where sorting the whole
 * 64-bit key (the id's bytes too) took six or seven. */
void sort_keys(uint64_t *v, uint64_t *tmp, size_t n)
{
    if (n < 2)
        return;
    uint32_t cnt[4][256];
    std::memset(cnt, 0, sizeof cnt);
    for (size_t i = 0; i < n; i++) {
        uint32_t d = key_dist(v[i]);
        cnt[0][d & 255]++, cnt[1][(d >> 8) & 255]++, cnt[2][(d >> 16) & 255]++, cnt[3][d >> 24]++;
    }
    uint64_t *a = v, *b = tmp;
    for (int p = 0; p < 4; p++) {
        const int shift = 32 + 8 * p;
        if (cnt[p][(v[0] >> shift) & 255] == n)
            continue;
        uint32_t sum = 0;
        for (int j = 0; j < 256; j++) {
            uint32_t x = cnt[p][j];
            cnt[p][j] = sum, sum += x;
        }
        for (size_t i = 0; i < n; i++)
            b[cnt[p][(a[i] >> shift) & 255]++] = a[i];
        std::swap(a, b);
    }
    if (a != v)
        std::memcpy(v, a, n * sizeof *v);
    for (size_t i = 1; i < n; i++) {
        const uint64_t x = v[i];
        size_t j = i;
        for (; j > 0 && key_dist(v[j - 1]) == key_dist(x) && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
}

/* A selection's arrays: the n candidates c [n] (keys; n >= 1), lo/hi the
 * smallest and largest distance bits among them (or a range holding
 * them), tmp [n] scratch, out [min(n, k)] the result */
struct topk_in {
    uint64_t *c, *tmp, *out;
    size_t n, k;
    uint32_t lo, hi;
};

/* The k smallest keys of c [0, n) (n > k), unordered, into out [k]: a radix
 * select on the distance bits, 8 at a time from the highest bit where the
 * candidates' distances differ (lo, hi: their smallest and largest). Each
 * level counts the digit over the keys still undecided, takes those below
 * the bucket that holds the k-th, and keeps that bucket's keys for the next
 * level; keys equal in all distance bits are decided by id (a sort of the
 * last bucket). c and tmp [n] are the levels' two buffers (both clobbered).
 * Against nth_element over the 64-bit keys, then the sort: 2.4x faster on
 * 1,339 candidates (k 512). */
void select_keys(const topk_in &a)
{
    uint64_t *S = a.c, *T = a.tmp, *out = a.out;
    size_t ns = a.n, got = 0, r = a.k;
    int top = a.lo == a.hi ? -1 : 31 - __builtin_clz(a.lo ^ a.hi);   /* bits above top: all the same */
    while (top >= 0) {
        const int sh = top >= 7 ? top - 7 : 0;
        uint32_t cnt[256] = {0};
        for (size_t i = 0; i < ns; i++)
            cnt[(key_dist(S[i]) >> sh) & 255]++;
        size_t below = 0;
        uint32_t B = 0;
        while (below + cnt[B] < r)
            below += cnt[B++];
        size_t nt = 0;
        for (size_t i = 0; i < ns; i++) {   /* branch-free: every key goes to one side or none */
            const uint32_t dg = (key_dist(S[i]) >> sh) & 255;
            out[got] = S[i], got += dg < B;
            T[nt] = S[i], nt += dg == B;
        }
        r -= below;
        std::swap(S, T);
        ns = nt;
        if (ns == r)
            break;
        top = sh - 1;
    }
    if (ns > r)
        std::sort(S, S + ns);   /* equal distances: the smallest ids */
    std::memcpy(out + got, S, r * sizeof *out);
}

/* The k best of a.c, ascending, into a.out (c is clobbered). Returns how
 * many: min(n, k). */
size_t top_keys(const topk_in &a)
{
    if (a.n <= a.k) {
        std::memcpy(a.out, a.c, a.n * sizeof *a.out);
        sort_keys(a.out, a.tmp, a.n);
        return a.n;
    }
    select_keys(a);
    sort_keys(a.out, a.tmp, a.k);
    return a.k;
}

/* Lists whose tables are made together and then scanned: residual_tables'
 * group (four lists to a pass over a sub-quantizer's codebook). Made for
 * all np lists first, the tables (32 KB a list at PQ32: 512 KB at nprobe
 * 16) had left L2 by the time their lists were scanned; four at a time,
 * 128 KB, they are scanned while in L2, and a thread holds four tables
 * rather than np. The same tables and the same scan order: the same bits.
 * (Measured on the growth curve's 1.7M read with the 8-bit code, nprobe
 * 16: 1-2% less CPU, within the noise. Groups of two: 3-9% slower, the
 * codebooks read twice as often.) */
const int TABLE_GROUP = 4;

/* The scan's scratch, one a thread, kept between calls (a 1M-state
 * search allocated and faulted in its candidate arrays each call), and what
 * it reads: the index and, when the coarse searcher is there, its
 * transposed codebooks (the tables then come from the residual,
 * residual_tables: TABLE_GROUP lists' at a time into tab [TABLE_GROUP, M,
 * ksub]; cur the table of the list being scanned). c [nc] a query's
 * candidates so far, lo/hi the range of their distance bits; tmp [nc] and
 * best [k] the selection's. */
struct scan_ctx {
    const faiss::IndexIVFPQ *ix;
    const faiss::ArrayInvertedLists *al;   /* ix's lists when they are arrays (prefetch_list), else null */
    const faiss::Index::idx_t *cids_end;   /* the end of the search's lists, all its queries' (the look-ahead's) */
    const faiss_shim_cq *cq;
    std::vector<float> tab2, tab, dist;
    std::vector<uint64_t> c, tmp, best;
    size_t nc;
    uint32_t lo, hi;
    /* the k-th best key so far once the candidates were cut to the k best
     * (cut_keys), UINT64_MAX before: a key above it cannot be among the
     * query's k best, k better ones being already held */
    uint64_t bar;
    const float *cur = nullptr;
    /* scan_trim's: the most bytes a query needed in this window of
     * SCAN_TRIM_WINDOW queries, and the queries so far */
    size_t window_need = 0, window_queries = 0;
};

/* A thread keeps its scan_ctx between searches (its vectors sized to the
 * largest query seen: allocated afresh each search, a query's candidates
 * were mapped and faulted in again). Kept for ever, they ratcheted: a
 * worker that once searched a large namespace at a high nprobe held that
 * query's megabytes after the namespace was gone (the endurance's replica:
 * +1.5 MB in 15 minutes of its heap profile, the largest growth besides
 * the namespaces'). So a window of SCAN_TRIM_WINDOW queries that all
 * needed less than a quarter of what the vectors hold, and more than
 * SCAN_TRIM_KEEP held, gives it back. */
const size_t SCAN_TRIM_WINDOW = 256;
const size_t SCAN_TRIM_KEEP = 256 * 1024;

size_t scan_bytes(const scan_ctx &sc)
{
    return (sc.tab2.capacity() + sc.tab.capacity() + sc.dist.capacity()) * sizeof(float) +
           (sc.c.capacity() + sc.tmp.capacity() + sc.best.capacity()) * sizeof(uint64_t);
}

/* One query's need: its tables (np of them with our searcher), its
 * largest list's distances, its nc candidates twice and its k best */
void scan_need(scan_ctx &sc, int np, size_t largest, size_t k)
{
    const size_t tsz = sc.ix->pq.M * sc.ix->pq.ksub;
    const size_t need = ((sc.cq ? (size_t)std::min(np, TABLE_GROUP) * tsz : 2 * tsz) + largest) * sizeof(float) +
                        (2 * sc.nc + std::min(sc.nc, k)) * sizeof(uint64_t);
    sc.window_need = std::max(sc.window_need, need);
}

void scan_trim(scan_ctx &sc, size_t queries)
{
    if ((sc.window_queries += queries) < SCAN_TRIM_WINDOW)
        return;
    const size_t held = scan_bytes(sc);
    if (held > SCAN_TRIM_KEEP && held > 4 * sc.window_need) {
        std::vector<float>().swap(sc.tab2), std::vector<float>().swap(sc.tab), std::vector<float>().swap(sc.dist);
        std::vector<uint64_t>().swap(sc.c), std::vector<uint64_t>().swap(sc.tmp);
        std::vector<uint64_t>().swap(sc.best);
    }
    sc.window_need = 0, sc.window_queries = 0;
}

/* One query's inputs and outputs: its np lists (cids, coarse distances
 * cdis), ids < limit accepted, its k best into d/l */
struct scan_row {
    const float *x, *cdis;
    const faiss::Index::idx_t *cids;
    int np;
    int64_t limit, k;
    float *d;
    int64_t *l;
};

void residual_tables(const faiss_shim_cq *cq, const float *x, const faiss::Index::idx_t *keys, int np, float *tab);
void prefetch_centroids(const faiss_shim_cq *cq, const faiss::Index::idx_t *keys, int n);

/* The query's share of its tables, once a query: FAISS's inner-product
 * table into tab2 (without our searcher; with it, group_tables makes the
 * tables a group of lists at a time) */
void query_tables(scan_ctx &sc, const scan_row &q)
{
    if (!sc.cq)
        sc.ix->pq.compute_inner_prod_table(q.x, sc.tab2.data());
}

/* With our searcher, the tables ||r_m - q_m||^2 of the residuals r = x - c
 * of lists j0 .. j0 + TABLE_GROUP - 1 (those there are) into sc.tab
 * [min(TABLE_GROUP, np), M, ksub] (what scan_need counts) */
void group_tables(scan_ctx &sc, const scan_row &q, int j0)
{
    const size_t tsz = sc.ix->pq.M * sc.ix->pq.ksub, want = (size_t)std::min(TABLE_GROUP, q.np) * tsz;
    if (sc.tab.size() < want)
        sc.tab.resize(want);
    residual_tables(sc.cq, q.x, q.cids + j0, std::min(TABLE_GROUP, q.np - j0), sc.tab.data());
    if (j0 + TABLE_GROUP < q.np)   /* the next group's centroids (1 KB each at H = 256), read by its residuals */
        prefetch_centroids(sc.cq, q.cids + j0 + TABLE_GROUP, std::min(TABLE_GROUP, q.np - j0 - TABLE_GROUP));
}

/* The list's table (sc.cur), and the distance every code of the list adds
 * it to: FAISS's precompute_list_tables_L2 (use_precomputed_table == 1:
 * T_c - 2 <x_m, q_m>, the coarse distance added), or, with our searcher,
 * the residual's from group_tables (0 added) */
float list_table(scan_ctx &sc, const scan_row &q, int j)
{
    const faiss::IndexIVFPQ *ix = sc.ix;
    const size_t tsz = ix->pq.M * ix->pq.ksub;
    if (sc.cq) {
        sc.cur = sc.tab.data() + (size_t)(j % TABLE_GROUP) * tsz;
        return 0.0f;
    }
    faiss::fvec_madd(tsz, ix->precomputed_table.data() + (size_t)q.cids[j] * tsz, -2.0f, sc.tab2.data(),
                     sc.tab.data());
    sc.cur = sc.tab.data();
    return q.cdis[j];
}

/* A run of list_keys: the range of the distance bits so far, the ids
 * >= limit seen, and the codes done */
struct key_run {
    uint32_t lo, hi;
    size_t rejected, m;
};

/* list_keys's codes four at a time with SSE4.2 (the default build's
 * baseline, x86-64-v2; checked at run time for other builds): the same
 * float sums and bits as cand_key. Returns the run after the last full
 * group of four. */
__attribute__((target("sse4.2"))) key_run keys_sse42(const scan_ctx &sc, const scan_row &q, float dis0,
                                                     const faiss::Index::idx_t *ip, size_t ls)
{
    uint64_t *c = const_cast<uint64_t *>(sc.c.data()) + sc.nc;
    const float *dist = sc.dist.data();
    const __m128 v0 = _mm_set1_ps(dis0);
    /* id >= limit as id > limit - 1 (ids are >= 0: a limit <= 0 drops all) */
    const __m128i sign = _mm_set1_epi32((int)0x80000000u), last = _mm_set1_epi64x(q.limit > 0 ? q.limit - 1 : -1);
    __m128i vlo = _mm_set1_epi32((int)sc.lo), vhi = _mm_set1_epi32((int)sc.hi), rej = _mm_setzero_si128();
    size_t m = 0;
    for (; m + 4 <= ls; m += 4) {
        __m128i b = _mm_castps_si128(_mm_add_ps(v0, _mm_loadu_ps(dist + m)));
        b = _mm_xor_si128(b, _mm_or_si128(_mm_srai_epi32(b, 31), sign));   /* cand_key's flip */
        vlo = _mm_min_epu32(vlo, b), vhi = _mm_max_epu32(vhi, b);
        const __m128i i01 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(ip + m));
        const __m128i i23 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(ip + m + 2));
        rej = _mm_sub_epi64(rej, _mm_cmpgt_epi64(i01, last));
        rej = _mm_sub_epi64(rej, _mm_cmpgt_epi64(i23, last));
        const __m128i id = _mm_castps_si128(
            _mm_shuffle_ps(_mm_castsi128_ps(i01), _mm_castsi128_ps(i23), _MM_SHUFFLE(2, 0, 2, 0)));   /* low halves */
        _mm_storeu_si128(reinterpret_cast<__m128i *>(c + m), _mm_unpacklo_epi32(id, b));       /* id | b << 32 */
        _mm_storeu_si128(reinterpret_cast<__m128i *>(c + m + 2), _mm_unpackhi_epi32(id, b));
    }
    uint32_t lo[4], hi[4];
    uint64_t r[2];
    _mm_storeu_si128(reinterpret_cast<__m128i *>(lo), vlo), _mm_storeu_si128(reinterpret_cast<__m128i *>(hi), vhi);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(r), rej);
    return {std::min({lo[0], lo[1], lo[2], lo[3]}), std::max({hi[0], hi[1], hi[2], hi[3]}), (size_t)(r[0] + r[1]), m};
}

/* The keys (cand_key) of a list's ls scanned distances sc.dist (plus dis0)
 * and ids ip appended to sc.c, those of ids >= limit dropped; sc.lo/hi
 * widened to every scanned distance (a range holding the accepted ones is
 * all select_keys needs). Four at a time (keys_sse42); the causal filter's
 * drops, rare (a block's own newest pairs), then by a scalar pass. */
void list_keys(scan_ctx &sc, const scan_row &q, float dis0, const faiss::Index::idx_t *ip, size_t ls)
{
    static const bool sse42 = __builtin_cpu_supports("sse4.2");
    key_run kr = sse42 ? keys_sse42(sc, q, dis0, ip, ls) : key_run{sc.lo, sc.hi, 0, 0};
    uint64_t *c = sc.c.data() + sc.nc;
    for (size_t m = kr.m; m < ls; m++) {
        c[m] = cand_key(dis0 + sc.dist[m], ip[m]);
        kr.lo = std::min(kr.lo, key_dist(c[m])), kr.hi = std::max(kr.hi, key_dist(c[m]));
        kr.rejected += ip[m] >= q.limit;
    }
    sc.lo = kr.lo, sc.hi = kr.hi;
    size_t n = ls;
    if (kr.rejected || sc.bar != UINT64_MAX) {
        n = 0;
        for (size_t m = 0; m < ls; m++)
            c[n] = c[m], n += ip[m] < q.limit && c[m] < sc.bar;
    }
    sc.nc += n;
}

/* The candidates cut to their k best (unordered) once they pass CUT_AT k,
 * and sc.bar set to the k-th: later lists then keep only the keys below it
 * (list_keys). The lists are scanned nearest first, so most of a query's k
 * best come from its first lists and most of the later lists' codes fall
 * above the bar: the selection at the end reads about 2k candidates, not
 * every code scanned (~6,700 at 1.7M pairs, nprobe 16, k 1,024). The same
 * k best, to the bit: a key above the bar has k better ones, keys are
 * distinct (the id is in the key), and the cut keeps exactly the k best. */
const size_t CUT_AT = 3;

void cut_keys(scan_ctx &sc, size_t k)
{
    if (k == 0 || sc.nc <= CUT_AT * k)
        return;
    sc.tmp.resize(std::max(sc.tmp.size(), sc.nc));
    sc.best.resize(std::max(sc.best.size(), k));
    select_keys({sc.c.data(), sc.tmp.data(), sc.best.data(), sc.nc, k, sc.lo, sc.hi});
    uint64_t bar = 0;
    for (size_t i = 0; i < k; i++)
        bar = std::max(bar, sc.best[i]);
    std::memcpy(sc.c.data(), sc.best.data(), k * sizeof(uint64_t));
    sc.nc = k, sc.bar = bar, sc.hi = key_dist(bar);
}

/* The codes of the list scanned after this one (the next query's first
 * list after a query's last): where they are, for scan_list */
struct next_codes {
    const char *p;
    size_t bytes;
};
/* Codes a chunk of scan_list: one four-block pass of the AVX-512 kernel.
 * Each chunk asks for its share of the next list's codes, so the memory
 * works on the next list all through this one (the hardware's prefetcher
 * follows a list only after its first misses). Against the next list's
 * first 4 KB asked for at once, on the growth curve's 1.7M read (PQ64x4,
 * nprobe 16): the code kernel's share of the process 10.3% -> 6.1%. */
const size_t SCAN_CHUNK = 64;

/* List j's codes scanned into sc.c (list_keys). Returns the codes scanned. */
size_t scan_list(scan_ctx &sc, const scan_row &q, int j, next_codes nx)
{
    const faiss::IndexIVFPQ *ix = sc.ix;
    const size_t key = (size_t)q.cids[j], ls = ix->invlists->list_size(key);
    if (ls == 0)
        return 0;
    const float dis0 = list_table(sc, q, j);
    faiss::InvertedLists::ScopedCodes codes(ix->invlists, key);
    faiss::InvertedLists::ScopedIds ids(ix->invlists, key);
    if (ls > sc.dist.size())
        sc.dist.resize(ls);
    if (sc.nc + ls > sc.c.size())
        sc.c.resize(sc.nc + ls);
    const size_t cs = ix->code_size;
    size_t pf = 0;
    for (size_t m = 0; m < ls; m += SCAN_CHUNK) {
        const size_t n = std::min(SCAN_CHUNK, ls - m);
        for (const size_t want = nx.bytes * (m + n) / ls; pf < want; pf += 64)
            __builtin_prefetch(nx.p + pf);
        list_dists({sc.cur, ix->pq.M, ix->pq.ksub, codes.get() + m * cs, cs, n, (int)ix->pq.nbits},
                   sc.dist.data() + m);
    }
    list_keys(sc, q, dis0, ids.get(), ls);
    return ls;
}

/* List key's ids, asked for before the list before it is scanned (read
 * four at a time with their distances: 30% of list_keys's time was that
 * load's misses with 512 bytes ahead), and where its codes are, for
 * scan_list to bring them in while it scans the list before */
next_codes prefetch_list(const faiss::ArrayInvertedLists *al, faiss::Index::idx_t key)
{
    if (!al || key < 0)
        return {nullptr, 0};
    const std::vector<uint8_t> &codes = al->codes[(size_t)key];
    const std::vector<faiss::Index::idx_t> &ids = al->ids[(size_t)key];
    const size_t ib = ids.size() * sizeof(ids[0]);
    for (size_t o = 0; o < ib; o += 64)
        __builtin_prefetch(reinterpret_cast<const char *>(ids.data()) + o);
    return {reinterpret_cast<const char *>(codes.data()), codes.size()};
}

/* One query: the candidates of its probed lists into sc.c, then the k best
 * into q.d/q.l (ascending; INFINITY and -1 past the last found). */
uint64_t scan_query(scan_ctx &sc, const scan_row &q)
{
    query_tables(sc, q);
    sc.nc = 0, sc.lo = UINT32_MAX, sc.hi = 0, sc.bar = UINT64_MAX;
    uint64_t nd = 0;
    size_t largest = 0;
    for (int j = 0; j < q.np; j++) {
        if (sc.cq && j % TABLE_GROUP == 0)
            group_tables(sc, q, j);
        /* the next list of the search: this query's next, or the next query's first */
        const next_codes nx = q.cids + j + 1 < sc.cids_end ? prefetch_list(sc.al, q.cids[j + 1]) : next_codes{nullptr, 0};
        if (q.cids[j] >= 0) {   /* -1: fewer lists than nprobe */
            size_t ls = scan_list(sc, q, j, nx);
            nd += ls, largest = std::max(largest, ls);
            cut_keys(sc, (size_t)q.k);
        }
    }
    const size_t k = (size_t)q.k;
    scan_need(sc, q.np, largest, k);
    sc.tmp.resize(std::max(sc.tmp.size(), sc.nc));
    sc.best.resize(std::max(sc.best.size(), std::min(sc.nc, k)));
    const size_t got = sc.nc ? top_keys({sc.c.data(), sc.tmp.data(), sc.best.data(), sc.nc, k, sc.lo, sc.hi}) : 0;
    for (size_t i = 0; i < k; i++) {
        q.d[i] = i < got ? cand_dist(sc.best[i]) : INFINITY;
        q.l[i] = i < got ? (int64_t)(uint32_t)sc.best[i] : -1;
    }
    return nd;
}

} // namespace

/* ---- the coarse quantizer's pruned exact search (faiss_shim_cq_*) ----
 *
 * The bound. P: the dp top principal axes of the centroids (rows of an
 * orthonormal [dp, d] matrix), R = I - P^T P the projection on their
 * orthogonal complement, mu the centroids' mean, x' = x - mu, c' = c - mu.
 * Since P^T P and R are complementary orthogonal projections,
 *   ||x - c||^2 = ||P(x - c)||^2 + ||R(x - c)||^2,
 * and R(x - c) = R x' - R c', so by the reverse triangle inequality
 * ||R(x - c)|| >= | ||R x'|| - ||R c'|| |; hence
 *   ||x - c||^2 >= ||P x' - P c'||^2 + (||R x'|| - ||R c'||)^2 =: L(x, c).
 * The first term is computed for a block of queries as one GEMM [B, dp] x
 * [dp, nlist] (||Px'||^2 + ||Pc'||^2 - 2 <Px', Pc'>), the second from norms.
 *
 * Rounding. The axes are orthonormal to 1e-4 (checked at build: P P^T =
 * I + E with dp max|E| <= 1e-4), which breaks the split above by at most
 * |v^T P^T E P v| <= 1e-4 ||v||^2 (v = x - c, ||v||^2 <= 2 (||x'||^2 +
 * ||c'||^2)); the triangle inequality holds for any linear R. Every term of
 * L is computed in float from sums of <= d + dp products, |error| <= (d +
 * dp) 2^-24 ~ 2e-5 of ||x'||^2 + ||c'||^2 (the residual norms from the
 * residuals themselves, not as differences of squares); and fvec_L2sqr is
 * the true distance within d 2^-24 = 1.5e-5 of it. So with
 *   Ls = L - 1e-3 (||x'||^2 + ||c'||^2)
 * (three times the sum of those errors), Ls > t implies fvec_L2sqr(x, c) >
 * t: a centroid whose Ls exceeds the np-th best exact distance found cannot
 * be among the np best, not even tied (ties break by list as in a full
 * loop). The search computes exact distances for the np smallest bounds,
 * then for every other centroid whose bound does not exceed the np-th best
 * so far (it only falls): its result is the full loop's with the same
 * distance function, to the bit, whatever the batch (tests/test_coarse.c:
 * against a naive loop in double and FAISS's own search). */
struct faiss_shim_cq {
    const faiss::IndexIVF *ix;  /* the index it serves */
    const float *cent;          /* [nlist, d] the flat quantizer's centroids (the index's) */
    size_t d, dp, nlist;
    std::vector<float> mean;    /* [d] */
    std::vector<float> P;       /* [dp, d] principal axes, rows */
    std::vector<float> pc;      /* [nlist, dp] P c' */
    std::vector<float> pcn;     /* [nlist] ||P c'||^2 - 1e-3 ||c'||^2 (the margin's share) */
    std::vector<float> rc;      /* [nlist] ||R c'|| */
    /* the second stage (cq_stage2): the next dp2 axes, rows dp.. of P */
    size_t dp2;
    std::vector<float> pc2;     /* [nlist, dp2] P2 c' */
    std::vector<float> rc2;     /* [nlist] ||R2 c'|| (R2: the complement of all dp + dp2 axes) */
    /* the PQ's codebooks for residual_tables: M sub-quantizers of ksub
     * centroids of dsub floats, transposed qT [M, dsub, ksub], and their
     * squared norms qn [M, ksub] */
    size_t M, dsub, ksub;
    std::vector<float> qT, qn;
    mutable std::atomic<uint64_t> queries{0}, exact{0};
};

namespace {

const float CQ_MARGIN = 1e-3f;   /* relative, of ||x'||^2 + ||c'||^2: see above */
const size_t CQ_BLOCK = 64;      /* queries a GEMM: G is [64, nlist] floats (1 MB at 4,096) */
const size_t CQ_AHEAD = 2;       /* exact distances prefetched ahead (2, 4, 8 measured alike) */

/* (d, list) pairs kept sorted ascending, np of them at most */
struct cq_top {
    std::vector<float> d;
    std::vector<faiss::Index::idx_t> l;
    size_t np, n;
    bool better(float dv, faiss::Index::idx_t lv) const
    {
        return n < np || dv < d[n - 1] || (dv == d[n - 1] && lv < l[n - 1]);
    }
    void insert(float dv, faiss::Index::idx_t lv)
    {
        size_t i = n < np ? n++ : np - 1;
        while (i > 0 && (d[i - 1] > dv || (d[i - 1] == dv && l[i - 1] > lv))) {
            d[i] = d[i - 1], l[i] = l[i - 1];
            i--;
        }
        d[i] = dv, l[i] = lv;
    }
};

/* A thread's scratch for faiss_shim_cq_search, kept between calls: a
 * fresh 1 MB row block each call was measured at 13% of the search in page
 * faults. Rows of a block of B queries: xc, back [B, d], y [B, dp], g [B,
 * nlist]; xn, yn, r [B] (cq_project); top, seed: one query's lists;
 * cand: the centroids its pruning visits. */
struct cq_scratch {
    std::vector<float> xc, y, back, g, b2;
    std::vector<double> xn, yn, r, r2;
    cq_top top, seed;
    std::vector<uint32_t> cand;
    void fit(size_t B, size_t d, size_t dp, size_t nlist, size_t np)
    {
        xc.resize(std::max(xc.size(), B * d)), back.resize(std::max(back.size(), B * d));
        y.resize(std::max(y.size(), B * dp)), g.resize(std::max(g.size(), B * nlist));
        xn.resize(std::max(xn.size(), B)), yn.resize(std::max(yn.size(), B)), r.resize(std::max(r.size(), B));
        r2.resize(std::max(r2.size(), B)), b2.resize(std::max(b2.size(), nlist));
        top.d.resize(np), top.l.resize(np), top.np = np, top.n = 0;
        seed.d.resize(np), seed.l.resize(np), seed.np = np, seed.n = 0;
        cand.resize(std::max(cand.size(), nlist));
    }
};

/* ||xc_i - back_i|| for i < n (rows [n, d]), in double: a residual's norm
 * computed from the residual itself */
void residual_norms(const float *xc, const float *back, size_t n, size_t d, double *r)
{
    for (size_t i = 0; i < n; i++) {
        double c = 0;
        for (size_t j = 0; j < d; j++) {
            double e = (double)xc[i * d + j] - back[i * d + j];
            c += e * e;
        }
        r[i] = std::sqrt(c);
    }
}

/* rows [n, d] minus mean, projected, into w: xc [n, d] = x - mean, y [n,
 * dt] = xc P^T on all dt = dp + dp2 axes; xn[i] = ||xc_i||^2, yn[i] =
 * ||y_i||^2 over the first dp, r[i] = ||xc_i - P1^T y1_i|| (P1: the first
 * dp axes) and r2[i] the same over all dt axes */
void cq_project(const faiss_shim_cq *cq, size_t n, const float *x, cq_scratch &w)
{
    const size_t d = cq->d, dp = cq->dp, dt = cq->dp + cq->dp2;
    std::vector<float> &xc = w.xc, &y = w.y, &back = w.back;
    double *xn = w.xn.data(), *yn = w.yn.data();
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < d; j++)
            xc[i * d + j] = x[i * d + j] - cq->mean[j];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)dt, (int)d, 1.0f, xc.data(), (int)d,
                cq->P.data(), (int)d, 0.0f, y.data(), (int)dt);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)dp, 1.0f, y.data(), (int)dt,
                cq->P.data(), (int)d, 0.0f, back.data(), (int)d);
    residual_norms(xc.data(), back.data(), n, d, w.r.data());
    if (cq->dp2) {   /* back += y2 P2: the projection on all dt axes */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)cq->dp2, 1.0f, y.data() + dp,
                    (int)dt, cq->P.data() + dp * d, (int)d, 1.0f, back.data(), (int)d);
        residual_norms(xc.data(), back.data(), n, d, w.r2.data());
    }
    for (size_t i = 0; i < n; i++) {
        double a = 0, b = 0;
        for (size_t j = 0; j < d; j++)
            a += (double)xc[i * d + j] * xc[i * d + j];
        for (size_t j = 0; j < dp; j++)
            b += (double)y[i * dt + j] * y[i * dt + j];
        xn[i] = a, yn[i] = b;
    }
}

/* The query's exact distance to centroid c: faiss::fvec_L2sqr, or the same
 * sum of d squared differences with AVX2 (8 lanes, then their sum): either
 * within d 2^-24 of the true distance, which is all the bound needs. */
__attribute__((target("avx2,fma"))) float l2sqr_avx2(const float *x, const float *y, size_t d)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= d; j += 16) {
        __m256 a = _mm256_sub_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j));
        __m256 b = _mm256_sub_ps(_mm256_loadu_ps(x + j + 8), _mm256_loadu_ps(y + j + 8));
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float r = _mm_cvtss_f32(h);
    for (; j < d; j++)
        r += (x[j] - y[j]) * (x[j] - y[j]);
    return r;
}

/* Our AVX2 kernels at the level the numeric core runs (vmath.h: the best
 * the CPU has, or NEUROCACHE_SIMD's / vm_set_isa's), so that the suites
 * run at each level prove the plain paths too */
inline bool cq_avx2_on()
{
    return shim_level() > 0;
}

inline float cq_exact(const faiss_shim_cq *cq, const float *x, size_t c)
{
    const float *y = cq->cent + c * cq->d;
    return cq_avx2_on() ? l2sqr_avx2(x, y, cq->d) : faiss::fvec_L2sqr(x, y, cq->d);
}

/* The bounds' row of one query, in place: g [nlist] holds <Px', Pc'> and
 * becomes Ls(c) = a + pcn[c] - 2 g[c] + (rx - rc[c])^2; and the np smallest
 * bounds into seed (ties to the lower list). Eight at a time, with a scalar
 * insertion only where a lane beats the seed's worst. */
__attribute__((target("avx2,fma"))) void bounds_avx2(const faiss_shim_cq *cq, float a, float rx, float *g,
                                                     cq_top &seed)
{
    const size_t nlist = cq->nlist;
    const float *pcn = cq->pcn.data(), *rc = cq->rc.data();
    const __m256 va = _mm256_set1_ps(a), vrx = _mm256_set1_ps(rx), m2 = _mm256_set1_ps(-2.0f);
    size_t c = 0;
    for (; c + 8 <= nlist; c += 8) {
        __m256 t = _mm256_sub_ps(vrx, _mm256_loadu_ps(rc + c));
        __m256 v = _mm256_add_ps(_mm256_add_ps(va, _mm256_loadu_ps(pcn + c)), _mm256_mul_ps(m2, _mm256_loadu_ps(g + c)));
        v = _mm256_add_ps(v, _mm256_mul_ps(t, t));
        _mm256_storeu_ps(g + c, v);
        const float worst = seed.n < seed.np ? INFINITY : seed.d[seed.n - 1];
        int m = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(worst), _CMP_LE_OQ));
        for (; m; m &= m - 1) {
            size_t i = c + (size_t)__builtin_ctz((unsigned)m);
            if (seed.better(g[i], (faiss::Index::idx_t)i))
                seed.insert(g[i], (faiss::Index::idx_t)i);
        }
    }
    for (; c < nlist; c++) {
        float t = rx - rc[c];
        g[c] = a + pcn[c] + -2.0f * g[c] + t * t;
        if (seed.better(g[c], (faiss::Index::idx_t)c))
            seed.insert(g[c], (faiss::Index::idx_t)c);
    }
}

void bounds_plain(const faiss_shim_cq *cq, float a, float rx, float *g, cq_top &seed)
{
    for (size_t c = 0; c < cq->nlist; c++) {
        float t = rx - cq->rc[c];
        g[c] = a + cq->pcn[c] + -2.0f * g[c] + t * t;
        if (seed.better(g[c], (faiss::Index::idx_t)c))
            seed.insert(g[c], (faiss::Index::idx_t)c);
    }
}

/* The centroid's lines brought towards the cache ahead of its distance:
 * the candidates are scattered over 4 MB of centroids, and their exact
 * distances waited on memory (~100 ns each at IVF4096) */
inline void cq_prefetch(const faiss_shim_cq *cq, size_t c)
{
    const char *p = reinterpret_cast<const char *>(cq->cent + c * cq->d);
    for (size_t o = 0; o < cq->d * sizeof(float); o += 64)
        __builtin_prefetch(p + o);
}

/* The lists c in [c0, nlist) with lo <= b[c] <= hi, ascending, into cand;
 * returns how many. The same set at every level (NaN bounds pass at none).
 * The pass over all 4,096 bounds a query was 5% of the scoring pass as a
 * scalar loop (its count kept in memory); 16 or 8 bounds a compare now. */
size_t candidates_plain(const float *b, size_t c0, size_t nlist, float lo, float hi, uint32_t *cand)
{
    size_t nc = 0;
    for (size_t c = c0; c < nlist; c++) {
        cand[nc] = (uint32_t)c;
        nc += b[c] <= hi && b[c] >= lo;   /* branch-free: most are pruned */
    }
    return nc;
}

__attribute__((target("avx2"))) size_t candidates_avx2(const float *b, size_t nlist, float lo, float hi,
                                                        uint32_t *cand)
{
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    size_t nc = 0, c = 0;
    for (; c + 8 <= nlist; c += 8) {
        const __m256 v = _mm256_loadu_ps(b + c);
        unsigned m = (unsigned)_mm256_movemask_ps(
            _mm256_and_ps(_mm256_cmp_ps(v, vhi, _CMP_LE_OQ), _mm256_cmp_ps(v, vlo, _CMP_GE_OQ)));
        for (; m; m &= m - 1)
            cand[nc++] = (uint32_t)(c + (size_t)__builtin_ctz(m));
    }
    return nc + candidates_plain(b, c, nlist, lo, hi, cand + nc);
}

__attribute__((target("avx512f"))) size_t candidates_avx512(const float *b, size_t nlist, float lo, float hi,
                                                             uint32_t *cand)
{
    const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    size_t nc = 0, c = 0;
    for (; c + 16 <= nlist; c += 16) {
        const __m512 v = _mm512_loadu_ps(b + c);
        const __mmask16 m = _mm512_cmp_ps_mask(v, vhi, _CMP_LE_OQ) & _mm512_cmp_ps_mask(v, vlo, _CMP_GE_OQ);
        if (m) {   /* (compressed in a register: Zen 4 microcodes the compress to memory) */
            _mm512_storeu_si512(cand + nc, _mm512_maskz_compress_epi32(m, idx));   /* nc + 16 <= c + 16 <= nlist */
            nc += (size_t)__builtin_popcount((unsigned)m);
        }
        idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16));
    }
    return nc + candidates_plain(b, c, nlist, lo, hi, cand + nc);
}

/* The second stage of the bound, for the candidates of the first, on the
 * next dp2 axes P2 (rows dp.. of P) and R2 the complement of all dp + dp2:
 *   L2(x, c) = ||P1(x - c)||^2 + ||P2(x - c)||^2 + (||R2 x'|| - ||R2 c'||)^2
 *            = L(x, c) - (||R x'|| - ||R c'||)^2 + ||P2 x' - P2 c'||^2 + (..R2..)^2,
 * the same argument as L's on dp + dp2 orthonormal axes (the margin as
 * L's, which b carries: rounding now over sums of <= d + dp + dp2 terms,
 * still within a third of it). The candidates c = cand[i] whose L2s
 * does not exceed t stay, compacted in order with their L2s into w.b2;
 * returns how many. 112 exact distances a query of 1 KB centroids each at
 * IVF4096 (64 axes) become 112 of 256 B rows here and ~15 exact. */
size_t cq_stage2(const faiss_shim_cq *cq, const float *b, size_t nc, size_t qi, float t, cq_scratch &w)
{
    const size_t dp2 = cq->dp2, dt = cq->dp + dp2;
    const float *y2 = w.y.data() + qi * dt + cq->dp;
    const float rx = (float)w.r[qi], rx2 = (float)w.r2[qi];
    size_t n = 0;
    for (size_t i = 0; i < nc; i++) {
        if (i + 4 < nc)
            __builtin_prefetch(cq->pc2.data() + (size_t)w.cand[i + 4] * dp2);
        const uint32_t c = w.cand[i];
        const float *p2 = cq->pc2.data() + (size_t)c * dp2;
        const float t1 = rx - cq->rc[c], t2 = rx2 - cq->rc2[c];
        const float s = cq_avx2_on() ? l2sqr_avx2(y2, p2, dp2) : faiss::fvec_L2sqr(y2, p2, dp2);
        const float l2 = (b[c] - t1 * t1) + s + t2 * t2;
        w.cand[n] = c, w.b2[n] = l2;
        n += l2 <= t;
    }
    return n;
}

/* The centroids whose bound does not exceed the np-th best exact distance
 * after the seeds, in list order into w.cand (and through the second
 * stage, cq_stage2, where there is one); then their exact distances
 * (prefetched two ahead), each while its bound still does not exceed the
 * np-th best so far and it is not a seed (b < bmax: every such centroid
 * is one; b == bmax: look). qi: the query's row in the block. Returns the
 * exact distances computed. */
size_t cq_prune(const faiss_shim_cq *cq, const float *x, size_t qi, const float *b, cq_scratch &w)
{
    const cq_top &seed = w.seed;
    cq_top &top = w.top;
    const float bmax = seed.d[seed.n - 1], t0 = top.d[top.n - 1];
    const int lv = shim_level();
    size_t nc = lv == 2   ? candidates_avx512(b, cq->nlist, bmax, t0, w.cand.data())
                : lv == 1 ? candidates_avx2(b, cq->nlist, bmax, t0, w.cand.data())
                          : candidates_plain(b, 0, cq->nlist, bmax, t0, w.cand.data());
    if (cq->dp2)
        nc = cq_stage2(cq, b, nc, qi, t0, w);
    size_t nex = 0;
    for (size_t i = 0; i < nc; i++) {
        if (i + CQ_AHEAD < nc)
            cq_prefetch(cq, w.cand[i + CQ_AHEAD]);
        const size_t c = w.cand[i];
        const float bc = cq->dp2 ? w.b2[i] : b[c];
        if (bc > top.d[top.n - 1] || (b[c] == bmax && std::find(seed.l.begin(), seed.l.begin() + (long)seed.n,
                                                                (faiss::Index::idx_t)c) != seed.l.begin() + (long)seed.n))
            continue;
        float e = cq_exact(cq, x, c);
        nex++;
        if (top.better(e, (faiss::Index::idx_t)c))
            top.insert(e, (faiss::Index::idx_t)c);
    }
    return nex;
}

/* r [dsub] = x - c, a sub-vector of the residual; returns ||r||^2 */
inline float sub_residual(const float *x, const float *c, size_t dsub, float *r)
{
    float rn = 0;
    for (size_t i = 0; i < dsub; i++) {
        r[i] = x[i] - c[i];
        rn += r[i] * r[i];
    }
    return rn;
}

/* A list's PQ table from the query's residual r = x - c (Jegou et al.
 * 2011, eq. 13: the sub-vector distances ||r_m - q_m(j)||^2 of the by-residual
 * ADC), as ||r_m||^2 + ||q_m(j)||^2 - 2 <r_m, q_m(j)>: tab [M, ksub]. The
 * same values FAISS's decomposition of eq. 14 gives (||x - c||^2 + T_c[m][j]
 * - 2 <x_m, q_m(j)>, T_c precomputed at 128 MB for IVF4096,PQ32), to float
 * rounding of terms no larger than those (the tests allow 1e-4 of the
 * distance); computed here in 65,536 products a list from 256 KB of
 * codebooks that stay in cache, where T_c's 32 KB a list came from memory
 * (that decomposition with -2 <x_m, q_m(j)> once a query and T_c read a
 * list measured 12% slower in the cache part: 7,473 against 8,554
 * tokens/CPU-s). All of a query's lists at once, four to a pass over a
 * sub-quantizer's codebook: its 8 KB (dsub 8) is read from L2 once for the
 * four and stays in L1 between them, where a list at a time streamed all
 * 256 KB once a list.
 * The same bits at every level: <r_m, q_m(j)> is its dsub products summed
 * in the order i = 0..dsub-1, each product rounded, then added (no fused
 * multiply-add: the plain path is compiled for x86-64-v2, which has none,
 * and ISO C++ does not contract); then (||r_m||^2 + ||q_m(j)||^2) + (-2
 * <r_m, q_m(j)>), -2 exact. On Zen 4 the product and the sum go to
 * different pipes: no slower than a fused multiply-add. */
/* One sub-quantizer's rows for up to four lists (a group of fewer repeats
 * its last list: the same values written twice): t[l] [ksub] from r[l]
 * [dsub], rn[l] = ||r[l]||^2, the transposed codebook qT [dsub, ksub] and
 * its norms qn [ksub]; ksub a multiple of 16 */
struct sub_table {
    const float *r[4];
    float rn[4];
    float *t[4];
    const float *qT, *qn;
    size_t dsub, ksub;
};

/* (the four lists' sums as named registers: as an array GCC kept them on
 * the stack) */
__attribute__((target("avx2"))) void sub_table_avx2(const sub_table &s)
{
    const size_t dsub = s.dsub, ksub = s.ksub;
    const float *r0 = s.r[0], *r1 = s.r[1], *r2 = s.r[2], *r3 = s.r[3];
    const __m256 m2 = _mm256_set1_ps(-2.0f);
    for (size_t j = 0; j < ksub; j += 8) {
        __m256 q = _mm256_loadu_ps(s.qT + j);
        __m256 a0 = _mm256_mul_ps(_mm256_set1_ps(r0[0]), q), a1 = _mm256_mul_ps(_mm256_set1_ps(r1[0]), q);
        __m256 a2 = _mm256_mul_ps(_mm256_set1_ps(r2[0]), q), a3 = _mm256_mul_ps(_mm256_set1_ps(r3[0]), q);
        for (size_t i = 1; i < dsub; i++) {
            q = _mm256_loadu_ps(s.qT + i * ksub + j);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_set1_ps(r0[i]), q));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_set1_ps(r1[i]), q));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_set1_ps(r2[i]), q));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_set1_ps(r3[i]), q));
        }
        const __m256 qn = _mm256_loadu_ps(s.qn + j);
        _mm256_storeu_ps(s.t[0] + j, _mm256_add_ps(_mm256_add_ps(_mm256_set1_ps(s.rn[0]), qn), _mm256_mul_ps(m2, a0)));
        _mm256_storeu_ps(s.t[1] + j, _mm256_add_ps(_mm256_add_ps(_mm256_set1_ps(s.rn[1]), qn), _mm256_mul_ps(m2, a1)));
        _mm256_storeu_ps(s.t[2] + j, _mm256_add_ps(_mm256_add_ps(_mm256_set1_ps(s.rn[2]), qn), _mm256_mul_ps(m2, a2)));
        _mm256_storeu_ps(s.t[3] + j, _mm256_add_ps(_mm256_add_ps(_mm256_set1_ps(s.rn[3]), qn), _mm256_mul_ps(m2, a3)));
    }
}

__attribute__((target("avx512f"))) void sub_table_avx512(const sub_table &s)
{
    const size_t dsub = s.dsub, ksub = s.ksub;
    const float *r0 = s.r[0], *r1 = s.r[1], *r2 = s.r[2], *r3 = s.r[3];
    const __m512 m2 = _mm512_set1_ps(-2.0f);
    for (size_t j = 0; j < ksub; j += 16) {
        __m512 q = _mm512_loadu_ps(s.qT + j);
        __m512 a0 = _mm512_mul_ps(_mm512_set1_ps(r0[0]), q), a1 = _mm512_mul_ps(_mm512_set1_ps(r1[0]), q);
        __m512 a2 = _mm512_mul_ps(_mm512_set1_ps(r2[0]), q), a3 = _mm512_mul_ps(_mm512_set1_ps(r3[0]), q);
        for (size_t i = 1; i < dsub; i++) {
            q = _mm512_loadu_ps(s.qT + i * ksub + j);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(r0[i]), q));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_set1_ps(r1[i]), q));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_set1_ps(r2[i]), q));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_set1_ps(r3[i]), q));
        }
        const __m512 qn = _mm512_loadu_ps(s.qn + j);
        _mm512_storeu_ps(s.t[0] + j, _mm512_add_ps(_mm512_add_ps(_mm512_set1_ps(s.rn[0]), qn), _mm512_mul_ps(m2, a0)));
        _mm512_storeu_ps(s.t[1] + j, _mm512_add_ps(_mm512_add_ps(_mm512_set1_ps(s.rn[1]), qn), _mm512_mul_ps(m2, a1)));
        _mm512_storeu_ps(s.t[2] + j, _mm512_add_ps(_mm512_add_ps(_mm512_set1_ps(s.rn[2]), qn), _mm512_mul_ps(m2, a2)));
        _mm512_storeu_ps(s.t[3] + j, _mm512_add_ps(_mm512_add_ps(_mm512_set1_ps(s.rn[3]), qn), _mm512_mul_ps(m2, a3)));
    }
}

void sub_table_plain(const sub_table &s)
{
    for (int l = 0; l < 4; l++)
        for (size_t j = 0; j < s.ksub; j++) {
            float acc = s.r[l][0] * s.qT[j];
            for (size_t i = 1; i < s.dsub; i++)
                acc += s.r[l][i] * s.qT[i * s.ksub + j];
            s.t[l][j] = (s.rn[l] + s.qn[j]) + -2.0f * acc;
        }
}

/* The PQ codes of residuals: for each sub-quantizer the nearest of its ksub
 * centroids, by the sum of squared differences (as FAISS's compute_code: no
 * ||r||^2 + ||q||^2 - 2<r, q> cancellation in the comparison that picks the
 * code), ties to the lower index. From the transposed codebooks, 8 or 16
 * centroids a register, four keys to a pass over a sub-quantizer's codebook
 * (8 KB at dsub 8, read from L2 once for the four; FAISS's fvec_L2sqr_ny
 * took 256 distances of 8 floats one after the other, 12% of the scoring
 * pass). The same codes at every level: each distance is (r_0 - q_0)^2,
 * then + (r_i - q_i)^2 for i = 1..dsub-1 in order, each by a fused
 * multiply-add (one rounding; the plain path by std::fma, libm's fmaf,
 * which is the CPU's own instruction where it has one and exact software
 * where not): on Zen 4 the subtraction and the sum then share no pipe (the
 * encoder at 512 bits was bound by its adds: 5.4% of the scoring pass ->
 * see the commit). A group of fewer than four keys repeats its last: its
 * code written twice, the same. */
struct encode_job {
    const float *r[4];   /* the keys' residual sub-vectors [dsub] */
    uint8_t *code[4];    /* where each key's code byte goes */
    const float *qT;     /* [dsub, ksub] the sub-quantizer's codebook, transposed */
    size_t dsub, ksub;
};

/* the lowest index among the lanes' minima (lane l holds its own first
 * minimum: the lowest index of its lanes' values) */
inline uint8_t argmin_lanes(const float *bv, const int32_t *bx, int n)
{
    int k = 0;
    for (int l = 1; l < n; l++)
        if (bv[l] < bv[k] || (bv[l] == bv[k] && bx[l] < bx[k]))
            k = l;
    return (uint8_t)bx[k];
}

/* A lane's running minimum and its index: strictly less replaces, so a
 * lane keeps its lower index (the minima and indices as named registers:
 * as arrays GCC kept them on the stack) */
__attribute__((target("avx2,fma"), always_inline)) inline void keep_min8(__m256 a, __m256i idx, __m256 &best, __m256i &bi)
{
    __m256 lt = _mm256_cmp_ps(a, best, _CMP_LT_OQ);
    best = _mm256_blendv_ps(best, a, lt);
    bi = _mm256_blendv_epi8(bi, idx, _mm256_castps_si256(lt));
}

__attribute__((target("avx2,fma"), always_inline)) inline uint8_t argmin8(__m256 best, __m256i bi)
{
    float bv[8];
    int32_t bx[8];
    _mm256_storeu_ps(bv, best);
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(bx), bi);
    return argmin_lanes(bv, bx, 8);
}

__attribute__((target("avx2,fma"))) void encode_avx2(const encode_job &e)
{
    __m256 b0 = _mm256_set1_ps(INFINITY), b1 = b0, b2 = b0, b3 = b0;
    __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0, idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t j = 0; j < e.ksub; j += 8) {
        __m256 q = _mm256_loadu_ps(e.qT + j), t;
        __m256 a0 = (t = _mm256_sub_ps(_mm256_set1_ps(e.r[0][0]), q), _mm256_mul_ps(t, t));
        __m256 a1 = (t = _mm256_sub_ps(_mm256_set1_ps(e.r[1][0]), q), _mm256_mul_ps(t, t));
        __m256 a2 = (t = _mm256_sub_ps(_mm256_set1_ps(e.r[2][0]), q), _mm256_mul_ps(t, t));
        __m256 a3 = (t = _mm256_sub_ps(_mm256_set1_ps(e.r[3][0]), q), _mm256_mul_ps(t, t));
        for (size_t i = 1; i < e.dsub; i++) {
            q = _mm256_loadu_ps(e.qT + i * e.ksub + j);
            t = _mm256_sub_ps(_mm256_set1_ps(e.r[0][i]), q), a0 = _mm256_fmadd_ps(t, t, a0);
            t = _mm256_sub_ps(_mm256_set1_ps(e.r[1][i]), q), a1 = _mm256_fmadd_ps(t, t, a1);
            t = _mm256_sub_ps(_mm256_set1_ps(e.r[2][i]), q), a2 = _mm256_fmadd_ps(t, t, a2);
            t = _mm256_sub_ps(_mm256_set1_ps(e.r[3][i]), q), a3 = _mm256_fmadd_ps(t, t, a3);
        }
        keep_min8(a0, idx, b0, i0), keep_min8(a1, idx, b1, i1), keep_min8(a2, idx, b2, i2), keep_min8(a3, idx, b3, i3);
        idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
    }
    *e.code[0] = argmin8(b0, i0), *e.code[1] = argmin8(b1, i1), *e.code[2] = argmin8(b2, i2), *e.code[3] = argmin8(b3, i3);
}

__attribute__((target("avx512f"), always_inline)) inline void keep_min16(__m512 a, __m512i idx, __m512 &best,
                                                                        __m512i &bi)
{
    __mmask16 lt = _mm512_cmp_ps_mask(a, best, _CMP_LT_OQ);
    best = _mm512_mask_blend_ps(lt, best, a);
    bi = _mm512_mask_blend_epi32(lt, bi, idx);
}

__attribute__((target("avx512f"), always_inline)) inline uint8_t argmin16(__m512 best, __m512i bi)
{
    float bv[16];
    int32_t bx[16];
    _mm512_storeu_ps(bv, best);
    _mm512_storeu_si512(bx, bi);
    return argmin_lanes(bv, bx, 16);
}

__attribute__((target("avx512f"))) void encode_avx512(const encode_job &e)
{
    __m512 b0 = _mm512_set1_ps(INFINITY), b1 = b0, b2 = b0, b3 = b0;
    __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (size_t j = 0; j < e.ksub; j += 16) {
        __m512 q = _mm512_loadu_ps(e.qT + j), t;
        __m512 a0 = (t = _mm512_sub_ps(_mm512_set1_ps(e.r[0][0]), q), _mm512_mul_ps(t, t));
        __m512 a1 = (t = _mm512_sub_ps(_mm512_set1_ps(e.r[1][0]), q), _mm512_mul_ps(t, t));
        __m512 a2 = (t = _mm512_sub_ps(_mm512_set1_ps(e.r[2][0]), q), _mm512_mul_ps(t, t));
        __m512 a3 = (t = _mm512_sub_ps(_mm512_set1_ps(e.r[3][0]), q), _mm512_mul_ps(t, t));
        for (size_t i = 1; i < e.dsub; i++) {
            q = _mm512_loadu_ps(e.qT + i * e.ksub + j);
            t = _mm512_sub_ps(_mm512_set1_ps(e.r[0][i]), q), a0 = _mm512_fmadd_ps(t, t, a0);
            t = _mm512_sub_ps(_mm512_set1_ps(e.r[1][i]), q), a1 = _mm512_fmadd_ps(t, t, a1);
            t = _mm512_sub_ps(_mm512_set1_ps(e.r[2][i]), q), a2 = _mm512_fmadd_ps(t, t, a2);
            t = _mm512_sub_ps(_mm512_set1_ps(e.r[3][i]), q), a3 = _mm512_fmadd_ps(t, t, a3);
        }
        keep_min16(a0, idx, b0, i0), keep_min16(a1, idx, b1, i1), keep_min16(a2, idx, b2, i2);
        keep_min16(a3, idx, b3, i3);
        idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16));
    }
    *e.code[0] = argmin16(b0, i0), *e.code[1] = argmin16(b1, i1), *e.code[2] = argmin16(b2, i2);
    *e.code[3] = argmin16(b3, i3);
}

void encode_plain(const encode_job &e)
{
    for (int l = 0; l < 4; l++) {
        float bd = INFINITY;
        size_t b = 0;
        for (size_t j = 0; j < e.ksub; j++) {
            float t = e.r[l][0] - e.qT[j], acc = t * t;
            for (size_t i = 1; i < e.dsub; i++) {
                t = e.r[l][i] - e.qT[i * e.ksub + j];
                acc = std::fma(t, t, acc);   /* libm's fmaf: the CPU's FMA where it has one */
            }
            if (acc < bd)
                bd = acc, b = j;
        }
        *e.code[l] = (uint8_t)b;
    }
}

/* The codes [n, M] of n <= 4 residuals r [n, d] */
void encode_keys(const faiss_shim_cq *cq, const float *r, int n, uint8_t *codes)
{
    const size_t d = cq->d, dsub = cq->dsub, ksub = cq->ksub;
    const int lv = shim_level();
    for (size_t m = 0; m < cq->M; m++) {
        encode_job e{};
        for (int l = 0; l < 4; l++) {
            const int u = l < n ? l : n - 1;
            e.r[l] = r + (size_t)u * d + m * dsub;
            e.code[l] = codes + (size_t)u * cq->M + m;
        }
        e.qT = cq->qT.data() + m * dsub * ksub, e.dsub = dsub, e.ksub = ksub;
        if (lv == 2)   /* (direct calls: UBSan's check of calls through pointers needs its C++ runtime) */
            encode_avx512(e);
        else if (lv == 1)
            encode_avx2(e);
        else
            encode_plain(e);
    }
}

void prefetch_centroids(const faiss_shim_cq *cq, const faiss::Index::idx_t *keys, int n)
{
    for (int j = 0; j < n; j++)
        if (keys[j] >= 0)
            for (size_t o = 0; o < cq->d; o += 16)
                __builtin_prefetch(cq->cent + (size_t)keys[j] * cq->d + o);
}

/* The tables of the query x's lists keys [np] (those < 0 skipped) into tab
 * [np, M, ksub], four lists to a pass (see sub_table) */
void residual_tables(const faiss_shim_cq *cq, const float *x, const faiss::Index::idx_t *keys, int np, float *tab)
{
    const size_t d = cq->d, dsub = cq->dsub, ksub = cq->ksub, tsz = cq->M * ksub;
    const int lv = shim_level();
    thread_local std::vector<float> res, rn;   /* [4, d] residuals, [4, M] their sub-norms */
    res.resize(4 * d), rn.resize(4 * cq->M);
    for (int j0 = 0; j0 < np; j0 += 4) {
        int sel[4], n = 0;
        for (int j = j0; j < np && j < j0 + 4; j++)
            if (keys[j] >= 0)
                sel[n++] = j;
        if (n == 0)
            continue;
        for (int l = 0; l < n; l++) {
            const float *c = cq->cent + (size_t)keys[sel[l]] * d;
            for (size_t m = 0; m < cq->M; m++)
                rn[l * cq->M + m] = sub_residual(x + m * dsub, c + m * dsub, dsub, res.data() + l * d + m * dsub);
        }
        for (size_t m = 0; m < cq->M; m++) {
            sub_table st{};
            for (int l = 0; l < 4; l++) {
                const int u = l < n ? l : n - 1;
                st.r[l] = res.data() + u * d + m * dsub;
                st.rn[l] = rn[u * cq->M + m];
                st.t[l] = tab + (size_t)sel[u] * tsz + m * ksub;
            }
            st.qT = cq->qT.data() + m * dsub * ksub, st.qn = cq->qn.data() + m * ksub;
            st.dsub = dsub, st.ksub = ksub;
            if (lv == 2)
                sub_table_avx512(st);
            else if (lv == 1)
                sub_table_avx2(st);
            else
                sub_table_plain(st);
        }
    }
}

/* One query: g [nlist] its inner products <Px', Pc'>, made its bounds (Ls);
 * a = ||Px'||^2 - 1e-3 ||x'||^2, rx = ||Rx'||. Exact distances for the np
 * smallest bounds (seed), then for every other centroid whose bound does
 * not exceed the np-th exact distance so far. Returns the exact distances
 * computed. */
size_t cq_select(const faiss_shim_cq *cq, const float *x, size_t i, cq_scratch &w)
{
    cq_top &seed = w.seed, &top = w.top;
    float *g = w.g.data() + i * cq->nlist;
    const float a = (float)(w.yn[i] - CQ_MARGIN * w.xn[i]), rx = (float)w.r[i];
    seed.n = top.n = 0;
    if (cq_avx2_on())
        bounds_avx2(cq, a, rx, g, seed);
    else
        bounds_plain(cq, a, rx, g, seed);
    for (size_t j = 0; j < seed.n; j++)
        cq_prefetch(cq, (size_t)seed.l[j]);
    for (size_t j = 0; j < seed.n; j++) {
        faiss::Index::idx_t c = seed.l[j];
        float e = cq_exact(cq, x, (size_t)c);
        if (top.better(e, c))
            top.insert(e, c);
    }
    return seed.n + cq_prune(cq, x, i, g, w);
}

} // namespace

extern "C" faiss_shim_cq *faiss_shim_cq_new(const FaissIndex *idx, int dp)
{
    const faiss::IndexIVFPQ *ix = scannable(idx);
    const faiss::IndexFlat *fq = ix ? dynamic_cast<const faiss::IndexFlat *>(ix->quantizer) : nullptr;
    if (!fq || fq->metric_type != faiss::METRIC_L2 || (size_t)fq->ntotal != ix->nlist || ix->nlist < (size_t)ix->d)
        return nullptr;
    faiss_shim_cq *cq = nullptr;
    int rc = guarded(nullptr, 0, [&]() {
        std::unique_ptr<faiss_shim_cq> q(new faiss_shim_cq);
        const size_t d = (size_t)ix->d, nlist = ix->nlist;
        q->ix = ix, q->d = d, q->nlist = nlist, q->cent = fq->get_xb();
        /* d / 2 axes for the first stage's GEMM, and the second stage's
         * (cq_stage2) as many again, at most the rest (at H = 256: all
         * of them). A namespace's own index, trained on its keys, spreads
         * its centroids over more axes than the model's index trained on
         * PTB: at 1.7M pairs (own IVF4096, nprobe 16) 64 + 64 axes let
         * 1,104 centroids a query past the first stage, 479 past the
         * second and 89 exact distances (1 KB rows, scattered over 4 MB);
         * 128 + 128: 110, 21 and ~30, the coarse search 11.5% -> 8.8% of
         * the process. 96 + 96: 365 and 96. At 100k and 1M pairs, and on
         * the model's index at 1M (where 64 + 64 had been measured best
         * against 48 + 48, 32 + 96 and 64 + 96), 128 + 128 reads alike. */
        q->dp = dp > 0 ? std::min((size_t)dp, d) : std::max<size_t>(1, d / 2);
        q->dp2 = std::min(q->dp, d - q->dp);
        const size_t dt = q->dp + q->dp2;
        faiss::PCAMatrix pca((int)d, (int)dt);
        pca.train((faiss::Index::idx_t)nlist, q->cent);
        q->mean = pca.mean;
        q->P.assign(pca.A.begin(), pca.A.begin() + (long)(dt * d));
        /* orthonormal rows, to the bound's allowance (see above) */
        double worst = 0;
        for (size_t a = 0; a < dt; a++)
            for (size_t b = a; b < dt; b++) {
                double s = 0;
                for (size_t j = 0; j < d; j++)
                    s += (double)q->P[a * d + j] * q->P[b * d + j];
                worst = std::max(worst, std::fabs(s - (a == b)));
            }
        if (worst * (double)dt > 1e-4)
            return 1;
        cq_scratch w;
        w.fit(nlist, d, dt, 0, 0);
        cq_project(q.get(), nlist, q->cent, w);
        q->pc.resize(nlist * q->dp), q->pc2.resize(nlist * q->dp2);
        q->pcn.resize(nlist), q->rc.resize(nlist), q->rc2.resize(nlist);
        for (size_t c = 0; c < nlist; c++) {
            std::copy_n(w.y.begin() + (long)(c * dt), q->dp, q->pc.begin() + (long)(c * q->dp));
            std::copy_n(w.y.begin() + (long)(c * dt + q->dp), q->dp2, q->pc2.begin() + (long)(c * q->dp2));
            q->pcn[c] = (float)(w.yn[c] - CQ_MARGIN * w.xn[c]), q->rc[c] = (float)w.r[c];
            q->rc2[c] = (float)w.r2[c];
        }
        const faiss::ProductQuantizer &pq = ix->pq;
        q->M = pq.M, q->dsub = pq.dsub, q->ksub = pq.ksub;
        q->qT.resize(pq.M * pq.dsub * pq.ksub), q->qn.resize(pq.M * pq.ksub);
        for (size_t m = 0; m < pq.M; m++)
            for (size_t j = 0; j < pq.ksub; j++) {
                const float *cj = pq.get_centroids(m, j);
                double n2 = 0;
                for (size_t i = 0; i < pq.dsub; i++) {
                    q->qT[(m * pq.dsub + i) * pq.ksub + j] = cj[i];
                    n2 += (double)cj[i] * cj[i];
                }
                q->qn[m * pq.ksub + j] = (float)n2;
            }
        cq = q.release();
        return 0;
    });
    return rc == 0 ? cq : nullptr;
}

extern "C" void faiss_shim_cq_free(faiss_shim_cq *cq) { delete cq; }

extern "C" int faiss_shim_cq_search(const faiss_shim_cq *cq, int64_t n, const float *x, int nprobe, float *cdis,
                                    int64_t *cids)
{
    return guarded(nullptr, 0, [&]() {
        const size_t d = cq->d, dp = cq->dp, dt = cq->dp + cq->dp2, nlist = cq->nlist;
        const size_t np = nprobe > 0 && (size_t)nprobe < nlist ? (size_t)nprobe : nprobe > 0 ? nlist : 0;
        if (np == 0)
            return shim_error(nullptr, 0, "nprobe");
        const size_t B = std::min<size_t>(CQ_BLOCK, (size_t)n);
        thread_local cq_scratch w;
        w.fit(B, d, dt, nlist, np);
        std::vector<float> &y = w.y, &g = w.g;
        uint64_t nex = 0;
        for (int64_t i0 = 0; i0 < n; i0 += (int64_t)B) {
            const size_t nb = std::min<size_t>(B, (size_t)(n - i0));
            const float *xb = x + (size_t)i0 * d;
            cq_project(cq, nb, xb, w);
            /* one GEMM for the block; a product by vector for a few
             * queries (OpenBLAS's GEMM would pack all of pc for each) */
            if (nb >= 8)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)nlist, (int)dp, 1.0f, y.data(),
                            (int)dt, cq->pc.data(), (int)dp, 0.0f, g.data(), (int)nlist);
            else
                for (size_t i = 0; i < nb; i++)
                    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)nlist, (int)dp, 1.0f, cq->pc.data(), (int)dp,
                                y.data() + i * dt, 1, 0.0f, g.data() + i * nlist, 1);
            for (size_t i = 0; i < nb; i++) {
                nex += cq_select(cq, xb + i * d, i, w);
                float *od = cdis + ((size_t)i0 + i) * np;
                int64_t *ol = cids + ((size_t)i0 + i) * np;
                for (size_t j = 0; j < np; j++)
                    od[j] = w.top.d[j], ol[j] = (int64_t)w.top.l[j];
            }
        }
        cq->queries += (uint64_t)n;
        cq->exact += nex;
        return (int)np;
    });
}

extern "C" void faiss_shim_cq_stats(const faiss_shim_cq *cq, uint64_t *queries, uint64_t *exact)
{
    *queries = cq ? cq->queries.load() : 0;
    *exact = cq ? cq->exact.load() : 0;
}

extern "C" size_t faiss_shim_cq_bytes(const faiss_shim_cq *cq)
{
    if (!cq)
        return 0;
    return sizeof *cq + (cq->mean.size() + cq->P.size() + cq->pc.size() + cq->pcn.size() + cq->rc.size() +
                         cq->pc2.size() + cq->rc2.size() + cq->qT.size() + cq->qn.size()) *
                            sizeof(float);
}

/* nprobe as our scan and its coarse search take it: <= 0 the index's, at
 * most nlist */
static int probes(const faiss::IndexIVF *ix, int nprobe)
{
    int np = nprobe > 0 ? nprobe : (int)ix->nprobe;
    return (size_t)np > ix->nlist ? (int)ix->nlist : np;
}

static thread_local scan_ctx thread_scan;

extern "C" size_t faiss_shim_scan_kept_bytes(void)
{
    return scan_bytes(thread_scan);
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
            /* the coarse quantizer: ours, exact and pruned, or FAISS's one
             * batched search for all n (BLAS from 20 on) */
            cd.resize((size_t)n * np);
            ci.resize((size_t)n * np);
            if (!s->cq || s->cq->ix != ix || faiss_shim_cq_search(s->cq, n, s->x, np, cd.data(), reinterpret_cast<int64_t *>(ci.data())) != np)
                ix->quantizer->search(n, s->x, np, cd.data(), ci.data());
            cdis = cd.data();
            cids = ci.data();
        }
        uint64_t nd = 0;
        const bool ours = s->cq && s->cq->ix == ix;
        scan_ctx &sc = thread_scan;
        sc.ix = ix, sc.cq = ours ? s->cq : nullptr;
        sc.al = dynamic_cast<const faiss::ArrayInvertedLists *>(ix->invlists);
        sc.cids_end = cids + (size_t)n * np;
        sc.tab2.resize(ours ? 0 : tsz), sc.tab.resize(std::max(sc.tab.size(), tsz));   /* (ours: TABLE_GROUP tables) */
        for (int64_t q = 0; q < n; q++) {
            scan_row row{s->x + (size_t)q * d_, cdis + (size_t)q * np, cids + (size_t)q * np, np,
                         s->id_limit ? s->id_limit[q] : INT64_MAX, k, s->d + (size_t)q * k, s->l + (size_t)q * k};
            nd += scan_query(sc, row);
        }
        scan_trim(sc, (size_t)n);
        if (s->ndis)
            *s->ndis += nd;
        return 0;
    });
}

extern "C" void faiss_shim_pq_dists(const faiss_shim_pq_list *l, float *out)
{
    list_dists(*l, out);
}

extern "C" size_t faiss_shim_top_k(const float *d, const int64_t *ids, size_t n, size_t k, float *od, int64_t *ol)
{
    std::vector<uint64_t> c(n), tmp(n), best(std::min(n, k));
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        c[i] = cand_key(d[i], ids[i]);
        lo = std::min(lo, key_dist(c[i])), hi = std::max(hi, key_dist(c[i]));
    }
    const size_t got = n ? top_keys({c.data(), tmp.data(), best.data(), n, k, lo, hi}) : 0;
    for (size_t i = 0; i < got; i++)
        od[i] = cand_dist(best[i]), ol[i] = (int64_t)(uint32_t)best[i];
    return got;
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
 * the set). The set of faiss_shim_cq_search holds a fortiori: there every
 * centroid outside it has a computed distance >= dnp with an error below d
 * 2^-24 of D, less than the eta (||x||^2 + ||c||^2) allowed here. */
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

/* What FAISS's IndexIVFPQ::add_core_o does with given lists (residuals,
 * PQ codes, one entry a key in its list, sequential ids, ntotal), with our
 * encoder: the keys' residuals to their lists' centroids (as FAISS's
 * compute_residual: x - c in float), encoded by encode_keys and packed by
 * FAISS's own PQ encoder. */
void add_encoded(faiss::IndexIVFPQ *ix, const faiss_shim_cq *cq, const faiss_shim_add_in *a,
                 const std::vector<faiss::Index::idx_t> &lists)
{
    const size_t d = (size_t)ix->d, cs = ix->code_size, M = ix->pq.M;
    std::vector<float> r(4 * d);
    std::vector<uint8_t> code(4 * M, 0), packed(4 * cs, 0);
    for (int64_t i0 = 0; i0 < a->n; i0 += 4) {
        const int n = (int)std::min<int64_t>(4, a->n - i0);
        for (int l = 0; l < n; l++) {
            const size_t i = (size_t)i0 + (size_t)l;
            const float *x = a->keys + i * d, *c = cq->cent + (size_t)lists[i] * d;
            for (size_t j = 0; j < d; j++)
                r[(size_t)l * d + j] = x[j] - c[j];
        }
        encode_keys(cq, r.data(), n, code.data());
        for (int l = 0; l < n; l++) {   /* packed as FAISS packs pq.nbits a sub-quantizer (4: two a byte) */
            faiss::PQEncoderGeneric enc(packed.data() + (size_t)l * cs, (int)ix->pq.nbits);
            for (size_t m = 0; m < M; m++)
                enc.encode(code[(size_t)l * M + m]);
        }
        for (int l = 0; l < n; l++) {
            const size_t i = (size_t)i0 + (size_t)l;
            faiss::Index::idx_t id = ix->ntotal + (faiss::Index::idx_t)i;
            size_t off = ix->invlists->add_entry((size_t)lists[i], id, packed.data() + (size_t)l * cs);
            ix->direct_map.add_single_id(id, lists[i], off);
        }
    }
    ix->ntotal += a->n;
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
        if (a->cq && a->cq->ix == ix && ix->direct_map.type == faiss::DirectMap::NoMap)
            add_encoded(ix, a->cq, a, lists);
        else
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
    /* the lists themselves, empty: each its two vectors (ids, codes) */
    if (dynamic_cast<const faiss::ArrayInvertedLists *>(ivf->invlists))
        b += ivf->nlist * 2 * sizeof(std::vector<uint8_t>);
    if (const faiss::IndexIVFPQ *pq = dynamic_cast<const faiss::IndexIVFPQ *>(ivf))
        b += pq->pq.centroids.size() * sizeof(float) + pq->precomputed_table.size() * sizeof(float);
    return b;
}

extern "C" size_t faiss_shim_lists_bytes(const FaissIndex *idx)
{
    const faiss::IndexIVF *ivf = dynamic_cast<const faiss::IndexIVF *>(reinterpret_cast<const faiss::Index *>(idx));
    const faiss::ArrayInvertedLists *al =
        ivf ? dynamic_cast<const faiss::ArrayInvertedLists *>(ivf->invlists) : nullptr;
    if (!al)
        return 0;
    size_t b = 0;
    for (size_t i = 0; i < al->nlist; i++)
        b += al->codes[i].capacity() + al->ids[i].capacity() * sizeof(faiss::Index::idx_t);
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

/* ---- a namespace's own training ------------------------------------------- */

#include <faiss/impl/AuxIndexStructures.h>
#include <mutex>

namespace {

/* The training thread's stop flag, read by FAISS's k-means at each
 * iteration through its process-wide interrupt callback (installed once;
 * other threads have none and are never interrupted). */
thread_local const volatile int *train_stop = nullptr;

struct stop_callback : faiss::InterruptCallback {
    bool want_interrupt() override { return train_stop && __atomic_load_n(train_stop, __ATOMIC_RELAXED); }
};

} // namespace

extern "C" int faiss_shim_train_ivfpq(const faiss_shim_train_in *in, FaissIndex **out, char *err, size_t errlen)
{
    static std::once_flag installed;
    *out = nullptr;
    faiss::IndexIVFPQ *ix = nullptr;
    try {
        std::call_once(installed, [] { faiss::InterruptCallback::instance.reset(new stop_callback()); });
        auto *q = new faiss::IndexFlatL2(in->d);
        ix = new faiss::IndexIVFPQ(q, in->d, (size_t)in->nlist, (size_t)in->M, in->nbits == 4 ? 4 : 8);
        ix->own_fields = true;
        ix->do_polysemous_training = false;
        ix->cp.niter = in->niter;
        ix->cp.seed = in->seed;
        ix->cp.min_points_per_centroid = 1;   /* the caller sizes the sample; FAISS would print */
        ix->cp.max_points_per_centroid = (int)((in->n + in->nlist - 1) / in->nlist);   /* all of it */
        ix->pq.cp.seed = in->seed;
        ix->pq.cp.min_points_per_centroid = 1;
        ix->verbose = false;
        train_stop = in->stop;
        ix->train((faiss::Index::idx_t)in->n, in->x);
        train_stop = nullptr;
        /* (train made its precomputed table: pq_tables_attach moves it out
         * into the table its training shares) */
        *out = reinterpret_cast<FaissIndex *>(ix);
        return 0;
    } catch (const std::exception &e) {
        train_stop = nullptr;
        delete ix;
        bool stopped = in->stop && __atomic_load_n(in->stop, __ATOMIC_RELAXED);
        snprintf(err, errlen, "%s", stopped ? "training stopped" : e.what());
        return stopped ? -2 : -1;
    }
}

extern "C" double faiss_shim_imbalance(const FaissIndex *idx)
{
    auto *iv = dynamic_cast<const faiss::IndexIVF *>(reinterpret_cast<const faiss::Index *>(idx));
    if (!iv || !iv->invlists || iv->ntotal == 0)
        return 0.0;
    return iv->invlists->imbalance_factor();
}

extern "C" double faiss_shim_imbalance_below(const FaissIndex *idx, int64_t limit)
{
    auto *iv = dynamic_cast<const faiss::IndexIVF *>(reinterpret_cast<const faiss::Index *>(idx));
    if (!iv || !iv->invlists || limit <= 0)
        return 0.0;
    double sum2 = 0.0, tot = 0.0;
    for (size_t l = 0; l < iv->nlist; l++) {
        const size_t n = iv->invlists->list_size(l);
        faiss::InvertedLists::ScopedIds ids(iv->invlists, l);
        const faiss::Index::idx_t *p = ids.get();
        const double below = (double)(std::lower_bound(p, p + n, (faiss::Index::idx_t)limit) - p);
        sum2 += below * below;
        tot += below;
    }
    return tot > 0.0 ? (double)iv->nlist * sum2 / (tot * tot) : 0.0;
}

extern "C" int64_t faiss_shim_nlist(const FaissIndex *idx)
{
    auto *iv = dynamic_cast<const faiss::IndexIVF *>(reinterpret_cast<const faiss::Index *>(idx));
    return iv ? (int64_t)iv->nlist : 0;
}
