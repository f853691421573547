/* stream.c -- the per-stream predictor: LSTM state + local caches + an
 * optional namespace unbounded cache. Scoring goes through doc_score so that
 * streams and documents share one causal code path. */
#include "stream.h"
#include "gate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct nc_stream {
    const nc_model *m;
    nc_cache_params p;
    nc_state *st;
    nc_lstm_work *work;
    bool has_h;
    int64_t pos;
    nc_ncache neural;             /* size 0 when off */
    nc_ucache unigram;
    nc_ubcache *ub;
    nc_wordtable *words;          /* open vocabulary table or NULL */
    bool own_words;
    float *logits;                /* [V] scratch for predict */
    float *dots;                  /* [neural.size] scratch */
};

static int setup_caches(nc_stream *s, char *err, size_t errlen)
{
    int rc = NC_OK;
    if (s->p.neural_size > 0)
        rc = ncache_init(&s->neural, s->p.neural_size, s->m->cfg.hidden_size, s->p.neural_f16, err,
                         errlen);
    if (!rc && s->p.neural_size > 0) {
        s->dots = nc_alloc((size_t)s->p.neural_size * sizeof(float));
        if (!s->dots)
            rc = nc_error(err, errlen, NC_ENOMEM, "neural cache scratch");
    }
    if (!rc && s->p.unigram_size > 0)
        rc = ucache_init(&s->unigram, s->p.unigram_size, err, errlen);
    return rc;
}

static void start(nc_stream *s, bool bos)
{
    lstm_state_reset(s->st);
    s->has_h = false;
    s->pos = 0;
    if (bos) {
        lstm_step(s->m, s->st, s->m->eos_id, s->work);
        s->has_h = true;
    }
}

int stream_new(const nc_model *m, const nc_cache_params *p, nc_ubcache *ub, nc_wordtable *words,
               bool bos, nc_stream **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = cache_params_validate(p, err, errlen);
    if (rc)
        return rc;
    if (p->unbounded && !ub)
        return nc_error(err, errlen, NC_EINVAL, "unbounded cache requested but none given");
    if (p->gate && !m->gate)
        return nc_error(err, errlen, NC_EINVAL, "gate: the model has no gate (gate.safetensors; fit one with "
                                                "neurocache fit-gate)");
    if (ub && ubcache_dim(ub) != m->cfg.hidden_size)
        return nc_error(err, errlen, NC_EINVAL, "unbounded cache dimension %d, model hidden size %d",
                        ubcache_dim(ub), m->cfg.hidden_size);
    nc_stream *s = calloc(1, sizeof *s);
    if (!s)
        return nc_error(err, errlen, NC_ENOMEM, "stream");
    s->m = m;
    s->p = *p;
    s->ub = ub;
    s->st = lstm_state_new(m);
    s->work = lstm_work_new(m);
    s->logits = nc_alloc((size_t)m->cfg.vocab_size * sizeof(float));
    if (!s->st || !s->work || !s->logits)
        rc = nc_error(err, errlen, NC_ENOMEM, "stream state");
    if (!rc && p->open_vocab) {
        s->words = words ? words : (ub ? ubcache_words(ub) : NULL);
        if (!s->words) {
            rc = wordtable_new(m->vocab, &s->words, err, errlen);
            s->own_words = rc == NC_OK;
        }
    }
    if (!rc)
        rc = setup_caches(s, err, errlen);
    if (rc) {
        stream_free(s);
        return rc;
    }
    start(s, bos);
    *out = s;
    return NC_OK;
}

void stream_free(nc_stream *s)
{
    if (!s)
        return;
    lstm_state_free(s->st);
    lstm_work_free(s->work);
    ncache_free(&s->neural);
    ucache_free(&s->unigram);
    if (s->own_words)
        wordtable_free(s->words);
    nc_free(s->logits);
    nc_free(s->dots);
    free(s);
}

void stream_reset(nc_stream *s, bool bos)
{
    if (s->neural.size)
        ncache_clear(&s->neural);
    if (s->unigram.size)
        ucache_clear(&s->unigram);
    start(s, bos);
}

const nc_cache_params *stream_params(const nc_stream *s)
{
    return &s->p;
}

