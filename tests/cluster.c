/* cluster.c -- the multi-replica suites' shared helpers (cluster.h). */
#include "cluster.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cluster_haproxy_cfg(const char *out, int lb_port, const int rep_port[CLUSTER_NREP], int stats_port,
                        const char *sock)
{
    FILE *in = fopen("deploy/haproxy/haproxy.cfg", "r");
    FILE *o = fopen(out, "w");
    if (!in || !o) {
        if (in) fclose(in);
        if (o) fclose(o);
        return -1;
    }
    const char *from[] = {"127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083",
                          "127.0.0.1:8404", "/tmp/haproxy-neurocache.sock"};
    char to[6][300];
    snprintf(to[0], sizeof to[0], "127.0.0.1:%d", lb_port);
    for (int i = 0; i < CLUSTER_NREP; i++) snprintf(to[1 + i], sizeof to[1 + i], "127.0.0.1:%d", rep_port[i]);
    snprintf(to[4], sizeof to[4], "127.0.0.1:%d", stats_port);
    snprintf(to[5], sizeof to[5], "%s", sock);
    char line[1024];
    while (fgets(line, sizeof line, in)) {
        char l2[1200];
        snprintf(l2, sizeof l2, "%s", line);
        for (int k = 0; k < 6; k++) {
            char *p = strstr(l2, from[k]);
            if (p) {
                char tail[1200];
                snprintf(tail, sizeof tail, "%s", p + strlen(from[k]));
                snprintf(p, sizeof l2 - (size_t)(p - l2), "%s%s", to[k], tail);
            }
        }
        fputs(l2, o);
    }
    fclose(in);
    return fclose(o);
}

pid_t cluster_haproxy_start(const char *bin, const char *workdir, int lb_port, const int rep_port[CLUSTER_NREP],
                            int stats_port)
{
    char cfg[400], log[400], sock[400];
    snprintf(cfg, sizeof cfg, "%s/haproxy.cfg", workdir);
    snprintf(log, sizeof log, "%s/haproxy.log", workdir);
    snprintf(sock, sizeof sock, "%s/haproxy.sock", workdir);
    if (cluster_haproxy_cfg(cfg, lb_port, rep_port, stats_port, sock))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        execl(bin, "haproxy", "-db", "-f", cfg, (char *)NULL);
        _exit(127);
    }
    return pid;
}

int cluster_lb_call(int lb_port, const char *method, const char *path, const char *ctype, const char *body,
                    const char *sid, http_resp *out)
{
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    char url[512], hdr[200], ct[128], *b = NULL;
    size_t bl = 0;
    FILE *mem = open_memstream(&b, &bl);
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", lb_port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    if (sid) {
        snprintf(hdr, sizeof hdr, "X-Session-Id: %s", sid);
        h = curl_slist_append(h, hdr);
    }
    if (body) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "application/json");
        h = curl_slist_append(h, ct);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, mem);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    fclose(mem);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    out->body = b;
    out->len = bl;
    if (bl) out->json = json_loadb(b, bl, 0, NULL);
    return rc == CURLE_OK ? 0 : -1;
}
