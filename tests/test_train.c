/* test_train.c -- training: gradient check against central differences,
 * over-fitting, determinism, interrupted+resumed == uninterrupted, and the
 * eval-mode forward against the inference path. */
#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lstm.h"
#include "lstm_grad.h"
#include "model.h"
#include "optim.h"
#include "rng.h"
#include "train.h"

#include <jansson.h>

/* Mean loss of one segment from a fixed initial state, in eval mode. */
static double seg_loss(lstm_grad_net *n, lstm_grad_work *w, const float *h0, const float *c0,
                       const int *x, const int *y, int T)
{
    size_t cnt = lstm_grad_work_state_floats(w);
    memcpy(lstm_grad_work_state_h(w), h0, cnt * sizeof(float));
    memcpy(lstm_grad_work_state_c(w), c0, cnt * sizeof(float));
    return lstm_grad_segment(n, w, x, y, T, NULL) / (double)(T * 3);
}

/* Central differences f'(w) ~ (f(w+e) - f(w-e)) / 2e, refined by Richardson
 * extrapolation (4 D(e/2) - D(e)) / 3 so that float rounding (which grows as
 * e shrinks) and truncation (which grows as e grows) both stay below 1e-4. */
static void gradient_check(bool tied)
{
    enum { V = 11, E = 6, H = 6, L = 2, T = 5, B = 3 };
    char err[NC_ERRLEN];
    lstm_grad_net *n = NULL;
    lstm_grad_work *w = NULL;
    CHECK(lstm_grad_net_new(&(lstm_grad_shape){V, E, H, L, tied}, &n, err, sizeof err) == NC_OK);
    CHECK(lstm_grad_work_new(n, T, B, &w, err, sizeof err) == NC_OK);
    if (!n || !w)
        goto done;
    nc_rng rng;
    rng_seed(&rng, tied ? 7 : 8);
    lstm_grad_init_uniform(n, &rng, 0.5f, 0.5f);
    /* Non-zero decoder bias, so its gradient path is exercised too. */
    float *db;
    size_t cnt;
    lstm_grad_tensor(n, n->n_tensors - 1, NULL, &db, NULL, &cnt);
    for (size_t i = 0; i < cnt; i++)
        db[i] = 0.3f * (rng_uniform(&rng) - 0.5f);
    size_t sc = lstm_grad_work_state_floats(w);
    float *h0 = malloc(sc * sizeof(float)), *c0 = malloc(sc * sizeof(float));
    for (size_t i = 0; i < sc; i++)
        h0[i] = 0.8f * (rng_uniform(&rng) - 0.5f), c0[i] = 2.0f * (rng_uniform(&rng) - 0.5f);
    int x[15], y[15];
    for (int i = 0; i < T * B; i++)
        x[i] = (int)(rng_next(&rng) % V), y[i] = (int)(rng_next(&rng) % V);

    memcpy(lstm_grad_work_state_h(w), h0, sc * sizeof(float));
    memcpy(lstm_grad_work_state_c(w), c0, sc * sizeof(float));
    lstm_grad_segment(n, w, x, y, T, &(const lstm_grad_pass){.backward = true});
    float *ga = malloc(n->n * sizeof(float));
    memcpy(ga, n->g, n->n * sizeof(float));

    for (int t = 0; t < n->n_tensors; t++) {
        const char *name;
        float *wt, *gt;
        lstm_grad_tensor(n, t, &name, &wt, &gt, &cnt);
        char tname[64];
        snprintf(tname, sizeof tname, "%s", name);
        const float *gat = ga + (gt - n->g);
        double maxrel = 0, num2 = 0, diff2 = 0;
        for (size_t i = 0; i < cnt; i++) {
            float orig = wt[i];
            double d[2];
            const float eps[2] = {8e-2f, 4e-2f};
            for (int e = 0; e < 2; e++) {
                wt[i] = orig + eps[e];
                double lp = seg_loss(n, w, h0, c0, x, y, T);
                wt[i] = orig - eps[e];
                double lm = seg_loss(n, w, h0, c0, x, y, T);
                wt[i] = orig;
                d[e] = (lp - lm) / (2.0 * eps[e]);
            }
            double num = (4.0 * d[1] - d[0]) / 3.0, an = gat[i];
            double rel = fabs(num - an) / fmax(fmax(fabs(num), fabs(an)), 1e-2);
            if (rel > maxrel)
                maxrel = rel;
            num2 += num * num;
            diff2 += (num - an) * (num - an);
        }
        double tensor_rel = sqrt(diff2) / fmax(sqrt(num2), 1e-12);
        CHECKF(maxrel <= 1e-3 && tensor_rel <= 1e-3, "%s%s: max elementwise rel err %.3g, tensor rel err %.3g (norm %.3g)",
               tied ? "tied " : "", tname, maxrel, tensor_rel, sqrt(num2));
    }
    free(ga);
    free(h0);
    free(c0);
done:
    lstm_grad_work_free(w);
    lstm_grad_net_free(n);
}

