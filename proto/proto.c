/* proto.c -- the wire format: API error table, typed JSON field readers with
 * validation, and decoding of request bodies. */
#include "proto.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistr.h>

#include "buf.h"
#include "suggest.h"

/* The one table mapping failures to HTTP statuses, wire codes and the
 * Retry-After seconds (0 = no header). */
static const struct {
    unsigned status;
    const char *code;
    unsigned retry_after;
} api_errors[API_ERROR_COUNT] = {
    [API_OK] = {200, "ok", 0},
    [API_INVALID_JSON] = {400, "invalid_json", 0},
    [API_INVALID_UTF8] = {400, "invalid_utf8", 0},
    [API_INVALID_TYPE] = {400, "invalid_type", 0},
    [API_OUT_OF_RANGE] = {400, "out_of_range", 0},
    [API_MISSING_FIELD] = {400, "missing_field", 0},
    [API_UNKNOWN_FIELD] = {400, "unknown_field", 0},
    [API_INVALID_TEXT] = {400, "invalid_text", 0},
    [API_NOT_FOUND] = {404, "not_found", 0},
    [API_SESSION_NOT_FOUND] = {404, "session_not_found", 0},
    [API_METHOD_NOT_ALLOWED] = {405, "method_not_allowed", 0},
    [API_CONFLICT] = {409, "conflict", 0},
    [API_BODY_TOO_LARGE] = {413, "body_too_large", 0},
    [API_TOO_MANY_TOKENS] = {413, "too_many_tokens", 0},
    [API_UNSUPPORTED_MEDIA] = {415, "unsupported_media_type", 0},
    [API_TOO_MANY_SESSIONS] = {429, "too_many_sessions", 0},
    [API_MEMORY_BUDGET] = {429, "memory_budget_exceeded", 0},
    [API_NOT_READY] = {503, "not_ready", 0},
    [API_INTERNAL] = {500, "internal", 0},
    [API_SESSION_NOT_HERE] = {404, "session_not_here", 0},
    [API_SESSION_MOVED] = {503, "session_moved", 0},
    [API_STATE_CORRUPT] = {400, "state_corrupt", 0},
    [API_STATE_VERSION] = {400, "state_version", 0},
    [API_STATE_MODEL] = {409, "state_model_mismatch", 0},
    [API_STORAGE_FULL] = {507, "insufficient_storage", 0},
    /* an I/O error under the log is usually transient (a controller reset,
     * a network volume's hiccup), unlike a full disk: clients back off */
    [API_STORAGE_UNAVAILABLE] = {503, "storage_unavailable", 5},
    [API_OVER_BUDGET] = {413, "over_budget", 0},
    /* the same request will take as long again: no Retry-After */
    [API_DEADLINE_EXCEEDED] = {503, "deadline_exceeded", 0},
    /* a queued request runs within a few seconds (the budgets bound each) */
    [API_OVERLOADED] = {429, "overloaded", 1},
    [API_TOO_MANY_CONNECTIONS] = {503, "too_many_connections", 1},
    [API_MALFORMED_REQUEST] = {400, "malformed_request", 0},
    [API_UNAUTHORIZED] = {401, "unauthorized", 0},
    [API_FORBIDDEN] = {403, "forbidden", 0},
    [API_RATE_LIMITED] = {429, "rate_limited", 0},
    [API_TOKEN_BUDGET] = {429, "token_budget_exceeded", 0},
    /* for good: a retry cannot succeed, the namespace created again under
     * the name is another incarnation (docs/namespaces.md) */
    [API_NAMESPACE_DELETED] = {410, "namespace_deleted", 0},
    [API_CONFIRMATION_REQUIRED] = {400, "confirmation_required", 0},
    /* the request is valid; this model lacks what it needs: the message
     * names the command that measures it (docs/dyneval.md) */
    [API_DYNEVAL_UNAVAILABLE] = {400, "dyneval_unavailable", 0},
};

unsigned proto_http_status(api_error e)
{
    return (unsigned)e < API_ERROR_COUNT ? api_errors[e].status : 500;
}

const char *proto_error_code(api_error e)
{
    return (unsigned)e < API_ERROR_COUNT ? api_errors[e].code : "internal";
}

