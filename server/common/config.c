/* config.c -- option table, INI file (libinih) and command-line flags. */
#include "config.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suggest.h"

#define OFF(f) offsetof(nc_server_config, f)
#define SZ(f) sizeof(((nc_server_config *)0)->f)

/* [cache]: the core's knob table, row for row (bounds and checks are the
 * core's: cache_knob_set_text). */
#define CACHE_ROW(name_, alias_, type_, min_, max_, def_, needs_, doc_) \
    {"cache", #name_, OPT_CACHE_KNOB, OFF(cache), 0, (min_), (max_), NULL, def_, doc_},

/* Every option is one row: the file, the flags, the defaults and the
 * validation all come from here. */
static const config_option options[] = {
    {"server", "bind", OPT_STRING, OFF(bind), SZ(bind), 0, 0, NULL, "127.0.0.1",
     "listen address (IPv4 or IPv6 literal)"},
    {"server", "port", OPT_INT, OFF(port), 0, 0, 65535, NULL, "8080",
     "TCP port; 0 picks a free one (logged as \"listening\" with \"port\")"},
    {"server", "port_file", OPT_STRING, OFF(port_file), SZ(port_file), 0, 0, NULL, "",
     "if set, the bound port is written to this file once listening"},
    {"server", "model", OPT_STRING, OFF(model), SZ(model), 0, 0, NULL, "models/demo",
     "model directory (config.json, vocab.txt, model.safetensors)"},
    {"server", "data_dir", OPT_STRING, OFF(data_dir), SZ(data_dir), 0, 0, NULL, "data",
     "directory for namespaces, snapshots and write-ahead logs"},
    {"server", "threads", OPT_INT, OFF(threads), 0, 0, 256, NULL, "0",
     "workers running heavy requests (score, feed, completions, document uploads) at once; 0 = number of cores"},
    {"server", "worker_nice", OPT_INT, OFF(worker_nice), 0, 0, 19, NULL, "10",
     "nice value of those workers: probes and predicts (nice 0) preempt heavy work"},
    {"server", "max_connections", OPT_INT, OFF(max_connections), 0, 4, 65536, NULL, "512",
     "most open client connections (each has a thread); more are answered 503 too_many_connections and closed"},
    {"server", "connection_timeout", OPT_INT, OFF(connection_timeout_s), 0, 1, 3600, NULL, "15",
     "seconds a connection may stay idle (or take to send its request) before it is closed"},
    {"server", "batch_predict", OPT_BOOL, OFF(batch_predict), 0, 0, 0, NULL, "true",
     "predictions of concurrent sessions share one decoder matrix product"},
    {"server", "batch_threads", OPT_INT, OFF(batch_threads), 0, 0, 256, NULL, "0",
     "threads running predict batches; 0 = number of cores"},
    {"server", "max_batch", OPT_INT, OFF(max_batch), 0, 1, 4096, NULL, "64",
     "most predictions in one batch"},
    {"server", "log_format", OPT_ENUM, OFF(log_format), 0, 0, 0, "json|text", "json",
     "json: one JSON object a line on stderr; text: human-readable"},
    {"server", "log_level", OPT_ENUM, OFF(log_level), 0, 0, 0, "debug|info|warn|error", "info",
     "lowest level logged"},
    {"server", "log_requests", OPT_BOOL, OFF(log_requests), 0, 0, 0, NULL, "false",
     "log one line per request (at info level)"},
    {"server", "drain_timeout", OPT_INT, OFF(drain_timeout_s), 0, 0, 3600, NULL, "30",
     "seconds SIGTERM waits for in-flight requests before exiting"},
    {"server", "replica_tag", OPT_STRING, OFF(replica_tag), SZ(replica_tag), 0, 0, NULL, "",
     "short tag ([a-z0-9], up to 15) put in session ids to route them to this replica"},
    {"server", "peers", OPT_STRING, OFF(peers), SZ(peers), 0, 0, NULL, "",
     "other replicas, tag=http://host:port comma-separated: sessions are pulled from them and handed to them on drain"},
    {"server", "peer_key", OPT_STRING, OFF(peer_key), SZ(peer_key), 0, 0, NULL, "",
     "API key sent to the peers (Bearer) when pulling or handing over sessions; with api_keys, an admin key of theirs"},
    {"server", "drain_grace", OPT_INT, OFF(drain_grace_s), 0, 0, 600, NULL, "0",
     "seconds SIGTERM keeps serving with /ready 503 (load balancer catches up) before handing sessions to peers"},
    {"server", "web", OPT_BOOL, OFF(web), 0, 0, 0, NULL, "true",
     "serve the web page at GET / (static files; its API calls need a key as any client's)"},
    {"server", "malloc_trim", OPT_INT, OFF(malloc_trim_s), 0, 0, 86400, NULL, "10",
     "seconds between returns of malloc's free pages to the kernel (malloc_trim); 0 = never"},
    {"replication", "redis", OPT_STRING, OFF(redis), SZ(redis), 0, 0, NULL, "",
     "Redis host:port whose Streams replicate namespaces between replicas; empty = off"},
    {"replication", "redis_prefix", OPT_STRING, OFF(redis_prefix), SZ(redis_prefix), 0, 0, NULL, "neurocache:",
     "prefix of the Redis keys (streams <prefix>ns:<namespace>, set <prefix>namespaces)"},
    {"replication", "redis_maxlen", OPT_LONG, OFF(redis_maxlen), 0, 0, 1e12, NULL, "0",
     "approximate length cap of each stream (XADD MAXLEN ~); 0 = keep everything (a new replica replays all)"},
    {"limits", "max_body_bytes", OPT_LONG, OFF(max_body_bytes), 0, 64, 1073741824.0, NULL, "8388608",
     "largest request body; larger ones get 413"},
    {"limits", "max_tokens_per_request", OPT_LONG, OFF(max_tokens_per_request), 0, 1, 1e9, NULL, "50000",
     "LSTM steps one request may take: tokens scored or fed, prompt plus generated tokens of all a completion's prompts; more get 413 too_many_tokens"},
    {"limits", "max_generation_steps", OPT_LONG, OFF(max_generation_steps), 0, 1, 1e9, NULL, "2048",
     "full-vocabulary distributions one completion request may compute: prompts x max_tokens (+ prompt tokens with echo and logprobs); more get 413 over_budget"},
    {"limits", "max_neighbours_per_request", OPT_LONG, OFF(max_neighbours_per_request), 0, 1, 1e12, NULL, "16777216",
     "unbounded-cache neighbours one request may search: tokens read with the unbounded cache x its knn; more get 413 over_budget"},
    {"limits", "request_timeout", OPT_INT, OFF(request_timeout_s), 0, 1, 86400, NULL, "30",
     "seconds a request may wait and run; past it its work stops and 503 deadline_exceeded is answered (document uploads excepted)"},
    {"limits", "max_queued", OPT_INT, OFF(max_queued), 0, 0, 100000, NULL, "16",
     "heavy requests waiting for a worker; more get 429 overloaded with Retry-After"},
    {"limits", "max_predict_text_tokens", OPT_INT, OFF(max_predict_text_tokens), 0, 0, 1e6, NULL, "64",
     "most tokens a predict's \"text\" may feed (fed in the predict batch, which waits for them: longer text goes to /feed); more get 413 over_budget. A feed shorter than this many bytes, without adapt or components, runs in its connection's thread instead of queueing for a worker"},
    {"limits", "max_top_k", OPT_INT, OFF(max_top_k), 0, 1, 1e6, NULL, "1000",
     "largest top_k of predict and logprobs of completions"},
    {"limits", "max_completion_tokens", OPT_INT, OFF(max_completion_tokens), 0, 0, 1e6, NULL, "1024",
     "largest max_tokens of /v1/completions"},
    {"sessions", "max_sessions", OPT_INT, OFF(max_sessions), 0, 1, 1e7, NULL, "10000",
     "most sessions alive at once; creating more gets 429"},
    {"sessions", "ttl", OPT_INT, OFF(session_ttl_s), 0, 1, 1e8, NULL, "3600",
     "seconds a session may stay idle before it is evicted"},
    {"sessions", "memory_mb", OPT_LONG, OFF(session_memory_mb), 0, 1, 1e7, NULL, "4096",
     "memory budget of all sessions together (MiB); over it creating gets 429"},
    NC_CACHE_KNOBS(CACHE_ROW)
    {"security", "api_keys", OPT_STRING, OFF(api_keys), SZ(api_keys), 0, 0, NULL, "",
     "API key file (NAME KEY OPERATIONS NAMESPACES [LIMITS] a line, mode 600); empty = no keys"},
    {"security", "allow_root", OPT_BOOL, OFF(allow_root), 0, 0, 0, NULL, "false",
     "start even as root (refused by default); --allow-root alone means true"},
    {"namespaces", "fsync", OPT_ENUM, OFF(fsync_mode), 0, 0, 0, "group|each|none", "group",
     "log fsync before answering adapting requests: group (concurrent requests share one), each (one per request), none (not durable)"},
    {"namespaces", "snapshot_period", OPT_INT, OFF(snapshot_period_s), 0, 0, 1e7, NULL, "300",
     "seconds between snapshots of a changed namespace (one is also taken at shutdown); 0 = only at shutdown"},
    {"namespaces", "index_factory", OPT_STRING, OFF(index_factory), SZ(index_factory), 0, 0, NULL, "",
     "FAISS factory string of the unbounded cache's IVF index; empty = IVF4096,PQ{hidden/16} for the indexes a namespace trains (or the model's unbounded.faiss)"},
    {"namespaces", "index_switch_at", OPT_LONG, OFF(index_switch_at), 0, 1, 1e12, NULL, "65536",
     "pairs at which a namespace moves from the exact flat index to the IVF index"},
    {"namespaces", "index_train_self", OPT_BOOL, OFF(index_train_self), 0, 0, 0, NULL, "false",
     "with index_own_training false and no trained unbounded.faiss in the model directory, train the index_factory index on the namespace's pairs at the switch (else stay exact)"},
    {"namespaces", "index_own_training", OPT_BOOL, OFF(index_own_training), 0, 0, 0, NULL, "true",
     "each namespace with keys trains its own IVF index on its pairs at index_switch_at and re-trains it in the background each time it has grown 4x (false: the model's unbounded.faiss, or index_train_self)"},
    {"namespaces", "index_recall_target", OPT_DOUBLE, OFF(index_recall_target), 0, 0.01, 1, NULL, "0.9",
     "at each training, the default nprobe is the least whose measured recall (the 32 exact nearest among the 1024 found, on held-out keys) meets this"},
    {NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, NULL},
};

const config_option *config_options(void)
{
    return options;
}

int config_get_integer(const nc_server_config *c, const config_option *o, long long *out)
{
    const char *p = (const char *)c + o->offset;
    switch (o->type) {
    case OPT_INT: *out = *(const int *)p; return 0;
    case OPT_LONG: *out = *(const long *)p; return 0;
    default: return -1;
    }
}

static const config_option *find(const char *name)
{
    for (const config_option *o = options; o->name; o++)
        if (strcmp(o->name, name) == 0)
            return o;
    return NULL;
}

static int set_option(nc_server_config *c, const config_option *o, const char *value,
                      char *err, size_t errlen)
{
    char *p = (char *)c + o->offset, *end;
    errno = 0;
    switch (o->type) {
    case OPT_INT:
    case OPT_LONG: {
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end || v < o->min || v > o->max) {
            snprintf(err, errlen, "option '%s': '%s' is not an integer in [%.0f, %.0f]",
                     o->name, value, o->min, o->max);
            return -1;
        }
        if (o->type == OPT_INT) *(int *)p = (int)v;
        else *(long *)p = (long)v;
        return 0;
    }
    case OPT_DOUBLE: {
        double v = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(v) || v < o->min || v > o->max) {
            snprintf(err, errlen, "option '%s': '%s' is not a number in [%g, %g]",
                     o->name, value, o->min, o->max);
            return -1;
        }
        *(double *)p = v;
        return 0;
    }
    case OPT_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on") || !strcmp(value, "1"))
            *(bool *)p = true;
        else if (!strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "off") || !strcmp(value, "0"))
            *(bool *)p = false;
        else {
            snprintf(err, errlen, "option '%s': '%s' is not a boolean (true|false)", o->name, value);
            return -1;
        }
        return 0;
    case OPT_STRING:
        if (strlen(value) >= o->size) {
            snprintf(err, errlen, "option '%s': value longer than %zu bytes", o->name, o->size - 1);
            return -1;
        }
        if (strcmp(o->name, "replica_tag") == 0)
            for (const char *q = value; *q; q++)
                if (!((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9'))) {
                    snprintf(err, errlen, "option '%s': '%s' must be [a-z0-9]*", o->name, value);
                    return -1;
                }
        memcpy(p, value, strlen(value) + 1);
        return 0;
    case OPT_CACHE_KNOB: {
        char msg[NC_ERRLEN];
        if (cache_knob_set_text(&c->cache, cache_knob_find(o->name), value, msg, sizeof msg) != NC_OK) {
            snprintf(err, errlen, "%s", msg);
            return -1;
        }
        return 0;
    }
    case OPT_ENUM: {
        size_t vlen = strlen(value);
        int idx = 0;
        for (const char *e = o->enums; *e; idx++) {
            const char *bar = strchr(e, '|');
            size_t n = bar ? (size_t)(bar - e) : strlen(e);
            if (n == vlen && strncmp(e, value, n) == 0) {
                *(int *)p = idx;
                return 0;
            }
            e += n + (bar ? 1 : 0);
        }
        snprintf(err, errlen, "option '%s': '%s' is not one of %s", o->name, value, o->enums);
        return -1;
    }
    }
    return -1;
}

