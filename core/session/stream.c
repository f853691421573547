/* stream.c -- the per-stream predictor: LSTM state + the component rows'
 * session states (component.h), which may read the namespace's index
 * store. Scoring goes through doc_score so that streams and documents share
 * one causal code path. */
#include "stream.h"
#include "binio.h"
#include "buf.h"
#include "components.h"
#include "doc.h"
#include "dyneval.h"
#include "gate.h"
#include "lstm.h"
#include "mixture.h"
#include "vmath.h"
#include "fault.h"

#include <ctype.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The memo of the model's output at the stream's h (issue 26): what a
 * predict made at h_t -- the decoder's logits, and in the rows' states what
 * their at_h and search_h made (a searched row's coarse search of h_t) --
 * read again by the next feed (the token's score at h_t, the add of the
 * pair (h_t, x) whose key is h_t) and by a repeated predict, instead of
 * made twice: a one-word feed + predict pair then runs one decoder GEMV (V
 * x H) and one coarse search, not two. Only what those would make to the
 * bit is kept: logits of lstm_logits with the stream's weights (doc_prepare
 * says where a feed makes the same), what the rows make of h alone.
 * Cleared by all that moves h or the weights: feed (dynamic evaluation's
 * steps are in it), reset, new parameters; an imported or cloned stream
 * starts without one. */
typedef struct {
    bool logits;                  /* s->logits = lstm_logits(wm(s), h) */
    /* the rows' states still hold what their at_h and search_h made at h
     * (component.h nc_at_h.memo: a window's dots h.h_i and words) while the
     * states are as they read them (issue 36: a 2,000-entry window's dots
     * are 2 MB of keys read from memory, most of a repeated predict) */
    bool rows;
} stream_memo;

static atomic_bool memo_off;            /* stream_memo_disable */
static atomic_uint_fast64_t memo_reads; /* stream_memo_reads */

struct nc_stream {
    const nc_model *m;
    nc_cache_params p;
    nc_state *st;
    nc_lstm_work *work;
    bool has_h;
    int64_t pos;
    void *rows[NC_NCOMP];         /* each row's session state (component.h state_new), or NULL */
    nc_unbounded_cache *ub;       /* the namespace's index store (borrowed), or NULL */
    nc_wordtable *words;          /* open vocabulary table or NULL */
    nc_wordtable *store_words;    /* the store's word table (its words by name), or NULL */
    bool own_words;
    float *logits;                /* [V] scratch for predict */
    nc_dyneval *dyn;              /* dynamic evaluation's adapted weights, or NULL (the trained
                                   * ones: dyn_lr 0 and nothing left to decay) */
    stream_memo memo;
    double *gate_f, *gate_pc;     /* stream_gate_sink's arrays (fit-gate), or NULL */
    int64_t gate_pos0;            /* the position their row 0 is of */
};

void stream_memo_disable(bool off)
{
    atomic_store(&memo_off, off);
}

uint64_t stream_memo_reads(void)
{
    return atomic_load(&memo_reads);
}

static bool memo_on(void)
{
    return !atomic_load_explicit(&memo_off, memory_order_relaxed);
}

static void memo_clear(nc_stream *s)
{
    s->memo.logits = false;
    s->memo.rows = false;
}


/* The weights the stream predicts with: the adapted ones while dynamic
 * evaluation holds any, else the model's. */
static const nc_model *wm(const nc_stream *s)
{
    return s->dyn ? dyneval_model(s->dyn) : s->m;
}

const nc_model *stream_model(const nc_stream *s)
{
    return wm(s);
}

/* Dynamic evaluation on for p: a fresh adaptation from the trained weights,
 * its first segment starting at the stream's current state. */
static int dyn_start(nc_stream *s, const nc_cache_params *p, char *err, size_t errlen)
{
    dyneval_free(s->dyn);
    s->dyn = NULL;
    if (p->dyn_lr <= 0.0f)
        return NC_OK;
    const nc_dyn_segment start = {.s0 = s->st, .has_h = s->has_h};
    return dyneval_new(s->m, p->dyn_params, &start, &s->dyn, err, errlen);
}

/* What the rows' session states are made for: the stream's model and
 * store, p. */
static nc_state_args state_args(const nc_stream *s, const nc_cache_params *p)
{
    return (nc_state_args){.p = p, .H = s->m->cfg.hidden_size, .store = s->ub, .unk_id = s->m->unk_id,
                           .strict = true};
}

/* The rows' session states, empty, for the stream's settings. */
static int rows_new(nc_stream *s, char *err, size_t errlen)
{
    const nc_state_args a = state_args(s, &s->p);
    int rc = NC_OK;
    for (int c = 0; !rc && c < NC_NCOMP; c++)
        if (nc_component_rows[c]->state_new)
            rc = nc_component_rows[c]->state_new(&a, &s->rows[c], err, errlen);
    return rc;
}

static void rows_free(void *rows[NC_NCOMP])
{
    for (int c = 0; c < NC_NCOMP; c++)
        if (rows[c])
            nc_component_rows[c]->state_free(rows[c]);
}

static int start(nc_stream *s, bool bos, char *err, size_t errlen)
{
    lstm_state_reset(s->st);
    s->has_h = false;
    s->pos = 0;
    if (bos) {
        lstm_step(s->m, s->st, s->m->eos_id, s->work);
        s->has_h = true;
    }
    return dyn_start(s, &s->p, err, errlen);
}

