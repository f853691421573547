/* binio.c -- CRC-sealed binary records (see binio.h). */
#include "binio.h"

#include <string.h>
#include <zlib.h>

#include "fault.h"
#include "nc_common.h"

/* zlib takes uInt lengths: large blocks go in pieces */
uint32_t binio_crc32(uint32_t c, const void *p, size_t n)
{
    const unsigned char *b = p;
    uLong x = c;
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        x = crc32(x, b, k);
        b += k;
        n -= k;
    }
    return (uint32_t)x;
}

void binio_writer_buf(binio_writer *w, nc_buf *buf)
{
    NC_ASSERT(buf, "binio_writer_buf: no buf");
    *w = (binio_writer){.buf = buf, .crc = (uint32_t)crc32(0L, Z_NULL, 0), .bad = buf->oom};
}

void binio_writer_file(binio_writer *w, FILE *f)
{
    *w = (binio_writer){.f = f, .crc = (uint32_t)crc32(0L, Z_NULL, 0), .bad = f == NULL};
}

void binio_put(binio_writer *w, const void *p, size_t n)
{
    if (w->bad || n == 0)
        return;
    if (w->buf)
        w->bad = buf_append(w->buf, p, n) != NC_OK;
    else
        w->bad = nc_fwrite(p, 1, n, w->f) != n;
    if (!w->bad)
        w->crc = binio_crc32(w->crc, p, n);
}

void binio_put_u32(binio_writer *w, uint32_t v) { binio_put(w, &v, sizeof v); }
void binio_put_i32(binio_writer *w, int32_t v) { binio_put(w, &v, sizeof v); }
void binio_put_f32(binio_writer *w, float v) { binio_put(w, &v, sizeof v); }
void binio_put_u64(binio_writer *w, uint64_t v) { binio_put(w, &v, sizeof v); }

int binio_seal(binio_writer *w)
{
    uint32_t crc = w->crc;
    binio_put(w, &crc, sizeof crc);
    return !w->bad ? NC_OK : w->buf ? NC_ENOMEM : NC_EIO;
}

bool binio_open(binio_reader *r, const void *data, size_t len, size_t skip)
{
    *r = (binio_reader){.p = data, .bad = true};
    if (!data || len < skip + 4)
        return false;
    uint32_t crc;
    memcpy(&crc, (const unsigned char *)data + len - 4, 4);
    if (crc != binio_crc32((uint32_t)crc32(0L, Z_NULL, 0), data, len - 4))
        return false;
    *r = (binio_reader){.p = data, .n = len - 4, .off = skip};
    return true;
}

const void *binio_take(binio_reader *r, size_t n)
{
    NC_ASSERT(r, "binio_take: no r");
    if (r->bad || r->n - r->off < n) {
        r->bad = true;
        return NULL;
    }
    const void *p = r->p + r->off;
    r->off += n;
    return p;
}

void binio_get(binio_reader *r, void *dst, size_t n)
{
    const void *p = binio_take(r, n);
    if (p)
        memcpy(dst, p, n);
    else
        memset(dst, 0, n);
}

uint32_t binio_get_u32(binio_reader *r) { uint32_t v; binio_get(r, &v, sizeof v); return v; }
int32_t binio_get_i32(binio_reader *r) { int32_t v; binio_get(r, &v, sizeof v); return v; }
float binio_get_f32(binio_reader *r) { float v; binio_get(r, &v, sizeof v); return v; }
uint64_t binio_get_u64(binio_reader *r) { uint64_t v; binio_get(r, &v, sizeof v); return v; }

size_t binio_left(const binio_reader *r)
{
    NC_ASSERT(r, "binio_left: no r");
    return r->bad ? 0 : r->n - r->off;
}

bool binio_done(const binio_reader *r)
{
    return !r->bad && r->off == r->n;
}
