/* test_coarse.c -- the coarse quantizer's pruned exact search
 * (faiss_shim_cq_search) against a naive loop in double precision and
 * against FAISS's own quantizer search, on the demo model's hidden states of
 * real text and on random vectors, near-ties included; and the add's exact
 * placement from its lists. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/IndexIVF_c.h>

#include "harness.h"
#include "faiss_shim.h"
#include "lstm.h"
#include "model.h"
#include "tokenizer.h"
#include "unbounded_cache.h"
#include "vmath.h"

static uint64_t lcg = 2026;
static float gauss(void)
{
    double u = 0;
    for (int i = 0; i < 12; i++) {
        lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
        u += (double)(lcg >> 11) / 9007199254740992.0;
    }
    return (float)(u - 6.0);
}

static double dist2(const float *a, const float *b, int d)
{
    double s = 0;
    for (int j = 0; j < d; j++)
        s += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
    return s;
}

static double norm2(const float *a, int d)
{
    double s = 0;
    for (int j = 0; j < d; j++)
        s += (double)a[j] * a[j];
    return s;
}

static int in_list(const int64_t *l, int np, int64_t c)
{
    for (int j = 0; j < np; j++)
        if (l[j] == c)
            return 1;
    return 0;
}

/* ix's coarse centroids [*nlist, d], the flat quantizer's own */
static const float *centroids(FaissIndex *ix, int *nlist)
{
    FaissIndexFlat *fq = (FaissIndexFlat *)faiss_IndexIVF_quantizer((FaissIndexIVF *)ix);
    float *cx = NULL;
    size_t cs = 0;
    faiss_IndexFlat_xb(fq, &cx, &cs);
    *nlist = (int)faiss_Index_ntotal((FaissIndex *)fq);
    return cx;
}

typedef struct {
    int checked, naive_ties, faiss_differ, exact_ties;
    double exact_per_query;
} cq_report;

/* cq's lists for q [nq, d] at np probes, checked:
 * - against the naive loop in double: each returned distance within 2e-5
 *   of the true one (a float sum of d <= 256 squares: relative error <= d
 *   2^-24 = 1.5e-5), ascending (ties by list), and the set the true np
 *   nearest, except where a returned list and a left-out one are within
 *   4e-5 of the np-th distance of each other (a near-tie: counted);
 * - against FAISS's quantizer search (faiss_shim_coarse: ||x||^2 + ||c||^2 -
 *   2<x, c> by BLAS from 20 queries, error <= 1e-4 (||x||^2 + ||c||^2)): the
 *   same set except where the lists that differ are within 2e-4 (||x||^2 +
 *   max ||c||^2) of the np-th distance (counted);
 * - batch independence: all queries in one call = one query a call, to the
 *   bit. */
