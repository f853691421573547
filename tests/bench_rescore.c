/* bench_rescore.c -- N-best rescoring on neurocached over loopback: one
 * POST /v1/sessions/{id}/rescore of N hypotheses against what a client had
 * to do before it, N feed + rollback round trips (GET the session's state
 * once, then per hypothesis a feed with scores and a PUT of the saved state
 * to roll it back). Both give the same logprobs (test_server_stream); the
 * bench prints the median of --reps runs of each, for N = 10 and 100
 * hypotheses of 10 words, on a session with a 2,000-pair neural cache and
 * a 100-word unigram cache filled with 3,000 tokens.
 *
 * usage: bench_rescore [--model DIR] [--reps R] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const char *model = "models/demo";
    int reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    /* words of the model's vocabulary (skipping <unk> and <eos>) */
    char vpath[512];
    snprintf(vpath, sizeof vpath, "%s/vocab.txt", model);
    FILE *vf = fopen(vpath, "r");
    if (!vf) {
        perror(vpath);
        return 1;
    }
    static char words[2000][64];
    int nw = 0;
    char line[256];
    while (nw < 2000 && fgets(line, sizeof line, vf)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] && line[0] != '<') snprintf(words[nw++], sizeof words[0], "%.60s", line);
    }
    fclose(vf);
    char data[] = "/tmp/nc-bench-rescore-XXXXXX";
    if (!mkdtemp(data)) return 1;
    httpc_init();
    const char *args[] = {"--model", model, "--data-dir", data, "--max-tokens-per-request", "1000000", NULL};
    nc_daemon d;
    if (daemon_start(&d, args) != 0) return 1;
    http_resp r;
    http_json(d.port, "POST", "/v1/sessions",
              "{\"id\":\"b\",\"cache\":{\"neural_size\":2000,\"neural_lambda\":0.1,\"unigram_size\":100,\"unigram_lambda\":0.05}}", &r);
    http_resp_free(&r);
    unsigned seed = 1;
    size_t cap = 1 << 20;
    char *text = malloc(cap);
    size_t tl = 0;
    for (int i = 0; i < 3000; i++) {
        seed = seed * 1103515245u + 12345u;
        tl += (size_t)snprintf(text + tl, cap - tl, "%s%s", words[(seed >> 8) % (unsigned)nw], i % 20 == 19 ? "\n" : " ");
    }
    json_t *fb = json_pack("{s:s}", "text", text);
    http_post_json(d.port, "/v1/sessions/b/feed", fb, &r);
    json_decref(fb);
    http_resp_free(&r);
    printf("| hypotheses (10 words) | one rescore request | N feed + rollback round trips | ratio |\n|---|---|---|---|\n");
    int ns[] = {10, 100};
    for (int k = 0; k < 2; k++) {
        int N = ns[k];
        json_t *hyps = json_array();
        char **hs = calloc((size_t)N, sizeof *hs);
        for (int h = 0; h < N; h++) {
            char buf[1024];
            size_t bl = 0;
            for (int w = 0; w < 10; w++) {
                seed = seed * 1103515245u + 12345u;
                bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "%s%s", w ? " " : "", words[(seed >> 8) % (unsigned)nw]);
            }
            hs[h] = strdup(buf);
            json_array_append_new(hyps, json_string(buf));
        }
        json_t *rb = json_pack("{s:o}", "hypotheses", hyps);
        double *ta = calloc((size_t)reps, sizeof *ta), *tb = calloc((size_t)reps, sizeof *tb);
        for (int rep = 0; rep < reps; rep++) {
            double t0 = now_s();
            http_post_json(d.port, "/v1/sessions/b/rescore", rb, &r);
            if (r.status != 200) fprintf(stderr, "rescore: %ld %s\n", r.status, r.body);
            http_resp_free(&r);
            ta[rep] = now_s() - t0;
            t0 = now_s();
            http_resp st;
            http_call(d.port, "GET", "/v1/sessions/b/state", NULL, NULL, 0, &st);
            for (int h = 0; h < N; h++) {
                json_t *f = json_pack("{s:s,s:b}", "text", hs[h], "scores", 1);
                http_post_json(d.port, "/v1/sessions/b/feed", f, &r);
                json_decref(f);
                http_resp_free(&r);
                http_call(d.port, "PUT", "/v1/sessions/b/state", "application/octet-stream", st.body, st.len, &r);
                if (r.status / 100 != 2) fprintf(stderr, "rollback: %ld %s\n", r.status, r.body);
                http_resp_free(&r);
            }
            http_resp_free(&st);
            tb[rep] = now_s() - t0;
        }
        double a = median(ta, reps), b = median(tb, reps);
        printf("| %d | %.1f ms | %.1f ms | x%.1f |\n", N, a * 1e3, b * 1e3, b / a);
        json_decref(rb);
        for (int h = 0; h < N; h++) free(hs[h]);
        free(hs);
        free(ta);
        free(tb);
    }
    free(text);
    daemon_stop(&d);
    httpc_cleanup();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", data);
    return system(cmd) == 0 ? 0 : 1;
}
