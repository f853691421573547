#!/usr/bin/env bash
# lint.sh -- check what of deploy/ can be checked on this machine: HAProxy
# and nginx configurations with the real binaries, the systemd unit with
# systemd-analyze (ExecStart pointed at bin/neurocached), the Kubernetes
# manifests as YAML and against the Kubernetes schemas (tests/k8s/check.mjs).
# Missing tools are reported and skipped, not failed. The container image is
# built and run by scripts/container_test.sh (make container-test).
set -uo pipefail
cd "$(dirname "$0")/.."
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if command -v haproxy >/dev/null; then
    haproxy -c -q -f deploy/haproxy/haproxy.cfg && echo "ok   haproxy -c deploy/haproxy/haproxy.cfg" || fail=1
else echo "skip haproxy: not installed (make deps-test)"; fi

nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
if [ -x "$nginx_bin" ]; then
    mkdir -p "$tmp/nginx/logs"
    "$nginx_bin" -q -t -p "$tmp/nginx" -c "$PWD/deploy/nginx/nginx-test.conf" \
        && echo "ok   nginx -t deploy/nginx/neurocache.conf" || fail=1
else echo "skip nginx: not installed (make deps-test)"; fi

if command -v systemd-analyze >/dev/null; then
    sed "s#/usr/local/bin/neurocached#$PWD/bin/neurocached#" deploy/systemd/neurocached.service \
        > "$tmp/neurocached.service"
    out=$(systemd-analyze verify "$tmp/neurocached.service" 2>&1)
    if [ -n "$out" ]; then echo "$out"; fail=1; else echo "ok   systemd-analyze verify neurocached.service"; fi
else echo "skip systemd-analyze: not installed"; fi

if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
    for f in deploy/k8s/*.yaml; do
        python3 - "$f" <<'PY' && echo "ok   yaml $f" || fail=1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    for k in ("apiVersion", "kind", "metadata", "spec"):
        if k not in d:
            sys.exit(f"{sys.argv[1]}: {d.get('kind', '?')} has no {k}")
    if d["kind"] == "StatefulSet":
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert "preStop" in c["lifecycle"]
PY
    done
else echo "skip k8s: python3-yaml missing"; fi

k8s_modules=${NC_NODE_MODULES:-build/node-k8s/node_modules}
if command -v node >/dev/null && [ -d "$k8s_modules/kubernetes-models" ]; then
    NC_NODE_MODULES="$k8s_modules" node tests/k8s/check.mjs deploy/k8s | grep -v '^[0-9]* passed' || fail=1
else echo "skip k8s schemas: kubernetes-models not installed (make deps-test)"; fi

if command -v hadolint >/dev/null; then
    hadolint deploy/docker/Dockerfile && echo "ok   hadolint" || fail=1
else echo "skip hadolint: not installed (the image itself: make container-test)"; fi
exit $fail
