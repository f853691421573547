/* normalize.c -- ordinary text onto a model's conventions, with offsets into the original (libunistring). */
#include "normalize.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unicase.h>
#include <unictype.h>
#include <uninorm.h>
#include <unistr.h>

#include "fault.h"

/* ------------------------------------------------------------------------ */
/* The conventions: one row per key of config.json's "text" object           */

typedef enum { TK_BOOL, TK_ENUM, TK_STR } text_key_kind;

static const char *const mode_names[] = {"keep", "split", "drop", NULL};
static const char *const case_names[] = {"keep", "lower", "fold", NULL};
static const char *const lines_names[] = {"eos", "sentences", NULL};

static const struct {
    const char *key;
    text_key_kind kind;
    size_t off;
    const char *const *names;     /* TK_ENUM: value i is names[i] */
    size_t size;                  /* TK_STR: buffer size */
} text_keys[] = {
    {"nfkc", TK_BOOL, offsetof(nc_text_conv, nfkc), NULL, 0},
    {"case", TK_ENUM, offsetof(nc_text_conv, case_mode), case_names, 0},
    {"strip_accents", TK_BOOL, offsetof(nc_text_conv, strip_accents), NULL, 0},
    {"number_token", TK_STR, offsetof(nc_text_conv, number), NULL, sizeof(((nc_text_conv *)0)->number)},
    {"punctuation", TK_ENUM, offsetof(nc_text_conv, punctuation), mode_names, 0},
    {"quotes", TK_ENUM, offsetof(nc_text_conv, quotes), mode_names, 0},
    {"brackets", TK_ENUM, offsetof(nc_text_conv, brackets), mode_names, 0},
    {"hyphens", TK_ENUM, offsetof(nc_text_conv, hyphens), mode_names, 0},
    {"contractions", TK_BOOL, offsetof(nc_text_conv, contractions), NULL, 0},
    {"abbreviations", TK_BOOL, offsetof(nc_text_conv, abbreviations), NULL, 0},
    {"lines", TK_ENUM, offsetof(nc_text_conv, lines), lines_names, 0},
    {"symbols", TK_STR, offsetof(nc_text_conv, symbols), NULL, sizeof(((nc_text_conv *)0)->symbols)},
};
#define N_TEXT_KEYS (int)(sizeof text_keys / sizeof text_keys[0])

void text_conv_ptb(nc_text_conv *c)
{
    /* What Mikolov's PTB text (and the .ptb.txt files in ../shared/data) look like: lower
     * case ASCII words, no punctuation, numbers as N, clitics split off,
     * hyphenated compounds kept, one sentence per line, $ and & as words. */
    *c = (nc_text_conv){.declared = true,
                        .nfkc = true,
                        .case_mode = NORM_CASE_LOWER,
                        .strip_accents = true,
                        .number = "N",
                        .punctuation = NORM_DROP,
                        .quotes = NORM_DROP,
                        .brackets = NORM_DROP,
                        .hyphens = NORM_KEEP,
                        .contractions = true,
                        .abbreviations = true,
                        .lines = NORM_LINES_SENTENCES,
                        .symbols = "$&"};
}

bool text_conv_key_is_bool(const char *key)
{
    for (int i = 0; i < N_TEXT_KEYS; i++)
        if (!strcmp(text_keys[i].key, key))
            return text_keys[i].kind == TK_BOOL;
    return false;
}

