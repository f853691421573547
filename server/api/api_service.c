/* api_service.c -- the daemon's own endpoints (api_service.h): health,
 * readiness, metrics, the model, replication's status. */
#include "api_service.h"

#include <string.h>

#include "apiutil.h"
#include "components.h"
#include "compute.h"
#include "dyneval.h"
#include "memstats.h"
#include "metrics.h"
#include "namespaces.h"
#include "replication.h"
#include "vmath.h"
#include "workguard.h"

void api_h_health(nc_server *srv, http_request *req, http_response *resp)
{
    (void)srv, (void)req;
    http_reply_json(resp, 200, json_pack("{s:s}", "status", "ok"));
}

void api_h_ready(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    if (atomic_load(&srv->draining))
        http_reply_error(resp, API_NOT_READY, "draining: the server is shutting down");
    else if (!atomic_load(&srv->ready))
        http_reply_error(resp, API_NOT_READY, "loading the model and recovering namespaces");
    else
        http_reply_json(resp, 200, json_pack("{s:s}", "status", "ready"));
}

void api_h_metrics(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    long n = 0;
    size_t bytes = 0;
    if (srv->sessions)
        sessions_stats(srv->sessions, &n, &bytes);
    /* the memory gauges last: they count the series of all the others */
    resp->text = memstats_metrics(workpool_metrics(srv->pool, replication_metrics(srv, namespaces_metrics(
        srv, metrics_render(n, bytes, atomic_load(&srv->ready), atomic_load(&srv->draining))))));
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp->status = 200;
}

/* The mixture's components in its order (core/knobs/component_table.h): each
 * one's name, its knobs and its gate features. */
static json_t *api_components(void)
{
    json_t *a = json_array();
    for (int c = 0; a && c < NC_NCOMP; c++) {
        const nc_component *r = nc_component_rows[c];
        json_t *knobs = json_array(), *feats = json_array();
        for (int i = 0; r->knobs && r->knobs[i]; i++)
            json_array_append_new(knobs, json_string(r->knobs[i]));
        for (int i = 0; r->features && r->features[i]; i++)
            json_array_append_new(feats, json_string(r->features[i]));
        json_array_append_new(a, json_pack("{s:s,s:o,s:o}", "name", r->name, "knobs", knobs, "gate_features", feats));
    }
    return a;
}

void api_h_model(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    const nc_model_config *c = &srv->model->cfg;
    json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:b,s:b,s:s,s:s,s:I}",
                          "name", api_model_name(srv), "directory", srv->cfg.model,
                          "model_type", c->model_type, "vocab_size", c->vocab_size,
                          "embedding_size", c->embedding_size, "hidden_size", c->hidden_size,
                          "num_layers", c->num_layers, "tie_weights", c->tie_weights,
                          "lowercase", c->lowercase, "unk_token", c->unk_token,
                          "eos_token", c->eos_token,
                          "parameters", (json_int_t)model_num_params(srv->model));
    if (o) {
        json_object_set_new(o, "text", api_text_conventions(srv->model));
        json_object_set_new(o, "cache_defaults", proto_encode_cache(&srv->cache_defaults));
        json_object_set_new(o, "cache_knobs", proto_encode_cache_knobs());
        json_object_set_new(o, "components", api_components());
        json_t *dm = json_object();
        for (int sub = NC_DYN_BIAS; dm && sub <= NC_DYN_ALL; sub++) {
            char key[4];
            snprintf(key, sizeof key, "%d", sub);
            json_object_set_new(dm, key, json_integer((json_int_t)dyneval_memory_of(srv->model, sub)));
        }
        json_object_set_new(o, "dyneval", json_pack("{s:b,s:o*}", "statistics", srv->model->dyn_ms != NULL,
                                                     "memory_per_session", dm));
        /* every option of the [limits] section, by its name (config.c's
         * table is where each is defined), then the sessions' */
        json_t *lim = json_object();
        for (const config_option *co = config_options(); lim && co->name; co++) {
            long long v;
            if (!strcmp(co->section, "limits") && config_get_integer(&srv->cfg, co, &v) == 0)
                json_object_set_new(lim, co->name, json_integer((json_int_t)v));
        }
        if (lim) {
            json_object_set_new(lim, "max_sessions", json_integer(srv->cfg.max_sessions));
            json_object_set_new(lim, "session_ttl", json_integer(srv->cfg.session_ttl_s));
            json_object_set_new(lim, "session_memory_bytes", json_integer((json_int_t)srv->cfg.session_memory_mb << 20));
            json_object_set_new(lim, "threads", json_integer(srv->cfg.threads));
        }
        json_object_set_new(o, "limits", lim);
        json_object_set_new(o, "compute",
                            json_pack("{s:s,s:s,s:s,s:s}", "version", NC_VERSION, "simd", vm_isa(),
                                      "simd_supported", vm_isa_supported(), "blas", nc_blas_core()));
    }
    http_reply_json(resp, 200, o);
}

void api_h_models(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    http_reply_json(resp, 200,
                    json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id",
                              api_model_name(srv), "object", "model", "created", (json_int_t)0,
                              "owned_by", "neurocache"));
}

void api_h_replication(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    http_reply_json(resp, 200, replication_status(srv));
}