int stream_new(const nc_model *m, const nc_cache_params *p, nc_unbounded_cache *ub, nc_wordtable *words,
               bool bos, nc_stream **out, char *err, size_t errlen)
{
    NC_ASSERT(p, "stream_new: no p");
    *out = NULL;
    int rc = cache_params_validate(p, err, errlen);
    if (rc)
        return rc;
    if (p->gate && !m->gate)
        return nc_error(err, errlen, NC_EINVAL, "gate: the model has no gate (gate.safetensors; fit one with "
                                                "neurocache fit-gate)");
    nc_stream *s = nc_zalloc(1, sizeof *s);
    if (!s)
        return nc_error(err, errlen, NC_ENOMEM, "stream");
    s->m = m;
    s->p = *p;
    s->ub = ub;
    s->store_words = ub ? unbounded_cache_words(ub) : NULL;
    s->st = lstm_state_new(m);
    s->work = lstm_work_new(m);
    s->logits = nc_alloc((size_t)m->cfg.vocab_size * sizeof(float));
    if (!s->st || !s->work || !s->logits)
        rc = nc_error(err, errlen, NC_ENOMEM, "stream state");
    if (!rc && p->open_vocab) {
        s->words = words ? words : s->store_words;
        if (!s->words) {
            rc = wordtable_new(m->vocab, &s->words, err, errlen);
            s->own_words = rc == NC_OK;
        }
    }
    if (!rc)
        rc = rows_new(s, err, errlen);
    if (!rc)
        rc = start(s, bos, err, errlen);
    if (rc) {
        stream_free(s);
        return rc;
    }
    *out = s;
    return NC_OK;
}

void stream_free(nc_stream *s)
{
    if (!s)
        return;
    lstm_state_free(s->st);
    lstm_work_free(s->work);
    rows_free(s->rows);
    if (s->own_words)
        wordtable_free(s->words);
    nc_free(s->logits);
    dyneval_free(s->dyn);
    free(s);
}

void stream_reset(nc_stream *s, bool bos)
{
    NC_ASSERT(s, "stream_reset: no s");
    memo_clear(s);
    for (int c = 0; c < NC_NCOMP; c++)
        if (s->rows[c])
            nc_component_rows[c]->state_clear(s->rows[c]);
    /* dyn_start cannot fail for parameters it accepted at creation but
     * for memory: the stream then continues with the trained weights */
    if (start(s, bos, NULL, 0) != NC_OK)
        s->dyn = NULL;
}

const nc_cache_params *stream_params(const nc_stream *s)
{
    NC_ASSERT(s, "stream_params: no s");
    return &s->p;
}

/* The settings p that this stream cannot take, beyond
 * cache_params_validate's: 0 or the error. */
static int check_new_params(const nc_stream *s, const nc_cache_params *p, char *err, size_t errlen)
{
    int rc = cache_params_validate(p, err, errlen);
    if (rc)
        return rc;
    /* The windows hold the words as the stream's mode named them (an OOV
     * word by its own id, or as unk): switching would leave the other
     * mode's ids in them, so the mode is fixed at creation. */
    if (p->open_vocab != s->p.open_vocab)
        return nc_error(err, errlen, NC_ESTATE, "open_vocab is fixed when the stream is created (its caches "
                        "hold words in that mode): create a new stream to change it");
    if (p->gate && !s->m->gate)
        return nc_error(err, errlen, NC_EINVAL, "gate: the model has no gate (gate.safetensors; fit one with "
                                                "neurocache fit-gate)");
    return NC_OK;
}

/* Dynamic evaluation under p: turned on, a fresh adaptation from here
 * (*dyn_new); a new subset only while the weights are the trained ones
 * (the adapted ones of the old subset would be lost), *replace then set;
 * off, the adapted weights stay and decay at each segment until they are
 * the trained ones. */
static int dyn_for_params(const nc_stream *s, const nc_cache_params *p, nc_dyneval **dyn_new, bool *replace,
                          char *err, size_t errlen)
{
    *dyn_new = NULL;
    *replace = false;
    if (s->dyn && p->dyn_params != dyneval_subset(s->dyn)) {
        if (!dyneval_at_rest(s->dyn))
            return nc_error(err, errlen, NC_ESTATE, "dyn_params cannot change while the session's weights are "
                            "adapted (set dyn_lr 0 and let them decay, or reset the session)");
        *replace = true;
    }
    const nc_dyn_segment start = {.s0 = s->st, .has_h = s->has_h};
    if ((*replace || !s->dyn) && p->dyn_lr > 0.0f)
        return dyneval_new(s->m, p->dyn_params, &start, dyn_new, err, errlen);
    return NC_OK;
}

/* The rows' states for p (rows[c]), each holding the newest pairs of the
 * stream's; on error nothing is left allocated. */
static int rows_resize(const nc_stream *s, const nc_cache_params *p, void *rows[NC_NCOMP], char *err,
                       size_t errlen)
{
    const nc_state_args a = state_args(s, p);
    int rc = NC_OK;
    for (int c = 0; c < NC_NCOMP; c++)
        rows[c] = NULL;
    for (int c = 0; !rc && c < NC_NCOMP; c++)
        if (s->rows[c])
            rc = nc_component_rows[c]->state_resize(s->rows[c], &a, &rows[c], err, errlen);
    if (rc)
        rows_free(rows);
    return rc;
}

/* All that can fail (the new windows, a new adaptation) is built before
 * the stream changes, so that on error it is as it was. */
int stream_set_params(nc_stream *s, const nc_cache_params *p, char *err, size_t errlen)
{
    NC_ASSERT(p, "stream_set_params: no p");
    NC_ASSERT(s, "stream_set_params: no s");
    nc_dyneval *dyn_new = NULL;
    bool dyn_replace = false;
    int rc = check_new_params(s, p, err, errlen);
    if (!rc)
        rc = dyn_for_params(s, p, &dyn_new, &dyn_replace, err, errlen);
    if (rc)
        return rc;
    /* rebuild windows keeping the newest pairs */
    void *rows[NC_NCOMP];
    if ((rc = rows_resize(s, p, rows, err, errlen))) {
        dyneval_free(dyn_new);
        return rc;
    }
    rows_free(s->rows);
    memcpy(s->rows, rows, sizeof rows);
    memo_clear(s);
    s->p = *p;
    if (dyn_new || dyn_replace) {
        dyneval_free(s->dyn);
        s->dyn = dyn_new;
    } else if (s->dyn && p->dyn_lr <= 0.0f && dyneval_at_rest(s->dyn)) {
        dyneval_free(s->dyn);
        s->dyn = NULL;
    }
    return NC_OK;
}

