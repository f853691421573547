/* nsbackup.h -- a point-in-time copy of a namespace's files (issue 38;
 * docs/operations.md#backup): its newest snapshot and the log records after
 * it up to one position, written under a destination directory in the
 * layout of a namespace directory (snap-<seq>/, wal/, storage), so that a
 * daemon opening the copy recovers exactly the pairs up to that position.
 * Every file written is fsynced and listed with its size and CRC-32 (the
 * caller writes them into the backup's manifest; server/domain/backup.c).
 *
 * Two ways in:
 *   nsstore_backup   an open store of this process: snapshots and pruning
 *                    wait meanwhile (snap_lock), adds and reads go on; the
 *                    position is the last durable record when it starts.
 *   backup_dir_copy  a namespace directory on disk, its daemon running or
 *                    not (neurocache backup): the files are only read; the
 *                    position is the last whole record of the log (a record
 *                    being written, or a torn one, is left out); a file
 *                    removed by the daemon meanwhile (a snapshot pruned) is
 *                    NC_ENOTFOUND: try again.
 * The log's copy is one segment starting after the snapshot, its records
 * read back through the log reader (each checked against its CRC). */
#ifndef NC_NSBACKUP_H
#define NC_NSBACKUP_H

#include "nc_common.h"
#include "nsstore.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char path[128];               /* relative to the namespace's copy */
    uint64_t size;
    uint32_t crc;                 /* zlib CRC-32 of the whole file */
} nc_backup_file;

typedef struct {
    uint64_t snapshot_seq;        /* the snapshot copied, 0 = none */
    uint64_t position;            /* last log record copied (>= snapshot_seq) */
    uint64_t entries;             /* pairs at position (snapshot + the records' pairs) */
    uint64_t records;             /* log records copied */
    bool compact;                 /* compact storage (a storage file copied) */
    uint64_t bytes;               /* of every file written */
    nc_backup_file *files;        /* nfiles, malloc'ed: backup_ns_free */
    int nfiles;
} nc_backup_ns;

/* Copies open store ns into dst (created; must not exist). */
int nsstore_backup(nc_nsstore *ns, const char *dst, nc_backup_ns *out, char *err, size_t errlen);

/* Copies the namespace directory src (its log's tag: nsstore_model_tag)
 * into dst (created; must not exist). */
int backup_dir_copy(const char *src, uint32_t tag, const char *dst, nc_backup_ns *out, char *err, size_t errlen);

/* Checks file f under dir: its size and CRC-32. NC_EFORMAT naming it when
 * either differs, NC_ENOTFOUND when it is missing. */
int backup_file_check(const char *dir, const nc_backup_file *f, char *err, size_t errlen);

/* Copies file src to dst (created), fsynced; its size and CRC-32. */
int backup_copy_file(const char *src, const char *dst, uint64_t *size, uint32_t *crc, char *err, size_t errlen);

/* fsyncs directory dir (a rename or a file made in it durable). */
int backup_sync_dir(const char *dir, char *err, size_t errlen);

/* NULL allowed. */
void backup_ns_free(nc_backup_ns *b);

#endif
