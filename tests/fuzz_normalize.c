/* fuzz_normalize.c -- libFuzzer harness for the text normaliser
 * (core/text/normalize.c) through tokenize() of a small model with text
 * conventions: arbitrary bytes (invalid UTF-8, NUL, combining marks,
 * compatibility characters, apostrophes, stops, numbers, huge words). The
 * first byte picks the conventions (PTB, or each mode varied by its bits)
 * and final_eos. Checks the contract: the text is refused exactly when it
 * holds a NUL or invalid UTF-8; otherwise every token is a non-empty word
 * without white space whose span [offset, offset + length) lies inside the
 * text, offsets never decrease, a non-eos token starts on a UTF-8 character
 * boundary, and an in-vocabulary id names that very word. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <unistr.h>

#include "fuzzmodel.h"
#include "model.h"
#include "normalize.h"
#include "tokenizer.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

static nc_model *fnorm_model;

static nc_model *fnorm_get_model(void)
{
    if (fnorm_model)
        return fnorm_model;
    static const char *const words[] = {"<unk>", "<eos>", "the", "a", "N", "n't", "'s", "do", "mr.",
                                        "u.s.", "$", "red-tipped", "uber", "ecole", ",", "."};
    fnorm_model = fuzz_model_of(words, sizeof words / sizeof words[0]);
    return fnorm_model;
}

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    nc_model *m = fnorm_get_model();
    uint8_t k = data[0];
    nc_text_conv *c = &m->cfg.text;
    text_conv_ptb(c);
    if (k & 0x80) {   /* every mode varied: each class keep / split / drop */
        c->punctuation = (norm_mode)((k >> 1) % 3);
        c->quotes = (norm_mode)((k >> 2) % 3);
        c->brackets = (norm_mode)((k >> 3) % 3);
        c->hyphens = (norm_mode)((k >> 4) % 3);
        c->case_mode = (norm_case)((k >> 2) % 3);
        c->lines = (k & 0x20) ? NORM_LINES_EOS : NORM_LINES_SENTENCES;
        c->contractions = (k & 0x40) != 0;
        c->abbreviations = (k & 0x08) != 0;
        c->strip_accents = (k & 0x10) != 0;
        c->nfkc = (k & 0x04) != 0;
    }
    bool final_eos = (k & 1) != 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN] = "";
    int rc = tokenize(m, text, len, final_eos, &t, err, sizeof err);
    bool bad = memchr(text, 0, len) != NULL || u8_check((const uint8_t *)text, len) != NULL;
    if (bad) {
        if (rc != NC_EFORMAT || t.n != 0 || !err[0])
            abort();
    } else {
        if (rc != NC_OK)
            abort();
        size_t prev = 0;
        for (size_t i = 0; i < t.n; i++) {
            const char *w = t.words[i];
            if (t.ids[i] < 0 || t.ids[i] >= m->cfg.vocab_size || !w[0])
                abort();
            if (t.offsets[i] > len || t.lens[i] > len - t.offsets[i] || t.offsets[i] < prev)
                abort();
            prev = t.offsets[i];
            if (strchr(w, ' ') || strchr(w, '\n') || strchr(w, '\t'))
                abort();
            if (u8_check((const uint8_t *)w, strlen(w)))
                abort();
            if (t.ids[i] == m->eos_id)
                continue;
            /* a word starts on a character: not on a UTF-8 continuation byte */
            if (t.lens[i] == 0 || ((uint8_t)text[t.offsets[i]] & 0xC0) == 0x80)
                abort();
            if (t.ids[i] != m->unk_id && strcmp(vocab_word(m->vocab, t.ids[i]), w) != 0)
                abort();
        }
    }
    tokens_clear(&t);
    return 0;
}
