/* test_knobs.c -- the cache knob table (core/knobs/cache_knobs.h) is the one
 * definition of every knob's bounds: the command line, a request's JSON and
 * the daemon's config file (file and flags) refuse the same out-of-range
 * value with the same message, and proto/openapi.yaml documents the same
 * bounds. */
#include "harness.h"
#include "daemon.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml.h>

#include "cache_params.h"
#include "cache_knobs.h"
#include "components.h"
#include "suggest.h"

static char model_dir[512];

static int run_capture(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool numeric(const nc_cache_knob *k)
{
    return k->type == NC_KNOB_INT || k->type == NC_KNOB_FLOAT || k->type == NC_KNOB_FLOAT_BELOW_MAX;
}

/* A value just above the knob's range, written the same way to every
 * front end (the text is what each parses). */
static void above(const nc_cache_knob *k, char *buf, size_t len)
{
    if (k->type == NC_KNOB_FLOAT_BELOW_MAX)
        snprintf(buf, len, "%.17g", k->max);              /* the excluded bound itself */
    else if (k->type == NC_KNOB_INT)
        snprintf(buf, len, "%.0f", k->max + 1);
    else
        snprintf(buf, len, "%.17g", k->max * 2 + 1);
}

/* The core's own message for text on knob k (what every front end shows). */
static void core_message(const nc_cache_knob *k, const char *text, char *msg, size_t len)
{
    nc_cache_params p;
    cache_params_default(&p);
    msg[0] = 0;
    CHECKF(cache_knob_set_text(&p, k, text, msg, len) == NC_EINVAL, "%s = %s accepted", k->name, text);
}

TEST(table_defaults_and_bounds)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    CHECK(n == 23);   /* 17 + the gate's two (issue 18) + dynamic evaluation's four (issue 27) */
    nc_cache_params p;
    cache_params_default(&p);
    char err[NC_ERRLEN];
    CHECKF(cache_params_validate(&p, err, sizeof err) == NC_OK, "defaults: %s", err);
    int aliases = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(cache_knob_find(k[i].name) == &k[i]);
        CHECK(cache_knob_by_flag(k[i].flag) == &k[i]);
        /* one name: the option is the JSON/config name with '-' for '_' */
        char dashed[64];
        snprintf(dashed, sizeof dashed, "%s", k[i].name);
        for (char *q = dashed; *q; q++)
            if (*q == '_') *q = '-';
        CHECKF(!strcmp(k[i].flag, dashed), "%s's option is --%s", k[i].name, k[i].flag);
        if (k[i].alias) {
            aliases++;
            CHECK(cache_knob_by_flag(k[i].alias) == &k[i] && strcmp(k[i].alias, k[i].flag) != 0);
        }
        if (!numeric(&k[i]))
            continue;
        nc_cache_params q = p;
        CHECKF(cache_knob_set_number(&q, &k[i], k[i].min, err, sizeof err) == NC_OK, "%s", err);
        CHECK(cache_knob_get(&q, &k[i]) == k[i].min);
        int at_max = cache_knob_set_number(&q, &k[i], k[i].max, err, sizeof err);
        CHECKF((at_max == NC_OK) == (k[i].type != NC_KNOB_FLOAT_BELOW_MAX), "%s at its maximum", k[i].name);
        CHECK(cache_knob_set_number(&q, &k[i], k[i].min - 1, err, sizeof err) == NC_EINVAL);
        CHECK(cache_knob_set_number(&q, &k[i], NAN, err, sizeof err) == NC_EINVAL);
        /* validate reads the same bounds: a value planted past them is refused */
        q = p;
        char *f = (char *)&q + k[i].offset;
        if (k[i].type == NC_KNOB_INT)
            *(int *)f = (int)k[i].min - 1;
        else
            *(float *)f = (float)(k[i].min - 1);
        CHECKF(cache_params_validate(&q, err, sizeof err) == NC_EINVAL && strstr(err, k[i].name),
               "%s below its range passed validation", k[i].name);
    }
    CHECK(aliases == 6);   /* the options renamed by issue 25: unigram-cache neural-cache theta lambda alpha f16-keys */
    CHECK(cache_knob_by_flag("theta") == cache_knob_find("neural_theta"));
    CHECK(cache_knob_by_flag("neural-cache") == cache_knob_find("neural_size"));
    const nc_cache_knob *kn = cache_knob_find("kernel");
    CHECK(cache_knob_set_text(&p, kn, "epanechnikov", err, sizeof err) == NC_OK && p.kernel == NC_KERNEL_EPANECHNIKOV);
    CHECK(cache_knob_set_text(&p, kn, "box", err, sizeof err) == NC_EINVAL);
    CHECK(cache_knob_set_text(&p, cache_knob_find("knn"), "12.5", err, sizeof err) == NC_EINVAL);
    CHECK(cache_knob_set_text(&p, cache_knob_find("unbounded"), "maybe", err, sizeof err) == NC_EINVAL);
}

