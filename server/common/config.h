/* config.h -- the daemon's options: one table of typed, range-checked
 * options, read from an INI file (libinih) and overridden by flags. */
#ifndef NC_SERVER_CONFIG_H
#define NC_SERVER_CONFIG_H

#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>

#include "cache_params.h"

enum { LOG_FORMAT_JSON = 0, LOG_FORMAT_TEXT = 1 };

typedef struct {
    /* [server] */
    char bind[256];              /* listen address, IPv4 or IPv6 literal */
    int port;                    /* 0 = ephemeral (actual port is logged) */
    char port_file[1024];        /* if set, the bound port is written here */
    char model[1024];            /* model directory */
    char data_dir[1024];         /* namespaces, snapshots, logs (next issue) */
    int threads;                 /* workers for heavy requests, 0 = number of cores */
    int worker_nice;             /* their nice value */
    int max_connections;         /* open client connections */
    int connection_timeout_s;    /* idle connections close after this */
    bool batch_predict;          /* predictions of concurrent sessions share one decoder GEMM */
    int batch_threads;           /* threads running those batches, 0 = number of cores */
    int max_batch;               /* most predictions in one batch */
    int log_format;              /* LOG_FORMAT_JSON | LOG_FORMAT_TEXT */
    int log_level;               /* 0 debug, 1 info, 2 warn, 3 error */
    bool log_requests;           /* one log line per request (debug level) */
    int drain_timeout_s;         /* SIGTERM: longest wait for in-flight work */
    char replica_tag[16];        /* prefix of session ids (scale-out) */
    char peers[2048];            /* other replicas: "tag=url,..." (server/domain/migrate.h) */
    char peer_key[128];          /* API key presented to the peers ("" = none) */
    int drain_grace_s;           /* SIGTERM: seconds serving with /ready 503 before hand-over */
    bool web;                    /* serve the page at GET / (server/net/web.h) */
    /* [replication] (server/replication/replication.h) */
    char redis[256];             /* host:port of Redis; "" = no replication */
    char redis_prefix[64];       /* key prefix of the streams */
    long redis_maxlen;           /* approximate cap of each stream, 0 = none */
    /* [limits] */
    long max_body_bytes;         /* 413 above */
    long max_tokens_per_request; /* LSTM steps per request, 413 above */
    long max_generation_steps;   /* full-softmax steps per completion request */
    long max_neighbours_per_request; /* unbounded-cache neighbours searched */
    int request_timeout_s;       /* deadline of a request's wait and work */
    int max_queued;              /* heavy requests waiting for a worker, 429 above */
    int max_predict_text_tokens; /* tokens a predict's "text" feeds in its batch, 413 above */
    int max_top_k;               /* largest top_k / logprobs answered */
    int max_completion_tokens;   /* largest max_tokens in /v1/completions */
    int malloc_trim_s;           /* seconds between malloc_trim calls, 0 = never */
    /* [sessions] */
    int max_sessions;            /* 429 when reached */
    int session_ttl_s;           /* idle sessions are evicted after this */
    long session_memory_mb;      /* budget for all sessions together, 429 over */
    /* [cache] defaults of every session and of /v1/score: one key per row of
     * the core's knob table (core/knobs/cache_knobs.h) */
    nc_cache_params cache;
    /* [security] (server/net/auth.h) */
    char api_keys[1024];         /* API key file; "" = no keys (open API, loopback by default) */
    bool allow_root;             /* start even when running as root */
    /* [namespaces] (server/domain/namespaces.h) */
    int fsync_mode;              /* nc_wal_sync: 0 group, 1 each, 2 none */
    int snapshot_period_s;       /* seconds between snapshots, 0 = only at shutdown */
    char index_factory[128];     /* FAISS factory of the IVF index, "" = IVF4096,PQ{H/4}x4 */
    long index_switch_at;        /* pairs at which a namespace leaves the flat index */
    bool index_train_self;       /* no unbounded.faiss: train the IVF index on the pairs */
    bool index_own_training;     /* each namespace trains (and re-trains) its own IVF index */
    double index_recall_target;  /* nprobe chosen at each training to meet it */
} nc_server_config;

/* Types of the option table. */
/* OPT_CACHE_KNOB: a row of the core's knob table, set and checked by it */
typedef enum { OPT_INT, OPT_LONG, OPT_DOUBLE, OPT_BOOL, OPT_STRING, OPT_ENUM, OPT_CACHE_KNOB } config_type;

typedef struct {
    const char *section;         /* INI section */
    const char *name;            /* INI key; flag is --name with '_' -> '-' */
    config_type type;
    size_t offset;               /* into nc_server_config */
    size_t size;                 /* OPT_STRING: buffer size */
    double min, max;             /* numeric range, inclusive */
    const char *enums;           /* OPT_ENUM: "json|text", index = value */
    const char *defval;          /* default, as text */
    const char *help;
} config_option;

/* The table, terminated by a row with name == NULL. */
const config_option *config_options(void);

/* The value of an integer option (OPT_INT, OPT_LONG) of c: 0, or -1 for
 * another type. */
int config_get_integer(const nc_server_config *c, const config_option *o, long long *out);

/* Fills every option with its default. */
void config_defaults(nc_server_config *c);

/* Sets one option from text. Returns 0, or -1 with a message naming the
 * option and the accepted values in err. */
int config_set(nc_server_config *c, const char *name, const char *value,
               char *err, size_t errlen);

/* Reads an INI file (sections must match the table's). Unknown keys, bad
 * values and unreadable files are errors (-1, message in err). */
int config_load_file(nc_server_config *c, const char *path, char *err, size_t errlen);

/* Parses argv: --config FILE is applied first, then every other flag
 * (--name VALUE or --name=VALUE) overrides the file. --help prints usage and
 * returns 1. Returns 0 on success, -1 with a message on error. */
int config_from_args(nc_server_config *c, int argc, char **argv, char *err, size_t errlen);

/* Prints the flag list with defaults. */
void config_usage(FILE *f);

#endif
