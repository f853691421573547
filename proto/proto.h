/* proto.h -- the wire format: API error table, typed JSON field readers with
 * validation, and decoding/encoding of request and response bodies. */
#ifndef NC_PROTO_H
#define NC_PROTO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "cache_params.h"

/* Every API failure, with its HTTP status and wire code in one table
 * (proto.c). */
typedef enum {
    API_OK = 0,
    API_INVALID_JSON,        /* 400 body is not JSON */
    API_INVALID_UTF8,        /* 400 body or text is not UTF-8 */
    API_INVALID_TYPE,        /* 400 a field has the wrong JSON type */
    API_OUT_OF_RANGE,        /* 400 a value is outside its range */
    API_MISSING_FIELD,       /* 400 a required field is absent */
    API_UNKNOWN_FIELD,       /* 400 a field the endpoint does not know */
    API_INVALID_TEXT,        /* 400 text the tokenizer refuses (NUL ...) */
    API_NOT_FOUND,           /* 404 no such route */
    API_SESSION_NOT_FOUND,   /* 404 no such session */
    API_METHOD_NOT_ALLOWED,  /* 405 route exists, method does not */
    API_CONFLICT,            /* 409 id already in use */
    API_BODY_TOO_LARGE,      /* 413 body over max_body_bytes */
    API_TOO_MANY_TOKENS,     /* 413 over max_tokens_per_request */
    API_UNSUPPORTED_MEDIA,   /* 415 body not application/json */
    API_TOO_MANY_SESSIONS,   /* 429 max_sessions reached */
    API_MEMORY_BUDGET,       /* 429 sessions' memory budget reached */
    API_NOT_READY,           /* 503 model not loaded or draining */
    API_INTERNAL,            /* 500 */
    API_SESSION_NOT_HERE,    /* 404 the session id names another replica */
    API_SESSION_MOVED,       /* 503 the session left for another replica: retry */
    API_STATE_CORRUPT,       /* 400 session state blob truncated or bad checksum */
    API_STATE_VERSION,       /* 400 session state blob of an unknown version */
    API_STATE_MODEL,         /* 409 session state blob from another model */
    API_STORAGE_FULL,        /* 507 the write-ahead log could not be written: disk full */
    API_STORAGE_UNAVAILABLE, /* 503 the log could not be written or synced (EIO ...): retry */
    API_OVER_BUDGET,         /* 413 over a work budget (generation steps, neighbours) */
    API_DEADLINE_EXCEEDED,   /* 503 request_timeout reached: the work was stopped */
    API_OVERLOADED,          /* 429 the queue of heavy requests is full: retry */
    API_TOO_MANY_CONNECTIONS,/* 503 max_connections reached: retry */
    API_MALFORMED_REQUEST,   /* 400 not an HTTP request line (TLS to a plain port, garbage) */
    API_UNAUTHORIZED,        /* 401 no API key, or an unknown one */
    API_FORBIDDEN,           /* 403 the key may not do this, or not in this namespace */
    API_RATE_LIMITED,        /* 429 over the key's requests per second */
    API_TOKEN_BUDGET,        /* 429 over the key's tokens per minute */
    API_NAMESPACE_DELETED,   /* 410 the session's namespace incarnation was deleted */
    API_CONFIRMATION_REQUIRED, /* 400 a destructive request without its ?confirm= */
    API_DYNEVAL_UNAVAILABLE, /* 400 dyn_lr > 0 on a model without gradient statistics (dyn-stats) */
    API_ERROR_COUNT
} api_error;

typedef struct {
    api_error code;
    char message[512];
} api_status;

unsigned proto_http_status(api_error e);
const char *proto_error_code(api_error e);     /* "invalid_json", ... */
/* Seconds a client should wait before retrying (the Retry-After header),
 * 0 when the error says nothing about retrying. */
unsigned proto_retry_after(api_error e);

