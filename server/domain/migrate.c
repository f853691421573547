/* migrate.c -- sessions that move between replicas: state blobs,
 * pull-on-miss from the peers and the hand-over of every session on drain
 * (migrate.h). */
#include "migrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "api_errors.h"
#include "buf.h"
#include "httpclient.h"
#include "metrics.h"
#include "namespaces.h"
#include "slog.h"

#define MAX_PEERS 32

typedef struct {
    char tag[16];
    char url[256];   /* no trailing slash */
} peer;

struct migration {
    peer peers[MAX_PEERS];
    int npeers;
    uint64_t fingerprint;         /* model_fingerprint of the model served */
    char peer_key[128];           /* sent to the peers as Bearer, "" = none */
};


/* ---- blob --------------------------------------------------------------- */

static const char MAGIC[8] = {'N', 'C', 'S', 'E', 'S', 'S', '\r', '\n'};

int migrate_encode(const nc_model *m, uint64_t fingerprint, const nc_session *s, void **blob,
                   size_t *len, char *err, size_t errlen)
{
    *blob = NULL;
    *len = 0;
    void *sb = NULL;
    size_t sl = 0;
    int rc = stream_export(s->stream, &sb, &sl, err, errlen);
    if (rc != NC_OK)
        return rc;
    uint16_t il = (uint16_t)strnlen(s->id, SESSION_ID_MAX), nl = (uint16_t)strnlen(s->ns, SESSION_ID_MAX);
    size_t total = 8 + 4 + 8 + 12 + 2 + il + 2 + nl + 8 + 8 + sl + 4;
    unsigned char *b = malloc(total), *p = b;
    if (!b) {
        free(sb);
        return nc_error(err, errlen, NC_ENOMEM, "session state: out of memory");
    }
    uint32_t ver = MIGRATE_BLOB_VERSION;
    uint32_t shape[3] = {(uint32_t)m->cfg.vocab_size, (uint32_t)m->cfg.hidden_size,
                         (uint32_t)m->cfg.num_layers};
    uint64_t sl64 = sl;
    memcpy(p, MAGIC, 8), p += 8;
    memcpy(p, &ver, 4), p += 4;
    memcpy(p, &fingerprint, 8), p += 8;
    memcpy(p, shape, 12), p += 12;
    memcpy(p, &il, 2), p += 2;
    memcpy(p, s->id, il), p += il;
    memcpy(p, &nl, 2), p += 2;
    memcpy(p, s->ns, nl), p += nl;
    memcpy(p, &s->created, 8), p += 8;
    memcpy(p, &sl64, 8), p += 8;
    memcpy(p, sb, sl), p += sl;
    uint32_t crc = (uint32_t)crc32(0L, b, (uInt)(p - b));
    memcpy(p, &crc, 4), p += 4;
    free(sb);
    *blob = b;
    *len = (size_t)(p - b);
    return NC_OK;
}

/* The blob's frame: magic, version, length and checksum. */
static api_error check_frame(const unsigned char *b, size_t len, char *err, size_t errlen)
{
    if (len < 8 + 4 || memcmp(b, MAGIC, 8) != 0) {
        snprintf(err, errlen, "not a neurocache session state (bad magic; expected the body of "
                 "GET /v1/sessions/{id}/state, sent as application/octet-stream)");
        return API_STATE_CORRUPT;
    }
    uint32_t ver;
    memcpy(&ver, b + 8, 4);
    if (ver != MIGRATE_BLOB_VERSION) {
        snprintf(err, errlen, "session state version %u, this server reads version %u", ver,
                 MIGRATE_BLOB_VERSION);
        return API_STATE_VERSION;
    }
    size_t fixed = 8 + 4 + 8 + 12 + 2 + 2 + 8 + 8 + 4;
    if (len < fixed) {
        snprintf(err, errlen, "session state truncated (%zu bytes)", len);
        return API_STATE_CORRUPT;
    }
    uint32_t crc;
    memcpy(&crc, b + len - 4, 4);
    if (crc != (uint32_t)crc32(0L, b, (uInt)(len - 4))) {
        snprintf(err, errlen, "session state checksum mismatch (truncated or altered in transit)");
        return API_STATE_CORRUPT;
    }
    return API_OK;
}

