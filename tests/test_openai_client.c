/* test_openai_client.c -- the daemon driven by the official `openai` npm
 * client (tests/openai/client_test.mjs, the package pinned by
 * tests/openai/package-lock.json and installed by scripts/deps.sh into
 * build/node-openai with npm ci): its checks count here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"

TEST(openai_client)
{
    char fixture[512];
    snprintf(fixture, sizeof fixture, "%s/lstm-2layer", harness_fixtures());
    const char *args[] = {"--model", fixture, NULL};
    nc_daemon d;
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    const char *modules = getenv("NC_OPENAI_MODULES") ? getenv("NC_OPENAI_MODULES") : "build/node-openai/node_modules";
    char pc[512];
    snprintf(pc, sizeof pc, "%s/openai/package.json", modules);
    CHECKF(access(pc, R_OK) == 0, "%s missing: run make deps-test (scripts/deps.sh installs tests/openai with npm ci)", pc);
    if (access(pc, R_OK) != 0) {
        daemon_stop(&d);
        return;
    }
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", d.port);
    setenv("NC_URL", url, 1);
    setenv("NC_NODE_MODULES", modules, 1);
    harness_run_external("node tests/openai/client_test.mjs", "openai");
    if (harness_failed)
        daemon_dump_log(&d);
    CHECK(daemon_stop(&d) == 0);
}

int main(void)
{
    httpc_init();
    RUN(openai_client);
    httpc_cleanup();
    return harness_summary();
}
