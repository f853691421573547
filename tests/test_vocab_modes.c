/* test_vocab_modes.c -- one namespace, read by closed- and open-vocabulary
 * sessions (design §4): the real daemon (a document uploaded, then a session
 * fed the text with "adapt" and "scores") gives the log-probabilities of
 * `neurocache score --memory` within a bound derived below, in both modes,
 * on a text with out-of-vocabulary words; a closed-vocabulary session reads
 * the namespace's OOV words as <unk> in its predictions, components and
 * explain while an open-vocabulary one keeps their names; a closed session
 * that adapts stores its OOV words by name, so open readers see them. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon.h"
#include "harness.h"
#include "lstm.h"
#include "model.h"
#include "tokenizer.h"
#include "tolerance.h"

static char model_dir[512], data_dir[128] = "/tmp/nc-test-vocab-XXXXXX";
static char mem_path[160], text_path[160];
static char *mem_text, *score_text;

static const char *nn(const char *s) { return s ? s : "(null)"; }

static int start(nc_daemon *d)
{
    const char *args[] = {"--model", model_dir, "--data-dir", data_dir, "--log-format", "text", NULL};
    return daemon_start(d, args);
}

static json_t *call(nc_daemon *d, const char *method, const char *path, const char *body, long *status)
{
    http_resp r;
    json_t *j = NULL;
    *status = -1;
    if (http_json(d->port, method, path, body, &r) == 0) {
        *status = r.status;
        j = r.json ? json_incref(r.json) : NULL;
    }
    http_resp_free(&r);
    return j;
}

static long upload(nc_daemon *d, const char *ns, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/namespaces/%s/documents?id=doc-a", ns);
    http_resp r;
    long st = -1;
    if (http_call(d->port, "POST", path, "text/plain", text, strlen(text), &r) == 0)
        st = r.status;
    http_resp_free(&r);
    return st;
}

/* A deterministic text of lines x 12 words: model words w0..w47, and with
 * probability ~1/6 an out-of-vocabulary word of oov[0..noov) or a literal
 * <unk> (which a closed reader must not tell apart from the OOV words). */