/* The blob's model: its fingerprint and shape at *p (moved past them)
 * against m's. */
static api_error check_model(const nc_model *m, uint64_t fingerprint, const unsigned char **p, char *err,
                             size_t errlen)
{
    uint64_t fp;
    uint32_t shape[3];
    memcpy(&fp, *p, 8), *p += 8;
    memcpy(shape, *p, 12), *p += 12;
    if (fp != fingerprint) {
        snprintf(err, errlen, "session state comes from another model (fingerprint %016llx, "
                 "V=%u H=%u L=%u); this replica serves fingerprint %016llx (V=%d H=%d L=%d)",
                 (unsigned long long)fp, shape[0], shape[1], shape[2], (unsigned long long)fingerprint,
                 m->cfg.vocab_size, m->cfg.hidden_size, m->cfg.num_layers);
        return API_STATE_MODEL;
    }
    return API_OK;
}

/* The envelope's id (skipped), namespace (into ns) and creation time
 * (skipped) at *p, then the stream's length, which must be what is left
 * before end; *p moved to the stream. -1 when the lengths do not add up. */
static int read_names(const unsigned char **p, const unsigned char *end, char *ns, size_t nslen, uint64_t *sl)
{
    uint16_t il, nl;
    memcpy(&il, *p, 2), *p += 2;
    if ((size_t)(end - *p) < (size_t)il + 2) return -1;
    *p += il;
    memcpy(&nl, *p, 2), *p += 2;
    if ((size_t)(end - *p) < (size_t)nl + 16 || nl >= nslen) return -1;
    memcpy(ns, *p, nl);
    ns[nl] = 0;
    *p += nl;
    *p += 8; /* created */
    memcpy(sl, *p, 8), *p += 8;
    return *sl == (uint64_t)(end - *p) ? 0 : -1;
}

/* migrate_import (import) or migrate_peek. */
static api_error decode(nc_server *srv, bool import, const void *blob, size_t len, migrate_state *st)
{
    const nc_model *m = srv->model;
    uint64_t fingerprint = srv->migration->fingerprint;
    sessions *t = srv->sessions;
    char *err = st->err, *ns = st->ns;
    const size_t errlen = sizeof st->err, nslen = sizeof st->ns;
    st->stream = NULL;
    st->ns_ref = NULL;
    ns[0] = 0;
    const unsigned char *b = blob;
    api_error e = check_frame(b, len, err, errlen);
    const unsigned char *p = b + 12, *end = b + len - 4;
    if (e == API_OK)
        e = check_model(m, fingerprint, &p, err, errlen);
    if (e != API_OK)
        return e;
    uint64_t sl;
    if (read_names(&p, end, ns, nslen, &sl) != 0) {
        snprintf(err, errlen, "session state is malformed (field lengths do not add up)");
        return API_STATE_CORRUPT;
    }
    if (!import)
        return API_OK;   /* the envelope only (namespace for a key check) */
    char msg[NC_ERRLEN] = "";
    nc_unbounded_cache *ub = NULL;
    int brc = sessions_bind(t, ns, &ub, &st->ns_ref, msg, sizeof msg);
    if (brc != 0) {
        snprintf(err, errlen, "session state: namespace '%s': %s", ns, msg);
        /* the namespace's disk (503/507), else the state's name */
        return api_error_from_storage(brc, API_OUT_OF_RANGE);
    }
    int rc = stream_import(m, ub, NULL, p, (size_t)sl, &st->stream, msg, sizeof msg);
    if (rc != NC_OK) {
        sessions_unbind(t, st->ns_ref);
        st->ns_ref = NULL;
    }
    if (rc == NC_ENOMEM) {
        snprintf(err, errlen, "session state: out of memory");
        return API_INTERNAL;
    }
    if (rc != NC_OK) {
        snprintf(err, errlen, "session state: %s", msg);
        return API_STATE_CORRUPT;
    }
    return API_OK;
}

