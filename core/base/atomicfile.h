/* atomicfile.h -- replacing a file so that a crash leaves the old content or
 * the new, never a mix: write a temporary file beside it, fsync it, rename it
 * over the target, fsync the directory (the rename is durable only then).
 *
 *     nc_atomicfile a;
 *     rc = atomicfile_open(&a, path, err, errlen);     -- a.f is the stream
 *     ... fprintf(a.f, ...) / nc_fwrite(..., a.f) ...
 *     rc = atomicfile_commit(&a, rc, err, errlen);      -- or abort on error
 *
 * Several files replaced together (a model directory) are closed one by one
 * (atomicfile_close), renamed once all are complete (atomicfile_rename), and
 * the directory synced once (atomicfile_sync_dir). Creation, fsyncs and the
 * rename go through the fault-injection wrappers (fault.h). */
#ifndef NC_ATOMICFILE_H
#define NC_ATOMICFILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    char path[4096];              /* the target */
    char tmp[4096];               /* "<dir>/.<name>.tmp.<pid>" while it is being written, "" after */
    FILE *f;                      /* open between open and close */
} nc_atomicfile;

/* Creates the temporary file for path. NC_OK; NC_EINVAL for a path too long;
 * NC_EIO ("<tmp>: cannot create: <reason>", ENOSPC included: callers
 * replacing whole files treat any failure alike) leaving nothing: a
 * commit or abort of a that follows only returns the caller's rc. */
int atomicfile_open(nc_atomicfile *a, const char *path, char *err, size_t errlen);
/* Flushes, fsyncs and closes the temporary file; it stays under its
 * temporary name. rc: the writer's own result so far -- when it is not NC_OK
 * the file is only closed and rc returned (err untouched). NC_EIO
 * ("<tmp>: write failed: <reason>") when a write or the fsync failed. */
int atomicfile_close(nc_atomicfile *a, int rc, char *err, size_t errlen);
/* Renames the closed temporary file over the target. NC_EIO on failure. */
int atomicfile_rename(nc_atomicfile *a, char *err, size_t errlen);
/* close + rename + fsync of the target's directory; on any failure (or rc
 * != NC_OK coming in) the temporary file is removed and the target keeps its
 * old content. */
int atomicfile_commit(nc_atomicfile *a, int rc, char *err, size_t errlen);
/* Closes and removes the temporary file, if any (after a commit: nothing). */
void atomicfile_abort(nc_atomicfile *a);
/* fsync of a directory, so that renames and creations in it are durable.
 * 0, or -1 with errno. */
int atomicfile_sync_dir(const char *dir);
/* Replaces path with the len bytes of data (open, write, commit). */
int atomicfile_write(const char *path, const void *data, size_t len, char *err, size_t errlen);

#endif
