/* test_tokenizer.c -- whitespace tokenisation, eos rules, OOV surface strings,
 * lower-casing, UTF-8 validation; vocabulary table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "model.h"
#include "tokenizer.h"
#include "vocab.h"

static const char *msg(const char *s)
{
    return s;
}

static nc_model *small_model(bool lowercase)
{
    const char *words[] = {"<unk>", "<eos>", "the", "cat", "sat", "école", "straße", "The"};
    nc_vocab *v = vocab_new();
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        vocab_add(v, words[i], strlen(words[i]));
    nc_model_config cfg = {.model_type = "lstm", .vocab_size = 8, .embedding_size = 4, .hidden_size = 4,
                           .num_layers = 1, .tie_weights = true, .lowercase = lowercase,
                           .unk_token = "<unk>", .eos_token = "<eos>"};
    nc_model *m = NULL;
    char err[NC_ERRLEN];
    int rc = model_create(&cfg, v, &m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return m;
}

/* Tokenises and renders "word/id@offset ..." for compact comparisons. */
static void render(nc_model *m, const char *text, size_t len, bool final_eos, char *out, size_t n)
{
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN];
    int rc = tokenize(m, text, len, final_eos, &t, err, sizeof err);
    size_t off = 0;
    out[0] = '\0';
    if (rc != NC_OK)
        snprintf(out, n, "ERR %s", err);
    for (size_t i = 0; rc == NC_OK && i < t.n && off < n; i++)
        off += (size_t)snprintf(out + off, n - off, "%s%s/%d@%zu", i ? " " : "", t.words[i], t.ids[i],
                                t.offsets[i]);
    tokens_clear(&t);
}

#define EXPECT_TOKS(m, text, fe, want) do { \
        char got_[1024]; \
        render(m, text, strlen(text), fe, got_, sizeof got_); \
        CHECKF(!strcmp(got_, want), "tokenize(\"%s\", final_eos=%d) = \"%s\", want \"%s\"", text, fe, got_, want); \
    } while (0)

TEST(eos_rules)
{
    nc_model *m = small_model(false);
    EXPECT_TOKS(m, "", true, "");
    EXPECT_TOKS(m, "the cat\nsat", true, "the/2@0 cat/3@4 <eos>/1@7 sat/4@8 <eos>/1@11");
    EXPECT_TOKS(m, "the cat\nsat", false, "the/2@0 cat/3@4 <eos>/1@7 sat/4@8");
    EXPECT_TOKS(m, "the\n", true, "the/2@0 <eos>/1@3");
    EXPECT_TOKS(m, "the\n", false, "the/2@0 <eos>/1@3");
    /* Empty lines still end with eos, as `line.split() + ['<eos>']` does. */
    EXPECT_TOKS(m, "the\n\n", true, "the/2@0 <eos>/1@3 <eos>/1@4");
    EXPECT_TOKS(m, "\n", false, "<eos>/1@0");
    EXPECT_TOKS(m, "the\n  ", true, "the/2@0 <eos>/1@3 <eos>/1@6");
    EXPECT_TOKS(m, "the\n  ", false, "the/2@0 <eos>/1@3");
    /* CRLF, tabs and runs of spaces. */
    EXPECT_TOKS(m, "  the\t\tcat \r\nsat\r\n", true, "the/2@2 cat/3@7 <eos>/1@12 sat/4@13 <eos>/1@17");
    model_free(m);
}

TEST(oov_and_case)
{
    nc_model *m = small_model(false);
    /* OOV words map to unk for the model but keep their surface string. */
    EXPECT_TOKS(m, "the dog", false, "the/2@0 dog/0@4");
    EXPECT_TOKS(m, "The CAT", false, "The/7@0 CAT/0@4");
    /* Unicode white space (U+00A0, U+3000) separates words. */
    EXPECT_TOKS(m, "the\xc2\xa0" "cat\xe3\x80\x80sat", false, "the/2@0 cat/3@5 sat/4@11");
    EXPECT_TOKS(m, "école straße", false, "école/5@0 straße/6@7");
    model_free(m);

    m = small_model(true);
    EXPECT_TOKS(m, "The CAT Sat", false, "the/2@0 cat/3@4 sat/4@8");
    EXPECT_TOKS(m, "ÉCOLE Dog", false, "école/5@0 dog/0@7");
    /* The eos token itself is not lower-cased and a literal "<eos>" is eos. */
    EXPECT_TOKS(m, "cat <eos>\n", false, "cat/3@0 <eos>/1@4 <eos>/1@9");
    model_free(m);
}

