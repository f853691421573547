/* test_normalize.c -- the text normaliser (core/text/normalize.c) through
 * tokenize(): PTB conventions on ordinary text (case, NFKC, accents,
 * numbers, clitics, hyphens, quotes, brackets, abbreviations, sentences),
 * offsets and lengths into the original text, the other modes, the "text"
 * object of config.json (load, save, errors) and --no-normalize's path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "harness.h"
#include "model.h"
#include "normalize.h"
#include "tokenizer.h"
#include "tokenize_walk.h"
#include "vocab.h"

static const char *const words[] = {"<unk>", "<eos>", "the", "company", "said", "hello", "i",    "do",
                                    "n't",   "'s",    "N",   "mr.",     "u.s.", "red-tipped", "fine", "and",
                                    "$",     "ca",    "wo",  "know",    "it",   "you",  "sit",  ",",
                                    "a",     "b",     "c",   "d",       "e"};

static const char *msg(const char *s)
{
    return s;
}

static nc_model *ptb_model(void)
{
    nc_vocab *v = vocab_new();
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        vocab_add(v, words[i], strlen(words[i]));
    nc_model_config cfg = {.model_type = "lstm", .vocab_size = vocab_size(v), .embedding_size = 4,
                           .hidden_size = 4, .num_layers = 1, .tie_weights = true,
                           .unk_token = "<unk>", .eos_token = "<eos>"};
    text_conv_ptb(&cfg.text);
    nc_model *m = NULL;
    char err[NC_ERRLEN];
    int rc = model_create(&cfg, v, &m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return m;
}

/* "word@offset+length" per token; unknown words get a trailing '?'. */
static void render(const nc_model *m, const char *text, bool final_eos, bool normalize, char *out, size_t n)
{
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN];
    int rc = tokenize_ex(m, text, strlen(text), final_eos, normalize, &t, err, sizeof err);
    size_t off = 0;
    out[0] = '\0';
    if (rc != NC_OK)
        snprintf(out, n, "ERR %s", err);
    for (size_t i = 0; rc == NC_OK && i < t.n && off < n; i++)
        off += (size_t)snprintf(out + off, n - off, "%s%s%s@%zu+%zu", i ? " " : "", t.words[i],
                                t.ids[i] == m->unk_id ? "?" : "", t.offsets[i], t.lens[i]);
    tokens_clear(&t);
}

#define EXPECT(m, text, fe, want) do { \
        char got_[2048]; \
        render(m, text, fe, true, got_, sizeof got_); \
        CHECKF(!strcmp(got_, want), "normalise(\"%s\") =\n  \"%s\", want\n  \"%s\"", text, got_, want); \
    } while (0)

TEST(ptb_ordinary_text)
{
    nc_model *m = ptb_model();
    /* the newcomer's sentence of issue 23: the words known, the '!' ends it */
    EXPECT(m, "The Company said, \"Hello!\"", false, "the@0+3 company@4+7 said@12+4 hello@19+5 <eos>@24+1");
    /* clitics split at the original apostrophe (’ is 3 bytes) */
    EXPECT(m, "I don\xe2\x80\x99t know", false, "i@0+1 do@2+2 n't@4+5 know@10+4");
    EXPECT(m, "the company's", false, "the@0+3 company@4+7 's@11+2");
    EXPECT(m, "I can't, I won't", false, "i@0+1 ca@2+2 n't@4+3 i@9+1 wo@11+2 n't@13+3");
    /* already-PTB text stays as it is */
    EXPECT(m, "i do n't know the company 's N", false, "i@0+1 do@2+2 n't@5+3 know@9+4 the@14+3 company@18+7 's@26+2 N@29+1");
    /* numbers, kept symbols, brackets and quotes dropped */
    EXPECT(m, "$1,805 (and 3.5%)", false, "$@0+1 N@1+5 and@8+3 N@12+3");
    /* NFKC (ligature fi, full-width letters), accents, case */
    EXPECT(m, "\xef\xac\x81ne \xef\xbc\xb4\xef\xbd\x88\xef\xbd\x85 D\xc3\xb3lokhov", false,
           "fine@0+5 the@6+9 dolokhov?@16+9");
    /* hyphenated compounds kept, dashes separate */
    EXPECT(m, "red-tipped you\xe2\x80\x94sit -- it", false, "red-tipped@0+10 you@11+3 sit@17+3 it@24+2");
    /* WikiText's " @-@ " is a hyphen inside a word; its " @,@ " and " @.@ " separate */
    EXPECT(m, "red @-@ tipped 1 @,@ 805 @-@", false, "red-tipped@0+14 N@15+1 N@21+3");
    /* abbreviations the vocabulary has keep their period and end nothing */
    EXPECT(m, "Mr. Hello said U.S. company.", false,
           "mr.@0+3 hello@4+5 said@10+4 u.s.@15+4 company@20+7 <eos>@27+1");
    /* sentences: . ! ? end one (a run of them once) unless the next word
     * starts in lower case, a blank line ends one, a single newline is a
     * space; final_eos closes the last */
    EXPECT(m, "a b?! C\nd\n\ne", true, "a@0+1 b@2+1 <eos>@3+2 c@6+1 d@8+1 <eos>@10+1 e@11+1 <eos>@12+0");
    EXPECT(m, "a b! c. \xe2\x80\x9c\xc3\x89", false, "a@0+1 b@2+1 c@5+1 <eos>@6+1 e@11+2");
    EXPECT(m, "a.\n\nB", false, "a@0+1 <eos>@1+1 b@4+1");
    EXPECT(m, "a.\n\nb", false, "a@0+1 <eos>@3+1 b@4+1");
    /* a feed that starts with a stop ends the sentence fed before it; a
     * whole document does not start with an eos */
    EXPECT(m, ". B", false, "<eos>@0+1 b@2+1");
    EXPECT(m, ". B", true, "b@2+1 <eos>@3+0");
    /* the model's own tokens written out stay themselves */
    EXPECT(m, "<unk> and <eos>", false, "<unk>?@0+5 and@6+3 <eos>@10+5");
    /* nothing but punctuation: no token */
    EXPECT(m, " \"--\" (...) ", true, "");
    EXPECT(m, "", true, "");
    model_free(m);
}

