/* test_docs.c -- the documents' examples run as written: tests/doctest.py
 * runs every ```sh doctest block of README.md and of every docs/ page, in order,
 * against this daemon on the demo model (a free port stands for the
 * documents' 8080) and compares the outputs they show; its checks count
 * here, one per command. */
#include <stdio.h>
#include <stdlib.h>
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

int main(void)
{
    httpc_init();
    RUN(documents_run_as_written);
    httpc_cleanup();
    return harness_summary();
}
