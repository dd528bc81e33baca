#!/usr/bin/env bash
# netem.sh RATE [NP] [SIZE] [-- extra allreduce_perf args]
#
# Runs bench/allreduce_perf on one machine as if every rank sat on its own host behind a link
# of RATE (e.g. 1gbit, 10gbit), so compression is measured where it matters: on links slower
# than memory. RATE "none" is a plain shared-memory run (btl self,vader), no namespaces.
#
# Topology: a star, like ranks on hosts behind one switch.
#
#     netns gcomp<PID>-r0 [gc0 10.77.0.1/24] ==veth== [v0]--+
#     netns gcomp<PID>-r1 [gc0 10.77.0.2/24] ==veth== [v1]--+-- br0 in netns gcomp<PID>-hub
#     ...                                                   |
#
# Why this one: every rank gets its own interface with its own token bucket, on BOTH ends of
# its veth (tbf on gc0 shapes what the rank sends, tbf on vN in the hub what it receives), so
# a rank's upload and download are each limited to RATE, independently of the other ranks,
# exactly as a full-duplex NIC port would be. A bridge keeps one flat subnet, which is all
# Open MPI's TCP BTL needs. Putting all ranks in one namespace would let the kernel route
# rank-to-rank traffic over loopback and bypass the shaped interfaces.
#
# Each namespace is a "host" with its own Open MPI daemon, as on a real cluster: mpirun runs
# in the hub namespace (br0 10.77.0.254) with a hostfile naming 10.77.0.1..NP, and its remote
# launch agent (plm_rsh_agent, normally ssh) is a generated script that starts orted inside
# the namespace owning that address (ip netns exec). Why not one mpirun whose ranks each
# re-enter a namespace: a rank reaches its local daemon through PMIx over TCP loopback, which
# a network namespace cuts off (MPI_Init fails with "Unreachable"); a daemon per namespace
# keeps that loopback local. Daemons talk to mpirun (OOB) and ranks to each other (TCP BTL)
# over 10.77.0.0/24 only, so everything crosses the shaped links (control traffic is tiny).
# 10.77.0.0/24 exists only inside these private namespaces: nothing is routed anywhere else,
# and the root namespace is never touched. Everything created is removed on exit, on
# failure, and on Ctrl-C or TERM.
#
# Environment: ALLREDUCE_PERF=path to the binary (default: build/bench/allreduce_perf of this
# checkout); TBF_BURST (default 256kb) and TBF_LATENCY (default 50ms, the longest a
# packet may wait in a token bucket: its queue holds RATE * TBF_LATENCY bytes) tune the links;
# OMPI_MCA_* variables reach every rank (OMPI_MCA_mpi_yield_when_idle=0 keeps Open MPI spinning,
# where the script would make it yield; see the launch below). Requires root, iproute2 (ip, tc) and Open MPI's mpirun.
# Open MPI's rsh launcher may warn "setpgid(...) failed in parent ... Permission denied": a
# harmless race with the agent's exec.
#
# Examples:
#   sudo bench/netem.sh 1gbit 4 64M
#   sudo bench/netem.sh 10gbit 8 16M -- -n 5 -w 1 --codec terngrad -J out.jsonl
set -euo pipefail

usage() {
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2
    echo "see the comment at the top of $0 for the topology" >&2
    exit 2
}

die() { echo "netem.sh: $*" >&2; exit 2; }