/* Records a failure in st (if non-NULL) and returns -1. */
int proto_fail(api_status *st, api_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The text of a JSON answer: compact, reals to 12 significant digits (0.1
 * stays 0.1, not 0.10000000000000001; far beyond the float precision of
 * probabilities), ending with a newline as every line of text does (curl's
 * output leaves the shell prompt on a line of its own; line tools read one
 * answer as one line). Server-sent events are framed by sse.c instead.
 * malloc'd (free it), *len its length; NULL on ENOMEM. */
char *proto_dump(const json_t *json, size_t *len);

/* One entry of a predict's answer (proto_predict_body). */
typedef struct {
    const char *word;             /* UTF-8; an entry whose word is not is left out, as json_pack leaves it */
    int id;
    double prob;
} proto_prediction;

/* The body of a predict's answer without components or explain,
 * {"predictions":[{"word","id","prob"}...],"vocab_size","position"[,"consumed"]},
 * written straight into one buffer (issue 36: jansson's node a value and
 * its dump cost more than the mixture of a repeated predict): the bytes
 * proto_dump gives for the same object built with json_pack, newline
 * included. consumed < 0: no "consumed". A malloc'ed string (free()) and
 * *len its length, or NULL out of memory. */
char *proto_predict_body(const proto_prediction *pred, size_t k, long long vocab_size, long long position,
                         long long consumed, size_t *len);

/* {"error":{"code":..,"message":..}}; new reference (NULL on ENOMEM). */
json_t *proto_error_body(api_error e, const char *message);

/* Parses a request body. Returns a new reference to an object, or NULL with
 * st set: invalid_json, invalid_utf8 (jansson's own UTF-8 check), or
 * invalid_type when the top level is not an object. An empty body gives an
 * empty object when allow_empty. */
json_t *proto_parse_body(const char *body, size_t len, bool allow_empty, api_status *st);

/* Fails with unknown_field when obj has a key not in allowed (NULL-ended). */
int proto_check_keys(const json_t *obj, const char *const *allowed, api_status *st);

/* Typed readers: absent (or JSON null) -> default; wrong type ->
 * invalid_type; outside [min, max] -> out_of_range. Return 0 or -1. */
int proto_get_int(const json_t *obj, const char *key, long min, long max, long def,
                  long *out, api_status *st);
int proto_get_double(const json_t *obj, const char *key, double min, double max, double def,
                     double *out, api_status *st);
int proto_get_bool(const json_t *obj, const char *key, bool def, bool *out, api_status *st);
/* String field: required -> missing_field when absent; *out borrowed from
 * obj, *len its byte length (the string may hold no NUL: jansson refuses
 * \u0000 by default). */
int proto_get_string(const json_t *obj, const char *key, bool required, const char **out,
                     size_t *len, api_status *st);

/* Cache settings: starts from *defaults and applies the fields present in
 * obj (NULL or null = none), then cache_params_validate. */
int proto_decode_cache(const json_t *obj, const nc_cache_params *defaults,
                       nc_cache_params *out, api_status *st);
/* The settings as a JSON object (new reference). */
/* A log-probability as JSON: NaN (no prediction) is null, -inf is a large
 * negative number (JSON has no infinity). */
json_t *proto_logprob(double lp);
json_t *proto_encode_cache(const nc_cache_params *p);
/* The knob table (core/knobs/cache_knobs.h) as an object keyed by knob name, in
 * the table's order: {"knn": {"flag", "type", "default", "description",
 * "minimum", "maximum"}, ..., "uniform_mu": {..., "exclusive_maximum":
 * true}, "kernel": {..., "enum": [...]}} (new reference): what GET
 * /v1/model shows as "cache_knobs" (forms, clients). */
json_t *proto_encode_cache_knobs(void);

/* Requests of the session endpoints. */
typedef struct {
    long top_k; bool full, components;
    bool explain;            /* cache entries behind each predicted word */
    const char *text; size_t len;   /* "text": fed first (NULL: none), as a feed without adapt */
    bool normalize;          /* "normalize" (default true) of that text */
} proto_predict_req;
int proto_decode_predict(const json_t *body, long max_top_k, proto_predict_req *r, api_status *st);

typedef struct {
    const char *text; size_t len; bool scores;
    bool adapt;              /* also add the pairs to the namespace's unbounded cache */
    bool components;         /* each token's probability split by component (implies scores) */
    bool normalize;          /* "normalize" (default true): text to the model's conventions */
} proto_feed_req;
int proto_decode_feed(const json_t *body, proto_feed_req *r, api_status *st);

typedef struct {
    const char *text; size_t len;
    nc_cache_params cache;
    bool bos_eos;            /* "bos": "eos" (default) or "none" */
    bool final_eos;          /* a last line without newline still ends with eos */
    bool normalize;          /* "normalize" (default true): text to the model's conventions */
} proto_score_req;
int proto_decode_score(const json_t *body, const nc_cache_params *defaults,
                       proto_score_req *r, api_status *st);

typedef struct {
    const char *id;          /* client-chosen id or NULL */
    const char *ns;          /* namespace (next issue) or NULL */
    nc_cache_params cache;
} proto_session_req;
int proto_decode_session(const json_t *body, const nc_cache_params *defaults,
                         proto_session_req *r, api_status *st);

/* Stop sequences a generation request may give ("stop": a string or a
 * list of non-empty strings). */
#define PROTO_MAX_STOP 16

/* OpenAI /v1/completions subset. prompts are borrowed from body: each is a
 * JSON string or an array of token ids (validated against vocab_size). */
typedef struct {
    const json_t **prompts;  /* [n_prompts], malloc'd: free with proto_completions_free */
    size_t n_prompts;
    long max_tokens;
    double temperature, top_p;
    long long seed; bool has_seed;
    long logprobs;           /* -1 = none, else top-N (0 allowed) */
    bool echo;
    bool stream;             /* server-sent events */
    bool include_usage;      /* stream_options.include_usage: usage in a last chunk */
    bool allow_unk;          /* unk_token may be generated */
    const char *stop[PROTO_MAX_STOP];   /* stop sequences, borrowed from body */
    size_t stop_len[PROTO_MAX_STOP];
    size_t n_stop;
    bool normalize;          /* "normalize" (default true): string prompts to the model's conventions */
} proto_completions_req;
int proto_decode_completions(const json_t *body, int vocab_size, long max_top_k,
                             long max_completion_tokens, proto_completions_req *r,
                             api_status *st);
void proto_completions_free(proto_completions_req *r);

/* POST /v1/sessions/{id}/generate: words drawn from the session's state. */
typedef struct {
    long max_tokens;
    double temperature, top_p;
    long long seed; bool has_seed;
    long logprobs;           /* alternatives per word, -1 = none */
    bool allow_unk, stream;
    bool advance;            /* the session advances by the words delivered (default true) */
    const char *stop[PROTO_MAX_STOP];
    size_t stop_len[PROTO_MAX_STOP];
    size_t n_stop;
} proto_generate_req;
int proto_decode_generate(const json_t *body, long max_top_k, long max_completion_tokens,
                          proto_generate_req *r, api_status *st);

/* N-best rescoring: POST /v1/sessions/{id}/rescore {"hypotheses", "top_k"}
 * and POST /v1/rescore {"context", "hypotheses", "top_k", "cache", "bos"}.
 * hyps are borrowed from body. */
typedef struct {
    const char **hyps;       /* [n], malloc'd: free with proto_rescore_free */
    size_t *hyp_len;
    size_t n;
    long top_k;              /* 0 = every hypothesis, in the request's order */
    const char *context; size_t context_len;   /* stateless only ("" when absent) */
    nc_cache_params cache;   /* stateless only */
    bool bos_eos;            /* stateless only */
    bool normalize;          /* "normalize" (default true): hypotheses and context to the model's conventions */
} proto_rescore_req;
/* stateless: the /v1/rescore form (context, cache, bos allowed). */
int proto_decode_rescore(const json_t *body, bool stateless, const nc_cache_params *defaults,
                         long max_hypotheses, proto_rescore_req *r, api_status *st);
void proto_rescore_free(proto_rescore_req *r);

#endif
