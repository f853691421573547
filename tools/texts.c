/* texts.c -- the texts the commands read (texts.h): a file tokenised in
 * the model's conventions (or split on white space with --no-normalize),
 * with its unknown-word rate; a document prepared by one LSTM pass; the
 * perplexity of scored entries. */
#include "texts.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "cacheopts.h"

/* Set once by the command's option loop, before any file is read. */
static bool co_normalize = true;
/* co_read_tokens prints each file's unknown-word rate (score prints its own
 * beside its perplexity) */
bool co_report_unk = true;

int co_parse_normalize(int code)
{
    if (code != CO_NO_NORMALIZE)
        return 0;
    co_normalize = false;
    return 1;
}

double co_unk_rate(const nc_model *m, const nc_tokens *t, size_t *unk)
{
    *unk = tokens_count_unk(m, t, 0);
    return t->n ? 100.0 * (double)*unk / (double)t->n : 0.0;
}

int co_read_tokens(const nc_model *m, const char *path, nc_tokens *out, char *err, size_t errlen)
{
    nc_buf text = NC_BUF_INIT;
    int rc = strcmp(path, "-") ? buf_read_file(&text, path, err, errlen)
                               : buf_read_stream(&text, stdin, "standard input", err, errlen);
    if (!rc) {
        char e2[NC_ERRLEN];
        size_t n0 = out->n, unk;
        rc = tokenize_ex(m, text.data ? text.data : "", text.len, true, co_normalize, out, e2, sizeof e2);
        if (rc)
            nc_error(err, errlen, rc, "%s: %s", path, e2);
        /* every perplexity a command prints comes with the rate of <unk>
         * behind it (an <unk>-heavy text flatters it: docs/normalisation.md) */
        /* words and offsets are NULL when the caller keeps no strings
         * (and an empty file leaves ids NULL): no offset into NULL */
        nc_tokens mine = {out->ids ? out->ids + n0 : NULL, out->words ? out->words + n0 : NULL,
                          out->offsets ? out->offsets + n0 : NULL, out->n - n0, out->n - n0, NULL};
        double rate = rc ? 0 : co_unk_rate(m, &mine, &unk);
        if (!rc && co_report_unk)
            fprintf(stderr, "%s: %zu tokens (%s), %zu unknown words (%.2f%%)\n", path, mine.n,
                    co_normalize && m->cfg.text.declared ? "normalised to the model's text conventions"
                                                         : "split on white space",
                    unk, rate);
    }
    buf_free(&text);
    return rc;
}

int co_prepare(const co_text *x, nc_doc **out, char *err, size_t errlen)
{
    return co_prepare_ex(x, x->m->gate != NULL, out, err, errlen);
}

int co_prepare_ex(const co_text *x, bool vocab_stats, nc_doc **out, char *err, size_t errlen)
{
    const nc_model *m = x->m;
    const bool bos_eos = x->bos_eos;
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    int rc = (!s || !w) ? nc_error(err, errlen, NC_ENOMEM, "state") : NC_OK;
    if (!rc && bos_eos)
        lstm_step(m, s, m->eos_id, w);
    const nc_doc_prep in = {
        .m = m, .s = s, .has_h = bos_eos, .toks = x->toks, .words = x->words, .vocab_stats = vocab_stats};
    if (!rc)
        rc = doc_prepare(&in, out, err, errlen);
    lstm_state_free(s);
    lstm_work_free(w);
    return rc;
}

double co_ppl(const double *lp, size_t len, size_t *n)
{
    double sum = 0;
    size_t c = 0;
    for (size_t i = 0; i < len; i++)
        if (!isnan(lp[i])) {
            sum += lp[i];
            c++;
        }
    if (n)
        *n = c;
    return c ? exp(-sum / (double)c) : NAN;
}
