/* nswalk.c -- see nswalk.h */
#include "nswalk.h"

#include <stdio.h>
#include <stdlib.h>

#include "rng.h"

char *nswalk_text(int n, uint64_t seed)
{
    char *t = malloc((size_t)n * 5 + 2);
    if (!t)
        abort();
    nc_rng r;
    rng_seed(&r, seed);
    size_t k = 0;
    unsigned w = 0;
    for (int i = 0; i < n; i++) {
        w = rng_uniform(&r) < 0.5 ? (w + 1) % 48 : (unsigned)(rng_uniform(&r) * 48) % 48;
        k += (size_t)sprintf(t + k, "w%u ", w);
    }
    t[k++] = '\n';
    t[k] = 0;
    return t;
}

json_t *nswalk_training(const nc_daemon *d, const char *ns, int64_t *entries)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/namespaces/%s", ns);
    http_resp r;
    json_t *t = NULL;
    if (entries)
        *entries = -1;
    if (http_call(d->port, "GET", path, NULL, NULL, 0, &r) != 0)
        return NULL;
    if (r.status == 200) {
        t = json_incref(json_object_get(json_object_get(r.json, "index"), "training"));
        if (entries)
            *entries = (int64_t)json_integer_value(json_object_get(r.json, "entries"));
    }
    http_resp_free(&r);
    return t;
}

json_t *nswalk_predictions(const nc_daemon *d, const char *ns, const char *knobs)
{
    char create[512];
    snprintf(create, sizeof create,
             "{\"id\":\"probe\",\"namespace\":\"%s\",\"cache\":{\"unbounded\":true,\"unbounded_lambda\":0.5%s}}", ns,
             knobs);
    http_resp r;
    json_t *out = NULL;
    if (http_json(d->port, "POST", "/v1/sessions", create, &r) == 0 && r.status == 201) {
        http_resp_free(&r);
        if (http_json(d->port, "POST", "/v1/sessions/probe/feed", "{\"text\":\"w3 w4 w5 w6 w7 w9\"}", &r) == 0 &&
            r.status == 200) {
            http_resp_free(&r);
            if (http_json(d->port, "POST", "/v1/sessions/probe/predict", "{\"top_k\":20}", &r) == 0 && r.status == 200)
                out = json_incref(json_object_get(r.json, "predictions"));
        }
    }
    http_resp_free(&r);
    if (http_json(d->port, "DELETE", "/v1/sessions/probe", NULL, &r) == 0)
        http_resp_free(&r);
    return out;
}