int stream_set_params(nc_stream *s, const nc_cache_params *p, char *err, size_t errlen)
{
    int rc = cache_params_validate(p, err, errlen);
    if (rc)
        return rc;
    if (p->unbounded && !s->ub)
        return nc_error(err, errlen, NC_ESTATE, "this stream has no unbounded cache");
    if (p->gate && !s->m->gate)
        return nc_error(err, errlen, NC_EINVAL, "gate: the model has no gate (gate.safetensors; fit one with "
                                                "neurocache fit-gate)");
    if (p->open_vocab && !s->words)
        return nc_error(err, errlen, NC_ESTATE, "open vocabulary must be chosen when the stream is created");
    /* rebuild windows keeping the newest pairs */
    nc_ncache nn = {0};
    nc_ucache nu = {0};
    float *dots = NULL;
    const int H = s->m->cfg.hidden_size;
    if (p->neural_size > 0) {
        if ((rc = ncache_init(&nn, p->neural_size, H, p->neural_f16, err, errlen)))
            return rc;
        dots = nc_alloc((size_t)p->neural_size * sizeof(float));
        float *tmp = s->neural.count ? nc_alloc((size_t)s->neural.count * H * sizeof(float)) : NULL;
        int *vals = s->neural.count ? malloc((size_t)s->neural.count * sizeof(int)) : NULL;
        if (!dots || (s->neural.count && (!tmp || !vals))) {
            nc_free(tmp);
            free(vals);
            nc_free(dots);
            ncache_free(&nn);
            return nc_error(err, errlen, NC_ENOMEM, "neural cache");
        }
        int cnt = ncache_export(&s->neural, tmp, vals);
        for (int i = cnt > p->neural_size ? cnt - p->neural_size : 0; i < cnt; i++)
            ncache_push(&nn, tmp + (size_t)i * H, vals[i]);
        nc_free(tmp);
        free(vals);
    }
    if (p->unigram_size > 0) {
        if ((rc = ucache_init(&nu, p->unigram_size, err, errlen))) {
            ncache_free(&nn);
            nc_free(dots);
            return rc;
        }
        int cnt = s->unigram.count;
        for (int i = cnt > p->unigram_size ? cnt - p->unigram_size : 0; i < cnt; i++)
            if (ucache_push(&nu, ucache_at(&s->unigram, i))) {
                ncache_free(&nn);
                ucache_free(&nu);
                nc_free(dots);
                return nc_error(err, errlen, NC_ENOMEM, "unigram cache");
            }
    }
    ncache_free(&s->neural);
    ucache_free(&s->unigram);
    nc_free(s->dots);
    s->neural = nn;
    s->unigram = nu;
    s->dots = dots;
    s->p = *p;
    return NC_OK;
}

int stream_feed(nc_stream *s, const nc_tokens *toks, bool adapt, double *logprobs, char *err,
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
    int rc = doc_prepare(s->m, st, s->has_h, toks, s->p.open_vocab ? s->words : NULL, &d, err, errlen);
    double *lp = logprobs;
    if (!rc && !lp) {
        lp = malloc(toks->n * sizeof(double));
        if (!lp)
            rc = nc_error(err, errlen, NC_ENOMEM, "log-probabilities");
    }
    if (!rc) {
        nc_doc_caches c = {.neural = s->neural.size ? &s->neural : NULL,
                           .unigram = s->unigram.size ? &s->unigram : NULL,
                           .ub = s->ub, .adapt = adapt};
        rc = doc_score(d, &s->p, &c, 0, lp, err, errlen);
    }
    if (lp != logprobs)
        free(lp);
    if (!rc) {
        lstm_state_copy(s->st, st);
        s->has_h = true;
        s->pos += (int64_t)toks->n;
    }
    lstm_state_free(st);
    doc_free(d);
    return rc;
}

int stream_predict(nc_stream *s, bool shares, nc_dist *out, char *err, size_t errlen)
{
    if (!s->has_h)
        return nc_error(err, errlen, NC_ESTATE, "nothing to predict from yet (no token fed)");
    lstm_logits(s->m, lstm_state_top(s->st), s->logits);
    return stream_predict_logits(s, s->logits, shares, out, err, errlen);
}

const nc_ncache *stream_neural(const nc_stream *s)
{
    return s->neural.size && s->p.neural_size > 0 ? &s->neural : NULL;
}

const float *stream_h(const nc_stream *s)
{
    return s->has_h ? lstm_state_top(s->st) : NULL;
}