TEST(gradient_check_untied) { gradient_check(false); }
TEST(gradient_check_tied) { gradient_check(true); }

/* The training forward in eval mode reproduces PyTorch's log-probabilities
 * of the reference models (design §2: |delta| <= 1e-4). */
static void pytorch_reference(const char *fixture)
{
    char dir[512], path[600], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/%s", harness_fixtures(), fixture);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    nc_model *m = NULL;
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    CHECKF(ref != NULL, "%s: %s", path, jerr.text);
    CHECKF(model_load(dir, &m, err, sizeof err) == NC_OK, "%s", err);
    lstm_grad_net *n = NULL;
    lstm_grad_work *w = NULL;
    if (!ref || !m)
        goto done;
    CHECK(lstm_grad_net_new(&(lstm_grad_shape){m->cfg.vocab_size, m->cfg.embedding_size, m->cfg.hidden_size,
                                                m->cfg.num_layers, m->cfg.tie_weights},
                            &n, err, sizeof err) == NC_OK);
    CHECK(lstm_grad_work_new(n, 4, 1, &w, err, sizeof err) == NC_OK);
    CHECK(lstm_grad_from_model(n, m, err, sizeof err) == NC_OK);
    json_t *toks = json_object_get(ref, "tokens");
    json_t *lp = json_object_get(json_object_get(ref, "target_logprobs"), "static");
    size_t T = json_array_size(toks);
    CHECK(T > 1 && json_array_size(lp) >= T - 1);
    double maxd = 0;
    for (size_t t = 0; t + 1 < T; t++) {
        int x = (int)json_integer_value(json_array_get(toks, t));
        int y = (int)json_integer_value(json_array_get(toks, t + 1));
        double nll = lstm_grad_segment(n, w, &x, &y, 1, NULL);
        double d = fabs(-nll - json_real_value(json_array_get(lp, t)));
        maxd = d > maxd ? d : maxd;
    }
    CHECKF(maxd <= 1e-4, "%s: max |logprob - PyTorch| = %g", fixture, maxd);
done:
    lstm_grad_work_free(w);
    lstm_grad_net_free(n);
    model_free(m);
    json_decref(ref);
}

TEST(matches_pytorch_2layer) { pytorch_reference("lstm-2layer"); }
TEST(matches_pytorch_1layer_tied) { pytorch_reference("lstm-1layer-tied"); }

/* A tiny corpus: 40 words, sentences drawn from a fixed seed, so that runs
 * are short but the model has something to learn. */
static void write_corpus(const char *path, int lines, uint64_t seed)
{
    FILE *f = fopen(path, "w");
    nc_rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < lines; i++) {
        int len = 3 + (int)(rng_next(&r) % 8);
        int w = (int)(rng_next(&r) % 40);
        for (int j = 0; j < len; j++) {
            fprintf(f, "%sw%d", j ? " " : "", w);
            /* mostly deterministic successor, some noise */
            w = rng_uniform(&r) < 0.8f ? (w * 7 + 3) % 40 : (int)(rng_next(&r) % 40);
        }
        fputc('\n', f);
    }
    fclose(f);
}

static char tmpdir[256];

static void setup_tmp(void)
{
    if (tmpdir[0])
        return;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_train.XXXXXX");
    if (!mkdtemp(tmpdir))
        abort();
    char p[400];
    snprintf(p, sizeof p, "%s/train.txt", tmpdir);
    write_corpus(p, 300, 1);
    snprintf(p, sizeof p, "%s/valid.txt", tmpdir);
    write_corpus(p, 40, 2);
}

