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
#include "hidden_pass.h"
#include "report.h"
#include "texts.h"
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

/* The command line. */
typedef struct {
    const char *model_dir, *corpus, *factory_arg, *out_arg;
    long sample, seed, threads;
} build_args;

/* getopt over argv into a, checked; -1 to go on, else the exit status. */
static int build_parse_args(build_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},  {"corpus", required_argument, NULL, 'c'},
        {"factory", required_argument, NULL, 'f'}, {"sample", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},    {"seed", required_argument, NULL, 'S'},
        {"threads", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
        {"no-normalize", no_argument, NULL, CO_NO_NORMALIZE}, {NULL, 0, NULL, 0},
    };
    *a = (build_args){.sample = 160000, .seed = 1};
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model_dir = optarg; break;
        case CO_NO_NORMALIZE: co_parse_normalize(c); break;
        case 'c': a->corpus = optarg; break;
        case 'f': a->factory_arg = optarg; break;
        case 'o': a->out_arg = optarg; break;
        case 's':
            if (!co_parse_int(optarg, 1, 100000000, &a->sample)) {
                fprintf(stderr, "neurocache build-index: --sample must be an integer in [1, 1e8], not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'S':
            if (!co_parse_int(optarg, 0, 0x7fffffffL, &a->seed)) {
                fprintf(stderr, "neurocache build-index: bad --seed '%s'\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (!co_parse_int(optarg, 1, 1024, &a->threads)) {
                fprintf(stderr, "neurocache build-index: bad --threads '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: return co_bad_option("build-index", opts, c, argv);
        }
    }
    if (!a->model_dir || !a->corpus || optind != argc) {
        return co_usage_error("build-index", "%s",
                              !a->model_dir ? "--model DIR is required"
                              : !a->corpus  ? "--corpus FILE is required"
                                            : "unexpected argument");
    }
    return -1;
}

/* The index being built: its factory string and where it goes. */
typedef struct {
    FaissIndex *idx;
    char factory[128];
    char out[1200];
} build_index;

/* The empty index of the factory string (--factory, or IVF4096,PQ{H/8}np)
 * and the path it goes to; checked before the long pass over the corpus. */
static int build_new_index(const build_args *a, const nc_model *m, build_index *bi, char *err, size_t errlen)
{
    const int H = m->cfg.hidden_size;
    if (a->factory_arg)
        snprintf(bi->factory, sizeof bi->factory, "%s", a->factory_arg);
    else
        /* np: see unbounded_cache.c -- skips polysemous training, same index */
        snprintf(bi->factory, sizeof bi->factory, "IVF4096,PQ%dnp", H / 8 > 0 ? H / 8 : 1);
    snprintf(bi->out, sizeof bi->out, "%s/unbounded.faiss", a->model_dir);
    if (a->out_arg)
        snprintf(bi->out, sizeof bi->out, "%s", a->out_arg);
    if (faiss_index_factory(&bi->idx, H, bi->factory, METRIC_L2)) {
        const char *fm = faiss_get_last_error();
        return nc_error(err, errlen, NC_EINVAL, "bad --factory '%s': %s", bi->factory, fm ? fm : "FAISS error");
    }
    return NC_OK;
}

/* The reservoir sample of --sample hidden states of the corpus. */
static int build_sample(const build_args *a, const nc_model *m, const nc_tokens *toks, reservoir *r, char *err,
                        size_t errlen)
{
    r->H = m->cfg.hidden_size;
    r->cap = (size_t)a->sample < toks->n ? (size_t)a->sample : toks->n;
    rng_seed(&r->rng, (uint64_t)a->seed);
    r->x = malloc(r->cap * (size_t)r->H * sizeof(float));
    if (!r->x)
        return nc_error(err, errlen, NC_ENOMEM, "sample of %zu states", r->cap);
    fprintf(stderr, "build-index: running the model over %zu tokens of %s\n", toks->n, a->corpus);
    return co_hidden_pass(&(co_text){.m = m, .toks = toks}, keep_sample, r, true, err, errlen);
}

/* Trains the index on the sample. */
static int build_train(FaissIndex *idx, const char *factory, const reservoir *r, char *err, size_t errlen)
{
    fprintf(stderr, "build-index: training %s on %zu of %zu hidden states (dim %d)\n", factory, r->kept, r->seen,
            r->H);
    double t1 = nc_now_s();
    if (faiss_Index_train(idx, (idx_t)r->kept, r->x)) {
        const char *fm = faiss_get_last_error();
        return nc_error(err, errlen, NC_EFORMAT, "training %s: %s", factory, fm ? fm : "FAISS error");
    }
    fprintf(stderr, "build-index: trained in %.1f s\n", nc_now_s() - t1);
    return NC_OK;
}

/* Writes the index to out; a crash never leaves a half-written index. */
static int build_write(FaissIndex *idx, const char *out, char *err, size_t errlen)
{
    nc_atomicfile a;
    int rc = atomicfile_open(&a, out, err, errlen);
    if (!rc && faiss_write_index(idx, a.f)) {
        const char *fm = faiss_get_last_error();
        rc = nc_error(err, errlen, NC_EIO, "writing %s: %s", out, fm ? fm : "FAISS error");
    }
    return atomicfile_commit(&a, rc, err, errlen);
}

int cmd_build_index(int argc, char **argv)
{
    build_args a;
    int st = build_parse_args(&a, argc, argv);
    if (st >= 0)
        return st;
    /* one OpenMP thread unless asked (see cacheopts_finish): FAISS's
     * spin-waiting threads are slowest exactly when the cores are busy */
    unbounded_cache_set_threads(a.threads > 0 ? (int)a.threads : 1);

    char err[NC_ERRLEN];
    nc_model *m = NULL;
    nc_tokens toks;
    tokens_init(&toks);
    reservoir r = {0};
    static build_index bi;
    int rc = model_load(a.model_dir, &m, err, sizeof err);
    if (!rc)
        rc = build_new_index(&a, m, &bi, err, sizeof err);
    if (!rc)
        rc = co_read_tokens(m, a.corpus, &toks, err, sizeof err);
    if (!rc && toks.n == 0)
        rc = nc_error(err, sizeof err, NC_EINVAL, "%s: no tokens", a.corpus);
    double t0 = nc_now_s();
    if (!rc)
        rc = build_sample(&a, m, &toks, &r, err, sizeof err);
    if (!rc)
        rc = build_train(bi.idx, bi.factory, &r, err, sizeof err);
    if (!rc)
        rc = build_write(bi.idx, bi.out, err, sizeof err);
    if (!rc)
        fprintf(stderr, "build-index: wrote %s (%s, trained, empty) in %.1f s total\n", bi.out, bi.factory,
                nc_now_s() - t0);
    if (rc)
        fprintf(stderr, "neurocache build-index: %s\n", err);
    if (bi.idx)
        faiss_Index_free(bi.idx);
    free(r.x);
    tokens_clear(&toks);
    model_free(m);
    return rc ? 1 : 0;
}
