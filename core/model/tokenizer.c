/* tokenizer.c -- text to token ids: normalised by the model's conventions, or whitespace split (libunistring). */
#include "tokenizer.h"
#include "fault.h"
#include "normalize.h"

#include <stdlib.h>
#include <string.h>

#include <unicase.h>
#include <unictype.h>
#include <unistr.h>

void tokens_init(nc_tokens *t)
{
    memset(t, 0, sizeof *t);
}

void tokens_clear(nc_tokens *t)
{
    NC_ASSERT(t, "tokens_clear: no t");
    for (size_t i = 0; i < t->n; i++)
        free(t->words[i]);
    free(t->ids);
    free(t->words);
    free(t->offsets);
    free(t->lens);
    tokens_init(t);
}

static int tokens_grow(nc_tokens *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 256;
    int *ids = nc_realloc(t->ids, ncap * sizeof *ids);
    if (!ids)
        return NC_ENOMEM;
    t->ids = ids;
    char **words = nc_realloc(t->words, ncap * sizeof *words);
    if (!words)
        return NC_ENOMEM;
    t->words = words;
    size_t *offs = nc_realloc(t->offsets, ncap * sizeof *offs);
    if (!offs)
        return NC_ENOMEM;
    t->offsets = offs;
    size_t *lens = nc_realloc(t->lens, ncap * sizeof *lens);
    if (!lens)
        return NC_ENOMEM;
    t->lens = lens;
    t->cap = ncap;
    return NC_OK;
}

int tokens_push(nc_tokens *t, int id, const char *word, size_t len, size_t offset)
{
    return tokens_push_src(t, id, word, len, offset, len);
}

size_t tokens_count_unk(const nc_model *m, const nc_tokens *t, size_t from)
{
    NC_ASSERT(t, "tokens_count_unk: no t");
    NC_ASSERT(m, "tokens_count_unk: no m");
    size_t n = 0;
    for (size_t i = from; i < t->n; i++)
        n += t->ids[i] == m->unk_id;
    return n;
}

int tokens_push_src(nc_tokens *t, int id, const char *word, size_t len, size_t offset, size_t src_len)
{
    NC_ASSERT(t, "tokens_push_src: no t");
    if (t->n == t->cap && tokens_grow(t) != NC_OK)
        return NC_ENOMEM;
    char *w = nc_malloc(len + 1);
    if (!w)
        return NC_ENOMEM;
    memcpy(w, word, len);
    w[len] = '\0';
    t->ids[t->n] = id;
    t->words[t->n] = w;
    t->offsets[t->n] = offset;
    t->lens[t->n] = src_len;
    t->n++;
    return NC_OK;
}

/* Drops tokens past n (rollback after a failed tokenize). */
static void tokens_truncate(nc_tokens *t, size_t n)
{
    for (size_t i = n; i < t->n; i++)
        free(t->words[i]);
    t->n = n;
}

/* Length of the whitespace character at s (0 if not whitespace). Python's
 * str.split(), which word_language_model uses, splits on Unicode white
 * space, so non-ASCII spaces (U+00A0, U+3000, ...) separate words too. */