unsigned proto_retry_after(api_error e)
{
    return (unsigned)e < API_ERROR_COUNT ? api_errors[e].retry_after : 0;
}

int proto_fail(api_status *st, api_error e, const char *fmt, ...)
{
    if (st) {
        st->code = e;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->message, sizeof st->message, fmt, ap);
        va_end(ap);
    }
    return -1;
}

char *proto_dump(const json_t *json, size_t *len)
{
    char *s = json_dumps(json, JSON_COMPACT | JSON_REAL_PRECISION(12));
    size_t n = s ? strlen(s) : 0;
    char *t = s ? realloc(s, n + 2) : NULL;
    if (!t) {
        free(s);
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = 0;
    if (len)
        *len = n + 1;
    return t;
}

/* A JSON string as jansson's dump writes it (no flags): '"' and '\\'
 * escaped, the C escapes, other control characters as \\u00XX, the rest
 * (UTF-8) as it is. */
static void put_json_string(nc_buf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";   /* jansson: "\\u%04X" */
    buf_append(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        buf_append(b, run, (size_t)(s - run));
        run = s + 1;
        char e[6] = {'\\', 0};
        size_t n = 2;
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            memcpy(e + 1, "u00", 3);
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            n = 6;
        }
        buf_append(b, e, n);
    }
    buf_append(b, run, (size_t)(s - run));
    buf_append(b, "\"", 1);
}

/* A real as proto_dump writes it: jansson's "%.12g" (JSON_REAL_PRECISION(12)),
 * ".0" added to an integral value, the exponent without '+' or leading
 * zeros (jsonp_dtostr). v is finite (json_real refuses the others). */
static void put_json_real(nc_buf *b, double v)
{
    char t[40];
    int n = snprintf(t, sizeof t, "%.12g", v);
    if (n < 0 || (size_t)n >= sizeof t - 3)
        return;
    char *e = strchr(t, 'e');
    if (!e && !strchr(t, '.')) {
        memcpy(t + n, ".0", 3);
        n += 2;
    }
    if (e) {
        char *start = e + 1, *end = start + 1;
        if (*start == '-')
            start++;
        while (*end == '0')
            end++;
        if (end != start) {
            memmove(start, end, (size_t)(t + n - end) + 1);
            n -= (int)(end - start);
        }
    }
    buf_append(b, t, (size_t)n);
}

char *proto_predict_body(const proto_prediction *pred, size_t k, long long vocab_size, long long position,
                         long long consumed, size_t *len)
{
    nc_buf b = NC_BUF_INIT;
    buf_reserve(&b, 64 + k * 64);
    buf_append(&b, "{\"predictions\":[", 16);
    bool first = true;
    for (size_t i = 0; i < k; i++) {
        if (u8_check((const uint8_t *)pred[i].word, strlen(pred[i].word)))
            continue;
        buf_append(&b, first ? "{\"word\":" : ",{\"word\":", first ? 8 : 9);
        first = false;
        put_json_string(&b, pred[i].word);
        buf_printf(&b, ",\"id\":%d,\"prob\":", pred[i].id);
        put_json_real(&b, pred[i].prob);
        buf_append(&b, "}", 1);
    }
    buf_printf(&b, "],\"vocab_size\":%lld,\"position\":%lld", vocab_size, position);
    if (consumed >= 0)
        buf_printf(&b, ",\"consumed\":%lld", consumed);
    buf_append(&b, "}\n", 2);
    if (b.oom) {
        buf_free(&b);
        return NULL;
    }
    return buf_detach(&b, len);
}

json_t *proto_error_body(api_error e, const char *message)
{
    /* Messages quote the request (a bad escape, a session id from the URL),
     * which may not be UTF-8: json_pack would refuse it and the answer would
     * lose its body. Such bytes become U+FFFD (found by fuzz_proto). */
    const char *msg = message ? message : "";
    char *clean = NULL;
    if (u8_check((const uint8_t *)msg, strlen(msg))) {
        size_t n = strlen(msg);
        clean = malloc(3 * n + 1);
        if (!clean)
            return NULL;
        size_t o = 0;
        for (size_t i = 0; i < n;) {
            ucs4_t uc;
            int k = u8_mbtoucr(&uc, (const uint8_t *)msg + i, n - i);
            if (k > 0) {
                memcpy(clean + o, msg + i, (size_t)k);
                o += (size_t)k;
                i += (size_t)k;
            } else {
                memcpy(clean + o, "\xef\xbf\xbd", 3);
                o += 3;
                i++;
            }
        }
        clean[o] = 0;
        msg = clean;
    }
    json_t *j = json_pack("{s:{s:s,s:s}}", "error", "code", proto_error_code(e), "message", msg);
    free(clean);
    return j;
}