static char *gen_text(unsigned seed, int lines, const char *const *oov, int noov)
{
    size_t cap = (size_t)lines * 12 * 16 + 1, n = 0;
    char *s = malloc(cap);
    for (int l = 0; l < lines; l++) {
        for (int w = 0; w < 12; w++) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = (seed >> 16) & 0x7fff;
            if (r % 6 == 0)
                n += (size_t)sprintf(s + n, "%s%s", w ? " " : "", r % 5 == 0 ? "<unk>" : oov[(r / 6) % (unsigned)noov]);
            else
                n += (size_t)sprintf(s + n, "%sw%u", w ? " " : "", (r / 7) % 48);
        }
        s[n++] = '\n';
    }
    s[n] = 0;
    return s;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* ---- the bound between the daemon and the CLI ------------------------------
 *
 * Both compute, for every token x_t of the text, log p = log((1-λ) p_model +
 * λ p_kde) (design §4; with open vocabulary then mixed with μ/|V_full|, the
 * same |V_full| on both sides: a fresh namespace holds exactly the CLI
 * table's words). With knn above the number of stored pairs every stored
 * pair i < t is a neighbour on both sides (the same set: the memory's pairs
 * and the text's earlier ones, added by "adapt" / score's own adaptation),
 * so θ_t² = max_i d_i² and p_kde(w) = Σ_{w_i=w} K_i / Σ_i K_i with log K_i =
 * -d_i² / (2 θ_t²), a continuous function of the squared distances. What
 * differs:
 *
 *  1. The namespace stores keys rounded to binary16 (nsstore: key_f16), the
 *     CLI float32: e_c = |fl16(k_c) - k_c| <= 2^-11 |k_c| + 2^-25 (half an
 *     ulp relative, or absolute in the subnormal range).
 *  2. Hidden states come from other batchings (upload batches, CLI chunks)
 *     and thread counts: every component within η = 2 * 6.4e-5 on the
 *     fixtures (tolerance.h: a pre-activation off by at most 6.4e-5 moves h
 *     by at most twice that), for queries and keys alike.
 *  3. FAISS computes d² = |q|² + |k|² - 2 q.k in float32, on each side:
 *     within γ(H+2) (|q| + |k|)² each (Higham, Lemma 3.1: sums of <= H+2
 *     terms whose magnitudes add up to at most (|q| + |k|)²).
 *
 *  So with δ_c = 2η + e_c, pair i's d² differs by at most
 *     ε_i = 2 Σ_c |q_c - k_c| δ_c + Σ_c δ_c² + 2 γ(H+2) (|q| + |k|)²,
 *  and θ_t² by at most ε_t = max_i ε_i. log K_i = -d_i²/(2θ²) has partial
 *  derivatives -1/(2θ²) in d_i² and d_i²/(2θ⁴) <= 1/(2θ²) in θ² (d_i <= θ):
 *  it moves by at most ε_t / (θ_t² - ε_t), and log p_kde, a difference of
 *  two log-sum-exps of them, by twice that. The static part log p_model
 *  moves by at most TOL_FIXTURE_PATHS (tolerance.h), and the mixtures (with
 *  λ, then μ) are 1-Lipschitz in the max norm of their components' logs:
 *     tol_t = max(TOL_FIXTURE_PATHS, 2 ε_t / (θ_t² - ε_t)).
 *  The kernel sums themselves run in double (mixture.c): their rounding is
 *  below 1e-12 and absorbed by the margins above. */

typedef struct {
    nc_model *m;
    int H;
    float *k;                     /* [nm + nt, H]: memory pairs' keys, then the text's */
    size_t nm, nt;
} keyset;

/* h before every token of text, from the state after one eos (as an upload,
 * a session and the CLI all start): rows [n, H] written to out. */
static int hidden_rows(nc_model *m, const char *text, float **out, size_t *n)
{
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN];
    int H = m->cfg.hidden_size, rc = tokenize(m, text, strlen(text), true, &t, err, sizeof err);
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    float *h = malloc((t.n + 1) * (size_t)H * sizeof(float));
    if (!rc && s && w && h) {
        lstm_step(m, s, m->eos_id, w);
        memcpy(h, lstm_state_top(s), (size_t)H * sizeof(float));
        rc = lstm_forward_seq(m, s, t.ids, t.n, h + H, err, sizeof err);
    } else {
        rc = -1;
    }
    *out = h;
    *n = t.n;
    tokens_clear(&t);
    lstm_state_free(s);
    lstm_work_free(w);
    return rc;
}

static double tol_token(const keyset *ks, size_t t)
{
    const int H = ks->H;
    const double eta = 2 * 6.4e-5, gam = (H + 2) * F32_U / (1 - (H + 2) * F32_U);
    const float *q = ks->k + (ks->nm + t) * (size_t)H;
    double qn = 0;
    for (int c = 0; c < H; c++)
        qn += (double)q[c] * q[c];
    qn = sqrt(qn);
    double eps = 0, theta2 = 0;
    for (size_t i = 0; i < ks->nm + t; i++) {
        const float *k = ks->k + i * (size_t)H;
        double d2 = 0, kn = 0, lin = 0, quad = 0;
        for (int c = 0; c < H; c++) {
            double diff = (double)q[c] - k[c], dc = 2 * eta + 0x1p-11 * fabs((double)k[c]) + 0x1p-25;
            d2 += diff * diff;
            kn += (double)k[c] * k[c];
            lin += fabs(diff) * dc;
            quad += dc * dc;
        }
        kn = sqrt(kn);
        double e = 2 * lin + quad + 2 * gam * (qn + kn) * (qn + kn);
        if (e > eps)
            eps = e;
        if (d2 > theta2)
            theta2 = d2;
    }
    if (theta2 <= 2 * eps)
        return INFINITY;   /* the bound says nothing; the test reports it */
    double kde = 2 * eps / (theta2 - eps);
    return kde > TOL_FIXTURE_PATHS ? kde : TOL_FIXTURE_PATHS;
}