void config_defaults(nc_server_config *c)
{
    char err[256];
    memset(c, 0, sizeof *c);
    for (const config_option *o = options; o->name; o++)
        if (set_option(c, o, o->defval, err, sizeof err) != 0)
            abort(); /* a bad default in the table is a programming error */
}

/* " (did you mean 'neural_size'?)" for the option nearest to name (in
 * section, when given, which a file's key must match), written as a flag
 * (--neural-size) or a key; "" when none is near. */
static const char *did_you_mean(const char *name, const char *section, bool as_flag, char *buf, size_t len)
{
    nc_suggest s;
    suggest_init(&s, name);
    for (const config_option *o = options; o->name; o++)
        if (!section || !strcmp(o->section, section))
            suggest_offer(&s, o->name);
    const char *best = suggest_best(&s);
    buf[0] = 0;
    if (best && as_flag) {
        char flag[64];
        snprintf(flag, sizeof flag, "%s", best);
        for (char *q = flag; *q; q++)
            if (*q == '_') *q = '-';
        snprintf(buf, len, " (did you mean '--%s'?)", flag);
    } else if (best) {
        snprintf(buf, len, " (did you mean '%s'?)", best);
    }
    return buf;
}

/* A command-line flag's unknown-option message: the flag as typed
 * (--neural-sise), the nearest flag. */