/* stream_feed with one set of weights (wm(s)). */
static int feed_part(nc_stream *s, const nc_tokens *toks, bool adapt, double *logprobs, float **logits, char *err,
                     size_t errlen)
{
    if (toks->n == 0)
        return NC_OK;
    nc_doc *d = NULL;
    /* on failure the LSTM state must not have moved: work on a copy */
    nc_state *st = lstm_state_new(s->m);
    if (!st)
        return nc_error(err, errlen, NC_ENOMEM, "stream state");
    lstm_state_copy(st, s->st);
    nc_wordtable *words = s->p.open_vocab ? s->words : NULL, *mem = adapt ? s->store_words : NULL;
    /* the memo of the predict at this h (doc_prepare: used where it is
     * the same to the bit); the gate sink needs p_vocab's statistics, which
     * only the pass without kept logits computes for a model without a gate
     * (the step then runs its own decoder pass) */
    const bool memo = s->memo.logits && memo_on() && s->has_h && !logits;
    nc_doc_prep in = {.m = wm(s), .s = st, .has_h = s->has_h, .toks = toks, .words = words, .mem_words = mem,
                      .keep = logits != NULL && !s->gate_f, .vocab_stats = s->gate_f != NULL,
                      .logits0 = memo ? s->logits : NULL};
    int rc = doc_prepare(&in, &d, err, errlen);
    if (memo && toks->n <= LSTM_LOGITS_ROWS_MAX)
        atomic_fetch_add_explicit(&memo_reads, 1, memory_order_relaxed);
    double *lp = logprobs;
    if (!rc && !lp) {
        lp = nc_malloc(toks->n * sizeof(double));
        if (!lp)
            rc = nc_error(err, errlen, NC_ENOMEM, "log-probabilities");
    }
    if (!rc) {
        const size_t row = (size_t)(s->pos - s->gate_pos0);
        nc_doc_caches c = {.states = s->rows, .ub = s->ub, .adapt = adapt,
                           .gate_f = s->gate_f ? s->gate_f + row * NC_GATE_NFEAT : NULL,
                           .gate_pc = s->gate_f ? s->gate_pc + row * NC_NCOMP : NULL};
        if (s->memo.rows && memo_on() && s->has_h) {
            /* what the rows made at h (a window's dots, a searched row's
             * coarse search and neighbours): row 0's */
            c.at_h0 = true;
            atomic_fetch_add_explicit(&memo_reads, 1, memory_order_relaxed);
        }
        rc = doc_score(d, &s->p, &c, lp, err, errlen);
    }
    if (lp != logprobs)
        free(lp);
    memo_clear(s);   /* read: h moves now (dynamic evaluation feeds in parts) */
    if (!rc) {
        lstm_state_copy(s->st, st);
        s->has_h = true;
        s->pos += (int64_t)toks->n;
        if (logits) {
            *logits = d->logits;   /* handed over */
            d->logits = NULL;
        }
    }
    lstm_state_free(st);
    doc_free(d);
    return rc;
}

static int feed_parts(nc_stream *s, const nc_tokens *toks, bool adapt, double *logprobs, char *err,
                      size_t errlen);

int stream_feed(nc_stream *s, const nc_tokens *toks, bool adapt, double *logprobs, char *err,
                size_t errlen)
{
    NC_ASSERT(toks, "stream_feed: no toks");
    NC_ASSERT(s, "stream_feed: no s");
    int rc = s->dyn ? feed_parts(s, toks, adapt, logprobs, err, errlen)
                    : feed_part(s, toks, adapt, logprobs, NULL, err, errlen);
    /* h (and with dynamic evaluation the weights) moved: on failure too,
     * which may have fed part of the tokens */
    if (toks->n > 0)
        memo_clear(s);
    return rc;
}

/* stream_feed with dynamic evaluation's adapted weights (s->dyn).
 * With dynamic evaluation the tokens go in parts that end where a segment
 * ends, each scored with the weights of its segment; the step follows the
 * segment's last token (causal: a token's probability comes from weights
 * stepped on tokens before it only). The parts end at the same positions
 * however the tokens are split across calls. */
static int feed_parts(nc_stream *s, const nc_tokens *toks, bool adapt, double *logprobs, char *err,
                      size_t errlen)
{
    const int V = s->m->cfg.vocab_size;
    for (size_t j = 0; j < toks->n; j++)
        if (toks->ids[j] < 0 || toks->ids[j] >= V)
            return nc_error(err, errlen, NC_EINVAL, "token %zu has id %d outside [0, %d)", j, toks->ids[j], V);
    int rc = NC_OK;
    for (size_t j0 = 0; !rc && s->dyn && j0 < toks->n;) {
        size_t room = (size_t)(s->p.dyn_segment - dyneval_pending(s->dyn));
        if (s->p.dyn_segment <= dyneval_pending(s->dyn))
            room = 1;
        size_t k = toks->n - j0 < room ? toks->n - j0 : room;
        nc_tokens part = {.ids = toks->ids + j0, .words = toks->words ? toks->words + j0 : NULL,
                          .offsets = toks->offsets ? toks->offsets + j0 : NULL, .n = k};
        bool whole = dyneval_pending(s->dyn) == 0 && (int)k == s->p.dyn_segment && s->p.dyn_lr > 0.0f;
        float *logits = NULL;
        rc = feed_part(s, &part, adapt, logprobs ? logprobs + j0 : NULL, whole ? &logits : NULL, err, errlen);
        const nc_dyn_fed fed = {.ids = part.ids, .k = k, .logits = logits, .st = s->st, .has_h = s->has_h};
        const nc_dyn_rule rule = {.segment = s->p.dyn_segment, .lr = s->p.dyn_lr, .decay = s->p.dyn_decay};
        if (!rc)
            rc = dyneval_push(s->dyn, &fed, &rule, err, errlen);
        nc_free(logits);
        j0 += k;
        if (!rc && s->p.dyn_lr <= 0.0f && dyneval_pending(s->dyn) == 0 && dyneval_at_rest(s->dyn)) {
            /* decayed back to the trained weights: the model's again */
            dyneval_free(s->dyn);
            s->dyn = NULL;
            if (j0 < toks->n) {
                nc_tokens rest = {.ids = toks->ids + j0, .words = toks->words ? toks->words + j0 : NULL,
                                  .offsets = toks->offsets ? toks->offsets + j0 : NULL, .n = toks->n - j0};
                rc = feed_part(s, &rest, adapt, logprobs ? logprobs + j0 : NULL, NULL, err, errlen);
            }
        }
    }
    return rc;
}