/* The CLI's log-probabilities (score --format json): malloc'ed, NAN = null. */
static double *cli_logprobs(bool open, size_t *n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' score --model '%s' --memory '%s' --unbounded --knn 1024 --unbounded-lambda 0.5 %s "
             "--format json '%s' 2>/dev/null",
             daemon_bin_path("neurocache"), model_dir, mem_path, open ? "--open-vocab --uniform-mu 0.05" : "",
             text_path);
    FILE *p = popen(cmd, "r");
    json_error_t je;
    json_t *o = p ? json_loadf(p, 0, &je) : NULL;
    int st = p ? pclose(p) : -1;
    double *lp = NULL;
    json_t *a = json_object_get(o, "logprobs");
    *n = json_array_size(a);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && *n) {
        lp = malloc(*n * sizeof(double));
        for (size_t i = 0; i < *n; i++) {
            json_t *v = json_array_get(a, i);
            lp[i] = json_is_number(v) ? json_number_value(v) : NAN;
        }
    }
    json_decref(o);
    return lp;
}

/* The daemon's: upload the memory into ns, a session reading it fed the
 * text with adapt and scores. */
static double *daemon_logprobs(nc_daemon *d, const char *ns, bool open, size_t *n)
{
    *n = 0;
    CHECK(upload(d, ns, mem_text) == 200);
    char body[512], path[256];
    snprintf(body, sizeof body,
             "{\"id\":\"s-%s\",\"namespace\":\"%s\",\"cache\":{\"unbounded\":true,\"knn\":1024,"
             "\"unbounded_lambda\":0.5%s}}", ns, ns, open ? ",\"open_vocab\":true,\"uniform_mu\":0.05" : "");
    long st;
    json_decref(call(d, "POST", "/v1/sessions", body, &st));
    CHECKF(st == 201, "session: %ld", st);
    json_t *req = json_pack("{s:s,s:b,s:b}", "text", score_text, "scores", 1, "adapt", 1);
    snprintf(path, sizeof path, "/v1/sessions/s-%s/feed", ns);
    http_resp r;
    double *lp = NULL;
    if (http_post_json(d->port, path, req, &r) == 0 && r.status == 200) {
        json_t *a = json_object_get(r.json, "logprobs");
        *n = json_array_size(a);
        lp = malloc((*n + 1) * sizeof(double));
        for (size_t i = 0; i < *n; i++) {
            json_t *v = json_array_get(a, i);
            lp[i] = json_is_number(v) ? json_number_value(v) : NAN;
        }
    } else {
        CHECKF(0, "feed: %ld %s", r.status, nn(r.body));
    }
    http_resp_free(&r);
    json_decref(req);
    return lp;
}

static void compare(nc_daemon *d, const keyset *ks, const char *ns, bool open)
{
    size_t nd = 0, nc = 0;
    double *ld = daemon_logprobs(d, ns, open, &nd), *lc = cli_logprobs(open, &nc);
    CHECKF(ld && lc && nd == nc && nd == ks->nt, "%s: daemon %zu, CLI %zu, text %zu tokens", ns, nd, nc, ks->nt);
    if (!ld || !lc || nd != nc || nd != ks->nt) {
        free(ld);
        free(lc);
        return;
    }
    size_t bad = 0, finite = 0;
    double worst = 0, worst_tol = 0, sd = 0, sc = 0;
    for (size_t t = 0; t < nd; t++) {
        bool both_null = isnan(ld[t]) && isnan(lc[t]);
        double tol = tol_token(ks, t), diff = both_null ? 0 : fabs(ld[t] - lc[t]);
        if (!(diff <= tol)) {
            if (bad++ < 5)
                fprintf(stderr, "  %s token %zu: daemon %.9g, CLI %.9g, |diff| %.3g > tol %.3g\n", ns, t, ld[t],
                        lc[t], diff, tol);
        } else if (diff * worst_tol >= worst * tol) {
            worst = diff;   /* the token closest to its bound */
            worst_tol = tol;
        }
        if (!both_null) {
            sd += ld[t];
            sc += lc[t];
            finite++;
        }
    }
    CHECKF(bad == 0, "%s: %zu of %zu tokens outside the bound", ns, bad, nd);
    CHECK(finite == nd);   /* μ > 0 in open vocabulary: every token has mass */
    fprintf(stderr, "  %s: perplexity daemon %.6f, CLI %.6f; closest to its bound: |diff| %.3g, bound %.3g\n",
            ns, exp(-sd / (double)nd), exp(-sc / (double)nd), worst, worst_tol);
    free(ld);
    free(lc);
}