int stream_predict_logits(nc_stream *s, const float *logits, bool shares, nc_dist *out, char *err,
                          size_t errlen)
{
    if (!s->has_h)
        return nc_error(err, errlen, NC_ESTATE, "nothing to predict from yet (no token fed)");
    const int H = s->m->cfg.hidden_size, V = s->m->cfg.vocab_size;
    const float *h = lstm_state_top(s->st);
    nc_mix_input in = {.V = V, .logits = logits, .vocab_full = V};
    size_t n_words = (size_t)V;
    if (s->p.open_vocab && s->words) {
        n_words = (size_t)wordtable_size(s->words);
        in.vocab_full = s->p.vocab_size_full > 0 ? s->p.vocab_size_full : (int)n_words;
    }
    int vals_cap = s->neural.size;
    int *vals = NULL;
    if (s->p.neural_size > 0 && s->neural.count > 0) {
        vals = malloc((size_t)vals_cap * sizeof(int));
        if (!vals)
            return nc_error(err, errlen, NC_ENOMEM, "neural window");
        int cnt = ncache_dots(&s->neural, h, s->dots);
        ncache_export(&s->neural, NULL, vals);
        int w = cnt < s->p.neural_size ? cnt : s->p.neural_size;
        in.ndots = s->dots + (cnt - w);
        in.nvals = vals + (cnt - w);
        in.nn = w;
    }
    if (s->p.unigram_size > 0)
        in.uni = &s->unigram;
    float *ud2 = NULL;
    int *uw = NULL;
    int rc = NC_OK;
    bool skip = false;
    if (s->p.gate && s->m->gate) {
        /* the adaptive mixture: p_vocab's statistics, then the pre-search
         * gate decides whether the unbounded cache is searched (gate.h) */
        float *scratch = malloc((size_t)V * sizeof(float));
        if (!scratch) {
            free(vals);
            return nc_error(err, errlen, NC_ENOMEM, "gate features");
        }
        gate_vocab_stats(logits, V, scratch, &in.v_ent, &in.v_logmax, &in.v_argmax);
        free(scratch);
        in.gate = s->m->gate;
        if (s->p.unbounded && s->ub) {
            skip = gate_skip_search(s->m->gate, &s->p, &in);
            in.ub_skipped = skip;
            if (gate_threshold(s->m->gate, &s->p) > 0.0)
                gate_count_searches(!skip, skip);
        }
    }
    if (s->p.unbounded && s->ub && !skip) {
        int k = s->p.knn;
        ud2 = malloc((size_t)k * sizeof(float));
        uw = malloc((size_t)k * sizeof(int));
        if (!ud2 || !uw)
            rc = nc_error(err, errlen, NC_ENOMEM, "neighbours");
        else
            rc = ubcache_search(s->ub, h, 1, k, s->p.nprobe, NULL, 0, ud2, uw, err, errlen);
        in.ub_d2 = ud2;
        in.ub_words = uw;
        in.ub_k = k;
    }
    (void)H;
    if (!rc)
        rc = mixture_full(&s->p, &in, n_words, shares, out, err, errlen);
    free(vals);
    free(ud2);
    free(uw);
    return rc;
}

const char *stream_word(nc_stream *s, int id)
{
    if (s->words)
        return wordtable_word(s->words, id);
    return vocab_word(s->m->vocab, id);
}

int64_t stream_position(const nc_stream *s) { return s->pos; }
bool stream_has_h(const nc_stream *s) { return s->has_h; }
nc_ubcache *stream_ubcache(const nc_stream *s) { return s->ub; }

size_t stream_memory(const nc_stream *s)
{
    size_t m = sizeof *s + 2 * lstm_state_blob_size(s->st) + (size_t)s->m->cfg.vocab_size * sizeof(float);
    if (s->neural.size)
        m += ncache_memory(&s->neural) + (size_t)s->neural.size * sizeof(float);
    if (s->unigram.size)
        m += ucache_memory(&s->unigram);
    if (s->own_words)
        m += wordtable_memory(s->words);
    return m;
}

