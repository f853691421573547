// oracle_fastscan.cpp -- an oracle for the unbounded cache's next code
// (issue 35; BENCHMARKS.md, the growth curve, "An oracle for the next
// method"): recall and CPU a query of FAISS's IVF-PQ with 8-bit codes
// (IndexIVFPQ, PQ32x8) against its 4-bit fast-scan codes (IndexIVFPQFastScan,
// PQ64x4: the same 32 bytes a code), by residual and not, over one coarse
// quantizer, on real hidden states (bench_growth's BENCH_STATES file).
// Queries: Q states spread over the first N, held out of the database.
// Recall: the share of the exact 32 nearest among the 1,024 found, as the
// own training measures it. Thread CPU time a query, one query a call.
// Built and run by scripts/oracle_fastscan.sh.
#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/utils/random.h>
#include <immintrin.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef faiss::Index::idx_t idx_t;

static double thread_cpu()
{
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: oracle_fastscan STATES N NLIST [Q]\n");
        return 2;
    }
    size_t N = atol(argv[2]), nlist = atol(argv[3]), Q = argc > 4 ? atol(argv[4]) : 300;
    const size_t K = 1024, TOP = 32, d = 256;
    FILE *f = fopen(argv[1], "rb");
    uint64_t n0 = 0;
    if (!f || fread(&n0, 8, 1, f) != 1) {
        fprintf(stderr, "oracle_fastscan: %s: not a states file (bench_growth's BENCH_STATES)\n", argv[1]);
        return 1;
    }
    N = std::min<size_t>(N, n0);
    std::vector<uint16_t> h(N * d);
    if (fread(h.data(), 2, h.size(), f) != h.size()) {
        fprintf(stderr, "oracle_fastscan: %s: short read\n", argv[1]);
        return 1;
    }
    fclose(f);
    std::vector<float> x(N * d);
    for (size_t i = 0; i < x.size(); i += 8)
        _mm256_storeu_ps(&x[i], _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(&h[i]))));
    std::vector<uint16_t>().swap(h);
    std::vector<char> held(N, 0);
    std::vector<float> q(Q * d), db;
    for (size_t i = 0; i < Q; i++) {
        size_t id = (size_t)((i + 0.5) * N / Q);
        held[id] = 1;
        std::memcpy(&q[i * d], &x[id * d], d * sizeof(float));
    }
    db.reserve((N - Q) * d);
    for (size_t i = 0; i < N; i++)
        if (!held[i])
            db.insert(db.end(), &x[i * d], &x[i * d] + d);
    std::vector<float>().swap(x);
    const size_t nb = db.size() / d;
    std::vector<float> gd(Q * TOP);
    std::vector<idx_t> gi(Q * TOP);
    {
        faiss::IndexFlatL2 flat(d);
        flat.add(nb, db.data());
        flat.search(Q, q.data(), TOP, gd.data(), gi.data());
    }
    /* the coarse quantizer as the own training makes it: k-means on 40 nlist keys */
    const size_t ns = std::min(nb, 40 * nlist);
    std::vector<float> sample(ns * d);
    std::vector<int> perm(nb);
    faiss::rand_perm(perm.data(), nb, 1234);
    for (size_t i = 0; i < ns; i++)
        std::memcpy(&sample[i * d], &db[(size_t)perm[i] * d], d * sizeof(float));
    faiss::IndexFlatL2 cq(d);
    {
        faiss::ClusteringParameters cp;
        cp.niter = 10;
        faiss::Clustering km(d, nlist, cp);
        km.train(ns, sample.data(), cq);
    }
    faiss::IndexIVFPQ pq8(&cq, d, nlist, 32, 8);
    pq8.by_residual = true;
    pq8.train(ns, sample.data());
    pq8.add(nb, db.data());
    faiss::IndexIVFPQFastScan fsr(&cq, d, nlist, 64, 4), fsp(&cq, d, nlist, 64, 4);
    fsr.by_residual = true, fsp.by_residual = false;
    fsr.train(ns, sample.data()), fsp.train(ns, sample.data());
    fsr.add(nb, db.data()), fsp.add(nb, db.data());
    omp_set_num_threads(1);
    printf("database %zu states, %zu queries held out, IVF%zu, k %zu\n", nb, Q, nlist, K);
    printf("| nprobe | recall PQ32x8 | recall fast-scan residual | recall fast-scan plain | PQ32x8 us a query | fast-scan residual | fast-scan plain |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    faiss::IndexIVF *ix[3] = {&pq8, &fsr, &fsp};
    std::vector<float> D(K);
    std::vector<idx_t> I(K), s(K);
    for (int np : {2, 4, 8, 16, 32}) {
        if ((size_t)np > nlist)
            break;
        double recall[3], us[3];
        for (int t = 0; t < 3; t++) {
            ix[t]->nprobe = np;
            double hit = 0, c0 = thread_cpu();
            for (size_t i = 0; i < Q; i++) {
                ix[t]->search(1, &q[i * d], K, D.data(), I.data());
                s = I;
                std::sort(s.begin(), s.end());
                for (size_t j = 0; j < TOP; j++)
                    hit += std::binary_search(s.begin(), s.end(), gi[i * TOP + j]);
            }
            us[t] = (thread_cpu() - c0) / Q * 1e6;
            recall[t] = hit / (double)(TOP * Q);
        }
        printf("| %d | %.3f | %.3f | %.3f | %.1f | %.1f | %.1f |\n", np, recall[0], recall[1], recall[2], us[0], us[1],
               us[2]);
        fflush(stdout);
    }
    return 0;
}