static void check_lists(FaissIndex *ix, const float *q, int nq, int np, cq_report *r)
{
    faiss_shim_cq *cq = faiss_shim_cq_new(ix, 0);
    CHECK(cq != NULL);
    if (!cq)
        return;
    const int d = faiss_Index_d(ix);
    int nlist;
    const float *cx = centroids(ix, &nlist);
    size_t rows = (size_t)nq * np;
    float *cd = malloc(rows * sizeof(float)), *cd1 = malloc(rows * sizeof(float)), *fd = malloc(rows * sizeof(float));
    int64_t *cl = malloc(rows * sizeof(int64_t)), *cl1 = malloc(rows * sizeof(int64_t)),
            *fl = malloc(rows * sizeof(int64_t));
    double *dd = malloc((size_t)nlist * sizeof(double)), *sorted = malloc((size_t)nlist * sizeof(double));
    uint64_t q0, e0, q1, e1;
    faiss_shim_cq_stats(cq, &q0, &e0);
    CHECK(faiss_shim_cq_search(cq, nq, q, np, cd, cl) == np);
    faiss_shim_cq_stats(cq, &q1, &e1);
    r->exact_per_query = (double)(e1 - e0) / nq;
    CHECKF(q1 - q0 == (uint64_t)nq && e1 - e0 >= (uint64_t)nq * np && e1 - e0 <= (uint64_t)nq * nlist,
           "stats: %llu queries, %llu exact distances", (unsigned long long)(q1 - q0), (unsigned long long)(e1 - e0));
    for (int i = 0; i < nq; i++)
        CHECK(faiss_shim_cq_search(cq, 1, q + (size_t)i * d, np, cd1 + (size_t)i * np, cl1 + (size_t)i * np) == np);
    CHECK(memcmp(cd, cd1, rows * sizeof(float)) == 0 && memcmp(cl, cl1, rows * sizeof(int64_t)) == 0);
    CHECK(faiss_shim_coarse(ix, nq, q, np, fd, fl) == np);
    double cmax = 0;
    for (int c = 0; c < nlist; c++)
        cmax = fmax(cmax, norm2(cx + (size_t)c * d, d));
    int bad_d = 0, bad_naive = 0, bad_faiss = 0, bad_order = 0;
    for (int i = 0; i < nq; i++) {
        const float *x = q + (size_t)i * d;
        const float *di = cd + (size_t)i * np;
        const int64_t *li = cl + (size_t)i * np, *fli = fl + (size_t)i * np;
        for (int c = 0; c < nlist; c++)
            dd[c] = sorted[c] = dist2(x, cx + (size_t)c * d, d);
        /* the np-th and (np+1)-th true distances */
        for (int a = 0; a <= np && a < nlist; a++)
            for (int b = a + 1; b < nlist; b++)
                if (sorted[b] < sorted[a]) {
                    double t = sorted[a];
                    sorted[a] = sorted[b], sorted[b] = t;
                }
        const double t = sorted[np - 1];
        for (int j = 0; j < np; j++) {
            if (li[j] < 0 || li[j] >= nlist) {
                bad_naive++;
                continue;
            }
            double D = dd[li[j]];
            if (fabs(di[j] - D) > 2e-5 * D + 1e-30)
                bad_d++;
            if (j > 0 && (di[j] < di[j - 1] || (di[j] == di[j - 1] && li[j] < li[j - 1])))
                bad_order++;
            if (D > t) {
                if (D - t <= 4e-5 * t)
                    r->naive_ties++;
                else
                    bad_naive++;
            }
            if (j > 0 && di[j] == di[j - 1])
                r->exact_ties++;
            if (!in_list(fli, np, li[j])) {
                /* the one FAISS kept instead: as near the boundary */
                if (fabs(D - t) <= 2e-4 * (norm2(x, d) + cmax))
                    r->faiss_differ++;
                else
                    bad_faiss++;
            }
        }
        r->checked++;
    }
    CHECKF(bad_d == 0 && bad_naive == 0 && bad_faiss == 0 && bad_order == 0,
           "%d distances off, %d lists not the nearest, %d differ from FAISS's beyond its rounding, %d out of order",
           bad_d, bad_naive, bad_faiss, bad_order);
    faiss_shim_cq_free(cq);
    free(cd), free(cd1), free(fd), free(cl), free(cl1), free(fl), free(dd), free(sorted);
}

/* Queries halfway between a centroid and its nearest other centroid (in
 * exact arithmetic equidistant from both; in float often exactly tied), the
 * odd ones moved by Gaussian noise of scale noise: out [n, d] */
static void near_ties(FaissIndex *ix, int n, float noise, float *out)
{
    const int d = faiss_Index_d(ix);
    int nlist;
    const float *cx = centroids(ix, &nlist);
    for (int i = 0; i < n; i++) {
        int a = (i * 7919) % nlist, b = -1;
        double best = INFINITY;
        for (int c = 0; c < nlist; c++) {
            double s = c == a ? INFINITY : dist2(cx + (size_t)a * d, cx + (size_t)c * d, d);
            if (s < best)
                best = s, b = c;
        }
        for (int j = 0; j < d; j++)
            out[(size_t)i * d + j] = 0.5f * (cx[(size_t)a * d + j] + cx[(size_t)b * d + j]) +
                                     (i % 2 ? noise * gauss() : 0.0f);
    }
}

