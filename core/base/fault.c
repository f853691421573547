/* fault.c -- fault simulation for allocations and file I/O (see fault.h). */
#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *const kind_names[NC_FAULT_NKINDS] = {"alloc", "read", "write", "fsync"};

const char *nc_fault_name(nc_fault_kind kind)
{
    return (unsigned)kind < NC_FAULT_NKINDS ? kind_names[kind] : "?";
}

#ifndef NC_FAULT_DISABLE

atomic_int nc_fault_active;

static struct {
    atomic_long nth;              /* fail at this call (1-based); 0 = off */
    atomic_int flags;
    atomic_long calls, hits;
    atomic_int err;               /* errno of a failing call, 0 = the kind's default */
} faults[NC_FAULT_NKINDS];

static _Thread_local bool thread_on;

void nc_fault_thread(bool on)
{
    thread_on = on;
}

void nc_fault_arm(nc_fault_kind kind, long nth, int flags)
{
    if ((unsigned)kind >= NC_FAULT_NKINDS)
        return;
    atomic_fetch_and(&nc_fault_active, ~(1 << kind));
    atomic_store(&faults[kind].calls, 0);
    atomic_store(&faults[kind].hits, 0);
    atomic_store(&faults[kind].flags, flags);
    atomic_store(&faults[kind].nth, nth > 0 ? nth : 0);
    if (nth > 0)
        atomic_fetch_or(&nc_fault_active, 1 << kind);
}

void nc_fault_disarm(void)
{
    atomic_store(&nc_fault_active, 0);
    for (int k = 0; k < NC_FAULT_NKINDS; k++) {
        atomic_store(&faults[k].nth, 0);
        atomic_store(&faults[k].err, 0);
    }
}

void nc_fault_errno(nc_fault_kind kind, int err)
{
    if ((unsigned)kind < NC_FAULT_NKINDS)
        atomic_store(&faults[kind].err, err > 0 ? err : 0);
}

long nc_fault_calls(nc_fault_kind kind)
{
    return (unsigned)kind < NC_FAULT_NKINDS ? atomic_load(&faults[kind].calls) : 0;
}

long nc_fault_hits(nc_fault_kind kind)
{
    return (unsigned)kind < NC_FAULT_NKINDS ? atomic_load(&faults[kind].hits) : 0;
}

bool nc_fault_hit(nc_fault_kind kind)
{
    if (!(atomic_load(&nc_fault_active) & (1 << kind)))
        return false;
    int flags = atomic_load(&faults[kind].flags);
    if (!thread_on && !(flags & NC_FAULT_ALL_THREADS))
        return false;
    long nth = atomic_load(&faults[kind].nth);
    long n = atomic_fetch_add(&faults[kind].calls, 1) + 1;
    if (nth <= 0 || (n != nth && !((flags & NC_FAULT_PERSIST) && n > nth)))
        return false;
    atomic_fetch_add(&faults[kind].hits, 1);
    int e = atomic_load(&faults[kind].err);
    errno = e ? e : kind == NC_FAULT_ALLOC ? ENOMEM : kind == NC_FAULT_WRITE ? ENOSPC : EIO;
    return true;
}

