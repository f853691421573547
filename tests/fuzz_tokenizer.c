/* fuzz_tokenizer.c -- libFuzzer harness for the tokenizer: arbitrary bytes
 * (invalid UTF-8, NUL bytes, huge tokens, Unicode white space) through
 * tokenize() of a small in-memory model. The first byte picks lower-casing
 * and final_eos. Checks the contract: the text is refused exactly when it
 * holds a NUL or invalid UTF-8; otherwise every token is a non-empty word
 * without white space at an increasing offset inside the text, with an id in
 * the vocabulary. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <unistr.h>

#include "fuzzmodel.h"
#include "model.h"
#include "tokenizer.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

static nc_model *ftok_model;

static nc_model *ftok_get_model(void)
{
    if (ftok_model)
        return ftok_model;
    static const char *const words[] = {"<unk>", "<eos>", "the", "a", "über", "ǅemal", "日本", "straße", "x"};
    ftok_model = fuzz_model_of(words, sizeof words / sizeof words[0]);
    return ftok_model;
}

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    nc_model *m = ftok_get_model();
    m->cfg.lowercase = data[0] & 1;
    bool final_eos = (data[0] & 2) != 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    nc_tokens t;
    tokens_init(&t);
    /* Something already in the list must survive a refusal untouched. */
    if (tokens_push(&t, 2, "the", 3, 0) != NC_OK)
        abort();
    char err[NC_ERRLEN] = "";
    int rc = tokenize(m, text, len, final_eos, &t, err, sizeof err);
    bool bad = memchr(text, 0, len) != NULL || u8_check((const uint8_t *)text, len) != NULL;
    if (bad) {
        if (rc != NC_EFORMAT || t.n != 1 || !err[0])
            abort();
    } else {
        if (rc != NC_OK)
            abort();
        size_t prev = 0;
        for (size_t i = 1; i < t.n; i++) {
            const char *w = t.words[i];
            if (t.ids[i] < 0 || t.ids[i] >= m->cfg.vocab_size || !w[0] || t.offsets[i] > len)
                abort();
            if (i > 1 && t.offsets[i] <= prev)
                abort();
            prev = t.offsets[i];
            if (t.ids[i] == m->eos_id && t.offsets[i] < len && text[t.offsets[i]] == '\n')
                continue;   /* a line end (a literal "<eos>" word is checked as a word) */
            if (t.ids[i] == m->eos_id && t.offsets[i] == len)
                continue;   /* final_eos */
            if (strchr(w, ' ') || strchr(w, '\n') || strchr(w, '\t'))
                abort();
            /* An in-vocabulary id names that very word. */
            if (t.ids[i] != m->unk_id && strcmp(vocab_word(m->vocab, t.ids[i]), w) != 0)
                abort();
        }
    }
    tokens_clear(&t);
    return 0;
}
