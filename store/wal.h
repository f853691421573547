/* wal.h -- a write-ahead log of checksummed records with group commit.
 *
 * A log is a directory of segment files "wal-<first seq, 16 hex>.log". Each
 * segment starts with a header (magic "NCWAL001", u64 first_seq, u32 user
 * tag, u32 crc32 of the 20 bytes before) and holds records
 *
 *     u32 magic "NCWR" | u32 payload length | u64 seq | u32 crc32 | u32 0 | payload
 *
 * where the crc covers length, seq and payload, and seq numbers run from 1
 * without gaps across segments. A crash can only tear the end of the last
 * segment: recovery truncates a bad tail there (with a warning) when no
 * valid record follows it, and refuses anything else (a bad record followed
 * by good ones, a gap in seq, a bad segment header) with the file and offset.
 *
 * Durability (design §6): wal_append writes the record to the file (the
 * page cache); wal_sync(seq) returns once seq is on disk. In group mode
 * concurrent callers share fsyncs: one of them syncs everything written so
 * far while the others wait for it (group commit). In per-append mode each
 * sync is done alone under the log's lock, so no two requests share one
 * (the baseline group commit is measured against); in none mode nothing is
 * synced (benchmarks, tests).
 *
 * Thread-safe. The core never prints: warnings are returned in a buffer. */
#ifndef NC_WAL_H
#define NC_WAL_H

#include "nc_common.h"

typedef struct nc_wal nc_wal;

typedef enum { WAL_SYNC_GROUP = 0, WAL_SYNC_EACH = 1, WAL_SYNC_NONE = 2 } nc_wal_sync;

/* The log format this build writes (SEG_MAGIC "NCWAL001"'s digits) and the
 * newest it reads: a newer segment is refused naming both versions. */
#define WAL_FORMAT_VERSION 1

#define WAL_MAX_RECORD (64u << 20)   /* a larger length is corruption */

/* Called by wal_replay for each record, in seq order; a nonzero return stops
 * the replay and is returned by it. */
typedef int (*wal_record_fn)(void *ctx, uint64_t seq, const void *payload, size_t len,
                             char *err, size_t errlen);

typedef struct {
    uint64_t records;             /* records replayed (seq > after) */
    uint64_t last_seq;            /* highest seq found (0 = empty log) */
    uint64_t bytes;               /* bytes of the valid log */
    int segments;
    bool truncated;               /* a torn tail was cut */
    char warning[NC_ERRLEN];      /* what was truncated, or "" */
} nc_wal_replay_info;

/* Which records a replay hands out, and to whom. */
typedef struct {
    const char *dir;              /* the log's directory */
    uint32_t tag;                 /* its owner's tag: segments with another are refused */
    uint64_t after;               /* records up to it are the caller's already */
    wal_record_fn fn;             /* called for each record with seq > after (NULL: only checked) */
    void *ctx;                    /* fn's */
} nc_wal_replay_spec;

/* Reads the segments of s->dir in order from the one holding seq after + 1
 * and calls fn for each record with seq > after (earlier ones of that
 * segment are read and checked, not handed out; earlier segments are not
 * read: the caller's snapshot covers them, and after a failed fsync one may
 * have lost its tail -- wal_restart). The log
 * must cover after + 1: the first segment starts at or before it, else
 * NC_ENOTFOUND "log does not reach back to ...". tag: segments with another
 * tag are refused (a log of another model). A torn tail of the last segment
 * is truncated on disk. NC_EFORMAT on corruption, NC_EIO on I/O errors.
 * info (or NULL) says what was found. */
int wal_replay(const nc_wal_replay_spec *s, nc_wal_replay_info *info, char *err, size_t errlen);

/* Where a log is opened for appending, and how it syncs. */
typedef struct {
    const char *dir;              /* made if missing */
    uint32_t tag;                 /* written in every segment header */
    uint64_t next_seq;            /* the new segment's first: the replay's last_seq + 1 */
    nc_wal_sync mode;
    /* NULL: no room on the disk for the new segment fails the open
     * (NC_ENOSPACE). Else the log opens stopped (*stopped set, wal_broken
     * true, appends fail with NC_ENOSPACE) instead: a namespace on a full
     * disk is still recovered and read, and takes writes once wal_restart
     * can make the segment. */
    bool *stopped;
} nc_wal_open_spec;

/* Opens the log of s->dir for appending: a new segment starting at
 * s->next_seq. */
int wal_open(const nc_wal_open_spec *s, nc_wal **out, char *err, size_t errlen);
/* Syncs and closes. NULL allowed. */
void wal_close(nc_wal *w);

