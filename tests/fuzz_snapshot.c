/* fuzz_snapshot.c -- libFuzzer harness for the namespace snapshot reader
 * (store/snapshot.c verify_snapshot and nsstore_snapshot_load, reached through
 * nsstore_open; behind them unbounded_cache_load's values reader and FAISS's index
 * reader, wordtable_load, the provenance and document tables).
 *
 * The input is a flag byte, then the snapshot's files separated by the line
 * "==FILE==", in the order MANIFEST, index.faiss, values.bin, words.txt,
 * prov.bin, docs.bin (a part that is absent leaves the file absent; a part
 * "-" too). They are written to snap-<seq>/ of a private namespace directory
 * on tmpfs, <seq> read from the MANIFEST's "seq" line as recovery expects.
 *
 * Flag bit 0 set ("resealed"): the harness writes the MANIFEST itself with
 * the true size and crc32 of every file, as nsstore_snapshot does, so the
 * fuzzer reaches the parsers behind the checksums (values, words,
 * provenance, documents). The FAISS index is then not taken from the input
 * but is the seed's own (a valid index of the entries' count when the input
 * gives one of the sizes below): FAISS's reader allocates whatever sizes a
 * file claims, and recovery hands it only bytes whose checksum matches the
 * MANIFEST, so garbage reaches it only in unsealed inputs -- where the
 * checksum must refuse it first. (Handed resealed garbage, Debian's FAISS
 * 1.7.3 read_index allocated the 128 MB a corrupt header claimed, threw on
 * the short read and leaked it: its reader must never see unverified
 * bytes.)
 *
 * Contract checked with abort(): nsstore_open either refuses with a message
 * or recovers a namespace whose every pair has a word inside its word table
 * and a provenance inside its document table, with per-document counts that
 * add up; and a second open of what the first left on disk recovers the same
 * entries (recovery is idempotent). */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "slurp.h"
#include "model.h"
#include "nsstore.h"
#include "unbounded_cache.h"
#include "wordtable.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

#define FSNAP_FIXTURE "tests/fixtures/lstm-2layer"
#define FSNAP_NFILES 6
/* valid FAISS flat indexes of these sizes, for resealed inputs */
#define FSNAP_NINDEX 4

static const char *const fsnap_names[FSNAP_NFILES] = {"MANIFEST", "index.faiss", "values.bin",
                                                       "words.txt", "prov.bin", "docs.bin"};
static char fsnap_root[256];
static nc_model *fsnap_model;
static const int64_t fsnap_index_n[FSNAP_NINDEX] = {0, 1, 5, 40};
static unsigned char *fsnap_index[FSNAP_NINDEX];
static size_t fsnap_index_len[FSNAP_NINDEX];

static int fsnap_rm(const char *dir)
{
    return nsstore_remove_dir(dir, NULL, 0);
}

static void fsnap_cleanup(void)
{
    fsnap_rm(fsnap_root);
    model_free(fsnap_model);
    for (int i = 0; i < FSNAP_NINDEX; i++)
        free(fsnap_index[i]);
}

static void fsnap_write(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        abort();
    const unsigned char *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w <= 0)
            abort();
        b += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* The file whole; a fuzzer has no other answer than abort when it cannot. */
static unsigned char *fsnap_read_or_abort(const char *path, size_t *len)
{
    unsigned char *b = (unsigned char *)slurp_file(path, len);
    if (!b)
        abort();
    return b;
}

static int fsnap_open(const char *dir, nc_nsstore **ns, char *err, size_t errlen)
{
    nc_nsstore_opts o = {.dir = dir, .model = fsnap_model, .sync = WAL_SYNC_NONE};
    unbounded_cache_opts_default(&o.ub, fsnap_model->cfg.hidden_size);
    o.ub.exact = true;   /* a flat index, no training */
    return nsstore_open(&o, ns, NULL, err, errlen);
}

/* Once: the model, and valid FAISS indexes of a few sizes (the keys of a
 * namespace built with that many pairs, snapshotted). */