static int unknown_flag(const char *name, char *err, size_t errlen)
{
    char flag[64], dym[96];
    snprintf(flag, sizeof flag, "%s", name);
    for (char *q = flag; *q; q++)
        if (*q == '_') *q = '-';
    snprintf(err, errlen, "unknown option '--%s'%s; see 'neurocached --help'", flag,
             did_you_mean(name, NULL, true, dym, sizeof dym));
    return -1;
}

int config_set(nc_server_config *c, const char *name, const char *value, char *err, size_t errlen)
{
    const config_option *o = find(name);
    if (!o) {
        char dym[96];
        snprintf(err, errlen, "unknown option '%s'%s", name, did_you_mean(name, NULL, false, dym, sizeof dym));
        return -1;
    }
    return set_option(c, o, value, err, errlen);
}

typedef struct {
    nc_server_config *c;
    char *err;
    size_t errlen;
    int failed;
} ini_ctx;

static int on_ini_entry(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *x = user;
    if (x->failed)
        return 0;
    const config_option *o = find(name);
    if (!o || strcmp(o->section, section) != 0) {
        char dym[96] = "";
        if (o)   /* a known key in another section: say which */
            snprintf(dym, sizeof dym, " ('%s' belongs in [%s])", name, o->section);
        else
            did_you_mean(name, section, false, dym, sizeof dym);
        snprintf(x->err, x->errlen, "unknown option '%s' in section [%s]%s", name, section, dym);
        x->failed = 1;
        return 0;
    }
    if (set_option(x->c, o, value, x->err, x->errlen) != 0) {
        x->failed = 1;
        return 0;
    }
    return 1;
}