/* The needs column and the owners (cache_knobs.h): what the CLI's rules,
 * eval's rows and sweeps and tune's static reference are generated from.
 * A knob needs a knob of its own row (or, unowned, an unowned one); the
 * chain ends at a switch; each cache has one switch, and the helpers
 * built on them switch the caches off and on as the rows say. */
TEST(needs_and_owners)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    int switches[NC_NCOMP] = {0};
    for (size_t i = 0; i < n; i++) {
        int hops = 0;
        for (const nc_cache_knob *need = k[i].needs; need; need = need->needs, hops++)
            CHECKF(need->owner == k[i].owner && hops < 4, "%s needs %s of another row", k[i].name, need->name);
        if (k[i].owner >= 0 && !k[i].needs)
            switches[k[i].owner]++;
    }
    for (int c = 0; c < NC_NCOMP; c++)
        CHECKF(!cache_row_remembers(c) || switches[c] == 1, "cache %s has %d switches", nc_comp_names[c], switches[c]);
    CHECK(cache_knob_find("neural_alpha")->needs == cache_knob_find("global_norm"));
    CHECK(cache_knob_find("global_norm")->needs == cache_knob_find("neural_size"));
    CHECK(cache_knob_find("knn")->owner == NC_COMP_UNBOUNDED && cache_knob_find("gate")->owner == -1);
    CHECK(cache_row_remembers(NC_COMP_NEURAL) && cache_row_remembers(NC_COMP_UNBOUNDED));
    CHECK(!cache_row_remembers(NC_COMP_MODEL) && !cache_row_remembers(NC_COMP_UNIFORM));

    nc_cache_params p, q;
    cache_params_default(&p);
    CHECK(cache_params_caches_on(&p) == 0);
    p.neural_size = 100;
    p.global_norm = true;   /* its row is off (the term is the model's), the cache is on */
    p.unigram_size = 50;
    p.open_vocab = true;
    p.neural_theta = 0.7f;
    CHECK(cache_params_caches_on(&p) == ((1u << NC_COMP_NEURAL) | (1u << NC_COMP_UNIGRAM)));
    CHECK(cache_knob_in_effect(&p, cache_knob_find("neural_alpha")));
    CHECK(!cache_knob_in_effect(&p, cache_knob_find("knn")) && !cache_knob_in_effect(&p, cache_knob_find("exact")));
    q = p;
    cache_params_caches_off(&q);
    CHECK(cache_params_caches_on(&q) == 0 && q.open_vocab && !q.global_norm && q.neural_theta == 0.3f);
    cache_params_row_copy(&q, &p, NC_COMP_NEURAL);
    CHECK(cache_params_caches_on(&q) == (1u << NC_COMP_NEURAL) && q.neural_theta == 0.7f && q.global_norm);
    char d[256];
    CHECKF(!strcmp(cache_params_describe(&q, d, sizeof d), "neural-global N=100 theta=0.7 alpha=0 open-vocab mu=0"),
           "%s", d);
}

/* The edit distance behind every "did you mean" (suggest.h): the optimal
 * string alignment distance, values worked by hand. */
