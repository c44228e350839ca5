#!/usr/bin/env bash
# Build pMARS (the reference Core War simulator) for DEI, from Debian's source package, without a display.
#
# Debian's binary package `pmars` is built for X11 and will not start without a display
# ("Can't connect to X server"); the same source built with -DSERVER is the display-less build that
# King-of-the-Hill servers run. This fetches Debian's pmars 0.9.2 source (checksums from its .dsc),
# applies Debian's printf fix, builds it and installs the binary where decentrain looks for it:
#   ${1:-${XDG_CACHE_HOME:-$HOME/.cache}/decentrain/pmars}/pmars
# Needs curl, tar, patch and a C compiler. Idempotent: a present, working binary is kept.
set -euo pipefail
dest=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/decentrain/pmars}
pool=${DEBIAN_POOL:-http://deb.debian.org/debian/pool/main/p/pmars}
orig=pmars_0.9.2.orig.tar.gz
orig_sha=df7f0a1d0026c4af4f57e941d1dd3c487be1eb8097a658cec12e1c1f8e8d3ead
deb=pmars_0.9.2-1.debian.tar.xz
deb_sha=474cd91f8a12ad59800c62d3b2e1407a28b4d1131966802285a2f97b633a4943
if [ -x "$dest/pmars" ] && ! "$dest/pmars" -b -r 0 /dev/null 2>&1 | grep -q "X server"; then
  echo "pmars already at $dest/pmars"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
curl -fsS -o "$orig" "$pool/$orig"
curl -fsS -o "$deb" "$pool/$deb"
echo "$orig_sha  $orig" | sha256sum -c --quiet
echo "$deb_sha  $deb" | sha256sum -c --quiet
tar xzf "$orig"
tar xJf "$deb"
cd pmars-0.9.2
patch -s -p1 < ../debian/patches/printf.patch
make -s -C src CFLAGS="-O2 -DEXT94 -DPERMUTATE -DSERVER" LIB= >build.log 2>&1 || { cat build.log >&2; exit 1; }
mkdir -p "$dest"
install -m 0755 src/pmars "$dest/pmars"
echo "pmars built at $dest/pmars"
