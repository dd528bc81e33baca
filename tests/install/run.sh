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
  done | sed -e "s|^\(libgcomp[^ ]*\) $build/|\1 <gcomp>/|" -e "s|^\(libgcomp[^ ]*\) $libdir/|\1 <gcomp>/|" | sort
}
# The RUNPATH entries outside the build tree must survive the install too: where the loader's
# cache knows the libraries (as here), ldd alone cannot tell.
runpath() {
  readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p' | tr ':' '\n' | grep -v -e '^$' -e "^$build" | sort -u
}
for lib in libgcomp.so interpose/libgcomp_mpi.so interpose/libgcomp_nccl.so; do
  [ -e "$build/$lib" ] || continue
  name=$(basename "$lib")
  if ! diff <(deps "$build/$lib") <(deps "$libdir/$name"); then
    echo "FAIL: installed $name (>) loads other libraries than the build tree's (<)"; exit 1
  fi
  missing=$(comm -23 <(runpath "$build/$lib") <(runpath "$libdir/$name"))
  if [ -n "$missing" ]; then
    echo "FAIL: installed $name lost RUNPATH entries of the build tree's: $missing"; exit 1
  fi
done

# The soname is the one the Python package falls back to (python/gcomp/_lib.py), and it
# changes with the minor version before 1.0 (the CMake package's SameMinorVersion).
soname=$(readelf -d "$libdir/libgcomp.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
version=$(sed -n 's/^project(gcomp VERSION \([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p' "$src/../../CMakeLists.txt")
read -r major minor <<<"$version"
want=libgcomp.so.$major; [ "$major" != 0 ] || want=libgcomp.so.0.$minor
[ "$soname" = "$want" ] || { echo "FAIL: soname $soname, want $want"; exit 1; }
grep -q "yield \"$soname\"" "$src/../../python/gcomp/_lib.py" ||
  { echo "FAIL: python/gcomp/_lib.py does not fall back to the soname $soname"; exit 1; }

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