TEST(suggestions)
{
    CHECK(suggest_distance("", "") == 0);
    CHECK(suggest_distance("abc", "") == 3);
    CHECK(suggest_distance("kitten", "sitting") == 3);      /* 2 substitutions, 1 insertion */
    CHECK(suggest_distance("neural_sise", "neural_size") == 1);
    CHECK(suggest_distance("max_token", "max_tokens") == 1);
    CHECK(suggest_distance("ab", "ba") == 1);                /* one swap of neighbours */
    CHECK(suggest_distance("ca", "abc") == 3);               /* OSA, not full Damerau (2): no edit of a swapped pair */
    CHECK(suggest_distance("neural-size", "NEURAL_SIZE") == 0);   /* '-' = '_', case folded */
    CHECK(suggest_distance("neural_size", "neural_theta") == 5);
    /* the nearest within the limit, else none */
    CHECK(cache_knob_suggest("neural_sise", false) && !strcmp(cache_knob_suggest("neural_sise", false), "neural_size"));
    CHECK(cache_knob_suggest("neural-sise", true) && !strcmp(cache_knob_suggest("neural-sise", true), "neural-size"));
    /* an older alias answers with the knob's name */
    CHECK(cache_knob_suggest("thetaa", true) && !strcmp(cache_knob_suggest("thetaa", true), "neural-theta"));
    CHECK(cache_knob_suggest("unbounded_lamda", false) &&
          !strcmp(cache_knob_suggest("unbounded_lamda", false), "unbounded_lambda"));
    CHECK(cache_knob_suggest("colour", false) == NULL);
    CHECK(cache_knob_suggest("k", false) == NULL);   /* one letter is near every short name: no guess */
    nc_suggest sg;
    suggest_init(&sg, "txt");
    suggest_offer(&sg, "id");
    suggest_offer(&sg, "text");
    suggest_offer(&sg, "next");
    CHECK(suggest_best(&sg) && !strcmp(suggest_best(&sg), "text"));   /* the first of equals */
    suggest_init(&sg, "temprature");
    suggest_offer(&sg, "temperature");
    suggest_offer(&sg, "top_p");
    CHECK(suggest_best(&sg) && !strcmp(suggest_best(&sg), "temperature"));
}

/* A misspelt knob, in each front end: one line naming the knob it was meant
 * to be (--neural-sise 5 -> --neural-size; {"neural_sise":5} -> neural_size). */
TEST(misspelt_knob_everywhere)
{
    char cmd[4096], out[8192];
    char text[] = "/tmp/nc-knobs-XXXXXX";
    int fd = mkstemp(text);
    CHECK(fd >= 0 && write(fd, "a b c\n", 6) == 6);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s score --model %s --neural-sise 5 %s 2>&1 >/dev/null", daemon_bin_path("neurocache"),
             model_dir, text);
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECKF(!strcmp(out, "neurocache score: unknown option '--neural-sise' (did you mean '--neural-size'?); "
                        "see 'neurocache score --help'\n"), "CLI said '%s'", out);
    /* the daemon's flags and its config file */
    snprintf(cmd, sizeof cmd, "%s --neural-sise 5 --model %s --port 0 --allow-root 2>&1", daemon_bin_path("neurocached"),
             model_dir);
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECKF(!strcmp(out, "neurocached: unknown option '--neural-sise' (did you mean '--neural-size'?); "
                        "see 'neurocached --help'\n"), "neurocached said '%s'", out);
    snprintf(cmd, sizeof cmd, "%s --max-body-byte 5 --model %s --port 0 --allow-root 2>&1", daemon_bin_path("neurocached"),
             model_dir);
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECKF(strstr(out, "unknown option '--max-body-byte' (did you mean '--max-body-bytes'?)"), "said '%s'", out);
    static const struct {
        const char *file, *said;
    } confs[] = {
        {"[cache]\nneural_sise = 5\n", "unknown option 'neural_sise' in section [cache] (did you mean 'neural_size'?)"},
        {"[cache]\nneural-size = 5\n", "unknown option 'neural-size' in section [cache] (did you mean 'neural_size'?)"},
        {"[server]\nneural_size = 5\n", "unknown option 'neural_size' in section [server] ('neural_size' belongs in [cache])"},
        {"[limits]\nmax_top = 5\n", "unknown option 'max_top' in section [limits] (did you mean 'max_top_k'?)"},
    };
    for (size_t i = 0; i < sizeof confs / sizeof *confs; i++) {
        char conf[] = "/tmp/nc-knobs-conf-XXXXXX";
        fd = mkstemp(conf);
        CHECK(fd >= 0 && write(fd, confs[i].file, strlen(confs[i].file)) == (ssize_t)strlen(confs[i].file));
        close(fd);
        snprintf(cmd, sizeof cmd, "%s --config %s --model %s --port 0 --allow-root 2>&1", daemon_bin_path("neurocached"),
                 conf, model_dir);
        CHECK(run_capture(cmd, out, sizeof out) == 2);
        CHECKF(strstr(out, confs[i].said), "%s: said '%s'", confs[i].file, out);
        unlink(conf);
    }
    /* a request's "cache" object */
    nc_daemon d;
    const char *args[] = {"--model", model_dir, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        unlink(text);
        return;
    }
    http_resp r;
    CHECK(http_json(d.port, "POST", "/v1/sessions", "{\"cache\": {\"neural_sise\": 5}}", &r) == 0);
    json_t *m = json_object_get(json_object_get(r.json, "error"), "message");
    CHECKF(r.status == 400 && json_is_string(m) &&
               !strcmp(json_string_value(m), "unknown field 'neural_sise' (did you mean 'neural_size'?)"),
           "JSON said %s", r.body);
    http_resp_free(&r);
    /* /v1/model: each knob's option and its older alias */
    CHECK(http_json(d.port, "GET", "/v1/model", NULL, &r) == 0 && r.status == 200);
    json_t *ns = json_object_get(json_object_get(r.json, "cache_knobs"), "neural_size");
    CHECK(!strcmp(json_string_value(json_object_get(ns, "flag")), "neural-size") &&
          !strcmp(json_string_value(json_object_get(ns, "alias")), "neural-cache"));
    CHECK(json_object_get(json_object_get(json_object_get(r.json, "cache_knobs"), "knn"), "alias") == NULL);
    http_resp_free(&r);
    CHECK(daemon_stop(&d) == 0);
    unlink(text);
}

