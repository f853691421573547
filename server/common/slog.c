/* slog.c -- structured logs on stderr: one JSON object a line, or text. */
#include "slog.h"
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int slog_format = LOG_FORMAT_JSON;
static int slog_min = SLOG_INFO;
static const char *level_names[] = {"debug", "info", "warn", "error"};

void slog_init(int format, int min_level)
{
    slog_format = format;
    slog_min = min_level;
}

int slog_enabled(int level)
{
    return level >= slog_min;
}

static void timestamp(char *buf, size_t n)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%03dZ", (int)(tv.tv_usec / 1000));
}

static void write_all(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

void slog(int level, const char *event, json_t *fields)
{
    if (level < slog_min || level < 0 || level > SLOG_ERROR) {
        json_decref(fields);
        return;
    }
    char ts[48];
    timestamp(ts, sizeof ts);
    char *line = NULL;
    if (slog_format == LOG_FORMAT_JSON) {
        json_t *o = json_pack("{s:s,s:s,s:s}", "ts", ts, "level", level_names[level], "msg", event);
        if (o && fields)
            json_object_update(o, fields);
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
        json_decref(o);
        if (s) {
            size_t n = strlen(s);
            line = malloc(n + 2);
            if (line) {
                memcpy(line, s, n);
                line[n] = '\n';
                line[n + 1] = 0;
            }
            free(s);
        }
    } else {
        size_t cap = 256, len = 0;
        line = malloc(cap);
        if (line)
            len = (size_t)snprintf(line, cap, "%s %-5s %s", ts, level_names[level], event);
        const char *key;
        json_t *v;
        if (fields && line)
            json_object_foreach(fields, key, v) {
                char *vs = json_is_string(v) ? strdup(json_string_value(v))
                                             : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(9));
                if (!vs)
                    continue;
                size_t need = len + strlen(key) + strlen(vs) + 4;
                if (need > cap) {
                    while (cap < need) cap *= 2;
                    char *nl = realloc(line, cap);
                    if (!nl) { free(vs); break; }
                    line = nl;
                }
                len += (size_t)snprintf(line + len, cap - len, " %s=%s", key, vs);
                free(vs);
            }
        if (line) {
            if (len + 2 > cap) {
                char *nl = realloc(line, len + 2);
                if (nl) line = nl;
                else len = cap - 2;
            }
            line[len] = '\n';
            line[len + 1] = 0;
        }
    }
    if (line) {
        write_all(line, strlen(line));
        free(line);
    }
    json_decref(fields);
}