static FaissIndex *trained_ivfpq(const char *factory, int d, const float *x, size_t n)
{
    FaissIndex *ix = NULL;
    CHECK(faiss_index_factory(&ix, d, factory, METRIC_L2) == 0);
    if (ix)
        CHECK(faiss_Index_train(ix, (idx_t)n, x) == 0);
    return ix;
}

/* Random vectors: clustered training points (as stored states are), queries
 * Gaussian around them and uniform-ish far from them, and near-ties; nprobe
 * 1 (where a tie decides the list), 2, 4 and 8. */
TEST(cq_random_vectors)
{
    const int d = 32, nclust = 40, ntrain = 6000, nq = 300;
    float *x = malloc((size_t)ntrain * d * sizeof(float)), *cent = malloc((size_t)nclust * d * sizeof(float));
    for (int i = 0; i < nclust * d; i++)
        cent[i] = 3.0f * gauss();
    for (int i = 0; i < ntrain; i++)
        for (int j = 0; j < d; j++)
            x[(size_t)i * d + j] = cent[(i % nclust) * d + j] + gauss();
    FaissIndex *ix = trained_ivfpq("IVF64,PQ8np", d, x, (size_t)ntrain);
    float *q = malloc((size_t)3 * nq * d * sizeof(float));
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < d; j++) {
            q[(size_t)i * d + j] = x[(size_t)(i * 13) * d + j] + 0.5f * gauss();
            q[(size_t)(nq + i) * d + j] = 6.0f * gauss();
        }
    if (ix) {
        near_ties(ix, nq, 1e-4f, q + (size_t)2 * nq * d);
        const int nps[] = {1, 2, 4, 8};
        int ties = 0, exact_ties = 0;
        for (int k = 0; k < 4; k++) {
            cq_report r = {0};
            check_lists(ix, q, 3 * nq, nps[k], &r);
            ties += r.naive_ties + r.faiss_differ;
            exact_ties += r.exact_ties;
            fprintf(stderr, "    random, nprobe %d: %.1f exact distances a query of 64; %d near-ties, %d lists "
                            "FAISS's rounding ordered otherwise, %d exact ties\n",
                    nps[k], r.exact_per_query, r.naive_ties, r.faiss_differ, r.exact_ties);
        }
        /* the near-tie queries did reach the boundary (else they test nothing) */
        CHECKF(exact_ties > 0, "no exactly tied distances among %d near-tie queries", nq);
        (void)ties;
        faiss_Index_free(ix);
    }
    free(x), free(cent), free(q);
}

/* The demo model's last-layer hidden states over this repository's
 * documents (real text, 256 dimensions), IVF256,PQ8 trained on the first
 * 5,000, the next ones and near-ties as queries. */
TEST(cq_real_hidden_states)
{
    char err[NC_ERRLEN];
    nc_model *m = NULL;
    CHECKF(model_load("models/demo", &m, err, sizeof err) == NC_OK, "%s", err);
    if (!m)
        return;
    const char *files[] = {"docs/design.md", "docs/caches.md", "docs/api.md", "docs/cli.md"};
    nc_tokens t;
    tokens_init(&t);
    for (int f = 0; f < 4; f++) {
        FILE *fp = fopen(files[f], "rb");
        CHECKF(fp != NULL, "%s", files[f]);
        if (!fp)
            continue;
        static char buf[1 << 20];
        size_t len = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
        nc_tokens one;
        tokens_init(&one);
        CHECKF(tokenize(m, buf, len, true, &one, err, sizeof err) == NC_OK, "%s", err);
        for (size_t i = 0; i < one.n; i++)
            tokens_push(&t, one.ids[i], "", 0, i);
        tokens_clear(&one);
    }
    const int H = m->cfg.hidden_size, nq = 400;
    const size_t ntrain = 5000;
    CHECKF(t.n >= ntrain + nq, "%zu tokens", t.n);
    if (t.n >= ntrain + nq) {
        float *h = malloc(t.n * (size_t)H * sizeof(float));
        nc_state *s = lstm_state_new(m);
        CHECK(lstm_forward_seq(m, s, t.ids, t.n, h, err, sizeof err) == NC_OK);
        lstm_state_free(s);
        FaissIndex *ix = trained_ivfpq("IVF256,PQ8np", H, h, ntrain);
        if (ix) {
            float *q = malloc((size_t)2 * nq * H * sizeof(float));
            memcpy(q, h + ntrain * H, (size_t)nq * H * sizeof(float));
            near_ties(ix, nq, 1e-5f, q + (size_t)nq * H);
            const int nps[] = {1, 4, 8};
            for (int k = 0; k < 3; k++) {
                cq_report r = {0};
                check_lists(ix, q, 2 * nq, nps[k], &r);
                fprintf(stderr, "    hidden states, nprobe %d: %.1f exact distances a query of 256; %d near-ties, "
                                "%d lists FAISS's rounding ordered otherwise, %d exact ties\n",
                        nps[k], r.exact_per_query, r.naive_ties, r.faiss_differ, r.exact_ties);
            }
            free(q);
            faiss_Index_free(ix);
        }
        free(h);
    }
    tokens_clear(&t);
    model_free(m);
}

