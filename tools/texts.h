/* texts.h -- the texts the commands read (texts.c): tokenised in the
 * model's conventions, prepared by one LSTM pass, scored entries to a
 * perplexity. */
#ifndef NC_TEXTS_H
#define NC_TEXTS_H

#include <stdbool.h>
#include <stddef.h>

#include "doc.h"
#include "model.h"
#include "tokenizer.h"
#include "wordtable.h"

/* 1 when code is --no-normalize (CO_NO_NORMALIZE, cacheopts.h: then
 * co_read_tokens splits on white space only, eos per line;
 * docs/normalisation.md), else 0. Set once by the command's option loop,
 * before any file is read. */
int co_parse_normalize(int code);
/* co_read_tokens prints "FILE: N tokens (...), U unknown words (x%)" on
 * stderr (default true; score prints the rate beside its perplexity). */
extern bool co_report_unk;

/* A text to run the model over: its tokens, the start state (bos_eos: the
 * state after eos, every token scored; else the first token is context
 * only) and the open-vocabulary word table (NULL: closed vocabulary). */
typedef struct {
    const nc_model *m;
    const nc_tokens *toks;
    bool bos_eos;
    nc_wordtable *words;
} co_text;

/* Reads a text file ('-' = stdin) and tokenises it (file semantics: a last
 * line without newline also ends with eos), normalised to the model's text
 * conventions unless --no-normalize was given. */
int co_read_tokens(const nc_model *m, const char *path, nc_tokens *out, char *err, size_t errlen);
/* Prepares a document of x (the LSTM pass). */
int co_prepare(const co_text *x, nc_doc **out, char *err, size_t errlen);
/* The same; vocab_stats: keep p_vocab's statistics for the gate's features
 * (co_prepare does when the model has a gate; fit-gate needs them before). */
int co_prepare_ex(const co_text *x, bool vocab_stats, nc_doc **out, char *err, size_t errlen);
/* Perplexity of the scored entries (NAN entries skipped); *n gets their count. */
double co_ppl(const double *lp, size_t len, size_t *n);
/* Tokens of t that are the model's unk, and their share of t in percent
 * (eos included in the denominator, as perplexity counts it): the figure
 * printed beside every perplexity, for <unk>-heavy text flatters it. */
double co_unk_rate(const nc_model *m, const nc_tokens *t, size_t *unk);

#endif