/* neurocache score --FLAG VALUE: the knob's option with a value above its range. */
TEST(cli_config_and_json_say_the_same)
{
    nc_daemon d;
    const char *args[] = {"--model", model_dir, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        return;
    }
    char text[] = "/tmp/nc-knobs-XXXXXX";
    int fd = mkstemp(text);
    CHECK(fd >= 0 && write(fd, "a b c\n", 6) == 6);
    close(fd);
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    int tried = 0;
    for (size_t i = 0; i < n; i++) {
        if (!numeric(&k[i]))
            continue;
        tried++;
        char val[64], msg[NC_ERRLEN], cmd[4096], out[8192];
        above(&k[i], val, sizeof val);
        core_message(&k[i], val, msg, sizeof msg);
        /* the command line */
        snprintf(cmd, sizeof cmd, "%s score --model %s --%s %s %s 2>&1 >/dev/null", daemon_bin_path("neurocache"),
                 model_dir, k[i].flag, val, text);
        CHECKF(run_capture(cmd, out, sizeof out) == 2, "--%s %s: exit status", k[i].flag, val);
        CHECKF(strstr(out, msg) != NULL, "CLI --%s %s said '%s', the table '%s'", k[i].flag, val, out, msg);
        if (k[i].alias) {   /* the older name: the same knob, the same message */
            snprintf(cmd, sizeof cmd, "%s score --model %s --%s %s %s 2>&1 >/dev/null",
                     daemon_bin_path("neurocache"), model_dir, k[i].alias, val, text);
            CHECKF(run_capture(cmd, out, sizeof out) == 2 && strstr(out, msg), "CLI --%s %s said '%s'", k[i].alias,
                   val, out);
        }
        /* the config file's [cache] section */
        char conf[] = "/tmp/nc-knobs-conf-XXXXXX";
        fd = mkstemp(conf);
        char body[256];
        int len = snprintf(body, sizeof body, "[cache]\n%s = %s\n", k[i].name, val);
        CHECK(fd >= 0 && write(fd, body, (size_t)len) == len);
        close(fd);
        snprintf(cmd, sizeof cmd, "%s --config %s --model %s --port 0 --allow-root 2>&1",
                 daemon_bin_path("neurocached"), conf, model_dir);
        CHECKF(run_capture(cmd, out, sizeof out) == 2, "[cache] %s = %s: exit status", k[i].name, val);
        CHECKF(strstr(out, msg) != NULL, "config [cache] %s = %s said '%s'", k[i].name, val, out);
        unlink(conf);
        /* the daemon's flag (--neural-theta ...) */
        char flag[64];
        snprintf(flag, sizeof flag, "%s", k[i].name);
        for (char *q = flag; *q; q++)
            if (*q == '_') *q = '-';
        snprintf(cmd, sizeof cmd, "%s --%s %s --model %s --port 0 --allow-root 2>&1", daemon_bin_path("neurocached"),
                 flag, val, model_dir);
        CHECKF(run_capture(cmd, out, sizeof out) == 2, "neurocached --%s %s: exit status", flag, val);
        CHECKF(strstr(out, msg) != NULL, "neurocached --%s %s said '%s'", flag, val, out);
        /* a request's "cache" object */
        char json[256];
        snprintf(json, sizeof json, "{\"cache\": {\"%s\": %s}}", k[i].name, val);
        http_resp r;
        CHECK(http_json(d.port, "POST", "/v1/sessions", json, &r) == 0);
        CHECKF(r.status == 400, "%s: status %ld", json, r.status);
        json_t *m = r.json ? json_object_get(json_object_get(r.json, "error"), "message") : NULL;
        CHECKF(m && !strcmp(json_string_value(m), msg), "JSON %s said '%s', the table '%s'", json,
               m ? json_string_value(m) : r.body, msg);
        http_resp_free(&r);
    }
    int numeric_rows = 0;
    for (size_t i = 0; i < n; i++)
        numeric_rows += numeric(&k[i]);
    CHECK(tried == numeric_rows && tried >= 12);   /* every INT and FLOAT row (12 with gate_skip) */
    /* GET /v1/model lists the table with the same bounds */
    http_resp r;
    CHECK(http_json(d.port, "GET", "/v1/model", NULL, &r) == 0 && r.status == 200);
    json_t *a = r.json ? json_object_get(r.json, "cache_knobs") : NULL;
    CHECK(json_is_object(a) && json_object_size(a) == n);
    for (size_t i = 0; a && i < n; i++) {
        json_t *o = json_object_get(a, k[i].name);
        CHECKF(o && !strcmp(json_string_value(json_object_get(o, "flag")), k[i].flag), "/v1/model lacks %s",
               k[i].name);
        if (o && numeric(&k[i]))
            CHECKF(json_number_value(json_object_get(o, "minimum")) == k[i].min &&
                       json_number_value(json_object_get(o, "maximum")) == k[i].max,
                   "/v1/model's bounds of %s", k[i].name);
    }
    http_resp_free(&r);
    unlink(text);
    CHECK(daemon_stop(&d) == 0);
}

