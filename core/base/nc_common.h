/* nc_common.h -- error codes and small helpers shared by the whole core. */
#ifndef NC_COMMON_H
#define NC_COMMON_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

/* Every fallible core function returns an int rc: NC_OK or a negative code,
 * and writes a human-readable message into the caller's (err, errlen) buffer
 * (which may be NULL/0). The core never prints. */
enum {
    NC_OK = 0,
    NC_EINVAL = -1,   /* bad argument / out-of-range parameter */
    NC_ENOMEM = -2,   /* allocation failed */
    NC_EIO = -3,      /* read/write/fsync failed (errno in message) */
    NC_EFORMAT = -4,  /* malformed file or input data */
    NC_ENOTFOUND = -5,/* missing file, word, entry */
    NC_ESTATE = -6,   /* operation not valid in the current state */
    NC_ENOSPACE = -7, /* a write failed for lack of room (ENOSPC, EFBIG, EDQUOT) */
};

#define NC_ERRLEN 512

/* NC_ASSERT(cond, fmt, ...): an invariant one tier establishes and another
 * relies on (proto's parse for the server's handlers, the safetensors reader
 * for the model, the record encoder for its length), checked where it is
 * relied on. Never a check of input: files, requests and options get error
 * returns. Kept in release builds, so only for cheap conditions; a failure
 * is a bug: it prints "file:line: invariant 'cond' failed: message" to
 * stderr (the one place the core writes there) and aborts, leaving a core
 * dump, before wrong data goes further. */
#define NC_ASSERT(cond, ...) \
    (__builtin_expect(!!(cond), 1) ? (void)0 : nc_assert_fail(#cond, __FILE__, __LINE__, __VA_ARGS__))
_Noreturn void nc_assert_fail(const char *cond, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* printf-style: writes the message into err (if non-NULL) and returns rc,
 * so callers can `return nc_error(err, errlen, NC_EINVAL, "...", ...)`. */
int nc_error(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* IEEE half <-> single conversion (round to nearest even). */
float nc_half_to_float(uint16_t h);
uint16_t nc_float_to_half(float f);

/* Seconds on CLOCK_MONOTONIC: the one clock of durations and deadlines
 * (sessions' idle times, rate limits, phases' timings). */
double nc_now_s(void);

/* Allocation that never returns unaligned memory for SIMD/BLAS (64 bytes);
 * free with nc_free (NULL allowed). Returns NULL on failure or n == 0. */
void *nc_alloc(size_t n);
void *nc_calloc(size_t count, size_t size);
void nc_free(void *p);

#endif
