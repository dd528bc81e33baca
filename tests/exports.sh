#!/usr/bin/env bash
# exports.sh LIB HEADER... — the shared library exports exactly the public API: no internal
# gcomp__ name, and every gcomp_ function it exports is declared GCOMP_API in a public header.
set -euo pipefail
lib=$1; shift
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TWDBRV]$/ {print $3}' | grep '^gcomp' | sort -u)
internal=$(echo "$syms" | grep '^gcomp__' || true)
if [ -n "$internal" ]; then
  echo "FAIL: $lib exports internal names:"; echo "$internal" | head -20; exit 1
fi
declared=$(grep -ho 'GCOMP_API [^(]*\bgcomp_[a-z0-9_]*(' "$@" | grep -o 'gcomp_[a-z0-9_]*(' | tr -d '(' | sort -u)
extra=$(comm -23 <(echo "$syms") <(echo "$declared"))
if [ -n "$extra" ]; then
  echo "FAIL: $lib exports names no public header declares GCOMP_API:"; echo "$extra"; exit 1
fi
echo "exports: $(echo "$syms" | wc -l) public symbols, no gcomp__ name: 1 passed, 0 failed"
