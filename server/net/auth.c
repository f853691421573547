/* auth.c -- API keys, per-key operations, namespaces and limits, and the
 * start-up checks (see auth.h for the key file and the rules). */
#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "slog.h"

#define AUTH_NAME_MAX 64
#define AUTH_SECRET_MAX 128            /* secrets are at most 127 bytes */
#define AUTH_SECRET_MIN 16
#define AUTH_KEYFILE_MAX (1 << 20)

struct auth_key {
    char name[AUTH_NAME_MAX];
    char secret[AUTH_SECRET_MAX];
    size_t secret_len;
    int ops;                           /* AUTH_* bits */
    bool all_ns;
    char (*ns)[AUTH_NAME_MAX];
    int nns;
    long max_sessions;                 /* 0 = unlimited */
    double rate;                       /* requests per second, 0 = unlimited */
    long tokens_per_min;               /* 0 = unlimited */
    /* mutable, under lock: */
    pthread_mutex_t lock;
    double rate_bucket, rate_t;        /* token bucket of requests */
    double tok_bucket, tok_t;          /* token bucket of model tokens */
    char (*sess)[SESSION_ID_MAX];      /* sessions this key created (maybe gone since) */
    int nsess, capsess;
    int pending_creates;
};

struct auth_table {
    auth_key *keys;
    int n;
};


/* ---- the key file -------------------------------------------------------- */

static bool valid_name(const char *s, size_t n)
{
    if (n == 0 || n >= AUTH_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-' || s[i] == '.'))
            return false;
    return true;
}

void auth_table_free(auth_table *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n; i++) {
        free(t->keys[i].ns);
        free(t->keys[i].sess);
        pthread_mutex_destroy(&t->keys[i].lock);
        /* The secret does not outlive the table in freed memory. */
        explicit_bzero(t->keys[i].secret, sizeof t->keys[i].secret);
    }
    free(t->keys);
    free(t);
}

int auth_table_count(const auth_table *t)
{
    return t ? t->n : 0;
}

/* Splits a comma list, calling fn on each item; returns -1 on an empty item
 * or when fn fails. */
static int each_item(const char *s, int (*fn)(auth_key *, const char *, size_t), auth_key *k)
{
    for (;;) {
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        if (n == 0 || fn(k, s, n) != 0)
            return -1;
        if (!c)
            return 0;
        s = c + 1;
    }
}

static int add_op(auth_key *k, const char *s, size_t n)
{
    if (n == 4 && !strncmp(s, "read", 4)) k->ops |= AUTH_READ;
    else if (n == 5 && !strncmp(s, "write", 5)) k->ops |= AUTH_WRITE;
    else if (n == 5 && !strncmp(s, "admin", 5)) k->ops |= AUTH_ADMIN;
    else if (n == 3 && !strncmp(s, "all", 3)) k->ops |= AUTH_READ | AUTH_WRITE | AUTH_ADMIN;
    else return -1;
    return 0;
}