int nc_fault_from_spec(const char *spec)
{
    nc_fault_disarm();
    if (!spec || !*spec)
        return 0;
    const char *p = spec;
    while (*p) {
        const char *colon = strchr(p, ':');
        if (!colon)
            return -1;
        int kind = -1;
        for (int k = 0; k < NC_FAULT_NKINDS; k++)
            if ((size_t)(colon - p) == strlen(kind_names[k]) && strncmp(p, kind_names[k], (size_t)(colon - p)) == 0)
                kind = k;
        char *end;
        errno = 0;
        long nth = strtol(colon + 1, &end, 10);
        if (kind < 0 || errno || end == colon + 1 || nth <= 0)
            return -1;
        int flags = NC_FAULT_ALL_THREADS;
        if (*end == '+') {
            flags |= NC_FAULT_PERSIST;
            end++;
        }
        int e = 0;
        if (*end == '=') {
            static const struct { const char *name; int e; } names[] = {
                {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EFBIG", EFBIG}, {"ENOMEM", ENOMEM}};
            end++;
            size_t l = strcspn(end, ",");
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                if (l == strlen(names[i].name) && strncmp(end, names[i].name, l) == 0)
                    e = names[i].e;
            if (!e)
                return -1;
            end += l;
        }
        if (*end != ',' && *end != 0)
            return -1;
        nc_fault_arm((nc_fault_kind)kind, nth, flags);
        nc_fault_errno((nc_fault_kind)kind, e);
        p = *end ? end + 1 : end;
    }
    return 0;
}

#else /* NC_FAULT_DISABLE */

void nc_fault_thread(bool on) { (void)on; }
void nc_fault_arm(nc_fault_kind kind, long nth, int flags) { (void)kind, (void)nth, (void)flags; }
void nc_fault_disarm(void) {}
void nc_fault_errno(nc_fault_kind kind, int err) { (void)kind, (void)err; }
long nc_fault_calls(nc_fault_kind kind) { (void)kind; return 0; }
long nc_fault_hits(nc_fault_kind kind) { (void)kind; return 0; }
int nc_fault_from_spec(const char *spec) { return spec && *spec ? -1 : 0; }

#endif

void *nc_malloc(size_t n)
{
    return nc_fault_fail(NC_FAULT_ALLOC) ? NULL : malloc(n);
}

void *nc_zalloc(size_t count, size_t size)
{
    return nc_fault_fail(NC_FAULT_ALLOC) ? NULL : calloc(count, size);
}

void *nc_realloc(void *p, size_t n)
{
    return nc_fault_fail(NC_FAULT_ALLOC) ? NULL : realloc(p, n);
}

FILE *nc_fopen(const char *path, const char *mode)
{
    bool wr = strpbrk(mode, "wa+") != NULL;
    if (nc_fault_fail(wr ? NC_FAULT_WRITE : NC_FAULT_READ))
        return NULL;
    return fopen(path, mode);
}

int nc_open(const char *path, int flags, int mode)
{
    bool wr = (flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT);
    if (nc_fault_fail(wr ? NC_FAULT_WRITE : NC_FAULT_READ))
        return -1;
    return open(path, flags, mode);
}

ssize_t nc_read(int fd, void *buf, size_t n)
{
    return nc_fault_fail(NC_FAULT_READ) ? -1 : read(fd, buf, n);
}

ssize_t nc_pread(int fd, void *buf, size_t n, off_t off)
{
    return nc_fault_fail(NC_FAULT_READ) ? -1 : pread(fd, buf, n, off);
}

size_t nc_fread(void *p, size_t size, size_t n, FILE *f)
{
    return nc_fault_fail(NC_FAULT_READ) ? 0 : fread(p, size, n, f);
}

ssize_t nc_write(int fd, const void *buf, size_t n)
{
    return nc_fault_fail(NC_FAULT_WRITE) ? -1 : write(fd, buf, n);
}

ssize_t nc_writev(int fd, const struct iovec *iov, int n)
{
    return nc_fault_fail(NC_FAULT_WRITE) ? -1 : writev(fd, iov, n);
}

size_t nc_fwrite(const void *p, size_t size, size_t n, FILE *f)
{
    return nc_fault_fail(NC_FAULT_WRITE) ? 0 : fwrite(p, size, n, f);
}

ssize_t nc_getline(char **line, size_t *cap, FILE *f)
{
    return nc_fault_fail(NC_FAULT_READ) ? -1 : getline(line, cap, f);
}

int nc_fsync(int fd)
{
    return nc_fault_fail(NC_FAULT_FSYNC) ? -1 : fsync(fd);
}

int nc_fdatasync(int fd)
{
    return nc_fault_fail(NC_FAULT_FSYNC) ? -1 : fdatasync(fd);
}

void *nc_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return nc_fault_fail(NC_FAULT_READ) ? MAP_FAILED : mmap(addr, len, prot, flags, fd, off);
}
