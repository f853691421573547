#!/usr/bin/env bash
# deps.sh -- install neurocache's dependencies from Debian packages and
# compile FAISS's C API (which Debian ships headers for, but does not build)
# into build/faiss_c/libfaiss_c.a. Idempotent: quick when done.
#
#   deps.sh server   what building and serving need (make deps, make run);
#                    no node, no npm, nothing from a registry but Debian's
#   deps.sh test     that, plus the test rig (make deps-test, make test):
#                    clang, the balancers and Redis of the multi-replica
#                    tests, Chromium and the pinned node modules
#   deps.sh container  only what make container-test needs: podman, runc,
#                    debootstrap (the image builds its own dependencies)
#
# The two lists below are what README.md says each command installs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build/faiss_c"
mode=${1:-server}
case "$mode" in
    server|test|container) ;;
    *) echo "usage: deps.sh [server|test|container]" >&2; exit 2 ;;
esac

# Building and serving: the compiler, the libraries bin/neurocached and
# bin/neurocache link (Makefile LIBS_CORE, LIBS_SERVER), dpkg-dev for
# `apt-get source faiss`.
server_packages=(build-essential pkg-config dpkg-dev
                 libmicrohttpd-dev libjansson-dev libopenblas-dev liblapack-dev
                 libfaiss-dev uthash-dev libunistring-dev zlib1g-dev libinih-dev
                 libcurl4-openssl-dev libhiredis-dev libsystemd-dev)
# The test rig: test binaries link libyaml; clang for make asan/fuzz;
# gnuplot and wrk for plots and benchmarks; curl, jq and python3 for the
# documents' examples (tests/doctest.py); haproxy, nginx and redis for the
# multi-replica tests and deploy/lint.sh; chromium for the web page's test.
test_packages=(libyaml-dev clang libclang-rt-dev gnuplot-nox wrk procps curl jq python3 python3-yaml
               haproxy nginx-light redis-server
               chromium)
# Packages that come with a system service: the tests start their own
# instances on loopback, so the services are neither started by the
# installation nor left enabled (see keep_services_down).
service_packages=(haproxy:haproxy nginx-light:nginx redis-server:redis-server)

# make container-test (scripts/container_test.sh): rootful podman with runc
container_packages=(podman runc debootstrap curl jq)

packages=("${server_packages[@]}")
[ "$mode" = container ] && packages=("${container_packages[@]}")
if [ "$mode" = test ]; then
    packages+=("${test_packages[@]}")
    # node and npm drive that browser (puppeteer-core) and the openai client
    # test: Debian's, unless a node is already installed (its own npm comes
    # with it)
    command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${packages[@]}"; do
    installed "$p" || missing+=("$p")
done

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

# Debian starts a service when its package is installed (invoke-rc.d), and
# enables it for the next boot (deb-systemd-helper). For the packages of
# service_packages this installation adds, neither is wanted: a policy-rc.d
# answering 101 ("action forbidden") while apt-get runs keeps them from
# starting, and `systemctl disable` afterwards keeps them from starting at
# boot. An existing policy-rc.d (containers ship one) is left as it is, and
# so is a service whose package was already installed: that is the user's.
policy=/usr/sbin/policy-rc.d
own_policy=0
new_services=()
for sp in "${service_packages[@]}"; do
    for m in "${missing[@]}"; do
        [ "$m" = "${sp%%:*}" ] && new_services+=("${sp##*:}")
    done