int stream_clone(const nc_stream *s, nc_stream **out, char *err, size_t errlen)
{
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
 * "NCSTRM02", u32 V, H, L, params (fixed list of 4-byte fields), u8 has_h,
 * i64 pos, u64 state length + lstm_state blob, u32 number of dynamic words +
 * (u32 len, bytes) each, neural: i32 size count f16 + count x (keys, i32 ref),
 * unigram: i32 size count + count x i32 ref, u32 crc32 of everything before.
 * A ref < V is a model id; V + i is the i-th dynamic word of the blob. */

#include <zlib.h>

typedef struct {
    unsigned char *b;
    size_t n, cap;
    bool oom;
} wbuf;

static void put(wbuf *w, const void *p, size_t n)
{
    if (w->oom)
        return;
    if (w->n + n > w->cap) {
        size_t c = w->cap ? w->cap : 4096;
        while (c < w->n + n)
            c *= 2;
        unsigned char *b = realloc(w->b, c);
        if (!b) {
            w->oom = true;
            return;
        }
        w->b = b;
        w->cap = c;
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put_u32(wbuf *w, uint32_t v) { put(w, &v, 4); }
static void put_i32(wbuf *w, int32_t v) { put(w, &v, 4); }
static void put_f32(wbuf *w, float v) { put(w, &v, 4); }

typedef struct {
    const unsigned char *b;
    size_t n, off;
    bool bad;
} rbuf;

static void get(rbuf *r, void *p, size_t n)
{
    if (r->bad || r->n - r->off < n) {
        r->bad = true;
        memset(p, 0, n);
        return;
    }
    memcpy(p, r->b + r->off, n);
    r->off += n;
}
static uint32_t get_u32(rbuf *r) { uint32_t v; get(r, &v, 4); return v; }
static int32_t get_i32(rbuf *r) { int32_t v; get(r, &v, 4); return v; }
static float get_f32(rbuf *r) { float v; get(r, &v, 4); return v; }

static void put_params(wbuf *w, const nc_cache_params *p)
{
    put_i32(w, p->unigram_size); put_f32(w, p->unigram_lambda);
    put_i32(w, p->neural_size); put_f32(w, p->neural_theta); put_f32(w, p->neural_lambda);
    put_i32(w, p->global_norm); put_f32(w, p->neural_alpha); put_i32(w, p->neural_f16);
    put_i32(w, p->unbounded); put_i32(w, p->knn); put_i32(w, p->nprobe);
    put_f32(w, p->unbounded_lambda); put_i32(w, (int32_t)p->kernel); put_i32(w, p->exact);
    put_i32(w, p->open_vocab); put_f32(w, p->uniform_mu); put_i32(w, p->vocab_size_full);
    put_i32(w, p->gate); put_f32(w, p->gate_skip);
}

static void get_params(rbuf *r, nc_cache_params *p, int version)
{
    cache_params_default(p);
    p->unigram_size = get_i32(r); p->unigram_lambda = get_f32(r);
    p->neural_size = get_i32(r); p->neural_theta = get_f32(r); p->neural_lambda = get_f32(r);
    p->global_norm = get_i32(r) != 0; p->neural_alpha = get_f32(r); p->neural_f16 = get_i32(r) != 0;
    p->unbounded = get_i32(r) != 0; p->knn = get_i32(r); p->nprobe = get_i32(r);
    p->unbounded_lambda = get_f32(r); p->kernel = (nc_kernel)get_i32(r); p->exact = get_i32(r) != 0;
    p->open_vocab = get_i32(r) != 0; p->uniform_mu = get_f32(r); p->vocab_size_full = get_i32(r);
    if (version >= 2) {
        p->gate = get_i32(r) != 0; p->gate_skip = get_f32(r);
    }
}

/* Dynamic ids met in the windows, in first-seen order: map id -> blob ref. */
typedef struct {
    int *ids;
    int n, cap;
} idlist;

static int ref_of(idlist *l, int V, int id)
{
    if (id < V)
        return id;
    for (int i = 0; i < l->n; i++)
        if (l->ids[i] == id)
            return V + i;
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 64;
        int *p = realloc(l->ids, (size_t)c * sizeof(int));
        if (!p)
            return -1;
        l->ids = p;
        l->cap = c;
    }
    l->ids[l->n++] = id;
    return V + l->n - 1;
}

int stream_export(const nc_stream *s, void **blob, size_t *len, char *err, size_t errlen)
{
    *blob = NULL;
    *len = 0;
    const int V = s->m->cfg.vocab_size, H = s->m->cfg.hidden_size;
    idlist ids = {0};
    /* refs first (the word list precedes the windows in the blob) */
    int nn = s->neural.size ? s->neural.count : 0, nu = s->unigram.size ? s->unigram.count : 0;
    int *nref = malloc(((size_t)nn + 1) * sizeof(int)), *uref = malloc(((size_t)nu + 1) * sizeof(int));
    int *vals = malloc(((size_t)nn + 1) * sizeof(int));
    int rc = NC_OK;
    if (!nref || !uref || !vals)
        rc = nc_error(err, errlen, NC_ENOMEM, "stream export");
    if (!rc && nn)
        ncache_export(&s->neural, NULL, vals);
    for (int i = 0; !rc && i < nn; i++)
        if ((nref[i] = ref_of(&ids, V, vals[i])) < 0)
            rc = nc_error(err, errlen, NC_ENOMEM, "stream export");
    for (int i = 0; !rc && i < nu; i++)
        if ((uref[i] = ref_of(&ids, V, ucache_at(&s->unigram, i))) < 0)
            rc = nc_error(err, errlen, NC_ENOMEM, "stream export");
    wbuf w = {0};
    if (!rc) {
        put(&w, "NCSTRM02", 8);
        put_u32(&w, (uint32_t)V);
        put_u32(&w, (uint32_t)H);
        put_u32(&w, (uint32_t)s->m->cfg.num_layers);
        put_params(&w, &s->p);
        unsigned char hh = s->has_h;
        put(&w, &hh, 1);
        put(&w, &s->pos, 8);
        uint64_t sl = lstm_state_blob_size(s->st);
        put(&w, &sl, 8);
        if (!w.oom && w.n + sl <= w.cap) {
            lstm_state_to_blob(s->st, w.b + w.n);
            w.n += sl;
        } else {
            void *tmp = malloc(sl);
            if (tmp) {
                lstm_state_to_blob(s->st, tmp);
                put(&w, tmp, sl);
                free(tmp);
            } else {
                w.oom = true;
            }
        }
        put_u32(&w, (uint32_t)ids.n);
        for (int i = 0; i < ids.n; i++) {
            const char *word = s->words ? wordtable_word(s->words, ids.ids[i]) : NULL;
            if (!word)
                word = "<unk>";
            put_u32(&w, (uint32_t)strlen(word));
            put(&w, word, strlen(word));
        }
        put_i32(&w, s->neural.size);
        put_i32(&w, nn);
        put_i32(&w, s->neural.f16);
        for (int i = 0; i < nn; i++) {
            int slot = ncache_slot(&s->neural, i);
            size_t ks = s->neural.f16 ? 2 : 4;
            put(&w, (const char *)s->neural.keys + (size_t)slot * H * ks, (size_t)H * ks);
            put_i32(&w, nref[i]);
        }
        put_i32(&w, s->unigram.size);
        put_i32(&w, nu);
        for (int i = 0; i < nu; i++)
            put_i32(&w, uref[i]);
        uint32_t crc = w.oom ? 0 : (uint32_t)crc32(0L, w.b, (uInt)w.n);
        put_u32(&w, crc);
        if (w.oom)
            rc = nc_error(err, errlen, NC_ENOMEM, "stream export");
    }
    free(ids.ids);
    free(nref);
    free(uref);
    free(vals);
    if (rc) {
        free(w.b);
        return rc;
    }
    *blob = w.b;
    *len = w.n;
    return NC_OK;
}

int stream_import(const nc_model *m, nc_ubcache *ub, nc_wordtable *words, const void *blob,
                  size_t len, nc_stream **out, char *err, size_t errlen)
{
    *out = NULL;
    const int V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    /* NCSTRM01: the same without the gate's two knobs (read as their defaults) */
    if (len < 12 || (memcmp(blob, "NCSTRM01", 8) != 0 && memcmp(blob, "NCSTRM02", 8) != 0))
        return nc_error(err, errlen, NC_EFORMAT, "not a neurocache stream blob");
    int version = ((const char *)blob)[7] - '0';
    uint32_t crc;
    memcpy(&crc, (const char *)blob + len - 4, 4);
    if (crc != (uint32_t)crc32(0L, blob, (uInt)(len - 4)))
        return nc_error(err, errlen, NC_EFORMAT, "stream blob checksum mismatch");
    rbuf r = {.b = blob, .n = len - 4, .off = 8};
    uint32_t bV = get_u32(&r), bH = get_u32(&r), bL = get_u32(&r);
    if (r.bad || bV != (uint32_t)V || bH != (uint32_t)H || bL != (uint32_t)m->cfg.num_layers)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob is for a model V=%u H=%u L=%u, this one "
                        "has V=%d H=%d L=%d", bV, bH, bL, V, H, m->cfg.num_layers);
    nc_cache_params p;
    get_params(&r, &p, version);
    unsigned char hh = 0;
    int64_t pos = 0;
    uint64_t sl = 0;
    get(&r, &hh, 1);
    get(&r, &pos, 8);
    get(&r, &sl, 8);
    if (r.bad || sl > r.n - r.off)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob truncated");
    int rc = cache_params_validate(&p, err, errlen);
    if (rc)
        return NC_EFORMAT;   /* message from validate names the field */
    nc_stream *s;
    if ((rc = stream_new(m, &p, ub, words, false, &s, err, errlen)))
        return rc;
    if ((rc = lstm_state_from_blob(s->st, r.b + r.off, (size_t)sl, err, errlen))) {
        stream_free(s);
        return rc;
    }
    r.off += sl;
    s->has_h = hh != 0;
    s->pos = pos;
    uint32_t nw = get_u32(&r);
    int *map = NULL;
    if (!r.bad && nw > 0) {
        if (nw > (r.n - r.off) / 4 || !s->words) {
            rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: %u dynamic words %s", nw,
                          s->words ? "(truncated)" : "without open vocabulary");
        } else if (!(map = malloc(nw * sizeof(int)))) {
            rc = nc_error(err, errlen, NC_ENOMEM, "stream import");
        }
        for (uint32_t i = 0; !rc && i < nw; i++) {
            uint32_t l = get_u32(&r);
            if (r.bad || l == 0 || l > r.n - r.off) {
                rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: bad word %u", i);
                break;
            }
            map[i] = wordtable_id(s->words, (const char *)r.b + r.off, l, true);
            r.off += l;
            if (map[i] < 0)
                rc = nc_error(err, errlen, NC_ENOMEM, "word table");
        }
    }
#define REF(x) ((x) >= 0 && (x) < V ? (x) : ((x) >= V && (uint32_t)((x) - V) < nw ? map[(x) - V] : -1))
    int32_t nsize = get_i32(&r), ncount = get_i32(&r), nf16 = get_i32(&r);
    if (!rc && (r.bad || nsize != s->neural.size || ncount < 0 || ncount > nsize ||
                (nsize && (nf16 != 0) != s->neural.f16)))
        rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: neural window does not match its parameters");
    size_t ks = s->neural.f16 ? 2 : 4;
    for (int i = 0; !rc && i < ncount; i++) {
        if ((size_t)H * ks + 4 > r.n - r.off) {
            rc = nc_error(err, errlen, NC_EFORMAT, "stream blob truncated (neural window)");
            break;
        }
        memcpy((char *)s->neural.keys + (size_t)i * H * ks, r.b + r.off, (size_t)H * ks);
        r.off += (size_t)H * ks;
        int32_t ref = get_i32(&r);
        int id = REF(ref);
        if (id < 0)
            rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: bad word reference %d", ref);
        s->neural.values[i] = id;
    }
    if (!rc && ncount > 0) {
        s->neural.count = ncount;
        s->neural.head = ncount % s->neural.size;
    }
    int32_t usize = get_i32(&r), ucount = get_i32(&r);
    if (!rc && (r.bad || usize != s->unigram.size || ucount < 0 || ucount > usize))
        rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: unigram window does not match its parameters");
    for (int i = 0; !rc && i < ucount; i++) {
        int32_t ref = get_i32(&r);
        int id = REF(ref);
        if (r.bad || id < 0)
            rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: bad word reference %d", ref);
        else if (ucache_push(&s->unigram, id))
            rc = nc_error(err, errlen, NC_ENOMEM, "unigram cache");
    }
#undef REF
    if (!rc && (r.bad || r.off != r.n))
        rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: %s", r.bad ? "truncated" : "trailing bytes");
    free(map);
    if (rc) {
        stream_free(s);
        return rc;
    }
    *out = s;
    return NC_OK;
}