static int add_ns(auth_key *k, const char *s, size_t n)
{
    if (n == 1 && s[0] == '*') {
        k->all_ns = true;
        return 0;
    }
    /* Names as the API accepts them; "." and ".." are never namespaces. */
    if (!valid_name(s, n) || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return -1;
    char (*nb)[AUTH_NAME_MAX] = realloc(k->ns, (size_t)(k->nns + 1) * sizeof *nb);
    if (!nb)
        return -1;
    k->ns = nb;
    memcpy(k->ns[k->nns], s, n);
    k->ns[k->nns][n] = 0;
    k->nns++;
    return 0;
}

static int parse_limit(auth_key *k, const char *f, char *err, size_t errlen, int line)
{
    const char *eq = strchr(f, '=');
    if (!eq) {
        snprintf(err, errlen, "line %d: '%s' is not NAME=VALUE", line, f);
        return -1;
    }
    char *end;
    errno = 0;
    double v = strtod(eq + 1, &end);
    if (errno || end == eq + 1 || *end || !isfinite(v) || v < 0 || v > 1e9) {
        snprintf(err, errlen, "line %d: limit '%s' is not a number in [0, 1e9]", line, f);
        return -1;
    }
    size_t n = (size_t)(eq - f);
    if (n == 8 && !strncmp(f, "sessions", 8) && v == floor(v)) k->max_sessions = (long)v;
    else if (n == 4 && !strncmp(f, "rate", 4)) k->rate = v;
    else if (n == 17 && !strncmp(f, "tokens_per_minute", 17) && v == floor(v)) k->tokens_per_min = (long)v;
    else {
        snprintf(err, errlen, "line %d: unknown limit '%.*s' (sessions, rate, tokens_per_minute; "
                 "sessions and tokens_per_minute are integers)", line, (int)n, f);
        return -1;
    }
    return 0;
}

/* Splits line l (comment cut) into at most 16 blank-separated fields.
 * Returns their number, or -1 (err set) when there are more. */
static int split_fields(char *l, char **fields, int line, char *err, size_t errlen)
{
    char *hash = strchr(l, '#');
    if (hash) *hash = 0;
    int nf = 0;
    char *fs = NULL;
    for (char *f = strtok_r(l, " \t\r", &fs); f; f = strtok_r(NULL, " \t\r", &fs)) {
        if (nf == 16) {
            snprintf(err, errlen, "line %d: too many fields", line);
            return -1;
        }
        fields[nf++] = f;
    }
    return nf;
}

/* The fields of one key line, checked: name, secret, operations,
 * namespaces, limits (auth.h). */
static int check_key(auth_key *k, char **fields, int nf, int line, char *err, size_t errlen)
{
    size_t sl = strlen(fields[1]);
    bool bad = true;
    if (!valid_name(fields[0], strlen(fields[0])))
        snprintf(err, errlen, "line %d: key name must be 1-63 characters of [A-Za-z0-9_.-]", line);
    else if (sl < AUTH_SECRET_MIN || sl >= AUTH_SECRET_MAX)
        snprintf(err, errlen, "line %d: key '%s' must be %d-%d characters long", line, fields[0], AUTH_SECRET_MIN,
                 AUTH_SECRET_MAX - 1);
    else if (each_item(fields[2], add_op, k) != 0)
        snprintf(err, errlen, "line %d: key '%s': operations must be a comma list of read, write, admin, all", line,
                 fields[0]);
    else if (each_item(fields[3], add_ns, k) != 0)
        snprintf(err, errlen, "line %d: key '%s': namespaces must be '*' or a comma list of names "
                 "of [A-Za-z0-9_.-] (not '.' or '..')", line, fields[0]);
    else
        bad = false;
    if (bad)
        return -1;
    for (int i = 4; i < nf; i++)
        if (parse_limit(k, fields[i], err, errlen, line) != 0)
            return -1;
    for (size_t i = 0; i < sl; i++)
        if ((unsigned char)fields[1][i] < 0x21 || (unsigned char)fields[1][i] > 0x7e) {
            snprintf(err, errlen, "line %d: key '%s' must be printable ASCII", line, fields[0]);
            return -1;
        }
    return 0;
}

/* Appends the key of one line (nf >= 4 fields) to t. 0, or -1 with err
 * set; a key added before the failure stays in t for auth_table_free. */
static int add_key(auth_table *t, char **fields, int nf, int line, char *err, size_t errlen)
{
    auth_key *nk = realloc(t->keys, (size_t)(t->n + 1) * sizeof *nk);
    if (!nk) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    t->keys = nk;
    auth_key *k = &t->keys[t->n];
    memset(k, 0, sizeof *k);
    pthread_mutex_init(&k->lock, NULL);
    t->n++;
    if (check_key(k, fields, nf, line, err, errlen) != 0)
        return -1;
    size_t sl = strlen(fields[1]);
    snprintf(k->name, sizeof k->name, "%s", fields[0]);
    memcpy(k->secret, fields[1], sl);
    k->secret_len = sl;
    int rc = 0;
    for (int i = 0; i + 1 < t->n && rc == 0; i++) {
        if (!strcmp(t->keys[i].name, k->name)) {
            snprintf(err, errlen, "line %d: key name '%s' is used twice", line, k->name);
            rc = -1;
        } else if (auth_equal(t->keys[i].secret, t->keys[i].secret_len, k->secret, k->secret_len)) {
            snprintf(err, errlen, "line %d: key '%s' has the same secret as '%s'", line, k->name, t->keys[i].name);
            rc = -1;
        }
    }
    k->rate_bucket = k->rate > 1 ? k->rate : 1;
    k->tok_bucket = (double)k->tokens_per_min;
    k->rate_t = k->tok_t = nc_now_s();
    return rc;
}

auth_table *auth_parse(const char *text, size_t len, char *err, size_t errlen)
{
    auth_table *t = calloc(1, sizeof *t);
    char *buf = malloc(len + 1);
    if (!t || !buf) {
        free(t);
        free(buf);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memcpy(buf, text, len);
    buf[len] = 0;
    int line = 0, ok = 1;
    if (memchr(text, 0, len)) {
        snprintf(err, errlen, "the key file contains a NUL byte");
        ok = 0;
    }
    char *next = NULL;
    for (char *l = ok ? buf : NULL; l && ok; l = next) {
        next = strchr(l, '\n');
        if (next)
            *next++ = 0;
        line++;
        char *fields[16];
        int nf = split_fields(l, fields, line, err, errlen);
        if (nf < 0) {
            ok = 0;
        } else if (nf > 0 && nf < 4) {
            snprintf(err, errlen, "line %d: expected NAME KEY OPERATIONS NAMESPACES [LIMITS], got %d fields",
                     line, nf);
            ok = 0;
        } else if (nf > 0) {
            ok = add_key(t, fields, nf, line, err, errlen) == 0;
        }
    }
    explicit_bzero(buf, len);
    free(buf);
    if (ok && t->n == 0) {
        snprintf(err, errlen, "no keys (every request would be refused)");
        ok = 0;
    }
    if (!ok) {
        auth_table_free(t);
        return NULL;
    }
    return t;
}

auth_table *auth_load_file(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "api key file '%s': cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    char msg[400] = "";
    char *buf = NULL;
    if (fstat(fd, &st) != 0) {
        snprintf(msg, sizeof msg, "stat failed: %s", strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(msg, sizeof msg, "not a regular file");
    } else if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        snprintf(msg, sizeof msg, "mode %04o lets its group or others read or write it; "
                 "chmod 600 (or 400) it", (unsigned)(st.st_mode & 07777));
    } else if (st.st_size > AUTH_KEYFILE_MAX) {
        snprintf(msg, sizeof msg, "larger than %d bytes", AUTH_KEYFILE_MAX);
    } else if (!(buf = malloc((size_t)st.st_size + 1))) {
        snprintf(msg, sizeof msg, "out of memory");
    } else {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                snprintf(msg, sizeof msg, "read failed: %s", r < 0 ? strerror(errno) : "file shrank");
                break;
            }
            got += (size_t)r;
        }
    }
    close(fd);
    auth_table *t = NULL;
    if (!msg[0]) {
        char perr[400] = "";
        t = auth_parse(buf, (size_t)st.st_size, perr, sizeof perr);
        if (!t)
            snprintf(msg, sizeof msg, "%s", perr);
    }
    if (buf) {
        explicit_bzero(buf, (size_t)st.st_size);
        free(buf);
    }
    if (!t)
        snprintf(err, errlen, "api key file '%s': %s", path, msg);
    return t;
}