static void fsnap_init(void)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fsnap_root, sizeof fsnap_root, "%s/nc-fuzz-snap-%d", base, (int)getpid());
    mkdir(fsnap_root, 0700);
    atexit(fsnap_cleanup);
    char err[NC_ERRLEN] = "";
    if (model_load(FSNAP_FIXTURE, &fsnap_model, err, sizeof err) != NC_OK) {
        fprintf(stderr, "fuzz_snapshot: %s (run from the repository's root)\n", err);
        abort();
    }
    const size_t H = (size_t)fsnap_model->cfg.hidden_size;
    for (int i = 0; i < FSNAP_NINDEX; i++) {
        char dir[400];
        snprintf(dir, sizeof dir, "%s/gen%d", fsnap_root, i);
        nc_nsstore *ns;
        if (fsnap_open(dir, &ns, err, sizeof err) != NC_OK)
            abort();
        size_t n = (size_t)fsnap_index_n[i];
        float *k = calloc(n * H + 1, sizeof *k);
        int *w = calloc(n + 1, sizeof *w);
        for (size_t j = 0; j < n * H; j++)
            k[j] = (float)((j * 2654435761u) % 1000) / 500.0f - 1.0f;
        uint32_t doc;
        uint64_t seq;
        if (nsstore_doc_begin(ns, "d", 1, &doc, err, sizeof err) != NC_OK ||
            (n && nsstore_add(ns, &(const nsstore_pairs){.keys = k, .words = w, .n = n, .doc = doc}, &seq, err,
                              sizeof err) != NC_OK) ||
            nsstore_snapshot(ns, NULL, err, sizeof err) != NC_OK)
            abort();
        nsstore_close(ns);
        free(k);
        free(w);
        /* the snapshot just written is the only one */
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (!strncmp(e->d_name, "snap-", 5)) {
                char p[800];
                snprintf(p, sizeof p, "%s/%s/index.faiss", dir, e->d_name);
                fsnap_index[i] = fsnap_read_or_abort(p, &fsnap_index_len[i]);
            }
        if (d)
            closedir(d);
        if (!fsnap_index[i])
            abort();
        fsnap_rm(dir);
    }
}

/* Every pair's word and provenance lie inside their tables; returns the
 * entry count. */