/* Appends one record (payload copied to the file); *seq receives its number.
 * Not durable until wal_sync(seq). */
int wal_append(nc_wal *w, const void *payload, size_t len, uint64_t *seq, char *err, size_t errlen);
/* Returns once every record up to seq is on disk (group commit). */
int wal_sync(nc_wal *w, uint64_t seq, char *err, size_t errlen);

/* Starts a new segment at the next seq; returns the last seq of the old one
 * (everything <= it is in older segments). Snapshots rotate so that old
 * segments can be deleted once a snapshot covers them. */
int wal_rotate(nc_wal *w, uint64_t *last_seq, char *err, size_t errlen);

/* A write or fsync error left the log unusable (appends and syncs fail):
 * after a failed fsync the page cache may have dropped what it covered, so
 * the current segment's tail is unknown on disk and is never synced again.
 * wal_broken says so; *last_seq (optional) the last record appended;
 * *tail_unknown (optional) false only for a log opened stopped
 * (wal_open with stopped), whose segments are all whole on disk. */
bool wal_broken(nc_wal *w, uint64_t *last_seq, bool *tail_unknown);
/* Takes appends again after such an error, in a new segment starting at
 * last_seq + 1, with every record up to last_seq counted as durable. When
 * the tail is unknown, only for a caller that has made them durable
 * elsewhere -- a snapshot covering last_seq (nsstore_heal) -- since the
 * older segments may have lost their tails; recovery from that snapshot
 * starts at the segment holding last_seq + 1 (wal_replay skips the ones
 * before). A log opened stopped needs no snapshot. NC_ESTATE if the log is
 * not broken or its last seq is not last_seq; NC_EIO / NC_ENOSPACE if the
 * new segment cannot be made (the log stays unusable). */
int wal_restart(nc_wal *w, uint64_t last_seq, char *err, size_t errlen);
/* Deletes the segments whose records all have seq <= upto (not the one being
 * written). Returns how many were removed, or a negative rc. */
int wal_prune(const char *dir, uint64_t upto, char *err, size_t errlen);
/* The first seq of the oldest segment under dir, 0 when there is none. */
uint64_t wal_oldest_seq(const char *dir);

typedef struct {
    uint64_t last_seq;            /* last appended */
    uint64_t synced_seq;          /* last known durable */
    uint64_t bytes;               /* bytes appended since open (all segments) */
    uint64_t fsyncs;              /* fsync calls made */
} nc_wal_stats;
void wal_stats(nc_wal *w, nc_wal_stats *st);
/* Bytes of every segment in dir (on disk). */
uint64_t wal_disk_bytes(const char *dir);

/* The last record a follower may read: synced_seq, or last_seq when the
 * log is not synced (mode none). Records up to it are whole in the file. */
uint64_t wal_durable_seq(nc_wal *w);

/* A follower of a log that is being written (replication publishes a
 * namespace's adds from its log, design §7): it reads records with
 * seq > after in order and keeps its place between calls. Unlike
 * wal_replay it never writes (no torn-tail truncation: the writer owns the
 * tail) and reads only up to a bound the caller knows complete
 * (wal_durable_seq). Segments pruned behind it do not disturb it; a segment
 * pruned before it reads it is an error (keep them: nsstore_retain_log). */
typedef struct nc_wal_reader nc_wal_reader;
/* NC_ENOTFOUND when the log no longer reaches back to after + 1. */
int wal_reader_open(const char *dir, uint32_t tag, uint64_t after, nc_wal_reader **out, char *err,
                    size_t errlen);
/* A record a reader hands out: its payload is owned by the reader, valid
 * until the next call. */
typedef struct {
    uint64_t seq;
    const void *payload;
    size_t len;
} nc_wal_record;

/* The next record if its seq <= upto: returns 1 with *rec; 0 when there is
 * none yet; a negative NC_ code on corruption or I/O errors. A record that
 * cannot be read while a later segment starts after it (a tail lost to a
 * failed fsync, wal_restart) is NC_ENOTFOUND naming the records passed
 * over, and the reader goes on from that segment at the next call. */
int wal_reader_next(nc_wal_reader *r, uint64_t upto, nc_wal_record *rec, char *err, size_t errlen);
/* The seq of the last record returned (after, before the first). */
uint64_t wal_reader_position(const nc_wal_reader *r);
/* NULL allowed. */
void wal_reader_close(nc_wal_reader *r);

/* Segment file name of first seq s into buf ("wal-%016llx.log"). */
void wal_segment_name(uint64_t s, char *buf, size_t len);

#endif