TEST(daemon_equals_cli_both_modes)
{
    char err[NC_ERRLEN];
    keyset ks = {0};
    CHECKF(model_load(model_dir, &ks.m, err, sizeof err) == NC_OK, "%s", err);
    if (!ks.m)
        return;
    ks.H = ks.m->cfg.hidden_size;
    float *km = NULL, *kt = NULL;
    CHECK(hidden_rows(ks.m, mem_text, &km, &ks.nm) == 0);
    CHECK(hidden_rows(ks.m, score_text, &kt, &ks.nt) == 0);
    ks.k = malloc((ks.nm + ks.nt) * (size_t)ks.H * sizeof(float));
    memcpy(ks.k, km, ks.nm * (size_t)ks.H * sizeof(float));
    memcpy(ks.k + ks.nm * (size_t)ks.H, kt, ks.nt * (size_t)ks.H * sizeof(float));
    free(km);
    free(kt);
    CHECK(ks.nm + ks.nt < 1024);   /* knn 1024: every stored pair is a neighbour */
    nc_daemon d;
    CHECK(start(&d) == 0);
    compare(&d, &ks, "closed", false);
    compare(&d, &ks, "open", true);
    CHECK(daemon_stop(&d) == 0);
    free(ks.k);
    model_free(ks.m);
}

/* ---- what a closed reader sees of a namespace ------------------------------- */

static const char *DOC = "w3 w4 w5 quetzalcoatl w6 w7\nw8 w9 w3 w4 w5 quetzalcoatl w10\n";

static json_t *session_predict(nc_daemon *d, const char *sid, const char *ns, bool open, const char *text)
{
    char body[512], path[256];
    long st;
    snprintf(body, sizeof body,
             "{\"id\":\"%s\",\"namespace\":\"%s\",\"cache\":{\"unbounded\":true,\"knn\":32,"
             "\"unbounded_lambda\":0.5,\"open_vocab\":%s}}", sid, ns, open ? "true" : "false");
    json_decref(call(d, "POST", "/v1/sessions", body, &st));
    CHECKF(st == 201, "session %s: %ld", sid, st);
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
    snprintf(body, sizeof body, "{\"text\":\"%s\"}", text);
    json_decref(call(d, "POST", path, body, &st));
    CHECK(st == 200);
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
    json_t *p = call(d, "POST", path, "{\"top_k\":60,\"components\":true,\"explain\":true}", &st);
    CHECK(st == 200 && p);
    return p;
}

static json_t *prediction(json_t *pred, const char *word)
{
    json_t *it;
    size_t i;
    json_array_foreach(json_object_get(pred, "predictions"), i, it)
        if (strcmp(nn(json_string_value(json_object_get(it, "word"))), word) == 0)
            return it;
    return NULL;
}

static double unbounded_share(json_t *it)
{
    return json_real_value(json_object_get(json_object_get(it, "components"), "unbounded"));
}

/* One namespace, both kinds of reader at once: the closed session's <unk>
 * gets exactly the unbounded mass the open one gives quetzalcoatl (the only
 * OOV word stored, no literal <unk>), explained by the same two entries. */
