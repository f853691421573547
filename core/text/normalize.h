/* normalize.h -- a model's text conventions and the one normaliser that maps ordinary text onto them. */
#ifndef NC_NORMALIZE_H
#define NC_NORMALIZE_H

#include "nc_common.h"

/* What a class of characters becomes (docs/normalisation.md). */
typedef enum {
    NORM_KEEP = 0,                /* stays inside the word it touches (no split) */
    NORM_SPLIT,                   /* a token of its own */
    NORM_DROP,                    /* a word separator, no token */
} norm_mode;

typedef enum { NORM_CASE_KEEP = 0, NORM_CASE_LOWER, NORM_CASE_FOLD } norm_case;

/* Where sentences (eos tokens) end. */
typedef enum {
    NORM_LINES_EOS = 0,           /* every '\n' is an eos (one sentence per line, as today) */
    NORM_LINES_SENTENCES,         /* . ! ? ; … and blank lines end a sentence; '\n' is a space
                                   * (hard-wrapped prose: books, paragraphs); a text with fewer
                                   * than one stop per four lines is one sentence per line
                                   * (PTB-style text, lines typed without a period) */
} norm_lines;

/* A model's text conventions: config.json's "text" object. All-zero is
 * "declared nothing": the tokenizer then splits on white space only, as
 * before the object existed (the legacy "lowercase" flag still applies). */
typedef struct {
    bool declared;                /* config.json has a "text" object: the normaliser runs */
    bool nfkc;                    /* Unicode NFKC first (ﬁ → fi, full-width → ASCII) */
    norm_case case_mode;          /* lower: u8_tolower; fold: u8_casefold (ß → ss) */
    bool strip_accents;           /* NFKD, drop combining marks (é → e) */
    char number[16];              /* each number (1,805  3.5  0.7) becomes this token; "" keeps it */
    norm_mode punctuation;        /* . , ; : ! ? and other punctuation and symbols */
    norm_mode quotes;             /* " “ ” « » and quote-like apostrophes at word edges */
    norm_mode brackets;           /* ( ) [ ] { } and other open/close punctuation */
    norm_mode hyphens;            /* '-' between two word characters; keep = one compound word */
    bool contractions;            /* PTB clitics: don't → do n't, company's → company 's */
    bool abbreviations;           /* word + '.' is one token when the vocabulary has it (mr., u.s.) */
    norm_lines lines;             /* where eos tokens go */
    char symbols[32];             /* characters kept as tokens even when punctuation is dropped ($ &) */
} nc_text_conv;

/* The Penn Treebank conventions (Mikolov's PTB and the demo model). */
void text_conv_ptb(nc_text_conv *c);

/* Sets one key of the "text" object from its string form (booleans as
 * "true"/"false"; "preset": "ptb" or "none" resets every key). Marks c
 * declared. NC_EINVAL with a message naming the key and the allowed values. */
int text_conv_set(nc_text_conv *c, const char *key, const char *value, char *err, size_t errlen);

/* Whether key is a boolean key of the "text" object (for JSON readers). */
bool text_conv_key_is_bool(const char *key);

/* The i-th key of the object and its value as text (into val[vallen]);
 * false past the last key. Writers iterate it (config.json, /v1/model). */
bool text_conv_get(const nc_text_conv *c, int i, const char **key, char *val, size_t vallen);

/* One token found by normalize_text: word[0..wlen) is the normalised form
 * (NUL-terminated), src_off/src_len the bytes of the original text it came
 * from (for eos: the sentence-ending character or the newline; src_len 0 for
 * the eos appended at the end). Returns NC_OK or an error that stops the run. */
typedef int (*norm_emit_fn)(void *ctx, const char *word, size_t wlen, size_t src_off, size_t src_len,
                            bool is_eos);
/* Whether the model's vocabulary has word[0..n) (abbreviations). */
typedef bool (*norm_known_fn)(void *ctx, const char *word, size_t n);

/* Normalises text[0..len) (valid UTF-8 without NUL: the caller checks) by c
 * and calls emit for every token in order, with increasing src_off inside
 * [0, len]. unk and eos (the model's tokens) written verbatim as a word stay
 * themselves, and so does c->number. final_eos: a last sentence (or line)
 * without an end gets an eos too (a whole document); without it the text
 * may continue earlier text (a feed), so a stop before any word ends the
 * sentence that text left open. known may be NULL. Returns the first
 * non-OK rc of emit, NC_ENOMEM, or NC_OK. */
int normalize_text(const nc_text_conv *c, const char *text, size_t len, bool final_eos, const char *unk,
                   const char *eos, norm_known_fn known, norm_emit_fn emit, void *ctx);

#endif
