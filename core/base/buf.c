/* buf.c -- the growable byte buffer (see buf.h). */
#include "buf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "nc_common.h"

int buf_reserve(nc_buf *b, size_t extra)
{
    NC_ASSERT(b, "buf_reserve: no b");
    if (b->oom)
        return NC_ENOMEM;
    if (extra < b->cap - b->len && b->data)
        return NC_OK;
    if (extra > SIZE_MAX / 2 - b->len - 1) {
        b->oom = true;
        return NC_ENOMEM;
    }
    /* doubling keeps n appends O(n) bytes copied in total */
    size_t need = b->len + extra + 1, c = b->cap ? b->cap : 64;
    while (c < need)
        c *= 2;
    char *p = nc_realloc(b->data, c);
    if (!p) {
        b->oom = true;
        return NC_ENOMEM;
    }
    b->data = p;
    b->cap = c;
    b->data[b->len] = 0;
    NC_ASSERT(b->len < b->cap, "buf_reserve: length %zu, capacity %zu", b->len, b->cap);
    return NC_OK;
}

int buf_append(nc_buf *b, const void *p, size_t n)
{
    NC_ASSERT(b, "buf_append: no b");
    if (buf_reserve(b, n) != NC_OK)
        return NC_ENOMEM;
    NC_ASSERT(b->data && b->len + n < b->cap, "buf_append: %zu + %zu bytes into %zu", b->len, n, b->cap);
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return NC_OK;
}

int buf_vprintf(nc_buf *b, const char *fmt, va_list ap)
{
    NC_ASSERT(b, "buf_vprintf: no b");
    if (buf_reserve(b, 0) != NC_OK)
        return NC_ENOMEM;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    int rc = n < 0 ? NC_EINVAL : NC_OK;
    if (n >= 0 && (size_t)n >= b->cap - b->len) {
        /* did not fit: grow to the size it told us, then format again */
        rc = buf_reserve(b, (size_t)n);
        if (rc == NC_OK)
            vsnprintf(b->data + b->len, b->cap - b->len, fmt, again);
    }
    va_end(again);
    if (rc == NC_OK)
        b->len += (size_t)n;
    b->data[b->len] = 0;
    return rc;
}

int buf_printf(nc_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void buf_clear(nc_buf *b)
{
    NC_ASSERT(b, "buf_clear: no b");
    b->len = 0;
    b->oom = false;
    if (b->data)
        b->data[0] = 0;
}

char *buf_detach(nc_buf *b, size_t *len)
{
    char *d = NULL;
    if (!b->oom && buf_reserve(b, 0) == NC_OK)
        d = b->data;
    else
        free(b->data);
    if (len)
        *len = d ? b->len : 0;
    *b = (nc_buf)NC_BUF_INIT;
    return d;
}

void buf_free(nc_buf *b)
{
    if (!b)
        return;
    free(b->data);
    *b = (nc_buf)NC_BUF_INIT;
}

/* Reads fd to its end into b. 0, or -1 with errno (ENOMEM when b is full). */
static int read_fd(nc_buf *b, int fd)
{
    for (;;) {
        size_t room = b->cap - b->len - 1;
        if (!b->data || room < 65536) {
            /* at least 64 KiB per read, and the buffer's doubling beyond */
            if (buf_reserve(b, b->cap > 65536 ? b->cap : 65536) != NC_OK) {
                errno = ENOMEM;
                return -1;
            }
            room = b->cap - b->len - 1;
        }
        ssize_t r = nc_read(fd, b->data + b->len, room);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return 0;
        b->len += (size_t)r;
        b->data[b->len] = 0;
    }
}

int buf_read_stream(nc_buf *b, FILE *f, const char *name, char *err, size_t errlen)
{
    if (read_fd(b, fileno(f)) == 0)
        return NC_OK;
    if (errno == ENOMEM)
        return nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", name);
    return nc_error(err, errlen, NC_EIO, "%s: read error: %s", name, strerror(errno));
}

int buf_read_file(nc_buf *b, const char *path, char *err, size_t errlen)
{
    int fd = nc_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: cannot open: %s", path,
                        strerror(errno));
    int r = read_fd(b, fd), e = errno;
    close(fd);
    if (r == 0)
        return NC_OK;
    if (e == ENOMEM)
        return nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
    return nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(e));
}
