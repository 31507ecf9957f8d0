#!/usr/bin/env bash
# Fetches libmicrohttpd (the HTTP library of `infer --serve`) and the libraries it links, as Debian
# packages, and unpacks them into .deps/ (ignored by git), for a machine without a package manager
# (the GPU machine): there the Makefile builds infer against .deps/ when the system has no
# libmicrohttpd, and infer finds the libraries in .deps/ at run time (an rpath). Run it where apt-get
# works, on a Debian or Ubuntu no newer than the target (the packages need its glibc), then carry
# .deps/ along with the working tree. docs/SERVE.md, "Building".
#   bash dev/carry_microhttpd.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v apt-get > /dev/null && command -v dpkg > /dev/null || { echo "error: needs apt-get and dpkg (Debian or Ubuntu)"; exit 1; }
work=$(mktemp -d)
chmod 755 "$work" # apt-get download, as root, hands the files to its own user
trap 'rm -rf "$work"' EXIT
# libmicrohttpd12 and what it needs (GnuTLS and its libraries), but glibc and libgcc, which every
# machine that runs infer has; the -dev package for the header and the link name
mapfile -t packages < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances --no-pre-depends libmicrohttpd12 | grep -v '^ ' | grep -vE '^(libc6|libgcc-s1|gcc-[0-9]+-base)$' | sort -u)
packages+=(libmicrohttpd-dev)
if ! (cd "$work" && apt-get download "${packages[@]}" > /dev/null 2> apt.log); then
    cat "$work/apt.log"; echo "error: apt-get download ${packages[*]} failed (apt-get update first?)"; exit 1
fi
rm -rf .deps
for deb in "$work"/*.deb; do dpkg -x "$deb" .deps; done
rm -rf .deps/usr/share # documentation
header=.deps/usr/include/microhttpd.h
lib=$(ls .deps/usr/lib/*/libmicrohttpd.so 2> /dev/null | head -n 1)
[ -f "$header" ] && [ -n "$lib" ] || { echo "error: the packages hold no microhttpd.h or libmicrohttpd.so"; exit 1; }
echo "unpacked into .deps/ ($(du -sh .deps | cut -f1)): $(cd "$work" && ls *.deb | tr '\n' ' ')"
version=$(awk '/^#define MHD_VERSION 0x/ {v = substr($3, 3); printf "%d.%d.%d", substr(v, 1, 2) + 0, substr(v, 3, 2) + 0, substr(v, 5, 2) + 0}' "$header")
echo "libmicrohttpd $version; carry .deps/ and run make infer there"