/* ---- matching ------------------------------------------------------------- */

bool auth_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    unsigned char pa[AUTH_SECRET_MAX] = {0}, pb[AUTH_SECRET_MAX] = {0};
    memcpy(pa, a, alen < AUTH_SECRET_MAX ? alen : AUTH_SECRET_MAX);
    memcpy(pb, b, blen < AUTH_SECRET_MAX ? blen : AUTH_SECRET_MAX);
    /* Lengths and every byte are folded into one accumulator: no early exit. */
    volatile unsigned diff = (unsigned)((alen ^ blen) != 0) | (unsigned)(alen >= AUTH_SECRET_MAX) |
                             (unsigned)(blen >= AUTH_SECRET_MAX);
    for (size_t i = 0; i < AUTH_SECRET_MAX; i++)
        diff |= pa[i] ^ pb[i];
    return diff == 0;
}

const auth_key *auth_find(const auth_table *t, const char *token, size_t len)
{
    const auth_key *found = NULL;
    if (!t)
        return NULL;
    for (int i = 0; i < t->n; i++) {
        bool eq = auth_equal(t->keys[i].secret, t->keys[i].secret_len, token, len);
        found = eq ? &t->keys[i] : found;   /* every key is compared */
    }
    return found;
}

const char *auth_key_name(const auth_key *k)
{
    return k ? k->name : "";
}

bool auth_key_allows(const auth_key *k, int ops, const char *ns)
{
    if (!k || (k->ops & ops) != ops)
        return false;
    if (k->all_ns)
        return true;
    if (!ns || !*ns)
        ns = "default";
    for (int i = 0; i < k->nns; i++)
        if (!strcmp(k->ns[i], ns))
            return true;
    return false;
}