/* Our PQ encoder (faiss_shim_add with the searcher) against FAISS's
 * (add_core): the same keys in the same lists (exact placement) give the
 * same codes, except where a sub-vector's two nearest codewords are a
 * near-tie: there both codes are the nearest to float rounding, so the
 * squared distances of the keys to their reconstructions agree within 1e-5
 * of their size (8 sub-vector distances of 4 floats, each rounded to ~4
 * 2^-24 of its terms). */
static void encoder_matches_faiss(const char *factory)
{
    const int d = 32, ntrain = 5000, n = 3000;
    float *x = malloc((size_t)(ntrain + n) * d * sizeof(float));
    for (int i = 0; i < (ntrain + n) * d; i++)
        x[i] = gauss() + (float)((i / d) % 7);
    FaissIndex *ix[2] = {trained_ivfpq(factory, d, x, (size_t)ntrain), trained_ivfpq(factory, d, x, (size_t)ntrain)};
    if (ix[0] && ix[1]) {
        const float *keys = x + (size_t)ntrain * d;
        faiss_shim_cq *cq = faiss_shim_cq_new(ix[0], 0);
        CHECK(cq != NULL);
        char err[256] = "";
        faiss_shim_add_in ours = {.n = n, .keys = keys, .cq = cq}, theirs = {.n = n, .keys = keys};
        CHECKF(faiss_shim_add(ix[0], &ours, err, sizeof err) == 0, "%s", err);
        CHECKF(faiss_shim_add(ix[1], &theirs, err, sizeof err) == 0, "%s", err);
        float *rec = malloc((size_t)2 * d * sizeof(float));
        int differ = 0, bad = 0;
        for (int v = 0; v < 2; v++)
            CHECK(faiss_IndexIVF_make_direct_map((FaissIndexIVF *)ix[v], 1) == 0);
        for (int i = 0; i < n; i++) {
            CHECK(faiss_Index_reconstruct(ix[0], i, rec) == 0 && faiss_Index_reconstruct(ix[1], i, rec + d) == 0);
            if (memcmp(rec, rec + d, (size_t)d * sizeof(float)) == 0)
                continue;
            differ++;
            double a = dist2(keys + (size_t)i * d, rec, d), b = dist2(keys + (size_t)i * d, rec + d, d);
            if (fabs(a - b) > 1e-5 * b + 1e-9)
                bad++;
        }
        fprintf(stderr, "    encoder, %s: %d of %d codes differ from FAISS's (near-ties)\n", factory, differ, n);
        CHECKF(bad == 0, "%s: %d of %d keys encoded farther than FAISS's codes", factory, bad, n);
        free(rec);
        faiss_shim_cq_free(cq);
    }
    for (int v = 0; v < 2; v++)
        if (ix[v])
            faiss_Index_free(ix[v]);
    free(x);
}

/* 8-bit codes (the model's unbounded.faiss), and 4-bit ones (a namespace's
 * own training: two sub-quantizers a byte, which our encoder must pack as
 * FAISS does, or every reconstruction differs) */