void stream_gate_sink(nc_stream *s, double *f, double *pc)
{
    NC_ASSERT(s, "stream_gate_sink: no s");
    s->gate_f = f && pc ? f : NULL;
    s->gate_pc = f && pc ? pc : NULL;
    s->gate_pos0 = s->pos;
}

int stream_word_id(nc_stream *s, const char *word, size_t len)
{
    if (!s->p.open_vocab || !s->words)
        return -1;
    int id = wordtable_id(s->words, word, len, false);
    return id >= 0 ? id : -1;
}

/* The decoder's logits at h (has_h) in s->logits: the memo's, or made
 * now and kept in it. */
static const float *logits_at_h(nc_stream *s)
{
    if (!s->memo.logits || !memo_on()) {
        lstm_logits(wm(s), lstm_state_top(s->st), s->logits);
        s->memo.logits = memo_on();
    } else {
        atomic_fetch_add_explicit(&memo_reads, 1, memory_order_relaxed);
    }
    return s->logits;
}

int stream_predict(nc_stream *s, bool shares, nc_dist *out, char *err, size_t errlen)
{
    if (!s->has_h)
        return nc_error(err, errlen, NC_ESTATE, "nothing to predict from yet (no token fed)");
    return stream_predict_logits(s, logits_at_h(s), shares, out, err, errlen);
}

const float *stream_memo_logits(const nc_stream *s)
{
    NC_ASSERT(s, "stream_memo_logits: no s");
    return s->has_h && s->memo.logits && memo_on() ? s->logits : NULL;
}

void stream_keep_logits(nc_stream *s, const float *logits)
{
    if (!s->has_h || !memo_on() || logits == s->logits)
        return;
    memcpy(s->logits, logits, (size_t)s->m->cfg.vocab_size * sizeof(float));
    s->memo.logits = true;
}

const float *stream_h(const nc_stream *s)
{
    NC_ASSERT(s, "stream_h: no s");
    return s->has_h ? lstm_state_top(s->st) : NULL;
}

/* The rows' inputs at the stream's h (component.h at_h): in->state and
 * each row's own fields; scratch[c] for the caller to free
 * (rows_scratch_free). What the rows keep of it is the memo until h or a
 * state moves (a repeated predict reads it again: the same bits). */
static int rows_at_h(nc_stream *s, const float *h, nc_mix_input *in, void *scratch[NC_NCOMP], char *err,
                     size_t errlen)
{
    int rc = NC_OK;
    const bool memo = s->memo.rows && memo_on();
    for (int c = 0; c < NC_NCOMP; c++)
        scratch[c] = NULL;
    for (int c = 0; !rc && c < NC_NCOMP; c++) {
        const nc_at_h a = {.p = &s->p, .h = h, .in = in, .scratch = &scratch[c], .memo = memo};
        in->state[c] = s->rows[c];
        if (s->rows[c] && nc_component_rows[c]->at_h)
            rc = nc_component_rows[c]->at_h(s->rows[c], &a, err, errlen);
    }
    if (memo)
        atomic_fetch_add_explicit(&memo_reads, 1, memory_order_relaxed);
    return rc;
}

/* The searched rows' searches at the stream's h (component.h search_h), after rows_at_h
 * with the memo it read: for predict each asks the gate first whether to
 * skip it (in->gate set: adaptive retrieval, gate.h); explain searches
 * where the gate would skip (explain says where the mass would come from)
 * and keeps what the rows' explain reads. Then what the rows made at h is
 * the memo. */
static int rows_search(nc_stream *s, nc_mix_input *in, void *scratch[NC_NCOMP], bool explain, char *err,
                       size_t errlen)
{
    const float *h = lstm_state_top(s->st);
    const bool memo = s->memo.rows && memo_on();
    uint64_t reads = 0;
    int rc = NC_OK;
    for (int c = 0; !rc && c < NC_NCOMP; c++) {
        const nc_component *r = nc_component_rows[c];
        if (!r->searched || !s->rows[c])
            continue;
        bool skip = false;
        if (!explain && in->gate && r->on(&s->p) && r->can_search(s->rows[c])) {
            skip = gate_skip_search(in->gate, &s->p, in, c);
            if (gate_threshold(in->gate, &s->p) > 0.0)
                gate_count_searches(!skip, skip);
        }
        const nc_at_h a = {.p = &s->p, .h = h, .in = in, .scratch = &scratch[c], .memo = memo, .keep = memo_on(),
                           .memo_reads = &reads, .skip = skip, .explain = explain};
        rc = r->search_h(s->rows[c], &a, err, errlen);
    }
    if (reads)
        atomic_fetch_add_explicit(&memo_reads, reads, memory_order_relaxed);
    s->memo.rows = !rc && memo_on();
    return rc;
}

static void rows_scratch_free(void *scratch[NC_NCOMP])
{
    for (int c = 0; c < NC_NCOMP; c++)
        free(scratch[c]);
}

int stream_predict_logits(nc_stream *s, const float *logits, bool shares, nc_dist *out, char *err,
                          size_t errlen)
{
    if (!s->has_h)
        return nc_error(err, errlen, NC_ESTATE, "nothing to predict from yet (no token fed)");
    const int V = s->m->cfg.vocab_size;
    const float *h = lstm_state_top(s->st);
    nc_mix_input in = {.V = V, .logits = logits, .vocab_full = V};
    size_t n_words = (size_t)V;
    if (s->p.open_vocab && s->words) {
        n_words = (size_t)wordtable_size(s->words);
        in.vocab_full = s->p.vocab_size_full > 0 ? s->p.vocab_size_full : (int)n_words;
    }
    void *scratch[NC_NCOMP];
    int rc = rows_at_h(s, h, &in, scratch, err, errlen);
    if (!rc && s->p.gate && s->m->gate) {
        /* the adaptive mixture: p_vocab's statistics, from which (and the
         * rows' pre-search fields) the pre-search gate decides whether a
         * searched row searches (gate.h) */
        float *vs = nc_malloc((size_t)V * sizeof(float));
        if (!vs)
            rc = nc_error(err, errlen, NC_ENOMEM, "gate features");
        else
            gate_vocab_stats(logits, V, vs, &in.v_ent, &in.v_logmax, &in.v_argmax);
        free(vs);
        in.gate = s->m->gate;
    }
    if (!rc)
        rc = rows_search(s, &in, scratch, false, err, errlen);
    if (!rc)
        rc = mixture_full(&s->p, &in, n_words, shares, out, err, errlen);
    rows_scratch_free(scratch);
    return rc;
}

