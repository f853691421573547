/* test_cache_ref.c -- the caches against the reference vectors: every
 * target_logprobs mixture (unigram, neural_linear, neural_global,
 * unbounded_exact_gaussian) within 1e-4 through the full-distribution path
 * (stream_predict) and the target-only path (doc_score, stream_feed, and a
 * document built from the reference's own hidden_last_layer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "harness.h"
#include "stream.h"
#include "doc.h"
#include "lstm.h"
#include "cache_params.h"
#include "tokenizer.h"
#include "model.h"

#define TOL_LOGPROB 1e-4
#define TOL_SUM 1e-5

static const char *fixtures[] = {"lstm-2layer", "lstm-1layer-tied", "lstm-2layer-f16"};
static const char *mixtures[] = {"static", "unigram", "neural_linear", "neural_global",
                                 "unbounded_exact_gaussian"};

typedef struct {
    nc_model *m;
    json_t *ref;
    nc_tokens toks;
    size_t T;
} fixture;

static int fixture_open(const char *name, fixture *f)
{
    char dir[1024], path[1100], err[NC_ERRLEN];
    memset(f, 0, sizeof *f);
    tokens_init(&f->toks);
    snprintf(dir, sizeof dir, "%s/%s", harness_fixtures(), name);
    int rc = model_load(dir, &f->m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s: %s", dir, err);
    if (rc)
        return -1;
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t jerr;
    f->ref = json_load_file(path, 0, &jerr);
    CHECKF(f->ref != NULL, "%s: %s", path, jerr.text);
    if (!f->ref)
        return -1;
    json_t *ids = json_object_get(f->ref, "tokens"), *strs = json_object_get(f->ref, "token_strings");
    f->T = json_array_size(ids);
    for (size_t i = 0; i < f->T; i++) {
        const char *w = json_string_value(json_array_get(strs, i));
        tokens_push(&f->toks, (int)json_integer_value(json_array_get(ids, i)), w, strlen(w), i);
    }
    return 0;
}

static void fixture_close(fixture *f)
{
    model_free(f->m);
    json_decref(f->ref);
    tokens_clear(&f->toks);
}

static double cp(const fixture *f, const char *key)
{
    return json_number_value(json_object_get(json_object_get(f->ref, "cache_params"), key));
}

/* reference log p(x_{t+1} | x_0..x_t) for mixture name */
static double ref_target(const fixture *f, const char *mix, size_t t)
{
    return json_number_value(json_array_get(json_object_get(json_object_get(f->ref, "target_logprobs"), mix), t));
}

static void params_for(const fixture *f, const char *mix, nc_cache_params *p)
{
    cache_params_default(p);
    int N = (int)cp(f, "window");
    if (!strcmp(mix, "unigram")) {
        p->unigram_size = N;
        p->unigram_lambda = (float)cp(f, "unigram_lambda");
    } else if (!strcmp(mix, "neural_linear")) {
        p->neural_size = N;
        p->neural_theta = (float)cp(f, "theta");
        p->neural_lambda = (float)cp(f, "lambda");
    } else if (!strcmp(mix, "neural_global")) {
        p->neural_size = N;
        p->neural_theta = (float)cp(f, "theta");
        p->global_norm = true;
        p->neural_alpha = (float)cp(f, "alpha");
    } else if (!strcmp(mix, "unbounded_exact_gaussian")) {
        p->unbounded = true;
        p->exact = true;
        p->knn = (int)cp(f, "knn_k");
        p->unbounded_lambda = (float)cp(f, "unbounded_lambda");
    }
}

static nc_unbounded_cache *new_exact_ub(const fixture *f)
{
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, f->m->cfg.hidden_size);
    o.exact = true;
    nc_unbounded_cache *u = NULL;
    char err[NC_ERRLEN];
    int rc = unbounded_cache_new(&o, NULL, &u, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return u;
}