json_t *proto_parse_body(const char *body, size_t len, bool allow_empty, api_status *st)
{
    if (len == 0) {
        if (allow_empty)
            return json_object();
        proto_fail(st, API_INVALID_JSON, "request body is empty, a JSON object is expected");
        return NULL;
    }
    json_error_t jerr;
    json_t *j = json_loadb(body, len, 0, &jerr);
    if (!j) {
        /* jansson reports invalid UTF-8 as its own error kind. */
        if (json_error_code(&jerr) == json_error_invalid_utf8 || strstr(jerr.text, "UTF-8"))
            proto_fail(st, API_INVALID_UTF8, "request body is not valid UTF-8 (byte %d)", jerr.position);
        else
            proto_fail(st, API_INVALID_JSON, "malformed JSON at line %d column %d: %s",
                       jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        proto_fail(st, API_INVALID_TYPE, "request body must be a JSON object");
        return NULL;
    }
    return j;
}

/* unknown_field for key, naming the nearest field of allowed; a body with a
 * "cache" object also offers the knob names, which belong inside it. */
static int unknown_field(api_status *st, const char *key, const char *const *allowed)
{
    nc_suggest s;
    suggest_init(&s, key);
    bool has_cache = false;
    for (const char *const *a = allowed; *a; a++) {
        suggest_offer(&s, *a);
        has_cache = has_cache || !strcmp(*a, "cache");
    }
    const char *near = suggest_best(&s);
    if (near)
        return proto_fail(st, API_UNKNOWN_FIELD, "unknown field '%s' (did you mean '%s'?)", key, near);
    const char *knob = has_cache ? cache_knob_suggest(key, false) : NULL;
    if (knob)
        return proto_fail(st, API_UNKNOWN_FIELD,
                          "unknown field '%s' (did you mean \"cache\": {\"%s\": ...}? knobs go in the cache object)",
                          key, knob);
    return proto_fail(st, API_UNKNOWN_FIELD, "unknown field '%s'", key);
}

int proto_check_keys(const json_t *obj, const char *const *allowed, api_status *st)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0) { ok = 1; break; }
        if (!ok)
            return unknown_field(st, key, allowed);
    }
    return 0;
}

static const json_t *field(const json_t *obj, const char *key)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    return (v && !json_is_null(v)) ? v : NULL;
}

int proto_get_int(const json_t *obj, const char *key, long min, long max, long def,
                  long *out, api_status *st)
{
    const json_t *v = field(obj, key);
    if (!v) { *out = def; return 0; }
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);   /* 10.0 is an integer too */
    } else {
        return proto_fail(st, API_INVALID_TYPE, "field '%s' must be an integer", key);
    }
    if (x < min || x > max)
        return proto_fail(st, API_OUT_OF_RANGE, "field '%s' = %lld is outside [%ld, %ld]", key, x, min, max);
    *out = (long)x;
    return 0;
}

