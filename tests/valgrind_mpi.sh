#!/usr/bin/env bash
# valgrind memcheck over a 2-rank engine run. Memory errors anywhere fail it; leaks fail it
# only when a gcomp function allocated the block (Open MPI keeps some allocations to exit).
# Usage: valgrind_mpi.sh MPIEXEC TEST_BINARY SUPPRESSIONS...
set -uo pipefail
mpiexec=$1; bin=$2; shift 2
supp=(); for s in "$@"; do supp+=(--suppressions="$s"); done
log=$(mktemp); trap 'rm -f "$log"' EXIT
GCOMP_TEST_UNDER_VALGRIND=1 timeout 900 "$mpiexec" -n 2 -x GCOMP_TEST_UNDER_VALGRIND valgrind -q --error-exitcode=9 --leak-check=full --show-leak-kinds=definite \
  --errors-for-leak-kinds=none "${supp[@]}" "$bin" >"$log" 2>&1
rc=$?
grep -E "passed|failed|FAIL" "$log"
# a definitely-lost record whose allocation stack names gcomp
if awk '/definitely lost/{grab=1; block=""} grab{block=block"\n"$0} grab && /^==[0-9]+== $/{if (block ~ /gcomp/) {print block; found=1} grab=0} END{exit found?0:1}' "$log"; then
  echo "valgrind: gcomp leaked memory (above)"; exit 1
fi
if [ $rc -ne 0 ]; then grep -E "^==[0-9]+==" "$log" | head -60; echo "valgrind run failed: status $rc"; exit 1; fi
echo "valgrind: no memory errors, no gcomp leaks"