int config_load_file(nc_server_config *c, const char *path, char *err, size_t errlen)
{
    ini_ctx x = {c, err, errlen, 0};
    int rc = ini_parse(path, on_ini_entry, &x);
    if (rc == -1) {
        snprintf(err, errlen, "config file '%s': cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (x.failed) {
        size_t n = strlen(err);
        char tmp[512];
        snprintf(tmp, sizeof tmp, "config file '%s': %.*s", path, (int)n, err);
        snprintf(err, errlen, "%s", tmp);
        return -1;
    }
    if (rc != 0) {
        snprintf(err, errlen, "config file '%s': syntax error on line %d", path, rc);
        return -1;
    }
    return 0;
}

void config_usage(FILE *f)
{
    fprintf(f, "usage: neurocached [--config FILE] [--OPTION VALUE ...]\n\noptions (flags override the file):\n");
    for (const config_option *o = options; o->name; o++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", o->name);
        for (char *q = flag; *q; q++)
            if (*q == '_') *q = '-';
        fprintf(f, "  %-26s %s (default \"%s\")\n", flag, o->help, o->defval);
    }
}

/* Flag name to option name: strip "--", '-' -> '_'. */
static void flag_to_name(const char *flag, size_t n, char *name, size_t cap)
{
    size_t i;
    for (i = 0; i < n && i + 1 < cap; i++)
        name[i] = flag[i] == '-' ? '_' : flag[i];
    name[i] = 0;
}

int config_from_args(nc_server_config *c, int argc, char **argv, char *err, size_t errlen)
{
    /* --config first, so every other flag overrides the file. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        const char *cfg = NULL;
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "option '--config' needs a value; see 'neurocached --help'");
                return -1;
            }
            cfg = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            cfg = argv[i] + 9;
        }
        if (cfg && config_load_file(c, cfg, err, errlen) != 0)
            return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (options are --name value); see 'neurocached --help'", a);
            return -1;
        }
        a += 2;
        const char *eq = strchr(a, '=');
        char name[64];
        flag_to_name(a, eq ? (size_t)(eq - a) : strlen(a), name, sizeof name);
        const char *value;
        const config_option *bo = find(name);
        if (!bo && strcmp(name, "config") != 0)
            return unknown_flag(name, err, errlen);
        if (eq) {
            value = eq + 1;
        } else if (bo && bo->type == OPT_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            value = "true";            /* a boolean flag alone (--allow-root) means true */
        } else {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "option '--%.*s' needs a value; see 'neurocached --help'",
                         (int)(eq ? (size_t)(eq - a) : strlen(a)), a);
                return -1;
            }
            value = argv[++i];
        }
        if (strcmp(name, "config") == 0)
            continue;
        if (config_set(c, name, value, err, errlen) != 0)
            return -1;
    }
    return 0;
}
