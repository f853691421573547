/* generate.c -- drawing words from a stream, and the stop sequences
 * (generate.h). */
#include "generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void gen_setup(gen_params *gp, nc_rng *rng, const gen_request *rq)
{
    *gp = (gen_params){.temperature = rq->temperature, .top_p = rq->top_p, .logprobs = rq->logprobs,
                       .allow_unk = rq->allow_unk, .n_stop = rq->n_stop};
    for (size_t i = 0; i < rq->n_stop; i++) {
        gp->stop[i] = rq->stop[i];
        gp->stop_len[i] = rq->stop_len[i];
    }
    uint64_t s = (uint64_t)rq->seed;
    if (!rq->has_seed && getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
        s = (uint64_t)time(NULL);
    rng_seed(rng, s);
}

void gen_init(gen_state *g, nc_stream *st, const nc_model *m, const gen_params *p, nc_rng *rng)
{
    memset(g, 0, sizeof *g);
    g->st = st;
    g->m = m;
    g->p = *p;
    g->rng = rng;
    dist_init(&g->d);
}

void gen_free(gen_state *g)
{
    dist_free(&g->d);
    free(g->order);
    g->order = NULL;
}

json_t *gen_top_json(nc_stream *st, const nc_dist *d, int n, int *idx)
{
    json_t *o = json_object();
    size_t k = dist_top_k(d->p, d->n, (size_t)n, idx);
    for (size_t i = 0; o && i < k; i++) {
        const char *w = stream_word(st, idx[i]);
        json_object_set_new(o, w ? w : "", proto_logprob(log((double)d->p[idx[i]])));
    }
    return o;
}

/* Picks the next token: greedy at temperature 0 (the lowest id among
 * equals), else sampled from p^(1/T) restricted to the smallest set of
 * words whose mass reaches top_p (nucleus sampling, Holtzman et al. 2020).
 * order is scratch of d->n ints. */
static int choose(const nc_dist *d, double temperature, double top_p, nc_rng *rng, int *order)
{
    size_t n = d->n;
    if (temperature <= 0) {
        int best = 0;
        for (size_t i = 1; i < n; i++)
            if (d->p[i] > d->p[best]) best = (int)i;
        return best;
    }
    size_t k = n;
    if (top_p < 1.0) {
        k = dist_top_k(d->p, n, n, order);
        double cum = 0;
        size_t m = 0;
        while (m < k && cum < top_p) cum += d->p[order[m++]];
        k = m ? m : 1;
    } else {
        for (size_t i = 0; i < n; i++) order[i] = (int)i;
    }
    /* Weights p^(1/T), scaled by the largest to stay finite. */
    double maxlog = -INFINITY;
    for (size_t i = 0; i < k; i++)
        if (d->p[order[i]] > 0) {
            double l = log((double)d->p[order[i]]) / temperature;
            if (l > maxlog) maxlog = l;
        }
    double total = 0;
    for (size_t i = 0; i < k; i++)
        if (d->p[order[i]] > 0) total += exp(log((double)d->p[order[i]]) / temperature - maxlog);
    double u = (double)rng_uniform(rng) * total, acc = 0;
    int last = order[0];
    for (size_t i = 0; i < k; i++) {
        if (d->p[order[i]] <= 0) continue;
        acc += exp(log((double)d->p[order[i]]) / temperature - maxlog);
        last = order[i];
        if (u < acc) break;
    }
    return last;
}

/* Removes unk_token's mass and renormalises (the others keep their
 * ratios). A distribution with nothing but unk is left as it is. */
static void drop_unk(nc_dist *d, int unk)
{
    if (unk < 0 || (size_t)unk >= d->n || d->p[unk] <= 0)
        return;
    double rest = 0;
    for (size_t i = 0; i < d->n; i++)
        if ((int)i != unk) rest += d->p[i];
    if (!(rest > 0))
        return;
    d->p[unk] = 0;
    float inv = (float)(1.0 / rest);
    for (size_t i = 0; i < d->n; i++)
        d->p[i] *= inv;
}

int gen_next(gen_state *g, gen_token *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int rc = stream_predict(g->st, false, &g->d, err, errlen);
    if (rc != NC_OK)
        return rc;
    if (!g->p.allow_unk)
        drop_unk(&g->d, g->m->unk_id);
    if (g->order_cap < g->d.n) {
        free(g->order);
        g->order_cap = g->d.n + 1024;
        g->order = malloc(g->order_cap * sizeof *g->order);
        if (!g->order) {
            g->order_cap = 0;
            return nc_error(err, errlen, NC_ENOMEM, "out of memory");
        }
    }
    int w = choose(&g->d, g->p.temperature, g->p.top_p, g->rng, g->order);
    out->id = w;
    out->logprob = log((double)g->d.p[w]);
    if (g->p.logprobs > 0)
        out->top = gen_top_json(g->st, &g->d, (int)g->p.logprobs, g->order);
    const char *word = stream_word(g->st, w);
    out->word = word ? word : g->m->cfg.unk_token;
    out->eos = w == g->m->eos_id;
    /* Open-vocabulary words enter the LSTM as unk, the caches by name. */
    const int V = g->m->cfg.vocab_size;
    nc_tokens one;
    tokens_init(&one);
    rc = tokens_push(&one, w < V ? w : g->m->unk_id, out->word, strlen(out->word), 0);
    if (rc == NC_OK)
        rc = stream_feed(g->st, &one, false, NULL, err, errlen);
    tokens_clear(&one);
    if (rc != NC_OK) {
        json_decref(out->top);
        out->top = NULL;
    }
    return rc;
}

int gen_feed(nc_stream *st, workguard *g, const nc_tokens *t, double *lp, wg_stop *why, char *err,
             size_t errlen)
{
    int rc = NC_OK;
    *why = WG_RUN;
    for (size_t i = 0; i < t->n && rc == NC_OK; i += WORKGUARD_SLICE) {
        if ((*why = workguard_check(g)) != WG_RUN)
            break;
        size_t nb = t->n - i < WORKGUARD_SLICE ? t->n - i : WORKGUARD_SLICE;
        nc_tokens v = {t->ids + i, t->words + i, t->offsets + i, nb, nb, t->lens ? t->lens + i : NULL};
        rc = stream_feed(st, &v, false, lp ? lp + i : NULL, err, errlen);
    }
    return rc;
}

/* ---- stop sequences ---------------------------------------------------- */

int gen_text_init(gen_text *gt, const char *prompt, size_t len)
{
    memset(gt, 0, sizeof *gt);
    if (sb_add(&gt->text, prompt, len))
        return NC_ENOMEM;
    gt->from = gt->sent = gt->text.len;
    return NC_OK;
}

void gen_text_free(gen_text *gt)
{
    for (size_t i = 0; i < gt->npend; i++)
        json_decref(gt->pend[i].top);
    free(gt->pend);
    free(gt->text.s);
    memset(gt, 0, sizeof *gt);
}

/* The earliest complete stop sequence in text[from..len): its start, or -1. */
static long find_stop(const gen_text *gt, const gen_params *p)
{
    long best = -1;
    const char *t = gt->text.s + gt->from;
    size_t n = gt->text.len - gt->from;
    for (size_t i = 0; i < p->n_stop; i++) {
        const char *hit = memmem(t, n, p->stop[i], p->stop_len[i]);
        if (hit && (best < 0 || hit - t < best))
            best = hit - t;
    }
    return best < 0 ? -1 : (long)gt->from + best;
}

int gen_text_add(gen_text *gt, const gen_token *t, const gen_params *p)
{
    if (gt->npend == gt->cap) {
        size_t cap = gt->cap ? 2 * gt->cap : 16;
        gen_word *nw = realloc(gt->pend, cap * sizeof *nw);
        if (!nw)
            return NC_ENOMEM;
        gt->pend = nw;
        gt->cap = cap;
    }
    size_t start = sb_add_word(&gt->text, t->word, t->eos);
    if (gt->text.oom)
        return NC_ENOMEM;
    gt->pend[gt->npend++] = (gen_word){start, gt->text.len, t->id, t->word, t->eos, t->logprob, t->top};
    long cut = find_stop(gt, p);
    if (cut >= 0) {
        /* the text ends where the stop sequence starts; a word that starts
         * there or later is not part of the answer */
        gt->text.len = (size_t)cut;
        gt->text.s[cut] = 0;
        while (gt->npend > 0 && gt->pend[gt->npend - 1].start >= (size_t)cut) {
            json_decref(gt->pend[gt->npend - 1].top);
            gt->npend--;
        }
        gt->stopped = true;
    }
    return NC_OK;
}

/* Bytes at the end of text[from..len) that are a proper prefix of a stop
 * sequence: they may yet become one, so they are not sent. */
static size_t holdback(const gen_text *gt, const gen_params *p)
{
    size_t n = gt->text.len - gt->from, best = 0;
    const char *t = gt->text.s + gt->from;
    for (size_t i = 0; i < p->n_stop; i++)
        for (size_t k = p->stop_len[i] - 1; k > best; k--)
            if (k <= n && memcmp(t + n - k, p->stop[i], k) == 0) {
                best = k;
                break;
            }
    return best;
}

size_t gen_text_ready(const gen_text *gt, const gen_params *p, bool final, size_t *end)
{
    if (final || gt->stopped) {
        *end = gt->text.len;
        return gt->npend;
    }
    size_t safe = gt->text.len - holdback(gt, p), n = 0;
    *end = gt->sent;
    while (n < gt->npend && gt->pend[n].end <= safe)
        *end = gt->pend[n++].end;
    return n;
}

void gen_text_consume(gen_text *gt, size_t n, size_t end)
{
    if (n > 0 && n < gt->npend)   /* pend is NULL while nothing is pending */
        memmove(gt->pend, gt->pend + n, (gt->npend - n) * sizeof *gt->pend);
    gt->npend -= n;
    gt->sent = end;
}
