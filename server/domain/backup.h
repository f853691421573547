/* backup.h -- backups of the daemon's namespaces and their restore (issue
 * 38; docs/operations.md#backup).
 *
 * A backup is a directory in the layout of a data directory:
 *   namespaces/<name>/   each namespace's newest snapshot and its log up to
 *                        one position (store/backup.h)
 *   backup.json          the manifest, written last (fsynced, renamed into
 *                        place): format and its version, when, the model's
 *                        fingerprint and shape, the formats of the files,
 *                        and per namespace its storage, index fingerprint,
 *                        snapshot, position, pairs and every file's size
 *                        and CRC-32. A directory without it is no backup
 *                        (one interrupted, e.g. by kill -9): refused.
 * Restore verifies every file against the manifest and the model against
 * the one served before copying; a daemon started on a backup directory as
 * its data_dir does the same before opening anything (and renames the
 * manifest to backup.json.restored: from then on it is a data directory). */
#ifndef NC_SERVER_BACKUP_H
#define NC_SERVER_BACKUP_H

#include <jansson.h>

#include "model.h"
#include "server.h"

#define BACKUP_MANIFEST "backup.json"
#define BACKUP_FORMAT_VERSION 1

/* What to back up and where. */
typedef struct {
    const char *dst;              /* the backup's directory: must not exist */
    const char *ns;               /* one namespace, NULL = every one */
} backup_spec;

/* Online, in the daemon: each namespace's store copied while it serves
 * (nsstore_backup). 0 with *summary (the manifest without its file list;
 * the caller's), or an NC_ code (NC_ENOTFOUND no such namespace,
 * NC_ESTATE a destination that exists, NC_ENOSPACE, NC_EIO) with a
 * message; a failed backup's directory is removed. */
int backup_take(nc_server *srv, const backup_spec *s, json_t **summary, char *err, size_t errlen);

/* Of the files of data_dir (its daemon running or not): neurocache backup. */
int backup_take_files(const char *data_dir, const nc_model *m, const backup_spec *s, json_t **summary, char *err,
                      size_t errlen);

/* Checks backup dir: its manifest (complete, a version this build reads,
 * model m's fingerprint) and every file's size and CRC-32. 0 with
 * *manifest (or NULL), or an NC_ code with a message saying what is wrong. */
int backup_verify(const char *dir, const nc_model *m, json_t **manifest, char *err, size_t errlen);

/* Verifies backup from, then copies its namespaces into data_dir's
 * (a namespace of the same name there: NC_ESTATE, nothing copied). */
int backup_restore(const char *from, const char *data_dir, const nc_model *m, json_t **summary, char *err,
                   size_t errlen);

/* At start-up: a data_dir holding a backup manifest is verified (refused
 * as backup_verify says), then the manifest is renamed aside. 0 when there
 * is none. */
int backup_startup_check(const char *data_dir, const nc_model *m, char *err, size_t errlen);

/* `neurocached backup|restore ...` (the CLI's `neurocache backup|restore`
 * runs it): argv[0] is the command. Exit status. */
int backup_cli_main(int argc, char **argv);

#endif
