/* test_docs.c -- the documents' examples run as written: tests/doctest.py
 * runs every ```sh doctest block of README.md and of every docs/ page, in order,
 * against this daemon on the demo model (a free port stands for the
 * documents' 8080) and compares the outputs they show; its checks count
 * here, one per command. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"

TEST(documents_run_as_written)
{
    if (access("models/demo/model.safetensors", R_OK) != 0) {
        CHECK(!"models/demo present (the documents' examples use the demo model)");
        return;
    }
    /* as `make run` starts it: the model, nothing else (daemon_start adds
     * the loopback port, a scratch data directory and two threads) */
    const char *args[] = {"--model", "models/demo", NULL};
    nc_daemon d;
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "python3 tests/doctest.py --port %d README.md docs/*.md 2>&1", d.port);
    harness_run_external(cmd, "doctest");
    if (harness_failed)
        daemon_dump_log(&d);
    CHECK(daemon_stop(&d) == 0);
}

/* A number shown with "…" (the digits every CPU prints) matches within one
 * unit of its last digit, and the line still has exactly its keys: doctest.py
 * on a page of echoes, 4 that must match and 3 that must not. */
TEST(digits_shown_match_to_the_digit)
{
    char md[] = "/tmp/nc_doctest_XXXXXX.md";
    int fd = mkstemps(md, 3);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("```sh doctest\n"
          "echo '{\"word\":\"N\",\"prob\":0.432601749897}'\n#> {\"word\":\"N\",\"prob\":0.43260…}\n"
          "echo '{\"word\":\"N\",\"prob\":0.432599999}'\n#> {\"word\":\"N\",\"prob\":0.43260…}\n"
          "echo 'perplexity 37.5724286, took 0.25 s'\n#> perplexity 37.5724…, took … s\n"
          "echo 'took 0.25 s'\n#> took … s\n"
          "echo '{\"word\":\"N\",\"prob\":0.4328}'\n#> {\"word\":\"N\",\"prob\":0.43260…}\n"
          "echo '{\"word\":\"N\",\"prob\":0.43260,\"x\":1}'\n#> {\"word\":\"N\",\"prob\":0.43260…}\n"
          "echo 'perplexity 37.5734286, took 0.25 s'\n#> perplexity 37.5724…, took … s\n"
          "```\n", f);
    fclose(f);
    char cmd[256], line[512], fail[64];
    snprintf(cmd, sizeof cmd, "python3 tests/doctest.py --port 9 %s 2>&1", md);
    snprintf(fail, sizeof fail, "FAIL %s:", md);
    FILE *p = popen(cmd, "r");
    unsigned failed = 0;   /* bit n: the command on line n failed */
    while (p && fgets(line, sizeof line, p))
        if (!strncmp(line, fail, strlen(fail)))
            failed |= 1u << (atoi(line + strlen(fail)) & 31);
    if (p)
        pclose(p);
    CHECKF(failed == (1u << 10 | 1u << 12 | 1u << 14), "doctest.py failed the commands of lines mask %#x, "
           "want 10, 12, 14", failed);
    unlink(md);
}

int main(void)
{
    httpc_init();
    RUN(digits_shown_match_to_the_digit);
    RUN(documents_run_as_written);
    httpc_cleanup();
    return harness_summary();
}