static int64_t fsnap_check(nc_nsstore *ns)
{
    nc_unbounded_cache *ub = nsstore_unbounded_cache(ns);
    nc_wordtable *words = nsstore_words(ns);
    int64_t n = unbounded_cache_count(ub);
    uint32_t docs = nsstore_doc_count(ns);
    uint64_t with_doc = 0;
    for (int64_t id = 0; id < n; id++) {
        int w = unbounded_cache_word_at(ub, id);
        if (w < 0 || w >= wordtable_size(words))
            abort();
        char err[NC_ERRLEN];
        nsstore_provenance pv = {.word = w};
        if (nsstore_entry(ns, id, &pv, err, sizeof err) == NC_OK)
            with_doc++;
        if (pv.word != w)
            abort();
        char snip[256];
        nsstore_snippet(ns, id, 3, 3, snip, sizeof snip);
    }
    uint64_t pairs = 0;
    for (uint32_t i = 0; i < docs; i++) {
        char id[1100];
        uint64_t p = 0;
        if (nsstore_doc_info(ns, i, id, sizeof id, &p) != NC_OK || !id[0])
            abort();
        pairs += p;
    }
    if (pairs != with_doc || pairs > (uint64_t)n)
        abort();
    return n;
}

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (!fsnap_model)
        fsnap_init();
    if (size < 1)
        return 0;
    int flags = data[0];
    const uint8_t *p = data + 1, *end = data + size;
    const uint8_t *part[FSNAP_NFILES] = {0};
    size_t plen[FSNAP_NFILES] = {0};
    static const char sep[] = "\n==FILE==\n";
    for (int i = 0; i < FSNAP_NFILES && p <= end; i++) {
        const uint8_t *q = i + 1 < FSNAP_NFILES ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1) : NULL;
        part[i] = p;
        plen[i] = q ? (size_t)(q - p) : (size_t)(end - p);
        if (plen[i] == 1 && p[0] == '-')
            part[i] = NULL;   /* "-": the file is absent */
        if (!q)
            break;
        p = q + sizeof sep - 1;
    }
    char ns_dir[400], sdir[500], path[700];
    snprintf(ns_dir, sizeof ns_dir, "%s/ns", fsnap_root);
    fsnap_rm(ns_dir);
    mkdir(ns_dir, 0700);
    bool sealed = flags & 1;
    unsigned long long seq = 1;
    if (!sealed && part[0]) {
        /* named after the seq its MANIFEST claims (a bounded copy: the
         * part is not NUL-terminated) */
        char head[128];
        size_t l = plen[0] < sizeof head - 1 ? plen[0] : sizeof head - 1;
        memcpy(head, part[0], l);
        head[l] = 0;
        const char *s = strstr(head, "\nseq ");
        if (s)
            seq = strtoull(s + 5, NULL, 10);
    }
    snprintf(sdir, sizeof sdir, "%s/snap-%016llx", ns_dir, seq);
    mkdir(sdir, 0700);
    if (sealed) {
        /* a valid index of as many vectors as values.bin claims, if one of
         * the prepared sizes (else the first part's bytes are ignored and
         * the index is the empty one) */
        uint64_t n = 0;
        if (part[2] && plen[2] >= 16)
            memcpy(&n, part[2] + 8, 8);
        int which = 0;
        for (int i = 0; i < FSNAP_NINDEX; i++)
            if ((uint64_t)fsnap_index_n[i] == n)
                which = i;
        if (flags & 2)
            which = (which + 1) % FSNAP_NINDEX;   /* a count the index disagrees with */
        part[1] = fsnap_index[which];
        plen[1] = fsnap_index_len[which];
    }
    for (int i = 1; i < FSNAP_NFILES; i++)
        if (part[i]) {
            snprintf(path, sizeof path, "%s/%s", sdir, fsnap_names[i]);
            fsnap_write(path, part[i], plen[i]);
        }
    if (sealed) {
        uint64_t n = 0;
        if (part[2] && plen[2] >= 16)
            memcpy(&n, part[2] + 8, 8);
        char man[2048];
        size_t k = (size_t)snprintf(man, sizeof man, "neurocache-snapshot 1\nseq %llu\nentries %llu\n", seq,
                                    (unsigned long long)n);
        for (int i = 1; i < FSNAP_NFILES; i++) {
            uint32_t c = part[i] ? (uint32_t)crc32(0L, part[i], (uInt)plen[i]) : 0;
            k += (size_t)snprintf(man + k, sizeof man - k, "file %s %zu %08x\n", fsnap_names[i], plen[i], c);
        }
        k += (size_t)snprintf(man + k, sizeof man - k, "crc %08x\n", (uint32_t)crc32(0L, (const Bytef *)man, (uInt)k));
        snprintf(path, sizeof path, "%s/MANIFEST", sdir);
        fsnap_write(path, man, k);
    } else if (part[0]) {
        snprintf(path, sizeof path, "%s/MANIFEST", sdir);
        fsnap_write(path, part[0], plen[0]);
    }

    char err[NC_ERRLEN] = "";
    nc_nsstore *ns = NULL;
    int rc = fsnap_open(ns_dir, &ns, err, sizeof err);
    if (rc != NC_OK) {
        if (!err[0] || ns)
            abort();
        return 0;
    }
    int64_t n1 = fsnap_check(ns);
    nsstore_close(ns);
    /* What recovery left on disk (the snapshot, a fresh log) recovers the
     * same pairs. */
    err[0] = 0;
    rc = fsnap_open(ns_dir, &ns, err, sizeof err);
    if (rc != NC_OK)
        abort();
    if (fsnap_check(ns) != n1)
        abort();
    nsstore_close(ns);
    return 0;
}
