#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs consumers through
# find_package(gcomp) (C, C++, both; shared and static) and through pkg-config.
set -euo pipefail
build=$1; src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# the build's CMAKE_INSTALL_LIBDIR: lib, lib64 or a multiarch lib/x86_64-linux-gnu
pcdir=$(dirname "$(find "$work/prefix" -name gcomp.pc)")
libdir=$(dirname "$pcdir")

# Installed, the library must load what the build tree's loads (an NCCL_ROOT outside the
# system directories included): the install keeps those RUNPATH entries.
deps() {
  env -u LD_LIBRARY_PATH ldd "$1" | awk '$2 == "=>" {print $1, $3}' | while read -r name path; do
    [ "$path" = not ] || path=$(readlink -f "$path")
    echo "$name $path"
  done | sort
}
if ! diff <(deps "$build/libgcomp.so") <(deps "$libdir/libgcomp.so"); then
  echo "FAIL: installed libgcomp.so (>) loads other libraries than the build tree's (<)"; exit 1
fi

for langs in C CXX "C;CXX"; do
  b=$work/b-${langs/;/-}
  cmake -S "$src" -B "$b" -DCONSUMER_LANGUAGES="$langs" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
  cmake --build "$b" >/dev/null
  for exe in "$b"/consumer_*; do
    LD_LIBRARY_PATH="$libdir" "$exe"
  done
done

flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs gcomp)
# every directory it names must exist (gcomp.pc finds the prefix relative to itself)
for f in $flags; do
  case $f in -I*|-L*) [ -d "${f:2}" ] || { echo "FAIL: pkg-config gives $f: no such directory"; exit 1; };; esac
done
inc=$(PKG_CONFIG_PATH="$pcdir" pkg-config --variable=includedir gcomp)
defs=
[ ! -f "$inc/gcomp_mpi.h" ] || defs+=" -DCONSUMER_MPI"
[ ! -f "$inc/gcomp_nccl.h" ] || defs+=" -DCONSUMER_NCCL"
cc $defs "$src/main.c" $flags -o "$work/consumer_pc"
LD_LIBRARY_PATH="$libdir" "$work/consumer_pc"