int migrate_export(nc_server *srv, const nc_session *s, void **blob, size_t *len, char *err, size_t errlen)
{
    /* The blob names its namespace only: imported elsewhere it would bind
     * to whatever incarnation lives under the name there -- a session of a
     * deleted incarnation must not join a new one that way. */
    if (namespaces_session_deleted(s) && stream_unbounded_cache(s->stream))
        return nc_error(err, errlen, NC_ESTATE, "the session's namespace '%s' was deleted", s->ns);
    return migrate_encode(srv->model, srv->migration->fingerprint, s, blob, len, err, errlen);
}

api_error migrate_import(nc_server *srv, const void *blob, size_t len, migrate_state *st)
{
    return decode(srv, true, blob, len, st);
}

api_error migrate_peek(nc_server *srv, const void *blob, size_t len, migrate_state *st)
{
    return decode(srv, false, blob, len, st);
}

/* ---- calls to the peers ---------------------------------------------------- */

/* A peer's answer: body malloc'ed (NUL-terminated, free()), status the
 * HTTP status (0 when no answer). */
typedef struct {
    char *body;
    size_t len;
    long status;
} peer_reply;

/* r (method, url, body) on a peer with the peer key and the hand-over's
 * timeouts; 0, or -1 with a message (connection failed). */
static int peer_call(const migration *mg, http_client_req r, peer_reply *out, char *err, size_t errlen)
{
    r.bearer = mg->peer_key;
    r.connect_timeout_ms = 1000;
    r.timeout_ms = 30000;
    nc_buf buf = NC_BUF_INIT;
    *out = (peer_reply){.body = NULL, .len = 0, .status = 0};
    if (http_client_call(&r, &buf, &out->status, err, errlen) != 0) {
        buf_free(&buf);
        return -1;
    }
    out->body = buf_detach(&buf, &out->len);
    return out->body ? 0 : -1;
}

/* ---- set-up ---------------------------------------------------------------- */

/* The entries of a peers option ("tag=url,tag=url", or bare urls) into
 * mg->peers, skipping this replica's own tag. 0 or -1 with a message. */
static int parse_peers(migration *mg, const char *s, const char *self_tag, char *err, size_t errlen)
{
    while (*s) {
        while (*s == ',' || *s == ' ') s++;
        if (!*s) break;
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        while (n && s[n - 1] == ' ') n--;
        char item[512];
        if (n >= sizeof item) {
            snprintf(err, errlen, "option 'peers': entry '%.40s...' is too long", s);
            return -1;
        }
        memcpy(item, s, n);
        item[n] = 0;
        s += n;
        char *eq = strchr(item, '='), *url = item, *tag = "";
        if (eq && strncmp(item, "http", 4) != 0) {
            *eq = 0;
            tag = item;
            url = eq + 1;
        }
        if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
            snprintf(err, errlen, "option 'peers': '%s' is not tag=http://host:port", item);
            return -1;
        }
        if (strlen(tag) >= sizeof mg->peers[0].tag || strlen(url) >= sizeof mg->peers[0].url) {
            snprintf(err, errlen, "option 'peers': '%s' has a tag over 15 or a URL over 255 bytes", url);
            return -1;
        }
        if (tag[0] && strcmp(tag, self_tag) == 0)
            continue;   /* this replica */
        if (mg->npeers == MAX_PEERS) {
            snprintf(err, errlen, "option 'peers': more than %d peers", MAX_PEERS);
            return -1;
        }
        peer *p = &mg->peers[mg->npeers++];
        snprintf(p->tag, sizeof p->tag, "%s", tag);
        snprintf(p->url, sizeof p->url, "%s", url);
        size_t ul = strlen(p->url);
        while (ul > 0 && p->url[ul - 1] == '/') p->url[--ul] = 0;
    }
    return 0;
}

