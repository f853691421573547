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
#include "nc_common.h"

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

int main(void)
{
    RUN(held_invariant_passes);
    RUN(broken_invariant_aborts_and_says_where);
    return harness_summary();
}