/* The rows' explain in the table's order (component.h), reading the mixture
 * input predict builds at h. */
int stream_explain(nc_stream *s, const int *ids, size_t k, int per_source, nc_explain_entry *out, int *counts,
                   char *err, size_t errlen)
{
    for (size_t q = 0; q < k; q++)
        counts[q] = 0;
    if (!s->has_h)
        return nc_error(err, errlen, NC_ESTATE, "nothing to predict from yet (no token fed)");
    const float *h = lstm_state_top(s->st);
    nc_mix_input in = {.V = s->m->cfg.vocab_size};
    void *scratch[NC_NCOMP];
    int rc = rows_at_h(s, h, &in, scratch, err, errlen);
    if (!rc && components_joint(&s->p, &in)) {
        /* a row in the first row's softmax (eq. 4): its normaliser holds
         * the vocabulary's exponentials */
        in.logits = logits_at_h(s);
    }
    if (!rc)
        rc = rows_search(s, &in, scratch, true, err, errlen);
    nc_explain_ctx x = {.p = &s->p, .in = &in, .pos = s->pos, .ids = ids, .k = k,
                        .per_source = per_source, .stride = (size_t)NC_EXPLAIN_ROWS * (size_t)per_source};
    for (x.comp = 0; !rc && x.comp < NC_NCOMP; x.comp++) {
        x.scratch = scratch[x.comp];
        if (nc_component_rows[x.comp]->explain)
            rc = nc_component_rows[x.comp]->explain(&x, out, counts, err, errlen);
    }
    rows_scratch_free(scratch);
    return rc;
}

int stream_ub_reader(const nc_stream *s)
{
    NC_ASSERT(s, "stream_ub_reader: no s");
    return s->p.open_vocab ? NC_UB_OPEN : s->m->unk_id;
}

const char *stream_word(nc_stream *s, int id)
{
    NC_ASSERT(s, "stream_word: no s");
    if (s->words)
        return wordtable_word(s->words, id);
    return vocab_word(s->m->vocab, id);
}

int64_t stream_position(const nc_stream *s) { return s->pos; }
bool stream_has_h(const nc_stream *s) { return s->has_h; }
nc_unbounded_cache *stream_unbounded_cache(const nc_stream *s) { return s->ub; }

size_t stream_memory(const nc_stream *s)
{
    NC_ASSERT(s, "stream_memory: no s");
    size_t m = sizeof *s + 2 * lstm_state_blob_size(s->st) + (size_t)s->m->cfg.vocab_size * sizeof(float);
    for (int c = 0; c < NC_NCOMP; c++)
        if (s->rows[c])
            m += nc_component_rows[c]->memory(s->rows[c]);
    if (s->own_words)
        m += wordtable_memory(s->words);
    if (s->dyn)
        m += dyneval_memory(s->dyn);
    /* the memo: its logits are s->logits, above; the rows' own in their memory */
    return m;
}

int stream_clone(const nc_stream *s, nc_stream **out, char *err, size_t errlen)
{
    NC_ASSERT(s, "stream_clone: no s");
    *out = NULL;
    void *blob = NULL;
    size_t len = 0;
    int rc = stream_export(s, &blob, &len, err, errlen);
    if (!rc)
        rc = stream_import(s->m, s->ub, s->own_words ? NULL : s->words, blob, len, out, err, errlen);
    free(blob);
    return rc;
}

/* ---- serialisation ----
 * "NCSTRM04", u32 V, H, L, the settings (u32 count, then per knob: u32 name
 * length, name, its value in 4 bytes: i32 for INT/BOOL/KERNEL, f32 for
 * FLOAT; every row of the knob table, so each component's settings are in
 * the blob as its knobs), u8 has_h, i64 pos, u64 state length + lstm_state
 * blob, u32 number of dynamic words + (u32 len, bytes) each, the rows'
 * sections in the table's order (component.h export_state; each row's
 * file says its section's layout), u8 has dynamic evaluation + its section, u32 crc32 of everything
 * before (binio.h). A ref < V is a model id; V + i is the i-th dynamic word
 * of the blob. Versions 1-3 wrote the settings as the fixed list below
 * without names (still read); a knob by name reads whatever order or set of
 * knobs a build has (one missing takes its default). */

/* The knobs of versions 1-3 in their order: 1 the first 17, 2 also the
 * gate's two, 3 also dynamic evaluation's four. */
static const char *const old_knobs[] = {
    "unigram_size", "unigram_lambda", "neural_size", "neural_theta", "neural_lambda", "global_norm", "neural_alpha",
    "neural_f16", "unbounded", "knn", "nprobe", "unbounded_lambda", "kernel", "exact", "open_vocab", "uniform_mu",
    "vocab_size_full", "gate", "gate_skip", "dyn_lr", "dyn_decay", "dyn_segment", "dyn_params"};
static const int old_knob_count[4] = {0, 17, 19, 23};

static bool knob_is_float(const nc_cache_knob *k)
{
    return k->type == NC_KNOB_FLOAT || k->type == NC_KNOB_FLOAT_BELOW_MAX;
}

static void put_params(binio_writer *w, const nc_cache_params *p)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    binio_put_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        binio_put_u32(w, (uint32_t)strlen(k[i].name));
        binio_put(w, k[i].name, strlen(k[i].name));
        if (knob_is_float(&k[i]))
            binio_put_f32(w, (float)cache_knob_get(p, &k[i]));
        else
            binio_put_i32(w, (int32_t)cache_knob_get(p, &k[i]));
    }
}

