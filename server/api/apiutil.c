/* apiutil.c -- what the API's handlers share (apiutil.h). */
#include "apiutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_errors.h"
#include "migrate.h"
#include "namespaces.h"

nc_session *api_session_acquire(nc_server *srv, http_request *req, http_response *resp)
{
    api_error why = API_SESSION_NOT_FOUND;
    char msg[512] = "";
    nc_session *s = migrate_acquire(srv, req->params[0], &why, msg, sizeof msg);
    if (!s)
        http_reply_error(resp, why, "%s", msg);
    return s;
}

int api_session_namespace_check(nc_session *s, bool adapt, http_response *resp)
{
    if (!namespaces_session_deleted(s) || (!adapt && !stream_unbounded_cache(s->stream)))
        return 0;
    const ns_handle *r = s->ns_ref;
    http_reply_error(resp, API_NAMESPACE_DELETED,
                     "namespace '%s' (incarnation %llu), which session '%s' reads and adapts, was deleted: "
                     "create a new session (a namespace created again under the name is a new incarnation "
                     "this session does not join)", namespaces_name(r),
                     (unsigned long long)namespaces_incarnation(r), s->id);
    return -1;
}

int api_session_live(nc_server *srv, nc_session *s, http_response *resp)
{
    if (!sessions_removed(srv->sessions, s))
        return api_session_namespace_check(s, false, resp);
    /* Only a session that lives on elsewhere (handed over, replaced by an
     * import) or a draining replica is worth a retry: one deleted here is
     * gone, and a retry would only find that out. */
    if (sessions_moved(srv->sessions, s) || atomic_load(&srv->draining))
        http_reply_error(resp, API_SESSION_MOVED,
                         "session '%s' was handed to another replica while this request waited: retry", s->id);
    else
        http_reply_error(resp, API_SESSION_NOT_FOUND, "session '%s' was deleted while this request waited", s->id);
    return -1;
}

int api_session_lock(nc_server *srv, nc_session *s, http_response *resp)
{
    pthread_mutex_lock(&s->lock);
    if (api_session_live(srv, s, resp) == 0)
        return 0;
    pthread_mutex_unlock(&s->lock);
    return -1;
}

size_t api_tokens_at_least(const char *text, size_t len, bool normalized)
{
    size_t n = 0;
    bool counted = false;         /* this word was counted */
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        bool sp = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
        if (sp)
            counted = false;
        else if (!counted && (!normalized || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')))
            n++, counted = true;
        if (c == '\n' && !normalized)
            n++;
    }
    return n;
}

int api_over_token_budget(nc_server *srv, size_t n, http_response *resp)
{
    if ((long)n <= srv->cfg.max_tokens_per_request)
        return 0;
    http_reply_error(resp, API_TOO_MANY_TOKENS,
                     "%zu tokens are over max_tokens_per_request = %ld (LSTM steps per request): score long "
                     "texts in pieces, stream corpora with POST /v1/namespaces/{ns}/documents",
                     n, srv->cfg.max_tokens_per_request);
    return -1;
}

int api_dyneval_check(nc_server *srv, const nc_cache_params *p, http_response *resp)
{
    if (p->dyn_lr <= 0.0f || srv->model->dyn_ms)
        return 0;
    http_reply_error(resp, API_DYNEVAL_UNAVAILABLE,
                     "dyn_lr = %g needs the model's gradient statistics for dynamic evaluation, and %s/dyneval "
                     "holds none: measure them with 'neurocache dyn-stats --model %s --train TRAINING_TEXT' "
                     "(docs/dyneval.md), or set dyn_lr 0",
                     (double)p->dyn_lr, srv->cfg.model, srv->cfg.model);
    return -1;
}

int api_tokenize(nc_server *srv, const char *text, size_t len, bool final_eos, bool normalize,
                        nc_tokens *t, http_response *resp)
{
    char err[NC_ERRLEN] = "";
    bool normalized = normalize && srv->model->cfg.text.declared;
    if (api_over_token_budget(srv, api_tokens_at_least(text, len, normalized), resp))
        return -1;
    int rc = tokenize_ex(srv->model, text, len, final_eos, normalize, t, err, sizeof err);
    if (rc != NC_OK) {
        http_reply_error(resp, rc == NC_EFORMAT ? API_INVALID_TEXT : api_error_from_core(rc), "text: %s", err);
        return -1;
    }
    return api_over_token_budget(srv, t->n, resp);
}

json_t *api_text_conventions(const nc_model *m)
{
    if (!m->cfg.text.declared)
        return json_null();
    json_t *o = json_object();
    const char *key;
    char val[64];
    for (int i = 0; o && text_conv_get(&m->cfg.text, i, &key, val, sizeof val); i++)
        json_object_set_new(o, key, text_conv_key_is_bool(key) ? json_boolean(!strcmp(val, "true")) : json_string(val));
    return o;
}

size_t api_char_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;   /* every byte but a continuation starts one */
    return k;
}

size_t api_char_offset(api_charpos *c, const char *s, size_t len, size_t b)
{
    if (b > len)
        b = len;
    if (b < c->byte)
        *c = (api_charpos){0, 0};
    if (b > c->byte)
        c->chars += api_char_count(s + c->byte, b - c->byte);
    c->byte = b;
    return c->chars;
}

void api_token_info(json_t *o, const nc_model *m, const nc_tokens *t, const char *text, size_t len, bool listed)
{
    if (!o)
        return;
    json_object_set_new(o, "unk_count", json_integer((json_int_t)tokens_count_unk(m, t, 0)));
    if (!listed)
        return;
    json_t *unk = json_array(), *offs = json_array(), *lens = json_array();
    api_charpos at = {0, 0};
    for (size_t i = 0; i < t->n; i++) {
        size_t off = t->offsets[i] < len ? t->offsets[i] : len;
        size_t n = t->lens ? t->lens[i] : strlen(t->words[i]);
        n = n < len - off ? n : len - off;
        json_array_append_new(unk, json_boolean(t->ids[i] == m->unk_id));
        json_array_append_new(offs, json_integer((json_int_t)api_char_offset(&at, text, len, off)));
        json_array_append_new(lens, json_integer((json_int_t)(text ? api_char_count(text + off, n) : 0)));
    }
    json_object_set_new(o, "unk", unk);
    json_object_set_new(o, "offsets", offs);
    json_object_set_new(o, "lengths", lens);
}

json_t *api_logprob(double lp)
{
    return proto_logprob(lp);
}

size_t api_top_k(const float *p, size_t n, size_t k, int *out)
{
    return dist_top_k(p, n, k, out);
}

const char *api_model_name(nc_server *srv)
{
    const char *d = srv->cfg.model;
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/') n--;
    const char *slash = NULL;
    for (size_t i = 0; i < n; i++)
        if (d[i] == '/') slash = d + i;
    static __thread char name[256];
    const char *b = slash ? slash + 1 : d;
    snprintf(name, sizeof name, "%.*s", (int)(n - (size_t)(b - d)), b);
    return name;
}

int api_stream_token_id(nc_stream *st, const nc_model *m, const nc_tokens *t, size_t i)
{
    int id = t->ids[i];
    if (id == m->unk_id && t->words[i] && stream_params(st)->open_vocab)
        id = stream_word_id(st, t->words[i], strlen(t->words[i]));
    return id;
}

int api_stream_feed_one(nc_stream *st, const nc_tokens *t, size_t i, double *lp, char *err, size_t errlen)
{
    nc_tokens one = {t->ids + i, t->words + i, t->offsets + i, 1, 1, t->lens ? t->lens + i : NULL};
    return stream_feed(st, &one, false, lp, err, errlen);
}