int proto_get_double(const json_t *obj, const char *key, double min, double max, double def,
                     double *out, api_status *st)
{
    const json_t *v = field(obj, key);
    if (!v) { *out = def; return 0; }
    if (!json_is_number(v))
        return proto_fail(st, API_INVALID_TYPE, "field '%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < min || x > max)
        return proto_fail(st, API_OUT_OF_RANGE, "field '%s' = %g is outside [%g, %g]", key, x, min, max);
    *out = x;
    return 0;
}

int proto_get_bool(const json_t *obj, const char *key, bool def, bool *out, api_status *st)
{
    const json_t *v = field(obj, key);
    if (!v) { *out = def; return 0; }
    if (!json_is_boolean(v))
        return proto_fail(st, API_INVALID_TYPE, "field '%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

int proto_get_string(const json_t *obj, const char *key, bool required, const char **out,
                     size_t *len, api_status *st)
{
    const json_t *v = field(obj, key);
    *out = NULL;
    if (len) *len = 0;
    if (!v) {
        if (required)
            return proto_fail(st, API_MISSING_FIELD, "field '%s' is required", key);
        return 0;
    }
    if (!json_is_string(v))
        return proto_fail(st, API_INVALID_TYPE, "field '%s' must be a string", key);
    *out = json_string_value(v);
    if (len) *len = json_string_length(v);
    if (memchr(*out, 0, json_string_length(v)))
        return proto_fail(st, API_INVALID_TEXT, "field '%s' contains a NUL character", key);
    return 0;
}

/* The "cache" object: one field per row of the knob table (cache_knobs.h);
 * JSON types are checked here, values and bounds by the table's setter, so
 * a bad value gets the same message as on the command line or in the
 * config file. */
int proto_decode_cache(const json_t *obj, const nc_cache_params *defaults,
                       nc_cache_params *out, api_status *st)
{
    *out = *defaults;
    if (!obj || json_is_null(obj))
        return 0;
    if (!json_is_object(obj))
        return proto_fail(st, API_INVALID_TYPE, "field 'cache' must be an object");
    const char *key;
    json_t *v;
    char err[NC_ERRLEN] = "";
    json_object_foreach((json_t *)obj, key, v) {
        const nc_cache_knob *k = cache_knob_find(key);
        if (!k) {
            /* the nearest knob; a command-line option (theta, neural-cache) names its knob */
            const nc_cache_knob *byflag = cache_knob_by_flag(key);
            const char *near = byflag ? byflag->name : cache_knob_suggest(key, false);
            if (near)
                return proto_fail(st, API_UNKNOWN_FIELD, "unknown field '%s' (did you mean '%s'?)", key, near);
            return proto_fail(st, API_UNKNOWN_FIELD, "unknown field '%s'", key);
        }
        if (json_is_null(v))
            continue;
        int rc;
        switch (k->type) {
        case NC_KNOB_BOOL:
            if (!json_is_boolean(v))
                return proto_fail(st, API_INVALID_TYPE, "field '%s' must be a boolean", key);
            rc = cache_knob_set_number(out, k, json_is_true(v), err, sizeof err);
            break;
        case NC_KNOB_KERNEL:
            if (!json_is_string(v))
                return proto_fail(st, API_INVALID_TYPE, "field '%s' must be a string", key);
            rc = cache_knob_set_text(out, k, json_string_value(v), err, sizeof err);
            break;
        default:
            if (!json_is_number(v) || (k->type == NC_KNOB_INT && !json_is_integer(v) &&
                                       json_real_value(v) != floor(json_real_value(v))))
                return proto_fail(st, API_INVALID_TYPE, "field '%s' must be %s", key,
                                  k->type == NC_KNOB_INT ? "an integer" : "a number");
            rc = cache_knob_set_number(out, k, json_number_value(v), err, sizeof err);
        }
        if (rc != NC_OK)
            return proto_fail(st, API_OUT_OF_RANGE, "%s", err);
    }
    if (cache_params_validate(out, err, sizeof err) != 0)
        return proto_fail(st, API_OUT_OF_RANGE, "%s", err);
    return 0;
}

/* A float setting as the shortest decimal that reads back to it (0.1, not
 * 0.10000000149011612). */
static double short_float(float f)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", (double)f);
    return strtod(buf, NULL);
}

static json_t *knob_value(const nc_cache_knob *k, double v)
{
    switch (k->type) {
    case NC_KNOB_INT: return json_integer((json_int_t)v);
    case NC_KNOB_BOOL: return json_boolean(v != 0);
    case NC_KNOB_KERNEL: return json_string(cache_kernel_name((int)v));
    default: return json_real(short_float((float)v));
    }
}

json_t *proto_logprob(double lp)
{
    if (isnan(lp))
        return json_null();
    if (isinf(lp))
        return json_real(-1e30);
    return json_real(lp);
}

json_t *proto_encode_cache(const nc_cache_params *p)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    json_t *o = json_object();
    for (size_t i = 0; o && i < n; i++)
        json_object_set_new(o, k[i].name, knob_value(&k[i], cache_knob_get(p, &k[i])));
    return o;
}

json_t *proto_encode_cache_knobs(void)
{
    static const char *const types[] = {[NC_KNOB_INT] = "integer", [NC_KNOB_FLOAT] = "number",
                                        [NC_KNOB_FLOAT_BELOW_MAX] = "number", [NC_KNOB_BOOL] = "boolean",
                                        [NC_KNOB_KERNEL] = "string"};
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    nc_cache_params def;
    cache_params_default(&def);
    json_t *all = json_object();
    for (size_t i = 0; all && i < n; i++) {
        json_t *o = json_pack("{s:s,s:s,s:o,s:s}", "flag", k[i].flag, "type", types[k[i].type], "default",
                              knob_value(&k[i], cache_knob_get(&def, &k[i])), "description", k[i].doc);
        if (o && (k[i].type == NC_KNOB_INT || k[i].type == NC_KNOB_FLOAT || k[i].type == NC_KNOB_FLOAT_BELOW_MAX)) {
            bool whole = k[i].type == NC_KNOB_INT;
            json_object_set_new(o, "minimum", whole ? json_integer((json_int_t)k[i].min) : json_real(k[i].min));
            json_object_set_new(o, "maximum", whole ? json_integer((json_int_t)k[i].max) : json_real(k[i].max));
            if (k[i].type == NC_KNOB_FLOAT_BELOW_MAX)
                json_object_set_new(o, "exclusive_maximum", json_true());
        }
        if (o && k[i].alias)
            json_object_set_new(o, "alias", json_string(k[i].alias));
        if (o && k[i].type == NC_KNOB_KERNEL)
            json_object_set_new(o, "enum", json_pack("[s,s]", cache_kernel_name(0), cache_kernel_name(1)));
        json_object_set_new(all, k[i].name, o);
    }
    return all;
}

int proto_decode_predict(const json_t *body, long max_top_k, proto_predict_req *r, api_status *st)
{
    static const char *const keys[] = {"top_k", "full", "components", "explain", "text", "normalize", NULL};
    if (proto_check_keys(body, keys, st)) return -1;
    if (proto_get_int(body, "top_k", 1, max_top_k, 10, &r->top_k, st)) return -1;
    if (proto_get_string(body, "text", false, &r->text, &r->len, st)) return -1;
    if (proto_get_bool(body, "normalize", true, &r->normalize, st)) return -1;
    if (proto_get_bool(body, "full", false, &r->full, st)) return -1;
    if (proto_get_bool(body, "components", false, &r->components, st)) return -1;
    if (proto_get_bool(body, "explain", false, &r->explain, st)) return -1;
    return 0;
}

int proto_decode_feed(const json_t *body, proto_feed_req *r, api_status *st)
{
    static const char *const keys[] = {"text", "scores", "adapt", "components", "normalize", NULL};
    if (proto_check_keys(body, keys, st)) return -1;
    if (proto_get_bool(body, "normalize", true, &r->normalize, st)) return -1;
    if (proto_get_string(body, "text", true, &r->text, &r->len, st)) return -1;
    if (proto_get_bool(body, "scores", false, &r->scores, st)) return -1;
    if (proto_get_bool(body, "adapt", false, &r->adapt, st)) return -1;
    if (proto_get_bool(body, "components", false, &r->components, st)) return -1;
    if (r->components && r->adapt)
        return proto_fail(st, API_OUT_OF_RANGE, "field 'components' cannot be combined with 'adapt'");
    r->scores = r->scores || r->components;
    return 0;
}

/* "bos": "eos" (default: start after one eos token) or "none". */
static int get_bos(const json_t *body, bool *bos_eos, api_status *st)
{
    const char *bos;
    if (proto_get_string(body, "bos", false, &bos, NULL, st)) return -1;
    if (bos && strcmp(bos, "eos") && strcmp(bos, "none"))
        return proto_fail(st, API_OUT_OF_RANGE, "field 'bos' must be \"eos\" or \"none\"");
    *bos_eos = !bos || strcmp(bos, "eos") == 0;
    return 0;
}

int proto_decode_score(const json_t *body, const nc_cache_params *defaults,
                       proto_score_req *r, api_status *st)
{
    static const char *const keys[] = {"text", "cache", "bos", "final_eos", "normalize", NULL};
    if (proto_check_keys(body, keys, st)) return -1;
    if (proto_get_bool(body, "normalize", true, &r->normalize, st)) return -1;
    if (proto_get_string(body, "text", true, &r->text, &r->len, st)) return -1;
    if (proto_decode_cache(json_object_get(body, "cache"), defaults, &r->cache, st)) return -1;
    if (get_bos(body, &r->bos_eos, st)) return -1;
    if (proto_get_bool(body, "final_eos", true, &r->final_eos, st)) return -1;
    return 0;
}

static int valid_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return 0;
    return 1;
}

