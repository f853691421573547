/* web.h -- the page at GET / : the static files of web/ (HTML, CSS,
 * JavaScript), compiled into the daemon by scripts/embed_web.sh so the binary
 * is self-contained and the page works offline. The page uses only the
 * public API, sending the key the user types as Authorization: Bearer; the
 * files themselves hold no data and need no key. `web = false` turns them
 * off (404). */
#ifndef NC_SERVER_WEB_H
#define NC_SERVER_WEB_H

#include <stddef.h>

#include "http.h"

/* One embedded file (the generated build/gen/web_assets.c defines the
 * table, sorted by name). */
typedef struct {
    const char *name;             /* "index.html", "app.js" */
    const unsigned char *data;
    size_t len;
} web_asset;

/* The file called name, or NULL. */
const web_asset *web_find(const char *name);

/* GET / (index.html), GET /favicon.ico and GET /web/{file}: the file with its media type, or
 * 404 (unknown file, or web = false). */
void web_h_page(nc_server *srv, http_request *req, http_response *resp);

#endif