/* One knob's 4-byte value into p, checked as user input is. */
static int get_knob(binio_reader *r, nc_cache_params *p, const nc_cache_knob *k, char *err, size_t errlen)
{
    double v = knob_is_float(k) ? (double)binio_get_f32(r) : (double)binio_get_i32(r);
    if (k->type == NC_KNOB_BOOL)
        v = v != 0;
    if (r->bad)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob truncated (settings)");
    return cache_knob_set_number(p, k, v, err, errlen) ? NC_EFORMAT : NC_OK;
}

static int get_params(binio_reader *r, nc_cache_params *p, int version, char *err, size_t errlen)
{
    cache_params_default(p);
    int rc = NC_OK;
    if (version < 4) {
        for (int i = 0; !rc && i < old_knob_count[version]; i++)
            rc = get_knob(r, p, cache_knob_find(old_knobs[i]), err, errlen);
        return rc;
    }
    uint32_t n = binio_get_u32(r);
    for (uint32_t i = 0; !rc && !r->bad && i < n; i++) {
        uint32_t l = binio_get_u32(r);
        const char *name = l < 64 ? binio_take(r, l) : NULL;
        char buf[64];
        if (!name)
            return nc_error(err, errlen, NC_EFORMAT, "stream blob: bad knob name %u", i);
        memcpy(buf, name, l);
        buf[l] = 0;
        const nc_cache_knob *k = cache_knob_find(buf);
        if (!k)
            return nc_error(err, errlen, NC_EFORMAT, "stream blob: knob '%s' is unknown to this build", buf);
        rc = get_knob(r, p, k, err, errlen);
    }
    return r->bad && !rc ? nc_error(err, errlen, NC_EFORMAT, "stream blob truncated (settings)") : rc;
}

/* The blob's head: magic, shape, knobs, has_h, position and the LSTM
 * state (a failed allocation marks the writer bad). */
static void put_head(binio_writer *w, const nc_stream *s)
{
    char magic[9];
    snprintf(magic, sizeof magic, "NCSTRM%02d", STREAM_BLOB_VERSION);
    binio_put(w, magic, 8);
    binio_put_u32(w, (uint32_t)s->m->cfg.vocab_size);
    binio_put_u32(w, (uint32_t)s->m->cfg.hidden_size);
    binio_put_u32(w, (uint32_t)s->m->cfg.num_layers);
    put_params(w, &s->p);
    unsigned char hh = s->has_h;
    binio_put(w, &hh, 1);
    binio_put(w, &s->pos, 8);
    uint64_t sl = lstm_state_blob_size(s->st);
    binio_put(w, &sl, 8);
    void *tmp = nc_malloc(sl);
    if (tmp) {
        lstm_state_to_blob(s->st, tmp);
        binio_put(w, tmp, sl);
        free(tmp);
    } else {
        w->bad = true;
    }
}

/* The rows' sections (component.h export_state) into sec, in the table's
 * order, listing the words they name in x. */
static int put_rows(const nc_stream *s, nc_buf *sec, nc_blob_words *x, char *err, size_t errlen)
{
    void *const *st = s->rows;
    binio_writer w;
    binio_writer_buf(&w, sec);
    int rc = NC_OK;
    for (int c = 0; !rc && c < NC_NCOMP; c++) {
        const nc_component *r = nc_component_rows[c];
        if (!r->export_state)
            continue;
        NC_ASSERT(st[c], "component %s: session state the stream does not keep", r->name);
        rc = r->export_state(st[c], &w, x);
    }
    return rc || w.bad ? nc_error(err, errlen, NC_ENOMEM, "stream export") : NC_OK;
}

/* The dynamic words the rows' sections name. */
static void put_words(binio_writer *w, const nc_stream *s, const nc_blob_words *x)
{
    binio_put_u32(w, (uint32_t)x->n);
    for (int i = 0; i < x->n; i++) {
        const char *word = s->words ? wordtable_word(s->words, x->ids[i]) : NULL;
        if (!word)
            word = "<unk>";
        binio_put_u32(w, (uint32_t)strlen(word));
        binio_put(w, word, strlen(word));
    }
}

int stream_export(const nc_stream *s, void **blob, size_t *len, char *err, size_t errlen)
{
    NC_ASSERT(s, "stream_export: no s");
    *blob = NULL;
    *len = 0;
    /* the rows' sections first (the word list they name precedes them) */
    nc_blob_words x = {.V = s->m->cfg.vocab_size};
    nc_buf sec = NC_BUF_INIT, out = NC_BUF_INIT;
    int rc = put_rows(s, &sec, &x, err, errlen);
    binio_writer w;
    binio_writer_buf(&w, &out);
    if (!rc) {
        put_head(&w, s);
        put_words(&w, s, &x);
        binio_put(&w, sec.data, sec.len);
        /* dynamic evaluation's own section: its adapted weights and segment */
        unsigned char hd = s->dyn != NULL;
        binio_put(&w, &hd, 1);
        if (s->dyn)
            dyneval_write(s->dyn, &w);
        if (binio_seal(&w) != NC_OK)
            rc = nc_error(err, errlen, NC_ENOMEM, "stream export");
    }
    free(x.ids);
    buf_free(&sec);
    if (rc) {
        buf_free(&out);
        return rc;
    }
    *blob = buf_detach(&out, len);
    return NC_OK;
}

/* Magic, checksum and the model's shape: the reader r positioned after
 * them (the version is the magic's last digit), or the error. */
