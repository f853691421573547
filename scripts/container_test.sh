#!/usr/bin/env bash
# container_test.sh -- deploy/docker/Dockerfile really built and run: podman
# builds the image on a Debian 12 base made here (debootstrap from Debian's
# mirror, `podman import`; no image registry), starts it with host
# networking, and checks /ready, a session's predict and a clean SIGTERM
# (exit status 0, the daemon's own "stopped" log line). Prints
# "N passed, N failed"; where podman cannot run, says why and counts nothing.
#
# NC_FRESH_MAKE_RUN=1 also runs `make run` in a container of the bare base
# (a fresh Debian 12 with the committed tree, npm_config_registry pointed at
# nothing) and checks it serves and installed no node or npm.
#
# Run by `make container-test` (not by `make test`: the image build compiles
# FAISS's C API and the whole tree inside, minutes on two shared cores).
# Everything podman keeps lives under build/container/: its configuration
# (runc, cgroupfs, host networking, no default ulimits, no registries), its
# image store, and the debootstrapped base (debian12.tar, made once).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
work="$here/build/container"
image=localhost/neurocache:container-test
name="nc-container-test-$$"
pass=0 fail=0
ok()   { pass=$((pass + 1)); echo "ok   $*"; }
bad()  { fail=$((fail + 1)); echo "FAIL $*"; }
skip() { echo "SKIP container test: $*"; echo "0 passed, 0 failed"; exit 0; }
now()  { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman with runc and cgroupfs; rootless needs subuids and a user session)"
for tool in podman runc debootstrap curl jq python3; do
    command -v "$tool" >/dev/null 2>&1 ||
        skip "$tool is not installed (make container-test installs podman runc debootstrap curl jq)"
done

# ---- podman's configuration: the test's own, nothing of /etc/containers ----
mkdir -p "$work/storage" "$work/run" "$work/tmp"
cat > "$work/containers.conf" <<EOF
[containers]
netns = "host"
default_ulimits = []
log_driver = "k8s-file"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$work/run/events.log"
EOF
cat > "$work/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/run"
EOF
cat > "$work/registries.conf" <<EOF
unqualified-search-registries = []
short-name-mode = "permissive"
EOF
export CONTAINERS_CONF="$work/containers.conf" CONTAINERS_STORAGE_CONF="$work/storage.conf" \
       CONTAINERS_REGISTRIES_CONF="$work/registries.conf" TMPDIR="$work/tmp"
pm() { podman --cgroup-manager cgroupfs --runtime runc "$@"; }

pm info >"$work/podman-info.log" 2>&1 || skip "podman cannot run here: $(tail -n 1 "$work/podman-info.log")"

# ---- the base: Debian 12 from Debian's mirror, tagged as the names the ----
# ---- Dockerfile's FROM lines use, so no registry is asked               ----
base_tar="$work/debian12.tar"
if [ ! -s "$base_tar" ]; then
    t0=$(now)
    echo "container: debootstrap bookworm (once; kept in $base_tar)"
    rm -rf "$work/rootfs"
    if ! debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian \
            >"$work/debootstrap.log" 2>&1; then
        tail -n 5 "$work/debootstrap.log"
        skip "debootstrap from deb.debian.org failed (log: $work/debootstrap.log)"
    fi
    # the sources of Debian's own bookworm image: updates and security too
    rm -f "$work/rootfs/etc/apt/sources.list"
    cat > "$work/rootfs/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
    tar -C "$work/rootfs" -cf "$base_tar.tmp" . && mv "$base_tar.tmp" "$base_tar"
    rm -rf "$work/rootfs"
    echo "container: base made in $(secs "$t0" "$(now)") s"
fi
if ! pm image exists docker.io/library/debian:bookworm; then
    pm import "$base_tar" docker.io/library/debian:bookworm >/dev/null || skip "podman import failed"
    pm tag docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim
fi