static size_t space_len(const uint8_t *s, size_t n)
{
    if (s[0] < 0x80)
        return (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r')) ? 1 : 0;
    ucs4_t uc;
    int k = u8_mbtouc(&uc, s, n);
    return (k > 0 && uc_is_property_white_space(uc)) ? (size_t)k : 0;
}

static int push_word(const nc_model *m, const uint8_t *w, size_t wl, size_t off, nc_tokens *out, char *err,
                     size_t errlen)
{
    uint8_t buf[256];
    const uint8_t *word = w;
    uint8_t *low = NULL;
    size_t len = wl;
    /* with a "text" object, "lowercase" is only there for older readers:
     * text sent un-normalised is taken as already in the conventions */
    if (m->cfg.lowercase && !m->cfg.text.declared) {
        size_t ll = sizeof buf;
        low = u8_tolower(w, wl, NULL, NULL, buf, &ll);
        if (!low)
            return nc_error(err, errlen, NC_ENOMEM, "tokenize: out of memory lower-casing at byte %zu", off);
        word = low;
        len = ll;
    }
    int id = vocab_lookup(m->vocab, (const char *)word, len);
    int rc = tokens_push_src(out, id >= 0 ? id : m->unk_id, (const char *)word, len, off, wl);
    if (low && low != buf)
        free(low);
    return rc == NC_OK ? NC_OK : nc_error(err, errlen, rc, "tokenize: out of memory");
}

typedef struct {
    const nc_model *m;
    nc_tokens *out;
} norm_ctx;

static bool norm_known(void *ctx, const char *w, size_t n)
{
    return vocab_lookup(((norm_ctx *)ctx)->m->vocab, w, n) >= 0;
}

static int norm_push(void *ctx, const char *w, size_t wl, size_t off, size_t sl, bool is_eos)
{
    norm_ctx *c = ctx;
    int id = is_eos ? c->m->eos_id : vocab_lookup(c->m->vocab, w, wl);
    return tokens_push_src(c->out, id >= 0 ? id : c->m->unk_id, w, wl, off, sl);
}

int tokenize(const nc_model *m, const char *text, size_t len, bool final_eos, nc_tokens *out, char *err,
             size_t errlen)
{
    return tokenize_ex(m, text, len, final_eos, true, out, err, errlen);
}

int tokenize_ex(const nc_model *m, const char *text, size_t len, bool final_eos, bool normalize, nc_tokens *out,
                char *err, size_t errlen)
{
    NC_ASSERT(out, "tokenize_ex: no out");
    NC_ASSERT(m, "tokenize_ex: no m");
    const uint8_t *s = (const uint8_t *)text;
    const char *nul = memchr(text, '\0', len);
    if (nul)
        return nc_error(err, errlen, NC_EFORMAT, "invalid text: NUL byte at byte offset %zu", (size_t)(nul - text));
    const uint8_t *bad = u8_check(s, len);
    if (bad)
        return nc_error(err, errlen, NC_EFORMAT, "invalid UTF-8 at byte offset %zu", (size_t)(bad - s));

    size_t start_n = out->n;
    if (normalize && m->cfg.text.declared) {
        norm_ctx c = {m, out};
        int rc = normalize_text(&m->cfg.text, text, len, final_eos, m->cfg.unk_token, m->cfg.eos_token, norm_known,
                                norm_push, &c);
        if (rc != NC_OK) {
            tokens_truncate(out, start_n);
            return nc_error(err, errlen, rc, "tokenize: out of memory normalising the text");
        }
        return NC_OK;
    }
    const char *eos = m->cfg.eos_token;
    size_t eos_len = strlen(eos);
    size_t i = 0, line_start = 0;
    int rc = NC_OK;
    while (i < len && rc == NC_OK) {
        if (s[i] == '\n') {
            rc = tokens_push_src(out, m->eos_id, eos, eos_len, i, 1) == NC_OK
                     ? NC_OK
                     : nc_error(err, errlen, NC_ENOMEM, "tokenize: out of memory");
            i++;
            line_start = i;
            continue;
        }
        size_t sp = space_len(s + i, len - i);
        if (sp) {
            i += sp;
            continue;
        }
        size_t w0 = i;
        while (i < len && s[i] != '\n' && !space_len(s + i, len - i)) {
            int k = u8_mblen(s + i, len - i);
            i += k > 0 ? (size_t)k : 1;
        }
        rc = push_word(m, s + w0, i - w0, w0, out, err, errlen);
    }
    /* Python's `for line in f` yields a last line without '\n' too, and
     * word_language_model appends <eos> to every line it yields. */
    if (rc == NC_OK && final_eos && line_start < len)
        rc = tokens_push_src(out, m->eos_id, eos, eos_len, len, 0) == NC_OK
                 ? NC_OK
                 : nc_error(err, errlen, NC_ENOMEM, "tokenize: out of memory");
    if (rc != NC_OK)
        tokens_truncate(out, start_n);
    return rc;
}
