/* test_fuzz_replay.c -- regression test over the fuzzers' committed inputs:
 * every file of tests/fuzz/corpus/<harness>/ (seeds plus the inputs that
 * once crashed, named regress_*) is run through its harness, compiled in
 * here under another entry name. A harness checks its own invariants with
 * abort(), so a regression fails this binary; under `make asan` the
 * sanitizers watch the same inputs. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define FUZZ_ENTRY fuzz_proto_one
#include "fuzz_proto.c"
#undef FUZZ_ENTRY
#define FUZZ_ENTRY fuzz_tokenizer_one
#include "fuzz_tokenizer.c"
#undef FUZZ_ENTRY
#define FUZZ_ENTRY fuzz_normalize_one
#include "fuzz_normalize.c"
#undef FUZZ_ENTRY
#define FUZZ_ENTRY fuzz_model_one
#include "fuzz_model.c"
#undef FUZZ_ENTRY
#define FUZZ_ENTRY fuzz_config_one
#include "fuzz_config.c"
#undef FUZZ_ENTRY
#define FUZZ_ENTRY fuzz_wal_one
#include "fuzz_wal.c"
#undef FUZZ_ENTRY
#define FUZZ_ENTRY fuzz_auth_one
#include "fuzz_auth.c"
#undef FUZZ_ENTRY
#define FUZZ_ENTRY fuzz_snapshot_one
#include "fuzz_snapshot.c"
#undef FUZZ_ENTRY

typedef int (*fuzz_fn)(const uint8_t *, size_t);

/* Runs every file of the corpus directory; returns how many ran. */
static int replay(const char *name, fuzz_fn fn, int *regressions)
{
    char dir[512];
    snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", name);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        size_t got = buf ? fread(buf, 1, (size_t)len, f) : 0;
        fclose(f);
        CHECKF(buf && got == (size_t)len, "cannot read %s", path);
        if (buf && got == (size_t)len) {
            CHECKF(fn(buf, got) == 0, "%s", path);
            n++;
            if (strncmp(e->d_name, "regress_", 8) == 0)
                (*regressions)++;
        }
        free(buf);
    }
    closedir(d);
    return n;
}

static void run_corpus(const char *name, fuzz_fn fn, int min_seeds)
{
    int reg = 0;
    int n = replay(name, fn, &reg);
    CHECKF(n >= min_seeds, "corpus %s: %d inputs, expected at least %d", name, n, min_seeds);
    fprintf(stderr, "        %s: %d inputs (%d regressions)\n", name, n, reg);
}

TEST(proto_corpus) { run_corpus("proto", fuzz_proto_one, 10); }
TEST(tokenizer_corpus) { run_corpus("tokenizer", fuzz_tokenizer_one, 10); }
TEST(normalize_corpus) { run_corpus("normalize", fuzz_normalize_one, 8); }
TEST(model_corpus) { run_corpus("model", fuzz_model_one, 3); }
TEST(config_corpus) { run_corpus("config", fuzz_config_one, 5); }
TEST(wal_corpus) { run_corpus("wal", fuzz_wal_one, 5); }
TEST(auth_corpus) { run_corpus("auth", fuzz_auth_one, 5); }
TEST(snapshot_corpus) { run_corpus("snapshot", fuzz_snapshot_one, 10); }

/* The crash fuzz_proto found: an error message quoting non-UTF-8 bytes
 * still gives a JSON error body (with U+FFFD in their place). */
TEST(error_body_non_utf8)
{
    json_t *e = proto_error_body(API_INVALID_JSON, "invalid escape near '\"a b c\\\xd2\x9b\xdf\x9a\xdd\xd3\xdd'");
    CHECK(e != NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(e, "error"), "message"));
    CHECK_STR_CONTAINS(msg, "\xef\xbf\xbd");
    CHECK_STR_CONTAINS(msg, "invalid escape near");
    json_decref(e);
    e = proto_error_body(API_NOT_FOUND, "\xff");
    CHECK(e && strcmp(json_string_value(json_object_get(json_object_get(e, "error"), "message")), "\xef\xbf\xbd") == 0);
    json_decref(e);
}

int main(void)
{
    RUN(proto_corpus);
    RUN(tokenizer_corpus);
    RUN(normalize_corpus);
    RUN(model_corpus);
    RUN(config_corpus);
    RUN(wal_corpus);
    RUN(auth_corpus);
    RUN(snapshot_corpus);
    RUN(error_body_non_utf8);
    /* The harnesses remove their scratch files at exit. */
    return harness_summary();
}
