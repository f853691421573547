/* doc.c -- batched, causal scoring of a token sequence with the caches. */
#include "doc.h"
#include "components.h"
#include "gate.h"
#include "mixture.h"
#include "vmath.h"
#include "fault.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DOC_LOGIT_BLOCK 128
#define DOC_SCORE_BLOCK 64

int doc_alloc(int dim, int V, size_t n, nc_doc **out, char *err, size_t errlen)
{
    *out = NULL;
    nc_doc *d = nc_zalloc(1, sizeof *d);
    if (!d)
        return nc_error(err, errlen, NC_ENOMEM, "document");
    d->dim = dim;
    d->V = V;
    d->n = n;
    d->unk_id = -1;
    /* one spare row: the batched LSTM writes h after every token, and the
     * last one is the state, not a query */
    d->q = nc_calloc(n + 1, (size_t)dim * sizeof(float));
    d->ids = nc_calloc(n + 1, sizeof(int));
    d->s_target = nc_calloc(n + 1, sizeof(float));
    d->log_z = nc_calloc(n + 1, sizeof(float));
    d->vfull = nc_calloc(n + 1, sizeof(int));
    if (!d->q || !d->ids || !d->s_target || !d->log_z || !d->vfull) {
        doc_free(d);
        return nc_error(err, errlen, NC_ENOMEM, "document of %zu tokens", n);
    }
    for (size_t j = 0; j < n; j++)
        d->vfull[j] = V;
    *out = d;
    return NC_OK;
}

void doc_free(nc_doc *d)
{
    if (!d)
        return;
    nc_free(d->q);
    nc_free(d->ids);
    nc_free(d->mem_ids);
    nc_free(d->s_target);
    nc_free(d->log_z);
    nc_free(d->vfull);
    nc_free(d->logits);
    free(d->v_ent);
    free(d->v_logmax);
    free(d->v_argmax);
    free(d);
}

/* The id of token j in table t: its own (possibly new, >= V) for an OOV
 * word, the model id otherwise; negative on allocation failure. */
static int table_id(const nc_model *m, nc_wordtable *t, const nc_tokens *toks, size_t j)
{
    int id = toks->ids[j];
    if (id == m->unk_id && toks->words && toks->words[j])
        return wordtable_id(t, toks->words[j], strlen(toks->words[j]), true);
    return id;
}

/* Rows of a logits block: DOC_LOGIT_BLOCK at most, of the rows there are
 * (from first to n). A generated token's feed of one needs 40 kB, not 5 MB:
 * over malloc's mmap threshold that was a mapping made and unmapped per
 * token. */
static size_t block_rows(size_t n, size_t first)
{
    size_t rows = n > first ? n - first : 1;
    return rows < DOC_LOGIT_BLOCK ? rows : DOC_LOGIT_BLOCK;
}

/* The pieces of prepare below read its arguments as doc_prepare settles
 * them: vocab_stats also when the model has a gate, logits0 only with
 * has_h. */
static int prepare(const nc_doc_prep *in, nc_doc **out, char *err, size_t errlen);

int doc_prepare(const nc_doc_prep *a, nc_doc **out, char *err, size_t errlen)
{
    NC_ASSERT(a, "doc_prepare: no a");
    nc_doc_prep in = *a;
    in.vocab_stats = a->vocab_stats || a->m->gate;
    in.logits0 = a->has_h ? a->logits0 : NULL;
    return prepare(&in, out, err, errlen);
}

/* d->ids (and d->mem_ids) from the tokens, growing the word tables with
 * the OOV words met, and d->vfull: |V_full| before each token (causal). */
static int doc_ids(const nc_doc_prep *in, nc_doc *d, char *err, size_t errlen)
{
    const nc_model *m = in->m;
    const nc_tokens *toks = in->toks;
    const int V = m->cfg.vocab_size;
    for (size_t j = 0; j < toks->n; j++) {
        int id = toks->ids[j];
        if (id < 0 || id >= V)
            return nc_error(err, errlen, NC_EINVAL, "token %zu has id %d outside [0, %d)", j, id, V);
        d->vfull[j] = V;
        if (in->words) {
            /* |V_full| as it was before token j (causal), then its own id */
            d->vfull[j] = wordtable_size(in->words);
            id = table_id(m, in->words, toks, j);
        }
        if (d->mem_ids && (d->mem_ids[j] = table_id(m, in->mem_words, toks, j)) < 0)
            id = -1;
        if (id < 0)
            return nc_error(err, errlen, NC_ENOMEM, "word table");
        d->ids[j] = id;
    }
    return NC_OK;
}