static void tiny_params(nc_train_params *p, const char *out)
{
    train_default_params(p);
    snprintf(p->train_path, sizeof p->train_path, "%s/train.txt", tmpdir);
    snprintf(p->valid_path, sizeof p->valid_path, "%s/valid.txt", tmpdir);
    snprintf(p->out_dir, sizeof p->out_dir, "%s/%s", tmpdir, out);
    p->embedding_size = p->hidden_size = 16;
    p->num_layers = 2;
    p->bptt = 7;
    p->batch_size = 4;
    p->eval_batch_size = 3;
    p->lr = 5;
    p->epochs = 3;
    p->dropout.emb = 0.2f, p->dropout.hid = 0.3f, p->dropout.out = 0.4f;
    p->threads = 1;
}

static bool same_weights(const char *dir_a, const char *dir_b)
{
    char err[NC_ERRLEN];
    float *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    bool ok = train_load_state_weights(dir_a, &a, &na, err, sizeof err) == NC_OK &&
              train_load_state_weights(dir_b, &b, &nb, err, sizeof err) == NC_OK && na == nb &&
              na > 0 && memcmp(a, b, na * sizeof(float)) == 0;
    free(a);
    free(b);
    return ok;
}

TEST(same_seed_same_weights)
{
    setup_tmp();
    nc_train_params p;
    char err[NC_ERRLEN];
    nc_train_result r1, r2, r3;
    tiny_params(&p, "det1");
    CHECKF(train_run(&p, false, NULL, NULL, &r1, err, sizeof err) == NC_OK, "%s", err);
    tiny_params(&p, "det2");
    CHECKF(train_run(&p, false, NULL, NULL, &r2, err, sizeof err) == NC_OK, "%s", err);
    char a[400], b[400];
    snprintf(a, sizeof a, "%s/det1", tmpdir);
    snprintf(b, sizeof b, "%s/det2", tmpdir);
    CHECK(same_weights(a, b));
    CHECK(r1.best_val_ppl == r2.best_val_ppl);
    CHECK(r1.steps > 0 && isfinite(r1.best_val_ppl));
    /* Training learned something: far below the uniform 41-way perplexity. */
    CHECKF(r1.best_val_ppl < 35, "best valid ppl %g", r1.best_val_ppl);
    /* A different seed gives different weights. */
    tiny_params(&p, "det3");
    p.seed = 99;
    CHECKF(train_run(&p, false, NULL, NULL, &r3, err, sizeof err) == NC_OK, "%s", err);
    snprintf(b, sizeof b, "%s/det3", tmpdir);
    CHECK(!same_weights(a, b));
}

TEST(resume_equals_uninterrupted)
{
    setup_tmp();
    nc_train_params p;
    char err[NC_ERRLEN], a[400], b[400];
    nc_train_result r;
    const int opts[2] = {NC_OPT_SGD, NC_OPT_ADAGRAD};
    for (int o = 0; o < 2; o++) {
        char na[32], nb[32];
        snprintf(na, sizeof na, "full%d", o);
        snprintf(nb, sizeof nb, "cut%d", o);
        tiny_params(&p, na);
        p.optimizer = opts[o];
        if (o == 1)
            p.lr = 0.1f;
        CHECKF(train_run(&p, false, NULL, NULL, &r, err, sizeof err) == NC_OK, "%s", err);
        long total = r.steps;
        /* Interrupt twice: mid-epoch and again in a later epoch. */
        tiny_params(&p, nb);
        p.optimizer = opts[o];
        if (o == 1)
            p.lr = 0.1f;
        p.stop_at_step = total / 3 + 1;
        CHECKF(train_run(&p, false, NULL, NULL, &r, err, sizeof err) == NC_OK, "%s", err);
        CHECK(r.stopped && r.steps == total / 3 + 1);
        snprintf(b, sizeof b, "%s/%s", tmpdir, nb);
        nc_train_params q;
        CHECKF(train_load_params(b, &q, err, sizeof err) == NC_OK, "%s", err);
        q.stop_at_step = 2 * total / 3 + 1;
        CHECKF(train_run(&q, true, NULL, NULL, &r, err, sizeof err) == NC_OK, "%s", err);
        CHECK(r.stopped);
        q.stop_at_step = 0;
        CHECKF(train_run(&q, true, NULL, NULL, &r, err, sizeof err) == NC_OK, "%s", err);
        CHECK(!r.stopped && r.steps == total);
        snprintf(a, sizeof a, "%s/%s", tmpdir, na);
        CHECKF(same_weights(a, b), "optimizer %d: resumed weights differ", o);
        /* The best models written are identical too. */
        char fa[500], fb[500];
        snprintf(fa, sizeof fa, "%s/model.safetensors", a);
        snprintf(fb, sizeof fb, "%s/model.safetensors", b);
        FILE *f1 = fopen(fa, "rb"), *f2 = fopen(fb, "rb");
        bool same = f1 && f2;
        while (same) {
            int c1 = fgetc(f1), c2 = fgetc(f2);
            if (c1 != c2)
                same = false;
            if (c1 == EOF || c2 == EOF)
                break;
        }
        if (f1)
            fclose(f1);
        if (f2)
            fclose(f2);
        CHECK(same);
    }
}

