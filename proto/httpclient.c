/* httpclient.c -- requests to a peer's API with libcurl (httpclient.h). */
#include "httpclient.h"

#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "nc_common.h"

int http_client_init(void)
{
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void http_client_cleanup(void)
{
    curl_global_cleanup();
}

typedef struct {
    nc_buf *out;
    size_t max, got;
    bool over;
} sink;

/* libcurl's write callback: a short count makes it fail the transfer */
static size_t on_data(char *p, size_t size, size_t nmemb, void *ud)
{
    sink *s = ud;
    size_t n = size * nmemb;
    if (s->got + n > s->max) {
        s->over = true;
        return 0;
    }
    s->got += n;
    return buf_append(s->out, p, n) == NC_OK ? n : 0;
}

int http_client_call(const http_client_req *r, nc_buf *out, long *status, char *err, size_t errlen)
{
    *status = 0;
    CURL *c = curl_easy_init();
    if (!c) {
        snprintf(err, errlen, "%s %s: curl_easy_init failed", r->method, r->url);
        return -1;
    }
    char ct[160], auth[300];
    snprintf(ct, sizeof ct, "Content-Type: %s", r->content_type ? r->content_type : "application/octet-stream");
    struct curl_slist *hdr = curl_slist_append(NULL, ct);
    hdr = curl_slist_append(hdr, "Expect:");   /* no 100-continue round trip */
    if (r->bearer && r->bearer[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->bearer);
        hdr = curl_slist_append(hdr, auth);
    }
    sink s = {out, r->max_bytes ? r->max_bytes : (size_t)1 << 31, 0, false};
    curl_easy_setopt(c, CURLOPT_URL, r->url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
    if (r->body || strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body ? r->body : "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->len);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, r->connect_timeout_ms ? r->connect_timeout_ms : 3000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, r->timeout_ms ? r->timeout_ms : 120000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);   /* threads: no SIGALRM for timeouts */
    CURLcode cr = curl_easy_perform(c);
    int rc = 0;
    if (cr != CURLE_OK) {
        snprintf(err, errlen, "%s %s: %s", r->method, r->url,
                 s.over ? "answer over the size limit" : out->oom ? "out of memory" : curl_easy_strerror(cr));
        rc = -1;
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    return rc;
}