/* Operation of each route, by its endpoint label (routes.c). */
static const struct { const char *endpoint; int ops; } route_ops[] = {
    {"health", 0}, {"ready", 0},
    /* the page's static files (web.h): no data in them; every API call the
     * page makes carries the key the user typed and is checked here */
    {"web_page", 0}, {"web_asset", 0}, {"web_favicon", 0},
    {"metrics", AUTH_READ}, {"model", AUTH_READ}, {"models", AUTH_READ},
    {"sessions_create", AUTH_READ}, {"sessions_list", AUTH_READ}, {"sessions_get", AUTH_READ},
    {"sessions_delete", AUTH_READ}, {"predict", AUTH_READ}, {"score", AUTH_READ},
    {"completions", AUTH_READ}, {"chat_completions", AUTH_READ}, {"tokenize", AUTH_READ}, {"detokenize", AUTH_READ},
    {"tokenizer_info", AUTH_READ}, {"rescore", AUTH_READ}, {"rescore_session", AUTH_READ},
    /* generate advances one's own session as a feed without adapt does */
    {"generate", AUTH_READ},
    {"sessions_state_get", AUTH_READ}, {"namespaces_get", AUTH_READ}, {"documents_list", AUTH_READ},
    /* feed is a read of one's own session unless it adapts the namespace
     * ("adapt": true, checked in auth_check) */
    {"feed", AUTH_READ},
    {"documents", AUTH_WRITE},
    /* an imported state names its own namespace, which the URL does not
     * show: only admin keys (the replicas' peer_key) may import */
    {"sessions_state_put", AUTH_ADMIN},
    /* the list names every tenant's namespaces */
    {"namespaces_list", AUTH_ADMIN}, {"namespaces_delete", AUTH_ADMIN}, {"sessions_handoff", AUTH_ADMIN},
    /* a copy of every tenant's namespaces, written on the server's disk */
    {"backup", AUTH_ADMIN},
};

int auth_route_ops(const char *endpoint)
{
    if (!endpoint)
        return AUTH_ADMIN;
    for (size_t i = 0; i < sizeof route_ops / sizeof route_ops[0]; i++)
        if (!strcmp(route_ops[i].endpoint, endpoint))
            return route_ops[i].ops;
    /* Routes added later: streaming documents into a namespace adapts it
     * (write); namespace reads are reads; everything else is admin. */
    if (strstr(endpoint, "snapshot") || strstr(endpoint, "delete"))
        return AUTH_ADMIN;
    if (strstr(endpoint, "stream") || strstr(endpoint, "documents") || strstr(endpoint, "feed") ||
        strstr(endpoint, "adapt"))
        return AUTH_WRITE;
    if (strstr(endpoint, "predict") || strstr(endpoint, "score"))
        return AUTH_READ;
    return AUTH_ADMIN;
}

/* ---- start-up --------------------------------------------------------------- */

static bool is_loopback(const char *bind)
{
    return !strncmp(bind, "127.", 4) || !strcmp(bind, "::1") || !strcmp(bind, "localhost");
}

int auth_startup(nc_server *srv, char *err, size_t errlen)
{
    const nc_server_config *cfg = &srv->cfg;
    if (geteuid() == 0 && !cfg->allow_root) {
        snprintf(err, errlen, "refusing to run as root: run neurocached as an unprivileged user "
                 "(or pass --allow-root, e.g. inside a container)");
        return -1;
    }
    if (cfg->api_keys[0]) {
        auth_table *t = auth_load_file(cfg->api_keys, err, errlen);
        if (!t)
            return -1;
        auth_table_free(srv->auth);
        srv->auth = t;
        slog(SLOG_INFO, "api keys loaded", json_pack("{s:s,s:i}", "file", cfg->api_keys, "keys", t->n));
    } else if (!is_loopback(cfg->bind)) {
        slog(SLOG_WARN, "no api keys",
             json_pack("{s:s,s:s}", "bind", cfg->bind, "detail",
                       "listening beyond loopback without api_keys: anyone who reaches the port "
                       "may read and adapt every namespace"));
    }
    return 0;
}

void auth_shutdown(nc_server *srv)
{
    auth_table_free(srv->auth);
    srv->auth = NULL;
}

