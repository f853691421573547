/* cmd_build_index.c -- `neurocache build-index`: trains the unbounded cache's
 * IVFPQ quantizer on hidden states of a corpus and writes it, empty, as the
 * model directory's unbounded.faiss (design §2, §5). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/index_io_c.h>

#include "atomicfile.h"
#include "cacheopts.h"
#include "commands.h"
#include "rng.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: neurocache build-index --model DIR --corpus FILE [--factory STR] [--sample N]\n"
            "                              [--out PATH] [--seed S] [--threads N] [--no-normalize]\n"
            "\n"
            "Runs the model over FILE, keeps a uniform random sample of N hidden states h_t\n"
            "(the unbounded cache's keys, design §3), trains the FAISS index built from the\n"
            "factory string on them, and writes it empty to DIR/unbounded.faiss (or PATH).\n"
            "The unbounded cache (score/eval --unbounded, the server) then fills this trained\n"
            "index instead of staying on exact search. Progress goes to stderr.\n"
            "\n"
            "options:\n"
            "  --model DIR      model directory\n"
            "  --corpus FILE    training text (one sentence a line, as for train)\n"
            "  --factory STR    FAISS factory string (default IVF4096,PQ{H/8}np, L2: the\n"
            "                   paper's IVFPQ; 'np' skips FAISS's polysemous training,\n"
            "                   which costs minutes and which the search never uses)\n"
            "  --sample N       hidden states to train on (default 160000, about 39 per list\n"
            "                   of IVF4096, FAISS's minimum; all states if the corpus is smaller)\n"
            "  --out PATH       where to write the index (default DIR/unbounded.faiss)\n"
            "  --seed S         sampling seed (default 1)\n"
            "  --threads N      OpenMP threads for FAISS training (default 1)\n"
            "  --no-normalize   FILE is already in the model's text conventions (white-space split)\n"
            "  -h, --help       this help\n"
            "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n");
}

typedef struct {
    float *x;                     /* [cap, H] reservoir */
    size_t cap, kept, seen;
    int H;
    nc_rng rng;
} reservoir;

/* Reservoir sampling (Vitter's algorithm R): every state of the corpus ends in
 * the sample with the same probability cap/seen, whatever the corpus length. */
static int keep_sample(const float *h, const int *ids, size_t n, void *ctx, char *err, size_t errlen)
{
    (void)ids, (void)err, (void)errlen;
    reservoir *r = ctx;
    for (size_t i = 0; i < n; i++, r->seen++) {
        size_t slot = r->seen;
        if (slot >= r->cap) {
            slot = (size_t)(rng_next(&r->rng) % (r->seen + 1));
            if (slot >= r->cap)
                continue;
        } else {
            r->kept++;
        }
        memcpy(r->x + slot * r->H, h + i * r->H, (size_t)r->H * sizeof(float));
    }
    return NC_OK;
}

