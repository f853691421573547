/* slog.h -- structured logs on stderr: one JSON object a line, or text. */
#ifndef NC_SERVER_SLOG_H
#define NC_SERVER_SLOG_H

#include <jansson.h>

enum { SLOG_DEBUG = 0, SLOG_INFO = 1, SLOG_WARN = 2, SLOG_ERROR = 3 };

/* format: LOG_FORMAT_JSON or LOG_FORMAT_TEXT (config.h); lines below
 * min_level are dropped. Call once before any thread logs. */
void slog_init(int format, int min_level);

/* Logs one event. fields (an object or NULL) is stolen: the caller must not
 * use it afterwards. JSON form: {"ts":..,"level":..,"msg":event, fields...};
 * text form: "TS LEVEL event k=v ...". Lines are written with one write(2)
 * so concurrent threads never interleave. */
void slog(int level, const char *event, json_t *fields);

/* True when level would be logged (to skip building fields). */
int slog_enabled(int level);

#endif
