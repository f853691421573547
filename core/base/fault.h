/* fault.h -- fault simulation for the core's allocations and file I/O, in the
 * style of SQLite's (test_malloc.c / the "ioerr" tests): a test arms a fault
 * kind to fail at the N-th call from now, optionally at every call after it,
 * and then checks that the operation fails cleanly and succeeds again once the
 * fault is disarmed.
 *
 * The core calls its allocations and I/O through the wrappers below. While no
 * fault is armed a wrapper costs one relaxed atomic load and a predicted
 * branch; building with -DNC_FAULT_DISABLE removes even that (the wrappers
 * become the plain libc calls).
 *
 * Faults are process-wide but counted only on the threads that opt in
 * (nc_fault_thread(true)), or on every thread when armed with
 * NC_FAULT_ALL_THREADS (the daemon armed from the environment), so a test's
 * count is not disturbed by library worker threads. */
#ifndef NC_FAULT_H
#define NC_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

typedef enum {
    NC_FAULT_ALLOC = 0,   /* nc_alloc, nc_calloc, nc_malloc, nc_zalloc, nc_realloc: NULL */
    NC_FAULT_READ,        /* opening for reading, read, pread, fread, getline, mmap: EIO */
    NC_FAULT_WRITE,       /* opening for writing, write, fwrite: ENOSPC */
    NC_FAULT_FSYNC,       /* fsync, fdatasync: EIO */
    NC_FAULT_NKINDS
} nc_fault_kind;

enum {
    NC_FAULT_PERSIST = 1,      /* fail every call from the N-th on, not only the N-th */
    NC_FAULT_ALL_THREADS = 2,  /* count calls on every thread */
};

/* Arms kind to fail at the nth call (1-based) counted from now. flags:
 * NC_FAULT_PERSIST, NC_FAULT_ALL_THREADS. nth <= 0 disarms the kind. */
void nc_fault_arm(nc_fault_kind kind, long nth, int flags);
/* Disarms every kind (counters keep their values until the next arm). */
void nc_fault_disarm(void);
/* Calls of kind counted since it was armed, and how many of them failed.
 * A walk over N stops when a run finishes with hits == 0: the operation
 * made fewer than N calls of that kind. */
long nc_fault_calls(nc_fault_kind kind);
long nc_fault_hits(nc_fault_kind kind);
/* Opts the calling thread in (or out) of counting. */
void nc_fault_thread(bool on);
/* The errno a failing call of kind sets, instead of its default (ENOMEM,
 * EIO, ENOSPC for writes, EIO): a write failing with EIO is an I/O error,
 * not a full disk. 0 restores the default; nc_fault_disarm does too. */
void nc_fault_errno(nc_fault_kind kind, int err);
/* Arms from a spec such as "alloc:12", "write:3+" ('+' = persistent),
 * "fsync:1,read:4" (every thread), "write:2+=EIO" (failing with that errno:
 * EIO, ENOSPC, EDQUOT, EFBIG or ENOMEM). Returns 0, or -1 on a malformed
 * spec. NULL or "" disarms. Used by the daemon for NEUROCACHE_FAULT. */
int nc_fault_from_spec(const char *spec);
/* Name of a kind ("alloc", "read", "write", "fsync"). */
const char *nc_fault_name(nc_fault_kind kind);

#ifndef NC_FAULT_DISABLE
extern atomic_int nc_fault_active;   /* armed kinds, as a bit set */
/* Out of line: counts the call; true when it must fail (errno is set). */
bool nc_fault_hit(nc_fault_kind kind);
static inline bool nc_fault_fail(nc_fault_kind kind)
{
    if (__builtin_expect(atomic_load_explicit(&nc_fault_active, memory_order_relaxed) != 0, 0))
        return nc_fault_hit(kind);
    return false;
}
#else
static inline bool nc_fault_fail(nc_fault_kind kind) { (void)kind; return false; }
#endif

/* Allocation wrappers with libc's contracts (free with free(); nc_alloc and
 * nc_calloc in nc_common.h, 64-byte aligned and NULL for 0 bytes, consult
 * NC_FAULT_ALLOC too). nc_zalloc is calloc: zeroed, count * size checked
 * for overflow. The core allocates only through these and nc_common.h's;
 * tests/check_layering.sh fails the build's tests on a raw call. */
void *nc_malloc(size_t n);
void *nc_zalloc(size_t count, size_t size);
void *nc_realloc(void *p, size_t n);

/* I/O wrappers with the libc contracts: on an injected fault they return the
 * failure value of the wrapped call with errno EIO (ENOSPC for writes). The
 * core reads and writes files only through them, so a test can fail any of
 * its I/O. nc_fread's injected failure returns 0 without setting the
 * stream's error flag: callers compare the count, never ferror() alone. */
FILE *nc_fopen(const char *path, const char *mode);
int nc_open(const char *path, int flags, int mode);
ssize_t nc_read(int fd, void *buf, size_t n);
ssize_t nc_pread(int fd, void *buf, size_t n, off_t off);
size_t nc_fread(void *p, size_t size, size_t n, FILE *f);
ssize_t nc_write(int fd, const void *buf, size_t n);
struct iovec;
ssize_t nc_writev(int fd, const struct iovec *iov, int n);
size_t nc_fwrite(const void *p, size_t size, size_t n, FILE *f);
ssize_t nc_getline(char **line, size_t *cap, FILE *f);
int nc_fsync(int fd);
int nc_fdatasync(int fd);
void *nc_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

#endif