int cmd_build_index(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},  {"corpus", required_argument, NULL, 'c'},
        {"factory", required_argument, NULL, 'f'}, {"sample", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},    {"seed", required_argument, NULL, 'S'},
        {"threads", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
        {"no-normalize", no_argument, NULL, CO_NO_NORMALIZE}, {NULL, 0, NULL, 0},
    };
    const char *model_dir = NULL, *corpus = NULL, *factory_arg = NULL, *out_arg = NULL;
    long sample = 160000, seed = 1, threads = 0;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case CO_NO_NORMALIZE: co_parse_normalize(c); break;
        case 'c': corpus = optarg; break;
        case 'f': factory_arg = optarg; break;
        case 'o': out_arg = optarg; break;
        case 's':
            if (!co_parse_int(optarg, 1, 100000000, &sample)) {
                fprintf(stderr, "neurocache build-index: --sample must be an integer in [1, 1e8], not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'S':
            if (!co_parse_int(optarg, 0, 0x7fffffffL, &seed)) {
                fprintf(stderr, "neurocache build-index: bad --seed '%s'\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (!co_parse_int(optarg, 1, 1024, &threads)) {
                fprintf(stderr, "neurocache build-index: bad --threads '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: return co_bad_option("build-index", opts, c, argv);
        }
    }
    if (!model_dir || !corpus || optind != argc) {
        return co_usage_error("build-index", "%s",
                              !model_dir ? "--model DIR is required"
                              : !corpus  ? "--corpus FILE is required"
                                         : "unexpected argument");
    }
    /* one OpenMP thread unless asked (see cacheopts_finish): FAISS's
     * spin-waiting threads are slowest exactly when the cores are busy */
    unbounded_cache_set_threads(threads > 0 ? (int)threads : 1);

    char err[NC_ERRLEN], factory[128], out[1200];
    nc_model *m = NULL;
    nc_tokens toks;
    tokens_init(&toks);
    reservoir r = {0};
    FaissIndex *idx = NULL;
    int rc = model_load(model_dir, &m, err, sizeof err);
    if (!rc) {
        const int H = m->cfg.hidden_size;
        if (factory_arg)
            snprintf(factory, sizeof factory, "%s", factory_arg);
        else
            /* np: see unbounded_cache.c -- skips polysemous training, same index */
            snprintf(factory, sizeof factory, "IVF4096,PQ%dnp", H / 8 > 0 ? H / 8 : 1);
        snprintf(out, sizeof out, "%s/unbounded.faiss", model_dir);
        if (out_arg)
            snprintf(out, sizeof out, "%s", out_arg);
        /* the factory string is checked before the long pass over the corpus */
        if (faiss_index_factory(&idx, H, factory, METRIC_L2)) {
            const char *fm = faiss_get_last_error();
            rc = nc_error(err, sizeof err, NC_EINVAL, "bad --factory '%s': %s", factory, fm ? fm : "FAISS error");
        }
    }
    if (!rc)
        rc = co_read_tokens(m, corpus, &toks, err, sizeof err);
    if (!rc && toks.n == 0)
        rc = nc_error(err, sizeof err, NC_EINVAL, "%s: no tokens", corpus);
    double t0 = co_now();
    if (!rc) {
        r.H = m->cfg.hidden_size;
        r.cap = (size_t)sample < toks.n ? (size_t)sample : toks.n;
        rng_seed(&r.rng, (uint64_t)seed);
        r.x = malloc(r.cap * (size_t)r.H * sizeof(float));
        if (!r.x)
            rc = nc_error(err, sizeof err, NC_ENOMEM, "sample of %zu states", r.cap);
    }
    if (!rc) {
        fprintf(stderr, "build-index: running the model over %zu tokens of %s\n", toks.n, corpus);
        rc = co_hidden_pass(m, &toks, NULL, keep_sample, &r, true, err, sizeof err);
    }
    if (!rc) {
        fprintf(stderr, "build-index: training %s on %zu of %zu hidden states (dim %d)\n", factory, r.kept,
                r.seen, r.H);
        double t1 = co_now();
        if (faiss_Index_train(idx, (idx_t)r.kept, r.x)) {
            const char *fm = faiss_get_last_error();
            rc = nc_error(err, sizeof err, NC_EFORMAT, "training %s: %s", factory, fm ? fm : "FAISS error");
        } else {
            fprintf(stderr, "build-index: trained in %.1f s\n", co_now() - t1);
        }
    }
    if (!rc) {
        /* a crash never leaves a half-written index */
        nc_atomicfile a;
        rc = atomicfile_open(&a, out, err, sizeof err);
        if (!rc && faiss_write_index(idx, a.f)) {
            const char *fm = faiss_get_last_error();
            rc = nc_error(err, sizeof err, NC_EIO, "writing %s: %s", out, fm ? fm : "FAISS error");
        }
        rc = atomicfile_commit(&a, rc, err, sizeof err);
        if (!rc) {
            fprintf(stderr, "build-index: wrote %s (%s, trained, empty) in %.1f s total\n", out, factory,
                    co_now() - t0);
        }
    }
    if (rc)
        fprintf(stderr, "neurocache build-index: %s\n", err);
    if (idx)
        faiss_Index_free(idx);
    free(r.x);
    tokens_clear(&toks);
    model_free(m);
    return rc ? 1 : 0;
}
