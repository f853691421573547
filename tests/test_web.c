/* test_web.c -- the page at GET / (server/net/web.h): its files are served
 * without a key and are the repository's web/ files byte for byte, the API
 * behind it still needs one, `--web false` turns the page off; then the
 * browser test (tests/web/ui_test.js, headless Chromium through
 * puppeteer-core) drives the page against this daemon on the demo model and
 * its checks count here (with a second daemon, on a model whose text
 * conventions split punctuation off, for how a clicked mark is typed).
 * Screenshots go to $NC_SCREENSHOTS (default
 * build/screenshots; docs/screenshots holds the committed ones). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "slurp.h"
#include "daemon.h"
#include "harness.h"
#include "tolerance.h"

#define ADMIN_KEY "nc_webtest_admin_0123456789abcdef"
#define READ_KEY "nc_webtest_reader_0123456789abcdef"

static char scratch[] = "/tmp/nc-web-XXXXXX";
static char keyfile[300];
static const char *model = "models/demo";

static int start(nc_daemon *d, const char *web)
{
    const char *args[] = {"--model", model, "--api-keys", keyfile, "--web", web, NULL};
    return daemon_start(d, args);
}

/* GET path without a key: 200 with the type and the bytes of web/file. */
static void check_file(int port, const char *path, const char *file, const char *type)
{
    char disk[256];
    snprintf(disk, sizeof disk, "web/%s", file);
    size_t len = 0;
    char *want = slurp_file(disk, &len);
    http_resp r;
    httpc_set_bearer(NULL);
    CHECK(http_call(port, "GET", path, NULL, NULL, 0, &r) == 0);
    CHECKF(r.status == 200, "GET %s: %ld", path, r.status);
    CHECK_STR_CONTAINS(r.content_type, type);
    CHECKF(want && r.len == len && memcmp(r.body, want, len) == 0, "GET %s is not web/%s (%zu vs %zu bytes)",
           path, file, r.len, len);
    http_resp_free(&r);
    free(want);
}

TEST(page_served_without_key_api_still_needs_one)
{
    nc_daemon d;
    if (start(&d, "true") != 0) {
        CHECK(!"daemon started");
        return;
    }
    check_file(d.port, "/", "index.html", "text/html");
    check_file(d.port, "/web/app.js", "app.js", "text/javascript");
    check_file(d.port, "/web/style.css", "style.css", "text/css");
    /* the icon, where browsers ask for it, compiled in as the page's files are */
    check_file(d.port, "/favicon.ico", "favicon.ico", "image/x-icon");
    http_resp r;
    httpc_set_bearer(NULL);
    http_call(d.port, "GET", "/web/nope.js", NULL, NULL, 0, &r);
    CHECK(r.status == 404 && !strcmp(http_error_code(&r), "not_found"));
    http_resp_free(&r);
    http_call(d.port, "GET", "/web/..%2Fconfig.h", NULL, NULL, 0, &r);
    CHECK(r.status == 404);
    http_resp_free(&r);
    http_call(d.port, "POST", "/", "text/plain", "x", 1, &r);
    CHECKF(r.status == 405, "POST /: %ld", r.status);
    http_resp_free(&r);
    /* the files need no key; nothing else changed: the API still does */
    http_call(d.port, "GET", "/v1/model", NULL, NULL, 0, &r);
    CHECKF(r.status == 401, "GET /v1/model without a key: %ld", r.status);
    http_resp_free(&r);
    http_json(d.port, "POST", "/v1/sessions", "{}", &r);
    CHECKF(r.status == 401, "POST /v1/sessions without a key: %ld", r.status);
    http_resp_free(&r);
    /* the form's ranges: one per setting, each default inside its range */
    httpc_set_bearer(READ_KEY);
    http_call(d.port, "GET", "/v1/model", NULL, NULL, 0, &r);
    CHECK(r.status == 200 && r.json);
    json_t *ranges = json_object_get(r.json, "cache_knobs"), *defs = json_object_get(r.json, "cache_defaults");
    CHECK(json_is_object(ranges) && json_is_object(defs) && json_object_size(ranges) == json_object_size(defs));
    const char *name;
    json_t *rg;
    json_object_foreach(ranges, name, rg) {
        json_t *dv = json_object_get(defs, name);
        const char *type = json_string_value(json_object_get(rg, "type"));
        CHECKF(dv && type, "setting %s: no default or no type", name);
        if (!dv || !type)
            continue;
        if (!strcmp(type, "integer") || !strcmp(type, "number")) {
            double lo = json_number_value(json_object_get(rg, "minimum")),
                   hi = json_number_value(json_object_get(rg, "maximum")), v = json_number_value(dv);
            CHECKF(json_is_number(dv) && lo <= v && v <= hi, "%s = %g outside [%g, %g]", name, v, lo, hi);
        } else if (!strcmp(type, "boolean")) {
            CHECKF(json_is_boolean(dv), "%s: not a boolean", name);
        } else {
            CHECKF(json_is_array(json_object_get(rg, "enum")), "%s: no enum", name);
        }
    }
    CHECK(json_integer_value(json_object_get(json_object_get(ranges, "knn"), "maximum")) == 16384);
    http_resp_free(&r);
    /* a value outside the range the form shows is refused by the API */
    http_json(d.port, "POST", "/v1/sessions", "{\"cache\":{\"neural_theta\":10001}}", &r);
    CHECKF(r.status == 400 && !strcmp(http_error_code(&r), "out_of_range"), "theta over the range: %ld", r.status);
    http_resp_free(&r);
    httpc_set_bearer(NULL);
    CHECK(daemon_stop(&d) == 0);
}

