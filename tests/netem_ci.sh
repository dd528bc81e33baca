#!/usr/bin/env bash
# bench/netem.sh end to end on this machine: 3 ranks, each in its own network namespace behind
# a 1 Gbit/s token bucket, Open MPI over TCP. Checks that the links were shaped, that every
# allreduce_perf row is within its codec's bound (#wrong 0), that every rank's Open MPI was
# told to yield when idle (mpi_yield_when_idle 1) unless the environment chose otherwise, and
# that the run left none of its namespaces behind.
# Skips (77) without root, network namespaces, veth or tbf.
set -euo pipefail
root=$1; perf=$2
fail() { echo "netem_ci: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "bench/netem.sh needs root"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 is missing"
probe=gcompci$$
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces here"
if ! { ip -n "$probe" link add ci0 type veth peer name ci1 &&
    tc -n "$probe" qdisc add dev ci0 root tbf rate 1gbit burst 256kb latency 50ms; } 2>/dev/null; then
    ip netns del "$probe"
    skip "no veth or tbf in network namespaces here"
fi
ip netns del "$probe"

np=3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# allreduce_perf behind a wrapper that says what each rank's Open MPI was given
cat >"$tmp/perf" <<EOS
#!/bin/sh
echo "netem_ci: rank sees mpi_yield_when_idle=\${OMPI_MCA_mpi_yield_when_idle:-unset}"
exec "$perf" "\$@"
EOS
chmod +x "$tmp/perf"

run() { # env assignments for netem.sh, if any
    env -u OMPI_MCA_mpi_yield_when_idle "$@" ALLREDUCE_PERF="$tmp/perf" timeout 240 \
        bash "$root/bench/netem.sh" 1gbit "$np" 16K -- -b 16K -e 64K -f 4 -n 3 -w 1 -c 1 --codec none --codec fp16
}

check_run() { # output, expected mpi_yield_when_idle
    local out=$1 want=$2 rows tag
    [ "$(grep -c 'qdisc tbf .*rate 1Gbit' <<<"$out")" -eq "$np" ] || fail "expected $np shaped links (tbf 1Gbit)"
    [ "$(grep -c "rank sees mpi_yield_when_idle=$want\$" <<<"$out")" -eq "$np" ] ||
        fail "expected all $np ranks to see mpi_yield_when_idle=$want: $(grep 'rank sees' <<<"$out" | tr '\n' ' ')"
    rows=$(grep -E '^ +[0-9]+ +[0-9]+ ' <<<"$out" || true)
    [ "$(grep -c . <<<"$rows")" -eq 4 ] || fail "expected 4 result rows (2 sizes x 2 codecs)"
    awk '$9 != "0" { bad = 1 } END { exit bad }' <<<"$rows" || fail "a row has #wrong != 0"
    # netem.sh names its namespaces gcomp<its PID>-hub and -r<rank>; its header names the hub
    tag=$(sed -n 's/.* in netns \(gcomp[0-9]*\)-hub.*/\1/p' <<<"$out" | head -n 1)
    [ -n "$tag" ] || fail "netem.sh printed no namespace names"
    if ip netns list | awk '{print $1}' | grep -qE "^$tag-(hub|r[0-9]+)\$"; then
        fail "namespaces of $tag left behind: $(ip netns list | tr '\n' ' ')"
    fi
}

out=$(run) || fail "netem.sh failed: $out"
echo "$out"
check_run "$out" 1
# the environment's choice wins
out=$(run OMPI_MCA_mpi_yield_when_idle=0) || fail "netem.sh with OMPI_MCA_mpi_yield_when_idle=0 failed: $out"
check_run "$out" 0
echo "netem_ci: ok"