/* The LSTM over the tokens (d->q), then the decoder's logits block by
 * block, of which a document keeps log Z, the target's logit and, for the
 * gate, the vocabulary statistics (all rows' logits too if in->keep). */
static int doc_logits(const nc_doc_prep *in, nc_doc *d, char *err, size_t errlen)
{
    const nc_model *m = in->m;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const size_t n = in->toks->n;
    const bool keep = in->keep, vocab_stats = in->vocab_stats;
    memcpy(d->q, lstm_state_top(in->s), (size_t)H * sizeof(float));
    int rc = lstm_forward_seq(m, in->s, in->toks->ids, n, d->q + H, err, errlen);
    /* kept: all rows in d->logits, else one block at a time */
    if (!rc && keep && !(d->logits = nc_alloc(n * (size_t)V * sizeof(float))))
        rc = nc_error(err, errlen, NC_ENOMEM, "logits of %zu tokens", n);
    float *logits = rc || keep ? NULL : nc_alloc(block_rows(n, d->first) * (size_t)V * sizeof(float));
    float *scratch = rc || !vocab_stats ? NULL : nc_alloc((size_t)V * sizeof(float));
    if (!rc && ((!logits && !keep) || (vocab_stats && !scratch)))
        rc = nc_error(err, errlen, NC_ENOMEM, "logits block");
    for (size_t j0 = d->first; !rc && j0 < n; j0 += DOC_LOGIT_BLOCK) {
        size_t nb = n - j0 < DOC_LOGIT_BLOCK ? n - j0 : DOC_LOGIT_BLOCK;
        float *lb = keep ? d->logits + j0 * (size_t)V : logits;
        if (keep)   /* a segment of dynamic evaluation: a few rows, decoder read in place */
            lstm_logits_rows(m, d->q + j0 * H, nb, lb);
        else if (j0 == 0 && in->logits0 && nb <= LSTM_LOGITS_ROWS_MAX) {
            /* row 0 as the caller made it: lstm_logits, as lstm_logits_batch
             * makes each of up to LSTM_LOGITS_ROWS_MAX rows, so the same bits */
            memcpy(lb, in->logits0, (size_t)V * sizeof(float));
            lstm_logits_batch(m, d->q + H, nb - 1, lb + V);
        } else
            lstm_logits_batch(m, d->q + j0 * H, nb, lb);
        for (size_t r = 0; r < nb; r++) {
            const float *l = lb + r * (size_t)V;
            int id = d->ids[j0 + r];
            d->log_z[j0 + r] = nc_logsumexp(l, (size_t)V);
            d->s_target[j0 + r] = id < V ? l[id] : -INFINITY;
            if (vocab_stats)
                gate_vocab_stats(l, V, scratch, &d->v_ent[j0 + r], &d->v_logmax[j0 + r], &d->v_argmax[j0 + r]);
        }
    }
    nc_free(logits);
    nc_free(scratch);
    return rc;
}

static int prepare(const nc_doc_prep *in, nc_doc **out, char *err, size_t errlen)
{
    const nc_model *m = in->m;
    const size_t n = in->toks->n;
    nc_doc *d;
    int rc = doc_alloc(m->cfg.hidden_size, m->cfg.vocab_size, n, &d, err, errlen);
    if (rc)
        return rc;
    *out = NULL;
    d->unk_id = m->unk_id;
    d->gate = m->gate;
    d->dec_w = m->decoder_w;
    d->dec_b = m->decoder_b;
    if (in->vocab_stats) {
        d->v_ent = nc_zalloc(n + 1, sizeof(float));
        d->v_logmax = nc_zalloc(n + 1, sizeof(float));
        d->v_argmax = nc_zalloc(n + 1, sizeof(int));
        if (!d->v_ent || !d->v_logmax || !d->v_argmax)
            rc = nc_error(err, errlen, NC_ENOMEM, "vocabulary statistics of %zu tokens", n);
    }
    d->first = in->has_h ? 0 : (n > 0 ? 1 : 0);
    if (!rc && in->mem_words && in->mem_words != in->words && !(d->mem_ids = nc_calloc(n + 1, sizeof(int))))
        rc = nc_error(err, errlen, NC_ENOMEM, "document of %zu tokens", n);
    if (!rc)
        rc = doc_ids(in, d, err, errlen);
    if (!rc && n > 0)
        rc = doc_logits(in, d, err, errlen);
    if (rc) {
        doc_free(d);
        return rc;
    }
    *out = d;
    return NC_OK;
}

