#!/usr/bin/env bash
# deps.sh -- install neurocache's build and test dependencies from Debian
# packages and compile FAISS's C API (which Debian ships headers for, but does
# not build) into build/faiss_c/libfaiss_c.a. Idempotent: quick when done.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build/faiss_c"

packages=(build-essential pkg-config dpkg-dev
          libmicrohttpd-dev libjansson-dev libopenblas-dev liblapack-dev
          libfaiss-dev uthash-dev libunistring-dev zlib1g-dev libinih-dev
          libcurl4-openssl-dev libhiredis-dev libsystemd-dev libyaml-dev
          clang libclang-rt-dev gnuplot-nox wrk procps curl
          haproxy nginx-light redis-server python3-yaml)  # multi-replica tests, deploy/lint.sh

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}" >&2
    log=$(mktemp)
    if ! { "${sudo_cmd[@]}" apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
               --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "deps: apt-get failed (log above)" >&2
        exit 1
    fi
    rm -f "$log"
fi

if [ -f "$build/libfaiss_c.a" ]; then
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