int migrate_init(nc_server *srv, char *err, size_t errlen)
{
    migration *mg = calloc(1, sizeof *mg);
    if (!mg) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    srv->migration = mg;
    mg->fingerprint = model_fingerprint(srv->model);
    snprintf(mg->peer_key, sizeof mg->peer_key, "%s", srv->cfg.peer_key);
    if (http_client_init() != 0) {
        snprintf(err, errlen, "libcurl initialisation failed");
        return -1;
    }
    return parse_peers(mg, srv->cfg.peers, srv->cfg.replica_tag, err, errlen);
}

void migrate_shutdown(nc_server *srv)
{
    if (!srv->migration)
        return;
    http_client_cleanup();
    free(srv->migration);
    srv->migration = NULL;
}

/* ---- ids -------------------------------------------------------------------- */

/* The replica tag of a minted id (ses_<tag>_<32 hex> or ses_<32 hex> for no
 * tag): 1 and the tag in out, or 0 for a client-chosen id. */
static int id_tag(const char *id, char *out, size_t cap)
{
    if (strncmp(id, "ses_", 4) != 0)
        return 0;
    const char *t = id + 4, *us = strchr(t, '_');
    const char *hex = us ? us + 1 : t;
    if (strlen(hex) != 32 || strspn(hex, "0123456789abcdef") != 32)
        return 0;
    size_t n = us ? (size_t)(us - t) : 0;
    if (n >= cap)
        return 0;
    memcpy(out, t, n);
    out[n] = 0;
    return 1;
}

/* Session ids as POST /v1/sessions accepts them ([A-Za-z0-9_.-]), which
 * are also safe to put in a peer URL. */
bool migrate_id_url_safe(const char *id)
{
    return id[0] && strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") == strlen(id);
}

/* ---- pull on miss ----------------------------------------------------------- */

/* Asks the peers (the id's own replica first) to hand the session over and
 * adopts it. 1 if it is now here, 0 if no peer had it. */
static int pull(nc_server *srv, const char *id)
{
    const migration *mg = srv->migration;
    char tag[16] = "";
    int tagged = id_tag(id, tag, sizeof tag);
    int order[MAX_PEERS], n = 0;
    for (int i = 0; i < mg->npeers; i++)
        if (tagged && strcmp(mg->peers[i].tag, tag) == 0) order[n++] = i;
    for (int i = 0; i < mg->npeers; i++)
        if (!(tagged && strcmp(mg->peers[i].tag, tag) == 0)) order[n++] = i;
    /* A peer answering session_moved is pushing it somewhere right now:
     * look again a little later. */
    for (int round = 0; round < 3; round++) {
        int moving = 0;
        for (int k = 0; k < n; k++) {
            const peer *p = &mg->peers[order[k]];
            char url[512], err[256];
            peer_reply got;
            snprintf(url, sizeof url, "%s/v1/sessions/%s/handoff", p->url, id);
            if (peer_call(mg, (http_client_req){.method = "POST", .url = url}, &got, err, sizeof err))
                continue;   /* peer down: nothing to get from it */
            char *body = got.body;
            size_t blen = got.len;
            long status = got.status;
            if (status == 503)
                moving = 1;
            if (status != 200) {
                free(body);
                continue;
            }
            migrate_state ms = {0};
            char *msg = ms.err;
            api_error e = migrate_import(srv, body, blen, &ms);
            nc_session *s = NULL;
            sessions_rc src = SESS_EINVAL;
            nc_session_spec sp = {.id = id, .ns = ms.ns, .p = stream_params(ms.stream), .stream = ms.stream,
                                  .ns_ref = ms.ns_ref};
            if (e == API_OK)
                src = sessions_adopt(srv->sessions, &sp, &s, msg, sizeof ms.err);
            if (src == SESS_OK) {
                sessions_release(srv->sessions, s);
                slog(SLOG_INFO, "session pulled", json_pack("{s:s,s:s}", "session", id, "from", p->url));
                free(body);
                return 1;
            }
            if (src == SESS_EEXIST) { /* a concurrent request pulled it first */
                free(body);
                return 1;
            }
            /* We took it but cannot keep it (limits): give it back. */
            peer_reply back_reply;
            snprintf(url, sizeof url, "%s/v1/sessions/%s/state", p->url, id);
            int back = peer_call(mg, (http_client_req){.method = "PUT", .url = url, .body = body, .len = blen},
                                 &back_reply, err, sizeof err);
            slog(SLOG_WARN, "session pull refused",
                 json_pack("{s:s,s:s,s:s,s:b}", "session", id, "from", p->url, "error", msg,
                           "returned", back == 0 && back_reply.status == 201));
            free(back_reply.body);
            free(body);
            return 0;
        }
        if (!moving)
            break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        nc_session *s = sessions_acquire(srv->sessions, id);
        if (s) {
            sessions_release(srv->sessions, s);
            return 1;
        }
    }
    return 0;
}