/* The saved model, loaded by the inference path (lstm.h), gives the
 * log-probabilities of the training forward in eval mode. */
TEST(saved_model_matches_inference)
{
    setup_tmp();
    nc_train_params p;
    char err[NC_ERRLEN];
    tiny_params(&p, "infer");
    p.epochs = 1;
    p.tie_weights = false;
    p.save_f16 = false;
    CHECKF(train_run(&p, false, NULL, NULL, NULL, err, sizeof err) == NC_OK, "%s", err);
    nc_model *m = NULL;
    CHECKF(model_load(p.out_dir, &m, err, sizeof err) == NC_OK, "%s", err);
    if (!m)
        return;
    enum { N = 30 };
    int tok[N + 1];
    nc_rng r;
    rng_seed(&r, 5);
    for (int i = 0; i <= N; i++)
        tok[i] = (int)(rng_next(&r) % (uint64_t)m->cfg.vocab_size);
    lstm_grad_net *n = NULL;
    lstm_grad_work *w = NULL;
    CHECK(lstm_grad_net_new(&(lstm_grad_shape){m->cfg.vocab_size, 16, 16, 2, false}, &n, err, sizeof err) == NC_OK);
    CHECK(lstm_grad_work_new(n, N, 1, &w, err, sizeof err) == NC_OK);
    CHECK(lstm_grad_from_model(n, m, err, sizeof err) == NC_OK);
    nc_state *s = lstm_state_new(m);
    float *hidden = malloc(sizeof(float) * N * 16), *logits = malloc(sizeof(float) * N * m->cfg.vocab_size);
    CHECK(lstm_forward_seq(m, s, tok, N, hidden, err, sizeof err) == NC_OK);
    lstm_logits_batch(m, hidden, N, logits);
    double maxd = 0, sum_inf = 0;
    for (int t = 0; t < N; t++) {
        float *row = logits + (size_t)t * m->cfg.vocab_size;
        nc_log_softmax(row, (size_t)m->cfg.vocab_size);
        double nll = lstm_grad_segment(n, w, &tok[t], &tok[t + 1], 1, NULL);
        double d = fabs(-nll - row[tok[t + 1]]);
        maxd = d > maxd ? d : maxd;
        sum_inf += -row[tok[t + 1]];
    }
    CHECKF(maxd <= 1e-4, "max |training forward - inference| = %g", maxd);
    /* Whole segment at once gives the same sum. */
    lstm_grad_work_reset_state(w);
    double whole = lstm_grad_segment(n, w, tok, tok + 1, N, NULL);
    CHECK_NEAR(whole, sum_inf, 1e-3);
    free(hidden);
    free(logits);
    lstm_state_free(s);
    lstm_grad_work_free(w);
    lstm_grad_net_free(n);
    model_free(m);
}