TEST(cq_encoder_matches_faiss)
{
    encoder_matches_faiss("IVF64,PQ8np");
    encoder_matches_faiss("IVF64,PQ16x4np");
}

/* The scan's look-up tables (residual_tables, four lists to a pass) and our
 * encoder give the same bits at every level the CPU runs (the kernels sum
 * in the same order, with no fused multiply-add), so a user's results do
 * not depend on the CPU: IVF64,PQ8 on 64 dimensions (dsub 8, the 1M
 * benchmark's), nprobe 1 to 9 (groups of four lists and their remainders),
 * the same searches and the same adds at each level. Each distance is
 * also checked against the ADC distance computed in double from the
 * reconstruction rec = c + q(code): a table entry ||r_m||^2 + ||q_m||^2 -
 * 2 <r_m, q_m> rounds sums of dsub + 2 terms, each no larger than
 * ||r_m||^2 + ||q_m||^2 (the inner product by Cauchy-Schwarz, the 2 by
 * the AM-GM inequality), the M entries then summed: within (dsub + M + 4)
 * 2^-24 (||r||^2 + ||q||^2) (Higham's gamma bound), 2x that allowed. */
static void scan_same_bits_every_level(const char *factory, int M)
{
    const int d = 64, ntrain = 6000, nadd = 4000, nq = 60, k = 25;
    float *x = malloc((size_t)(ntrain + nadd + nq) * d * sizeof(float));
    for (int i = 0; i < (ntrain + nadd + nq) * d; i++)
        x[i] = gauss() + (float)((i / d) % 11);
    const char *levels[] = {"scalar", "avx2", "avx512"};
    FaissIndex *ix[3] = {NULL, NULL, NULL};
    faiss_shim_cq *cq[3] = {NULL, NULL, NULL};
    float *dd = malloc((size_t)3 * nq * k * sizeof(float)), *rec = malloc((size_t)d * sizeof(float));
    int64_t *ll = malloc((size_t)3 * nq * k * sizeof(int64_t));
    int nlev = 0, bad = 0, checked = 0;
    char err[256] = "";
    for (int v = 0; v < 3; v++) {
        if (vm_set_isa(levels[v]) != 0)
            continue;   /* not on this CPU */
        ix[nlev] = trained_ivfpq(factory, d, x, (size_t)ntrain);
        if (!ix[nlev])
            break;
        cq[nlev] = faiss_shim_cq_new(ix[nlev], 0);
        CHECK(cq[nlev] != NULL);
        faiss_shim_add_in in = {.n = nadd, .keys = x + (size_t)ntrain * d, .cq = cq[nlev]};
        CHECKF(faiss_shim_add(ix[nlev], &in, err, sizeof err) == 0, "%s", err);
        CHECK(faiss_IndexIVF_make_direct_map((FaissIndexIVF *)ix[nlev], 1) == 0);
        nlev++;
    }
    vm_set_isa(NULL);
    CHECKF(nlev >= 2, "%d levels on this CPU", nlev);
    int nlist = 0;
    const float *cent = nlev ? centroids(ix[0], &nlist) : NULL;
    for (int np = 1; np <= 9 && nlev > 0; np++) {
        for (int v = 0, lv = 0; v < 3 && lv < nlev; v++) {
            if (vm_set_isa(levels[v]) != 0)
                continue;
            faiss_shim_scan sc = {.n = nq, .x = x + (size_t)(ntrain + nadd) * d, .k = k, .nprobe = np,
                                  .cq = cq[lv], .d = dd + (size_t)lv * nq * k, .l = ll + (size_t)lv * nq * k};
            CHECKF(faiss_shim_ivfpq_search(ix[lv], &sc, err, sizeof err) == 0, "%s", err);
            lv++;
        }
        vm_set_isa(NULL);
        for (int v = 1; v < nlev; v++) {
            CHECKF(memcmp(dd, dd + (size_t)v * nq * k, (size_t)nq * k * sizeof(float)) == 0,
                   "%s nprobe %d: level %d's distances differ from the first's", factory, np, v);
            CHECKF(memcmp(ll, ll + (size_t)v * nq * k, (size_t)nq * k * sizeof(int64_t)) == 0,
                   "%s nprobe %d: level %d's neighbours differ from the first's", factory, np, v);
        }
        for (int i = 0; i < nq * k; i++) {
            if (ll[i] < 0)
                continue;
            const float *q = x + (size_t)(ntrain + nadd + i / k) * d;
            CHECK(faiss_Index_reconstruct(ix[0], ll[i], rec) == 0);
            /* the neighbour's list c is one of the query's np probed ones:
             * the bound's scale ||q - c||^2 + ||rec - c||^2 at its largest
             * over them */
            float cd[9];
            int64_t ci[9];
            CHECK(faiss_shim_cq_search(cq[0], 1, q, np, cd, ci) == np);
            double scale = 0;
            for (int j = 0; j < np; j++)
                scale = fmax(scale, dist2(q, cent + (size_t)ci[j] * d, d) + dist2(rec, cent + (size_t)ci[j] * d, d));
            checked++;
            if (fabs(dd[i] - dist2(q, rec, d)) > 2.0 * (d / M + M + 4) * ldexp(1.0, -24) * scale)
                bad++;
        }
    }
    CHECKF(checked > 0 && bad == 0, "%s: %d of %d distances off the double ADC distance", factory, bad, checked);
    /* the adds: the same codes at every level */
    for (int v = 1; v < nlev; v++)
        for (int i = 0; i < nadd; i++) {
            float a[64], b[64];
            CHECK(faiss_Index_reconstruct(ix[0], i, a) == 0 && faiss_Index_reconstruct(ix[v], i, b) == 0);
            if (memcmp(a, b, sizeof a) != 0) {
                CHECKF(0, "%s key %d: level %d encoded it otherwise", factory, i, v);
                break;
            }
        }
    for (int v = 0; v < 3; v++) {
        faiss_shim_cq_free(cq[v]);
        if (ix[v])
            faiss_Index_free(ix[v]);
    }
    free(x), free(dd), free(ll), free(rec);
}