TEST(web_false_turns_the_page_off)
{
    nc_daemon d;
    if (start(&d, "false") != 0) {
        CHECK(!"daemon started");
        return;
    }
    http_resp r;
    httpc_set_bearer(NULL);
    const char *paths[] = {"/", "/web/app.js", "/favicon.ico"};
    for (int i = 0; i < 3; i++) {
        http_call(d.port, "GET", paths[i], NULL, NULL, 0, &r);
        CHECKF(r.status == 404, "GET %s with web = false: %ld", paths[i], r.status);
        CHECK_STR_CONTAINS(r.body, "web = false");
        http_resp_free(&r);
    }
    http_call(d.port, "GET", "/health", NULL, NULL, 0, &r);
    CHECK(r.status == 200);
    http_resp_free(&r);
    CHECK(daemon_stop(&d) == 0);
}

/* feed with "components" (the map's tooltips): each token's shares add up
 * to its probability, and its logprobs are those of a plain feed, on a
 * fixture model with a neural and a unigram cache. The shares come from the
 * full distribution and the logprob from the target-only path, fed token by
 * token against a batched feed: TOL_FIXTURE_PATHS bounds both (tolerance.h). */
TEST(feed_components_add_up)
{
    char fixture[512];
    snprintf(fixture, sizeof fixture, "%s/lstm-2layer", harness_fixtures());
    const char *args[] = {"--model", fixture, NULL};
    nc_daemon d;
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    const char *text = "w3 w4 w5 w6 w7 w3 w4 w5 w9\\nw10 w3 w4 w5";
    const char *cache = "{\"neural_size\":50,\"neural_lambda\":0.3,\"unigram_size\":20,\"unigram_lambda\":0.2}";
    char body[512];
    http_resp r, a, b;
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, "{\"id\":\"s%d\",\"cache\":%s}", i, cache);
        http_json(d.port, "POST", "/v1/sessions", body, &r);
        CHECK(r.status == 201);
        http_resp_free(&r);
    }
    snprintf(body, sizeof body, "{\"text\":\"%s\",\"components\":true}", text);
    http_json(d.port, "POST", "/v1/sessions/s0/feed", body, &a);
    snprintf(body, sizeof body, "{\"text\":\"%s\",\"scores\":true}", text);
    http_json(d.port, "POST", "/v1/sessions/s1/feed", body, &b);
    CHECK(a.status == 200 && b.status == 200);
    json_t *comps = json_object_get(a.json, "components"), *lpa = json_object_get(a.json, "logprobs"),
           *lpb = json_object_get(b.json, "logprobs");
    size_t n = json_array_size(lpb);
    CHECK(n > 10 && json_array_size(comps) == n && json_array_size(lpa) == n);
    double worst_sum = 0, worst_lp = 0;
    int cached = 0;
    for (size_t i = 0; i < n && json_array_size(comps) == n; i++) {
        json_t *c = json_array_get(comps, i);
        CHECK(json_is_object(c) && json_object_size(c) == 5);
        double p = 0;
        const char *k;
        json_t *v;
        json_object_foreach(c, k, v) p += json_number_value(v);
        double la = json_number_value(json_array_get(lpa, i)), lb = json_number_value(json_array_get(lpb, i));
        worst_sum = fmax(worst_sum, fabs(log(p) - la));
        worst_lp = fmax(worst_lp, fabs(la - lb));
        if (json_number_value(json_object_get(c, "neural")) > 0 && json_number_value(json_object_get(c, "unigram")) > 0)
            cached++;
    }
    CHECKF(worst_sum <= TOL_FIXTURE_PATHS, "|log sum(shares) - logprob| up to %g", worst_sum);
    CHECKF(worst_lp <= TOL_FIXTURE_PATHS, "components changed the logprobs by up to %g", worst_lp);
    CHECKF(cached >= 5, "only %d tokens with neural and unigram shares", cached);
    http_resp_free(&a);
    http_resp_free(&b);
    /* open vocabulary: a new word has no id (null), its repeat its own
     * id's shares, not unk_token's */
    http_json(d.port, "POST", "/v1/sessions", "{\"id\":\"ov\",\"cache\":{\"neural_size\":50,\"open_vocab\":true}}", &r);
    CHECK(r.status == 201);
    http_resp_free(&r);
    http_json(d.port, "POST", "/v1/sessions/ov/feed", "{\"text\":\"w3 zork w4 zork\",\"components\":true}", &r);
    json_t *oc = json_object_get(r.json, "components"), *ol = json_object_get(r.json, "logprobs");
    CHECK(r.status == 200 && json_array_size(oc) == 4);
    CHECK(json_is_null(json_array_get(oc, 1)));
    json_t *rep = json_array_get(oc, 3);
    double prep = json_number_value(json_object_get(rep, "neural")) + json_number_value(json_object_get(rep, "model"));
    CHECKF(json_is_object(rep) && json_number_value(json_object_get(rep, "model")) == 0 && prep > 0 &&
           fabs(log(prep) - json_number_value(json_array_get(ol, 3))) <= TOL_FIXTURE_PATHS,
           "the repeated new word: model %g, neural %g, logprob %g", json_number_value(json_object_get(rep, "model")),
           json_number_value(json_object_get(rep, "neural")), json_number_value(json_array_get(ol, 3)));
    http_resp_free(&r);
    http_json(d.port, "POST", "/v1/sessions/s0/feed", "{\"text\":\"w3\",\"components\":true,\"adapt\":true}", &r);
    CHECK(r.status == 400 && !strcmp(http_error_code(&r), "out_of_range"));
    http_resp_free(&r);
    CHECK(daemon_stop(&d) == 0);
}