/* One doc_score call: its windows (the caller's or local ones), what it
 * reads, and the buffers of a block of B positions. */
typedef struct {
    const nc_doc *d;
    const nc_cache_params *p;
    nc_doc_caches *c;
    void *st[NC_NCOMP];           /* each row's session state: the caller's or own[c]'s */
    void *own[NC_NCOMP];          /* states made for the call (the caller gave none) */
    void *scan[NC_NCOMP];         /* each row's scan of the pass (component.h scan_open) */
    bool pre, gated;
    unsigned skipping;            /* the searched rows whose searches the gate may skip */
    size_t B;
    nc_mix_input *ins;
    bool *skip;                   /* [NC_NCOMP, B] row c's search of position b0 + r skipped */
} score_run;

/* The rows' session states (the caller's, or empty ones made for the
 * call when it gave none) and their scans of the pass (component.h). */
static int score_rows(score_run *s, size_t block, char *err, size_t errlen)
{
    const nc_doc *d = s->d;
    const nc_doc_caches *c = s->c;
    const nc_state_args a = {.p = s->p, .H = d->dim, .store = c ? c->ub : NULL, .unk_id = d->unk_id};
    const nc_scan_doc sd = {.p = s->p, .q = d->q, .ids = d->ids, .first = d->first, .H = d->dim,
                            .at_h0 = c && c->at_h0, .store_ids = d->mem_ids ? d->mem_ids : d->ids,
                            .adapt = c && c->adapt, .unk_id = d->unk_id, .pre_d2 = s->pre ? c->pre_d2 : NULL,
                            .pre_words = s->pre ? c->pre_words : NULL};
    int rc = NC_OK;
    for (int i = 0; !rc && i < NC_NCOMP; i++) {
        const nc_component *r = nc_component_rows[i];
        if (!r->state_new)
            continue;
        if (c && c->states)
            s->st[i] = c->states[i];
        else if (!(rc = r->state_new(&a, &s->own[i], err, errlen)))
            s->st[i] = s->own[i];
        NC_ASSERT(rc || s->st[i], "component %s: no session state given", r->name);
        if (!rc && r->scan_open)
            rc = r->scan_open(s->st[i], &sd, block, &s->scan[i], err, errlen);
    }
    return rc;
}

/* Whether the pass searches a row's memory (its scan is open and it is on:
 * the gate may skip its searches). */
static bool row_searches(const score_run *s, int c)
{
    const nc_component *r = nc_component_rows[c];
    return r->searched && s->scan[c] && r->on(s->p) && (s->pre || r->can_search(s->st[c]));
}

/* What the scoring reads (the gate) and the block's buffers. */
static int score_setup(score_run *s, size_t block, char *err, size_t errlen)
{
    const nc_cache_params *p = s->p;
    nc_doc_caches *c = s->c;
    const nc_doc *d = s->d;
    s->gated = p->gate;
    if (s->gated && !d->gate)
        return nc_error(err, errlen, NC_EINVAL, "gate: the model has no gate (gate.safetensors; fit one with "
                                                "neurocache fit-gate)");
    if ((s->gated || (c && c->gate_f)) && !d->v_ent)
        return nc_error(err, errlen, NC_EINVAL, "gate: the document was prepared without p_vocab's statistics");
    /* adaptive retrieval (gate.h): only with a gate, a row whose memory
     * the pass searches and a threshold above 0 */
    const bool thr = s->gated && gate_threshold(d->gate, p) > 0.0;
    for (int i = 0; thr && i < NC_NCOMP; i++)
        if (row_searches(s, i))
            s->skipping |= 1u << i;
    s->B = block;
    s->ins = nc_malloc(block * sizeof *s->ins);
    s->skip = nc_zalloc(block * NC_NCOMP, sizeof *s->skip);
    if (!s->ins || !s->skip)
        return nc_error(err, errlen, NC_ENOMEM, "scoring buffers");
    return NC_OK;
}

