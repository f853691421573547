/* harness.h -- the tiny shared test harness: CHECK macros and a summary line.
 *
 * Usage: TEST(name) { CHECK(cond); CHECK_NEAR(a, b, tol); } ...
 * int main(void) { RUN(name); ...; return harness_summary(); }
 * Every binary ends with "N passed, N failed" (counted per check).
 */
#ifndef NC_HARNESS_H
#define NC_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "vmath.h"

static int harness_passed, harness_failed;
static const char *harness_current = "";

#define TEST(name) static void name(void)

#define RUN(name) do { \
        harness_current = #name; \
        int failed_before_ = harness_failed; \
        name(); \
        fprintf(stderr, "%s %s\n", harness_failed == failed_before_ ? "  ok  " : "  FAIL", #name); \
    } while (0)

#define CHECK(cond) do { \
        if (cond) harness_passed++; \
        else { harness_failed++; \
            fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__, __LINE__, harness_current, #cond); } \
    } while (0)

#define CHECKF(cond, ...) do { \
        if (cond) harness_passed++; \
        else { harness_failed++; \
            fprintf(stderr, "%s:%d: %s: check failed: %s: ", __FILE__, __LINE__, harness_current, #cond); \
            fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
    } while (0)

#define CHECK_NEAR(a, b, tol) do { \
        double a_ = (double)(a), b_ = (double)(b); \
        if (fabs(a_ - b_) <= (tol)) harness_passed++; \
        else { harness_failed++; \
            fprintf(stderr, "%s:%d: %s: |%s - %s| = |%.9g - %.9g| > %g\n", __FILE__, __LINE__, \
                    harness_current, #a, #b, a_, b_, (double)(tol)); } \
    } while (0)

#define CHECK_STR_CONTAINS(haystack, needle) \
    CHECKF((haystack) && strstr((haystack), (needle)) != NULL, "\"%s\" lacks \"%s\"", \
           (haystack) ? (haystack) : "(null)", (needle))

static inline int harness_summary(void)
{
    printf("%d passed, %d failed\n", harness_passed, harness_failed);
    return harness_failed == 0 ? 0 : 1;
}

/* Runs a shell command, its standard output (at most cap-1 bytes, NUL
 * ended) into out; its exit status, or -1 when it did not exit. */
static inline int harness_run_capture(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs a test program of another language (cmd, e.g. "node tests/web/ui_test.js")
 * that ends with its own "N passed, N failed": its other lines are echoed on
 * stderr behind "  TAG: ", its counts join this binary's, and it must have
 * printed the line and exited 1 exactly when something failed. */
static inline void harness_run_external(const char *cmd, const char *tag)
{
    FILE *p = popen(cmd, "r");
    CHECKF(p != NULL, "cannot run %s", cmd);
    int np = -1, nf = -1;
    char line[4096];
    while (p && fgets(line, sizeof line, p)) {
        int a, b;
        if (sscanf(line, "%d passed, %d failed", &a, &b) == 2) {
            np = a, nf = b;
            continue;
        }
        fprintf(stderr, "  %s: %s", tag, line);
    }
    int st = p ? pclose(p) : -1;
    CHECKF(np >= 0, "%s printed no summary line (exit status %d)", cmd, st);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == (nf > 0), "%s exit status %d", cmd, st);
    if (np >= 0) {
        harness_passed += np;
        harness_failed += nf;
    }
}

/* Directory of the test fixtures (tests/fixtures), overridable by env. */
static inline const char *harness_fixtures(void)
{
    const char *d = getenv("NEUROCACHE_FIXTURES");
    return d ? d : "tests/fixtures";
}

/* Every test binary takes its kernel level from NEUROCACHE_SIMD, as the
 * programs do (make test runs the numeric suites once per level), and
 * refuses to run on a level it cannot honour rather than test another. */
__attribute__((constructor)) static void harness_simd_level(void)
{
    char err[512];
    if (vm_simd_init(err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
}

#endif