/* ---- per request --------------------------------------------------------- */

static const char *op_name(int ops)
{
    return ops & AUTH_ADMIN ? "admin" : ops & AUTH_WRITE ? "write" : "read";
}

/* Drops recorded sessions that no longer exist (deleted, evicted). */
static void prune_sessions(nc_server *srv, auth_key *k)
{
    int j = 0;
    for (int i = 0; i < k->nsess; i++) {
        char ns[SESSION_ID_MAX];
        if (srv->session_namespace(srv, k->sess[i], ns, sizeof ns)) {
            if (j != i) memcpy(k->sess[j], k->sess[i], sizeof k->sess[0]);
            j++;
        }
    }
    k->nsess = j;
}

/* The key of an "Authorization: Bearer" header's value h (NULL = no
 * header), or NULL with the reason in *why. */
static const auth_key *bearer_key(const auth_table *t, const char *h, const char **why)
{
    if (!h) {
        *why = "an API key is required: Authorization: Bearer <key>";
        return NULL;
    }
    while (*h == ' ') h++;
    if (strncasecmp(h, "Bearer ", 7) != 0) {
        *why = "the Authorization header must be 'Bearer <key>'";
        return NULL;
    }
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t')) n--;
    const auth_key *k = auth_find(t, h, n);
    if (!k)
        *why = "unknown API key";
    return k;
}

const auth_key *auth_identify(nc_server *srv, const char *authorization)
{
    const char *why;
    return srv->auth ? bearer_key(srv->auth, authorization, &why) : NULL;
}

static int refuse(auth_refusal *why, api_error code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(auth_refusal *why, api_error code, const char *fmt, ...)
{
    why->code = code;
    why->challenge = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->message, sizeof why->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* The namespace a request touches (ns; has_ns: it names one), or -1 with
 * why filled when it names a session of a namespace k cannot see. */
static int request_namespace(nc_server *srv, const auth_request *ar, const auth_key *k, char *ns, size_t nslen,
                             bool *has_ns, auth_refusal *why)
{
    ns[0] = 0;
    *has_ns = false;
    const char *pat = ar->pattern;
    if (!strncmp(pat, "/v1/namespaces/{", 16)) {
        snprintf(ns, nslen, "%s", ar->param);
        *has_ns = true;
    } else if (!strncmp(pat, "/v1/sessions/{", 14)) {
        if (srv->session_namespace(srv, ar->param, ns, nslen)) {
            if (!auth_key_allows(k, 0, ns))
                /* Indistinguishable from a session that does not exist. */
                return refuse(why, API_SESSION_NOT_FOUND, "no session '%s' (unknown, deleted or expired)",
                              ar->param);
        }
    } else if (ar->json && json_is_string(json_object_get(ar->json, "namespace"))) {
        snprintf(ns, nslen, "%s", json_string_value(json_object_get(ar->json, "namespace")));
        *has_ns = true;
    } else if (!strcmp(ar->endpoint, "sessions_create")) {
        *has_ns = true;                /* a session without namespace lives in "default" */
    }
    return 0;
}

int auth_check(nc_server *srv, const auth_request *ar, const auth_key **key, auth_refusal *why)
{
    *key = NULL;
    auth_table *t = srv->auth;
    if (!t)
        return 0;
    int ops = auth_route_ops(ar->endpoint);
    if (ops == 0)
        return 0;
    if (!strcmp(ar->endpoint, "feed") && ar->json && json_is_true(json_object_get(ar->json, "adapt")))
        ops |= AUTH_WRITE;
    const char *reason = NULL;
    auth_key *k = (auth_key *)bearer_key(t, ar->authorization, &reason);
    if (!k) {
        refuse(why, API_UNAUTHORIZED, "%s", reason);
        /* RFC 6750 section 3: every 401 names the scheme; a key that was
         * sent but is not known is an invalid_token */
        why->challenge = ar->authorization ? "Bearer realm=\"neurocache\", error=\"invalid_token\""
                                           : "Bearer realm=\"neurocache\"";
        return -1;
    }
    if ((k->ops & ops) != ops)
        return refuse(why, API_FORBIDDEN, "key '%s' may not %s (%s %s)", k->name, op_name(ops), ar->method, ar->url);
    /* The namespace the request touches. */
    char ns[128];                  /* as long as a URL capture */
    bool has_ns;
    if (request_namespace(srv, ar, k, ns, sizeof ns, &has_ns, why) != 0)
        return -1;
    if (has_ns && !auth_key_allows(k, 0, ns))
        return refuse(why, API_FORBIDDEN, "key '%s' has no access to namespace '%s'", k->name,
                      ns[0] ? ns : "default");
    /* Limits. */
    int rc = 0;
    pthread_mutex_lock(&k->lock);
    double now = nc_now_s();
    if (k->rate > 0) {
        double cap = k->rate > 1 ? k->rate : 1;
        k->rate_bucket = fmin(cap, k->rate_bucket + (now - k->rate_t) * k->rate);
        k->rate_t = now;
        if (k->rate_bucket < 1) {
            rc = refuse(why, API_RATE_LIMITED, "key '%s': over %g requests per second", k->name, k->rate);
        } else {
            k->rate_bucket -= 1;
        }
    }
    if (rc == 0 && k->tokens_per_min > 0) {
        double cap = (double)k->tokens_per_min;
        k->tok_bucket = fmin(cap, k->tok_bucket + (now - k->tok_t) * cap / 60.0);
        k->tok_t = now;
        if (k->tok_bucket <= 0) {
            rc = refuse(why, API_TOKEN_BUDGET, "key '%s': over %ld tokens per minute", k->name,
                        k->tokens_per_min);
        }
    }
    if (rc == 0 && k->max_sessions > 0 && !strcmp(ar->endpoint, "sessions_create")) {
        prune_sessions(srv, k);
        if (k->nsess + k->pending_creates >= k->max_sessions) {
            rc = refuse(why, API_TOO_MANY_SESSIONS, "key '%s' already has %d sessions (its limit)", k->name,
                        k->nsess + k->pending_creates);
        } else {
            k->pending_creates++;
        }
    }
    pthread_mutex_unlock(&k->lock);
    if (rc == 0)
        *key = k;
    return rc;
}

/* Model tokens an answer reports: completions' usage, feed's "consumed",
 * score's token list, or a "tokens" count. */
static long answer_tokens(const json_t *j)
{
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u) && json_is_integer(json_object_get(u, "total_tokens")))
        return (long)json_integer_value(json_object_get(u, "total_tokens"));
    if (json_is_integer(json_object_get(j, "consumed")))
        return (long)json_integer_value(json_object_get(j, "consumed"));
    if (json_is_integer(json_object_get(j, "tokens_added")))
        return (long)json_integer_value(json_object_get(j, "tokens_added"));
    json_t *tk = json_object_get(j, "tokens");
    if (json_is_array(tk))
        return (long)json_array_size(tk);
    if (json_is_integer(tk))
        return (long)json_integer_value(tk);
    return 0;
}