/* 8-bit codes (the tables' loads), and 4-bit ones of 16 bytes (the scan's
 * register permutes: list_dists4, 8 codes a block with AVX2, 16 with
 * AVX-512, one by one in the plain loop) */
TEST(cq_scan_same_bits_every_level)
{
    scan_same_bits_every_level("IVF64,PQ8np", 8);
    scan_same_bits_every_level("IVF64,PQ32x4np", 32);
}

/* Bad input: an index the search cannot serve gets no searcher (the
 * callers then use FAISS's), never a crash. */
TEST(cq_declines_other_indexes)
{
    FaissIndex *flat = NULL;
    CHECK(faiss_index_factory(&flat, 16, "Flat", METRIC_L2) == 0);
    CHECK(faiss_shim_cq_new(flat, 0) == NULL);
    faiss_Index_free(flat);
    /* fewer centroids than dimensions: the principal axes do not span */
    float *x = malloc(2000 * 64 * sizeof(float));
    for (int i = 0; i < 2000 * 64; i++)
        x[i] = gauss();
    FaissIndex *ix = trained_ivfpq("IVF32,PQ8np", 64, x, 2000);
    if (ix) {
        CHECK(faiss_shim_cq_new(ix, 0) == NULL);
        faiss_Index_free(ix);
    }
    free(x);
    faiss_shim_cq_free(NULL);
}

int main(void)
{
    /* FAISS's k-means on one thread: its OpenMP team spun on the shared
     * cores for most of this suite's time */
    unbounded_cache_set_threads(1);
    RUN(cq_random_vectors);
    RUN(cq_real_hidden_states);
    RUN(cq_encoder_matches_faiss);
    RUN(cq_scan_same_bits_every_level);
    RUN(cq_declines_other_indexes);
    /* the plain paths (the level a CPU without AVX2 runs) as well */
    if (strcmp(vm_isa(), "scalar") != 0) {
        CHECK(vm_set_isa("scalar") == 0);
        RUN(cq_random_vectors);
        RUN(cq_encoder_matches_faiss);
        vm_set_isa(NULL);
    }
    return harness_summary();
}