done
drop_policy() { [ "$own_policy" = 0 ] || "${sudo_cmd[@]}" rm -f "$policy"; }
keep_services_down() {
    [ ${#new_services[@]} -gt 0 ] || return 0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# neurocache deps.sh: no service starts while it installs packages\nexit 101\n' |
            "${sudo_cmd[@]}" tee "$policy" >/dev/null
        "${sudo_cmd[@]}" chmod 755 "$policy"
        own_policy=1
        trap drop_policy EXIT
    fi
}
disable_services() {
    [ ${#new_services[@]} -gt 0 ] || return 0
    # only on a host booted with systemd; elsewhere nothing starts them
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        echo "deps: disabling the services ${new_services[*]} (the tests run their own)" >&2
        "${sudo_cmd[@]}" systemctl disable --now "${new_services[@]}" >/dev/null 2>&1 || true
    fi
}

if [ ${#missing[@]} -gt 0 ]; then
    echo "deps ($mode): installing ${missing[*]}" >&2
    keep_services_down
    log=$(mktemp)
    if ! { "${sudo_cmd[@]}" apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
               --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "deps: apt-get failed (log above)" >&2
        exit 1
    fi
    rm -f "$log"
    disable_services
    drop_policy; own_policy=0
fi
[ "$mode" != container ] || exit 0

# The node modules of the tests that drive real clients, each pinned by a
# package-lock.json under tests/ and installed with npm ci into the build
# tree (no install scripts: nothing downloads a browser); again only when
# the lock file changed. install_test_modules SRC DIR MODULE
install_test_modules() {
    local src="$here/tests/$1" dir="$here/build/$2" module=$3
    if [ -f "$dir/node_modules/$module/package.json" ] && cmp -s "$src/package-lock.json" "$dir/package-lock.json"; then
        return 0
    fi
    echo "deps: npm ci (tests/$1: $module) into build/$2" >&2
    mkdir -p "$dir"
    cp "$src/package.json" "$src/package-lock.json" "$dir/"
    ( cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error ) >&2
}
if [ "$mode" = test ]; then
    install_test_modules web node puppeteer-core     # the browser test (Debian's chromium)
    install_test_modules openai node-openai openai   # the official openai client
    install_test_modules k8s node-k8s kubernetes-models  # deploy/k8s against the Kubernetes schemas
fi

# FAISS's distance and IVFPQ kernels, recompiled for this CPU (see below).
build_simd_kernels() {
    local srcdir=$1 out="$build/libfaiss_simd.a" flags=()
    local want=${FAISS_SIMD:-}
    # Unset keeps the level this tree was built with (so that
    # `FAISS_SIMD=none make deps && make test` tests the generic kernels:
    # make test runs deps again without the variable); a fresh tree is auto.
    if [ -z "$want" ]; then
        want=$(cat "$build/simd.level" 2>/dev/null || true)
        [ -n "$want" ] && [ -f "$out" ] || want=auto
    fi
    if [ "$want" = auto ]; then
        if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then
            want=avx2
        else
            want=none
        fi
    fi
    [ "$(cat "$build/simd.level" 2>/dev/null)" = "$want" ] && [ -f "$out" ] && return 0
    rm -f "$out" "$build/simd.level"
    local objs=()
    if [ "$want" = avx2 ]; then
        flags=(-mavx2 -mfma -mf16c -mpopcnt)
        echo "deps: compiling FAISS's distance and IVFPQ kernels with ${flags[*]} (FAISS_SIMD=none to keep Debian's generic ones)" >&2
        # The same translation units as in Debian's libfaiss.a, from the same
        # source: linked whole before -lfaiss, they define every symbol of
        # those members, so the linker never takes the generic copies.
        for f in utils/distances_simd utils/distances impl/ProductQuantizer IndexIVFPQ IndexIVF; do
            local o="$build/simd_$(basename "$f").o"
            g++ -std=c++17 -O3 "${flags[@]}" -fPIC -fopenmp -DFINTEGER=int -I"$srcdir" \
                -c "$srcdir/faiss/$f.cpp" -o "$o"
            objs+=("$o")
        done
        # refuse, at start-up, to run these kernels on a CPU without AVX2
        gcc -O2 -fPIC -c "$here/scripts/faiss_simd_check.c" -o "$build/simd_check.o"
        objs+=("$build/simd_check.o")
    elif [ "$want" != none ]; then
        echo "deps: FAISS_SIMD=$want: expected auto, avx2 or none" >&2
        exit 1
    fi
    ar rcs "$out.tmp" "${objs[@]}" && mv "$out.tmp" "$out"
    rm -f "${objs[@]}"
    echo "$want" > "$build/simd.level"
}

faiss_source_dir() { find "$here/build/faiss_src" -maxdepth 1 -mindepth 1 -type d -name 'faiss*' 2>/dev/null | head -n 1; }

if [ -f "$build/libfaiss_c.a" ] && [ -n "$(faiss_source_dir)" ]; then
    build_simd_kernels "$(faiss_source_dir)"
    exit 0
fi

# FAISS's C API: fetch Debian's source package (a deb-src entry in a file of
# our own, never touching the user's sources) and compile c_api/*.cpp.
srcfile=/etc/apt/sources.list.d/neurocache-deb-src.sources
if ! apt-get source --print-uris faiss >/dev/null 2>&1 || \
   [ -z "$(apt-get source --print-uris faiss 2>/dev/null | grep -i faiss)" ]; then
    echo "deps: enabling Debian source packages in $srcfile" >&2
    suites=$(. /etc/os-release; echo "${VERSION_CODENAME:-bookworm}")
    "${sudo_cmd[@]}" tee "$srcfile" >/dev/null <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suites
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    "${sudo_cmd[@]}" apt-get update -qq
fi

work="$here/build/faiss_src"
rm -rf "$work"; mkdir -p "$work" "$build"
( cd "$work" && apt-get source --download-only faiss >/dev/null 2>&1 )
tarball=$(ls "$work"/faiss_*.orig.tar.* | head -n 1)
tar -xf "$tarball" -C "$work"
srcdir=$(find "$work" -maxdepth 1 -mindepth 1 -type d -name 'faiss*' | head -n 1)
echo "deps: compiling FAISS C API from $(basename "$tarball")" >&2
objs=()
for f in "$srcdir"/c_api/*.cpp "$srcdir"/c_api/impl/*.cpp; do
    [ -f "$f" ] || continue
    o="$build/$(basename "${f%.cpp}").o"
    g++ -std=c++17 -O2 -fPIC -fopenmp -I/usr/include -I"$srcdir/c_api" -c "$f" -o "$o"
    objs+=("$o")
done
ar rcs "$build/libfaiss_c.a.tmp" "${objs[@]}"
mv "$build/libfaiss_c.a.tmp" "$build/libfaiss_c.a"
rm -f "${objs[@]}"
echo "deps: built $build/libfaiss_c.a" >&2
build_simd_kernels "$srcdir"