/* Target-only path: doc_prepare + doc_score over the whole sequence at once. */
static void check_doc_path(const fixture *f, const char *mix, size_t block)
{
    nc_cache_params p;
    params_for(f, mix, &p);
    char err[NC_ERRLEN];
    nc_state *s = lstm_state_new(f->m);
    nc_doc *d = NULL;
    const nc_doc_prep in = {.m = f->m, .s = s, .has_h = false, .toks = &f->toks};
    int rc = doc_prepare(&in, &d, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    nc_unbounded_cache *ub = p.unbounded ? new_exact_ub(f) : NULL;
    nc_doc_caches c = {.block = block, .ub = ub, .adapt = true};
    double *lp = malloc(f->T * sizeof(double));
    rc = doc_score(d, &p, &c, lp, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    CHECK(isnan(lp[0]));
    double worst = 0;
    for (size_t t = 0; t + 1 < f->T; t++)
        worst = fmax(worst, fabs(lp[t + 1] - ref_target(f, mix, t)));
    CHECKF(worst <= TOL_LOGPROB, "%s doc path (block %zu): max |diff| %g", mix, block, worst);
    free(lp);
    unbounded_cache_free(ub);
    doc_free(d);
    lstm_state_free(s);
}

/* Target-only path on a document built from the reference's hidden states
 * (independent of our LSTM): q row t+1 = hidden_last_layer[t]. */
static void check_hidden_path(const fixture *f, const char *mix)
{
    nc_cache_params p;
    params_for(f, mix, &p);
    char err[NC_ERRLEN];
    const int H = f->m->cfg.hidden_size, V = f->m->cfg.vocab_size;
    nc_doc *d = NULL;
    int rc = doc_alloc(H, V, f->T, &d, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    if (rc)
        return;
    json_t *hid = json_object_get(f->ref, "hidden_last_layer");
    float *logits = malloc((size_t)V * sizeof(float));
    d->first = 1;
    for (size_t t = 0; t < f->T; t++) {
        d->ids[t] = f->toks.ids[t];
        if (t == 0)
            continue;
        float *q = d->q + t * H;
        for (int j = 0; j < H; j++)
            q[j] = (float)json_number_value(json_array_get(json_array_get(hid, t - 1), (size_t)j));
        lstm_logits(f->m, q, logits);
        d->log_z[t] = nc_logsumexp(logits, (size_t)V);
        d->s_target[t] = logits[d->ids[t]];
    }
    nc_unbounded_cache *ub = p.unbounded ? new_exact_ub(f) : NULL;
    nc_doc_caches c = {.block = 7, .ub = ub, .adapt = true};
    double *lp = malloc(f->T * sizeof(double));
    rc = doc_score(d, &p, &c, lp, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    double worst = 0;
    for (size_t t = 0; t + 1 < f->T; t++)
        worst = fmax(worst, fabs(lp[t + 1] - ref_target(f, mix, t)));
    CHECKF(worst <= TOL_LOGPROB, "%s hidden path: max |diff| %g", mix, worst);
    free(lp);
    free(logits);
    unbounded_cache_free(ub);
    doc_free(d);
}

/* Full-distribution path token by token (stream_predict before each token),
 * and the stream's own target-only scores (stream_feed one token at a time). */
static void check_stream_path(const fixture *f, const char *mix)
{
    nc_cache_params p;
    params_for(f, mix, &p);
    char err[NC_ERRLEN];
    nc_unbounded_cache *ub = p.unbounded ? new_exact_ub(f) : NULL;
    nc_stream *s = NULL;
    int rc = stream_new(f->m, &p, ub, NULL, false, &s, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    if (rc)
        return;
    nc_dist dist;
    dist_init(&dist);
    double worst_full = 0, worst_feed = 0, worst_sum = 0, worst_share = 0;
    for (size_t t = 0; t < f->T; t++) {
        if (t > 0) {
            rc = stream_predict(s, true, &dist, err, sizeof err);
            CHECKF(rc == NC_OK, "%s", err);
            if (rc)
                break;
            double sum = 0;
            for (size_t w = 0; w < dist.n; w++) {
                sum += dist.p[w];
                double sh = 0;
                for (int c = 0; c < NC_NCOMP; c++)
                    sh += dist.share[c][w];
                worst_share = fmax(worst_share, fabs(sh - dist.p[w]));
            }
            worst_sum = fmax(worst_sum, fabs(sum - 1.0));
            worst_full = fmax(worst_full, fabs(log(dist.p[f->toks.ids[t]]) - ref_target(f, mix, t - 1)));
        } else {
            CHECK(stream_predict(s, false, &dist, err, sizeof err) == NC_ESTATE);
        }
        nc_tokens one = {.ids = &f->toks.ids[t], .words = &f->toks.words[t], .offsets = &f->toks.offsets[t],
                         .n = 1, .cap = 1};
        double lp;
        rc = stream_feed(s, &one, true, &lp, err, sizeof err);
        CHECKF(rc == NC_OK, "%s", err);
        if (t == 0)
            CHECK(isnan(lp));
        else
            worst_feed = fmax(worst_feed, fabs(lp - ref_target(f, mix, t - 1)));
    }
    CHECKF(worst_full <= TOL_LOGPROB, "%s full path: max |diff| %g", mix, worst_full);
    CHECKF(worst_feed <= TOL_LOGPROB, "%s stream feed: max |diff| %g", mix, worst_feed);
    CHECKF(worst_sum <= TOL_SUM, "%s: distribution sums off by %g", mix, worst_sum);
    CHECKF(worst_share <= 1e-6, "%s: shares do not add up (%g)", mix, worst_share);
    dist_free(&dist);
    stream_free(s);
    unbounded_cache_free(ub);
}

TEST(reference_mixtures)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        fixture f;
        if (fixture_open(fixtures[i], &f) == 0) {
            for (size_t k = 0; k < sizeof mixtures / sizeof *mixtures; k++) {
                check_doc_path(&f, mixtures[k], 0);
                check_doc_path(&f, mixtures[k], 5);
                check_doc_path(&f, mixtures[k], 1);
                check_hidden_path(&f, mixtures[k]);
                check_stream_path(&f, mixtures[k]);
            }
        }
        fixture_close(&f);
    }
}

int main(void)
{
    RUN(reference_mixtures);
    return harness_summary();
}
