#!/usr/bin/env bash
# Fills .gpu-deps/ with the build and test libraries a GPU machine may lack (libzstd, cmocka),
# for scripts/gpu-check.sh to use when that machine has no internet and no such packages.
# Run it HERE (a Debian/Ubuntu machine with apt and network), then carry .gpu-deps/ to the
# GPU machine with the working tree. Only apt-get download + dpkg-deb -x: nothing is installed.
#
# Usage: scripts/gpu-deps.sh [DIR]   (default: .gpu-deps at the repository root)
# The folder is git-ignored through .git/info/exclude (this script adds the line).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
dest=${1:-.gpu-deps}
PACKAGES=(libzstd-dev libzstd1 libcmocka-dev libcmocka0)

command -v apt-get >/dev/null || { echo "gpu-deps: needs apt-get (Debian/Ubuntu)" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/debs"
dest=$(cd "$dest" && pwd)
(cd "$dest/debs" && apt-get download "${PACKAGES[@]}")
for deb in "$dest"/debs/*.deb; do
  dpkg-deb -x "$deb" "$dest/root"
done

# Keep what a build needs (headers, shared libraries, pkg-config files); drop docs and the
# static zstd archive, so the folder stays small enough to travel with the tree.
rm -rf "$dest/root/usr/share" "$dest/root/usr/lib/x86_64-linux-gnu/libzstd.a" "$dest/debs"
# Symbolic links become plain copies: the folder is copied to the GPU machine by tools that
# may not keep links.
find "$dest/root" -type l | while read -r link; do
  target=$(readlink -f "$link")
  rm "$link"
  cp "$target" "$link"
done
# .pc files name /usr (cmocka's spells it out, zstd's libdir says lib, not lib/<triplet>); make
# them point at this folder wherever it is copied to. ${pcfiledir} (usr/lib/<triplet>/pkgconfig)
# is understood by pkg-config and pkgconf alike. CMake package files are dropped: the build
# finds these libraries through pkg-config only.
rm -rf "$dest"/root/usr/lib/*/cmake
for pc in "$dest"/root/usr/lib/*/pkgconfig/*.pc; do
  sed -i -e 's|^prefix=.*|prefix=${pcfiledir}/../../..|' \
         -e 's|^libdir=.*|libdir=${pcfiledir}/..|' \
         -e 's|-L/usr/lib/[^ ]*|-L${pcfiledir}/..|g' \
         -e 's|-I/usr/include|-I${pcfiledir}/../../../include|g' "$pc"
done

exclude=$(git rev-parse --git-common-dir 2>/dev/null)/info/exclude
if [ -n "${exclude%/info/exclude}" ] && [ "$dest" = "$(pwd)/.gpu-deps" ]; then
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu-deps/' "$exclude" 2>/dev/null || echo '/.gpu-deps/' >>"$exclude"
fi
echo "gpu-deps: ${PACKAGES[*]} unpacked into $dest ($(du -sh "$dest" | cut -f1))"
