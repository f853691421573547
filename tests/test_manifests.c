/* test_manifests.c -- the deployment files checked with the real tools:
 * the deploy/k8s manifests against the Kubernetes API's schemas and,
 * strictly, its types (tests/k8s/check.mjs: kubernetes-models and
 * TypeScript, pinned by tests/k8s/package-lock.json and installed by
 * scripts/deps.sh into build/node-k8s), and deploy/lint.sh (haproxy -c,
 * nginx -t, systemd-analyze verify). The container image itself is built and
 * run by `make container-test`. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

TEST(k8s_manifests_match_the_schemas)
{
    const char *modules = getenv("NC_K8S_MODULES") ? getenv("NC_K8S_MODULES") : "build/node-k8s/node_modules";
    char pc[512];
    snprintf(pc, sizeof pc, "%s/kubernetes-models/package.json", modules);
    CHECKF(access(pc, R_OK) == 0, "%s missing: run make deps-test (scripts/deps.sh installs tests/k8s with npm ci)", pc);
    if (access(pc, R_OK) != 0)
        return;
    setenv("NC_NODE_MODULES", modules, 1);
    harness_run_external("node tests/k8s/check.mjs deploy/k8s", "k8s");
}

TEST(deploy_lint)
{
    /* lint.sh exits non-zero when a check that could run failed */
    int st = system("bash deploy/lint.sh > build/deploy-lint.log 2>&1");
    CHECKF(st == 0, "deploy/lint.sh failed (status %d): see build/deploy-lint.log", st);
}

int main(void)
{
    RUN(k8s_manifests_match_the_schemas);
    RUN(deploy_lint);
    return harness_summary();
}
