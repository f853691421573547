/* web.c -- serves the embedded page (web.h): a lookup in the generated asset
 * table and a media type from the file name. */
#include "web.h"

#include <stdlib.h>
#include <string.h>

extern const web_asset web_assets[];
extern const size_t web_nassets;

const web_asset *web_find(const char *name)
{
    for (size_t i = 0; i < web_nassets; i++)
        if (!strcmp(web_assets[i].name, name))
            return &web_assets[i];
    return NULL;
}

/* Media type by extension; the page ships only these kinds. */
static const char *media_type(const char *name)
{
    static const struct { const char *ext, *type; } types[] = {
        {".html", "text/html; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".svg", "image/svg+xml"},
        {".png", "image/png"},
        {".ico", "image/x-icon"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i].ext))
            return types[i].type;
    return "application/octet-stream";
}

void web_h_page(nc_server *srv, http_request *req, http_response *resp)
{
    if (!srv->cfg.web) {
        http_reply_error(resp, API_NOT_FOUND, "the web page is turned off (web = false)");
        return;
    }
    /* "/" and "/favicon.ico" (where browsers look for the icon) have no
     * capture: the page itself, the icon */
    const char *name = !strcmp(req->url, "/")              ? "index.html"
                       : !strcmp(req->url, "/favicon.ico") ? "favicon.ico"
                                                           : req->params[0];
    const web_asset *a = web_find(name);
    if (!a) {
        http_reply_error(resp, API_NOT_FOUND, "no file '%s' in the web page", name);
        return;
    }
    char *copy = malloc(a->len ? a->len : 1);   /* the response frees its text */
    if (!copy) {
        http_reply_error(resp, API_INTERNAL, "out of memory");
        return;
    }
    memcpy(copy, a->data, a->len);
    resp->status = 200;
    resp->text = copy;
    resp->text_len = a->len;
    resp->content_type = media_type(name);
}
