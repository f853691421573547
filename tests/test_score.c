/* test_score.c -- block scoring against the reference vectors and the naive
 * full-distribution path; `neurocache score` end to end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"
#include "lstm.h"
#include "model.h"
#include "scorer.h"

static const char *fixtures[] = {"lstm-2layer", "lstm-1layer-tied", "lstm-2layer-f16"};

typedef struct {
    nc_model *m;
    json_t *ref;
    int *tokens;
    size_t T;
    char dir[1024];
} fixture;

static int fixture_open(const char *name, fixture *f)
{
    char path[1200], err[NC_ERRLEN];
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/%s", harness_fixtures(), name);
    int rc = model_load(f->dir, &f->m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s: %s", f->dir, err);
    snprintf(path, sizeof path, "%s/reference.json", f->dir);
    f->ref = json_load_file(path, 0, NULL);
    CHECK(f->ref != NULL);
    if (rc != NC_OK || !f->ref)
        return -1;
    json_t *toks = json_object_get(f->ref, "tokens");
    f->T = json_array_size(toks);
    f->tokens = malloc(f->T * sizeof(int));
    for (size_t i = 0; i < f->T; i++)
        f->tokens[i] = (int)json_integer_value(json_array_get(toks, i));
    return 0;
}

static void fixture_close(fixture *f)
{
    model_free(f->m);
    json_decref(f->ref);
    free(f->tokens);
}

static double ref_static(const fixture *f, size_t t)
{
    json_t *tl = json_object_get(json_object_get(f->ref, "target_logprobs"), "static");
    return json_number_value(json_array_get(tl, t));
}

/* --bos none scoring equals target_logprobs.static for any block size, and
 * the exposed hidden rows are the reference h_t. */
TEST(reference_target_logprobs)
{
    size_t blocks[] = {1, 7, 0};
    for (size_t fi = 0; fi < 3; fi++) {
        fixture f;
        if (fixture_open(fixtures[fi], &f) != 0) {
            fixture_close(&f);
            continue;
        }
        for (size_t bi = 0; bi < 3; bi++) {
            nc_scorer *sc = scorer_new(f.m, blocks[bi]);
            nc_state *s = lstm_state_new(f.m);
            float *lp = malloc(f.T * sizeof(float));
            size_t first = 99;
            char err[NC_ERRLEN];
            CHECK(scorer_begin(sc, s, NC_BOS_NONE, f.tokens, f.T, &first, err, sizeof err) == NC_OK);
            CHECK(first == 1);
            CHECK(scorer_run(sc, s, f.tokens + 1, f.T - 1, lp, NULL, NULL, err, sizeof err) == NC_OK);
            double worst = 0;
            for (size_t t = 0; t + 1 < f.T; t++)
                worst = fmax(worst, fabs(lp[t] - ref_static(&f, t)));
            CHECKF(worst <= 1e-4, "%s block %zu: |d| = %g", fixtures[fi], blocks[bi], worst);
            free(lp);
            lstm_state_free(s);
            scorer_free(sc);
        }
        /* Block API: hidden row i predicts tokens[i]; lse and logits agree. */
        nc_scorer *sc = scorer_new(f.m, 16);
        nc_state *s = lstm_state_new(f.m);
        size_t first;
        float lp[16];
        char err[NC_ERRLEN];
        scorer_begin(sc, s, NC_BOS_NONE, f.tokens, f.T, &first, err, sizeof err);
        CHECK(scorer_block(sc, s, f.tokens + 1, 16, lp, err, sizeof err) == NC_OK);
        CHECK(scorer_block(sc, s, f.tokens + 1, 17, lp, err, sizeof err) == NC_EINVAL);
        CHECK(scorer_block_size(sc) == 16);
        double wh = 0, wl = 0;
        const int H = f.m->cfg.hidden_size, V = f.m->cfg.vocab_size;
        json_t *hid = json_object_get(f.ref, "hidden_last_layer");
        for (size_t i = 0; i < 16; i++) {
            for (int j = 0; j < H; j++)
                wh = fmax(wh, fabs(scorer_hidden(sc)[i * (size_t)H + (size_t)j] -
                                   json_number_value(json_array_get(json_array_get(hid, i), (size_t)j))));
            const float *row = scorer_logits(sc) + i * (size_t)V;
            wl = fmax(wl, fabs(row[f.tokens[i + 1]] - scorer_lse(sc)[i] - lp[i]));
        }
        CHECK(wh <= 1e-4 && wl <= 1e-6);
        lstm_state_free(s);
        scorer_free(sc);
        fixture_close(&f);
    }
}