/* proto/openapi.yaml's CacheSettings: one property per knob, same type and bounds. */
static yaml_document_t doc;

static yaml_node_t *get(yaml_node_t *n, const char *key)
{
    if (!n || n->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(&doc, p->key);
        if (kn && kn->type == YAML_SCALAR_NODE && !strcmp((char *)kn->data.scalar.value, key))
            return yaml_document_get_node(&doc, p->value);
    }
    return NULL;
}

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

TEST(openapi_documents_the_table)
{
    FILE *f = fopen("proto/openapi.yaml", "rb");
    CHECK(f != NULL);
    if (!f) return;
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    int ok = yaml_parser_load(&parser, &doc);
    yaml_parser_delete(&parser);
    fclose(f);
    CHECK(ok);
    if (!ok) return;
    yaml_node_t *props = get(get(get(get(yaml_document_get_root_node(&doc), "components"), "schemas"),
                                 "CacheSettings"), "properties");
    CHECK(props && props->type == YAML_MAPPING_NODE);
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    static const char *const types[] = {[NC_KNOB_INT] = "integer", [NC_KNOB_FLOAT] = "number",
                                        [NC_KNOB_FLOAT_BELOW_MAX] = "number", [NC_KNOB_BOOL] = "boolean",
                                        [NC_KNOB_KERNEL] = "string"};
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *p = get(props, k[i].name);
        CHECKF(p != NULL, "CacheSettings lacks %s", k[i].name);
        if (!p) continue;
        CHECKF(scalar(get(p, "type")) && !strcmp(scalar(get(p, "type")), types[k[i].type]), "%s: type", k[i].name);
        if (!numeric(&k[i]))
            continue;
        const char *lo = scalar(get(p, "minimum")), *hi = scalar(get(p, "maximum"));
        CHECKF(lo && atof(lo) == k[i].min, "%s: minimum %s, the table %g", k[i].name, lo ? lo : "(none)", k[i].min);
        CHECKF(hi && atof(hi) == k[i].max, "%s: maximum %s, the table %g", k[i].name, hi ? hi : "(none)", k[i].max);
        const char *ex = scalar(get(p, "exclusiveMaximum"));
        CHECKF((ex && !strcmp(ex, "true")) == (k[i].type == NC_KNOB_FLOAT_BELOW_MAX), "%s: exclusiveMaximum",
               k[i].name);
    }
    CHECKF(props && props->data.mapping.pairs.top - props->data.mapping.pairs.start == (long)n,
           "CacheSettings has properties that are not knobs");
    yaml_document_delete(&doc);
}

int main(void)
{
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    httpc_init();
    RUN(table_defaults_and_bounds);
    RUN(needs_and_owners);
    RUN(suggestions);
    RUN(misspelt_knob_everywhere);
    RUN(openapi_documents_the_table);
    RUN(cli_config_and_json_say_the_same);
    httpc_cleanup();
    return harness_summary();
}