int text_conv_set(nc_text_conv *c, const char *key, const char *value, char *err, size_t errlen)
{
    NC_ASSERT(c, "text_conv_set: no c");
    if (!strcmp(key, "preset")) {
        if (!strcmp(value, "ptb"))
            text_conv_ptb(c);
        else if (!strcmp(value, "none"))
            *c = (nc_text_conv){.declared = true};
        else
            return nc_error(err, errlen, NC_EINVAL, "text.preset is '%s', expected ptb or none", value);
        return NC_OK;
    }
    for (int i = 0; i < N_TEXT_KEYS; i++) {
        if (strcmp(text_keys[i].key, key))
            continue;
        char *dst = (char *)c + text_keys[i].off;
        switch (text_keys[i].kind) {
        case TK_BOOL:
            if (strcmp(value, "true") && strcmp(value, "false"))
                return nc_error(err, errlen, NC_EINVAL, "text.%s must be true or false", key);
            *(bool *)dst = !strcmp(value, "true");
            break;
        case TK_ENUM: {
            const char *const *n = text_keys[i].names;
            int v = 0;
            while (n[v] && strcmp(n[v], value))
                v++;
            if (!n[v]) {
                char allowed[64] = "";
                for (int k = 0; n[k]; k++)
                    snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s", k ? ", " : "", n[k]);
                return nc_error(err, errlen, NC_EINVAL, "text.%s is '%s', expected one of %s", key, value, allowed);
            }
            *(int *)dst = v;
            break;
        }
        case TK_STR:
            if (strlen(value) >= text_keys[i].size || strpbrk(value, " \t\r\n"))
                return nc_error(err, errlen, NC_EINVAL, "text.%s must be at most %zu bytes without white space", key,
                                text_keys[i].size - 1);
            memcpy(dst, value, strlen(value) + 1);
            break;
        }
        c->declared = true;
        return NC_OK;
    }
    char keys[256] = "preset";
    for (int i = 0; i < N_TEXT_KEYS; i++)
        snprintf(keys + strlen(keys), sizeof keys - strlen(keys), ", %s", text_keys[i].key);
    return nc_error(err, errlen, NC_EINVAL, "unknown key text.%s (known: %s)", key, keys);
}