TEST(offsets_point_at_the_word)
{
    nc_model *m = ptb_model();
    /* Every token but eos starts at a letter or digit of the original (or
     * the apostrophe of a clitic, or a kept symbol) and its span holds
     * exactly the characters it was read from: re-normalising the span
     * alone gives the token back. */
    const char *text = "\xe2\x80\x9cWell, Prince, so Genoa and Lucca are now just family estates of the\n"
                       "Buonapartes.\xe2\x80\x9d She said it in 1805\xe2\x80\x94on July 3rd, I\xe2\x80\x99m sure; "
                       "Anna P\xc3\xa1vlovna\xe2\x80\x99s (caf\xc3\xa9) cost $2,000.50!\n\n\xc2\xab" "Don't\xc2\xbb, "
                       "she said.";
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN];
    CHECK(tokenize(m, text, strlen(text), true, &t, err, sizeof err) == NC_OK);
    CHECK(t.n > 30);
    size_t bad = 0, prev = 0;
    for (size_t i = 0; i < t.n; i++) {
        CHECKF(t.offsets[i] + t.lens[i] <= strlen(text) && t.offsets[i] >= prev, "token %zu at %zu+%zu", i,
               t.offsets[i], t.lens[i]);
        prev = t.offsets[i];
        if (t.ids[i] == m->eos_id)
            continue;
        unsigned char c = (unsigned char)text[t.offsets[i]];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c >= 0x80 ||
                  c == '\'' || c == '$';
        nc_tokens one;
        tokens_init(&one);
        char span[256];
        snprintf(span, sizeof span, "%.*s", (int)t.lens[i], text + t.offsets[i]);
        ok = ok && tokenize(m, span, strlen(span), false, &one, err, sizeof err) == NC_OK && one.n >= 1 &&
             !strcmp(one.words[0], t.words[i]);
        if (!ok && bad++ < 5)
            fprintf(stderr, "  token %zu '%s' at %zu: span '%s'\n", i, t.words[i], t.offsets[i], span);
        tokens_clear(&one);
    }
    CHECKF(bad == 0, "%zu tokens whose span is not their word", bad);
    tokens_clear(&t);
    model_free(m);
}

TEST(modes_and_off_switch)
{
    nc_model *m = ptb_model();
    char got[512];
    /* normalize = false: exactly the whitespace tokenizer, eos per line */
    render(m, "The Company, said\nhi", true, false, got, sizeof got);
    CHECKF(!strcmp(got, "The?@0+3 Company,?@4+8 said@13+4 <eos>@17+1 hi?@18+2 <eos>@20+0"), "%s", got);
    /* punctuation split, lines = eos, no clitics, case kept */
    nc_text_conv *c = &m->cfg.text;
    char err[NC_ERRLEN];
    CHECK(text_conv_set(c, "punctuation", "split", err, sizeof err) == NC_OK);
    CHECK(text_conv_set(c, "lines", "eos", err, sizeof err) == NC_OK);
    CHECK(text_conv_set(c, "contractions", "false", err, sizeof err) == NC_OK);
    EXPECT(m, "a, b.\nc's", true, "a@0+1 ,@1+1 b@3+1 .?@4+1 <eos>@5+1 c's?@6+3 <eos>@9+0");
    /* hyphens dropped: the parts are words */
    CHECK(text_conv_set(c, "hyphens", "drop", err, sizeof err) == NC_OK);
    EXPECT(m, "red-tipped", false, "red?@0+3 tipped?@4+6");
    /* punctuation kept: attached, as white-space splitting does */
    CHECK(text_conv_set(c, "punctuation", "keep", err, sizeof err) == NC_OK);
    CHECK(text_conv_set(c, "case", "keep", err, sizeof err) == NC_OK);
    EXPECT(m, "Said, it", false, "Said,?@0+5 it@6+2");
    /* invalid input is refused whatever the conventions */
    nc_tokens t;
    tokens_init(&t);
    CHECK(tokenize(m, "a \xff", 3, true, &t, err, sizeof err) == NC_EFORMAT && t.n == 0);
    CHECK(tokenize(m, "a\0b", 3, true, &t, err, sizeof err) == NC_EFORMAT && t.n == 0);
    model_free(m);
}