void auth_done(nc_server *srv, const auth_key *key, const char *endpoint, unsigned status, const json_t *answer,
               long text_tokens)
{
    (void)srv;
    if (!key)
        return;
    auth_key *k = (auth_key *)key;
    bool create = !strcmp(endpoint, "sessions_create");
    long tokens = 0;
    if (answer && status == 200 && strcmp(endpoint, "tokenize") && strcmp(endpoint, "detokenize") &&
        strncmp(endpoint, "sessions_", 9))
        tokens = answer_tokens(answer);
    else if (!answer && status == 200)
        tokens = text_tokens;     /* an answer written as text (http_response.text_tokens) */
    const char *id = create && status == 201 && answer ? json_string_value(json_object_get(answer, "id")) : NULL;
    if (!tokens && !create)
        return;
    pthread_mutex_lock(&k->lock);
    if (tokens > 0 && k->tokens_per_min > 0)
        k->tok_bucket -= (double)tokens;   /* may go negative: the next requests wait */
    if (create && k->max_sessions > 0) {
        if (k->pending_creates > 0)
            k->pending_creates--;
        if (id && strlen(id) < SESSION_ID_MAX) {
            if (k->nsess == k->capsess) {
                int cap = k->capsess ? 2 * k->capsess : 8;
                char (*nb)[SESSION_ID_MAX] = realloc(k->sess, (size_t)cap * sizeof *nb);
                if (nb) {
                    k->sess = nb;
                    k->capsess = cap;
                }
            }
            if (k->nsess < k->capsess)
                snprintf(k->sess[k->nsess++], SESSION_ID_MAX, "%s", id);
        }
    }
    pthread_mutex_unlock(&k->lock);
}