/* Default bos: the state after one eos, every token scored; equals the
 * step path with the full distribution (design §4: both paths agree). */
TEST(bos_eos_matches_full_distribution)
{
    fixture f;
    if (fixture_open("lstm-2layer", &f) != 0) {
        fixture_close(&f);
        return;
    }
    int V = f.m->cfg.vocab_size;
    nc_scorer *sc = scorer_new(f.m, 5);
    nc_state *s = lstm_state_new(f.m), *n = lstm_state_new(f.m);
    nc_lstm_work *w = lstm_work_new(f.m);
    float *lp = malloc(f.T * sizeof(float)), *full = malloc((size_t)V * sizeof(float));
    size_t first = 99;
    char err[NC_ERRLEN];
    CHECK(scorer_begin(sc, s, NC_BOS_EOS, f.tokens, f.T, &first, err, sizeof err) == NC_OK);
    CHECK(first == 0);
    CHECK(scorer_run(sc, s, f.tokens, f.T, lp, NULL, NULL, err, sizeof err) == NC_OK);
    lstm_step(f.m, n, f.m->eos_id, w);
    double worst = 0;
    for (size_t t = 0; t < f.T; t++) {
        lstm_logits(f.m, lstm_state_top(n), full);
        nc_log_softmax(full, (size_t)V);
        worst = fmax(worst, fabs(full[f.tokens[t]] - lp[t]));
        lstm_step(f.m, n, f.tokens[t], w);
    }
    CHECKF(worst <= 1e-5, "score vs full distribution: %g", worst);
    /* The first token is predicted after eos: not the zero-state answer. */
    CHECK(fabs(lp[1] - ref_static(&f, 0)) > 1e-3);
    free(lp);
    free(full);
    lstm_work_free(w);
    lstm_state_free(s);
    lstm_state_free(n);
    scorer_free(sc);
    fixture_close(&f);
}

/* ---- CLI ---------------------------------------------------------------- */

static const char *bin_dir(void)
{
    const char *d = getenv("NEUROCACHE_BIN");
    return d ? d : "bin";
}