static void score_free(score_run *s)
{
    free(s->ins);
    free(s->skip);
    for (int c = 0; c < NC_NCOMP; c++) {
        if (s->scan[c] && nc_component_rows[c]->scan_close)
            nc_component_rows[c]->scan_close(s->scan[c]);
        if (s->own[c])
            nc_component_rows[c]->state_free(s->own[c]);
    }
}

/* The rows' scans of the block (component.h scan_block), before any of
 * its positions is pushed. */
static void block_scans(score_run *s, size_t b0, size_t nb)
{
    for (int c = 0; c < NC_NCOMP; c++)
        if (s->scan[c] && nc_component_rows[c]->scan_block)
            nc_component_rows[c]->scan_block(s->scan[c], b0, nb);
}

/* What each position of the block reads before the searches, and the
 * pre-search gate's decision to skip them. */
static void block_inputs(score_run *s, size_t b0, size_t nb)
{
    const nc_doc *d = s->d;
    const nc_cache_params *p = s->p;
    const int H = d->dim;
    for (size_t r = 0; r < nb; r++) {
        size_t t = b0 + r;
        nc_mix_input *in = &s->ins[r];
        *in = (nc_mix_input){.V = d->V, .s_target = d->s_target[t], .log_z = d->log_z[t],
                             .vocab_full = p->vocab_size_full > 0 ? p->vocab_size_full : d->vfull[t],
                             .gate = s->gated ? d->gate : NULL, .h = d->q + t * H,
                             .dec_w = d->dec_w, .dec_b = d->dec_b, .H = H};
        if (d->v_ent) {
            in->v_ent = d->v_ent[t];
            in->v_logmax = d->v_logmax[t];
            in->v_argmax = d->v_argmax[t];
        }
        for (int c = 0; c < NC_NCOMP; c++) {
            in->state[c] = s->st[c];
            if (s->scan[c] && nc_component_rows[c]->scan_input)
                nc_component_rows[c]->scan_input(s->scan[c], r, in);
        }
        /* adaptive retrieval: the pre-search gate decides from these, for
         * each searched row */
        for (int c = 0; c < NC_NCOMP; c++)
            s->skip[(size_t)c * s->B + r] = ((s->skipping >> c) & 1u) && gate_skip_search(d->gate, p, in, c);
    }
}

/* The searched rows' block (component.h scan_search): a row adapting
 * adds the block's pairs to its memory, then searches the positions the
 * gate does not skip, as one batch; the searches made and skipped counted
 * where the gate may skip (into the pass's and, but for precomputed
 * neighbours, the process's counters). */
static int block_search(score_run *s, size_t b0, size_t nb, char *err, size_t errlen)
{
    for (int c = 0; c < NC_NCOMP; c++) {
        if (!s->scan[c] || !nc_component_rows[c]->scan_search)
            continue;
        nc_scan_search b = {.b0 = b0, .nb = nb, .skip = s->skip + (size_t)c * s->B, .ins = s->ins};
        int rc = nc_component_rows[c]->scan_search(s->scan[c], &b, err, errlen);
        if (rc)
            return rc;
        if ((s->skipping >> c) & 1u) {
            s->c->searched += b.searched;
            s->c->skipped += b.skipped;
            if (!s->pre)
                gate_count_searches(b.searched, b.skipped);
        }
    }
    return NC_OK;
}

/* Each position's mixture (and the gate's data), then its pair into the
 * rows' states. */
static int block_mix(score_run *s, size_t b0, size_t nb, double *logprobs, char *err, size_t errlen)
{
    const nc_doc *d = s->d;
    const nc_cache_params *p = s->p;
    nc_doc_caches *c = s->c;
    for (size_t r = 0; r < nb; r++) {
        size_t t = b0 + r;
        nc_mix_input *in = &s->ins[r];
        logprobs[t] = mixture_target(p, in, d->ids[t]);
        if (c && c->gate_f)
            mixture_gate_data(p, in, d->ids[t], c->gate_f + t * NC_GATE_NFEAT, c->gate_pc + t * NC_NCOMP);
        /* the pair into the rows' states: the block's later positions read
         * them (scan_block took what it needs before the block) */
        for (int c = 0; c < NC_NCOMP; c++) {
            int rc = s->st[c] ? nc_component_rows[c]->push(s->st[c], d->q + t * d->dim, d->ids[t]) : NC_OK;
            if (rc)
                return nc_error(err, errlen, rc, "%s cache", nc_component_rows[c]->name);
        }
    }
    return NC_OK;
}

