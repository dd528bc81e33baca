#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs a consumer through
# find_package(gcomp) (shared and static) and through pkg-config.
set -euo pipefail
build=$1; src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/b" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/b" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib" "$work/b/consumer"
"$work/b/consumer_static"
flags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs gcomp)
cc "$src/main.c" $flags -o "$work/consumer_pc"
LD_LIBRARY_PATH="$work/prefix/lib" "$work/consumer_pc"