/* A model whose conventions split punctuation, brackets and quotes off
 * and split clitics (the fixture's weights under a vocabulary of words,
 * marks and clitics): the page must type each as the conventions say.
 * Writes it into dir; 0 on success. */
static int write_punct_model(const char *dir)
{
    char path[512], target[512];
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return -1;
    if (!realpath(harness_fixtures(), target))
        return -1;
    size_t tl = strlen(target);
    snprintf(target + tl, sizeof target - tl, "/lstm-2layer/model.safetensors");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (symlink(target, path) != 0 && errno != EEXIST)
        return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\"model_type\": \"lstm\", \"vocab_size\": 50, \"embedding_size\": 16, \"hidden_size\": 16,\n"
               " \"num_layers\": 2, \"tie_weights\": false, \"unk_token\": \"<unk>\", \"eos_token\": \"<eos>\",\n"
               " \"lowercase\": false, \"text\": {\"preset\": \"none\", \"case\": \"keep\", \"punctuation\": \"split\",\n"
               " \"quotes\": \"split\", \"brackets\": \"split\", \"contractions\": true, \"lines\": \"eos\"}}\n");
    fclose(f);
    /* 50 entries, as the fixture's weights have */
    static const char *vocab[] = {"<unk>", "<eos>", "the", "a", "cat", "dog", "sat", "on", "it", "was",
                                  "and", "to", "of", "in", "is", "he", "she", "they", "we", "not",
                                  "but", "or", "big", "red", "old", "new", ",", ".", ";", ":",
                                  "!", "?", ")", "]", "(", "[", "\u201c", "\u201d", "'s", "n't",
                                  "'re", "'ll", "'d", "dogs", "cats", "sun", "moon", "day", "night", "time"};
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    f = fopen(path, "w");
    if (!f)
        return -1;
    for (size_t i = 0; i < sizeof vocab / sizeof *vocab; i++)
        fprintf(f, "%s\n", vocab[i]);
    fclose(f);
    return 0;
}