TEST(config_object)
{
    nc_text_conv c = {0};
    char err[NC_ERRLEN];
    CHECK(text_conv_set(&c, "preset", "ptb", err, sizeof err) == NC_OK && c.declared && !strcmp(c.number, "N"));
    CHECK(text_conv_set(&c, "punctuation", "loud", err, sizeof err) == NC_EINVAL);
    CHECK_STR_CONTAINS(msg(err), "text.punctuation is 'loud', expected one of keep, split, drop");
    CHECK(text_conv_set(&c, "colour", "red", err, sizeof err) == NC_EINVAL);
    CHECK_STR_CONTAINS(msg(err), "unknown key text.colour (known: preset, nfkc");
    CHECK(text_conv_set(&c, "nfkc", "yes", err, sizeof err) == NC_EINVAL);
    CHECK(text_conv_set(&c, "number_token", "a b", err, sizeof err) == NC_EINVAL);

    /* saved and loaded back: the same conventions, "lowercase" as it was for older readers */
    nc_model *m = ptb_model();
    CHECK(text_conv_set(&m->cfg.text, "symbols", "$&%", err, sizeof err) == NC_OK);
    char dir[] = "/tmp/nc-norm-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECKF(model_save(m, dir, false, err, sizeof err) == NC_OK, "%s", err);
    nc_model *l = NULL;
    CHECKF(model_load(dir, &l, err, sizeof err) == NC_OK, "%s", err);
    CHECK(l && !memcmp(&l->cfg.text, &m->cfg.text, sizeof l->cfg.text));
    char path[300], buf[4096] = "";
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    CHECK_STR_CONTAINS(msg(buf), "\"lowercase\": false");
    CHECK_STR_CONTAINS(msg(buf), "\"lines\": \"sentences\"");
    model_free(l);

    /* a preset refined by a key; errors name the file and the key */
    const char *base = "{\"model_type\":\"lstm\",\"vocab_size\":29,\"embedding_size\":4,\"hidden_size\":4,"
                       "\"num_layers\":1,\"tie_weights\":true,\"unk_token\":\"<unk>\",\"eos_token\":\"<eos>\"";
    const struct { const char *tail; const char *err; } cases[] = {
        {",\"text\":{\"lines\":\"eos\",\"preset\":\"ptb\"}}", NULL},
        {",\"text\":{\"punctuation\":true}}", "text.punctuation must be a string"},
        {",\"text\":{\"nfkc\":\"true\"}}", "text.nfkc must be true or false"},
        {",\"text\":[]}", "key 'text' must be an object"},
        {",\"text\":{\"preset\":\"wsj\"}}", "text.preset is 'wsj'"},
        {"}", "missing required key 'lowercase' (or a 'text' object)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        f = fopen(path, "w");
        fprintf(f, "%s%s\n", base, cases[i].tail);
        fclose(f);
        int rc = model_load(dir, &l, err, sizeof err);
        if (!cases[i].err) {
            CHECKF(rc == NC_OK && l->cfg.text.declared && l->cfg.text.lines == NORM_LINES_EOS &&
                       l->cfg.text.contractions, "%s", err);
            model_free(l);
        } else {
            CHECKF(rc == NC_EFORMAT && strstr(err, cases[i].err) && strstr(err, "config.json"), "case %zu: %s", i,
                   err);
        }
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    model_free(m);
}

/* Every allocation of a normalised tokenize can fail: the answer is
 * NC_ENOMEM, what the list held before is kept and nothing is appended;
 * the same list then tokenises completely. (libunistring's own results
 * are not behind the fault wrappers: only the core's buffers are walked.) */
TEST(allocation_failures)
{
    nc_model *m = ptb_model();
    char text[8192] = "";
    for (int i = 0; i < 200; i++)
        strcat(text, i % 9 == 8 ? "Company\xe2\x80\x99s 1,805 roubles. \xc3\x89" "cole " : "The Company, ");
    /* 200 phrases: the token arrays grow past their first 256 slots */
    nc_fault_thread(true);
    CHECK(walk_tokenize_allocations(m, text, 2000) > 256);
    nc_fault_thread(false);
    model_free(m);
}

int main(void)
{
    RUN(ptb_ordinary_text);
    RUN(offsets_point_at_the_word);
    RUN(modes_and_off_switch);
    RUN(config_object);
    RUN(allocation_failures);
    return harness_summary();
}