int proto_decode_session(const json_t *body, const nc_cache_params *defaults,
                         proto_session_req *r, api_status *st)
{
    static const char *const keys[] = {"id", "namespace", "cache", NULL};
    if (proto_check_keys(body, keys, st)) return -1;
    if (proto_get_string(body, "id", false, &r->id, NULL, st)) return -1;
    if (r->id && !valid_id(r->id))
        return proto_fail(st, API_OUT_OF_RANGE, "field 'id' must be 1-63 characters of [A-Za-z0-9_.-]");
    if (proto_get_string(body, "namespace", false, &r->ns, NULL, st)) return -1;
    /* A namespace name becomes a directory under data_dir: "." and ".."
     * (and hidden names) would leave it or collide with its files. */
    if (r->ns && (!valid_id(r->ns) || r->ns[0] == '.' || strstr(r->ns, ".deleted-")))
        return proto_fail(st, API_OUT_OF_RANGE,
                          "field 'namespace' must be 1-63 characters of [A-Za-z0-9_.-], not starting with '.' nor "
                          "holding '.deleted-' (the directories of deleted incarnations)");
    return proto_decode_cache(json_object_get(body, "cache"), defaults, &r->cache, st);
}

/* "stop": absent, null, a string or a list of up to PROTO_MAX_STOP
 * non-empty strings (OpenAI's form; lm-eval sends a list). */