int doc_score(const nc_doc *d, const nc_cache_params *p, nc_doc_caches *c, double *logprobs, char *err,
              size_t errlen)
{
    NC_ASSERT(d, "doc_score: no d");
    const size_t block = c ? c->block : 0;
    const size_t n = d->n;
    int rc = cache_params_validate(p, err, errlen);
    if (rc)
        return rc;
    for (size_t j = 0; j < d->first && j < n; j++) {
        logprobs[j] = NAN;
        for (int i = 0; c && c->gate_f && i < NC_GATE_NFEAT; i++)
            c->gate_f[j * NC_GATE_NFEAT + i] = NAN;
        for (int i = 0; c && c->gate_pc && i < NC_NCOMP; i++)
            c->gate_pc[j * NC_NCOMP + i] = NAN;
    }
    if (d->first >= n)
        return NC_OK;
    /* Blocks of at most the positions scored: a daemon's one-word feed
     * allocated 64 rows of dots (528 kB for a 2,000-key window) and a copy
     * of the window (2 MB) it never reads, mapped and faulted in afresh
     * each feed (issue 36); the blocks are the same (one of them). */
    const size_t todo = n - d->first;
    size_t B = block ? block : DOC_SCORE_BLOCK;
    if (B > todo)
        B = todo;
    score_run s = {.d = d, .p = p, .c = c, .pre = c && c->pre_d2 && c->pre_words};
    rc = score_rows(&s, B, err, errlen);
    if (!rc)
        rc = score_setup(&s, B, err, errlen);
    for (size_t b0 = d->first; !rc && b0 < n; b0 += s.B) {
        size_t nb = n - b0 < s.B ? n - b0 : s.B;
        block_scans(&s, b0, nb);
        block_inputs(&s, b0, nb);
        rc = block_search(&s, b0, nb, err, errlen);
        if (!rc)
            rc = block_mix(&s, b0, nb, logprobs, err, errlen);
    }
    score_free(&s);
    return rc;
}

int doc_neighbours(const nc_doc *d, const nc_cache_params *p, const nc_doc_knn *kn, char *err, size_t errlen)
{
    NC_ASSERT(p, "doc_neighbours: no p");
    NC_ASSERT(kn, "doc_neighbours: no kn");
    NC_ASSERT(d, "doc_neighbours: no d");
    const int k = p->knn, H = d->dim;
    const size_t block = kn->block ? kn->block : DOC_SCORE_BLOCK;
    const bool adapt = kn->adapt;
    float *d2 = kn->d2;
    int *words = kn->words;
    for (size_t i = 0; i < d->first * (size_t)k && i < d->n * (size_t)k; i++) {
        d2[i] = 0.0f;
        words[i] = -1;
    }
    /* how the document reads the store's words (nc_doc.unk_id) */
    const int reader = p->open_vocab || d->unk_id < 0 ? NC_UB_OPEN : d->unk_id;
    int64_t *lim = nc_malloc(block * sizeof(int64_t));
    if (!lim)
        return nc_error(err, errlen, NC_ENOMEM, "search buffers");
    int rc = NC_OK;
    nc_ub_coarse coarse = {0};   /* the add's coarse search of the block, its search's too */
    for (size_t b0 = d->first; !rc && b0 < d->n; b0 += block) {
        size_t nb = d->n - b0 < block ? d->n - b0 : block;
        const float *Q = d->q + b0 * H;
        if (adapt) {
            int64_t first_id;
            nc_ub_add a = {.keys = Q, .words = (d->mem_ids ? d->mem_ids : d->ids) + b0, .n = nb,
                           .nprobe = p->nprobe, .coarse = &coarse};
            if ((rc = unbounded_cache_add_block(kn->ub, &a, &first_id, err, errlen)))
                break;
            for (size_t r = 0; r < nb; r++)
                lim[r] = first_id + (int64_t)r;
        }
        nc_ub_query q = {.queries = Q, .nq = nb, .k = k, .nprobe = p->nprobe, .id_limit = adapt ? lim : NULL,
                         .extra = adapt ? (int)nb : 0, .reader = reader, .coarse = adapt ? &coarse : NULL,
                         .out_d2 = d2 + b0 * (size_t)k, .out_words = words + b0 * (size_t)k};
        rc = unbounded_cache_query(kn->ub, &q, err, errlen);
    }
    ub_coarse_free(&coarse);
    free(lim);
    return rc;
}