static int open_blob(const nc_model *m, const void *blob, size_t len, binio_reader *r, char *err, size_t errlen)
{
    /* NCSTRM01: without the gate's two knobs (read as their defaults); 02
     * without dynamic evaluation's knobs and section; 03: settings
     * without names */
    if (len < 12 || memcmp(blob, "NCSTRM", 6) != 0 || !isdigit(((const unsigned char *)blob)[6]) ||
        !isdigit(((const unsigned char *)blob)[7]) || memcmp(blob, "NCSTRM00", 8) == 0)
        return nc_error(err, errlen, NC_EFORMAT, "not a neurocache stream blob");
    int version = (((const char *)blob)[6] - '0') * 10 + (((const char *)blob)[7] - '0');
    if (version > STREAM_BLOB_VERSION)   /* never read as one of ours (docs/operations.md) */
        return nc_error(err, errlen, NC_EFORMAT, "stream blob format version %d is newer than this build reads "
                        "(versions 1 to %d): written by a later neurocache; import it there", version,
                        STREAM_BLOB_VERSION);
    if (!binio_open(r, blob, len, 8))
        return nc_error(err, errlen, NC_EFORMAT, "stream blob checksum mismatch");
    uint32_t bV = binio_get_u32(r), bH = binio_get_u32(r), bL = binio_get_u32(r);
    if (r->bad || bV != (uint32_t)m->cfg.vocab_size || bH != (uint32_t)m->cfg.hidden_size ||
        bL != (uint32_t)m->cfg.num_layers)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob is for a model V=%u H=%u L=%u, this one "
                        "has V=%d H=%d L=%d", bV, bH, bL, m->cfg.vocab_size, m->cfg.hidden_size, m->cfg.num_layers);
    return NC_OK;
}

/* The dynamic words into the stream's word table (x->ids). */
static int import_words(nc_stream *s, binio_reader *r, nc_blob_words *x, char *err, size_t errlen)
{
    uint32_t nw = binio_get_u32(r);
    if (r->bad || nw == 0)
        return NC_OK;
    if (nw > binio_left(r) / 4 || !s->words)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob: %u dynamic words %s", nw,
                        s->words ? "(truncated)" : "without open vocabulary");
    if (!(x->ids = nc_malloc(nw * sizeof(int))))
        return nc_error(err, errlen, NC_ENOMEM, "stream import");
    for (uint32_t i = 0; i < nw; i++) {
        uint32_t l = binio_get_u32(r);
        const char *word = l ? binio_take(r, l) : NULL;
        if (!word)
            return nc_error(err, errlen, NC_EFORMAT, "stream blob: bad word %u", i);
        x->ids[x->n] = wordtable_id(s->words, word, l, true);
        if (x->ids[x->n++] < 0)
            return nc_error(err, errlen, NC_ENOMEM, "word table");
    }
    return NC_OK;
}

/* The rows' sections (component.h import_state), in the table's order:
 * the same in every version of the blob. */
static int import_rows(nc_stream *s, binio_reader *r, const nc_blob_words *x, char *err, size_t errlen)
{
    void *const *st = s->rows;
    int rc = NC_OK;
    for (int c = 0; !rc && c < NC_NCOMP; c++) {
        const nc_component *row = nc_component_rows[c];
        if (!row->import_state)
            continue;
        NC_ASSERT(st[c], "component %s: session state the stream does not keep", row->name);
        rc = row->import_state(st[c], r, x, err, errlen);
    }
    return rc;
}

/* Dynamic evaluation's section (version 3 on), replacing the fresh
 * adaptation stream_new started; then the blob must be done. */
static int import_tail(nc_stream *s, binio_reader *r, int version, char *err, size_t errlen)
{
    unsigned char hd = 0;
    if (version >= 3) {
        binio_get(r, &hd, 1);
        if (r->bad)
            return nc_error(err, errlen, NC_EFORMAT, "stream blob truncated");
    }
    dyneval_free(s->dyn);
    s->dyn = NULL;
    int rc = hd ? dyneval_read(s->m, r, &s->dyn, err, errlen) : NC_OK;
    if (!rc && hd && dyneval_subset(s->dyn) != s->p.dyn_params)
        rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: adapted subset %d, dyn_params %d",
                      dyneval_subset(s->dyn), s->p.dyn_params);
    if (!rc && !binio_done(r))
        rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: %s", r->bad ? "truncated" : "trailing bytes");
    return rc;
}

int stream_import(const nc_model *m, nc_unbounded_cache *ub, nc_wordtable *words, const void *blob,
                  size_t len, nc_stream **out, char *err, size_t errlen)
{
    NC_ASSERT(m, "stream_import: no m");
    *out = NULL;
    binio_reader r;
    nc_cache_params p;
    int rc = open_blob(m, blob, len, &r, err, errlen);
    int version = rc ? 0 : (((const char *)blob)[6] - '0') * 10 + (((const char *)blob)[7] - '0');
    if (!rc)
        rc = get_params(&r, &p, version, err, errlen);
    if (rc)
        return rc;
    unsigned char hh = 0;
    int64_t pos = 0;
    uint64_t sl = 0;
    binio_get(&r, &hh, 1);
    binio_get(&r, &pos, 8);
    binio_get(&r, &sl, 8);
    const void *state = binio_take(&r, sl);
    if (!state)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob truncated");
    if (cache_params_validate(&p, err, errlen))
        return NC_EFORMAT;   /* message from validate names the field */
    nc_stream *s;
    if ((rc = stream_new(m, &p, ub, words, false, &s, err, errlen)))
        return rc;
    rc = lstm_state_from_blob(s->st, state, (size_t)sl, err, errlen);
    s->has_h = hh != 0;
    s->pos = pos;
    nc_blob_words x = {.V = m->cfg.vocab_size};
    if (!rc)
        rc = import_words(s, &r, &x, err, errlen);
    if (!rc)
        rc = import_rows(s, &r, &x, err, errlen);
    if (!rc)
        rc = import_tail(s, &r, version, err, errlen);
    free(x.ids);
    if (rc) {
        stream_free(s);
        return rc;
    }
    *out = s;
    return NC_OK;
}

/* ---- N-best rescoring (stream_rescore) ---------------------------------- */

/* The rows' marks before a continuation (component.h mark): what its
 * ntok pushes overwrite, put back after it by rows_rollback. */
static int rows_mark(nc_stream *s, size_t ntok, void *marks[NC_NCOMP], char *err, size_t errlen)
{
    int rc = NC_OK;
    for (int c = 0; c < NC_NCOMP; c++)
        marks[c] = NULL;
    for (int c = 0; !rc && c < NC_NCOMP; c++)
        if (s->rows[c])
            rc = nc_component_rows[c]->mark(s->rows[c], ntok, &marks[c], err, errlen);
    return rc;
}