/* Runs ui_test.js against a daemon and adds its counts to ours. */
TEST(browser)
{
    nc_daemon d;
    if (start(&d, "true") != 0) {
        CHECK(!"daemon started");
        return;
    }
    /* a second daemon, without keys, on the model that splits punctuation */
    char pdir[320];
    snprintf(pdir, sizeof pdir, "%s/punct", scratch);
    nc_daemon pd;
    const char *pargs[] = {"--model", pdir, NULL};
    if (write_punct_model(pdir) != 0 || daemon_start(&pd, pargs) != 0) {
        CHECK(!"daemon on the punctuation model started");
        daemon_stop(&d);
        return;
    }
    char url[64], purl[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", d.port);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%d", pd.port);
    setenv("NC_URL", url, 1);
    setenv("NC_PUNCT_URL", purl, 1);
    setenv("NC_ADMIN_KEY", ADMIN_KEY, 1);
    setenv("NC_READ_KEY", READ_KEY, 1);
    if (!getenv("NC_SCREENSHOTS"))
        setenv("NC_SCREENSHOTS", "build/screenshots", 1);
    const char *modules = getenv("NC_NODE_MODULES") ? getenv("NC_NODE_MODULES") : "build/node/node_modules";
    const char *chromium = getenv("CHROMIUM") ? getenv("CHROMIUM") : "/usr/bin/chromium";
    char pc[512];
    snprintf(pc, sizeof pc, "%s/puppeteer-core/package.json", modules);
    CHECKF(access(pc, R_OK) == 0, "%s missing: run make deps-test (scripts/deps.sh installs tests/web with npm ci)", pc);
    CHECKF(access(chromium, X_OK) == 0, "%s missing: run make deps-test (Debian's chromium)", chromium);
    if (access(pc, R_OK) != 0 || access(chromium, X_OK) != 0) {
        daemon_stop(&pd);
        daemon_stop(&d);
        return;
    }
    /* the sanitizer build's daemon is slower: the test's waits are about
     * events, not time, and its own timeouts are generous */
    harness_run_external("node tests/web/ui_test.js", "ui");
    if (harness_failed) {
        daemon_dump_log(&d);
        daemon_dump_log(&pd);
    }
    CHECK(daemon_stop(&pd) == 0);
    CHECK(daemon_stop(&d) == 0);
}

int main(void)
{
    if (!mkdtemp(scratch)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(keyfile, sizeof keyfile, "%s/keys", scratch);
    FILE *f = fopen(keyfile, "w");
    if (!f) {
        perror(keyfile);
        return 1;
    }
    fprintf(f, "admin %s all *\nreader %s read default\n", ADMIN_KEY, READ_KEY);
    fclose(f);
    chmod(keyfile, 0600);
    httpc_init();
    RUN(page_served_without_key_api_still_needs_one);
    RUN(web_false_turns_the_page_off);
    RUN(feed_components_add_up);
    RUN(browser);
    httpc_cleanup();
    unlink(keyfile);
    char p[400];
    const char *files[] = {"model.safetensors", "config.json", "vocab.txt"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/punct/%s", scratch, files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/punct", scratch);
    rmdir(p);
    rmdir(scratch);
    return harness_summary();
}
