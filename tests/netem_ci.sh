#!/usr/bin/env bash
# bench/netem.sh end to end on this machine: 3 ranks, each in its own network namespace behind
# a 1 Gbit/s token bucket, Open MPI over TCP. Checks that every allreduce_perf row is within
# its codec's bound (#wrong 0), that Open MPI is told to yield exactly when the emulated hosts
# outnumber the cores (unless the environment chooses), and that no namespace is left behind.
# Skips (77) without root or network namespaces.
set -euo pipefail
root=$1; perf=$2
fail() { echo "netem_ci: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "SKIP: bench/netem.sh needs root"; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "SKIP: iproute2 is missing"; exit 77; }
probe=gcompci$$
ip netns add "$probe" 2>/dev/null || { echo "SKIP: cannot create network namespaces here"; exit 77; }
ip netns del "$probe"

np=3
yield_line='Open MPI yields when idle'
# netem.sh names its namespaces gcomp<its PID>-hub and -r<rank>; the header names the hub
left_behind() { # output of a run: its namespaces still present, if any
    local tag
    tag=$(echo "$1" | sed -n 's/.* in netns \(gcomp[0-9]*\)-hub.*/\1/p' | head -n 1)
    [ -n "$tag" ] || fail "netem.sh printed no namespace names"
    ip netns list | awk '{print $1}' | grep -E "^$tag-(hub|r[0-9]+)\$" || true
}

run() { # extra env assignments for netem.sh, if any
    env "$@" ALLREDUCE_PERF="$perf" timeout 240 bash "$root/bench/netem.sh" 1gbit "$np" 16K -- \
        -b 16K -e 64K -f 4 -n 3 -w 1 -c 1 --codec none --codec fp16
}

out=$(run) || fail "netem.sh failed: $out"
echo "$out"
[ -z "$(left_behind "$out")" ] || fail "namespaces left behind: $(left_behind "$out")"
rows=$(echo "$out" | grep -E '^ +[0-9]+ +[0-9]+ ' || true)
[ "$(echo "$rows" | grep -c .)" -eq 4 ] || fail "expected 4 result rows (2 sizes x 2 codecs)"
echo "$rows" | awk '$9 != "0" { bad = 1 } END { exit bad }' || fail "a row has #wrong != 0"
if [ "$np" -gt "$(nproc)" ]; then
    echo "$out" | grep -q "$yield_line" || fail "$np ranks on $(nproc) cores, but Open MPI was not told to yield"
else
    echo "$out" | grep -q "$yield_line" && fail "$np ranks on $(nproc) cores: no yield expected"
fi

# the environment's choice wins
out=$(run OMPI_MCA_mpi_yield_when_idle=0) || fail "netem.sh with OMPI_MCA_mpi_yield_when_idle=0 failed: $out"
echo "$out" | grep -q "$yield_line" && fail "OMPI_MCA_mpi_yield_when_idle=0 was overridden"
echo "$out" | grep -qE '^ +16384 ' || fail "no result rows with OMPI_MCA_mpi_yield_when_idle=0"
[ -z "$(left_behind "$out")" ] || fail "namespaces left behind: $(left_behind "$out")"
echo "netem_ci: ok"