TEST(invalid_input)
{
    nc_model *m = small_model(false);
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN];
    CHECK(tokenize(m, "the cat\n", 8, true, &t, err, sizeof err) == NC_OK);
    CHECK(t.n == 3);
    /* Invalid UTF-8: error with the byte offset, nothing appended. */
    CHECK(tokenize(m, "sat \xff the", 9, true, &t, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "UTF-8");
    CHECK_STR_CONTAINS(msg(err), "offset 4");
    CHECK(t.n == 3);
    /* Truncated multi-byte sequence at the end. */
    CHECK(tokenize(m, "sat \xc3", 5, true, &t, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "offset 4");
    /* Overlong encoding and UTF-16 surrogates are invalid too. */
    CHECK(tokenize(m, "\xc0\xaf", 2, true, &t, err, sizeof err) == NC_EFORMAT);
    CHECK(tokenize(m, "\xed\xa0\x80", 3, true, &t, err, sizeof err) == NC_EFORMAT);
    /* NUL bytes. */
    CHECK(tokenize(m, "the\0cat", 7, true, &t, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "NUL");
    CHECK_STR_CONTAINS(msg(err), "offset 3");
    CHECK(t.n == 3);
    /* Appending keeps earlier tokens. */
    CHECK(tokenize(m, "sat", 3, false, &t, err, sizeof err) == NC_OK);
    CHECK(t.n == 4 && t.ids[3] == 4 && !strcmp(t.words[3], "sat"));
    tokens_clear(&t);
    CHECK(t.n == 0);
    model_free(m);
}

TEST(long_words_and_many_tokens)
{
    nc_model *m = small_model(true);
    /* A word longer than the lower-casing stack buffer. */
    size_t n = 1000;
    char *w = malloc(n + 1);
    memset(w, 'A', n);
    w[n] = '\0';
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN];
    CHECK(tokenize(m, w, n, false, &t, err, sizeof err) == NC_OK);
    CHECK(t.n == 1 && strlen(t.words[0]) == n && t.words[0][0] == 'a' && t.ids[0] == m->unk_id);
    tokens_clear(&t);
    free(w);
    /* Growth past the initial capacity. */
    size_t reps = 2000;
    char *txt = malloc(reps * 4 + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(txt + 4 * i, "cat ", 4);
    CHECK(tokenize(m, txt, reps * 4, true, &t, err, sizeof err) == NC_OK);
    CHECK(t.n == reps + 1 && t.ids[reps - 1] == 3 && t.ids[reps] == m->eos_id && t.offsets[reps - 1] == 4 * (reps - 1));
    tokens_clear(&t);
    free(txt);
    model_free(m);
}

TEST(vocab_table)
{
    nc_vocab *v = vocab_new();
    CHECK(vocab_add(v, "a", 1) == 0);
    CHECK(vocab_add(v, "bb", 2) == 1);
    CHECK(vocab_add(v, "a", 1) == 0);
    CHECK(vocab_add(v, "abc", 2) == 2);      /* "ab": length-delimited */
    CHECK(vocab_lookup(v, "ab", 2) == 2);
    CHECK(vocab_lookup(v, "abc", 3) == -1);
    CHECK(vocab_size(v) == 3);
    CHECK(!strcmp(vocab_word(v, 2), "ab"));
    CHECK(vocab_word(v, 3) == NULL && vocab_word(v, -1) == NULL);
    int dense = 1;
    for (int i = 0; i < 5000; i++) {
        char b[32];
        int l = snprintf(b, sizeof b, "w%d", i);
        dense &= vocab_add(v, b, (size_t)l) == 3 + i;
    }
    CHECK(dense);
    nc_vocab *c = vocab_clone(v);
    CHECK(vocab_size(c) == vocab_size(v));
    CHECK(vocab_lookup(c, "w4999", 5) == 5002 && !strcmp(vocab_word(c, 5002), "w4999"));
    CHECK(vocab_add(c, "new", 3) == 5003 && vocab_lookup(v, "new", 3) == -1);

    char dir[] = "/tmp/nc_vocab_XXXXXX", path[256], err[NC_ERRLEN];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    CHECK(vocab_save(c, path, err, sizeof err) == NC_OK);
    nc_vocab *r = NULL;
    CHECK(vocab_load(path, &r, err, sizeof err) == NC_OK);
    CHECK(r && vocab_size(r) == 5004 && vocab_lookup(r, "new", 3) == 5003);
    vocab_free(r);

    /* Duplicate and empty lines are refused with the line number. */
    FILE *f = fopen(path, "w");
    fputs("a\nb\na\n", f);
    fclose(f);
    CHECK(vocab_load(path, &r, err, sizeof err) == NC_EFORMAT && r == NULL);
    CHECK_STR_CONTAINS(msg(err), "line 3");
    CHECK_STR_CONTAINS(msg(err), "duplicate");
    f = fopen(path, "w");
    fputs("a\n\nb\n", f);
    fclose(f);
    CHECK(vocab_load(path, &r, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "line 2");
    remove(path);
    CHECK(vocab_load(path, &r, err, sizeof err) == NC_ENOTFOUND);
    rmdir(dir);
    vocab_free(c);
    vocab_free(v);
    vocab_free(NULL);
}

int main(void)
{
    RUN(eos_rules);
    RUN(oov_and_case);
    RUN(invalid_input);
    RUN(long_words_and_many_tokens);
    RUN(vocab_table);
    return harness_summary();
}