static int decode_stop(const json_t *body, const char **stop, size_t *len, size_t *n, api_status *st)
{
    *n = 0;
    const json_t *v = field(body, "stop");
    if (!v)
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return 0;             /* "" stops nothing */
        stop[0] = json_string_value(v);
        len[0] = json_string_length(v);
        *n = 1;
        return 0;
    }
    if (!json_is_array(v))
        return proto_fail(st, API_INVALID_TYPE, "field 'stop' must be a string or a list of strings");
    if (json_array_size(v) > PROTO_MAX_STOP)
        return proto_fail(st, API_OUT_OF_RANGE, "field 'stop' has %zu sequences, at most %d are allowed",
                          json_array_size(v), PROTO_MAX_STOP);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_string(e))
            return proto_fail(st, API_INVALID_TYPE, "stop sequence %zu must be a string", i);
        if (json_string_length(e) == 0)
            continue;
        stop[*n] = json_string_value(e);
        len[*n] = json_string_length(e);
        (*n)++;
    }
    return 0;
}

static int check_prompt(const json_t *p, int vocab_size, api_status *st)
{
    if (json_is_string(p)) {
        if (memchr(json_string_value(p), 0, json_string_length(p)))
            return proto_fail(st, API_INVALID_TEXT, "prompt contains a NUL character");
        return 0;
    }
    if (!json_is_array(p))
        return proto_fail(st, API_INVALID_TYPE, "prompt must be a string, a list of token ids, or a list of either");
    size_t i;
    json_t *t;
    json_array_foreach(p, i, t) {
        if (!json_is_integer(t))
            return proto_fail(st, API_INVALID_TYPE, "prompt token %zu must be an integer id", i);
        json_int_t id = json_integer_value(t);
        if (id < 0 || id >= vocab_size)
            return proto_fail(st, API_OUT_OF_RANGE, "prompt token %zu = %lld is outside [0, %d)", i,
                              (long long)id, vocab_size);
    }
    return 0;
}

