/* test_scan.c -- the IVFPQ scan's kernels (core/index/faiss_shim.cpp) against
 * naive loops: the PQ distances of a list's codes from its look-up table
 * (faiss_shim_pq_dists), bit for bit, and the k best candidates by
 * (distance, id) (faiss_shim_top_k), exactly; at every kernel level the CPU
 * has (the suite also runs under tests/run_levels.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "faiss_shim.h"
#include "vmath.h"

static uint64_t rng = 26;
static uint32_t next32(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng >> 32);
}

/* uniform in [lo, hi) */
static float unif(float lo, float hi)
{
    return lo + (hi - lo) * (float)(next32() >> 8) * (1.0f / 16777216.0f);
}

/* The tolerance is zero: the kernel must add each code's M look-ups in the
 * order s = 0..M-1 in float, as this loop does (and FAISS's scanner), so
 * any regrouping of the sum shows as a differing bit. */
static void naive_dists(const faiss_shim_pq_list *l, float *out)
{
    for (size_t i = 0; i < l->n; i++) {
        float a = 0;
        for (size_t s = 0; s < l->M; s++) {
            const uint8_t *c = l->codes + i * l->code_size;
            /* 4 bits: FAISS's packing, sub-quantizer s in byte s / 2, low nibble first */
            unsigned v = l->nbits == 4 ? (c[s / 2] >> (4 * (s % 2))) & 15u : c[s];
            a += l->table[s * l->ksub + v];
        }
        out[i] = a;
    }
}

/* M, ksub, code_size: the kernel's fast shape (M a multiple of 8, ksub 256:
 * IVF4096,PQ32's 32 x 8 bits), code sizes with padding, and shapes it
 * leaves to the code-by-code loop; n around the eight-code blocks */
TEST(pq_dists_match_naive_sum)
{
    const size_t shapes[][3] = {{32, 256, 32}, {8, 256, 8}, {16, 256, 19}, {64, 256, 64},
                                {12, 256, 12}, {32, 16, 32}, {3, 256, 5}};
    const size_t ns[] = {0, 1, 7, 8, 9, 15, 16, 17, 335, 1339};
    for (size_t h = 0; h < sizeof shapes / sizeof *shapes; h++) {
        const size_t M = shapes[h][0], ksub = shapes[h][1], cs = shapes[h][2];
        float *t = malloc(M * ksub * sizeof *t);
        /* magnitudes spread over 2^-6..2^6, both signs: the roundings of
         * a reordered sum differ */
        for (size_t i = 0; i < M * ksub; i++)
            t[i] = unif(-1.0f, 4.0f) * (float)(1u << (next32() % 13)) / 64.0f;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
            const size_t n = ns[a];
            uint8_t *c = malloc(n * cs + 1);
            for (size_t i = 0; i < n * cs; i++)
                c[i] = (uint8_t)(next32() % ksub);
            float *got = malloc((n + 1) * sizeof *got), *want = malloc((n + 1) * sizeof *want);
            faiss_shim_pq_list l = {.table = t, .M = M, .ksub = ksub, .codes = c, .code_size = cs, .n = n};
            faiss_shim_pq_dists(&l, got);
            naive_dists(&l, want);
            CHECKF(n == 0 || memcmp(got, want, n * sizeof *got) == 0, "M %zu ksub %zu cs %zu n %zu: not the naive sum's bits",
                   M, ksub, cs, n);
            free(c);
            free(got);
            free(want);
        }
        free(t);
    }
}

/* 4-bit codes (PQ<M>x4, ksub 16): the vector kernels' shapes (code sizes
 * multiples of 16 with M = 2 code_size: 8 or 16 codes a block, one or more
 * 16-byte chunks; 272 bytes: a tail too long for the padded block) and the
 * plain loop's (odd M, padding); n around the
 * blocks. Zero tolerance as above: each lane must add its code's M
 * entries in the order s = 0..M-1. run_levels.sh runs this at every
 * level, so each of the scalar, AVX2 and AVX-512 kernels is compared. */
