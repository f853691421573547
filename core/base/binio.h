/* binio.h -- host-endian binary records sealed by a CRC-32: a writer that
 * appends fields to a buffer or a file and a bounds-checked reader over the
 * bytes. The layout is data || u32 crc32(data) (zlib's CRC-32 of every byte
 * before it, magic included); the files that use it (stream blobs, training
 * checkpoints) resume on the machine that wrote them, not interchange.
 *
 * Both sides are "sticky": after the first failure (out of memory, a failed
 * write, a read past the end) every later call does nothing (reads give
 * zeros), so a record is written or read field by field and checked once. */
#ifndef NC_BINIO_H
#define NC_BINIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "buf.h"

/* zlib's CRC-32 continued from c (0 to start) over n bytes of any size. */
uint32_t binio_crc32(uint32_t c, const void *p, size_t n);

typedef struct {
    nc_buf *buf;                  /* appends here, or */
    FILE *f;                      /* writes here (nc_fwrite) */
    uint32_t crc;                 /* of everything written so far */
    bool bad;                     /* a write or allocation failed */
} binio_writer;

/* Starts a record at the end of buf / at f's position. */
void binio_writer_buf(binio_writer *w, nc_buf *buf);
void binio_writer_file(binio_writer *w, FILE *f);
void binio_put(binio_writer *w, const void *p, size_t n);
void binio_put_u32(binio_writer *w, uint32_t v);
void binio_put_i32(binio_writer *w, int32_t v);
void binio_put_f32(binio_writer *w, float v);
void binio_put_u64(binio_writer *w, uint64_t v);
/* Appends the CRC trailer. NC_OK, or NC_ENOMEM (buffer) / NC_EIO (file)
 * if any write of the record failed. */
int binio_seal(binio_writer *w);

typedef struct {
    const unsigned char *p;
    size_t n;                     /* bytes of data (the trailer excluded) */
    size_t off;                   /* next byte to read */
    bool bad;                     /* a read went past n */
} binio_reader;

/* Checks the trailer of data[0..len) and positions r at byte skip (a magic
 * the caller has checked). false when len < skip + 4 or the CRC differs. */
bool binio_open(binio_reader *r, const void *data, size_t len, size_t skip);
void binio_get(binio_reader *r, void *dst, size_t n);
uint32_t binio_get_u32(binio_reader *r);
int32_t binio_get_i32(binio_reader *r);
float binio_get_f32(binio_reader *r);
uint64_t binio_get_u64(binio_reader *r);
/* The next n bytes in place (NULL and bad when fewer are left). */
const void *binio_take(binio_reader *r, size_t n);
/* Bytes left to read (0 once bad). */
size_t binio_left(const binio_reader *r);
/* Whole and read to the end: no read failed and none is left. */
bool binio_done(const binio_reader *r);

#endif