int proto_decode_completions(const json_t *body, int vocab_size, long max_top_k,
                             long max_completion_tokens, proto_completions_req *r,
                             api_status *st)
{
    /* OpenAI's fields this endpoint reads, then those it accepts and
     * ignores: model (one model is served) and user (an end-user id for
     * OpenAI's abuse monitoring); n, best_of, the penalties, logit_bias and
     * suffix only at the values that ask for nothing we lack. Anything else
     * is a misspelling (max_token) and answered as one, rather than ignored. */
    static const char *const keys[] = {"prompt", "max_tokens", "temperature", "top_p", "seed", "logprobs", "echo",
                                       "n", "stream", "stream_options", "allow_unk", "stop", "model", "user",
                                       "best_of", "presence_penalty", "frequency_penalty", "logit_bias", "suffix",
                                       NULL};
    static const char *const stream_keys[] = {"include_usage", NULL};
    memset(r, 0, sizeof *r);
    if (proto_check_keys(body, keys, st)) return -1;
    double unused;
    long one;
    if (proto_get_double(body, "presence_penalty", 0, 0, 0, &unused, st)) return -1;
    if (proto_get_double(body, "frequency_penalty", 0, 0, 0, &unused, st)) return -1;
    if (proto_get_int(body, "best_of", 1, 1, 1, &one, st)) return -1;
    const json_t *lb = field(body, "logit_bias"), *sfx = field(body, "suffix");
    if (lb && (!json_is_object(lb) || json_object_size(lb) > 0))
        return proto_fail(st, API_OUT_OF_RANGE, "field 'logit_bias' is not supported (only {} is accepted)");
    if (sfx && (!json_is_string(sfx) || json_string_length(sfx) > 0))
        return proto_fail(st, API_OUT_OF_RANGE, "field 'suffix' is not supported (only \"\" is accepted)");
    const json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p))
        return proto_fail(st, API_MISSING_FIELD, "field 'prompt' is required");
    /* A list whose first element is a string or a list is a batch. */
    bool batch = json_is_array(p) && json_array_size(p) > 0 &&
                 (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    size_t n = batch ? json_array_size(p) : 1;
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts)
        return proto_fail(st, API_INTERNAL, "out of memory");
    r->n_prompts = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *pi = batch ? json_array_get(p, i) : p;
        if (check_prompt(pi, vocab_size, st))
            return -1;
        r->prompts[i] = pi;
    }
    if (proto_get_int(body, "max_tokens", 0, max_completion_tokens, 16, &r->max_tokens, st)) return -1;
    if (proto_get_double(body, "temperature", 0, 100, 1.0, &r->temperature, st)) return -1;
    if (proto_get_double(body, "top_p", 0, 1, 1.0, &r->top_p, st)) return -1;
    if (r->top_p <= 0 && json_object_get(body, "top_p"))
        return proto_fail(st, API_OUT_OF_RANGE, "field 'top_p' must be in (0, 1]");
    long seed;
    const json_t *s = field(body, "seed");
    if (s) {
        if (proto_get_int(body, "seed", -9007199254740991L, 9007199254740991L, 0, &seed, st)) return -1;
        r->seed = seed;
        r->has_seed = true;
    }
    if (proto_get_int(body, "logprobs", 0, max_top_k, -1, &r->logprobs, st)) return -1;
    if (proto_get_bool(body, "echo", false, &r->echo, st)) return -1;
    long nn;
    if (proto_get_int(body, "n", 1, 1, 1, &nn, st)) return -1;
    if (proto_get_bool(body, "stream", false, &r->stream, st)) return -1;
    const json_t *so = field(body, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return proto_fail(st, API_INVALID_TYPE, "field 'stream_options' must be an object");
        if (proto_check_keys(so, stream_keys, st)) return -1;
        if (proto_get_bool(so, "include_usage", false, &r->include_usage, st)) return -1;
    }
    if (proto_get_bool(body, "allow_unk", false, &r->allow_unk, st)) return -1;
    if (proto_get_bool(body, "normalize", true, &r->normalize, st)) return -1;
    return decode_stop(body, r->stop, r->stop_len, &r->n_stop, st);
}