bool text_conv_get(const nc_text_conv *c, int i, const char **key, char *val, size_t vallen)
{
    if (i < 0 || i >= N_TEXT_KEYS)
        return false;
    const char *src = (const char *)c + text_keys[i].off;
    *key = text_keys[i].key;
    switch (text_keys[i].kind) {
    case TK_BOOL: snprintf(val, vallen, "%s", *(const bool *)src ? "true" : "false"); break;
    case TK_ENUM: snprintf(val, vallen, "%s", text_keys[i].names[*(const int *)src]); break;
    case TK_STR: snprintf(val, vallen, "%s", src); break;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* Character classes                                                         */

enum {
    CL_SPACE,
    CL_NEWLINE,
    CL_WORD,                      /* letters, marks, digits: the stuff of words */
    CL_APOS,                      /* ' ’ ‘ ʼ ＇: inside a word (don't), a clitic ('s) or a quote */
    CL_HYPHEN,                    /* - ‐ ‑: inside a word (red-tipped) or punctuation */
    CL_QUOTE,
    CL_BRACKET,
    CL_STOP,                      /* ends a sentence: . ! ? ; … */
    CL_PUNCT,                     /* every other punctuation mark and symbol */
};

static int classify(ucs4_t u)
{
    if (u == '\n')
        return CL_NEWLINE;
    if (u < 0x80) {
        if (u == ' ' || (u >= '\t' && u <= '\r'))
            return CL_SPACE;
        if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9'))
            return CL_WORD;
        switch (u) {
        case '\'': return CL_APOS;
        case '-': return CL_HYPHEN;
        case '"': case '`': return CL_QUOTE;
        case '(': case ')': case '[': case ']': case '{': case '}': return CL_BRACKET;
        case '.': case '!': case '?': case ';': return CL_STOP;
        default: return CL_PUNCT;
        }
    }
    if (uc_is_property_white_space(u))
        return CL_SPACE;
    if (uc_is_general_category(u, UC_CATEGORY_L) || uc_is_general_category(u, UC_CATEGORY_M) ||
        uc_is_general_category(u, UC_CATEGORY_N))
        return CL_WORD;
    switch (u) {
    case 0x2019: case 0x2018: case 0x02BC: case 0xFF07: return CL_APOS;
    case 0x2010: case 0x2011: return CL_HYPHEN;
    case 0x2026: case 0x203C: case 0x2047: case 0x2048: case 0x2049: case 0x3002: case 0xFF01: case 0xFF0E:
    case 0xFF1F: case 0xFF1B: case 0x037E: return CL_STOP;
    case 0x00AB: case 0x00BB: case 0x201C: case 0x201D: case 0x201E: case 0x201F: case 0x2039: case 0x203A:
    case 0x300C: case 0x300D: case 0x300E: case 0x300F: case 0xFF02: return CL_QUOTE;
    }
    if (uc_is_general_category(u, UC_CATEGORY_Pi) || uc_is_general_category(u, UC_CATEGORY_Pf))
        return CL_QUOTE;
    if (uc_is_general_category(u, UC_CATEGORY_Ps) || uc_is_general_category(u, UC_CATEGORY_Pe))
        return CL_BRACKET;
    return CL_PUNCT;
}

static bool is_digit(ucs4_t u)
{
    return u < 0x80 ? (u >= '0' && u <= '9') : uc_is_general_category(u, UC_CATEGORY_Nd);
}

static bool is_letter(ucs4_t u)
{
    return u < 0x80 ? ((u | 0x20) >= 'a' && (u | 0x20) <= 'z') : uc_is_general_category(u, UC_CATEGORY_L);
}

/* ------------------------------------------------------------------------ */
/* One run over a text                                                       */

typedef struct {
    const nc_text_conv *c;
    const uint8_t *s;
    size_t len;
    const char *unk, *eos;
    norm_known_fn known;
    norm_emit_fn emit;
    void *ctx;
    size_t since_eos;             /* tokens emitted since the last eos */
    bool oom;                     /* an allocation failed where no rc travels (word_end) */
    bool continues;               /* the text continues earlier text (a feed: !final_eos) and
                                   * nothing was emitted yet: a stop first ends the sentence
                                   * the earlier text left open ("Hello" then ". ") */
    uint8_t *buf;                 /* the normalised word */
    size_t blen, bcap;
} norm_run;

/* The code point at s[i] (the text is valid UTF-8) and its length in *k. */
static ucs4_t at(const norm_run *r, size_t i, size_t *k)
{
    ucs4_t u;
    int n = u8_mbtouc(&u, r->s + i, r->len - i);
    *k = n > 0 ? (size_t)n : 1;
    return u;
}

static int cls_at(const norm_run *r, size_t i)
{
    size_t k;
    return i < r->len ? classify(at(r, i, &k)) : CL_SPACE;
}

/* What a class becomes outside a word. */
static norm_mode mode_of(const nc_text_conv *c, int cl)
{
    switch (cl) {
    case CL_APOS:
    case CL_QUOTE: return c->quotes;
    case CL_BRACKET: return c->brackets;
    case CL_HYPHEN: return c->hyphens == NORM_KEEP ? c->punctuation : c->hyphens;
    default: return c->punctuation;
    }
}

/* Kept inside words: a class whose mode is keep (punctuation: "keep" leaves
 * "said," one word, as white-space splitting does). */
static bool wordlike(const nc_text_conv *c, int cl)
{
    if (cl == CL_WORD)
        return true;
    if (cl == CL_HYPHEN || cl == CL_SPACE || cl == CL_NEWLINE)
        return false;
    return mode_of(c, cl) == NORM_KEEP;
}

static int emit(norm_run *r, const char *w, size_t wl, size_t off, size_t sl, bool is_eos)
{
    r->since_eos = is_eos ? 0 : r->since_eos + 1;
    r->continues = false;
    return r->emit(r->ctx, w, wl, off, sl, is_eos);
}

static int emit_eos(norm_run *r, size_t off, size_t sl)
{
    return emit(r, r->eos, strlen(r->eos), off, sl, true);
}

static int buf_set(norm_run *r, const uint8_t *p, size_t n)
{
    if (n + 1 > r->bcap) {
        size_t cap = n + 64;
        uint8_t *b = nc_realloc(r->buf, cap);
        if (!b)
            return NC_ENOMEM;
        r->buf = b;
        r->bcap = cap;
    }
    memcpy(r->buf, p, n);
    r->buf[n] = 0;
    r->blen = n;
    return NC_OK;
}

/* Replaces r->buf by a libunistring result p[0..*n) (freed here). n is a
 * pointer so that a call `buf_take(r, f(..., &n), &n)` reads it after f. */
static int buf_take(norm_run *r, uint8_t *p, const size_t *n)
{
    if (!p)
        return NC_ENOMEM;
    int rc = buf_set(r, p, *n);
    free(p);
    return rc;
}

/* s[a..b) in the conventions' form into r->buf: NFKC, accents, case, then
 * the typographic apostrophes and hyphens as ASCII ones, white space (which
 * NFKC can produce: U+FDFA) removed. Pure ASCII only changes case. */
static int norm_word(norm_run *r, size_t a, size_t b)
{
    const nc_text_conv *c = r->c;
    int rc = buf_set(r, r->s + a, b - a);
    /* a WikiText compound (word_end joined it): " @-@ " is its hyphen */
    for (uint8_t *w = rc == NC_OK ? memmem(r->buf, r->blen, " @-@ ", 5) : NULL; w;
         w = memmem(r->buf, r->blen, " @-@ ", 5)) {
        *w = '-';
        memmove(w + 1, w + 5, r->blen - (size_t)(w + 5 - r->buf) + 1);
        r->blen -= 4;
    }
    bool ascii = true;
    for (size_t i = 0; i < r->blen && ascii; i++)
        ascii = r->buf[i] < 0x80;
    if (rc == NC_OK && !ascii) {
        size_t n;
        if (c->nfkc && rc == NC_OK)
            rc = buf_take(r, u8_normalize(UNINORM_NFKC, r->buf, r->blen, NULL, &n), &n);
        if (c->strip_accents && rc == NC_OK) {
            rc = buf_take(r, u8_normalize(UNINORM_NFKD, r->buf, r->blen, NULL, &n), &n);
            size_t o = 0;
            for (size_t i = 0; rc == NC_OK && i < r->blen;) {
                ucs4_t u;
                int k = u8_mbtouc(&u, r->buf + i, r->blen - i);
                k = k > 0 ? k : 1;
                if (!uc_is_general_category(u, UC_CATEGORY_M))
                    memmove(r->buf + o, r->buf + i, (size_t)k), o += (size_t)k;
                i += (size_t)k;
            }
            r->blen = o;
            if (rc == NC_OK)
                rc = buf_take(r, u8_normalize(UNINORM_NFC, r->buf, r->blen, NULL, &n), &n);
        }
        if (c->case_mode == NORM_CASE_LOWER && rc == NC_OK)
            rc = buf_take(r, u8_tolower(r->buf, r->blen, NULL, NULL, NULL, &n), &n);
        else if (c->case_mode == NORM_CASE_FOLD && rc == NC_OK)
            rc = buf_take(r, u8_casefold(r->buf, r->blen, NULL, NULL, NULL, &n), &n);
        /* ’ ‘ ʼ ＇ → '   ‐ ‑ → -   and no white space inside a token */
        size_t o = 0;
        for (size_t i = 0; rc == NC_OK && i < r->blen;) {
            ucs4_t u;
            int k = u8_mbtouc(&u, r->buf + i, r->blen - i);
            k = k > 0 ? k : 1;
            int cl = classify(u);
            if (cl == CL_APOS)
                r->buf[o++] = '\'';
            else if (cl == CL_HYPHEN)
                r->buf[o++] = '-';
            else if (cl != CL_SPACE && cl != CL_NEWLINE)
                memmove(r->buf + o, r->buf + i, (size_t)k), o += (size_t)k;
            i += (size_t)k;
        }
        if (rc == NC_OK)
            r->buf[r->blen = o] = 0;
    } else if (rc == NC_OK && c->case_mode != NORM_CASE_KEEP) {
        for (size_t i = 0; i < r->blen; i++)
            if (r->buf[i] >= 'A' && r->buf[i] <= 'Z')
                r->buf[i] += 'a' - 'A';
    }
    return rc;
}

/* A number as written: digits with , or . between digits (1,805  3.5). */
static bool is_number(const uint8_t *w, size_t n)
{
    if (!n || w[0] < '0' || w[0] > '9')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((w[i] >= '0' && w[i] <= '9') || ((w[i] == ',' || w[i] == '.') && i + 1 < n)))
            return false;
    return true;
}

/* Emits the normalised s[a..b) (no clitic split): the number token for a
 * number, nothing when normalisation left nothing (a lone combining mark). */
static int emit_piece(norm_run *r, size_t a, size_t b)
{
    const nc_text_conv *c = r->c;
    size_t nl = strlen(c->number);
    if (nl && b - a == nl && !memcmp(r->s + a, c->number, nl))
        return emit(r, c->number, nl, a, b - a, false);
    int rc = norm_word(r, a, b);
    if (rc != NC_OK || !r->blen)
        return rc;
    if (nl && is_number(r->buf, r->blen))
        return emit(r, c->number, nl, a, b - a, false);
    return emit(r, (const char *)r->buf, r->blen, a, b - a, false);
}

/* PTB clitics, as the Treebank tokenizer splits them off a word's end. */
static const char *const clitics[] = {"n't", "'s", "'re", "'ve", "'ll", "'d", "'m", NULL};

/* Length of the clitic the normalised word w[0..n) ends with after a
 * non-empty stem, 0 if none. */
static size_t clitic_len(const uint8_t *w, size_t n)
{
    for (int i = 0; clitics[i]; i++) {
        size_t k = strlen(clitics[i]);
        if (n > k && !memcmp(w + n - k, clitics[i], k))
            return k;
    }
    return 0;
}

/* A word s[a..b): split a clitic off (don't → do n't) at the original
 * apostrophe, so each part keeps its own offset. */
static int emit_word(norm_run *r, size_t a, size_t b)
{
    if (!r->c->contractions)
        return emit_piece(r, a, b);
    int rc = norm_word(r, a, b);
    size_t cl = rc == NC_OK ? clitic_len(r->buf, r->blen) : 0;
    if (rc != NC_OK || !cl)
        return rc == NC_OK ? emit_piece(r, a, b) : rc;
    /* the last apostrophe of the original; n't starts one character before it */
    size_t ap = b, k;
    for (size_t i = a; i < b; i += k)
        if (classify(at(r, i, &k)) == CL_APOS)
            ap = i;
    if (ap == b || ap == a)
        return emit_piece(r, a, b);
    size_t split = ap;
    if (cl == 3 && !memcmp(r->buf + r->blen - 3, "n't", 3)) {   /* n't starts before the apostrophe */
        ucs4_t pu;
        const uint8_t *p = u8_prev(&pu, r->s + ap, r->s + a);
        split = p ? (size_t)(p - r->s) : a;
    }
    if (split == a)
        return emit_piece(r, a, b);
    rc = emit_piece(r, a, split);
    return rc == NC_OK ? emit_piece(r, split, b) : rc;
}

/* The end of the word starting at i (a word character): word characters,
 * joined by an apostrophe between letters (don't, o'clock), a hyphen between
 * word characters when hyphens are kept, , or . between digits (1,805 3.5),
 * . after a single letter before a letter (u.s), and a final '.' when the
 * vocabulary has the word with it (mr.). */
static size_t word_end(norm_run *r, size_t i)
{
    const nc_text_conv *c = r->c;
    size_t j = i, k, seg = 0;     /* seg: characters since the start or the last inner '.' */
    ucs4_t prev = 0;
    while (j < r->len) {
        ucs4_t u = at(r, j, &k);
        int cl = classify(u);
        if (wordlike(c, cl)) {
            j += k, prev = u, seg++;
            continue;
        }
        size_t k2;
        ucs4_t nx = j + k < r->len ? at(r, j + k, &k2) : 0;
        bool nx_word = j + k < r->len && classify(nx) == CL_WORD;
        if (cl == CL_APOS && nx_word && is_letter(prev) && is_letter(nx)) {
            j += k, prev = u;
            continue;
        }
        if (cl == CL_HYPHEN && c->hyphens == NORM_KEEP && nx_word && classify(prev) == CL_WORD) {
            j += k, prev = u;
            continue;
        }
        /* WikiText's tokenised form writes a hyphen inside a word as " @-@ "
         * (red @-@ tipped): the same compound */
        if (u == ' ' && c->hyphens == NORM_KEEP && classify(prev) == CL_WORD && j + 5 < r->len &&
            !memcmp(r->s + j, " @-@ ", 5) && cls_at(r, j + 5) == CL_WORD) {
            j += 5, prev = '-';
            continue;
        }
        if ((u == '.' || u == ',') && is_digit(prev) && is_digit(nx)) {
            j += k, prev = u;
            continue;
        }
        if (u == '.' && c->abbreviations && seg == 1 && is_letter(prev) && is_letter(nx)) {
            j += k, prev = u, seg = 0;
            continue;
        }
        break;
    }
    if (c->abbreviations && r->known && j < r->len && r->s[j] == '.') {
        if (norm_word(r, i, j + 1) != NC_OK)
            r->oom = true;
        else if (r->known(r->ctx, (const char *)r->buf, r->blen))
            j++;
    }
    return j;
}

/* A clitic written on its own ('s of already tokenised text): its length
 * at i (an apostrophe) when a clitic and then no word character follow. */
static size_t lone_clitic(norm_run *r, size_t i)
{
    size_t k;
    at(r, i, &k);
    for (int c = 1; clitics[c]; c++) {
        size_t n = strlen(clitics[c]) - 1, e = i + k + n;
        if (e > r->len || wordlike(r->c, cls_at(r, e)))
            continue;
        bool same = true;
        for (size_t q = 0; q < n && same; q++)
            same = (r->s[i + k + q] | 0x20) == clitics[c][1 + q];
        if (same)
            return k + n;
    }
    return 0;
}

/* s[i..) starts with the token w followed by white space or the end. */
static bool verbatim(const norm_run *r, size_t i, const char *w)
{
    size_t n = strlen(w);
    return n && i + n <= r->len && !memcmp(r->s + i, w, n) &&
           (cls_at(r, i + n) == CL_SPACE || cls_at(r, i + n) == CL_NEWLINE);
}

/* Whether the run of stops s[i..e) ends a sentence: ';' does; . ! ? and …
 * do unless the next word, past quotes and brackets, starts in lower case
 * ("Heavens!" replied the prince: one sentence, as in the PTB text of
 * ../shared/data). */
static bool sentence_ends(const norm_run *r, size_t i, size_t e)
{
    for (size_t q = i; q < e; q++)
        if (r->s[q] == ';')
            return true;
    size_t k;
    while (e < r->len) {
        ucs4_t u = at(r, e, &k);
        int cl = classify(u);
        if (cl == CL_WORD)
            return !(u < 0x80 ? (u >= 'a' && u <= 'z') : uc_is_property_lowercase(u));
        if (cl != CL_SPACE && cl != CL_NEWLINE && cl != CL_QUOTE && cl != CL_BRACKET && cl != CL_APOS)
            return true;
        e += k;
    }
    return true;
}

/* Whether u is one of the conventions' kept symbols. */
static bool kept_symbol(const nc_text_conv *c, const uint8_t *p, size_t k)
{
    const char *s = c->symbols;
    for (size_t i = 0; s[i];) {
        int n = u8_mblen((const uint8_t *)s + i, strlen(s + i));
        n = n > 0 ? n : 1;
        if ((size_t)n == k && !memcmp(s + i, p, k))
            return true;
        i += (size_t)n;
    }
    return false;
}

/* Whether the text is written in sentences: at least one run of stops
 * outside the words (a '.' inside 3.5, u.s. or the vocabulary's mr. is
 * none) per four lines. Otherwise it is taken as one sentence per line, as
 * PTB-style text is written (whose rare stray stop, "non-u.s.", must not
 * turn 2,000 lines into one) and as a line typed without a period is meant.
 * A scan like run()'s, emitting nothing. */
static bool in_sentences(norm_run *r)
{
    size_t i = 0, k, stops = 0, lines = 0;
    while (i < r->len && !r->oom) {
        int cl = classify(at(r, i, &k));
        if (cl == CL_STOP) {
            stops++;
            while (i < r->len && cls_at(r, i) == CL_STOP)
                at(r, i, &k), i += k;
            continue;
        }
        lines += cl == CL_NEWLINE;
        i = wordlike(r->c, cl) ? word_end(r, i) : i + k;
    }
    return stops > 0 && stops * 4 >= lines;
}

static int run(norm_run *r, bool final_eos)
{
    const nc_text_conv *c = r->c;
    bool sentences = c->lines == NORM_LINES_SENTENCES && in_sentences(r);
    if (r->oom)
        return NC_ENOMEM;
    bool line_has_content = false, at_start = true;   /* at_start: after white space */
    size_t i = 0, k;
    int rc = NC_OK;
    while (i < r->len && rc == NC_OK) {
        ucs4_t u = at(r, i, &k);
        int cl = classify(u);
        if (cl == CL_NEWLINE) {
            if (!sentences || (!line_has_content && r->since_eos))
                rc = emit_eos(r, i, 1);
            line_has_content = false, at_start = true;
            i++;
            continue;
        }
        if (cl == CL_SPACE) {
            i += k, at_start = true;
            continue;
        }
        line_has_content = true;
        if (at_start && (verbatim(r, i, r->unk) || verbatim(r, i, r->eos))) {
            size_t n = strlen(verbatim(r, i, r->unk) ? r->unk : r->eos);
            rc = emit(r, (const char *)r->s + i, n, i, n, false);
            i += n;
            continue;
        }
        at_start = false;
        if (wordlike(c, cl)) {
            size_t e = word_end(r, i);
            rc = r->oom ? NC_ENOMEM : emit_word(r, i, e);
            i = e;
            continue;
        }
        size_t lc = cl == CL_APOS && c->contractions ? lone_clitic(r, i) : 0;
        if (lc) {
            rc = norm_word(r, i, i + lc);
            if (rc == NC_OK)
                rc = emit(r, (const char *)r->buf, r->blen, i, lc, false);
            i += lc;
            continue;
        }
        if (cl == CL_STOP) {
            size_t e = i, last = i;
            while (e < r->len && cls_at(r, e) == CL_STOP) {
                at(r, e, &k);
                if (c->punctuation == NORM_SPLIT && (rc = norm_word(r, e, e + k)) == NC_OK)
                    rc = emit(r, (const char *)r->buf, r->blen, e, k, false);
                last = e;
                e += k;
            }
            /* the eos spans the run, or its last stop when the stops are
             * tokens themselves (offsets never go back) */
            size_t eo = c->punctuation == NORM_SPLIT ? last : i;
            if (rc == NC_OK && sentences && (r->since_eos || r->continues) && sentence_ends(r, i, e))
                rc = emit_eos(r, eo, e - eo);
            i = e;
            continue;
        }
        if (kept_symbol(c, r->s + i, k) || mode_of(c, cl) == NORM_SPLIT) {
            rc = norm_word(r, i, i + k);
            if (rc == NC_OK && r->blen)
                rc = emit(r, (const char *)r->buf, r->blen, i, k, false);
        }
        i += k;
    }
    /* Python's `for line in f` yields a last line without '\n' too, and
     * word_language_model appends <eos> to every line it yields. */
    if (rc == NC_OK && final_eos && (sentences ? r->since_eos > 0 : line_has_content))
        rc = emit_eos(r, r->len, 0);
    return rc;
}

int normalize_text(const nc_text_conv *c, const char *text, size_t len, bool final_eos, const char *unk,
                   const char *eos, norm_known_fn known, norm_emit_fn emitfn, void *ctx)
{
    norm_run r = {.c = c, .s = (const uint8_t *)text, .len = len, .unk = unk, .eos = eos, .known = known,
                  .emit = emitfn, .ctx = ctx, .continues = !final_eos};
    int rc = run(&r, final_eos);
    free(r.buf);
    return rc;
}