static void rows_rollback(nc_stream *s, void *marks[NC_NCOMP])
{
    for (int c = 0; c < NC_NCOMP; c++)
        if (s->rows[c])
            nc_component_rows[c]->rollback(s->rows[c], marks[c]);
}

/* A continuation's document (doc.h) from a copy of the stream's LSTM
 * state, decoder left for later (s_target, log_z unset). Ids as
 * doc_prepare gives them, except that a word new to the open-vocabulary
 * table is not added to it: it gets the id it would get (table size + its
 * rank among the continuation's new words), so |V_full| grows as a feed
 * would grow it, and the table is left alone. */
static int rescore_prepare(nc_stream *s, nc_state *st, const nc_tokens *t, nc_doc **out, char *err,
                           size_t errlen)
{
    const nc_model *m = wm(s);
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    nc_doc *d;
    int rc = doc_alloc(H, V, t->n, &d, err, errlen);
    if (rc)
        return rc;
    d->first = s->has_h ? 0 : (t->n > 0 ? 1 : 0);
    nc_wordtable *words = s->p.open_vocab ? s->words : NULL;
    int base = words ? wordtable_size(words) : V, nnew = 0;
    const char **fresh = words && t->n ? nc_malloc(t->n * sizeof *fresh) : NULL;
    if (words && t->n && !fresh)
        rc = nc_error(err, errlen, NC_ENOMEM, "rescoring");
    for (size_t j = 0; !rc && j < t->n; j++) {
        int id = t->ids[j];
        if (id < 0 || id >= V) {
            rc = nc_error(err, errlen, NC_EINVAL, "token %zu has id %d outside [0, %d)", j, id, V);
            break;
        }
        if (words) {
            d->vfull[j] = base + nnew;
            if (id == m->unk_id && t->words && t->words[j]) {
                int w = wordtable_id(words, t->words[j], strlen(t->words[j]), false);
                for (int k = 0; w < 0 && k < nnew; k++)
                    if (strcmp(fresh[k], t->words[j]) == 0)
                        w = base + k;
                if (w < 0) {
                    fresh[nnew] = t->words[j];
                    w = base + nnew++;
                }
                id = w;
            }
        }
        d->ids[j] = id;
    }
    free(fresh);
    if (!rc && t->n) {
        lstm_state_copy(st, s->st);
        memcpy(d->q, lstm_state_top(st), (size_t)H * sizeof(float));
        rc = lstm_forward_seq(m, st, t->ids, t->n, d->q + H, err, errlen);
    }
    if (rc) {
        doc_free(d);
        return rc;
    }
    *out = d;
    return NC_OK;
}

/* Rows of decoder products per GEMM (as doc_prepare's blocks). */
#define RESCORE_LOGIT_BLOCK 128

/* The decoder for nb gathered rows (row r: position owner[2r+1] of
 * continuation owner[2r]) in one GEMM: each position's normaliser and its
 * target's logit. */
static void rescore_logits(const nc_model *m, nc_doc **docs, const float *rows, const size_t *owner, size_t nb,
                           float *logits)
{
    const int V = m->cfg.vocab_size;
    lstm_logits_batch(m, rows, nb, logits);
    for (size_t r = 0; r < nb; r++) {
        nc_doc *d = docs[owner[2 * r]];
        size_t t = owner[2 * r + 1];
        const float *l = logits + r * (size_t)V;
        d->log_z[t] = nc_logsumexp(l, (size_t)V);
        d->s_target[t] = d->ids[t] < V ? l[d->ids[t]] : -INFINITY;
    }
}

int stream_rescore(nc_stream *s, const nc_tokens *conts, size_t n, double **logprobs, char *err,
                   size_t errlen)
{
    NC_ASSERT(s, "stream_rescore: no s");
    const nc_model *m = wm(s);
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    nc_doc **docs = nc_zalloc(n ? n : 1, sizeof *docs);
    nc_state *st = lstm_state_new(m);
    float *rows = nc_alloc((size_t)RESCORE_LOGIT_BLOCK * H * sizeof(float));
    float *logits = nc_alloc((size_t)RESCORE_LOGIT_BLOCK * V * sizeof(float));
    size_t *owner = nc_malloc(RESCORE_LOGIT_BLOCK * 2 * sizeof *owner);
    int rc = docs && st && rows && logits && owner ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "rescoring");
    for (size_t i = 0; !rc && i < n; i++)
        rc = rescore_prepare(s, st, &conts[i], &docs[i], err, errlen);
    /* The decoder for every scored position of every continuation, in
     * blocks of rows gathered across continuations. */
    size_t nb = 0;
    for (size_t i = 0; !rc && i < n; i++)
        for (size_t j = docs[i]->first; j < docs[i]->n; j++) {
            memcpy(rows + nb * H, docs[i]->q + j * H, (size_t)H * sizeof(float));
            owner[2 * nb] = i;
            owner[2 * nb + 1] = j;
            if (++nb == RESCORE_LOGIT_BLOCK) {
                rescore_logits(m, docs, rows, owner, nb, logits);
                nb = 0;
            }
        }
    if (!rc && nb > 0)
        rescore_logits(m, docs, rows, owner, nb, logits);
    /* The caches, continuation by continuation, each put back after it. */
    for (size_t i = 0; !rc && i < n; i++) {
        void *marks[NC_NCOMP];
        rc = rows_mark(s, docs[i]->n, marks, err, errlen);
        if (!rc) {
            nc_doc_caches c = {.states = s->rows, .ub = s->ub, .adapt = false};
            rc = doc_score(docs[i], &s->p, &c, logprobs[i], err, errlen);
        }
        rows_rollback(s, marks);
    }
    s->memo.rows = false;   /* the states are put back as they were; read afresh all the same */
    for (size_t i = 0; docs && i < n; i++)
        doc_free(docs[i]);
    free(docs);
    lstm_state_free(st);
    nc_free(rows);
    nc_free(logits);
    free(owner);
    return rc;
}