/* A short repeated sentence is memorised: the training loss goes to ~0. */
TEST(overfits_tiny_corpus)
{
    enum { V = 9, B = 2, T = 8, LEN = 9 };
    char err[NC_ERRLEN];
    lstm_grad_net *n = NULL;
    lstm_grad_work *w = NULL;
    CHECK(lstm_grad_net_new(&(lstm_grad_shape){V, 24, 24, 2, true}, &n, err, sizeof err) == NC_OK);
    CHECK(lstm_grad_work_new(n, T, B, &w, err, sizeof err) == NC_OK);
    if (!n || !w)
        goto done;
    nc_rng rng;
    rng_seed(&rng, 3);
    lstm_grad_init_uniform(n, &rng, 0.1f, 0);
    float *acc = calloc(n->n, sizeof(float));
    const int seq[LEN] = {1, 2, 3, 4, 5, 6, 7, 8, 0};
    double loss = 0, first = 0;
    int pos = 0;
    for (int step = 0; step < 400; step++) {
        int x[T * B], y[T * B];
        for (int t = 0; t < T; t++)
            for (int b = 0; b < B; b++) {
                x[t * B + b] = seq[(pos + t + 4 * b) % LEN];
                y[t * B + b] = seq[(pos + t + 1 + 4 * b) % LEN];
            }
        pos = (pos + T) % LEN;
        loss = lstm_grad_segment(n, w, x, y, T, &(const lstm_grad_pass){.backward = true}) / (T * B);
        if (step == 0)
            first = loss;
        optim_clip_grad_norm(n->g, n->n, 5.0f);
        optim_adagrad(n->w, acc, n->g, n->n, 0.1f, 1e-10f);
    }
    CHECKF(first > 1.5 && loss < 0.02, "loss %g -> %g", first, loss);
    free(acc);
done:
    lstm_grad_work_free(w);
    lstm_grad_net_free(n);
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* A raw corpus trained with the PTB conventions (--text ptb): the
 * vocabulary is built from the normalised words, and the model records the
 * conventions in its config.json so that serving reads text the same way. */
TEST(raw_corpus_with_conventions)
{
    setup_tmp();
    char raw[400];
    snprintf(raw, sizeof raw, "%s/raw.txt", tmpdir);
    FILE *f = fopen(raw, "w");
    const char *lines[] = {"The Company\xe2\x80\x99s profit rose 3.5% in 1999.", "It didn't fall!",
                           "\"Shares,\" the Company said, \"rose.\"", "Profit rose; shares didn't."};
    for (int i = 0; i < 120; i++)
        fputs(lines[i % 4], f), fputc(i % 5 == 4 ? '\n' : ' ', f);
    fclose(f);
    nc_train_params p;
    char err[NC_ERRLEN];
    nc_train_result r;
    tiny_params(&p, "conv");
    snprintf(p.train_path, sizeof p.train_path, "%s", raw);
    snprintf(p.valid_path, sizeof p.valid_path, "%s", raw);
    p.epochs = 1;
    text_conv_ptb(&p.text);
    CHECKF(train_run(&p, false, NULL, NULL, &r, err, sizeof err) == NC_OK, "%s", err);
    nc_model *m = NULL;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/conv", tmpdir);
    CHECKF(model_load(dir, &m, err, sizeof err) == NC_OK, "%s", err);
    if (!m)
        return;
    CHECK(m->cfg.text.declared && m->cfg.text.lines == NORM_LINES_SENTENCES && !strcmp(m->cfg.text.number, "N"));
    const char *known[] = {"the", "company", "'s", "n't", "N", "profit", "did", "<eos>"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        CHECKF(vocab_lookup(m->vocab, known[i], strlen(known[i])) >= 0, "'%s' is in the vocabulary", known[i]);
    const char *raw_forms[] = {"The", "Company", "company's", "didn't", "3.5%", "1999.", "said,"};
    for (size_t i = 0; i < sizeof raw_forms / sizeof raw_forms[0]; i++)
        CHECKF(vocab_lookup(m->vocab, raw_forms[i], strlen(raw_forms[i])) < 0, "'%s' is not", raw_forms[i]);
    /* the company 's profit rose N in <eos> it did n't fall shares said, and <unk> */
    CHECKF(m->cfg.vocab_size == 15, "vocabulary of %d words", m->cfg.vocab_size);
    model_free(m);
}

int main(void)
{
    RUN(gradient_check_untied);
    RUN(gradient_check_tied);
    RUN(matches_pytorch_2layer);
    RUN(matches_pytorch_1layer_tied);
    RUN(overfits_tiny_corpus);
    RUN(same_seed_same_weights);
    RUN(resume_equals_uninterrupted);
    RUN(saved_model_matches_inference);
    RUN(raw_corpus_with_conventions);
    if (tmpdir[0])
        rm_rf(tmpdir);
    return harness_summary();
}
