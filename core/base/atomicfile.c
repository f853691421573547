/* atomicfile.c -- crash-safe file replacement (see atomicfile.h). */
#include "atomicfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "nc_common.h"

int atomicfile_open(nc_atomicfile *a, const char *path, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path) + 1 : 0;
    /* a hidden name beside the target: the same file system (rename is
     * atomic only within one), and no reader takes it for the real file */
    if ((size_t)snprintf(a->path, sizeof a->path, "%s", path) >= sizeof a->path ||
        (size_t)snprintf(a->tmp, sizeof a->tmp, "%.*s.%s.tmp.%ld", dlen, path, path + dlen, (long)getpid()) >=
            sizeof a->tmp) {
        a->tmp[0] = 0;
        return nc_error(err, errlen, NC_EINVAL, "path too long: %.200s...", path);
    }
    a->f = nc_fopen(a->tmp, "wb");
    if (!a->f) {
        nc_error(err, errlen, NC_EIO, "%s: cannot create: %s", a->tmp, strerror(errno));
        a->tmp[0] = 0;
        return NC_EIO;
    }
    return NC_OK;
}

int atomicfile_close(nc_atomicfile *a, int rc, char *err, size_t errlen)
{
    if (!a->f)
        return rc;
    errno = EIO;   /* ferror() alone leaves errno to whatever came last */
    bool ok = rc == NC_OK && !ferror(a->f) && fflush(a->f) == 0 && nc_fsync(fileno(a->f)) == 0;
    int e = errno;
    if (fclose(a->f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    a->f = NULL;
    if (rc == NC_OK && !ok)
        rc = nc_error(err, errlen, NC_EIO, "%s: write failed: %s", a->tmp, strerror(e));
    return rc;
}

int atomicfile_rename(nc_atomicfile *a, char *err, size_t errlen)
{
    NC_ASSERT(a, "atomicfile_rename: no a");
    if (rename(a->tmp, a->path) != 0)
        return nc_error(err, errlen, NC_EIO, "%s: rename failed: %s", a->path, strerror(errno));
    a->tmp[0] = 0;
    return NC_OK;
}

int atomicfile_sync_dir(const char *dir)
{
    int fd = nc_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int r = nc_fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

int atomicfile_commit(nc_atomicfile *a, int rc, char *err, size_t errlen)
{
    NC_ASSERT(a, "atomicfile_commit: no a");
    rc = atomicfile_close(a, rc, err, errlen);
    if (rc == NC_OK)
        rc = atomicfile_rename(a, err, errlen);
    if (rc == NC_OK) {
        char dir[4096];
        const char *slash = strrchr(a->path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - a->path) + (slash == a->path) : 1,
                 slash ? a->path : ".");
        if (atomicfile_sync_dir(dir) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: fsync of the directory: %s", dir, strerror(errno));
    }
    atomicfile_abort(a);
    return rc;
}

void atomicfile_abort(nc_atomicfile *a)
{
    NC_ASSERT(a, "atomicfile_abort: no a");
    if (a->f)
        fclose(a->f);
    a->f = NULL;
    if (a->tmp[0])
        unlink(a->tmp);
    a->tmp[0] = 0;
}

int atomicfile_write(const char *path, const void *data, size_t len, char *err, size_t errlen)
{
    nc_atomicfile a;
    int rc = atomicfile_open(&a, path, err, errlen);
    if (rc != NC_OK)
        return rc;
    if (len && nc_fwrite(data, 1, len, a.f) != len)
        rc = nc_error(err, errlen, NC_EIO, "%s: write failed: %s", a.tmp, strerror(errno));
    return atomicfile_commit(&a, rc, err, errlen);
}