int proto_decode_generate(const json_t *body, long max_top_k, long max_completion_tokens,
                          proto_generate_req *r, api_status *st)
{
    static const char *const keys[] = {"max_tokens", "temperature", "top_p", "seed", "logprobs", "allow_unk",
                                       "stream", "advance", "stop", NULL};
    memset(r, 0, sizeof *r);
    if (proto_check_keys(body, keys, st)) return -1;
    if (proto_get_int(body, "max_tokens", 1, max_completion_tokens, 16, &r->max_tokens, st)) return -1;
    if (proto_get_double(body, "temperature", 0, 100, 0.0, &r->temperature, st)) return -1;
    if (proto_get_double(body, "top_p", 0, 1, 1.0, &r->top_p, st)) return -1;
    if (r->top_p <= 0 && json_object_get(body, "top_p"))
        return proto_fail(st, API_OUT_OF_RANGE, "field 'top_p' must be in (0, 1]");
    if (field(body, "seed")) {
        long seed;
        if (proto_get_int(body, "seed", -9007199254740991L, 9007199254740991L, 0, &seed, st)) return -1;
        r->seed = seed;
        r->has_seed = true;
    }
    if (proto_get_int(body, "logprobs", 0, max_top_k, -1, &r->logprobs, st)) return -1;
    if (proto_get_bool(body, "allow_unk", false, &r->allow_unk, st)) return -1;
    if (proto_get_bool(body, "stream", false, &r->stream, st)) return -1;
    if (proto_get_bool(body, "advance", true, &r->advance, st)) return -1;
    return decode_stop(body, r->stop, r->stop_len, &r->n_stop, st);
}

int proto_decode_rescore(const json_t *body, bool stateless, const nc_cache_params *defaults,
                         long max_hypotheses, proto_rescore_req *r, api_status *st)
{
    static const char *const keys_s[] = {"hypotheses", "top_k", "normalize", NULL};
    static const char *const keys_l[] = {"context", "hypotheses", "top_k", "cache", "bos", "normalize", NULL};
    memset(r, 0, sizeof *r);
    r->context = "";
    r->bos_eos = true;
    if (proto_check_keys(body, stateless ? keys_l : keys_s, st)) return -1;
    if (proto_get_bool(body, "normalize", true, &r->normalize, st)) return -1;
    const json_t *h = field(body, "hypotheses");
    if (!h)
        return proto_fail(st, API_MISSING_FIELD, "field 'hypotheses' is required");
    if (!json_is_array(h))
        return proto_fail(st, API_INVALID_TYPE, "field 'hypotheses' must be a list of strings");
    size_t n = json_array_size(h);
    if (n == 0 || (long)n > max_hypotheses)
        return proto_fail(st, API_OUT_OF_RANGE, "field 'hypotheses' must hold 1 to %ld strings (got %zu)",
                          max_hypotheses, n);
    r->hyps = calloc(n, sizeof *r->hyps);
    r->hyp_len = calloc(n, sizeof *r->hyp_len);
    if (!r->hyps || !r->hyp_len)
        return proto_fail(st, API_INTERNAL, "out of memory");
    r->n = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(h, i);
        if (!json_is_string(e))
            return proto_fail(st, API_INVALID_TYPE, "hypothesis %zu must be a string", i);
        if (memchr(json_string_value(e), 0, json_string_length(e)))
            return proto_fail(st, API_INVALID_TEXT, "hypothesis %zu contains a NUL character", i);
        r->hyps[i] = json_string_value(e);
        r->hyp_len[i] = json_string_length(e);
    }
    if (proto_get_int(body, "top_k", 1, (long)n, 0, &r->top_k, st)) return -1;
    if (!stateless)
        return 0;
    if (proto_get_string(body, "context", false, &r->context, &r->context_len, st)) return -1;
    if (!r->context) {
        r->context = "";
        r->context_len = 0;
    }
    if (proto_decode_cache(json_object_get(body, "cache"), defaults, &r->cache, st)) return -1;
    if (get_bos(body, &r->bos_eos, st)) return -1;
    return 0;
}

void proto_rescore_free(proto_rescore_req *r)
{
    if (!r) return;
    free(r->hyps);
    free(r->hyp_len);
    r->hyps = NULL;
    r->hyp_len = NULL;
    r->n = 0;
}

void proto_completions_free(proto_completions_req *r)
{
    if (!r) return;
    free(r->prompts);
    r->prompts = NULL;
    r->n_prompts = 0;
}
