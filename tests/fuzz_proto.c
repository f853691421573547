/* fuzz_proto.c -- libFuzzer harness for the wire format (proto/): the input
 * is a request body; it goes through proto_parse_body and then through every
 * request decoder, as the daemon would for each endpoint. A decoder may
 * refuse the body (4xx) but must not crash, leak or read out of bounds, and
 * what it accepts must be in range (checked here with abort()). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

static void fproto_check_status(const api_status *st)
{
    /* Every refusal maps to a 4xx with a wire code and a message. */
    unsigned http = proto_http_status(st->code);
    if (st->code == API_OK || http < 400 || http >= 500 || !proto_error_code(st->code)[0] || !st->message[0])
        abort();
    json_t *e = proto_error_body(st->code, st->message);
    if (!e)
        abort();
    char *s = json_dumps(e, JSON_COMPACT);
    free(s);
    json_decref(e);
}

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    nc_cache_params defaults;
    cache_params_default(&defaults);
    api_status st;
    bool allow_empty = size > 0 && (data[0] & 1);
    json_t *body = proto_parse_body((const char *)data, size, allow_empty, &st);
    if (!body) {
        fproto_check_status(&st);
        return 0;
    }
    if (!json_is_object(body))
        abort();

    proto_predict_req pr;
    if (proto_decode_predict(body, 1000, &pr, &st) == 0) {
        if (pr.top_k < 1 || pr.top_k > 1000)
            abort();
    } else {
        fproto_check_status(&st);
    }

    proto_feed_req fr;
    if (proto_decode_feed(body, &fr, &st) == 0) {
        if (!fr.text || memchr(fr.text, 0, fr.len))
            abort();
    } else {
        fproto_check_status(&st);
    }

    proto_score_req sr;
    if (proto_decode_score(body, &defaults, &sr, &st) == 0) {
        char err[256];
        if (!sr.text || cache_params_validate(&sr.cache, err, sizeof err) != 0)
            abort();
        json_t *enc = proto_encode_cache(&sr.cache);
        nc_cache_params back;
        /* What is encoded decodes again. */
        if (!enc || proto_decode_cache(enc, &defaults, &back, &st) != 0)
            abort();
        json_decref(enc);
    } else {
        fproto_check_status(&st);
    }

    proto_session_req ser;
    if (proto_decode_session(body, &defaults, &ser, &st) == 0) {
        if (ser.id && (strlen(ser.id) == 0 || strlen(ser.id) > 63 || strpbrk(ser.id, "/\\ ")))
            abort();
        if (ser.ns && (strlen(ser.ns) == 0 || strlen(ser.ns) > 63 || strpbrk(ser.ns, "/\\ ") || ser.ns[0] == '.'))
            abort();
    } else {
        fproto_check_status(&st);
    }

    proto_completions_req cr;
    if (proto_decode_completions(body, 50, 20, 64, &cr, &st) == 0) {
        if (cr.n_prompts == 0 || cr.max_tokens < 0 || cr.max_tokens > 64 || cr.logprobs > 20)
            abort();
        for (size_t i = 0; i < cr.n_prompts; i++) {
            const json_t *p = cr.prompts[i];
            if (json_is_array(p)) {
                size_t j;
                json_t *t;
                json_array_foreach(p, j, t)
                    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= 50)
                        abort();
            } else if (!json_is_string(p)) {
                abort();
            }
        }
    } else {
        fproto_check_status(&st);
    }
    proto_completions_free(&cr);

    /* The field readers on arbitrary keys of the body. */
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v) {
        long l;
        double d;
        bool b;
        const char *s;
        size_t len;
        (void)proto_get_int(body, key, -5, 5, 0, &l, NULL);
        (void)proto_get_double(body, key, -1, 1, 0, &d, NULL);
        (void)proto_get_bool(body, key, false, &b, NULL);
        (void)proto_get_string(body, key, true, &s, &len, NULL);
    }
    json_decref(body);
    return 0;
}
