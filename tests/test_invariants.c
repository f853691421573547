/* test_invariants.c -- NC_ASSERT (nc_common.h): a held invariant costs
 * nothing visible, a broken one stops the process with SIGABRT and says
 * where and what, in every build (it is not assert(): NDEBUG does not
 * remove it). Each case runs in a child process. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "cache_params.h"
#include "components.h"
#include "neural_cache.h"
#include "unigram_cache.h"
#include "wal.h"

/* Runs fn(arg) in a child with stderr captured into out; returns the raw
 * wait status. */
static int in_child(void (*fn)(int), int arg, char *out, size_t cap)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 2);
        signal(SIGABRT, SIG_DFL);
        fn(arg);
        _exit(0);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(p[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = 0;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void check_components(int scores)
{
    int components = 1;
    NC_ASSERT(!components || scores, "components %d without scores", components);
}

TEST(held_invariant_passes)
{
    char out[1024];
    int st = in_child(check_components, 1, out, sizeof out);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    CHECKF(out[0] == 0, "printed \"%s\"", out);
}

TEST(broken_invariant_aborts_and_says_where)
{
    char out[1024];
    int st = in_child(check_components, 0, out, sizeof out);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "status %d", st);
    CHECKF(strstr(out, "test_invariants.c:") != NULL, "\"%s\" names no file", out);
    CHECKF(strstr(out, "invariant '!components || scores' failed: components 1 without scores") != NULL,
           "\"%s\" lacks the condition and message", out);
}

/* Planted violations of the invariants the asserts of core/ and store/
 * state (issue 39 point 4): each must abort with its message. */
static void plant(int which)
{
    char err[NC_ERRLEN];
    float h[4] = {0};
    switch (which) {
    case 0: {   /* a push into a ring never initialised */
        nc_neural_cache c = {0};
        neural_cache_push(&c, h, 3);
        break;
    }
    case 1: {   /* a word id below 0 into a window */
        nc_unigram_cache u;
        unigram_cache_init(&u, 4, err, sizeof err);
        unigram_cache_push(&u, 1);
        u.count = 9;   /* more than the window holds */
        unigram_cache_push(&u, 2);
        break;
    }
    case 2: {   /* a segment name into too small a buffer */
        char name[10];
        wal_segment_name(7, name, sizeof name);
        break;
    }
    case 3: {   /* a rescoring's mark rolled back onto another session's window */
        const nc_component *r = nc_component_rows[NC_COMP_UNIGRAM];
        nc_cache_params p8, p2;
        cache_params_default(&p8);
        p8.unigram_size = 8;
        p2 = p8;
        p2.unigram_size = 2;
        void *a = NULL, *b = NULL, *mark = NULL;
        r->state_new(&(nc_state_args){.p = &p8, .H = 4}, &a, err, sizeof err);
        r->state_new(&(nc_state_args){.p = &p2, .H = 4}, &b, err, sizeof err);
        for (int i = 0; i < 6; i++)
            r->push(a, h, i);
        r->mark(a, 3, &mark, err, sizeof err);
        r->rollback(b, mark);
        break;
    }
    case 4: {   /* a ring that claims more pairs than it has room for */
        nc_neural_cache c;
        neural_cache_init(&c, 4, 4, false, err, sizeof err);
        c.count = 9;
        neural_cache_export(&c, NULL, NULL);
        break;
    }
    }
}

TEST(planted_violations_abort_with_their_message)
{
    static const char *const says[] = {
        "neural_cache_push: ring head 0 count 0 of size 0",
        "unigram_cache_push: window head 1 count 9 of size 4",
        "wal_segment_name: 10 bytes for a 24-character name",
        "unigram: mark (head 6, count 6) not of this window (size 2)",
        "neural_cache_export: 9 pairs in a ring of 4",
    };
    for (int i = 0; i < (int)(sizeof says / sizeof *says); i++) {
        char out[2048];
        int st = in_child(plant, i, out, sizeof out);
        CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "case %d: status %d", i, st);
        CHECKF(strstr(out, says[i]) != NULL && strstr(out, ".c:") != NULL, "case %d said \"%s\"", i, out);
    }
}

int main(void)
{
    RUN(held_invariant_passes);
    RUN(broken_invariant_aborts_and_says_where);
    RUN(planted_violations_abort_with_their_message);
    return harness_summary();
}