TEST(closed_reader_sees_unk)
{
    nc_daemon d;
    CHECK(start(&d) == 0);
    CHECK(upload(&d, "zoo", DOC) == 200);
    json_t *c = session_predict(&d, "closed", "zoo", false, "w8 w9 w3 w4 w5");
    json_t *o = session_predict(&d, "open", "zoo", true, "w8 w9 w3 w4 w5");
    CHECKF(json_integer_value(json_object_get(c, "vocab_size")) == 50, "closed vocab_size %lld",
           (long long)json_integer_value(json_object_get(c, "vocab_size")));
    CHECK(json_integer_value(json_object_get(o, "vocab_size")) == 51);
    CHECK(prediction(c, "quetzalcoatl") == NULL);
    json_t *cu = prediction(c, "<unk>"), *oq = prediction(o, "quetzalcoatl"), *ou = prediction(o, "<unk>");
    CHECK(cu && oq && ou);
    if (cu && oq && ou) {
        CHECKF(unbounded_share(oq) > 0.05, "open: quetzalcoatl's unbounded share %g", unbounded_share(oq));
        CHECK(unbounded_share(ou) == 0);
        /* the same neighbours and kernel weights on both sides: equal to
         * float32 rounding of one product λ q[w] (2 u relative) */
        CHECKF(fabs(unbounded_share(cu) - unbounded_share(oq)) <= 2 * F32_U * unbounded_share(oq),
               "closed <unk> %.9g, open quetzalcoatl %.9g", unbounded_share(cu), unbounded_share(oq));
        json_t *ex = json_object_get(cu, "explain");
        CHECKF(json_array_size(ex) == 2, "closed <unk> explain: %zu entries", json_array_size(ex));
        for (size_t k = 0; k < json_array_size(ex); k++) {
            json_t *e = json_array_get(ex, k);
            long off = (long)json_integer_value(json_object_get(e, "offset"));
            CHECK(strcmp(nn(json_string_value(json_object_get(e, "document"))), "doc-a") == 0);
            CHECKF(off == 3 || off == 12, "offset %ld", off);
        }
    }
    json_decref(c);
    json_decref(o);
    CHECK(daemon_stop(&d) == 0);
}

/* A closed session that adapts stores its OOV words by name: an open
 * reader of the namespace then predicts them. */
TEST(closed_writer_stores_names)
{
    nc_daemon d;
    CHECK(start(&d) == 0);
    long st;
    json_decref(call(&d, "POST", "/v1/sessions",
                     "{\"id\":\"w\",\"namespace\":\"mixed\",\"cache\":{\"unbounded\":true,\"knn\":32}}", &st));
    CHECK(st == 201);
    json_decref(call(&d, "POST", "/v1/sessions/w/feed",
                     "{\"text\":\"w1 w2 ocelot w3 w1 w2 ocelot\",\"adapt\":true}", &st));
    CHECK(st == 200);
    json_t *j = call(&d, "GET", "/v1/namespaces/mixed", NULL, &st);
    CHECKF(json_integer_value(json_object_get(j, "entries")) == 7 &&
           json_integer_value(json_object_get(j, "words")) == 1, "entries %lld words %lld",
           (long long)json_integer_value(json_object_get(j, "entries")),
           (long long)json_integer_value(json_object_get(j, "words")));
    json_decref(j);
    json_t *o = session_predict(&d, "r", "mixed", true, "w3 w1 w2");
    json_t *it = prediction(o, "ocelot");
    CHECKF(it && unbounded_share(it) > 0.05, "open reader: ocelot %s", it ? "has no mass" : "absent");
    json_decref(o);
    CHECK(daemon_stop(&d) == 0);
}

int main(void)
{
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    if (!mkdtemp(data_dir))
        return 1;
    snprintf(mem_path, sizeof mem_path, "%s-memory.txt", data_dir);
    snprintf(text_path, sizeof text_path, "%s-text.txt", data_dir);
    static const char *const oov_mem[] = {"quetzalcoatl", "ocelot", "axolotl", "tapir"};
    static const char *const oov_text[] = {"quetzalcoatl", "ocelot", "axolotl", "tapir", "narwhal"};
    mem_text = gen_text(7, 30, oov_mem, 4);
    score_text = gen_text(11, 10, oov_text, 5);
    if (write_file(mem_path, mem_text) || write_file(text_path, score_text))
        return 1;
    httpc_init();
    RUN(daemon_equals_cli_both_modes);
    RUN(closed_reader_sees_unk);
    RUN(closed_writer_stores_names);
    httpc_cleanup();
    unlink(mem_path);
    unlink(text_path);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
    if (system(cmd) != 0) { /* best effort */ }
    free(mem_text);
    free(score_text);
    return harness_summary();
}