TEST(pq4_dists_match_naive_sum)
{
    const size_t shapes[][2] = {{32, 16}, {64, 32}, {16, 8}, {31, 16}, {32, 20}, {6, 3}, {544, 272}};
    const size_t ns[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 335, 1339};
    for (size_t h = 0; h < sizeof shapes / sizeof *shapes; h++) {
        const size_t M = shapes[h][0], cs = shapes[h][1];
        float *t = malloc(M * 16 * sizeof *t);
        for (size_t i = 0; i < M * 16; i++)
            t[i] = unif(-1.0f, 4.0f) * (float)(1u << (next32() % 13)) / 64.0f;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
            const size_t n = ns[a];
            uint8_t *c = malloc(n * cs + 1);
            for (size_t i = 0; i < n * cs; i++)
                c[i] = (uint8_t)next32();   /* both nibbles random; the padding too */
            float *got = malloc((n + 1) * sizeof *got), *want = malloc((n + 1) * sizeof *want);
            faiss_shim_pq_list l = {.table = t, .M = M, .ksub = 16, .codes = c, .code_size = cs, .n = n, .nbits = 4};
            faiss_shim_pq_dists(&l, got);
            naive_dists(&l, want);
            CHECKF(n == 0 || memcmp(got, want, n * sizeof *got) == 0,
                   "4-bit M %zu cs %zu n %zu: not the naive sum's bits", M, cs, n);
            free(c);
            free(got);
            free(want);
        }
        free(t);
    }
}

typedef struct {
    float d;
    int64_t id;
} cand;

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->d != y->d)
        return x->d < y->d ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* n candidates of distinct ids < 2^32, distances from `levels` values (few
 * levels: many ties, some straddling the k-th) or continuous; ties must
 * come out in id order, exactly as a sort by (distance, id) */
static void check_top_k(size_t n, size_t k, int levels, float lo, float hi)
{
    float *d = malloc((n + 1) * sizeof *d), *od = malloc((k + 1) * sizeof *od);
    int64_t *id = malloc((n + 1) * sizeof *id), *ol = malloc((k + 1) * sizeof *ol);
    cand *ref = malloc((n + 1) * sizeof *ref);
    for (size_t i = 0; i < n; i++) {
        d[i] = levels ? lo + (hi - lo) * (float)(next32() % (uint32_t)levels) / (float)levels : unif(lo, hi);
        if (d[i] == 0.0f)
            d[i] = 0.0f;   /* no -0.0: keys order it below +0.0, a comparison of floats does not */
        id[i] = (int64_t)(((uint64_t)i * 2654435761u + 12345) & 0xffffffffu);   /* distinct, scattered */
        ref[i] = (cand){d[i], id[i]};
    }
    qsort(ref, n, sizeof *ref, cmp_cand);
    size_t want = n < k ? n : k;
    size_t got = faiss_shim_top_k(d, id, n, k, od, ol);
    CHECKF(got == want, "n %zu k %zu: %zu found, expected %zu", n, k, got, want);
    size_t bad = 0;
    for (size_t i = 0; i < want && i < got; i++)
        bad += memcmp(&od[i], &ref[i].d, sizeof(float)) != 0 || ol[i] != ref[i].id;
    CHECKF(bad == 0, "n %zu k %zu levels %d: %zu of %zu differ from the sort by (distance, id)", n, k, levels, bad, want);
    free(d);
    free(od);
    free(id);
    free(ol);
    free(ref);
}

TEST(top_k_matches_sort)
{
    const size_t ns[] = {0, 1, 5, 511, 512, 513, 1339, 3000};
    const size_t ks[] = {1, 64, 512, 1024};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) {
            check_top_k(ns[a], ks[b], 0, 20.0f, 45.0f);      /* squared distances of one binade and the next */
            check_top_k(ns[a], ks[b], 7, 20.0f, 45.0f);      /* heavy ties */
            check_top_k(ns[a], ks[b], 0, -0.5f, 3000.0f);    /* both signs (rounding), many binades */
            check_top_k(ns[a], ks[b], 1, 30.0f, 31.0f);      /* all distances equal: ids decide */
        }
    check_top_k(1339, 512, 1000, 1e-3f, 1e6f);
}

int main(void)
{
    /* every level the CPU has: the kernels must give the same bits at each */
    char levels[64];
    snprintf(levels, sizeof levels, "%s", vm_isa_supported());
    for (char *save = NULL, *lv = strtok_r(levels, " ", &save); lv; lv = strtok_r(NULL, " ", &save)) {
        CHECK(vm_set_isa(lv) == 0);
        RUN(pq_dists_match_naive_sum);
        RUN(pq4_dists_match_naive_sum);
        RUN(top_k_matches_sort);
    }
    vm_set_isa(NULL);
    return harness_summary();
}