/* Runs a shell command, capturing stdout; returns the exit status. */
static int run(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[n] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(cli_score)
{
    fixture f;
    if (fixture_open("lstm-2layer", &f) != 0) {
        fixture_close(&f);
        return;
    }
    char txt[] = "/tmp/nc_score_XXXXXX";
    int fd = mkstemp(txt);
    FILE *tf = fdopen(fd, "w");
    json_t *ts = json_object_get(f.ref, "token_strings");
    for (size_t i = 0; i < f.T; i++)
        fprintf(tf, "%s%s", i ? " " : "", json_string_value(json_array_get(ts, i)));
    fclose(tf);   /* no final newline: the file reader still appends eos */

    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s --bos none %s 2>/dev/null", bin_dir(), f.dir, txt);
    CHECK(run(cmd, &out) == 0);
    /* T-1 reference tokens, then the final eos. */
    size_t lines = 0;
    double worst = 0;
    int fmt_ok = 1;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        char *tab = strchr(line, '\t');
        fmt_ok &= tab != NULL;
        if (!tab)
            continue;
        *tab = '\0';
        if (lines + 1 < f.T) {
            fmt_ok &= !strcmp(line, json_string_value(json_array_get(ts, lines + 1)));
            worst = fmax(worst, fabs(atof(tab + 1) - ref_static(&f, lines)));
        } else {
            fmt_ok &= !strcmp(line, "<eos>");
        }
    }
    CHECK(fmt_ok);
    CHECKF(lines == f.T, "%zu lines, want %zu", lines, f.T);
    CHECKF(worst <= 1e-4, "cli vs reference: %g", worst);
    free(out);

    /* json, default bos: T+1 tokens (all, with the final eos), ppl consistent. */
    snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s --format json %s 2>/dev/null", bin_dir(), f.dir, txt);
    CHECK(run(cmd, &out) == 0);
    json_t *o = json_loads(out, 0, NULL);
    CHECK(o != NULL);
    if (o) {
        json_t *tk = json_object_get(o, "tokens"), *lp = json_object_get(o, "logprobs");
        CHECK(json_array_size(tk) == f.T + 1 && json_array_size(lp) == f.T + 1);
        double sum = 0;
        for (size_t i = 0; i < json_array_size(lp); i++)
            sum += json_number_value(json_array_get(lp, i));
        double ppl = json_number_value(json_object_get(o, "ppl"));
        CHECK_NEAR(ppl, exp(-sum / (double)json_array_size(lp)), 1e-4 * ppl);
        CHECK(!strcmp(json_string_value(json_array_get(tk, 0)), json_string_value(json_array_get(ts, 0))));
        json_decref(o);
    }
    free(out);

    /* The unknown word is flagged: TSV's third column, JSON's "unk". */
    tf = fopen(txt, "w");
    fputs("w1 zebra w2\n", tf);
    fclose(tf);
    snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s %s 2>/dev/null", bin_dir(), f.dir, txt);
    CHECK(run(cmd, &out) == 0);
    const char *unk_col[] = {"w1\t", "zebra\t", "w2\t", "<eos>\t"};   /* the word as written, read as <unk> */
    size_t k = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), k++) {
        const char *last = strrchr(line, '\t');
        CHECKF(k < 4 && !strncmp(line, unk_col[k], strlen(unk_col[k])) && last && last != strchr(line, '\t') &&
               !strcmp(last + 1, k == 1 ? "1" : "0"), "line %zu: '%s'", k, line);
    }
    CHECK(k == 4);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s --format json %s 2>/dev/null", bin_dir(), f.dir, txt);
    CHECK(run(cmd, &out) == 0);
    o = json_loads(out, 0, NULL);
    json_t *unk = json_object_get(o, "unk");
    CHECK(json_array_size(unk) == 4 && json_is_true(json_array_get(unk, 1)) && json_is_false(json_array_get(unk, 0)) &&
          json_is_false(json_array_get(unk, 3)) && json_integer_value(json_object_get(o, "unk_count")) == 1);
    json_decref(o);
    free(out);
    /* Nothing to score (an empty file: a line, even empty, ends with an
     * eos, which is scored): exit 1 naming it, nothing on stdout, as
     * /v1/score's 400. */
    const char *nothing[][2] = {{"", ""}, {"", "--bos none"}};
    for (size_t i = 0; i < 2; i++) {
        tf = fopen(txt, "w");
        fputs(nothing[i][0], tf);
        fclose(tf);
        snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s %s %s 2>/dev/null", bin_dir(), f.dir, nothing[i][1],
                 txt);
        CHECKF(run(cmd, &out) == 1 && out[0] == '\0', "'%s': stdout '%s'", nothing[i][0], out);
        free(out);
        snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s %s %s 2>&1 >/dev/null", bin_dir(), f.dir,
                 nothing[i][1], txt);
        run(cmd, &out);
        CHECKF(strstr(out, "has no tokens to score") != NULL, "'%s': %s", nothing[i][0], out);
        free(out);
    }

    /* Errors: usage -> 2, runtime -> 1, and nothing on stdout. */
    const struct { const char *args; int rc; } bad[] = {
        {"", 2},
        {"--model %s", 2},
        {"--model %s --bos sos /dev/null", 2},
        {"--model %s --format xml /dev/null", 2},
        {"--model %s --frobnicate /dev/null", 2},
        {"--model /nonexistent /dev/null", 1},
        {"--model %s /nonexistent/file.txt", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[2048];
        snprintf(args, sizeof args, bad[i].args, f.dir);
        snprintf(cmd, sizeof cmd, "%s/neurocache score %s 2>/dev/null", bin_dir(), args);
        int rc = run(cmd, &out);
        CHECKF(rc == bad[i].rc, "'%s' exited %d, want %d", args, rc, bad[i].rc);
        CHECKF(out[0] == '\0', "'%s' wrote to stdout", args);
        free(out);
    }
    /* Invalid UTF-8 in the text: exit 1 with the offset. */
    tf = fopen(txt, "w");
    fputs("w1 w2\nw3 \xff\n", tf);
    fclose(tf);
    snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s %s 2>&1 >/dev/null", bin_dir(), f.dir, txt);
    CHECK(run(cmd, &out) == 1);
    CHECK_STR_CONTAINS(out, "offset 9");
    free(out);
    snprintf(cmd, sizeof cmd, "%s/neurocache score --help", bin_dir());
    CHECK(run(cmd, &out) == 0);
    CHECK_STR_CONTAINS(out, "--bos eos|none");
    free(out);
    unlink(txt);
    fixture_close(&f);
}

int main(void)
{
    RUN(reference_target_logprobs);
    RUN(bos_eos_matches_full_distribution);
    RUN(cli_score);
    return harness_summary();
}
