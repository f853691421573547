/* buf.h -- a growable byte buffer: the one way the core and the programs on
 * it accumulate bytes whose length is not known in advance (a record being
 * built, a file read whole, a response body).
 *
 *     nc_buf b = NC_BUF_INIT;
 *     buf_append(&b, p, n);  buf_printf(&b, "%d", x);  ...
 *     if (b.oom) ...;  use b.data[0 .. b.len);  buf_free(&b);
 *
 * data is always NUL-terminated after len (once anything was reserved), so a
 * text buffer is a C string. A failed growth sets oom and freezes the buffer:
 * later appends do nothing, so a caller may append a whole record and check
 * once at the end (the failure is also each call's return value). Growth
 * goes through nc_realloc, so allocation faults (fault.h) reach it. */
#ifndef NC_BUF_H
#define NC_BUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    char *data;                   /* NULL until the first growth; owned by the buffer */
    size_t len;                   /* bytes held */
    size_t cap;                   /* bytes allocated (room for len + 1) */
    bool oom;                     /* a growth failed: frozen, see above */
} nc_buf;

#define NC_BUF_INIT {NULL, 0, 0, false}

/* Makes room for extra more bytes (and the NUL). NC_OK or NC_ENOMEM. */
int buf_reserve(nc_buf *b, size_t extra);
/* Appends n bytes of p (p may be NULL when n == 0). NC_OK or NC_ENOMEM. */
int buf_append(nc_buf *b, const void *p, size_t n);
/* Appends formatted text. NC_OK, NC_ENOMEM, or NC_EINVAL on a bad format. */
int buf_printf(nc_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int buf_vprintf(nc_buf *b, const char *fmt, va_list ap);
/* Empties the buffer, keeping its memory and clearing oom. */
void buf_clear(nc_buf *b);
/* Hands the bytes to the caller (free() them; never NULL unless oom: an
 * empty buffer gives ""), *len (optional) their count, and resets b. */
char *buf_detach(nc_buf *b, size_t *len);
/* Frees the bytes and resets b. NULL allowed. */
void buf_free(nc_buf *b);

/* Appends everything left in f (a file, or stdin) through the
 * fault-injection read wrapper. NC_OK, NC_ENOMEM, or NC_EIO with "name:
 * reason" in err. f stays open. */
int buf_read_stream(nc_buf *b, FILE *f, const char *name, char *err, size_t errlen);
/* Appends the whole file at path (opened with nc_open, read with nc_read).
 * NC_ENOTFOUND when it does not exist, NC_EIO, NC_ENOMEM; err names path
 * ("<path>: cannot open: <reason>", "<path>: read error: <reason>"). */
int buf_read_file(nc_buf *b, const char *path, char *err, size_t errlen);

#endif