nc_session *migrate_acquire(nc_server *srv, const char *id, api_error *why, char *msg, size_t msglen)
{
    nc_session *s = sessions_acquire(srv->sessions, id);
    if (s)
        return s;
    bool draining = atomic_load(&srv->draining);
    if (!draining && srv->migration->npeers > 0 && migrate_id_url_safe(id) && pull(srv, id)) {
        s = sessions_acquire(srv->sessions, id);
        if (s)
            return s;
    }
    /* A concurrent request may have pulled it meanwhile. */
    s = sessions_acquire(srv->sessions, id);
    if (s)
        return s;
    char tag[16] = "";
    const char *mine = sessions_tag(srv->sessions);
    if (id_tag(id, tag, sizeof tag) && strcmp(tag, mine) != 0) {
        *why = API_SESSION_NOT_HERE;
        snprintf(msg, msglen,
                 "session '%s' belongs to replica '%s', not to this one ('%s'), and no peer "
                 "holds it: re-create it, or PUT its saved state to /v1/sessions/{id}/state",
                 id, tag, mine);
    } else if (draining) {
        *why = API_SESSION_MOVED;
        snprintf(msg, msglen, "this replica is draining and does not hold session '%s' (handed over): retry", id);
    } else {
        *why = API_SESSION_NOT_FOUND;
        snprintf(msg, msglen, "no session '%s' (unknown, deleted or expired)", id);
    }
    return NULL;
}

/* ---- drain ------------------------------------------------------------------- */

int migrate_drain(nc_server *srv, int *failed)
{
    const migration *mg = srv->migration;
    *failed = 0;
    char (*ids)[SESSION_ID_MAX] = NULL;
    size_t n = 0;
    if (mg->npeers == 0 || sessions_ids(srv->sessions, &ids, &n) != 0)
        return 0;
    int handed = 0;
    for (size_t i = 0; i < n; i++) {
        nc_session *s = sessions_acquire(srv->sessions, ids[i]);
        if (!s)
            continue;   /* pulled by a peer or deleted meanwhile */
        pthread_mutex_lock(&s->lock);
        bool ok = false;
        if (!sessions_removed(srv->sessions, s)) {
            void *blob = NULL;
            size_t len = 0;
            char err[NC_ERRLEN] = "";
            if (migrate_export(srv, s, &blob, &len, err, sizeof err) == NC_OK) {
                /* Round-robin start, then the next peers on failure. The lock
                 * is held across the PUT: a request waiting for it then sees
                 * the session gone and answers session_moved (retried). */
                for (int k = 0; k < mg->npeers && !ok; k++) {
                    const peer *p = &mg->peers[(i + (size_t)k) % (size_t)mg->npeers];
                    char url[512];
                    peer_reply put;
                    snprintf(url, sizeof url, "%s/v1/sessions/%s/state", p->url, s->id);
                    if (peer_call(mg, (http_client_req){.method = "PUT", .url = url, .body = blob, .len = len}, &put,
                                  err, sizeof err) == 0 &&
                        put.status == 201)
                        ok = true;
                    free(put.body);
                }
                free(blob);
            }
            if (ok)
                sessions_hand_over(srv->sessions, s->id);
        } else {
            ok = true;   /* already gone */
        }
        pthread_mutex_unlock(&s->lock);
        sessions_release(srv->sessions, s);
        if (ok) handed++;
        else (*failed)++;
    }
    free(ids);
    return handed;
}