# ---- arguments ---------------------------------------------------------------------------
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
RATE=$1; shift
NP=4; SIZE=64M
if [ $# -gt 0 ] && [ "$1" != "--" ]; then NP=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then SIZE=$1; shift; fi
if [ $# -gt 0 ]; then
    [ "$1" = "--" ] || die "unexpected argument '$1' (extra allreduce_perf args go after --)"
    shift
fi
EXTRA=("$@")
TBF_BURST=${TBF_BURST:-256kb}
TBF_LATENCY=${TBF_LATENCY:-50ms}

[[ $NP =~ ^[0-9]+$ ]] && [ "$NP" -ge 1 ] && [ "$NP" -le 200 ] || die "NP must be 1..200, got '$NP'"
[[ $SIZE =~ ^[0-9]+[KMGkmg]?$ ]] || die "SIZE must look like 64M, got '$SIZE'"
shopt -s nocasematch
[[ $RATE =~ ^(none|[0-9]+(\.[0-9]+)?([kmgt]i?)?(bit|bps))$ ]] ||
    die "RATE must be none or a tc rate like 1gbit, 100mbit, got '$RATE'"
shopt -u nocasematch
[ "${RATE,,}" = none ] && RATE=none

# ---- what we need ------------------------------------------------------------------------
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ALLREDUCE_PERF=${ALLREDUCE_PERF:-$ROOT/build/bench/allreduce_perf}
[ -x "$ALLREDUCE_PERF" ] ||
    die "$ALLREDUCE_PERF not found: build it (cmake --build build) or set ALLREDUCE_PERF=path"
command -v mpirun >/dev/null || die "mpirun not found (Debian: apt-get install openmpi-bin)"

# Codecs: the project's default set, unless the extra args choose their own.
CODECS=()
if [[ " ${EXTRA[*]-} " != *" --codec"* ]]; then
    for c in none fp16 terngrad topk:ratio=0.01; do CODECS+=(--codec "$c"); done
fi
BENCH=("$ALLREDUCE_PERF" -b "$SIZE" -e "$SIZE" "${CODECS[@]}" "${EXTRA[@]}")
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NP")

MPIRUN_PID=
run_mpirun() {
    # In the background so a TERM from timeout(1) or a Ctrl-C reaches our trap at once
    # (bash runs traps only between foreground commands); the trap then stops mpirun.
    "${MPIRUN[@]}" "$@" &
    MPIRUN_PID=$!
    local rc=0
    wait "$MPIRUN_PID" || rc=$?
    MPIRUN_PID=
    return "$rc"
}

on_signal() {
    trap - INT TERM
    if [ -n "$MPIRUN_PID" ]; then
        kill -TERM "$MPIRUN_PID" 2>/dev/null || true
        wait "$MPIRUN_PID" 2>/dev/null || true
    fi
    exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

if [ "$RATE" = none ]; then
    echo "# netem.sh: rate none: $NP ranks over shared memory (btl self,vader), no namespaces"
    run_mpirun --mca pml ob1 --mca btl self,vader "${BENCH[@]}"
    exit $?
fi

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces (run with sudo)"
for t in ip tc; do
    command -v "$t" >/dev/null || die "'$t' not found: install iproute2 (Debian: apt-get install iproute2)"
done
ip -V 2>&1 | grep -q iproute2 || die "'ip' is not iproute2's (Debian: apt-get install iproute2)"

# ---- build the topology ------------------------------------------------------------------
TAG=gcomp$$
HUB=$TAG-hub
NAMESPACES=()
TMP=$(mktemp -d /tmp/netem.XXXXXX)

cleanup() {
    local ns pid
    for ns in "${NAMESPACES[@]}"; do
        # ranks left behind by a killed mpirun: only processes inside our own namespaces
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true # takes its veth ends with it
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

add_ns() {
    ip netns add "$1"
    NAMESPACES+=("$1")
    ip -n "$1" link set lo up
}

shape() { # namespace, interface
    tc -n "$1" qdisc add dev "$2" root tbf rate "$RATE" burst "$TBF_BURST" latency "$TBF_LATENCY"
}

add_ns "$HUB"
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up
for ((r = 0; r < NP; r++)); do
    ns=$TAG-r$r
    add_ns "$ns"
    ip -n "$HUB" link add "v$r" type veth peer name gc0 netns "$ns"
    ip -n "$HUB" link set "v$r" master br0 up
    ip -n "$ns" addr add "10.77.0.$((r + 1))/24" dev gc0
    ip -n "$ns" link set gc0 up
    shape "$ns" gc0     # what rank r sends
    shape "$HUB" "v$r"  # what rank r receives
done

ip -n "$HUB" addr add 10.77.0.254/24 dev br0 # mpirun's own address

# One "host" per rank in the hostfile, in rank order; the agent plays ssh to them.
for ((r = 0; r < NP; r++)); do echo "10.77.0.$((r + 1)) slots=1"; done >"$TMP/hosts"
cat >"$TMP/agent" <<EOF
#!/bin/sh
# plm_rsh_agent generated by netem.sh: "agent HOST COMMAND..." runs COMMAND (a shell command
# line, as ssh hands it to the remote shell) inside the namespace that owns HOST.
host=\$1; shift
case "\$host" in
10.77.0.*) ;;
*) echo "netem.sh agent: unknown host '\$host'" >&2; exit 1 ;;
esac
exec ip netns exec "$TAG-r\$((\${host##*.} - 1))" sh -c "\$*"
EOF
chmod +x "$TMP/agent"

echo "# netem.sh: rate $RATE: $NP ranks, one netns (\"host\") each with its own orted, veth to"
echo "# a bridge in netns $HUB; tbf rate $RATE burst $TBF_BURST latency $TBF_LATENCY on both ends of"
echo "# every veth; MPI over TCP on 10.77.0.0/24 only"
for ((r = 0; r < NP; r++)); do
    echo "#   rank $r: 10.77.0.$((r + 1)) $(tc -n "$TAG-r$r" qdisc show dev gc0 | head -n 1)"
done

# Open MPI's rsh launch occasionally loses a daemon (one orted never reports back, and
# mpirun then waits forever without an error). A watchdog catches that: if after
# LAUNCH_TIMEOUT seconds some rank namespace still holds fewer than two processes (its orted
# and its rank) while mpirun runs, the launch is killed and retried, up to 3 attempts.
LAUNCH_TIMEOUT=${LAUNCH_TIMEOUT:-30}
ranks_started() {
    local r
    for ((r = 0; r < NP; r++)); do
        [ "$(ip netns pids "$TAG-r$r" 2>/dev/null | wc -l)" -ge 2 ] || return 1
    done
}
kill_rank_namespaces() {
    local r pid
    for ((r = 0; r < NP; r++)); do
        for pid in $(ip netns pids "$TAG-r$r" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    done
}
watch_launch() { # pid of mpirun; returns 0 when launched (or finished), 1 when stuck
    local waited=0
    while kill -0 "$1" 2>/dev/null; do
        ranks_started && return 0
        [ "$waited" -ge $((LAUNCH_TIMEOUT * 10)) ] && return 1
        sleep 0.1
        waited=$((waited + 1))
    done
    return 0
}

MPIRUN=(ip netns exec "$HUB" "${MPIRUN[@]}")
run_mpirun_watched() {
    local attempt rc
    for attempt in 1 2 3; do
        "${MPIRUN[@]}" "$@" &
        MPIRUN_PID=$!
        if watch_launch "$MPIRUN_PID"; then
            rc=0
            wait "$MPIRUN_PID" || rc=$?
            MPIRUN_PID=
            return "$rc"
        fi
        echo "netem.sh: launch attempt $attempt: not every rank started within ${LAUNCH_TIMEOUT} s; retrying" >&2
        kill -TERM "$MPIRUN_PID" 2>/dev/null || true
        kill_rank_namespaces
        sleep 1
        kill -KILL "$MPIRUN_PID" 2>/dev/null || true
        wait "$MPIRUN_PID" 2>/dev/null || true
        MPIRUN_PID=
    done
    die "Open MPI did not start all $NP ranks in 3 attempts"
}
# Every "host" holds one rank and one slot, so Open MPI does not know that its ranks share
# this machine's cores -- with each other, with their daemons and with the kernel's work for
# the emulated links -- and its blocking calls (MPI_Allreduce, MPI_Wait) spin without ever
# yielding. A spinning rank then takes the core from the one it waits for, or from the
# network: a 16 KiB MPI_Allreduce at 4 ranks over 1 Gbit/s took 12 ms instead of 0.2 ms on a
# 2-core machine, and 64 MiB at 10 Gbit/s at 2 ranks 210 ms instead of 147 ms, which made every
# comparison with it too kind to gcomp (whose waits yield; yielding speeds up gcomp's own
# small calls too). On one real host with more ranks than cores mpirun sets
# mpi_yield_when_idle itself; here it is always set, unless the environment chooses (with a
# core to spare, a yield with nothing else to run returns at once).
YIELD=()
if [ -z "${OMPI_MCA_mpi_yield_when_idle+set}" ]; then
    YIELD=(--mca mpi_yield_when_idle 1)
    echo "# Open MPI yields when idle (mpi_yield_when_idle 1): the emulated hosts share this machine's cores"
fi
run_mpirun_watched --hostfile "$TMP/hosts" --map-by node "${YIELD[@]}" \
    --mca plm rsh --mca plm_rsh_agent "$TMP/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca orte_startup_timeout 60 \
    --mca oob_tcp_if_include 10.77.0.0/24 \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
    "${BENCH[@]}"