# ---- build ----
old_id=$(pm image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
t0=$(now)
echo "container: podman build -f deploy/docker/Dockerfile (log: $work/build.log)"
if pm build --pull=never --network host --ignorefile deploy/docker/Dockerfile.dockerignore \
        -f deploy/docker/Dockerfile -t "$image" . >"$work/build.log" 2>&1; then
    ok "image built in $(secs "$t0" "$(now)") s"
else
    tail -n 30 "$work/build.log"
    bad "podman build (log above)"
    echo "$pass passed, $fail failed"; exit 1
fi
# the previous run's image, now untagged: its own layers only (the build
# stage's cached layers stay for the next build)
new_id=$(pm image inspect -f '{{.Id}}' "$image")
[ -z "$old_id" ] || [ "$old_id" = "$new_id" ] || pm rmi "$old_id" >/dev/null 2>&1 || true
size=$(pm image inspect -f '{{.Size}}' "$image")
echo "container: image size $((size / 1048576)) MiB ($size bytes)"

# ---- run: loopback port of host networking, as the image's own user ----
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
cleanup() { pm rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
t0=$(now)
cid=$(pm run -d --name "$name" --network host "$image" --bind 127.0.0.1 --port "$port") ||
    { bad "podman run"; echo "$pass passed, $fail failed"; exit 1; }
ready=0
for _ in $(seq 1 600); do
    if curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then ready=1; break; fi
    [ "$(pm inspect -f '{{.State.Running}}' "$name")" = true ] || break
    sleep 0.1
done
if [ $ready = 1 ]; then
    ok "/ready 200 after $(secs "$t0" "$(now)") s (podman run to ready)"
else
    pm logs "$name" 2>&1 | tail -n 20
    bad "/ready never answered 200"
    echo "$pass passed, $fail failed"; exit 1
fi
user=$(pm top "$name" user 2>/dev/null | tail -n 1 | tr -d ' ')
[ "$user" = 10001 ] || [ "$user" = neurocache ] && ok "the daemon runs as the image's user ($user)" ||
    bad "the daemon runs as '$user', expected 10001"

# a session on the baked-in model, fed and asked for the next word
api="http://127.0.0.1:$port"
sid=$(curl -s "$api/v1/sessions" -H 'Content-Type: application/json' -d '{}' | jq -r .id)
feed=$(curl -s "$api/v1/sessions/$sid/feed" -H 'Content-Type: application/json' \
       -d '{"text":"the company said"}' | jq -r .position)
pred=$(curl -s "$api/v1/sessions/$sid/predict" -H 'Content-Type: application/json' -d '{"top_k":3}')
n=$(jq '.predictions | length' <<<"$pred" 2>/dev/null)
desc=$(jq '[.predictions[].prob] | (.[0] >= .[1] and .[1] >= .[2] and .[0] < 1 and .[2] > 0)' <<<"$pred" 2>/dev/null)
if [[ "$sid" == ses_* ]] && [ "$feed" = 3 ] && [ "$n" = 3 ] && [ "$desc" = true ]; then
    ok "predict after a feed: $(jq -c '[.predictions[] | .word]' <<<"$pred")"
else
    bad "session $sid, feed position $feed, predict $pred"
fi
vocab=$(curl -s "$api/v1/model" | jq .vocab_size)
[ "$vocab" = "$(jq .vocab_size models/demo/config.json)" ] && ok "GET /v1/model: the demo model (vocab $vocab)" ||
    bad "GET /v1/model vocab_size $vocab"

# ---- SIGTERM: podman stop sends the image's STOPSIGNAL; the drain ends 0 ----
t0=$(now)
pm stop -t 60 "$name" >/dev/null
stop_s=$(secs "$t0" "$(now)")
code=$(pm inspect -f '{{.State.ExitCode}}' "$name")
logs=$(pm logs "$name" 2>&1)
if [ "$code" = 0 ] && grep -q '"draining"' <<<"$logs" && grep -q '"stopped"' <<<"$logs"; then
    ok "SIGTERM: exit status 0 after $stop_s s, log ends: $(tail -n 1 <<<"$logs" | cut -c1-120)"
else
    tail -n 10 <<<"$logs"
    bad "SIGTERM: exit status $code after $stop_s s"
fi

# ---- NC_FRESH_MAKE_RUN=1: `make run` on a fresh Debian 12 (the base, the ----
# ---- committed tree, only make and ca-certificates added), npm unreachable ----
if [ "${NC_FRESH_MAKE_RUN:-0}" = 1 ]; then
    fresh="$work/fresh-src"; rm -rf "$fresh"; mkdir -p "$fresh"
    git ls-files -z | tar --null -T - -cf - | tar -C "$fresh" -xf -     # as a fresh clone
    fport=$(free_port)
    fname="nc-fresh-make-run-$$"
    trap 'cleanup; pm rm -f "$fname" >/dev/null 2>&1 || true' EXIT
    t0=$(now)
    pm run -d --name "$fname" --network host -v "$fresh:/src" docker.io/library/debian:bookworm bash -c \
        "apt-get update -qq && apt-get install -y -qq --no-install-recommends make ca-certificates >/dev/null &&
         cd /src && npm_config_registry=http://127.0.0.1:9 make run RUN_ARGS='--port $fport'" >/dev/null
    ready=0
    for _ in $(seq 1 3600); do     # apt-get, FAISS's C API and the build: minutes
        if curl -fsS "http://127.0.0.1:$fport/ready" >/dev/null 2>&1; then ready=1; break; fi
        [ "$(pm inspect -f '{{.State.Running}}' "$fname")" = true ] || break
        sleep 0.5
    done
    pm logs "$fname" >"$work/fresh-make-run.log" 2>&1
    if [ $ready = 1 ]; then
        ok "make run on a fresh Debian 12 serves after $(secs "$t0" "$(now)") s (log: $work/fresh-make-run.log)"
        if pm exec "$fname" sh -c 'command -v node || command -v npm' >/dev/null 2>&1; then
            bad "make run installed node or npm"
        else
            ok "no node or npm installed by make run (npm_config_registry pointed nowhere)"
        fi
        p=$(curl -s "http://127.0.0.1:$fport/v1/score" -H 'Content-Type: application/json' \
            -d '{"text":"the company said"}' | jq .count)
        [ "$p" = 4 ] && ok "the fresh make run scores text" || bad "score answered count '$p'"
    else
        tail -n 20 "$work/fresh-make-run.log"
        bad "make run on a fresh Debian 12 never served"
    fi
    pm stop -t 30 "$fname" >/dev/null 2>&1
    pm rm -f "$fname" >/dev/null 2>&1
    rm -rf "$fresh"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
